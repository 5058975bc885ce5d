"""The dependency direction of DESIGN.md, as a table: what each part of iterflow may import.

Every module of the package belongs to exactly one part (the longest matching
prefix below), and may import only the parts its row names, plus the known
exceptions listed with their reasons. Leaves never import Spark.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "iterflow"

#: What either loop may import.
LOOPS = (
    "iterflow.errors",
    "iterflow.records",
    "iterflow.termination",
    "iterflow.progress",
    "iterflow.body",
    "iterflow.builder",
    "iterflow.runtime",
    "iterflow.windows",
)

#: part -> the parts it may import (itself always). "iterflow" is the public API
#: (``import iterflow as itf``), which users of it reach only through that name.
ALLOWED: dict[str, tuple[str, ...]] = {
    # Leaves: pure Python values and rules.
    "iterflow.errors": (),
    "iterflow.records": (),
    "iterflow.windows": ("iterflow.errors",),
    "iterflow.termination": ("iterflow.errors", "iterflow.records"),
    "iterflow.metrics": ("iterflow.errors", "iterflow.records"),
    "iterflow.progress": ("iterflow.errors", "iterflow.records", "iterflow.metrics"),
    # The body a user writes, and the builder both iteration kinds share.
    "iterflow.body": ("iterflow.errors", "iterflow.termination"),
    "iterflow.builder": (
        "iterflow.errors",
        "iterflow.body",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.runtime",
        "iterflow.termination",
    ),
    # The Spark machinery both loops share: never a loop, never a library on top.
    "iterflow.runtime": (
        "iterflow.errors",
        "iterflow.records",
        "iterflow.windows",
        "iterflow.termination",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.body",
    ),
    # The two loops: each on the runtime, never on each other.
    "iterflow.bounded": LOOPS,
    "iterflow.unbounded": LOOPS,
    # Libraries on the public API only.
    "iterflow.graph": ("iterflow",),
    "iterflow.ml": ("iterflow",),
    "iterflow.demo": ("iterflow", "iterflow.graph", "iterflow.ml"),
    # The test harness runs the libraries' algorithms and reads progress like `iterflow
    # plot` does.
    "iterflow.testing": (
        "iterflow",
        "iterflow.errors",
        "iterflow.graph",
        "iterflow.ml",
        "iterflow.progress",
    ),
    "iterflow.cli": (
        "iterflow",
        "iterflow.errors",
        "iterflow.demo",
        "iterflow.graph",
        "iterflow.ml",
        "iterflow.progress",
        "iterflow.testing",
    ),
    # The package's own front: what it exports.
    "iterflow.__init__": (
        "iterflow",
        "iterflow.runtime",
        "iterflow.errors",
        "iterflow.records",
        "iterflow.termination",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.body",
        "iterflow.bounded",
        "iterflow.unbounded",
        "iterflow.windows",
    ),
}

#: (importing module, imported module): why the rule above does not hold there.
EXCEPTIONS: dict[tuple[str, str], str] = {}

#: Modules that import no Spark: the leaves (the metrics' Spark bridge aside).
LEAVES = (
    "iterflow.errors",
    "iterflow.records",
    "iterflow.termination",
    "iterflow.progress",
    "iterflow.windows",
)
SPARK = ("pyspark", "py4j")

#: Spark's JVM internals are reached in runtime/jvm.py only (and asked about with its
#: is_classic): these names appear nowhere else, but for the exceptions named.
JVM_NAMES = ("_jdf", "_jsc", "_jvm", "_jsparkSession", "py4j", "is_remote")
JVM_EXCEPTIONS = {
    "iterflow.metrics._spark": "inside a task there is no session to ask; the process's "
    "Spark Connect mode decides how a metric unpickles",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts)


MODULES = sorted(module_name(p) for p in PACKAGE.rglob("*.py"))


def part_of(module: str) -> str:
    matches = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    assert matches, f"{module} belongs to no part of ALLOWED; add it to the table"
    return max(matches, key=len)


def imported_modules(module: str) -> set[str]:
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_module_belongs_to_a_part() -> None:
    assert len(MODULES) > 50 and all(part_of(m) in ALLOWED for m in MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_only_what_its_part_may(module: str) -> None:
    part = part_of(module)
    allowed = (part, *ALLOWED[part])
    offending = set()
    for name in imported_modules(module):
        if not (name == "iterflow" or name.startswith("iterflow.")):
            continue
        target = "iterflow" if name == "iterflow" else name
        if target in allowed or any(target.startswith(a + ".") for a in allowed if a != "iterflow"):
            continue
        if (module, name) in EXCEPTIONS or (part, name) in EXCEPTIONS:
            continue
        offending.add(name)
    assert offending == set()


@pytest.mark.parametrize(
    "module", [m for m in MODULES if m.startswith(LEAVES) or m.startswith("iterflow.metrics.")]
)
def test_leaves_do_not_import_spark(module: str) -> None:
    if module == "iterflow.metrics._spark":
        pytest.skip("the metrics' Spark bridge")
    assert {n for n in imported_modules(module) if n.startswith(SPARK)} == set()


@pytest.mark.parametrize("module", MODULES)
def test_the_jvm_is_reached_in_one_module(module: str) -> None:
    if module == "iterflow.runtime.jvm" or module in JVM_EXCEPTIONS:
        return
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    names = {
        node.attr if isinstance(node, ast.Attribute) else node.id
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Attribute, ast.Name))
    }
    strings = {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    imported = {n.split(".")[-1] for n in imported_modules(module)} | {
        n.split(".")[0] for n in imported_modules(module)
    }
    assert {n for n in JVM_NAMES if n in names or n in strings or n in imported} == set()


def test_the_table_has_no_cycle_between_parts() -> None:
    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in ALLOWED[start]:
            if nxt == goal:
                return True
            if nxt in ALLOWED and nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    assert [p for p in ALLOWED if reaches(p, p, set())] == []
