"""Pushes metrics snapshots to sinks from background threads while a run goes on.

Pure Python: no Spark import. Rounds never wait for a sink: a round that ends
only joins the list of rounds the next push carries. Each push runs on a thread
of its own and the pusher waits for it at most the sink's ``timeout_s``, so a
slow, refused or hanging sink costs neither the rounds nor the other sinks any
time, and the end of the run waits at most twice ``timeout_s`` for each sink (in
parallel): the push under way, then the final one. A failing sink logs a warning
and never fails the run; a sink that misses the final push gets an
``IterflowWarning``, and a WARNING on the ``iterflow.metrics`` logger, naming what
it missed: the totals and the rounds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from iterflow.errors import IterflowValueError, warn
from iterflow.metrics.sinks import MetricsSink
from iterflow.metrics.values import MetricsSnapshot
from iterflow.reports import RoundProgress

logger = logging.getLogger("iterflow.metrics")

#: Why a push failed that never began: the sink was still busy with the one before.
UNDER_WAY = "its previous push was still under way"


@attrs.define(eq=False)
class _Push:
    """One snapshot on its way to one sink, on a daemon thread of its own.

    ``outcome`` is None until the push is settled: "" once delivered, else what went
    wrong (the sink's error, or that it gave no answer before ``deadline``).
    """

    snapshot: MetricsSnapshot
    deadline: float
    done: threading.Event = attrs.field(factory=threading.Event)
    #: Whether the sink's ``push`` was called (it waits for the sink's previous push).
    called: bool = False
    error: Exception | None = None
    outcome: str | None = None


@attrs.define
class _Schedule:
    """One sink, its interval, when it is next due, its push under way (or the last
    one), how many pushes in a row failed, the rounds that ended since its last push
    and the epochs of the rounds its failed pushes carried."""

    sink: MetricsSink
    every_s: float
    due: float = 0.0
    push: _Push | None = None
    failures: int = 0
    pending: list[RoundProgress] = attrs.field(factory=list)
    undelivered: list[int] = attrs.field(factory=list)

    @property
    def timeout_s(self) -> float:
        return float(self.sink.timeout_s)

    @property
    def busy(self) -> bool:
        """Whether the sink's last push has not returned yet (a late one included)."""
        return self.push is not None and not self.push.done.is_set()


def validate_timing(sink: MetricsSink, every_s: float) -> float:
    """``every_s`` as a float, or an error naming the sink when it, or the sink's
    ``timeout_s``, is not a positive number."""
    for what, seconds in (("every_s", every_s), ("timeout_s", getattr(sink, "timeout_s", None))):
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not (seconds > 0 and math.isfinite(seconds))
        ):
            raise IterflowValueError(
                f"{what} of metrics sink '{sink.name}' is {seconds!r}: "
                "give a positive number of seconds"
            )
    return float(every_s)


