"""One epoch of an unbounded iteration: its inputs (a micro-batch's new rows, unioned
with the feedback for each variable), the body, event time, the sinks, and the epoch's
progress, through the round cycle both loops share. The epoch loop (``epochs``) decides
when epochs run, on which rows, and commits them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import attrs
from pyspark.sql import Column, DataFrame

from iterflow.body import IterationBody
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.round.cycle import RoundCycle
from iterflow.runtime.round.materialize import observe_rows, step_observation
from iterflow.runtime.spark.jvm import await_observations
from iterflow.runtime.spark.observations import observed_metrics, observed_rows
from iterflow.unbounded.event_steps import EpochSteps
from iterflow.unbounded.event_time import EventTime


class EpochRound:
    """Runs epochs of one unbounded iteration on its round ``cycle``."""

    def __init__(
        self,
        *,
        body: IterationBody,
        cycle: RoundCycle,
        inputs: Mapping[str, DataFrame],
        streams: tuple[str, ...],
        state_names: frozenset[str],
        sinks: Mapping[str, Sink],
        event_time: EventTime | None,
    ) -> None:
        self.body = body
        self.cycle = cycle
        self.loop = cycle.loop
        self.inputs = inputs
        self.streams = streams
        self.state_names = state_names
        self.sinks = sinks
        self.event_time = event_time
        spark = next(iter(inputs.values())).sparkSession
        self.empty = {name: spark.createDataFrame([], inputs[name].schema) for name in streams}

    @property
    def in_flight(self) -> int:
        """Work feedback rows waiting for an epoch."""
        rows = self.cycle.variables.rows
        names = self.loop.check.variable_names or ()
        return sum(rows.get(name, 0) for name in names if name not in self.state_names)

    def run(
        self,
        epoch: int,
        pending: Mapping[str, DataFrame],
        new: Mapping[str, DataFrame] | None,
        batch_id: int | None,
        source_backlog: Callable[[], dict[str, float]],
    ) -> tuple[dict[str, DataFrame], dict[str, DataFrame]]:
        """Epoch ``epoch`` on the rows ``new`` of each streaming input (None: none) and the
        variables ``pending``: the variables the next epoch reads, and the outputs."""
        timing = self.event_time
        self.loop.observers.metrics.settle(epoch)  # an unbounded run never rolls back
        with self.loop.observers.round(epoch):
            tracker = self.loop.observers.tracker
            observations = {
                name: step_observation("input", (name,), tracker) for name in self.streams
            }
            inputs = self._inputs(pending, new, observations)
            feedback_in = dict(self.cycle.variables.rows)
            events = (
                timing.begin(
                    epoch,
                    inputs.values(),
                    self._seen(observations) if new and self._fires_early() else None,
                    fresh=bool(new),
                )
                if timing is not None
                else None
            )
            # A small state variable (a model) lives on the driver between epochs.
            rnd = self.cycle.evaluate(
                epoch,
                self.body,
                inputs,
                partial(self.loop.check.check_unbounded, epoch, self.state_names, self.sinks),
                self.state_names,
                events=events,
                extras=None if events is None else partial(self._extras, events),
            )
            marks = None
            if timing is not None and events is not None:
                # The steps' own observations were awaited when their rows were evaluated.
                await_observations(list(observations.values()))
                marks = timing.end(
                    epoch,
                    events,
                    rnd.evaluated.done,
                    {n: observed_metrics(o) if new else None for n, o in observations.items()},
                    rnd.evaluated.plan.declaration.feedback,
                    self._is_work,
                )
            self.cycle.write_sinks(rnd, self.sinks)
            progress = rnd.progress(
                epoch_watermark=self.watermark(epoch),
                batch_id=batch_id,
                input_rows={n: observed_rows(o) if new else 0 for n, o in observations.items()},
                feedback_rows_in=feedback_in,
                backlog={"feedback_rows": self.in_flight, **source_backlog()},
                **(attrs.asdict(marks, recurse=False) if marks is not None else {}),
            )
            self.cycle.record(rnd, progress, ())
            self.cycle.complete(rnd)
        return rnd.evaluated.variables, rnd.evaluated.outputs

    def _inputs(
        self,
        pending: Mapping[str, DataFrame],
        new: Mapping[str, DataFrame] | None,
        observations: Mapping[str, object],
    ) -> dict[str, DataFrame]:
        """The epoch's inputs: each streaming input's new rows (counted by its observation)
        unioned with its feedback, and the other inputs' feedback or bound value."""
        timing = self.event_time
        inputs: dict[str, DataFrame] = {}
        for name in self.loop.check.schemas:
            if name in self.streams:
                fresh = observe_rows(
                    (new or self.empty)[name],
                    observations[name],  # type: ignore[arg-type]
                    *(timing.input_metrics(name) if timing is not None else ()),
                )
                variable = pending.get(name)
                inputs[name] = fresh if variable is None else fresh.unionByName(variable)
            else:
                inputs[name] = pending.get(name, self.inputs[name])
        return inputs

    def _fires_early(self) -> bool:
        """A window step may fire under the watermark of the epoch's own new rows: the
        iteration's variables are known (after its first epoch) and no work variable keeps
        an event time (its rows fed back now could still belong to the window)."""
        names = self.loop.check.variable_names
        timed = set(self.event_time.columns) if self.event_time is not None else set()
        return names is not None and not {n for n in names if self._is_work(n)} & timed

    @staticmethod
    def _seen(observations: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
        """What the epoch's jobs have observed so far of each input's new rows."""
        return lambda: {name: observed_metrics(o) for name, o in observations.items()}

    def _is_work(self, name: str) -> bool:
        return name not in self.state_names

    def _extras(
        self, events: EpochSteps, feedback: Mapping[str, DataFrame]
    ) -> tuple[list[DataFrame], dict[int, list[Column]], list[DataFrame]]:
        """The event-time steps' new state, and the earliest event time of the work
        feedback, to materialize and aggregate with the epoch, and the steps'
        checkpoints that the next epoch reads."""
        assert self.event_time is not None
        targets, metrics = events.targets()
        metrics.update(self.event_time.feedback_metrics(feedback, self._is_work))
        return targets, metrics, events.kept()

    def watermark(self, epoch: int) -> int:
        """The epoch watermark after ``epoch``: every record that entered the loop at an
        epoch up to it is processed, and ``watermark + 1`` is the lowest epoch that may
        still have records in flight (as in FLIP-176).

        Work feedback is one DataFrame, so iterflow cannot tell which epoch its rows came
        from: while any is in flight the watermark stays before the epoch in which it last
        rose from none, and it catches up with the epoch once the feedback drained. It
        follows from the previous epoch's progress, which a restart restores."""
        if self.in_flight == 0:
            return epoch
        history = self.loop.history
        previous = history[-1] if history and history[-1].epoch == epoch - 1 else None
        if previous is None or previous.backlog.get("feedback_rows", 0) == 0:
            return epoch - 1
        return previous.epoch_watermark
