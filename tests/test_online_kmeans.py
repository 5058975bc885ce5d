"""Online k-means as an unbounded iteration agrees with a numpy StreamingKMeans, epoch by epoch;
the streaming demo consumes every point it writes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from pyspark.sql import SparkSession

import iterflow as itf
from iterflow.cli import main
from iterflow.demo.online_kmeans_demo import (
    POINTS_SCHEMA,
    blobs,
    centers_of,
    initial_model,
    online_kmeans_step,
    run_online_kmeans,
    write_points,
)

pytestmark = pytest.mark.spark


def streaming_kmeans(
    centers: np.ndarray, batches: list[np.ndarray], decay: float
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Spark MLlib's StreamingKMeans update in numpy, from weight 0: per batch, the
    centers, weights and point counts after it.

    Each point goes to its nearest center (Euclidean); then per cluster, with n new
    points summing to s: weight' = weight * decay + n, and when n > 0,
    center' = (center * weight * decay + s) / weight'.
    """
    centers = centers.astype(float).copy()
    weights = np.zeros(len(centers))
    after = []
    for points in batches:
        distances = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
        nearest = distances.argmin(axis=1)
        counts = np.bincount(nearest, minlength=len(centers))
        for cluster in range(len(centers)):
            kept = weights[cluster] * decay
            if counts[cluster] > 0:
                total = points[nearest == cluster].sum(axis=0)
                centers[cluster] = (centers[cluster] * kept + total) / (kept + counts[cluster])
            weights[cluster] = kept + counts[cluster]
        after.append((centers.copy(), weights.copy(), counts))
    return after


def test_epochs_match_numpy_streaming_kmeans(spark: SparkSession, tmp_path: Path) -> None:
    k, dims, decay, per_file = 4, 3, 0.9, 200
    rng = np.random.default_rng(11)
    true_centers = rng.uniform(-5.0, 5.0, size=(k, dims))
    # The first file has points around every true center, the later ones none around
    # the last: that cluster keeps its center while its weight decays.
    batches = [blobs(rng, per_file, true_centers, spread=1.0)]
    batches += [blobs(rng, per_file, true_centers[:-1], spread=1.0) for _ in range(4)]
    start_centers = true_centers + rng.normal(0.0, 1.0, size=(k, dims))

    folder = tmp_path / "points"
    folder.mkdir()
    first = time.time() - 1000
    for index, batch in enumerate(batches):
        path = write_points(folder, f"points-{index:03d}.json", batch)
        os.utime(path, (first + index, first + index))  # the file source reads in this order

    seen: list[tuple[int, list[tuple[int, list[float], float]]]] = []

    def capture(end: itf.RoundEnd) -> None:
        rows = sorted(end.outputs["model"].collect(), key=lambda r: r["cluster"])
        seen.append((end.epoch, [(r["cluster"], r["center"], r["weight"]) for r in rows]))

    points = (
        spark.readStream.schema(POINTS_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
    )
    query = (
        itf.UnboundedIteration(online_kmeans_step(decay))
        .bind("model", initial_model(spark, start_centers), state=True)
        .bind("points", points)
        .listen(capture)
        .start(checkpoint_location=str(tmp_path / "checkpoint"), available_now=True, progress=False)
    )
    assert query.await_termination(timeout=120)
    assert query.termination is not None and query.termination.reason == "inputs_ended"

    expected = streaming_kmeans(start_centers, batches, decay)
    assert [epoch for epoch, _ in seen] == list(range(len(batches)))  # one epoch per file
    assert [p.input_rows["points"] for p in query.progress] == [per_file] * len(batches)
    # The case under test happens: a cluster with weight gets no points in a later epoch.
    assert any(((counts == 0) & (weights > 0)).any() for _, weights, counts in expected[1:])
    for (_, model), (centers, weights, _) in zip(seen, expected, strict=True):
        assert [cluster for cluster, _, _ in model] == list(range(k))
        got_centers = np.array([center for _, center, _ in model])
        got_weights = np.array([weight for _, _, weight in model])
        np.testing.assert_allclose(got_centers, centers, rtol=0, atol=1e-9)
        np.testing.assert_allclose(got_weights, weights, rtol=0, atol=1e-9)


def test_runner_consumes_every_point_written_while_running(
    spark: SparkSession, tmp_path: Path
) -> None:
    lines: list[str] = []
    run = run_online_kmeans(
        spark,
        k=3,
        dims=2,
        files=4,
        points_per_file=100,
        seed=3,
        folder=tmp_path / "work",
        interval_s=0.1,
        out=lines.append,
    )
    assert sorted(p.name for p in (tmp_path / "work" / "points").iterdir()) == [
        f"points-{i:05d}.json" for i in range(4)
    ]  # renamed into place: no temporary file is left behind
    assert run.points_written == run.points_consumed == 400
    assert run.termination == "stopped"
    assert run.epochs == len(lines) == len(run.progress) == 4  # one file per micro-batch
    assert [p.input_rows["points"] for p in run.progress] == [100] * 4
    assert all(line.lstrip().startswith(f"epoch {i:4d}") for i, line in enumerate(lines))
    assert run.centers.shape == run.true_centers.shape == (3, 2)
    assert run.center_error < 0.5  # 400 points, spread 0.5: every true center is found


def test_demo_command_prints_epochs_and_summary(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "online-kmeans", "--k", "3", "--dims", "4", "--files", "3"]
    argv += ["--points-per-file", "150", "--interval", "0", "--decay", "0.8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    epochs = [line.split() for line in out.splitlines() if line.lstrip().startswith("epoch ")]
    assert [(int(words[1]), int(words[2])) for words in epochs] == [(i, 150) for i in range(3)]
    assert "epochs: 3  points: 450 of 450" in out
    error = float(out.split("centers: at most ")[1].split()[0])
    assert 0 <= error < 0.5


def test_centers_of_orders_by_cluster(spark: SparkSession) -> None:
    centers = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    model = initial_model(spark, centers).orderBy("weight", "center", ascending=False)
    np.testing.assert_array_equal(centers_of(model), centers)
