"""A regression to fit, whichever solver fits it: what was asked (``FitOptions``,
checked), the rows as columnar data (``design``), and their loss and gradient
(``loss_sums``), the kernel that gradient descent (``iterflow.ml.regression``) and
L-BFGS (``iterflow.ml.lbfgs_regression``) both run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import pyarrow as pa

from iterflow.ml.features import PARTITION, Features, block_rows, matrix, numbers, weights
from iterflow.ml.training import MLError

#: ``solver=``: gradient descent, or L-BFGS (OWL-QN with an L1 part) as Spark MLlib runs it.
SOLVERS = ("gd", "lbfgs")
# ``PARTITION`` (features.py) brings every row's partition to ``prepare``: a partition's
# mini-batch is drawn from a stream seeded by (seed, epoch, partition), the same on every path.


def design(
    features: Features,
    label: str,
    weight: str | None,
    class_weight: Mapping[Any, float] | None,
) -> Callable[[pa.Table], pa.Table]:
    """A ``columnar`` prepare step: ``x`` (each row's features), ``y`` and ``v`` (weights),
    and ``part`` (the row's partition). A value that is not a finite number, or a negative
    weight, is an ``MLError`` naming its column."""

    def prepare(table: pa.Table) -> pa.Table:
        x = matrix(table, features)
        y = numbers(table, label, "label")
        v = np.ones(len(y)) if weight is None else weights(table, weight)
        if class_weight is not None:
            v = v * np.array([class_weight.get(c, 1.0) for c in y.tolist()], dtype=np.float64)
        rows = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), features.dims)
        return pa.table({"x": rows, "y": y, "v": v, "part": table[PARTITION]})

    return prepare


def binary_labels(
    prepare: Callable[[pa.Table], pa.Table], label: str
) -> Callable[[pa.Table], pa.Table]:
    """``prepare``, checking that every label is 0 or 1 (a binary classifier's)."""

    def checked(table: pa.Table) -> pa.Table:
        prepared = prepare(table)
        y = prepared["y"].to_numpy()
        if not ((y == 0.0) | (y == 1.0)).all():
            odd = sorted(set(y[(y != 0.0) & (y != 1.0)].tolist()))[:3]
            raise MLError(f"label column '{label}' must hold 0 and 1 only; found {odd}")
        return prepared

    return checked


def loss_sums(
    kind: str, x: np.ndarray, y: np.ndarray, v: np.ndarray, coefficients: np.ndarray
) -> tuple[Any, Any]:
    """The rows' summed loss at ``coefficients`` (intercept last) and its gradient: the
    kernel of both solvers. Linear: ``sum v (z - y)^2 / 2``; logistic: ``sum v log(1 +
    exp(-(2y-1) z))``; hinge (linear SVM): ``sum v max(0, 1 - (2y-1) z)``, with
    ``z = x.w + b``. ``coefficients`` of shape ``(d + 1, k)`` are ``k`` points evaluated in
    one pass over the rows (problems fitted together): the gradients are then ``(d + 1, k)``
    and the losses ``(k,)``."""
    points = coefficients.reshape(len(coefficients), -1)
    gradient, loss = np.zeros(points.shape), np.zeros(points.shape[1])
    w, b = points[:-1], points[-1]
    # Block by block: a block of x stays in the cache from z = x.w to the gradient's x.T @
    # slope, and the per-row values are a block long (no partition-sized temporaries).
    step = block_rows(x.shape[1] + 4 * points.shape[1])
    for start in range(0, len(x), step):
        xs, ys, vs = x[start : start + step], y[start : start + step], v[start : start + step]
        ys, vs = ys[:, None], vs[:, None]
        z = xs @ w
        z += b
        if kind == "linear":
            residual = z - ys
            loss += 0.5 * np.sum(vs * residual**2, axis=0)
            slope = vs * residual
        elif kind == "hinge":
            signed = 2.0 * ys - 1.0
            gap = 1.0 - signed * z
            inside = gap > 0.0  # a subgradient: 0 at the hinge, as MLlib's
            loss += np.sum(vs * gap, axis=0, where=inside)
            slope = np.where(inside, -signed * vs, 0.0)
        else:
            # log(1 + exp(t)) as numpy's logaddexp(0, t) computes it, in fewer passes.
            t = (1.0 - 2.0 * ys) * z
            terms = np.log1p(np.exp(-np.abs(t)))
            terms += np.maximum(t, 0.0)
            loss += np.sum(vs * terms, axis=0)
            slope = vs * (1.0 / (1.0 + np.exp(-z)) - ys)
        gradient[:-1] += xs.T @ slope
        gradient[-1] += slope.sum(axis=0)
    if coefficients.ndim == 1:
        return gradient[:, 0], float(loss[0])
    return gradient, loss


def no_rows(kind: str, fraction: float = 1.0) -> str:
    """What an ``MLError`` says when a fit sums no weight: no rows, or every weight 0."""
    batch = " (or this round's mini-batch drew none: raise batch_fraction)" if fraction < 1 else ""
    who = "linear_svc()" if kind == "hinge" else f"{kind}_regression()"
    return f"{who} has no rows to fit: the DataFrame is empty or every row's weight is 0{batch}"


def _positive(instance: object, field: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise MLError(f"{field.name}={value} must be positive")


def _not_negative(instance: object, field: attrs.Attribute[float], value: float) -> None:
    if value < 0:
        raise MLError(f"{field.name}={value} must not be negative")


def _fraction(instance: object, field: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise MLError(f"{field.name}={value} must be in (0, 1]")


def _unit(instance: object, field: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise MLError(f"{field.name}={value} must be in [0, 1]")


def _solver(instance: object, field: attrs.Attribute[str], value: str) -> None:
    if value not in SOLVERS:
        raise MLError(f"solver={value!r} is not one of {list(SOLVERS)}")


def _memory(instance: object, field: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise MLError(f"memory={value} must be at least 1 (pairs kept by L-BFGS)")


@attrs.frozen(kw_only=True)
class FitOptions:
    """What ``linear_regression`` and ``logistic_regression`` were asked for, as one value;
    a step size, penalty or batch fraction out of range fails here, named."""

    kind: str  # "linear", "logistic" or "hinge" (linear SVM)
    features: Sequence[str] | str
    label: str
    weight: str | None
    class_weight: Mapping[Any, float] | None = None
    learning_rate: float = attrs.field(validator=_positive)
    reg: float = attrs.field(validator=_not_negative)
    max_rounds: int
    tol: float | None
    loss_tol: float | None
    batch_fraction: float = attrs.field(validator=_fraction)
    seed: int
    listen: Any
    run_options: Mapping[str, Any]
    solver: str = attrs.field(default="lbfgs", validator=_solver)
    elastic_net: float = attrs.field(default=0.0, validator=_unit)
    #: L-BFGS's (MLlib's; None: True for L-BFGS): gradient descent works on the features
    #: as they are, and refuses True.
    standardization: bool | None = None
    fit_intercept: bool = True
    memory: int = attrs.field(default=10, validator=_memory)
    #: The coefficients to start from (intercept last), or None: the solver's own start.
    initial: np.ndarray | None = None

    def __attrs_post_init__(self) -> None:
        if self.standardization is None:
            object.__setattr__(self, "standardization", self.solver != "gd")
        if self.solver == "gd":
            if self.standardization:
                raise MLError("standardization=True needs solver='lbfgs'")
            if self.elastic_net > 0:
                raise MLError(
                    f"elastic_net={self.elastic_net} needs solver='lbfgs' (OWL-QN); "
                    "gradient descent takes an L2 penalty only"
                )
        elif self.batch_fraction < 1.0:
            raise MLError(
                f"batch_fraction={self.batch_fraction} is for solver='gd'; L-BFGS evaluates "
                "every row in every round"
            )
        elif self.loss_tol is not None:
            raise MLError("loss_tol is for solver='gd'; L-BFGS stops by tol, as Spark MLlib")


def initial_coefficients(initial: Any, dims: int, who: str) -> np.ndarray | None:
    """The coefficients (intercept last) to start from: ``initial`` a fitted model
    (iterflow's or MLlib's: ``coefficients`` and ``intercept``), or ``dims`` coefficients,
    or ``dims + 1`` with the intercept last; None stays None."""
    if initial is None:
        return None
    if hasattr(initial, "coefficients") and hasattr(initial, "intercept"):
        values = np.asarray(initial.coefficients.toArray(), dtype=np.float64)
        start = np.append(values, float(initial.intercept))
    else:
        start = np.asarray(initial, dtype=np.float64).ravel()
        if len(start) == dims:
            start = np.append(start, 0.0)
    if start.shape != (dims + 1,) or not np.isfinite(start).all():
        raise MLError(
            f"{who}: the initial model has {len(start) - 1} finite coefficients or is not "
            f"finite, but the features have {dims}"
        )
    return start
