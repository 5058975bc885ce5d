"""solver="lbfgs" against Spark MLlib fitted on the same data in the same session, against
scipy's optimum of the same objective written in numpy, and across a resume."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.regression import LinearRegression
from scipy.optimize import minimize

import iterflow as itf
from iterflow.ml import MLError, linear_regression, logistic_regression
from iterflow.ml import lbfgs as optimizer

NAMES = ["x0", "x1", "x2", "x3"]
TRUE = np.array([1.0, -0.5, 2.0, 0.0])


@pytest.fixture(scope="module")
def data():
    """400 rows, 4 features of different scales and means (one with no effect), a noisy
    0/1 label, a linear label and row weights."""
    rng = np.random.default_rng(3)
    n = 400
    x = rng.normal(size=(n, 4)) * [1.0, 3.0, 0.5, 2.0] + [0.0, 1.0, -2.0, 0.5]
    p = 1.0 / (1.0 + np.exp(-(x @ TRUE + 0.4)))
    return {
        "x": x,
        "label": (rng.random(n) < p).astype(float),
        "y": x @ TRUE + 0.4 + rng.normal(0, 0.5, n),
        "w": rng.uniform(0.5, 2.0, n),
    }


@pytest.fixture(scope="module")
def frames(spark, data):
    """The rows as feature columns (iterflow) and as VectorAssembler output (MLlib)."""
    columns = {name: data["x"][:, i] for i, name in enumerate(NAMES)}
    table = pa.table({**columns, "label": data["label"], "y": data["y"], "w": data["w"]})
    df = spark.createDataFrame(table).repartition(3).cache()
    assembled = VectorAssembler(inputCols=NAMES, outputCol="features").transform(df).cache()
    yield df, assembled
    assembled.unpersist()
    df.unpersist()


def fitted(model) -> np.ndarray:
    return np.append(model.coefficients, model.intercept)


def mllib(model) -> np.ndarray:
    return np.append(model.coefficients.toArray(), model.intercept)


# (kind, reg, elastic_net, standardization, weight, fit_intercept): L-BFGS, then OWL-QN.
CASES = [
    ("logistic", 0.0, 0.0, False, None, True),
    ("logistic", 0.1, 0.0, True, "w", True),
    ("logistic", 0.05, 0.5, True, None, True),
    ("logistic", 0.05, 0.7, False, "w", False),
    ("linear", 0.1, 0.0, True, "w", True),
    ("linear", 0.05, 0.5, True, None, True),
    ("linear", 0.05, 0.5, False, None, False),
]


@pytest.mark.parametrize(
    ("kind", "reg", "elastic_net", "standardization", "weight", "intercept"), CASES
)
def test_lbfgs_matches_mllib(frames, kind, reg, elastic_net, standardization, weight, intercept):
    df, assembled = frames
    label = "label" if kind == "logistic" else "y"
    fit = logistic_regression if kind == "logistic" else linear_regression
    model = fit(
        df,
        features=NAMES,
        label=label,
        weight=weight,
        reg=reg,
        elastic_net=elastic_net,
        standardization=standardization,
        fit_intercept=intercept,
        solver="lbfgs",
        max_rounds=100,
        tol=1e-6,
        progress=False,
    )
    common = {
        "labelCol": label,
        "maxIter": 100,
        "tol": 1e-6,
        "regParam": reg,
        "elasticNetParam": elastic_net,
        "standardization": standardization,
        "fitIntercept": intercept,
    }
    estimator = (
        LogisticRegression(**common)
        if kind == "logistic"
        else LinearRegression(solver="l-bfgs", **common)
    )
    if weight:
        estimator.setWeightCol(weight)
    reference = estimator.fit(assembled)
    np.testing.assert_allclose(fitted(model), mllib(reference), atol=1e-4, rtol=0)
    assert abs(model.total_iterations - reference.summary.totalIterations) <= 1
    assert model.objective_history[-1] == pytest.approx(
        reference.summary.objectiveHistory[-1], abs=1e-8
    )
    assert model.stop_reason in (optimizer.GRADIENT, optimizer.FUNCTION_VALUES)
    assert model.termination.reason == "converged"
    # One round measures the data, one evaluates the start; then at least one per iteration.
    assert model.rounds >= model.total_iterations + 2
    assert model.history[-1].metrics["loss"] == model.objective_history[-1]


def test_max_rounds_counts_iterations_as_mllib_max_iter(frames):
    df, assembled = frames
    model = logistic_regression(
        df, features=NAMES, reg=0.01, solver="lbfgs", max_rounds=3, tol=1e-6, progress=False
    )
    # Both standardize by default.
    reference = LogisticRegression(maxIter=3, tol=1e-6, regParam=0.01).fit(assembled)
    assert model.total_iterations == reference.summary.totalIterations == 3
    assert model.stop_reason == optimizer.MAX_ITERATIONS
    np.testing.assert_allclose(fitted(model), mllib(reference), atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        model.objective_history, reference.summary.objectiveHistory, atol=1e-9, rtol=0
    )


# -- the same objective in numpy, minimized by scipy ------------------------------------------


def weighted_std(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The weighted sample std (reliability weights), as MLlib's summarizer."""
    mean = v @ x / v.sum()
    return np.sqrt(v @ (x - mean) ** 2 / (v.sum() - (v @ v) / v.sum()))


