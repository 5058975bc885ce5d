"""Where a bounded run starts again: after a restored checkpoint, or after a lost block.

A run with ``checkpoint_dir`` resumes after the last committed epoch; a finished
one returns its result (or continues, when ``max_rounds`` grew). A round that
lost a block of the previous round's local checkpoint, which Spark cannot
recompute, rolls back to the last durable checkpoint, at most ``MAX_ROLLBACKS``
times.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession

from iterflow.bounded.result import IterationResult
from iterflow.errors import IterflowError, IterflowValueError, RoundError, warn
from iterflow.reports import Rollback, describe_loss, executors_lost
from iterflow.runtime.checkpoint.format import Checkpoint
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.checkpoint.writer import Checkpointing
from iterflow.runtime.progresstrack.observers import enclosing_round
from iterflow.runtime.round.cycle import RoundCycle
from iterflow.runtime.spark.jvm import removed_executors
from iterflow.termination import Condition, max_rounds_of

log = logging.getLogger("iterflow.checkpoint")

#: Rollbacks to a durable checkpoint one run may make before it gives up.
MAX_ROLLBACKS = 3


class Recovery:
    """Restores and rolls back the rounds of one bounded run: its round ``cycle``, its
    ``checkpointing`` (None: none), its static ``conditions``, the inputs bound with
    ``replay``, its output ``sinks``, and ``data_inputs`` (its inputs without feedback)."""

    def __init__(
        self,
        *,
        spark: SparkSession,
        cycle: RoundCycle,
        checkpointing: Checkpointing | None,
        conditions: Sequence[Condition],
        replay: set[str],
        sinks: Mapping[str, Sink],
        data_inputs: Callable[[], dict[str, DataFrame]],
    ) -> None:
        self.spark = spark
        self.cycle = cycle
        self.loop = cycle.loop
        self.checkpointing = checkpointing
        self.conditions = conditions
        self.replay = replay
        self.sinks = sinks
        self.data_inputs = data_inputs
        #: The rollbacks of this run() so far.
        self.rollbacks: list[Rollback] = []
        #: When this run() started, in ms since the epoch (executors removed before it
        #: are not this run's loss).
        self._started_ms = int(time.time() * 1000)

    def finished(self, checkpoint: Checkpoint) -> IterationResult | None:
        """The result of a finished run, read back from its final ``checkpoint``; None when
        the run continues from it."""
        if not checkpoint.final or self._extends(checkpoint):
            self._check_reachable(checkpoint)
            return None
        loop = self.loop
        driver = checkpoint.driver
        loop.listeners.load_state(driver.listeners)
        loop.observers.metrics.restore(driver.metrics)
        metrics = loop.observers.terminated(driver.termination, checkpoint.epoch + 1)
        return IterationResult(
            outputs=checkpoint.outputs,
            rounds=checkpoint.epoch + 1,
            termination=driver.termination,
            history=loop.kept(driver.history),
            emitted={k: list(v) for k, v in driver.emitted.items()},
            metrics=metrics,
            resumed_from=checkpoint.epoch,
            iteration=loop.observers.iteration,
        )

    def resume(self, checkpoint: Checkpoint) -> dict[str, DataFrame]:
        """Restore the driver state of ``checkpoint``; the inputs of its next round."""
        self.discard_sinks_after(checkpoint.epoch)
        self.cycle.first_epoch = checkpoint.epoch + 1
        self.loop.load(checkpoint.driver)
        check = self.loop.check
        variables = {n: check.aligned(n, df) for n, df in checkpoint.variables.items()}
        return {**self.data_inputs(), **variables}

    def discard_sinks_after(self, epoch: int) -> None:
        """Delete what the sinks hold of the epochs after ``epoch``: they run (again) now."""
        for sink in self.sinks.values():
            sink.discard_after(self.spark, epoch)

    def roll_back(self, epoch: int, error: RoundError) -> dict[str, DataFrame]:
        """Round ``epoch`` lost a local checkpoint block, which Spark cannot recompute:
        continue from the last durable checkpoint (its next round's inputs), or fail
        with the remedy."""
        blocks, executors = self._loss(error)
        gone = f"{describe_loss(blocks, [])} of the previous round's local checkpoint"
        gone += " are gone" if len(blocks) > 1 else " is gone"
        cause = (
            executors_lost(executors)
            if executors
            else "its executor was lost, or dynamic allocation removed it"
        )
        lost = f"epoch {epoch}: {gone} ({cause}), and Spark cannot recompute it"
        keep = (
            "keep executors that hold cached data "
            "(spark.dynamicAllocation.cachedExecutorIdleTimeout)"
        )
        checkpointing = self.checkpointing
        if checkpointing is None and enclosing_round() is not None:
            # A nested run takes no checkpoints: the outer run rolls back to its own.
            raise error
        if checkpointing is None:
            raise IterflowError(
                f"{lost}. Run with checkpoint_dir=... so that iterflow rolls back to the "
                f"last durable checkpoint, and {keep}"
            ) from error
        if len(self.rollbacks) >= MAX_ROLLBACKS:
            raise IterflowError(
                f"{lost}, and this run has rolled back {MAX_ROLLBACKS} times already; "
                f"{keep}, then run() again to resume"
            ) from error
        checkpointing.settle()
        checkpoint = checkpointing.latest()
        if checkpoint is None:
            raise IterflowError(
                f"{lost}, and no checkpoint has committed yet (the first is due after epoch "
                f"{checkpointing.options.every - 1}); lower checkpoint_every, or {keep}"
            ) from error
        rollback = Rollback(
            failed_epoch=epoch,
            to_epoch=checkpoint.epoch,
            lost_blocks=blocks,
            lost_executors=executors,
            at=datetime.now(timezone.utc),
        )
        self.rollbacks.append(rollback)
        warn(
            f"{lost}; rolling back to the durable checkpoint of epoch {checkpoint.epoch} and "
            f"running again from epoch {checkpoint.epoch + 1} "
            f"({rollback.rounds_recomputed} completed round(s) recomputed)",
            log=log,
        )
        self.loop.observers.rolled_back(rollback)
        self.cycle.drop_rounds()
        current = self.resume(checkpoint)
        self.cycle.own_inputs(current, skip=self.replay)
        return current

    def _loss(self, error: BaseException) -> tuple[list[str], list[str]]:
        """The block ids Spark's ``error`` names, and the executors removed since this run
        started (each described by id, address and Spark's reason)."""
        text = f"{error} {error.__cause__}"
        blocks = list(dict.fromkeys(re.findall(r"\brdd_\d+_\d+\b", text)))
        executors = removed_executors(self.spark, self._started_ms) or []
        return blocks, executors

    def _check_reachable(self, checkpoint: Checkpoint) -> None:
        """A run cannot resume past a static max_rounds it has already passed."""
        bound = max_rounds_of(self.conditions)
        if not checkpoint.final and bound is not None and bound <= checkpoint.epoch + 1:
            root = self.checkpointing.store.root  # type: ignore[union-attr]
            raise IterflowValueError(
                f"the checkpoint in '{root}' is at epoch "
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
