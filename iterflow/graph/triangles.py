"""Triangles through every vertex (GraphFrames' ``triangleCount``) and sketches of the
vertices within each number of hops (``hyper_anf``), as DataFrame plans.

Triangles are counted on the undirected simple graph (edge directions, self-loops and
repeated edges ignored): every triangle is found once, from its smallest vertex, by
joining each vertex's pairs of larger neighbours with the edges among them.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iterflow.graph.components import undirected_edges
from iterflow.graph.graphs import GraphError, as_graph, where


def triangle_count(graph: Any) -> DataFrame:
    """The vertices of ``graph`` with ``count`` (long): the triangles through each (0 for
    none), as ``networkx.triangles`` counts them on the undirected simple graph."""
    g = as_graph(graph)
    upward = undirected_edges(g.edges).where(F.col("src") < F.col("dst"))
    first, second, closing = upward.alias("ab"), upward.alias("ac"), upward.alias("bc")
    triangles = (
        first.join(
            second,
            (F.col("ab.src") == F.col("ac.src")) & (F.col("ab.dst") < F.col("ac.dst")),
        )
        .join(
            closing,
            (F.col("bc.src") == F.col("ab.dst")) & (F.col("bc.dst") == F.col("ac.dst")),
        )
        .select(F.array("ab.src", "ab.dst", "ac.dst").alias("corners"))
    )
    counts = (
        triangles.select(F.explode("corners").alias("id"))
        .groupBy("id")
        .agg(F.count(F.lit(1)).alias("count"))
    )
    return (
        g.vertices.drop("count")
        .join(counts, "id", "left")
        .withColumn("count", F.coalesce("count", F.lit(0)).cast("long"))
    )


def hyper_anf(
    graph: Any, *, n_hops: int = 3, lg_nom_entries: int = 12, edge_filter: Any = None
) -> DataFrame:
    """``id`` and ``hop_0`` ... ``hop_{n_hops}``: for every vertex with an out-edge (that
    meets ``edge_filter``), a HyperLogLog sketch (Spark's ``hll_sketch_agg``, ``lgConfigK``
    ``lg_nom_entries``) of the vertices at the end of walks of exactly k edges from it
    (``hop_0``: itself). ``hll_sketch_estimate`` of a sketch, or of ``hll_union`` of
    ``hop_0`` to ``hop_k``, estimates how many vertices are within k hops."""
    if not isinstance(n_hops, int) or n_hops <= 0:
        raise GraphError("hyper_anf: n_hops must be a positive integer")
    if not isinstance(lg_nom_entries, int) or not 4 <= lg_nom_entries <= 21:
        raise GraphError("hyper_anf: lg_nom_entries must be between 4 and 21 (inclusive)")
    g = as_graph(graph)
    edges = g.edges
    if edge_filter is not None:
        edges = where(edges, edge_filter, "hyper_anf(edge_filter=...)")
    edges = edges.select("src", "dst").distinct()
    ends = edges.select(F.explode(F.array("src", "dst")).alias("id")).distinct()
    level = ends.groupBy("id").agg(F.hll_sketch_agg("id", lg_nom_entries).alias("sketch"))
    result = edges.select(F.col("src").alias("id")).distinct()
    result = result.join(level.withColumnRenamed("sketch", "hop_0"), "id", "left")
    for hop in range(1, n_hops + 1):
        level = (
            edges.join(level, edges["dst"] == level["id"])
            .groupBy(edges["src"].alias("id"))
            .agg(F.hll_union_agg("sketch", True).alias("sketch"))
        )
        result = result.join(level.withColumnRenamed("sketch", f"hop_{hop}"), "id", "left")
    return result