def reference_objective(kind, x, y, v, reg, alpha, standardization):
    """MLlib's objective on the raw coefficients (intercept last), written directly: the
    penalty is on ``beta_j * sigma_j`` with standardization; a linear model's is MLlib's
    effective one, whose L2 part is divided by the label's std.

    Returns ``(objective, smooth, l1)``: the whole objective; its smooth part (loss and L2)
    as ``beta -> (value, gradient)``; and the L1 weight of each coefficient, so that the
    objective is ``smooth(beta)[0] + l1 @ abs(beta[:-1])``."""
    sigma = weighted_std(x, v)
    scale = sigma if standardization else np.ones(x.shape[1])
    label_std = float(weighted_std(y[:, None], v)[0])
    ridge = reg * (1 - alpha) * scale**2 / (label_std if kind == "linear" else 1.0)
    l1 = reg * alpha * scale
    sign = 2 * y - 1

    def smooth(beta: np.ndarray) -> tuple[float, np.ndarray]:
        z = x @ beta[:-1] + beta[-1]
        if kind == "linear":
            loss = v @ (z - y) ** 2 / (2 * v.sum())
            dz = v * (z - y) / v.sum()
        else:
            loss = v @ np.logaddexp(0.0, -sign * z) / v.sum()
            dz = -sign * v * np.exp(-np.logaddexp(0.0, sign * z)) / v.sum()
        grad = np.append(x.T @ dz + ridge * beta[:-1], dz.sum())
        return float(loss + ridge @ beta[:-1] ** 2 / 2), grad

    def objective(beta: np.ndarray) -> float:
        return smooth(beta)[0] + float(l1 @ np.abs(beta[:-1]))

    return objective, smooth, l1


def scipy_optimum(smooth, l1: np.ndarray) -> np.ndarray:
    """The minimizer by scipy's L-BFGS-B with exact gradients, on beta = plus - minus
    (plus, minus >= 0) with the L1 part written as ``l1 @ (plus + minus)``, which is smooth.

    L-BFGS-B may stop short of the optimum on this formulation (scipy 1.17 did, started
    from zeros), so it is restarted from its own point until the objective stops falling,
    and the point is then checked against the optimality conditions of the L1 problem."""
    d = len(l1)

    def split(u: np.ndarray) -> np.ndarray:
        return np.append(u[:d] - u[d : 2 * d], u[-1])

    def value_and_grad(u: np.ndarray) -> tuple[float, np.ndarray]:
        value, grad = smooth(split(u))
        value += l1 @ (u[:d] + u[d : 2 * d])
        return value, np.concatenate([grad[:-1] + l1, -grad[:-1] + l1, grad[-1:]])

    bounds = [(0, None)] * (2 * d) + [(None, None)]
    options = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000, "maxfun": 100_000}
    u, best = np.zeros(2 * d + 1), np.inf
    for _ in range(20):
        found = minimize(
            value_and_grad, u, jac=True, method="L-BFGS-B", bounds=bounds, options=options
        )
        if found.fun >= best - 1e-15:
            break
        u, best = found.x, found.fun
    beta = split(u)
    assert_l1_optimal(smooth, l1, beta)
    return beta


