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
Spark replays that the commit already holds is not taken again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from functools import partial
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iterflow.body import IterationBody, RoundContext
from iterflow.errors import IterflowError, IterflowValueError
from iterflow.progress.listeners import Emitter, IterationEnd, ListenerSet
from iterflow.progress.round import RoundProgress
from iterflow.runtime.checkpoint import Checkpointing, driver_state_of, load_driver_state
from iterflow.runtime.jvm import in_session
from iterflow.runtime.materialize import (
    local_frame,
    observe_rows,
    observed_rows,
    persist_owned,
    release,
    unique_observation,
)
from iterflow.runtime.observers import RunObservers
from iterflow.runtime.rounds import (
    DRIVER_ROWS,
    DeclarationCheck,
    RoundPlan,
    evaluate_round,
    fail,
    small_variables,
)
from iterflow.runtime.scope import CacheRegistry, SparkRoundScope
from iterflow.termination import Termination
from iterflow.unbounded.inputs import Chunks, split
from iterflow.unbounded.sinks import Sink

#: Pending variables up to this many rows are committed inside the driver state
#: (one small collect) rather than as parquet (a Spark write job).
INLINE_ROWS = 10_000
#: Per-epoch progress kept in memory and in the epoch log.
RECENT_EPOCHS = 1_000


class StoppedError(IterflowError):
    """A micro-batch arrived after ``stop()``; it is left for the next ``start()``."""


@attrs.frozen(kw_only=True)
class EpochOptions:
    """``start(max_rows_per_epoch=, max_feedback_rows=, max_epochs_per_batch=)``."""

    max_rows_per_epoch: int | None = None
    max_feedback_rows: int = 0
    max_epochs_per_batch: int = 100
    driver_rows: int = DRIVER_ROWS  # state variables up to this many rows live on the driver


