"""Resident rounds on local-cluster[3,2,1024]: three executor JVMs of two cores, six task
slots, three resident tasks (``local[2]`` has one, which hides what several do). Run in a
child process (one SparkContext per process) by tests/cluster_resident_job.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from child_jobs import run_job

# A local-cluster session of 1.5 minutes: the slow tier; CI keeps the standalone cluster's job.
pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow_spark]

JOB = Path(__file__).with_name("cluster_resident_job.py")
BIG, SMALL = 600_000, 1_000
ROWS = BIG + 7 * SMALL
#: The sum of x: partitions 0-2 and 4-7 hold 1,000 rows from p * 1,000; partition 3 holds
#: 600,000 from 10,000.
SMALL_TOTAL = float(sum(sum(range(p * SMALL, (p + 1) * SMALL)) for p in (0, 1, 2, 4, 5, 6, 7)))
TOTAL = SMALL_TOTAL + sum(range(10 * SMALL, 10 * SMALL + BIG))


@pytest.fixture(scope="module")
def cluster() -> dict:  # type: ignore[type-arg]
    return run_job(JOB, "local-cluster[3,2,1024]", timeout=1500)


def test_a_skewed_partition_is_held_whole_and_every_row_reaches_the_kernels(cluster) -> None:
    """One 4.8 MB partition among eight, 12m per executor: more than an even share of the
    tasks' bytes, within its executor's budget. Every round's kernels see all 607,000 rows."""
    skewed = cluster["skewed"]
    assert cluster["partitions"] == 8 and skewed["tasks"] == 3
    # one task stays on each executor and runs kernels on both its cores; the load ran on
    # all six slots, three tasks handing their partitions over on their own host
    assert skewed["executors"] == 3 and skewed["processes"] == 2 and skewed["launched"] == 6
    assert skewed["resident"] == [True] * 3
    assert skewed["kernel_rows"] == [ROWS] * 3
    assert skewed["rows"] == ROWS and skewed["total"] == TOTAL


def test_data_over_an_executors_budget_falls_back_whole_or_is_refused_by_name(cluster) -> None:
    over = cluster["over_budget"]
    assert over["resident"] == [False] * 3 and over["tasks"] == 0
    assert over["kernel_rows"] == [ROWS] * 3 and over["total"] == TOTAL
    assert any("maxBytesPerExecutor=2097152" in message for message in over["warnings"])
    refused = cluster["over_budget_on"]
    assert refused is not None
    assert "spark.iterflow.resident=on" in refused and "maxBytesPerExecutor" in refused


def test_a_run_nested_in_a_resident_round_finishes_within_the_slot_policy(cluster) -> None:
    nested = cluster["nested"]
    assert "deadlock" not in nested
    assert nested["resident"] == [True] * 3 and nested["tasks"] == 3
    # The nested run's kernels count toward the outer round they ran in (2 rounds of 7,000).
    assert nested["kernel_rows"] == [ROWS, ROWS + 2 * 7 * SMALL, ROWS]
    (inner,) = nested["inner"]
    # The outer run holds 3 of the 6 slots: half, so the nested run holds none.
    assert inner["resident"] == [False] * 2 and inner["kernel_rows"] == [7 * SMALL] * 2
    assert inner["total"] == SMALL_TOTAL


def test_runs_on_two_threads_hold_at_most_half_the_slots_together(cluster) -> None:
    threads = cluster["threads"]
    assert "deadlock" not in threads
    whole, small = threads
    assert whole["kernel_rows"] == [ROWS] * 4 and small["kernel_rows"] == [7 * SMALL] * 4
    assert whole["total"] == TOTAL and small["total"] == SMALL_TOTAL
    assert whole["tasks"] + small["tasks"] <= 3
    assert (whole["tasks"] == 0) != (small["tasks"] == 0)  # one resident, one not


def test_a_kernel_argument_is_pickled_once_for_all_resident_tasks(cluster) -> None:
    large = cluster["large_argument"]
    assert large["resident"] is True
    assert large["acc"] == ROWS + 8 * float(sum(range(10)))  # one row per partition
    assert large["large_pickles"] == 1


def test_a_killed_resident_task_is_relaunched_and_every_round_counts_every_row(cluster) -> None:
    killed = cluster["killed"]
    assert killed["killed"] and cluster["driver_pid"] not in killed["killed"]
    assert killed["launches"] == 2 and killed["tasks"] == 3
    assert killed["resident"] == [True] * 4
    assert killed["kernel_rows"] == [ROWS] * 4 and killed["rows"] == ROWS
