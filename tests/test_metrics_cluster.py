"""Metrics updated inside mapInPandas and UDFs on separate executor JVMs, with task
retries, add up exactly (run in a child process: one SparkContext per process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from child_jobs import run_job

# Each starts a local cluster of its own: with the slow tests (`bash run.sh test --slow`);
# CI keeps test_cluster_resident.py and the secured standalone job of test_cluster_standalone.py.
pytestmark = [pytest.mark.spark, pytest.mark.slow_spark, pytest.mark.cluster]

JOB = Path(__file__).with_name("metrics_cluster_job.py")
ROUNDS, ROWS = 3, 1000


@pytest.fixture(scope="module")
def cluster_run() -> dict:  # type: ignore[type-arg]
    return run_job(JOB, timeout=600)


def test_the_updates_came_from_several_executor_processes(cluster_run: dict) -> None:  # type: ignore[type-arg]
    assert len(cluster_run["worker_pids"]) >= 2
    assert cluster_run["driver_pid"] not in cluster_run["worker_pids"]
    assert cluster_run["ids"] == list(range(ROWS))  # retried tasks gave the right result


def test_counters_add_up_exactly_across_processes_and_retries(cluster_run: dict) -> None:  # type: ignore[type-arg]
    expected_round = {"batch_rows": ROWS, "flaky_calls": ROWS, "first_attempt_failures": 0}
    assert cluster_run["per_round"] == [expected_round] * ROUNDS
    # Spark drops the updates of failed task attempts: retries change neither value.
    totals = cluster_run["totals"]
    assert totals["batch_rows"] == {"committed": ROUNDS * ROWS, "attempted": ROUNDS * ROWS}
    assert totals["flaky_calls"] == {"committed": ROUNDS * ROWS, "attempted": ROUNDS * ROWS}
    assert totals["first_attempt_failures"] == {"committed": 0, "attempted": 0}


def test_a_distribution_merges_exactly_across_processes(cluster_run: dict) -> None:  # type: ignore[type-arg]
    values = cluster_run["values"]["committed"]
    assert values["count"] == ROUNDS * ROWS
    assert values["sum"] == ROUNDS * sum(range(ROWS))
    assert (values["min"], values["max"]) == (0.0, ROWS - 1.0)
    assert values["mean"] == pytest.approx((ROWS - 1) / 2)
