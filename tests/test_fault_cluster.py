"""Executor and worker faults on local-cluster[2,1,1024] (executor JVMs and Python
workers of their own), each run compared with an uninterrupted run of the same job.

Bounded runs (tests/fault_cluster_job.py): executors killed between rounds roll back to
the last durable checkpoint, and the rollback is recorded (``IterationResult.rollbacks``,
``RoundProgress.rollback``, the event log and ``iterflow report``); without
``checkpoint_dir`` the error names the lost blocks and executors; a killed Python
worker or a task failing once is retried by Spark, with metrics counted exactly once;
losses Spark can recompute from lineage (cached inputs, shuffle outputs, resident data,
rows held on the driver) finish without a rollback. Unbounded runs
(tests/unbounded_fault_cluster_job.py): the file sinks hold every row exactly once after
Spark's retries or a restart.

The default run covers one workload (a numpy-kernel PageRank-like body); the rest are
``slow_spark`` (``bash run.sh test --slow``).
"""

from __future__ import annotations

import re
from itertools import accumulate
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
from child_jobs import run_job
from fault_cluster_job import EDGES, ROUNDS
from test_unbounded import write_numbers

from iterflow.progress.event_log import read_events
from iterflow.progress.table import format_report

# Starts a local cluster of its own: with the cluster tier (`bash run.sh test --cluster`) and
# the slow tests; CI keeps test_cluster_resident.py and the secured standalone job.
pytestmark = [pytest.mark.spark, pytest.mark.slow_spark, pytest.mark.cluster]

CLUSTER = "local-cluster[2,1,1024]"
BOUNDED_JOB = Path(__file__).with_name("fault_cluster_job.py")
UNBOUNDED_JOB = Path(__file__).with_name("unbounded_fault_cluster_job.py")
#: The fault's round, and the durable checkpoint before it (checkpoint_every=3: 2, 5, 8...).
FAULT_EPOCH, DURABLE_BEFORE = 7, 5
BLOCK = re.compile(r"^rdd_\d+_\d+$")


def bounded_runs(tmp_path_factory: pytest.TempPathFactory, *cases: str) -> dict[str, Any]:
    folder = str(tmp_path_factory.mktemp("faults"))
    return run_job(BOUNDED_JOB, CLUSTER, folder, *cases, timeout=600 * len(cases))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return bounded_runs(
        tmp_path_factory,
        "kernel:none",
        "kernel:executors",
        "kernel:worker",
        "kernel:executors:7:nockpt",
    )


def same_values(run: dict[str, Any], reference: dict[str, Any], rtol: float = 1e-12) -> None:
    assert run["error"] is None, run["error"]
    assert run["rounds"] == reference["rounds"]
    assert run["epochs"] == list(range(reference["rounds"]))
    np.testing.assert_allclose(run["values"], reference["values"], rtol=rtol, atol=0)


def check_rollback(run: dict[str, Any], failed_epoch: int, to_epoch: int) -> None:
    """One rollback, from ``failed_epoch`` to the checkpoint of ``to_epoch``, recorded on
    the result, on the round run first after it, in the event log and in the report."""
    (rollback,) = run["rollbacks"]
    assert rollback["failed_epoch"] == failed_epoch and rollback["to_epoch"] == to_epoch
    assert rollback["rounds_recomputed"] == failed_epoch - to_epoch - 1
    assert rollback["lost_blocks"] and all(BLOCK.match(b) for b in rollback["lost_blocks"])
    assert rollback["lost_executors"], "the killed executors are named"
    assert run["rollback_rounds"] == [to_epoch + 1]
    events = read_events(run["event_log"])
    (logged,) = [e for e in events if e["event"] == "rolled_back"]
    assert logged["to_epoch"] == to_epoch and logged["failed_epoch"] == failed_epoch
    assert logged["lost_blocks"] == rollback["lost_blocks"]
    report = format_report(events)
    assert f"rolled back: epoch {failed_epoch} lost block" in report
    assert f"checkpoint of epoch {to_epoch}, {failed_epoch - to_epoch - 1} completed" in report
    assert any(f"durable checkpoint of epoch {to_epoch}" in w for w in run["warnings"])