def assert_l1_optimal(smooth, l1: np.ndarray, beta: np.ndarray, atol: float = 1e-7) -> None:
    """First-order conditions of ``smooth + l1 @ abs``: the gradient is zero on the
    intercept, ``-l1 * sign(beta_j)`` on a non-zero coefficient, within ``[-l1, l1]`` on a
    zero one."""
    grad = smooth(beta)[1]
    assert abs(grad[-1]) < atol
    nonzero = np.abs(beta[:-1]) > 1e-9
    np.testing.assert_allclose(
        grad[:-1][nonzero], -l1[nonzero] * np.sign(beta[:-1][nonzero]), atol=atol, rtol=0
    )
    assert (np.abs(grad[:-1][~nonzero]) <= l1[~nonzero] + atol).all()


@pytest.mark.parametrize(
    ("kind", "reg", "elastic_net", "standardization"),
    [("logistic", 0.05, 0.0, True), ("logistic", 0.02, 0.6, False), ("linear", 0.1, 0.5, True)],
)
def test_lbfgs_reaches_scipys_optimum_of_the_same_objective(
    frames, data, kind, reg, elastic_net, standardization
):
    df, _ = frames
    fit = logistic_regression if kind == "logistic" else linear_regression
    model = fit(
        df,
        features=NAMES,
        label="label" if kind == "logistic" else "y",
        weight="w",
        reg=reg,
        elastic_net=elastic_net,
        standardization=standardization,
        solver="lbfgs",
        max_rounds=500,
        tol=1e-12,
        progress=False,
    )
    label = data["label"] if kind == "logistic" else data["y"]
    objective, smooth, l1 = reference_objective(
        kind, data["x"], label, data["w"], reg, elastic_net, standardization
    )
    expected = scipy_optimum(smooth, l1)
    np.testing.assert_allclose(fitted(model), expected, atol=1e-4, rtol=0)
    assert objective(fitted(model)) <= objective(expected) + 1e-9
    if elastic_net > 0:
        assert (model.coefficients.toArray() == 0).any() == (np.abs(expected[:-1]) < 1e-6).any()


# -- resume, options, the optimizer alone ---------------------------------------------------


def test_a_run_stopped_mid_way_resumes_from_its_checkpoint_to_the_same_answer(frames, tmp_path):
    df, _ = frames
    fit = {
        "features": NAMES,
        "reg": 0.02,
        "elastic_net": 0.3,
        "solver": "lbfgs",
        "max_rounds": 100,
        "tol": 1e-8,
        "progress": False,
    }
    whole = logistic_regression(df, **fit)

    def crash(end: itf.RoundEnd) -> None:
        if end.epoch == 6:
            raise RuntimeError("stopped on purpose")

    with pytest.raises(itf.RoundError, match="epoch 6"):
        logistic_regression(
            df, listen=crash, checkpoint_dir=str(tmp_path), checkpoint_every=1, **fit
        )
    resumed = logistic_regression(df, checkpoint_dir=str(tmp_path), checkpoint_every=1, **fit)
    assert resumed.result.resumed_from == 5
    np.testing.assert_array_equal(fitted(resumed), fitted(whole))
    np.testing.assert_array_equal(resumed.objective_history, whole.objective_history)
    assert resumed.rounds == whole.rounds and resumed.stop_reason == whole.stop_reason


