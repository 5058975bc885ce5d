"""Faults injected into bounded iterations on separate executor JVMs: an executor killed
between rounds or in the middle of one, a Python worker killed, a task that fails once;
each run's result next to an uninterrupted run's. Prints one JSON line.

``python fault_cluster_job.py MASTER WORKDIR CASE [CASE ...]``, where a CASE is
``WORKLOAD:FAULT[:EPOCH][:nockpt]``; run by tests/test_fault_cluster.py in its own
process (a process has one SparkContext). Workloads: ``kernel`` (a PageRank-like body
whose contributions come from a numpy kernel), ``pagerank-arrow`` and
``pagerank-dataframe`` (``iterflow.graph.pagerank``; the Arrow one runs resident
rounds), ``kmeans`` (``iterflow.ml.kmeans``) and ``pregel`` (single-source shortest
paths by ``iterflow.graph.pregel``). Faults: ``none``; ``executor`` (a listener kills
an executor JVM after round EPOCH) and ``executors`` (all of them); ``executor-mid``
(a task of round EPOCH kills its own executor JVM); ``worker`` (a task of round EPOCH
kills its Python worker); ``task`` (a task of round EPOCH raises once). Task faults
apply to ``kernel`` only."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pandas as pd
from child_jobs import job_session
from faults import BetweenRounds, Injector, executor_pids
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import Graph, Pregel, pagerank, pregel
from iterflow.ml import kmeans

VERTICES, EDGES = 400, 3_000
ROUNDS, EVERY = 30, 3
POINTS = 2_000


def graph_frames(spark: SparkSession) -> tuple[DataFrame, DataFrame]:
    """A ring (every vertex has an in-edge and an out-edge) plus random edges."""
    rng = np.random.default_rng(7)
    src = np.concatenate([np.arange(VERTICES), rng.integers(0, VERTICES, EDGES - VERTICES)])
    dst = np.concatenate(
        [(np.arange(VERTICES) + 1) % VERTICES, rng.integers(0, VERTICES, EDGES - VERTICES)]
    )
    edges = spark.createDataFrame(pd.DataFrame({"src": src, "dst": dst})).repartition(4, "src")
    vertices = spark.range(VERTICES).repartition(4, "id")
    return vertices, edges


def kernel_run(spark: SparkSession, injector: Injector, listen: Any, **run: Any) -> dict[str, Any]:
    """ranks <- 0.15/N + 0.85 * sum of rank/outdeg over in-edges, the contributions from a
    numpy kernel (a pandas UDF) that counts its rows in a metric."""
    vertices, edges = graph_frames(spark)
    degrees = edges.groupBy("src").agg(F.count("*").alias("deg"))
    weighted = edges.join(degrees, "src").persist()
    rows_seen = itf.metrics.counter("rows_seen")

    @itf.body
    def kernel(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        epoch = ctx.epoch

        @F.pandas_udf("double")  # type: ignore[call-overload]
        def share(rank: pd.Series, deg: pd.Series) -> pd.Series:
            injector.due(epoch)
            rows_seen.inc(len(rank))
            return pd.Series(rank.to_numpy() / deg.to_numpy(dtype=np.float64))

        contributions = edges.join(ranks.withColumnRenamed("id", "src"), "src").select(
            F.col("dst").alias("id"), share("rank", "deg").alias("c")
        )
        following = contributions.groupBy("id").agg(
            (F.lit(0.15 / VERTICES) + 0.85 * F.sum("c")).alias("rank")
        )
        return itf.Declaration(feedback={"ranks": following}, outputs={"ranks": following})

    iteration = (
        itf.BoundedIteration(kernel)
        .bind("ranks", vertices.select("id", F.lit(1.0 / VERTICES).alias("rank")))
        .bind("edges", weighted)
        .until(itf.max_rounds(ROUNDS))
    )
    if listen is not None:
        iteration.listen(listen)
    result = iteration.run(**run)
    values = {r["id"]: r["rank"] for r in result.outputs["ranks"].collect()}
    out = summary(result)
    out["values"] = [values[i] for i in sorted(values)]
    out["rows_seen"] = [p.metrics.get("rows_seen") for p in result.history]
    out["rows_seen_committed"] = result.metrics["rows_seen"].committed
    weighted.unpersist()
    return out


def summary(result: itf.IterationResult) -> dict[str, Any]:
    return {
        "rounds": result.rounds,
        "epochs": [p.epoch for p in result.history],
        "rollbacks": [
            {
                "failed_epoch": r.failed_epoch,
                "to_epoch": r.to_epoch,
                "rounds_recomputed": r.rounds_recomputed,
                "lost": r.lost,
                "lost_executors": list(r.lost_executors),
                "lost_blocks": list(r.lost_blocks),
            }
            for r in result.rollbacks
        ],
        "rollback_rounds": [p.epoch for p in result.history if p.rollback is not None],
    }


def from_log(path: str) -> dict[str, Any]:
    """What the event log of a run says: its epochs, rollbacks and the rounds that ran on
    resident data (for the library functions, which return no IterationResult)."""
    events = [json.loads(line) for line in Path(path).read_text().splitlines()]
    ends = {e["epoch"]: e for e in events if e["event"] == "round_end"}
    return {
        "rounds": len(ends),
        "epochs": sorted(ends),
        "rollbacks": [
            {k: v for k, v in e.items() if k not in ("event", "time", "run_id")}
            for e in events
            if e["event"] == "rolled_back"
        ],
        "rollback_rounds": sorted(k for k, e in ends.items() if e.get("rollback")),
        "resident": [ends[k].get("resident") for k in sorted(ends)],
    }


def pagerank_run(
    spark: SparkSession, method: str, injector: Injector, listen: Any, **run: Any
) -> dict[str, Any]:
    vertices, edges = graph_frames(spark)
    ranks = pagerank(
        Graph(vertices, edges), tol=None, max_rounds=ROUNDS, method=method, listen=listen, **run
    )
    values = {r["id"]: r["pagerank"] for r in ranks.collect()}
    return {**from_log(run["event_log"]), "values": [values[i] for i in sorted(values)]}


def kmeans_run(spark: SparkSession, injector: Injector, listen: Any, **run: Any) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    centers = rng.normal(scale=10.0, size=(4, 3))
    data = centers[rng.integers(0, 4, POINTS)] + rng.normal(size=(POINTS, 3))
    points = spark.createDataFrame(pd.DataFrame(data, columns=["a", "b", "c"])).repartition(4)
    model = kmeans(
        points, 4, features=["a", "b", "c"], max_rounds=ROUNDS, tol=None, listen=listen, **run
    )
    centroids = sorted(map(list, np.asarray(model.centroids).tolist()))
    return {**from_log(run["event_log"]), "values": [x for c in centroids for x in c]}


def pregel_run(spark: SparkSession, injector: Injector, listen: Any, **run: Any) -> dict[str, Any]:
    """Single-source shortest paths from vertex 0 by edge weight."""
    vertices, edges = graph_frames(spark)
    weighted = edges.withColumn("weight", (F.abs(F.hash("src", "dst")) % 10 + 1).cast("double"))
    found = pregel(
        Graph(vertices, weighted),
        init={"dist": F.when(F.col("id") == 0, 0.0).otherwise(float("inf"))},
        update={"dist": F.least(F.col("dist"), Pregel.msg())},
        send_to_dst=Pregel.src("dist") + Pregel.edge("weight"),
        aggregate=F.min,
        listen=listen,
        **run,
    )
    dist = {r["id"]: r["dist"] for r in found.collect()}
    out = {**from_log(run["event_log"]), "values": [dist[i] for i in sorted(dist)]}
    out["edges"] = [(r["src"], r["dst"], r["weight"]) for r in weighted.collect()]
    return out


def fault_session(master: str, app_name: str) -> SparkSession:
    """A fault job's session. Variables stay in Spark (driverRows=0) and keep their
    partitions (no coalescing), so that every executor holds blocks of them; the fault
    injectors (faults.py) go to the executors."""
    spark = job_session(
        master,
        app_name,
        **{
            "spark.iterflow.driverRows": "0",
            "spark.sql.adaptive.coalescePartitions.enabled": "false",
        },
    )
    spark.sparkContext.addPyFile(str(Path(__file__).with_name("faults.py")))
    return spark


def main(master: str, workdir: str, *cases: str) -> None:
    spark = fault_session(master, "iterflow-fault-cluster")
    out: dict[str, Any] = {"driver_pid": os.getpid(), "executors": executor_pids()}
    for case in cases:
        workload, fault, *rest = case.split(":")
        epoch = int(rest[0]) if rest and rest[0].isdigit() else 7
        durable = "nockpt" not in rest
        folder = Path(workdir) / case.replace(":", "-")
        folder.mkdir(parents=True, exist_ok=True)
        injector = Injector(fault, epoch, str(folder / "fault-ran"))
        run: dict[str, Any] = {"progress": False, "event_log": str(folder / "events.jsonl")}
        if durable:
            run.update(checkpoint_dir=str(folder / "ckpt"), checkpoint_every=EVERY)
        listen = BetweenRounds(injector) if fault in ("executor", "executors") else None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = WORKLOADS[workload](spark, injector, listen=listen, **run)
                got["error"] = None
            except itf.IterflowError as exc:
                got = {"error": str(exc), "error_type": type(exc).__name__}
        got["warnings"] = [str(w.message) for w in caught]
        got["fault_ran"] = (folder / "fault-ran").exists() or (
            fault.startswith("executor") and bool(getattr(listen, "killed", None))
        )
        got["killed"] = getattr(listen, "killed", [])
        got["event_log"] = str(folder / "events.jsonl")
        out[case] = got
    print(json.dumps(out))
    spark.stop()


WORKLOADS: dict[str, Callable[..., dict[str, Any]]] = {
    "kernel": kernel_run,
    "pagerank-arrow": lambda *a, **k: pagerank_run(a[0], "arrow", *a[1:], **k),
    "pagerank-dataframe": lambda *a, **k: pagerank_run(a[0], "dataframe", *a[1:], **k),
    "kmeans": kmeans_run,
    "pregel": pregel_run,
}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *sys.argv[3:])
