"""Commits off the loop's path (``start(commit_interval_s=...)``): written in the background at
most every interval, surfaced when they fail, and exactly once after a SIGKILL, because
Spark's own checkpoint is rewound to the last commit on a restart."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path

import pytest
from child_jobs import job_command, kill_when, run_to_end
from pyspark.sql import functions as F
from test_unbounded import numbers_stream, running_sum, write_numbers

import iterflow as itf
from iterflow.errors import IterflowError, IterflowValueError
from iterflow.runtime.checkpoint.format import load_driver_state
from iterflow.runtime.checkpoint.store import CheckpointStore
from iterflow.runtime.checkpoint.writer import CheckpointWriteError
from iterflow.unbounded import epoch_log
from iterflow.unbounded.rewind import rewind

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("unbounded_kill_job.py")
OFFSET_LOG_FORMAT = "spark.sql.streaming.offsetLog.formatVersion"
FILES = [[100 * f + j for j in range(f % 3 + 1)] for f in range(16)]


def spark_committed(stream: Path) -> int:
    """The last micro-batch Spark committed in its streaming checkpoint."""
    return max(
        (int(p.name) for p in (stream / "commits").iterdir() if p.name.isdigit()), default=-1
    )


def iterflow_committed(epochs: Path) -> int:
    """The micro-batch of the epoch log's last commit."""
    committed = sorted(p.parent for p in epochs.glob("epoch-*/_COMMITTED"))
    if not committed:
        return -1
    driver = load_driver_state((committed[-1] / "driver.pkl").read_bytes())
    return int(driver.stream.batch_id)


@pytest.mark.slow_spark  # a second kill-and-resume job; CI keeps the others
def test_a_killed_stream_with_background_commits_replays_what_spark_committed_after_them(
    spark, tmp_path: Path
):
    write_numbers(tmp_path / "in", FILES)
    command = job_command(JOB, tmp_path, "2")
    stream, epochs = tmp_path / "ckpt" / "stream", tmp_path / "ckpt" / "epochs"

    def spark_is_ahead() -> bool:
        committed = iterflow_committed(epochs) if list(epochs.glob("*/_COMMITTED")) else -1
        return committed >= 2 and spark_committed(stream) >= committed + 2

    kill_when(command, spark_is_ahead)
    assert not (tmp_path / "out.json").exists()
    at_kill = iterflow_committed(epochs)
    spark_at_kill = spark_committed(stream)
    # Spark committed micro-batches that the epoch log had not: they must be read again.
    assert spark_at_kill > at_kill

    run_to_end(command)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["termination"] == "inputs_ended"
    resumed_from = out["resumed_from"]
    assert resumed_from == at_kill  # one file per micro-batch, one micro-batch per epoch

    # An uninterrupted run: epoch i takes file i, and its total is the sum of files 0..i.
    expected_totals = list(enumerate(accumulate(sum(f) for f in FILES)))
    # The restart ran every epoch after the commit, those Spark had committed included.
    assert [tuple(t) for t in out["totals"]] == expected_totals[resumed_from + 1 :]
    assert out["epochs_counted"] == len(FILES)  # ctx.state counted every epoch once

    sinks = tmp_path / "sinks"
    totals = spark.read.parquet(str(sinks / "total")).collect()
    assert sorted((r["epoch"], r["total"]) for r in totals) == expected_totals
    numbers = spark.read.parquet(str(sinks / "numbers")).collect()
    assert sorted((r["epoch"], r["x"]) for r in numbers) == sorted(
        (e, x) for e, f in enumerate(FILES) for x in f
    )


def written_commits(monkeypatch) -> list[tuple[int, str]]:
    """(epoch, thread name) of every commit of the epoch log written from now on."""
    written: list[tuple[int, str]] = []
    original = epoch_log.write

    def recording(loop, taken):
        original(loop, taken)
        written.append((taken.epoch, threading.current_thread().name))

    monkeypatch.setattr(epoch_log, "write", recording)
    return written


