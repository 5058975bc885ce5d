"""mkdocs hooks: the README is the site's home page, and a link to a file of the
repository outside docs/ (an example, the benchmarks) is shown as its path.

mkdocs checks links between pages itself (`strict: true`); a link that leaves docs/
is checked here instead: the file must exist, or a strict build fails.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
# A warning on a "mkdocs." logger fails a strict build.
log = logging.getLogger("mkdocs.hooks.docs_hooks")
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The home page's text is the README's; links out of docs/ become paths."""
    source = Path(page.file.abs_src_path)
    home = page.file.src_uri == "index.md"
    if home:
        source = ROOT / "README.md"
        markdown = source.read_text(encoding="utf-8").replace("](docs/", "](")
    docs = Path(config["docs_dir"]).resolve()

    def outside(match: re.Match[str]) -> str:
        text, target = match.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        name = target.split("#", 1)[0]
        if home and (docs / name).exists():
            return match.group(0)  # the README's link to a page: a page of the site
        path = ((ROOT if home else source.parent) / name).resolve()
        if path.is_relative_to(docs):
            return match.group(0)  # a page of the site: mkdocs checks it
        if not path.exists():
            log.warning(f"{page.file.src_uri}: the link to '{target}' names no file")
            return match.group(0)
        return f"{text} (`{path.relative_to(ROOT)}`)"

    return LINK.sub(outside, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings introduce their code blocks reST's way (``Example::``); the rendered
    page shows one colon."""
    return html.replace("::</p>", ":</p>")
