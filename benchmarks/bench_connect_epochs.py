"""What does Spark Connect cost an unbounded epoch? The same unbounded iteration on a
classic session and on a Spark Connect session.

The workload: a running sum (a state variable, one aggregate per epoch) over FILES
JSON files of PER_FILE numbers, one file per micro-batch (``maxFilesPerTrigger=1``,
available-now), each epoch's total written to a ``FileSink``. Each run is its own
process: classic ``local[2]``, or ``remote("local[2]")`` (a Connect server in the
process, the epochs in its foreachBatch worker beside it). Figures, medians over the
runs:

- "epoch": the epochs' ``duration_s`` (the body, its jobs, the sink; the same clock
  on both sides, read from ``query.history``);
- "micro-batch": the stream's ``durationMs.triggerExecution`` of micro-batches 1..N
  (micro-batch 0 is left out: over Connect it starts the worker process and builds the
  loop there), so the epoch plus reading the file, the commit and, over Connect,
  the round trip to the worker;
- "first micro-batch", "start to end" (``start()`` to ``awaitTermination()``, the
  ending query included over Connect).

Checked: both runs write the same totals. Writes ``results/bench_connect_epochs.json``.

    python benchmarks/bench_connect_epochs.py [--quick]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import COMMIT, child_result, log, parse_args, print_table, write_result

FILES, PER_FILE, REPETITIONS = 30, 1_000, 2
QUICK = {"FILES": 6, "PER_FILE": 100, "REPETITIONS": 1}


def child(mode: str, files: int, per_file: int) -> dict[str, Any]:
    """One measured run in this process."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import iterflow as itf

    builder = SparkSession.builder.config("spark.ui.enabled", "false")
    builder = builder.config("spark.sql.shuffle.partitions", "2")
    if mode == "connect":
        spark = builder.remote("local[2]").getOrCreate()
    else:
        spark = builder.master("local[2]").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="bench-connect-epochs-"))
    start = time.time() - 1000
    for index in range(files):
        path = work / "in" / f"part-{index:04d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        numbers = range(index * per_file, (index + 1) * per_file)
        path.write_text("".join(json.dumps({"x": x}) + "\n" for x in numbers))
        os.utime(path, (start + index, start + index))

    @itf.body
    def running_sum(total, numbers):  # type: ignore[no-untyped-def]
        added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
        new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
        return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})

    sink = itf.FileSink(str(work / "out"))
    stream = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1)
    started = time.perf_counter()
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", stream.json(str(work / "in")))
        .sink("total", sink)
        .start(checkpoint_location=str(work / "ckpt"), available_now=True)
    )
    query.awaitTermination()
    total_s = time.perf_counter() - started
    triggers = {
        int(p["batchId"]): p["durationMs"].get("triggerExecution", 0) / 1000
        for p in query.recentProgress
        if p.get("numInputRows")
    }
    totals = sorted((r["epoch"], r["total"]) for r in sink.read(spark).collect())
    return {
        "mode": mode,
        "session": type(spark).__module__,
        "start_to_end_s": total_s,
        "epochs": len(query.history),
        "epoch_s": statistics.median(p.duration_s for p in query.history),
        "first_batch_s": triggers.get(0),
        "batch_s": statistics.median(v for k, v in triggers.items() if k > 0),
        "totals": totals,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, mode, files, per_file = sys.argv
        print("RESULT " + json.dumps(child(mode, int(files), int(per_file))))
        return
    args = parse_args(__doc__ or "")
    sizes = {"FILES": FILES, "PER_FILE": PER_FILE, "REPETITIONS": REPETITIONS}
    if args.quick:
        sizes.update(QUICK)
    order = ["classic", "connect", "connect", "classic"][: 2 * sizes["REPETITIONS"]]
    runs: dict[str, list[dict[str, Any]]] = {"classic": [], "connect": []}
    for mode in order:
        run = child_result(__file__, mode, str(sizes["FILES"]), str(sizes["PER_FILE"]), what=mode)
        runs[mode].append(run)
        log(f"{mode}: {run['start_to_end_s']:.2f} s, median epoch {run['epoch_s']:.3f} s")
    keys = ("epoch_s", "batch_s", "first_batch_s", "start_to_end_s")
    median = {
        mode: {key: statistics.median(r[key] for r in found) for key in keys}
        for mode, found in runs.items()
    }
    results = {
        **runs,
        "median": median,
        "ratio_epoch_connect_over_classic": median["connect"]["epoch_s"]
        / median["classic"]["epoch_s"],
        "ratio_batch_connect_over_classic": median["connect"]["batch_s"]
        / median["classic"]["batch_s"],
        "totals_agree": len({json.dumps(r["totals"]) for f in runs.values() for r in f}) == 1,
    }
    import pyspark

    config = {
        "spark_version": pyspark.__version__,
        "master": "local[2] (classic) / remote('local[2]') (connect)",
        "iterflow_commit": COMMIT,
        "quick": args.quick,
        **{key.lower(): value for key, value in sizes.items()},
        "order": order,
    }
    rows = [
        (f"{mode} {label} (s)", median[mode][key])
        for key, label in (
            ("epoch_s", "median epoch"),
            ("batch_s", "median micro-batch 1..N"),
            ("first_batch_s", "first micro-batch"),
            ("start_to_end_s", "start to end"),
        )
        for mode in ("classic", "connect")
    ]
    rows += [
        ("connect / classic, epoch", results["ratio_epoch_connect_over_classic"]),
        ("connect / classic, micro-batch", results["ratio_batch_connect_over_classic"]),
        ("same totals", results["totals_agree"]),
    ]
    print_table("An unbounded epoch: Spark Connect vs classic", rows)
    write_result("bench_connect_epochs", args.quick, config, results)


if __name__ == "__main__":
    main()
