"""Unbounded iterations on a Spark Connect session (``remote("local[2]")``: a Connect
server in this process, whose foreachBatch worker runs the epochs beside it).

Usage: connect_unbounded_job.py suite WORK_DIR
       connect_unbounded_job.py run INPUT_DIR CHECKPOINT SINK_DIR [available_now]

``suite`` runs the cases below and prints their results as one JSON line. ``run`` runs
the running sum of the kill test: with ``available_now`` to the end (printing what it
saw), otherwise until it is killed. Run by tests/test_connect.py in its own process."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_unbounded import write_rows

import iterflow as itf
from iterflow.graph import streaming
from iterflow.progress.event_log import read_events

#: Seconds each epoch's listener sleeps in ``run`` (so that a kill lands mid-stream).
SLEEP_S = 0.3


@itf.body
def running_sum(total: DataFrame, numbers: DataFrame) -> itf.Declaration:
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(
        feedback={"total": new_total}, outputs={"total": new_total, "numbers": numbers}
    )


@itf.body
def countdown(work: DataFrame) -> itf.Declaration:
    """Work rows (id, n): each epoch takes one off n and drops the rows that reach 0."""
    left = work.select("id", (F.col("n") - 1).alias("n")).where(F.col("n") > 0)
    return itf.Declaration(feedback={"work": left}, outputs={"left": left})


@itf.body
def breaks(total: DataFrame, numbers: DataFrame) -> itf.Declaration:
    """A running sum whose epoch raises once the total passes 10."""
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    if new_total.first()["total"] > 10:
        raise ZeroDivisionError("boom")
    return itf.Declaration(feedback={"total": new_total})


def numbers(spark: SparkSession, folder: Path) -> DataFrame:
    return spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(str(folder))


def emit_total(end: itf.RoundEnd) -> None:
    """A listener: it runs beside the server, and what it emits reaches the client."""
    end.emit("total", end.outputs["total"].first()["total"])


def sums(spark: SparkSession, work: Path) -> dict[str, Any]:
    """A running sum over four files, available-now: sinks, emitted values, history,
    progress and the event log, on the client."""
    write_rows(work / "in", [[{"x": x} for x in f] for f in [[1, 2, 3], [10, 20], [100], [7]]])
    out = itf.FileSink(str(work / "out"))
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers(spark, work / "in"))
        .sink("total", out)
        .listen(emit_total)
        .start(
            checkpoint_location=str(work / "ckpt"),
            available_now=True,
            event_log=str(work / "events.jsonl"),
            query_name="sums",
        )
    )
    ended = query.awaitTermination(timeout=300)
    events = read_events(str(work / "events.jsonl"))
    return {
        "handle": isinstance(query, itf.UnboundedQuery),
        "ended": ended,
        "termination": [query.termination.reason, query.termination.epoch],
        "written": sorted([r["epoch"], r["total"]] for r in out.read(spark).collect()),
        "emitted": query.emitted,
        "input_rows": [p.input_rows["numbers"] for p in query.history],
        "batches": [p.batch_id for p in query.history],
        "last": query.lastProgress["iterflow"] if query.lastProgress else None,
        "name": query.name,
        "events": [e["event"] for e in events],
        "ending": [
            e["termination"]["reason"] for e in events if e["event"] == "iteration_terminated"
        ],
    }


def drains(spark: SparkSession, work: Path) -> dict[str, Any]:
    """Work feedback drains beside the server, each micro-batch's before the next."""
    write_rows(work / "in", [[{"id": i, "n": i} for i in range(1, 5)], [{"id": 9, "n": 2}]])
    stream = spark.readStream.schema("id long, n long").option("maxFilesPerTrigger", 1)
    query = (
        itf.UnboundedIteration(countdown)
        .bind("work", stream.json(str(work / "in")))
        .start(checkpoint_location=str(work / "ckpt"), available_now=True)
    )
    query.awaitTermination()
    return {
        "rows": [p.rows["work"] for p in query.history],
        "batches": [p.batch_id for p in query.history],
        "watermarks": [p.epoch_watermark for p in query.history],
        "in_flight": query.status["feedback_rows_in_flight"],
    }


def streaming_query_code(spark: SparkSession, work: Path) -> dict[str, Any]:
    """Code written for a StreamingQuery: a context manager, processAllAvailable,
    lastProgress and recentProgress, a name among the session's streams; stop() ends the
    iteration beside the server."""
    write_rows(work / "in", [[{"x": 1}, {"x": 2}], [{"x": 3}]])
    iteration = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers(spark, work / "in"))
    )
    ckpt, log = str(work / "ckpt"), str(work / "events.jsonl")
    with iteration.start(checkpoint_location=ckpt, query_name="counted", event_log=log) as q:
        q.processAllAvailable()
        active = [s.name for s in spark.streams.active]
        status = q.status
        recent = [p["iterflow"]["epochs"] for p in q.recentProgress]
        last = q.lastProgress
        running = q.isActive
    events = read_events(log)
    return {
        "active": active,
        "running": running,
        "after": [q.isActive, q.termination.reason, q.exception() is None],
        "status": [status["epoch"], status["committed_epoch"], status["state"]],
        "recent": [[e["epoch"] for e in epochs] for epochs in recent],
        "last_rows": last["numInputRows"] if last else None,
        "ending": [
            e["termination"]["reason"] for e in events if e["event"] == "iteration_terminated"
        ],
    }


