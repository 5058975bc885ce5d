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
from contextlib import nullcontext
from typing import Any

import attrs
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from iterflow.runtime.datacache.columnar import combined_on_driver
from iterflow.runtime.datacache.driver_variables import held_frame, held_on_driver
from iterflow.runtime.progresstrack.tracker import RoundTracker
from iterflow.runtime.round.tally import Counted, Tally
from iterflow.runtime.spark.jvm import (
    deliver_observations,
    is_classic,
    is_local,
    release_local_checkpoint,
    set_checkpoint_statistics,
    union_keeps_partitions,
)
from iterflow.runtime.spark.planning import static_planning
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
    #: The rows of the criteria that are not targets, counted by the round's tally.
    criteria_rows: dict[int, int] = attrs.Factory(dict)


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
    """Checkpoint ``targets``, count the rows of ``criteria``, read one-cell ``values``.

    Targets whose ``id()`` is in ``on_driver`` (small ones, such as a model) are
    collected as Arrow tables instead, and continue as local DataFrames over
    them (a ``LocalRelation``): reading them later, in the next body or to
    commit them, runs no Spark job. A target with a user-defined type (an ML
    vector), which Arrow does not carry back, is checkpointed all the same.

    The criteria that are not targets and the values are read by one job (a ``Tally``),
    or by none when a target is collected to the driver: they ride on its job. The
    round's jobs are planned statically (``static_planning``).

    ``names`` gives the step names of targets (by ``id()``), for progress sampling
    (reported to ``tracker``): their row counts, live while their jobs run and exact
    once done.

    ``metrics`` gives aliased aggregate columns to compute over targets (by ``id()``),
    riding on the job that materializes them; their values are in ``aggregates``.
    """
    distinct = list({id(df): df for df in targets}.values())
    target_ids = {id(df) for df in distinct}
    tally = Tally([df for df in criteria if id(df) not in target_ids], values)
    # Over Connect a persisted DataFrame's checkpoint takes its statistics from the cache
    # (none can be set afterwards). Rows held on the driver already need no job at all.
    held = {id(df): table for df in distinct if (table := held_on_driver(df)) is not None}
    in_spark = [df for df in distinct if id(df) not in held]
    shared = len(distinct) > 1 or bool(tally)
    connect = {
        id(df) for df in in_spark if id(df) not in on_driver and not is_classic(df.sparkSession)
    }
    frames = [*in_spark, *tally.criteria, *tally.values]
    owned: list[DataFrame] = []
    try:
        # A cache's plan is made when it is persisted: under the round's planning too.
        with static_planning(frames[0].sparkSession) if frames else nullcontext():
            owned = [df for df in in_spark if (shared or id(df) in connect) and persist_owned(df)]
            done = _Round(epoch, tracker, names or {}, metrics or {}, held, tally)
            for df in in_spark:
                done.evaluate(df, id(df) in on_driver and not has_user_type(df.schema), shared)
            done.finish()
    finally:
        for df in owned:
            df.unpersist(blocking=False)
    counted = done.counted.rows
    return Materialized(
        frames={**{id(df): df for df in distinct if id(df) in held}, **done.frames},
        rows=done.rows,
        criteria_empty={id(df): done.rows.get(id(df), counted.get(id(df))) == 0 for df in criteria},
        values=done.counted.values,
        tables=done.tables,
        seconds=done.seconds,
        aggregates=done.aggregates,
        criteria_rows=counted,
    )


