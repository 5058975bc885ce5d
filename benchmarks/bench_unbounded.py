"""Online k-means on a stream: iterflow's UnboundedIteration against a plain foreachBatch query.

The workload: k=8 centers in 16 dimensions, 1,000,000 points in 100 JSON-lines
files of 10,000 points each (numpy blobs around 8 true centers, fixed seed),
read with ``spark.readStream...option("maxFilesPerTrigger", 1).json(folder)`` and
the available-now trigger, so that each file is one micro-batch and one epoch.

"iterflow" runs ``online_kmeans_step()`` from ``iterflow.demo.online_kmeans_demo``
as ``UnboundedIteration(...).bind("model", model0, state=True).bind("points",
stream).start(checkpoint_location=..., available_now=True, progress=False)``.
"plain" is the same update written by hand on Structured Streaming: a
``foreachBatch`` function keeps the model as numpy arrays on the driver and, per
micro-batch, runs the same ``mapInArrow`` partial-sums kernel with the same
``groupBy`` sum (``batch_sums``), collects the 8 rows and applies the same rule.
"plain-df" sits between the two: a ``foreachBatch`` function that keeps the model
as a DataFrame and runs the demo body's own function on it (the ``model_arrays``
collect, the partial-sums kernel per partition and the kernel that updates the model), then
``localCheckpoint(eager=True)``; no iterflow. iterflow / plain-df is what iterflow's
machinery costs; plain-df / plain is what keeping the model in a DataFrame costs.
All three start from the same initial centers, read the same files and get a fresh
checkpoint location every run; their final centers must agree within 1e-9.

Per-epoch times are the ``triggerExecution`` durations of the micro-batches (the
whole micro-batch, as Spark's own progress reports it), read by a
``StreamingQueryListener``; the total is the time from ``start()`` to the end of
waiting for termination. Runs alternate (the starting variant rotates every
repetition) after one warm-up run of each over a smaller set of files, and the
ratios are of medians. Target: iterflow / plain, per epoch, <= 1.2. One more
iterflow run at the end times the steps of an epoch (``PROBES``), and one file is
read as JSON lines and as parquet to show what parsing the JSON costs.

``--commits`` compares iterflow with itself instead: commits written before each
``foreachBatch`` call returns (``commit_interval_s=None``, "iterflow") against commits
written in the background at most every 5 seconds (``commit_interval_s=5``,
"iterflow-async"), same workload, same alternation, and the same timed breakdown of
the synchronous variant (what its commit costs per epoch). Target: async / sync,
median epoch, <= 0.8. It writes ``bench_unbounded.commits.json``.

``--commits --keyed`` runs the same comparison on a workload whose commits cost
something: a streaming per-key running aggregate. Its state variable ``counts``
(key, n, total) holds all 100,000 keys from the start, more than the 10,000 rows a
commit keeps inline (``epoch_log.INLINE_ROWS``), so every commit writes it as
parquet (a Spark write job). The input is 40 JSON-lines files of 5,000 events (key,
value), keys uniform over the 100,000 (fixed seed), one file per micro-batch and
epoch; each epoch adds the epoch's per-key count and sum to ``counts`` (a union of
the two and a ``groupBy`` sum: every key stays). The body does nothing else and has
no work variable. Every run's final counts must match a numpy reference computed
from the files. It writes ``bench_unbounded.commits_keyed.json``.

    python benchmarks/bench_unbounded.py [--quick] [--commits [--keyed]]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np
from _common import (
    alternate,
    finish,
    log,
    median,
    print_table,
    settle,
    start_session,
)
from _online_kmeans import batch_sums
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

import iterflow as itf
from iterflow.demo.online_kmeans_demo import (
    POINTS_SCHEMA,
    blobs,
    centers_of,
    initial_model,
    online_kmeans_step,
)
from iterflow.unbounded import epoch_log

TARGET = 1.2
VARIANTS = ("plain", "plain-df", "iterflow")
#: ``--commits``: iterflow with commits before each micro-batch returns, and in the background.
COMMIT_VARIANTS = ("iterflow", "iterflow-async")
COMMIT_INTERVAL_S = 5.0
COMMIT_TARGET = 0.8
K, DIMS = 8, 16
DECAY = 1.0
SEED = 2026
TOLERANCE = 1e-9
#: Streaming progress durations recorded per micro-batch (``durationMs`` keys).
PHASES = ("triggerExecution", "addBatch", "latestOffset", "getBatch", "queryPlanning", "walCommit")
#: ``--commits --keyed``: the keys of the running aggregate (all in the state from the start),
#: the input's rows and the state's rows.
KEYS = 100_000
EVENTS_SCHEMA = "key LONG, value DOUBLE"
COUNTS_SCHEMA = "key LONG, n LONG, total DOUBLE"


class Workload(NamedTuple):
    """The files every run reads, and the centers every run starts from."""

    folder: Path
    files: int
    rows_per_file: int  # points
    initial: np.ndarray


def write_points(folder: Path, files: int, per_file: int, seed: int) -> np.ndarray:
    """Write ``files`` JSON-lines files of blobs into ``folder``; return the initial centers.

    The modification times are one second apart in file order, so the file source
    takes the files in that order. The initial centers are K points of the first file.
    """
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    true_centers = rng.uniform(-10.0, 10.0, size=(K, DIMS))
    start = time.time() - files - 60
    initial = None
    for index in range(files):
        points = blobs(rng, per_file, true_centers)
        if initial is None:
            initial = points[rng.choice(per_file, size=K, replace=False)]
        path = folder / f"points-{index:04d}.json"
        with path.open("w", encoding="utf-8") as out:
            out.writelines(json.dumps({"features": row}) + "\n" for row in points.tolist())
        os.utime(path, (start + index, start + index))
    assert initial is not None
    return initial


def point_stream(spark: SparkSession, folder: Path) -> DataFrame:
    return spark.readStream.schema(POINTS_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))


class ProgressLog(StreamingQueryListener):
    """Spark's per-micro-batch progress of the query running now (one at a time)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.terminated = threading.Event()

    def reset(self) -> None:
        self.batches = []
        self.terminated.clear()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        self.batches.append(
            {
                "batch_id": progress.batchId,
                "rows": progress.numInputRows,
                **{phase: progress.durationMs.get(phase, 0) / 1000 for phase in PHASES},
            }
        )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.terminated.set()

    def wait(self) -> list[dict[str, Any]]:
        """The batches of the query that just ended (its last events arrive asynchronously)."""
        if not self.terminated.wait(60):
            raise RuntimeError("the streaming query's termination event never arrived")
        return sorted(self.batches, key=lambda b: b["batch_id"])


