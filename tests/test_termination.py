"""Termination conditions and their decision order; pure Python, no Spark."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

import iterflow as itf
from iterflow.termination import REASONS, Converged, Empty, decide


class FakeFrame:
    """Stands in for a DataFrame: termination only checks for these attributes."""

    schema = None
    sparkSession = None


def progress(epoch: int) -> itf.RoundProgress:
    return itf.RoundProgress(
        epoch=epoch,
        epoch_watermark=epoch,
        started_at=datetime.now(timezone.utc),
        duration_s=0.1,
    )


def test_max_rounds_fires_after_exactly_n_rounds() -> None:
    stop = itf.max_rounds(4)
    fired = [
        decide([stop], progress(k), criteria_empty={}, converged_values={}, feedback_empty=False)
        for k in range(5)
    ]
    assert [t is not None for t in fired] == [False, False, False, True, True]
    assert fired[3] == itf.Termination("max_rounds", 3, ("max_rounds",))


@pytest.mark.parametrize("n", [0, -1])
def test_max_rounds_below_one_is_a_value_error(n: int) -> None:
    with pytest.raises(itf.IterflowError, match=rf"max_rounds\({n}\).*n >= 1") as info:
        itf.max_rounds(n)
    assert isinstance(info.value, ValueError)


def test_max_rounds_rejects_non_integers() -> None:
    with pytest.raises(TypeError, match=r"int"):
        itf.max_rounds(2.5)  # type: ignore[arg-type]


def test_conditions_combine_with_or_into_flat_leaves() -> None:
    a, b, c = itf.max_rounds(3), itf.until(lambda p: False), itf.empty(FakeFrame())
    combined = (a | b) | c
    assert combined.leaves() == (a, b, c)


def test_reason_is_first_in_api_order_and_reasons_lists_all_fired() -> None:
    criteria = itf.empty(FakeFrame())
    value = itf.converged(FakeFrame(), tol=0.5)
    conditions = [itf.max_rounds(1), itf.until(lambda p: True), value, criteria]
    result = decide(
        conditions,
        progress(0),
        criteria_empty={criteria: True},
        converged_values={value: 0.1},
        feedback_empty=True,
    )
    assert result is not None
    assert result.reasons == REASONS
    assert result.reason == "criteria_empty"


def test_converged_fires_at_or_below_tolerance_only() -> None:
    value = itf.converged(lambda end: 0.0, tol=1e-3)
    assert isinstance(value, Converged)
    kwargs = {"criteria_empty": {}, "feedback_empty": False}
    assert decide([value], progress(2), converged_values={value: 2e-3}, **kwargs) is None
    hit = decide([value], progress(2), converged_values={value: 1e-3}, **kwargs)
    assert hit is not None and hit.reason == "converged" and hit.epoch == 2


def test_feedback_empty_alone_stops() -> None:
    result = decide([], progress(7), criteria_empty={}, converged_values={}, feedback_empty=True)
    assert result == itf.Termination("feedback_empty", 7, ("feedback_empty",))


def test_predicate_receives_the_round_progress() -> None:
    seen: list[int] = []

    def stop_at_three(p: itf.RoundProgress) -> bool:
        seen.append(p.epoch)
        return p.epoch == 3

    stop = itf.until(stop_at_three)
    outcomes = [
        decide([stop], progress(k), criteria_empty={}, converged_values={}, feedback_empty=False)
        for k in range(4)
    ]
    assert seen == [0, 1, 2, 3]
    assert outcomes[3] is not None and outcomes[3].reason == "predicate"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_convergence_value_raises_divergence_naming_the_epoch(bad: float) -> None:
    from iterflow.termination import check_converged_value

    with pytest.raises(itf.DivergenceError, match=r"epoch 6") as info:
        check_converged_value(bad, 6)
    assert info.value.epoch == 6


def test_null_convergence_value_is_an_iterflow_error() -> None:
    from iterflow.termination import check_converged_value

    with pytest.raises(itf.IterflowError, match=r"epoch 2.*null or empty"):
        check_converged_value(None, 2)


def test_condition_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"DataFrame"):
        itf.empty([1, 2])
    with pytest.raises(ValueError, match=r"tol must be a finite number"):
        itf.converged(lambda e: 0.0, tol=math.nan)
    with pytest.raises(TypeError, match=r"callable"):
        itf.until(3)  # type: ignore[arg-type]
    assert isinstance(itf.empty(FakeFrame()), Empty)
