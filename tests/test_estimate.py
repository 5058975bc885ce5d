"""Backlog and ETA estimates from convergence values and from counts the loop drives to
zero; pure Python, no Spark."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from itertools import count
from typing import Any

import numpy as np
import pytest

from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.progress.estimate import (
    Estimate,
    check_progress_from,
    check_series_name,
    count_series,
    estimate_remaining,
)
from iterflow.reports import RoundProgress


def first_round_at_or_below(trend: Callable[[int], float], tol: float) -> int:
    """The reference answer: scan the noise-free trend for the first round with value <= tol."""
    return next(k for k in count() if trend(k) <= tol)


def estimate(
    values: Sequence[float | None],
    tol: float | None,
    *,
    max_rounds: int | None = None,
    durations: Sequence[float] | None = None,
) -> Estimate:
    """The estimate after the last round in ``values``; each round took 1 s unless told."""
    return estimate_remaining(
        epoch=len(values) - 1,
        values=values,
        tol=tol,
        max_rounds=max_rounds,
        durations=[1.0] * len(values) if durations is None else durations,
    )


def halving(k: int) -> float:
    return 10.0 * 0.5**k


def test_geometric_sequence_predicts_the_round_that_reaches_tol() -> None:
    tol = 1e-3
    stop = first_round_at_or_below(halving, tol)
    assert stop == math.ceil(math.log(tol / 10.0) / math.log(0.5)) == 14
    for epoch in range(2, stop):
        values = [halving(k) for k in range(epoch + 1)]
        assert estimate(values, tol) == Estimate(stop - epoch, float(stop - epoch)), epoch


@pytest.mark.parametrize("tol", [2.5, 0.0])
def test_linear_sequence_predicts_the_round_that_reaches_tol(tol: float) -> None:
    # A geometric fit of the same values would put round 11 (tol 2.5) at round 17.
    def trend(k: int) -> float:
        return 10.0 - 0.7 * k

    stop = first_round_at_or_below(trend, tol)
    for epoch in range(2, stop):
        values = [trend(k) for k in range(epoch + 1)]
        assert estimate(values, tol).rounds_remaining == stop - epoch, epoch


def test_rounds_without_a_value_are_skipped_and_the_fit_uses_round_numbers() -> None:
    tol = 1e-3
    values = [halving(k) if k % 2 == 0 else None for k in range(7)]
    assert estimate(values, tol).rounds_remaining == first_round_at_or_below(halving, tol) - 6
    # The current round had no value: the others still carry the trend.
    assert estimate([*values, None], tol).rounds_remaining == 14 - 7


@pytest.mark.parametrize("n", [3, 5, 8, 20])
def test_constant_values_are_stalled_and_give_no_estimate(n: int) -> None:
    assert estimate([0.1] * n, 1e-3) == Estimate(None, None)


def test_increasing_values_are_diverging_and_give_no_estimate() -> None:
    values = [1e-2 * 1.1**k for k in range(10)]
    assert estimate(values, 1e-3) == Estimate(None, None)


@pytest.mark.parametrize(
    "values",
    [[5.0], [5.0, 2.5], [None, None, 5.0, 2.5], [None, None, None]],
    ids=["one value", "two values", "two values after rounds without", "no values"],
)
def test_fewer_than_three_values_give_no_estimate(values: list[float | None]) -> None:
    assert estimate(values, 1e-3) == Estimate(None, None)


def test_non_positive_values_give_no_estimate() -> None:
    # Only a negative tol lets a non-positive value pass without stopping the iteration.
    assert estimate([3.0, 2.0, 1.0, 0.0], -1.0) == Estimate(None, None)


def test_geometric_decrease_never_reaches_a_non_positive_tol() -> None:
    values = [halving(k) for k in range(6)]
    assert estimate(values, 0.0) == Estimate(None, None)
    assert estimate(values, 0.0, max_rounds=50) == Estimate(44, 44.0)


@pytest.mark.parametrize("epoch", [2, 5, 10, 19])
def test_noisy_geometric_trend_estimate_is_within_one_round(epoch: int) -> None:
    rng = np.random.default_rng(20240611)

    def trend(k: int) -> float:
        return 10.0 * 0.7**k

    tol = 1e-4
    noise = np.exp(0.05 * rng.standard_normal(epoch + 1))  # about 5% relative noise
    values = [trend(k) * float(noise[k]) for k in range(epoch + 1)]
    remaining = estimate(values, tol).rounds_remaining
    assert remaining is not None
    assert abs(remaining - (first_round_at_or_below(trend, tol) - epoch)) <= 1


@pytest.mark.parametrize("seed", range(5))
def test_noise_without_a_trend_gives_no_estimate(seed: int) -> None:
    values = list(1.0 + 0.1 * np.random.default_rng(seed).standard_normal(30))
    for epoch in range(30):
        assert estimate(values[: epoch + 1], 0.5) == Estimate(None, None), epoch


@pytest.mark.parametrize("seed", range(4))
def test_pagerank_like_deltas_estimate_within_five_percent_all_the_way(seed: int) -> None:
    # PageRank's L1 delta shrinks by about the damping factor every round; 1% noise.
    def trend(k: int) -> float:
        return 1.7 * 0.85**k

    tol = 1e-6
    stop = first_round_at_or_below(trend, tol)
    noise = 1.0 + 0.01 * np.random.default_rng(seed).standard_normal(stop)
    values = [trend(k) * float(noise[k]) for k in range(stop)]
    for epoch in range(2, stop):
        truth = stop - epoch
        remaining = estimate(values[: epoch + 1], tol).rounds_remaining
        assert remaining is not None, epoch
        # Extrapolating 80+ rounds from a few noisy points is off by a few rounds at
        # first; the error shrinks with the rounds left.
        assert abs(remaining - truth) <= max(1, math.ceil(0.05 * truth)), epoch


def test_max_rounds_alone_gives_exactly_the_rounds_left() -> None:
    for epoch in range(10):
        got = estimate([None] * (epoch + 1), None, max_rounds=10)
        assert got == Estimate(9 - epoch, float(9 - epoch))


def test_a_max_rounds_lowered_below_the_epoch_leaves_no_rounds() -> None:
    assert call(3, [1.0] * 4, max_rounds=3) == Estimate(0, 0.0)


def test_max_rounds_caps_a_slower_convergence() -> None:
    values = [halving(k) for k in range(5)]  # reaches 1e-3 at round 14
    assert estimate(values, 1e-3, max_rounds=10).rounds_remaining == 5
    assert estimate(values, 1e-3, max_rounds=100).rounds_remaining == 14 - 4


def test_max_rounds_bounds_a_stalled_iteration() -> None:
    assert estimate([0.1] * 5, 1e-3, max_rounds=30) == Estimate(25, 25.0)


def test_eta_is_the_rounds_left_times_the_median_of_recent_durations() -> None:
    values = [halving(k) for k in range(6)]  # 14 - 5 = 9 rounds left
    # Round 0 (slow, say caching) is outside the last five; the median ignores the straggler.
    durations = [100.0, 1.0, 2.0, 3.0, 2.0, 50.0]
    assert estimate(values, 1e-3, durations=durations) == Estimate(9, 9 * 2.0)


def test_no_tol_and_no_max_rounds_give_no_estimate() -> None:
    assert estimate([halving(k) for k in range(6)], None) == Estimate(None, None)


@pytest.mark.parametrize(
    "values",
    [[5.0, 1e-3], [1e-4], [None, 2e-4], [3.0, 2.0, 0.0]],
    ids=["reached", "first round", "after a round without value", "zero"],
)
def test_value_at_or_below_tol_leaves_zero_rounds(values: list[float | None]) -> None:
    assert estimate(values, 1e-3, max_rounds=100) == Estimate(0, 0.0)


def call(
    epoch: int,
    values: Sequence[float | None],
    *,
    durations: Sequence[float] | None = None,
    tol: float | None = 1e-3,
    max_rounds: int | None = None,
) -> Estimate:
    return estimate_remaining(
        epoch=epoch,
        values=values,
        tol=tol,
        max_rounds=max_rounds,
        durations=[1.0] * len(values) if durations is None else durations,
    )


@pytest.mark.parametrize(
    ("bad_call", "message"),
    [
        (lambda: call(-1, []), "epoch is -1"),
        (lambda: call(1, [1.0], durations=[1.0, 1.0]), "values has 1 entries"),
        (lambda: call(1, [1.0, 0.5], durations=[1.0]), "durations has 1 entries"),
        (lambda: call(0, [1.0], tol=math.nan), "tol is nan"),
        (lambda: call(1, [1.0, math.inf]), "NaN or infinity"),
        (lambda: call(0, [1.0], durations=[-1.0]), "negative or non-finite"),
    ],
    ids=["epoch", "values", "durations", "tol", "value", "duration"],
)
def test_inconsistent_arguments_raise_value_error(
    bad_call: Callable[[], Estimate], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bad_call()


# -- counts the loop drives to zero ---------------------------------------------------


def first_round_below_one_row(trend: Callable[[int], float]) -> int:
    """The reference answer for counts: the first round whose trend is below one row."""
    return next(k for k in count() if trend(k) < 1.0)


def from_counts(
    counts: Sequence[float | None],
    *,
    max_rounds: int | None = None,
    values: Sequence[float | None] | None = None,
    tol: float | None = None,
) -> Estimate:
    """The estimate after the last round in ``counts``; each round took 1 s."""
    return estimate_remaining(
        epoch=len(counts) - 1,
        values=[None] * len(counts) if values is None else values,
        tol=tol,
        max_rounds=max_rounds,
        durations=[1.0] * len(counts),
        counts=counts,
    )


def test_a_halving_count_predicts_the_round_that_counts_no_row() -> None:
    # 512 rows halved every round: 1 row at round 9, none at round 10.
    stop = 10
    for epoch in range(2, stop):
        counts = [512 // 2**k for k in range(epoch + 1)]
        assert from_counts(counts) == Estimate(stop - epoch, float(stop - epoch)), epoch


def test_a_linear_count_predicts_the_round_that_counts_no_row() -> None:
    def trend(k: int) -> float:
        return 100.0 - 7.0 * k

    stop = first_round_below_one_row(trend)
    assert stop == 15
    for epoch in range(2, stop):
        counts = [trend(k) for k in range(epoch + 1)]
        assert from_counts(counts).rounds_remaining == stop - epoch, epoch


@pytest.mark.parametrize("epoch", [3, 6, 12])
def test_noisy_geometric_counts_of_whole_rows_estimate_within_one_round(epoch: int) -> None:
    def trend(k: int) -> float:
        return 5000.0 * 0.6**k

    rng = np.random.default_rng(7)
    counts = [
        round(trend(k) * float(np.exp(0.05 * rng.standard_normal()))) for k in range(epoch + 1)
    ]
    remaining = from_counts(counts).rounds_remaining
    assert remaining is not None
    assert abs(remaining - (first_round_below_one_row(trend) - epoch)) <= 1


@pytest.mark.parametrize(
    "counts",
    [[8, 4, 2, 1, 0], [0], [None, 3, 0]],
    ids=["drained", "empty at once", "after a round without count"],
)
def test_a_count_at_zero_leaves_zero_rounds(counts: list[float | None]) -> None:
    assert from_counts(counts, max_rounds=100) == Estimate(0, 0.0)


@pytest.mark.parametrize(
    "counts",
    [[40, 20], [40, 40, 40, 40], [10, 20, 40, 80], [None, None, None]],
    ids=["two counts", "constant", "growing", "never counted"],
)
def test_counts_without_a_decrease_give_no_estimate(counts: list[float | None]) -> None:
    assert from_counts(counts) == Estimate(None, None)


def test_rounds_without_a_count_are_skipped() -> None:
    counts: list[float | None] = [512 // 2**k if k % 2 == 0 else None for k in range(7)]
    assert from_counts(counts).rounds_remaining == 10 - 6
    assert from_counts([*counts, None]).rounds_remaining == 10 - 7


def test_max_rounds_caps_the_estimate_from_counts() -> None:
    counts = [512 // 2**k for k in range(4)]  # none left at round 10
    assert from_counts(counts, max_rounds=6) == Estimate(2, 2.0)
    assert from_counts(counts, max_rounds=60).rounds_remaining == 10 - 3


def test_the_sooner_of_convergence_and_counts_is_the_estimate() -> None:
    values = [halving(k) for k in range(5)]  # reaches 1e-3 at round 14
    counts = [512 // 2**k for k in range(5)]  # none left at round 10
    assert from_counts(counts, values=values, tol=1e-3).rounds_remaining == 10 - 4
    assert from_counts([100] * 5, values=values, tol=1e-3).rounds_remaining == 14 - 4


@pytest.mark.parametrize(
    ("counts", "message"),
    [([4, 2], "counts has 2 entries"), ([4, -1, 1], "negative"), ([4, math.nan, 1], "non-finite")],
    ids=["length", "negative", "nan"],
)
def test_inconsistent_counts_raise_value_error(counts: list[float | None], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimate_remaining(
            epoch=2,
            values=[None] * 3,
            tol=None,
            max_rounds=None,
            durations=[1.0] * 3,
            counts=counts,
        )


# -- which count the estimate follows ---------------------------------------------------


def round_record(epoch: int, **fields: Any) -> RoundProgress:
    start = datetime(2025, 1, 1, tzinfo=timezone.utc)
    return RoundProgress(
        epoch=epoch, epoch_watermark=epoch, started_at=start, duration_s=1.0, **fields
    )


def test_the_criteria_rows_are_followed_first_when_counted() -> None:
    rounds = [
        round_record(k, criteria_empty=False, criteria_rows=64 >> k, observed={"changed": 9})
        for k in range(3)
    ]
    assert count_series(rounds, None) == [64, 32, 16]


def test_without_counted_criteria_the_first_observed_step_counted_is_followed() -> None:
    rounds = [
        round_record(
            k, criteria_empty=False, observed={"skipped": None, "messages": 50 - k, "active": 9}
        )
        for k in range(3)
    ]
    assert count_series(rounds, None) == [50, 49, 48]


def test_an_unbounded_run_follows_its_feedback_in_flight() -> None:
    rounds = [round_record(k, backlog={"feedback_rows": 30.0 - k}) for k in range(3)]
    assert count_series(rounds, None) == [30.0, 29.0, 28.0]


def test_nothing_counted_gives_no_series() -> None:
    rounds = [round_record(k, criteria_empty=False, rows={"labels": 10}) for k in range(3)]
    assert count_series(rounds, None) is None


def test_a_named_count_is_an_observed_step_or_a_feedback_or_output() -> None:
    rounds = [
        round_record(
            k,
            criteria_empty=False,
            criteria_rows=5,
            observed={"changed": 10 - k, "labels": None},
            rows={"labels": 100 + k, "workset": 20 - k},
        )
        for k in range(3)
    ]
    assert count_series(rounds, "changed") == [10, 9, 8]
    assert count_series(rounds, "workset") == [20, 19, 18]
    assert count_series(rounds, "labels") == [None, None, None]  # observed first
    assert count_series(rounds, "criteria") == [5, 5, 5]


def test_a_name_the_round_does_not_have_is_an_error_naming_it() -> None:
    progress = round_record(0, criteria_empty=False, observed={"changed": 3}, rows={"labels": 5})
    for name in ("changed", "labels", "criteria"):
        check_series_name(progress, name)
    with pytest.raises(IterflowValueError, match=r"progress_from='chnaged'.*\['changed'\]"):
        check_series_name(progress, "chnaged")
    with pytest.raises(IterflowValueError, match=r"declares no itf\.empty"):
        check_series_name(round_record(0), "criteria")


def test_progress_from_takes_a_name_or_none() -> None:
    check_progress_from(None)
    check_progress_from("changed")
    with pytest.raises(IterflowTypeError, match="got int 3"):
        check_progress_from(3)
