"""SIGKILL a bounded run with output sinks, and one with nested iterations, in a child
process; run it again: every sink epoch is written exactly once, and the nested run
resumes at the outer round, equal to its reference."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from child_jobs import kill_when, run_to_end
from iteration_kill_job import NESTED_EVERY, NESTED_ROUNDS, SINK_ROUNDS, sink_rows
from pyspark.sql import SparkSession

from iterflow.progress.event_log import read_events

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("iteration_kill_job.py")


def kill_and_resume(mode: str, work: Path, ready: Callable[[], bool]) -> None:
    """Start the job, SIGKILL it once ``ready()`` holds, then run it again to the end."""
    job = [sys.executable, str(JOB), mode, str(work)]
    kill_when(job, ready)
    assert not (work / "result.json").exists()
    run_to_end(job)


@pytest.mark.slow_spark  # a kill-and-resume job of a minute; CI keeps test_checkpoint_kill
def test_a_killed_run_resumes_with_every_sink_epoch_written_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    # Killed after epoch 12's checkpoint, once epochs past it reached the sink.
    kill_and_resume(
        "sink",
        tmp_path,
        lambda: (
            (tmp_path / "ckpt" / "epoch-00000012" / "_COMMITTED").exists()
            and (out / "epoch=14" / "_SUCCESS").exists()
        ),
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"rounds": SINK_ROUNDS, "resumed_from": 12}
    epochs = sorted(p.name for p in out.iterdir() if p.name.startswith("epoch="))
    assert epochs == sorted(f"epoch={k}" for k in range(SINK_ROUNDS))
    rows = sorted((r["epoch"], r["id"], r["v"]) for r in spark.read.parquet(str(out)).collect())
    assert rows == sink_rows(SINK_ROUNDS)  # each epoch once, as an uninterrupted run


@pytest.mark.slow_spark  # a second kill-and-resume job; CI keeps the others
def test_a_kill_inside_a_nested_run_resumes_at_the_outer_round(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    interrupted = 4  # an outer round after the checkpoint of epoch 3

    def inside_inner_run() -> bool:
        if not (tmp_path / "ckpt" / "epoch-00000003" / "_COMMITTED").exists():
            return False
        lines = log.read_text().splitlines()[:-1]  # the last may be half written
        events = [json.loads(line) for line in lines if line]
        return any(
            e["event"] == "round_end"
            and e["epoch_path"][:1] == [interrupted]
            and len(e["epoch_path"]) == 2
            for e in events
        )

    kill_and_resume("nested", tmp_path, inside_inner_run)
    result = json.loads((tmp_path / "result.json").read_text())
    np.testing.assert_allclose(result["w"], result["reference"], rtol=1e-9, atol=1e-12)
    assert result["rounds"] == NESTED_ROUNDS
    assert result["resumed_from"] == interrupted - 1
    assert result["history_paths"] == [[k] for k in range(NESTED_ROUNDS)]
    assert (interrupted - 1 + 1) % NESTED_EVERY == 0  # epoch 3 was a checkpoint
    # The resumed run ran the interrupted inner iteration again, from its inner round 0.
    resumed = read_events(log)
    (start,) = [e for e in resumed if e["event"] == "iteration_started" and not e["parent_run_id"]]
    assert start["resumed_from"] == interrupted - 1
    nested = [tuple(e["epoch_path"]) for e in resumed if e["event"] == "round_end"]
    assert nested[0] == (interrupted, 0)
    assert {path[0] for path in nested} == set(range(interrupted, NESTED_ROUNDS))