class PlainKMeans:
    """The hand-written ``foreachBatch`` function: the model is numpy arrays on the driver."""

    def __init__(self, initial: np.ndarray) -> None:
        self.centers = initial.copy()
        self.weights = np.zeros(len(initial))
        self.call_s: list[float] = []
        self.build_s: list[float] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        clock = time.perf_counter()
        sums = batch_sums(batch, self.centers)
        self.build_s.append(time.perf_counter() - clock)
        rows = sums.collect()
        n = np.zeros(K)
        total = np.zeros((K, DIMS))
        seen = np.zeros(K, dtype=bool)
        for row in rows:
            n[row["cluster"]] = row["n"]
            total[row["cluster"]] = row["total"]
            seen[row["cluster"]] = True
        # The body's rule: weight' = weight * decay + n,
        # center' = (center * weight * decay + sum) / weight', unchanged without points.
        kept = self.weights * DECAY
        weight = kept + n
        with np.errstate(divide="ignore", invalid="ignore"):
            moved = (self.centers * kept[:, None] + total) / (kept + n)[:, None]
        unchanged = ~seen | (weight <= 0)
        self.centers = np.where(unchanged[:, None], self.centers, moved)
        self.weights = weight
        self.call_s.append(time.perf_counter() - clock)


class PlainDataFrameKMeans:
    """``foreachBatch`` with the model as a DataFrame: the demo body's own update, no iterflow.

    Calls the function behind ``online_kmeans_step()`` (``model_arrays`` the model, the
    partial-sums kernel per partition and the update kernel) and checkpoints the new model
    with ``localCheckpoint(eager=True)``, as a hand-written loop cuts its lineage.
    """

    def __init__(self, model0: DataFrame) -> None:
        self.model = model0
        self.update = online_kmeans_step(DECAY).__wrapped__

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        declaration = self.update(model=self.model, points=batch)
        self.model = declaration.feedback["model"].localCheckpoint(eager=True)


class FinalOutput(itf.RoundListener):
    """Reads the last epoch's result with ``read(outputs)`` once the iteration has ended
    (timed, to leave it out)."""

    def __init__(self, read: Callable[[Mapping[str, DataFrame]], Any]) -> None:
        self._read = read
        self.value: Any = None
        self.read_s = 0.0

    def on_iteration_terminated(self, ctx: itf.IterationEnd) -> None:
        clock = time.perf_counter()
        self.value = self._read(ctx.outputs)
        self.read_s = time.perf_counter() - clock

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing to checkpoint


def run_timed(
    iteration: itf.UnboundedIteration,
    stream_name: str,
    files: int,
    rows_per_file: int,
    read: Callable[[Mapping[str, DataFrame]], Any],
    location: Path,
    commit_interval_s: float | None,
) -> tuple[float, Any, dict[str, Any]]:
    """Start ``iteration`` (its inputs bound) available-now at ``location`` and wait: the
    seconds it took, less reading its result with ``read``; that result; and the epochs'
    durations. Each of the ``files`` must have been one epoch of ``rows_per_file`` rows."""
    final = FinalOutput(read)
    start = time.perf_counter()
    handle = iteration.listen(final).start(
        checkpoint_location=str(location),
        available_now=True,
        progress=False,
        commit_interval_s=commit_interval_s,
    )
    handle.await_termination()
    total_s = time.perf_counter() - start - final.read_s
    assert final.value is not None
    epochs = handle.progress
    if [p.input_rows[stream_name] for p in epochs] != [rows_per_file] * files:
        raise RuntimeError("the epochs do not match the files")
    return total_s, final.value, {"duration_s": [p.duration_s for p in epochs]}