def test_executors_killed_between_rounds_roll_back_and_end_as_an_uninterrupted_run(
    kernel: dict[str, Any],
) -> None:
    killed, uninterrupted = kernel["kernel:executors"], kernel["kernel:none"]
    assert killed["fault_ran"] and len(killed["killed"]) == 2
    same_values(killed, uninterrupted)
    check_rollback(killed, FAULT_EPOCH + 1, DURABLE_BEFORE)
    assert uninterrupted["rollbacks"] == [] and uninterrupted["rollback_rounds"] == []
    # Rounds run again count once: committed metrics are those of an uninterrupted run.
    assert killed["rows_seen"] == [EDGES] * ROUNDS
    assert killed["rows_seen_committed"] == uninterrupted["rows_seen_committed"] == ROUNDS * EDGES


def test_a_killed_python_worker_is_retried_and_counted_once(kernel: dict[str, Any]) -> None:
    killed, uninterrupted = kernel["kernel:worker"], kernel["kernel:none"]
    assert killed["fault_ran"]
    same_values(killed, uninterrupted)
    assert killed["rollbacks"] == []
    assert killed["rows_seen"] == [EDGES] * ROUNDS
    assert killed["rows_seen_committed"] == ROUNDS * EDGES


def test_without_checkpoint_dir_the_error_names_the_lost_blocks_and_executors(
    kernel: dict[str, Any],
) -> None:
    failed = kernel["kernel:executors:7:nockpt"]
    assert failed["fault_ran"] and failed["error_type"] == "IterflowError"
    error = failed["error"]
    assert error.startswith(f"epoch {FAULT_EPOCH + 1}: block")
    assert re.search(r"rdd_\d+_\d+", error), error
    assert re.search(r"executors? \d+ at \S+ .*(was|were) lost", error), error
    assert "Run with checkpoint_dir=" in error


#: The slow cases, a job (one local cluster) per group.
SLOW_CASES = {
    "kernel": ("kernel:none", "kernel:executor-mid", "kernel:task", "kernel:executor"),
    "pagerank": (
        "pagerank-arrow:none",
        "pagerank-arrow:executors",
        "pagerank-dataframe:none",
        "pagerank-dataframe:executors",
    ),
    "ml-pregel": ("kmeans:none", "kmeans:executors", "pregel:none", "pregel:executors:3"),
}


