"""The epoch loop of an unbounded iteration, driven by Structured Streaming's ``foreachBatch``.

A micro-batch arrives as one call. Feedback comes first: while more work
feedback is in flight than ``max_feedback_rows``, epochs run on the feedback
alone and the micro-batch waits (so does the stream: the call has not
returned). Then the micro-batch's rows (cut into chunks of at most
``max_rows_per_epoch``, one epoch each) are taken, and the feedback left after
them is drained in up to ``max_epochs_per_batch`` further epochs. What is left
then comes first in the next call, or drains once the stream is idle or has
ended.

Exactly once: every epoch writes its outputs to the sinks (idempotent per
epoch), and before the call returns (so before Spark commits the micro-batch)
the pending variables and the driver state are committed to the epoch log
under the checkpoint location, with the id of the last micro-batch whose rows
are consumed. After a crash, the loop restarts from that commit; a micro-batch
Spark replays that the commit already holds is not taken again. With
``commit_interval_s``, the commit is only taken there and written later
(``committer``); Spark's checkpoint is then rewound to it on a restart
(``rewind``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.body import IterationBody
from iterflow.errors import IterflowError
from iterflow.progress.listeners import ListenerSet
from iterflow.reports import Termination
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.checkpoint.writer import Checkpointing
from iterflow.runtime.datacache.driver_variables import DRIVER_ROWS
from iterflow.runtime.datacache.resident_policy import ResidentPolicy
from iterflow.runtime.progresstrack.observers import RunObservers
from iterflow.runtime.round.cycle import LoopState, RoundCycle
from iterflow.runtime.round.declaration import DeclarationCheck
from iterflow.runtime.round.scope import CacheRegistry
from iterflow.runtime.spark.jvm import in_session, plan_leaves
from iterflow.unbounded import epoch_log
from iterflow.unbounded.committer import Committer
from iterflow.unbounded.epoch_log import Committed, EpochLog
from iterflow.unbounded.epoch_round import EpochRound
from iterflow.unbounded.event_time import EventTime
from iterflow.unbounded.inputs import Chunks, split

#: Per-epoch progress kept in memory and in the epoch log, unless ``keep_history`` says.
RECENT_EPOCHS = 1_000


class StoppedError(IterflowError):
    """A micro-batch arrived after ``stop()``; it is left for the next ``start()``."""


@attrs.frozen(kw_only=True)
class EpochOptions:
    """``start(max_rows_per_epoch=, max_feedback_rows=, max_epochs_per_batch=,
    commit_interval_s=, keep_history=)``."""

    max_rows_per_epoch: int | None = None
    max_feedback_rows: int = 0
    max_epochs_per_batch: int = 100
    commit_interval_s: float | None = None  # None: commit before each micro-batch returns
    max_batches_behind: int = 50  # of the last commit, off the loop's path (``committer``)
    driver_rows: int = DRIVER_ROWS  # state variables up to this many rows live on the driver
    keep_history: int | None = None  # epochs of history kept; None: ``RECENT_EPOCHS``


class EpochGuard:
    """One thread at a time runs a loop's epochs or commits (re-entrant), and the first
    error one of them raises stops the loop: its state is then past its last commit, and
    no thread may run another epoch on it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None  # the thread running epochs now
        self.error: BaseException | None = None

    @contextmanager
    def exclusive(self, blocking: bool = True) -> Iterator[bool]:
        """Hold the loop inside; yields False (holding nothing) when ``blocking`` is off
        and another thread holds it."""
        if not self._lock.acquire(blocking=blocking):
            yield False
            return
        previous, self._owner = self._owner, threading.get_ident()
        try:
            yield True
        finally:
            self._owner = previous
            self._lock.release()

    @property
    def in_this_thread(self) -> bool:
        """True on the thread that runs epochs now (e.g. inside a listener)."""
        return self._owner == threading.get_ident()

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Keep the first error raised inside."""
        try:
            yield
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise


class EpochLoop:
    """Runs the epochs of one ``UnboundedIteration.start()``; thread-safe through ``lock``."""

    def __init__(
        self,
        *,
        body: IterationBody,
        spark: SparkSession,
        inputs: Mapping[str, DataFrame],
        streams: tuple[str, ...],
        state_names: frozenset[str],
        sinks: Mapping[str, Sink],
        listeners: ListenerSet,
        observers: RunObservers,
        checkpointing: Checkpointing,
        options: EpochOptions,
        event_time: EventTime | None = None,
    ) -> None:
        self.body = body
        self.spark = spark
        self.inputs = dict(inputs)
        self.streams = streams
        self.state_names = state_names
        self.sinks = dict(sinks)
        self.checkpointing = checkpointing
        self.options = options
        self.guard = EpochGuard()
        self.stopping = threading.Event()
        check = DeclarationCheck(body.name, {n: df.schema for n, df in inputs.items()})
        self.loop = LoopState(
            check=check,
            listeners=listeners,
            observers=observers,
            recent=RECENT_EPOCHS if options.keep_history is None else options.keep_history,
        )
        residency = ResidentPolicy(spark, observers.tracker)
        caches = CacheRegistry(residency, changing=lambda df: changing_reason(df, self))
        self.cycle = RoundCycle(self.loop, caches, options.driver_rows, hold_outputs=True)
        self.pending: dict[str, DataFrame] = {}  # the variables the next epoch reads
        self.epoch = -1
        self.batch_id = -1
        self.event_time = event_time  # watermarks and event-time steps; None: no event time
        self.log = EpochLog(
            spark=spark, checkpointing=checkpointing, cycle=self.cycle, event_time=event_time
        )
        self.commits = Committer(
            self.log,
            interval_s=options.commit_interval_s,
            max_batches_behind=options.max_batches_behind,
        )
        self.outputs: dict[str, DataFrame] = {}
        self.source_backlog: Callable[[], dict[str, float]] = dict
        self.epochs = EpochRound(
            body=body,
            cycle=self.cycle,
            inputs=self.inputs,
            streams=streams,
            state_names=state_names,
            sinks=self.sinks,
            event_time=event_time,
        )

    @property
    def committed_epoch(self) -> int:
        """The epoch of the last commit written whole (-1 before the first)."""
        return self.commits.committed.epoch

    @property
    def in_flight(self) -> int:
        """Work feedback rows waiting for an epoch."""
        return self.epochs.in_flight

    def restore(self) -> int | None:
        """Continue from the last commit under the checkpoint location; its epoch, or None."""
        restored = epoch_log.restore(self.log)
        if restored is not None:
            self.epoch, self.batch_id = restored.epoch, restored.batch_id
            self.pending = restored.pending
            self.commits.committed = Committed(epoch=restored.epoch, batch_id=restored.batch_id)
        resumed_from = None if restored is None else restored.epoch
        self.cycle.first_epoch = self.epoch + 1
        self.cycle.own_inputs(self.inputs, skip={*self.streams, *self.pending})
        return resumed_from

    # -- driving ---------------------------------------------------------------------

    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function: the epochs of micro-batch ``batch_id``, committed."""
        with self.guard.exclusive():
            if self.stopping.is_set() or self.guard.error is not None:
                # Not taken, so not committed: Spark reads it again on the next start().
                raise StoppedError(f"micro-batch {batch_id} arrived after the iteration ended")
            with self.guard.recording():
                if batch_id > self.batch_id:  # else: consumed before a crash, replayed by Spark
                    self._take(in_session(batch, self.spark), batch_id)
                    self.batch_id = batch_id
                self.drain(self.options.max_epochs_per_batch, batch_id)
                self.commits.commit(self.epoch, self.batch_id, self.pending)

    def _take(self, batch: DataFrame, batch_id: int) -> None:
        limit = self.options.max_rows_per_epoch
        chunks = Chunks(batch, limit) if limit is not None else None
        try:
            parts = [chunks.chunk(i) for i in range(len(chunks))] if chunks else [batch]
            for part in parts:
                # Feedback first: the input waits while too much work feedback is in flight.
                while self.in_flight > self.options.max_feedback_rows:
                    self.run_round(None, batch_id)
                self.run_round(split(part, self.streams), batch_id)
        finally:
            if chunks is not None:
                chunks.release()

    def drain(self, limit: int | None, batch_id: int | None = None) -> int:
        """Epochs on work feedback alone while any is in flight, at most ``limit``; none
        once the iteration is stopping (what is left is committed and continues later)."""
        ran = 0
        while (
            (self.in_flight > 0 or windows_due(self.event_time))
            and not self.stopping.is_set()
            and (limit is None or ran < limit)
        ):
            self.run_round(None, batch_id)
            ran += 1
        return ran

    def drain_idle(self) -> None:
        """The stream is idle: drain feedback left in flight, and commit."""
        with self.guard.exclusive(), self.guard.recording():
            if self.guard.error is None:
                self.drain(self.options.max_epochs_per_batch)
                self.commits.commit(self.epoch, self.batch_id, self.pending)

    def commit_idle(self) -> None:
        """Between micro-batches: hand over a commit when one is due (commits off the loop's
        path), unless epochs are running."""
        if self.options.commit_interval_s is None:
            return
        with self.guard.exclusive(blocking=False) as held, self.guard.recording():
            if held and self.guard.error is None:
                self.commits.commit(self.epoch, self.batch_id, self.pending)

    def flush(self) -> None:
        """The stream stopped: write the commits handed over, then the last epoch's."""
        with self.guard.exclusive(), self.guard.recording():
            if self.guard.error is None:
                self.commits.flush(self.epoch, self.batch_id, self.pending)

    def finish(self) -> None:
        """The inputs have ended: run epoch 0 if none ran, drain every epoch left, commit."""
        with self.guard.exclusive(), self.guard.recording():
            if self.event_time is not None:
                self.event_time.inputs_ended()  # every window may fire now
            if self.epoch < 0:
                self.run_round(None, None)
            while self.drain(self.options.max_epochs_per_batch):
                self.commits.commit(self.epoch, self.batch_id, self.pending)
            self.commits.flush(self.epoch, self.batch_id, self.pending)

    # -- one epoch -------------------------------------------------------------------

    def run_round(self, new: Mapping[str, DataFrame] | None, batch_id: int | None) -> None:
        """Epoch ``self.epoch + 1`` on the rows ``new`` of each streaming input (None: none)."""
        epoch = self.epoch + 1
        self.pending, self.outputs = self.epochs.run(
            epoch, self.pending, new, batch_id, self.source_backlog
        )
        self.epoch = epoch

    # -- the end -----------------------------------------------------------------------

    def terminate(self, reason: str) -> Termination:
        """Tell listeners and observers the iteration ended for ``reason``."""
        with self.guard.exclusive():
            termination = Termination(reason=reason, epoch=self.epoch, reasons=(reason,))
            self.loop.terminated(termination, self.epoch + 1, self.outputs)
            return termination

    def failed(self, error: BaseException) -> None:
        epoch = getattr(error, "epoch", None) if isinstance(error, IterflowError) else None
        self.loop.observers.failed(epoch, error)

    def close(self) -> None:
        """Release everything iterflow holds for this iteration (once the commits in flight
        are written)."""
        with self.guard.exclusive():
            try:
                self.commits.settle()
                self.loop.observers.close()
            finally:
                try:
                    self.cycle.close()
                finally:
                    self.checkpointing.close()


def changing_reason(df: DataFrame, loop: EpochLoop) -> str | None:
    """Why ``df`` is read anew every epoch of ``loop``, or None when it comes only from data
    inputs bound once (not a stream, not a variable fed back): such data is loaded into
    resident tasks once for the whole run."""
    fed = {*loop.streams, *loop.state_names, *loop.pending}
    bound_once = [frame for name, frame in loop.inputs.items() if name not in fed]
    leaves = plan_leaves(df)
    known = frozenset().union(*(plan_leaves(frame) or frozenset() for frame in bound_once))
    if leaves is None or not leaves or not leaves <= known:
        return (
            "ctx.columnar data that reads a stream or a variable changes every epoch: its "
            "kernels run as a Spark job of the epoch (only data inputs bound once are "
            "made resident)"
        )
    return None


def windows_due(event_time: EventTime | None) -> bool:
    """An event-time step has a window to fire under the next epoch's watermark: one more
    epoch (with no new input) emits it."""
    return event_time is not None and event_time.due()
