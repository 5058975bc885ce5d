"""PageRank as an iterflow body, with a random-graph generator for the demo.

Normalization (the same as networkx's ``pagerank``): ranks sum to 1, a vertex
without out-edges (dangling) spreads its rank uniformly over all vertices, and

    rank'(v) = (1 - alpha) / n + alpha * (sum over u -> v of rank(u) / out(u) + dangling / n)

Uses only ``iterflow``'s public names, like any user would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf

ALPHA = 0.85


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


def initial_ranks(vertices: DataFrame, edges: DataFrame) -> DataFrame:
    """Round-0 ranks: ``(id, rank = 1/n, out_degree)`` for every vertex."""
    n = vertices.count()
    degrees = edges.groupBy(F.col("src").alias("id")).agg(F.count(F.lit(1)).alias("out_degree"))
    return (
        vertices.select("id")
        .join(degrees, "id", "left")
        .select(
            "id",
            F.lit(1.0 / n).alias("rank"),
            F.coalesce(F.col("out_degree"), F.lit(0)).cast("long").alias("out_degree"),
        )
    )


def pagerank_update(
    ranks: DataFrame,
    edges: DataFrame,
    n: int,
    alpha: float = ALPHA,
    observe: Callable[[str, DataFrame], DataFrame] = lambda _name, df: df,
) -> tuple[DataFrame, DataFrame]:
    """One PageRank step: ``(new_ranks, delta)``.

    ``delta`` is a one-row DataFrame holding the L1 change of the ranks;
    ``observe`` wraps the per-vertex contributions (e.g. ``ctx.observe``).
    """
    shares = ranks.where(F.col("out_degree") > 0).select(
        F.col("id").alias("src"), (F.col("rank") / F.col("out_degree")).alias("share")
    )
    contributions = observe(
        "contributions",
        edges.join(shares, "src").groupBy(F.col("dst").alias("id")).agg(F.sum("share").alias("in")),
    )
    dangling = ranks.where(F.col("out_degree") == 0).agg(
        F.coalesce(F.sum("rank"), F.lit(0.0)).alias("dangling")
    )
    new_ranks = (
        ranks.join(contributions, "id", "left")
        .crossJoin(F.broadcast(dangling))
        .select(
            "id",
            (
                F.lit((1.0 - alpha) / n)
                + F.lit(alpha) * (F.coalesce(F.col("in"), F.lit(0.0)) + F.col("dangling") / n)
            ).alias("rank"),
            "out_degree",
        )
    )
    delta = (
        new_ranks.alias("new")
        .join(ranks.alias("old"), "id")
        .agg(F.coalesce(F.sum(F.abs(F.col("new.rank") - F.col("old.rank"))), F.lit(0.0)))
    )
    return new_ranks, delta


def pagerank_body(n: int, *, alpha: float = ALPHA, tol: float | None = None) -> itf.IterationBody:
    """The PageRank body for ``n`` vertices; with ``tol`` it stops once the L1 change <= tol."""

    @itf.body
    def pagerank_step(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        new_ranks, delta = pagerank_update(ranks, edges, n, alpha, observe=ctx.observe)
        return itf.Declaration(
            feedback={"ranks": new_ranks},
            outputs={"ranks": new_ranks},
            until=itf.converged(delta, tol) if tol is not None else None,
        )

    return pagerank_step


def pagerank(
    vertices: DataFrame,
    edges: DataFrame,
    *,
    tol: float | None = 1e-8,
    max_rounds: int = 100,
    alpha: float = ALPHA,
    listeners: tuple[object, ...] = (),
    **run_options: Any,
) -> itf.IterationResult:
    """Run PageRank to an L1 tolerance (or for ``max_rounds``); output ``ranks`` is (id, rank).

    ``run_options`` go to ``run()``: ``progress=``, ``event_log=``.
    """
    n = vertices.count()
    iteration = (
        itf.BoundedIteration(pagerank_body(n, alpha=alpha, tol=tol))
        .bind("ranks", initial_ranks(vertices, edges))
        .bind("edges", edges.select("src", "dst"))
        .until(itf.max_rounds(max_rounds))
    )
    for listener in listeners:
        iteration.listen(listener)
    return iteration.run(**run_options)
