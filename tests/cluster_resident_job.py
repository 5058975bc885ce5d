"""Resident rounds where several resident tasks share several executors: a skewed
partition, an executor budget too small for it, a run nested in a resident run, two runs
on two threads, a large kernel argument, and a killed resident task. Prints the results as
one JSON line. ``python cluster_resident_job.py MASTER``, run by
tests/test_cluster_resident.py in its own process (a process has one SparkContext)."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pyarrow as pa
from child_jobs import job_session
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.datacache.ledger import MAX_BYTES_PER_EXECUTOR_CONF
from iterflow.runtime.datacache.resident_policy import RESIDENT_CONF

#: Rows of the skewed partition, and of each of the seven small ones.
BIG, SMALL = 600_000, 1_000
ROWS = BIG + 7 * SMALL
#: How long a scenario may take before it counts as a deadlock.
DEADLOCK_S = 240


def skewed(spark: SparkSession) -> DataFrame:
    """Eight partitions, the fourth holding 600,000 of the 607,000 rows (4.8 MB of doubles):
    more than an even share of any byte budget that all eight fit in. Made without a
    shuffle, so each partition holds the same rows on every read."""

    def rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part in batch.column(0).to_pylist():
                start, count = (10 * SMALL, BIG) if part == 3 else (part * SMALL, SMALL)
                yield pa.RecordBatch.from_pydict(
                    {"x": np.arange(start, start + count, dtype=np.float64)}
                )

    return spark.range(0, 8, 1, 8).mapInArrow(rows, "x double")


def counting_body(seen: list, nested: Any = None) -> itf.IterationBody:
    """acc = the rows and the sum of x the kernels saw this round; the kernels also count
    their rows in the metric ``kernel_rows``."""
    kernel_rows = itf.metrics.counter("kernel_rows")

    def partial(table: pa.Table, counter: itf.metrics.Counter) -> pa.Table:
        x = table["x"].to_numpy()
        counter.inc(len(x))
        return pa.table({"rows": [len(x)], "total": [float(np.sum(x))]})

    @itf.body
    def counting(acc, points, ctx):
        if nested is not None:
            nested(ctx.epoch)
        data = ctx.columnar(points)
        seen.append(data)
        out = data.map(partial, "rows LONG, total DOUBLE", kernel_rows)
        new_acc = out.agg(F.sum("rows").alias("rows"), F.sum("total").alias("total"))
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    return counting


def run(
    spark: SparkSession,
    points: DataFrame,
    rounds: int = 3,
    nested: Any = None,
    listen: Any = None,
) -> dict:
    """The counting body for ``rounds`` rounds; what the kernels saw, and how it ran.
    ``listen(end, data)`` is called after each round with the run's columnar data."""
    seen: list = []
    it = (
        itf.BoundedIteration(counting_body(seen, nested))
        .bind("acc", spark.createDataFrame([(0, 0.0)], "rows long, total double"))
        .bind("points", points)
        .until(itf.max_rounds(rounds))
    )
    executors: set[str] = set()

    def note(end: itf.RoundEnd) -> None:
        if hasattr(seen[0], "executors"):  # resident: where its tasks run
            executors.update(seen[0].executors())
        if listen is not None:
            listen(end, seen[0])

    result = it.listen(note).run(progress=False)
    acc = result.outputs["acc"].first()
    data = seen[0]
    return {
        "rows": acc["rows"],
        "total": acc["total"],
        "kernel_rows": [p.metrics["kernel_rows"] for p in result.history],
        "resident": [p.resident for p in result.history],
        "tasks": getattr(data, "tasks", 0),
        "launched": getattr(data, "launched", 0),
        "processes": getattr(data, "processes", 0),
        "launches": getattr(data, "launches", 0),
        "location": data.plane.location if hasattr(data, "plane") else None,
        "executors": len(executors),
    }


