"""Resident rounds: kernels sent to long-running Spark tasks, against a Spark job per round.

With ``spark.iterflow.resident`` = ``auto`` (the default) the data a body passes to
``ctx.columnar(df, prepare)`` is loaded once into long-running Spark tasks (the
*resident job*), and every round's ``map(kernel, ..., combine=...)`` is a message to
them over the driver's Arrow Flight data plane. ``off`` is the per-round-job path:
the data written once as Arrow files, one Spark job per ``map``. On this ``local[2]``
session (2 task slots) ``auto`` runs one resident task, which holds all 4 partitions
and runs their kernels one after another: resident tasks take at most half the slots.
The setting is read when a run starts, so every run sets it with
``spark.conf.set("spark.iterflow.resident", mode)`` (one py4j call, inside its timed
block). Every run records ``RoundProgress.resident`` for each round: a "resident" run
must have all its rounds resident and an "off" run none (reported, and said loudly
if not).

The workloads are those of ``bench_graph.py`` and ``bench_ml.py``, built by their
functions, cached and counted before anything is timed:

1. **PageRank** on 100,000 vertices and 1,000,000 edges whose ``src`` and ``dst`` are
   uniform random from ``default_rng(0)`` (``bench_graph.random_edges``; ``--quick``:
   10,000 and 100,000), nothing filtered. iterflow gets ``Graph(spark.range(n),
   edges)``, the edges ``spark.createDataFrame`` of the arrays repartitioned to 4;
   GraphX reads the same arrays as an edge-list file (``graphx_peer.load_graph``, 4
   edge partitions, cached and counted). Timed: ``pagerank(g, tol=None,
   max_rounds=10, method="arrow", progress=False).count()`` from the call until the
   count returns, so iterflow's preparation (collecting the vertex ids, repartitioning
   the edges by source, round 0 loading them into the resident task or writing them
   as Arrow files, and turning the rank vector back into a DataFrame) counts against
   it; ``graphx_peer.pagerank(spark, jgraph, 10)`` (``PageRank.run`` on the loaded
   graph and ``vertices().count()``). As in ``bench_graph.py``, GraphX's load is then
   timed again, warm, and the target ratio is iterflow resident / (GraphX warm load +
   ``PageRank.run``), medians: target <= 0.5. Checks on the warm-up runs: resident
   ranks == off ranks exactly; both against ``bench_graph.numpy_pagerank`` (networkx's
   normalization); GraphX against its own numpy replica.
2. **k-means**, 1,000,000 points x 16, k = 16, 20 rounds (``bench_ml.kmeans_inputs``;
   ``--quick``: 100,000): ``kmeans(points, 16, init=centroids, max_rounds=20,
   tol=None, progress=False)`` against MLlib's ``mllib.clustering.KMeans`` from the
   same centroids (``bench_ml.mllib_kmeans_same_init``), each timed from the call
   until the centroids are on the driver. Target iterflow resident / MLlib <= 0.6.
   Checks: resident centroids == off centroids exactly; both within 1e-6 of MLlib's
   (``bench_ml.check_centroids``), with the final costs.
3. **Logistic regression**, 1,000,000 rows x 20 (``bench_ml.regression_inputs``):
   ``logistic_regression(df, features=[20 columns], max_rounds=50, tol=None,
   solver="gd", learning_rate=1.0, progress=False)`` (gradient descent, 50 rounds) against
   ``LogisticRegression(maxIter=50, tol=0.0, regParam=0.0,
   standardization=False).fit`` (L-BFGS; ``bench_ml.mllib_logistic``). The figure
   compared is seconds per iteration (total / iterations): target resident / MLlib
   <= 0.2. Checks: resident coefficients == off coefficients exactly; both against 50
   steps of the same gradient descent in numpy on the rows read back from the
   DataFrame (max difference reported, at most 1e-9 asked).
4. **A no-op resident kernel round**: a bounded iteration over a one-row model (16
   doubles) and ``points`` = ``spark.range(0, 100_000, 1, 4)`` as one double column,
   cached. The body reads the model (held on the driver: no job) and calls
   ``ctx.columnar(points).map(one_row, "x ARRAY<DOUBLE>", model, combine=first_row,
   combine_schema="x ARRAY<DOUBLE>")``: each kernel returns one row (the model), the
   combine returns the first of them, the one-row model, fed back. 100 rounds
   (``--quick``: 20). Figure: the median of ``RoundProgress.duration_s`` over rounds
   1.. (round 0 loads the data), resident against off; target resident <= 10 ms. Next
   to it, in the same run, ``bench_noop_round.run_iterflow`` (the old no-op body: a
   one-row DataFrame fed back, one ``localCheckpoint`` job per round) and the figure
   ``bench_noop_round.json`` recorded.
5. **Per-round times** of 1-3 in both modes: the median over runs of each run's
   median ``duration_s`` of rounds 1.. ("round"), the median of round 0's
   ``duration_s`` ("preparation": loading or writing the data and the first kernels),
   and, for PageRank, the time outside the rounds (total - sum of ``duration_s``).

Each comparison runs one warm-up of every variant, then 3 runs of each (``--quick``:
1), rotating which goes first (A, B, C / B, C, A / C, A, B); figures are medians and
ratios are ratios of medians. Every timed block runs in its own job group
(``_common.count_jobs``); between runs the script collects garbage (not timed). The
session is ``_common.start_session()``: ``local[2]``, 4 shuffle partitions, AQE on
(Spark's default) with partition coalescing, driver memory 2g, UI off.

    python benchmarks/bench_resident.py [--quick]
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_graph
import bench_ml
import bench_noop_round
import graphx_peer
import numpy as np
import pyarrow as pa
from _common import (
    RESULTS,
    RoundClock,
    Runner,
    alternate,
    compare_runners,
    count_jobs,
    finish,
    log,
    median,
    parse_args,
    print_table,
    ratio,
    settle,
    start_session,
    time_run,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import Graph
from iterflow.runtime.datacache.resident_policy import PROCESSES_CONF, RESIDENT_CONF

TARGET_PAGERANK = 0.35  # iterflow resident / (GraphX warm load + PageRank.run)
TARGET_KMEANS = 0.4  # iterflow resident / MLlib from the same centroids
TARGET_LOGISTIC = 0.12  # iterflow resident / MLlib, seconds per iteration
TARGET_NOOP_S = 0.010  # median duration_s of a resident no-op kernel round
LR_TOL = 1e-9  # iterflow's coefficients against numpy's gradient descent
MODES = {"resident": "auto", "off": "off"}
NOOP_DIMS = 16
NOOP_SCHEMA = "x ARRAY<DOUBLE>"
NOOP_POINTS = 100_000


# -- what every iterflow run records -----------------------------------------------


class GraphRounds(bench_graph.Rounds):
    """``bench_graph.Rounds`` plus each round's ``RoundProgress.resident``."""

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "resident": [p.resident for p in self.progress]}


