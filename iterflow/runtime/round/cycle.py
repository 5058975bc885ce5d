"""The round cycle that the bounded and the unbounded loop share.

Every round, bounded or unbounded, goes through the same steps::

    rnd = cycle.evaluate(epoch, inputs, plan_of, held_names)  # call the body, check it,
                                                              # materialize its Declaration
    progress = cycle.record(rnd, rnd.progress(...), conditions)  # observers, history,
                                                                 # listeners
    cycle.complete(rnd)  # the round counts; release what the round before held

What differs stays in the loops: termination, rollback and checkpoint cadence in
the bounded one (``iterflow.bounded.loop``); micro-batches, draining, commits and
sinks in the unbounded one (``iterflow.unbounded.epochs``). What a run holds on the
driver between rounds, and saves in checkpoints, is one value: ``LoopState``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timezone
from functools import partial
from typing import Any, NoReturn

import attrs
from pyspark.sql import Column, DataFrame

from iterflow.body import IterationBody, RoundContext
from iterflow.errors import IterflowError, RoundError
from iterflow.metrics.values import MetricResult
from iterflow.progress.listeners import Emitter, IterationEnd, ListenerSet, RoundEnd
from iterflow.reports import RoundProgress, Termination
from iterflow.runtime.checkpoint.format import DriverState
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.datacache.driver_variables import DriverVariables
from iterflow.runtime.progresstrack.observers import RunObservers, enclosing_round
from iterflow.runtime.progresstrack.sampler import SampleDeliveryError, delivery_failed
from iterflow.runtime.progresstrack.tracker import RoundTracker
from iterflow.runtime.round.declaration import DeclarationCheck, RoundPlan
from iterflow.runtime.round.materialize import Materialized, materialize, persist_owned, release
from iterflow.runtime.round.scope import CacheRegistry, EventTimeSteps, SparkRoundScope
from iterflow.termination import Condition


def fail(epoch: int, stage: str, exc: BaseException) -> NoReturn:
    """Re-raise ``exc`` from round ``epoch``; iterflow's own errors pass unchanged."""
    if isinstance(exc, IterflowError):
        raise exc
    path = enclosing_round() or ()
    raise RoundError(epoch, stage, exc, path if path[-1:] == (epoch,) else ()) from exc


@attrs.define(kw_only=True)
class LoopState:
    """What a run holds on the driver between rounds: what a checkpoint saves of it."""

    check: DeclarationCheck  # its variable names
    listeners: ListenerSet
    observers: RunObservers  # the committed metrics
    state: dict[str, Any] = attrs.Factory(dict)
    emitter: Emitter = attrs.Factory(Emitter)
    history: list[RoundProgress] = attrs.Factory(list)
    #: Rounds of history kept (``keep_history``; None: all); an unbounded run keeps the
    #: recent ones by default. The event log is the full record.
    recent: int | None = None

    def driver_state(self, *, termination: Any = None, stream: Any = None) -> DriverState:
        """The driver state at a round boundary (pickled by ``checkpoint.snapshot``)."""
        return DriverState(
            variable_names=self.check.variable_names or (),
            state=self.state,
            listeners=self.listeners.state(),
            emitted=self.emitter.values,
            history=self.history,
            metrics=self.observers.metrics.export(),
            termination=termination,
            stream=stream,
        )

    def load(self, driver: DriverState) -> None:
        """Put ``driver`` back, in place (the inverse of ``driver_state``): listener state
        goes into the listener objects registered now. Metrics are left to the caller,
        which knows whether the rounds since count as committed."""
        self.check.variable_names = tuple(driver.variable_names)
        self.state.clear()
        self.state.update(driver.state)
        self.listeners.load_state(driver.listeners)
        self.emitter.values.clear()
        self.emitter.values.update({k: list(v) for k, v in driver.emitted.items()})
        self.history[:] = self.kept(driver.history)

    def kept(self, history: Sequence[RoundProgress]) -> list[RoundProgress]:
        """The rounds of ``history`` this run keeps: the last ``recent`` ones, or all."""
        if self.recent is None:
            return list(history)
        return list(history[max(len(history) - self.recent, 0) :])

    def terminated(
        self, termination: Termination, rounds: int, outputs: Mapping[str, DataFrame]
    ) -> dict[str, MetricResult]:
        """Tell listeners, then observers, that the run ended; the metric totals."""
        end = IterationEnd(
            termination=termination,
            rounds=rounds,
            outputs=outputs,
            history=tuple(self.history),
            state=self.state,
            emitter=self.emitter,
        )
        self.listeners.iteration_terminated(end, partial(fail, termination.epoch))
        return self.observers.terminated(termination, rounds)


