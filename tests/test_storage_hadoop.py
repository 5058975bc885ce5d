"""The storage layer through Hadoop's FileSystem in Spark's JVM, and event logs of real runs
on URIs (shared local[2] session)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow import storage
from iterflow.progress.event_log import EventLog, read_events
from iterflow.runtime.spark.jvm import HadoopFiles

pytestmark = [
    pytest.mark.spark,
    pytest.mark.spark_classic("Hadoop's FileSystem is reached through a classic session's JVM"),
]


@itf.body
def halve(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
    nxt = v.select((F.col("x") / 2).alias("x"))
    return itf.Declaration(feedback={"v": nxt}, outputs={"v": nxt})


def _hadoop(spark: SparkSession, append: bool) -> HadoopFiles:
    """Hadoop's files on this session; ``append``: over Hadoop's raw local file system,
    which appends, instead of its checksummed one, which cannot."""
    files = HadoopFiles(spark)
    if append:
        jvm: Any = spark.sparkContext._jvm
        conf = jvm.org.apache.hadoop.conf.Configuration(files._conf)
        conf.set("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem")
        conf.set("fs.file.impl.disable.cache", "true")
        files._conf = conf
    return files


@pytest.mark.parametrize("append", [False, True], ids=["rewrite", "append"])
def test_an_event_log_written_and_read_through_hadoop(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, append: bool
) -> None:
    # Every place, file: URIs included, is reached through Hadoop's FileSystem.
    files = _hadoop(spark, append)
    monkeypatch.setattr(storage, "files_at", lambda place, what: files)
    target = tmp_path / "logs" / "run.jsonl"
    uri = f"file:{target}"
    log = EventLog(uri)
    # Hadoop's checksummed local file system cannot append: each line rewrites the file.
    assert log._file.rewrites is not append
    log.iteration_started(run_id="r1", iteration="it", inputs={}, conditions=[])
    # Flushed at once: readable before the log is closed, by Python and by Hadoop.
    assert len(target.read_text().splitlines()) == 1
    assert [e["event"] for e in read_events(uri)] == ["iteration_started"]
    log.iteration_started(run_id="r1", iteration="again", inputs={}, conditions=[])
    log.close()
    with EventLog(uri) as later:  # a second run appends to what is there
        later.iteration_started(run_id="r2", iteration="it", inputs={}, conditions=[])
    assert [e["iteration"] for e in read_events(uri, "r1")] == ["it", "again"]
    assert [e["run_id"] for e in read_events(uri)] == ["r2"]
    assert [e["run_id"] for e in read_events(target)] == ["r2"]


def test_a_run_logs_to_a_file_uri(spark: SparkSession, tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/events/run.jsonl"
    itf.BoundedIteration(halve).bind(
        "v", spark.range(4).select(F.col("id").cast("double").alias("x"))
    ).until(itf.max_rounds(2)).run(event_log=uri)
    events = read_events(tmp_path / "events" / "run.jsonl")
    assert [e["event"] for e in events] == [
        "iteration_started",
        "round_end",
        "round_end",
        "iteration_terminated",
    ]
    assert not (Path.cwd() / "file:").exists()


def test_a_scheme_hadoop_has_no_file_system_for_fails_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    it = itf.BoundedIteration(halve).bind(
        "v", spark.range(2).select(F.col("id").cast("double").alias("x"))
    )
    with pytest.raises(itf.IterflowError) as raised:
        it.until(itf.max_rounds(1)).run(event_log="nosuch://bucket/run.jsonl")
    message = str(raised.value)
    assert "event_log='nosuch://bucket/run.jsonl'" in message
    assert "scheme 'nosuch'" in message and "Hadoop has a connector for" in message
    with pytest.raises(itf.IterflowError) as raised:
        it.until(itf.max_rounds(1)).run(checkpoint_dir="nosuch://bucket/ckpt")
    assert "scheme 'nosuch'" in str(raised.value)
    assert "spark.hadoop.fs.nosuch.impl" in str(raised.value)


#: Spark's own spellings of intervals, as trigger(processingTime=) reads them.
SPARK_SPELLINGS = [
    "10 seconds",
    "1 second",
    "1 minute",
    "500 milliseconds",
    "250 microseconds",
    "2 hours",
    "1 day",
    "2 weeks",
    "1 hour 30 minutes",
    "interval 10 seconds",
    "INTERVAL 1 Hour",
    ".5 seconds",
    "1.25 seconds",
    "+3 seconds",
    "1 hour -15 minutes",
]


def test_the_duration_grammar_reads_spark_spellings_as_spark_does(spark: SparkSession) -> None:
    from iterflow.durations import duration_us

    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # a day is 24 hours
    try:
        row = spark.sql(
            "SELECT "
            + ", ".join(
                f"unix_micros(timestamp_micros(0) + CAST('{text}' AS INTERVAL)) AS c{k}"
                for k, text in enumerate(SPARK_SPELLINGS)
            )
        ).first()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert row is not None
    spark_micros = dict(zip(SPARK_SPELLINGS, row, strict=True))
    assert {text: duration_us(text, "x") for text in SPARK_SPELLINGS} == spark_micros