def test_solver_options_are_checked(frames):
    df, _ = frames
    with pytest.raises(MLError, match="solver='newton'"):
        logistic_regression(df, features=NAMES, solver="newton")
    with pytest.raises(MLError, match=r"elastic_net=0\.5 needs solver='lbfgs'"):
        logistic_regression(df, features=NAMES, solver="gd", elastic_net=0.5)
    with pytest.raises(MLError, match=r"elastic_net=1\.5 must be in \[0, 1\]"):
        logistic_regression(df, features=NAMES, solver="lbfgs", elastic_net=1.5)
    with pytest.raises(MLError, match=r"batch_fraction=0\.5 is for solver='gd'"):
        linear_regression(df, features=NAMES, label="y", solver="lbfgs", batch_fraction=0.5)
    with pytest.raises(MLError, match="memory=0"):
        linear_regression(df, features=NAMES, label="y", solver="lbfgs", memory=0)
    with pytest.raises(MLError, match="standardization=True needs solver='lbfgs'"):
        linear_regression(df, features=NAMES, label="y", solver="gd", standardization=True)


def test_gradient_descent_without_intercept_fits_through_the_origin(frames, data):
    df, _ = frames
    model = linear_regression(
        df,
        features=NAMES,
        label="y",
        fit_intercept=False,
        solver="gd",
        learning_rate=0.1,
        max_rounds=400,
        tol=1e-10,
        progress=False,
    )
    expected, *_ = np.linalg.lstsq(data["x"], data["y"], rcond=None)
    assert model.intercept == 0.0
    np.testing.assert_allclose(model.coefficients, expected, atol=1e-4)
    assert len(model.objective_history) == model.total_iterations == model.rounds


def drive(settings: optimizer.Settings, function, x0: np.ndarray) -> optimizer.OptimizerState:
    """The optimizer driven by a numpy function, one evaluation per step."""
    state = optimizer.begin(x0)
    while state.running:
        value, gradient = function(state.trial)
        optimizer.advance(settings, state, value, gradient)
    return state


def rosenbrock(w: np.ndarray) -> tuple[float, np.ndarray]:
    a, b = w
    value = (1 - a) ** 2 + 100 * (b - a * a) ** 2
    return value, np.array([-2 * (1 - a) - 400 * a * (b - a * a), 200 * (b - a * a)])


def test_the_optimizer_alone_minimizes_rosenbrock_and_reports_why_it_stopped():
    settings = optimizer.Settings(memory=5, max_iterations=200, tol=1e-12, l1=np.zeros(2))
    state = drive(settings, rosenbrock, np.array([-1.2, 1.0]))
    np.testing.assert_allclose(state.x, [1.0, 1.0], atol=1e-6)
    assert state.status in (optimizer.GRADIENT, optimizer.FUNCTION_VALUES)
    assert len(state.history) == state.iteration + 1
    assert all(b <= a for a, b in zip(state.history, state.history[1:], strict=False))
    # The state survives its model columns (a checkpoint) unchanged.
    again = optimizer.OptimizerState.from_columns(state.columns())
    np.testing.assert_array_equal(again.x, state.x)
    assert (again.iteration, again.history, again.status) == (
        state.iteration,
        state.history,
        state.status,
    )


def test_a_line_search_that_fails_twice_stops_and_a_nan_objective_is_divergence():
    settings = optimizer.Settings(memory=5, max_iterations=50, tol=1e-9, l1=np.zeros(1))

    def rising(w: np.ndarray) -> tuple[float, np.ndarray]:
        # The gradient says "go right", the value grows whichever way: no step is accepted.
        return float(abs(w[0])) * 10 + (0.0 if w[0] == 0 else 1.0), np.array([-1.0])

    state = drive(settings, rising, np.array([0.0]))
    assert state.status == optimizer.SEARCH_FAILED and state.iteration == 0
    assert state.history == [state.history[0]] * 3  # as MLlib: the point, handed back twice
    broken = drive(settings, lambda w: (math.nan, np.zeros(1)), np.array([0.0]))
    assert broken.status == optimizer.DIVERGED