def last_job_id(spark: SparkSession, tag: str) -> int:
    """Run a marker job in job group ``tag``; its id (job ids are sequential)."""
    sc = spark.sparkContext
    sc.setJobGroup(tag, "benchmark job counter marker")
    try:
        sc.parallelize([0], 1).count()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    tracker = sc.statusTracker()
    for _ in range(50):
        ids = tracker.getJobIdsForGroup(tag)
        if ids:
            return max(ids)
        time.sleep(0.1)
    raise RuntimeError(f"marker job of group {tag} not found")


def run_foreach_batch(spark: SparkSession, w: Workload, location: Path, update: Any) -> float:
    """Run a plain ``foreachBatch`` query over the workload's files; its wall time."""
    stream = point_stream(spark, w.folder)
    start = time.perf_counter()
    query = (
        stream.writeStream.foreachBatch(update)
        .option("checkpointLocation", str(location))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - start


def run_plain(
    spark: SparkSession, w: Workload, location: Path
) -> tuple[float, np.ndarray, dict[str, Any]]:
    update = PlainKMeans(w.initial)
    return (
        run_foreach_batch(spark, w, location, update),
        update.centers,
        {"call_s": update.call_s, "build_s": update.build_s},
    )


def run_plain_df(
    spark: SparkSession, w: Workload, location: Path
) -> tuple[float, np.ndarray, dict[str, Any]]:
    update = PlainDataFrameKMeans(initial_model(spark, w.initial))
    total_s = run_foreach_batch(spark, w, location, update)
    return total_s, centers_of(update.model), {}


def run_iterflow(
    spark: SparkSession, w: Workload, location: Path, commit_interval_s: float | None = None
) -> tuple[float, np.ndarray, dict[str, Any]]:
    iteration = (
        itf.UnboundedIteration(online_kmeans_step(DECAY))
        .bind("model", initial_model(spark, w.initial), state=True)
        .bind("points", point_stream(spark, w.folder))
    )
    return run_timed(
        iteration,
        "points",
        w.files,
        w.rows_per_file,
        lambda outputs: centers_of(outputs["model"]),
        location,
        commit_interval_s,
    )


def run_iterflow_async(
    spark: SparkSession, w: Workload, location: Path
) -> tuple[float, np.ndarray, dict[str, Any]]:
    return run_iterflow(spark, w, location, COMMIT_INTERVAL_S)


#: A variant: runs over a workload's files in a fresh checkpoint location; returns its
#: total seconds, its final result (for the comparison of the variants) and what it recorded.
Runner = Callable[[SparkSession, Any, Path], tuple[float, Any, dict[str, Any]]]

RUNNERS: dict[str, Runner] = {
    "plain": run_plain,
    "plain-df": run_plain_df,
    "iterflow": run_iterflow,
    "iterflow-async": run_iterflow_async,
}


# -- --commits --keyed: a running per-key aggregate with a large state -------------------


class KeyedWorkload(NamedTuple):
    """The event files every keyed run reads, and the final counts they must end with."""

    folder: Path
    files: int
    rows_per_file: int  # events
    n: np.ndarray  # the reference: events per key, over all files
    total: np.ndarray  # sum of the values per key


def write_events(folder: Path, files: int, per_file: int, seed: int) -> KeyedWorkload:
    """Write ``files`` JSON-lines files of ``per_file`` events (key, value) into ``folder``.

    Keys are uniform over ``KEYS``, values standard normal. The modification times are
    one second apart in file order, as in ``write_points``. The reference counts are
    added up file by file, as the epochs do.
    """
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    start = time.time() - files - 60
    n = np.zeros(KEYS, dtype=np.int64)
    total = np.zeros(KEYS)
    for index in range(files):
        keys = rng.integers(0, KEYS, size=per_file)
        values = rng.normal(0.0, 1.0, size=per_file)
        n += np.bincount(keys, minlength=KEYS)
        total += np.bincount(keys, weights=values, minlength=KEYS)
        path = folder / f"events-{index:04d}.json"
        with path.open("w", encoding="utf-8") as out:
            out.writelines(
                json.dumps({"key": key, "value": value}) + "\n"
                for key, value in zip(keys.tolist(), values.tolist(), strict=True)
            )
        os.utime(path, (start + index, start + index))
    return KeyedWorkload(folder, files, per_file, n, total)


def event_stream(spark: SparkSession, folder: Path) -> DataFrame:
    return spark.readStream.schema(EVENTS_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))


@itf.body
def keyed_counts(counts: DataFrame, events: DataFrame) -> itf.Declaration:
    """Add the epoch's count and sum per key to ``counts``; every key stays."""
    added = events.groupBy("key").agg(F.count("*").alias("n"), F.sum("value").alias("total"))
    new_counts = (
        counts.unionByName(added)
        .groupBy("key")
        .agg(F.sum("n").alias("n"), F.sum("total").alias("total"))
    )
    return itf.Declaration(feedback={"counts": new_counts}, outputs={"counts": new_counts})


def initial_counts(spark: SparkSession) -> DataFrame:
    """Every key with n = 0 and total = 0.0."""
    return spark.range(KEYS).select(
        F.col("id").alias("key"), F.lit(0).cast("long").alias("n"), F.lit(0.0).alias("total")
    )


