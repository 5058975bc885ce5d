"""An unbounded running sum in its own process, for the kill test.

Usage: unbounded_kill_job.py INPUT_DIR CHECKPOINT SINK_DIR OUT_JSON [COMMIT_INTERVAL_S].
Reads the JSON files of INPUT_DIR one per micro-batch (available-now), keeps the
running total as a state variable, writes each epoch's numbers and total to
FileSinks under SINK_DIR, and sleeps a little per epoch so that a kill lands
mid-stream. With COMMIT_INTERVAL_S, commits are written in the background at most
that often. Writes what the run saw to OUT_JSON."""

from __future__ import annotations

import json
import sys
import time

from child_jobs import job_master
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.spark.session import embedded_session

SLEEP_S = 0.2


@itf.body
def running_sum(total, numbers, ctx):  # type: ignore[no-untyped-def]
    ctx.state["epochs"] = ctx.state.get("epochs", 0) + 1
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(
        feedback={"total": new_total}, outputs={"total": new_total, "numbers": numbers}
    )


def main(
    input_dir: str, checkpoint: str, sink_dir: str, out: str, commit_interval_s: str | None = None
) -> None:
    spark = embedded_session(
        job_master("local[2]"),
        app_name="iterflow-unbounded-kill",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    numbers = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(input_dir)
    totals: list[tuple[int, int]] = []
    state: list[int] = []

    def slow(end: itf.RoundEnd) -> None:
        totals.append((end.epoch, end.outputs["total"].first()["total"]))
        state.append(end.state["epochs"])
        time.sleep(SLEEP_S)

    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers)
        .sink("total", itf.FileSink(f"{sink_dir}/total"))
        .sink("numbers", itf.FileSink(f"{sink_dir}/numbers"))
        .listen(slow)
        .start(
            checkpoint_location=checkpoint,
            available_now=True,
            progress=False,
            commit_interval_s=None if commit_interval_s is None else float(commit_interval_s),
        )
    )
    query.await_termination()
    with open(out, "w") as f:
        json.dump(
            {
                "resumed_from": query.resumed_from,
                "totals": totals,
                "epochs_counted": state[-1] if state else None,
                "termination": query.termination.reason if query.termination else None,
            },
            f,
        )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
