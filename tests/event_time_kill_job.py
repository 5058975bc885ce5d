"""Sliding-window sums in event time, in their own process, for the kill test.

Usage: event_time_kill_job.py INPUT_DIR CHECKPOINT SINK_DIR OUT_JSON. Reads the
JSON files of INPUT_DIR (rows ``t`` seconds, ``v``) one per micro-batch
(available-now), sums ``v`` per 4-second window sliding every 2 seconds, writes
each epoch's fired sums to a FileSink under SINK_DIR, and sleeps a little per
epoch so that a kill lands mid-stream. Writes what the run saw to OUT_JSON."""

from __future__ import annotations

import json
import sys
import time

from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.spark.session import embedded_session

SLEEP_S = 0.2


@itf.body
def window_sums(events, ctx):  # type: ignore[no-untyped-def]
    windows = ctx.window(events, itf.SlidingWindows("4 seconds", every="2 seconds"), name="sums")
    sums = windows.groupBy("window").agg(F.sum("v").alias("total"), F.max("pane").alias("pane"))
    return itf.Declaration(outputs={"sums": sums})


def main(input_dir: str, checkpoint: str, sink_dir: str, out: str) -> None:
    spark = embedded_session(
        "local[2]",
        app_name="iterflow-event-time-kill",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    events = (
        spark.readStream.schema("t long, v long")
        .option("maxFilesPerTrigger", 1)
        .json(input_dir)
        .select(F.timestamp_seconds("t").alias("ts"), "v")
    )
    query = (
        itf.UnboundedIteration(window_sums)
        .bind("events", events, event_time="ts", max_delay="1 second")
        .sink("sums", itf.FileSink(f"{sink_dir}/sums"))
        .listen(lambda end: time.sleep(SLEEP_S))
        .start(checkpoint_location=checkpoint, available_now=True, progress=False)
    )
    query.await_termination()
    with open(out, "w") as f:
        json.dump(
            {
                "resumed_from": query.resumed_from,
                "termination": query.termination.reason if query.termination else None,
                "late": sum(sum(p.late_rows.values()) for p in query.history),
            },
            f,
        )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
