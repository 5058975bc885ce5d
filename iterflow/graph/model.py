"""The graph data model of GraphFrames: vertices with ``id``, edges with ``src`` and ``dst``.

Every function of ``iterflow.graph`` takes an ``iterflow.graph.Graph`` or any object
with ``.vertices`` and ``.edges`` DataFrames (a GraphFrame). Written on iterflow's
public API only, like any user code.
"""

from __future__ import annotations

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


def nested(df: DataFrame, name: str) -> Column:
    """All of ``df``'s columns as one struct column ``name`` (a vertex or edge row, as
    GraphFrames nests them in triplets and paths)."""
    return F.struct(*(df[c] for c in df.columns)).alias(name)


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
