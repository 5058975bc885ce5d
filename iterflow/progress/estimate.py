"""Backlog and ETA: how many rounds an iteration still runs, and how long they take.

Pure Python and numpy. The round loop hands in the convergence values and round
durations it recorded; the estimate extrapolates the recent trend of the
convergence value to ``tol`` and is capped by ``max_rounds``. When nothing
supports an estimate the answer is None, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np
import numpy.typing as npt

# Values in the fit: few enough to follow a rate that changes as the iteration
# settles, enough to tell a trend from noise.
_WINDOW = 8
# Two parameters per line plus one degree of freedom to estimate the noise.
_MIN_POINTS = 3
# The fitted slope must lie this many standard errors below zero; with fewer the
# decrease is indistinguishable from noise and any extrapolation would be made up.
_MIN_STANDARD_ERRORS = 3.0
# Recent round durations behind the time per round; their median ignores a
# single slow round (a first round that caches, a straggler).
_DURATION_WINDOW = 5

_Model = Literal["geometric", "linear"]


@attrs.frozen
class Estimate:
    """Rounds still to run after the current one, and the seconds they take; None when unknown."""

    rounds_remaining: int | None
    eta_s: float | None


def estimate_remaining(
    *,
    epoch: int,
    values: Sequence[float | None],
    tol: float | None,
    max_rounds: int | None,
    durations: Sequence[float],
) -> Estimate:
    """What remains after round ``epoch``: from the convergence trend, capped by ``max_rounds``.

    ``values[i]`` is round i's convergence value (None if it had none) and the
    iteration stops once a value is ``<= tol``; ``durations[i]`` is round i's
    wall time in seconds. Both hold one entry per round run so far. Halving
    from 8.0 reaches 0.1 in round 7, four rounds after round 3, at 2 s a round::

        >>> estimate_remaining(epoch=3, values=[8.0, 4.0, 2.0, 1.0], tol=0.1,
        ...                    max_rounds=None, durations=[2.0, 2.5, 2.0, 1.5])
        Estimate(rounds_remaining=4, eta_s=8.0)
    """
    _check(epoch, values, tol, max_rounds, durations)
    # A body may lower its own max_rounds between rounds: then none remain.
    bound = None if max_rounds is None else max(0, max_rounds - (epoch + 1))
    converging = None if tol is None else _rounds_to_tol(epoch, values, tol)
    known = [n for n in (bound, converging) if n is not None]
    if not known:
        return Estimate(rounds_remaining=None, eta_s=None)
    remaining = min(known)
    round_s = float(np.median(durations[-_DURATION_WINDOW:]))
    return Estimate(rounds_remaining=remaining, eta_s=remaining * round_s)


@attrs.frozen
class _Fit:
    """A line fitted to the window: value (geometric: its log) = ``intercept + slope * epoch``."""

    model: _Model
    slope: float
    intercept: float
    slope_se: float
    # Sum of squared relative errors of the fitted values: both models are
    # judged by the same measure, whatever space they are fitted in.
    error: float


def _fit(model: _Model, x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> _Fit:
    if model == "geometric":
        coefficients, cov = np.polyfit(x, np.log(y), 1, cov=True)
        fitted = np.exp(np.polyval(coefficients, x))
    else:
        # Weights 1/y make least squares minimise the relative errors, the
        # measure the two models are compared by.
        coefficients, cov = np.polyfit(x, y, 1, w=1.0 / y, cov=True)
        fitted = np.polyval(coefficients, x)
    return _Fit(
        model=model,
        slope=float(coefficients[0]),
        intercept=float(coefficients[1]),
        slope_se=math.sqrt(float(cov[0, 0])),
        error=float(np.sum(((fitted - y) / y) ** 2)),
    )


def _rounds_to_tol(epoch: int, values: Sequence[float | None], tol: float) -> int | None:
    """Rounds after ``epoch`` until the fitted trend reaches ``tol``, or None without a trend."""
    current = values[epoch]
    if current is not None and current <= tol:
        return 0
    window = [(k, v) for k, v in enumerate(values) if v is not None][-_WINDOW:]
    if len(window) < _MIN_POINTS:
        return None
    x = np.array([k for k, _ in window], dtype=np.float64)
    y = np.array([v for _, v in window], dtype=np.float64)
    # The geometric model needs logs, and the comparison divides by the values;
    # a window that ends no lower than it starts is stalled or diverging.
    if np.any(y <= 0) or y[-1] >= y[0]:
        return None
    fit = min((_fit("geometric", x, y), _fit("linear", x, y)), key=lambda f: f.error)
    if fit.slope >= -_MIN_STANDARD_ERRORS * fit.slope_se:
        return None
    if fit.model == "geometric":
        if tol <= 0:
            return None  # a geometric decrease never reaches zero
        target = math.log(tol)
    else:
        target = tol
    crossing = (target - fit.intercept) / fit.slope
    if not math.isfinite(crossing):
        return None
    # The current value is above tol, so at least one more round runs even when
    # the fitted line crossed tol already.
    return max(1, math.ceil(crossing) - epoch)


def _check(
    epoch: int,
    values: Sequence[float | None],
    tol: float | None,
    max_rounds: int | None,
    durations: Sequence[float],
) -> None:
    if epoch < 0:
        raise ValueError(f"epoch is {epoch}; epochs count from 0")
    for name, entries in (("values", values), ("durations", durations)):
        if len(entries) != epoch + 1:
            raise ValueError(
                f"{name} has {len(entries)} entries after epoch {epoch}; "
                f"pass one per round run, {epoch + 1}"
            )
    if tol is not None and not math.isfinite(tol):
        raise ValueError(f"tol is {tol}; pass a finite number or None")
    if any(v is not None and not math.isfinite(v) for v in values):
        raise ValueError("values holds NaN or infinity; check convergence values before estimating")
    if any(not (math.isfinite(d) and d >= 0) for d in durations):
        raise ValueError("durations holds a negative or non-finite time; pass seconds >= 0")
