"""The block path of ``iterflow.graph`` (``method="blocks"``) against Apache Spark GraphX and
against iterflow's own ``method="dataframe"``, in the same JVM.

Four parts, each on graphs built as in ``bench_graph.py`` (uniform random ``src`` and
``dst`` from ``numpy.random.default_rng(0)``, self-loops and parallel edges kept; iterflow
reads them from cached DataFrames, GraphX from an edge-list file it loads with
``GraphLoader.edgeListFile`` into 4 edge partitions):

1. **Large graph** (default 2,000,000 vertices / 20,000,000 edges; ``--quick``: 100,000 /
   1,000,000): ``pagerank(g, tol=None, max_rounds=10, method="blocks")`` against
   ``PageRank.run(graph, 10)`` and ``connected_components(g, method="blocks")`` against
   ``ConnectedComponents.run``. iterflow's time is from the call to ``count()`` of the
   returned DataFrame: its whole preparation (vertex layout, edges joined with their
   blocks and written as Arrow files) counts. GraphX's time is the algorithm on the
   already loaded graph; its load is timed apart and reported beside (cold, then warm),
   and a second ratio adds it. Then PageRank once more with the vertex ids spread out
   (``id * 7 + 3``: no longer 0..n-1, so the layout joins edges with vertex positions
   instead of computing them from the ids), for iterflow alone. Checks: iterflow's ranks
   against a numpy power iteration with networkx's normalization
   (``bench_graph.numpy_pagerank``), its components against GraphX's labels.
2. **Blocks against the DataFrame path** on 100,000 / 1,000,000 (``--quick``: 10,000 /
   100,000): PageRank 10 rounds and connected components, ``method="blocks"`` (median of
   the runs) against ``method="dataframe"`` (one run).
3. **Shortest paths to landmarks** on the graph of part 2: ``shortest_paths(g, [0, 1, 2],
   method="blocks")`` against GraphX's ``ShortestPaths.run(graph, Seq(0, 1, 2))``;
   iterflow's distances are checked against ``scipy.sparse.csgraph`` breadth-first
   distances on the reversed graph.
4. **Pregel on blocks, rounds that follow their messages**: ``bench_graph``'s single-source
   shortest paths on the layered DAG (25 x 200, 960,200 edges; ``--quick`` 8 x 60) with
   ``method="blocks"``, with active vertices and with all: seconds and messages per round.

Every variant runs once to warm up, then ``--repetitions`` times (default 1, ``--quick``
1), alternating; the figures are medians. The session is ``local[2]`` with 4 shuffle
partitions and ``--driver-memory`` (default 12g: in local mode GraphX's graph and
iterflow's cached inputs both live in the driver's JVM). Results go to
``benchmarks/results/bench_graph_blocks.json``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import graphx_peer
import numpy as np
from _common import (
    Runner,
    compare_runners,
    finish,
    log,
    median,
    print_table,
    ratio,
    time_run,
)
from bench_graph import (
    PARTITIONS,
    ROUNDS,
    Rounds,
    cached_inputs,
    check_components,
    check_pagerank,
    graphx_components,
    graphx_load,
    graphx_pagerank,
    iterflow_components,
    iterflow_pagerank,
    load_plus_run,
    numpy_pagerank,
    pregel_comparison,
    random_edges,
    release_graphx,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from iterflow.graph import Graph, pagerank, shortest_paths

TARGET = 1.0
LANDMARKS = [0, 1, 2]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small graphs, one run each")
    parser.add_argument("--vertices", type=int, default=2_000_000, help="part 1's vertices")
    parser.add_argument("--edges", type=int, default=20_000_000, help="part 1's edges")
    parser.add_argument("--repetitions", type=int, default=1, help="measured runs per variant")
    parser.add_argument("--driver-memory", default="12g", help="spark.driver.memory")
    return parser.parse_args()


def _graphx_graph(spark: SparkSession, tmp: Path, src: np.ndarray, dst: np.ndarray) -> Any:
    """The edge list written and loaded cold into GraphX: ``(jgraph, path, facts)``."""
    clock = time.perf_counter()
    path = tmp / f"edges-{len(src)}.txt"
    graphx_peer.write_edge_list(path, src, dst)
    written = time.perf_counter() - clock
    clock = time.perf_counter()
    jgraph = graphx_peer.load_graph(spark, path, PARTITIONS)
    facts = {"write_edge_list_s": written, "graphx_load_cold_s": time.perf_counter() - clock}
    return jgraph, path, facts


def _warm_loads(spark: SparkSession, path: Path, repetitions: int) -> dict[str, Any]:
    loads = [time_run(spark, "graphx load", graphx_load(spark, path)) for _ in range(repetitions)]
    seconds = [r.seconds for r in loads]
    return {"s_median": median(seconds), "s": seconds}


def _components_check(spark: SparkSession, variant: str, n: int) -> tuple[Any, list[Any]]:
    """A ``compare_runners`` check of ``variant``'s components against GraphX's labels,
    and the list where it keeps those labels (read once, from the warm-up)."""
    labels: list[Any] = []

    def check(results: dict[str, Any]) -> dict[str, Any]:
        labels.append(graphx_peer.components_of(spark, results["graphx"]))
        return check_components(results[variant], labels[0], n)

    return check, labels


def _round_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """Round 0 (the preparation is in it) and the later rounds of the first measured run."""
    durations = summary["runs"][0]["duration_s"]
    return {
        "rounds": len(durations),
        "round_0_s": durations[0],
        "later_round_s_median": median(durations[1:]) if len(durations) > 1 else None,
    }


def large_graph(spark: SparkSession, tmp: Path, n: int, m: int, repetitions: int) -> dict[str, Any]:
    src, dst = random_edges(n, m)
    jgraph, path, facts = _graphx_graph(spark, tmp, src, dst)
    clock = time.perf_counter()
    vertices, edges = cached_inputs(spark, {"src": src, "dst": dst}, n)
    facts["iterflow_inputs_s"] = time.perf_counter() - clock
    log(f"graph {n} / {m}: {facts}")
    g = Graph(vertices, edges)
    expected = numpy_pagerank(src, dst, n, ROUNDS)

    pr = compare_runners(
        spark,
        "pagerank",
        {"iterflow": iterflow_pagerank(g, "blocks"), "graphx": graphx_pagerank(spark, jgraph)},
        repetitions,
        lambda results: check_pagerank(results["iterflow"], expected),
        release_graphx,
    )
    pr["iterflow_rounds"] = _round_figures(pr["iterflow"])
    pr["graphx_load_warm"] = _warm_loads(spark, path, repetitions)
    pr["ratio_iterflow_over_graphx"] = ratio(pr["iterflow"], pr["graphx"])
    pr["ratio_iterflow_over_graphx_load_plus_run"] = ratio(
        pr["iterflow"], load_plus_run(pr["graphx_load_warm"], pr["graphx"])
    )
    log(f"  pagerank: {pr['check']}, ratio {pr['ratio_iterflow_over_graphx']}")

    check_labels, labels = _components_check(spark, "iterflow", n)

    cc = compare_runners(
        spark,
        "components",
        {
            "iterflow": iterflow_components(g, "blocks"),
            "graphx": graphx_components(spark, jgraph),
        },
        repetitions,
        check_labels,
        release_graphx,
    )
    cc["iterflow_rounds"] = _round_figures(cc["iterflow"])
    cc["ratio_iterflow_over_graphx"] = ratio(cc["iterflow"], cc["graphx"])
    log(f"  components: {cc['check']}, ratio {cc['ratio_iterflow_over_graphx']}")
    labels.clear()
    jgraph.unpersist(True)

    # The same graph with ids that are not 0..n-1: the layout joins instead of computing.
    spread = Graph(
        vertices.select((F.col("id") * 7 + 3).alias("id")),
        edges.select((F.col("src") * 7 + 3).alias("src"), (F.col("dst") * 7 + 3).alias("dst")),
    )

    def spread_pagerank() -> tuple[Any, dict[str, Any]]:
        rounds = Rounds()
        ranks = pagerank(
            spread, tol=None, max_rounds=ROUNDS, method="blocks", progress=False, listen=rounds
        )
        ranks.count()
        return ranks, rounds.summary()

    run = time_run(spark, "pagerank iterflow, ids id*7+3", spread_pagerank)
    shifted = run.value.select(((F.col("id") - 3) / 7).cast("long").alias("id"), "pagerank")
    spread_s = run.seconds
    pr["iterflow_spread_ids"] = {
        "s": spread_s,
        "round_0_s": run.info["duration_s"][0],
        "check": check_pagerank(shifted, expected),
    }
    pr["ratio_iterflow_spread_ids_over_graphx"] = spread_s / pr["graphx"]["s_median"]
    edges.unpersist()
    vertices.unpersist()
    return {"graph": {"vertices": n, "edges": m, **facts}, "pagerank": pr, "components": cc}


def _bfs_distances(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Edges from every vertex to each landmark (inf: none), by BFS on the reversed graph."""
    reverse = csr_matrix((np.ones(len(src)), (dst, src)), shape=(n, n))
    return shortest_path(reverse, unweighted=True, indices=LANDMARKS)


