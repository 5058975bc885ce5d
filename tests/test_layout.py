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
    "iterflow.reports",
    "iterflow.termination",
    "iterflow.progress",
    "iterflow.body",
    "iterflow.builder",
    "iterflow.runtime",
    "iterflow.windows",
    "iterflow.durations",
    "iterflow.storage",
)

#: part -> the parts it may import (itself always). "iterflow" is the public API
#: (``import iterflow as itf``), which users of it reach only through that name.
ALLOWED: dict[str, tuple[str, ...]] = {
    # Leaves: pure Python values and rules.
    "iterflow.errors": (),
    "iterflow.reports": (),
    "iterflow.durations": ("iterflow.errors",),
    "iterflow.storage": ("iterflow.errors",),
    "iterflow.windows": ("iterflow.errors", "iterflow.durations"),
    "iterflow.termination": ("iterflow.errors", "iterflow.reports"),
    "iterflow.metrics": ("iterflow.errors", "iterflow.reports"),
    "iterflow.progress": (
        "iterflow.errors",
        "iterflow.reports",
        "iterflow.metrics",
        "iterflow.storage",
    ),
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
    # The Spark machinery both loops share, in packages from the leaf up: never a loop,
    # never a library on top (iterflow/runtime/__init__.py says each package's job).
    "iterflow.runtime": (),
    "iterflow.runtime.spark": ("iterflow.errors", "iterflow.storage"),
    "iterflow.runtime.checkpoint": (
        "iterflow.errors",
        "iterflow.durations",
        "iterflow.storage",
        "iterflow.runtime.spark",
    ),
    "iterflow.runtime.progresstrack": (
        "iterflow.errors",
        "iterflow.reports",
        "iterflow.termination",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.runtime.spark",
    ),
    "iterflow.runtime.datacache": (
        "iterflow.errors",
        "iterflow.storage",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.runtime.spark",
        "iterflow.runtime.progresstrack",
    ),
    "iterflow.runtime.round": (
        "iterflow.errors",
        "iterflow.reports",
        "iterflow.termination",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.body",
        "iterflow.runtime.spark",
        "iterflow.runtime.checkpoint",
        "iterflow.runtime.progresstrack",
        "iterflow.runtime.datacache",
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
        "iterflow.graph",
        "iterflow.ml",
    ),
    "iterflow.cli": (
        "iterflow",
        "iterflow.demo",
        "iterflow.graph",
        "iterflow.ml",
        "iterflow.testing",
    ),
    # The package's own front: what it exports.
    "iterflow.__init__": (
        "iterflow",
        "iterflow.runtime",
        "iterflow.errors",
        "iterflow.reports",
        "iterflow.termination",
        "iterflow.metrics",
        "iterflow.progress",
        "iterflow.body",
        "iterflow.bounded",
        "iterflow.unbounded",
        "iterflow.windows",
        "iterflow.durations",
    ),
}

#: (importing module, imported module): why the rule above does not hold there.
EXCEPTIONS: dict[tuple[str, str], str] = {}

#: Modules that import no Spark: the leaves (the metrics' Spark bridge aside).
LEAVES = (
    "iterflow.errors",
    "iterflow.reports",
    "iterflow.termination",
    "iterflow.progress",
    "iterflow.windows",
    "iterflow.durations",
    "iterflow.storage",
)
SPARK = ("pyspark", "py4j")

#: Spark's JVM internals are reached in runtime/spark/jvm.py only (and asked about with its
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
    if module == "iterflow.runtime.spark.jvm" or module in JVM_EXCEPTIONS:
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


def _module_imports(module: str) -> set[str]:
    """The iterflow modules ``module`` imports (anywhere in it, functions included), with
    ``from package import module`` read as the module."""
    found = set()
    for name in imported_modules(module):
        if name in MODULES:
            found.add(name)
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in MODULES
            )
    found.discard(module)
    return {m for m in found if not m.endswith(".__init__")}


def test_no_import_cycle_between_files() -> None:
    """No chain of imports leads from a module back to itself (packages' ``__init__``
    re-exports aside): each file can be read knowing only the files below it."""
    graph = {m: _module_imports(m) for m in MODULES}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph.get(module, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[module] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [module])
    assert cycles == []


#: Functions may not be longer (``def`` to last line, docstring included); the two loops'
#: classes stay under their own bound.
FUNCTION_LINES = 80
LOOP_CLASSES = {"RoundLoop": 200, "EpochLoop": 200}


def test_functions_and_loops_stay_within_their_bounds() -> None:
    too_long = []
    for module in MODULES:
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            size = (
                (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            )
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > FUNCTION_LINES:
                too_long.append(f"{module}.{node.name}: {size} lines")
            bound = LOOP_CLASSES.get(getattr(node, "name", ""))
            if isinstance(node, ast.ClassDef) and bound is not None and size >= bound:
                too_long.append(f"class {module}.{node.name}: {size} lines")
    assert too_long == []


def _windows(paths: list[Path], size: int = 6) -> dict[tuple[str, ...], str]:
    """Each run of ``size`` meaningful lines (blank lines, comments, imports, lone
    punctuation and docstring quotes left out; white space folded) -> where it stands."""
    found: dict[tuple[str, ...], str] = {}
    for path in paths:
        lines = []
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            line = " ".join(raw.split())
            if not line or line.startswith(("#", "import ", "from ", '"""')) or len(line) < 4:
                continue
            lines.append((number, line))
        for i in range(len(lines) - size + 1):
            key = tuple(text for _, text in lines[i : i + size])
            found.setdefault(key, f"{path.relative_to(PACKAGE.parent)}:{lines[i][0]}")
    return found


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("bounded", "unbounded"),
        ("graph/pagerank.py", "graph/components.py"),
        ("graph/pagerank.py", "graph/labels.py"),
        ("graph/pagerank.py", "graph/paths.py"),
        ("graph/components.py", "graph/labels.py"),
        ("graph/components.py", "graph/paths.py"),
        ("graph/labels.py", "graph/paths.py"),
    ],
)
def test_no_six_lines_stand_in_both(first: str, second: str) -> None:
    """The two loops share the runtime instead of copying each other, and the graph
    algorithms share the block runner: no six lines of one stand again in the other."""

    def files(part: str) -> list[Path]:
        path = PACKAGE / part
        return sorted(path.rglob("*.py")) if path.is_dir() else [path]

    ones, others = _windows(files(first)), _windows(files(second))
    assert [f"{ones[key]} ~ {others[key]}" for key in ones.keys() & others.keys()] == []


#: Parts on the public door: they import ``iterflow``, and the public packages
#: ``iterflow.graph`` and ``iterflow.ml`` as packages, never a module inside another part.
ON_THE_DOOR = ("iterflow.graph", "iterflow.ml", "iterflow.demo", "iterflow.cli", "iterflow.testing")
PUBLIC_PACKAGES = ("iterflow", "iterflow.graph", "iterflow.ml", "iterflow.testing")
#: The demos are the command line's own: they stand beside their one caller.
BESIDE = {"iterflow.cli": "iterflow.demo"}


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(ON_THE_DOOR)])
def test_libraries_on_the_api_import_only_public_names(module: str) -> None:
    part = part_of(module)
    private = {
        name
        for name in imported_modules(module)
        if name.startswith("iterflow")
        and name not in PUBLIC_PACKAGES
        and not (name == part or name.startswith(part + "."))
        and not name.startswith(BESIDE.get(module, "-") + ".")
        and (module, name) not in EXCEPTIONS
    }
    assert private == set()
