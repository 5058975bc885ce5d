"""iterflow.ml as pyspark.ml: Estimators in Pipelines, Vector columns, saving and loading,
CrossValidator, bad input named; checked against MLlib's own estimators and numpy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.classification import LogisticRegressionModel as MLlibLogisticRegressionModel
from pyspark.ml.clustering import KMeans as MLlibKMeans
from pyspark.ml.clustering import KMeansModel as MLlibKMeansModel
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
    # The stage is saved in MLlib's format: a PipelineModel loads it as MLlib's class, and
    # iterflow's class reads the same directory.
    assert isinstance(loaded.stages[-1], MLlibKMeansModel)
    np.testing.assert_array_equal(loaded.stages[-1].clusterCenters(), model.centroids)
    stage_path = str(next((tmp_path / "pipeline" / "stages").glob("1_*")))
    restored = KMeansModel.load(stage_path)
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


#: Saved when KMeans lived in iterflow.ml.kmeans (it is iterflow.ml.estimators' now): the
#: metadata of the KMeans stages names the class "iterflow.ml.kmeans.KMeans".
SAVED_AT_OLD_PATH = Path(__file__).parent / "data" / "kmeans_saved_at_old_path"


def test_kmeans_saved_under_its_old_class_path_still_loads(spark, tmp_path):
    alone = KMeans.load(str(SAVED_AT_OLD_PATH / "kmeans_estimator"))
    assert (alone.getK(), alone.getInitMode(), alone.getMaxIter()) == (4, "random", 7)
    assert (alone.getWeightCol(), alone.getSeed()) == ("w", 11)
    stage = Pipeline.load(str(SAVED_AT_OLD_PATH / "kmeans_pipeline")).getStages()[-1]
    assert isinstance(stage, KMeans)
    assert (stage.getK(), stage.getMaxIter(), stage.getSeed()) == (2, 5, 3)
    # Saved again, it names the class where it lives now, and loads from there.
    stage.write().save(str(tmp_path / "again"))
    metadata = next((tmp_path / "again" / "metadata").glob("part-*"))
    assert json.loads(metadata.read_text())["class"] == "iterflow.ml.estimators.KMeans"
    assert KMeans.load(str(tmp_path / "again")).getK() == 2

    fitted = PipelineModel.load(str(SAVED_AT_OLD_PATH / "kmeans_pipeline_model"))
    model = fitted.stages[-1]
    assert isinstance(model, KMeansModel) and model.getK() == 2
    np.testing.assert_array_equal(model.centroids, [[0.0, 0.0], [5.0, 5.0]])
    df = spark.createDataFrame([(0.5, -0.5), (4.0, 6.0), (1.0, 1.0)], ["a", "b"])
    predicted = fitted.transform(df).orderBy("a").select("prediction").collect()
    assert [row.prediction for row in predicted] == [0, 0, 1]


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
    # Weights below 1 per cluster: the centroids are the same weighted means.
    tiny = kmeans(
        assembled(spark, blobs, w=weights * 1e-3),
        3,
        weight="w",
        init=start,
        max_rounds=5,
        tol=None,
        progress=False,
    )
    np.testing.assert_allclose(tiny.centroids, weighted.centroids, atol=1e-9)


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


# Regression Estimators, against MLlib's on the same data and Pipelines.


@pytest.fixture(scope="module")
def classes(spark):
    """Noisy two-class data in three numeric columns of different scales."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(600, 3)) * np.array([1.0, 10.0, 0.1])
    margin = x @ np.array([1.2, -0.15, 6.0]) - 0.4
    y = (rng.random(600) < 1.0 / (1.0 + np.exp(-margin))).astype(float)
    return x, y


def classes_frame(spark, x, y, **extra):
    return columns_frame(spark, x, label=y, **extra)


def lr_pipeline(estimator):
    return Pipeline(
        stages=[
            VectorAssembler(inputCols=["c0", "c1", "c2"], outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="features"),
            estimator,
        ]
    )


def test_logistic_pipeline_matches_mllib_and_survives_save_and_load(spark, classes, tmp_path):
    from pyspark.ml.classification import LogisticRegression as MLlibLogistic

    from iterflow.ml import LogisticRegression, LogisticRegressionModel

    df = classes_frame(spark, *classes)
    ours = lr_pipeline(
        LogisticRegression(regParam=0.01, tol=1e-10).setIterationOptions(progress=False)
    )
    theirs = lr_pipeline(MLlibLogistic(regParam=0.01, tol=1e-10))
    fitted, reference = ours.fit(df), theirs.fit(df)
    model = fitted.stages[-1]
    assert isinstance(model, LogisticRegressionModel)
    np.testing.assert_allclose(
        model.coefficients.toArray(), reference.stages[-1].coefficients.toArray(), atol=1e-4
    )
    assert model.intercept == pytest.approx(reference.stages[-1].intercept, abs=1e-4)
    assert model.summary.totalIterations >= 1
    assert model.summary.objectiveHistory[-1] == pytest.approx(
        reference.stages[-1].summary.objectiveHistory[-1], abs=1e-6
    )

    columns = ["c0", "c1", "c2", "rawPrediction", "probability", "prediction"]
    predicted = fitted.transform(df).select(*columns).orderBy("c0").collect()
    expected = reference.transform(df).select(*columns).orderBy("c0").collect()
    assert dict(fitted.transform(df).dtypes) == dict(reference.transform(df).dtypes)
    for a, b in zip(predicted, expected, strict=True):
        np.testing.assert_allclose(
            a["probability"].toArray(), b["probability"].toArray(), atol=1e-4
        )
        np.testing.assert_allclose(
            a["rawPrediction"].toArray(), b["rawPrediction"].toArray(), atol=1e-3
        )
    pairs = zip(predicted, expected, strict=True)
    agree = sum(a["prediction"] == b["prediction"] for a, b in pairs)
    assert agree >= len(expected) - 2  # only points on the boundary may differ

    fitted.write().save(str(tmp_path / "lr"))
    loaded = PipelineModel.load(str(tmp_path / "lr"))
    # Saved in MLlib's format, the stage loads as MLlib's model, which predicts the same.
    assert isinstance(loaded.stages[-1], MLlibLogisticRegressionModel)
    again = loaded.transform(df).select(*columns).orderBy("c0").collect()
    assert [r["prediction"] for r in again] == [r["prediction"] for r in predicted]
    for a, b in zip(again, predicted, strict=True):
        np.testing.assert_allclose(a["probability"], b["probability"], rtol=1e-12, atol=1e-15)
    last_stage = sorted((tmp_path / "lr" / "stages").iterdir())[-1]
    restored = LogisticRegressionModel.load(str(last_stage))
    assert restored.getRegParam() == 0.01 and restored.coefficients == model.coefficients
    point = fitted.transform(df).select("features", "probability", "prediction").first()
    np.testing.assert_allclose(
        restored.predictProbability(point["features"]).toArray(),
        point["probability"].toArray(),
        atol=1e-12,
    )
    assert restored.predict(point["features"]) == point["prediction"]


