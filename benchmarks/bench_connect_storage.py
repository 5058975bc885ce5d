"""Does a long iteration over Spark Connect keep the server's storage flat?

A bounded iteration of ``ROUNDS`` rounds over a ``ROWS``-row variable (``v <- v/2 + 1``),
whose rounds are local checkpoints on the server, on ``remote("local[2]")`` (PySpark
starts the Connect server in this process, so the benchmark reads the server's block
storage through its classic SparkContext: RDDs stored, bytes in memory and on disk).
Sampled after every round; the first rounds fill the cache, so the figures compare
the mean of rounds 100–300 with the mean of rounds 300–500 (their ratio is 1.0 for
flat storage). Two runs, each in its own process: the session's defaults (the server's
plan cache keeps the last 16 commands' plans, and their checkpoints), and with
``spark.connect.session.planCache.enabled=false``. Writes
``results/bench_connect_storage.json``.

    python benchmarks/bench_connect_storage.py [--quick]
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

ROWS, ROUNDS = 1_000_000, 500
QUICK = {"ROWS": 100_000, "ROUNDS": 60}
MODES = ("defaults", "no_plan_cache")


def child(mode: str, rows: int, rounds: int) -> dict[str, Any]:
    """One run in this process: the server's storage after every round."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    import iterflow as itf

    spark = (
        SparkSession.builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .remote("local[2]")
        .getOrCreate()
    )
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    if mode == "no_plan_cache":
        spark.conf.set("spark.connect.session.planCache.enabled", "false")
    server = SparkContext._active_spark_context
    assert server is not None, "remote('local[...]') starts its server in this process"
    samples: list[dict[str, Any]] = []

    def storage(end: itf.RoundEnd) -> None:
        infos = list(server._jsc.sc().getRDDStorageInfo())
        samples.append(
            {
                "epoch": end.epoch,
                "rdds": len(infos),
                "memory_bytes": sum(int(i.memSize()) for i in infos),
                "disk_bytes": sum(int(i.diskSize()) for i in infos),
                "round_s": end.progress.duration_s,
            }
        )

    @itf.body
    def halve(x: DataFrame) -> itf.Declaration:
        following = x.select("id", (F.col("v") * 0.5 + 1).alias("v"))
        return itf.Declaration(feedback={"x": following}, outputs={"x": following})

    started = time.perf_counter()
    result = (
        itf.BoundedIteration(halve)
        .bind("x", spark.range(rows).select("id", F.lit(1.0).alias("v")))
        .until(itf.max_rounds(rounds))
        .listen(storage)
        .run(progress=False)
    )
    total = time.perf_counter() - started
    last = result.outputs["x"].agg(F.min("v"), F.max("v")).first()
    return {"mode": mode, "total_s": total, "samples": samples, "final_v": [last[0], last[1]]}


def window(samples: list[dict[str, Any]], key: str, first: int, last: int) -> float:
    return statistics.fmean(s[key] for s in samples if first <= s["epoch"] < last)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, mode, rows, rounds = sys.argv
        print("RESULT " + json.dumps(child(mode, int(rows), int(rounds))))
        sys.stdout.flush()
        os._exit(0)  # the in-process Connect server's shutdown can outlast the run
    args = parse_args(__doc__ or "")
    rows, rounds = (QUICK["ROWS"], QUICK["ROUNDS"]) if args.quick else (ROWS, ROUNDS)
    # Windows: from a fifth of the run to three fifths, and from there to the end.
    early, late = rounds // 5, 3 * rounds // 5
    runs: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        runs[mode] = child_result(__file__, mode, str(rows), str(rounds), what=mode, timeout=3600)
        log(f"{mode}: {runs[mode]['total_s']:.1f} s")
    results: dict[str, Any] = {}
    rows_out = []
    for mode, run in runs.items():
        samples = run["samples"]
        summary: dict[str, Any] = {"total_s": run["total_s"]}
        for key in ("rdds", "memory_bytes", "disk_bytes"):
            before = window(samples, key, early, late)
            after = window(samples, key, late, rounds)
            summary[key] = {
                "mean_early": before,
                "mean_late": after,
                "max": max(s[key] for s in samples),
                "ratio_late_over_early": after / before if before else None,
            }
            rows_out.append(
                (
                    f"{mode} {key} (early → late, max)",
                    f"{before:.4g} → {after:.4g}, {summary[key]['max']:.4g}",
                )
            )
        summary["samples"] = samples
        summary["final_v"] = run["final_v"]
        results[mode] = summary
    import pyspark

    config = {
        "spark_version": pyspark.__version__,
        "master": "remote('local[2]') (in-process Connect server)",
        "shuffle_partitions": 4,
        "iterflow_commit": COMMIT,
        "quick": args.quick,
        "rows": rows,
        "rounds": rounds,
        "windows": {"early": [early, late], "late": [late, rounds]},
    }
    path = write_result("bench_connect_storage", args.quick, config, results)
    print_table("Connect server storage over a long iteration", rows_out)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