@pytest.fixture(scope="module")
def others(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The slow cases' runs by case, each group's job run when a test first needs it."""
    done: dict[str, Any] = {}

    class Runs:
        def __getitem__(self, case: str) -> Any:
            group = next(g for g, cases in SLOW_CASES.items() if case in cases)
            if group not in done:
                done[group] = bounded_runs(tmp_path_factory, *SLOW_CASES[group])
            return done[group][case]

    return Runs()


@pytest.mark.slow_spark
def test_an_executor_killed_by_its_own_task_mid_round_is_recomputed_without_rollback(
    others: Any,
) -> None:
    # The round's previous-round input is broadcast before the kernel's stage runs, so
    # what the executor held then (cached edges, shuffle outputs) is all recomputable.
    killed = others["kernel:executor-mid"]
    assert killed["fault_ran"]
    same_values(killed, others["kernel:none"])
    assert killed["rollbacks"] == []
    assert killed["rows_seen"][FAULT_EPOCH] >= EDGES  # a re-run stage may count again


@pytest.mark.slow_spark
def test_a_task_failing_once_is_retried_and_counted_once(others: Any) -> None:
    failed = others["kernel:task"]
    assert failed["fault_ran"]
    same_values(failed, others["kernel:none"])
    assert failed["rollbacks"] == [] and failed["rows_seen_committed"] == ROUNDS * EDGES


@pytest.mark.slow_spark
def test_one_executor_killed_between_rounds_ends_as_an_uninterrupted_run(
    others: Any,
) -> None:
    killed = others["kernel:executor"]
    assert killed["fault_ran"] and len(killed["killed"]) == 1
    same_values(killed, others["kernel:none"])
    # Whether the one executor held blocks of the variable is up to Spark's scheduling:
    # a rollback, if any, is the one a lost block calls for.
    if killed["rollbacks"]:
        check_rollback(killed, FAULT_EPOCH + 1, DURABLE_BEFORE)
    assert killed["rows_seen_committed"] == ROUNDS * EDGES


@pytest.mark.slow_spark
def test_pagerank_on_the_dataframe_path_rolls_back(others: Any) -> None:
    killed = others["pagerank-dataframe:executors"]
    same_values(killed, others["pagerank-dataframe:none"])
    check_rollback(killed, FAULT_EPOCH + 1, DURABLE_BEFORE)


@pytest.mark.slow_spark
@pytest.mark.parametrize("workload", ["pagerank-arrow", "kmeans"])
def test_resident_rounds_recompute_lost_executors_without_rollback(
    others: Any, workload: str
) -> None:
    # Their variable is held on the driver and their data resident in Python workers or
    # read from columnar files: an executor's loss costs a relaunch, never a rollback.
    killed = others[f"{workload}:executors"]
    assert killed["fault_ran"]
    same_values(killed, others[f"{workload}:none"])
    assert killed["rollbacks"] == [] and killed["rollback_rounds"] == []
    assert all(killed["resident"]) and all(others[f"{workload}:none"]["resident"])


@pytest.mark.slow_spark
def test_a_pregel_job_rolls_back_and_still_equals_networkx(others: Any) -> None:
    killed, uninterrupted = others["pregel:executors:3"], others["pregel:none"]
    same_values(killed, uninterrupted, rtol=0)
    check_rollback(killed, 4, 2)
    graph = nx.DiGraph()
    for src, dst, weight in uninterrupted["edges"]:
        if not graph.has_edge(src, dst) or graph[src][dst]["weight"] > weight:
            graph.add_edge(src, dst, weight=weight)
    expected = nx.single_source_dijkstra_path_length(graph, 0)
    values = killed["values"]
    assert {v: values[v] for v in range(len(values)) if values[v] != float("inf")} == expected


#: One file per epoch; file f holds f % 3 + 1 numbers.
FILES = [[100 * f + j for j in range(f % 3 + 1)] for f in range(12)]


def unbounded_run(tmp_path: Path, fault: str, epoch: int = 4) -> dict[str, Any]:
    write_numbers(tmp_path / "in", FILES)
    work = tmp_path / "work"
    work.mkdir()
    return run_job(UNBOUNDED_JOB, CLUSTER, str(tmp_path / "in"), str(work), fault, str(epoch))


@pytest.mark.slow_spark
@pytest.mark.parametrize("fault", ["executors", "executor-mid", "worker"])
def test_an_unbounded_query_writes_every_row_exactly_once_after_a_fault(
    tmp_path: Path, fault: str
) -> None:
    out = unbounded_run(tmp_path, fault)
    assert out["fault_ran"]
    assert out["starts"][-1]["error"] is None, out["starts"]
    expected_totals = list(enumerate(accumulate(sum(x * x for x in f) for f in FILES)))
    assert [tuple(t) for t in out["totals"]] == expected_totals
    expected = sorted((e, x, x * x) for e, f in enumerate(FILES) for x in f)
    assert [tuple(s) for s in out["squared"]] == expected
    if len(out["starts"]) > 1:  # the fault failed the query: the restart resumed it
        assert out["starts"][-1]["resumed_from"] is not None