@pytest.mark.slow_spark  # half a minute of MLlib fits; the pipeline tests stay in CI
def test_cross_validator_picks_the_regparam_mllib_picks(spark, classes):
    from pyspark.ml.classification import LogisticRegression as MLlibLogistic
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from iterflow.ml import LogisticRegression

    df = classes_frame(spark, *classes).cache()
    evaluator = MulticlassClassificationEvaluator(metricName="logLoss")
    picks = []
    for estimator in (
        LogisticRegression(tol=1e-8).setIterationOptions(progress=False),
        MLlibLogistic(tol=1e-8),
    ):
        grid = ParamGridBuilder().addGrid(estimator.regParam, [0.3, 0.03, 0.0]).build()
        cv = CrossValidator(
            estimator=lr_pipeline(estimator),
            estimatorParamMaps=grid,
            evaluator=evaluator,
            numFolds=3,
            seed=7,
        )
        fitted = cv.fit(df)
        picks.append((fitted.bestModel.stages[-1].getRegParam(), fitted.avgMetrics))
    (ours, our_metrics), (theirs, their_metrics) = picks
    assert ours == theirs
    np.testing.assert_allclose(our_metrics, their_metrics, atol=1e-4)


def test_linear_estimator_matches_mllib_with_standardization_and_sparse_vectors(spark):
    from pyspark.ml.regression import LinearRegression as MLlibLinear

    from iterflow.ml import LinearRegression

    rng = np.random.default_rng(4)
    x = np.where(rng.random((500, 4)) < 0.4, 0.0, rng.normal(size=(500, 4)) * [1, 5, 0.5, 2])
    y = x @ np.array([2.0, -0.3, 4.0, 0.0]) + 1.5 + rng.normal(0, 0.5, 500)
    dense, sparse = assembled(spark, x, label=y), sparse_frame(spark, x, label=y)
    params = {"regParam": 0.1, "elasticNetParam": 0.0, "tol": 1e-10, "maxIter": 200}
    reference = MLlibLinear(solver="l-bfgs", **params).fit(dense)
    fits = [
        LinearRegression(**params).setIterationOptions(progress=False).fit(df)
        for df in (dense, sparse)
    ]
    for model in fits:
        np.testing.assert_allclose(
            model.coefficients.toArray(), reference.coefficients.toArray(), atol=1e-4
        )
        assert model.intercept == pytest.approx(reference.intercept, abs=1e-4)
    predicted = fits[1].transform(sparse).select("prediction").collect()
    scores = x @ fits[1].coefficients.toArray() + fits[1].intercept
    np.testing.assert_allclose(sorted(r[0] for r in predicted), sorted(scores), atol=1e-9)


def test_regression_estimators_name_bad_params_and_labels(spark, classes):
    from iterflow.ml import LinearRegression, LogisticRegression

    with pytest.raises(MLError, match=r"no Param\(s\) \['maxIters'\]"):
        LogisticRegression(maxIters=5)
    with pytest.raises(MLError, match="solver='newton'"):
        LinearRegression(solver="newton")
    x, y = classes
    df = assembled(spark, x, label=np.where(np.arange(len(y)) == 5, 2.0, y))
    with pytest.raises(MLError, match=r"label column 'label'.* 0 and 1"):
        LogisticRegression().setIterationOptions(progress=False).fit(df)


def test_gradient_descent_estimator_is_the_short_form(spark, classes):
    from iterflow.ml import LogisticRegression, logistic_regression

    x, y = classes
    df = assembled(spark, x / np.array([1.0, 10.0, 0.1]), label=y)
    estimator = LogisticRegression(solver="gd", learningRate=2.0, maxIter=40, regParam=0.01)
    model = estimator.setIterationOptions(progress=False).fit(df)
    short = logistic_regression(
        df, solver="gd", learning_rate=2.0, max_rounds=40, reg=0.01, progress=False
    )
    np.testing.assert_allclose(model.coefficients.toArray(), short.coefficients, atol=1e-12)
    assert model.summary.objectiveHistory == pytest.approx(list(short.objective_history))
    assert model.summary.totalIterations == short.rounds
