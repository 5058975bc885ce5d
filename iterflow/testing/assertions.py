"""Assertions about an iteration's run, whose messages show the evidence.

Each takes what a run gives back: an ``IterationResult``, a fitted
``iterflow.ml`` model, or the ``IterationEnd`` a listener received (anything
with ``termination``, ``rounds`` and ``history``). A failing assertion raises
``ConvergenceAssertionError`` (an ``AssertionError``) whose message holds the
last rounds of the history, or the first rows that differ.

``metric`` names what ``iterflow plot --metric`` takes: ``converged_value``,
``duration_s``, ``rows.<name>``, ``observed.<name>``, or a user metric such as
the ``loss`` gauge of ``iterflow.ml``.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pyspark.errors import PySparkAssertionError
from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

import iterflow as itf

#: Rounds of history a failure message shows.
SHOWN_ROUNDS = 5
#: Differing rows a failure message shows.
SHOWN_ROWS = 5


class ConvergenceAssertionError(AssertionError):
    """An iterflow.testing assertion failed; the message holds the evidence."""


def _run(result: Any) -> Any:
    missing = [a for a in ("termination", "rounds", "history") if not hasattr(result, a)]
    if missing:
        raise itf.IterflowTypeError(
            f"expected an iteration's result (an IterationResult, a fitted model or an "
            f"IterationEnd), got {type(result).__name__} without {', '.join(missing)}"
        )
    return result


def metric_values(result: Any, metric: str) -> list[tuple[int, float]]:
    """``(epoch, value)`` of every round of ``result`` that has a value of ``metric``."""
    rounds = [
        (p.epoch, itf.progress.round_values(itf.progress.progress_to_dict(p)))
        for p in _run(result).history
    ]
    return [(epoch, float(value)) for epoch, value in itf.progress.metric_points(rounds, metric)]


def _evidence(result: Any, metric: str | None = None) -> str:
    """The run's ending and its last rounds, as lines for a failure message."""
    run = _run(result)
    termination = run.termination
    lines = [
        f"  terminated by {termination.reason!r} (reasons {list(termination.reasons)}) "
        f"after {run.rounds} rounds; last {min(SHOWN_ROUNDS, len(run.history))} rounds:"
    ]
    for p in list(run.history)[-SHOWN_ROUNDS:]:
        values = itf.progress.round_values(itf.progress.progress_to_dict(p))
        shown = {"converged_value": values.get("converged_value")}
        if metric is not None:
            shown[metric] = values.get(metric)
        shown.update(
            (name, values.get(name)) for name in p.metrics if name not in shown and len(shown) < 5
        )
        described = ", ".join(f"{k}={_number(v)}" for k, v in shown.items() if v is not None)
        lines.append(f"    epoch {p.epoch}: {described or 'no values'} ({p.duration_s:.3f} s)")
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _fail(headline: str, evidence: str) -> None:
    raise ConvergenceAssertionError(f"{headline}\n{evidence}")


def assert_converges(result: Any, tol: float | None = None, within: int | None = None) -> None:
    """The run stopped by its own criterion, not by ``max_rounds``; with ``tol``, its last
    convergence value is at most ``tol``; with ``within``, it took at most ``within`` rounds.

    Example::

        assert_converges(iteration.run(progress=False), tol=1e-8, within=60)
    """
    run = _run(result)
    problems = []
    if run.termination.reason == "max_rounds":
        problems.append("it ran out of rounds (max_rounds) instead of converging")
    if tol is not None:
        last = run.history[-1].converged_value if run.history else None
        if last is None:
            problems.append(f"its last round has no convergence value to compare with {tol}")
        elif not last <= tol:
            problems.append(f"its last convergence value {_number(last)} is above tol={tol}")
    if within is not None and run.rounds > within:
        problems.append(f"it took {run.rounds} rounds, more than within={within}")
    if problems:
        _fail("the iteration did not converge: " + "; ".join(problems), _evidence(result))


