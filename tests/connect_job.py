"""Bounded iterations, iterflow.ml and iterflow.testing on a Spark Connect session
(``remote("local[2]")``: a Connect server in this process, the client talking to it
over gRPC); prints the results as one JSON line. Run by tests/test_connect.py in its own
process."""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_round_progress import slow_body, values

import iterflow as itf
from iterflow.graph import (
    AggregateMessages,
    Graph,
    GraphFrame,
    Pregel,
    VertexProgram,
    aggregate_messages,
    connected_components,
    pagerank,
    pregel,
)
from iterflow.ml import (
    GaussianMixture,
    LogisticRegression,
    LogisticRegressionModel,
    kmeans,
    linear_regression,
)
from iterflow.testing import assert_converges, assert_frame_close

#: Where the k-means run writes its events (its iteration_started tells how kernels ran).
EVENT_LOG = os.path.join(tempfile.mkdtemp(), "kmeans.jsonl")

#: A small graph with a dangling vertex (5), an isolated one (7) and two components.
GRAPH_VERTICES = 8
GRAPH_EDGES = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 5), (6, 6), (6, 1)]


def halving(spark: SparkSession, rows: int) -> dict:  # type: ignore[type-arg]
    """v -> v / 2 over ``rows`` rows until max(v) <= 0.01, with a step observed."""
    seen: list[float] = []
    driver_counter = itf.metrics.counter("rounds_seen")

    @itf.body
    def halve(x: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        half = ctx.observe("halved", x.select("i", (F.col("v") / 2).alias("v")))
        return itf.Declaration(
            feedback={"x": half},
            outputs={"x": half},
            until=itf.converged(half.agg(F.max("v")), 0.01),
        )

    def listen(end: itf.RoundEnd) -> None:
        driver_counter.inc()
        seen.append(end.progress.converged_value)

    start = spark.range(rows).select(F.col("id").alias("i"), F.lit(1.0).alias("v"))
    result = itf.BoundedIteration(halve).bind("x", start).listen(listen).run(progress=False)
    assert_converges(result, tol=0.01, within=7)
    assert_frame_close(result.outputs["x"], [{"i": i, "v": 2.0**-7} for i in range(rows)], key="i")
    return {
        "rounds": result.rounds,
        "reason": result.termination.reason,
        "rows": [p.rows["x"] for p in result.history],
        "observed": [p.observed["halved"] for p in result.history],
        "converged": seen,
        "rounds_seen": result.metrics["rounds_seen"].committed,
        "session": type(result.outputs["x"].sparkSession).__module__,
    }


def criteria(spark: SparkSession) -> dict:  # type: ignore[type-arg]
    """Count down 5 rows: the criteria (rows still above 0) empties after 5 rounds."""

    @itf.body
    def count_down(x: DataFrame) -> itf.Declaration:
        following = x.select((F.col("n") - 1).alias("n")).where("n >= 0")
        return itf.Declaration(feedback={"x": following}, until=itf.empty(following.where("n > 0")))

    start = spark.createDataFrame([(k,) for k in range(1, 6)], "n long")
    result = itf.BoundedIteration(count_down).bind("x", start).until(itf.max_rounds(20)).run()
    return {"rounds": result.rounds, "reason": result.termination.reason}


def executor_metric(spark: SparkSession) -> dict:  # type: ignore[type-arg]
    """A metric updated inside a UDF: over Connect the run goes on, and the driver is
    warned that such updates are not recorded."""
    evaluated = itf.metrics.counter("evaluated")

    def touch(v):  # type: ignore[no-untyped-def]
        evaluated.inc()
        return v

    touched = F.udf(touch, "double")

    @itf.body
    def step(x: DataFrame) -> itf.Declaration:
        following = x.select("i", touched(F.col("v") + 1).alias("v"))
        return itf.Declaration(feedback={"x": following}, outputs={"x": following})

    start = spark.range(50).select(F.col("id").alias("i"), F.lit(0.0).alias("v"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = itf.BoundedIteration(step).bind("x", start).until(itf.max_rounds(3)).run()
    return {
        "values": sorted({r["v"] for r in result.outputs["x"].collect()}),
        "rounds": result.rounds,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, itf.IterflowWarning)],
    }


def graph_arrow(spark: SparkSession) -> dict:  # type: ignore[type-arg]
    """iterflow.graph's Arrow paths (files and numpy kernels) over Connect."""
    vertices = spark.createDataFrame([(v,) for v in range(GRAPH_VERTICES)], "id long")
    edges = spark.createDataFrame(GRAPH_EDGES, "src long, dst long")
    graph = Graph(vertices, edges)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", itf.IterflowWarning)  # its messages metric
        ranks = pagerank(graph, method="arrow", tol=1e-10, max_rounds=200, progress=False)
        labels = connected_components(graph, method="arrow", progress=False)
        smallest = pregel(graph, program=smallest_label(), progress=False)
        compiled = compiled_programs(graph)
    frame = GraphFrame(vertices, edges)
    heard = aggregate_messages(
        graph, F.sum(AggregateMessages.msg).alias("n"), send_to_dst=AggregateMessages.src["id"]
    )
    return {
        "ranks": {r["id"]: r["pagerank"] for r in ranks.collect()},
        "components": {r["id"]: r["component"] for r in labels.collect()},
        "program_components": {r["id"]: r["label"] for r in smallest.collect()},
        "heard": {r["id"]: r["n"] for r in heard.collect()},
        "triangles": {r["id"]: r["count"] for r in frame.triangleCount().collect()},
        "cores": {r["id"]: r["kcore"] for r in frame.k_core(progress=False).collect()},
        "two_step_paths": frame.find("(a)-[]->(b); (b)-[]->(c)").count(),
        **compiled,
    }


def compiled_programs(graph: Graph) -> dict:  # type: ignore[type-arg]
    """Vertex programs written as Column expressions (iterflow's pregel and GraphFrames'
    builder), compiled to kernels from Connect's own expression trees."""
    log = os.path.join(tempfile.mkdtemp(), "pregel.jsonl")
    labels = pregel(
        graph,
        init={"label": F.col("id")},
        update={"label": F.least(F.col("label"), Pregel.msg())},
        send_to_dst=Pregel.src("label"),
        send_to_src=Pregel.dst("label"),
        aggregate=F.min,
        progress=False,
        event_log=log,
    )
    degrees = GraphFrame(graph.vertices, graph.edges).outDegrees
    ranks = (
        GraphFrame(graph.vertices.join(degrees, "id", "left"), graph.edges)
        .pregel.setMaxIter(6)
        .withVertexColumn(
            "rank",
            F.lit(1.0 / GRAPH_VERTICES),
            F.coalesce(Pregel.msg(), F.lit(0.0)) * 0.85 + 0.15 / GRAPH_VERTICES,
        )
        .sendMsgToDst(Pregel.src("rank") / Pregel.src("outDegree"))
        .aggMsgs(F.sum(Pregel.msg()))
        .run(progress=False, event_log=log)
    )
    with open(log) as events:
        started = [e for e in map(json.loads, events) if e["event"] == "iteration_started"]
    return {
        "expression_components": {r["id"]: r["label"] for r in labels.collect()},
        "builder_ranks": {r["id"]: r["rank"] for r in ranks.collect()},
        "engines": [e["notes"].get("engine") for e in started],
    }


def smallest_label() -> VertexProgram:
    """Connected components as a numpy vertex program: the smallest id around, both ways."""

    def smaller(mine: dict, theirs: dict) -> np.ndarray:  # type: ignore[type-arg]
        return np.ma.masked_array(mine["label"], mine["label"] >= theirs["label"])

    return VertexProgram(
        state={"label": np.int64},
        init=lambda v: {"label": v["id"].to_numpy()},
        send_to_dst=lambda src, dst, e: smaller(src, dst),
        send_to_src=lambda src, dst, e: smaller(dst, src),
        merge="min",
        apply=lambda s, m, got: (
            {"label": np.where(got, np.minimum(s["label"], m), s["label"])},
            got & (m < s["label"]),
        ),
    )


def sampled(spark: SparkSession) -> dict:  # type: ignore[type-arg]
    """Two rounds of a slow UDF (>= 1 s each), sampled every 0.2 s: what the client's
    progress handler let iterflow see of them."""
    samples: list[itf.RoundSample] = []

    class Samples(itf.RoundListener):
        def on_round_progress(self, sample: itf.RoundSample) -> None:
            samples.append(sample)

    result = (
        itf.BoundedIteration(slow_body(0.1))  # the body of the classic session's tests
        .bind("x", values(spark))
        .until(itf.max_rounds(2))
        .listen(Samples())
        .run(progress=False, progress_interval_s=0.2)
    )
    return {
        "durations": [p.duration_s for p in result.history],
        # The round's exact counts; an observation Spark Connect left undelivered (None,
        # as PySpark 4.0 leaves the one inside this small feedback's plan) is left out.
        "counts": [
            {**{k: v for k, v in p.observed.items() if v is not None}, **p.rows}
            for p in result.history
        ],
        "samples": [
            {
                "epoch": s.epoch,
                "fraction": s.fraction_done,
                "done": s.tasks_done,
                "total": s.tasks_total,
                "final": s.final,
                "rows_by_step": dict(s.rows_by_step),
            }
            for s in samples
        ],
    }


def estimator(spark: SparkSession, rng: np.random.Generator) -> dict:  # type: ignore[type-arg]
    """A pyspark.ml Estimator over Connect: L-BFGS on array features, saved and loaded."""
    x = rng.normal(size=(400, 2))
    y = (rng.random(400) < 1.0 / (1.0 + np.exp(-(x @ np.array([1.0, -2.0]) + 0.5)))).astype(float)
    table = pa.table({"features": list(x), "label": y})
    model = (
        LogisticRegression(tol=1e-9)
        .setIterationOptions(progress=False)
        .fit(spark.createDataFrame(table))
    )
    path = os.path.join(tempfile.mkdtemp(), "lr")
    model.write().save(path)
    loaded = LogisticRegressionModel.load(path)
    # An IterativeEstimator over Connect: the start is a seeded shuffle's rows (no RDDs).
    mixture = (
        GaussianMixture(k=2, seed=3, featuresCol="features")
        .setIterationOptions(progress=False)
        .fit(spark.createDataFrame(table))
    )
    return {
        "mixture_weights": mixture.weights,
        "mixture_loglik": mixture.summary.logLikelihood,
        "x": x.tolist(),
        "y": y.tolist(),
        "coefficients": [*model.coefficients.toArray().tolist(), model.intercept],
        "loaded": [*loaded.coefficients.toArray().tolist(), loaded.intercept],
        "iterations": model.summary.totalIterations,
    }


def released(spark: SparkSession, rounds: int = 30) -> dict:  # type: ignore[type-arg]
    """A run of ``rounds`` rounds whose variable is checkpointed on the server: how many
    checkpoints the client still refers to after each round, and how many RDDs the
    server still stores once its JVM collected garbage. The server's plan cache (which
    keeps the plans of the last 16 commands, and their checkpoints with them) is off, so
    what is left is what iterflow holds."""
    from pyspark import SparkContext
    from pyspark.sql.connect.plan import CachedRemoteRelation

    server = SparkContext._active_spark_context  # the in-process server's classic context
    assert server is not None

    def stored() -> list[int]:
        """RDDs the server stores, after each of up to 20 collections until none is left
        that its cleaner frees (what the JVM's GC found unreachable)."""
        counts = [len(server._jsc.sc().getRDDStorageInfo())]
        for _ in range(20):
            server._jvm.System.gc()
            time.sleep(0.25)
            counts.append(len(server._jsc.sc().getRDDStorageInfo()))
            if len(counts) >= 3 and counts[-1] == counts[-2] == counts[-3]:
                break
        return counts

    spark.conf.set("spark.connect.session.planCache.enabled", "false")
    before = stored()
    referred: list[int] = []

    def count(end: itf.RoundEnd) -> None:
        gc.collect()
        referred.append(sum(isinstance(o, CachedRemoteRelation) for o in gc.get_objects()))

    @itf.body
    def step(x: DataFrame) -> itf.Declaration:
        following = x.select("i", (F.col("v") * 0.5 + 1).alias("v"))
        return itf.Declaration(feedback={"x": following}, outputs={"x": following})

    start = spark.range(3000).select(F.col("id").alias("i"), F.lit(1.0).alias("v"))
    result = (
        itf.BoundedIteration(step)
        .bind("x", start)
        .until(itf.max_rounds(rounds))
        .listen(count)
        .run(progress=False)
    )
    result.release()
    del result
    gc.collect()
    after = stored()
    spark.conf.unset("spark.connect.session.planCache.enabled")
    return {"referred": referred, "before": before, "after": after}


def main() -> None:
    # PySpark's in-process Connect server: it listens on port 15002, where its client
    # connects (the test checks first that no other server holds the port).
    spark = SparkSession.builder.remote("local[2]").getOrCreate()
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    # The server reports each operation's stages to the client's progress handler this
    # often (2 s by default, longer than the sampled rounds' operations).
    spark.conf.set("spark.connect.progress.reportInterval", "100ms")
    rng = np.random.default_rng(5)
    points = np.concatenate([rng.normal(c, 0.3, (100, 2)) for c in ([0, 0], [5, 0], [0, 5])])
    frame = spark.createDataFrame(pa.table({"x": points[:, 0], "y": points[:, 1]}))
    model = kmeans(
        frame,
        3,
        features=["x", "y"],
        init=points[[0, 100, 200]],
        tol=None,
        max_rounds=5,
        progress=False,
        event_log=EVENT_LOG,
    )
    with open(EVENT_LOG) as lines:
        started = next(e for e in map(json.loads, lines) if e["event"] == "iteration_started")
    seeded = kmeans(frame, 3, features=["x", "y"], seed=3, progress=False)
    x = rng.normal(size=(200, 2))
    y = x @ np.array([1.5, -0.5]) + 0.25
    rows = spark.createDataFrame(pa.table({"x0": x[:, 0], "x1": x[:, 1], "label": y}))
    fit = linear_regression(
        rows,
        features=["x0", "x1"],
        solver="gd",
        learning_rate=0.9,
        tol=1e-10,
        max_rounds=300,
        progress=False,
    )
    print(
        json.dumps(
            {
                "estimator": estimator(spark, rng),
                "small": halving(spark, 10),  # held on the driver
                "large": halving(spark, 3000),  # local checkpoints on the server
                "criteria": criteria(spark),
                "kmeans": model.centroids.tolist(),
                "kmeans_resident": started["resident"],
                "kmeans_rounds_resident": [p.resident for p in model.result.history],
                "kmeans_seeded": sorted(np.round(seeded.centroids).tolist()),
                "coefficients": [*fit.coefficients.tolist(), fit.intercept],
                "executor_metric": executor_metric(spark),
                "graph": graph_arrow(spark),
                "sampled": sampled(spark),
                "released": released(spark),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main()
