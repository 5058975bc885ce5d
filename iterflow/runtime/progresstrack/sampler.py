"""Sampling the progress of the round running now, on a thread of its own.

One sampler per run. While a round runs, every ``interval_s`` it reads the
round's status (``iterflow.runtime.progresstrack.spark_status``: no Spark job) and delivers a
``RoundSample``; a round shorter than the interval is never sampled, so fast
loops pay nothing but a wake-up per round. When the round's work is done the
loop calls ``finish`` on its own thread: a round that was sampled gets one last
sample (``final``, fraction 1.0) there, before the round's end is recorded, so
deliveries never overlap a round end. An error raised by the delivery (a
listener's ``on_round_progress``) stops the round's sampling and is raised by
``finish``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any, NoReturn, Protocol

import attrs
from pyspark.sql import SparkSession

from iterflow.errors import gist, warn
from iterflow.progress.sampling import Reading, RoundGauge
from iterflow.reports import RoundSample
from iterflow.runtime.progresstrack.spark_status import ClassicStatus, ConnectStatus, round_tag
from iterflow.runtime.progresstrack.tracker import RoundSteps, RoundTracker
from iterflow.runtime.spark.jvm import is_classic, observation_ready
from iterflow.runtime.spark.observations import observed_rows

_SAMPLER = threading.local()


def on_sampler_thread() -> bool:
    """True on a thread that delivers samples (in ``on_round_progress``): waiting there for
    the run to get anywhere would deadlock, as it would in ``on_round_end``."""
    return bool(getattr(_SAMPLER, "delivering", False))


class SampleDeliveryError(Exception):
    """A listener failed on a sample: ``stage`` names it, ``cause`` is what it raised."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"{stage}: {cause}")
        self.stage = stage
        self.cause = cause


def delivery_failed(stage: str, cause: BaseException) -> NoReturn:
    raise SampleDeliveryError(stage, cause)


class StatusSource(Protocol):
    def tagged(self, tag: str) -> Any: ...
    def read(self, tag: str, steps: RoundSteps) -> Reading: ...
    def forget(self) -> None: ...


@attrs.define
class _Round:
    epoch: int
    tag: str
    run_id: str
    steps: RoundSteps
    gauge: RoundGauge
    clock: float
    error: BaseException | None = None

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.clock


class RoundSampler:
    """Samples the rounds of run ``run_id`` every ``interval_s`` seconds (0: never), reading
    Spark's status and what the rounds report to the run's ``tracker``, and hands the
    samples to ``deliver``."""

    def __init__(
        self,
        spark: SparkSession,
        run_id: str,
        interval_s: float,
        deliver: Callable[[RoundSample], None],
        tracker: RoundTracker,
    ) -> None:
        self.run_id = run_id
        self.tracker = tracker
        self.interval_s = interval_s
        self.deliver = deliver
        self._source: StatusSource | None = None
        if interval_s > 0:
            self._source = ClassicStatus(spark) if is_classic(spark) else ConnectStatus(spark)
        self._disabled = False  # Spark's status could not be read: no more samples
        self._attempts = 0  # rounds begun: a round run again (after a rollback) is tagged anew
        self._changed = threading.Condition()
        self._sampling = threading.Lock()  # held while a sample is read and delivered
        self._current: _Round | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self._expected: tuple[int | None, float | None] = (None, None)

    @contextmanager
    def round(self, epoch: int, path: tuple[int, ...]) -> Iterator[None]:
        """Round ``epoch`` (epoch path ``path``) runs inside: its jobs are tagged and its
        named steps noted, and it is sampled until ``finish`` or the end of the block."""
        steps = self.tracker.begin(epoch)  # nothing of an earlier attempt of this epoch
        source = self._source
        if source is None or self._disabled:
            yield
            return
        tasks, seconds = self._expected
        self._attempts += 1
        current = _Round(
            epoch=epoch,
            tag=round_tag(self.run_id, epoch, self._attempts),
            run_id=self.run_id,
            steps=steps,
            gauge=RoundGauge(epoch, path, expected_tasks=tasks, expected_s=seconds),
            clock=time.perf_counter(),
        )
        with ExitStack() as stack:
            stack.enter_context(source.tagged(current.tag))
            self._start(current)
            try:
                yield
            finally:
                if self._stop() is not None:  # the round failed before its end
                    self._forget()

    def finish(self, counted: Mapping[str, int]) -> None:
        """The round's work is done, with the exact rows ``counted`` of its steps: its
        final sample (if it was sampled at all) is delivered now, on this thread; an error
        its deliveries raised is raised."""
        current = self._stop()
        if current is None:
            return
        current.steps.counted.update(counted)
        current.steps.pending.clear()
        try:
            self._finish(current)
        finally:
            self._forget()

    def _finish(self, current: _Round) -> None:
        gauge = current.gauge
        if current.error is not None:
            raise current.error
        elapsed = current.elapsed_s
        if gauge.last is None or self._disabled:
            self._expected = (self._expected[0], elapsed)
            return
        try:
            reading = self._read(current)
        except Exception as exc:
            self._unreadable(exc)
            return
        self._expected = (reading.tasks_total or None, elapsed)
        self.deliver(gauge.sample(reading, elapsed, final=True))

    def _forget(self) -> None:
        """Drop what the source kept about the round that ended."""
        if self._source is not None:
            self._source.forget()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()
        closing = getattr(self._source, "close", None)
        if closing is not None:
            closing()

    # -- the thread ------------------------------------------------------------------

    def _start(self, current: _Round) -> None:
        with self._changed:
            self._current = current
            self._changed.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"iterflow-progress-{self.run_id}", daemon=True
            )
            self._thread.start()

    def _stop(self) -> _Round | None:
        """Stop sampling the current round (waiting for a sample being taken); it."""
        with self._changed:
            current, self._current = self._current, None
            self._changed.notify_all()
        with self._sampling:
            pass
        return current

    def _read(self, current: _Round) -> Reading:
        assert self._source is not None
        steps = current.steps
        for name, observation in list(steps.pending.items()):
            if observation_ready(observation):
                rows = observed_rows(observation)
                if rows is not None:
                    steps.counted[name] = rows
                del steps.pending[name]
        reading = self._source.read(current.tag, steps)
        resident = self.tracker.kernel_reading()
        current.gauge.counted = dict(steps.counted)
        return reading if resident is None else reading.plus(resident)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._current is not None or self._closed)
                if self._closed:
                    return
                current = self._current
                self._changed.wait_for(partial(self._moved_on, current), self.interval_s)
                if self._current is not current or current is None or current.error:
                    continue
            with self._sampling:
                if self._current is not current:
                    continue
                try:
                    reading = self._read(current)
                except Exception as exc:
                    self._unreadable(exc)
                    return
                _SAMPLER.delivering = True
                try:
                    self.deliver(current.gauge.sample(reading, current.elapsed_s))
                except BaseException as exc:  # raised on the round's thread by finish()
                    current.error = exc
                finally:
                    _SAMPLER.delivering = False

    def _moved_on(self, current: _Round | None) -> bool:
        return self._current is not current or self._closed

    def _unreadable(self, exc: Exception) -> None:
        """Spark's status cannot be read: the run goes on without in-round progress."""
        warn(
            f"in-round progress is off for the rest of this run: reading Spark's status "
            f"failed ({gist(exc)})"
        )
        self._disabled = True
