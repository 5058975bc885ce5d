"""Where a round's Spark jobs come from: each job attributed to the call that started it.

``JobSources`` wraps PySpark's actions (``localCheckpoint``, ``collect``, ``toArrow``,
``count``...) while active. For each outermost action it reads the driver's next job
id before and after (``DAGScheduler.nextJobId``: synchronous, counts jobs of every
thread) and records the jobs under a label: the action, and the innermost frame of
iterflow (or of the benchmark) that called it. Jobs started outside any wrapped
action (a background checkpoint write, a broadcast) count as ``(other)``.
"""

from __future__ import annotations

import collections
import functools
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

ACTIONS = (
    "localCheckpoint",
    "checkpoint",
    "collect",
    "toArrow",
    "toPandas",
    "count",
    "first",
    "take",
    "head",
    "isEmpty",
    "toLocalIterator",
    "foreachPartition",
)


def next_job_id(spark: SparkSession) -> int:
    """The id the driver gives its next job: every job submitted so far, from any thread."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def _caller() -> str:
    """The innermost frame outside PySpark and this module: ``module.function``."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("pyspark", "py4j", __name__)):
            return f"{module.removeprefix('iterflow.')}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


class JobSources:
    """Counts jobs per (action, caller) while active (``with sources.active(): ...``)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.counts: collections.Counter[str] = collections.Counter()
        #: Seconds spent in each label's actions (their jobs, and planning them).
        self.seconds: collections.Counter[str] = collections.Counter()
        #: Seconds of Spark's analysis, optimization and planning of the actions' plans
        #: (``QueryPlanningTracker``; adaptive re-planning while a plan runs is not in it).
        self.phases: collections.Counter[str] = collections.Counter()
        self._depth = 0
        self._start = 0
        self._end = 0

    @contextmanager
    def active(self) -> Iterator[JobSources]:
        originals = {name: getattr(ClassicFrame, name) for name in ACTIONS}
        for name, method in originals.items():
            setattr(ClassicFrame, name, self._wrapped(name, method))
        self._start = next_job_id(self.spark)
        try:
            yield self
        finally:
            self._end = next_job_id(self.spark)
            for name, method in originals.items():
                setattr(ClassicFrame, name, method)
            other = self.total - sum(self.counts.values())
            if other:
                self.counts["(other)"] += other

    @property
    def total(self) -> int:
        return self._end - self._start

    def _wrapped(self, name: str, method: Any) -> Any:
        @functools.wraps(method)
        def traced(df: Any, *args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return method(df, *args, **kwargs)
            label = f"{name} <- {_caller()}"
            before = next_job_id(self.spark)
            clock = time.perf_counter()
            self._depth += 1
            try:
                return method(df, *args, **kwargs)
            finally:
                self._depth -= 1
                jobs = next_job_id(self.spark) - before
                self.seconds[label] += time.perf_counter() - clock
                self._read_phases(df)
                if jobs:
                    self.counts[label] += jobs

        return traced

    def _read_phases(self, df: Any) -> None:
        try:
            phases = df._jdf.queryExecution().tracker().phases()
            for name in ("analysis", "optimization", "planning"):
                summary = phases.get(name)
                if summary.isDefined():
                    self.phases[name] += summary.get().durationMs() / 1000
        except Exception:  # a Spark without the tracker: no phases
            pass

    def per_round(self, rounds: int) -> list[tuple[str, float]]:
        """Jobs per round by source, most first."""
        return [(label, jobs / rounds) for label, jobs in self.counts.most_common()]