#: More targets and aggregates for a round's materialization, given its feedback.
Extras = Callable[
    [Mapping[str, DataFrame]], tuple[list[DataFrame], dict[int, list[Column]], list[DataFrame]]
]


@attrs.frozen
class EvaluatedRound:
    """A round's body called, its Declaration checked and materialized."""

    plan: RoundPlan
    done: Materialized
    variables: dict[str, DataFrame]  # feedback, materialized, columns in input order
    outputs: dict[str, DataFrame]  # materialized
    rows: dict[str, int]  # of each feedback and output
    step_s: dict[str, float]  # seconds the job materializing each one took
    produced: list[DataFrame]  # what the round holds until the next one completes
    tables: dict[str, Any]  # the variables materialized on the driver, as pyarrow Tables


def evaluate_round(
    body: IterationBody,
    inputs: Mapping[str, DataFrame],
    ctx: RoundContext,
    check: DeclarationCheck,
    plan_of: Callable[[Any], RoundPlan],
    tracker: RoundTracker,
    on_driver: Collection[str] = (),
    extras: Extras | None = None,
    outputs_on_driver: Collection[str] = (),
) -> EvaluatedRound:
    """Call ``body`` for round ``ctx.epoch``, check its Declaration with ``plan_of``, and
    materialize its feedback, outputs, criteria and convergence values (the feedback of
    the variables named in ``on_driver``, and the outputs named in ``outputs_on_driver``,
    as rows on the driver), reporting its steps to the run's ``tracker``.

    ``extras``, given the round's feedback, names more DataFrames to materialize with
    the round (event-time steps' state), aggregates to compute on the same jobs, and
    DataFrames materialized already that the next round reads (a window step's
    checkpoint): the round holds them as it holds its own results."""
    epoch = ctx.epoch
    try:
        declaration = body(inputs, ctx)
    except Exception as exc:
        fail(epoch, f"body '{body.name}'", exc)
    plan = plan_of(declaration)
    feedback, outputs = plan.declaration.feedback, plan.declaration.outputs
    more, metrics, kept = extras(feedback) if extras is not None else ([], {}, [])
    try:
        done = materialize(
            targets=[*feedback.values(), *outputs.values(), *more],
            criteria=[c.criteria for c in plan.criteria],
            values=[c.value for c in plan.convergence if not callable(c.value)],
            epoch=epoch,
            tracker=tracker,
            on_driver={id(df) for name, df in feedback.items() if name in on_driver}
            | {id(df) for name, df in outputs.items() if name in outputs_on_driver},
            names=_step_names({**outputs, **feedback}),
            metrics=metrics,
        )
    except Exception as exc:
        fail(epoch, "materialization", exc)
    return EvaluatedRound(
        plan=plan,
        done=done,
        variables={name: check.aligned(name, done.frames[id(df)]) for name, df in feedback.items()},
        outputs={name: done.frames[id(df)] for name, df in outputs.items()},
        rows={name: done.rows[id(df)] for name, df in [*feedback.items(), *outputs.items()]},
        step_s={
            name: done.seconds[id(df)]
            for name, df in [*feedback.items(), *outputs.items()]
            if id(df) in done.seconds
        },
        produced=list({id(df): df for df in [*done.frames.values(), *kept]}.values()),
        tables={  # in the input's column order, like ``variables``
            name: done.tables[id(df)].select(check.schemas[name].fieldNames())
            for name, df in feedback.items()
            if id(df) in done.tables
        },
    )


def _step_names(frames: Mapping[str, DataFrame]) -> dict[int, tuple[str, ...]]:
    """The names of each distinct DataFrame (by ``id()``): a feedback may be an output too."""
    names: dict[int, tuple[str, ...]] = {}
    for name, df in frames.items():
        names[id(df)] = (*names.get(id(df), ()), name)
    return names


