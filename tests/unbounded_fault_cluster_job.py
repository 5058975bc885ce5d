"""Faults injected into an unbounded iteration on separate executor JVMs: an executor
killed between epochs or in the middle of one, or a Python worker killed; when the
query fails for it, the same query is started again on its checkpoint location. Prints
what the file sinks hold, as one JSON line.

``python unbounded_fault_cluster_job.py MASTER INPUT_DIR WORKDIR FAULT EPOCH``, run by
tests/test_fault_cluster.py. FAULT is ``none``, ``executor`` (a listener kills an
executor JVM after epoch EPOCH), ``executors`` (all of them), ``executor-mid`` (a
task of epoch EPOCH kills its own executor JVM) or ``worker`` (a task of epoch EPOCH
kills its Python worker). The iteration keeps a running sum of numbers (state
variable ``total``) and squares each number with a numpy kernel (a pandas UDF, in
Python workers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pandas as pd
from fault_cluster_job import fault_session
from faults import BetweenRounds, Injector, executor_pids
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf


def main(master: str, input_dir: str, workdir: str, fault: str, epoch: str) -> None:
    spark = fault_session(master, "iterflow-unbounded-fault-cluster")
    work = Path(workdir)
    injector = Injector(fault, int(epoch), str(work / "fault-ran"))
    killer = BetweenRounds(injector)

    @itf.body
    def squares(total: DataFrame, numbers: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        current = ctx.epoch

        @F.pandas_udf("long")  # type: ignore[call-overload]
        def square(x: pd.Series) -> pd.Series:
            injector.due(current)
            return pd.Series(np.square(x.to_numpy()))

        squared = numbers.repartition(4).select("x", square("x").alias("sq"))
        added = squared.agg(F.coalesce(F.sum("sq"), F.lit(0)).cast("long").alias("added"))
        new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
        return itf.Declaration(
            feedback={"total": new_total}, outputs={"total": new_total, "squared": squared}
        )

    def start() -> itf.UnboundedQuery:
        numbers = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(input_dir)
        iteration = (
            itf.UnboundedIteration(squares)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers)
            .sink("total", itf.FileSink(str(work / "sinks" / "total")))
            .sink("squared", itf.FileSink(str(work / "sinks" / "squared")))
        )
        if fault in ("executor", "executors"):
            iteration.listen(killer)
        return iteration.start(
            checkpoint_location=str(work / "ckpt"), available_now=True, progress=False
        )

    starts: list[dict[str, Any]] = []
    for _ in range(3):
        query = start()
        try:
            query.await_termination()
        except Exception as exc:  # the fault failed the query: start it again
            starts.append({"error": f"{type(exc).__name__}: {str(exc)[:600]}"})
            continue
        starts.append({"error": None, "resumed_from": query.resumed_from})
        break
    totals = spark.read.parquet(str(work / "sinks" / "total")).collect()
    squared = spark.read.parquet(str(work / "sinks" / "squared")).collect()
    print(
        json.dumps(
            {
                "starts": starts,
                "fault_ran": (work / "fault-ran").exists() or bool(killer.killed),
                "executors": executor_pids(),
                "totals": sorted((r["epoch"], r["total"]) for r in totals),
                "squared": sorted((r["epoch"], r["x"], r["sq"]) for r in squared),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
