"""Beam's CombineFn on DataFrames: ``itf.combine(data, fn, schema, depth=2)``.

A ``CombineFn`` says how to aggregate in four steps: ``create_accumulator``,
``add_input(acc, batch)`` for every Arrow record batch of a partition,
``merge_accumulators`` of the partitions' accumulators, and ``extract_output``
of the last one: the rows of the result. ``combine`` builds, and never runs, the
DataFrame of those rows::

    partition 0 -> add_input per batch -> acc 0 -+- merge -+
    partition 1 -> add_input per batch -> acc 1 -+         |
    partition 2 -> add_input per batch -> acc 2 -+- merge -+- merge -> extract_output -> rows
    partition 3 -> add_input per batch -> acc 3 -+

The merge is a tree of ``depth`` levels, like ``RDD.treeAggregate(depth)`` (grouping
consecutive partitions): with P accumulators,
``scale = max(ceil(P ** (1 / depth)), 2)``; while more than ``scale`` remain (at
most ``depth - 1`` times), consecutive ones (``index // scale``) are merged in
groups; then the rest are merged at once, in index order. Which accumulators
meet, and in which order, depends only on the partition indices, never on
which task finished first; ``MergeTree`` and ``merge_tree`` are that rule, and
every merge made in memory goes through them, so that every path merges the
same accumulators to the same result, to the bit.

The paths:

- **A DataFrame.** One ``mapInArrow`` task per partition feeds an accumulator
  (an empty partition gives ``create_accumulator()`` untouched) and emits one
  row: its partition index and the pickled accumulator. Each level of the tree
  is a shuffle (``repartition(groups, index // scale)``) and a ``mapInArrow``
  that merges every group; a last task merges the rest and extracts the rows.
  The levels need P before the plan runs: on a classic session it is read from
  the physical plan when that runs no job (``jvm.planned_partitions``: scans,
  local rows, checkpoints, filled caches); otherwise (a shuffle, which adaptive
  execution may coalesce; Spark Connect, which has no plan to read) the last task
  makes the whole tree in memory, with the same result.
- **Columnar data** (``ctx.columnar(df, prepare)``). The accumulators are fed
  from the prepared partitions by a ``map`` kernel, and its ``combine`` makes the
  tree in memory; on resident data that runs in the resident tasks, with no
  Spark job.
- **On the driver.** A result that iterflow holds on the driver (a small
  variable, such as a one-row model) is computed there: one job collects the
  partitions' accumulators, and the tree is made in memory on the driver.

Errors name the CombineFn in quotes: an ``fn`` that is not one, a bad
``depth``, an accumulator that cannot be pickled (checked on the driver when
the DataFrame is built, and in the task after ``add_input``), a failing method
(with the epoch of the round that built the DataFrame), and an
``extract_output`` that does not fit the declared schema.
"""

from __future__ import annotations

import functools
import itertools
import math
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.runtime.datacache.columnar import (
    ColumnarData,
    _conform,
    _declared_arrow_schema,
    declared_struct,
    mark_combined,
)
from iterflow.runtime.datacache.resident import ResidentData, current_round
from iterflow.runtime.spark.jvm import planned_partitions, spark_context
from iterflow.runtime.spark.schema import map_in_arrow

#: The rows between the steps of a combine: a partition's (or a group's) index and its
#: pickled accumulator.
PARTIAL_SCHEMA = "index INT, accumulator BINARY"
_PARTIAL_ARROW = pa.schema([("index", pa.int32()), ("accumulator", pa.binary())])

#: What ``extract_output`` may return.
Rows = Any  # list of tuples or dicts, pyarrow Table or RecordBatch, pandas DataFrame

_METHODS = ("create_accumulator", "add_input", "merge_accumulators", "extract_output")


