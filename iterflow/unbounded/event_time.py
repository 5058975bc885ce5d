"""Event time through an unbounded iteration: watermarks per input, per step and of the loop.

An input bound with ``event_time="ts", max_delay=d`` has a watermark: the latest
event time seen in it, less ``d`` (-inf before its first row, +inf once the
inputs have ended). The inputs' watermarks combine as Structured Streaming's
``WatermarkTracker`` combines those of a query's sources, under its setting
``spark.sql.streaming.multipleWatermarkPolicy``: ``min`` (the default) takes the
least, so an input that has seen no row yet (Spark counts it at its initial
watermark) holds the others back; ``max`` takes the greatest, so inputs without
rows do not count while any input has some. The loop's **input watermark** for an
epoch is that, or the earliest event time among the work feedback entering the
epoch if it is earlier (fed-back rows keep their event time, so the loop must stay
behind the oldest one in flight, under either policy); it never goes back. A
commit keeps the policy, and a restart goes on with it (as a Spark checkpoint
keeps its own).

Each ``ctx.window``/``ctx.join`` step (``iterflow.unbounded.event_steps``) has an
input watermark for the epoch: the least of the loop's and the output watermarks
of the steps its rows come from, as they stood after the previous epoch. Like a
Structured Streaming micro-batch, an epoch works with the watermarks computed at
the end of the one before. After the epoch, in the order the steps ran:

    next input watermark of S = max(its input watermark,
                                    min(loop input watermark after the epoch,
                                        output watermarks of S's upstream steps))
    output watermark of S     = max(the previous one, min(next input watermark of S,
                                                          S's hold))

where a window step holds at the earliest event time in its windows not fired yet
(their rows are still to come out) and a join step at the earliest event time it
stores. The loop's watermark (``watermarks["loop"]``) is the least of the loop's
input watermark and every step's output watermark. Rows a step emits at or after
its input watermark are never late downstream.

A window fires in the first epoch whose watermark has passed its end. An epoch
with new rows already knows their latest event time when its window step runs
(it rides on the step's first job), so the step fires (and evicts) under the
watermark those rows make, while it still classifies the new rows as late under
the watermark of the epoch before: a window fires in the epoch whose input made it
due, and a row is never late for its own micro-batch (as in Structured Streaming,
where a micro-batch's watermark is that of the ones before). When work feedback
keeps its event time, a step fires under the epoch's own watermark only (a row fed
back now may still belong to the window). When an epoch leaves a step with a window
due under its next watermark (a step downstream of another, or feedback), the loop
runs another epoch without new input (as Structured Streaming runs a no-data
micro-batch), so chained steps fire within the micro-batch that made them due.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import partial
from typing import Any

import attrs
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iterflow.errors import IterflowValueError
from iterflow.runtime.round.materialize import Materialized
from iterflow.runtime.spark.schema import quoted
from iterflow.unbounded.event_steps import EpochSteps, PreviousStep, StepOutcome
from iterflow.windows import MAX_US, MIN_US, to_datetime

#: Metric names riding on the epoch's jobs.
MAX_EVENT, MIN_EVENT = "max_event_us", "min_event_us"
#: Structured Streaming's setting for how the watermarks of several inputs combine.
WATERMARK_POLICY_CONF = "spark.sql.streaming.multipleWatermarkPolicy"
POLICIES = ("min", "max")

log = logging.getLogger("iterflow.unbounded")


def watermark_policy(setting: str | None) -> str:
    """``spark.sql.streaming.multipleWatermarkPolicy`` checked: "min" (unset) or "max"."""
    policy = "min" if setting is None else setting.strip().lower()
    if policy not in POLICIES:
        raise IterflowValueError(
            f"{WATERMARK_POLICY_CONF}={setting!r}: the watermarks of several event-time "
            "inputs combine by 'min' (the default: the slowest input holds the loop back) "
            "or 'max' (the fastest drives it); set one of them"
        )
    return policy


@attrs.define(kw_only=True)
class StepMarks:
    """A step's watermarks and state after an epoch (committed with the epoch)."""

    kind: str
    spec: str
    upstream: tuple[str, ...]
    input_watermark: int  # in the epoch just run
    output_watermark: int
    due: int | None  # the end of its next window to fire
    state_rows: int
    parts: tuple[str, ...]


@attrs.frozen(kw_only=True)
class EpochMarks:
    """What an epoch's ``RoundProgress`` reports of event time."""

    watermarks: dict[str, datetime]
    late_rows: dict[str, int]
    state_rows: dict[str, int]