class MLRounds(bench_ml.Rounds):
    """``bench_ml.Rounds`` plus each round's ``RoundProgress.resident``."""

    def __init__(self) -> None:
        super().__init__()
        self.resident: list[bool] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        super().on_round_end(ctx)
        self.resident.append(ctx.progress.resident)

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "resident": self.resident}


def set_mode(spark: SparkSession, variant: str) -> None:
    spark.conf.set(RESIDENT_CONF, MODES[variant])


def in_mode(spark: SparkSession, variant: str, runner: Runner) -> Runner:
    """``runner`` in one resident mode: the setting is set first, inside the timed block."""

    def run() -> tuple[Any, dict[str, Any]]:
        set_mode(spark, variant)
        return runner()

    return run


def round_figures(summary: dict[str, Any], variant: str) -> dict[str, Any]:
    """Item 5 for one iterflow variant of a ``compare_runners`` summary: per-round medians
    (rounds 1..), round 0, time outside the rounds, and whether the rounds were resident
    as the variant asks."""
    s = summary[variant]
    infos = s["runs"]
    per_run = [median(i["duration_s"][1:]) for i in infos]
    first = [i["duration_s"][0] for i in infos]
    outside = [total - sum(i["duration_s"]) for total, i in zip(s["s"], infos, strict=True)]
    flags = [flag for i in [s["warm_up"], *infos] for flag in i["resident"]]
    expected = variant == "resident"
    as_asked = all(flag == expected for flag in flags)
    if not as_asked:
        log(f"  WARNING: {variant} rounds resident: {[i['resident'] for i in infos]}")
    return {
        "round_s_median": median(per_run),
        "round_s_per_run": per_run,
        "round0_s_median": median(first),
        "round0_s": first,
        "outside_rounds_s_median": median(outside),
        "outside_rounds_s": outside,
        "rounds_resident_as_asked": as_asked,
        "resident_rounds": sum(flags),
        "rounds": len(flags),
    }


