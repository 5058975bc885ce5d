"""The event-time steps of one epoch: ``ctx.window`` and ``ctx.join`` on Spark.

A step keeps state from epoch to epoch (the rows of its open windows, the rows
of each join side that may still match) and has its own input watermark, given
by the loop (``iterflow.unbounded.event_time``) when the epoch starts: the
minimum of the loop's input watermark and the output watermarks of the steps its
rows come from. Those are found by lineage, not by reading plan text: the leaves of
a DataFrame's plan (a scan, local rows, a checkpoint, a micro-batch) say where its
rows come from, and a step's rows come from a step before it when they share a leaf
with that step's output. A checkpoint or a DataFrame rebuilt from collected rows
(``localCheckpoint``, ``spark.createDataFrame(df.rdd, ...)``, ``toPandas`` and back)
is a new leaf, which neither the epoch's inputs nor any step's output has: rows of
unknown origin may come from any step before, so every one of them holds the step
back (its watermark can only be lower than the exact one: later firings, never rows
dropped as late that came in time). In the epoch, the step

- drops the new rows that are too late (a window step: every window the row is
  assigned to has ended ``allowed_lateness`` before the watermark; a join step: the
  row is older than the watermark) into its late rows (``ctx.late(name)``);
- emits what the watermark lets it: the rows of each window whose end it passed
  (first firing) and of each such window that got new rows since (a late firing,
  an update), or every pair of rows of the two join sides, one of them new, within
  ``within`` of each other;
- keeps what a later epoch may still need, as its new state, with the earliest event
  time it still holds (the step's watermark hold) and the end of its next window to
  fire.

A window step costs one Spark job of its own: on the driver (``driver_windows``, for a
small state and small new rows) the job that reads its new rows; planned in Spark, the
checkpoint of its new rows with its state's, grouped by window, which the epoch's output
and the next epoch's state are plans over (its state's rows, hold and due ride on the
job that reads the output). A join step materializes its state with the epoch's
feedback, its hold riding on that job.

Event times are handled in microseconds since the Unix epoch (``unix_micros``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iterflow.durations import duration_us
from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.runtime.datacache.driver_variables import held_frame, to_arrow
from iterflow.runtime.round.materialize import Materialized, observe_rows
from iterflow.runtime.round.materialize import unique_observation as _observation
from iterflow.runtime.spark.jvm import (
    await_observations,
    deliver_observations,
    estimated_bytes,
    is_classic,
    plan_leaves,
    release_local_checkpoint,
    undelivered_observations,
)
from iterflow.runtime.spark.observations import observed_metrics
from iterflow.runtime.spark.planning import static_planning
from iterflow.runtime.spark.schema import has_user_type, quoted, quoted_name
from iterflow.unbounded.driver_windows import (
    DRIVER_WINDOW_BYTES,
    Windowed,
    can_window,
    output_schema,
    state_schema,
    windowed,
)
from iterflow.unbounded.window_columns import (
    DIRTY,
    LATE,
    NEW,
    PANE,
    PANE_OUT,
    SIDE,
    TS,
    WE,
    WINDOW,
    WINDOW_END,
    WS,
)
from iterflow.windows import (
    MIN_US,
    FixedWindows,
    SessionWindows,
    SlidingWindows,
    WindowFn,
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: A window step whose state had at most this many rows after the epoch before may run
#: on the driver (``driver_windows``), which then holds its state.
HELD_STATE_ROWS = 10_000

log = logging.getLogger("iterflow.unbounded")


@attrs.frozen(kw_only=True)
class PreviousStep:
    """What a step left after the previous epoch: its state and watermarks."""

    kind: str
    spec: str
    frames: Mapping[str, DataFrame]  # part -> state rows
    input_watermark: int
    output_watermark: int
    state_rows: int = HELD_STATE_ROWS + 1  # unknown: kept in Spark


@attrs.frozen(kw_only=True)
class StepOutcome:
    """What a step did in an epoch, once the epoch's jobs ran."""

    kind: str
    spec: str
    upstream: tuple[str, ...]
    input_watermark: int
    frames: dict[str, DataFrame]  # part -> its new state (materialized)
    state_rows: int
    late_rows: int
    hold: int | None  # the earliest event time the state holds for a later first firing
    due: int | None  # the end of the next window to fire


@attrs.define(kw_only=True)
class _Step:
    name: str
    kind: str
    spec: str
    upstream: tuple[str, ...]
    input_watermark: int
    output: DataFrame  # what the step returned: its leaves tell later steps they read it
    states: dict[str, DataFrame]  # part -> new state, to materialize
    state_metrics: dict[str, list[Column]]
    late: Callable[[], DataFrame]  # the rows dropped as too late (made when asked for)
    late_observations: list[Observation]
    held: Windowed | None = None  # what the step did on the driver, if it ran there
    #: A window step planned in Spark: the observation of its state's rows, hold and due
    #: on the job that reads its output, the checkpoint they are of, and the aggregates.
    marks: tuple[Observation, DataFrame, list[Column]] | None = None