class EventTime:
    """The event time of one unbounded iteration: its inputs' watermarks, its steps' state.

    ``sources`` maps each streaming input bound with ``event_time=`` to its column and
    maximum delay (microseconds); ``columns`` maps every input bound with
    ``event_time=`` (streaming or a variable whose feedback keeps its event time) to
    its column. ``policy`` combines the inputs' watermarks ("min" or "max").
    """

    def __init__(
        self,
        sources: Mapping[str, tuple[str, int]],
        columns: Mapping[str, str],
        policy: str = "min",
    ) -> None:
        self.sources = dict(sources)
        self.columns = dict(columns)
        self.policy = policy
        self.told_idle: set[str] = set()  # inputs logged as holding the loop back
        self.told_unknown: set[str] = set()  # steps logged as reading rows of unknown origin
        self.max_seen: dict[str, int] = {}
        self.ended = False
        self.feedback_min: dict[str, int] = {}
        self.loop_input = MIN_US
        self.loop = MIN_US
        self.steps: dict[str, StepMarks] = {}
        self.frames: dict[str, dict[str, DataFrame]] = {}

    # -- watermarks ----------------------------------------------------------------------

    def source_watermark(self, name: str, max_seen: Mapping[str, int] | None = None) -> int:
        if self.ended:
            return MAX_US
        seen = (self.max_seen if max_seen is None else max_seen).get(name)
        return MIN_US if seen is None else max(MIN_US, seen - self.sources[name][1])

    def _input_now(self, max_seen: Mapping[str, int] | None = None) -> int:
        """The loop's input watermark from what is known now (before monotonicity), or with
        the latest event times ``max_seen`` instead of those of the epochs before."""
        marks = [self.source_watermark(name, max_seen) for name in self.sources]
        if not marks:  # no input has event time: nothing advances it but the end
            marks = [MAX_US if self.ended else MIN_US]
        combined = max(marks) if self.policy == "max" else min(marks)
        return min([combined, *self.feedback_min.values()])

    def _tell_idle(self) -> None:
        """Log once per input that one without rows holds the loop back under "min"."""
        if self.policy != "min" or self.ended or not self.max_seen:
            return
        for name in sorted(set(self.sources) - set(self.max_seen) - self.told_idle):
            self.told_idle.add(name)
            log.warning(
                "event-time input '%s' has seen no row yet, so it holds the loop's "
                "watermark (and every window) back, as an input without data does in "
                "Structured Streaming under %s=min; set it to max to let the inputs with "
                "rows drive the watermark",
                name,
                WATERMARK_POLICY_CONF,
            )

    def _next_input(self, marks: StepMarks, loop_input: int) -> int:
        upstream = [self.steps[u].output_watermark for u in marks.upstream if u in self.steps]
        return max(marks.input_watermark, min([loop_input, *upstream]))

    def inputs_ended(self) -> None:
        """Every streaming input has ended: their watermarks jump to +inf."""
        self.ended = True

    def due(self) -> bool:
        """A step has a window to fire under the watermark its next epoch would have."""
        loop_input = max(self.loop_input, self._input_now())
        for marks in self.steps.values():
            if marks.due is not None and marks.due <= self._next_input(marks, loop_input):
                return True
        return False

    # -- an epoch ------------------------------------------------------------------------

    def begin(
        self,
        epoch: int,
        inputs: Iterable[DataFrame] = (),
        seen: Callable[[], Mapping[str, Mapping[str, Any] | None]] | None = None,
        fresh: bool = True,
    ) -> EpochSteps:
        """The event-time steps of epoch ``epoch``, with this epoch's watermarks; ``inputs``
        are the DataFrames the body gets. ``seen`` reads what the epoch's jobs have
        observed so far of each streaming input's new rows: with it, a window step fires
        under the watermark those rows make (``firing``); None (no new rows, or work
        feedback that keeps its event time) keeps the watermark of the epoch before.
        ``fresh``: the epoch has new input rows."""
        self.loop_input = max(self.loop_input, self._input_now())
        previous = {
            name: PreviousStep(
                kind=marks.kind,
                spec=marks.spec,
                frames=self.frames.get(name, {}),
                input_watermark=marks.input_watermark,
                output_watermark=marks.output_watermark,
                state_rows=marks.state_rows,
            )
            for name, marks in self.steps.items()
        }
        return EpochSteps(
            epoch,
            event_columns=self.columns,
            loop_watermark=self.loop_input,
            previous=previous,
            reserved=[*self.columns, "loop"],
            inputs=inputs,
            told=self.told_unknown,
            firing=None if seen is None else partial(self.firing, seen),
            fresh=fresh,
        )

    def firing(self, seen: Callable[[], Mapping[str, Mapping[str, Any] | None]]) -> int:
        """The loop's input watermark with the new rows observed so far in this epoch: a
        window that it passes fires in this epoch, not in one more without input. The new
        rows of an input that no job of the epoch has read yet do not count (a lower
        watermark: a window fires an epoch later, never early)."""
        return max(self.loop_input, self._input_now(_later(self.max_seen, seen())))

    def input_metrics(self, name: str) -> list[Column]:
        """What to aggregate over the new rows of input ``name`` (its latest event time)."""
        if name not in self.sources:
            return []
        column = self.columns[name]
        return [F.max(F.unix_micros(quoted(column))).alias(MAX_EVENT)]

    def feedback_metrics(
        self, feedback: Mapping[str, DataFrame], work: Callable[[str], bool]
    ) -> dict[int, list[Column]]:
        """What to aggregate over the work feedback whose rows keep their event time."""
        return {
            id(df): [F.min(F.unix_micros(quoted(self.columns[name]))).alias(MIN_EVENT)]
            for name, df in feedback.items()
            if name in self.columns and work(name) and self.columns[name] in df.columns
        }

    def end(
        self,
        epoch: int,
        steps: EpochSteps,
        done: Materialized,
        inputs_seen: Mapping[str, dict[str, Any] | None],
        feedback: Mapping[str, DataFrame],
        work: Callable[[str], bool],
    ) -> EpochMarks:
        """Advance the watermarks after epoch ``epoch`` and keep the steps' new state."""
        self.max_seen = _later(self.max_seen, inputs_seen)
        self.feedback_min = {}
        for name, df in feedback.items():
            value = done.aggregates.get(id(df), {}).get(MIN_EVENT)
            if work(name) and value is not None:
                self.feedback_min[name] = int(value)
        gone = sorted(set(self.steps) - set(steps.steps))
        if gone:
            raise IterflowValueError(
                f"epoch {epoch}: step '{gone[0]}' ran in the epoch before but not in this "
                "one; its state would be lost. Call every ctx.window/ctx.join in every "
                "epoch (on an empty DataFrame if need be)"
            )
        self._tell_idle()
        outcomes = steps.outcomes(done)
        steps.release()
        loop_input = max(self.loop_input, self._input_now())
        for name, outcome in outcomes.items():  # in the order the steps ran
            self._advance(name, outcome, loop_input)
        self.loop = max(
            self.loop, min([loop_input, *(m.output_watermark for m in self.steps.values())])
        )
        watermarks = {name: to_datetime(self.source_watermark(name)) for name in self.sources}
        watermarks.update({name: to_datetime(m.output_watermark) for name, m in self.steps.items()})
        watermarks["loop"] = to_datetime(self.loop)
        return EpochMarks(
            watermarks=watermarks,
            late_rows={name: o.late_rows for name, o in outcomes.items()},
            state_rows={name: o.state_rows for name, o in outcomes.items()},
        )

    def _advance(self, name: str, outcome: StepOutcome, loop_input: int) -> None:
        before = self.steps.get(name)
        marks = StepMarks(
            kind=outcome.kind,
            spec=outcome.spec,
            upstream=outcome.upstream,
            input_watermark=outcome.input_watermark,
            output_watermark=MIN_US if before is None else before.output_watermark,
            due=outcome.due,
            state_rows=outcome.state_rows,
            parts=tuple(outcome.frames),
        )
        hold = MAX_US if outcome.hold is None else outcome.hold
        upcoming = self._next_input(marks, loop_input)
        marks.output_watermark = max(marks.output_watermark, min(upcoming, hold))
        self.steps[name] = marks
        self.frames[name] = dict(outcome.frames)

    # -- commits ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What a commit keeps of the watermarks (the steps' state rows go separately)."""
        return {
            "policy": self.policy,
            "max_seen": dict(self.max_seen),
            "feedback_min": dict(self.feedback_min),
            "loop_input": self.loop_input,
            "loop": self.loop,
            "steps": {name: attrs.asdict(marks) for name, marks in self.steps.items()},
        }

    def state_frames(self) -> dict[str, DataFrame]:
        """The steps' state rows, by the name a commit stores them under."""
        return {
            stored_name(step, part): df
            for step, parts in self.frames.items()
            for part, df in parts.items()
        }

    def restore(self, snapshot: Mapping[str, Any], frames: Mapping[str, DataFrame]) -> None:
        committed = snapshot.get("policy", "min")  # commits before it was kept: the default
        if committed != self.policy:
            log.warning(
                "%s is '%s', but the commit this restart continues from combined the "
                "inputs' watermarks by '%s'; it goes on with '%s' (as a Spark checkpoint "
                "keeps its own); start at a new checkpoint_location to change it",
                WATERMARK_POLICY_CONF,
                self.policy,
                committed,
                committed,
            )
            self.policy = committed
        self.max_seen = dict(snapshot["max_seen"])
        self.feedback_min = dict(snapshot["feedback_min"])
        self.loop_input = int(snapshot["loop_input"])
        self.loop = int(snapshot["loop"])
        self.steps = {
            name: StepMarks(
                **{**fields, "upstream": tuple(fields["upstream"]), "parts": tuple(fields["parts"])}
            )
            for name, fields in snapshot["steps"].items()
        }
        self.frames = {
            name: {part: frames[stored_name(name, part)] for part in marks.parts}
            for name, marks in self.steps.items()
        }


def _later(
    max_seen: Mapping[str, int], observed: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, int]:
    """The latest event time of each input: ``max_seen``, moved on by what the epoch's
    jobs ``observed`` of its new rows (``MAX_EVENT``; only streaming inputs have one)."""
    later = dict(max_seen)
    for name, metrics in observed.items():
        latest = (metrics or {}).get(MAX_EVENT)
        if latest is not None:
            later[name] = max(later.get(name, MIN_US), int(latest))
    return later


def stored_name(step: str, part: str) -> str:
    """The name a step's state part is committed under (step names are identifiers)."""
    return f"{step}__{part}"
