"""The graph data model of GraphFrames: vertices with ``id``, edges with ``src`` and ``dst``.
Here are the ``Graph`` that holds them, the checks that a graph follows the model
(``GraphError``), and how a graph function takes a graph in and gives its vertices back.

Every function of ``iterflow.graph`` takes an ``iterflow.graph.Graph`` or any object
with ``.vertices`` and ``.edges`` DataFrames (a GraphFrame). Written on iterflow's
public API only, like any user code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf


class GraphError(itf.IterflowError, ValueError):
    """A graph that does not follow the data model: a missing column, a wrong kind of object."""


def _has_columns(kind: str, required: tuple[str, ...]) -> Any:
    def check(_instance: Any, _attribute: Any, df: Any) -> None:
        if not isinstance(df, DataFrame):
            raise GraphError(f"Graph({kind}=...) takes a DataFrame, got {type(df).__name__}")
        missing = [c for c in required if c not in df.columns]
        if missing:
            raise GraphError(
                f"the {kind} DataFrame has no column(s) {', '.join(repr(c) for c in missing)}; "
                f"its columns are {df.columns}. GraphFrames' data model: vertices have 'id', "
                "edges have 'src' and 'dst' (rename with withColumnRenamed)"
            )
        if df.isStreaming:
            raise GraphError(f"the {kind} DataFrame is streaming; graphs take batch DataFrames")

    return check


@attrs.frozen
class Graph:
    """Vertices (``id`` plus attributes) and edges (``src``, ``dst`` plus attributes).

    Example::

        g = Graph(spark.createDataFrame([(1,), (2,)], "id long"),
                  spark.createDataFrame([(1, 2)], "src long, dst long"))
    """

    vertices: DataFrame = attrs.field(validator=_has_columns("vertices", ("id",)))
    edges: DataFrame = attrs.field(validator=_has_columns("edges", ("src", "dst")))

    def __attrs_post_init__(self) -> None:
        types = {
            "id": self.vertices.schema["id"].dataType,
            "src": self.edges.schema["src"].dataType,
            "dst": self.edges.schema["dst"].dataType,
        }
        if len({t.simpleString() for t in types.values()}) > 1:
            described = ", ".join(f"'{c}' {t.simpleString()}" for c, t in types.items())
            raise GraphError(
                f"vertex ids and edge ends must have one type, got {described}; cast them "
                "to the same type"
            )


def checked(g: Graph, who: str, *, edges: bool = True) -> int:
    """The number of vertices of ``g``, counted in one Spark job that also checks the ids:
    a null or repeated vertex ``id`` is a ``GraphError``. With ``edges``, one more job
    checks that every edge's ``src`` and ``dst`` is a vertex id (not null, not missing).
    ``who`` names the caller in errors."""
    row = g.vertices.agg(
        F.count(F.lit(1)).alias("n"), F.count("id").alias("ids"), F.count_distinct("id")
    ).first()
    assert row is not None  # an aggregate without grouping has one row
    n, ids, distinct = int(row[0]), int(row[1]), int(row[2])
    if ids < n:
        raise GraphError(
            f"{who}: {n - ids} vertex row(s) have a null 'id'; every vertex needs an id "
            "(drop them with vertices.where('id IS NOT NULL'))"
        )
    if distinct < ids:
        repeated = g.vertices.groupBy("id").count().where("count > 1").limit(3).collect()
        raise GraphError(
            f"{who}: vertex ids must be unique, and the vertices' 'id' column holds "
            f"{[r['id'] for r in repeated]} more than once; keep one row per id "
            "(vertices.dropDuplicates(['id']))"
        )
    if edges:
        check_edge_ends(g, who)
    return n


def check_edge_ends(g: Graph, who: str) -> None:
    """A ``GraphError`` naming the column when an edge's ``src`` or ``dst`` is null or no
    vertex's id (one Spark job)."""
    ends = g.edges.select(F.lit("src").alias("end"), F.col("src").alias("id")).unionByName(
        g.edges.select(F.lit("dst").alias("end"), F.col("dst").alias("id"))
    )
    strays = ends.join(g.vertices.select("id"), "id", "left_anti").limit(3).collect()
    if strays:
        raise GraphError(stray_ends(who, [(r["end"], r["id"]) for r in strays]))


