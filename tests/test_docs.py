"""The documentation says what the code does: every public name has a docstring (the main
entry points with an example), and every Python block of README.md and docs/*.md runs,
in order, one namespace per file, unless the line before its fence is ``<!-- fragment -->``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"
PUBLIC = ["iterflow", "iterflow.graph", "iterflow.graph.streaming", "iterflow.ml"]
PUBLIC += ["iterflow.testing", "iterflow.metrics", "iterflow.progress"]

#: The entry points a user meets first: their docstrings show them in use.
WITH_EXAMPLE = {
    "iterflow": [
        "BoundedIteration", "UnboundedIteration", "IterationBody", "body", "Declaration",
        "session", "combine", "CombineFn", "FileSink", "max_rounds", "converged", "empty",
        "until", "Condition", "RoundListener", "worker_errors", "vector", "to_arrow",
        "from_arrow",
    ],
    "iterflow.graph": [
        "Graph", "GraphFrame", "bfs", "connected_components", "label_propagation", "pagerank",
        "pagerank_body", "initial_ranks", "pregel", "shortest_paths",
        "strongly_connected_components", "weighted_shortest_paths",
    ],
    "iterflow.graph.streaming": ["builder", "connected_components", "pagerank", "shortest_paths"],
    "iterflow.ml": [
        "kmeans", "linear_regression", "logistic_regression", "KMeans", "LinearRegression",
        "LogisticRegression",
    ],
    "iterflow.testing": [
        "assert_converges", "assert_frame_close", "assert_monotone", "assert_rate",
        "assert_terminated_by",
    ],
}  # fmt: skip
EXAMPLE = re.compile(r"Example|>>> |```|::\n\n    ")


@dataclass(frozen=True)
class Block:
    """A fenced Python block of a Markdown file."""

    line: int  # of its opening fence, from 1
    heading: str  # the nearest heading above it
    code: str
    fragment: bool


def blocks(path: Path) -> list[Block]:
    """The ```python blocks of ``path``, dedented (a block may sit in a list item)."""
    found, heading = [], ""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if text.startswith("#") and not lines[i].startswith(" "):
            heading = text.lstrip("#").strip()
        if text in ("```python", "```py"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(line[indent:] for line in lines[i + 1 : end])
            fragment = i > 0 and lines[i - 1].strip() == FRAGMENT
            found.append(Block(i + 1, heading, code + "\n", fragment))
            i = end
        i += 1
    return found


def public_names() -> list[tuple[str, str]]:
    return [
        (module, name)
        for module in PUBLIC
        for name in importlib.import_module(module).__all__
        if name != "__version__"
    ]


@pytest.mark.parametrize(("module", "name"), public_names())
def test_every_public_name_has_a_docstring(module: str, name: str) -> None:
    thing = getattr(importlib.import_module(module), name)
    doc = inspect.getdoc(thing)
    assert doc and len(doc) > 20, f"{module}.{name} has no docstring"
    if name in WITH_EXAMPLE.get(module, ()):
        assert EXAMPLE.search(doc), f"{module}.{name}'s docstring shows no example"


def test_the_names_that_need_an_example_are_public() -> None:
    for module, names in WITH_EXAMPLE.items():
        assert set(names) <= set(importlib.import_module(module).__all__), module


def test_blocks_are_found_and_every_runnable_one_compiles() -> None:
    found = {path.name: blocks(path) for path in DOCS}
    assert sum(len(b) for b in found.values()) >= 38
    runnable = [b for b in found["README.md"] if not b.fragment]
    assert "BoundedIteration(propagate)" in runnable[0].code
    for name, file_blocks in found.items():
        for block in file_blocks:
            if not block.fragment:
                compile(block.code, f"{name}:{block.line}", "exec")


def test_a_fragment_is_only_marked_by_the_line_before_its_fence(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n\n<!-- fragment -->\n```python\nx = (\n```\n\n## U\n\n- item:\n\n"
        "  ```python\n  y = 1\n  ```\n"
    )
    first, second = blocks(page)
    assert first.fragment and (first.line, first.heading) == (4, "T")
    assert not second.fragment and (second.code, second.heading) == ("y = 1\n", "U")


#: Each file's namespace after each of its blocks (the files run once, then are read).
RUNS: dict[str, list[dict[str, Any]]] = {}


def run_blocks(path: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Run the file's blocks in order in one namespace, in ``tmp``; a namespace per block."""
    if path.name not in RUNS:
        monkeypatch.chdir(tmp)
        namespace: dict[str, Any] = {"__name__": f"docs.{path.stem}"}
        after = []
        for block in blocks(path):
            if not block.fragment:
                where = f"{path.relative_to(ROOT)}:{block.line} ({block.heading})"
                exec(compile(block.code, where, "exec"), namespace)
            after.append(dict(namespace))
        RUNS[path.name] = after
    return RUNS[path.name]


#: Pages whose blocks run many iterations (graph.md: every graph algorithm): slow tests.
SLOW_PAGES = {"graph.md"}


@pytest.mark.spark
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=[pytest.mark.slow_spark] if p.name in SLOW_PAGES else [])
        for p in DOCS
        if any(not b.fragment for b in blocks(p))
    ],
    ids=lambda p: p.name,
)
def test_the_python_blocks_of_a_page_run(
    path: Path, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    after = run_blocks(path, tmp_path, monkeypatch)
    assert len(after) == len(blocks(path))
    if path.name == "README.md":
        result = after[0]["result"]
        assert (result.rounds, result.termination.reason) == (3, "criteria_empty")


def numpy_em(x, weights, means, covs, rounds):
    """Gaussian-mixture EM in numpy and scipy: the model after ``rounds`` steps, and the
    log-likelihood under the model the last step started from."""
    from scipy.stats import multivariate_normal

    for _ in range(rounds):
        joint = np.column_stack(
            [
                w * multivariate_normal(m, c).pdf(x)
                for w, m, c in zip(weights, means, covs, strict=True)
            ]
        )
        loglik = np.log(joint.sum(axis=1)).sum()
        r = joint / joint.sum(axis=1, keepdims=True)
        n = r.sum(axis=0)
        means = (r.T @ x) / n[:, None]
        covs = np.array(
            [(r[:, k] * (x - means[k]).T) @ (x - means[k]) / n[k] for k in range(len(n))]
        )
        weights = n / n.sum()
    return weights, means, covs, loglik


@pytest.mark.spark
def test_the_guides_gaussian_mixture_matches_numpy(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guide = ROOT / "docs" / "guide.md"
    after = run_blocks(guide, tmp_path, monkeypatch)
    (index,) = [
        i for i, b in enumerate(blocks(guide)) if b.heading == "Custom aggregates: itf.combine"
    ]
    scope = after[index]
    result, k, d = scope["result"], scope["K"], scope["D"]
    start = scope["start"].collect()[0]
    weights, means, covs, loglik = numpy_em(
        scope["x"],
        np.array(start["weights"]),
        np.reshape(start["means"], (k, d)),
        np.reshape(start["covs"], (k, d, d)),
        result.rounds,
    )
    fitted = scope["fitted"]
    assert result.rounds == 25
    np.testing.assert_allclose(fitted["weights"], weights, rtol=1e-9)
    np.testing.assert_allclose(np.reshape(fitted["means"], (k, d)), means, rtol=1e-9)
    np.testing.assert_allclose(np.reshape(fitted["covs"], (k, d, d)), covs, rtol=1e-9, atol=1e-12)
    assert fitted["loglik"] == pytest.approx(loglik, rel=1e-12)


@pytest.mark.spark
def test_ml_pages_own_estimator_is_the_same_em_as_numpy(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/ml.md's IterativeEstimator (the guide's mixture as an Estimator) fits what EM
    in numpy and scipy fits from its start, and stops by its own rule."""
    page = ROOT / "docs" / "ml.md"
    after = run_blocks(page, tmp_path, monkeypatch)
    (index,) = [i for i, b in enumerate(blocks(page)) if b.heading.startswith("Writing your own")]
    scope = after[index]
    model = scope["model"]
    start = scope["mixture"].start(None)
    weights, means, covs, loglik = numpy_em(
        scope["x"], start["weights"], start["means"], start["covs"], model.rounds
    )
    learned = model.learned
    np.testing.assert_allclose(learned["weights"], weights, rtol=1e-9)
    np.testing.assert_allclose(learned["means"], means, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(learned["covs"], covs, rtol=1e-9, atol=1e-12)
    assert learned["loglik"] == pytest.approx(loglik, rel=1e-12)
    assert model.termination.reason == "converged" and learned["change"] <= 1e-9
    assert model.history[-2].metrics["Mixture.change"] > 1e-9