def within(spark: SparkSession, scenario: Any) -> Any:
    """``scenario()``, or ``{"deadlock": True}`` (its jobs cancelled) past ``DEADLOCK_S``."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(scenario)
    try:
        return future.result(timeout=DEADLOCK_S)
    except concurrent.futures.TimeoutError:
        spark.sparkContext.cancelAllJobs()
        return {"deadlock": True}
    finally:
        pool.shutdown(wait=False)


class Warnings(logging.Handler):
    """The messages of the WARNINGs logged on ``iterflow.resident``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("iterflow.resident").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def budgets(spark: SparkSession, points: DataFrame, out: dict) -> None:
    """A skewed partition within its executor's budget is held whole; over it, the data falls
    back whole (auto) or is refused by name (on)."""
    spark.conf.set(MAX_BYTES_PER_EXECUTOR_CONF, "12m")
    out["skewed"] = run(spark, points)
    spark.conf.set(MAX_BYTES_PER_EXECUTOR_CONF, "2m")
    warnings = Warnings()
    out["over_budget"] = run(spark, points)
    out["over_budget"]["warnings"] = warnings.messages
    logging.getLogger("iterflow.resident").removeHandler(warnings)
    spark.conf.set(RESIDENT_CONF, "on")
    try:
        run(spark, points)
        out["over_budget_on"] = None
    except itf.IterflowError as error:
        out["over_budget_on"] = str(error)
    spark.conf.unset(RESIDENT_CONF)
    spark.conf.unset(MAX_BYTES_PER_EXECUTOR_CONF)


def nested_and_threads(spark: SparkSession, points: DataFrame, out: dict) -> None:
    """A run nested in a resident run's round, and two runs on two threads at once: resident
    tasks of all of them together take at most half the slots, and all finish."""
    small = points.where("x < 10000")  # the seven small partitions
    inner: list = []

    def nested(epoch: int) -> None:
        if epoch == 1 and not inner:
            small.count()
            inner.append(run(spark, small, rounds=2))

    out["nested"] = within(spark, lambda: {**run(spark, points, nested=nested), "inner": inner})

    def two_threads() -> list:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(run, spark, frame, 4) for frame in (points, small)]
            return [future.result() for future in runs]

    out["threads"] = within(spark, two_threads)


def large_argument(spark: SparkSession, points: DataFrame, out: dict) -> None:
    """A kernel call's payload is pickled once for all resident tasks."""
    weights = np.arange(2_500_000, dtype=np.float64)  # 20 MB
    sizes: list[int] = []
    dumps = cloudpickle.dumps

    def counted(value: Any, *args: Any, **kwargs: Any) -> bytes:
        data = dumps(value, *args, **kwargs)
        sizes.append(len(data))
        return data

    @itf.body
    def weighted(acc, points, ctx):
        data = ctx.columnar(points)
        cloudpickle.dumps = counted
        try:
            out_ = data.map(
                lambda table, w: pa.table({"s": [float(w[:10].sum()) + table.num_rows]}),
                "s DOUBLE",
                weights,
            )
        finally:
            cloudpickle.dumps = dumps
        new_acc = out_.agg(F.sum("s").alias("acc"))
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    result = (
        itf.BoundedIteration(weighted)
        .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
        .bind("points", points)
        .until(itf.max_rounds(1))
        .run(progress=False)
    )
    out["large_argument"] = {
        "resident": result.history[-1].resident,
        "acc": result.outputs["acc"].first()["acc"] if "acc" in result.outputs else None,
        "large_pickles": sum(1 for size in sizes if size >= weights.nbytes),
    }


def killed_task(spark: SparkSession, points: DataFrame, out: dict) -> None:
    """One of several resident tasks killed mid-run: the resident job is relaunched, its
    tasks load again, and every round still counts every row."""
    killed: list[int] = []

    def kill_one(end: itf.RoundEnd, data: Any) -> None:
        if end.epoch == 1:
            _task, (_host, pid) = sorted(data.tasks_alive().items())[-1]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    out["killed"] = {**run(spark, points, rounds=4, listen=kill_one), "killed": killed}


def main(master: str) -> None:
    spark = job_session(master, "iterflow-cluster-resident")
    points = skewed(spark).cache()
    points.count()
    out: dict = {"driver_pid": os.getpid(), "partitions": points.rdd.getNumPartitions()}
    budgets(spark, points, out)
    nested_and_threads(spark, points, out)
    large_argument(spark, points, out)
    killed_task(spark, points, out)
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