@attrs.frozen(kw_only=True)
class Round:
    """One round in flight: its body evaluated, not yet complete."""

    epoch: int
    inputs: Mapping[str, DataFrame]
    ctx: RoundContext
    scope: SparkRoundScope
    evaluated: EvaluatedRound
    emitter: Emitter
    started_at: datetime
    clock: float  # time.perf_counter() at its start
    resident: bool  # its kernels ran on resident data
    path: tuple[int, ...]  # the epochs of the rounds it runs inside (nested runs)

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.clock

    def progress(self, **fields: Any) -> RoundProgress:
        """The round's ``RoundProgress`` before observers complete it; ``fields`` are the
        loop's own (criteria, micro-batch, backlog, an unbounded epoch's watermark...). A
        bounded round's epoch watermark is its epoch."""
        fields.setdefault("epoch_watermark", self.epoch)
        return RoundProgress(
            epoch=self.epoch,
            started_at=self.started_at,
            duration_s=self.elapsed_s,
            rows=self.evaluated.rows,
            step_s=self.evaluated.step_s,
            observed=self.scope.observed(),
            resident=self.resident,
            epoch_path=(*self.path, self.epoch),
            **fields,
        )

    def end(self, progress: RoundProgress) -> RoundEnd:
        """What listeners (and convergence callables) receive about this round."""
        return RoundEnd(
            epoch=self.epoch,
            epoch_watermark=progress.epoch_watermark,
            inputs=self.inputs,
            variables=self.evaluated.variables,
            outputs=self.evaluated.outputs,
            progress=progress,
            state=self.ctx.state,
            emitter=self.emitter,
        )


