"""The model exchange of resident rounds on local clusters of 1, 3 and 6 executors.

Each cluster (``local-cluster[N,2,1024]``, one resident task per executor) runs
tests/cluster_exchange_job.py in a child process: an ``itf.combine`` over 600,000 rows
in 12 partitions whose CombineFn carries a 2 MB model and makes a 2 MB accumulator per
partition, four rounds along the tree of resident tasks and four through the driver
(``spark.iterflow.resident.tree=false``). Recorded: the bytes through the driver's data
plane per round (counted by the data plane), seconds per round, and whether every
round's result is the same to the bit on every cluster and either way.

    python benchmarks/bench_exchange.py [--quick]   # --quick: 1 and 3 executors only
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "tests" / "cluster_exchange_job.py"


def run_cluster(executors: int) -> dict[str, Any]:
    """The job's JSON result on ``local-cluster[executors,2,1024]``."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(JOB), f"local-cluster[{executors},2,1024]", str(executors)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        cwd=JOB.parent,
    )
    if done.returncode != 0:
        raise SystemExit(f"{executors} executors failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import log, parse_args, print_table, write_result

    args = parse_args(__doc__.splitlines()[0])
    counts = (1, 3) if args.quick else (1, 3, 6)
    results: dict[str, Any] = {}
    digests = set()
    for executors in counts:
        clock = time.perf_counter()
        out = run_cluster(executors)
        log(f"{executors} executor(s): {time.perf_counter() - clock:.0f} s")
        row: dict[str, Any] = {}
        for way in ("tree", "driver"):
            measured = out[way]
            digests.add(tuple(measured["digests"]))
            row[way] = {
                "tasks": measured["tasks"],
                "along_tree": measured["tree"],
                "driver_bytes_per_round": statistics.median(measured["bytes_per_round"]),
                "seconds_per_round": statistics.median(measured["seconds_per_round"]),
            }
        results[f"{executors}_executors"] = row
    results["same_results_everywhere"] = len(digests) == 1
    rows = []
    for name, row in results.items():
        if isinstance(row, dict):
            for way in ("tree", "driver"):
                measured = row[way]
                rows.append(
                    (
                        f"{name}, {way}: MB through the driver per round",
                        measured["driver_bytes_per_round"] / 1e6,
                    )
                )
                rows.append((f"{name}, {way}: seconds per round", measured["seconds_per_round"]))
    rows.append(("same results on every cluster, both ways", results["same_results_everywhere"]))
    print_table("model exchange (2 MB model, 2 MB accumulators, 12 partitions)", rows)
    config = {
        "masters": [f"local-cluster[{n},2,1024]" for n in counts],
        "partitions": 12,
        "model_bytes": 2_000_000,
        "rows": 600_000,
        "rounds": 4,
        "depth": 2,
    }
    path = write_result("bench_exchange", args.quick, config, results)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
