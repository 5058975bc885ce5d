"""A declarative round's Spark jobs: its bookkeeping (criteria, convergence values) rides
on the jobs that materialize its feedback, and its jobs are planned once (no adaptive
re-planning: one job per round plus its broadcasts). Counted with the driver's job ids,
as the other job-count tests do; results are compared with the adaptive path's."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sessions import jobs_started

import iterflow as itf
from iterflow.graph import initial_ranks, pagerank_body
from iterflow.runtime.round.tally import zero

# The bodies of benchmarks/bench_round_jobs.py: the README's components and k-means.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _bodies import kmeans_body, propagate

AQE = "spark.sql.adaptive.enabled"


@itf.body
def propagate_blind(labels: DataFrame, edges: DataFrame) -> itf.Declaration:
    """The same rounds without criteria: what its bookkeeping may cost is the difference."""
    sent = edges.join(labels, edges.src == labels.id).select(F.col("dst").alias("id"), "label")
    best = labels.unionByName(sent).groupBy("id").agg(F.min("label").alias("label"))
    return itf.Declaration(feedback={"labels": best}, outputs={"labels": best})


def components_inputs(spark: SparkSession, n: int) -> dict[str, DataFrame]:
    """A path 0-...-(n-1) and a few chords, both directions; labels start at the ids."""
    pairs = [(v, v + 1) for v in range(n - 1)] + [(0, n // 2), (3, n - 2)]
    edges = spark.createDataFrame(pairs + [(b, a) for a, b in pairs], "src long, dst long")
    labels = spark.createDataFrame([(v, v) for v in range(n)], "id long, label long")
    return {"labels": labels, "edges": edges}


def kmeans_inputs(spark: SparkSession) -> dict[str, DataFrame]:
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 0.0], [8.0, 1.0], [2.0, 9.0]])
    xy = centres[np.arange(300) % 3] + rng.normal(size=(300, 2))
    points = spark.createDataFrame(
        [(i, float(x), float(y)) for i, (x, y) in enumerate(xy)], "id long, x double, y double"
    )
    centroids = spark.createDataFrame(
        [(k, float(x), float(y)) for k, (x, y) in enumerate(xy[:3])],
        "cluster int, cx double, cy double",
    )
    return {"centroids": centroids, "points": points}


def run_counting(
    spark: SparkSession, body: itf.IterationBody, inputs: dict[str, DataFrame], **until: Any
) -> tuple[itf.IterationResult, list[int]]:
    """Run ``body`` and count the Spark jobs each round started (up to its listener)."""
    marks = [jobs_started(spark)]
    iteration = itf.BoundedIteration(body)
    for name, df in inputs.items():
        iteration = iteration.bind(name, df)
    if "rounds" in until:
        iteration = iteration.until(itf.max_rounds(until["rounds"]))
    result = iteration.listen(lambda _end: marks.append(jobs_started(spark))).run(progress=False)
    return result, [b - a for a, b in itertools.pairwise(marks)]


@pytest.fixture
def adaptive(spark: SparkSession) -> Iterator[None]:
    """Rounds keep the session's adaptive execution (the path before static planning)."""
    spark.conf.set("spark.iterflow.adaptive", "true")
    spark.conf.set(AQE, "true")
    try:
        yield
    finally:
        spark.conf.unset("spark.iterflow.adaptive")
        spark.conf.unset(AQE)


def sorted_rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in df.collect())


def test_the_readme_components_criteria_ride_on_the_checkpoint(spark: SparkSession) -> None:
    inputs = components_inputs(spark, 12)
    result, jobs = run_counting(spark, propagate, inputs)
    blind, blind_jobs = run_counting(spark, propagate_blind, inputs, rounds=result.rounds)
    assert result.termination.reason == "criteria_empty"
    assert sorted_rows(result.outputs["labels"]) == [(v, 0) for v in range(12)]
    # After round 0 (which caches the inputs) a round with criteria runs the job of the
    # same round without them: the emptiness test and its row count add no job of their
    # own, only the broadcast their anti-join plans (Spark runs a broadcast as a job).
    assert all(a - b == 1 for a, b in zip(jobs[1:], blind_jobs[1:], strict=True))
    assert max(jobs[1:]) <= 3
    # The criteria's rows are counted every round (the feedback is always all 12).
    assert all(p.criteria_rows is not None for p in result.history)
    assert result.history[-1].criteria_rows == 0
    assert sorted_rows(blind.outputs["labels"]) == sorted_rows(result.outputs["labels"])
    result.release()
    blind.release()


def test_a_convergence_value_rides_on_a_target_collected_to_the_driver(
    spark: SparkSession,
) -> None:
    inputs = kmeans_inputs(spark)
    result, jobs = run_counting(spark, kmeans_body(-1.0), inputs, rounds=5)
    fixed, fixed_jobs = run_counting(spark, kmeans_body(None), inputs, rounds=5)
    # The value adds no job of its own, only the broadcast its join plans.
    assert jobs[1:] == [3] * 4
    assert fixed_jobs[1:] == [2] * 4
    assert [p.converged_value for p in result.history][-1] < 1e-6
    assert sorted_rows(fixed.outputs["centroids"]) == sorted_rows(result.outputs["centroids"])


