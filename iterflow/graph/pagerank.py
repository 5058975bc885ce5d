"""PageRank, with networkx's normalization: ranks sum to 1, a vertex without
out-edges (dangling) spreads its rank uniformly over all vertices, and

    rank'(v) = (1 - alpha) / n + alpha * (sum over u -> v of rank(u) / out(u) + dangling / n)

Written on iterflow's public API only; ``iterflow.demo.pagerank`` runs the same body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.model import as_graph

ALPHA = 0.85


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
    graph: Any,
    *,
    tol: float | None = 1e-8,
    max_rounds: int = 100,
    alpha: float = ALPHA,
    listen: Any = None,
    **run_options: Any,
) -> DataFrame:
    """The vertices of ``graph`` with a ``pagerank`` column, iterated until the L1 change of
    the ranks is at most ``tol`` (``tol=None``: exactly ``max_rounds`` rounds).

    Duplicate edges count once and a self-loop counts as an out-edge, as in a networkx
    ``DiGraph``. ``listen`` and ``run_options`` are as in ``connected_components``.

    Example::

        ranks = pagerank(Graph(vertices, edges), tol=1e-6)
    """
    g = as_graph(graph)
    edges = g.edges.select("src", "dst").distinct()
    iteration = (
        itf.BoundedIteration(pagerank_body(g.vertices.count(), alpha=alpha, tol=tol))
        .bind("ranks", initial_ranks(g.vertices, edges))
        .bind("edges", edges)
        .until(itf.max_rounds(max_rounds))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    ranks = iteration.run(**run_options).outputs["ranks"]
    return g.vertices.join(ranks.select("id", F.col("rank").alias("pagerank")), "id")
