"""The PageRank demo: a random-graph generator and a runner of ``iterflow.graph``'s
PageRank body that returns the whole ``IterationResult``.

It runs ``iterflow.graph``'s PageRank body (``pagerank_body``, with its
``initial_ranks``, re-exported here for the examples) through ``iterflow``'s public
names, like any user would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import initial_ranks, pagerank_body

__all__ = ["initial_ranks", "pagerank", "pagerank_body", "random_graph"]


def random_graph(
    spark: SparkSession,
    vertices: int,
    edges: int,
    *,
    seed: int = 1,
    dangling_fraction: float = 0.1,
    partitions: int | None = None,
) -> tuple[DataFrame, DataFrame]:
    """A directed random graph: ``vertices`` ids 0..n-1 and about ``edges`` edges.

    The last ``dangling_fraction`` of the ids have no out-edges. Self-loops and
    duplicate edges are dropped, so slightly fewer than ``edges`` remain. The
    graph depends only on the arguments (hashes, not task order).
    """
    if vertices < 2 or edges < 1:
        raise ValueError("random_graph needs at least 2 vertices and 1 edge")
    sources = max(1, int(vertices * (1.0 - dangling_fraction)))
    vertex_df = spark.range(vertices, numPartitions=partitions).select(F.col("id"))
    edge_df = (
        spark.range(edges, numPartitions=partitions)
        .select(
            F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit("src")), F.lit(sources)).alias("src"),
            F.pmod(F.xxhash64(F.col("id"), F.lit(seed), F.lit("dst")), F.lit(vertices)).alias(
                "dst"
            ),
        )
        .where(F.col("src") != F.col("dst"))
        .distinct()
    )
    return vertex_df, edge_df


def pagerank(
    vertices: DataFrame,
    edges: DataFrame,
    *,
    tol: float | None = 1e-8,
    max_rounds: int = 100,
    alpha: float = 0.85,
    listen: Sequence[object] = (),
    **run_options: Any,
) -> itf.IterationResult:
    """Run PageRank to an L1 tolerance (or for ``max_rounds``); output ``ranks`` is (id, rank).

    ``listen`` holds listeners given to ``BoundedIteration.listen``, in order;
    ``run_options`` go to ``run()``: ``progress=``, ``event_log=``.
    """
    n = vertices.count()
    iteration = (
        itf.BoundedIteration(pagerank_body(n, alpha=alpha, tol=tol))
        .bind("ranks", initial_ranks(vertices, edges))
        .bind("edges", edges.select("src", "dst"))
        .until(itf.max_rounds(max_rounds))
    )
    for listener in listen:
        iteration.listen(listener)
    return iteration.run(**run_options)
