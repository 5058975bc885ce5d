"""GaussianMixture (EM on IterativeEstimator) against MLlib's from the same start, against
EM in numpy/scipy, saved and loaded both ways across the libraries, in a Pipeline, and its
errors."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import Pipeline
from pyspark.ml import clustering as mllib
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.linalg import Vectors
from scipy.stats import multivariate_normal

from iterflow.ml import GaussianMixture, GaussianMixtureModel, MLError, gaussian_mixture

pytestmark = pytest.mark.spark

CENTERS = np.array([[0.0, 0.0, 0.0], [5.0, 3.0, 1.0], [-4.0, 4.0, 2.0]])


@pytest.fixture(scope="module")
def blobs(spark):
    rng = np.random.default_rng(0)
    sizes, spreads = (600, 400, 300), (1.0, 0.7, 0.5)
    x = np.concatenate(
        [rng.normal(c, s, (n, 3)) for c, s, n in zip(CENTERS, spreads, sizes, strict=True)]
    )
    w = rng.integers(1, 4, len(x)).astype(float)
    rows = [
        (Vectors.dense(r.tolist()), float(v), *map(float, r)) for r, v in zip(x, w, strict=True)
    ]
    df = spark.createDataFrame(rows, ["features", "w", "a", "b", "c"]).repartition(3).cache()
    return x, w, df


def mixture(model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """weights, means, covariances of either library's model."""
    return (
        np.array(model.weights),
        np.array([g.mean.toArray() for g in model.gaussians]),
        np.array([g.cov.toArray() for g in model.gaussians]),
    )


def assert_same_mixture(ours, theirs, tol=1e-6):
    for a, b in zip(mixture(ours), mixture(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_same_seed_fits_mllibs_mixture(blobs, weighted):
    _, _, df = blobs
    options = {"k": 3, "seed": 11, "tol": 1e-4, **({"weightCol": "w"} if weighted else {})}
    theirs = mllib.GaussianMixture(**options).fit(df)
    ours = GaussianMixture(**options).setIterationOptions(progress=False).fit(df)
    assert ours.summary.numIter == theirs.summary.numIter
    assert ours.summary.logLikelihood == pytest.approx(theirs.summary.logLikelihood, rel=1e-9)
    assert_same_mixture(ours, theirs)
    assert ours.summary.clusterSizes == theirs.summary.clusterSizes
    a = ours.transform(df).select("prediction", "probability").collect()
    b = theirs.transform(df).select("prediction", "probability").collect()
    assert [r[0] for r in a] == [r[0] for r in b]
    np.testing.assert_allclose([r[1].toArray() for r in a], [r[1].toArray() for r in b], atol=1e-9)
    point = df.first()["features"]
    assert ours.predict(point) == theirs.predict(point)
    np.testing.assert_allclose(
        ours.predictProbability(point).toArray(), theirs.predictProbability(point).toArray()
    )


def numpy_em(x, v, weights, means, covs, rounds):
    """EM in numpy and scipy, from the given mixture: the mixture after ``rounds`` steps
    and the log-likelihood under the one the last step started from."""
    for _ in range(rounds):
        joint = np.column_stack(
            [
                w * multivariate_normal(m, c).pdf(x)
                for w, m, c in zip(weights, means, covs, strict=False)
            ]
        )
        loglik = float(v @ np.log(joint.sum(axis=1)))
        r = joint / joint.sum(axis=1, keepdims=True) * v[:, None]
        n = r.sum(axis=0)
        means = (r.T @ x) / n[:, None]
        covs = np.array([(r[:, k] * (x - means[k]).T) @ (x - means[k]) / n[k] for k in range(3)])
        weights = n / n.sum()
    return weights, means, covs, loglik


def test_an_mllib_initial_model_continues_as_em_in_numpy(blobs):
    x, w, df = blobs
    start = mllib.GaussianMixture(k=3, seed=2, maxIter=2).fit(df)
    model = (
        GaussianMixture(initialModel=start, maxIter=4, tol=0.0, weightCol="w")
        .setIterationOptions(progress=False)
        .fit(df)
    )
    assert model.getK() == 3 and model.rounds == 4
    expected = numpy_em(x, w, *mixture(start), 4)
    for a, b in zip(mixture(model), expected[:3], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
    assert model.summary.logLikelihood == pytest.approx(expected[3], rel=1e-10)
    assert len(model.summary.objectiveHistory) == 4  # every round's log-likelihood gauge
    with pytest.raises(MLError, match="initialModel has 3 components"):
        GaussianMixture(k=2, initialModel=start).setIterationOptions(progress=False).fit(df)


def test_saved_models_load_across_the_libraries(blobs, tmp_path):
    _, _, df = blobs
    ours = gaussian_mixture(df, k=3, seed=4, progress=False)
    ours.save(str(tmp_path / "ours"))
    theirs = mllib.GaussianMixtureModel.load(str(tmp_path / "ours"))
    assert_same_mixture(ours, theirs, tol=0.0)
    a = [r[0] for r in ours.transform(df).select("prediction").collect()]
    assert a == [r[0] for r in theirs.transform(df).select("prediction").collect()]
    again = GaussianMixtureModel.load(str(tmp_path / "ours"))
    assert again.getK() == 3 and again.getSeed() == 4
    assert_same_mixture(again, ours, tol=0.0)

    fitted = mllib.GaussianMixture(k=2, seed=1, maxIter=5).fit(df)
    fitted.save(str(tmp_path / "theirs"))
    loaded = GaussianMixtureModel.load(str(tmp_path / "theirs"))
    assert loaded.getK() == 2 and not loaded.hasSummary
    assert_same_mixture(loaded, fitted, tol=0.0)
    a = [r[0] for r in loaded.transform(df).select("prediction").collect()]
    assert a == [r[0] for r in fitted.transform(df).select("prediction").collect()]
    assert loaded.gaussiansDF.count() == 2


def test_in_a_pipeline_after_an_assembler_and_a_scaler(blobs):
    _, _, df = blobs
    stages = [
        VectorAssembler(inputCols=["a", "b", "c"], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features"),
    ]
    options = {"k": 3, "seed": 5}
    theirs = Pipeline(stages=[*stages, mllib.GaussianMixture(**options)]).fit(df.drop("features"))
    estimator = GaussianMixture(**options).setIterationOptions(progress=False)
    ours = Pipeline(stages=[*stages, estimator]).fit(df.drop("features"))
    assert_same_mixture(ours.stages[-1], theirs.stages[-1])


def test_bad_input_is_an_ml_error_naming_it(spark, blobs):
    _, _, df = blobs
    quiet = {"progress": False}
    with pytest.raises(MLError, match=r"k=1\) needs k >= 2"):
        GaussianMixture(k=1).setIterationOptions(**quiet).fit(df)
    with pytest.raises(MLError, match="no feature column 'vec'"):
        GaussianMixture(featuresCol="vec").setIterationOptions(**quiet).fit(df)
    bad = spark.createDataFrame(
        [(Vectors.dense([0.0, float("nan")]),), (Vectors.dense([1.0, 2.0]),)], ["features"]
    )
    with pytest.raises(MLError, match="NaN"):
        GaussianMixture(seed=1).setIterationOptions(**quiet).fit(bad)
    with pytest.raises(MLError, match=r"has no Param\(s\) \['kk'\]"):
        GaussianMixture(kk=3)