def stray_ends(who: str, strays: list[tuple[str, Any]]) -> str:
    """What a ``GraphError`` says of edges whose ends are null or not vertex ids."""
    described = ", ".join(f"'{end}' {value!r}" for end, value in strays)
    return (
        f"{who}: edges must join vertices, and some edges' ends are null or not a vertex "
        f"'id' ({described}); add those vertices or drop those edges "
        "(edges.join(vertices, edges.src == vertices.id, 'left_semi'), and so for dst)"
    )


def with_column(vertices: DataFrame, result: DataFrame, name: str) -> DataFrame:
    """``vertices`` joined on ``id`` with ``result`` (``id`` and column ``name``): a vertex
    column already called ``name`` (an earlier run's) is replaced, not repeated."""
    return vertices.drop(name).join(result, "id")


def column_of(value: Any, who: str) -> Column:
    """``value``, SQL text or a Column, as a Column; anything else is a ``GraphError``
    naming ``who`` (the call and argument, e.g. ``"all_paths(from_expr=...)"``)."""
    if isinstance(value, str):
        return F.expr(value)
    if isinstance(value, Column):
        return value
    raise GraphError(f"{who} takes a SQL condition (str) or a Column, got {type(value).__name__}")


def where(df: DataFrame, condition: Any, who: str) -> DataFrame:
    """``df``'s rows that meet ``condition`` (SQL text or a Column); a condition Spark
    cannot apply to ``df``'s columns is a ``GraphError`` naming ``who`` and the columns."""
    column = column_of(condition, who)
    try:
        return df.where(column)
    except Exception as error:  # an AnalysisException or a parse error, from Spark
        raise GraphError(
            f"{who}: {condition!r} is not a condition on the columns {df.columns}: "
            f"{str(error).splitlines()[0]}"
        ) from None


def nested(df: DataFrame, name: str) -> Column:
    """All of ``df``'s columns as one struct column ``name`` (a vertex or edge row, as
    GraphFrames nests them in triplets and paths). The columns are named, not bound to
    ``df``, so the struct resolves in any select of ``df``'s rows on Spark Connect too."""
    return F.struct(*(F.col(f"`{c}`") for c in df.columns)).alias(name)


def as_graph(graph: Any) -> Graph:
    """``graph`` as a ``Graph``: a Graph itself, or any object with ``.vertices`` and ``.edges``."""
    if isinstance(graph, Graph):
        return graph
    if not (hasattr(graph, "vertices") and hasattr(graph, "edges")):
        raise GraphError(
            "iterflow.graph functions take an iterflow.graph.Graph or an object with "
            f".vertices and .edges DataFrames (a GraphFrame), got {type(graph).__name__}"
        )
    return Graph(graph.vertices, graph.edges)


def graph_result(graph: Any, vertices: DataFrame) -> Any:
    """What a graph function returns: ``vertices``, or a GraphFrame of ``vertices`` and the
    input's edges when the input was a GraphFrame (graphframes-py with its JVM package)."""
    try:
        from graphframes import GraphFrame  # type: ignore[import-not-found]
    except ImportError:
        return vertices
    if isinstance(graph, GraphFrame):
        return GraphFrame(vertices, graph.edges)
    return vertices


def run_iteration(
    iteration: Any,
    listen: Any,
    run_options: Mapping[str, Any],
    *,
    release: Callable[[], None] | None = None,
) -> itf.IterationResult:
    """The end of a graph run: ``listen`` after every round, run (a ``GraphError`` that a
    kernel raised in a worker, such as an edge to no vertex, surfaces as itself), then
    ``release`` what the run held (a block layout), however it ended."""
    if listen is not None:
        iteration = iteration.listen(listen)
    try:
        with itf.worker_errors(GraphError):
            return iteration.run(**run_options)
    finally:
        if release is not None:
            release()
