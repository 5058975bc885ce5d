"""iterflow.ml's Estimators as drop-ins for MLlib's: the same Params, defaults and accessors,
MLlib's saved format both ways, warm starts from either library's models, and the short
forms returning the Estimators' models with the same defaults."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml import classification as mllib_classification
from pyspark.ml import clustering as mllib_clustering
from pyspark.ml import regression as mllib_regression
from pyspark.ml.linalg import Vectors

from iterflow.ml import (
    KMeans,
    KMeansModel,
    LinearRegression,
    LinearRegressionModel,
    LogisticRegression,
    LogisticRegressionModel,
    MLError,
    kmeans,
    linear_regression,
    logistic_regression,
)

PAIRS = [
    (LogisticRegression, "LogisticRegression", mllib_classification),
    (LinearRegression, "LinearRegression", mllib_regression),
    (KMeans, "KMeans", mllib_clustering),
]


@pytest.fixture(scope="module")
def data(spark):
    """Two classes in 3 features (a label for each kind of fit) as a Vector column."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(600, 3)) * np.array([1.0, 3.0, 0.5]) + np.array([0.5, -1.0, 2.0])
    margin = x @ np.array([1.2, -0.4, 0.8]) - 1.0
    label = (rng.random(600) < 1 / (1 + np.exp(-margin))).astype(float)
    y = x @ np.array([2.0, -1.0, 0.5]) + 4.0 + rng.normal(0, 0.2, 600)
    rows = [
        (Vectors.dense(r.tolist()), float(a), float(b)) for r, a, b in zip(x, label, y, strict=True)
    ]
    return spark.createDataFrame(rows, ["features", "label", "y"]).repartition(3).cache()


@pytest.mark.parametrize(("ours", "name", "module"), PAIRS)
def test_every_param_has_mllibs_default_and_a_setter_and_getter(spark, ours, name, module):
    theirs = getattr(module, name)()
    estimator = ours()
    shared = {p.name for p in theirs.params} & {p.name for p in estimator.params}
    assert len(shared) >= 7
    for param_name in shared - {"seed"}:  # MLlib's default seed is a hash of the class name
        if theirs.hasDefault(param_name):
            assert estimator.getOrDefault(param_name) == theirs.getOrDefault(param_name), param_name
    for p in estimator.params:
        suffix = p.name[0].upper() + p.name[1:]
        assert callable(getattr(estimator, f"get{suffix}")), p.name
        assert callable(getattr(estimator, f"set{suffix}")), p.name
    # The constructor's signature names every Param, keyword-only, with its default.
    signature = inspect.signature(ours.__init__).parameters
    for p in estimator.params:
        assert signature[p.name].kind is inspect.Parameter.KEYWORD_ONLY, p.name
        if estimator.hasDefault(p) and signature[p.name].default is not None:
            assert signature[p.name].default == estimator.getOrDefault(p), p.name


@pytest.mark.parametrize(("ours", "name", "module"), PAIRS)
def test_an_unknown_param_is_the_same_ml_error_everywhere(ours, name, module):
    with pytest.raises(MLError, match=r"has no Param\(s\) \['maxIters'\]"):
        ours(maxIters=3)
    with pytest.raises(MLError, match=r"has no Param\(s\) \['maxIters'\]"):
        ours().setParams(maxIters=3)
    with pytest.raises(MLError, match="takes its Params by name"):
        ours(3)
    with pytest.raises(MLError, match="maxIter"):
        ours().setMaxIter("many")
    assert ours().setMaxIter(7).getMaxIter() == 7


def test_models_have_mllibs_setters(data):
    model = logistic_regression(data, progress=False)
    scored = (
        model.setThreshold(0.9)
        .setPredictionCol("label9")
        .setProbabilityCol("p")
        .setRawPredictionCol("raw")
        .transform(data)
    )
    rows = scored.select("p", "label9").collect()
    assert all(r["label9"] == (1.0 if r["p"][1] > 0.9 else 0.0) for r in rows)
    assert {"raw", "p", "label9"} <= set(scored.columns)


