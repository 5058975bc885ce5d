"""Online (mini-batch) k-means as an unbounded iterflow body.

The model is a state variable: one row per cluster with its ``center`` and its
``weight`` (points absorbed so far, decayed). Every epoch assigns the epoch's
new points to the nearest center with a numpy kernel inside ``mapInArrow`` (per
cluster, the sum and the number of its points), and
moves each center to the weighted mean of its old position and its new points,
as Spark MLlib's ``StreamingKMeans`` does::

    weight' = weight * decay + n
    center' = (center * weight * decay + sum of the new points) / weight'

``run_online_kmeans`` runs the body the way a streaming job would: a
background thread drops files of points into a watched folder while the query
runs, one epoch per file.

The epoch's plan is two Arrow kernels: partial sums per partition, then one
task that adds them up and applies the update. Building it takes two PySpark
calls, so the driver spends little time planning. Uses ``iterflow``'s public
names only, like any user would: its kernels are numpy on Arrow batches.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

import iterflow as itf

MODEL_SCHEMA = "cluster INT, center ARRAY<DOUBLE>, weight DOUBLE"
POINTS_SCHEMA = "features ARRAY<DOUBLE>"
#: What a partition of points sends to the update: per cluster the sum of its new points
#: (flattened, k * dims) and their number.
PARTIAL_SCHEMA = "sums ARRAY<DOUBLE>, counts ARRAY<DOUBLE>"


def cluster_sums(points: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster, the sum ``(k, dims)`` and the number ``(k,)`` of the points nearest it.

    The distances use |x - c|^2 = |x|^2 - 2 x.c + |c|^2 (|x|^2 is the same for every
    center), and the sums a one-hot matrix product: two BLAS calls per batch.
    """
    k = len(centers)
    nearest = np.argmin((centers**2).sum(axis=1) - 2.0 * points @ centers.T, axis=1)
    chosen = np.zeros((len(points), k))
    chosen[np.arange(len(points)), nearest] = 1.0
    return chosen.T @ points, chosen.sum(axis=0)