def test_background_commits_are_rate_limited_and_stop_writes_the_last_epoch(
    spark, tmp_path, monkeypatch
):
    files = [[f] for f in range(8)]
    write_numbers(tmp_path / "in", files)
    written = written_commits(monkeypatch)
    ckpt = str(tmp_path / "ckpt")

    def started():
        return (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .start(checkpoint_location=ckpt, progress=False, commit_interval_s=600)
        )

    query = started()
    query.process_all_available()  # waits for its rows' epochs, not for their commit
    assert query.status["epoch"] == len(files) - 1
    query.stop()
    assert query.termination is not None and query.termination.reason == "stopped"
    # One commit in the background (the first due one), and stop() wrote the last epoch.
    assert [epoch for epoch, _ in written] == [0, len(files) - 1]
    assert written[0][1] == "iterflow-commit"
    assert written[1][1] != "iterflow-commit"
    assert query.status["committed_epoch"] == len(files) - 1
    assert not query.status["commit_in_flight"]

    again = started()
    assert again.resumed_from == len(files) - 1  # nothing to run again after a clean stop
    again.stop()


def test_background_commits_at_a_short_interval_are_fewer_than_epochs(spark, tmp_path, monkeypatch):
    files = [[f, 10 * f] for f in range(12)]
    write_numbers(tmp_path / "in", files)
    written = written_commits(monkeypatch)
    totals = EpochRows()
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .sink("total", totals)
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            progress=False,
            commit_interval_s=3,
        )
    )
    query.await_termination()
    epochs = [epoch for epoch, _ in written]
    assert totals.epochs == {e: [t] for e, t in enumerate(accumulate(sum(f) for f in files))}
    assert len(epochs) < len(files) and epochs == sorted(epochs)
    assert epochs[-1] == len(files) - 1  # the end of the inputs commits the last epoch
    assert query.status["committed_epoch"] == len(files) - 1


def test_a_failing_background_commit_fails_the_query(spark, tmp_path, monkeypatch):
    write_numbers(tmp_path / "in", [[f] for f in range(10)])
    original = CheckpointStore.write

    def failing(self, epoch, **kwargs):
        if epoch >= 2:
            raise OSError("disk full")
        return original(self, epoch, **kwargs)

    monkeypatch.setattr(CheckpointStore, "write", failing)
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            progress=False,
            commit_interval_s=0.01,
        )
    )
    with pytest.raises(CheckpointWriteError, match="disk full"):
        query.await_termination(timeout=120)
    assert isinstance(query.error, CheckpointWriteError)
    assert query.status["state"] == "failed"
    assert query.status["committed_epoch"] < 2


@pytest.mark.parametrize("value", [0, -1.5, "5", True, math.nan, math.inf])
def test_commit_interval_must_be_a_positive_number_of_seconds(spark, tmp_path, value):
    write_numbers(tmp_path / "in", [[1]])
    iteration = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
    )
    with pytest.raises(IterflowValueError, match="commit_interval_s"):
        iteration.start(checkpoint_location=str(tmp_path / "ckpt"), commit_interval_s=value)


def test_sources_that_cannot_replay_are_refused_with_background_commits(spark, tmp_path):
    socket = spark.readStream.format("socket").option("host", "localhost").option("port", 9)
    deleting = spark.readStream.schema("x long").option("cleanSource", "delete").json(str(tmp_path))
    for stream, named in ((socket.load(), "'socket'"), (deleting, "cleanSource='delete'")):
        iteration = (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", stream)
        )
        with pytest.raises(IterflowError, match=named):
            iteration.start(checkpoint_location=str(tmp_path / "ckpt"), commit_interval_s=1)


