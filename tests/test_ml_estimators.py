"""iterflow.ml as pyspark.ml: Estimators in Pipelines, Vector columns, saving and loading,
CrossValidator, bad input named; checked against MLlib's own estimators and numpy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.clustering import KMeans as MLlibKMeans
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F

from iterflow.ml import KMeans, KMeansModel, MLError, kmeans, linear_regression

CENTERS = np.array([[0.0, 0.0, 0.0], [6.0, 6.0, 0.0], [0.0, 6.0, 6.0]])


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(3)
    return np.vstack([rng.normal(c, 0.4, (120, 3)) for c in CENTERS])


def columns_frame(spark, points: np.ndarray, partitions: int = 3, **extra):
    table = {f"c{i}": points[:, i] for i in range(points.shape[1])} | extra
    return spark.createDataFrame(pa.table(table)).repartition(partitions)


def assembled(spark, points: np.ndarray, **extra):
    names = [f"c{i}" for i in range(points.shape[1])]
    return VectorAssembler(inputCols=names, outputCol="features").transform(
        columns_frame(spark, points, **extra)
    )


def sparse_frame(spark, points: np.ndarray, **extra):
    """The same points as sparse Vectors (zeros left out), with ``extra`` columns."""
    rows = []
    for i, p in enumerate(points):
        nonzero = np.flatnonzero(p)
        vector = Vectors.sparse(len(p), nonzero.tolist(), p[nonzero].tolist())
        rows.append((vector, *[float(v[i]) for v in extra.values()]))
    return spark.createDataFrame(rows, ["features", *extra]).repartition(3)


def lloyd(points, centroids, rounds, weights=None):
    """Lloyd's algorithm in numpy (the reference)."""
    weights = np.ones(len(points)) if weights is None else weights
    for _ in range(rounds):
        chosen = ((points[:, None, :] - centroids[None]) ** 2).sum(axis=2).argmin(axis=1)
        moved = centroids.copy()
        for c in range(len(centroids)):
            members = chosen == c
            if weights[members].sum() > 0:
                moved[c] = (weights[members, None] * points[members]).sum(0) / weights[
                    members
                ].sum()
        centroids = moved
    return centroids


def test_kmeans_estimator_in_a_pipeline_saves_loads_and_matches_mllib(spark, blobs, tmp_path):
    df = columns_frame(spark, blobs)
    assembler = VectorAssembler(inputCols=["c0", "c1", "c2"], outputCol="features")
    estimator = KMeans(k=3, maxIter=30, tol=1e-6, seed=5).setIterationOptions(progress=False)
    fitted = Pipeline(stages=[assembler, estimator]).fit(df)
    model = fitted.stages[-1]
    assert isinstance(model, KMeansModel) and model.getK() == 3 and model.getSeed() == 5
    assert model.summary.totalIterations == model.rounds <= 30
    assert model.termination.reason == "converged"
    assert len(model.summary.objectiveHistory) == model.rounds

    reference = MLlibKMeans(k=3, maxIter=30, tol=1e-6, seed=5).fit(assembler.transform(df))
    ours = sorted(map(tuple, np.round(model.centroids, 9)))
    theirs = sorted(map(tuple, np.round(np.array(reference.clusterCenters()), 9)))
    np.testing.assert_allclose(ours, theirs, atol=1e-6)

    predicted = fitted.transform(df).select("c0", "c1", "c2", "prediction")
    assert dict(predicted.dtypes)["prediction"] == "int"
    fitted.write().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    again = loaded.transform(df).select("c0", "c1", "c2", "prediction")
    assert sorted(predicted.collect()) == sorted(again.collect())
    restored = loaded.stages[-1]
    np.testing.assert_array_equal(restored.centroids, model.centroids)
    assert restored.getK() == 3 and not restored.hasSummary
    with pytest.raises(MLError, match="loaded"):
        restored.summary  # noqa: B018
    # One point, as MLlib's predict, agrees with the DataFrame's.
    first = fitted.transform(df).select("features", "prediction").first()
    assert model.predict(first["features"]) == first["prediction"]


def test_kmeans_estimator_saved_alone_keeps_its_params(spark, tmp_path):
    estimator = KMeans(k=4, initMode="random", maxIter=7, weightCol="w")
    estimator.write().save(str(tmp_path / "estimator"))
    loaded = KMeans.load(str(tmp_path / "estimator"))
    assert (loaded.getK(), loaded.getInitMode(), loaded.getMaxIter()) == (4, "random", 7)
    assert loaded.getWeightCol() == "w"


