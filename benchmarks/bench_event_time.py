"""Event-time windows: iterflow's ``ctx.window`` against Structured Streaming's own.

The workload: events (ts, key) in 30 JSON-lines files of 4,000 events each, keys
uniform over 8 ("k0".."k7"), fixed numpy seed. File i holds event times uniform in
``[30 i, 30 i + 30)`` seconds after a fixed start, each moved back by up to 5
seconds (disorder, within the 10-second max delay, so no row is ever late). The
stream reads one file per micro-batch (``maxFilesPerTrigger=1``) with the
available-now trigger. Both variants count the events per 10-second window and key:

- "iterflow": ``UnboundedIteration(body).bind("events", stream, event_time="ts",
  max_delay="10 seconds")`` with the body
  ``ctx.window(events, itf.FixedWindows("10 seconds"), name="w").groupBy("window",
  "key").count()`` as the output "counts", written by ``itf.FileSink`` (parquet), and
  ``start(available_now=True, progress=False, checkpoint_location=<fresh>)``;
- "spark": ``stream.withWatermark("ts", "10 seconds").groupBy(F.window("ts",
  "10 seconds"), "key").count()`` written in append mode to a parquet file sink,
  ``trigger(availableNow=True)``.

Both write parquet to a fresh folder and checkpoint to a fresh location every run.
Per micro-batch times are the ``triggerExecution`` durations of the query's
micro-batches (read by the ``StreamingQueryListener`` of ``bench_unbounded.py``);
the total is from ``start()`` to the end of waiting for termination; jobs are the
Spark jobs the run submitted (job ids are sequential). iterflow runs epochs inside
its micro-batches: one per file and, when an epoch leaves a window due, one more
without input right away; Spark runs no-data micro-batches of its own. Both counts
are reported.

Checks: iterflow's output equals a numpy reference computed from the files (every
window, every key), each (window, key) once (no late rows, so every window fires
once); Spark's output equals the same reference restricted to the windows its final
watermark closed (with available-now Spark does not close the windows left open when
the input ends, iterflow does: its input watermarks jump to the end of time), and
iterflow's output restricted to those windows equals Spark's.

Runs alternate (the starting variant rotates every repetition) after one warm-up run
of each over a smaller set of files; reported figures are medians.

    python benchmarks/bench_event_time.py [--quick] [--in-spark]

``--in-spark`` plans iterflow's window step in Spark in every epoch (as for a state or
new rows too large for the driver), to measure that path on the same workload.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from _common import alternate, finish, log, median, parse_args, print_table, settle, start_session
from bench_unbounded import ProgressLog, last_job_id, written_events
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.unbounded import event_steps

VARIANTS = ("iterflow", "spark")
SEED = 2026
KEYS = 8
FILE_SPAN_S = 30  # event seconds each file covers
DISORDER_S = 5  # events move back by up to this
WINDOW_S = 10
MAX_DELAY = "10 seconds"
WINDOW = "10 seconds"
EVENTS_SCHEMA = "ts timestamp, key string"
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)

#: (window start as seconds after T0, key) -> count
Counts = Counter[tuple[int, str]]


class Workload(NamedTuple):
    folder: Path
    files: int
    rows_per_file: int
    reference: Counts  # all windows
    max_ts_s: float


def write_events(folder: Path, files: int, per_file: int, seed: int) -> Workload:
    """Write the event files (modification times one second apart, in file order)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    start = time.time() - files - 60
    reference: Counts = Counter()
    max_ts = 0.0
    for index in range(files):
        # Milliseconds, so that the JSON strings are exact.
        ts_ms = rng.integers(index * FILE_SPAN_S * 1000, (index + 1) * FILE_SPAN_S * 1000, per_file)
        ts_ms = ts_ms - rng.integers(0, DISORDER_S * 1000, per_file)
        keys = rng.integers(0, KEYS, per_file)
        starts = (ts_ms // (WINDOW_S * 1000)) * WINDOW_S
        reference.update(zip(starts.tolist(), (f"k{k}" for k in keys.tolist()), strict=True))
        max_ts = max(max_ts, float(ts_ms.max()) / 1000)
        path = folder / f"events-{index:04d}.json"
        with path.open("w", encoding="utf-8") as out:
            out.writelines(
                json.dumps(
                    {
                        "ts": (T0 + timedelta(milliseconds=t)).isoformat(timespec="milliseconds"),
                        "key": f"k{k}",
                    }
                )
                + "\n"
                for t, k in zip(ts_ms.tolist(), keys.tolist(), strict=True)
            )
        os.utime(path, (start + index, start + index))
    return Workload(folder, files, per_file, reference, max_ts)


def event_stream(spark: SparkSession, folder: Path) -> DataFrame:
    return spark.readStream.schema(EVENTS_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))


@itf.body
def windowed_counts(events: DataFrame, ctx: Any) -> itf.Declaration:
    counts = ctx.window(events, itf.FixedWindows(WINDOW), name="w").groupBy("window", "key").count()
    return itf.Declaration(outputs={"counts": counts})


def read_counts(df: DataFrame) -> tuple[Counts, int]:
    """The (window start, key) -> count of an output, and how many rows it had."""
    rows = df.select(
        (F.unix_timestamp("window.start") - int(T0.timestamp())).alias("s"), "key", "count"
    ).collect()
    counts: Counts = Counter()
    for row in rows:
        counts[(int(row["s"]), row["key"])] += int(row["count"])
    return counts, len(rows)


def run_iterflow(spark: SparkSession, w: Workload, tmp: Path) -> dict[str, Any]:
    stream = event_stream(spark, w.folder)
    sink = itf.FileSink(str(tmp / "out"))
    start = time.perf_counter()
    handle = (
        itf.UnboundedIteration(windowed_counts)
        .bind("events", stream, event_time="ts", max_delay=MAX_DELAY)
        .sink("counts", sink)
        .start(checkpoint_location=str(tmp / "checkpoint"), available_now=True, progress=False)
    )
    handle.await_termination()
    total_s = time.perf_counter() - start
    epochs = handle.progress
    return {
        "total_s": total_s,
        "epochs": len(epochs),
        "epochs_with_input": sum(1 for p in epochs if p.input_rows.get("events", 0) > 0),
        "input_rows": sum(p.input_rows.get("events", 0) for p in epochs),
        "epoch_duration_s": [p.duration_s for p in epochs],
        "late_rows": sum(sum(p.late_rows.values()) for p in epochs if p.late_rows),
        "read": lambda: read_counts(sink.read(spark)),
        "final_watermark_s": None,
    }


def run_spark(spark: SparkSession, w: Workload, tmp: Path) -> dict[str, Any]:
    stream = event_stream(spark, w.folder)
    counts_df = stream.withWatermark("ts", MAX_DELAY).groupBy(F.window("ts", WINDOW), "key").count()
    start = time.perf_counter()
    query = (
        counts_df.writeStream.outputMode("append")
        .format("parquet")
        .option("path", str(tmp / "out"))
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    total_s = time.perf_counter() - start
    mark = query.lastProgress["eventTime"]["watermark"]
    watermark = datetime.fromisoformat(mark.replace("Z", "+00:00"))
    return {
        "total_s": total_s,
        "read": lambda: read_counts(spark.read.parquet(str(tmp / "out"))),
        "final_watermark_s": (watermark - T0).total_seconds(),
    }


RUNNERS = {"iterflow": run_iterflow, "spark": run_spark}


def measure(spark: SparkSession, progress: ProgressLog, label: str, w: Workload) -> dict[str, Any]:
    """One run of a variant over ``w`` in fresh output and checkpoint folders."""
    variant = label.split()[0]
    settle(spark)
    tag = "event-time-" + "".join(c if c.isalnum() else "-" for c in label)
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        before = last_job_id(spark, f"{tag}-before")
        progress.reset()
        run = RUNNERS[variant](spark, w, Path(tmp))
        batches = progress.wait()
        after = last_job_id(spark, f"{tag}-after")  # before reading the output
        run["job_sites"] = job_sites(spark, before, after)
        run["counts"], run["output_rows"] = run.pop("read")()
    data = [b for b in batches if b["rows"] > 0]
    # Spark's numInputRows counts the rows its source scans yielded; a plan that scans a
    # micro-batch twice counts them twice (iterflow's does, see "source_rows_read").
    rows_read = sum(b["rows"] for b in data)
    if len(data) != w.files or rows_read % (w.files * w.rows_per_file):
        raise RuntimeError(f"{label}: expected {w.files} micro-batches of all rows: {batches}")
    if variant == "iterflow" and run["input_rows"] != w.files * w.rows_per_file:
        raise RuntimeError(f"{label}: the epochs took {run['input_rows']} rows")
    run.update(
        {
            "micro_batches": len(batches),
            "no_data_batches": len(batches) - len(data),
            "source_rows_read": rows_read,
            "jobs": after - before - 1,
            "batch_s": [b["triggerExecution"] for b in batches],
            "data_batch_s": [b["triggerExecution"] for b in data],
            "add_batch_s": [b["addBatch"] for b in batches],
        }
    )
    epochs = f", {run['epochs']} epochs" if "epochs" in run else ""
    log(
        f"  {label}: {total(run)} micro-batches ({run['no_data_batches']} without data){epochs}, "
        f"{run['total_s']:.2f} s, median micro-batch {median(run['batch_s']):.3f} s, "
        f"{run['jobs']} jobs"
    )
    return run


def job_sites(spark: SparkSession, before: int, after: int) -> dict[str, int]:
    """How many of the jobs between two job ids each call site ran (file name and line only).

    Read from Spark's status store (it keeps the last ~1000 jobs).
    """
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    sites: Counter[str] = Counter()
    for i in range(jobs.size()):
        job = jobs.apply(i)
        if before < job.jobId() < after:
            method, _, where = str(job.name()).partition(" at ")
            sites[f"{method} at {where.rsplit('/', 1)[-1]}"] += 1
    return dict(sites.most_common())


def total(run: dict[str, Any]) -> int:
    return int(run["micro_batches"])


def check(w: Workload, runs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Compare every run's output with the reference (see the module docstring)."""
    found: dict[str, Any] = {"windows": len({s for s, _ in w.reference}), "reference_rows": 0}
    found["reference_rows"] = len(w.reference)
    spark_open: list[int] = []
    iterflow_runs = [r for v, r in runs if v == "iterflow"]
    spark_runs = [r for v, r in runs if v == "spark"]
    for run in iterflow_runs:
        assert run["counts"] == w.reference, "iterflow's counts differ from the reference"
        assert run["output_rows"] == len(w.reference), "iterflow fired a (window, key) twice"
        assert run["late_rows"] == 0, "iterflow dropped rows as late"
    for run in spark_runs:
        closed = run["final_watermark_s"]
        expected = Counter({k: n for k, n in w.reference.items() if k[0] + WINDOW_S <= closed})
        assert run["counts"] == expected, "Spark's counts differ from the reference"
        assert run["output_rows"] == len(expected), "Spark emitted a (window, key) twice"
        restricted = Counter(
            {k: n for k, n in iterflow_runs[0]["counts"].items() if k[0] + WINDOW_S <= closed}
        )
        assert restricted == run["counts"], "iterflow and Spark differ on the closed windows"
        spark_open.append(len(w.reference) - len(expected))
    found.update(
        {
            "iterflow_equals_reference": True,
            "spark_equals_reference_on_closed_windows": True,
            "iterflow_equals_spark_on_closed_windows": True,
            "spark_final_watermark_s": spark_runs[0]["final_watermark_s"],
            "max_event_time_s": w.max_ts_s,
            "spark_rows_not_emitted": spark_open,
            "late_rows_iterflow": 0,
        }
    )
    return found


def main() -> None:
    args = parse_args(
        "Event-time windows: iterflow's ctx.window vs Structured Streaming's",
        in_spark="plan iterflow's window step in Spark (never on the driver); results go "
        "to bench_event_time.in_spark.json",
    )
    if args.in_spark:
        event_steps.DRIVER_WINDOW_BYTES = -1  # every epoch's new rows count as large
    if args.quick:
        files, per_file, warm_files, repetitions = 10, 1_000, 3, 3
    else:
        files, per_file, warm_files, repetitions = 30, 4_000, 5, 3

    spark = start_session()
    progress = ProgressLog()
    spark.streams.addListener(progress)
    with written_events(write_events, files, per_file, warm_files) as (w, warm, input_bytes):
        log(f"warm-up: one run of each variant over {warm_files} files")
        warm_runs = [(v, measure(spark, progress, f"{v} (warm-up)", warm)) for v in VARIANTS]
        check(warm, warm_runs)
        log(f"{files} files, {repetitions} runs of each variant")
        sequence, runs = alternate(
            VARIANTS, repetitions, lambda variant: measure(spark, progress, variant, w)
        )

    checked = check(w, [(v, r) for v, rs in runs.items() for r in rs])
    summary: dict[str, dict[str, Any]] = {}
    for variant, rs in runs.items():
        summary[variant] = {
            "total_s_median": median([r["total_s"] for r in rs]),
            "batch_s_median": median([median(r["batch_s"]) for r in rs]),
            "data_batch_s_median": median([median(r["data_batch_s"]) for r in rs]),
            "add_batch_s_median": median([median(r["add_batch_s"]) for r in rs]),
            "micro_batches": median([r["micro_batches"] for r in rs]),
            "no_data_batches": median([r["no_data_batches"] for r in rs]),
            "jobs_median": median([r["jobs"] for r in rs]),
            "jobs_per_micro_batch": median([r["jobs"] / r["micro_batches"] for r in rs]),
            "source_rows_read_per_event": median([r["source_rows_read"] for r in rs])
            / (files * per_file),
        }
    for variant, rs in runs.items():
        summary[variant]["job_sites_last_run"] = rs[-1]["job_sites"]
    it = summary["iterflow"]
    it["epochs"] = median([r["epochs"] for r in runs["iterflow"]])
    it["epochs_with_input"] = median([r["epochs_with_input"] for r in runs["iterflow"]])
    it["epoch_duration_s_median"] = median(
        [median(r["epoch_duration_s"]) for r in runs["iterflow"]]
    )
    it["jobs_per_epoch"] = median([r["jobs"] / r["epochs"] for r in runs["iterflow"]])
    sp = summary["spark"]
    ratio = {
        "total": it["total_s_median"] / sp["total_s_median"],
        "batch_median": it["batch_s_median"] / sp["batch_s_median"],
        "data_batch_median": it["data_batch_s_median"] / sp["data_batch_s_median"],
        "jobs": it["jobs_median"] / sp["jobs_median"],
        "total_per_repetition": [
            x["total_s"] / y["total_s"]
            for x, y in zip(runs["iterflow"], runs["spark"], strict=True)
        ],
    }
    results = {
        "sequence": sequence,
        "check": checked,
        "summary": summary,
        "ratio_iterflow_over_spark": ratio,
        "runs": {
            v: [{k: x for k, x in r.items() if k not in ("counts", "job_sites")} for r in rs]
            for v, rs in runs.items()
        },
    }
    rows: list[tuple[str, Any]] = []
    for variant in VARIANTS:
        s = summary[variant]
        rows += [
            (f"{variant}: total (s)", s["total_s_median"]),
            (
                f"{variant}: micro-batches (without data)",
                f"{s['micro_batches']:g} ({s['no_data_batches']:g})",
            ),
            (f"{variant}: median micro-batch, triggerExecution (s)", s["batch_s_median"]),
            (f"{variant}: median micro-batch with data (s)", s["data_batch_s_median"]),
            (
                f"{variant}: jobs (per micro-batch)",
                f"{s['jobs_median']:g} ({s['jobs_per_micro_batch']:.2f})",
            ),
        ]
    rows += [
        ("iterflow: epochs (with input)", f"{it['epochs']:g} ({it['epochs_with_input']:g})"),
        ("iterflow: median epoch, duration_s (s)", it["epoch_duration_s_median"]),
        ("iterflow: jobs per epoch", it["jobs_per_epoch"]),
        ("iterflow: source rows read per event", it["source_rows_read_per_event"]),
        ("iterflow / spark, total", ratio["total"]),
        ("iterflow / spark, median micro-batch", ratio["batch_median"]),
        ("iterflow / spark, median micro-batch with data", ratio["data_batch_median"]),
        ("iterflow / spark, jobs", ratio["jobs"]),
        ("(window, key) rows Spark left open at the end", checked["spark_rows_not_emitted"][0]),
    ]
    for variant in VARIANTS:
        print_table(
            f"{variant}: jobs of the last run by call site",
            list(summary[variant]["job_sites_last_run"].items()),
        )
    print_table(
        f"counts per {WINDOW} window and key, {files} files x {per_file} events "
        f"(medians of {repetitions} runs)",
        rows,
    )
    finish(
        spark,
        "bench_event_time.in_spark" if args.in_spark else "bench_event_time",
        args.quick,
        results,
        seed=SEED,
        files=files,
        events_per_file=per_file,
        events=files * per_file,
        keys=KEYS,
        file_span_s=FILE_SPAN_S,
        disorder_s=DISORDER_S,
        window=WINDOW,
        max_delay=MAX_DELAY,
        input_format="json lines",
        input_bytes=input_bytes,
        max_files_per_trigger=1,
        trigger="availableNow",
        repetitions=repetitions,
        warm_up_files=warm_files,
        output="parquet files (itf.FileSink / Spark's parquet file sink, append mode)",
        iterflow="UnboundedIteration(body).bind('events', stream, event_time='ts', "
        "max_delay='10 seconds').sink('counts', FileSink(out)).start(available_now=True, "
        "progress=False); body: ctx.window(events, FixedWindows('10 seconds'), name='w')"
        ".groupBy('window', 'key').count()",
        structured_streaming="stream.withWatermark('ts', '10 seconds')"
        ".groupBy(F.window('ts', '10 seconds'), 'key').count()"
        ".writeStream.outputMode('append').format('parquet')"
        ".trigger(availableNow=True)",
    )


if __name__ == "__main__":
    main()