def assert_terminated_by(result: Any, reason: str) -> None:
    """``reason`` is among the reasons the run stopped (``result.termination.reasons``).

    Example::

        assert_terminated_by(result, "criteria_empty")
    """
    run = _run(result)
    if reason not in run.termination.reasons:
        _fail(
            f"expected termination by {reason!r}, got {run.termination.reason!r}",
            _evidence(result),
        )


def assert_monotone(
    result: Any, metric: str, decreasing: bool = True, tolerance: float = 0.0
) -> None:
    """Round after round, ``metric`` never rises (``decreasing``) or never falls, by more
    than ``tolerance``.

    Example::

        assert_monotone(model, "loss")  # the loss of iterflow.ml never rises
    """
    points = metric_values(result, metric)
    for (e0, v0), (e1, v1) in itertools.pairwise(points):
        step = v1 - v0 if decreasing else v0 - v1
        if not step <= tolerance:  # NaN fails too
            direction = "rose" if decreasing else "fell"
            _fail(
                f"{metric} {direction} from {_number(v0)} at epoch {e0} to {_number(v1)} at "
                f"epoch {e1}, by more than tolerance={tolerance}",
                _evidence(result, metric),
            )


def observed_rate(values: Sequence[float], window: int = 8) -> float | None:
    """The geometric rate of convergence of ``values`` (errors, or changes per round): the
    factor by which they shrink per round, fitted over the last ``window`` positive values
    (least squares on their logs). None with fewer than 3 positive values."""
    tail = [v for v in values if v > 0 and math.isfinite(v)][-window:]
    if len(tail) < 3:
        return None
    slope = np.polyfit(np.arange(len(tail), dtype=np.float64), np.log(tail), 1)[0]
    return float(np.exp(slope))


def assert_rate(result: Any, metric: str, at_most: float, window: int = 8) -> None:
    """``metric`` shrinks geometrically at least as fast as ``at_most``: the observed rate
    (see :func:`observed_rate`) is at most ``at_most`` (0.5: it halves every round).

    Example::

        assert_rate(result, "converged_value", at_most=0.9)
    """
    values = [v for _, v in metric_values(result, metric)]
    rate = observed_rate(values, window)
    if rate is None:
        _fail(
            f"cannot measure a rate of {metric}: it needs 3 positive values, it has "
            f"{[_number(v) for v in values]}",
            _evidence(result, metric),
        )
    elif not rate <= at_most:
        _fail(
            f"{metric} shrinks by a factor of {rate:.4g} per round (fitted over its last "
            f"{min(window, len(values))} values), slower than at_most={at_most}",
            _evidence(result, metric),
        )


def _frame(data: Any, what: str) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        return data.reset_index(drop=True)
    if hasattr(data, "toPandas"):  # a Spark DataFrame, classic or Connect
        return data.toPandas()
    if isinstance(data, Sequence) and all(isinstance(row, Mapping) for row in data):
        return pd.DataFrame(list(data))
    raise itf.IterflowTypeError(
        f"{what} must be a DataFrame, a pandas DataFrame or a list of dicts, "
        f"got {type(data).__name__}"
    )


def _missing(value: Any) -> bool:
    return (
        value is None
        or value is pd.NA
        or value is pd.NaT
        or (isinstance(value, float) and math.isnan(value))
    )


