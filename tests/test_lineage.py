"""Plans and persisted data do not grow with the round count."""

from __future__ import annotations

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sessions import estimated_bytes, is_connect, persisted_rdds, plan_nodes

import iterflow as itf

pytestmark = pytest.mark.spark


def persisted_count(spark: SparkSession, baseline: frozenset[int] = frozenset()) -> int:
    """Persisted RDDs behind ``spark`` that are not in ``baseline``. Earlier tests leave
    unreleased results behind, which the JVM's garbage collector may unpersist at any
    moment: a count that includes them can drop in the middle of a run."""
    return len(set(persisted_rdds(spark)) - baseline)


def test_plan_size_and_persisted_rdds_stay_flat_over_sixty_rounds(spark: SparkSession) -> None:
    weights = spark.range(200, numPartitions=2).select("id", (F.col("id") % 7).alias("w"))
    values = spark.range(200, numPartitions=2).select("id", F.lit(0.0).alias("v"))
    baseline = frozenset(persisted_rdds(spark))
    nodes: list[int] = []
    persisted: list[int] = []
    estimates: list[int] = []

    def watch(ctx: itf.RoundEnd) -> None:
        persisted.append(persisted_count(spark, baseline))
        estimates.append(estimated_bytes(ctx.variables["values"]))

    @itf.body
    def smooth(values: DataFrame, weights: DataFrame) -> itf.Declaration:
        following = values.join(weights, "id").select(
            "id", (F.col("v") * 0.5 + F.col("w")).alias("v")
        )
        nodes.append(plan_nodes(following))
        return itf.Declaration(feedback={"values": following}, outputs={"values": following})

    result = (
        itf.BoundedIteration(smooth)
        .bind("values", values)
        .bind("weights", weights)
        .until(itf.max_rounds(60))
        .listen(watch)
        .run()
    )
    assert result.rounds == 60
    assert nodes[59] <= nodes[5]
    assert nodes[5:] == [nodes[5]] * 55  # identical shape every round
    if is_connect(spark):
        # A Connect server frees released checkpoints when its JVM collects them: the
        # count wobbles by those not collected yet, but does not grow with the rounds.
        assert max(persisted[30:]) <= max(persisted[4:10])
    else:
        assert persisted[59] == persisted[4]
        assert max(persisted[4:]) == persisted[4]
    # Statistics do not compound either: 200 rows of (id long, v double) plus row overhead
    # (over Connect, the size of the cache the checkpoint was made from).
    if is_connect(spark):
        assert estimates[1:] == [estimates[1]] * 59 and estimates[1] < 64 * 1024
    else:
        assert estimates == [200 * (8 + 8 + 8)] * 60
    # v converges to 2w (v = v/2 + w); after 60 halvings it is exact in doubles.
    got = {r["id"]: r["v"] for r in result.outputs["values"].collect()}
    assert got == {i: pytest.approx(2.0 * (i % 7), abs=1e-12) for i in range(200)}
    result.release()
    if not is_connect(spark):  # a Connect server frees released checkpoints when its JVM
        assert persisted_count(spark, baseline) == 0  # collects them (docs/deploy.md)


def test_a_plain_loop_without_lineage_cutting_does_grow(spark: SparkSession) -> None:
    """The contrast that makes the previous test meaningful."""
    weights = spark.range(20).select("id", (F.col("id") % 7).alias("w"))
    values = spark.range(20).select("id", F.lit(0.0).alias("v"))
    sizes = []
    for _ in range(6):
        values = values.join(weights, "id").select("id", (F.col("v") * 0.5 + F.col("w")).alias("v"))
        sizes.append(plan_nodes(values))
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