@attrs.frozen(kw_only=True)
class StreamPosition:
    """Where an unbounded iteration stood at a commit (kept in the driver state)."""

    epoch: int  # the last epoch run; -1 before the first
    batch_id: int  # the last micro-batch whose rows are consumed; -1 before the first
    rows: dict[str, int]  # rows of each pending variable
    inline: dict[str, tuple[str, Any]]  # small pending variables: schema JSON, pyarrow Table


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
    ) -> None:
        self.body = body
        self.spark = spark
        self.inputs = dict(inputs)
        self.streams = streams
        self.state_names = state_names
        self.sinks = dict(sinks)
        self.listeners = listeners
        self.observers = observers
        self.checkpointing = checkpointing
        self.options = options
        self._lock = threading.RLock()
        self._owner: int | None = None  # the thread running epochs now
        self.stopping = threading.Event()
        self.check = DeclarationCheck(body.name, {n: df.schema for n, df in inputs.items()})
        self.empty = {name: spark.createDataFrame([], inputs[name].schema) for name in streams}
        self.state: dict[str, Any] = {}
        self.emitter = Emitter()
        self.caches = CacheRegistry()
        self.history: list[RoundProgress] = []
        self.pending: dict[str, DataFrame] = {}
        self.pending_rows: dict[str, int] = {}
        self.pending_tables: dict[str, Any] = {}  # pending variables held on the driver
        self.epoch = -1
        self.batch_id = -1
        self.committed_epoch = -1
        self.outputs: dict[str, DataFrame] = {}
        self.held: list[DataFrame] = []
        self.owned: dict[str, DataFrame] = {}
        self.source_backlog: Callable[[], dict[str, float]] = dict
        self.error: BaseException | None = None
        self._first_epoch = 0

    # -- state -----------------------------------------------------------------------

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the loop: one thread at a time runs epochs or commits (re-entrant)."""
        with self._lock:
            previous, self._owner = self._owner, threading.get_ident()
            try:
                yield
            finally:
                self._owner = previous

    @property
    def in_epoch_thread(self) -> bool:
        """True on the thread that runs epochs now (e.g. inside a listener)."""
        return self._owner == threading.get_ident()

    @property
    def work_names(self) -> list[str]:
        return [n for n in self.check.variable_names or () if n not in self.state_names]

    @property
    def in_flight(self) -> int:
        """Work feedback rows waiting for an epoch."""
        return sum(self.pending_rows.get(name, 0) for name in self.work_names)

    def restore(self) -> int | None:
        """Continue from the last commit under the checkpoint location; its epoch, or None."""
        checkpoint = self.checkpointing.restore()
        if checkpoint is not None:
            driver = checkpoint.driver
            position = driver.stream
            if not isinstance(position, StreamPosition):
                raise IterflowValueError(
                    f"checkpoint_location '{self.checkpointing.store.root}' holds checkpoints of "
                    "a bounded iteration; give the unbounded iteration its own location"
                )
            load_driver_state(self, driver)
            self.observers.metrics.restore(driver.metrics)
            self.pending_tables = {name: table for name, (_, table) in position.inline.items()}
            inline = {
                name: local_frame(self.spark, table, StructType.fromJson(json.loads(schema)))
                for name, (schema, table) in position.inline.items()
            }
            self.pending = {
                name: self.check.aligned(name, df)
                for name, df in {**checkpoint.variables, **inline}.items()
            }
            self.pending_rows = dict(position.rows)
            self.epoch = self.committed_epoch = position.epoch
            self.batch_id = position.batch_id
        self._first_epoch = self.epoch + 1
        for name, df in self.inputs.items():
            if name not in self.streams and name not in self.pending and persist_owned(df):
                self.owned[name] = df
        return checkpoint.epoch if checkpoint is not None else None

    def discard_uncommitted_outputs(self) -> None:
        """Drop what sinks hold of epochs after the last commit: a crashed attempt wrote
        them, and this start may run those epochs on other rows (or not at all)."""
        for sink in self.sinks.values():
            sink.discard_after(self.spark, self.epoch)

    # -- driving ---------------------------------------------------------------------

    def on_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function: the epochs of micro-batch ``batch_id``, committed."""
        with self.exclusive():
            if self.stopping.is_set() or self.error is not None:
                # Not taken, so not committed: Spark reads it again on the next start().
                raise StoppedError(f"micro-batch {batch_id} arrived after the iteration ended")
            with self._recording_errors():
                if batch_id > self.batch_id:  # else: consumed before a crash, replayed by Spark
                    self._take(in_session(batch, self.spark), batch_id)
                    self.batch_id = batch_id
                self.drain(self.options.max_epochs_per_batch, batch_id)
                self.commit()

    @contextmanager
    def _recording_errors(self) -> Iterator[None]:
        """Keep the first error: the loop's state is then past its last commit, and no
        thread may run another epoch on it."""
        try:
            yield
        except BaseException as exc:
            if self.error is None:
                self.error = exc
            raise

    def _take(self, batch: DataFrame, batch_id: int) -> None:
        limit = self.options.max_rows_per_epoch
        chunks = Chunks(batch, limit) if limit is not None else None
        try:
            parts = [chunks.chunk(i) for i in range(len(chunks))] if chunks else [batch]
            for part in parts:
                # Feedback first: the input waits while too much work feedback is in flight.
                while self.in_flight > self.options.max_feedback_rows:
                    self.run_epoch(None, batch_id)
                self.run_epoch(split(part, self.streams), batch_id)
        finally:
            if chunks is not None:
                chunks.release()

    def drain(self, limit: int | None, batch_id: int | None = None) -> int:
        """Epochs on work feedback alone while any is in flight, at most ``limit``; none
        once the iteration is stopping (what is left is committed and continues later)."""
        ran = 0
        while self.in_flight > 0 and not self.stopping.is_set() and (limit is None or ran < limit):
            self.run_epoch(None, batch_id)
            ran += 1
        return ran

    def drain_idle(self) -> None:
        """The stream is idle: drain feedback left in flight, and commit."""
        with self.exclusive(), self._recording_errors():
            if self.error is None:
                self.drain(self.options.max_epochs_per_batch)
                self.commit()

    def finish(self) -> None:
        """The inputs have ended: run epoch 0 if none ran, drain every epoch left, commit."""
        with self.exclusive(), self._recording_errors():
            if self.epoch < 0:
                self.run_epoch(None, None)
            while self.drain(self.options.max_epochs_per_batch):
                self.commit()
            self.commit()

    # -- one epoch -------------------------------------------------------------------

    def run_epoch(self, new: Mapping[str, DataFrame] | None, batch_id: int | None) -> None:
        """Epoch ``self.epoch + 1`` on the rows ``new`` of each streaming input (None: none)."""
        epoch = self.epoch + 1
        started_at = datetime.now(timezone.utc)
        clock = time.perf_counter()
        with self.observers.round(epoch):
            scope = SparkRoundScope(epoch, self.caches)
            observations = {name: unique_observation("input") for name in self.streams}
            inputs: dict[str, DataFrame] = {}
            for name in self.check.schemas:
                if name in self.streams:
                    fresh = observe_rows((new or self.empty)[name], observations[name])
                    variable = self.pending.get(name)
                    inputs[name] = fresh if variable is None else fresh.unionByName(variable)
                else:
                    inputs[name] = self.pending.get(name, self.inputs[name])
            feedback_in = dict(self.pending_rows)
            ctx = RoundContext(epoch, self.state, scope)
            # A small state variable (a model) lives on the driver between epochs.
            small = small_variables(
                self.state_names, self.pending_rows, self.pending_tables, self.options.driver_rows
            )
            evaluated = evaluate_round(
                self.body, inputs, ctx, self.check, partial(self._checked, epoch), small
            )
            produced, rows = evaluated.produced, evaluated.rows
            self.held.extend(produced)
            variables, results = evaluated.variables, evaluated.outputs
            for name, sink in self.sinks.items():
                try:
                    sink.write(results[name], epoch, rows[name])
                except Exception as exc:
                    fail(epoch, f"sink '{name}'", exc)

            in_flight = sum(rows[name] for name in self.work_names)
            progress = RoundProgress(
                epoch=epoch,
                epoch_watermark=epoch,
                started_at=started_at,
                duration_s=time.perf_counter() - clock,
                rows=rows,
                observed=scope.observed(),
                batch_id=batch_id,
                input_rows={n: observed_rows(o) if new else 0 for n, o in observations.items()},
                feedback_rows_in=feedback_in,
                backlog={"feedback_rows": in_flight, **self.source_backlog()},
            )
            progress = self.observers.complete(progress, (), self.history)
            self.history.append(progress)
            del self.history[:-RECENT_EPOCHS]
            self.observers.round_end(progress, ())
            end = evaluated.round_end(ctx, inputs, progress, self.emitter)
            self.listeners.round_end(end, partial(fail, epoch))
            self.observers.round_completed(epoch)

        # Epoch complete: release what the previous one held.
        self.caches.release("round")
        finished, self.held = self.held[: len(self.held) - len(produced)], produced
        for df in finished:
            release(df)
        if epoch == self._first_epoch:  # the variables' bound values are replaced now
            for name in self.check.variable_names or ():
                if name in self.owned:
                    self.owned.pop(name).unpersist(blocking=False)
        self.pending = variables
        self.pending_rows = {name: rows[name] for name in variables}
        self.pending_tables = evaluated.tables
        self.outputs = results
        self.epoch = epoch

    def _checked(self, epoch: int, declaration: Any) -> RoundPlan:
        plan = self.check.check(epoch, declaration)
        where = f"epoch {epoch}: body '{self.body.name}'"
        if plan.conditions:
            raise IterflowValueError(
                f"{where} declared until=...; an unbounded iteration ends when its inputs "
                "end and no work feedback is in flight, or on stop(). Drop until=, or run "
                "the body as a BoundedIteration"
            )
        variables = set(plan.declaration.feedback)
        for name in sorted(self.state_names - variables):
            raise IterflowValueError(
                f"{where}: input '{name}' is bound with state=True but the body declares no "
                f"feedback for it; return feedback={{'{name}': ...}} or drop state=True"
            )
        outputs = plan.declaration.outputs
        for name in sorted(set(self.sinks) - set(outputs)):
            raise IterflowValueError(
                f"{where}: sink '{name}' has no output '{name}'; the body's outputs are "
                f"{sorted(outputs)}. Declare it in outputs= or sink one of those"
            )
        return plan

    # -- the epoch log -----------------------------------------------------------------

    def commit(self) -> None:
        """Commit the pending variables and the driver state after the last epoch run."""
        if self.epoch == self.committed_epoch:
            return
        inline: dict[str, tuple[str, Any]] = {}
        written: dict[str, DataFrame] = {}
        for name, df in self.pending.items():
            if name in self.pending_tables or self.pending_rows[name] <= INLINE_ROWS:
                table = self.pending_tables.get(name)
                inline[name] = (df.schema.json(), df.toArrow() if table is None else table)
            else:
                written[name] = df
        position = StreamPosition(
            epoch=self.epoch, batch_id=self.batch_id, rows=dict(self.pending_rows), inline=inline
        )
        driver = driver_state_of(self, stream=position)
        self.checkpointing.write(self.epoch, driver, written)
        self.committed_epoch = self.epoch

    # -- the end -----------------------------------------------------------------------

    def terminate(self, reason: str) -> Termination:
        """Tell listeners and observers the iteration ended for ``reason``."""
        with self.exclusive():
            termination = Termination(reason=reason, epoch=self.epoch, reasons=(reason,))
            end = IterationEnd(
                termination=termination,
                rounds=self.epoch + 1,
                outputs=self.outputs,
                history=tuple(self.history),
                state=self.state,
                emitter=self.emitter,
            )
            self.listeners.iteration_terminated(end, partial(fail, self.epoch))
            self.observers.terminated(termination, self.epoch + 1)
            return termination

    def failed(self, error: BaseException) -> None:
        epoch = getattr(error, "epoch", None) if isinstance(error, IterflowError) else None
        self.observers.failed(epoch, error)

    def close(self) -> None:
        """Release everything iterflow holds for this iteration."""
        with self.exclusive():
            try:
                self.observers.close()
            finally:
                self.caches.release("round")
                self.caches.release("iteration")
                for df in self.held:
                    release(df)
                self.held = []
                for df in self.owned.values():
                    df.unpersist(blocking=False)
                self.owned = {}