def pagerank_inputs(spark: SparkSession) -> dict[str, DataFrame]:
    edges = spark.createDataFrame(
        [(v, (v * 7 + 3) % 40) for v in range(40)] + [(v, (v + 1) % 40) for v in range(35)],
        "src long, dst long",
    ).distinct()
    return {"ranks": initial_ranks(spark.range(40), edges), "edges": edges}


def test_the_pagerank_body_runs_one_job_per_round_plus_its_broadcasts(
    spark: SparkSession,
) -> None:
    inputs = pagerank_inputs(spark)
    result, jobs = run_counting(spark, pagerank_body(40), inputs, rounds=5)
    # One job, and a broadcast for each small side of its joins (the edges, the
    # shares, the dangling rank, the contributions) that Spark runs as a job of its own.
    assert jobs[1:] == [4] * 4
    converging, converging_jobs = run_counting(spark, pagerank_body(40, tol=-1.0), inputs, rounds=5)
    # The L1 change rides on the checkpoint's job; the old ranks it joins are one more
    # broadcast.
    assert converging_jobs[1:] == [5] * 4
    assert sum(r for _, r in sorted_rows(result.outputs["ranks"].select("id", "rank"))) == (
        pytest.approx(1.0, abs=1e-12)
    )
    result.release()
    converging.release()


def outputs_of_each_body(spark: SparkSession) -> tuple[dict[str, list[Any]], dict[str, list[int]]]:
    """The outputs of the three bodies, and their jobs per round after round 0."""
    runs = {
        "labels": run_counting(spark, propagate, components_inputs(spark, 12)),
        "centroids": run_counting(spark, kmeans_body(-1.0), kmeans_inputs(spark), rounds=5),
        "ranks": run_counting(spark, pagerank_body(40, tol=-1.0), pagerank_inputs(spark), rounds=5),
    }
    return (
        {name: sorted_rows(result.outputs[name]) for name, (result, _) in runs.items()},
        {name: jobs[1:] for name, (_, jobs) in runs.items()},
    )


def test_results_equal_the_adaptive_path(spark: SparkSession, adaptive: None) -> None:
    before, adaptive_jobs = outputs_of_each_body(spark)
    spark.conf.unset("spark.iterflow.adaptive")
    assert spark.conf.get(AQE) == "true"
    after, jobs = outputs_of_each_body(spark)
    assert spark.conf.get(AQE) == "true"  # the rounds put the session's setting back
    for name in jobs:
        assert sum(jobs[name]) < sum(adaptive_jobs[name]), name
    assert after["labels"] == before["labels"]  # minimum labels: to the bit
    # Sums and averages agree to the last bits: a static plan may group a partial
    # aggregation's rows otherwise than an adaptive one.
    for name in ("centroids", "ranks"):
        assert [row[0] for row in after[name]] == [row[0] for row in before[name]]
        np.testing.assert_allclose(
            np.array([row[1:] for row in after[name]], dtype=float),
            np.array([row[1:] for row in before[name]], dtype=float),
            rtol=1e-12,
            atol=1e-15,
        )


def test_the_adaptive_setting_is_put_back_when_a_round_fails(spark: SparkSession) -> None:
    @itf.body
    def broken(items: DataFrame) -> itf.Declaration:
        bad = items.select((F.col("id") / F.lit(0)).cast("int").alias("id"))
        return itf.Declaration(
            feedback={"items": bad}, until=itf.converged(bad.agg(F.max("nope")), 0.1)
        )

    before = spark.conf.get(AQE)
    with pytest.raises(itf.IterflowError):
        itf.BoundedIteration(broken).bind("items", spark.range(3)).until(itf.max_rounds(2)).run(
            progress=False
        )
    assert spark.conf.get(AQE) == before


def test_a_criteria_only_loop_gets_an_estimate_within_two_times(spark: SparkSession) -> None:
    # A path: the minimum label walks one vertex a round, so the criteria's rows (the
    # vertices whose label changed) fall by one a round: the rounds left are known.
    n = 14
    edges = spark.createDataFrame(
        [(v, v + 1) for v in range(n - 1)] + [(v + 1, v) for v in range(n - 1)],
        "src long, dst long",
    )
    labels = spark.createDataFrame([(v, v) for v in range(n)], "id long, label long")
    result = (
        itf.BoundedIteration(propagate)
        .bind("labels", labels)
        .bind("edges", edges)
        .run(progress=False)
    )
    assert result.termination.reason == "criteria_empty"
    last = result.rounds - 1
    for p in result.history[5:-1]:
        remaining = last - p.epoch
        assert p.rounds_remaining_estimate is not None, p.epoch
        assert remaining / 2 <= p.rounds_remaining_estimate <= 2 * remaining, p.epoch


@pytest.mark.parametrize(
    "kind",
    [
        "int",
        "bigint",
        "double",
        "decimal(10,2)",
        "string",
        "binary",
        "boolean",
        "date",
        "timestamp",
        "timestamp_ntz",
        "array<double>",
        "map<string,bigint>",
        "struct<a:bigint,b:array<string>>",
        "interval day to second",
    ],
)
def test_a_tally_branch_never_makes_a_column_nullable(spark: SparkSession, kind: str) -> None:
    target = spark.createDataFrame([], f"c {kind}").select(F.col("c"))
    strict = spark.range(1).select(zero(target.schema.fields[0].dataType).alias("c"))
    assert strict.schema.fields[0].nullable is False
    assert strict.schema.fields[0].dataType.simpleString().replace(" ", "") == kind.replace(" ", "")
