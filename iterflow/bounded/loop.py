"""The bounded round loop.

Round k calls the body on the variables (feedback of round k-1, or the bound
values at round 0) and the data inputs through the shared round cycle
(``iterflow.runtime.round.cycle``). What is the bounded loop's own: deciding
termination, writing checkpoints every ``checkpoint_every`` rounds, and rolling
back to the last durable one when a round lost a local checkpoint block.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.body import IterationBody
from iterflow.bounded.recovery import Recovery
from iterflow.bounded.result import IterationResult
from iterflow.errors import RoundError
from iterflow.progress.listeners import ListenerSet
from iterflow.reports import RoundProgress, Termination
from iterflow.runtime.checkpoint.format import lost_checkpoint_block
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.checkpoint.writer import Checkpointing
from iterflow.runtime.datacache.resident_policy import ResidentPolicy
from iterflow.runtime.progresstrack.observers import RunObservers
from iterflow.runtime.round.cycle import LoopState, Round, RoundCycle, fail
from iterflow.runtime.round.declaration import DeclarationCheck, RoundPlan
from iterflow.runtime.round.scope import CacheRegistry
from iterflow.termination import Condition, check_converged_value, decide, flatten


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
        checkpointing: Checkpointing | None,
        driver_rows: int,
        sinks: Mapping[str, Sink],
        spark: SparkSession,
        keep_history: int | None = None,
        in_spark: Collection[str] = (),
    ) -> None:
        self.body = body
        self.sinks = dict(sinks)
        self.spark = spark
        self.inputs = dict(inputs)
        self.replay = replay
        self.conditions = tuple(flatten(conditions))
        self.checkpointing = checkpointing
        check = DeclarationCheck(
            body.name,
            {name: df.schema for name, df in inputs.items()},
            self.conditions,
            fixed=replay,
            fixed_reason="is bound with replay=True but receives feedback; replay applies to "
            "data inputs only, drop replay=True",
        )
        self.loop = LoopState(
            check=check, listeners=listeners, observers=observers, recent=keep_history
        )
        residency = ResidentPolicy(spark, observers.tracker)
        self.cycle = RoundCycle(self.loop, CacheRegistry(residency), driver_rows, in_spark)
        self.recovery = Recovery(
            spark=spark,
            cycle=self.cycle,
            checkpointing=checkpointing,
            conditions=self.conditions,
            replay=replay,
            sinks=self.sinks,
            data_inputs=self.data_inputs,
        )

    def run(self) -> IterationResult:
        observers = self.loop.observers
        kept: dict[str, DataFrame] = {}
        epoch: int | None = None  # set once rounds may run
        started = False
        try:
            restored = self.checkpointing.restore() if self.checkpointing else None
            resumed_from = restored.epoch if restored else None
            observers.started(
                self.inputs,
                self.replay,
                self.conditions,
                resumed_from,
                resident=True,
            )
            started = True
            if restored is not None:
                finished = self.recovery.finished(restored)
                if finished is not None:
                    return finished
                observers.metrics.restore(restored.driver.metrics)
            if restored is None:
                self.recovery.discard_sinks_after(-1)  # a fresh start: the sinks hold stale rows
                current = dict(self.inputs)
            else:
                current = self.recovery.resume(restored)
            self.cycle.variables.count_local(current)
            self.cycle.own_inputs(current, skip=self.replay)
            epoch = self.cycle.first_epoch
            while True:
                try:
                    with observers.round(epoch):
                        current, outputs, termination = self.run_round(epoch, current)
                        if termination is not None:
                            # Listener updates at the end count toward the last round.
                            result = self._terminate(
                                epoch, termination, current, outputs, resumed_from
                            )
                            kept = outputs  # returned: not released
                            return result
                    epoch += 1
                except RoundError as exc:
                    if not lost_checkpoint_block(exc):
                        raise
                    current = self.recovery.roll_back(epoch, exc)
                    epoch = self.cycle.first_epoch
        except BaseException as exc:
            if epoch is not None and self.checkpointing is not None:
                self.checkpointing.settle()
            if started:
                observers.failed(epoch, exc)
            raise
        finally:
            try:
                observers.close()
            finally:
                try:
                    self.cycle.close(keep=kept)
                finally:
                    if self.checkpointing is not None:
                        self.checkpointing.close()

    def run_round(
        self, epoch: int, inputs: dict[str, DataFrame]
    ) -> tuple[dict[str, DataFrame], dict[str, DataFrame], Termination | None]:
        """Round ``epoch`` on ``inputs``: the next round's inputs, the outputs, and the
        termination if the iteration ends here."""

        def plan_of(declaration: Any) -> RoundPlan:
            plan = self.loop.check.check_sinks(
                epoch, self.sinks, self.loop.check.check(epoch, declaration)
            )
            self.loop.check.warn_unbounded(epoch, plan)
            return plan

        # The metrics of rounds no rollback can reach are totals only from now on (without
        # checkpoints nothing rolls back: a nested run's outer run runs it again whole).
        floor = epoch if self.checkpointing is None else self.checkpointing.rollback_floor
        self.loop.observers.metrics.settle(floor)
        # Before round 0 declares its feedback, any input may turn out to be a variable.
        names = self.loop.check.variable_names
        rnd = self.cycle.evaluate(
            epoch, self.body, inputs, plan_of, inputs if names is None else names
        )
        plan, variables = rnd.evaluated.plan, rnd.evaluated.variables
        # Before the round can count, so a committed checkpoint's epochs are all written.
        self.cycle.write_sinks(rnd, self.sinks)
        criteria_empty, criteria_rows = criteria_outcome(rnd, plan)
        progress = rnd.progress(
            criteria_empty=any(criteria_empty.values()) if criteria_empty else None,
            criteria_rows=criteria_rows,
            # A convergence callable may read the round's metrics (its kernels' counts).
            metrics=self.loop.observers.metrics.round_values(epoch),
        )
        values = convergence_values(rnd, plan, progress)
        if values:
            progress = attrs.evolve(
                progress, converged_value=values[plan.convergence[0]], duration_s=rnd.elapsed_s
            )
        progress = self.cycle.record(rnd, progress, plan.conditions)
        try:
            termination = decide(
                plan.conditions,
                progress,
                criteria_empty=criteria_empty,
                converged_values=values,
                feedback_empty=all(rnd.evaluated.rows[name] == 0 for name in variables),
            )
        except Exception as exc:
            fail(epoch, "until predicate", exc)
        # A pending checkpoint write may still read the previous round's data.
        self.cycle.complete(rnd, self.checkpointing.wait if self.checkpointing else None)
        if self.checkpointing is not None and termination is None and self.checkpointing.due(epoch):
            self.checkpointing.write(epoch, self.loop.driver_state(), variables)
        return {**self.data_inputs(), **variables}, rnd.evaluated.outputs, termination

    def _terminate(
        self,
        epoch: int,
        termination: Termination,
        current: Mapping[str, DataFrame],
        outputs: dict[str, DataFrame],
        resumed_from: int | None,
    ) -> IterationResult:
        metrics = self.loop.terminated(termination, epoch + 1, outputs)
        if self.checkpointing is not None:
            variables = self.loop.check.variable_names or ()
            self.checkpointing.write_final(
                epoch,
                self.loop.driver_state(termination=termination),
                {name: current[name] for name in variables},
                outputs,
            )
        return IterationResult(
            outputs=outputs,
            rounds=epoch + 1,
            termination=termination,
            history=list(self.loop.history),
            emitted={k: list(v) for k, v in self.loop.emitter.values.items()},
            metrics=metrics,
            resumed_from=resumed_from,
            rollbacks=list(self.recovery.rollbacks),
            iteration=self.body.name,
        )

    def data_inputs(self) -> dict[str, DataFrame]:
        variables = self.loop.check.variable_names or ()
        return {name: df for name, df in self.inputs.items() if name not in variables}


def criteria_outcome(rnd: Round, plan: RoundPlan) -> tuple[dict[Condition, bool], int | None]:
    """Whether each criteria of the round is empty, and the fewest rows among them (a
    criteria that is also a feedback or output is counted by its checkpoint's job, the
    others by the round's tally)."""
    done = rnd.evaluated.done
    empty: dict[Condition, bool] = {c: done.criteria_empty[id(c.criteria)] for c in plan.criteria}
    rows = {**done.criteria_rows, **done.rows}
    counted = [rows[id(c.criteria)] for c in plan.criteria if id(c.criteria) in rows]
    return empty, (min(counted) if counted and len(counted) == len(plan.criteria) else None)


def convergence_values(
    rnd: Round, plan: RoundPlan, progress: RoundProgress
) -> dict[Condition, float]:
    """The round's convergence values, by condition: computed with the round (a one-cell
    DataFrame) or by a callable on its ``RoundEnd``; checked for NaN and infinity."""
    values: dict[Condition, float] = {}
    for condition in plan.convergence:
        if callable(condition.value):
            try:
                raw = condition.value(rnd.end(progress))
            except Exception as exc:
                fail(rnd.epoch, "convergence value", exc)
        else:
            raw = rnd.evaluated.done.values[id(condition.value)]
        values[condition] = check_converged_value(raw, rnd.epoch)
    return values