def failure(spark: SparkSession, work: Path) -> dict[str, Any]:
    """A body that raises beside the server: the client raises the same RoundError."""
    write_rows(work / "in", [[{"x": 1}], [{"x": 20}]])
    query = (
        itf.UnboundedIteration(breaks)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers(spark, work / "in"))
        .start(checkpoint_location=str(work / "ckpt"), available_now=True)
    )
    try:
        query.awaitTermination()
    except itf.IterflowError as error:
        raised = [type(error).__name__, getattr(error, "epoch", None), str(error)]
    else:
        raised = []
    refused = []
    for options in ({"commit_interval_s": 1.0}, {"progress": True}):
        try:
            (
                itf.UnboundedIteration(running_sum)
                .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
                .bind("numbers", numbers(spark, work / "in"))
                .start(checkpoint_location=str(work / "other"), **options)
            )
        except itf.IterflowValueError as error:
            refused.append(str(error))
    error = query.exception()
    return {
        "raised": raised,
        "exception": None if error is None else type(error).__name__,
        "refused": refused,
    }


@itf.body
def per_10s(events: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
    """Rows per 10-second window of event time."""
    windowed = ctx.window(events, itf.FixedWindows("10 seconds"), name="per10")
    counts = windowed.groupBy("window").agg(F.count("*").alias("n"))
    return itf.Declaration(outputs={"counts": counts})


def windows(spark: SparkSession, work: Path) -> dict[str, Any]:
    """Event time beside the server: each window fires once, in the epoch whose input
    makes it due (the last at the end, in the ending query); or, on a server that does
    not report the observations event time needs, the error that says so."""
    write_rows(work / "in", [[{"t": 1}, {"t": 2}], [{"t": 11}], [{"t": 25}]])
    stream = spark.readStream.schema("t long").option("maxFilesPerTrigger", 1)
    events = stream.json(str(work / "in")).select(F.timestamp_seconds("t").alias("ts"))
    out = itf.FileSink(str(work / "out"))
    query = (
        itf.UnboundedIteration(per_10s)
        .bind("events", events, event_time="ts")
        .sink("counts", out)
        .start(checkpoint_location=str(work / "ckpt"), available_now=True)
    )
    try:
        query.awaitTermination()
    except itf.IterflowError as error:
        return {"error": str(error)}
    rows = out.read(spark).select("epoch", F.unix_seconds("window.start").alias("s"), "n")
    return {"fired": sorted([r["epoch"], r["s"], r["n"]] for r in rows.collect())}


#: The edges of ``graph``, one file per micro-batch.
GRAPH_FILES = [[(1, 2), (3, 4)], [(2, 3)], [(5, 6), (7, 7)]]


def graph(spark: SparkSession, work: Path) -> dict[str, Any]:
    """Connected components kept up to date as edges arrive (``iterflow.graph.streaming``):
    each epoch's whole result in the sink."""
    write_rows(work / "in", [[{"src": a, "dst": b} for a, b in f] for f in GRAPH_FILES])
    edges = spark.readStream.schema("src long, dst long").option("maxFilesPerTrigger", 1)
    out = itf.FileSink(str(work / "out"))
    query = streaming.connected_components(
        edges.json(str(work / "in")),
        sink=out,
        checkpoint_location=str(work / "ckpt"),
        available_now=True,
    )
    query.awaitTermination()
    rows = out.read(spark).collect()
    return {
        str(epoch): {r["id"]: r["component"] for r in rows if r["epoch"] == epoch}
        for epoch in range(len(GRAPH_FILES))
    }


def run(input_dir: str, checkpoint: str, sink_dir: str, until_end: bool) -> dict[str, Any]:
    """The running sum of the kill test, sinking totals and numbers."""
    spark = SparkSession.builder.remote("local[2]").getOrCreate()

    def slow(end: itf.RoundEnd) -> None:
        time.sleep(SLEEP_S)

    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers(spark, Path(input_dir)))
        .sink("total", itf.FileSink(f"{sink_dir}/total"))
        .sink("numbers", itf.FileSink(f"{sink_dir}/numbers"))
        .listen(slow)
        .start(checkpoint_location=checkpoint, available_now=until_end)
    )
    query.awaitTermination()
    return {"resumed_from": query.resumed_from, "epochs": [p.epoch for p in query.history]}


def main() -> None:
    if sys.argv[1] == "run":
        input_dir, checkpoint, sink_dir = sys.argv[2:5]
        print(json.dumps(run(input_dir, checkpoint, sink_dir, sys.argv[5:] == ["available_now"])))
        return
    work = Path(sys.argv[2])
    spark = (
        SparkSession.builder.remote("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    results = {
        case.__name__: case(spark, work / case.__name__)
        for case in (sums, drains, streaming_query_code, failure, graph, windows)
    }
    print(json.dumps(results))
    spark.stop()


if __name__ == "__main__":
    main()