class EpochSteps:
    """The ``ctx.window``/``ctx.join`` steps of epoch ``epoch`` (see the module's docstring).

    ``event_columns`` maps each input bound with ``event_time=`` to its column;
    ``loop_watermark`` is the loop's input watermark for this epoch; ``previous`` what
    each step left after the previous epoch; ``reserved`` names no step may take;
    ``inputs`` are the DataFrames the body gets this epoch; ``told`` the steps already
    logged as reading rows of unknown origin in this run; ``fresh`` whether the epoch
    has new input rows.
    """

    def __init__(
        self,
        epoch: int,
        *,
        event_columns: Mapping[str, str],
        loop_watermark: int,
        previous: Mapping[str, PreviousStep],
        reserved: Sequence[str],
        inputs: Iterable[DataFrame] = (),
        told: set[str] | None = None,
        firing: Callable[[], int] | None = None,
        fresh: bool = True,
    ) -> None:
        self.epoch = epoch
        self.event_columns = dict(event_columns)
        self.loop_watermark = loop_watermark
        self.previous = dict(previous)
        self.reserved = set(reserved)
        self._checkpoints: list[DataFrame] = []  # released at the epoch's end
        self._kept: list[DataFrame] = []  # released with the round's results (``kept``)
        #: Observations read another way when a job does not deliver them (``marks``).
        self._optional: set[str] = set()
        self.steps: dict[str, _Step] = {}
        self._inputs = list(inputs)
        self._leaves: dict[str, frozenset[int]] = {}  # "" the inputs', else a step's output's
        self._told = set() if told is None else told
        self._firing = firing  # the loop's watermark with this epoch's rows, once read
        self.fresh = fresh  # the epoch has new input rows

    # -- building ----------------------------------------------------------------------

    def window(
        self,
        df: DataFrame,
        window: WindowFn,
        allowed_lateness: Any,
        *,
        by: str | Sequence[str] | None,
        event_time: str | None,
        name: str | None,
    ) -> DataFrame:
        step = self._name(name, "window")
        where = f"epoch {self.epoch}: ctx.window('{step}')"
        lateness, keys, event, columns = self._window_args(
            df, window, allowed_lateness, by, event_time, where
        )
        spec = f"window {window!r} lateness={lateness} by={keys} event_time={event}"
        watermark, upstream = self._input_watermark(step, "window", spec, df, where)
        # The new rows with their event time, assigned to windows; late ones flagged.
        timed = df.select(*map(quoted, columns), _event_us(event).alias(TS))
        held = self._held_state(step, window, keys, timed)
        if held is not None:
            step_args = (step, spec, upstream, watermark)
            return self._window_on_driver(step_args, timed, held, window, keys, lateness)
        return self._window_in_spark(
            (step, spec, upstream, watermark), timed, window, keys, lateness, where
        )

    def _window_in_spark(
        self,
        step_args: tuple[str, str, tuple[str, ...], int],
        timed: DataFrame,
        window: WindowFn,
        keys: list[str],
        lateness: int,
        where: str,
    ) -> DataFrame:
        """Window step ``step`` in this epoch, planned in Spark, with one job of its own:
        the new rows ``timed``, flagged late or not, with the state's rows, each with its
        window's pane and dirtiness, checkpointed (``grouped``: what this epoch's output
        and the next epoch's state read). Its new state is a plan over that checkpoint;
        the state's rows, hold and due are observed on the job that reads the output."""
        step, spec, upstream, watermark = step_args
        columns = [c for c in timed.columns if c != TS]
        late_flag = F.col(WS).isNull()
        if watermark > MIN_US:
            late_flag = late_flag | (F.col(WE) + F.lit(lateness) <= F.lit(watermark))
        fresh = (
            _assigned(timed, window, columns)
            .withColumn(PANE, F.lit(0))
            .withColumn(DIRTY, F.lit(True))
            .withColumn(LATE, late_flag)
        )
        state = self._state(step, "state", fresh.drop(LATE), where)
        rows = fresh if state is None else state.withColumn(LATE, F.lit(False)).unionByName(fresh)
        if window.merging:
            rows = _merged(rows, keys)
        counted = _observation("late")
        grouped = self._checkpoint(_grouped(rows, columns, keys), counted, kept=True)
        fire_at = self._fire_at(upstream, watermark)
        on_time = ~F.col(LATE)
        fires = (
            on_time & F.col(DIRTY) & (F.col(WE) <= F.lit(fire_at))
            if fire_at > MIN_US
            else F.lit(False)
        )
        keep = on_time & (F.col(WE) + F.lit(lateness) > F.lit(fire_at))
        pane = F.col(PANE) + fires.cast("int")
        marks = [
            F.sum(keep.cast("long")).alias("rows"),
            F.min(F.when(keep & (pane == 0), F.col(TS))).alias("hold"),
            F.min(F.when(keep & F.col(DIRTY) & ~fires, F.col(WE))).alias("due"),
        ]
        observation = _observation("state")
        self._optional.add(str(observation._name))
        output = (
            grouped.observe(observation, *marks)
            .where(fires)
            .select(
                *map(quoted, columns), _window_struct().alias(WINDOW), F.col(PANE).alias(PANE_OUT)
            )
        )
        new_state = grouped.where(keep).select(
            *map(quoted, columns),
            TS,
            WS,
            WE,
            pane.alias(PANE),
            (F.col(DIRTY) & ~fires).alias(DIRTY),
        )
        self.steps[step] = _Step(
            name=step,
            kind="window",
            spec=spec,
            upstream=upstream,
            input_watermark=fire_at,
            output=output,
            states={"state": new_state},
            state_metrics={},
            late=lambda: grouped.where(F.col(LATE)).select(
                *map(quoted, columns), _window_struct().alias(WINDOW)
            ),
            late_observations=[counted],
            marks=(observation, grouped, marks),
        )
        return output

    def _held_state(
        self, step: str, window: WindowFn, keys: list[str], timed: DataFrame
    ) -> pa.Table | None:
        """The state of window step ``step`` on the driver (an empty table in its first
        epoch), when the step runs there in this epoch (``driver_windows``): its state is
        small (``HELD_STATE_ROWS``), its window and keys are ones the driver handles, and
        Spark estimates the new rows ``timed`` small. A state the driver does not hold yet
        (the step ran in Spark, or a restart read it) is collected, one job, once. None:
        the step is planned in Spark."""
        previous = self.previous.get(step)
        frame = None if previous is None else previous.frames.get("state")
        if previous is not None and frame is not None and previous.state_rows > HELD_STATE_ROWS:
            return None
        if not (is_classic(timed.sparkSession) and can_window(window, keys, timed.schema)):
            return None
        if has_user_type(timed.schema):
            return None
        size = estimated_bytes(timed)
        if size is None or size > DRIVER_WINDOW_BYTES:
            return None
        return pa.table({}) if frame is None else to_arrow(frame)

    def _window_on_driver(
        self,
        step_args: tuple[str, str, tuple[str, ...], int],
        timed: DataFrame,
        state: pa.Table,
        window: WindowFn,
        keys: list[str],
        lateness: int,
    ) -> DataFrame:
        """Window step ``step`` in this epoch on the driver (``driver_windows``): one job
        reads its new rows ``timed``; its output, late rows and new ``state`` are rows held
        on the driver."""
        step, spec, upstream, watermark = step_args
        counted = _observation("rows")
        new = observe_rows(timed, counted).toArrow()
        await_observations([counted])  # and the inputs' latest event time, on the same job
        fire_at = self._fire_at(upstream, watermark)
        done = windowed(
            new,
            state,
            window,
            keys=keys,
            lateness=lateness,
            watermark=watermark,
            fire_at=fire_at,
        )
        spark = timed.sparkSession
        columns = StructType([f for f in timed.schema.fields if f.name != TS])
        output = held_frame(spark, done.output, output_schema(columns))
        new_state = held_frame(spark, done.state, state_schema(timed.schema))
        self.steps[step] = _Step(
            name=step,
            kind="window",
            spec=spec,
            upstream=upstream,
            input_watermark=fire_at,
            output=output,
            states={"state": new_state},
            state_metrics={},
            late=lambda: held_frame(spark, done.late, output_schema(columns, pane=False)),
            late_observations=[],
            held=done,
        )
        return output

    def _window_args(
        self,
        df: DataFrame,
        window: Any,
        allowed_lateness: Any,
        by: str | Sequence[str] | None,
        event_time: str | None,
        where: str,
    ) -> tuple[int, list[str], str, list[str]]:
        """``ctx.window``'s arguments, checked: the allowed lateness in microseconds, the
        key columns, the event-time column, and the columns the rows keep."""
        if not isinstance(df, DataFrame):
            raise IterflowTypeError(f"{where} takes a DataFrame, got {type(df).__name__}")
        if not isinstance(window, WindowFn):
            raise IterflowTypeError(
                f"{where}: window must be itf.FixedWindows, itf.SlidingWindows, "
                f"itf.SessionWindows or an itf.WindowFn subclass, got {type(window).__name__}"
            )
        lateness = (
            0
            if allowed_lateness is None
            else duration_us(allowed_lateness, f"{where}: allowed_lateness", zero=True)
        )
        keys = _columns(by, f"{where}: by")
        event = self._event_time(df, event_time, where)
        columns = [c for c in df.columns if c not in (WINDOW, PANE_OUT)]
        missing = [k for k in keys if k not in columns]
        if missing:
            raise IterflowValueError(f"{where}: by column '{missing[0]}' is not in {columns}")
        return lateness, keys, event, columns

    def join(
        self,
        left: DataFrame,
        right: DataFrame,
        on: str | Sequence[str],
        within: Any,
        *,
        event_time: str | tuple[str, str] | None,
        name: str | None,
    ) -> DataFrame:
        step = self._name(name, "join")
        where = f"epoch {self.epoch}: ctx.join('{step}')"
        span, keys, left_event, right_event = self._join_args(
            left, right, on, within, event_time, where
        )
        shared_time = left_event == right_event and left_event != WINDOW_END
        left_cols = [c for c in left.columns if c not in keys]
        right_cols = [c for c in right.columns if c not in keys]
        clashes = sorted(
            (set(left_cols) & set(right_cols)) - ({left_event} if shared_time else set())
        )
        if clashes:
            raise IterflowValueError(
                f"{where}: both sides have a column '{clashes[0]}'; rename it on one side "
                "(only the key columns, and an event-time column of the same name, may be shared)"
            )
        spec = f"join on={keys} within={span} event_time=({left_event}, {right_event})"
        watermark, upstream = self._input_watermark(step, "join", spec, left, where, right)
        sides = {}
        counted = []
        late_rows = []
        for part, df, event in (("left", left, left_event), ("right", right, right_event)):
            timed = df.select(*map(quoted, df.columns), _event_us(event).alias(TS))
            late_flag = F.col(TS).isNull()
            if watermark > MIN_US:
                late_flag = late_flag | (F.col(TS) < F.lit(watermark))
            observation = _observation("late")
            counted.append(observation)
            classified = self._checkpoint(timed.withColumn(LATE, late_flag), observation)
            late_rows.append(
                classified.where(F.col(LATE)).drop(LATE, TS).withColumn(SIDE, F.lit(part))
            )
            fresh = classified.where(~F.col(LATE)).drop(LATE)
            state = self._state(step, part, fresh, where)
            rows = fresh.withColumn(NEW, F.lit(True))
            sides[part] = (
                rows if state is None else state.withColumn(NEW, F.lit(False)).unionByName(rows)
            )
        events = (left_event, right_event)
        output = _joined(sides, (left.columns, right.columns), keys, span, events, shared_time)
        states = {}
        for part, rows in sides.items():
            kept = (
                rows
                if watermark <= MIN_US
                else rows.where(F.col(TS) + F.lit(span) >= F.lit(watermark))
            )
            states[part] = kept.drop(NEW)
        late = late_rows[0].unionByName(late_rows[1], allowMissingColumns=True)
        self.steps[step] = _Step(
            name=step,
            kind="join",
            spec=spec,
            upstream=upstream,
            input_watermark=watermark,
            output=output,
            states=states,
            state_metrics={part: [F.min(TS).alias("hold")] for part in states},
            late=lambda: late.select(
                SIDE, *[c for c in late.columns if c != SIDE]
            ).withColumnRenamed(SIDE, "side"),
            late_observations=counted,
        )
        return output

    def _join_args(
        self,
        left: DataFrame,
        right: DataFrame,
        on: str | Sequence[str],
        within: Any,
        event_time: str | tuple[str, str] | None,
        where: str,
    ) -> tuple[int, list[str], str, str]:
        """``ctx.join``'s arguments, checked: ``within`` in microseconds, the key columns,
        and each side's event-time column."""
        for side, df in (("left", left), ("right", right)):
            if not isinstance(df, DataFrame):
                raise IterflowTypeError(
                    f"{where}: {side} must be a DataFrame, got {type(df).__name__}"
                )
        if within is None:
            raise IterflowValueError(
                f"{where}: within= is required: how far apart in event time two rows may be "
                "to join (e.g. within='10 minutes'); it bounds the state the join keeps"
            )
        span = duration_us(within, f"{where}: within", zero=True)
        keys = _columns(on, f"{where}: on")
        if not keys:
            raise IterflowValueError(f"{where}: on= names no column; join on at least one key")
        left_time, right_time = (
            (event_time, event_time)
            if event_time is None or isinstance(event_time, str)
            else tuple(event_time)
        )
        left_event = self._event_time(left, left_time, f"{where} (left)")
        right_event = self._event_time(right, right_time, f"{where} (right)")
        for side, df in (("left", left), ("right", right)):
            missing = [k for k in keys if k not in df.columns]
            if missing:
                raise IterflowValueError(
                    f"{where}: key '{missing[0]}' is not a column of the {side} side {df.columns}"
                )
        return span, keys, left_event, right_event

    def late(self, name: str) -> DataFrame:
        """The rows step ``name`` dropped as too late in this epoch."""
        step = self.steps.get(name)
        if step is None:
            known = sorted(self.steps) or "none yet"
            raise IterflowValueError(
                f"epoch {self.epoch}: ctx.late('{name}'): no step of that name ran in this "
                f"epoch before it (steps so far: {known}); call ctx.late after the "
                "ctx.window/ctx.join it names"
            )
        return step.late()

    # -- the epoch's end ------------------------------------------------------------------

    def targets(self) -> tuple[list[DataFrame], dict[int, list[Column]]]:
        """The steps' new states to materialize with the epoch (a join step's), and what
        to aggregate over each one on the same job. A window step's state needs no job
        of its own: it ran on the driver, or it is a plan over its checkpoint."""
        frames, metrics = [], {}
        for step in self.steps.values():
            if step.kind == "window":
                continue
            for part, df in step.states.items():
                frames.append(df)
                metrics[id(df)] = step.state_metrics[part]
        return frames, metrics

    def outcomes(self, done: Materialized) -> dict[str, StepOutcome]:
        """What each step did, from the epoch's materialization ``done`` (or, for a step
        that ran on the driver, from what it did there)."""
        outcomes = {}
        for name, step in self.steps.items():
            if step.held is not None:
                frames, state_rows = dict(step.states), step.held.state.num_rows
                late, hold, due = step.held.late_rows, step.held.hold, step.held.due
            else:
                frames, state_rows, late, hold, due = self._materialized(step, done)
            outcomes[name] = StepOutcome(
                kind=step.kind,
                spec=step.spec,
                upstream=step.upstream,
                input_watermark=step.input_watermark,
                frames=frames,
                state_rows=state_rows,
                late_rows=late,
                hold=hold,
                due=due,
            )
        return outcomes

    @staticmethod
    def _materialized(
        step: _Step, done: Materialized
    ) -> tuple[dict[str, DataFrame], int, int, int | None, int | None]:
        """A step planned in Spark, once the epoch's jobs ran: its new state, the state's
        rows, its late rows, hold and due."""
        if step.marks is not None:
            frames = dict(step.states)
            aggregates = [_observed_marks(*step.marks)]
        else:
            frames = {part: done.frames[id(df)] for part, df in step.states.items()}
            aggregates = [
                {**done.aggregates.get(id(df), {}), "rows": done.rows[id(df)]}
                for df in step.states.values()
            ]
        holds = [a["hold"] for a in aggregates if a.get("hold") is not None]
        dues = [a["due"] for a in aggregates if a.get("due") is not None]
        late = 0
        for observation in step.late_observations:
            metrics = observed_metrics(observation) or {}
            late += int(metrics.get("late") or 0)
        state_rows = sum(int(a.get("rows") or 0) for a in aggregates)
        return frames, state_rows, late, min(holds) if holds else None, min(dues) if dues else None

    # -- helpers --------------------------------------------------------------------------

    def _name(self, name: str | None, kind: str) -> str:
        if name is None:
            name = f"{kind}_{sum(1 for s in self.steps.values() if s.kind == kind)}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise IterflowValueError(
                f"epoch {self.epoch}: ctx.{kind}(name={name!r}): a step name must be an "
                "identifier (letters, digits, _)"
            )
        if name in self.reserved:
            raise IterflowValueError(
                f"epoch {self.epoch}: ctx.{kind}(name='{name}'): the name is taken by an "
                "event-time input or the loop's watermark ('loop'); choose another"
            )
        if name in self.steps:
            raise IterflowValueError(
                f"epoch {self.epoch}: step '{name}' was called twice in one epoch; give "
                "each ctx.window/ctx.join its own name="
            )
        return name

    def _event_time(self, df: DataFrame, column: str | None, where: str) -> str:
        """The event-time column of ``df`` (``WINDOW_END`` for a window step's output)."""
        if column is None:
            declared = sorted({c for c in self.event_columns.values() if c in df.columns})
            if len(declared) > 1:
                raise IterflowValueError(
                    f"{where}: the rows have several event-time columns {declared}; "
                    "say which with event_time="
                )
            if declared:
                column = declared[0]
            elif _is_window(df):
                return WINDOW_END
            else:
                known = sorted(set(self.event_columns.values())) or "(none)"
                raise IterflowValueError(
                    f"{where}: the rows have no event-time column: none of the columns "
                    f"declared with bind(..., event_time=) {known} is among {df.columns}; "
                    "pass event_time='<column>'"
                )
        if column not in df.columns:
            raise IterflowValueError(
                f"{where}: event_time '{column}' is not a column of {df.columns}"
            )
        kind = df.schema[column].dataType
        if isinstance(kind, TimestampNTZType):
            raise IterflowTypeError(
                f"{where}: event_time '{column}' is a TIMESTAMP_NTZ, which is no instant; "
                f"cast it: F.col('{column}').cast('timestamp') (in the session's time zone)"
            )
        if not isinstance(kind, TimestampType):
            raise IterflowTypeError(
                f"{where}: event_time '{column}' is {kind.simpleString()}, not a timestamp; "
                f"make it one, e.g. F.timestamp_seconds('{column}') for seconds since the epoch"
            )
        return column

    def _input_watermark(
        self, step: str, kind: str, spec: str, df: DataFrame, where: str, *more: DataFrame
    ) -> tuple[int, tuple[str, ...]]:
        """The step's input watermark in this epoch, and the earlier steps it reads from."""
        previous = self.previous.get(step)
        if previous is not None and (previous.kind, previous.spec) != (kind, spec):
            raise IterflowValueError(
                f"{where}: the step changed since the epoch before ({previous.spec!r}, now "
                f"{spec!r}); its state holds rows of the old one. Keep a step's settings, "
                "or give the new one another name"
            )
        upstream = self._upstream(step, (df, *more))
        watermark = self._behind(self.loop_watermark, upstream)
        if previous is not None:
            watermark = max(watermark, previous.input_watermark)  # never goes back
        return watermark, upstream

    def _behind(self, loop_watermark: int, upstream: Sequence[str]) -> int:
        """``loop_watermark``, held back by the output watermarks of the ``upstream`` steps
        as they stood after the epoch before."""
        watermark = loop_watermark
        for name in upstream:
            before = self.previous.get(name)
            watermark = min(watermark, before.output_watermark if before else MIN_US)
        return watermark

    def _fire_at(self, upstream: Sequence[str], watermark: int) -> int:
        """The watermark a window step fires and evicts under: its input ``watermark``, or,
        once the epoch's first job read the new rows, the one they make (``firing``)."""
        if self._firing is None:
            return watermark
        return max(watermark, self._behind(self._firing(), upstream))

    def _upstream(self, step: str, frames: Sequence[DataFrame]) -> tuple[str, ...]:
        """The steps before ``step`` in this epoch whose output ``frames`` read: those they
        share a leaf with, or all of them when a leaf is of unknown origin."""
        if not self.steps:
            return ()
        leaves: set[int] = set()
        for frame in frames:
            found = plan_leaves(frame)
            if found is None:  # no plan to follow (not on a classic session): assume any
                return tuple(self.steps)
            leaves |= found
        upstream = tuple(name for name in self.steps if self._leaves_of(name) & leaves)
        known = set(self._leaves_of(""))
        for name in self.steps:
            known |= self._leaves_of(name)
        if leaves <= known:
            return upstream
        if step not in self._told:
            self._told.add(step)
            log.info(
                "epoch %d: step '%s' reads rows that come from neither the epoch's inputs "
                "nor a step's output as returned (a checkpoint, a DataFrame rebuilt from "
                "collected rows, or one made in the body), so every step before it holds "
                "its watermark: %s. Its windows may fire later than they would otherwise; "
                "bind a table made outside the body as a data input to avoid it",
                self.epoch,
                step,
                list(self.steps),
            )
        return tuple(self.steps)

    def _leaves_of(self, name: str) -> frozenset[int]:
        """The leaves of step ``name``'s output, or of the epoch's inputs for ``""``."""
        if name not in self._leaves:
            frames = self._inputs if name == "" else [self.steps[name].output]
            found: set[int] = set()
            for frame in frames:
                found |= plan_leaves(frame) or frozenset()
            self._leaves[name] = frozenset(found)
        return self._leaves[name]

    def _state(self, step: str, part: str, fresh: DataFrame, where: str) -> DataFrame | None:
        previous = self.previous.get(step)
        if previous is None or part not in previous.frames:
            return None
        state = previous.frames[part]
        if _shape(state.schema) != _shape(fresh.schema):
            raise IterflowValueError(
                f"{where}: the rows' columns changed since the epoch before: now "
                f"{fresh.schema.simpleString()}, its state holds "
                f"{state.schema.simpleString()}. Keep a step's columns, or give the new "
                "one another name"
            )
        return state.select(*map(quoted, fresh.columns))

    def _checkpoint(
        self, classified: DataFrame, observation: Observation, kept: bool = False
    ) -> DataFrame:
        """``classified`` (the new rows, each flagged late or not) evaluated now, once, with
        its late rows counted: what the step's later plans read. Its own job also runs
        the observations in the rows' plan (a cache would hide them from Spark's
        accounting of observed metrics), such as the input rows' count. ``kept``: the
        next epoch reads it too (a window step's state), so the round holds it as it
        holds its own results (``kept()``), not only until the epoch's end."""
        observed = observe_rows(
            classified, observation, F.sum(F.col(LATE).cast("long")).alias("late")
        )
        with static_planning(observed.sparkSession):  # one job, its shuffle a stage of it
            checkpoint = observed.localCheckpoint(eager=True)
        deliver_observations(observed)  # over Spark Connect: the plan's observations too
        # An epoch without new rows needs none of them (and Spark may prune the empty
        # rows' branch, their observation with it).
        missing = [n for n in undelivered_observations(observed) if n not in self._optional]
        if missing and self.fresh:
            raise IterflowError(
                "event time over this Spark Connect server: after the step's job it "
                f"reported no metrics for the observations {missing} inside its plan "
                "(Spark 4.0's Connect server reports only the outermost one), and the "
                "watermarks need them (the latest event time of the new rows). Use a newer "
                "Spark for the server (4.3 reports them), or a classic session"
            )
        await_observations([observation])
        (self._kept if kept else self._checkpoints).append(checkpoint)
        return checkpoint

    def kept(self) -> list[DataFrame]:
        """The checkpoints the next epoch reads (its window steps' state is a plan over
        them), for the round to hold until the next one completes."""
        return list(self._kept)

    def release(self) -> None:
        """Release the steps' evaluated new rows (once the epoch has been materialized)."""
        for checkpoint in self._checkpoints:
            release_local_checkpoint(checkpoint)
        self._checkpoints = []


