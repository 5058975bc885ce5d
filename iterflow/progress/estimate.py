"""Backlog and ETA: how many rounds an iteration still runs, and how long they take.

Pure Python and numpy. The round loop hands in what it recorded per round: the
convergence values, or the counts of something the loop drives to zero (the rows
of its ``itf.empty`` criteria, an observed step, feedback in flight), and the
round durations. The estimate extrapolates the recent trend of the convergence
value to ``tol``, or of the count to below one row, and is capped by
``max_rounds``. When nothing supports an estimate the answer is None, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal

import attrs
import numpy as np
import numpy.typing as npt

from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.reports import RoundProgress

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
# A fitted crossing this close to a whole round is that round: counts of a
# halving set (512, 256, ... 1) cross one row exactly, up to rounding.
_WHOLE_ROUND = 1e-6

#: ``run(progress_from=...)`` for the rows of the round's ``itf.empty`` criteria.
CRITERIA = "criteria"
# The backlog entry of an unbounded run's feedback in flight.
_FEEDBACK_IN_FLIGHT = "feedback_rows"

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
    counts: Sequence[float | None] | None = None,
) -> Estimate:
    """What remains after round ``epoch``: from the convergence trend or the trend of a
    count the loop drives to zero, capped by ``max_rounds``.

    ``values[i]`` is round i's convergence value (None if it had none) and the
    iteration stops once a value is ``<= tol``; ``counts[i]``, when given, is
    round i's count of rows the iteration stops at zero (None where not counted);
    ``durations[i]`` is round i's wall time in seconds. Each holds one entry per
    round run so far. Halving from 8.0 reaches 0.1 in round 7, four rounds after
    round 3, at 2 s a round::

        >>> estimate_remaining(epoch=3, values=[8.0, 4.0, 2.0, 1.0], tol=0.1,
        ...                    max_rounds=None, durations=[2.0, 2.5, 2.0, 1.5])
        Estimate(rounds_remaining=4, eta_s=8.0)

    Halving from 64 rows falls below one row in round 7, the round that counts none::

        >>> estimate_remaining(epoch=3, values=[None] * 4, tol=None, max_rounds=None,
        ...                    durations=[1.0] * 4, counts=[64, 32, 16, 8])
        Estimate(rounds_remaining=4, eta_s=4.0)
    """
    _check(epoch, values, tol, max_rounds, durations, counts)
    # A body may lower its own max_rounds between rounds: then none remain.
    bound = None if max_rounds is None else max(0, max_rounds - (epoch + 1))
    converging = None if tol is None else _rounds_to_tol(epoch, values, tol)
    draining = None if counts is None else _rounds_to_zero(epoch, counts)
    known = [n for n in (bound, converging, draining) if n is not None]
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


def _trend(values: Sequence[float | None]) -> _Fit | None:
    """The better of the two models over the recent values, or None without a decrease."""
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
    return fit


def _crossing(fit: _Fit, value: float) -> float | None:
    """The (fractional) epoch at which the fitted trend equals ``value``, or None."""
    if fit.model == "geometric":
        if value <= 0:
            return None  # a geometric decrease never reaches zero
        target = math.log(value)
    else:
        target = value
    crossing = (target - fit.intercept) / fit.slope
    return crossing if math.isfinite(crossing) else None


def _rounds_to_tol(epoch: int, values: Sequence[float | None], tol: float) -> int | None:
    """Rounds after ``epoch`` until the fitted trend reaches ``tol``, or None without a trend."""
    current = values[epoch]
    if current is not None and current <= tol:
        return 0
    fit = _trend(values)
    crossing = None if fit is None else _crossing(fit, tol)
    if crossing is None:
        return None
    # The current value is above tol, so at least one more round runs even when
    # the fitted line crossed tol already.
    return max(1, math.ceil(crossing) - epoch)


def _rounds_to_zero(epoch: int, counts: Sequence[float | None]) -> int | None:
    """Rounds after ``epoch`` until the fitted count falls below one row (the round that
    counts none ends the iteration), or None without a trend."""
    if counts[epoch] == 0:
        return 0
    fit = _trend(counts)
    crossing = None if fit is None else _crossing(fit, 1.0)
    if crossing is None:
        return None
    # The first whole round past the one where the trend is one row.
    below = math.floor(crossing + _WHOLE_ROUND) + 1
    return max(1, below - epoch)


def count_series(rounds: Sequence[RoundProgress], name: str | None) -> list[float | None] | None:
    """Per round of ``rounds``, the count named ``name``, or None when the last round has
    no count to follow.

    ``name`` is ``"criteria"`` (``criteria_rows``), a ``ctx.observe`` name, or a
    feedback or output name (looked up in that order). With None the series is
    the first of these that the last round counted: the criteria's rows, each
    observed step in the order the body observed them, an unbounded run's
    feedback in flight (``backlog["feedback_rows"]``).
    """
    if name is not None:
        return [_named_count(p, name) for p in rounds]
    last = rounds[-1]
    candidates: list[Callable[[RoundProgress], float | None]] = [
        lambda p: p.criteria_rows,
        *(partial(_observed_count, step) for step in last.observed),
        lambda p: p.backlog.get(_FEEDBACK_IN_FLIGHT),
    ]
    count = next((c for c in candidates if c(last) is not None), None)
    return None if count is None else [count(p) for p in rounds]


def _observed_count(step: str, progress: RoundProgress) -> int | None:
    return progress.observed.get(step)


def _named_count(progress: RoundProgress, name: str) -> float | None:
    if name == CRITERIA:
        return progress.criteria_rows
    if name in progress.observed:
        return progress.observed[name]
    return progress.rows.get(name)


def check_progress_from(name: object) -> None:
    """Raise unless ``run(progress_from=...)`` is None or a name (a str)."""
    if name is not None and not isinstance(name, str):
        raise IterflowTypeError(
            f"run(progress_from=...) takes the name of a count (a str such as 'criteria' "
            f"or a ctx.observe name) or None, got {type(name).__name__} {name!r}"
        )


def check_series_name(progress: RoundProgress, name: str) -> None:
    """Raise when round ``progress`` shows no count named ``name`` (checked on a run's
    first round: the names are the body's)."""
    if name == CRITERIA:
        if progress.criteria_empty is None:
            raise IterflowValueError(
                f"run(progress_from='{CRITERIA}'): epoch {progress.epoch} declares no "
                "itf.empty(...) criteria; end the body on one, or name a ctx.observe step"
            )
        return
    if name not in progress.observed and name not in progress.rows:
        raise IterflowValueError(
            f"run(progress_from='{name}'): epoch {progress.epoch} has no count named "
            f"'{name}'; name a ctx.observe step {sorted(progress.observed)}, a feedback or "
            f"output {sorted(progress.rows)}, or '{CRITERIA}'"
        )


def _check(
    epoch: int,
    values: Sequence[float | None],
    tol: float | None,
    max_rounds: int | None,
    durations: Sequence[float],
    counts: Sequence[float | None] | None,
) -> None:
    if epoch < 0:
        raise ValueError(f"epoch is {epoch}; epochs count from 0")
    series = [("values", values), ("durations", durations)]
    if counts is not None:
        series.append(("counts", counts))
    for name, entries in series:
        if len(entries) != epoch + 1:
            raise ValueError(
                f"{name} has {len(entries)} entries after epoch {epoch}; "
                f"pass one per round run, {epoch + 1}"
            )
    if tol is not None and not math.isfinite(tol):
        raise ValueError(f"tol is {tol}; pass a finite number or None")
    if any(v is not None and not math.isfinite(v) for v in values):
        raise ValueError("values holds NaN or infinity; check convergence values before estimating")
    if counts is not None and any(
        c is not None and not (c >= 0 and math.isfinite(c)) for c in counts
    ):
        raise ValueError("counts holds a negative or non-finite count; pass rows >= 0 or None")
    if any(not (math.isfinite(d) and d >= 0) for d in durations):
        raise ValueError("durations holds a negative or non-finite time; pass seconds >= 0")