class MetricsPusher:
    """Pushes ``snapshot(False)`` to each sink every ``every_s`` seconds, then a final one.

    ``start()`` starts the scheduling thread; ``stop()`` ends it and pushes
    ``snapshot(True)`` to every sink before returning, waiting at most
    ``2 × timeout_s`` for each sink, all sinks at once (see ``stop``). ``started`` and
    ``round_ended`` hand over the run's parameters and each round as it ends,
    without waiting for any push: every sink receives each round in exactly one
    push, the first one after it ended that the sink is free for (a sink still busy
    with its previous push skips its turn; a failed push is not repeated).
    Warnings go to the ``iterflow.metrics`` logger when a sink starts failing and
    when it recovers; ``stop()`` warns (``IterflowWarning``) for each sink that
    did not receive the final push, naming what it missed.

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
            validate_timing(sink, every_s)
        self._snapshot = snapshot
        self._schedules = [_Schedule(sink, every_s) for sink, every_s in sinks]
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        # Rounds end on the run's thread; pushes are made on the scheduling thread.
        self._lock = threading.Lock()
        # Pushes are settled on their own threads and on the scheduling one.
        self._settling = threading.Lock()
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

        Returns once every sink received it, or gave up on the slowest: each sink
        gets its ``timeout_s``, twice that when it is still busy with a push (to
        finish it, then the final one), all sinks at once. An ``IterflowWarning``, also
        logged at WARNING, names each sink that did not receive the final push and what
        it missed.
        Sinks stay open: they belong to the caller, who may push more runs to them
        (a ``PrometheusSink`` keeps serving the final values until closed). A second
        call does nothing.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()  # never waits for a push: pushes run on threads of their own
        if not self._schedules:
            return
        under_way = [(s, s.push) for s in self._schedules if s.push is not None and s.busy]
        finals = self._push_to(self._schedules, final=True, now=time.monotonic())
        for _, push in finals:
            push.done.wait(max(0.0, push.deadline - time.monotonic()))
        # A push still under way counts as failed by now: its deadline came before the final's.
        for schedule, push in [*under_way, *finals]:
            self._settle(schedule, push)
        for schedule, push in finals:
            if push.outcome:
                given_up(self._missed(schedule, push))

    def _run(self) -> None:
        while True:
            # Wake when a sink is due, or when a push under way reaches its deadline.
            wake = min(
                [schedule.due for schedule in self._schedules]
                + [
                    schedule.push.deadline
                    for schedule in self._schedules
                    if schedule.push is not None and schedule.push.outcome is None
                ]
            )
            if self._stopping.wait(max(0.0, wake - time.monotonic())):
                return
            now = time.monotonic()
            for schedule in self._schedules:
                if schedule.push is not None and now >= schedule.push.deadline:
                    self._settle(schedule, schedule.push)
            due = [schedule for schedule in self._schedules if schedule.due <= now]
            for schedule in due:
                schedule.due = now + schedule.every_s
            # A sink still busy skips its turn: its rounds wait for its next push.
            self._push_to([s for s in due if not s.busy], final=False, now=now)

    def _push_to(
        self, schedules: list[_Schedule], *, final: bool, now: float
    ) -> list[tuple[_Schedule, _Push]]:
        """Start pushing one snapshot to ``schedules``' sinks, each on a thread of its own;
        a failure to take the snapshot is logged (periodic) or warned about (final)."""
        if not schedules:
            return []
        try:
            snapshot = self._snapshot(final)
        except Exception as error:
            message = (
                f"could not take a metrics snapshot (final={final}): "
                f"{type(error).__name__}: {error}"
            )
            if final:
                names = ", ".join(f"'{s.sink.name}'" for s in schedules)
                given_up(f"{message}; metrics sink(s) {names} did not receive the final push")
            else:
                logger.warning("%s", message)
            return []
        started = []
        for schedule in schedules:
            with self._lock:
                rounds, schedule.pending = tuple(schedule.pending), []
                parameters = self._parameters
            previous = schedule.push if schedule.busy else None
            # A push gets timeout_s; a final one waiting for the one under way, twice that.
            deadline = now + schedule.timeout_s * (2 if previous is not None else 1)
            push = _Push(attrs.evolve(snapshot, rounds=rounds, parameters=parameters), deadline)
            schedule.push = push
            threading.Thread(
                target=self._deliver,
                args=(schedule, push, previous),
                name=f"iterflow-metrics {schedule.sink.name}",
                daemon=True,
            ).start()
            started.append((schedule, push))
        return started

    def _deliver(self, schedule: _Schedule, push: _Push, previous: _Push | None) -> None:
        """Push on this thread, after ``previous`` (a sink gets one push at a time)."""
        try:
            if previous is not None and not previous.done.wait(
                max(0.0, push.deadline - time.monotonic())
            ):
                raise TimeoutError(UNDER_WAY)
            push.called = True
            schedule.sink.push(push.snapshot)
        except Exception as error:
            push.error = error
        finally:
            self._settle(schedule, push, returned=True)
            push.done.set()

    def _settle(self, schedule: _Schedule, push: _Push, *, returned: bool = False) -> None:
        """Count ``push`` as delivered or failed, once: when it returns (``returned``) or
        once its deadline passed, whichever comes first."""
        with self._settling:
            if push.outcome is not None:
                return
            if returned:
                error = push.error
            elif time.monotonic() >= push.deadline:
                error = TimeoutError(
                    f"timed out: no answer within {schedule.timeout_s:g} s"
                    if push.called
                    else UNDER_WAY
                )
            else:
                return
            # Warnings quote the outcome: the sink takes its secrets (a URL's token) out.
            push.outcome = (
                "" if error is None else schedule.sink.redact(f"{type(error).__name__}: {error}")
            )
            self._count(schedule, push)

    def _count(self, schedule: _Schedule, push: _Push) -> None:
        """Log a sink's first failure in a row and its recovery (called settling)."""
        if not push.outcome:
            if schedule.failures:
                lost = schedule.undelivered
                logger.warning(
                    "metrics sink '%s' recovered after %d failed push(es)%s",
                    schedule.sink.name,
                    schedule.failures,
                    f"; the rounds of epochs {epochs_text(lost)} did not reach it" if lost else "",
                )
            schedule.failures = 0
            return
        schedule.failures += 1
        schedule.undelivered.extend(p.epoch for p in push.snapshot.rounds)
        if schedule.failures == 1:
            logger.warning(
                "metrics sink '%s' failed: %s (further failures are counted, "
                "not logged, until it recovers)",
                schedule.sink.name,
                push.outcome,
            )

    def _missed(self, schedule: _Schedule, push: _Push) -> str:
        """What the sink of a failed final push missed, for the warning that says so."""
        snapshot = push.snapshot
        totals = (
            "before any round completed"
            if snapshot.epoch is None
            else f"after epoch {snapshot.epoch}"
        )
        names = ", ".join(f"'{name}'" for name in sorted(snapshot.metrics)) or "none"
        lost = schedule.undelivered
        rounds = (
            f"; the rounds of epochs {epochs_text(lost)} did not reach it either" if lost else ""
        )
        return (
            f"metrics sink '{schedule.sink.name}' did not receive the final push of "
            f"'{snapshot.iteration}' (run {snapshot.run_id}; the totals {totals} of "
            f"metrics {names}): {push.outcome}{rounds} ({schedule.failures} push(es) in a "
            "row failed)"
        )


def given_up(message: str) -> None:
    """Say that a final push was given up: at WARNING on ``iterflow.metrics``, where
    logs are collected, and as an ``IterflowWarning``, which the caller sees."""
    logger.warning("%s", message)
    warn(message)


def epochs_text(epochs: Iterable[int]) -> str:
    """``0-4, 7, 9-10``: sorted epochs, runs of consecutive ones as ranges."""
    ranges: list[list[int]] = []
    for epoch in sorted(set(epochs)):
        if ranges and epoch == ranges[-1][1] + 1:
            ranges[-1][1] = epoch
        else:
            ranges.append([epoch, epoch])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
