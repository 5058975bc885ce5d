"""Shared setup of the benchmarks: session, settings, timing, job counting, output.

Every benchmark script starts one embedded ``local[2]`` session (UI off, 4 shuffle
partitions), runs its measurements sequentially in that one JVM, prints a small
table and writes ``benchmarks/results/NAME.json`` (``NAME.quick.json`` with
``--quick``) holding the numbers and the settings they were measured with
(:func:`finish`).

Comparisons run their variants in rotation (:func:`alternate`); those whose variants
are functions returning a result and a record use :func:`compare_runners`. The
PageRank scripts share their workload (:class:`PageRankWorkload`).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
from pyspark.sql import DataFrame, SparkSession

import iterflow as itf
from iterflow.demo.pagerank_demo import initial_ranks, pagerank_body, random_graph
from iterflow.runtime.spark.session import embedded_session

T = TypeVar("T")

RESULTS = Path(__file__).resolve().parent / "results"
MASTER = "local[2]"
SESSION_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}


def parse_args(description: str, **flags: str) -> argparse.Namespace:
    """``--quick``, and a ``--NAME`` switch for every ``NAME=help`` in ``flags``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and fewer rounds (a smoke test, under a minute)",
    )
    for name, text in flags.items():
        parser.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=text)
    return parser.parse_args()


def start_session() -> SparkSession:
    """The benchmark session: ``local[2]``, UI off, 4 shuffle partitions, quiet logs."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = embedded_session(MASTER, app_name="iterflow-bench", conf=SESSION_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def settings(spark: SparkSession, quick: bool, **workload: Any) -> dict[str, Any]:
    """What a result was measured with: versions, Spark settings, machine, workload."""
    conf = spark.conf
    return {
        "spark_version": spark.version,
        "master": spark.sparkContext.master,
        "shuffle_partitions": int(conf.get("spark.sql.shuffle.partitions")),
        "aqe_enabled": conf.get("spark.sql.adaptive.enabled") == "true",
        "aqe_coalesce_partitions": conf.get("spark.sql.adaptive.coalescePartitions.enabled")
        == "true",
        "driver_memory": conf.get("spark.driver.memory", None),
        "ui_enabled": conf.get("spark.ui.enabled", None),
        "python": platform.python_version(),
        "iterflow_version": itf.__version__,
        "iterflow_commit": COMMIT,
        "cpu_count": os.cpu_count(),
        "quick": quick,
        **workload,
    }


def _git_head() -> str | None:
    """The commit measured, with "+dirty" when iterflow/ has uncommitted changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=RESULTS.parent, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "../iterflow")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


# Read when the benchmark starts, i.e. the code it imported (the tree may change meanwhile).
COMMIT = _git_head()


def write_result(name: str, quick: bool, config: dict[str, Any], results: dict[str, Any]) -> Path:
    """Write ``{"benchmark", "measured_at", "load_average", "settings", "results"}`` as JSON."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}{'.quick' if quick else ''}.json"
    payload = {
        "benchmark": name,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # Other work may share the 2 cores; the load average tells a reader if it did.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "settings": config,
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    print(f"\nwrote {path}")
    return path


def finish(
    spark: SparkSession, name: str, quick: bool, results: dict[str, Any], **workload: Any
) -> Path:
    """The end of a benchmark script: write its result file, then stop the session.

    The file holds ``results`` and the :func:`settings` of ``spark`` with ``workload``
    (see :func:`write_result`).
    """
    path = write_result(name, quick, settings(spark, quick, **workload), results)
    spark.stop()
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def print_table(title: str, rows: Sequence[tuple[str, Any]]) -> None:
    """Print ``rows`` of (label, value) under ``title``, floats with 4 significant digits."""
    width = max(len(label) for label, _ in rows)
    print(f"\n{title}")
    print("-" * (width + 16))
    for label, value in rows:
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"{label:<{width}}  {shown}")


# -- timing ---------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def slope(values: Sequence[float], first_round: int = 0) -> float:
    """Least-squares slope of ``values`` against their round index (seconds per round per round)."""
    rounds = np.arange(first_round, first_round + len(values))
    return float(np.polyfit(rounds, np.asarray(values, dtype=float), 1)[0])


def round_times(stamps: Sequence[float], start: float) -> list[float]:
    """Per-round wall times from the clock readings at the end of every round."""
    return list(np.diff([start, *stamps]))


class RoundClock:
    """An iterflow listener reading the clock at every round end (full round cycle)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.stamps: list[float] = []

    def __call__(self, _ctx: itf.RoundEnd) -> None:
        self.stamps.append(time.perf_counter())

    @property
    def round_times(self) -> list[float]:
        return round_times(self.stamps, self.start)


def rotation(names: Sequence[str], repetitions: int) -> list[str]:
    """The order of the measured runs: every name once per repetition, the first one rotating.

    For two names: A, B, B, A, A, B; for three: A, B, C, B, C, A, C, A, B.
    """
    return [
        name
        for rep in range(repetitions)
        for name in [*names[rep % len(names) :], *names[: rep % len(names)]]
    ]