def _observed_marks(
    observation: Observation, grouped: DataFrame, metrics: list[Column]
) -> dict[str, Any]:
    """A window step's state rows, hold and due (``metrics``), as observed on the job
    that read its output; from a job of their own over its checkpoint ``grouped`` when
    no job did (the body did not use the output, or a cache hid the observation)."""
    await_observations([observation])
    observed = observed_metrics(observation)
    if observed is not None:
        return observed
    first = grouped.agg(*metrics).first()
    return first.asDict() if first is not None else {}


def _grouped(rows: DataFrame, columns: list[str], keys: list[str]) -> DataFrame:
    """A window step's rows (late ones flagged), each with its window's pane (the highest
    of its rows') and dirtiness (whether it holds rows it has not emitted: all of them
    before its first firing, and late ones, or a session grown by new rows, later). Late
    rows form windows of their own, which never fire."""
    by_window = Window.partitionBy(*map(quoted, keys), WS, WE, LATE)
    pane = F.max(PANE).over(by_window)
    dirty = F.max(F.col(DIRTY).cast("int")).over(by_window) == 1
    return rows.select(
        *map(quoted, columns), TS, WS, WE, pane.alias(PANE), dirty.alias(DIRTY), LATE
    )


def _joined(
    sides: dict[str, DataFrame],
    columns: tuple[list[str], list[str]],
    keys: list[str],
    span: int,
    events: tuple[str, str],
    shared_time: bool,
) -> DataFrame:
    """A join step's output: the pairs of its two sides' rows (state and new, at least one
    of them new) with equal keys and event times at most ``span`` apart; a shared
    event-time column (``shared_time``) takes the later of the two. ``columns`` and
    ``events`` are each side's columns and event-time column."""
    (left_event, right_event), right_columns = events, columns[1]
    left_cols = [c for c in columns[0] if c not in keys]
    right_cols = [c for c in right_columns if c not in keys]
    left_rows = sides["left"]
    renamed = {c: f"_iterflow_right_{i}" for i, c in enumerate([*right_columns, TS, NEW])}
    right_rows = sides["right"].select(*[quoted(c).alias(n) for c, n in renamed.items()])
    condition = F.lit(True)
    for key in keys:
        condition = condition & (quoted(key) == F.col(renamed[key]))
    condition = (
        condition
        & (F.abs(F.col(TS) - F.col(renamed[TS])) <= F.lit(span))
        & (F.col(NEW) | F.col(renamed[NEW]))
    )
    joined = left_rows.join(right_rows, condition, "inner")
    selected = [quoted(k) for k in keys]
    for column in left_cols:
        if shared_time and column == left_event:
            selected.append(F.greatest(quoted_name(column), renamed[column]).alias(column))
        else:
            selected.append(quoted(column))
    selected += [
        F.col(renamed[c]).alias(c) for c in right_cols if not (shared_time and c == right_event)
    ]
    return joined.select(*selected)


