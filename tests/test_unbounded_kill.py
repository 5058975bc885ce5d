"""SIGKILL an unbounded iteration mid-stream in a child process, start it again on the same
checkpoint location: the file sinks hold exactly the rows of an uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from child_jobs import epoch_committed, job_command, kill_when, run_to_end
from test_unbounded import write_numbers

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("unbounded_kill_job.py")
#: File f holds 100 * f, 100 * f + 1, ...: a number names its file.
FILES = [[100 * f + j for j in range(f % 3 + 1)] for f in range(16)]


def assert_each_row_once(spark, sinks: Path, files: list[list[int]]) -> list[tuple[int, int]]:
    """The sinks of unbounded_kill_job.py hold every number once, in epochs that take whole
    files in order, and each epoch's running total is the sum of every number up to it.
    Returns the totals by epoch.

    An epoch takes one file (maxFilesPerTrigger=1), except where the kill fell between the
    file source's log and Spark's offset log: Spark then plans the next micro-batch over both
    files, as Structured Streaming does for any query, and the epoch it starts takes both."""
    rows = spark.read.parquet(str(sinks / "numbers")).collect()
    numbers = sorted((r["epoch"], r["x"]) for r in rows)
    assert sorted(x for _, x in numbers) == sorted(x for f in files for x in f)
    taken: dict[int, set[int]] = {}
    for epoch, x in numbers:
        taken.setdefault(epoch, set()).add(x // 100)
    assert sorted(taken) == list(range(len(taken)))
    assert [f for e in sorted(taken) for f in sorted(taken[e])] == list(range(len(files)))
    expected, running = [], 0
    for epoch in sorted(taken):
        running += sum(x for e, x in numbers if e == epoch)
        expected.append((epoch, running))
    totals = spark.read.parquet(str(sinks / "total")).collect()
    assert sorted((r["epoch"], r["total"]) for r in totals) == expected
    return expected


@pytest.mark.slow_spark  # a minute of kill and restart; CI keeps test_checkpoint_kill
def test_a_killed_stream_restarts_without_losing_or_duplicating_a_row(spark, tmp_path: Path):
    write_numbers(tmp_path / "in", FILES)
    command = job_command(JOB, tmp_path)
    # Into the next epoch's work after epoch 4 or later committed.
    kill_when(command, epoch_committed(tmp_path / "ckpt", 4), after_s=0.15)
    assert not (tmp_path / "out.json").exists()

    run_to_end(command)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["termination"] == "inputs_ended"
    totals = assert_each_row_once(spark, tmp_path / "sinks", FILES)
    resumed_from = out["resumed_from"]
    assert resumed_from is not None and 4 <= resumed_from < len(totals) - 1
    # The restarted process ran exactly the epochs after the commit it resumed from.
    assert [tuple(t) for t in out["totals"]] == totals[resumed_from + 1 :]
    # ctx.state survived the kill: it counted every epoch once.
    assert out["epochs_counted"] == len(totals)