def check_landmarks(paths: DataFrame, expected: np.ndarray, n: int) -> dict[str, Any]:
    rows = paths.select("id", "distances").toArrow()
    ids = rows.column("id").to_numpy()
    if not np.array_equal(np.sort(ids), np.arange(n)):
        raise RuntimeError(f"shortest_paths returned {len(ids)} vertices, expected {n}")
    got = np.full((len(LANDMARKS), n), np.inf)
    for vertex, cell in zip(ids.tolist(), rows.column("distances").to_pylist(), strict=True):
        for mark, distance in cell:
            got[LANDMARKS.index(mark), vertex] = distance
    wrong = int((got != expected).sum())
    if wrong:
        raise RuntimeError(f"shortest_paths: {wrong} (landmark, vertex) distances differ")
    reached = np.isfinite(expected)
    return {
        "distances_equal_scipy_bfs": True,
        "pairs_reached": int(reached.sum()),
        "max_distance": int(expected[reached].max()),
    }


def medium_graph(
    spark: SparkSession, tmp: Path, n: int, m: int, repetitions: int
) -> dict[str, Any]:
    src, dst = random_edges(n, m)
    vertices, edges = cached_inputs(spark, {"src": src, "dst": dst}, n)
    g = Graph(vertices, edges)
    expected = numpy_pagerank(src, dst, n, ROUNDS)
    out: dict[str, Any] = {"graph": {"vertices": n, "edges": m}}

    blocks_pr = compare_runners(
        spark,
        "pagerank blocks",
        {"blocks": iterflow_pagerank(g, "blocks")},
        repetitions,
        lambda results: check_pagerank(results["blocks"], expected),
    )
    frame_pr = time_run(spark, "pagerank dataframe", iterflow_pagerank(g, "dataframe"))
    out["pagerank"] = {
        "blocks": blocks_pr["blocks"],
        "blocks_check": blocks_pr["check"],
        "dataframe_s": frame_pr.seconds,
        "dataframe_check": check_pagerank(frame_pr.value, expected),
        "speedup_blocks_over_dataframe": frame_pr.seconds / blocks_pr["blocks"]["s_median"],
    }
    del frame_pr

    jgraph, _, facts = _graphx_graph(spark, tmp, src, dst)
    out["graph"].update(facts)
    check_labels, labels = _components_check(spark, "blocks", n)

    blocks_cc = compare_runners(
        spark,
        "components blocks",
        {
            "blocks": iterflow_components(g, "blocks"),
            "graphx": graphx_components(spark, jgraph),
        },
        repetitions,
        check_labels,
        release_graphx,
    )
    frame_cc = time_run(spark, "components dataframe", iterflow_components(g, "dataframe"))
    out["components"] = {
        "blocks": blocks_cc["blocks"],
        "graphx": blocks_cc["graphx"],
        "check": blocks_cc["check"],
        "dataframe_s": frame_cc.seconds,
        "dataframe_check": check_components(frame_cc.value, labels[0], n),
        "speedup_blocks_over_dataframe": frame_cc.seconds / blocks_cc["blocks"]["s_median"],
        "ratio_blocks_over_graphx": ratio(blocks_cc["blocks"], blocks_cc["graphx"]),
    }
    del frame_cc
    labels.clear()

    distances = _bfs_distances(src, dst, n)

    def iterflow_landmarks() -> tuple[Any, dict[str, Any]]:
        rounds = Rounds()
        paths = shortest_paths(g, LANDMARKS, method="blocks", listen=rounds, progress=False)
        paths.count()
        return paths, rounds.summary()

    def graphx_landmarks() -> tuple[Any, dict[str, Any]]:
        return graphx_peer.shortest_paths(spark, jgraph, LANDMARKS), {}

    landmarks: Runner = iterflow_landmarks
    sp = compare_runners(
        spark,
        "shortest paths",
        {"blocks": landmarks, "graphx": graphx_landmarks},
        repetitions,
        lambda results: check_landmarks(results["blocks"], distances, n),
        release_graphx,
    )
    sp["ratio_blocks_over_graphx"] = ratio(sp["blocks"], sp["graphx"])
    sp["blocks_rounds"] = _round_figures(sp["blocks"])
    out["shortest_paths"] = sp
    jgraph.unpersist(True)
    edges.unpersist()
    vertices.unpersist()
    return out


