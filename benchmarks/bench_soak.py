"""Soak: does a long run hold what it held early on? 2,000 bounded rounds, 2,000 unbounded epochs.

Small data and fast rounds, so that what grows with the round count shows:

- bounded: a least-squares gradient step on 2,000 points in 4 dimensions, the model
  one row held on the driver, the points read through ``ctx.columnar`` on the file
  path (``spark.iterflow.resident=off``, ``spark.iterflow.columnar.dir`` a folder of
  its own), with ``checkpoint_dir``, ``checkpoint_every=10``, an ``event_log`` and
  ``keep_history=100``; 2,000 rounds (``max_rounds``);
- unbounded: a running sum over Spark's ``rate-micro-batch`` source (10 rows per
  micro-batch, one partition, micro-batches back to back), one epoch per micro-batch,
  the sum a state variable, an ``event_log`` and ``keep_history=100``, commits before
  each micro-batch returns; stopped after 2,000 epochs.

A listener samples every ``SAMPLE_EVERY`` rounds: the driver's resident set
(after ``gc.collect()``), the JVM heap in use right after ``System.gc()``, the RDDs
the SparkContext holds persisted, files and bytes under the columnar folder and
under the checkpoint folder, the open file descriptors of the Python driver and of
the JVM, and the bytes of the event log. Reported for every measure: the mean of
the samples of rounds 100-500 and of the last 500 rounds, and their ratio; a
measure is flat when the ratio is at most 1.10 (or both means are 0). The event
log grows on purpose (it is the full record): its bytes per round are reported.

    python benchmarks/bench_soak.py [--quick]
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
from _common import finish, log, parse_args, print_table, start_session
from pyspark.cloudpickle import dumps
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.spark.jvm import jvm_heap_after_gc, jvm_pid, persistent_rdd_count

SAMPLE_EVERY = 10
FLAT = 1.10
KEEP_HISTORY = 100
POINTS, DIMS = 2_000, 4
LEARNING_RATE = 0.1
ROWS_PER_BATCH = 10
#: The measures compared between the early and the late window.
MEASURES = (
    "driver_rss_bytes",
    "jvm_heap_after_gc_bytes",
    "persisted_rdds",
    "columnar_files",
    "columnar_bytes",
    "checkpoint_files",
    "checkpoint_bytes",
    "python_fds",
    "jvm_fds",
)


def folder_size(folder: Path) -> tuple[int, int]:
    """Files and bytes under ``folder`` (0, 0 when it does not exist)."""
    files = size = 0
    for root, _dirs, names in os.walk(folder):
        for name in names:
            try:
                size += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # deleted meanwhile (an old checkpoint)
                continue
            files += 1
    return files, size


class Sampler:
    """Listener: the measures every ``every`` rounds (the rounds ``every - 1``, ...)."""

    def __init__(
        self,
        spark: SparkSession,
        *,
        columnar: Path,
        checkpoints: Path,
        event_log: Path,
        every: int = SAMPLE_EVERY,
    ) -> None:
        self.spark = spark
        self.columnar, self.checkpoints, self.event_log = columnar, checkpoints, event_log
        self.every = every
        self.driver = psutil.Process()
        self.jvm = psutil.Process(jvm_pid(spark))
        self.samples: list[dict[str, Any]] = []
        self.last_epoch = -1

    def __call__(self, end: itf.RoundEnd) -> None:
        self.last_epoch = end.epoch
        if (end.epoch + 1) % self.every == 0:
            self.samples.append(self.sample(end.epoch))
        if (end.epoch + 1) % 100 == 0:
            s = self.samples[-1]
            log(
                f"  round {end.epoch}: rss {s['driver_rss_bytes'] / 2**20:.1f} MiB, heap "
                f"{s['jvm_heap_after_gc_bytes'] / 2**20:.1f} MiB, rdds {s['persisted_rdds']}, "
                f"checkpoint files {s['checkpoint_files']}, fds {s['python_fds']}/{s['jvm_fds']}"
            )

    def sample(self, epoch: int) -> dict[str, Any]:
        gc.collect()
        columnar_files, columnar_bytes = folder_size(self.columnar)
        checkpoint_files, checkpoint_bytes = folder_size(self.checkpoints)
        return {
            "epoch": epoch,
            "time": time.time(),
            "driver_rss_bytes": self.driver.memory_info().rss,
            "jvm_heap_after_gc_bytes": jvm_heap_after_gc(self.spark),
            "persisted_rdds": persistent_rdd_count(self.spark),
            "columnar_files": columnar_files,
            "columnar_bytes": columnar_bytes,
            "checkpoint_files": checkpoint_files,
            "checkpoint_bytes": checkpoint_bytes,
            "python_fds": self.driver.num_fds(),
            "jvm_fds": self.jvm.num_fds(),
            "event_log_bytes": self.event_log.stat().st_size if self.event_log.exists() else 0,
        }


def history_cost(history: list[itf.RoundProgress]) -> dict[str, float]:
    """Bytes per round of ``history``: pickled (what a checkpoint's history segment holds)
    and in memory (what ``tracemalloc`` sees allocated for an unpickled copy)."""
    raw = dumps(history)
    tracemalloc.start()
    copy = pickle.loads(raw)
    in_memory, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "history_pickled_bytes_per_round": len(raw) / len(copy),
        "history_memory_bytes_per_round": in_memory / len(copy),
    }


def flatness(samples: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """Per measure: the mean of rounds ``rounds/20``..``rounds/4`` (100-500 of 2,000) and of
    the last quarter (the last 500 of 2,000), their ratio, and whether it is flat."""
    early = (rounds // 20, rounds // 4)
    late = (rounds - rounds // 4, rounds - 1)

    def window(first: int, last: int, key: str) -> list[float]:
        return [float(s[key]) for s in samples if first <= s["epoch"] <= last]

    summary: dict[str, Any] = {"early_rounds": list(early), "late_rounds": list(late)}
    for key in MEASURES:
        a, b = window(*early, key), window(*late, key)
        if not a or not b:
            continue
        early_mean, late_mean = float(np.mean(a)), float(np.mean(b))
        if early_mean == 0:
            ratio = 1.0 if late_mean == 0 else float("inf")
        else:
            ratio = late_mean / early_mean
        summary[key] = {
            "early_mean": early_mean,
            "late_mean": late_mean,
            "early_median": float(np.median(a)),
            "late_median": float(np.median(b)),
            "late_max": float(np.max(b)),
            "ratio": ratio,
            "flat": ratio <= FLAT,
        }
    logged = [(s["epoch"], s["event_log_bytes"]) for s in samples]
    if len(logged) >= 2:
        (e0, b0), (e1, b1) = logged[len(logged) // 10], logged[-1]
        summary["event_log_bytes_per_round"] = (b1 - b0) / (e1 - e0)
    return summary


# -- the bounded run -----------------------------------------------------------------


def gradient(table: pa.Table, weights: np.ndarray) -> pa.Table:
    """The least-squares gradient over one file's points, and their count."""
    x = np.stack(table.column("x").to_numpy(zero_copy_only=False))
    g = x.T @ (x @ weights - table.column("y").to_numpy())
    return pa.table([itf.vector_cell(g), pa.array([table.num_rows], pa.int64())], names=["g", "n"])


def apply_step(
    weights: np.ndarray,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def combine(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total, n = np.zeros_like(weights), 0
        for batch in batches:
            for g, count in zip(
                batch.column("g").to_pylist(), batch.column("n").to_pylist(), strict=True
            ):
                total += np.asarray(g)
                n += count
        new = weights - LEARNING_RATE * total / max(n, 1)
        yield pa.RecordBatch.from_pylist([{"w": new.tolist()}])

    return combine


@itf.body
def soak_step(model: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
    weights = itf.vector(model, "w").copy()
    new_model = ctx.columnar(points).map(
        gradient,
        "g ARRAY<DOUBLE>, n LONG",
        weights,
        combine=apply_step(weights),
        combine_schema="w ARRAY<DOUBLE>",
    )
    return itf.Declaration(feedback={"model": new_model}, outputs={"model": new_model})


def bounded(spark: SparkSession, rounds: int, work: Path) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(POINTS, DIMS))
    y = x @ rng.normal(size=DIMS) + rng.normal(scale=0.1, size=POINTS)
    points = spark.createDataFrame(
        [(row.tolist(), float(t)) for row, t in zip(x, y, strict=True)], "x ARRAY<DOUBLE>, y DOUBLE"
    ).repartition(2)
    model = spark.createDataFrame([([0.0] * DIMS,)], "w ARRAY<DOUBLE>")
    columnar, checkpoints, event_log = (
        work / "columnar",
        work / "checkpoints",
        work / "events.jsonl",
    )
    columnar.mkdir()
    spark.conf.set("spark.iterflow.resident", "off")
    spark.conf.set("spark.iterflow.columnar.dir", str(columnar))
    sampler = Sampler(spark, columnar=columnar, checkpoints=checkpoints, event_log=event_log)
    clock = time.perf_counter()
    result = (
        itf.BoundedIteration(soak_step)
        .bind("model", model)
        .bind("points", points)
        .until(itf.max_rounds(rounds))
        .listen(sampler)
        .run(
            checkpoint_dir=str(checkpoints),
            checkpoint_every=10,
            event_log=str(event_log),
            progress=False,
            keep_history=KEEP_HISTORY,
        )
    )
    seconds = time.perf_counter() - clock
    segments = sorted((checkpoints / "history").iterdir())
    weights = result.outputs["model"].first()["w"]
    result.release()
    spark.conf.unset("spark.iterflow.resident")
    spark.conf.unset("spark.iterflow.columnar.dir")
    return {
        "rounds": result.rounds,
        "history_kept": len(result.history),
        **history_cost(result.history),
        # The last checkpoints' history segments (10 rounds each, 1 for the final one).
        "history_segment_bytes": [p.stat().st_size for p in segments],
        "seconds": seconds,
        "final_weights": weights,
        "event_log_bytes": event_log.stat().st_size,
        "samples": sampler.samples,
        "summary": flatness(sampler.samples, rounds),
    }


# -- the unbounded run -----------------------------------------------------------------


@itf.body
def running_total(total: DataFrame, ticks: DataFrame) -> itf.Declaration:
    added = ticks.agg(F.coalesce(F.sum("value"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})


def unbounded(spark: SparkSession, epochs: int, work: Path) -> dict[str, Any]:
    location, event_log, columnar = work / "stream", work / "stream-events.jsonl", work / "none"
    sampler = Sampler(spark, columnar=columnar, checkpoints=location, event_log=event_log)
    reached = threading.Event()

    def watch(end: itf.RoundEnd) -> None:
        if end.epoch + 1 >= epochs:
            reached.set()

    ticks = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", ROWS_PER_BATCH)
        .option("numPartitions", 1)
        .load()
        .select("value")
    )
    clock = time.perf_counter()
    query = (
        itf.UnboundedIteration(running_total)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("ticks", ticks)
        .listen(sampler)
        .listen(watch)
        .start(
            checkpoint_location=str(location),
            event_log=str(event_log),
            progress=False,
            keep_history=KEEP_HISTORY,
        )
    )
    while not reached.wait(5):
        if not query.is_active:
            query.await_termination()  # raises what ended it
            raise RuntimeError("the unbounded run ended before its epochs")
    query.stop()
    seconds = time.perf_counter() - clock
    history = query.history
    total = history[-1].epoch if history else None
    return {
        "rounds": sampler.last_epoch + 1,
        "history_kept": len(history),
        **history_cost(history),
        "last_epoch": total,
        "seconds": seconds,
        "event_log_bytes": event_log.stat().st_size,
        "samples": sampler.samples,
        "summary": flatness([s for s in sampler.samples if s["epoch"] < epochs], epochs),
    }


def table_rows(name: str, run: dict[str, Any]) -> list[tuple[str, Any]]:
    summary = run["summary"]
    rows: list[tuple[str, Any]] = [
        (f"{name}: rounds / history kept", f"{run['rounds']} / {run['history_kept']}"),
        ("  seconds", run["seconds"]),
    ]
    early, late = summary["early_rounds"], summary["late_rounds"]
    for key in MEASURES:
        if key in summary:
            m = summary[key]
            rows.append(
                (
                    f"  {key} {early[0]}-{early[1]} / {late[0]}-{late[1]}",
                    f"{m['early_mean']:.6g} / {m['late_mean']:.6g} = {m['ratio']:.3f}"
                    + ("" if m["flat"] else "  NOT FLAT"),
                )
            )
    if "event_log_bytes_per_round" in summary:
        rows.append(("  event log bytes per round", summary["event_log_bytes_per_round"]))
    rows.append(("  history bytes per round, pickled", run["history_pickled_bytes_per_round"]))
    rows.append(("  history bytes per round, in memory", run["history_memory_bytes_per_round"]))
    return rows


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 300 if args.quick else 2_000
    spark = start_session()
    work = Path(tempfile.mkdtemp(prefix="iterflow-soak-"))
    try:
        log(f"bounded: {rounds} rounds")
        bounded_run = bounded(spark, rounds, work)
        log(f"unbounded: {rounds} epochs")
        unbounded_run = unbounded(spark, rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(
        f"Soak, {rounds} rounds each (flat: last / early mean <= {FLAT})",
        [*table_rows("bounded", bounded_run), *table_rows("unbounded", unbounded_run)],
    )
    results = {"flat_target": FLAT, "bounded": bounded_run, "unbounded": unbounded_run}
    finish(
        spark,
        "bench_soak",
        args.quick,
        results,
        rounds=rounds,
        sample_every=SAMPLE_EVERY,
        keep_history=KEEP_HISTORY,
        bounded_workload=f"least squares, {POINTS} points x {DIMS}, ctx.columnar file path, "
        "checkpoint_every=10, event_log",
        unbounded_workload=f"running sum over rate-micro-batch ({ROWS_PER_BATCH} rows per "
        "micro-batch), one epoch per micro-batch, event_log",
    )


if __name__ == "__main__":
    main()
