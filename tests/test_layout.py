"""The dependency direction of DESIGN.md: leaves never import Spark or the loops."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "iterflow"
LEAVES = [
    PACKAGE / "termination.py",
    PACKAGE / "errors.py",
    *sorted((PACKAGE / "progress").glob("*.py")),
    # The metrics package but its Spark bridge.
    *sorted(p for p in (PACKAGE / "metrics").glob("*.py") if p.name != "_spark.py"),
]
FORBIDDEN = ("pyspark", "py4j", "iterflow.runtime", "iterflow.bounded", "iterflow.body")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("leaf", LEAVES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_leaf_modules_do_not_import_spark_or_the_loops(leaf: Path) -> None:
    offending = {
        name for name in imported_modules(leaf) for bad in FORBIDDEN if name.startswith(bad)
    }
    assert offending == set()


ALLOWED = {
    # iterflow.graph is itself a public library: the demos may use it.
    "demo": ("iterflow.demo", "iterflow.graph"),
    "graph": ("iterflow.graph",),
    "ml": ("iterflow.ml",),
    # The test harness runs the libraries' algorithms, reads progress like `iterflow
    # plot` does, and its pytest fixture starts sessions as the CLI does.
    "testing": (
        "iterflow.testing",
        "iterflow.graph",
        "iterflow.ml",
        "iterflow.errors",
        "iterflow.progress",
        "iterflow.runtime.session",
    ),
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_users_of_the_public_api_import_nothing_private(package: str) -> None:
    allowed = ALLOWED[package]
    for path in (PACKAGE / package).glob("*.py"):
        internal = {
            name
            for name in imported_modules(path)
            if name.startswith("iterflow.") and not name.startswith(allowed)
        }
        assert internal == set(), path.name