def final_counts(outputs: Mapping[str, DataFrame]) -> tuple[np.ndarray, np.ndarray]:
    """The last epoch's counts, by key: ``n`` and ``total``."""
    table = outputs["counts"].toArrow().sort_by("key")
    if table.column("key").to_pylist() != list(range(KEYS)):
        raise RuntimeError("the final counts do not hold every key once")
    return table.column("n").to_numpy(), table.column("total").to_numpy()


def run_keyed(
    spark: SparkSession, w: KeyedWorkload, location: Path, commit_interval_s: float | None = None
) -> tuple[float, tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    iteration = (
        itf.UnboundedIteration(keyed_counts)
        .bind("counts", initial_counts(spark), state=True)
        .bind("events", event_stream(spark, w.folder))
    )
    return run_timed(
        iteration, "events", w.files, w.rows_per_file, final_counts, location, commit_interval_s
    )


def run_keyed_async(
    spark: SparkSession, w: KeyedWorkload, location: Path
) -> tuple[float, tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    return run_keyed(spark, w, location, COMMIT_INTERVAL_S)


KEYED_RUNNERS: dict[str, Runner] = {"iterflow": run_keyed, "iterflow-async": run_keyed_async}

#: The breakdown run times these functions (module where defined, name, what it is).
#: Indented labels run inside the one above. They are iterflow's internals: a probe,
#: not an API, so a name that no longer exists is skipped.
PROBES = (
    ("iterflow.unbounded.epochs", "EpochLoop.on_batch", "foreachBatch call (on_batch)"),
    ("iterflow.runtime.spark.jvm", "in_session", "  move the batch to the session"),
    ("iterflow.unbounded.epochs", "EpochLoop.run_round", "  run_round"),
    ("iterflow.body", "FunctionBody.__call__", "    body"),
    (
        "iterflow.demo.online_kmeans_demo",
        "model_arrays",
        "      model_arrays (collect of the model)",
    ),
    ("iterflow.runtime.round.materialize", "materialize", "    materialize (run the body's plan)"),
    ("iterflow.runtime.spark.observations", "observed_rows", "    read the input's row count"),
    ("iterflow.unbounded.query", "UnboundedQuery._source_backlog", "    source backlog"),
    (
        "iterflow.runtime.progresstrack.observers",
        "RunObservers.complete",
        "    observers: complete",
    ),
    (
        "iterflow.runtime.progresstrack.observers",
        "RunObservers.round_end",
        "    observers: round_end",
    ),
    ("iterflow.progress.listeners", "ListenerSet.round_end", "    listeners"),
    ("iterflow.runtime.round.materialize", "release", "    release the previous epoch"),
    ("iterflow.unbounded.committer", "Committer.commit", "  commit"),
    ("iterflow.unbounded.epoch_log", "take", "    take the snapshot"),
    ("iterflow.runtime.checkpoint.store", "snapshot", "      pickle the driver state"),
    ("iterflow.runtime.checkpoint.store", "CheckpointStore.write", "    write the epoch's files"),
    ("pyspark.sql.readwriter", "DataFrameWriter.parquet", "      parquet (a Spark job each)"),
)
#: The keyed workload has no k-means model to collect.
KEYED_PROBES = tuple(probe for probe in PROBES if probe[0] != "iterflow.demo.online_kmeans_demo")


def probed(label: str, fn: Any, calls: dict[str, list[float]]) -> Any:
    def timed(*args: Any, **kwargs: Any) -> Any:
        clock = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            calls[label].append(time.perf_counter() - clock)

    return timed


def patch(module_name: str, path: str, wrap: Any) -> list[tuple[Any, str, Any]]:
    """Replace a method on its class, or a function wherever an iterflow module imported it."""
    try:
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = owner.__dict__[name]
    except (ImportError, AttributeError, KeyError):
        return []
    if parents:
        holders = [(owner, name)]
    else:
        holders = [
            (module, attr)
            for key, module in list(sys.modules.items())
            if key.split(".")[0] == "iterflow"
            for attr, value in list(vars(module).items())
            if value is original
        ]
    wrapped = wrap(original)
    for holder, attr in holders:
        setattr(holder, attr, wrapped)
    return [(holder, attr, original) for holder, attr in holders]


def unpatch(patched: list[tuple[Any, str, Any]]) -> None:
    """Put back what ``patch`` replaced."""
    for owner, name, original in reversed(patched):
        setattr(owner, name, original)


def counting_commits(runner: Runner) -> Runner:
    """``runner``, also recording every commit it writes (``epoch_log.write``, on the loop's
    thread or in the background): how many, and how long each took to write."""

    def run(spark: SparkSession, w: Any, location: Path) -> tuple[float, Any, dict[str, Any]]:
        calls: dict[str, list[float]] = {"write": []}
        patched = patch(
            "iterflow.unbounded.epoch_log", "write", lambda fn: probed("write", fn, calls)
        )
        if not patched:
            raise RuntimeError("iterflow.unbounded.epoch_log.write not found")
        try:
            total_s, final, extra = runner(spark, w, location)
        finally:
            unpatch(patched)
        return total_s, final, {**extra, "commit_write_s": calls["write"]}

    return run


def breakdown(
    spark: SparkSession,
    progress: ProgressLog,
    w: Any,
    runner: Runner = run_iterflow,
    probes: tuple[tuple[str, str, str], ...] = PROBES,
) -> dict[str, Any]:
    """One more run of ``runner`` (iterflow, synchronous commits) with every function in
    ``probes`` timed: seconds per epoch."""
    calls: dict[str, list[float]] = {}
    patched: list[tuple[Any, str, Any]] = []
    for module_name, path, label in probes:
        done = patch(module_name, path, lambda fn, label=label: probed(label, fn, calls))
        if done:
            calls[label] = []
        patched += done
    try:
        run = measure(spark, progress, "iterflow (timed functions)", runner, w)
    finally:
        unpatch(patched)
    per_epoch = {label: sum(times) / w.files for label, times in calls.items()}
    return {
        "per_epoch_s": per_epoch,
        "median_per_call_s": {label: median(times) for label, times in calls.items() if times},
        "calls": {label: len(times) for label, times in calls.items()},
        "epoch_s_median": median(run["epoch_s"]),
        "add_batch_s_mean": sum(run["phases_s"]["addBatch"]) / w.files,
        "trigger_s_mean": sum(run["epoch_s"]) / w.files,
        "total_s": run["total_s"],
        "jobs_per_epoch": run["jobs"] / w.files,
        "final": run["final"],
    }


def scan_costs(spark: SparkSession, w: Workload, files: int = 10) -> dict[str, float]:
    """Median time to read one input file and sum all its values, as JSON lines and as parquet.

    Tells whether parsing the JSON dominates an epoch. Each of the first ``files``
    files is also written as parquet; every read runs twice and the second one counts.
    """
    query = "sum(aggregate(features, 0D, (total, x) -> total + x))"
    times: dict[str, list[float]] = {"json": [], "parquet": []}
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        for index, path in enumerate(sorted(w.folder.iterdir())[:files]):
            copy = f"{tmp}/{index}"
            spark.read.schema(POINTS_SCHEMA).json(str(path)).write.parquet(copy)
            for fmt, target in (("json", str(path)), ("parquet", copy)):
                df = spark.read.schema(POINTS_SCHEMA).format(fmt).load(target)
                for attempt in range(2):
                    clock = time.perf_counter()
                    df.selectExpr(query).collect()
                    if attempt:
                        times[fmt].append(time.perf_counter() - clock)
    return {f"{fmt}_file_s_median": median(t) for fmt, t in times.items()}


def measure(
    spark: SparkSession, progress: ProgressLog, label: str, runner: Runner, w: Any
) -> dict[str, Any]:
    """One run of ``runner`` over workload ``w`` (a ``Workload`` or a ``KeyedWorkload``) in
    a fresh checkpoint location: its times, jobs and final result."""
    settle(spark)
    tag = "unbounded-" + "".join(c if c.isalnum() else "-" for c in label)
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        before = last_job_id(spark, f"{tag}-before")
        progress.reset()
        total_s, final, extra = runner(spark, w, Path(tmp) / "checkpoint")
        batches = progress.wait()
        after = last_job_id(spark, f"{tag}-after")
    if len(batches) != w.files or sum(b["rows"] for b in batches) != w.files * w.rows_per_file:
        raise RuntimeError(f"{label}: expected {w.files} micro-batches of all rows: {batches}")
    run: dict[str, Any] = {
        "total_s": total_s,
        "epochs": len(batches),
        "jobs": after - before - 1,
        "epoch_s": [b["triggerExecution"] for b in batches],
        "phases_s": {phase: [b[phase] for b in batches] for phase in PHASES},
        "final": final,
        **extra,
    }
    log(
        f"  {label}: {run['epochs']} epochs, {total_s:.2f} s, median epoch "
        f"{median(run['epoch_s']):.3f} s, {run['jobs']} jobs"
    )
    return run


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10 files of 2,000 points, one run of each variant (a smoke test)",
    )
    parser.add_argument(
        "--commits",
        action="store_true",
        help="iterflow with commit_interval_s=None against commit_interval_s=5 "
        "(bench_unbounded.commits.json)",
    )
    parser.add_argument(
        "--keyed",
        action="store_true",
        help="with --commits: on a running per-key aggregate of 100,000 keys instead of "
        "k-means (bench_unbounded.commits_keyed.json; --quick: 8 files of 2,000 events)",
    )
    args = parser.parse_args()
    if args.keyed and not args.commits:
        parser.error("--keyed goes with --commits")
    return args


class Written(Protocol):
    """A workload written into files: its ``folder``."""

    @property
    def folder(self) -> Path: ...


W = TypeVar("W", bound=Written)


@contextlib.contextmanager
def written_events(
    write: Callable[[Path, int, int, int], W], files: int, per_file: int, warm_files: int
) -> Iterator[tuple[W, W, int]]:
    """The timed workload (``files`` files) and the warm-up's (``warm_files``), made by
    ``write`` in a temporary folder that is removed afterwards, and the timed input's
    bytes; logs what was written."""
    data = Path(tempfile.mkdtemp(prefix="iterflow-bench-events-"))
    try:
        clock = time.perf_counter()
        w = write(data / "events", files, per_file, SEED)
        warm = write(data / "warm-up", warm_files, per_file, SEED + 1)
        input_bytes = sum(p.stat().st_size for p in w.folder.iterdir())
        log(
            f"wrote {files} files of {per_file} events ({input_bytes / 1e6:.1f} MB) in "
            f"{time.perf_counter() - clock:.1f} s"
        )
        yield w, warm, input_bytes
    finally:
        shutil.rmtree(data, ignore_errors=True)


def commits_keyed(quick: bool) -> None:
    """``--commits --keyed``: write the event files, compare, write the result file."""
    if quick:
        files, per_file, warm_files, repetitions = 8, 2_000, 2, 1
    else:
        files, per_file, warm_files, repetitions = 40, 5_000, 10, 3
    spark = start_session()
    progress = ProgressLog()
    spark.streams.addListener(progress)
    with written_events(write_events, files, per_file, warm_files) as (w, warm, input_bytes):
        results = compare_commits(
            spark,
            progress,
            w,
            warm,
            repetitions,
            title=f"running count and sum of {KEYS} keys, {files} files x {per_file} events",
            runners=KEYED_RUNNERS,
            agree=counts_agree(w),
            probes=KEYED_PROBES,
        )
    finish(
        spark,
        "bench_unbounded.commits_keyed",
        quick,
        results,
        keys=KEYS,
        state_rows=KEYS,
        inline_rows=epoch_log.INLINE_ROWS,
        seed=SEED,
        files=files,
        events_per_file=per_file,
        events_schema=EVENTS_SCHEMA,
        counts_schema=COUNTS_SCHEMA,
        input_bytes=input_bytes,
        max_files_per_trigger=1,
        trigger="availableNow",
        repetitions=repetitions,
        warm_up_files=warm_files,
        body="counts.unionByName(events.groupBy('key').agg(count, sum(value)))"
        ".groupBy('key').agg(sum(n), sum(total))",
        iterflow="UnboundedIteration(keyed_counts).bind('counts', counts0, state=True)"
        ".bind('events', stream).start(available_now=True, progress=False, "
        "commit_interval_s=None | 5)",
    )


def centers_agree(finals: list[Any]) -> dict[str, Any]:
    """``--commits``: every run ends with the same centers (within ``TOLERANCE``)."""
    reference = np.array(finals[0])
    max_difference = max(float(np.abs(np.array(c) - reference).max()) for c in finals)
    assert max_difference <= TOLERANCE, f"final centers differ by {max_difference}"
    return {"final_centers_max_abs_difference": max_difference}


def counts_agree(w: KeyedWorkload) -> Callable[[list[Any]], dict[str, Any]]:
    """``--commits --keyed``: every run ends with the reference counts (totals within
    ``TOLERANCE``)."""

    def check(finals: list[Any]) -> dict[str, Any]:
        n_mismatches = max(int((n != w.n).sum()) for n, _ in finals)
        max_difference = max(float(np.abs(total - w.total).max()) for _, total in finals)
        assert n_mismatches == 0, f"final counts differ from the reference for {n_mismatches} keys"
        assert max_difference <= TOLERANCE, f"final totals differ by {max_difference}"
        return {
            "final_counts_runs_checked": len(finals),
            "final_counts_n_mismatches": n_mismatches,
            "final_counts_total_max_abs_difference": max_difference,
        }

    return check


def compare_commits(
    spark: SparkSession,
    progress: ProgressLog,
    w: Any,
    warm: Any,
    repetitions: int,
    *,
    title: str,
    runners: dict[str, Runner],
    agree: Callable[[list[Any]], dict[str, Any]],
    probes: tuple[tuple[str, str, str], ...] = PROBES,
) -> dict[str, Any]:
    """``--commits``: iterflow's epochs over workload ``w`` with commits before each
    micro-batch returns (``runners["iterflow"]``) and in the background
    (``runners["iterflow-async"]``), and what the synchronous commit costs per epoch.

    ``agree`` gets the final results of every measured run and of the timed run; it raises
    when they do not agree and returns what it found."""
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    runners = {variant: counting_commits(runners[variant]) for variant in COMMIT_VARIANTS}
    log(f"warm-up: one run of each variant over {warm.files} files")
    for variant in COMMIT_VARIANTS:
        measure(spark, progress, f"{variant} (warm-up)", runners[variant], warm)
    log(f"{w.files} epochs, {repetitions} runs of each variant")
    sequence, runs = alternate(
        COMMIT_VARIANTS,
        repetitions,
        lambda variant: measure(spark, progress, variant, runners[variant], w),
    )
    log("breakdown: one more run with synchronous commits and its epoch's steps timed")
    timed = breakdown(spark, progress, w, runners["iterflow"], probes)
    checked = agree([r["final"] for rs in runs.values() for r in rs] + [timed["final"]])
    summary = {
        variant: {
            "total_s_median": median([r["total_s"] for r in rs]),
            "epoch_s_median": median([median(r["epoch_s"]) for r in rs]),
            "epoch_s_median_per_run": [median(r["epoch_s"]) for r in rs],
            "add_batch_s_median": median([median(r["phases_s"]["addBatch"]) for r in rs]),
            "duration_s_median": median([median(r["duration_s"]) for r in rs]),
            "jobs_per_epoch": median([r["jobs"] for r in rs]) / w.files,
            "commits_written_median": median([len(r["commit_write_s"]) for r in rs]),
            "commit_write_s_median": median([t for r in rs for t in r["commit_write_s"]]),
        }
        for variant, rs in runs.items()
    }
    sync, background = summary["iterflow"], summary["iterflow-async"]
    per_epoch = timed["per_epoch_s"]
    results = {
        "target": COMMIT_TARGET,
        "commit_interval_s": COMMIT_INTERVAL_S,
        "load_average_1_5_15_at_start": load_at_start,
        "sequence": sequence,
        "summary": summary,
        "ratio_async_over_sync": {
            "epoch_median": background["epoch_s_median"] / sync["epoch_s_median"],
            "add_batch_median": background["add_batch_s_median"] / sync["add_batch_s_median"],
            "total": background["total_s_median"] / sync["total_s_median"],
        },
        "sync_commit_per_epoch_s": per_epoch.get("  commit"),
        "breakdown_sync": {k: v for k, v in timed.items() if k != "final"},
        **checked,
        "runs": {
            v: [{k: x for k, x in r.items() if k != "final"} for r in rs] for v, rs in runs.items()
        },
    }
    ratio = results["ratio_async_over_sync"]
    rows: list[tuple[str, Any]] = []
    for variant, s in summary.items():
        rows += [
            (f"{variant}: total (s)", s["total_s_median"]),
            (f"{variant}: median epoch, triggerExecution (s)", s["epoch_s_median"]),
            (f"{variant}: median epoch, addBatch (s)", s["add_batch_s_median"]),
            (f"{variant}: jobs per epoch", s["jobs_per_epoch"]),
            (f"{variant}: commits written", s["commits_written_median"]),
            (f"{variant}: median time to write one commit (s)", s["commit_write_s_median"]),
        ]
    rows += [
        (f"async / sync, median epoch (target <= {COMMIT_TARGET})", ratio["epoch_median"]),
        ("async / sync, median addBatch", ratio["add_batch_median"]),
        ("async / sync, total", ratio["total"]),
        ("sync: commit per epoch, timed run (s)", results["sync_commit_per_epoch_s"]),
        *checked.items(),
    ]
    print_table(
        f"synchronous commits, one run with its steps timed: seconds per epoch (mean of {w.files})",
        [
            ("micro-batch (triggerExecution)", timed["trigger_s_mean"]),
            ("foreachBatch (addBatch)", timed["add_batch_s_mean"]),
            *per_epoch.items(),
        ],
    )
    print_table(
        f"{title}, commits before each micro-batch returns vs every {COMMIT_INTERVAL_S:g} s "
        f"in the background (medians of {repetitions} runs)",
        rows,
    )
    return results


def main() -> None:
    args = parse_args()
    if args.keyed:
        commits_keyed(args.quick)
        return
    if args.quick:
        files, per_file, warm_files, repetitions = 10, 2_000, 3, 1
    else:
        files, per_file, warm_files, repetitions = 100, 10_000, 20, 3

    spark = start_session()
    progress = ProgressLog()
    spark.streams.addListener(progress)
    data = Path(tempfile.mkdtemp(prefix="iterflow-bench-points-"))
    try:
        clock = time.perf_counter()
        w = Workload(
            data / "points", files, per_file, write_points(data / "points", files, per_file, SEED)
        )
        warm = Workload(
            data / "warm-up",
            warm_files,
            per_file,
            write_points(data / "warm-up", warm_files, per_file, SEED + 1),
        )
        input_bytes = sum(p.stat().st_size for p in w.folder.iterdir())
        log(
            f"wrote {files} files of {per_file} points ({input_bytes / 1e6:.0f} MB) in "
            f"{time.perf_counter() - clock:.1f} s"
        )

        if args.commits:
            commits = compare_commits(
                spark,
                progress,
                w,
                warm,
                repetitions,
                title=f"online k-means, {w.files} files x {w.rows_per_file} points",
                runners=RUNNERS,
                agree=centers_agree,
            )
            finish(
                spark,
                "bench_unbounded.commits",
                args.quick,
                commits,
                k=K,
                dims=DIMS,
                decay=DECAY,
                seed=SEED,
                files=files,
                points_per_file=per_file,
                input_bytes=input_bytes,
                max_files_per_trigger=1,
                trigger="availableNow",
                repetitions=repetitions,
                warm_up_files=warm_files,
                iterflow="UnboundedIteration(online_kmeans_step(1.0)).bind('model', model0, "
                "state=True).bind('points', stream).start(available_now=True, progress=False, "
                "commit_interval_s=None | 5)",
            )
            return
        log(f"warm-up: one run of each variant over {warm_files} files")
        for variant in VARIANTS:
            measure(spark, progress, f"{variant} (warm-up)", RUNNERS[variant], warm)
        log(f"{files} epochs, {repetitions} runs of each variant")
        sequence, runs = alternate(
            VARIANTS,
            repetitions,
            lambda variant: measure(spark, progress, variant, RUNNERS[variant], w),
        )
        log("breakdown: one more iterflow run with its epoch's steps timed")
        timed = breakdown(spark, progress, w)
        log("input: one file read as JSON lines and as parquet")
        scan = scan_costs(spark, w)
    finally:
        shutil.rmtree(data, ignore_errors=True)

    reference = np.array(runs["plain"][0]["final"])
    finals = [r["final"] for rs in runs.values() for r in rs] + [timed.pop("final")]
    differences = [float(np.abs(np.array(c) - reference).max()) for c in finals]
    max_difference = max(differences)
    assert max_difference <= TOLERANCE, f"final centers differ by {max_difference}"

    points = files * per_file
    summary: dict[str, dict[str, Any]] = {}
    for variant, rs in runs.items():
        total = median([r["total_s"] for r in rs])
        summary[variant] = {
            "total_s_median": total,
            "epoch_s_median": median([median(r["epoch_s"]) for r in rs]),
            "epochs_per_s": files / total,
            "points_per_s": points / total,
            "jobs_per_epoch": median([r["jobs"] for r in rs]) / files,
            "phases_s_median": {
                phase: median([median(r["phases_s"][phase]) for r in rs]) for phase in PHASES
            },
        }
    summary["iterflow"]["duration_s_median"] = median(
        [median(r["duration_s"]) for r in runs["iterflow"]]
    )
    for key in ("call_s", "build_s"):
        summary["plain"][f"{key}_median"] = median([median(r[key]) for r in runs["plain"]])
    it, plain = summary["iterflow"], summary["plain"]

    def ratio(a: str, b: str) -> dict[str, Any]:
        return {
            "total": summary[a]["total_s_median"] / summary[b]["total_s_median"],
            "epoch_median": summary[a]["epoch_s_median"] / summary[b]["epoch_s_median"],
            "total_per_repetition": [
                x["total_s"] / y["total_s"] for x, y in zip(runs[a], runs[b], strict=True)
            ],
        }

    results = {
        "target": TARGET,
        "sequence": sequence,
        "summary": summary,
        "ratio_iterflow_over_plain": ratio("iterflow", "plain"),
        "ratio_iterflow_over_plain_df": ratio("iterflow", "plain-df"),
        "ratio_plain_df_over_plain": ratio("plain-df", "plain"),
        "extra_per_epoch_s": (it["total_s_median"] - plain["total_s_median"]) / files,
        "breakdown_iterflow": timed,
        "input_scan": scan,
        "final_centers_max_abs_difference": max_difference,
        "final_centers": reference.tolist(),
        "runs": {
            v: [{k: x for k, x in r.items() if k != "final"} for r in rs] for v, rs in runs.items()
        },
    }
    ratio = results["ratio_iterflow_over_plain"]
    rows: list[tuple[str, Any]] = []
    for variant in VARIANTS:
        s = summary[variant]
        rows += [
            (f"{variant}: total (s)", s["total_s_median"]),
            (f"{variant}: median epoch, triggerExecution (s)", s["epoch_s_median"]),
            (f"{variant}: median epoch, addBatch (s)", s["phases_s_median"]["addBatch"]),
            (f"{variant}: epochs per second", s["epochs_per_s"]),
            (f"{variant}: points per second", s["points_per_s"]),
            (f"{variant}: jobs per epoch", s["jobs_per_epoch"]),
        ]
    rows += [
        ("plain: median foreachBatch function (s)", plain["call_s_median"]),
        ("plain: of which building batch_sums (s)", plain["build_s_median"]),
        ("iterflow: median epoch, duration_s (s)", it["duration_s_median"]),
        ("iterflow / plain, total", ratio["total"]),
        (f"iterflow / plain, median epoch (target <= {TARGET})", ratio["epoch_median"]),
        ("iterflow / plain-df, total", results["ratio_iterflow_over_plain_df"]["total"]),
        (
            "iterflow / plain-df, median epoch",
            results["ratio_iterflow_over_plain_df"]["epoch_median"],
        ),
        ("plain-df / plain, total", results["ratio_plain_df_over_plain"]["total"]),
        ("iterflow - plain, per epoch (s)", results["extra_per_epoch_s"]),
        ("final centers, max |difference| from plain", max_difference),
        ("read + sum one file, JSON lines (s)", scan["json_file_s_median"]),
        ("read + sum one file, parquet (s)", scan["parquet_file_s_median"]),
    ]
    print_table(
        f"iterflow, one run with its steps timed: seconds per epoch (mean of {files})",
        [
            ("micro-batch (triggerExecution)", timed["trigger_s_mean"]),
            ("foreachBatch (addBatch)", timed["add_batch_s_mean"]),
            *timed["per_epoch_s"].items(),
        ],
    )
    print_table(
        f"online k-means, k={K}, {DIMS} dims, {files} files x {per_file} points "
        f"(medians of {repetitions} runs)",
        rows,
    )
    finish(
        spark,
        "bench_unbounded",
        args.quick,
        results,
        k=K,
        dims=DIMS,
        decay=DECAY,
        seed=SEED,
        files=files,
        points_per_file=per_file,
        points=points,
        input_format="json lines",
        input_bytes=input_bytes,
        max_files_per_trigger=1,
        trigger="availableNow",
        repetitions=repetitions,
        warm_up_files=warm_files,
        iterflow="UnboundedIteration(online_kmeans_step(1.0)).bind('model', model0, "
        "state=True).bind('points', stream).start(available_now=True, progress=False)",
        plain="writeStream.foreachBatch(numpy model, batch_sums(...).collect())"
        ".trigger(availableNow=True)",
        plain_df="writeStream.foreachBatch(model DataFrame, the body's function, "
        "localCheckpoint(eager=True)).trigger(availableNow=True)",
    )


if __name__ == "__main__":
    main()
