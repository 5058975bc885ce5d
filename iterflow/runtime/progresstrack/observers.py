"""What watches a run: metrics, the progress bar, the event log and metric sinks.

Shared by the round loops. The loop tells it when a run starts, when each round
starts, ends and completes, and how the run ended; it completes each
RoundProgress with the round's metrics and the backlog estimate.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowValueError, gist, warn
from iterflow.metrics._spark import BRIDGE
from iterflow.metrics.pusher import MetricsPusher
from iterflow.metrics.registry import REGISTRY, RunMetrics
from iterflow.metrics.sinks import MetricsSink
from iterflow.metrics.values import MetricResult
from iterflow.progress.bar import ProgressBar
from iterflow.progress.estimate import (
    Estimate,
    check_series_name,
    count_series,
    estimate_remaining,
)
from iterflow.progress.event_log import EventLog
from iterflow.reports import Rollback, RoundProgress, RoundSample, Termination
from iterflow.runtime.progresstrack.sampler import RoundSampler
from iterflow.runtime.progresstrack.tracker import RoundTracker
from iterflow.runtime.spark.jvm import spark_context
from iterflow.runtime.spark.schema import describe_inputs
from iterflow.termination import Condition, Converged, max_rounds_of


@attrs.frozen(kw_only=True)
class ObserverOptions:
    """How a run is watched: ``run(progress=, event_log=)`` and ``push_metrics`` sinks."""

    progress: bool | None = None
    event_log: str | os.PathLike[str] | None = None
    sinks: tuple[tuple[MetricsSink, float], ...] = ()
    #: Whether a run started inside a round of another is nested in it (bounded runs).
    nestable: bool = True
    #: The count the estimate of the rounds left follows (``run(progress_from=)``);
    #: None picks one (see ``count_series``).
    progress_from: str | None = None
    #: Seconds between samples of a running round (0: none).
    progress_interval_s: float = 0.5
    #: Seconds between ``round_progress`` events in the event log, at least (0: none).
    event_log_progress_s: float = 5.0
    #: Fields for the ``iteration_started`` event's ``notes`` (``IterationBuilder.note``).
    notes: Mapping[str, Any] = attrs.field(factory=dict)


def _open_log(path: str | os.PathLike[str] | None) -> EventLog | None:
    if path is None:
        return None
    try:
        return EventLog(path)
    except OSError as exc:
        raise IterflowValueError(
            f"run(event_log='{os.fspath(path)}'): cannot open it ({exc.strerror}); "
            "pass a path in a writable directory"
        ) from exc


#: The rounds running on this thread, outermost first: (the run's observers, epoch). A run
#: started inside one of them (by a body or a listener) is nested in the last.
_RUNNING: ContextVar[tuple[tuple[RunObservers, int], ...]] = ContextVar(
    "iterflow_running_rounds", default=()
)


def enclosing_round() -> tuple[int, ...] | None:
    """The epoch path of the round a run started now is nested in, or None (not nested)."""
    running = _RUNNING.get()
    if not running:
        return None
    observers, epoch = running[-1]
    return (*observers.path, epoch)


#: How unbounded runs execute kernels: each epoch's are jobs of its micro-batch.


class RunObservers:
    """The observers of one run."""

    _log: EventLog | None
    _bar: ProgressBar

    def __init__(
        self,
        *,
        iteration: str,
        spark: SparkSession,
        options: ObserverOptions,
        static_conditions: Sequence[Condition],
        run_id: str | None = None,
    ) -> None:
        self.iteration = iteration
        self._notes = dict(options.notes)
        #: New for each run; given, for the processes of one run (over Spark Connect, the
        #: epochs' and the end's), so that their lines in the event log are one run's.
        self.run_id = run_id or uuid.uuid4().hex[:12]
        # Only an unbounded run is not nestable (its query runs on threads of its own).
        self._logger = logging.getLogger(
            "iterflow.bounded" if options.nestable else "iterflow.unbounded"
        )
        self._context = spark_context(spark)
        self._clock = time.perf_counter()
        # An unbounded query runs on its own threads: never nested in the round that started it.
        running = _RUNNING.get() if options.nestable else ()
        # A run inside a round of another: its epochs are paths below that round's, it
        # logs to the outer run's event log unless given its own, and its bar goes below.
        self.parent: RunObservers | None = running[-1][0] if running else None
        self.path: tuple[int, ...] = (enclosing_round() or ()) if running else ()
        parent = self.parent
        if parent is not None and options.event_log is None:
            self._owns_log, self._log = False, parent._log
        else:
            self._owns_log, self._log = True, _open_log(options.event_log)
        self.metrics = REGISTRY.begin_run(
            iteration=iteration,
            run_id=self.run_id,
            executor_states=partial(BRIDGE.executor_states, self.run_id),
            forget=partial(BRIDGE.forget, self.run_id),
        )
        shown = options.progress
        if shown is None and parent is not None:
            shown = parent._bar.enabled
        self._bar = ProgressBar(
            iteration,
            max_rounds=max_rounds_of(static_conditions),
            enabled=shown,
            position=len(self.path),
        )
        self._pusher = MetricsPusher(self.metrics.snapshot, options.sinks)
        self._pusher.start()
        if parent is None:
            BRIDGE.take_untagged()  # updates from before this run are not its concern
        self._warned_untagged: set[str] = set()
        self._pending_start: Callable[[], None] | None = None
        self._start_written = False  # the run's iteration_started line is in its log
        self._progress_from = options.progress_from
        self._series_checked = False
        #: Where samples of a running round go besides the bar and the log (listeners).
        self.on_sample: Callable[[RoundSample], None] | None = None
        self._log_every_s = options.event_log_progress_s
        self._logged_at: float | None = None
        self._sample_failed = False
        #: The rollback the next completed round follows, if any.
        self._rollback: Rollback | None = None
        #: What the run's rounds report while they run (read by the sampler and here).
        self.tracker = RoundTracker(on_decided=self.flush_start)
        self._sampler = RoundSampler(
            spark, self.run_id, options.progress_interval_s, self._sampled, self.tracker
        )

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._clock

    def started(
        self,
        inputs: Mapping[str, DataFrame],
        replay: set[str],
        conditions: Sequence[Condition],
        resumed_from: int | None = None,
        resident: bool = False,
    ) -> None:
        """The run starts, at round 0 or after the checkpoint of epoch ``resumed_from``.

        With ``resident`` (the run has a resident policy), its ``iteration_started`` event
        waits until the tracker's residency is decided, or the first event after it (the
        first round's end, or the run's): only the first round's body shows whether its
        kernels run resident.
        """
        if resumed_from is not None:
            self._bar.resume(resumed_from + 1)
        self._logger.info(
            "%s started%s%s",
            self._named(),
            "" if resumed_from is None else f", resuming after epoch {resumed_from}",
            f", nested in the round at epoch path {self.path}" if self.path else "",
        )
        if self._log is None and not self._pusher.has_sinks:
            return  # no one to describe the run to
        parameters: dict[str, Any] = {
            "inputs": describe_inputs(inputs, replay),
            "conditions": [c.describe() for c in conditions],
            "resumed_from": resumed_from,
            "notes": dict(self._notes),
        }
        self._pusher.started(parameters)
        if self._log is not None:
            log = self._log
            described: dict[str, Any] = {
                "run_id": self.run_id,
                "iteration": self.iteration,
                **parameters,
                "parent_run_id": None if self.parent is None else self.parent.run_id,
                "epoch_path": self.path,
            }
            tracker = self.tracker
            self._pending_start = lambda: log.iteration_started(
                **described, resident=tracker.residency.describe()
            )
            if not resident or tracker.decided:  # nothing to wait for
                self.flush_start()

    def flush_start(self) -> None:
        """Write the pending ``iteration_started`` event now (once)."""
        pending, self._pending_start = self._pending_start, None
        if pending is not None:
            pending()
            self._start_written = True

    @contextmanager
    def round(self, epoch: int) -> Iterator[None]:
        """Round ``epoch`` runs inside: metric updates and Spark jobs count toward it."""
        self.metrics.start_round(epoch)
        token = _RUNNING.set((*_RUNNING.get(), (self, epoch)))
        try:
            with (
                BRIDGE.round_property(self._context, self.run_id, epoch),
                self._sampler.round(epoch, (*self.path, epoch)),
            ):
                yield
        finally:
            _RUNNING.reset(token)

    def round_done(self, progress: RoundProgress) -> None:
        """The running round's work is done (``progress``): its last sample goes out, with
        the round's exact step counts (if it was sampled at all); raises
        ``SampleDeliveryError`` when a listener failed on one of its samples."""
        counted = {**progress.input_rows, **progress.observed, **progress.rows}
        self._sampler.finish({name: n for name, n in counted.items() if n is not None})

    def _sampled(self, sample: RoundSample) -> None:
        """Show, log and hand on a sample of the running round."""
        try:
            self._bar.round_progress(sample)
            self._log_sample(sample)
        except Exception as exc:  # the round goes on; listeners still hear the sample
            if not self._sample_failed:
                self._sample_failed = True
                warn(f"a sample of a running round could not be shown or logged: {gist(exc)}")
        if self.on_sample is not None:
            self.on_sample(sample)

    def _log_sample(self, sample: RoundSample) -> None:
        """A ``round_progress`` line, at most every ``event_log_progress_s``; none for a
        round shorter than that (its round_end says it all), and none before the run's
        start line (which waits for its resident mode to be known)."""
        every = self._log_every_s
        if self._log is None or every <= 0 or not self._start_written:
            return
        now = time.perf_counter()
        if sample.elapsed_s >= every and (
            self._logged_at is None or now - self._logged_at >= every
        ):
            self._logged_at = now
            self._log.round_progress(run_id=self.run_id, sample=sample)

    def complete(
        self,
        progress: RoundProgress,
        conditions: Sequence[Condition],
        history: Sequence[RoundProgress],
    ) -> RoundProgress:
        """``progress`` with the round's metrics and the estimate of what remains."""
        rounds = (*history, progress)
        convergence = [c for c in conditions if isinstance(c, Converged)]
        name = self._progress_from
        if name is not None and not self._series_checked:
            check_series_name(progress, name)  # the first round of this start shows the names
            self._series_checked = True
        # A loop with a convergence value follows it, unless a count is named.
        counts = count_series(rounds, name) if name is not None or not convergence else None
        # An unbounded run keeps only its recent rounds: count epochs from the oldest kept.
        dropped = progress.epoch + 1 - len(rounds)
        bound = max_rounds_of(conditions)
        estimate = estimate_remaining(
            epoch=progress.epoch - dropped,
            values=[p.converged_value for p in rounds],
            tol=convergence[0].tol if convergence else None,
            max_rounds=None if bound is None else bound - dropped,
            durations=[p.duration_s for p in rounds],
            counts=counts,
        )
        if progress.criteria_empty:
            estimate = Estimate(rounds_remaining=0, eta_s=0.0)  # the run ends with this round
        rollback, self._rollback = self._rollback, None
        return attrs.evolve(
            progress,
            rollback=rollback,
            metrics=self.metrics.round_values(progress.epoch),
            rounds_remaining_estimate=estimate.rounds_remaining,
            eta_s=estimate.eta_s,
        )

    def round_end(self, progress: RoundProgress, conditions: Sequence[Condition]) -> None:
        """Record and show round ``progress.epoch``, before listeners see it."""
        missed = BRIDGE.take_untagged() - self._warned_untagged
        if missed:
            self._warned_untagged |= missed
            warn(
                f"metric(s) {sorted(missed)} were updated by tasks of Spark jobs that no round "
                "started (a job run from a plain Python thread?); those updates are not "
                "counted. Start such threads as pyspark.InheritableThread within the round"
            )
        if self._log is not None:
            self.flush_start()
            self._log.round_end(run_id=self.run_id, progress=progress)
        self._bar.round_end(progress, max_rounds=max_rounds_of(conditions))
        self._pusher.round_ended(progress)

    def rolled_back(self, rollback: Rollback) -> None:
        """The run continues after the durable checkpoint of ``rollback.to_epoch``: the
        rounds after it count as attempted only, the bar goes back, and the next round's
        progress carries ``rollback``."""
        epoch = rollback.to_epoch
        self.metrics.roll_back(epoch + 1)
        self._bar.resume(epoch + 1)
        self._pusher.rolled_back(epoch)
        self._rollback = rollback
        if self._log is not None:
            self.flush_start()
            self._log.rolled_back(run_id=self.run_id, rollback=rollback)

    def round_completed(self, epoch: int) -> None:
        self.metrics.complete_round(epoch)

    def terminated(self, termination: Termination, rounds: int) -> dict[str, MetricResult]:
        """The run ended normally; returns the metric totals."""
        totals = self.metrics.finish()
        if self._log is not None:
            self.flush_start()
            self._log.iteration_terminated(
                run_id=self.run_id,
                termination=termination,
                rounds=rounds,
                duration_s=self.elapsed_s,
                metrics=totals,
                epoch_path=self.path,
            )
        outcome = f"{termination.reason} at epoch {termination.epoch}"
        self._logger.info(
            "%s ended: %s after %d round(s) in %.2f s",
            self._named(),
            outcome,
            rounds,
            self.elapsed_s,
        )
        self._bar.close(outcome)
        return totals

    def _named(self) -> str:
        """``iteration 'pagerank' (run 3f2a...)``: which run a log record is about."""
        return f"iteration '{self.iteration}' (run {self.run_id})"

    def failed(self, epoch: int | None, error: BaseException) -> None:
        """The run failed in round ``epoch`` (None: before its first round)."""
        totals = self.metrics.finish()
        if self._log is not None:
            self.flush_start()
            self._log.iteration_failed(
                run_id=self.run_id,
                epoch=epoch,
                error=error,
                duration_s=self.elapsed_s,
                metrics=totals,
                epoch_path=self.path,
            )
        outcome = "failed" if epoch is None else f"failed at epoch {epoch}"
        # INFO: the error itself reaches the caller, raised.
        self._logger.info(
            "%s %s after %.2f s: %s: %s",
            self._named(),
            outcome,
            self.elapsed_s,
            type(error).__name__,
            gist(error),
        )
        self._bar.close(outcome, failed=True)

    def close(self) -> None:
        """Final metrics push (it completes before this returns), then release everything."""
        self._bar.close("stopped")  # a no-op once the run's outcome closed it
        try:
            try:
                self._sampler.close()
            finally:
                self.flush_start()
                self._pusher.stop()
        finally:
            REGISTRY.end_run(self.metrics)
            if self.parent is not None:
                # What the nested run committed counts toward the outer run's round.
                self.metrics.roll_up(self.parent.metrics)
            if self._log is not None and self._owns_log:
                self._log.close()


def committed_metrics(exported: Mapping[str, Any] | None) -> dict[str, MetricResult]:
    """The user metrics' totals a checkpoint holds (``RunMetrics.export()``), read by a
    process that did not run them (the handle of an iteration whose epochs run beside a
    Spark Connect server)."""
    metrics = RunMetrics(iteration="", run_id="", kinds={})
    if exported:
        metrics.restore(exported)
    return metrics.totals()
