"""A file source's metadata log under a stream's checkpoint (``sources/<id>/``).

One file per log offset, named by it: a version line, then a JSON line per file the
source took (``path``, ``timestamp``, ``batchId``: the log offset). Every few
offsets Spark compacts the log into ``<offset>.compact``, which holds every entry
up to that offset, and may delete the entries it compacted.
"""

from __future__ import annotations

import json
import re
from typing import Any

from iterflow.runtime.spark.files import Files

_LOG_FILE = re.compile(r"(\d+)(\.compact)?")


def log_files(files: Files, directory: str) -> dict[int, str]:
    """Log offset -> the name of its file (``<n>`` or ``<n>.compact``) in ``directory``."""
    entries: dict[int, str] = {}
    for name in files.children(directory):
        if (match := _LOG_FILE.fullmatch(name)) is not None:
            entries[int(match.group(1))] = name
    return entries


def is_compaction(name: str) -> bool:
    """Whether the log file ``name`` is a compaction (``<n>.compact``)."""
    return name.endswith(".compact")


def log_entries(files: Files, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Each entry of the log file ``path``: its JSON line, and that line read."""
    lines = files.read_bytes(path).decode("utf-8").splitlines()[1:]  # after the version
    return [(line, json.loads(line)) for line in lines if line.strip()]
