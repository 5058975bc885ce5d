"""The declarative bodies whose Spark jobs per round the round benchmarks count.

- ``pagerank``: the PageRank body of ``bench_round_growth.py`` (``pagerank_body(n)``).
- ``components``: the README's connected-components example, on a path of ``n``
  vertices plus ``n/20`` random chords (undirected), run until no label changes.
- ``readme``: the README's example itself, on its five vertices (3 rounds).
- ``kmeans``: k-means written as DataFrame steps: points cross-joined with the
  centroids (a variable held on the driver), each point's nearest centroid by
  ``min_by``, new centroids by ``groupBy``, until no centroid moves more than ``tol``.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf


@itf.body
def propagate(labels: DataFrame, edges: DataFrame) -> itf.Declaration:
    """The README's body: min-label propagation until no label changes."""
    sent = edges.join(labels, edges.src == labels.id).select(F.col("dst").alias("id"), "label")
    best = labels.unionByName(sent).groupBy("id").agg(F.min("label").alias("label"))
    changed = best.join(labels, ["id", "label"], "left_anti")
    return itf.Declaration(
        feedback={"labels": best}, outputs={"labels": best}, until=itf.empty(changed)
    )


def components_inputs(spark: SparkSession, n: int, seed: int = 7) -> dict[str, DataFrame]:
    """A path 0-1-...-(n-1) plus n/20 random chords, both directions of every edge; labels
    start at the vertex ids. The chords make the graph's diameter, and so the rounds,
    a few dozen, and the rows of the criteria fall over many rounds: a loop whose end
    an estimate can foresee."""
    path = spark.range(n - 1).select(F.col("id").alias("src"), (F.col("id") + 1).alias("dst"))
    chords = spark.range(n // 20).select(
        F.pmod(F.xxhash64("id", F.lit(seed), F.lit("a")), F.lit(n)).alias("src"),
        F.pmod(F.xxhash64("id", F.lit(seed), F.lit("b")), F.lit(n)).alias("dst"),
    )
    pairs = path.unionByName(chords).where(F.col("src") != F.col("dst"))
    edges = pairs.unionByName(pairs.select(F.col("dst").alias("src"), F.col("src").alias("dst")))
    edges = edges.distinct().cache()
    edges.count()
    labels = spark.range(n).select(F.col("id"), F.col("id").alias("label")).cache()
    labels.count()
    return {"labels": labels, "edges": edges}


def readme_inputs(spark: SparkSession) -> dict[str, DataFrame]:
    """The README's own five vertices: 1-2-3 and 4-5."""
    pairs = spark.createDataFrame([(1, 2), (2, 3), (4, 5)], "src long, dst long")
    edges = pairs.unionByName(pairs.select(F.col("dst").alias("src"), F.col("src").alias("dst")))
    labels = spark.createDataFrame([(v, v) for v in range(1, 6)], "id long, label long")
    return {"labels": labels, "edges": edges}


def kmeans_body(tol: float | None) -> itf.IterationBody:
    """Lloyd's k-means over ``points (id, x, y)`` and ``centroids (cluster, cx, cy)``, until
    no centroid moves more than ``tol`` (None: no convergence value)."""

    @itf.body
    def lloyd(centroids: DataFrame, points: DataFrame) -> itf.Declaration:
        distance = (F.col("x") - F.col("cx")) ** 2 + (F.col("y") - F.col("cy")) ** 2
        nearest = (
            points.crossJoin(F.broadcast(centroids))
            .groupBy("id", "x", "y")
            .agg(F.min_by("cluster", distance).alias("cluster"))
        )
        moved = nearest.groupBy("cluster").agg(F.avg("x").alias("cx"), F.avg("y").alias("cy"))
        old = centroids.select("cluster", F.col("cx").alias("ox"), F.col("cy").alias("oy"))
        shift = moved.join(old, "cluster").agg(
            F.max(F.abs(F.col("cx") - F.col("ox")) + F.abs(F.col("cy") - F.col("oy")))
        )
        return itf.Declaration(
            feedback={"centroids": moved},
            outputs={"centroids": moved},
            until=itf.converged(shift, tol) if tol is not None else None,
        )

    return lloyd


def kmeans_inputs(spark: SparkSession, n: int, k: int = 8, seed: int = 3) -> dict[str, DataFrame]:
    """``n`` points around ``k`` centres on a circle; the first ``k`` points as centroids."""
    points = (
        spark.range(n)
        .select(
            "id",
            (F.cos(F.col("id") % k) * 10 + F.randn(seed)).alias("x"),
            (F.sin(F.col("id") % k) * 10 + F.randn(seed + 1)).alias("y"),
        )
        .cache()
    )
    points.count()
    first = points.where(F.col("id") < k).select(
        F.col("id").cast("int").alias("cluster"), F.col("x").alias("cx"), F.col("y").alias("cy")
    )
    centroids = spark.createDataFrame(first.collect(), first.schema)
    return {"centroids": centroids, "points": points}


Case = tuple[itf.IterationBody, dict[str, Any], int]


def bodies(spark: SparkSession, quick: bool) -> dict[str, Case]:
    """Body, inputs and rounds of each benchmarked body."""
    from _common import pagerank_workload

    from iterflow.graph import pagerank_body

    w = pagerank_workload(spark, 2_000 if quick else 20_000, 20_000 if quick else 200_000, 0)
    n = 10_000 if quick else 100_000
    return {
        "pagerank": (pagerank_body(w.n), {"ranks": w.ranks0, "edges": w.edges}, 8 if quick else 30),
        "components": (propagate, components_inputs(spark, n), 200),
        "kmeans": (kmeans_body(1e-9), kmeans_inputs(spark, n), 8 if quick else 20),
        "readme": (propagate, readme_inputs(spark), 10),
    }
