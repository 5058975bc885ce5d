"""What does Spark Connect cost per round? The bounded PageRank (iterflow.demo.pagerank_demo,
a DataFrame body) on a classic session against the same on a Spark Connect session.

Each run is its own process (a process holds one kind of session): classic
``local[2]``, or ``remote("local[2]")``, where PySpark starts a Connect server in
the process and its client talks to it over gRPC. The modes alternate, and the
figures are medians. Writes ``results/bench_connect.json``.

    python benchmarks/bench_connect.py [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import COMMIT, child_result, log, parse_args, print_table, write_result

VERTICES, EDGES, ROUNDS, REPETITIONS = 20_000, 200_000, 30, 3
QUICK = {"VERTICES": 2_000, "EDGES": 20_000, "ROUNDS": 10, "REPETITIONS": 1}
#: Rounds before this one are left out of the per-round median (caching, warm-up).
STEADY_FROM = 5


def child(mode: str, vertices: int, edges: int, rounds: int) -> dict[str, Any]:
    """One measured run in this process: the demo's PageRank for ``rounds`` fixed rounds."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from iterflow.demo.pagerank_demo import pagerank, random_graph

    builder = SparkSession.builder.config("spark.ui.enabled", "false")
    if mode == "connect":
        spark = builder.remote("local[2]").getOrCreate()
    else:
        spark = builder.master("local[2]").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    vertex_df, edge_df = random_graph(spark, vertices, edges, seed=1)
    vertex_df, edge_df = vertex_df.cache(), edge_df.cache()
    vertex_df.count(), edge_df.count()
    durations: list[float] = []
    started = time.perf_counter()
    result = pagerank(
        vertex_df,
        edge_df,
        tol=None,
        max_rounds=rounds,
        listen=(lambda end: durations.append(end.progress.duration_s),),
        progress=False,
    )
    total = time.perf_counter() - started
    rank_sum = result.outputs["ranks"].agg({"rank": "sum"}).first()[0]
    steady = durations[STEADY_FROM:] or durations
    return {
        "mode": mode,
        "session": type(spark).__module__,
        "total_s": total,
        "rounds": result.rounds,
        "duration_s": durations,
        "median_round_s": statistics.median(steady),
        "rank_sum": rank_sum,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, mode, vertices, edges, rounds = sys.argv
        print("RESULT " + json.dumps(child(mode, int(vertices), int(edges), int(rounds))))
        return
    args = parse_args(__doc__ or "")
    sizes = {"VERTICES": VERTICES, "EDGES": EDGES, "ROUNDS": ROUNDS, "REPETITIONS": REPETITIONS}
    if args.quick:
        sizes.update(QUICK)
    script_started = time.perf_counter()
    order = ["classic", "connect", "connect", "classic", "classic", "connect"]
    order = order[: 2 * sizes["REPETITIONS"]]
    runs: dict[str, list[dict[str, Any]]] = {"classic": [], "connect": []}
    for mode in order:
        run = child_result(
            __file__,
            mode,
            str(sizes["VERTICES"]),
            str(sizes["EDGES"]),
            str(sizes["ROUNDS"]),
            what=mode,
        )
        runs[mode].append(run)
        log(f"{mode}: {run['total_s']:.2f} s, median round {run['median_round_s']:.3f} s")
    median = {
        mode: {
            "total_s": statistics.median(r["total_s"] for r in found),
            "round_s": statistics.median(r["median_round_s"] for r in found),
        }
        for mode, found in runs.items()
    }
    sums = [r["rank_sum"] for found in runs.values() for r in found]
    results = {
        "classic": runs["classic"],
        "connect": runs["connect"],
        "median_round_s": {mode: m["round_s"] for mode, m in median.items()},
        "median_total_s": {mode: m["total_s"] for mode, m in median.items()},
        "ratio_round_connect_over_classic": median["connect"]["round_s"]
        / median["classic"]["round_s"],
        "ratio_total_connect_over_classic": median["connect"]["total_s"]
        / median["classic"]["total_s"],
        "rank_sums_agree": max(sums) - min(sums) < 1e-9,
        "script_s": time.perf_counter() - script_started,
    }
    import pyspark

    config = {
        "spark_version": pyspark.__version__,
        "master": "local[2] (classic) / remote('local[2]') (connect)",
        "shuffle_partitions": 4,
        "iterflow_commit": COMMIT,
        "quick": args.quick,
        "vertices": sizes["VERTICES"],
        "edges_requested": sizes["EDGES"],
        "rounds": sizes["ROUNDS"],
        "repetitions": sizes["REPETITIONS"],
        "steady_from_round": STEADY_FROM,
        "order": order,
    }
    print_table(
        "PageRank (iterflow.demo) per round: Spark Connect vs classic",
        [
            ("classic median round (s)", median["classic"]["round_s"]),
            ("connect median round (s)", median["connect"]["round_s"]),
            ("connect / classic, per round", results["ratio_round_connect_over_classic"]),
            ("classic total (s)", median["classic"]["total_s"]),
            ("connect total (s)", median["connect"]["total_s"]),
            ("connect / classic, total", results["ratio_total_connect_over_classic"]),
            ("rank sums agree", str(results["rank_sums_agree"])),
        ],
    )
    write_result("bench_connect", args.quick, config, results)


if __name__ == "__main__":
    main()
