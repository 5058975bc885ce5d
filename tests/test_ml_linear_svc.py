"""LinearSVC (OWL-QN on the hinge loss) against MLlib's on the same data, saved and loaded
both ways across the libraries, warm-started, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml import classification as mllib
from pyspark.ml.linalg import Vectors

from iterflow.ml import LinearSVC, LinearSVCModel, MLError, linear_svc

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def rows(spark):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1500, 4)) * np.array([1.0, 8.0, 0.2, 2.0]) + np.array([1, 0, 2, -1])
    margin = x @ np.array([1.0, -0.15, 4.0, 0.6]) - 8.6 + rng.normal(0, 1.5, 1500)
    y = (margin > 0).astype(float)
    w = rng.integers(1, 4, 1500).astype(float)
    data = [
        (Vectors.dense(r.tolist()), float(a), float(b)) for r, a, b in zip(x, y, w, strict=True)
    ]
    return spark.createDataFrame(data, ["features", "label", "w"]).repartition(3).cache()


def fitted(model) -> np.ndarray:
    return np.append(model.coefficients.toArray(), model.intercept)


@pytest.mark.parametrize(
    "options",
    [
        # No penalty: 108 iterations on these rows (slow: the others stay in CI).
        pytest.param({}, marks=pytest.mark.slow_spark),
        {"regParam": 0.01},
        pytest.param({"regParam": 0.05, "standardization": False}, marks=pytest.mark.slow_spark),
        {"regParam": 0.01, "fitIntercept": False},
        {"regParam": 0.02, "weightCol": "w", "maxIter": 7},
    ],
    ids=["default", "reg", "unstandardized", "no-intercept", "weighted-7-iterations"],
)
def test_linear_svc_matches_mllib(rows, options):
    theirs = mllib.LinearSVC(**options).fit(rows)
    ours = LinearSVC(**options).setIterationOptions(progress=False).fit(rows)
    np.testing.assert_allclose(fitted(ours), fitted(theirs), atol=1e-4, rtol=0)
    assert ours.summary.totalIterations == theirs.summary().totalIterations
    np.testing.assert_allclose(
        ours.summary.objectiveHistory, theirs.summary().objectiveHistory, rtol=1e-8, atol=1e-12
    )
    a = ours.transform(rows).select("prediction").collect()
    b = theirs.transform(rows).select("prediction").collect()
    assert sum(x != y for x, y in zip(a, b, strict=True)) <= 2  # points on the boundary
    point = rows.first()["features"]
    np.testing.assert_allclose(
        ours.predictRaw(point).toArray(), theirs.predictRaw(point).toArray(), atol=1e-4
    )


def test_short_form_saved_models_and_warm_starts(rows, tmp_path):
    short = linear_svc(rows, reg=0.01, progress=False)
    estimator = LinearSVC(regParam=0.01).setIterationOptions(progress=False)
    model = estimator.fit(rows)
    assert type(short) is LinearSVCModel
    np.testing.assert_array_equal(fitted(short), fitted(model))

    model.save(str(tmp_path / "ours"))
    theirs = mllib.LinearSVCModel.load(str(tmp_path / "ours"))
    np.testing.assert_array_equal(fitted(theirs), fitted(model))
    assert theirs.getRegParam() == 0.01 and theirs.getThreshold() == 0.0

    reference = mllib.LinearSVC(regParam=0.01, threshold=0.5).fit(rows)
    reference.save(str(tmp_path / "theirs"))
    loaded = LinearSVCModel.load(str(tmp_path / "theirs"))
    assert loaded.getThreshold() == 0.5
    np.testing.assert_array_equal(fitted(loaded), fitted(reference))
    a = [r[0] for r in loaded.transform(rows).select("prediction").collect()]
    assert a == [r[0] for r in reference.transform(rows).select("prediction").collect()]

    # From MLlib's optimum: the first objective is MLlib's last, and the hinge's flat
    # optimum keeps the coefficients where they were.
    warm = estimator.copy().setInitialModel(reference).fit(rows)
    final = reference.summary().objectiveHistory[-1]
    assert warm.summary.objectiveHistory[0] == pytest.approx(final, rel=1e-12)
    assert warm.summary.objectiveHistory[-1] <= final
    np.testing.assert_allclose(fitted(warm), fitted(reference), atol=1e-4)


def test_bad_labels_and_params_are_ml_errors(spark, rows):
    three = spark.createDataFrame(
        [(Vectors.dense([0.0]), 0.0), (Vectors.dense([1.0]), 2.0)], ["features", "label"]
    )
    with pytest.raises(
        MLError, match=r"label column 'label' must hold 0 and 1 only; found \[2\.0\]"
    ):
        LinearSVC().setIterationOptions(progress=False).fit(three)
    with pytest.raises(MLError, match=r"has no Param\(s\) \['elasticNetParam'\]"):
        LinearSVC(elasticNetParam=0.5)
    with pytest.raises(MLError, match="no column"):
        linear_svc(rows, label="nope", progress=False)
