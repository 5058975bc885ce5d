"""The model exchange of resident rounds on local clusters of 1, 3 and 6 executors.

Each cluster (``local-cluster[N,2,1024]``, one resident task per executor) runs
tests/cluster_exchange_job.py in a child process: an ``itf.combine`` over 600,000 rows
in 12 partitions whose CombineFn carries a 2 MB model and makes a 2 MB accumulator per
partition, four rounds along the tree of resident tasks and four through the driver
(``spark.iterflow.resident.tree=false``). Recorded: the bytes through the driver's data
plane per round (counted by the data plane), seconds per round, and whether every
round's result is the same to the bit on every cluster and either way.

Before the clusters, the relay's own constants, which docs/deploy.md's cost model uses:
the latency of one small delivery and the bandwidth of fetching a 2 MB and a 40 MB
payload from a task's relay, in one process over loopback, plain and with TLS.

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


def relay_constants(tls: bool, repeat: int = 7) -> dict[str, float]:
    """Median seconds of a 100-byte delivery, and MB/s of 2 MB and 40 MB fetches."""
    from iterflow.runtime.datacache.dataplane import Credentials, KeyPair
    from iterflow.runtime.datacache.resident_tree import Links, Peers, Relay

    scheme = "grpc+tls" if tls else "grpc+tcp"
    driver = Credentials(f"{scheme}://127.0.0.1:9", "s" * 64, None, KeyPair.make() if tls else None)
    relays = [Relay(driver), Relay(driver)]
    links = Links(driver, Peers((0, 1), {0: relays[0].location, 1: relays[1].location}, (0, 1)))
    try:
        measured: dict[str, float] = {}
        delays = []
        for index in range(repeat):
            clock = time.perf_counter()
            links.deliver(1, 1, 0, index, b"a" * 100)
            relays[1].take(1, 0, index)
            delays.append(time.perf_counter() - clock)
        measured["latency_s"] = statistics.median(delays)
        for call, size in ((2, 2_000_000), (3, 40_000_000)):
            relays[0].publish(call, memoryview(b"K" + bytes(size - 1)))
            seconds = []
            for _ in range(repeat):
                clock = time.perf_counter()
                links.fetch(0, call)
                seconds.append(time.perf_counter() - clock)
            rate = size / 1e6 / statistics.median(seconds)
            measured[f"fetch_{size // 1_000_000}MB_MB_per_s"] = rate
        return measured
    finally:
        links.close()
        for relay in relays:
            relay.close()


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import log, parse_args, print_table, write_result

    args = parse_args(__doc__.splitlines()[0])
    counts = (1, 3) if args.quick else (1, 3, 6)
    results: dict[str, Any] = {
        "relay": {"plain": relay_constants(False), "tls": relay_constants(True)}
    }
    log(f"relay: {results['relay']}")
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
    for way, constants in results["relay"].items():
        rows.extend((f"relay, {way}: {name}", value) for name, value in constants.items())
    for name, row in results.items():
        if name != "relay" and isinstance(row, dict):
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