def main() -> None:
    args = _arguments()
    if args.quick:
        big, medium, dag, repetitions = (100_000, 1_000_000), (10_000, 100_000), (8, 60), 1
    else:
        big, medium, dag = (args.vertices, args.edges), (100_000, 1_000_000), (25, 200)
        repetitions = args.repetitions
    started = time.perf_counter()
    spark = graphx_peer.start_session(driver_memory=args.driver_memory)
    tmp = Path(tempfile.mkdtemp(prefix="iterflow-bench-blocks-"))
    try:
        log(f"1. large graph {big}")
        large = large_graph(spark, tmp, *big, repetitions)
        log(f"2./3. medium graph {medium}")
        middle = medium_graph(spark, tmp, *medium, repetitions)
        log(f"4. Pregel on blocks, layered DAG {dag}")
        dag_graph, sssp = pregel_comparison(spark, *dag, repetitions, method="blocks")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = {
        "target_iterflow_over_graphx": TARGET,
        "large": large,
        "medium": middle,
        "pregel_graph": dag_graph,
        "pregel_shortest_paths_blocks": sssp,
        "script_s": time.perf_counter() - started,
    }
    pr, cc = large["pagerank"], large["components"]
    mpr, mcc, msp = middle["pagerank"], middle["components"], middle["shortest_paths"]
    rows: list[tuple[str, Any]] = [
        (
            "large: GraphX edge-list load, cold / warm (s)",
            f"{large['graph']['graphx_load_cold_s']:.1f} / "
            f"{pr['graphx_load_warm']['s_median']:.1f}",
        ),
        (f"large: PageRank {ROUNDS} rounds, iterflow blocks (s)", pr["iterflow"]["s_median"]),
        (
            "large: PageRank, round 0 / later rounds (s)",
            f"{pr['iterflow_rounds']['round_0_s']:.1f} / "
            f"{pr['iterflow_rounds']['later_round_s_median']:.2f}",
        ),
        ("large: PageRank, GraphX PageRank.run (s)", pr["graphx"]["s_median"]),
        (
            f"large: PageRank iterflow / GraphX (target <= {TARGET})",
            pr["ratio_iterflow_over_graphx"]["of_medians"],
        ),
        (
            "large: PageRank iterflow / (GraphX warm load + run)",
            pr["ratio_iterflow_over_graphx_load_plus_run"]["of_medians"],
        ),
        ("large: PageRank, ids id*7+3, iterflow blocks (s)", pr["iterflow_spread_ids"]["s"]),
        ("large: PageRank, ids id*7+3 / GraphX", pr["ratio_iterflow_spread_ids_over_graphx"]),
        ("large: PageRank max |iterflow - numpy|", pr["check"]["max_abs_difference_vs_numpy"]),
        ("large: components, iterflow blocks (s)", cc["iterflow"]["s_median"]),
        ("large: components, GraphX (s)", cc["graphx"]["s_median"]),
        (
            f"large: components iterflow / GraphX (target <= {TARGET})",
            cc["ratio_iterflow_over_graphx"]["of_medians"],
        ),
        ("large: components rounds", cc["iterflow_rounds"]["rounds"]),
        (
            "medium: PageRank blocks / dataframe (s)",
            f"{mpr['blocks']['s_median']:.1f} / {mpr['dataframe_s']:.1f}",
        ),
        ("medium: PageRank speedup blocks over dataframe", mpr["speedup_blocks_over_dataframe"]),
        (
            "medium: components blocks / dataframe / GraphX (s)",
            f"{mcc['blocks']['s_median']:.1f} / {mcc['dataframe_s']:.1f} / "
            f"{mcc['graphx']['s_median']:.1f}",
        ),
        ("medium: components speedup blocks over dataframe", mcc["speedup_blocks_over_dataframe"]),
        (
            "medium: shortest paths to 3 landmarks, blocks / GraphX (s)",
            f"{msp['blocks']['s_median']:.1f} / {msp['graphx']['s_median']:.1f}",
        ),
        (
            f"medium: shortest paths blocks / GraphX ShortestPaths (target <= {TARGET})",
            msp["ratio_blocks_over_graphx"]["of_medians"],
        ),
    ]
    for name in ("active", "all"):
        s = sssp[name]
        rows.append((f"pregel DAG on blocks, {name}: total (s)", s["s_median"]))
        rows.append((f"pregel DAG on blocks, {name}: median round (s)", s["round_s_median"]))
        rows.append((f"pregel DAG on blocks, {name}: messages", s["messages"]))
    print_table("iterflow.graph blocks", rows)
    finish(
        spark,
        "bench_graph_blocks",
        args.quick,
        results,
        large=big,
        medium=medium,
        dag=dag,
        repetitions=repetitions,
    )


if __name__ == "__main__":
    main()
