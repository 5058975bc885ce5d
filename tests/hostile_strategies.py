"""Hypothesis strategies and settings for tests/test_hostile_input.py: odd ids, odd
values, odd column names, small graphs and small regression data."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

#: Spark examples cost 0.3-2 s each: few in the default run, more under slow_spark.
_COMMON: dict[str, Any] = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
settings.register_profile("hostile", max_examples=3, **_COMMON)
settings.register_profile("hostile-slow", max_examples=25, **_COMMON)
FAST = settings.get_profile("hostile")
SLOW = settings.get_profile("hostile-slow")

#: Names iterflow gives its own columns, and names Spark reads specially unless quoted.
INTERNAL_NAMES = (
    "_iterflow_held",
    "__iterflow_file",
    "_iterflow_combined",
    "__partition",
    "_pregel_msg",
)
ODD_NAMES = ("a.b", "é ü 字", "with space", "a`b", "select", "x-y", "1st", *INTERNAL_NAMES)

ids = st.one_of(
    st.sampled_from([INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, 0, -1]),
    st.integers(INT64_MIN, INT64_MAX),
)
#: Doubles as Spark holds them: NaN, infinities and nulls included.
doubles = st.one_of(
    st.none(),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308, -1e-308]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
)
#: A value column's name: one of the odd ones, or any short text that is not "id".
column_names = st.one_of(
    st.sampled_from(ODD_NAMES),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=6),
).filter(lambda name: name.lower() != "id" and name.strip() == name and name != "")


@st.composite
def keyed_rows(draw: Any, max_rows: int = 8) -> list[tuple[int, float | None]]:
    """Rows ``(id, value)`` with distinct ids (int64 limits likely) and odd values."""
    keys = draw(st.lists(ids, unique=True, max_size=max_rows))
    return [(k, draw(doubles)) for k in keys]


@st.composite
def graphs(draw: Any, max_vertices: int = 7, max_edges: int = 10) -> tuple[list[int], list[Any]]:
    """A valid graph: distinct int64 vertex ids (the limits likely) and edges between
    them with self-loops and duplicates; possibly no vertex or no edge."""
    vertices = draw(st.lists(ids, unique=True, max_size=max_vertices))
    if not vertices:
        return [], []
    end = st.sampled_from(vertices)
    edges = draw(st.lists(st.tuples(end, end), max_size=max_edges))
    if edges and draw(st.booleans()):
        edges.append(edges[0])  # a duplicate edge
    return vertices, edges


@st.composite
def regression_data(draw: Any) -> tuple[list[list[float]], list[float], list[float]]:
    """Well-conditioned linear data: rows of 2 features, labels and positive weights."""
    n = draw(st.integers(4, 9))
    grid = st.integers(-5, 5).map(float)
    x = [[draw(grid), draw(grid)] for _ in range(n)]
    y = [draw(grid) for _ in range(n)]
    w = [draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for _ in range(n)]
    return x, y, w
