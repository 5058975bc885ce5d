"""The model exchange along the tree of resident tasks on local clusters of 1, 3 and 6
executors (one resident task each): the driver's bytes per round (counted by its data
plane) are the model and the result, whatever the number of tasks, where through the
driver they grow with it; every round's result is the same to the bit on every cluster
and either way. Run in child processes by tests/cluster_exchange_job.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from child_jobs import run_job

# Three local clusters of a minute or more each: the slow tier.
pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow_spark]

JOB = Path(__file__).with_name("cluster_exchange_job.py")
#: The model and one accumulator, pickled: 250,000 doubles each.
MODEL_BYTES = 2_000_000
PARTITIONS = 12


@pytest.fixture(scope="module")
def runs() -> dict[int, dict]:  # type: ignore[type-arg]
    return {
        executors: run_job(JOB, f"local-cluster[{executors},2,1024]", str(executors), timeout=900)
        for executors in (1, 3, 6)
    }


def test_the_drivers_bytes_per_round_are_flat_in_the_task_count(runs) -> None:
    flat = []
    for executors, out in runs.items():
        tree, driver = out["tree"], out["driver"]
        assert tree["tasks"] == driver["tasks"] == executors
        assert tree["tree"] == [True] * 4 and driver["tree"] == [False] * 4
        assert tree["resident"] == driver["resident"] == [True] * 4
        # along the tree: the model out to the root, the merged result back
        for per_round in tree["bytes_per_round"]:
            assert 2 * MODEL_BYTES < per_round < 2 * MODEL_BYTES + 20_000
            flat.append(per_round)
        # through the driver: the model to every task, every partition's accumulator back
        for through in driver["bytes_per_round"]:
            assert through > (executors + PARTITIONS) * MODEL_BYTES
    assert max(flat) - min(flat) < 5_000  # a few header (and progress) bytes per task


def test_every_round_gives_the_same_result_on_every_cluster_and_either_way(runs) -> None:
    digests = {tuple(out[way]["digests"]) for out in runs.values() for way in ("tree", "driver")}
    assert len(digests) == 1 and len(next(iter(digests))) == 4
