"""Metric bookkeeping without Spark: kinds, per-round values, committed vs attempted."""

from __future__ import annotations

import pickle

import pytest

from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.metrics.registry import Registry, RunMetrics
from iterflow.metrics.values import DistributionValue, MetricResult


def fresh() -> Registry:
    return Registry()


def test_get_or_create_returns_the_same_metric_by_name() -> None:
    registry = fresh()
    assert registry.get("seen", "counter") is registry.get("seen", "counter")


def test_a_name_keeps_its_kind() -> None:
    registry = fresh()
    registry.get("seen", "counter")
    with pytest.raises(IterflowValueError, match="'seen' is a counter already"):
        registry.get("seen", "gauge")


@pytest.mark.parametrize("name", ["", "1st", "has space", "a-b", None])
def test_invalid_names_are_refused(name: object) -> None:
    with pytest.raises(IterflowValueError, match="metric name"):
        fresh().get(name, "counter")  # type: ignore[arg-type]


def test_updates_are_validated() -> None:
    registry = fresh()
    counter = registry.get("c", "counter")
    with pytest.raises(IterflowTypeError, match="'c': inc\\(\\) takes an int"):
        counter.inc(1.5)  # type: ignore[attr-defined]
    with pytest.raises(IterflowTypeError):
        counter.inc(True)  # type: ignore[attr-defined]
    with pytest.raises(IterflowValueError, match="finite"):
        registry.get("d", "distribution").update(float("nan"))  # type: ignore[attr-defined]
    with pytest.raises(IterflowTypeError, match="takes a number"):
        registry.get("g", "gauge").set("3")  # type: ignore[attr-defined]


def test_updates_outside_a_run_are_not_counted() -> None:
    registry = fresh()
    counter = registry.get("c", "counter")
    counter.inc(5)  # type: ignore[attr-defined]
    run = registry.begin_run(iteration="it", run_id="r1")
    run.start_round(0)
    counter.inc(2)  # type: ignore[attr-defined]
    run.complete_round(0)
    assert run.finish() == {"c": MetricResult(kind="counter", committed=2, attempted=2)}


def test_per_round_values_and_totals() -> None:
    registry = fresh()
    run = registry.begin_run(iteration="it", run_id="r1")
    counter = registry.get("c", "counter")
    spread = registry.get("d", "distribution")
    level = registry.get("g", "gauge")
    rounds = []
    for epoch, xs in enumerate([[1.0, 3.0], [10.0], []]):
        run.start_round(epoch)
        counter.inc(len(xs))  # type: ignore[attr-defined]
        for x in xs:
            spread.update(x)  # type: ignore[attr-defined]
        if xs:
            level.set(xs[-1])  # type: ignore[attr-defined]
        rounds.append(run.round_values(epoch))
        run.complete_round(epoch)
    assert [r["c"] for r in rounds] == [2, 1, 0]
    assert rounds[0]["d"] == DistributionValue(count=2, sum=4.0, min=1.0, max=3.0)
    assert rounds[0]["d"].mean == 2.0  # type: ignore[union-attr]
    assert rounds[2]["d"] == DistributionValue()
    # A gauge not set in a round shows its latest committed value.
    assert [r["g"] for r in rounds] == [3.0, 10.0, 10.0]
    totals = run.finish()
    assert totals["c"] == MetricResult(kind="counter", committed=3, attempted=3)
    assert totals["d"].committed == DistributionValue(count=3, sum=14.0, min=1.0, max=10.0)
    assert totals["g"].committed == 10.0


def test_a_failed_round_counts_as_attempted_only() -> None:
    registry = fresh()
    run = registry.begin_run(iteration="it", run_id="r1")
    counter = registry.get("c", "counter")
    for epoch in range(2):
        run.start_round(epoch)
        counter.inc(10)  # type: ignore[attr-defined]
        run.complete_round(epoch)
    run.start_round(2)
    counter.inc(7)  # type: ignore[attr-defined]  # round 2 fails before completing
    assert run.totals()["c"] == MetricResult(kind="counter", committed=20, attempted=27)
    assert run.finish()["c"] == MetricResult(kind="counter", committed=20, attempted=27)