class CombineFn:
    """An aggregation in four steps, as Apache Beam's ``CombineFn``; subclass it and give
    ``itf.combine`` an instance.

    Accumulators travel between Spark tasks, so they must be picklable (numpy arrays,
    numbers, lists, dicts). ``add_input`` may be called any number of times per partition
    (never with an empty batch, so never for an empty partition), and the merge must not
    depend on how the rows were split into partitions and batches: associative and
    commutative in effect.

    Example (the sum and the number of values of ``x``)::

        class Total(itf.CombineFn):
            def create_accumulator(self):
                return np.zeros(2)
            def add_input(self, acc, batch):
                x = batch.column("x").to_numpy(zero_copy_only=False)
                return acc + [x.sum(), len(x)]
            def merge_accumulators(self, accs):
                return np.sum(accs, axis=0)
            def extract_output(self, acc):
                return [(float(acc[0]), int(acc[1]))]

        totals = itf.combine(df, Total(), "total DOUBLE, n LONG")
    """

    def create_accumulator(self) -> Any:
        """A fresh accumulator."""
        raise NotImplementedError

    def add_input(self, acc: Any, batch: pa.RecordBatch) -> Any:
        """``acc`` with the rows of ``batch`` (a ``pyarrow.RecordBatch``) added; returns it."""
        raise NotImplementedError

    def add_inputs(self, acc: Any, table: pa.Table) -> Any:
        """``acc`` with a whole prepared partition added (``ctx.columnar`` data; Beam's
        name): by default ``add_input`` for each of its non-empty record batches.
        Override it to work on the partition at once: on resident data ``table`` is the
        same object every round, so a structure built from it can be kept (for instance
        with a ``weakref.WeakKeyDictionary``-like cache keyed on the table)."""
        for batch in table.to_batches():
            if batch.num_rows:
                acc = self.add_input(acc, batch)
        return acc

    def merge_accumulators(self, accs: list[Any]) -> Any:
        """One accumulator holding all of ``accs`` (in index order)."""
        raise NotImplementedError

    def extract_output(self, acc: Any) -> Rows:
        """The rows of the result: a list of tuples or dicts, a ``pyarrow.Table`` or
        ``RecordBatch``, or a pandas DataFrame, with the declared columns in order."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """How errors name this CombineFn: its class name."""
        return type(self).__name__


@attrs.frozen
class MergeTree:
    """How ``partials`` accumulators are merged with ``depth``, as ``RDD.treeAggregate``:
    ``levels`` says how many remain after each level of merges of ``scale`` consecutive
    ones; what remains after the last level is merged at once."""

    partials: int
    depth: int

    @property
    def scale(self) -> int:
        return max(math.ceil(self.partials ** (1 / self.depth)), 2)

    @property
    def levels(self) -> tuple[int, ...]:
        left, levels = self.partials, list[int]()
        while left > self.scale and len(levels) < self.depth - 1:
            left = -(-left // self.scale)
            levels.append(left)
        return tuple(levels)


def merge_tree(fn: CombineFn, accumulators: Sequence[Any], depth: int, epoch: int | None) -> Any:
    """The accumulators (in index order) merged as ``MergeTree`` says; with none, a fresh one.
    Every merge iterflow makes in memory is this one, so all paths agree to the bit."""
    tree = MergeTree(len(accumulators), depth)
    merged = list(accumulators)
    for _ in tree.levels:
        merged = [
            _merge(fn, merged[start : start + tree.scale], epoch)
            for start in range(0, len(merged), tree.scale)
        ]
    return _merge(fn, merged, epoch) if merged else fn.create_accumulator()


def _merge(fn: CombineFn, accumulators: list[Any], epoch: int | None) -> Any:
    try:
        merged = fn.merge_accumulators(accumulators)
    except Exception as error:
        raise _failed(fn, "merge_accumulators", epoch, error) from error
    if merged is None:
        raise IterflowTypeError(
            f"CombineFn '{fn.name}'.merge_accumulators returned None; return the merged accumulator"
        )
    return merged


def _in_epoch(epoch: int | None) -> str:
    return "" if epoch is None else f" in epoch {epoch}"


def _failed(fn: CombineFn, method: str, epoch: int | None, error: Exception) -> IterflowError:
    return IterflowError(
        f"CombineFn '{fn.name}'.{method} failed{_in_epoch(epoch)}: {type(error).__name__}: {error}"
    )


def _dumps(fn: CombineFn, acc: Any, after: str, epoch: int | None) -> bytes:
    """``acc`` pickled, or an error that says which CombineFn's accumulator is not picklable."""
    from pyspark import cloudpickle

    try:
        return bytes(cloudpickle.dumps(acc))
    except Exception as error:
        raise IterflowTypeError(
            f"CombineFn '{fn.name}': its accumulator (a {type(acc).__name__}) cannot be "
            f"pickled after {after}{_in_epoch(epoch)}: {type(error).__name__}: {error}. "
            "Accumulators travel between Spark tasks: keep them to picklable values (numpy "
            "arrays, numbers, lists, dicts), and make locks, files or clients inside a method"
        ) from error


