"""Graphs made from a graph without iterating: subgraphs, the edges reversed or in both
directions, degrees per edge type, and the check that a graph follows the data model.

Each is one DataFrame plan over the graph's vertices and edges (nothing runs until its
result is read, except ``validate``), with GraphFrames' method semantics and result
columns; ``GraphFrame`` offers them under GraphFrames' names.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iterflow.graph.graphs import Graph, GraphError, checked, where


def filter_vertices(g: Graph, condition: str | Column) -> tuple[DataFrame, DataFrame]:
    """The vertices that meet ``condition``, and the edges whose two ends both remain."""
    vertices = where(g.vertices, condition, "filterVertices(condition=...)")
    ids = vertices.select("id")
    edges = g.edges.join(ids.withColumnRenamed("id", "src"), "src", "left_semi").join(
        ids.withColumnRenamed("id", "dst"), "dst", "left_semi"
    )
    return vertices, edges.select(*g.edges.columns)


def filter_edges(g: Graph, condition: str | Column) -> tuple[DataFrame, DataFrame]:
    """Every vertex, and the edges that meet ``condition``."""
    return g.vertices, where(g.edges, condition, "filterEdges(condition=...)")


def drop_isolated_vertices(g: Graph) -> tuple[DataFrame, DataFrame]:
    """The vertices that are an end of at least one edge, and every edge."""
    ends = g.edges.select(F.explode(F.array("src", "dst")).alias("id"))
    return g.vertices.join(ends, "id", "left_semi"), g.edges


def reversed_edges(edges: DataFrame) -> DataFrame:
    """``edges`` with ``src`` and ``dst`` swapped: columns ``src``, ``dst``, then the
    edges' other columns in their order (GraphFrames' ``as_reversed``)."""
    others = [F.col(c) for c in edges.columns if c not in ("src", "dst")]
    return edges.select(F.col("dst").alias("src"), F.col("src").alias("dst"), *others)


def both_directions(edges: DataFrame) -> DataFrame:
    """``edges`` and a reversed copy of each (a self-loop appears twice), attributes kept:
    columns ``src``, ``dst``, then the others (GraphFrames' ``as_undirected``)."""
    others = [F.col(c) for c in edges.columns if c not in ("src", "dst")]
    return edges.select("src", "dst", *others).unionByName(reversed_edges(edges))


def typed_degrees(
    g: Graph, side: str, edge_type_col: str, edge_types: list[Any] | None
) -> DataFrame:
    """``id`` and a struct of counts (int) with a field per edge type: edges leaving
    (``side="out"``), entering (``"in"``) or touching (``"both"``, a self-loop counted
    twice) each vertex that has such edges. Types are found in the edges unless
    ``edge_types`` lists them (then a type not in the list is not counted)."""
    if edge_type_col not in g.edges.columns:
        raise GraphError(
            f"type_{side}_degree: the edges have no column {edge_type_col!r}; "
            f"their columns are {g.edges.columns}"
        )
    ends = {"out": ["src"], "in": ["dst"], "both": ["src", "dst"]}[side]
    ids = F.explode(F.array(*ends)) if len(ends) > 1 else F.col(ends[0])
    rows = g.edges.select(ids.alias("id"), F.col(edge_type_col).alias("_type"))
    grouped = rows.groupBy("id")
    pivoted = (
        grouped.pivot("_type", edge_types) if edge_types is not None else grouped.pivot("_type")
    )
    counts = pivoted.agg(F.count(F.lit(1))).na.fill(0)
    fields = [F.col(f"`{c}`").cast("int").alias(c) for c in counts.columns if c != "id"]
    name = {"out": "outDegrees", "in": "inDegrees", "both": "degrees"}[side]
    return counts.select("id", F.struct(*fields).alias(name))


def validate(g: Graph, *, check_vertices: bool = True) -> None:
    """Raise ``GraphError`` (a ``ValueError``) if a vertex id is null or repeated, and with
    ``check_vertices`` if an edge's end is no vertex id; one Spark job, two with it."""
    checked(g, "validate()", edges=check_vertices)
