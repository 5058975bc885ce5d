"""iterflow.ml regressions against numpy: least squares, Newton's method for logistic loss."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

import iterflow as itf
from iterflow.ml import MLError, linear_regression, logistic_regression


def frame(spark, x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None, partitions=3):
    columns = {f"x{i}": x[:, i] for i in range(x.shape[1])} | {"label": y}
    if w is not None:
        columns["w"] = w
    return spark.createDataFrame(pa.table(columns)).repartition(partitions)


def newton_logistic(x: np.ndarray, y: np.ndarray, v: np.ndarray, reg: float) -> np.ndarray:
    """The minimizer of sum v log(1+exp(-(2y-1) z)) / sum v + reg/2 |w|^2 (z = x.w + b,
    no penalty on b) by Newton's method in numpy: (w, b)."""
    design = np.column_stack([x, np.ones(len(x))])
    beta = np.zeros(design.shape[1])
    penalty = np.diag(np.append(np.full(x.shape[1], reg), 0.0))
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-design @ beta))
        gradient = design.T @ (v * (p - y)) / v.sum() + penalty @ beta
        hessian = (design * (v * p * (1 - p))[:, None]).T @ design / v.sum() + penalty
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-14:
            break
    return beta


@pytest.fixture(scope="module")
def linear_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = x @ np.array([1.5, -2.0, 0.5]) + 3.0 + rng.normal(0, 0.3, 400)
    return x, y


def test_linear_regression_converges_to_least_squares(spark, linear_data):
    x, y = linear_data
    model = linear_regression(
        frame(spark, x, y),
        features=["x0", "x1", "x2"],
        solver="gd",
        learning_rate=0.9,
        max_rounds=100,
        tol=1e-9,
        progress=False,
    )
    expected, *_ = np.linalg.lstsq(np.column_stack([x, np.ones(len(x))]), y, rcond=None)
    np.testing.assert_allclose(model.coefficients, expected[:-1], atol=1e-4)
    assert model.intercept == pytest.approx(expected[-1], abs=1e-4)
    assert model.termination.reason == "converged" and model.rounds < 100
    losses = [p.metrics["loss"] for p in model.history]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(losses))  # full batch, small rate
    predicted = model.predict(frame(spark, x[:5], y[:5], partitions=1)).collect()
    np.testing.assert_allclose(
        sorted(r["prediction"] for r in predicted),
        sorted(x[:5] @ model.coefficients + model.intercept),
        rtol=1e-12,
    )


def test_row_weights_equal_repeated_rows(spark, linear_data):
    x, y = linear_data
    w = np.where(np.arange(len(y)) % 3 == 0, 2.0, 1.0)
    model = linear_regression(
        frame(spark, x, y, w),
        features=["x0", "x1", "x2"],
        weight="w",
        solver="gd",
        learning_rate=0.9,
        max_rounds=100,
        tol=1e-9,
        progress=False,
    )
    repeat = np.repeat(np.arange(len(y)), w.astype(int))
    expected, *_ = np.linalg.lstsq(
        np.column_stack([x[repeat], np.ones(len(repeat))]), y[repeat], rcond=None
    )
    np.testing.assert_allclose(np.append(model.coefficients, model.intercept), expected, atol=1e-4)


@pytest.mark.parametrize("class_weight", [None, {0.0: 1.0, 1.0: 3.0}])
def test_logistic_regression_converges_to_the_newton_optimum(spark, class_weight):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 2))
    p = 1.0 / (1.0 + np.exp(-(x @ np.array([2.0, -1.0]) + 0.5)))
    y = (rng.random(500) < p).astype(float)  # noisy labels: not separable
    reg = 0.01
    model = logistic_regression(
        frame(spark, x, y),
        features=["x0", "x1"],
        class_weight=class_weight,
        solver="gd",
        learning_rate=5.0,
        reg=reg,
        max_rounds=200,
        tol=1e-9,
        progress=False,
    )
    v = np.ones(len(y)) if class_weight is None else np.where(y == 1.0, 3.0, 1.0)
    expected = newton_logistic(x, y, v, reg)
    np.testing.assert_allclose(np.append(model.coefficients, model.intercept), expected, atol=1e-4)
    losses = [p.metrics["loss"] for p in model.history]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(losses))


def test_mini_batches_are_deterministic_for_a_seed(spark, linear_data):
    x, y = linear_data
    df = frame(spark, x, y)
    fit = {
        "features": ["x0", "x1", "x2"],
        "solver": "gd",
        "learning_rate": 0.5,
        "batch_fraction": 0.3,
        "max_rounds": 40,
        "tol": None,
        "progress": False,
    }
    first = linear_regression(df, seed=5, **fit)
    again = linear_regression(df, seed=5, **fit)
    other = linear_regression(df, seed=6, **fit)
    np.testing.assert_array_equal(first.coefficients, again.coefficients)
    assert not np.array_equal(first.coefficients, other.coefficients)
    expected, *_ = np.linalg.lstsq(np.column_stack([x, np.ones(len(x))]), y, rcond=None)
    np.testing.assert_allclose(first.coefficients, expected[:-1], atol=0.1)  # noisy steps
    assert first.rounds == 40 and first.termination.reason == "max_rounds"


def test_loss_tol_stops_like_flink_and_divergence_names_the_round(spark, linear_data):
    x, y = linear_data
    df = frame(spark, x, y)
    model = linear_regression(
        df,
        features=["x0", "x1", "x2"],
        solver="gd",
        learning_rate=0.5,
        tol=None,
        loss_tol=0.5,
        max_rounds=200,
        progress=False,
    )
    assert model.termination.reason == "converged"
    assert model.history[-1].metrics["loss"] <= 0.5 < model.history[-2].metrics["loss"]
    with pytest.raises(itf.DivergenceError, match="epoch"):
        linear_regression(
            df,
            features=["x0", "x1", "x2"],
            solver="gd",
            learning_rate=1e6,
            max_rounds=200,
            progress=False,
        )
    with pytest.raises(MLError, match=r"no column\(s\) \['nope'\]"):
        linear_regression(df, features=["nope"])
    with pytest.raises(MLError, match="learning_rate"):
        linear_regression(df, features=["x0"], learning_rate=0.0)
