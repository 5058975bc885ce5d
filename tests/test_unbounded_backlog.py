"""The backlog of an unbounded run per source: files behind, rates, drain time."""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

import iterflow as itf
from iterflow.unbounded.backlog import drain_s, offsets_behind


@itf.body
def running_sum(total, numbers):
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})


def write_files(folder: Path, count: int) -> None:
    """``count`` JSON-lines files, file i holding i + 1 rows, oldest first."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time() - 1000
    for index in range(count):
        path = folder / f"part-{index:04d}.json"
        path.write_text("".join(json.dumps({"x": x}) + "\n" for x in range(index + 1)))
        os.utime(path, (start + index, start + index))


def unread_files(folder: Path, checkpoint: Path) -> int:
    """The data files of ``folder`` that Spark's file source log does not list as taken."""
    taken = set()
    for entry in (checkpoint / "stream" / "sources" / "0").iterdir():
        if not entry.name.startswith("."):
            lines = entry.read_text().splitlines()[1:]
            taken |= {json.loads(line)["path"].rsplit("/", 1)[-1] for line in lines if line}
    return len({p.name for p in folder.iterdir() if not p.name.startswith(("_", "."))} - taken)


class RunTimes(StreamingQueryListener):
    """Spark's own timing of each micro-batch's run, from its progress events."""

    def __init__(self) -> None:
        self.runs_ms: dict[int, int] = {}

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        self.runs_ms[event.progress.batchId] = event.progress.durationMs["triggerExecution"]

    def onQueryIdle(self, event):
        pass

    def onQueryTerminated(self, event):
        pass


def test_a_file_source_reports_the_files_it_has_not_read_and_their_drain_time(spark, tmp_path):
    folder, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    write_files(folder, 10)
    # Spark skips hidden and "_" names; they are no backlog.
    (folder / "_ignored.json").write_text('{"x": 1}\n')
    (folder / ".hidden.json").write_text('{"x": 1}\n')
    truth: list[int] = []
    timed = RunTimes()
    spark.streams.addListener(timed)
    stream = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(str(folder))
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", stream)
        # Counted independently, from Spark's own log, while the epoch's micro-batch runs.
        .listen(lambda end: truth.append(unread_files(folder, checkpoint)))
        .start(checkpoint_location=str(checkpoint), available_now=True, progress=False)
    )
    try:
        assert query.await_termination(timeout=120)
    finally:
        spark.streams.removeListener(timed)
    backlogs = [p.backlog for p in query.progress]
    behind = [b["source.0.files_behind"] for b in backlogs]
    assert behind == truth == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    # Rates are those of the micro-batch finished before the epoch's: batch k - 1 read file
    # k - 1, of k rows; Spark timed its run. The first epoch has no finished batch before
    # it, the second no start of a batch before that one.
    runs = {batch: ms / 1000 for batch, ms in timed.runs_ms.items()}
    assert not {"source.0.processed_rows_per_s", "source.0.drain_s"} & set(backlogs[0])
    assert "source.0.input_rows_per_s" not in backlogs[1]
    for k, backlog in enumerate(backlogs[1:], start=1):
        assert backlog["source.0.processed_rows_per_s"] == pytest.approx(k / runs[k - 1])
        assert k == 1 or backlog["source.0.input_rows_per_s"] > 0
        drain = backlog["source.0.drain_s"]
        assert 0 < drain < float("inf") if backlog["source.0.files_behind"] else drain == 0
    # A file source has no latest offset.
    assert not any("source.0.offsets_behind" in b for b in backlogs)


def test_offsets_behind_sums_the_numeric_offsets_past_the_micro_batch():
    kafka_end = json.dumps({"events": {"0": 100, "1": 250}})
    kafka_latest = json.dumps({"events": {"0": 130, "1": 260}})
    assert offsets_behind(kafka_end, kafka_latest) == 40
    assert offsets_behind("7", "12") == 5
    assert offsets_behind('{"logOffset": 3}', "null") is None  # a file source
    assert offsets_behind(kafka_end, json.dumps({"events": {"0": 130}})) is None
    assert offsets_behind(None, None) is None


def test_drain_time_follows_the_rate_the_backlog_fell_at():
    samples = collections.deque([(0.0, 100.0), (5.0, 90.0), (10.0, 80.0)])
    assert drain_s(samples) == 40.0  # 20 fewer in 10 s: 80 left take 40 s
    assert drain_s(collections.deque([(0.0, 80.0), (10.0, 90.0)])) is None  # growing
    assert drain_s(collections.deque([(0.0, 80.0)])) is None  # one sample: no rate yet
    assert drain_s(collections.deque([(0.0, 3.0), (1.0, 0.0)])) == 0.0