def _plain(value: Any) -> Any:
    """A cell as ``pyspark.testing`` compares it: Python lists, dicts and floats (numbers
    other than bools compare within the tolerances), and None for any missing value
    (it would take NaN for equal to every number)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if _missing(value):
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _rows(frame: pd.DataFrame) -> list[Row]:
    return [Row(**{k: _plain(v) for k, v in record.items()}) for record in frame.to_dict("records")]


def _differing(actual: pd.DataFrame, expected: pd.DataFrame, atol: float, rtol: float) -> Any:
    """Per row (the frames hold the same keys in the same order): does it differ beyond
    ``atol + rtol * |expected|``, as ``pyspark.testing.assertDataFrameEqual`` decides."""
    mine, theirs = _rows(actual), _rows(expected)
    with warnings.catch_warnings():
        # PySpark 4.0 imports pandas-on-Spark here, which warns about a setting it needs
        # for its own frames only.
        warnings.filterwarnings("ignore", message=".*PYARROW_IGNORE_TIMEZONE")
        if _same_rows(mine, theirs, atol, rtol):  # the common case, in one call
            return np.zeros(len(mine), dtype=bool)
        return np.array(
            [not _same_rows([a], [e], atol, rtol) for a, e in zip(mine, theirs, strict=True)],
            dtype=bool,
        )


def _same_rows(actual: list[Row], expected: list[Row], atol: float, rtol: float) -> bool:
    try:
        assertDataFrameEqual(actual, expected, checkRowOrder=True, rtol=rtol, atol=atol)
    except PySparkAssertionError:
        return False
    return True


def assert_frame_close(
    actual_df: Any,
    expected: Any,
    key: str | Sequence[str],
    atol: float = 1e-8,
    rtol: float = 1e-5,
) -> None:
    """``actual_df`` has the rows of ``expected`` (a DataFrame, a pandas frame or a list of
    dicts), matched by the ``key`` column(s): the same keys, and in every other column of
    ``expected`` numbers within ``atol + rtol * |expected|`` and other values equal.

    The cells compare as ``pyspark.testing.assertDataFrameEqual(rtol=, atol=)`` compares
    them (arrays, maps and structs element by element), after matching rows by key, so
    that a failure names the keys missing on either side and shows the rows that differ.
    Missing values (None, NaN) equal only missing values.

    Example::

        assert_frame_close(result.outputs["ranks"], [{"id": 1, "rank": 0.25}], key="id")
    """
    keys = [key] if isinstance(key, str) else list(key)
    actual, wanted = _frame(actual_df, "actual_df"), _frame(expected, "expected")
    for name, frame in (("actual_df", actual), ("expected", wanted)):
        missing = [k for k in keys if k not in frame.columns]
        if missing:
            raise itf.IterflowValueError(
                f"{name} has no key column(s) {missing}; its columns are {list(frame.columns)}"
            )
        if frame.duplicated(keys).any():
            raise itf.IterflowValueError(f"{name} has duplicate keys {keys}; keys must be unique")
    columns = [c for c in wanted.columns if c not in keys]
    absent = [c for c in columns if c not in actual.columns]
    if absent:
        raise ConvergenceAssertionError(
            f"actual_df has no column(s) {absent}; its columns are {list(actual.columns)}"
        )
    merged = actual[keys + columns].merge(
        wanted[keys + columns], on=keys, how="outer", suffixes=("", " (expected)"), indicator=True
    )
    problems = []
    only_actual = merged[merged["_merge"] == "left_only"][keys]
    only_expected = merged[merged["_merge"] == "right_only"][keys]
    if len(only_expected):
        problems.append(
            f"{len(only_expected)} expected key(s) missing from actual_df, e.g. "
            f"{only_expected.head(SHOWN_ROWS).to_dict('records')}"
        )
    if len(only_actual):
        problems.append(
            f"{len(only_actual)} key(s) in actual_df that are not expected, e.g. "
            f"{only_actual.head(SHOWN_ROWS).to_dict('records')}"
        )
    both = merged[merged["_merge"] == "both"].reset_index(drop=True)
    expected_columns = {f"{c} (expected)": c for c in columns}
    differing = _differing(
        both[columns], both[list(expected_columns)].rename(columns=expected_columns), atol, rtol
    )
    if differing.any():
        shown = both[differing].head(SHOWN_ROWS).drop(columns="_merge")
        problems.append(
            f"{int(differing.sum())} of {len(both)} rows differ beyond atol={atol}, "
            f"rtol={rtol}; the first:\n{shown.to_string(index=False)}"
        )
    if problems:
        raise ConvergenceAssertionError("the frames differ: " + "\n".join(problems))