def alternate(
    names: Sequence[str], repetitions: int, measure: Callable[[str], T]
) -> tuple[list[str], dict[str, list[T]]]:
    """``measure(name)`` ``repetitions`` times for every name, in :func:`rotation` order.

    Returns the order the runs ran in and every name's results in that order.
    """
    sequence = rotation(names, repetitions)
    runs: dict[str, list[T]] = {name: [] for name in names}
    for name in sequence:
        runs[name].append(measure(name))
    return sequence, runs


def settle(spark: SparkSession) -> None:
    """Between measured runs: drop dead Python references and let the JVM collect garbage.

    Not timed. Blocks a hand-written loop left to the garbage collector (and
    py4j proxies of finished runs) would otherwise be freed during the next run.
    """
    gc.collect()
    spark.sparkContext._jvm.System.gc()
    time.sleep(0.2)


# -- Spark job counting -----------------------------------------------------------------


class JobCount:
    """The number of Spark jobs a ``with count_jobs(...)`` block ran."""

    jobs: int = 0


@contextmanager
def count_jobs(spark: SparkSession, group: str) -> Iterator[JobCount]:
    """Count the Spark jobs run inside the block (needs only this thread to submit jobs).

    Runs a marker job in its own group before the block (not inside the
    measurement), puts the block's jobs in job group ``group``, and counts
    ``max(job id in group) - marker job id``: job ids are sequential, so this
    stays exact even when the status store has dropped old jobs (it keeps ~1000).
    """
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    sc.setJobGroup(f"{group}-marker", "benchmark job counter marker")
    sc.parallelize([0], 1).count()
    marker = _wait_for_jobs(lambda: tracker.getJobIdsForGroup(f"{group}-marker"))
    sc.setJobGroup(group, "benchmark measurement")
    counted = JobCount()
    try:
        yield counted
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    ids = _wait_for_jobs(lambda: tracker.getJobIdsForGroup(group))
    counted.jobs = max(ids) - max(marker) if ids else 0


def _wait_for_jobs(read: Callable[[], list[int]]) -> list[int]:
    """Job ids of a group once the (asynchronous) status store has stopped changing."""
    previous = sorted(read())
    for _ in range(50):
        time.sleep(0.1)
        current = sorted(read())
        if current == previous:
            return current
        previous = current
    return previous


# -- comparing functions that return a result ------------------------------------------


class Run(NamedTuple):
    """One measured run: its seconds, its Spark jobs, its result and what it recorded."""

    seconds: float
    jobs: int
    value: Any
    info: dict[str, Any]


#: A variant of a comparison: runs, forces its result and returns it with what it recorded.
Runner = Callable[[], tuple[Any, dict[str, Any]]]


def time_run(spark: SparkSession, label: str, runner: Runner, count: str = "rounds") -> Run:
    """Time ``runner`` in a job group of its own (named after ``label``), after settling.

    The log line gives the seconds, the jobs and ``info[count]`` if the runner recorded it.
    """
    settle(spark)
    group = "".join(c if c.isalnum() else "-" for c in label)
    with count_jobs(spark, group) as jobs:
        clock = time.perf_counter()
        value, info = runner()
        seconds = time.perf_counter() - clock
    counted = f", {info[count]} {count}" if count in info else ""
    log(f"  {label}: {seconds:.2f} s, {jobs.jobs} jobs{counted}")
    return Run(seconds, jobs.jobs, value, info)


def compare_runners(
    spark: SparkSession,
    title: str,
    runners: dict[str, Runner],
    repetitions: int,
    check: Callable[[dict[str, Any]], dict[str, Any]],
    release: Callable[[str, Any], None] | None = None,
    figures: Callable[[list[Run]], dict[str, Any]] | None = None,
    count: str = "rounds",
) -> dict[str, Any]:
    """One warm-up run of every variant, then ``repetitions`` runs of each (:func:`alternate`).

    ``check`` gets the warm-up runs' results (by variant) before the measured runs start
    and returns what it found; ``release(name, result)``, if given, gets every result once
    it is no longer needed. The summary holds the order of the runs, the check and, per
    variant, the median seconds, every run's seconds, ``figures`` of the runs (if given),
    every run's jobs, the warm-up's seconds and records, and every run's records.
    ``count`` is what the log lines count (:func:`time_run`).
    """
    names = list(runners)
    warm = {
        name: time_run(spark, f"{title} {name} (warm-up)", runners[name], count) for name in names
    }
    checked = check({name: run.value for name, run in warm.items()})
    if release is not None:
        for name, run in warm.items():
            release(name, run.value)

    def measure(name: str) -> Run:
        run = time_run(spark, f"{title} {name}", runners[name], count)
        if release is not None:
            release(name, run.value)
        return run._replace(value=None)

    sequence, runs = alternate(names, repetitions, measure)
    summary: dict[str, Any] = {"sequence": sequence, "check": checked}
    for name, rs in runs.items():
        summary[name] = {
            "s_median": median([r.seconds for r in rs]),
            "s": [r.seconds for r in rs],
            **(figures(rs) if figures is not None else {}),
            "jobs": [r.jobs for r in rs],
            "warm_up_s": warm[name].seconds,
            "warm_up": warm[name].info,
            "runs": [r.info for r in rs],
        }
    return summary