def delivered_batches(stream, location: Path) -> list[tuple[int, list[int]]]:
    """Run ``stream`` (a column ``x``) available-now with its checkpoint at ``location``:
    each micro-batch Spark delivered, with its values of ``x``."""
    batches: list[tuple[int, list[int]]] = []
    query = (
        stream.writeStream.foreachBatch(
            lambda df, b: batches.append((b, sorted(r["x"] for r in df.collect())))
        )
        .option("checkpointLocation", str(location))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return batches


def test_a_rewind_rebuilds_the_file_source_log_that_spark_compacted_and_cleaned(spark, tmp_path):
    files = [[f] for f in range(25)]
    write_numbers(tmp_path / "in", files)
    location = tmp_path / "stream"

    def delivered() -> list[tuple[int, list[int]]]:
        return delivered_batches(numbers_stream(spark, tmp_path / "in"), location)

    assert delivered() == [(b, [b]) for b in range(25)]
    log = location / "sources" / "0"
    assert {"9.compact", "19.compact"} <= set(os.listdir(log))
    # What Spark's cleanup leaves once it compacted micro-batch 19: that compaction on.
    for name in os.listdir(log):
        if int(name.strip(".").split(".")[0]) < 19:
            (log / name).unlink()
    assert rewind(spark, str(location), 15)
    assert spark_committed(location) == 15
    assert delivered() == [(b, [b]) for b in range(16, 25)]
    assert not rewind(spark, str(location), 24)  # Spark is not ahead: nothing to do


@contextmanager
def offset_log_format(spark, version: str) -> Iterator[None]:
    """Spark writes the offset logs of the streams started meanwhile in format ``version``."""
    spark.conf.set(OFFSET_LOG_FORMAT, version)
    try:
        yield
    finally:
        spark.conf.unset(OFFSET_LOG_FORMAT)


@itf.body
def summing(total, numbers):
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(
        feedback={"total": new_total}, outputs={"total": new_total, "numbers": numbers}
    )


@contextmanager
def commits_crash_after_epoch_0(monkeypatch) -> Iterator[None]:
    """Within: every commit of the epoch log after epoch 0 fails, as a crash before it was
    written would leave it, and the query fails with it (Spark has committed its
    micro-batches by then)."""
    written = epoch_log.write

    def crashing(loop, taken):
        if taken.epoch > 0:
            raise OSError("crashed")
        written(loop, taken)

    monkeypatch.setattr(epoch_log, "write", crashing)
    with pytest.raises(OSError, match="crashed"):
        yield
    monkeypatch.setattr(epoch_log, "write", written)


@pytest.mark.parametrize("version", [pytest.param("1", marks=pytest.mark.slow_spark), "2"])
def test_a_restart_after_spark_ran_ahead_of_the_epoch_log_is_exactly_once(
    spark, tmp_path, monkeypatch, version
):
    files = [[10 * f + j for j in range(f % 2 + 1)] for f in range(4)]
    write_numbers(tmp_path / "in", files)
    numbers = itf.FileSink(str(tmp_path / "numbers"))
    ckpt = tmp_path / "ckpt"

    def started() -> itf.UnboundedQuery:
        return (
            itf.UnboundedIteration(summing)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .sink("numbers", numbers)
            .start(
                checkpoint_location=str(ckpt),
                available_now=True,
                progress=False,
                commit_interval_s=600,  # the first commit only, until the end
            )
        )

    with offset_log_format(spark, version):
        with commits_crash_after_epoch_0(monkeypatch):
            started().await_termination(timeout=300)
        offsets = (ckpt / "stream" / "offsets" / "0").read_text()
        assert offsets.startswith(f"v{version}\n")
        # Spark committed every micro-batch; the epoch log holds epoch 0 (micro-batch 0).
        assert spark_committed(ckpt / "stream") == len(files) - 1
        assert iterflow_committed(ckpt / "epochs") == 0
        query = started()
        query.await_termination(timeout=300)
    assert query.resumed_from == 0
    # Epoch e took file e, once: as an uninterrupted run (one file per micro-batch).
    rows = numbers.read(spark).collect()
    assert sorted((r["epoch"], r["x"]) for r in rows) == sorted(
        (e, x) for e, f in enumerate(files) for x in f
    )


def test_an_offset_log_in_a_format_iterflow_cannot_read_is_refused_by_name(spark, tmp_path):
    write_numbers(tmp_path / "in", [[f] for f in range(3)])
    location = tmp_path / "stream"
    (
        numbers_stream(spark, tmp_path / "in")
        .writeStream.foreachBatch(lambda df, b: None)
        .option("checkpointLocation", str(location))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    latest = location / "offsets" / "2"
    latest.write_text("v9\n" + latest.read_text().split("\n", 1)[1])
    (location / "offsets" / ".2.crc").unlink()
    before = sorted(p.relative_to(location) for p in location.rglob("*"))
    with pytest.raises(IterflowError, match=f"'v9'.*{OFFSET_LOG_FORMAT}"):
        rewind(spark, str(location), 0)
    assert sorted(p.relative_to(location) for p in location.rglob("*")) == before
    iteration = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
    )
    (tmp_path / "ckpt").mkdir()
    location.rename(tmp_path / "ckpt" / "stream")
    with pytest.raises(IterflowError, match=f"'v9'.*{OFFSET_LOG_FORMAT}"):
        iteration.start(checkpoint_location=str(tmp_path / "ckpt"), commit_interval_s=1)


def test_a_rewind_puts_named_sources_back_by_their_ids_in_the_offset_map(spark, tmp_path):
    # Named sources need the v2 offset log (an OffsetMap); their logs are sources/<name>/.
    left, right = [[f] for f in range(4)], [[100 + f] for f in range(4)]
    write_numbers(tmp_path / "left", left)
    write_numbers(tmp_path / "right", right)
    location = tmp_path / "stream"

    def delivered() -> list[tuple[int, list[int]]]:
        reader = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1)
        both = (
            reader.name("right")
            .json(str(tmp_path / "right"))
            .unionByName(reader.name("left").json(str(tmp_path / "left")))
        )
        return delivered_batches(both, location)

    evolution = "spark.sql.streaming.queryEvolution.enableSourceEvolution"
    spark.conf.set(evolution, "true")
    try:
        with offset_log_format(spark, "2"):
            assert delivered() == [(b, [b, 100 + b]) for b in range(4)]
            assert sorted(os.listdir(location / "sources")) == ["left", "right"]
            assert rewind(spark, str(location), 1)
            assert spark_committed(location) == 1
            assert delivered() == [(b, [b, 100 + b]) for b in range(2, 4)]
    finally:
        spark.conf.unset(evolution)


