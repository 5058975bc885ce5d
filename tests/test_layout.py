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


@pytest.mark.parametrize("package", ["demo", "graph", "ml"])
def test_users_of_the_public_api_import_nothing_private(package: str) -> None:
    # iterflow.graph is itself a public library: the demos may use it.
    allowed = ("iterflow.demo", "iterflow.graph") if package == "demo" else (f"iterflow.{package}",)
    for path in (PACKAGE / package).glob("*.py"):
        internal = {
            name
            for name in imported_modules(path)
            if name.startswith("iterflow.") and not name.startswith(allowed)
        }
        assert internal == set(), path.name
