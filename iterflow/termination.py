"""Termination conditions and the decision taken after every round.

Pure Python: conditions may hold DataFrames (``empty(df)``, ``converged(df, tol)``)
but this module never touches Spark. The round loop evaluates those DataFrames
and hands the facts to :func:`decide`.

Example::

    stop = itf.max_rounds(100) | itf.converged(delta, tol=1e-6)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from iterflow.errors import DivergenceError, IterflowTypeError, IterflowValueError
from iterflow.reports import RoundProgress, Termination

#: Termination reasons, in the order that picks ``Termination.reason``.
REASONS: tuple[str, ...] = (
    "criteria_empty",
    "converged",
    "predicate",
    "feedback_empty",
    "max_rounds",
)


class Condition:
    """A termination condition; combine conditions with ``|`` (stop when any holds).

    Example::

        iteration.until(itf.max_rounds(100) | itf.until(lambda p: p.duration_s > 60))
    """

    def __or__(self, other: Condition) -> AnyOf:
        if not isinstance(other, Condition):
            return NotImplemented
        return AnyOf((*self.leaves(), *other.leaves()))

    def leaves(self) -> tuple[Condition, ...]:
        return (self,)

    def describe(self) -> dict[str, Any]:
        """JSON-ready description, as the event log records it."""
        raise NotImplementedError


@attrs.frozen(eq=False)
class AnyOf(Condition):
    """Several conditions; the iteration stops when any of them holds."""

    conditions: tuple[Condition, ...]

    def leaves(self) -> tuple[Condition, ...]:
        return self.conditions

    def describe(self) -> dict[str, Any]:
        return {"kind": "any_of", "conditions": [c.describe() for c in self.conditions]}


@attrs.frozen(eq=False)
class MaxRounds(Condition):
    n: int

    def describe(self) -> dict[str, Any]:
        return {"kind": "max_rounds", "n": self.n}


@attrs.frozen(eq=False)
class Empty(Condition):
    criteria: Any  # a DataFrame of the round

    def describe(self) -> dict[str, Any]:
        return {"kind": "empty"}


@attrs.frozen(eq=False)
class Converged(Condition):
    value: Any  # a one-row, one-column numeric DataFrame, or a callable (RoundEnd) -> float
    tol: float

    def describe(self) -> dict[str, Any]:
        value = "callable" if callable(self.value) else "dataframe"
        return {"kind": "converged", "tol": self.tol, "value": value}


@attrs.frozen(eq=False)
class Until(Condition):
    predicate: Callable[[RoundProgress], bool]

    def describe(self) -> dict[str, Any]:
        name = getattr(self.predicate, "__qualname__", type(self.predicate).__qualname__)
        return {"kind": "predicate", "name": name}


def max_rounds(n: int) -> MaxRounds:
    """Stop after exactly ``n`` rounds (epochs 0..n-1).

    Example::

        itf.BoundedIteration(step).bind("x", df).until(itf.max_rounds(50)).run()
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise IterflowTypeError(f"max_rounds takes an int, got {type(n).__name__} {n!r}")
    if n < 1:
        raise IterflowValueError(
            f"max_rounds({n}): an iteration runs at least one round; pass n >= 1"
        )
    return MaxRounds(n)


def empty(criteria: Any) -> Empty:
    """Stop after a round in which the criteria DataFrame ``criteria`` has no rows.

    Example::

        changed = best.join(labels, ["id", "label"], "left_anti")  # rows that moved
        return itf.Declaration(feedback={"labels": best}, until=itf.empty(changed))
    """
    _require_dataframe(criteria, "empty()")
    return Empty(criteria)


def converged(value: Any, tol: float) -> Converged:
    """Stop once ``value <= tol``.

    ``value`` is a one-row, one-column numeric DataFrame built in the body, or a
    callable ``(RoundEnd) -> float``. NaN or infinity raises ``DivergenceError``.

    Example::

        delta = new.join(old, "id").agg(F.sum(F.abs(new.rank - old.rank)))  # L1 change
        return itf.Declaration(feedback={"ranks": new}, until=itf.converged(delta, tol=1e-8))
    """
    if not callable(value):
        _require_dataframe(value, "converged()")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol):
        raise IterflowValueError(f"converged(): tol must be a finite number, got {tol!r}")
    return Converged(value, float(tol))


def until(predicate: Callable[[RoundProgress], bool]) -> Until:
    """Stop after a round for which ``predicate(RoundProgress)`` is true.

    Example::

        stop = itf.max_rounds(100) | itf.until(lambda p: p.rows["frontier"] < 10)
    """
    if not callable(predicate):
        raise IterflowTypeError(
            f"until() takes a callable (RoundProgress) -> bool, got {type(predicate).__name__}"
        )
    return Until(predicate)


def _require_dataframe(obj: Any, where: str) -> None:
    # Duck-typed so that this module stays free of Spark: classic and Connect
    # DataFrames both have these.
    if not (hasattr(obj, "schema") and hasattr(obj, "sparkSession")):
        raise IterflowTypeError(f"{where} takes a DataFrame of the round, got {type(obj).__name__}")


def flatten(conditions: Sequence[Condition | None]) -> Iterator[Condition]:
    """Every leaf condition of ``conditions`` (None entries skipped)."""
    for condition in conditions:
        if condition is not None:
            yield from condition.leaves()


def check_converged_value(value: Any, epoch: int) -> float:
    """Validate a convergence value: a number, not null, finite."""
    if value is None:
        raise IterflowValueError(
            f"epoch {epoch}: the convergence value is null or empty; build it as a one-row "
            "aggregate that is never null (e.g. F.coalesce(F.sum(...), F.lit(0.0)))"
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise IterflowTypeError(
            f"epoch {epoch}: the convergence value {value!r} is not a number"
        ) from None
    if not math.isfinite(number):
        raise DivergenceError(
            f"epoch {epoch}: the convergence value is {number}; the iteration diverged "
            "(lower the step size or check the body for a division by zero)",
            epoch=epoch,
        )
    return number


def max_rounds_of(conditions: Sequence[Condition]) -> int | None:
    """The smallest ``max_rounds(n)`` among ``conditions`` (leaves), or None without one."""
    bounds = [c.n for c in conditions if isinstance(c, MaxRounds)]
    return min(bounds) if bounds else None


def decide(
    conditions: Sequence[Condition],
    progress: RoundProgress,
    *,
    criteria_empty: Mapping[Condition, bool],
    converged_values: Mapping[Condition, float],
    feedback_empty: bool,
) -> Termination | None:
    """The termination after ``progress.epoch``, or None to run another round.

    ``criteria_empty`` and ``converged_values`` hold, per ``Empty`` and
    ``Converged`` leaf, what the round loop evaluated.
    """
    fired: set[str] = set()
    for condition in conditions:
        if isinstance(condition, Empty) and criteria_empty[condition]:
            fired.add("criteria_empty")
        elif isinstance(condition, Converged) and converged_values[condition] <= condition.tol:
            fired.add("converged")
        elif isinstance(condition, Until) and condition.predicate(progress):
            fired.add("predicate")
        elif isinstance(condition, MaxRounds) and progress.epoch + 1 >= condition.n:
            fired.add("max_rounds")
    if feedback_empty:
        fired.add("feedback_empty")
    if not fired:
        return None
    reasons = tuple(r for r in REASONS if r in fired)
    return Termination(reason=reasons[0], epoch=progress.epoch, reasons=reasons)