class EpochRows:
    """A callable sink that keeps each epoch's values (its output's first column), and
    drops the epochs after one."""

    def __init__(self) -> None:
        self.epochs: dict[int, list[int]] = {}
        self.discarded: list[int] = []

    def __call__(self, df, epoch: int) -> None:
        self.epochs[epoch] = sorted(r[0] for r in df.collect())

    def discard_after(self, epoch: int) -> None:
        self.discarded.append(epoch)
        self.epochs = {e: rows for e, rows in self.epochs.items() if e <= epoch}


def test_a_callable_sink_drops_what_a_crashed_attempt_wrote_past_the_restart(
    spark, tmp_path, monkeypatch
):
    files = [[10 * f] for f in range(4)]
    write_numbers(tmp_path / "in", files)
    sink = EpochRows()

    def started(files_per_trigger: int) -> itf.UnboundedQuery:
        return (
            itf.UnboundedIteration(summing)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in", files_per_trigger))
            .sink("numbers", sink)
            .start(
                checkpoint_location=str(tmp_path / "ckpt"),
                available_now=True,
                progress=False,
                commit_interval_s=600,
            )
        )

    with commits_crash_after_epoch_0(monkeypatch):
        started(1).await_termination(timeout=300)
    assert sink.epochs == dict(enumerate(files))  # the epoch log holds epoch 0 only
    # Spark plans the micro-batches after the commit afresh: here as one, so the restart
    # runs one epoch where the crashed attempt ran three.
    query = started(len(files))
    query.await_termination(timeout=300)
    assert query.resumed_from == 0
    assert sink.discarded == [0]
    assert sink.epochs == {0: [0], 1: [10, 20, 30]}


def test_a_callable_sink_that_cannot_drop_epochs_is_refused_with_background_commits(
    spark, tmp_path
):
    write_numbers(tmp_path / "in", [[1]])
    iteration = (
        itf.UnboundedIteration(summing)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .sink("total", itf.FileSink(str(tmp_path / "total")))
        .sink("numbers", lambda df, epoch: None)
    )
    with pytest.raises(IterflowError, match=r"sink 'numbers' .*discard_after\(epoch\)"):
        iteration.start(checkpoint_location=str(tmp_path / "ckpt"), commit_interval_s=5)
    assert not (tmp_path / "ckpt").exists()  # refused before anything started
