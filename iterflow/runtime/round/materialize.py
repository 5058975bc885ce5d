"""Materializing a round: evaluate its DataFrames once, count rows, cut lineage.

Per round, every distinct feedback/output DataFrame is checkpointed locally
(``localCheckpoint(eager=True)``) with a row-count observation riding on the
same job, so plans never grow and no extra count job runs. The checkpoint's
optimizer statistics are set from the counted rows, so they do not grow
either. When the round has more than one thing to evaluate (several
DataFrames, criteria, a convergence value), the DataFrames are persisted
first: Spark's cache manager then serves the later evaluations from memory
instead of recomputing the round, and the caches are dropped once the round's
checkpoints exist.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from iterflow.errors import IterflowValueError
from iterflow.runtime.datacache.columnar import combined_on_driver
from iterflow.runtime.datacache.driver_variables import held_frame, held_on_driver
from iterflow.runtime.progresstrack.tracker import RoundTracker
from iterflow.runtime.spark.jvm import (
    deliver_observations,
    is_classic,
    is_empty,
    is_local,
    release_local_checkpoint,
    set_checkpoint_statistics,
)
from iterflow.runtime.spark.schema import has_user_type

_names = itertools.count()


def unique_observation(prefix: str) -> Observation:
    """An Observation with a name no other plan of this process uses."""
    return Observation(f"iterflow_{prefix}_{next(_names)}")


def step_observation(
    prefix: str, steps: Iterable[str], tracker: RoundTracker, *, watched: bool = True
) -> Observation:
    """A fresh observation of the rows of the round's steps ``steps``, reported to the
    run's ``tracker`` for progress sampling under the name Spark shows in its plan's
    ``CollectMetrics`` node.

    ``watched``: the sampler reads its count once Spark delivers it; otherwise the
    caller reports the count itself (``tracker.rows``)."""
    observation = unique_observation(prefix)
    tracker.step(str(observation._name), steps, observation if watched else None)
    return observation


def observe_rows(df: DataFrame, observation: Observation, *metrics: Column) -> DataFrame:
    """``df`` counting its rows (``rows``), and aggregating ``metrics`` (aliased aggregate
    columns), into ``observation`` when Spark evaluates it."""
    return df.observe(observation, F.count(F.lit(1)).alias("rows"), *metrics)


def is_persisted(df: DataFrame) -> bool:
    """True when ``df`` (or a DataFrame with an equal plan) is cached already."""
    return bool(df.storageLevel != StorageLevel.NONE)


def persist_owned(df: DataFrame) -> bool:
    """Persist ``df`` unless it is cached already or is rows held on the driver (a local
    relation: caching it would only make reading it a Spark job); True when iterflow now
    owns the cache."""
    if is_persisted(df) or is_local(df):
        return False
    df.persist(StorageLevel.MEMORY_AND_DISK)
    return True


def release(df: DataFrame) -> None:
    """Release what iterflow persisted or checkpointed for ``df``."""
    if held_on_driver(df) is not None:
        return  # rows on the driver: nothing in Spark to release
    df.unpersist(blocking=False)
    release_local_checkpoint(df)


@attrs.frozen
class Materialized:
    """The result of one round's materialization, keyed by ``id()`` of the original objects."""

    frames: dict[int, DataFrame]
    rows: dict[int, int]
    criteria_empty: dict[int, bool]
    values: dict[int, Any]
    tables: dict[int, Any]  # pyarrow Tables of the targets collected to the driver
    #: Seconds each target in Spark took to materialize (targets held already: none).
    seconds: dict[int, float] = attrs.Factory(dict)
    #: The ``metrics`` asked for, by target.
    aggregates: dict[int, dict[str, Any]] = attrs.Factory(dict)


