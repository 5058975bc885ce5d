"""Graphs that update as edges arrive: an epoch of ``iterflow.graph.streaming`` against a
from-scratch run of the same algorithm on the same edges.

The workload (fixed numpy seed): 100,000 vertices and 1,000,000 random edges (source and
target uniform) in one parquet file, then 20 files of 1,000 new random edges each.
The stream reads one file per micro-batch (``maxFilesPerTrigger=1``, available-now
trigger), so micro-batch 0 builds the graph and micro-batches 1..20 each add 1,000
edges. For components and PageRank (``tol=1e-6``):

- "streaming": ``streaming.connected_components(edges, sink=itf.FileSink(...))`` (or
  ``pagerank``), writing the output "vertices" (the whole result, 100,000+ rows) as
  parquet every epoch, with a fresh checkpoint location. Per micro-batch times are the
  stream's ``triggerExecution`` durations (the whole micro-batch: reading the files, the
  epoch, the sink, the commit); the rounds are the epoch's ``rounds`` metric.
- "scratch": ``iterflow.graph.connected_components(Graph(vertices, edges))`` (or
  ``pagerank(tol=1e-7)``: its ``tol`` bounds the change of a round, and ``1e-7`` puts
  the ranks within about ``6e-7`` of the exact ones, the streaming run's accuracy) on
  all 1,020,000 edges read from the same files, its result written as parquet.

The figure is the median incremental micro-batch (1..20) over the from-scratch run's
time. Checks: the streaming run's last epoch equals the from-scratch result (components
exactly, PageRank within 2e-6 in L1).

    python benchmarks/bench_streaming_graph.py [--quick]
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from _common import finish, log, median, parse_args, print_table, settle, start_session
from bench_unbounded import ProgressLog
from pyspark.sql import SparkSession

import iterflow as itf
from iterflow.graph import Graph, streaming
from iterflow.graph import connected_components as scratch_components
from iterflow.graph import pagerank as scratch_pagerank

SEED = 7
SCHEMA = "src long, dst long"
ALGORITHMS = ("components", "pagerank")


def write_edges(folder: Path, vertices: int, edges: int, batches: int, per_batch: int) -> None:
    """File 0: the graph; files 1..batches: the edges added per micro-batch."""
    rng = np.random.default_rng(SEED)
    folder.mkdir(parents=True)
    sizes = [edges] + [per_batch] * batches
    for index, size in enumerate(sizes):
        frame = pd.DataFrame(
            {"src": rng.integers(0, vertices, size), "dst": rng.integers(0, vertices, size)}
        )
        frame.to_parquet(folder / f"edges-{index:04d}.parquet")


def run_streaming(
    spark: SparkSession, progress: ProgressLog, algorithm: str, edges: Path, work: Path
) -> dict[str, Any]:
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(edges))
    out, ckpt = work / f"{algorithm}-out", work / f"{algorithm}-ckpt"
    start = dict(checkpoint_location=str(ckpt), available_now=True, progress=False)
    sink = itf.FileSink(str(out))
    progress.reset()
    clock = time.perf_counter()
    if algorithm == "components":
        query = streaming.connected_components(stream, sink=sink, **start)
    else:
        query = streaming.pagerank(stream, tol=1e-6, sink=sink, **start)
    query.awaitTermination()
    total = time.perf_counter() - clock
    batches = progress.wait()
    epochs = [e for p in query.recentProgress for e in p["iterflow"]["epochs"]]
    column = "component" if algorithm == "components" else "pagerank"
    last = spark.read.parquet(str(out)).where(f"epoch = {len(epochs) - 1}")
    return {
        "total_s": total,
        "batch_s": [b["triggerExecution"] for b in batches],
        "epoch_s": [e["duration_s"] for e in epochs],
        "rounds": [e["metrics"]["rounds"] for e in epochs],
        "changed": [e["metrics"]["changed"] for e in epochs],
        "last": last.select("id", column).toPandas().set_index("id")[column],
    }


def run_scratch(spark: SparkSession, algorithm: str, edges: Path, work: Path) -> dict[str, Any]:
    clock = time.perf_counter()
    frame = spark.read.schema(SCHEMA).parquet(str(edges))
    ids = frame.selectExpr("src AS id").union(frame.selectExpr("dst AS id")).distinct()
    graph = Graph(ids, frame)
    if algorithm == "components":
        result, column = scratch_components(graph), "component"
    else:
        result, column = scratch_pagerank(graph, tol=1e-7), "pagerank"
    out = work / f"{algorithm}-scratch"
    result.select("id", column).write.mode("overwrite").parquet(str(out))
    seconds = time.perf_counter() - clock
    values = spark.read.parquet(str(out)).toPandas().set_index("id")[column]
    return {"total_s": seconds, "values": values}


def compare(algorithm: str, streamed: pd.Series, scratch: pd.Series) -> float:
    """The largest difference (components: the count of differing vertices)."""
    joined = pd.concat([streamed.rename("s"), scratch.rename("b")], axis=1)
    if joined.isna().any().any():
        raise AssertionError(f"{algorithm}: the vertices differ")
    if algorithm == "components":
        wrong = int((joined["s"] != joined["b"]).sum())
        if wrong:
            raise AssertionError(f"components: {wrong} vertices differ from scratch")
        return 0.0
    gap = float((joined["s"] - joined["b"]).abs().sum())
    if gap > 2e-6:
        raise AssertionError(f"pagerank: L1 {gap} from scratch")
    return gap


def main() -> None:
    args = parse_args("Streaming graph epochs vs from-scratch runs")
    vertices, edges, batches, per_batch = (
        (10_000, 100_000, 5, 200) if args.quick else (100_000, 1_000_000, 20, 1_000)
    )
    spark = start_session()
    progress = ProgressLog()
    spark.streams.addListener(progress)
    work = Path(tempfile.mkdtemp(prefix="bench-streaming-graph-"))
    results: dict[str, Any] = {}
    rows: list[tuple[str, Any]] = []
    try:
        write_edges(work / "edges", vertices, edges, batches, per_batch)
        for algorithm in ALGORITHMS:
            log(f"{algorithm}: from scratch")
            scratch = run_scratch(spark, algorithm, work / "edges", work)
            settle(spark)
            log(f"{algorithm}: streaming")
            streamed = run_streaming(spark, progress, algorithm, work / "edges", work)
            settle(spark)
            gap = compare(algorithm, streamed.pop("last"), scratch.pop("values"))
            incremental = streamed["batch_s"][1:]
            ratio = median(incremental) / scratch["total_s"]
            results[algorithm] = {
                "scratch_s": scratch["total_s"],
                "first_batch_s": streamed["batch_s"][0],
                "median_batch_s": median(incremental),
                "median_epoch_s": median(streamed["epoch_s"][1:]),
                "ratio_median_batch_over_scratch": ratio,
                "rounds_per_epoch": streamed["rounds"],
                "changed_per_epoch": streamed["changed"],
                "difference_from_scratch": gap,
                **streamed,
            }
            rows += [
                (f"{algorithm}: from scratch (s)", scratch["total_s"]),
                (f"{algorithm}: micro-batch 0, the graph (s)", streamed["batch_s"][0]),
                (f"{algorithm}: median micro-batch 1..{batches} (s)", median(incremental)),
                (f"{algorithm}: median epoch duration_s (s)", median(streamed["epoch_s"][1:])),
                (f"{algorithm}: median / from scratch", ratio),
                (f"{algorithm}: rounds per epoch", streamed["rounds"]),
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(f"{vertices} vertices, {edges} edges, then {batches} x {per_batch} new edges", rows)
    finish(
        spark,
        "bench_streaming_graph",
        args.quick,
        results,
        seed=SEED,
        vertices=vertices,
        edges=edges,
        batches=batches,
        edges_per_batch=per_batch,
        pagerank_tol_streaming=1e-6,
        pagerank_tol_scratch=1e-7,
    )


if __name__ == "__main__":
    main()
