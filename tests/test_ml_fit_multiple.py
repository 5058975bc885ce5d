"""``fitMultiple`` of the regressions: the ParamMaps of a grid fitted together in one run
give the models of fitting them one by one; maps that read other columns or run another
solver run apart; CrossValidator (with parallelism) and a failing fit use the shared
iterator. The kernel evaluating several points at once against one point at a time, and
Vector columns carried to Python as arrays."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from pyspark.ml import classification
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.linalg import Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from iterflow.ml import LinearRegression, LinearSVC, LogisticRegression, MLError
from iterflow.ml.features import features_of, vectors_as_arrays
from iterflow.ml.regression_problem import loss_sums


@pytest.mark.parametrize("kind", ["linear", "logistic", "hinge"])
def test_the_kernel_evaluates_several_points_as_each_alone(kind):
    rng = np.random.default_rng(3)
    x, v = rng.normal(size=(5000, 6)), rng.uniform(0.5, 2.0, 5000)
    y = (rng.uniform(size=5000) < 0.4).astype(float)
    points = rng.normal(size=(7, 4))
    gradients, losses = loss_sums(kind, x, y, v, points)
    assert gradients.shape == (7, 4) and losses.shape == (4,)
    for k in range(4):
        gradient, loss = loss_sums(kind, x, y, v, points[:, k])
        np.testing.assert_allclose(gradients[:, k], gradient, rtol=1e-12, atol=1e-9)
        assert losses[k] == pytest.approx(loss, rel=1e-12)


@pytest.fixture(scope="module")
def rows(spark):
    """400 rows of 5 features, a 0/1 label, a numeric target and a second feature column."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(400, 5))
    margin = x @ np.array([1.2, -0.7, 0.0, 0.4, 0.0]) + rng.normal(0, 1.0, 400)
    data = [
        (
            Vectors.dense(r.tolist()),
            Vectors.dense((r[:3] * 2.0).tolist()),
            float(m > 0),
            float(m),
        )
        for r, m in zip(x, margin, strict=True)
    ]
    df = spark.createDataFrame(data, ["features", "other", "label", "target"])
    return df.repartition(2).cache()


def grid_of(estimator, elastic=True):
    builder = ParamGridBuilder().addGrid(estimator.regParam, [0.0, 0.01, 0.2])
    if elastic:
        builder = builder.addGrid(estimator.elasticNetParam, [0.0, 0.6])
    return [*builder.build(), {estimator.regParam: 0.05, estimator.maxIter: 4}]


CASES = {
    "logistic": lambda: (LogisticRegression(), True, "label"),
    "linear": lambda: (LinearRegression(), True, "target"),
    "svm": lambda: (LinearSVC(), False, "label"),
}


@pytest.mark.spark
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_grid_fitted_together_equals_the_fits_one_by_one(rows, case):
    estimator, elastic, label = CASES[case]()
    estimator = estimator.setLabelCol(label).setIterationOptions(progress=False)
    grid = grid_of(estimator, elastic)
    together = dict(estimator.fitMultiple(rows, grid))
    assert sorted(together) == list(range(len(grid)))
    # One run fitted them all: the models share it.
    assert len({id(model.result) for model in together.values()}) == 1
    assert together[len(grid) - 1].summary.totalIterations <= 4
    for index, params in enumerate(grid):
        alone = estimator.fit(rows, params)
        joint = together[index]
        np.testing.assert_allclose(
            joint.coefficients.toArray(), alone.coefficients.toArray(), rtol=1e-9, atol=1e-12
        )
        assert joint.intercept == pytest.approx(alone.intercept, rel=1e-9, abs=1e-12)
        assert joint.summary.totalIterations == alone.summary.totalIterations
        np.testing.assert_allclose(
            joint.summary.objectiveHistory, alone.summary.objectiveHistory, rtol=1e-10
        )
        assert joint.getRegParam() == params[estimator.regParam]


@pytest.mark.spark
def test_maps_reading_other_columns_or_another_solver_run_apart(rows):
    lr = LogisticRegression(maxIter=30).setIterationOptions(progress=False)
    grid = [
        {lr.regParam: 0.01},
        {lr.regParam: 0.1},
        {lr.regParam: 0.01, lr.featuresCol: "other"},
        {lr.regParam: 0.1, lr.featuresCol: "other"},
        {lr.regParam: 0.01, lr.solver: "gd", lr.standardization: False},
    ]
    models = dict(lr.fitMultiple(rows, grid))
    runs = [id(models[i].result) for i in range(len(grid))]
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert len(set(runs)) == 3
    assert models[2].numFeatures == 3 and models[0].numFeatures == 5
    for index, params in enumerate(grid):
        alone = lr.fit(rows, params)
        np.testing.assert_allclose(
            models[index].coefficients.toArray(), alone.coefficients.toArray(), atol=1e-10
        )


@pytest.mark.spark
def test_cross_validator_with_parallelism_takes_each_model_once(rows):
    ours = LogisticRegression(maxIter=50).setIterationOptions(progress=False)
    theirs = classification.LogisticRegression(maxIter=50)
    metrics = []
    for estimator in (ours, theirs):
        grid = ParamGridBuilder().addGrid(estimator.regParam, [0.001, 0.05, 0.5]).build()
        cv = CrossValidator(
            estimator=estimator,
            estimatorParamMaps=grid,
            evaluator=BinaryClassificationEvaluator(),
            numFolds=2,
            seed=3,
            parallelism=3,
        )
        metrics.append(cv.fit(rows).avgMetrics)
    np.testing.assert_allclose(metrics[0], metrics[1], atol=1e-4)


@pytest.mark.spark
def test_a_failed_fit_reaches_every_taker(rows):
    lr = LogisticRegression(labelCol="target").setIterationOptions(progress=False)
    models = lr.fitMultiple(rows, [{lr.regParam: 0.0}, {lr.regParam: 0.1}])
    caught = []

    def take():
        try:
            next(models)
        except MLError as error:
            caught.append(str(error))

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(caught) == 2
    assert all("label column 'target'" in message for message in caught)


@pytest.mark.spark
def test_vectors_reach_python_as_arrays_and_keep_their_checks(spark):
    narrow = spark.createDataFrame(
        [(Vectors.dense([1.0, 2.0]), 1.0), (Vectors.sparse(2, [1], [3.0]), 0.0)],
        ["features", "label"],
    )
    spec = features_of(narrow, "features", "test")
    assert dict(vectors_as_arrays(narrow, spec).dtypes)["features"] == "array<double>"
    wide = spark.createDataFrame([(Vectors.sparse(5000, [3], [1.0]), 1.0)], ["features", "label"])
    wide_spec = features_of(wide, "features", "test")
    assert vectors_as_arrays(wide, wide_spec).schema == wide.schema  # travels by its nonzeros
    odd = spark.createDataFrame(
        [(Vectors.dense([1.0, 2.0]), 1.0), (Vectors.dense([1.0, 2.0, 3.0]), 0.0)],
        ["features", "label"],
    )
    with pytest.raises(MLError, match="every vector must have size 2"):
        LogisticRegression().setIterationOptions(progress=False).fit(odd)
