"""SIGKILL a checkpointed run in a child process, run it again: it resumes and ends with
exactly the result of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkpoint_kill_job import EVERY, ROUNDS, VERTICES, path_ids

from iterflow.progress.events import read_events

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("checkpoint_kill_job.py")


def reference_labels() -> list[tuple[int, int]]:
    """After k rounds of min-label propagation a vertex holds the least id within k hops."""
    ids = path_ids()
    return sorted((ids[p], min(ids[max(0, p - ROUNDS) : p + ROUNDS + 1])) for p in range(VERTICES))


def start(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    command = [
        sys.executable,
        str(JOB),
        str(tmp_path / "ckpt"),
        str(tmp_path / "events.jsonl"),
        str(tmp_path / "out.json"),
    ]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return command, env


def test_a_killed_run_resumes_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    command, env = start(tmp_path)
    marker = tmp_path / "ckpt" / "epoch-00000007" / "_COMMITTED"
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert child.poll() is None, "the run ended before it could be killed"
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.stderr is not None
    child.stderr.close()
    assert not (tmp_path / "out.json").exists()
    killed = read_events(tmp_path / "events.jsonl")
    done_before_kill = [e["epoch"] for e in killed if e["event"] == "round_end"]
    assert killed[-1]["event"] == "round_end"  # no final event: the process died

    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
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
