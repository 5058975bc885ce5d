"""``BoundedIteration``: bind inputs, add conditions and listeners, run."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from iterflow.body import IterationBody
from iterflow.bounded.loop import RoundLoop
from iterflow.bounded.result import IterationResult
from iterflow.builder import (
    Binding,
    IterationBuilder,
    at_least_one,
    check_progress_option,
    keep_history_option,
)
from iterflow.errors import IterflowTypeError, IterflowValueError, warn
from iterflow.progress.estimate import check_progress_from
from iterflow.runtime.checkpoint.writer import Checkpointing, CheckpointOptions
from iterflow.runtime.datacache.driver_variables import driver_rows
from iterflow.runtime.datacache.resident_policy import resident_setting
from iterflow.runtime.progresstrack.observers import RunObservers, enclosing_round
from iterflow.runtime.spark.schema import describe_inputs
from iterflow.termination import Condition


class BoundedIteration(IterationBuilder):
    """A bounded iteration of ``body``.

    Example::

        result = (itf.BoundedIteration(step)
                    .bind("ranks", ranks).bind("edges", edges)
                    .until(itf.max_rounds(50))
                    .run())
    """

    kind = "BoundedIteration"

    def __init__(self, iteration_body: IterationBody | Callable[..., Any]) -> None:
        super().__init__(iteration_body)
        self._conditions: list[Condition] = []

    def bind(
        self, name: str, data: Any, *, replay: bool = False, on_driver: bool = True
    ) -> BoundedIteration:
        """Bind input ``name`` to a DataFrame (or rows / a pandas frame for the run's session).

        A variable's binding is its round-0 value. A data input is cached once and
        released at the end, unless ``replay=True``: then it is re-evaluated from
        its source every round. ``on_driver=False`` keeps a variable in Spark in every
        round, however few its rows (by default a variable of at most
        ``spark.iterflow.driverRows`` rows is held on the driver): for rows that are
        few but large, such as blocks of a vertex-state vector too big for the driver.
        """
        if isinstance(data, DataFrame) and data.isStreaming:
            raise IterflowValueError(
                f"bind('{name}', ...): a BoundedIteration takes batch DataFrames, and this one "
                "is streaming (spark.readStream); run it with itf.UnboundedIteration"
            )
        self._bind(Binding(name, data, replay=bool(replay), on_driver=bool(on_driver)))
        return self

    def until(self, *conditions: Condition) -> BoundedIteration:
        """Add termination conditions; the iteration stops when any of them holds."""
        for condition in conditions:
            if not isinstance(condition, Condition):
                raise IterflowTypeError(
                    "until() takes conditions such as itf.max_rounds(n), "
                    f"got {type(condition).__name__}"
                )
        self._conditions.extend(conditions)
        return self

    def run(
        self,
        *,
        spark: SparkSession | None = None,
        progress: bool | None = None,
        event_log: str | os.PathLike[str] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 10,
        checkpoint_async: bool = True,
        checkpoint_keep: int = 2,
        resume: bool = True,
        progress_from: str | None = None,
        progress_interval_s: float = 0.5,
        event_log_progress_s: float = 5.0,
        keep_history: int | None = None,
    ) -> IterationResult:
        """Run rounds until a termination condition holds; return the result.

        ``spark`` is the session for inputs bound as rows or pandas frames; by
        default the session of the bound DataFrames, else ``itf.session()``.
        ``progress`` shows a progress bar on stderr, a widget in a notebook (default:
        on a terminal or in a notebook); ``event_log`` appends the run's events to a JSON-lines file
        (see docs/events.md).

        ``checkpoint_dir`` (any path Spark can write: local, ``hdfs://``,
        ``s3a://``) makes the run durable: every ``checkpoint_every`` rounds and
        after the last one, the variables and the driver-side state are written
        there (in the background unless ``checkpoint_async=False``), keeping the
        newest ``checkpoint_keep`` (at least 2: one to fall back to). A later
        ``run()`` with the same directory and the same body and inputs resumes after
        the last committed epoch whose data verifies;
        ``resume=False`` deletes those checkpoints and starts over. See
        docs/checkpoints.md.

        ``progress_from`` names the count that the estimate of the rounds left
        (``RoundProgress.rounds_remaining_estimate``) follows down to zero: a
        ``ctx.observe`` name, a feedback or output name, or ``"criteria"`` (the rows
        of the body's ``itf.empty`` criteria). By default it is picked: the criteria
        when the round's jobs counted them, else the first observed step; a loop
        with ``itf.converged`` follows its convergence value.

        While a round runs, its progress is sampled every ``progress_interval_s``
        seconds (0: never) without running a Spark job: the bar shows the round's
        fraction done and time left, listeners' ``on_round_progress`` get an
        ``itf.RoundSample``, and the event log a ``round_progress`` line at most
        every ``event_log_progress_s`` seconds (0: none). See docs/events.md.

        ``keep_history=N`` keeps only the last N rounds' ``RoundProgress`` in memory,
        in checkpoints and in ``result.history`` (default None: every round). The
        event log stays the full record of every round; ``result.rounds`` counts them
        all. See docs/checkpoints.md, "How the history and the event log grow".
        """
        check_progress_option(progress)
        kept = keep_history_option(keep_history)
        check_progress_from(progress_from)
        active, inputs = self._bound_inputs(spark)
        driver_rows(active)  # checked before anything starts
        resident_setting(active)  # checked before anything starts
        replay = {name for name, b in self._bindings.items() if b.replay}
        checkpoints = _checkpoint_options(
            checkpoint_dir, checkpoint_every, checkpoint_async, checkpoint_keep, resume
        )
        checkpointing, observers = self._assemble(
            active,
            described_inputs=describe_inputs(inputs, replay),
            checkpoints=checkpoints,
            progress=progress,
            event_log=event_log,
            static_conditions=self._conditions,
            progress_from=progress_from,
            progress_interval_s=progress_interval_s,
            event_log_progress_s=event_log_progress_s,
        )
        return self._round_loop(active, inputs, replay, observers, checkpointing, kept).run()

    def _round_loop(
        self,
        spark: SparkSession,
        inputs: Mapping[str, DataFrame],
        replay: set[str],
        observers: RunObservers,
        checkpointing: Checkpointing | None,
        keep_history: int | None,
    ) -> RoundLoop:
        return RoundLoop(
            body=self._body,
            inputs=inputs,
            replay=replay,
            conditions=tuple(self._conditions),
            listeners=self._listeners,
            observers=observers,
            checkpointing=checkpointing,
            driver_rows=driver_rows(spark),
            sinks=self._sinks_by_output,
            spark=spark,
            keep_history=keep_history,
            in_spark={name for name, b in self._bindings.items() if not b.on_driver},
        )


def _checkpoint_options(
    directory: str | os.PathLike[str] | None,
    every: int,
    asynchronous: bool,
    keep: int,
    resume: bool,
) -> CheckpointOptions | None:
    """``run()``'s checkpoint options, checked; None without a directory, or in a run
    nested in another's round (only the outermost run takes checkpoints: said in a
    warning)."""
    outer = enclosing_round()
    if directory is not None and outer is not None:
        warn(
            f"run(checkpoint_dir='{os.fspath(directory)}') is ignored: this run is "
            f"nested in another, in its round at epoch path {outer}. Only the outermost "
            "run takes checkpoints, at its round boundaries (give it checkpoint_dir=); "
            "after a crash it resumes and runs this one again from its start"
        )
        return None
    if directory is None:
        return None
    return CheckpointOptions(
        directory=os.fspath(directory),
        every=at_least_one("checkpoint_every", every),
        asynchronous=bool(asynchronous),
        keep=at_least_one("checkpoint_keep", keep),
        resume=bool(resume),
    )