def _columns(value: str | Sequence[str] | None, what: str) -> list[str]:
    if value is None:
        return []
    columns = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(c, str) for c in columns):
        raise IterflowTypeError(f"{what} takes column names (str or a list of str), got {value!r}")
    return columns


def _shape(schema: StructType) -> list[tuple[str, str]]:
    return sorted((f.name, f.dataType.simpleString()) for f in schema.fields)


def _is_window(df: DataFrame) -> bool:
    if WINDOW not in df.columns:
        return False
    kind = df.schema[WINDOW].dataType
    return isinstance(kind, StructType) and {"start", "end"} <= set(kind.fieldNames())


def _event_us(column: str) -> Column:
    if column == WINDOW_END:
        return F.unix_micros(F.col(WINDOW).getField("end")) - F.lit(1)
    return F.unix_micros(quoted(column))


def _window_struct() -> Column:
    return F.struct(
        F.timestamp_micros(F.col(WS)).alias("start"), F.timestamp_micros(F.col(WE)).alias("end")
    )


_BOUNDS = ArrayType(StructType([StructField("start", LongType()), StructField("end", LongType())]))


def _assigned(timed: DataFrame, window: WindowFn, columns: list[str]) -> DataFrame:
    """``timed`` (the rows and their event time ``TS``) with one row per window each is in,
    in one pass over the rows; a row with no event time once, in no window (null bounds)."""
    ts = F.col(TS)
    if isinstance(window, FixedWindows):
        start = ts - F.pmod(ts - F.lit(window.offset_us), F.lit(window.size_us))
        return timed.withColumn(WS, start).withColumn(WE, F.col(WS) + F.lit(window.size_us))
    if isinstance(window, SlidingWindows):
        last = ts - F.pmod(ts - F.lit(window.offset_us), F.lit(window.every_us))
        first = last - F.lit((window.windows_per_row - 1) * window.every_us)
        starts = F.sequence(first, last, F.lit(window.every_us))
        return (
            timed.withColumn(WS, F.explode(_or_null(starts, LongType())))
            .where((F.col(WS) + F.lit(window.size_us) > ts) | ts.isNull())
            .withColumn(WE, F.col(WS) + F.lit(window.size_us))
        )
    if isinstance(window, SessionWindows):
        return timed.withColumn(WS, ts).withColumn(WE, ts + F.lit(window.gap_us))
    # No type hints (PySpark would read them); a null time is never assigned (its rows are
    # kept once by ``_or_null``, but Spark may call the UDF for every row all the same).
    assign = F.udf(lambda ts, row: None if ts is None else window.assigned_us(ts, row), _BOUNDS)
    bounds = "_iterflow_bounds"
    return (
        timed.withColumn(
            bounds,
            F.explode(_or_null(assign(ts, F.struct(*map(quoted, columns))), _BOUNDS.elementType)),
        )
        .withColumn(WS, F.col(bounds).getField("start"))
        .withColumn(WE, F.col(bounds).getField("end"))
        .drop(bounds)
    )


