"""The bounded round loop.

Round k calls the body on the variables (feedback of round k-1, or the bound
values at round 0) and the data inputs, materializes what it declared (cutting
lineage, so plans never grow), builds its RoundProgress, calls listeners,
decides termination, and releases what round k-1 held.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import partial
from typing import Any

import attrs
from pyspark.sql import DataFrame

from iterflow.body import IterationBody, RoundContext
from iterflow.bounded.result import IterationResult
from iterflow.errors import (
    IterflowError,
    IterflowValueError,
    IterflowWarning,
    RoundError,
)
from iterflow.progress.listeners import Emitter, IterationEnd, ListenerSet, RoundEnd
from iterflow.progress.round import RoundProgress
from iterflow.runtime.checkpoint import (
    Checkpoint,
    Checkpointing,
    driver_state_of,
    load_driver_state,
    lost_checkpoint_block,
)
from iterflow.runtime.materialize import Materialized, persist_owned, release
from iterflow.runtime.observers import RunObservers
from iterflow.runtime.resident import ResidentPolicy
from iterflow.runtime.rounds import (
    DRIVER_ROWS,
    DeclarationCheck,
    RoundPlan,
    evaluate_round,
    fail,
    local_rows,
    small_variables,
)
from iterflow.runtime.scope import CacheRegistry, SparkRoundScope
from iterflow.termination import (
    Condition,
    Termination,
    check_converged_value,
    decide,
    flatten,
    max_rounds_of,
)

#: Rollbacks to a durable checkpoint one run may make before it gives up.
MAX_ROLLBACKS = 3


class RoundLoop:
    """Runs one bounded iteration; made by ``BoundedIteration.run``."""

    def __init__(
        self,
        *,
        body: IterationBody,
        inputs: Mapping[str, DataFrame],
        replay: set[str],
        conditions: tuple[Condition, ...],
        listeners: ListenerSet,
        observers: RunObservers,
        residency: ResidentPolicy,
        checkpointing: Checkpointing | None = None,
        driver_rows: int = DRIVER_ROWS,
    ) -> None:
        self.body = body
        self.observers = observers
        self.checkpointing = checkpointing
        self.inputs = dict(inputs)
        self.replay = replay
        self.conditions = tuple(flatten(conditions))
        self.listeners = listeners
        self.check = DeclarationCheck(
            body.name,
            {name: df.schema for name, df in inputs.items()},
            self.conditions,
            fixed=replay,
            fixed_reason="is bound with replay=True but receives feedback; replay applies to "
            "data inputs only, drop replay=True",
        )
        self.state: dict[str, Any] = {}
        self.emitter = Emitter()
        self.residency = residency
        self.residency.on_decided = observers.flush_start
        self.caches = CacheRegistry(self.residency)
        self.history: list[RoundProgress] = []
        # Rows of each variable in the last round: small ones are held on the driver.
        self.variable_rows: dict[str, int] = {}
        self.variable_tables: dict[str, Any] = {}  # of those held on the driver
        self.driver_rows = driver_rows  # variables up to this many rows live on the driver
        # Live checkpoints: the previous round's, then the current round's.
        self.held: list[DataFrame] = []
        # Inputs iterflow persisted at the start (data inputs and round-0 variables).
        self.owned_inputs: dict[str, DataFrame] = {}
        # The first epoch this run computes: 0, or the one after a restored checkpoint.
        self.start = 0
        self.rollbacks = 0

    # -- the loop --------------------------------------------------------------

    def run(self) -> IterationResult:
        kept: dict[str, DataFrame] = {}
        epoch: int | None = None  # set once rounds may run
        started = False
        try:
            restored = self.checkpointing.restore() if self.checkpointing else None
            resumed_from = restored.epoch if restored else None
            self.observers.started(
                self.inputs,
                self.replay,
                self.conditions,
                resumed_from,
                resident=self.residency.residency,
            )
            started = True
            if restored is not None:
                if restored.final and not self._extends(restored):
                    return self._finished(restored)
                self._check_reachable(restored)
                self.observers.metrics.restore(restored.driver.metrics)
            current = self._resume(restored) if restored else dict(self.inputs)
            self.variable_rows = local_rows(current, self.driver_rows)
            self._own_inputs(current)
            epoch = self.start
            while True:
                try:
                    with self.observers.round(epoch):
                        current, outputs, termination = self._round(epoch, current)
                        if termination is not None:
                            # Listener updates at the end count toward the last round.
                            result = self._terminate(epoch, termination, current, outputs)
                            kept = outputs
                            result.resumed_from = resumed_from
                            return result
                    epoch += 1
                except RoundError as exc:
                    if not lost_checkpoint_block(exc):
                        raise
                    current = self._roll_back(epoch, exc)
                    epoch = self.start
        except BaseException as exc:
            if epoch is not None and self.checkpointing is not None:
                self.checkpointing.settle()
            if started:
                self.observers.failed(epoch, exc)
            raise
        finally:
            try:
                self.observers.close()
            finally:
                self._release_all(keep=kept)

    def _terminate(
        self,
        epoch: int,
        termination: Termination,
        current: dict[str, DataFrame],
        outputs: dict[str, DataFrame],
    ) -> IterationResult:
        end = IterationEnd(
            termination=termination,
            rounds=epoch + 1,
            outputs=outputs,
            history=tuple(self.history),
            state=self.state,
            emitter=self.emitter,
        )
        self.listeners.iteration_terminated(end, partial(fail, epoch))
        metrics = self.observers.terminated(termination, epoch + 1)
        if self.checkpointing is not None:
            # The final epoch is flushed before run() returns, with its outputs. If that
            # fails, the result in hand is still right: warn rather than lose it.
            try:
                self.checkpointing.write(
                    epoch,
                    driver_state_of(self, termination=termination),
                    self._variables(current),
                    outputs,
                )
                self.checkpointing.wait()
            except IterflowError as exc:
                warnings.warn(
                    f"{exc}. The result is returned, but the final checkpoint is missing: "
                    "a later run() with this checkpoint_dir resumes from the last "
                    "committed epoch and runs the remaining rounds again",
                    IterflowWarning,
                    stacklevel=4,
                )
        return IterationResult(
            outputs=outputs,
            rounds=epoch + 1,
            termination=termination,
            history=list(self.history),
            emitted={k: list(v) for k, v in self.emitter.values.items()},
            metrics=metrics,
        )

    # -- checkpoints -------------------------------------------------------------

    def _variables(self, current: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
        return {name: current[name] for name in self.check.variable_names or ()}

    def _resume(self, checkpoint: Checkpoint) -> dict[str, DataFrame]:
        """Restore the driver state of ``checkpoint``; the inputs of its next round."""
        self.start = checkpoint.epoch + 1
        load_driver_state(self, checkpoint.driver)
        variables = {n: self.check.aligned(n, df) for n, df in checkpoint.variables.items()}
        return {**self._data_inputs(), **variables}

    def _release_variable_inputs(self) -> None:
        """Unpersist the variables' starting values (bound, or read from a checkpoint): after
        the first round of a start, the variables are that round's feedback."""
        for name in self.check.variable_names or ():
            if name in self.owned_inputs:
                # Blocking, once per start: rounds held on the driver take milliseconds, and
                # what a run holds in Spark from round 1 on must not depend on how soon the
                # block manager got round to it.
                self.owned_inputs.pop(name).unpersist(blocking=True)

    def _own_inputs(self, inputs: Mapping[str, DataFrame]) -> None:
        for name, df in inputs.items():
            if name not in self.replay and name not in self.owned_inputs and persist_owned(df):
                self.owned_inputs[name] = df

    def _roll_back(self, epoch: int, error: RoundError) -> dict[str, DataFrame]:
        """Round ``epoch`` lost a local checkpoint block, which Spark cannot recompute:
        continue from the last durable checkpoint, or fail with the remedy."""
        lost = (
            f"epoch {epoch}: a block of the previous round's local checkpoint is gone (its "
            "executor was lost, or dynamic allocation removed it), and Spark cannot "
            "recompute it"
        )
        keep = (
            "keep executors that hold cached data "
            "(spark.dynamicAllocation.cachedExecutorIdleTimeout)"
        )
        if self.checkpointing is None:
            raise IterflowError(
                f"{lost}. Run with checkpoint_dir=... so that iterflow rolls back to the "
                f"last durable checkpoint, and {keep}"
            ) from error
        if self.rollbacks >= MAX_ROLLBACKS:
            raise IterflowError(
                f"{lost}, and this run has rolled back {MAX_ROLLBACKS} times already; "
                f"{keep}, then run() again to resume"
            ) from error
        self.checkpointing.settle()
        checkpoint = self.checkpointing.store.latest()
        if checkpoint is None:
            raise IterflowError(
                f"{lost}, and no checkpoint has committed yet (the first is due after epoch "
                f"{self.checkpointing.options.every - 1}); lower checkpoint_every, or {keep}"
            ) from error
        self.rollbacks += 1
        warnings.warn(
            f"epoch {epoch} lost a local checkpoint block; rolling back to the durable "
            f"checkpoint of epoch {checkpoint.epoch} and running again from epoch "
            f"{checkpoint.epoch + 1}",
            IterflowWarning,
            stacklevel=4,
        )
        self.observers.rolled_back(checkpoint.epoch)
        self.caches.release("round")
        for df in self.held:
            release(df)
        self.held = []
        self._release_variable_inputs()
        current = self._resume(checkpoint)
        self._own_inputs(current)
        return current

    def _check_reachable(self, checkpoint: Checkpoint) -> None:
        """A run cannot resume past a static max_rounds it has already passed."""
        bound = max_rounds_of(self.conditions)
        if not checkpoint.final and bound is not None and bound <= checkpoint.epoch + 1:
            raise IterflowValueError(
                f"the checkpoint in '{self.checkpointing.store.root}' is at epoch "  # type: ignore[union-attr]
                f"{checkpoint.epoch}, but max_rounds({bound}) ends the iteration at or "
                f"before it; pass max_rounds greater than {checkpoint.epoch + 1} to continue, "
                "or resume=False to start over"
            )

    def _extends(self, checkpoint: Checkpoint) -> bool:
        """True when a finished checkpoint continues: it stopped on max_rounds only, and
        the static max_rounds is larger now ("train 100 more rounds")."""
        bound = max_rounds_of(self.conditions)
        return (
            tuple(checkpoint.driver.termination.reasons) == ("max_rounds",)
            and bound is not None
            and bound > checkpoint.epoch + 1
        )

    def _finished(self, checkpoint: Checkpoint) -> IterationResult:
        """The result of a finished run, read back from its final checkpoint."""
        driver = checkpoint.driver
        self.listeners.load_state(driver.listeners)
        self.observers.metrics.restore(driver.metrics)
        metrics = self.observers.terminated(driver.termination, checkpoint.epoch + 1)
        return IterationResult(
            outputs=checkpoint.outputs,
            rounds=checkpoint.epoch + 1,
            termination=driver.termination,
            history=list(driver.history),
            emitted={k: list(v) for k, v in driver.emitted.items()},
            metrics=metrics,
            resumed_from=checkpoint.epoch,
        )

    def _round(
        self, epoch: int, inputs: dict[str, DataFrame]
    ) -> tuple[dict[str, DataFrame], dict[str, DataFrame], Termination | None]:
        started_at = datetime.now(timezone.utc)
        clock = time.perf_counter()
        scope = SparkRoundScope(epoch, self.caches)
        ctx = RoundContext(epoch, self.state, scope)

        def plan_of(declaration: Any) -> RoundPlan:
            plan = self.check.check(epoch, declaration)
            self.check.warn_unbounded(epoch, plan)
            return plan

        # A small variable (a model) lives on the driver between rounds. Before round 0
        # declares its feedback, any input may turn out to be a variable.
        names = self.check.variable_names
        small = small_variables(
            inputs if names is None else names,
            self.variable_rows,
            self.variable_tables,
            self.driver_rows,
        )
        resident_calls = self.caches.resident_calls
        evaluated = evaluate_round(self.body, inputs, ctx, self.check, plan_of, small)
        plan, done, rows = evaluated.plan, evaluated.done, evaluated.rows
        self.variable_rows = {name: rows[name] for name in evaluated.variables}
        self.variable_tables = evaluated.tables
        produced = evaluated.produced
        self.held.extend(produced)  # released with the rest if this round fails
        next_vars, materialized_outputs = evaluated.variables, evaluated.outputs
        criteria_empty: dict[Condition, bool] = {
            c: done.criteria_empty[id(c.criteria)] for c in plan.criteria
        }

        progress = RoundProgress(
            epoch=epoch,
            epoch_watermark=epoch,
            started_at=started_at,
            duration_s=time.perf_counter() - clock,
            rows=rows,
            criteria_empty=any(criteria_empty.values()) if criteria_empty else None,
            observed=scope.observed(),
            resident=self.caches.resident_calls > resident_calls,
        )

        def round_end(progress: RoundProgress) -> RoundEnd:
            return evaluated.round_end(ctx, inputs, progress, self.emitter)

        values = self._convergence_values(epoch, plan, done, round_end(progress))
        if values:
            progress = attrs.evolve(
                progress,
                converged_value=values[plan.convergence[0]],
                duration_s=time.perf_counter() - clock,
            )
        progress = self.observers.complete(progress, plan.conditions, self.history)
        self.history.append(progress)
        self.observers.round_end(progress, plan.conditions)
        self.listeners.round_end(round_end(progress), partial(fail, epoch))
        try:
            termination = decide(
                plan.conditions,
                progress,
                criteria_empty=criteria_empty,
                converged_values=values,
                feedback_empty=all(rows[name] == 0 for name in next_vars),
            )
        except Exception as exc:
            fail(epoch, "until predicate", exc)
        self.observers.round_completed(epoch)

        # Round k is complete: release what round k-1 held and this round's caches.
        self.caches.release("round")
        if self.checkpointing is not None:
            self.checkpointing.wait()  # a pending write may still read round k-1's data
        finished, self.held = self.held[: len(self.held) - len(produced)], produced
        for df in finished:
            release(df)
        if epoch == self.start:
            self._release_variable_inputs()
        if self.checkpointing is not None and termination is None and self.checkpointing.due(epoch):
            self.checkpointing.write(epoch, driver_state_of(self), next_vars)
        return {**self._data_inputs(), **next_vars}, materialized_outputs, termination

    # -- helpers ---------------------------------------------------------------

    def _data_inputs(self) -> dict[str, DataFrame]:
        return {
            name: df
            for name, df in self.inputs.items()
            if name not in (self.check.variable_names or ())
        }

    def _convergence_values(
        self, epoch: int, plan: RoundPlan, done: Materialized, ctx: RoundEnd
    ) -> dict[Condition, float]:
        values: dict[Condition, float] = {}
        for condition in plan.convergence:
            if callable(condition.value):
                try:
                    raw = condition.value(ctx)
                except Exception as exc:
                    fail(epoch, "convergence value", exc)
            else:
                raw = done.values[id(condition.value)]
            values[condition] = check_converged_value(raw, epoch)
        return values

    def _release_all(self, keep: Mapping[str, DataFrame]) -> None:
        """Release everything iterflow holds but the result's outputs."""
        keep_ids = {id(df) for df in keep.values()}
        self.caches.release("round")
        self.caches.release("iteration")
        for df in self.held:
            if id(df) not in keep_ids:
                release(df)
        for df in self.owned_inputs.values():
            df.unpersist(blocking=False)
        self.owned_inputs = {}
