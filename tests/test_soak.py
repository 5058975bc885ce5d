"""Soak: what a run holds stays flat over thousands of rounds (benchmarks/bench_soak.py
measures the same with more detail).

The measures are counts and sizes, not timings: RDDs the SparkContext holds
persisted, files under the checkpoint and columnar folders, open file descriptors
of the Python driver and of the JVM, the driver's resident set (after
``gc.collect()``) and the JVM heap in use right after ``System.gc()``. The default
run has a short bounded run checking the counts; ``-m slow_spark`` runs 2,000
bounded rounds and 2,000 unbounded epochs and compares the medians of rounds
100-500 with the last 500 rounds."""

from __future__ import annotations

import gc
import os
import statistics
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.spark.jvm import jvm_heap_after_gc, jvm_pid, persistent_rdd_count

pytestmark = pytest.mark.spark
# The kernels below run in Python workers, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Rounds between samples.
EVERY = 10
#: How much a median may grow from the early rounds to the last ones.
FLAT = 1.10


def files_under(folder: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(folder))


class Sampler:
    """Listener: the measures every ``EVERY`` rounds; ``memory`` adds the driver's resident
    set and the JVM heap after a full collection (slower)."""

    def __init__(self, spark: Any, folders: dict[str, Path], *, memory: bool) -> None:
        self.spark, self.folders, self.memory = spark, folders, memory
        self.driver, self.jvm = psutil.Process(), psutil.Process(jvm_pid(spark))
        self.samples: list[dict[str, float]] = []

    def __call__(self, end: itf.RoundEnd) -> None:
        if (end.epoch + 1) % EVERY:
            return
        sample: dict[str, float] = {
            "epoch": end.epoch,
            "persisted_rdds": persistent_rdd_count(self.spark),
            "python_fds": self.driver.num_fds(),
            "jvm_fds": self.jvm.num_fds(),
            **{f"{name}_files": files_under(path) for name, path in self.folders.items()},
        }
        if self.memory:
            gc.collect()
            sample["driver_rss"] = self.driver.memory_info().rss
            sample["jvm_heap_after_gc"] = jvm_heap_after_gc(self.spark)
        self.samples.append(sample)

    def window(self, key: str, first: int, last: int) -> list[float]:
        return [s[key] for s in self.samples if first <= s["epoch"] <= last]


