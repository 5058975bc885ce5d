"""SIGKILL an unbounded iteration mid-stream in a child process, start it again on the same
checkpoint location: the file sinks hold exactly the rows of an uninterrupted run."""

from __future__ import annotations

import json
from itertools import accumulate
from pathlib import Path

import pytest
from child_jobs import epoch_committed, job_command, kill_when, run_to_end
from test_unbounded import write_numbers

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("unbounded_kill_job.py")
FILES = [[100 * f + j for j in range(f % 3 + 1)] for f in range(16)]


def test_a_killed_stream_restarts_without_losing_or_duplicating_a_row(spark, tmp_path: Path):
    write_numbers(tmp_path / "in", FILES)
    command = job_command(JOB, tmp_path)
    # Into the next epoch's work after epoch 4 or later committed.
    kill_when(command, epoch_committed(tmp_path / "ckpt", 4), after_s=0.15)
    assert not (tmp_path / "out.json").exists()

    run_to_end(command)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["termination"] == "inputs_ended"
    resumed_from = out["resumed_from"]
    assert resumed_from is not None and 4 <= resumed_from < len(FILES) - 1

    # An uninterrupted run: epoch i takes file i, and its total is the sum of files 0..i.
    expected_totals = list(enumerate(accumulate(sum(f) for f in FILES)))
    # The restarted process ran exactly the epochs after the commit it resumed from.
    assert [tuple(t) for t in out["totals"]] == expected_totals[resumed_from + 1 :]
    # ctx.state survived the kill: it counted every epoch once.
    assert out["epochs_counted"] == len(FILES)

    sinks = tmp_path / "sinks"
    totals = spark.read.parquet(str(sinks / "total")).collect()
    assert sorted((r["epoch"], r["total"]) for r in totals) == expected_totals
    numbers = spark.read.parquet(str(sinks / "numbers")).collect()
    expected_numbers = sorted((e, x) for e, f in enumerate(FILES) for x in f)
    assert sorted((r["epoch"], r["x"]) for r in numbers) == expected_numbers