def test_rolled_back_rounds_count_as_attempted_only() -> None:
    registry = fresh()
    run = registry.begin_run(iteration="it", run_id="r1")
    counter = registry.get("c", "counter")
    for epoch in range(3):
        run.start_round(epoch)
        counter.inc(1)  # type: ignore[attr-defined]
        run.complete_round(epoch)
    run.roll_back(1)  # rounds 1 and 2 run again
    for epoch in (1, 2):
        run.start_round(epoch)
        counter.inc(1)  # type: ignore[attr-defined]
        run.complete_round(epoch)
    assert run.finish()["c"] == MetricResult(kind="counter", committed=3, attempted=5)


def test_settled_rounds_are_totals_only_and_a_later_rollback_still_counts_right() -> None:
    """A long run forgets the per-round states of the rounds no rollback can reach; the
    totals and a rollback after them come out as if it had kept them all."""
    registry = fresh()
    run = registry.begin_run(iteration="it", run_id="r1")
    counter = registry.get("c", "counter")
    level = registry.get("g", "gauge")
    for epoch in range(1000):
        run.settle(epoch - 10)  # a checkpoint ten rounds back
        run.start_round(epoch)
        counter.inc(2)  # type: ignore[attr-defined]
        level.set(epoch)  # type: ignore[attr-defined]
        run.complete_round(epoch)
    assert len(run._sealed) <= 12
    run.roll_back(995)  # rounds 995-999 run again
    for epoch in range(995, 1000):
        run.start_round(epoch)
        counter.inc(1)  # type: ignore[attr-defined]
        run.complete_round(epoch)
    totals = run.finish()
    assert totals["c"] == MetricResult(kind="counter", committed=995 * 2 + 5, attempted=2005)
    assert totals["g"].committed == 994  # the reruns did not set it: the last committed set


def test_executor_states_count_toward_their_epoch() -> None:
    executor = {
        (0, "c", "counter"): 5,
        (1, "c", "counter"): 7,
        (1, "d", "distribution"): (2, 3.0, 1.0, 2.0),
    }
    forgotten: list[int] = []
    run = RunMetrics(
        iteration="it",
        run_id="r1",
        kinds={},
        executor_states=lambda: executor,
        forget=forgotten.extend,
    )
    run.start_round(0)
    assert run.round_values(0)["c"] == 5
    run.complete_round(0)
    run.start_round(1)
    assert forgotten == [0]
    values = run.round_values(1)
    assert values["c"] == 7
    assert values["d"] == DistributionValue(count=2, sum=3.0, min=1.0, max=2.0)
    run.complete_round(1)
    assert run.finish()["c"] == MetricResult(kind="counter", committed=12, attempted=12)


def test_metrics_declared_before_a_run_belong_to_it() -> None:
    registry = fresh()
    registry.get("errors", "counter")
    run = registry.begin_run(iteration="it", run_id="r1")
    run.start_round(0)
    run.complete_round(0)
    assert run.finish() == {"errors": MetricResult(kind="counter", committed=0, attempted=0)}
    registry.end_run(run)
    # The next run starts without it unless it is declared or updated again.
    later = registry.begin_run(iteration="it", run_id="r2")
    assert later.finish() == {}


def test_snapshot_reports_the_last_completed_epoch() -> None:
    registry = fresh()
    run = registry.begin_run(iteration="it", run_id="r1")
    assert run.snapshot(False).epoch is None
    run.start_round(0)
    registry.get("c", "counter").inc(4)  # type: ignore[attr-defined]
    run.complete_round(0)
    snapshot = run.snapshot(True)
    assert (snapshot.epoch, snapshot.final, snapshot.iteration) == (0, True, "it")
    assert snapshot.to_dict()["metrics"] == {
        "c": {"kind": "counter", "committed": 4, "attempted": 4}
    }


def test_pickling_without_a_spark_bridge_is_a_clear_error() -> None:
    with pytest.raises(IterflowError, match="cannot travel to executors"):
        pickle.dumps(fresh().get("c", "counter"))
