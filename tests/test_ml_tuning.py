"""HalvingCrossValidator against CrossValidator on the same folds: the same winner with
fewer rounds, its rungs, its avgMetrics, Pipelines, saving, and its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pyspark.ml import Pipeline
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.linalg import Vectors
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

from iterflow.ml import HalvingCrossValidator, KMeans, LogisticRegression, MLError

pytestmark = pytest.mark.spark

REGS = [0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]


@pytest.fixture(scope="module")
def noisy(spark):
    """300 rows, 3 informative features among 20: a moderate L2 penalty validates best."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 20))
    margin = x[:, :3] @ np.array([1.5, -1.0, 0.8]) + rng.normal(0, 1.0, 300)
    y = (margin > 0).astype(float)
    rows = [
        (Vectors.dense(r.tolist()), float(v), *map(float, r[:3])) for r, v in zip(x, y, strict=True)
    ]
    return spark.createDataFrame(rows, ["features", "label", "a", "b", "c"]).repartition(2).cache()


def log_loss():
    return MulticlassClassificationEvaluator(metricName="logLoss")  # smaller is better


def test_the_same_winner_as_cross_validator_with_rungs(noisy):
    lr = LogisticRegression(maxIter=100).setIterationOptions(progress=False)
    grid = ParamGridBuilder().addGrid(lr.regParam, REGS).build()
    options = {"estimator": lr, "estimatorParamMaps": grid, "evaluator": log_loss()}
    full = CrossValidator(**options, numFolds=3, seed=7).fit(noisy)
    halving = HalvingCrossValidator(**options, numFolds=3, seed=7).fit(noisy)
    best = int(np.argmin(full.avgMetrics))
    assert halving.bestModel.getRegParam() == REGS[best]
    # 9 candidates, factor 3: 9 at 100/9 ~ 11 rounds, 3 at 33, then one left.
    assert [r.rounds for r in halving.rungs] == [11, 33]
    assert [len(r.metrics) for r in halving.rungs] == [9, 3]
    finalists = sorted(halving.rungs[-1].metrics)
    assert best in finalists
    for j, value in enumerate(halving.avgMetrics):
        assert math.isnan(value) == (j not in finalists)
    # The winner is fitted on all rows with maxRounds, as CrossValidator fits its best.
    np.testing.assert_allclose(
        halving.bestModel.coefficients.toArray(),
        full.bestModel.coefficients.toArray(),
        atol=1e-6,
    )


def test_in_a_pipeline_and_saved(noisy, tmp_path):
    lr = LogisticRegression(maxIter=20).setIterationOptions(progress=False)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b", "c"], outputCol="f3"), lr])
    lr.setFeaturesCol("f3")
    grid = ParamGridBuilder().addGrid(lr.regParam, [0.0, 5.0, 50.0]).build()
    halving = HalvingCrossValidator(
        estimator=pipeline, estimatorParamMaps=grid, evaluator=log_loss(), factor=2, seed=1
    )
    model = halving.fit(noisy)
    assert model.bestModel.stages[-1].getRegParam() == 0.0
    assert model.rungs[0].rounds == 5  # 20 / 2**2
    halving.save(str(tmp_path / "halving"))
    loaded = HalvingCrossValidator.load(str(tmp_path / "halving"))
    assert isinstance(loaded, HalvingCrossValidator)
    assert (loaded.getFactor(), loaded.getSeed(), loaded.getNumFolds()) == (2, 1, 3)


def test_bad_settings_are_ml_errors(noisy):
    lr = LogisticRegression().setIterationOptions(progress=False)
    with_rounds = ParamGridBuilder().addGrid(lr.maxIter, [5, 10]).build()
    with pytest.raises(MLError, match="take maxIter out of the grid"):
        HalvingCrossValidator(
            estimator=lr, estimatorParamMaps=with_rounds, evaluator=log_loss()
        ).fit(noisy)
    grid = ParamGridBuilder().addGrid(lr.regParam, [0.0, 1.0]).build()
    with pytest.raises(MLError, match="factor >= 2"):
        HalvingCrossValidator(
            estimator=lr, estimatorParamMaps=grid, evaluator=log_loss(), factor=1
        ).fit(noisy)
    assembler = VectorAssembler(inputCols=["a"], outputCol="x")
    with pytest.raises(MLError, match="needs an Estimator with maxIter"):
        HalvingCrossValidator(
            estimator=Pipeline(stages=[assembler]), estimatorParamMaps=[{}], evaluator=log_loss()
        ).fit(noisy)
    with pytest.raises(MLError, match=r"has no Param\(s\) \['factors'\]"):
        HalvingCrossValidator(factors=2)
    assert KMeans().hasParam("maxIter")  # k-means tunes the same way
