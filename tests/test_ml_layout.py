"""The house bounds on iterflow.ml: no import cycle between its files (imports inside
functions and under TYPE_CHECKING count too) and no function over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ML = Path(__file__).resolve().parent.parent / "iterflow" / "ml"


def module_of(path: Path) -> str:
    return "iterflow.ml" if path.stem == "__init__" else f"iterflow.ml.{path.stem}"


MODULES = {module_of(path): path for path in sorted(ML.glob("*.py"))}


def imports(path: Path) -> set[str]:
    """The modules of iterflow.ml that ``path`` imports: ``from iterflow.ml import x``
    names the module ``x`` where there is one, else the package itself."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return {name for name in found if name in MODULES}


def test_no_import_cycle_between_the_files_of_ml() -> None:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module, path in MODULES.items():
        graph.add_edges_from((module, target) for target in imports(path) if target != module)
    # The package's __init__ imports every file; a file that imports a name of the package
    # (not one of its files) closes a cycle through it, so __init__ stays in the graph.
    assert len(graph.edges) > 10
    assert list(nx.simple_cycles(graph)) == []


def test_no_function_of_ml_is_over_80_lines() -> None:
    long = [
        f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in MODULES.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []
