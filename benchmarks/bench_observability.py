"""What observability costs: PageRank with every observer on against the same run with none.

"on" runs ``pagerank_body(n)`` with ``run(progress=True, event_log=...)``, a
``JsonLinesSink`` pushed every second and a listener that increments a user
counter on the driver every round and counts the in-round samples it hears
(``on_round_progress``). The running round's progress is sampled at the default
``progress_interval_s`` (0.5 s). "off" runs the same iteration with
``run(progress=False, progress_interval_s=0)``: no event log, no sink, no
listener and no sampling. Two more modes isolate the sampling: "unsampled" is
"on" with ``progress_interval_s=0``, and "fast" is "on" with
``progress_interval_s=0.05`` (``--fast-interval``). A round shorter than the
interval is never sampled, so when the PageRank rounds take less than 0.5 s
"on" differs from "unsampled" only by the sampler's wake-up per round, and
"fast", whose rounds are sampled several times each, measures what reading
Spark's status store and delivering the samples (bar, event log, listener)
cost.

All modes run a fixed number of rounds (``itf.max_rounds``, no tolerance), so
every run does the same work. The progress bar is drawn (``progress=True``
forces it) into a file that stands in for the terminal, like the event log and
the metrics file. After one warm-up run of each mode, the modes run in rotation
(the starting mode moves on every repetition), and the ratios are of medians.
Targets: on / off <= 1.05 (every observer) and on / unsampled <= 1.02 (the
sampling at its default interval); fast / unsampled is reported next to them.
Every run counts its Spark jobs twice: in its job group (as the other scripts
do) and as every job submitted between two marker jobs, by any thread; the
sampling adds none. At the end, the observers' own driver-side work (an
event-log line, a bar update, a sink push, and for samples a bar update and an
event-log ``round_progress`` line) is timed on its own by replaying the last
"on" and "fast" runs' records without Spark.

``--long`` runs the same modes on a graph ten times larger (200,000 vertices), whose
rounds last longer than the default interval: there "on" samples every round, and
on / unsampled measures the sampling at its default interval directly.

    python benchmarks/bench_observability.py [--quick | --long] [--fast-interval SECONDS]
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, redirect_stderr
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from _common import (
    PageRankWorkload,
    alternate,
    count_jobs,
    finish,
    log,
    median,
    pagerank_workload,
    print_table,
    settle,
    start_session,
)
from pyspark.sql import SparkSession

import iterflow as itf
from iterflow.demo.pagerank_demo import pagerank_body
from iterflow.metrics import MetricsSnapshot
from iterflow.progress.bar import ProgressBar
from iterflow.progress.event_log import EventLog

TARGET = 1.05
SAMPLING_TARGET = 1.02
MODES = ("off", "unsampled", "on", "fast")
OBSERVED = ("unsampled", "on", "fast")
PUSH_EVERY_S = 1.0
COUNTER = "bench.rounds"
#: ``run()``'s own default, which "on" keeps.
DEFAULT_INTERVAL_S: float = (
    inspect.signature(itf.BoundedIteration.run).parameters["progress_interval_s"].default
)
FAST_INTERVAL_S = 0.05


class Observer(itf.RoundListener):
    """Increments the user counter every round; counts and times the samples it hears."""

    def __init__(self) -> None:
        self.counter = itf.metrics.counter(COUNTER)
        self.inc_s: list[float] = []
        self.samples: list[itf.RoundSample] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        clock = time.perf_counter()
        self.counter.inc()
        self.inc_s.append(time.perf_counter() - clock)

    def on_round_progress(self, sample: itf.RoundSample) -> None:
        self.samples.append(sample)


def run_once(
    w: PageRankWorkload, mode: str, interval_s: float, files: Path, observer: Observer
) -> tuple[float, itf.IterationResult]:
    """One run in ``mode``: its time (building the iteration and ``run()``) and its result.

    In the observed modes the event log, the metrics file and the progress bar's output go
    to fresh files in ``files``, and ``observer`` listens; ``interval_s`` is the run's
    ``progress_interval_s``.
    """
    it = w.iteration()
    if mode == "off":
        start = time.perf_counter()
        result = it.run(progress=False, progress_interval_s=0)
        return time.perf_counter() - start, result
    with ExitStack() as stack:
        bar = stack.enter_context((files / "progress.txt").open("w", encoding="utf-8"))
        stack.enter_context(redirect_stderr(bar))
        start = time.perf_counter()
        result = (
            it.push_metrics(
                itf.metrics.JsonLinesSink(files / "metrics.jsonl"), every_s=PUSH_EVERY_S
            )
            .listen(observer)
            .run(
                progress=True,
                event_log=files / "events.jsonl",
                progress_interval_s=interval_s,
            )
        )
        return time.perf_counter() - start, result


class AllJobs:
    """The number of Spark jobs submitted, by any thread, inside a ``with all_jobs(...)``."""

    jobs: int = 0


def _marker(spark: SparkSession, group: str) -> int:
    """Run a one-task job in job group ``group``; its job id."""
    sc = spark.sparkContext
    sc.setJobGroup(group, "benchmark job counter marker")
    try:
        sc.parallelize([0], 1).count()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    ids: list[int] = []
    for _ in range(50):  # the status store is asynchronous
        ids = list(sc.statusTracker().getJobIdsForGroup(group))
        if ids:
            break
        time.sleep(0.1)
    return max(ids)


@contextmanager
def all_jobs(spark: SparkSession, group: str) -> Iterator[AllJobs]:
    """Count every job between a marker job before the block and one after it.

    Job ids are sequential across the whole application, so this counts the jobs of
    every thread (a sampler's too, had it run any), not only those of a job group.
    """
    before = _marker(spark, f"{group}-before")
    counted = AllJobs()
    yield counted
    after = _marker(spark, f"{group}-after")
    counted.jobs = after - before - 1


def sampling_figures(samples: list[itf.RoundSample], rounds: int) -> dict[str, Any]:
    """How much of the run the sampler saw: samples, final samples, rounds sampled."""
    return {
        "samples": len(samples),
        "final_samples": sum(s.final for s in samples),
        "rounds_sampled": len({s.epoch for s in samples}),
        "samples_per_round": len(samples) / rounds,
    }


class Run(NamedTuple):
    """The numbers of one run, and what the driver-side timings replay."""

    numbers: dict[str, Any]
    history: list[itf.RoundProgress]
    metrics: dict[str, itf.metrics.MetricResult]
    samples: list[itf.RoundSample]


def measure(
    spark: SparkSession,
    label: str,
    mode: str,
    w: PageRankWorkload,
    intervals: dict[str, float],
) -> Run:
    settle(spark)
    observer = Observer()
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        files = Path(tmp)
        group = f"observability-{mode}"
        with all_jobs(spark, group) as every, count_jobs(spark, group) as jobs:
            total_s, result = run_once(w, mode, intervals[mode], files, observer)
        rounds = [p.duration_s for p in result.history]
        run: dict[str, Any] = {
            "total_s": total_s,
            "round_s": rounds,
            "rounds": len(rounds),
            "jobs": jobs.jobs,
            # Minus the marker that count_jobs runs inside the two markers.
            "jobs_any_thread": every.jobs - 1,
        }
        if mode in OBSERVED:
            events = [
                json.loads(line)["event"]
                for line in (files / "events.jsonl").read_text().splitlines()
            ]
            run |= {
                "event_log_bytes": (files / "events.jsonl").stat().st_size,
                "event_log_round_progress_lines": events.count("round_progress"),
                "metrics_file_bytes": (files / "metrics.jsonl").stat().st_size,
                "metrics_pushes": len((files / "metrics.jsonl").read_text().splitlines()),
                "progress_bar_bytes": (files / "progress.txt").stat().st_size,
                "counter_committed": result.metrics[COUNTER].committed,
                "counter_inc_s_median": median(observer.inc_s),
                **sampling_figures(observer.samples, len(rounds)),
            }
        history, metrics = list(result.history), dict(result.metrics)
        result.release()
    sampled = f", {len(observer.samples)} samples" if mode in OBSERVED else ""
    log(
        f"  {label}: {run['rounds']} rounds, {total_s:.2f} s, median round "
        f"{median(rounds):.3f} s, {jobs.jobs} jobs ({run['jobs_any_thread']} from any "
        f"thread){sampled}"
    )
    return Run(run, history, metrics, observer.samples)


def per_call_s(call: Callable[[], None], calls: int) -> float:
    """Median over 5 batches of the time of one ``call()``."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        batches.append((time.perf_counter() - start) / calls)
    return median(batches)


def driver_costs(iteration: str, on: Run, fast: Run, calls: int = 1000) -> dict[str, float]:
    """What the observers do on the driver per round (per push, per sample), no Spark.

    Replays the last "on" run's RoundProgress records into an event log and a progress
    bar (drawing into a file) and its metric totals into a ``JsonLinesSink``, and the
    last "fast" run's samples into the bar and into the event log's ``round_progress``
    lines. The counter's ``inc()`` needs an active run, so it is timed inside the runs
    only; reading Spark's status store needs a running round, so its cost is only in
    fast / unsampled.
    """
    history = on.history
    snapshot = MetricsSnapshot(
        iteration=iteration,
        run_id="bench",
        time=datetime.now(timezone.utc),
        epoch=history[-1].epoch,
        final=False,
        metrics=on.metrics,
    )
    with (
        tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp,
        EventLog(Path(tmp) / "events.jsonl") as events,
        (Path(tmp) / "progress.txt").open("w", encoding="utf-8") as out,
    ):
        records = itertools.cycle(history)
        bar = ProgressBar(iteration, max_rounds=None, enabled=True, file=out)
        sink = itf.metrics.JsonLinesSink(Path(tmp) / "metrics.jsonl")
        costs = {
            "event_log_line_s": per_call_s(
                lambda: events.round_end(run_id="bench", progress=next(records)), calls
            ),
            "progress_bar_update_s": per_call_s(lambda: bar.round_end(next(records)), calls),
            "sink_push_s": per_call_s(lambda: sink.push(snapshot), calls),
        }
        running = [s for s in fast.samples if not s.final]
        if running:
            samples = itertools.cycle(running)
            costs |= {
                "event_log_progress_line_s": per_call_s(
                    lambda: events.round_progress(run_id="bench", sample=next(samples)), calls
                ),
                "progress_bar_sample_s": per_call_s(
                    lambda: bar.round_progress(next(samples)), calls
                ),
            }
        bar.close("done")
    return costs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and fewer rounds (a smoke test, about a minute)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help="a 10x larger graph whose rounds outlast the default interval, so that the "
        '"on" mode samples every round (10 rounds, 10 runs of each mode; writes '
        "bench_observability.long.json)",
    )
    parser.add_argument(
        "--fast-interval",
        type=float,
        default=FAST_INTERVAL_S,
        metavar="SECONDS",
        help=f'progress_interval_s of the "fast" mode (default {FAST_INTERVAL_S})',
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.quick:
        vertices, edge_target, rounds, repetitions = 2_000, 20_000, 10, 1
    elif args.long:
        vertices, edge_target, rounds, repetitions = 200_000, 2_000_000, 10, 10
    else:
        vertices, edge_target, rounds, repetitions = 20_000, 200_000, 50, 8
    intervals = {
        "off": 0.0,
        "unsampled": 0.0,
        "on": DEFAULT_INTERVAL_S,
        "fast": args.fast_interval,
    }

    spark = start_session()
    w = pagerank_workload(spark, vertices, edge_target, rounds)

    log(f"warm-up: one run of each mode, {rounds} rounds")
    for mode in MODES:
        measure(spark, f"{mode} (warm-up)", mode, w, intervals)
    log(f"{rounds} rounds, {repetitions} runs of each mode")
    sequence, measured = alternate(
        MODES, repetitions, lambda mode: measure(spark, mode, mode, w, intervals)
    )
    runs = {mode: [r.numbers for r in rs] for mode, rs in measured.items()}
    log("driver-side cost of the observers, replayed without Spark")
    driver = driver_costs(pagerank_body(w.n).name, measured["on"][-1], measured["fast"][-1])

    summary: dict[str, dict[str, Any]] = {}
    for mode, rs in runs.items():
        summary[mode] = {
            "progress_interval_s": intervals[mode],
            "total_s_median": median([r["total_s"] for r in rs]),
            "round_s_median": median([median(r["round_s"]) for r in rs]),
            "jobs_per_run": sorted({r["jobs"] for r in rs}),
            "jobs_any_thread_per_run": sorted({r["jobs_any_thread"] for r in rs}),
            "jobs_per_round": rs[0]["jobs"] / rs[0]["rounds"],
        }
        if mode in OBSERVED:
            summary[mode] |= {
                "samples_per_run": [r["samples"] for r in rs],
                "final_samples_per_run": [r["final_samples"] for r in rs],
                "rounds_sampled_per_run": [r["rounds_sampled"] for r in rs],
                "event_log_round_progress_lines_per_run": [
                    r["event_log_round_progress_lines"] for r in rs
                ],
            }

    def ratios(a: str, b: str) -> dict[str, Any]:
        return {
            "total": summary[a]["total_s_median"] / summary[b]["total_s_median"],
            "round_median": summary[a]["round_s_median"] / summary[b]["round_s_median"],
            "total_per_repetition": [
                x["total_s"] / y["total_s"] for x, y in zip(runs[a], runs[b], strict=True)
            ],
        }

    fast_samples = median([r["samples"] for r in runs["fast"]])
    last_on = runs["on"][-1]
    results = {
        "target": TARGET,
        "sampling_target": SAMPLING_TARGET,
        "sequence": sequence,
        "summary": summary,
        "ratio_on_over_off": ratios("on", "off"),
        "ratio_on_over_unsampled": ratios("on", "unsampled"),
        "ratio_fast_over_unsampled": ratios("fast", "unsampled"),
        "ratio_unsampled_over_off": ratios("unsampled", "off"),
        "extra_per_round_s": (summary["on"]["total_s_median"] - summary["off"]["total_s_median"])
        / rounds,
        "fast_extra_per_sample_s": (
            (summary["fast"]["total_s_median"] - summary["unsampled"]["total_s_median"])
            / fast_samples
            if fast_samples
            else None
        ),
        "same_jobs_with_and_without_sampling": all(
            summary[m]["jobs_per_run"] == summary["unsampled"]["jobs_per_run"]
            and summary[m]["jobs_any_thread_per_run"]
            == summary["unsampled"]["jobs_any_thread_per_run"]
            for m in ("on", "fast")
        ),
        "event_log_bytes": last_on["event_log_bytes"],
        "metrics_file_bytes": last_on["metrics_file_bytes"],
        "metrics_pushes": last_on["metrics_pushes"],
        "progress_bar_bytes": last_on["progress_bar_bytes"],
        "counter_committed": last_on["counter_committed"],
        "driver_costs": {
            **driver,
            "counter_inc_s": median([r["counter_inc_s_median"] for r in runs["on"]]),
        },
        "runs": runs,
    }
    costs = results["driver_costs"]
    off = summary["off"]
    # Per round: one event-log line, one bar update, one inc(); plus the sink's pushes.
    costs["per_round_s"] = (
        costs["event_log_line_s"]
        + costs["progress_bar_update_s"]
        + costs["counter_inc_s"]
        + costs["sink_push_s"] * last_on["metrics_pushes"] / rounds
    )
    costs["per_round_over_off_round"] = costs["per_round_s"] / off["round_s_median"]

    def jobs(mode: str) -> str:
        s = summary[mode]
        shown = "/".join(str(j) for j in s["jobs_per_run"])
        anywhere = "/".join(str(j) for j in s["jobs_any_thread_per_run"])
        return f"{shown} ({anywhere} from any thread), {s['jobs_per_round']:.3g} per round"

    def samples(mode: str) -> str:
        s = summary[mode]
        return (
            f"{median(s['samples_per_run']):g} samples, "
            f"{median(s['rounds_sampled_per_run']):g} of {rounds} rounds sampled, "
            f"{median(s['event_log_round_progress_lines_per_run']):g} round_progress lines"
        )

    rows: list[tuple[str, Any]] = []
    for mode in MODES:
        s = summary[mode]
        rows += [
            (f"{mode}: progress_interval_s", s["progress_interval_s"]),
            (f"{mode}: total (s)", s["total_s_median"]),
            (f"{mode}: median round, duration_s (s)", s["round_s_median"]),
            (f"{mode}: jobs per run", jobs(mode)),
        ]
        if mode in OBSERVED:
            rows.append((f"{mode}: per run (median)", samples(mode)))
    rows += [
        (f"on / off, total (target <= {TARGET})", results["ratio_on_over_off"]["total"]),
        ("on / off, median round", results["ratio_on_over_off"]["round_median"]),
        ("on - off, per round (s)", results["extra_per_round_s"]),
        (
            f"on / unsampled, total (target <= {SAMPLING_TARGET})",
            results["ratio_on_over_unsampled"]["total"],
        ),
        ("on / unsampled, median round", results["ratio_on_over_unsampled"]["round_median"]),
        ("fast / unsampled, total", results["ratio_fast_over_unsampled"]["total"]),
        ("fast / unsampled, median round", results["ratio_fast_over_unsampled"]["round_median"]),
        ("fast - unsampled, per sample (s)", results["fast_extra_per_sample_s"]),
        ("unsampled / off, total", results["ratio_unsampled_over_off"]["total"]),
        ("same jobs with and without sampling", results["same_jobs_with_and_without_sampling"]),
        ("event log of an on run (bytes)", results["event_log_bytes"]),
        (
            "metrics file (bytes, pushes)",
            f"{results['metrics_file_bytes']}, {results['metrics_pushes']}",
        ),
        ("progress bar output (bytes)", results["progress_bar_bytes"]),
        (f"counter {COUNTER} (committed)", results["counter_committed"]),
        ("driver: event-log line (us)", costs["event_log_line_s"] * 1e6),
        ("driver: progress bar update (us)", costs["progress_bar_update_s"] * 1e6),
        ("driver: counter inc() in the listener (us)", costs["counter_inc_s"] * 1e6),
        ("driver: sink push (us)", costs["sink_push_s"] * 1e6),
        ("driver: all of it, per round (us)", costs["per_round_s"] * 1e6),
        ("driver: per round / off median round", costs["per_round_over_off_round"]),
    ]
    if "progress_bar_sample_s" in costs:
        rows += [
            ("driver: bar update for a sample (us)", costs["progress_bar_sample_s"] * 1e6),
            ("driver: round_progress line (us)", costs["event_log_progress_line_s"] * 1e6),
        ]
    print_table(w.title(repetitions), rows)
    observed = (
        "run(progress=True, event_log=file, progress_interval_s={}), "
        f"push_metrics(JsonLinesSink(file), every_s={PUSH_EVERY_S}), "
        f"listener: itf.metrics.counter({COUNTER!r}).inc() every round, "
        "on_round_progress counts the samples"
    )
    config = w.settings(
        repetitions=repetitions,
        warm_up_rounds=rounds,
        on=observed.format(f"{DEFAULT_INTERVAL_S} (default)"),
        unsampled=observed.format(0),
        fast=observed.format(args.fast_interval),
        off="run(progress=False, progress_interval_s=0)",
        event_log_progress_s="5.0 (default)",
    )
    name = "bench_observability.long" if args.long and not args.quick else "bench_observability"
    finish(spark, name, args.quick, results, **config)


if __name__ == "__main__":
    main()