def partials_kernel(
    centers: np.ndarray,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: the ``PARTIAL_SCHEMA`` row of every batch of points.

    A partition without points answers with zeros, so that the update always
    receives a row and the model never comes out empty.
    """
    k, dims = centers.shape

    def row(sums: np.ndarray, counts: np.ndarray) -> pa.RecordBatch:
        vectors = pa.list_(pa.float64())
        return pa.RecordBatch.from_arrays(
            [pa.array([sums.ravel()], vectors), pa.array([counts], vectors)],
            names=["sums", "counts"],
        )

    def kernel(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        answered = False
        for batch in batches:
            answered = True
            points = batch.column(0).flatten().to_numpy(zero_copy_only=False)
            yield row(*cluster_sums(points.reshape(-1, dims), centers))
        if not answered:
            yield row(np.zeros((k, dims)), np.zeros(k))

    return kernel


def added_partials(
    batches: Iterator[pa.RecordBatch], k: int, dims: int
) -> tuple[np.ndarray, np.ndarray]:
    """``PARTIAL_SCHEMA`` rows added up: per cluster the sum ``(k, dims)`` and the count."""
    sums, counts = np.zeros(k * dims), np.zeros(k)
    for batch in batches:
        flat = batch.column(0).flatten().to_numpy(zero_copy_only=False)
        sums += flat.reshape(-1, k * dims).sum(axis=0)
        counts += batch.column(1).flatten().to_numpy(zero_copy_only=False).reshape(-1, k).sum(0)
    return sums.reshape(k, dims), counts


def centers_of(model: DataFrame) -> np.ndarray:
    """The model's centers as a (k, dims) array, in cluster order (a small collect)."""
    return model_arrays(model)[0]


def update_kernel(
    centers: np.ndarray, weights: np.ndarray, decay: float
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function over all the partials: the updated model, one row per cluster."""
    k, dims = centers.shape

    def kernel(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sums, counts = added_partials(batches, k, dims)
        kept = weights * decay
        weight = kept + counts
        moved = (centers * kept[:, None] + sums) / np.where(weight > 0, weight, 1.0)[:, None]
        center = np.where((weight > 0)[:, None], moved, centers)  # never seen: stays put
        offsets = pa.array(np.arange(k + 1, dtype=np.int32) * dims)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(np.arange(k, dtype=np.int32)),
                pa.ListArray.from_arrays(offsets, pa.array(center.ravel())),
                pa.array(weight),
            ],
            names=["cluster", "center", "weight"],
        )

    return kernel


def model_arrays(model: DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The model's centers (k, dims) and weights (k,), in cluster order (a small collect)."""
    rows = sorted(model.collect(), key=lambda r: r["cluster"])
    return (
        np.array([r["center"] for r in rows], dtype=float),
        np.array([r["weight"] for r in rows], dtype=float),
    )


def online_kmeans_step(decay: float = 1.0) -> itf.IterationBody:
    """The body: ``model`` (state variable) and ``points`` (streaming input) in, new model out."""

    @itf.body
    def online_kmeans(model: DataFrame, points: DataFrame) -> itf.Declaration:
        centers, weights = model_arrays(model)  # reading an input is allowed: it is materialized
        partials = points.select("features").mapInArrow(partials_kernel(centers), PARTIAL_SCHEMA)
        new_model = partials.repartition(1).mapInArrow(
            update_kernel(centers, weights, decay), MODEL_SCHEMA
        )
        return itf.Declaration(feedback={"model": new_model}, outputs={"model": new_model})

    return online_kmeans


def initial_model(spark: SparkSession, centers: np.ndarray) -> DataFrame:
    """A model with the given centers and weight 0 (the first points decide)."""
    rows = [(i, [float(x) for x in c], 0.0) for i, c in enumerate(centers)]
    return spark.createDataFrame(rows, MODEL_SCHEMA)


def blobs(
    rng: np.random.Generator, count: int, true_centers: np.ndarray, spread: float = 0.5
) -> np.ndarray:
    """``count`` points around ``true_centers`` (chosen uniformly), Gaussian noise ``spread``."""
    chosen = rng.integers(0, len(true_centers), size=count)
    return true_centers[chosen] + rng.normal(0.0, spread, size=(count, true_centers.shape[1]))


# -- the streaming demo -------------------------------------------------------------


def write_points(folder: str | os.PathLike[str], name: str, points: np.ndarray) -> Path:
    """Write ``points`` as a JSON-lines file ``folder/name``, atomically.

    The rows go to a hidden temporary file first (the file source ignores names
    starting with ``.``), which is then renamed into place: a query watching
    ``folder`` never reads a file half written.
    """
    target = Path(folder) / name
    temporary = target.with_name(f".tmp-{name}")
    with open(temporary, "w") as out:
        out.writelines(json.dumps({"features": row}) + "\n" for row in points.tolist())
    os.replace(temporary, target)
    return target


def nearest_distances(found: np.ndarray, true_centers: np.ndarray) -> np.ndarray:
    """For each true center, its distance to the nearest of the ``found`` centers."""
    gaps = np.linalg.norm(true_centers[:, None, :] - found[None, :, :], axis=2)
    return np.asarray(gaps.min(axis=1))


@contextlib.contextmanager
def work_folder(folder: str | os.PathLike[str] | None) -> Iterator[Path]:
    """``folder`` (created if missing; it must be empty), or a temporary directory removed after."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="iterflow-kmeans-") as scratch:
            yield Path(scratch)
        return
    root = Path(folder)
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"folder '{root}' is not empty; give a new or empty folder")
    root.mkdir(parents=True, exist_ok=True)
    yield root


@dataclass(frozen=True)
class OnlineKMeansRun:
    """What ``run_online_kmeans`` returns."""

    centers: np.ndarray  # the final centers, (k, dims), in cluster order
    true_centers: np.ndarray  # the centers the points were drawn around
    epochs: int  # epochs run
    points_written: int
    points_consumed: int  # new points the epochs took; all of them unless timed out
    seconds: float  # wall time, from start() until the last point was consumed
    epoch_seconds: float  # the epochs' own time (the query idles while it waits for files)
    termination: str | None  # "stopped" once stop() returned
    progress: Sequence[itf.RoundProgress] = field(default_factory=list, repr=False)

    @property
    def center_error(self) -> float:
        """The largest distance from a true center to the nearest final center."""
        return float(nearest_distances(self.centers, self.true_centers).max())


class EpochPrinter:
    """A listener function: one line per epoch, and the latest centers and points consumed.

    It defines no ``on_round_end``, so ``listen()`` calls it as a plain function
    and checkpoints carry none of its attributes.
    """

    def __init__(self, centers: np.ndarray, out: Callable[[str], object] = print) -> None:
        self.centers = centers
        self.points = 0
        self.epochs = 0
        self.out = out

    def __call__(self, end: itf.RoundEnd) -> None:
        centers = centers_of(end.outputs["model"])  # materialized: a small collect
        moved = float(np.linalg.norm(centers - self.centers, axis=1).max())
        new_points = end.progress.input_rows.get("points") or 0
        self.centers, self.epochs = centers, self.epochs + 1
        self.points += new_points
        self.out(
            f"  epoch {end.epoch:4d}  {new_points:7d} points  largest move {moved:9.4f}"
            f"  {end.progress.duration_s:6.2f} s"
        )


def _feed_until_consumed(
    query: itf.UnboundedQuery,
    printer: EpochPrinter,
    incoming: Path,
    batches: list[np.ndarray],
    *,
    interval_s: float,
    timeout_s: float,
    started: float,
) -> float:
    """Write ``batches`` into ``incoming`` one file every ``interval_s`` seconds while
    ``query`` runs; stop the query once every point is consumed (or ``timeout_s`` after
    the last file, at the latest). The seconds from ``started`` until then."""
    written = sum(len(batch) for batch in batches)

    def feed(stop: threading.Event) -> None:
        for index, batch in enumerate(batches):
            if index and stop.wait(interval_s):
                return
            write_points(incoming, f"points-{index:05d}.json", batch)

    stop_feeding = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kmeans-feed") as pool:
        feeding = pool.submit(feed, stop_feeding)
        try:
            deadline = None
            while printer.points < written:
                if query.await_termination(0.1):  # ended by itself: raises its error
                    break
                if feeding.done():
                    feeding.result()  # raises the writer's error, if any
                    deadline = deadline or time.perf_counter() + timeout_s
                if deadline is not None and time.perf_counter() > deadline:
                    break
            return time.perf_counter() - started
        finally:
            stop_feeding.set()
            query.stop()  # the epoch in progress, if any, finishes and commits first


def _started_query(
    spark: SparkSession,
    root: Path,
    body: itf.IterationBody,
    start_centers: np.ndarray,
    printer: EpochPrinter,
    **start_options: Any,
) -> itf.UnboundedQuery:
    """The online k-means query over the files arriving in ``root/points``, one per epoch,
    checkpointed in ``root/checkpoint``; ``start_options`` go to ``start()``."""
    points = (
        spark.readStream.schema(POINTS_SCHEMA)
        .option("maxFilesPerTrigger", 1)  # one file per micro-batch: one epoch per file
        .json(str(root / "points"))
    )
    return (
        itf.UnboundedIteration(body)
        .bind("model", initial_model(spark, start_centers), state=True)
        .bind("points", points)
        .listen(printer)
        .start(
            checkpoint_location=str(root / "checkpoint"),
            processing_time="0 seconds",  # a micro-batch as soon as a file arrives
            **start_options,
        )
    )


def run_online_kmeans(
    spark: SparkSession,
    *,
    k: int = 8,
    dims: int = 16,
    files: int = 20,
    points_per_file: int = 2000,
    decay: float = 1.0,
    spread: float = 0.5,
    seed: int = 1,
    folder: str | os.PathLike[str] | None = None,
    interval_s: float = 0.2,
    timeout_s: float = 300.0,
    out: Callable[[str], object] = print,
    event_log: str | os.PathLike[str] | None = None,
    progress: bool | None = False,
) -> OnlineKMeansRun:
    """Stream ``files`` files of points through online k-means; stop once all are consumed.

    ``k`` true centers are drawn uniformly from [-10, 10]^dims and the model
    starts from them plus N(0, 1) noise. While the query runs, a background
    thread writes file after file of ``points_per_file`` points (Gaussian blobs
    of ``spread`` around the true centers), ``interval_s`` seconds apart, into
    a folder the query watches; every file is one micro-batch, hence one epoch.
    ``out`` gets one line per epoch. Once every point written has been
    consumed (or ``timeout_s`` after the last file, at the latest) the query is
    stopped.

    ``folder`` holds the points (``points/``) and the checkpoint
    (``checkpoint/``); by default it is a temporary directory, removed at the
    end. ``event_log`` and ``progress`` go to ``start()``.
    """
    rng = np.random.default_rng(seed)
    true_centers = rng.uniform(-10.0, 10.0, size=(k, dims))
    start_centers = true_centers + rng.normal(0.0, 1.0, size=(k, dims))
    batches = [blobs(rng, points_per_file, true_centers, spread) for _ in range(files)]
    written = files * points_per_file

    with work_folder(folder) as root:
        incoming = root / "points"
        incoming.mkdir()

        printer = EpochPrinter(start_centers, out)
        started = time.perf_counter()
        query = _started_query(
            spark,
            root,
            online_kmeans_step(decay),
            start_centers,
            printer,
            progress=progress,
            event_log=event_log,
        )
        seconds = _feed_until_consumed(
            query,
            printer,
            incoming,
            batches,
            interval_s=interval_s,
            timeout_s=timeout_s,
            started=started,
        )
        history = query.progress
        return OnlineKMeansRun(
            centers=printer.centers,
            true_centers=true_centers,
            epochs=printer.epochs,
            points_written=written,
            points_consumed=printer.points,
            seconds=seconds,
            epoch_seconds=sum(p.duration_s for p in history),
            termination=None if query.termination is None else query.termination.reason,
            progress=history,
        )