class RoundCycle:
    """The rounds of one run: what each round holds in Spark and on the driver, and the
    steps every round goes through (see the module's docstring)."""

    def __init__(
        self,
        loop: LoopState,
        caches: CacheRegistry,
        driver_rows: int,
        in_spark: Collection[str] = (),
        hold_outputs: bool = False,
    ) -> None:
        self.loop = loop
        self.caches = caches
        self.variables = DriverVariables(driver_rows, frozenset(in_spark))
        # Outputs that were small in the round before are collected to the driver: a sink
        # writes them without a Spark job (an unbounded run's epochs, where sinks take
        # every output).
        self.hold_outputs = hold_outputs
        # Live checkpoints: the previous round's, then the current round's.
        self.held: list[DataFrame] = []
        # Inputs iterflow persisted at the start (data inputs and the variables' first values).
        self.owned_inputs: dict[str, DataFrame] = {}
        # The first epoch of this start: the variables' first values are released after it.
        self.first_epoch = 0
        # What commits not yet written read (id -> times pinned), and what rounds let go of
        # meanwhile: released when the last commit reading it is written (``unpin``).
        self._pins: dict[int, int] = {}
        self._unheld: dict[int, DataFrame] = {}
        self._pins_lock = threading.Lock()
        loop.observers.on_sample = partial(loop.listeners.round_progress, on_error=delivery_failed)

    def own_inputs(self, inputs: Mapping[str, DataFrame], skip: Collection[str] = ()) -> None:
        """Persist the ``inputs`` not in ``skip`` that are not cached already, until the end."""
        for name, df in inputs.items():
            if name not in skip and name not in self.owned_inputs and persist_owned(df):
                self.owned_inputs[name] = df

    def evaluate(
        self,
        epoch: int,
        body: IterationBody,
        inputs: Mapping[str, DataFrame],
        plan_of: Callable[[Any], RoundPlan],
        candidates: Collection[str],
        events: EventTimeSteps | None = None,
        extras: Extras | None = None,
    ) -> Round:
        """Call ``body`` for round ``epoch`` and materialize its Declaration; the feedback of
        the small ``candidates`` (see ``DriverVariables``) stays on the driver. ``events``
        backs the round's event-time steps; ``extras`` as in ``evaluate_round``."""
        started_at = datetime.now(timezone.utc)
        clock = time.perf_counter()
        tracker = self.loop.observers.tracker
        scope = SparkRoundScope(epoch, self.caches, tracker, events)
        ctx = RoundContext(epoch, self.loop.state, scope)
        calls = self.caches.resident_calls
        small = self.variables.small(candidates)
        held_outputs = self.variables.small_outputs() if self.hold_outputs else ()
        evaluated = evaluate_round(
            body, inputs, ctx, self.loop.check, plan_of, tracker, small, extras, held_outputs
        )
        self.held.extend(evaluated.produced)  # released with the rest if this round fails
        self.variables.rows = {name: evaluated.rows[name] for name in evaluated.variables}
        self.variables.tables = evaluated.tables
        self.variables.outputs = {name: evaluated.rows[name] for name in evaluated.outputs}
        return Round(
            epoch=epoch,
            inputs=inputs,
            ctx=ctx,
            scope=scope,
            evaluated=evaluated,
            emitter=self.loop.emitter,
            started_at=started_at,
            clock=clock,
            resident=self.caches.resident_calls > calls,
            path=self.loop.observers.path,
        )

    def write_sinks(self, rnd: Round, sinks: Mapping[str, Sink]) -> None:
        """Write the round's outputs to their ``sinks`` (before the round counts)."""
        outputs, rows = rnd.evaluated.outputs, rnd.evaluated.rows
        for name, sink in sinks.items():
            try:
                sink.write(outputs[name], rnd.epoch, rows[name])
            except Exception as exc:
                fail(rnd.epoch, f"sink '{name}'", exc)

    def record(
        self, rnd: Round, progress: RoundProgress, conditions: tuple[Condition, ...]
    ) -> RoundProgress:
        """Complete ``progress`` with the round's metrics and estimate, add it to the
        history, show and log it, then call the listeners; the completed progress."""
        loop = self.loop
        try:
            loop.observers.round_done(progress)  # the round's last sample, before its end
        except SampleDeliveryError as exc:
            fail(rnd.epoch, exc.stage, exc.cause)
        progress = loop.observers.complete(progress, conditions, loop.history)
        loop.history.append(progress)
        if loop.recent is not None and len(loop.history) > loop.recent:
            del loop.history[: len(loop.history) - loop.recent]
        loop.observers.round_end(progress, conditions)
        loop.listeners.round_end(rnd.end(progress), partial(fail, rnd.epoch))
        return progress

    def complete(self, rnd: Round, before_release: Callable[[], None] | None = None) -> None:
        """Round ``rnd`` counts: release what the round before it held, and this round's
        caches (after ``before_release``, e.g. waiting for a checkpoint that reads it)."""
        self.loop.observers.round_completed(rnd.epoch)
        self.caches.release("round")
        if before_release is not None:
            before_release()
        produced = rnd.evaluated.produced
        finished, self.held = self.held[: len(self.held) - len(produced)], produced
        with self._pins_lock:
            for df in finished:
                if id(df) in self._pins:
                    self._unheld[id(df)] = df
                else:
                    release(df)
        if rnd.epoch == self.first_epoch:
            self.release_first_values()

    def pin(self) -> list[DataFrame]:
        """Keep what the last completed round holds (its variables' data) alive until
        ``unpin``, for a commit written while later rounds run (any thread)."""
        with self._pins_lock:
            frames = list(self.held)
            for df in frames:
                self._pins[id(df)] = self._pins.get(id(df), 0) + 1
            return frames

    def unpin(self, frames: list[DataFrame]) -> None:
        """``frames`` (from ``pin``) are no longer read: release those no round holds now."""
        with self._pins_lock:
            for df in frames:
                left = self._pins.pop(id(df)) - 1
                if left:
                    self._pins[id(df)] = left
                elif (unheld := self._unheld.pop(id(df), None)) is not None:
                    release(unheld)

    def release_first_values(self) -> None:
        """Unpersist the variables' first values (bound, or read from a checkpoint): after
        the first round of a start, the variables are that round's feedback."""
        for name in self.loop.check.variable_names or ():
            if name in self.owned_inputs:
                # Blocking, once per start: rounds held on the driver take milliseconds, and
                # what a run holds in Spark from round 1 on must not depend on how soon the
                # block manager got round to it.
                self.owned_inputs.pop(name).unpersist(blocking=True)

    def drop_rounds(self) -> None:
        """Release what the rounds in flight hold (before running them again)."""
        self.caches.release("round")
        for df in self.held:
            release(df)
        self.held = []
        self.release_first_values()

    def close(self, keep: Mapping[str, DataFrame] | None = None) -> None:
        """Release everything the run holds but ``keep`` (a result's outputs)."""
        keep_ids = {id(df) for df in (keep or {}).values()}
        try:
            self.caches.release("round")
            self.caches.release("iteration")
        finally:
            for df in [*self.held, *self._unheld.values()]:
                if id(df) not in keep_ids:
                    release(df)
            self.held, self._unheld, self._pins = [], {}, {}
            for df in self.owned_inputs.values():
                df.unpersist(blocking=False)
            self.owned_inputs = {}
