"""SIGKILL a checkpointed run in a child process, run it again: it resumes and ends with
exactly the result of an uninterrupted run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from checkpoint_kill_job import EVERY, ROUNDS, VERTICES, path_ids
from child_jobs import kill_when, run_to_end

from iterflow.progress.event_log import read_events
from iterflow.runtime.checkpoint.lease import LEASE

# A minute of child processes: CI keeps test_iteration_kill and test_unbounded_kill.
pytestmark = [pytest.mark.spark, pytest.mark.slow_spark]

JOB = Path(__file__).with_name("checkpoint_kill_job.py")


def reference_labels() -> list[tuple[int, int]]:
    """After k rounds of min-label propagation a vertex holds the least id within k hops."""
    ids = path_ids()
    return sorted((ids[p], min(ids[max(0, p - ROUNDS) : p + ROUNDS + 1])) for p in range(VERTICES))


def command(tmp_path: Path) -> list[str]:
    return [
        sys.executable,
        str(JOB),
        str(tmp_path / "ckpt"),
        str(tmp_path / "events.jsonl"),
        str(tmp_path / "out.json"),
    ]


def test_a_killed_run_resumes_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    job = command(tmp_path)
    marker = tmp_path / "ckpt" / "epoch-00000007" / "_COMMITTED"
    kill_when(job, marker.exists)
    assert not (tmp_path / "out.json").exists()
    # The killed run's lease is left behind; the run again takes it over, its process gone.
    lease = tmp_path / "ckpt" / LEASE
    assert json.loads(lease.read_text())["pid"] not in (None, os.getpid())
    killed = read_events(tmp_path / "events.jsonl")
    done_before_kill = [e["epoch"] for e in killed if e["event"] == "round_end"]
    assert killed[-1]["event"] == "round_end"  # no final event: the process died

    run_to_end(job)
    assert not lease.exists()  # given back when the run ended
    out = json.loads((tmp_path / "out.json").read_text())
    assert [tuple(pair) for pair in out["labels"]] == reference_labels()
    assert out["rounds"] == ROUNDS
    assert out["history_epochs"] == list(range(ROUNDS))
    resumed_from = out["resumed_from"]
    assert resumed_from is not None and resumed_from >= 7
    # Rounds that had run before the kill and ran again: at most checkpoint_every, plus
    # the round whose write was pending.
    recomputed = max(done_before_kill) - resumed_from
    assert 0 <= recomputed <= EVERY + 1
    # The listener's state_dict and ctx.state were restored: both count every round.
    assert out["listener_rounds"] == ROUNDS
    assert out["state_rounds"] == ROUNDS
    resumed = read_events(tmp_path / "events.jsonl")
    assert resumed[0]["resumed_from"] == resumed_from
    assert [e["epoch"] for e in resumed if e["event"] == "round_end"] == list(
        range(resumed_from + 1, ROUNDS)
    )