def test_short_forms_return_the_estimators_models_with_the_same_defaults(data):
    short = logistic_regression(data, progress=False)
    fitted = LogisticRegression().setIterationOptions(progress=False).fit(data)
    assert type(short) is type(fitted) is LogisticRegressionModel
    np.testing.assert_array_equal(short.coefficients.toArray(), fitted.coefficients.toArray())
    assert short.getStandardization() and short.getSolver() == "lbfgs"
    reference = mllib_classification.LogisticRegression().fit(data)
    np.testing.assert_allclose(
        short.coefficients.toArray(), reference.coefficients.toArray(), atol=1e-5
    )
    # prediction is the label, as MLlib's (it was the probability before).
    labels = {r["prediction"] for r in short.transform(data).select("prediction").collect()}
    assert labels <= {0.0, 1.0}
    linear = linear_regression(data, label="y", progress=False)
    assert type(linear) is LinearRegressionModel and linear.getLabelCol() == "y"
    assert type(kmeans(data, 2, progress=False)) is KMeansModel


def _same_predictions(first, second, data, column="prediction"):
    a = first.transform(data).select(column).collect()
    b = second.transform(data).select(column).collect()
    return [r[0] for r in a] == [r[0] for r in b]


def test_iterflow_models_load_with_mllibs_classes_and_predict_the_same(data, tmp_path):
    logistic = LogisticRegression(regParam=0.01).setIterationOptions(progress=False).fit(data)
    logistic.save(str(tmp_path / "lr"))
    theirs = mllib_classification.LogisticRegressionModel.load(str(tmp_path / "lr"))
    assert theirs.getRegParam() == 0.01
    np.testing.assert_array_equal(theirs.coefficients.toArray(), logistic.coefficients.toArray())
    assert theirs.intercept == logistic.intercept
    assert _same_predictions(logistic, theirs, data)

    linear = LinearRegression(labelCol="y", solver="gd", learningRate=0.05, maxIter=30)
    linear_model = linear.setIterationOptions(progress=False).fit(data)
    linear_model.save(str(tmp_path / "linear"))
    theirs_linear = mllib_regression.LinearRegressionModel.load(str(tmp_path / "linear"))
    assert theirs_linear.getSolver() == "auto"  # MLlib has no "gd": its default is saved
    got = [r[0] for r in theirs_linear.transform(data).select("prediction").collect()]
    want = [r[0] for r in linear_model.transform(data).select("prediction").collect()]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # iterflow's class reads its own Params back, "gd" included.
    assert LinearRegressionModel.load(str(tmp_path / "linear")).getSolver() == "gd"

    clusters = KMeans(k=3, initMode="k-means++", seed=3).setIterationOptions(progress=False)
    clusters_model = clusters.fit(data)
    clusters_model.save(str(tmp_path / "km"))
    theirs_km = mllib_clustering.KMeansModel.load(str(tmp_path / "km"))
    np.testing.assert_array_equal(theirs_km.clusterCenters(), clusters_model.centroids)
    assert _same_predictions(clusters_model, theirs_km, data)
    assert KMeansModel.load(str(tmp_path / "km")).getInitMode() == "k-means++"


def test_mllibs_saved_models_load_as_iterflows(data, tmp_path):
    theirs = mllib_classification.LogisticRegression(regParam=0.02, threshold=0.4).fit(data)
    theirs.save(str(tmp_path / "lr"))
    ours = LogisticRegressionModel.load(str(tmp_path / "lr"))
    assert (ours.getRegParam(), ours.getThreshold()) == (0.02, 0.4)
    np.testing.assert_array_equal(ours.coefficients.toArray(), theirs.coefficients.toArray())
    assert _same_predictions(ours, theirs, data)
    assert not ours.hasSummary

    linear = mllib_regression.LinearRegression(labelCol="y").fit(data)
    linear.save(str(tmp_path / "linear"))
    ours_linear = LinearRegressionModel.load(str(tmp_path / "linear"))
    assert ours_linear.getLabelCol() == "y" and ours_linear.intercept == linear.intercept

    clusters = mllib_clustering.KMeans(k=4, seed=1).fit(data)
    clusters.save(str(tmp_path / "km"))
    ours_km = KMeansModel.load(str(tmp_path / "km"))
    np.testing.assert_array_equal(ours_km.centroids, clusters.clusterCenters())
    assert ours_km.getK() == 4 and _same_predictions(ours_km, clusters, data)

    with pytest.raises(MLError, match=r"holds a org\.apache\.spark\.ml\.clustering\.KMeansModel"):
        LogisticRegressionModel.load(str(tmp_path / "km"))
    multinomial = mllib_classification.LogisticRegression(family="multinomial", maxIter=5)
    multinomial.fit(data).save(str(tmp_path / "multi"))
    with pytest.raises(MLError, match="multinomial"):
        LogisticRegressionModel.load(str(tmp_path / "multi"))