def assert_flat(sampler: Sampler, rounds: int) -> None:
    """Every measure's median over the last quarter of the rounds is at most ``FLAT``
    times its median over rounds ``rounds/20``..``rounds/4`` (100-500 of 2,000).

    The JVM heap is compared with rounds ``rounds/2``..``3 rounds/4`` instead: Spark's
    status store keeps the last 1,000 jobs, stages and SQL executions (with the UI
    off too), so the heap rises by some 10 MiB over the first 1,000 rounds and is
    flat after (benchmarks/README.md, "Soak")."""
    grown = {}
    for key in sampler.samples[0]:
        if key == "epoch":
            continue
        first, last = rounds // 20, rounds // 4
        if key == "jvm_heap_after_gc":  # once Spark's status store is full (see above)
            first, last = rounds // 2, rounds * 3 // 4
        early = statistics.median(sampler.window(key, first, last))
        late = statistics.median(sampler.window(key, rounds - rounds // 4, rounds))
        if late > max(early * FLAT, early + 1):
            grown[key] = (early, late)
    assert not grown, f"grew to the last {rounds // 4} rounds: {grown}"


@itf.body
def halve(x):
    return itf.Declaration(
        feedback={"x": x.select((F.col("n") + 1).alias("n"), (F.col("v") / 2).alias("v"))}
    )


@pytest.mark.slow_spark  # a soak test; the 2,000-round ones are slow too
def test_a_checkpointed_run_holds_no_more_rdds_files_or_fds_at_the_end(spark, tmp_path):
    """300 rounds with a checkpoint every 10: after the first checkpoints, the persisted
    RDDs, the checkpoint folder's files and the open descriptors stay where they were."""
    checkpoints = tmp_path / "ckpt"
    sampler = Sampler(spark, {"checkpoint": checkpoints}, memory=False)
    result = (
        itf.BoundedIteration(halve)
        .bind("x", spark.createDataFrame([(0, 1.0)], "n long, v double"))
        .until(itf.max_rounds(300))
        .listen(sampler)
        .run(
            progress=False,
            checkpoint_dir=str(checkpoints),
            checkpoint_every=10,
            keep_history=20,
            event_log=str(tmp_path / "events.jsonl"),
        )
    )
    assert result.rounds == 300 and len(result.history) == 20
    for key in ("persisted_rdds", "checkpoint_files"):
        early, late = sampler.window(key, 50, 150), sampler.window(key, 200, 300)
        assert max(late) <= max(early), (key, early, late)
    for key in ("python_fds", "jvm_fds"):
        early, late = sampler.window(key, 50, 150), sampler.window(key, 200, 300)
        assert statistics.median(late) <= statistics.median(early) + 2, (key, early, late)


# -- the 2,000-round soak ----------------------------------------------------------------


def gradient(table: pa.Table, weights: np.ndarray) -> pa.Table:
    x = np.stack(table.column("x").to_numpy(zero_copy_only=False))
    g = x.T @ (x @ weights - table.column("y").to_numpy())
    return pa.table([itf.vector_cell(g), pa.array([table.num_rows], pa.int64())], names=["g", "n"])


def step(weights: np.ndarray) -> Any:
    def combine(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total, n = np.zeros_like(weights), 0
        for batch in batches:
            for g, count in zip(
                batch.column("g").to_pylist(), batch.column("n").to_pylist(), strict=True
            ):
                total, n = total + np.asarray(g), n + count
        yield pa.RecordBatch.from_pylist([{"w": (weights - 0.1 * total / max(n, 1)).tolist()}])

    return combine


@itf.body
def least_squares(model, points, ctx):
    weights = itf.vector(model, "w").copy()
    new_model = ctx.columnar(points).map(
        gradient,
        "g ARRAY<DOUBLE>, n LONG",
        weights,
        combine=step(weights),
        combine_schema="w ARRAY<DOUBLE>",
    )
    return itf.Declaration(feedback={"model": new_model}, outputs={"model": new_model})


@pytest.mark.slow_spark
def test_2000_bounded_rounds_stay_flat(spark, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(2000, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 3.0])
    points = spark.createDataFrame(
        [(r.tolist(), float(t)) for r, t in zip(x, y, strict=True)], "x ARRAY<DOUBLE>, y DOUBLE"
    ).repartition(2)
    columnar, checkpoints = tmp_path / "columnar", tmp_path / "ckpt"
    columnar.mkdir()
    spark.conf.set("spark.iterflow.resident", "off")
    spark.conf.set("spark.iterflow.columnar.dir", str(columnar))
    sampler = Sampler(spark, {"checkpoint": checkpoints, "columnar": columnar}, memory=True)
    try:
        result = (
            itf.BoundedIteration(least_squares)
            .bind("model", spark.createDataFrame([([0.0] * 4,)], "w ARRAY<DOUBLE>"))
            .bind("points", points)
            .until(itf.max_rounds(2000))
            .listen(sampler)
            .run(
                progress=False,
                checkpoint_dir=str(checkpoints),
                checkpoint_every=10,
                keep_history=100,
                event_log=str(tmp_path / "events.jsonl"),
            )
        )
    finally:
        spark.conf.unset("spark.iterflow.resident")
        spark.conf.unset("spark.iterflow.columnar.dir")
    assert result.rounds == 2000 and len(result.history) == 100
    np.testing.assert_allclose(result.outputs["model"].first()["w"], [1.0, -2.0, 0.5, 3.0])
    assert_flat(sampler, 2000)


@itf.body
def running_total(total, ticks):
    added = ticks.agg(F.coalesce(F.sum("value"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})


@pytest.mark.slow_spark
def test_2000_unbounded_epochs_stay_flat(spark, tmp_path):
    location = tmp_path / "ckpt"
    sampler = Sampler(spark, {"checkpoint": location}, memory=True)
    reached = threading.Event()
    totals: dict[int, int] = {}

    def at_the_end(end: itf.RoundEnd) -> None:
        if end.epoch == 1999:
            totals[end.epoch] = end.outputs["total"].first()["total"]
            reached.set()

    ticks = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 10)
        .option("numPartitions", 1)
        .load()
        .select("value")
    )
    query = (
        itf.UnboundedIteration(running_total)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("ticks", ticks)
        .listen(sampler)
        .listen(at_the_end)
        .start(
            checkpoint_location=str(location),
            progress=False,
            keep_history=100,
            event_log=str(tmp_path / "events.jsonl"),
        )
    )
    try:
        while not reached.wait(5):
            assert query.is_active, query.error
    finally:
        query.stop()
    assert len(query.history) == 100
    # Epoch e takes micro-batch e: the rate source's values 10e..10e+9.
    assert totals == {1999: 20000 * 19999 // 2}
    assert_flat(sampler, 2000)
