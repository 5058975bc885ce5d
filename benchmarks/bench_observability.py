"""What observability costs: PageRank with every observer on against the same run with none.

"on" runs ``pagerank_body(n)`` with ``run(progress=True, event_log=...)``, a
``JsonLinesSink`` pushed every second and a listener that increments a user
counter on the driver every round. "off" runs the same iteration with
``progress=False``, no event log, no sink and no listener. Both run a fixed
number of rounds (``itf.max_rounds``, no tolerance), so every run does the same
work. The progress bar is drawn (``progress=True`` forces it) into a file that
stands in for the terminal, like the event log and the metrics file. Runs
alternate (the starting mode rotates every repetition) after one warm-up run of
each, and the ratio is of medians. Target: on / off <= 1.05. At the end, the
observers' own driver-side work (an event-log line, a bar update, a sink push) is
timed on its own by replaying the last "on" run's records without Spark.

    python benchmarks/bench_observability.py [--quick]
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, redirect_stderr
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
    parse_args,
    print_table,
    settle,
    start_session,
)
from pyspark.sql import SparkSession

import iterflow as itf
from iterflow.demo.pagerank import pagerank_body
from iterflow.metrics import MetricsSnapshot
from iterflow.progress.bar import ProgressBar
from iterflow.progress.events import EventLog

TARGET = 1.05
MODES = ("off", "on")
PUSH_EVERY_S = 1.0
COUNTER = "bench.rounds"


def run_once(
    w: PageRankWorkload, mode: str, files: Path, inc_s: list[float]
) -> tuple[float, itf.IterationResult]:
    """One run in ``mode``: its time (building the iteration and ``run()``) and its result.

    In "on" mode the event log, the metrics file and the progress bar's output go to
    fresh files in ``files``, and the listener appends the time of each ``inc()`` to
    ``inc_s``.
    """
    it = w.iteration()
    if mode == "off":
        start = time.perf_counter()
        result = it.run(progress=False)
        return time.perf_counter() - start, result
    with ExitStack() as stack:
        bar = stack.enter_context((files / "progress.txt").open("w", encoding="utf-8"))
        stack.enter_context(redirect_stderr(bar))
        start = time.perf_counter()
        counter = itf.metrics.counter(COUNTER)

        def count_round(_ctx: itf.RoundEnd) -> None:
            clock = time.perf_counter()
            counter.inc()
            inc_s.append(time.perf_counter() - clock)

        result = (
            it.push_metrics(
                itf.metrics.JsonLinesSink(files / "metrics.jsonl"), every_s=PUSH_EVERY_S
            )
            .listen(count_round)
            .run(progress=True, event_log=files / "events.jsonl")
        )
        return time.perf_counter() - start, result


class Run(NamedTuple):
    """The numbers of one run, and what the driver-side timings replay."""

    numbers: dict[str, Any]
    history: list[itf.RoundProgress]
    metrics: dict[str, itf.metrics.MetricResult]


def measure(spark: SparkSession, label: str, mode: str, w: PageRankWorkload) -> Run:
    settle(spark)
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        files = Path(tmp)
        with count_jobs(spark, f"observability-{mode}") as jobs:
            total_s, result = run_once(w, mode, files, inc_s := [])
        rounds = [p.duration_s for p in result.history]
        run: dict[str, Any] = {
            "total_s": total_s,
            "round_s": rounds,
            "rounds": len(rounds),
            "jobs": jobs.jobs,
        }
        if mode == "on":
            run |= {
                "event_log_bytes": (files / "events.jsonl").stat().st_size,
                "metrics_file_bytes": (files / "metrics.jsonl").stat().st_size,
                "metrics_pushes": len((files / "metrics.jsonl").read_text().splitlines()),
                "progress_bar_bytes": (files / "progress.txt").stat().st_size,
                "counter_committed": result.metrics[COUNTER].committed,
                "counter_inc_s_median": median(inc_s),
            }
        history, metrics = list(result.history), dict(result.metrics)
        result.release()
    log(
        f"  {label}: {run['rounds']} rounds, {total_s:.2f} s, median round "
        f"{median(rounds):.3f} s, {jobs.jobs} jobs"
    )
    return Run(run, history, metrics)


def per_call_s(call: Callable[[], None], calls: int) -> float:
    """Median over 5 batches of the time of one ``call()``."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        batches.append((time.perf_counter() - start) / calls)
    return median(batches)


