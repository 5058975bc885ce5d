"""A window step run on the driver: ``ctx.window``'s semantics on Arrow tables.

Planned in Spark (``event_steps``), a window step costs two jobs of its own per epoch
(its new rows evaluated with their late count and latest event time, then its new
state) and a shuffle for its window functions, where a Structured Streaming
micro-batch runs one job. When the step's state is held on the driver already (small
after the epoch before) and Spark estimates its new rows small
(``DRIVER_WINDOW_BYTES``), the step reads the new rows with one job (``toArrow``, which
also delivers the observations in their plan: the latest event time the step fires
under) and does the rest here with numpy: assigning windows, flagging late rows,
merging sessions, firing, evicting. Its output and new state are DataFrames over rows
held on the driver: the body's plans start from them with no job before, and a commit
writes the state without one.

It gives what the Spark plans give, row for row (the event-time tests run both ways),
and keeps the state in the same shape, so that either way may continue the other's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iterflow.unbounded.window_columns import DIRTY, PANE, PANE_OUT, TS, WE, WINDOW, WS
from iterflow.windows import MIN_US, FixedWindows, SessionWindows, SlidingWindows, WindowFn

#: New rows Spark estimates at most this large (bytes) are windowed on the driver.
DRIVER_WINDOW_BYTES = 16 * 2**20

#: Key types whose values group on the driver as Spark groups them (floating point does
#: not: Spark takes -0.0 for 0.0 and every NaN for one value; a collated string neither).
_GROUPABLE = (
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)
_UTC = pa.timestamp("us", tz="UTC")


@attrs.frozen
class Windowed:
    """What a window step did in an epoch, on the driver."""

    output: pa.Table  # the rows of the windows that fire: the columns, window, pane
    state: pa.Table  # the columns, TS, WS, WE, PANE, DIRTY: what later epochs need
    late: pa.Table  # the columns and window of the rows dropped as too late
    late_rows: int  # rows dropped as too late, once per window they were assigned to
    hold: int | None  # the earliest event time of a row whose window never fired
    due: int | None  # the end of the next window to fire


def can_window(window: WindowFn, keys: Sequence[str], schema: StructType) -> bool:
    """Whether a step with ``window`` and key columns ``keys`` over rows of ``schema`` can
    run on the driver: iterflow's own windows (a custom ``WindowFn`` runs in Spark's
    Python workers, as documented) and keys that group as in Spark."""
    if not isinstance(window, (FixedWindows, SlidingWindows, SessionWindows)):
        return False
    return all(_groupable(schema[k].dataType) for k in keys)


def _groupable(kind: DataType) -> bool:
    if isinstance(kind, StringType):
        return getattr(kind, "collation", "UTF8_BINARY") == "UTF8_BINARY"
    return isinstance(kind, _GROUPABLE)


def windowed(
    timed: pa.Table,
    state: pa.Table,
    window: WindowFn,
    *,
    keys: Sequence[str],
    lateness: int,
    watermark: int,
    fire_at: int,
) -> Windowed:
    """A window step's epoch: the new rows ``timed`` (the step's columns and ``TS``) flagged
    late under the input ``watermark``, the others added to ``state`` (no rows: none yet),
    windows merged (sessions), fired under ``fire_at`` and evicted once ``lateness`` past
    it, as ``event_steps.EpochSteps.window`` plans it in Spark."""
    columns = [c for c in timed.column_names if c != TS]
    rows = assigned(timed, window)
    late = _late(rows, lateness, watermark)
    fresh = rows.filter(pa.array(~late))
    fresh = fresh.append_column(PANE, pa.array(np.zeros(fresh.num_rows, np.int32)))
    fresh = fresh.append_column(DIRTY, pa.array(np.ones(fresh.num_rows, bool)))
    if state.num_rows:
        fresh = pa.concat_tables([state.select(fresh.column_names).cast(fresh.schema), fresh])
    ws, we, pane, dirty = _fired_groups(fresh, keys, window.merging)
    fires = (we <= fire_at) & dirty if fire_at > MIN_US else np.zeros(len(we), bool)
    keep = we + lateness > fire_at
    output = fresh.filter(pa.array(fires)).select(columns)
    bounds = (pa.array(ws[fires], pa.int64()), pa.array(we[fires], pa.int64()))
    output = output.append_column(WINDOW, _window_of(*bounds))
    output = output.append_column(PANE_OUT, pa.array(pane[fires], pa.int32()))
    kept = fresh.filter(pa.array(keep)).select([*columns, TS])
    new_state = pa.table(
        {
            **{name: kept.column(name) for name in kept.column_names},
            WS: pa.array(ws[keep], pa.int64()),
            WE: pa.array(we[keep], pa.int64()),
            PANE: pa.array((pane + fires)[keep], pa.int32()),
            DIRTY: pa.array((dirty & ~fires)[keep]),
        }
    )
    dropped = rows.filter(pa.array(late))
    marks = _marks(new_state)
    return Windowed(
        output=output,
        state=new_state,
        late=dropped.select(columns).append_column(
            WINDOW, _window_of(dropped.column(WS), dropped.column(WE))
        ),
        late_rows=dropped.num_rows,
        hold=marks["hold"],
        due=marks["due"],
    )


def assigned(timed: pa.Table, window: WindowFn) -> pa.Table:
    """``timed`` with ``WS`` and ``WE``: one row per window each row is in, and a row with
    no event time once, with null bounds (``event_steps._assigned`` in Spark)."""
    column = timed.column(TS)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    ts = column.fill_null(0).to_numpy()
    count = len(ts)
    if isinstance(window, FixedWindows):
        taken = np.arange(count)
        starts = ts - np.mod(ts - window.offset_us, window.size_us)
        size = window.size_us
    elif isinstance(window, SlidingWindows):
        per_row, size = window.windows_per_row, window.size_us
        last = ts - np.mod(ts - window.offset_us, window.every_us)
        taken = np.repeat(np.arange(count), per_row)
        starts = np.repeat(last, per_row) - np.tile(np.arange(per_row), count) * window.every_us
        first = np.tile(np.arange(per_row) == 0, count)
        keep = np.where(valid[taken], starts + size > ts[taken], first)
        taken, starts = taken[keep], starts[keep]
    else:
        assert isinstance(window, SessionWindows)
        taken, starts, size = np.arange(count), ts, window.gap_us
    missing = ~valid[taken]
    table = timed.take(pa.array(taken))
    table = table.append_column(WS, pa.array(starts, pa.int64(), mask=missing))
    return table.append_column(WE, pa.array(starts + size, pa.int64(), mask=missing))


def _late(rows: pa.Table, lateness: int, watermark: int) -> np.ndarray:
    """Each row is late: it has no window (no event time), or its window ended
    ``lateness`` before the ``watermark``."""
    end = rows.column(WE)
    late = ~end.is_valid().to_numpy(zero_copy_only=False)
    if watermark > MIN_US:
        late |= end.fill_null(0).to_numpy() + lateness <= watermark
    return late


def _fired_groups(
    rows: pa.Table, keys: Sequence[str], merging: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's window bounds (sessions merged) and its window's pane and dirtiness:
    the highest pane and whether any row of the same key and window is dirty."""
    ws = rows.column(WS).to_numpy()
    we = rows.column(WE).to_numpy()
    key = _key_ids(rows, keys)
    if merging:
        ws, we = _merged(key, ws, we)
    if not len(ws):
        return ws, we, np.zeros(0, np.int32), np.zeros(0, bool)
    _, group = np.unique(np.stack([key, ws, we], axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    groups = int(group.max()) + 1
    pane = np.zeros(groups, np.int32)
    np.maximum.at(pane, group, rows.column(PANE).to_numpy())
    dirty = np.zeros(groups, bool)
    np.logical_or.at(dirty, group, rows.column(DIRTY).to_numpy(zero_copy_only=False))
    return ws, we, pane[group], dirty[group]


def _key_ids(rows: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """One integer per row, equal for rows of equal keys (a null key is a key)."""
    if not keys:
        return np.zeros(rows.num_rows, np.int64)
    codes = []
    for name in keys:
        encoded = pc.dictionary_encode(rows.column(name).combine_chunks(), null_encoding="encode")
        codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
    if len(codes) == 1:
        return codes[0]
    _, ids = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
    return np.asarray(ids.reshape(-1), np.int64)


def _merged(key: np.ndarray, ws: np.ndarray, we: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Session windows: the windows of each key that overlap, merged into one (their
    earliest start to their latest end); touching windows stay apart."""
    if not len(ws):
        return ws, we
    order = np.lexsort((we, ws, key))
    k, s, e = key[order], ws[order], we[order]
    reach = pd.Series(e).groupby(k, sort=False).cummax().to_numpy()
    first = np.r_[True, k[1:] != k[:-1]]
    before = np.r_[np.int64(0), reach[:-1]]
    opens = first | (s >= before)
    starts = np.flatnonzero(opens)
    session = np.cumsum(opens) - 1
    merged_ws, merged_we = np.empty_like(ws), np.empty_like(we)
    merged_ws[order] = np.minimum.reduceat(s, starts)[session]
    merged_we[order] = np.maximum.reduceat(e, starts)[session]
    return merged_ws, merged_we


def _window_of(starts: Any, ends: Any) -> pa.StructArray:
    """The ``window`` column: a struct of the bounds as timestamps (null bounds stay null)."""
    start, end = (
        (b.combine_chunks() if isinstance(b, pa.ChunkedArray) else b).cast(_UTC)
        for b in (starts, ends)
    )
    return pa.StructArray.from_arrays([start, end], names=["start", "end"])


def _marks(table: pa.Table) -> dict[str, Any]:
    """A window step's hold and due from its state's rows: the earliest event time of a
    row whose window never fired, and the end of the next window to fire."""
    unfired = pc.equal(table.column(PANE), 0)
    return {
        "hold": pc.min(pc.filter(table.column(TS), unfired)).as_py(),
        "due": pc.min(pc.filter(table.column(WE), table.column(DIRTY))).as_py(),
    }


def state_schema(timed: StructType) -> StructType:
    """The schema of a window step's state, for new rows of schema ``timed``."""
    return StructType(
        [
            *timed.fields,
            StructField(WS, LongType()),
            StructField(WE, LongType()),
            StructField(PANE, IntegerType()),
            StructField(DIRTY, BooleanType()),
        ]
    )


def output_schema(columns: StructType, pane: bool = True) -> StructType:
    """The schema of a window step's output (``pane``) or late rows, for its columns."""
    bounds = StructType(
        [StructField("start", TimestampType()), StructField("end", TimestampType())]
    )
    fields = [*columns.fields, StructField(WINDOW, bounds, nullable=False)]
    if pane:
        fields.append(StructField(PANE_OUT, IntegerType()))
    return StructType(fields)
