"""On local-cluster[2,1,1024] (separate executor JVMs and Python workers), a bounded
iteration with a numpy UDF, a metric, checkpoints and a resume gives what it gives on
local[2], and what numpy says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child_jobs import run_job
from resume_cluster_job import ROWS

# Each starts a local cluster of its own: with the slow tests (`bash run.sh test --slow`);
# CI keeps test_cluster_resident.py and the secured standalone job of test_cluster_standalone.py.
pytestmark = [pytest.mark.spark, pytest.mark.slow_spark, pytest.mark.cluster]

JOB = Path(__file__).with_name("resume_cluster_job.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {
        master: run_job(JOB, master, str(tmp_path_factory.mktemp("checkpoints")))
        for master in ("local-cluster[2,1,1024]", "local[2]")
    }


def test_resume_on_two_executors_equals_local_and_numpy(runs: dict[str, dict[str, Any]]) -> None:
    cluster, local = runs["local-cluster[2,1,1024]"], runs["local[2]"]
    # v <- v / 2 + sqrt(i), 8 times from v = 1.
    i = np.arange(ROWS, dtype=np.float64)
    expected = np.ones(ROWS)
    for _ in range(8):
        expected = 0.5 * expected + np.sqrt(i)
    for run in (cluster, local):
        assert run["first_rounds"] == 4 and run["resumed_from"] == 3 and run["rounds"] == 8
        assert run["epochs"] == list(range(8))  # the history of both runs, restored
        np.testing.assert_allclose(run["values"], expected, rtol=1e-12)
        # The UDF saw every row once per round, counted on the executors; the first
        # run's rounds come back with the checkpoint.
        assert run["rows_seen_per_round"] == [ROWS] * 8
        assert run["rows_seen_total"] == 8 * ROWS
    assert cluster["values"] == local["values"]
    assert len(cluster["worker_pids"]) >= 2 and cluster["driver_pid"] not in cluster["worker_pids"]
