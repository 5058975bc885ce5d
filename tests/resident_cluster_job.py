"""Resident rounds on separate executor JVMs: PageRank on resident edges, a body that
mixes a resident kernel with a DataFrame join and durable checkpoints, and a run whose
resident task's Python worker is killed (SIGKILL) mid-run; prints the results as one
JSON line. ``python resident_cluster_job.py MASTER CHECKPOINT_DIR``, run by
tests/test_resident_cluster.py in its own process (a process has one SparkContext)."""

from __future__ import annotations

import json
import os
import signal
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pyarrow as pa
from child_jobs import job_session
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import Graph, pagerank
from iterflow.runtime.datacache.resident_policy import RESIDENT_CONF

ROWS = 3_000
VERTICES, EDGES = 500, 4_000


def mixed_body(seen: list, values: itf.metrics.Counter) -> itf.IterationBody:
    """acc += sum(x); rows keeps the ids whose label is not the epoch (a join per round)."""

    def partial(table: pa.Table, counter: itf.metrics.Counter) -> pa.Table:
        counter.inc(table.num_rows)
        return pa.table({"s": [float(np.sum(table["x"].to_numpy()))], "pid": [os.getpid()]})

    @itf.body
    def mixed(acc, rows, points, labels, ctx):
        data = ctx.columnar(points)
        seen.append(data)
        current = acc.first()["acc"]

        def combine(batches):
            total = current
            for batch in batches:
                for s in batch["s"].to_pylist():
                    total += s
            yield pa.RecordBatch.from_pydict({"acc": [total]})

        new_acc = data.map(
            partial, "s DOUBLE, pid LONG", values, combine=combine, combine_schema="acc DOUBLE"
        )
        new_rows = rows.join(labels, "id").where(f"label <> {ctx.epoch}").select("id")
        return itf.Declaration(
            feedback={"acc": new_acc, "rows": new_rows},
            outputs={"acc": new_acc},
            until=itf.empty(new_rows),
        )

    return mixed


def main(master: str, checkpoint_dir: str) -> None:
    spark = job_session(master, "iterflow-resident-cluster")
    rng = np.random.default_rng(0)
    # Rows in partitions without a shuffle: a shuffle's row order varies between reads
    # on a cluster, and so would floating-point sums of the same rows.
    points = spark.range(0, ROWS, 1, 4).select((F.sin("id") * 3).alias("x"))
    labels = spark.createDataFrame([(i, i % 5) for i in range(ROWS)], "id long, label long")
    values = itf.metrics.counter("values")
    out: dict = {"driver_pid": os.getpid()}

    def run(name: str, kill_at: int | None = None) -> dict:
        seen: list = []
        killed: list[int] = []

        def kill(end: itf.RoundEnd) -> None:
            if end.epoch == kill_at:
                for _host, pid in seen[0].tasks_alive().values():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

        result = (
            itf.BoundedIteration(mixed_body(seen, values))
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("rows", spark.range(ROWS))
            .bind("points", points)
            .bind("labels", labels)
            .until(itf.max_rounds(10))
            .listen(kill)
            .run(progress=False, checkpoint_dir=f"{checkpoint_dir}/{name}", checkpoint_every=1)
        )
        data = seen[0]
        return {
            "acc": result.outputs["acc"].first()["acc"],
            "rounds": result.rounds,
            "reason": result.termination.reason,
            "resident": [p.resident for p in result.history],
            "values": [p.metrics["values"] for p in result.history],
            "values_committed": result.metrics["values"].committed,
            "launches": getattr(data, "launches", 0),
            "killed": killed,
        }

    out["uninterrupted"] = run("uninterrupted")
    out["killed"] = run("killed", kill_at=2)
    spark.conf.set(RESIDENT_CONF, "off")
    out["jobs"] = run("jobs")
    spark.conf.unset(RESIDENT_CONF)

    edges = spark.createDataFrame(
        pa.table({"src": rng.integers(0, VERTICES, EDGES), "dst": rng.integers(0, VERTICES, EDGES)})
    )
    graph = Graph(spark.range(VERTICES), edges)
    ranks = pagerank(graph, tol=1e-10, max_rounds=200, method="arrow", progress=False)
    out["pagerank"] = {r["id"]: r["pagerank"] for r in ranks.collect()}
    out["edges"] = edges.toPandas()[["src", "dst"]].values.tolist()
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
