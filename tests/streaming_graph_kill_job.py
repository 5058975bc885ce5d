"""Streaming connected components in their own process, for the kill test.

Usage: streaming_graph_kill_job.py INPUT_DIR CHECKPOINT SINK_DIR OUT_JSON. Reads the
parquet files of INPUT_DIR/edges and INPUT_DIR/deletions one per micro-batch
(available-now), writes every epoch's components to a FileSink under SINK_DIR/vertices,
and sleeps a little per epoch so that a kill lands mid-stream. Writes what the run saw
to OUT_JSON."""

from __future__ import annotations

import json
import sys
import time

from child_jobs import job_session

import iterflow as itf
from iterflow.graph import streaming

SLEEP_S = 0.2


def main(input_dir: str, checkpoint: str, sink_dir: str, out: str) -> None:
    spark = job_session("local[2]", "iterflow-streaming-graph-kill")

    def stream(name: str, schema: str):  # type: ignore[no-untyped-def]
        reader = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
        return reader.parquet(f"{input_dir}/{name}")

    query = streaming.connected_components(
        stream("edges", "src long, dst long, w double"),
        deletions=stream("deletions", "src long, dst long"),
        sink=itf.FileSink(f"{sink_dir}/vertices"),
        listen=lambda end: time.sleep(SLEEP_S),
        checkpoint_location=checkpoint,
        available_now=True,
        progress=False,
    )
    query.awaitTermination()
    with open(out, "w") as f:
        json.dump(
            {
                "resumed_from": query.resumed_from,
                "termination": query.termination.reason if query.termination else None,
            },
            f,
        )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