@attrs.frozen
class _Combining:
    """One ``combine`` call: its CombineFn, the epoch that built it (for errors) and the
    declared output. Its methods are the functions of the Spark tasks and of the driver."""

    fn: CombineFn
    epoch: int | None
    target: pa.Schema  # the Arrow schema of the declared output
    declared: str  # the declared schema, as errors show it

    def accumulate(self, batches: Iterable[pa.RecordBatch]) -> Any:
        """A fresh accumulator fed every batch of one partition."""
        acc = self.fresh()
        for batch in batches:
            if batch.num_rows == 0:
                continue  # add_input never sees an empty batch
            acc = self.added("add_input", acc, batch)
        return acc

    def fresh(self) -> Any:
        try:
            return self.fn.create_accumulator()
        except Exception as error:
            raise _failed(self.fn, "create_accumulator", self.epoch, error) from error

    def added(self, method: str, acc: Any, rows: Any) -> Any:
        """``acc`` after the CombineFn's ``method`` (``add_input``, ``add_inputs``) of ``rows``."""
        fn = self.fn
        try:
            acc = getattr(fn, method)(acc, rows)
        except Exception as error:
            raise _failed(fn, method, self.epoch, error) from error
        if acc is None:
            raise IterflowTypeError(
                f"CombineFn '{fn.name}'.{method} returned None{_in_epoch(self.epoch)}; "
                "return the accumulator"
            )
        return acc

    def partial(self, index: int, acc: Any, after: str) -> pa.RecordBatch:
        """The row of one accumulator: its index and its pickled self."""
        data = _dumps(self.fn, acc, after, self.epoch)
        return pa.RecordBatch.from_arrays(
            [pa.array([index], pa.int32()), pa.array([data], pa.binary())],
            schema=_PARTIAL_ARROW,
        )

    def feed(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``mapInArrow`` over a DataFrame: the partition's accumulator, numbered by partition."""
        context = TaskContext.get()
        index = context.partitionId() if context is not None else 0
        yield self.partial(index, self.accumulate(batches), "add_input")

    def kernel(self, index: int, table: pa.Table) -> pa.RecordBatch:
        """A columnar kernel: the accumulator of prepared partition ``index``
        (``add_inputs``, which never sees an empty partition)."""
        if type(self.fn).add_inputs is CombineFn.add_inputs:  # add_input batch by batch
            return self.partial(index, self.accumulate(table.to_batches()), "add_input")
        acc = self.fresh()
        if table.num_rows:
            acc = self.added("add_inputs", acc, table)
        return self.partial(index, acc, "add_inputs")

    def merge_level(
        self, scale: int, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        """One level of the tree in Spark: the groups (``index // scale``) this task holds,
        each merged in index order."""
        received = _received(batches)
        for group, members in itertools.groupby(received, key=lambda item: item[0] // scale):
            merged = _merge(self.fn, [acc for _, acc in members], self.epoch)
            yield self.partial(group, merged, "merge_accumulators")

    def finish(self, depth: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The accumulators merged as a tree of ``depth``, then the extracted rows."""
        accumulators = [acc for _, acc in _received(batches)]
        yield from self.output(merge_tree(self.fn, accumulators, depth, self.epoch))

    def output(self, acc: Any) -> Iterator[pa.RecordBatch]:
        """``extract_output(acc)`` as record batches of the declared schema."""
        fn = self.fn
        try:
            rows = fn.extract_output(acc)
        except Exception as error:
            raise _failed(fn, "extract_output", self.epoch, error) from error
        source = f"CombineFn '{fn.name}'.extract_output"
        try:
            batches = [
                _conform(b, self.target, source) for b in _as_batches(rows, self.target, source)
            ]
        except IterflowTypeError as error:
            raise IterflowTypeError(f"{error}; the declared schema is '{self.declared}'") from error
        yield from batches or [pa.RecordBatch.from_pylist([], schema=self.target)]


@attrs.frozen
class TreeMerge:
    """How resident tasks merge one combine's accumulators among themselves
    (``resident_tree.reduce_here``): the same tree, the same merges, as ``merge_tree``."""

    combining: _Combining
    depth: int

    def shape(self, partials: int) -> tuple[int, tuple[int, ...]]:
        """The tree's group size, and the groups left after each level but the last."""
        tree = MergeTree(partials, self.depth)
        return tree.scale, tree.levels

    def merge(self, members: list[bytes]) -> bytes:
        """One group's pickled accumulators (in index order) merged, pickled."""
        fn, epoch = self.combining.fn, self.combining.epoch
        merged = _merge(fn, [pickle.loads(member) for member in members], epoch)
        return _dumps(fn, merged, "merge_accumulators", epoch)

    def finish(self, members: list[bytes]) -> list[pa.RecordBatch]:
        """The last merge (a fresh accumulator when there is nothing), and the rows."""
        fn, epoch = self.combining.fn, self.combining.epoch
        accumulators = [pickle.loads(member) for member in members]
        merged = _merge(fn, accumulators, epoch) if accumulators else fn.create_accumulator()
        return list(self.combining.output(merged))

    def whole(self, partials: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Every partition's accumulator (rows of ``PARTIAL_SCHEMA``) merged in one place:
        the per-round-job path, and resident tasks that could not pass them along a tree."""
        return self.combining.finish(self.depth, partials)


def _received(batches: Iterable[pa.RecordBatch]) -> list[tuple[int, Any]]:
    """The (index, accumulator) rows of ``batches``, unpickled, in index order."""
    received = [
        (index, pickle.loads(data))
        for batch in batches
        for index, data in zip(
            batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
        )
    ]
    return sorted(received, key=lambda item: item[0])


def _as_batches(rows: Rows, target: pa.Schema, source: str) -> list[pa.RecordBatch]:
    """What ``extract_output`` returned, as record batches (not yet conformed to ``target``);
    errors name ``source``."""
    if isinstance(rows, pa.Table):
        return rows.combine_chunks().to_batches()
    if isinstance(rows, pa.RecordBatch):
        return [rows]
    if isinstance(rows, (list, tuple)):
        return [_from_rows(rows, target, source)]
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        return [pa.RecordBatch.from_pandas(rows, preserve_index=False)]
    raise IterflowTypeError(
        f"{source} returned a {type(rows).__name__}; return rows (a list of tuples or dicts), a "
        "pyarrow Table or RecordBatch, or a pandas DataFrame"
    )


def _from_rows(rows: Sequence[Any], target: pa.Schema, source: str) -> pa.RecordBatch:
    """Rows as a record batch of ``target``: tuples by position, dicts by column name."""
    names = target.names
    columns: list[list[Any]] = [[] for _ in names]
    for row in rows:
        if isinstance(row, dict):
            if set(row) != set(names):
                raise IterflowTypeError(
                    f"{source} returned a row with keys {list(row)} where {names} were declared"
                )
            values = [row[name] for name in names]
        elif isinstance(row, (tuple, list)):
            values = list(row)
            if len(values) != len(names):
                raise IterflowTypeError(
                    f"{source} returned a row of {len(values)} value(s) where {len(names)} columns "
                    f"({', '.join(names)}) were declared"
                )
        else:
            raise IterflowTypeError(
                f"{source} returned a row that is a {type(row).__name__}; rows are tuples or dicts"
            )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    arrays = [_array(values, field, source) for values, field in zip(columns, target, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _array(values: list[Any], field: pa.Field, source: str) -> pa.Array:
    """``values`` as an Arrow array of ``field``'s type: converted, or else inferred and cast
    (numpy integers into a double column, say)."""
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    try:
        return pa.array(values).cast(field.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        raise IterflowTypeError(
            f"{source} returned values for column '{field.name}' that are not {field.type}: "
            f"{type(error).__name__}: {error}"
        ) from error


def _checked(fn: Any, depth: Any) -> CombineFn:
    if not isinstance(fn, CombineFn):
        raise IterflowTypeError(
            f"combine() takes a CombineFn, got a {type(fn).__name__} "
            f"'{getattr(fn, '__name__', type(fn).__name__)}'; subclass itf.CombineFn and "
            "define create_accumulator, add_input, merge_accumulators and extract_output"
        )
    missing = [m for m in _METHODS if getattr(type(fn), m) is getattr(CombineFn, m)]
    if missing:
        raise IterflowTypeError(
            f"CombineFn '{fn.name}' does not define {', '.join(missing)}; a CombineFn "
            f"defines all of {', '.join(_METHODS)}"
        )
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise IterflowValueError(
            f"combine(..., depth={depth!r}) for CombineFn '{fn.name}': depth is the number of "
            "levels of the merge tree, an int >= 1 (1: every accumulator merged at once)"
        )
    return fn


def _epoch(spark: SparkSession) -> int | None:
    """The epoch of the round being built on this thread; None outside an iteration and
    under Spark Connect (whose jobs carry no round tag)."""
    context = spark_context(spark)
    if context is None:
        return None
    epoch = current_round(context)[1]
    return epoch if epoch >= 0 else None


def combine(
    data: DataFrame | ColumnarData | ResidentData,
    fn: CombineFn,
    schema: StructType | str,
    depth: int = 2,
) -> DataFrame:
    """The DataFrame (with ``schema``) of ``fn.extract_output`` of all of ``data``'s rows.

    Built, not run. ``data`` is a DataFrame, or what ``ctx.columnar(df, prepare)``
    returns in a body (then the accumulators are fed from the prepared partitions,
    in the resident tasks when the data is resident). Accumulators are merged as a
    tree of ``depth`` levels, as ``RDD.treeAggregate``, in an order that depends
    only on the partitions, so results are the same on every run and every path.
    ``extract_output``'s columns are taken by position and cast to ``schema``. See
    ``iterflow.runtime.datacache.combine`` for how it runs.

    Example, in a body with a one-row model variable::

        stats = itf.combine(points, GaussianStats(means, covs, weights), STATS_SCHEMA)
    """
    fn = _checked(fn, depth)
    if isinstance(data, (ColumnarData, ResidentData)):
        spark = data.spark
    elif isinstance(data, DataFrame):
        spark = data.sparkSession
    else:
        raise IterflowTypeError(
            f"combine(data, CombineFn '{fn.name}', ...) takes a DataFrame or what "
            f"ctx.columnar(df, prepare) returns, got a {type(data).__name__}"
        )
    epoch = _epoch(spark)
    try:
        fresh = fn.create_accumulator()
    except Exception as error:
        raise _failed(fn, "create_accumulator", epoch, error) from error
    _dumps(fn, fresh, "create_accumulator", epoch)
    struct = declared_struct(spark, schema)
    declared = schema if isinstance(schema, str) else struct.simpleString()
    combining = _Combining(fn, epoch, _declared_arrow_schema(spark, struct), declared)
    if not isinstance(data, DataFrame):  # columnar: merged in one task, or along the tree
        return data.reduce(combining.kernel, PARTIAL_SCHEMA, TreeMerge(combining, depth), struct)
    partial_struct = declared_struct(spark, PARTIAL_SCHEMA)
    partials = map_in_arrow(data, combining.feed, partial_struct)
    merged, left = partials, depth
    known = planned_partitions(data)
    if known is not None:
        tree = MergeTree(known, depth)
        for groups in tree.levels:
            group = (F.col("index") / F.lit(tree.scale)).cast("int")
            level = functools.partial(combining.merge_level, tree.scale)
            merged = merged.repartition(groups, group).mapInArrow(level, partial_struct)
        if tree.levels:
            left = 1  # what the levels leave is merged at once
    result = merged.repartition(1).mapInArrow(functools.partial(combining.finish, left), struct)
    return mark_combined(result, partials, functools.partial(combining.finish, depth))
