"""The block path of ``iterflow.graph`` never brings vertex state to the driver: a graph
job runs under a 1 MiB cap on what any Spark action may collect
(``spark.driver.maxResultSize``) with a 1g driver, where the vector path fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from child_jobs import run_job

JOB = Path(__file__).parent / "graph_memory_job.py"


def check(result: dict, vertices: int) -> None:
    assert "bigger than spark.driver.maxResultSize" in result["arrow"], result["arrow"]
    ranks = result["pagerank"]
    assert ranks["n"] == vertices
    assert ranks["error"] < 1e-12
    assert ranks["total"] == pytest.approx(1.0, abs=1e-9)
    assert result["components"] == {"n": vertices, "wrong": 0}


@pytest.mark.slow_spark  # two driver JVMs with a memory cap, a minute
def test_block_path_runs_under_a_driver_cap_the_vector_path_breaks(tmp_path):
    check(run_job(JOB, "140000", "560000", "3", str(tmp_path)), 140_000)


@pytest.mark.slow_spark
def test_two_million_vertices_under_a_one_megabyte_driver_cap(tmp_path):
    check(run_job(JOB, "2000000", "10000000", "10", str(tmp_path), timeout=3600), 2_000_000)
