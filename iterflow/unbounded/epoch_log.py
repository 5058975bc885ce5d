"""The epoch log of an unbounded iteration: its commits under the checkpoint location.

A commit holds the pending variables (small ones inline in the driver state, the
others as parquet), the driver state, and the position in the stream: the last
epoch run and the id of the last micro-batch whose rows are consumed. It is taken
at an epoch boundary (``take``: the driver state pickled, the data of the pending
variables pinned) and written then or later (``write``; ``committer`` decides). A
restart continues from the last commit written whole."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iterflow.errors import IterflowValueError
from iterflow.runtime.checkpoint.format import DriverSnapshot
from iterflow.runtime.checkpoint.writer import Checkpointing
from iterflow.runtime.datacache.driver_variables import local_frame
from iterflow.runtime.round.cycle import RoundCycle
from iterflow.runtime.spark.jvm import held_on_driver
from iterflow.unbounded.event_time import EventTime, stored_name

#: Pending variables up to this many rows are committed inside the driver state
#: (one small collect) rather than as parquet (a Spark write job).
INLINE_ROWS = 10_000


@attrs.frozen(kw_only=True)
class StreamPosition:
    """Where an unbounded iteration stood at a commit (kept in the driver state)."""

    epoch: int  # the last epoch run; -1 before the first
    batch_id: int  # the last micro-batch whose rows are consumed; -1 before the first
    rows: dict[str, int]  # rows of each pending variable
    inline: dict[str, tuple[str, Any]]  # small pending variables: schema JSON, pyarrow Table
    #: The watermarks (``EventTime.snapshot``) and, under ``"inline"``, the small states of
    #: the event-time steps; None without event time.
    event_time: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class Committed:
    """The last commit written whole: its epoch and micro-batch (-1 before the first)."""

    epoch: int = -1
    batch_id: int = -1


@attrs.frozen(kw_only=True)
class Snapshot:
    """What a commit writes, taken at an epoch boundary: the driver state pickled then, the
    pending variables written as parquet, and what the round cycle keeps alive for them."""

    epoch: int
    batch_id: int
    driver: DriverSnapshot
    written: dict[str, DataFrame]
    states: dict[str, DataFrame]  # the event-time steps' large states
    pinned: list[DataFrame]


@attrs.frozen(kw_only=True)
class EpochLog:
    """What the epoch log of one unbounded run reads and writes: its ``checkpointing``, the
    round ``cycle`` (the driver-held state, and the data a commit pins), and the run's
    ``event_time`` steps, if any."""

    spark: SparkSession
    checkpointing: Checkpointing
    cycle: RoundCycle
    event_time: EventTime | None


@attrs.frozen(kw_only=True)
class Restored:
    """Where a restart continues: the last commit's epoch and micro-batch, and the
    variables pending after it."""

    epoch: int
    batch_id: int
    pending: dict[str, DataFrame]


def take(log: EpochLog, epoch: int, batch_id: int, pending: Mapping[str, DataFrame]) -> Snapshot:
    """What a commit after ``epoch`` (micro-batch ``batch_id``) writes, with the variables
    ``pending`` then (their data pinned until ``write``)."""
    variables = log.cycle.variables
    rows, tables = variables.rows, variables.tables
    small = {name for name in pending if name in tables or rows[name] <= INLINE_ROWS}
    inline, written = _packed(pending, small, tables)
    event_time, states = _event_time(log.event_time)
    position = StreamPosition(
        epoch=epoch, batch_id=batch_id, rows=dict(rows), inline=inline, event_time=event_time
    )
    driver = log.checkpointing.snapshot(log.cycle.loop.driver_state(stream=position), epoch)
    pinned = log.cycle.pin() if written or states else []
    return Snapshot(
        epoch=epoch, batch_id=batch_id, driver=driver, written=written, states=states, pinned=pinned
    )


def write(log: EpochLog, taken: Snapshot) -> None:
    """Commit ``taken`` to the epoch log (on the calling thread), then let its data go."""
    try:
        log.checkpointing.write_snapshot(taken.epoch, taken.driver, taken.written, taken.states)
    finally:
        log.cycle.unpin(taken.pinned)


def _event_time(timing: EventTime | None) -> tuple[dict[str, Any] | None, dict[str, DataFrame]]:
    """The watermarks to commit, with the small states of the event-time steps inline;
    and the large states, to write as parquet."""
    if timing is None:
        return None, {}
    snapshot = timing.snapshot()
    small = {
        stored_name(step, part)
        for step, parts in timing.frames.items()
        if timing.steps[step].state_rows <= INLINE_ROWS
        for part in parts
    }
    snapshot["inline"], written = _packed(timing.state_frames(), small)
    return snapshot, written


def _packed(
    frames: Mapping[str, DataFrame],
    small: Collection[str],
    tables: Mapping[str, Any] | None = None,
) -> tuple[dict[str, tuple[str, Any]], dict[str, DataFrame]]:
    """The ``small`` ones of ``frames`` inline, as their schema's JSON and a pyarrow Table
    (the one in ``tables``, rows on the driver already, else collected); the others to
    write as parquet."""
    inline: dict[str, tuple[str, Any]] = {}
    written: dict[str, DataFrame] = {}
    for name, df in frames.items():
        if name in small:
            table = (tables or {}).get(name)
            if table is None:
                table = held_on_driver(df)  # a small state collected with its epoch
            inline[name] = (df.schema.json(), df.toArrow() if table is None else table)
        else:
            written[name] = df
    return inline, written


def _unpacked(spark: SparkSession, inline: Mapping[str, tuple[str, Any]]) -> dict[str, DataFrame]:
    """The frames ``_packed`` put inline, as local DataFrames again."""
    return {
        name: local_frame(spark, table, StructType.fromJson(json.loads(schema)))
        for name, (schema, table) in inline.items()
    }


def restore(log: EpochLog) -> Restored | None:
    """Load the last commit under the checkpoint location into the run's driver state (and
    its event-time steps); where it continues, or None when there is none."""
    checkpoint = log.checkpointing.restore()
    if checkpoint is None:
        return None
    driver = checkpoint.driver
    position = driver.stream
    if not isinstance(position, StreamPosition):
        raise IterflowValueError(
            f"checkpoint_location '{log.checkpointing.store.root}' holds checkpoints of "
            "a bounded iteration; give the unbounded iteration its own location"
        )
    loop = log.cycle.loop
    loop.load(driver)
    loop.observers.metrics.restore(driver.metrics)
    pending = {
        name: loop.check.aligned(name, df)
        for name, df in {**checkpoint.variables, **_unpacked(log.spark, position.inline)}.items()
    }
    log.cycle.variables.rows = dict(position.rows)
    log.cycle.variables.tables = {name: table for name, (_, table) in position.inline.items()}
    if log.event_time is not None and position.event_time is not None:
        states = {**checkpoint.outputs, **_unpacked(log.spark, position.event_time["inline"])}
        log.event_time.restore(position.event_time, states)
    return Restored(epoch=position.epoch, batch_id=position.batch_id, pending=pending)