def driver_costs(iteration: str, on: Run, calls: int = 1000) -> dict[str, float]:
    """What the "on" observers do on the driver per round (per push for the sink), no Spark.

    Replays the last "on" run's RoundProgress records into an event log and a progress
    bar (drawing into a file) and its metric totals into a ``JsonLinesSink``. The
    counter's ``inc()`` needs an active run, so it is timed inside the runs only.
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
        bar.close("done")
    return costs


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        vertices, edge_target, rounds, repetitions = 2_000, 20_000, 10, 1
    else:
        vertices, edge_target, rounds, repetitions = 20_000, 200_000, 50, 6

    spark = start_session()
    w = pagerank_workload(spark, vertices, edge_target, rounds)

    log(f"warm-up: one run of each mode, {rounds} rounds")
    for mode in MODES:
        measure(spark, f"{mode} (warm-up)", mode, w)
    log(f"{rounds} rounds, {repetitions} runs of each mode")
    sequence, measured = alternate(MODES, repetitions, lambda mode: measure(spark, mode, mode, w))
    runs = {mode: [r.numbers for r in rs] for mode, rs in measured.items()}
    log("driver-side cost of the observers, replayed without Spark")
    driver = driver_costs(pagerank_body(w.n).name, measured["on"][-1])

    summary = {
        mode: {
            "total_s_median": median([r["total_s"] for r in rs]),
            "round_s_median": median([median(r["round_s"]) for r in rs]),
            "jobs_per_round": rs[0]["jobs"] / rs[0]["rounds"],
        }
        for mode, rs in runs.items()
    }
    on, off = summary["on"], summary["off"]
    last_on = runs["on"][-1]
    results = {
        "target": TARGET,
        "sequence": sequence,
        "summary": summary,
        "ratio_on_over_off": {
            "total": on["total_s_median"] / off["total_s_median"],
            "round_median": on["round_s_median"] / off["round_s_median"],
        },
        "extra_per_round_s": (on["total_s_median"] - off["total_s_median"]) / rounds,
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
    # Per round: one event-log line, one bar update, one inc(); plus the sink's pushes.
    costs["per_round_s"] = (
        costs["event_log_line_s"]
        + costs["progress_bar_update_s"]
        + costs["counter_inc_s"]
        + costs["sink_push_s"] * last_on["metrics_pushes"] / rounds
    )
    costs["per_round_over_off_round"] = costs["per_round_s"] / off["round_s_median"]
    rows: list[tuple[str, Any]] = []
    for mode in MODES:
        s = summary[mode]
        rows += [
            (f"{mode}: total (s)", s["total_s_median"]),
            (f"{mode}: median round, duration_s (s)", s["round_s_median"]),
            (f"{mode}: jobs per round", s["jobs_per_round"]),
        ]
    rows += [
        (f"on / off, total (target <= {TARGET})", results["ratio_on_over_off"]["total"]),
        ("on / off, median round", results["ratio_on_over_off"]["round_median"]),
        ("on - off, per round (s)", results["extra_per_round_s"]),
        ("event log (bytes)", results["event_log_bytes"]),
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
    print_table(w.title(repetitions), rows)
    config = w.settings(
        repetitions=repetitions,
        warm_up_rounds=rounds,
        on=(
            "run(progress=True, event_log=file), "
            f"push_metrics(JsonLinesSink(file), every_s={PUSH_EVERY_S}), "
            f"listener: itf.metrics.counter({COUNTER!r}).inc()"
        ),
        off="run(progress=False)",
    )
    finish(spark, "bench_observability", args.quick, results, **config)


if __name__ == "__main__":
    main()