def test_initial_model_warm_starts_from_either_librarys_model(data, tmp_path):
    done = LogisticRegression(regParam=0.01, tol=1e-10).setIterationOptions(progress=False)
    converged = done.fit(data)
    warm = done.copy().setInitialModel(converged).fit(data)
    # From the optimum, L-BFGS stops at once, where it was.
    assert warm.summary.totalIterations <= 1 < converged.summary.totalIterations
    np.testing.assert_allclose(
        warm.coefficients.toArray(), converged.coefficients.toArray(), atol=1e-8
    )
    theirs = mllib_classification.LogisticRegression(regParam=0.01, tol=1e-10).fit(data)
    from_mllib = done.copy().setInitialModel(theirs).fit(data)
    assert from_mllib.summary.totalIterations <= 2
    np.testing.assert_allclose(
        from_mllib.coefficients.toArray(), theirs.coefficients.toArray(), atol=1e-6
    )

    centers = mllib_clustering.KMeans(k=3, seed=2, tol=0.0, maxIter=50).fit(data)
    # k comes from the initial model; from MLlib's converged centroids one round moves none.
    resumed = KMeans(initialModel=centers).setIterationOptions(progress=False).fit(data)
    assert resumed.getK() == 3 and resumed.rounds == 1
    np.testing.assert_allclose(resumed.centroids, centers.clusterCenters(), atol=1e-9)
    with pytest.raises(MLError, match=r"shape \(2, 3\)"):
        KMeans(k=2, initialModel=centers).setIterationOptions(progress=False).fit(data)

    # Saved with an initial model (an object), an Estimator saves the model beside it.
    linear = LinearRegression(labelCol="y", initialModel=linear_regression(data, label="y"))
    linear.save(str(tmp_path / "estimator"))
    loaded = LinearRegression.load(str(tmp_path / "estimator"))
    assert loaded.getInitialModel().endswith("initialModel")
    again = loaded.setIterationOptions(progress=False).fit(data)
    assert again.summary.totalIterations <= 1


def test_kmeans_summary_has_mllibs_training_cost_and_cluster_sizes(data):
    # From MLlib's converged centroids, both libraries' last assignment is to the same
    # centroids: the same trainingCost and clusterSizes.
    theirs = mllib_clustering.KMeans(k=3, seed=4, tol=0.0, maxIter=50).fit(data)
    ours = KMeans(maxIter=5, initialModel=theirs).setIterationOptions(progress=False)
    model = ours.fit(data)
    points = np.array([r[0].toArray() for r in data.select("features").collect()])
    squares = ((points[:, None, :] - model.centroids[None]) ** 2).sum(-1)
    nearest = np.argmin(squares, axis=1)
    assert model.summary.clusterSizes == np.bincount(nearest, minlength=3).tolist()
    assert model.summary.clusterSizes == theirs.summary.clusterSizes
    assert model.summary.trainingCost == pytest.approx(squares.min(axis=1).sum(), rel=1e-12)
    assert model.summary.trainingCost == pytest.approx(theirs.summary.trainingCost, rel=1e-9)
    assert model.summary.k == 3 and model.summary.numIter == model.rounds
    assert model.summary.predictions.count() == len(points)


def test_a_pipeline_of_iterflow_stages_saves_in_mllibs_format(data, tmp_path):
    fitted = Pipeline(stages=[LogisticRegression().setIterationOptions(progress=False)]).fit(data)
    fitted.save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    assert isinstance(loaded.stages[0], mllib_classification.LogisticRegressionModel)
    assert _same_predictions(fitted, loaded, data)
