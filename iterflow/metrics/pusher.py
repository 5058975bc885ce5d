"""Pushes metrics snapshots to sinks from a background thread while a run goes on.

Pure Python: no Spark import. A failing sink logs a warning and never fails the
run; a hanging one costs at most its own timeout per push. Each snapshot also
carries the rounds that ended since the previous push to its sink, so that a sink
can record every round without slowing any of them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from iterflow.errors import IterflowValueError
from iterflow.metrics.sinks import MetricsSink
from iterflow.metrics.values import MetricsSnapshot
from iterflow.records import RoundProgress

logger = logging.getLogger("iterflow.metrics")


@attrs.define
class _Schedule:
    """One sink, its interval, when it is next due, how many pushes in a row failed and
    the rounds that ended since its last push."""

    sink: MetricsSink
    every_s: float
    due: float = 0.0
    failures: int = 0
    pending: list[RoundProgress] = attrs.field(factory=list)


def validate_interval(sink: MetricsSink, every_s: float) -> float:
    """``every_s`` as a float, or an error naming the sink when it is not a positive number."""
    if (
        isinstance(every_s, bool)
        or not isinstance(every_s, (int, float))
        or not (every_s > 0 and math.isfinite(every_s))
    ):
        raise IterflowValueError(
            f"every_s of metrics sink '{sink.name}' is {every_s!r}: "
            "give a positive number of seconds"
        )
    return float(every_s)


class MetricsPusher:
    """Pushes ``snapshot(False)`` to each sink every ``every_s`` seconds, then a final one.

    ``start()`` starts a daemon thread; ``stop()`` ends it and pushes ``snapshot(True)``
    to every sink before returning. ``started`` and ``round_ended`` hand over the
    run's parameters and each round as it ends: every sink receives each round in
    exactly one push, the one after it ended (a failed push is not repeated).
    Warnings go to the
    ``iterflow.metrics`` logger when a sink starts failing and when it recovers.

    >>> pusher = MetricsPusher(take_snapshot, [(JsonLinesSink("m.jsonl"), 5.0)])  # doctest: +SKIP
    >>> pusher.start()  # doctest: +SKIP
    >>> pusher.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        snapshot: Callable[[bool], MetricsSnapshot],
        sinks: Sequence[tuple[MetricsSink, float]],
    ) -> None:
        for sink, every_s in sinks:
            validate_interval(sink, every_s)
        self._snapshot = snapshot
        self._schedules = [_Schedule(sink, every_s) for sink, every_s in sinks]
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._lock = threading.Lock()  # rounds end on the run's thread, pushes go on this one
        self._parameters: Mapping[str, Any] = {}

    @property
    def has_sinks(self) -> bool:
        """Whether any sink receives the snapshots."""
        return bool(self._schedules)

    def started(self, parameters: Mapping[str, Any]) -> None:
        """The run started with ``parameters``; every snapshot carries them from now on."""
        with self._lock:
            self._parameters = dict(parameters)

    def round_ended(self, progress: RoundProgress) -> None:
        """Round ``progress.epoch`` ended: the next push to each sink carries it."""
        with self._lock:
            for schedule in self._schedules:
                schedule.pending.append(progress)

    def rolled_back(self, epoch: int) -> None:
        """The run goes on after epoch ``epoch``: the rounds after it that a sink was not
        pushed yet run again, so they are dropped (their reruns are pushed instead)."""
        with self._lock:
            for schedule in self._schedules:
                schedule.pending = [p for p in schedule.pending if p.epoch <= epoch]

    def start(self) -> None:
        """Start pushing in a daemon thread; each sink's first push is one interval away."""
        if self._thread is not None or self._stopped:
            raise RuntimeError("a MetricsPusher starts once")
        if not self._schedules:
            return
        now = time.monotonic()
        for schedule in self._schedules:
            schedule.due = now + schedule.every_s
        self._thread = threading.Thread(target=self._run, name="iterflow-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and push the final snapshot to every sink.

        Sinks stay open: they belong to the caller, who may push more runs to them
        (a ``PrometheusSink`` keeps serving the final values until closed).
        Waits for a push in progress, which each sink's timeout bounds. A second
        call does nothing.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self._push_to(self._schedules, final=True)
        for schedule in self._schedules:
            # A single failure was the final push, already logged as the first one.
            if schedule.failures > 1:
                logger.warning(
                    "metrics sink '%s' was still failing when the run ended: "
                    "%d pushes in a row failed, the final one included",
                    schedule.sink.name,
                    schedule.failures,
                )

    def _run(self) -> None:
        while True:
            next_due = min(schedule.due for schedule in self._schedules)
            if self._stopping.wait(max(0.0, next_due - time.monotonic())):
                return
            now = time.monotonic()
            due = [schedule for schedule in self._schedules if schedule.due <= now]
            for schedule in due:
                schedule.due = now + schedule.every_s
            self._push_to(due, final=False)

    def _push_to(self, schedules: list[_Schedule], *, final: bool) -> None:
        """Push one snapshot to ``schedules``' sinks, logging failures instead of raising."""
        if not schedules:
            return
        try:
            snapshot = self._snapshot(final)
        except Exception as error:
            logger.warning(
                "could not take a metrics snapshot (final=%s): %s: %s",
                final,
                type(error).__name__,
                error,
            )
            return
        for schedule in schedules:
            with self._lock:
                rounds, schedule.pending = tuple(schedule.pending), []
                parameters = self._parameters
            try:
                schedule.sink.push(attrs.evolve(snapshot, rounds=rounds, parameters=parameters))
            except Exception as error:
                schedule.failures += 1
                if schedule.failures == 1:
                    logger.warning(
                        "metrics sink '%s' failed: %s: %s (further failures are counted, "
                        "not logged, until it recovers)",
                        schedule.sink.name,
                        type(error).__name__,
                        error,
                    )
            else:
                if schedule.failures:
                    logger.warning(
                        "metrics sink '%s' recovered after %d failed push(es)",
                        schedule.sink.name,
                        schedule.failures,
                    )
                schedule.failures = 0