class _Round:
    """One materialization in progress: what its targets' jobs produced so far."""

    def __init__(
        self,
        epoch: int,
        tracker: RoundTracker,
        names: Mapping[int, tuple[str, ...]],
        metrics: Mapping[int, Sequence[Column]],
        held: Mapping[int, Any],
        tally: Tally,
    ) -> None:
        self.epoch, self.tracker, self.names, self.metrics = epoch, tracker, names, metrics
        self.tally: Tally | None = tally if tally else None  # until read
        self.counted = Counted(rows={}, values={})
        self.frames: dict[int, DataFrame] = {}
        self.rows: dict[int, int] = {key: table.num_rows for key, table in held.items()}
        for key, count in self.rows.items():
            tracker.rows(names.get(key, ()), count)
        self.tables: dict[int, Any] = dict(held)
        self.seconds: dict[int, float] = {}
        self.aggregates: dict[int, dict[str, Any]] = {}

    def evaluate(self, df: DataFrame, collect: bool, shared: bool) -> None:
        """Materialize target ``df``: collected to the driver (``collect``) or checkpointed."""
        clock = time.perf_counter()
        key = id(df)
        if collect:
            ride, frame = self._rider(df), df
            if ride is not None:
                observation = unique_observation("tally")
                frame = ride.riding(df, observation)
            self.frames[key], self.tables[key] = _collected(frame, df, shared)
            self.rows[key] = self.tables[key].num_rows
            if ride is not None:
                self.counted, self.tally = ride.observed(observation, self.epoch), None
        else:
            step = self.names.get(key, ())
            ride = self._rider(df)
            self.frames[key], got, rode = _checkpointed(
                df, step, self.tracker, self.metrics.get(key, ()), ride
            )
            if rode is not None and ride is not None:
                self.counted, self.tally = ride.observed(rode, self.epoch), None
            self.rows[key] = int(got.pop("rows"))
            if key in self.metrics:
                self.aggregates[key] = got
            set_checkpoint_statistics(self.frames[key], self.rows[key])
        self.seconds[key] = time.perf_counter() - clock
        self.tracker.rows(self.names.get(key, ()), self.rows[key])

    def _rider(self, df: DataFrame) -> Tally | None:
        """The tally not read yet, when it can ride on the job of ``df`` (classic Spark,
        plain values, no user-defined type in ``df``)."""
        tally = self.tally
        if tally is None or not tally.rides() or not is_classic(df.sparkSession):
            return None
        return None if has_user_type(df.schema) else tally

    def finish(self) -> None:
        """The aggregates of targets on the driver, and the tally if no job read it yet."""
        for key in self.metrics.keys() & self.tables.keys():  # rows on the driver: local
            first = self.frames[key].agg(*self.metrics[key]).first()
            self.aggregates[key] = first.asDict() if first is not None else {}
        if self.tally is not None:
            self.counted, self.tally = self.tally.collect(self.epoch), None


def _collected(frame: DataFrame, df: DataFrame, shared: bool) -> tuple[DataFrame, Any]:
    """``frame`` (``df``, or ``df`` carrying a tally) collected to the driver: a local
    DataFrame over its rows in the shape of ``df``, and their Arrow table. Alone in the
    round (nothing else reads it), a combined kernel result is combined here on the
    driver: no shuffle, no Python task for the combine."""
    table = None if shared else combined_on_driver(df)
    if table is None:
        table = frame.toArrow()
    return held_frame(df.sparkSession, table.combine_chunks(), df.schema), table


def _checkpointed(
    df: DataFrame,
    step: tuple[str, ...],
    tracker: RoundTracker,
    metrics: Sequence[Column],
    tally: Tally | None = None,
) -> tuple[DataFrame, dict[str, Any], Observation | None]:
    """``df`` cut from its lineage by one job that also counts its rows (``"rows"``) and
    computes ``metrics``: the checkpoint, and what the job observed. A ``tally`` rides on
    the same job where its extra partition stays one (``union_keeps_partitions``): the
    Observation holding it then, or None."""
    observation = step_observation("rows", step, tracker, watched=False)
    carried, riding = None, None
    if tally is not None:
        carried = unique_observation("tally")
        riding = observe_rows(tally.riding(df, carried), observation, *metrics)
        if not union_keeps_partitions(riding):  # the Observation is taken: a new one
            riding, observation = None, step_observation("rows", step, tracker, watched=False)
    observed = riding if riding is not None else observe_rows(df, observation, *metrics)
    frame = observed.localCheckpoint(eager=True)
    deliver_observations(observed)
    return frame, dict(observation.get), carried if riding is not None else None
