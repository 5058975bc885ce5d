"""The model exchange on a local cluster: an ``itf.combine`` over resident data whose
CombineFn carries a 2 MB model and returns a 2 MB accumulator per partition, for four
rounds, along the tree of resident tasks and (``spark.iterflow.resident.tree=false``)
through the driver. Prints, as one JSON line for each, the bytes through the driver's
data plane per round, the tasks, and a digest of every round's result.
``python cluster_exchange_job.py MASTER EXECUTORS``, run by tests/test_cluster_exchange.py
and benchmarks/bench_exchange.py in their own processes (one SparkContext per process)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
from child_jobs import job_session

import iterflow as itf
from iterflow.runtime.datacache.resident_policy import TREE_CONF

#: Doubles in the model and in each accumulator (2 MB), partitions of the data, rounds.
MODEL, PARTITIONS, ROUNDS = 250_000, 12, 4


def spread(model: np.ndarray) -> itf.CombineFn:
    """Each row adds ``x * model[x mod MODEL]`` at ``x mod MODEL``: a model-sized
    accumulator whose float sums depend on the order of the merges. Made inside a
    function, so that it travels by value to executors that cannot import this file."""
    size = len(model)

    class Spread(itf.CombineFn):
        def create_accumulator(self):
            return np.zeros(size)

        def add_input(self, acc, batch):
            x = batch.column("x").to_numpy()
            slot = x.astype(np.int64) % size
            return acc + np.bincount(slot, weights=x * model[slot] / 7.0, minlength=size)

        def merge_accumulators(self, accs):
            merged = accs[0].copy()
            for acc in accs[1:]:
                merged += acc
            return merged

        def extract_output(self, acc):
            return [(acc.tolist(),)]

    return Spread()


def run(spark, points, tree: bool) -> dict:
    spark.conf.set(TREE_CONF, "true" if tree else "false")
    seen: list = []

    @itf.body
    def spreading(acc, points, ctx):
        data = ctx.columnar(points)
        seen.append(data)
        model = np.linspace(1.0, 2.0, MODEL) + ctx.epoch
        new = itf.combine(data, spread(model), "v array<double>", depth=2)
        return itf.Declaration(feedback={"acc": new}, outputs={"acc": new})

    traffic: list[int] = []
    digests: list[str] = []
    seconds: list[float] = []
    started = [time.perf_counter()]

    along: list[bool] = []

    def note(end: itf.RoundEnd) -> None:
        traffic.append(seen[0].plane.traffic.total())
        along.append(seen[0].along_tree)
        values = np.asarray(itf.vector(end.variables["acc"], "v"))
        digests.append(hashlib.sha256(values.tobytes()).hexdigest()[:16])
        seconds.append(time.perf_counter() - started[0])
        started[0] = time.perf_counter()

    result = (
        itf.BoundedIteration(spreading)
        .bind("acc", spark.createDataFrame([([0.0],)], "v array<double>"))
        .bind("points", points)
        .until(itf.max_rounds(ROUNDS))
        .listen(note)
        .run(progress=False)
    )
    data = seen[0]
    per_round = [b - a for a, b in itertools.pairwise(traffic)]
    return {
        "tree": along,
        "tasks": data.tasks,
        "resident": [p.resident for p in result.history],
        "bytes_per_round": per_round,  # rounds 1.. (round 0 also loads)
        "seconds_per_round": seconds[1:],
        "digests": digests,
    }


def main(master: str, executors: int) -> None:
    spark = job_session(master, "iterflow-exchange")
    deadline = time.monotonic() + 120
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < executors:
        if time.monotonic() > deadline:
            raise SystemExit(f"fewer than {executors} executors registered")
        time.sleep(0.5)
    points = spark.range(0, 600_000, 1, PARTITIONS).selectExpr("CAST(id AS DOUBLE) AS x")
    points = points.cache()
    points.count()
    out = {"tree": run(spark, points, True), "driver": run(spark, points, False)}
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
