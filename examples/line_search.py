"""Logistic regression by gradient descent with a backtracking line search: an iteration
run inside every round of another.

The outer iteration takes gradient steps on a one-row model. In each of its rounds the
body computes the loss and the gradient, then runs an inner ``BoundedIteration`` that
tries the step sizes 64, 32, 16... until the Armijo condition holds
(``loss(w - t g) <= loss(w) - c t |g|^2``), and steps by the first that does. The inner
run's rounds are reported with epoch paths ``(outer, inner)``, its bar sits below the
outer one, and its metrics count toward the outer round (docs/guide.md, "Nested
iterations"). ``reference`` is the same algorithm in numpy.

Run: python examples/line_search.py [rows]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf

ARMIJO = 1e-4  # c: the fraction of the predicted decrease a step must achieve
SHRINK = 0.5  # the step size is halved until it does
FIRST_STEP = 64.0  # the first step size each line search tries
MODEL = "w ARRAY<DOUBLE>, loss DOUBLE, grad_norm DOUBLE"
trials = itf.metrics.counter("line_search_trials")


def _margin(w: np.ndarray) -> Column:
    """``s * (x . w)`` per row, with ``s = 2 * label - 1`` (a label of 0 or 1)."""
    dot = sum((F.col("x")[i] * float(v) for i, v in enumerate(w)), F.lit(0.0))
    return (F.col("label") * 2.0 - 1.0) * dot


def loss_of(points: DataFrame, w: np.ndarray) -> Column:
    """The mean logistic loss at ``w`` (an aggregate column)."""
    return F.avg(F.log1p(F.exp(-_margin(w))))


def loss_and_gradient(points: DataFrame, w: np.ndarray) -> tuple[float, np.ndarray]:
    """The mean logistic loss at ``w`` and its gradient: one Spark job over ``points``."""
    margin = _margin(w)
    weight = -(F.col("label") * 2.0 - 1.0) / (F.exp(margin) + 1.0)
    row = points.agg(
        loss_of(points, w).alias("loss"),
        *(F.avg(weight * F.col("x")[i]).alias(f"g{i}") for i in range(len(w))),
    ).first()
    assert row is not None
    return float(row["loss"]), np.array([row[f"g{i}"] for i in range(len(w))])


class LineSearch(itf.IterationBody):
    """The inner iteration: one step size ``t`` per round, halved until Armijo holds."""

    inputs = ("step", "points")

    def __init__(self, w: np.ndarray, gradient: np.ndarray, loss: float) -> None:
        self.w, self.gradient, self.loss = w, gradient, loss

    def iterate(self, step: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> Any:
        trials.inc()
        t = float(step.first()["t"])  # a one-row input, already on the driver
        bound = self.loss - ARMIJO * t * float(self.gradient @ self.gradient)
        tried = points.agg(loss_of(points, self.w - t * self.gradient).alias("loss"))
        checked = tried.select(F.lit(t).alias("t"), "loss", (F.col("loss") <= bound).alias("ok"))
        smaller = checked.where(~F.col("ok")).select((F.col("t") * SHRINK).alias("t"))
        # Accepted: no feedback is left, and the iteration ends ("feedback_empty").
        return itf.Declaration(
            feedback={"step": smaller}, outputs={"accepted": checked.where("ok").select("t")}
        )


class GradientDescent(itf.IterationBody):
    """The outer iteration: one gradient step per round, its size from a line search."""

    inputs = ("model", "points")

    def __init__(self, max_trials: int = 40) -> None:
        self.max_trials = max_trials

    def iterate(self, model: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> Any:
        w = itf.vector(model, "w")
        loss, gradient = loss_and_gradient(points, w)
        search = (
            itf.BoundedIteration(LineSearch(w, gradient, loss))
            .bind("step", points.sparkSession.createDataFrame([(FIRST_STEP,)], "t DOUBLE"))
            .bind("points", points)
            .until(itf.max_rounds(self.max_trials))
            .run()
        )
        accepted = search.outputs["accepted"].first()
        search.release()
        t = 0.0 if accepted is None else float(accepted["t"])  # no step decreased the loss
        norm = float(np.linalg.norm(gradient))
        stepped = (w - t * gradient).tolist()
        new = points.sparkSession.createDataFrame([(stepped, loss, norm)], MODEL)
        return itf.Declaration(
            feedback={"model": new},
            outputs={"model": new},
            until=itf.converged(new.select("grad_norm"), tol=1e-6),
        )


def fit(
    points: DataFrame, dims: int, rounds: int, listen: Callable[..., Any] | None = None, **run: Any
) -> itf.IterationResult:
    """``rounds`` gradient steps (fewer once the gradient vanishes) from w = 0."""
    start = points.sparkSession.createDataFrame([([0.0] * dims, None, None)], MODEL)
    iteration = (
        itf.BoundedIteration(GradientDescent())
        .bind("model", start)
        .bind("points", points)
        .until(itf.max_rounds(rounds))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    return iteration.run(**run)


def data(rows: int, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Features (with a constant 1 for the intercept) and noisy 0/1 labels."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(rows), rng.normal(size=(rows, 2))])
    chance = 1.0 / (1.0 + np.exp(-(x @ np.array([0.3, 2.0, -1.0]))))
    return x, (rng.random(rows) < chance).astype(float)


def reference(x: np.ndarray, label: np.ndarray, rounds: int, max_trials: int = 40) -> np.ndarray:
    """The same algorithm in numpy: the model after ``rounds`` steps."""
    sign = 2.0 * label - 1.0

    def loss(w: np.ndarray) -> float:
        return float(np.mean(np.log1p(np.exp(-sign * (x @ w)))))

    w = np.zeros(x.shape[1])
    for _ in range(rounds):
        gradient = x.T @ (-sign / (np.exp(sign * (x @ w)) + 1.0)) / len(x)
        f0, t = loss(w), FIRST_STEP
        for _trial in range(max_trials):
            if loss(w - t * gradient) <= f0 - ARMIJO * t * float(gradient @ gradient):
                break
            t *= SHRINK
        else:
            t = 0.0
        w = w - t * gradient
        if np.linalg.norm(gradient) <= 1e-6:
            break
    return w


if __name__ == "__main__" or __name__ == "example":
    rows = int(sys.argv[1]) if __name__ == "__main__" and len(sys.argv) > 1 else 400
    spark = itf.session()
    x, label = data(rows)
    points = spark.createDataFrame(
        [(list(map(float, xi)), float(yi)) for xi, yi in zip(x, label, strict=True)],
        "x ARRAY<DOUBLE>, label DOUBLE",
    ).cache()
    result = fit(points, dims=3, rounds=8)
    w = itf.vector(result.outputs["model"], "w")
    print(f"{result.rounds} steps ({result.termination.reason}), w = {np.round(w, 4)}")
    print(f"numpy reference:          w = {np.round(reference(x, label, 8), 4)}")
    print("line search trials:", result.metrics["line_search_trials"].committed)
