"""iterflow.ml.kmeans against Flink ML's published case and a numpy Lloyd's algorithm."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from iterflow.ml import MLError, kmeans

FLINK_POINTS = [(0.0, 0.0), (0.0, 0.3), (0.3, 0.0), (9.0, 0.0), (9.0, 0.6), (9.6, 0.0)]


def points_frame(spark, points, partitions=2):
    rows = pa.table({"features": [list(map(float, p)) for p in points]})
    return spark.createDataFrame(rows).repartition(partitions)


def numpy_lloyd(points: np.ndarray, centroids: np.ndarray, rounds: int) -> list[np.ndarray]:
    """Lloyd's algorithm in plain numpy: the centroids after every round; an empty
    cluster keeps its centroid."""
    history = []
    for _ in range(rounds):
        distance = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
        chosen = distance.argmin(axis=1)
        centroids = np.array(
            [
                points[chosen == c].mean(axis=0) if (chosen == c).any() else centroids[c]
                for c in range(len(centroids))
            ]
        )
        history.append(centroids)
    return history


def test_flink_ml_published_case(spark):
    model = kmeans(
        points_frame(spark, FLINK_POINTS),
        2,
        init=[FLINK_POINTS[0], FLINK_POINTS[1]],
        max_rounds=2,
        tol=None,
        progress=False,
    )
    assert model.rounds == 2 and model.termination.reason == "max_rounds"
    found = sorted(map(tuple, model.centroids))
    assert found == [pytest.approx((0.1, 0.1), abs=1e-5), pytest.approx((9.2, 0.2), abs=1e-5)]
    predicted = {
        tuple(r["features"]): r["prediction"]
        for r in model.predict(points_frame(spark, FLINK_POINTS)).collect()
    }
    assert len({predicted[p] for p in FLINK_POINTS[:3]}) == 1
    assert predicted[FLINK_POINTS[0]] != predicted[FLINK_POINTS[3]]


def test_fewer_distinct_points_than_k_assigns_every_point(spark):
    points = [(1.0, 1.0)] * 4 + [(5.0, 5.0)] * 3
    df = points_frame(spark, points)
    model = kmeans(df, 4, max_rounds=5, seed=3, init="random", progress=False)
    predictions = model.predict(df).collect()
    assert len(predictions) == 7 and all(r["prediction"] is not None for r in predictions)
    centres = {tuple(model.centroids[r["prediction"]]) for r in predictions}
    assert centres == {(1.0, 1.0), (5.0, 5.0)}


@pytest.mark.parametrize("seed", [0, 1])
def test_round_by_round_equal_to_numpy_lloyd(spark, seed):
    rng = np.random.default_rng(seed)
    true = rng.normal(0, 5, size=(4, 3))
    points = true[rng.integers(0, 4, 600)] + rng.normal(0, 1.0, size=(600, 3))
    start = points[:4].copy()
    seen = []

    def record(end):
        model = end.outputs["model"].toArrow()
        seen.append((model.column("centroids")[0].values.to_numpy().reshape(4, 3), end.progress))

    model = kmeans(
        points_frame(spark, points, partitions=3),
        4,
        init=start,
        max_rounds=6,
        tol=None,
        listen=record,
        progress=False,
    )
    expected = numpy_lloyd(points, start, 6)
    assert len(seen) == 6
    for (got, _), want in zip(seen, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-9)
    np.testing.assert_allclose(model.centroids, expected[-1], atol=1e-9)
    # The loss of round k is the cost of the assignment to round k's input centroids.
    before = [start, *expected[:-1]]
    for (_, progress), centroids in zip(seen, before, strict=True):
        cost = ((points[:, None, :] - centroids[None]) ** 2).sum(axis=2).min(axis=1).sum()
        assert progress.metrics["loss"] == pytest.approx(cost, rel=1e-9)
    losses = [p.metrics["loss"] for _, p in seen]
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(losses))


def test_tol_stops_early_with_converged_and_columns_work(spark):
    rng = np.random.default_rng(7)
    points = np.concatenate([rng.normal(0, 0.1, (50, 2)), rng.normal(10, 0.1, (50, 2))])
    df = spark.createDataFrame(pa.table({"x": points[:, 0], "y": points[:, 1]}))
    model = kmeans(df, 2, features=["x", "y"], max_rounds=50, tol=1e-6, seed=2, progress=False)
    assert model.termination.reason == "converged" and model.rounds < 50
    assert sorted(np.round(model.centroids.sum(axis=1))) == [0.0, 20.0]


def test_an_array_of_non_null_columns_gives_the_same_model(spark):
    # F.array over non-null columns has non-null elements, which Arrow batches do not mark.
    from pyspark.sql import functions as F

    df = (
        spark.range(0, 400, numPartitions=3)
        .select((F.rand(1) * 3.0).alias("x"), (F.rand(2) * 2.0).alias("y"))
        .localCheckpoint()
    )
    packed = df.select(F.array("x", "y").alias("features"))
    assert not packed.schema["features"].dataType.containsNull
    start = [[0.5, 1.0], [2.5, 1.0]]
    by_array = kmeans(packed, 2, init=start, max_rounds=5, tol=None, progress=False)
    by_columns = kmeans(
        df, 2, features=["x", "y"], init=start, max_rounds=5, tol=None, progress=False
    )
    assert np.allclose(by_array.centroids, by_columns.centroids, atol=1e-12)


def test_bad_input_is_named(spark):
    df = points_frame(spark, FLINK_POINTS)
    with pytest.raises(MLError, match="no feature column 'vec'"):
        kmeans(df, 2, features="vec")
    with pytest.raises(MLError, match=r"shape \(2, 2\)"):
        kmeans(df, 2, init=[[0.0, 0.0, 0.0]])
    with pytest.raises(MLError, match="positive int"):
        kmeans(df, 0)
    # Found in k-means++'s sample, before the first round.
    with pytest.raises(MLError, match=r"feature column\(s\) \['features'\]: a row has a NaN"):
        kmeans(points_frame(spark, [(0.0, float("nan")), (1.0, 1.0)]), 1, progress=False)


def test_kmeans_demo_finds_the_centers_and_its_loss_plots(spark, capsys, tmp_path):
    from iterflow.cli import main
    from iterflow.progress.event_log import read_events
    from iterflow.progress.plot import plot_events

    log = tmp_path / "kmeans.jsonl"
    args = ["demo", "kmeans", "--points", "3000", "--k", "3", "--dims", "2"]
    assert main([*args, "--event-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "termination: converged" in out
    # The loss gauge of every round is in the event log, and `iterflow plot` draws it.
    (line,) = plot_events(read_events(log), metric="loss").axes[0].get_lines()
    rounds, losses = list(line.get_xdata()), list(line.get_ydata())
    assert rounds == [float(k) for k in range(len(rounds))] and len(rounds) >= 2
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(losses))
    png = tmp_path / "loss.png"
    assert main(["plot", str(log), "--metric", "loss", "--output", str(png)]) == 0
    assert png.stat().st_size > 0
    # Every centroid lies next to one of the true centers (blobs of spread 0.5).
    distances = [
        float(line.rsplit("(", 1)[1].rstrip(")"))
        for line in out.splitlines()
        if "->" in line and "center" in line and "(" in line and "nearest" not in line
    ]
    assert len(distances) == 3 and max(distances) < 0.2


def test_plus_plus_seeding_spreads_the_centroids():
    from iterflow.ml.kmeans import plus_plus

    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
    sample = centers[rng.integers(0, 4, 2000)] + rng.normal(0, 0.3, (2000, 2))
    for seed in range(5):
        chosen = plus_plus(sample, 4, seed)
        owners = {int(np.linalg.norm(centers - c, axis=1).argmin()) for c in chosen}
        assert owners == {0, 1, 2, 3}, seed  # one seed per blob, for every seed tried
    assert np.array_equal(plus_plus(sample, 4, 7), plus_plus(sample, 4, 7))
    same = np.ones((5, 2))
    assert plus_plus(same, 3, 0).shape == (3, 2)  # fewer distinct points than k