def _or_null(windows: Column, element: Any) -> Column:
    """``windows`` (an array, one element per window) for a row with an event time, and
    one null element for a row without (so that exploding it keeps the row once)."""
    return F.when(F.col(TS).isNull(), F.array(F.lit(None).cast(element))).otherwise(windows)


def _merged(rows: DataFrame, keys: list[str]) -> DataFrame:
    """Session windows: the windows of each key that overlap, merged into one (their
    earliest start to their latest end); touching windows stay apart. Late rows keep
    their own windows (what ``ctx.late`` shows)."""
    by_key = [*map(quoted, keys), F.col(LATE)]
    order = Window.partitionBy(*by_key).orderBy(WS, WE)
    before = F.max(WE).over(order.rowsBetween(Window.unboundedPreceding, -1))
    opens = F.when(before.isNull() | (F.col(WS) >= before), 1).otherwise(0)
    session = "_iterflow_session"
    numbered = rows.withColumn(
        session, F.sum(opens).over(order.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    )
    merged = Window.partitionBy(*by_key, session)
    late = F.col(LATE)
    return (
        numbered.withColumn(WS, F.when(late, F.col(WS)).otherwise(F.min(WS).over(merged)))
        .withColumn(WE, F.when(late, F.col(WE)).otherwise(F.max(WE).over(merged)))
        .drop(session)
    )