def ratio(a: dict[str, Any], b: dict[str, Any], key: str = "s") -> dict[str, Any]:
    """``a / b`` of two variants of a :func:`compare_runners` summary, by ``key``.

    ``key`` is "s" or another per-run list with its median next to it ("KEY_median"):
    the ratio of the medians and the ratio of every repetition.
    """
    return {
        "of_medians": a[f"{key}_median"] / b[f"{key}_median"],
        "per_repetition": [x / y for x, y in zip(a[key], b[key], strict=True)],
    }


# -- the PageRank workload ---------------------------------------------------------------


class PageRankWorkload(NamedTuple):
    """PageRank on a cached random graph for a number of rounds (:func:`pagerank_workload`)."""

    n: int  # vertices
    edge_count: int  # edges, self-loops and duplicates dropped
    ranks0: DataFrame
    edges: DataFrame
    rounds: int
    graph: str  # how the graph was made

    def iteration(self, body: itf.IterationBody | None = None) -> itf.BoundedIteration:
        """``body`` (``pagerank_body(n)`` by default) on the inputs, for ``rounds`` rounds."""
        return (
            itf.BoundedIteration(pagerank_body(self.n) if body is None else body)
            .bind("ranks", self.ranks0)
            .bind("edges", self.edges)
            .until(itf.max_rounds(self.rounds))
        )

    def settings(self, body: str = "pagerank_body(n)", **more: Any) -> dict[str, Any]:
        """The workload's entries in the result's settings, then ``more``.

        The graph's size and how it was made, the ``body`` run on it and the rounds.
        """
        return {
            "vertices": self.n,
            "edges": self.edge_count,
            "graph": self.graph,
            "body": body,
            "rounds": self.rounds,
            **more,
        }

    def title(self, repetitions: int) -> str:
        """The heading of a table of medians over ``repetitions`` runs of this workload."""
        return (
            f"PageRank {self.n} vertices / {self.edge_count} edges, {self.rounds} rounds "
            f"(medians of {repetitions} runs)"
        )


def pagerank_workload(
    spark: SparkSession, vertices: int, edges: int, rounds: int
) -> PageRankWorkload:
    """PageRank on ``random_graph(spark, vertices, edges, seed=1)`` for ``rounds`` rounds.

    Both inputs (the starting ranks and the edges' ``src`` and ``dst``) are cached and
    counted once here, so iterflow (which does not re-persist a cached input) and the
    hand-written loops start from the same in-memory data and the graph generation is
    not part of any measurement.
    """
    vertex_df, edge_df = random_graph(spark, vertices, edges, seed=1)
    n = vertex_df.count()
    edge_df = edge_df.select("src", "dst").cache()
    edge_count = edge_df.count()
    ranks0 = initial_ranks(vertex_df, edge_df).cache()
    ranks0.count()
    log(f"graph: {n} vertices, {edge_count} edges (self-loops and duplicates dropped)")
    graph = f"random_graph(spark, {vertices}, {edges}, seed=1)"
    return PageRankWorkload(n, edge_count, ranks0, edge_df, rounds, graph)


def child_result(script: str, *args: str, what: str, timeout: int = 1800) -> dict[str, Any]:
    """Run ``script --child ARGS`` with this interpreter (a process of its own, for a
    session of its own) and return the JSON its ``RESULT`` line holds; exit naming
    ``what`` when it fails."""
    done = subprocess.run(
        [sys.executable, script, "--child", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{what} run failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))  # type: ignore[no-any-return]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


_UNIT_BITS = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40, "PiB": 50, "EiB": 60}


def size_estimate_log10(df: DataFrame) -> float:
    """log10 of the optimizer's ``sizeInBytes`` estimate for ``df`` (a BigInt of any size).

    Read from ``Statistics.simpleString`` ("sizeInBytes=5.55E+79 B", "sizeInBytes=2.3 PiB"),
    which stays cheap while the number has up to some 10^5 digits.
    """
    text = df._jdf.queryExecution().optimizedPlan().stats().simpleString()
    found = re.search(r"sizeInBytes=(\S+) (\w+)", text)
    if found is None:
        raise ValueError(f"unexpected statistics: {text[:80]}")
    mantissa, _, exponent = found.group(1).partition("E")
    return (
        math.log10(float(mantissa))
        + int(exponent or 0)
        + _UNIT_BITS[found.group(2)] * math.log10(2)
    )