# -- 1. PageRank ---------------------------------------------------------------------


def _drain(batches: Any) -> Any:
    """``mapInArrow`` function: read every batch, return one row of their count."""
    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def scan_s(spark: SparkSession, df: DataFrame, repetitions: int = 3) -> dict[str, Any]:
    """One scan of the cached ``df`` into Python by all cores (a task per partition, every
    batch read as Arrow and dropped): what round 0 is measured against."""
    times = []
    for _ in range(repetitions):
        clock = time.perf_counter()
        df.mapInArrow(_drain, "rows LONG").collect()
        times.append(time.perf_counter() - clock)
    return {"s_median": median(times), "s": times}


def round0_against_scan(summary: dict[str, Any], scan: dict[str, Any]) -> None:
    """Record the scan and round 0 of each iterflow variant over it."""
    summary["scan"] = scan
    for variant in MODES:
        summary[f"ratio_{variant}_round0_over_scan"] = (
            summary[variant]["round0_s_median"] / scan["s_median"]
        )


def pagerank_comparison(
    spark: SparkSession, n: int, m: int, repetitions: int, tmp: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    rounds = bench_graph.ROUNDS
    src, dst = bench_graph.random_edges(n, m)
    path = tmp / "edges.txt"
    graphx_peer.write_edge_list(path, src, dst)
    clock = time.perf_counter()
    jgraph = graphx_peer.load_graph(spark, path, bench_graph.PARTITIONS)
    graph: dict[str, Any] = {"vertices": n, "edges": m}
    graph["graphx_first_load_s"] = time.perf_counter() - clock
    clock = time.perf_counter()
    vertices, edges = bench_graph.cached_inputs(spark, {"src": src, "dst": dst}, n)
    graph["iterflow_inputs_s"] = time.perf_counter() - clock
    log(
        f"graph: {n:,} vertices, {m:,} edges; GraphX load {graph['graphx_first_load_s']:.2f} s, "
        f"iterflow inputs {graph['iterflow_inputs_s']:.2f} s"
    )
    g = Graph(vertices, edges)
    expected = bench_graph.numpy_pagerank(src, dst, n, rounds)

    def check(results: dict[str, Any]) -> dict[str, Any]:
        ids_r, ranks_r = bench_graph.sorted_column(results["resident"], "pagerank")
        ids_o, ranks_o = bench_graph.sorted_column(results["off"], "pagerank")
        gx_ids, gx_ranks = graphx_peer.ranks_of(spark, results["graphx"])
        ref_ids, ref_ranks = graphx_peer.reference_pagerank(src, dst, rounds)
        found = {
            "resident_equals_off": bool(
                np.array_equal(ids_r, ids_o) and np.array_equal(ranks_r, ranks_o)
            ),
            "resident_vs_numpy": bench_graph.check_pagerank(results["resident"], expected),
            "off_vs_numpy": bench_graph.check_pagerank(results["off"], expected),
            "graphx_on_edge_vertices": bool(np.array_equal(gx_ids, ref_ids)),
            "graphx_max_abs_difference_vs_replica": float(np.abs(gx_ranks - ref_ranks).max()),
        }
        if not found["resident_equals_off"]:
            log("  CHECK FAILED: resident ranks differ from the off ranks")
        return found

    log(f"PageRank, {rounds} rounds: {repetitions} runs each after a warm-up")
    summary = compare_runners(
        spark,
        "pagerank",
        {
            "resident": in_mode(
                spark, "resident", bench_graph.iterflow_pagerank(g, "arrow", GraphRounds)
            ),
            "off": in_mode(spark, "off", bench_graph.iterflow_pagerank(g, "arrow", GraphRounds)),
            "graphx": bench_graph.graphx_pagerank(spark, jgraph),
        },
        repetitions,
        check,
        bench_graph.release_graphx,
    )
    log(f"  checks: {summary['check']}")
    log(f"GraphX edge-list load again, warm: {repetitions} runs")
    loads = [
        time_run(spark, "graphx load", bench_graph.graphx_load(spark, path))
        for _ in range(repetitions)
    ]
    load = {"s_median": median([r.seconds for r in loads]), "s": [r.seconds for r in loads]}
    summary["graphx_load"] = load
    load_plus_run = bench_graph.load_plus_run(load, summary["graphx"])
    summary["graphx_load_plus_run"] = load_plus_run
    for variant in MODES:
        summary[variant].update(round_figures(summary, variant))
        summary[f"ratio_{variant}_over_graphx_load_plus_run"] = ratio(
            summary[variant], load_plus_run
        )
        summary[f"ratio_{variant}_over_graphx_run"] = ratio(summary[variant], summary["graphx"])
    summary["ratio_resident_over_off"] = ratio(summary["resident"], summary["off"])
    summary["ratio_resident_over_off_round"] = (
        summary["resident"]["round_s_median"] / summary["off"]["round_s_median"]
    )
    summary["graphx"]["s_per_round_median"] = summary["graphx"]["s_median"] / rounds
    round0_against_scan(summary, scan_s(spark, edges))
    jgraph.unpersist(True)
    edges.unpersist()
    vertices.unpersist()
    return graph, summary


# -- 2. k-means ----------------------------------------------------------------------


def kmeans_comparison(spark: SparkSession, n: int, repetitions: int) -> dict[str, Any]:
    points, start, arrays, vectors, build_s = bench_ml.kmeans_inputs(spark, n)
    del points
    log(f"k-means inputs: {n:,} points x {bench_ml.DIMS}, cached and counted in {build_s:.1f} s")
    jstart = bench_ml.jvm_centroids(spark, start)
    if not np.array_equal(bench_ml.from_jvm(jstart), start):
        raise RuntimeError("the initial centroids changed on their way to the JVM")

    def check(results: dict[str, Any]) -> dict[str, Any]:
        mllib = results["mllib_same_init"]
        found = {
            "resident_equals_off": bool(np.array_equal(results["resident"], results["off"])),
            "resident_vs_mllib": bench_ml.check_centroids(results["resident"], mllib, start),
            "off_vs_mllib": bench_ml.check_centroids(results["off"], mllib, start),
        }
        if not found["resident_equals_off"]:
            log("  CHECK FAILED: resident centroids differ from the off centroids")
        return found

    log(f"k-means, {bench_ml.KMEANS_ROUNDS} rounds: {repetitions} runs each after a warm-up")
    summary = bench_ml.compare(
        spark,
        "kmeans",
        {
            "resident": in_mode(
                spark, "resident", bench_ml.iterflow_kmeans(arrays, start, MLRounds)
            ),
            "off": in_mode(spark, "off", bench_ml.iterflow_kmeans(arrays, start, MLRounds)),
            "mllib_same_init": bench_ml.mllib_kmeans_same_init(spark, vectors, jstart),
        },
        repetitions,
        check,
    )
    mllib_cost = summary["mllib_same_init"]["warm_up"]["final_cost"]
    for variant in MODES:
        cost = summary[variant]["warm_up"]["final_loss"]
        summary["check"][f"final_cost_relative_difference_{variant}_vs_mllib"] = abs(
            cost - mllib_cost
        ) / abs(mllib_cost)
        summary[variant].update(round_figures(summary, variant))
        summary[f"ratio_{variant}_over_mllib"] = ratio(summary[variant], summary["mllib_same_init"])
    log(f"  checks: {summary['check']}")
    summary["ratio_resident_over_off"] = ratio(summary["resident"], summary["off"])
    summary["ratio_resident_over_off_round"] = (
        summary["resident"]["round_s_median"] / summary["off"]["round_s_median"]
    )
    summary["inputs"] = {"points": n, "dims": bench_ml.DIMS, "k": bench_ml.K, "build_s": build_s}
    round0_against_scan(summary, scan_s(spark, arrays))
    vectors.unpersist()
    arrays.unpersist()
    return summary


# -- 3. logistic regression ------------------------------------------------------------


def numpy_logistic(columns: DataFrame, names: list[str]) -> np.ndarray:
    """``LR_ROUNDS`` steps of full-batch gradient descent on the logistic loss, in numpy,
    from zero, on the rows of ``columns`` (coefficients, the intercept last)."""
    table = columns.select(*names, "label").toArrow()
    x = np.column_stack([table.column(c).to_numpy() for c in names])
    y = table.column("label").to_numpy()
    w = np.zeros(len(names) + 1)
    for _ in range(bench_ml.LR_ROUNDS):
        slope = 1.0 / (1.0 + np.exp(-(x @ w[:-1] + w[-1]))) - y
        w = w - bench_ml.LEARNING_RATE * np.append(x.T @ slope, slope.sum()) / len(y)
    return w


def logistic_comparison(spark: SparkSession, n: int, repetitions: int) -> dict[str, Any]:
    names, columns, assembled, inputs = bench_ml.regression_inputs(spark, n)
    log(
        f"regression inputs: {n:,} rows x {bench_ml.LR_FEATURES}, cached and counted in "
        f"{inputs['build_and_cache_s']:.1f} s"
    )

    def check(results: dict[str, Any]) -> dict[str, Any]:
        reference = numpy_logistic(columns, names)
        gaps = {v: float(np.abs(results[v] - reference).max()) for v in MODES}
        found = {
            "resident_equals_off": bool(np.array_equal(results["resident"], results["off"])),
            "max_abs_difference_vs_numpy": gaps,
            "within_tolerance_of_numpy": all(gap <= LR_TOL for gap in gaps.values()),
            "tolerance": LR_TOL,
            "coefficients_finite": bool(all(np.isfinite(v).all() for v in results.values())),
        }
        if not (found["resident_equals_off"] and found["within_tolerance_of_numpy"]):
            log(f"  CHECK FAILED: {found}")
        return found

    log(f"logistic regression, {bench_ml.LR_ROUNDS} rounds: {repetitions} runs each")
    summary = bench_ml.compare(
        spark,
        "logistic",
        {
            "resident": in_mode(
                spark, "resident", bench_ml.iterflow_logistic(columns, names, MLRounds)
            ),
            "off": in_mode(spark, "off", bench_ml.iterflow_logistic(columns, names, MLRounds)),
            "mllib": bench_ml.mllib_logistic(assembled),
        },
        repetitions,
        check,
    )
    for variant in MODES:
        summary["check"][f"final_loss_{variant}"] = summary[variant]["warm_up"]["final_loss"]
        summary[variant].update(round_figures(summary, variant))
        summary[f"ratio_{variant}_over_mllib_per_iteration"] = ratio(
            summary[variant], summary["mllib"], "s_per_iteration"
        )
    summary["check"]["final_loss_mllib"] = summary["mllib"]["warm_up"]["final_loss"]
    log(f"  checks: {summary['check']}")
    summary["ratio_resident_over_off"] = ratio(summary["resident"], summary["off"])
    summary["ratio_resident_over_off_round"] = (
        summary["resident"]["round_s_median"] / summary["off"]["round_s_median"]
    )
    summary["inputs"] = inputs
    round0_against_scan(summary, scan_s(spark, columns))
    assembled.unpersist()
    columns.unpersist()
    return summary


# -- 4. the no-op resident kernel round -----------------------------------------------


def one_row(table: pa.Table, model: np.ndarray) -> pa.Table:
    """Kernel: ignores its partition and returns one row, the model."""
    return pa.table([itf.vector_cell(model)], names=["x"])


def first_row(batches: Any) -> Any:
    """Combine: the first of the kernels' rows (the one-row model)."""
    for batch in batches:
        if batch.num_rows:
            yield batch.slice(0, 1)
            return


@itf.body
def noop_kernel_round(
    model: DataFrame, points: DataFrame, ctx: itf.RoundContext
) -> itf.Declaration:
    current = itf.vector(model, "x").astype(np.float64)  # held on the driver
    new_model = ctx.columnar(points).map(
        one_row, NOOP_SCHEMA, current, combine=first_row, combine_schema=NOOP_SCHEMA
    )
    return itf.Declaration(feedback={"model": new_model})


def noop_run(spark: SparkSession, points: DataFrame, variant: str, rounds: int) -> dict[str, Any]:
    model = spark.createDataFrame(
        pa.table([itf.vector_cell(np.arange(NOOP_DIMS, dtype=np.float64))], names=["x"]),
        NOOP_SCHEMA,
    )
    settle(spark)
    clock = RoundClock()
    with count_jobs(spark, f"noop-kernel-{variant}") as jobs:
        set_mode(spark, variant)
        clock.start = time.perf_counter()
        result = (
            itf.BoundedIteration(noop_kernel_round)
            .bind("model", model)
            .bind("points", points)
            .until(itf.max_rounds(rounds))
            .listen(clock)
            .run(progress=False)
        )
        total = time.perf_counter() - clock.start
    if result.rounds != rounds:
        raise RuntimeError(f"no-op kernel run ended after {result.rounds} rounds")
    duration = [p.duration_s for p in result.history]
    resident = [p.resident for p in result.history]
    result.release()
    return {
        "total_s": total,
        "round_s": clock.round_times,
        "duration_s": duration,
        "resident": resident,
        "jobs": jobs.jobs,
    }


def old_noop_run(spark: SparkSession, rounds: int) -> dict[str, Any]:
    """``bench_noop_round.run_iterflow``: a one-row DataFrame fed back, no kernel."""
    settle(spark)
    return bench_noop_round.run_iterflow(spark, rounds)


def noop_comparison(spark: SparkSession, rounds: int, repetitions: int) -> dict[str, Any]:
    points = spark.range(0, NOOP_POINTS, 1, bench_ml.PARTITIONS)
    points = points.select(F.col("id").cast("double").alias("x")).cache()
    points.count()
    runners = {
        "resident": lambda r: noop_run(spark, points, "resident", r),
        "off": lambda r: noop_run(spark, points, "off", r),
        "old_noop_body": lambda r: old_noop_run(spark, r),
    }
    names = list(runners)
    log("no-op rounds: warm-up, 10 rounds each")
    warm = {name: runners[name](10) for name in names}

    def measure(name: str) -> dict[str, Any]:
        run = runners[name](rounds)
        per_round = median(run["duration_s"][1:])
        log(
            f"  no-op {name}: {rounds} rounds in {run['total_s']:.2f} s, median duration_s "
            f"(rounds 1..) {per_round * 1000:.1f} ms, {run['jobs']} jobs"
        )
        return run

    sequence, runs = alternate(names, repetitions, measure)
    summary: dict[str, Any] = {"sequence": sequence, "rounds": rounds}
    for name, rs in runs.items():
        per_run = [median(r["duration_s"][1:]) for r in rs]
        summary[name] = {
            "duration_s_median": median(per_run),
            "duration_s_median_per_run": per_run,
            "wall_round_s_median": median([median(r["round_s"][1:]) for r in rs]),
            "round0_s": [r["duration_s"][0] for r in rs],
            "jobs_per_round": median([r["jobs"] for r in rs]) / rounds,
            "total_s": [r["total_s"] for r in rs],
            "runs": rs,
            "warm_up": warm[name],
        }
    for variant in MODES:
        flags = [f for r in [warm[variant], *runs[variant]] for f in r["resident"]]
        summary[variant]["rounds_resident_as_asked"] = all(
            f == (variant == "resident") for f in flags
        )
    summary["ratio_resident_over_off"] = (
        summary["resident"]["duration_s_median"] / summary["off"]["duration_s_median"]
    )
    summary["ratio_resident_over_old_noop_body"] = (
        summary["resident"]["duration_s_median"] / summary["old_noop_body"]["duration_s_median"]
    )
    recorded = RESULTS / "bench_noop_round.json"
    if recorded.exists():
        old = json.loads(recorded.read_text())
        summary["bench_noop_round_json"] = {
            "measured_at": old["measured_at"],
            "iterflow_commit": old["settings"]["iterflow_commit"],
            "iterflow_round_median_s": old["results"]["iterflow_round_median_s"],
            "iterflow_duration_s_median": old["results"]["iterflow_duration_s_median"],
        }
    points.unpersist()
    return summary


# -- main ------------------------------------------------------------------------------


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0],
        one_process="run each resident task's kernels in the task itself "
        "(spark.iterflow.resident.processes=1), the policy before kernel processes; "
        "writes bench_resident.one_process.json",
    )
    if args.quick:
        n, m, points, rows, noop_rounds, repetitions = 10_000, 100_000, 100_000, 100_000, 20, 1
    else:
        n, m, points, rows, noop_rounds, repetitions = (
            100_000,
            1_000_000,
            1_000_000,
            1_000_000,
            100,
            3,
        )
    started = time.perf_counter()
    spark = start_session()
    if args.one_process:
        spark.conf.set(PROCESSES_CONF, "1")
    tmp = Path(tempfile.mkdtemp(prefix="iterflow-bench-resident-"))
    try:
        graph, pr = pagerank_comparison(spark, n, m, repetitions, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    km = kmeans_comparison(spark, points, repetitions)
    lr = logistic_comparison(spark, rows, repetitions)
    noop = noop_comparison(spark, noop_rounds, repetitions)
    spark.conf.unset(RESIDENT_CONF)
    elapsed = time.perf_counter() - started

    targets = {
        "pagerank_resident_over_graphx_load_plus_run": TARGET_PAGERANK,
        "kmeans_resident_over_mllib": TARGET_KMEANS,
        "logistic_resident_over_mllib_per_iteration": TARGET_LOGISTIC,
        "noop_resident_round_s": TARGET_NOOP_S,
    }
    measured = {
        "pagerank_resident_over_graphx_load_plus_run": pr[
            "ratio_resident_over_graphx_load_plus_run"
        ]["of_medians"],
        "kmeans_resident_over_mllib": km["ratio_resident_over_mllib"]["of_medians"],
        "logistic_resident_over_mllib_per_iteration": lr["ratio_resident_over_mllib_per_iteration"][
            "of_medians"
        ],
        "noop_resident_round_s": noop["resident"]["duration_s_median"],
    }
    met = {key: measured[key] <= targets[key] for key in targets}
    results = {
        "targets": targets,
        "measured": measured,
        "met": met,
        "graph": graph,
        "pagerank": pr,
        "kmeans": km,
        "logistic_regression": lr,
        "noop_kernel_round": noop,
        "script_s": elapsed,
    }

    def verdict(key: str) -> str:
        return (
            f"{measured[key]:.4g} (target <= {targets[key]:g}: {'met' if met[key] else 'NOT met'})"
        )

    rows_out: list[tuple[str, Any]] = [
        ("PageRank: resident (s)", pr["resident"]["s_median"]),
        ("PageRank: off (s)", pr["off"]["s_median"]),
        ("PageRank: GraphX PageRank.run (s)", pr["graphx"]["s_median"]),
        ("PageRank: GraphX warm load (s)", pr["graphx_load"]["s_median"]),
        (
            "PageRank: resident / (GraphX load + run)",
            verdict("pagerank_resident_over_graphx_load_plus_run"),
        ),
        (
            "PageRank: off / (GraphX load + run)",
            pr["ratio_off_over_graphx_load_plus_run"]["of_medians"],
        ),
        ("PageRank: resident / GraphX run", pr["ratio_resident_over_graphx_run"]["of_medians"]),
        ("PageRank: off / GraphX run", pr["ratio_off_over_graphx_run"]["of_medians"]),
        ("PageRank: resident / off", pr["ratio_resident_over_off"]["of_medians"]),
        ("k-means: resident (s)", km["resident"]["s_median"]),
        ("k-means: off (s)", km["off"]["s_median"]),
        ("k-means: MLlib same centroids (s)", km["mllib_same_init"]["s_median"]),
        ("k-means: resident / MLlib", verdict("kmeans_resident_over_mllib")),
        ("k-means: off / MLlib", km["ratio_off_over_mllib"]["of_medians"]),
        ("k-means: resident / off", km["ratio_resident_over_off"]["of_medians"]),
        ("logistic: resident (s, 50 rounds)", lr["resident"]["s_median"]),
        ("logistic: off (s, 50 rounds)", lr["off"]["s_median"]),
        ("logistic: MLlib (s)", lr["mllib"]["s_median"]),
        ("logistic: resident s per iteration", lr["resident"]["s_per_iteration_median"]),
        ("logistic: off s per iteration", lr["off"]["s_per_iteration_median"]),
        ("logistic: MLlib s per iteration", lr["mllib"]["s_per_iteration_median"]),
        (
            "logistic: resident / MLlib per iteration",
            verdict("logistic_resident_over_mllib_per_iteration"),
        ),
        (
            "logistic: off / MLlib per iteration",
            lr["ratio_off_over_mllib_per_iteration"]["of_medians"],
        ),
        ("logistic: resident / off", lr["ratio_resident_over_off"]["of_medians"]),
        ("no-op kernel round: resident duration_s (s)", verdict("noop_resident_round_s")),
        ("no-op kernel round: off duration_s (s)", noop["off"]["duration_s_median"]),
        (
            "no-op round, old body (bench_noop_round), this run (s)",
            noop["old_noop_body"]["duration_s_median"],
        ),
        (
            "no-op round, bench_noop_round.json as recorded (s)",
            noop.get("bench_noop_round_json", {}).get("iterflow_duration_s_median"),
        ),
        ("no-op kernel round: resident / off", noop["ratio_resident_over_off"]),
        ("no-op: resident / old no-op body", noop["ratio_resident_over_old_noop_body"]),
        (
            "no-op: jobs per round, resident / off / old",
            f"{noop['resident']['jobs_per_round']:.2f} / {noop['off']['jobs_per_round']:.2f}"
            f" / {noop['old_noop_body']['jobs_per_round']:.2f}",
        ),
    ]
    for label, s in (("PageRank", pr), ("k-means", km), ("logistic", lr)):
        for variant in MODES:
            v = s[variant]
            rows_out.append(
                (
                    f"{label} {variant}: round 1.. / round 0 / outside rounds (s)",
                    f"{v['round_s_median']:.4f} / {v['round0_s_median']:.3f} / "
                    f"{v['outside_rounds_s_median']:.3f}",
                )
            )
        rows_out.append((f"{label}: round, resident / off", s["ratio_resident_over_off_round"]))
        rows_out.append(
            (
                f"{label}: scan of the input (s); round 0 / scan, resident (target <= 1.5)",
                f"{s['scan']['s_median']:.3f}; {s['ratio_resident_round0_over_scan']:.2f}",
            )
        )
    rows_out += [
        ("PageRank: resident ranks == off ranks", pr["check"]["resident_equals_off"]),
        (
            "PageRank: max |resident - numpy|",
            pr["check"]["resident_vs_numpy"]["max_abs_difference_vs_numpy"],
        ),
        ("k-means: resident centroids == off", km["check"]["resident_equals_off"]),
        (
            "k-means: max |resident - MLlib| centroid",
            km["check"]["resident_vs_mllib"]["max_distance_to_nearest_mllib_centroid"],
        ),
        ("logistic: resident coefficients == off", lr["check"]["resident_equals_off"]),
        (
            "logistic: max |resident - numpy|",
            lr["check"]["max_abs_difference_vs_numpy"]["resident"],
        ),
        (
            "all rounds resident as asked",
            all(s[v]["rounds_resident_as_asked"] for s in (pr, km, lr, noop) for v in MODES),
        ),
        ("script wall time (s)", elapsed),
    ]
    print_table(
        f"resident rounds vs a Spark job per round (medians of {repetitions}): PageRank "
        f"{n:,} / {m:,}, k-means {points:,} x 16, logistic {rows:,} x 20, no-op "
        f"{noop_rounds} rounds",
        rows_out,
    )
    finish(
        spark,
        "bench_resident.one_process" if args.one_process else "bench_resident",
        args.quick,
        results,
        resident_modes=MODES,
        resident_tasks="1 (local[2]: one per executor, at most half of the 2 task slots)",
        kernel_processes_per_task="1" if args.one_process else "2 (one per core)",
        pagerank_vertices=n,
        pagerank_edges=m,
        pagerank_rounds=bench_graph.ROUNDS,
        kmeans_points=points,
        kmeans_dims=bench_ml.DIMS,
        k=bench_ml.K,
        kmeans_rounds=bench_ml.KMEANS_ROUNDS,
        regression_rows=rows,
        regression_features=bench_ml.LR_FEATURES,
        regression_rounds=bench_ml.LR_ROUNDS,
        noop_rounds=noop_rounds,
        noop_points=NOOP_POINTS,
        partitions=bench_ml.PARTITIONS,
        repetitions=repetitions,
        warm_up_runs=1,
        iterflow_pagerank="pagerank(Graph(vertices, edges), tol=None, max_rounds=10, "
        "method='arrow', progress=False).count()",
        graphx="graphx_peer.pagerank(spark, jgraph, 10); load: graphx_peer.load_graph(spark, "
        "edge list, 4), timed warm",
        iterflow_kmeans="kmeans(points, 16, init=centroids, max_rounds=20, tol=None, "
        "progress=False)",
        mllib_kmeans="mllib.clustering.KMeans().setK(16).setMaxIterations(20).setEpsilon(0.0)"
        ".setInitialModel(KMeansModel(centroids)).run(...) via py4j",
        iterflow_logistic="logistic_regression(df, features=[x0..x19], max_rounds=50, "
        "tol=None, solver='gd', learning_rate=1.0, progress=False)",
        mllib_logistic="LogisticRegression(maxIter=50, tol=0.0, regParam=0.0, "
        "standardization=False).fit(VectorAssembler output)",
        noop="ctx.columnar(points).map(one_row, 'x ARRAY<DOUBLE>', model, combine=first_row, "
        "combine_schema='x ARRAY<DOUBLE>'), model 16 doubles, points 100,000 doubles in 4 "
        "partitions",
    )


if __name__ == "__main__":
    main()