def materialize(
    targets: Sequence[DataFrame],
    criteria: Sequence[DataFrame],
    values: Sequence[DataFrame],
    epoch: int,
    tracker: RoundTracker,
    on_driver: Collection[int] = (),
    names: Mapping[int, tuple[str, ...]] | None = None,
    metrics: Mapping[int, Sequence[Column]] | None = None,
) -> Materialized:
    """Checkpoint ``targets``, test ``criteria`` for emptiness, read one-cell ``values``.

    Targets whose ``id()`` is in ``on_driver`` (small ones, such as a model) are
    collected as Arrow tables instead, and continue as local DataFrames over
    them (a ``LocalRelation``): reading them later, in the next body or to
    commit them, runs no Spark job. A target with a user-defined type (an ML
    vector), which Arrow does not carry back, is checkpointed all the same.

    ``names`` gives the step names of targets (by ``id()``), for progress sampling
    (reported to ``tracker``): their row counts, live while their jobs run and exact
    once done.

    ``metrics`` gives aliased aggregate columns to compute over targets (by ``id()``),
    riding on the job that materializes them; their values are in ``aggregates``.
    """
    names = names or {}
    metrics = metrics or {}
    distinct = list({id(df): df for df in targets}.values())
    target_ids = {id(df) for df in distinct}
    extra_criteria = [df for df in criteria if id(df) not in target_ids]
    shared = len(distinct) > 1 or bool(extra_criteria) or bool(values)
    # Over Connect a persisted DataFrame's checkpoint takes its statistics from the cache
    # (none can be set afterwards). Rows held on the driver already need no job at all.
    held = {id(df): table for df in distinct if (table := held_on_driver(df)) is not None}
    in_spark = [df for df in distinct if id(df) not in held]
    connect = {
        id(df) for df in in_spark if id(df) not in on_driver and not is_classic(df.sparkSession)
    }
    owned = [df for df in in_spark if (shared or id(df) in connect) and persist_owned(df)]
    try:
        frames: dict[int, DataFrame] = {id(df): df for df in distinct if id(df) in held}
        rows: dict[int, int] = {key: table.num_rows for key, table in held.items()}
        for key, count in rows.items():
            tracker.rows(names.get(key, ()), count)
        tables: dict[int, Any] = dict(held)
        seconds: dict[int, float] = {}
        aggregates: dict[int, dict[str, Any]] = {}
        for df in in_spark:
            clock = time.perf_counter()
            if id(df) in on_driver and not has_user_type(df.schema):
                frames[id(df)], tables[id(df)] = _collected(df, shared)
                rows[id(df)] = tables[id(df)].num_rows
            else:
                step = names.get(id(df), ())
                frames[id(df)], got = _checkpointed(df, step, tracker, metrics.get(id(df), ()))
                rows[id(df)] = int(got.pop("rows"))
                if id(df) in metrics:
                    aggregates[id(df)] = got
                set_checkpoint_statistics(frames[id(df)], rows[id(df)])
            seconds[id(df)] = time.perf_counter() - clock
            tracker.rows(names.get(id(df), ()), rows[id(df)])
        for key in metrics.keys() & tables.keys():  # rows on the driver: a local aggregate
            first = frames[key].agg(*metrics[key]).first()
            aggregates[key] = first.asDict() if first is not None else {}
        empty = {id(df): (rows[id(df)] == 0 if id(df) in rows else is_empty(df)) for df in criteria}
        read = {id(df): _one_cell(df, epoch) for df in values}
    finally:
        for df in owned:
            df.unpersist(blocking=False)
    return Materialized(
        frames=frames,
        rows=rows,
        criteria_empty=empty,
        values=read,
        tables=tables,
        seconds=seconds,
        aggregates=aggregates,
    )


def _collected(df: DataFrame, shared: bool) -> tuple[DataFrame, Any]:
    """``df`` collected to the driver: a local DataFrame over its rows, and their Arrow
    table. Alone in the round (nothing else reads it), a combined kernel result is
    combined here on the driver: no shuffle, no Python task for the combine."""
    table = None if shared else combined_on_driver(df)
    if table is None:
        table = df.toArrow()
    return held_frame(df.sparkSession, table.combine_chunks(), df.schema), table


def _checkpointed(
    df: DataFrame, step: tuple[str, ...], tracker: RoundTracker, metrics: Sequence[Column]
) -> tuple[DataFrame, dict[str, Any]]:
    """``df`` cut from its lineage by one job that also counts its rows (``"rows"``) and
    computes ``metrics``: the checkpoint, and what the job observed."""
    observation = step_observation("rows", step, tracker, watched=False)
    observed = observe_rows(df, observation, *metrics)
    frame = observed.localCheckpoint(eager=True)
    deliver_observations(observed)
    return frame, dict(observation.get)


def _one_cell(df: DataFrame, epoch: int) -> Any:
    cells = df.limit(2).collect()
    if len(cells) != 1:
        count = "no rows" if not cells else "more than one row"
        raise IterflowValueError(
            f"epoch {epoch}: the convergence value has {count}; "
            "it must be a one-row aggregate such as df.agg(F.max(...))"
        )
    return cells[0][0]
