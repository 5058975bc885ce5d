"""A bounded iteration with a numpy UDF, a metric counted on executors and durable
checkpoints, stopped after 4 rounds and resumed to 8 in a second run(); prints the
results as one JSON line. ``python resume_cluster_job.py MASTER CHECKPOINT_DIR``, run by
tests/test_resume_cluster.py in its own process (a process has one SparkContext)."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pandas as pd
from child_jobs import job_session
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf

ROWS = 2_000


def main(master: str, checkpoint_dir: str) -> None:
    # driverRows=0 keeps the variable in Spark (local checkpoints on the executors).
    spark = job_session(master, "iterflow-resume-cluster", **{"spark.iterflow.driverRows": "0"})
    rows_seen = itf.metrics.counter("rows_seen")

    @F.pandas_udf("double")  # type: ignore[call-overload]
    def step(v: pd.Series, i: pd.Series) -> pd.Series:
        rows_seen.inc(len(v))
        return pd.Series(0.5 * v.to_numpy() + np.sqrt(i.to_numpy(dtype=np.float64)))

    @F.udf("long")  # type: ignore[misc]
    def worker(_: int) -> int:
        return os.getpid()

    @itf.body
    def halve(x: DataFrame) -> itf.Declaration:
        following = x.select("i", step("v", "i").alias("v"))
        return itf.Declaration(feedback={"x": following}, outputs={"x": following})

    start = spark.range(0, ROWS, numPartitions=4).select(
        F.col("id").alias("i"), F.lit(1.0).alias("v")
    )

    def run(rounds: int) -> itf.IterationResult:
        return (
            itf.BoundedIteration(halve)
            .bind("x", start)
            .until(itf.max_rounds(rounds))
            .run(checkpoint_dir=checkpoint_dir, checkpoint_every=2, progress=False)
        )

    first = run(4)
    second = run(8)
    final = second.outputs["x"]
    values = [r["v"] for r in final.orderBy("i").collect()]
    pids = {r[0] for r in spark.range(0, 64, numPartitions=8).select(worker("id")).collect()}
    print(
        json.dumps(
            {
                "master": spark.sparkContext.master,
                "first_rounds": first.rounds,
                "resumed_from": second.resumed_from,
                "rounds": second.rounds,
                "epochs": [p.epoch for p in second.history],
                "values": values,
                "rows_seen_per_round": [p.metrics.get("rows_seen") for p in second.history],
                "rows_seen_total": second.metrics["rows_seen"].committed,
                "worker_pids": sorted(pids),
                "driver_pid": os.getpid(),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
