"""A run on ``local-cluster[2,1,1024]`` (two executor JVMs, task retries allowed) whose
functions update metrics; prints what it saw as one JSON line. Run by
tests/test_metrics_cluster.py in its own process: a process has one SparkContext."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from child_jobs import job_session
from pyspark import TaskContext
from pyspark.sql import functions as F

import iterflow as itf

ROUNDS, ROWS = 3, 1000


def main() -> None:
    spark = job_session(
        "local-cluster[2,1,1024]", "iterflow-metrics-cluster", **{"spark.task.maxFailures": "4"}
    )
    batch_rows = itf.metrics.counter("batch_rows")
    flaky_calls = itf.metrics.counter("flaky_calls")
    values = itf.metrics.distribution("values")
    failures = itf.metrics.counter("first_attempt_failures")

    def tag_with_pid(batches):  # type: ignore[no-untyped-def]
        for batch in batches:
            batch_rows.inc(len(batch))
            for x in batch["id"]:
                values.update(float(x))
            yield batch.assign(pid=os.getpid())

    @F.udf("long")
    def flaky(x):  # type: ignore[no-untyped-def]
        flaky_calls.inc()
        if TaskContext.get().attemptNumber() == 0:
            failures.inc()  # dropped by Spark with the failed attempt
            raise RuntimeError("first attempt of every task fails")
        return x

    @itf.body
    def step(counter, points, ctx):  # type: ignore[no-untyped-def]
        tagged = points.mapInPandas(tag_with_pid, "id long, pid long")
        rows = tagged.select(flaky("id").alias("id"), "pid")
        return itf.Declaration(
            feedback={"counter": counter.select((F.col("n") + 1).alias("n"))},
            outputs={"rows": rows},
        )

    result = (
        itf.BoundedIteration(step)
        .bind("counter", spark.createDataFrame([(0,)], "n long"))
        .bind("points", spark.range(0, ROWS, numPartitions=4), replay=True)
        .until(itf.max_rounds(ROUNDS))
        .run(progress=False)
    )
    rows = result.outputs["rows"].collect()
    out = {
        "driver_pid": os.getpid(),
        "worker_pids": sorted({r["pid"] for r in rows}),
        "ids": sorted(r["id"] for r in rows),
        "per_round": [
            {
                "batch_rows": p.metrics["batch_rows"],
                "flaky_calls": p.metrics["flaky_calls"],
                "first_attempt_failures": p.metrics["first_attempt_failures"],
            }
            for p in result.history
        ],
        "totals": {
            name: {"committed": m.committed, "attempted": m.attempted}
            for name, m in result.metrics.items()
            if name != "values"
        },
        "values": {
            "committed": result.metrics["values"].committed.to_dict(),  # type: ignore[union-attr]
            "attempted": result.metrics["values"].attempted.to_dict(),  # type: ignore[union-attr]
        },
    }
    spark.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