def test_sparse_and_dense_vectors_and_columns_give_the_same_kmeans(spark, blobs):
    points = np.where(np.abs(blobs) < 0.3, 0.0, blobs)  # some exact zeros for sparsity
    start = points[[0, 130, 250]]
    runs = [
        kmeans(df, 3, features=features, init=start, max_rounds=4, tol=None, progress=False)
        for df, features in [
            (columns_frame(spark, points), ["c0", "c1", "c2"]),
            (assembled(spark, points), "features"),
            (sparse_frame(spark, points), "features"),
        ]
    ]
    expected = lloyd(points, start, 4)
    for model in runs:
        np.testing.assert_allclose(model.centroids, expected, atol=1e-9)


def test_weighted_kmeans_equals_repeated_points(spark, blobs):
    rng = np.random.default_rng(9)
    weights = rng.integers(0, 4, len(blobs)).astype(float)
    start = blobs[[0, 130, 250]]
    weighted = kmeans(
        assembled(spark, blobs, w=weights),
        3,
        weight="w",
        init=start,
        max_rounds=5,
        tol=None,
        progress=False,
    )
    repeated = np.repeat(blobs, weights.astype(int), axis=0)
    np.testing.assert_allclose(weighted.centroids, lloyd(repeated, start, 5), atol=1e-9)
    np.testing.assert_allclose(weighted.centroids, lloyd(blobs, start, 5, weights), atol=1e-9)


def test_iteration_options_reach_the_run(spark, blobs, tmp_path):
    ends: list[int] = []
    estimator = KMeans(k=3, maxIter=3, tol=0.0).setIterationOptions(
        listen=lambda end: ends.append(end.epoch),
        progress=False,
        event_log=str(tmp_path / "events.jsonl"),
    )
    model = estimator.fit(assembled(spark, blobs))
    assert model.rounds >= 2 and ends == list(range(model.rounds))
    assert (tmp_path / "events.jsonl").read_text().count('"round_end"') == model.rounds
    # copy() (as CrossValidator does) keeps the options and changes only the Params.
    copied = estimator.copy({estimator.maxIter: 2})
    assert copied.getMaxIter() == 2 and estimator.getMaxIter() == 3
    assert copied.getIterationOptions()["progress"] is False


def test_bad_params_and_input_are_ml_errors_naming_them(spark, blobs):
    with pytest.raises(MLError, match="initMode='nope'"):
        KMeans(initMode="nope")
    df = assembled(spark, blobs)
    with pytest.raises(MLError, match="no feature column 'vec'"):
        KMeans(featuresCol="vec").fit(df)
    with pytest.raises(MLError, match="must be a Vector or an array of numbers"):
        kmeans(columns_frame(spark, blobs).withColumn("s", F.lit("x")), 2, features="s")
    nan = blobs.copy()
    nan[5, 1] = np.nan
    with pytest.raises(MLError, match=r"feature column\(s\) \['features'\]: a row has a NaN"):
        KMeans(k=2).setIterationOptions(progress=False).fit(sparse_frame(spark, nan))
    weights = np.ones(len(blobs))
    weights[7] = -1.0
    with pytest.raises(MLError, match="feature column 'features' has a NaN"):  # in a worker
        kmeans(sparse_frame(spark, nan), 2, init=blobs[:2], progress=False)
    with pytest.raises(MLError, match="weight column 'w' has a negative value"):
        KMeans(k=2, weightCol="w").setIterationOptions(progress=False).fit(
            assembled(spark, blobs, w=weights)
        )
    with pytest.raises(MLError, match="label column 'label' has a null, NaN"):
        linear_regression(
            columns_frame(spark, blobs, label=np.where(np.arange(len(blobs)) == 3, np.nan, 1.0)),
            features=["c0", "c1"],
            progress=False,
        )
    infinite = blobs.copy()
    infinite[10, 1] = np.inf
    with pytest.raises(MLError, match="feature column 'c1' has a null, NaN or infinite"):
        linear_regression(
            columns_frame(spark, infinite, label=np.ones(len(blobs))),
            features=["c0", "c1", "c2"],
            progress=False,
        )


def test_standard_scaler_then_kmeans_in_a_pipeline(spark, blobs):
    df = assembled(spark, blobs)
    scaler = StandardScaler(inputCol="features", outputCol="scaled", withMean=True)
    estimator = KMeans(k=3, featuresCol="scaled", maxIter=20, seed=2)
    fitted = Pipeline(stages=[scaler, estimator.setIterationOptions(progress=False)]).fit(df)
    sizes = sorted(r["count"] for r in fitted.transform(df).groupBy("prediction").count().collect())
    assert sizes == [120, 120, 120]
    assert fitted.stages[-1].termination.reason == "converged"
