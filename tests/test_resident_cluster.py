"""Resident rounds on local-cluster[2,1,1024] (executor JVMs of their own): a body that
mixes a resident kernel with a join and durable checkpoint writes does not deadlock, a
killed resident worker is relaunched and its round recomputed, and PageRank on resident
edges equals networkx (run in a child process: one SparkContext per process)."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest
from child_jobs import run_job

# Starts a local cluster of its own: with the slow tests (`bash run.sh test --slow`);
# CI keeps test_cluster_resident.py and the secured standalone job of test_cluster_standalone.py.
pytestmark = [pytest.mark.spark, pytest.mark.slow_spark, pytest.mark.cluster]

JOB = Path(__file__).with_name("resident_cluster_job.py")
ROWS = 3_000


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> dict:  # type: ignore[type-arg]
    return run_job(JOB, "local-cluster[2,1,1024]", str(tmp_path_factory.mktemp("ck")))


def test_a_mixed_body_runs_resident_and_equals_the_job_path(cluster_run: dict) -> None:  # type: ignore[type-arg]
    resident, jobs = cluster_run["uninterrupted"], cluster_run["jobs"]
    assert resident["resident"] == [True] * 5 and jobs["resident"] == [False] * 5
    assert resident["reason"] == jobs["reason"] == "criteria_empty"
    assert resident["acc"] == jobs["acc"]  # the same partial sums, in the same order
    assert resident["values"] == jobs["values"] == [ROWS] * 5  # counted on the executors
    assert resident["values_committed"] == 5 * ROWS


def test_a_killed_resident_worker_is_relaunched_and_the_result_is_unchanged(
    cluster_run: dict,  # type: ignore[type-arg]
) -> None:
    killed, uninterrupted = cluster_run["killed"], cluster_run["uninterrupted"]
    assert killed["killed"] and cluster_run["driver_pid"] not in killed["killed"]
    assert killed["launches"] == 2 and uninterrupted["launches"] == 1
    assert killed["acc"] == uninterrupted["acc"]
    assert killed["resident"] == [True] * 5
    # The abandoned call's metric updates were dropped: every round counts once.
    assert killed["values"] == [ROWS] * 5 and killed["values_committed"] == 5 * ROWS


def test_pagerank_on_resident_edges_equals_networkx(cluster_run: dict) -> None:  # type: ignore[type-arg]
    g = nx.DiGraph()
    g.add_nodes_from(range(500))
    g.add_edges_from(map(tuple, cluster_run["edges"]))
    expected = nx.pagerank(g, alpha=0.85, tol=1e-12)
    got = {int(k): v for k, v in cluster_run["pagerank"].items()}
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-8
