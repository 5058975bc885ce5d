"""Data that crosses from the JVM to Python once: a DataFrame kept as Arrow files.

A vectorized kernel (numpy inside ``mapInArrow``) that reads the same data input
every round pays, every round, for Spark to serialize that data to the Python
workers; for numeric kernels that is most of the cost. ``ColumnarData`` pays it
once: one Spark job writes each partition of the DataFrame, optionally reshaped
by a ``prepare`` function, as an Arrow IPC file; afterwards every
``ColumnarData.map`` runs one task per file, which opens the file in place
(memory-mapped when local, so the operating system's page cache is the only
copy) and hands the kernel a ``pyarrow.Table``.

The files live in ``spark.iterflow.columnar.dir`` (default: a temporary folder on
the driver, which suits ``local`` and ``local-cluster`` masters). On a cluster
of several machines it must be storage every executor can read: a shared mount,
or a URI that ``pyarrow.fs`` opens (``s3://``, ``gs://``, ``hdfs://``, ``abfss://``...):
the Python tasks that read the files have no JVM, so a Hadoop-only scheme (``s3a://``)
is refused with an error naming the scheme. A task that cannot find its file fails
with an error saying so.

``map(..., combine=f)`` reduces the kernels' outputs with ``f`` in one place, in
file order (so the result does not depend on which task finished first). Spark
runs it as one task after a shuffle; when iterflow holds the result on the
driver (a small variable, such as a model), it collects the kernels' outputs
and runs ``f`` on the driver instead, saving the shuffle and a Python task.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, StructType

from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.runtime.spark.jvm import semantic_hash, spark_context
from iterflow.runtime.spark.planning import static_planning
from iterflow.runtime.spark.schema import map_in_arrow
from iterflow.storage import arrow_filesystem

DIRECTORY_CONF = "spark.iterflow.columnar.dir"

Prepare = Callable[[pa.Table], pa.Table]
Kernel = Callable[..., Iterable[pa.RecordBatch] | pa.Table | pa.RecordBatch]
Combine = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]

#: The column that numbers the file each kernel output came from (before ``combine``).
FILE_COLUMN = "__iterflow_file"
#: Where ``map(..., combine=...)`` notes how its result can be computed on the driver.
_COMBINED_ATTRIBUTE = "_iterflow_combined"

#: Tables a Python worker has opened, by path, most recent last (worker side).
_OPENED: OrderedDict[str, pa.Table] = OrderedDict()
_OPENED_LIMIT = 64


def _filesystem(location: str) -> tuple[pafs.FileSystem | None, str]:
    """The ``pyarrow.fs`` file system and path of ``location`` (None: a local path, which
    is memory-mapped). Python tasks open these files, where there is no JVM: pyarrow is
    the storage layer's way to them (``iterflow.storage``)."""
    return arrow_filesystem(location, DIRECTORY_CONF)


def _open(location: str) -> pa.Table:
    """The table in the Arrow file at ``location``, memory-mapped when it is local."""
    table = _OPENED.get(location)
    if table is not None:
        _OPENED.move_to_end(location)
        return table
    fs, path = _filesystem(location)
    try:
        if fs is None:
            table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        else:
            with fs.open_input_file(path) as source:
                table = pa.ipc.open_file(source).read_all()
    except FileNotFoundError as error:
        raise IterflowError(
            f"columnar data file {location} is not readable on this executor; on a cluster "
            f"of several machines, set {DIRECTORY_CONF} to storage every executor shares"
        ) from error
    _OPENED[location] = table
    while len(_OPENED) > _OPENED_LIMIT:
        _OPENED.popitem(last=False)
    return table


def _batches(
    result: Iterable[pa.RecordBatch] | pa.Table | pa.RecordBatch,
) -> Iterator[pa.RecordBatch]:
    if isinstance(result, pa.Table):
        yield from result.to_batches()
    elif isinstance(result, pa.RecordBatch):
        yield result
    else:
        yield from result


def _writer(
    directory: str, prepare: Prepare | None, schema: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Spark's batches may mark nested fields nullable where the DataFrame's schema
        # does not (an array of non-null elements): take their own schema when there are any.
        received = list(batches)
        table = pa.Table.from_batches(received) if received else schema.empty_table()
        if prepare is not None:
            table = prepare(table)
        # One batch per partition, as resident data holds it: a CombineFn sees the same
        # batches on both paths, and kernels read each column without concatenating it.
        table = table.combine_chunks()
        location = f"{directory.rstrip('/')}/part-{uuid.uuid4().hex}.arrow"
        fs, path = _filesystem(location)
        sink = pa.OSFile(path, "wb") if fs is None else fs.open_output_stream(path)
        with sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        yield pa.RecordBatch.from_pydict(
            {"location": [location], "rows": [table.num_rows]},
            schema=pa.schema([("location", pa.string()), ("rows", pa.int64())]),
        )

    return write


def _arrow_type(data_type: Any) -> pa.DataType:
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type)


#: The StructTypes of the DDL strings kernels declared, parsed once per process.
_DECLARED: dict[str, StructType] = {}


def declared_struct(spark: SparkSession, schema: StructType | str) -> StructType:
    """``schema`` as a StructType; a DDL string is parsed once (a JVM call each time)."""
    if isinstance(schema, StructType):
        return schema
    if schema not in _DECLARED:
        # Parsing a DDL string runs no job (over Spark Connect, one analysis call).
        _DECLARED[schema] = spark.createDataFrame([], schema).schema
    return _DECLARED[schema]


def _declared_arrow_schema(spark: SparkSession, schema: StructType | str) -> pa.Schema:
    """The Arrow schema Spark expects from a kernel declared with ``schema``."""
    fields = declared_struct(spark, schema).fields
    return pa.schema([(f.name, _arrow_type(f.dataType)) for f in fields])


def _conform(batch: pa.RecordBatch, target: pa.Schema, source: str = "a kernel") -> pa.RecordBatch:
    """``batch`` with the column types and names Spark expects, taken by position as
    ``mapInArrow`` takes them. numpy picks types by value, not by declaration (an empty
    ``np.bincount`` is int64 even with float weights), and Spark reads a mistyped Arrow
    column with the declared type's accessor, failing or worse. Errors name ``source``."""
    if batch.num_columns != len(target):
        raise IterflowTypeError(
            f"{source} returned {batch.num_columns} column(s) {batch.schema.names} where "
            f"{len(target)} were declared ({', '.join(target.names)})"
        )
    if batch.schema.types == target.types and batch.schema.names == target.names:
        return batch
    try:
        pairs = zip(batch.columns, target.types, strict=True)
        columns = [column.cast(kind) for column, kind in pairs]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise IterflowTypeError(
            f"{source} returned columns {batch.schema.types} where {target.types} were "
            f"declared: {error}"
        ) from error
    return pa.RecordBatch.from_arrays(columns, names=target.names)


@attrs.frozen
class KernelCall:
    """One ``map`` of a kernel: what runs on each partition, in a task of either path."""

    kernel: Kernel
    args: tuple[Any, ...]
    indexed: bool
    declared: pa.Schema  # the Arrow schema of the kernel's declared output
    numbered: bool  # number the outputs by partition (FILE_COLUMN), for a combine

    def outputs(
        self, index: int, table: pa.Table, rows: pa.Table | None = None
    ) -> Iterator[pa.RecordBatch]:
        """The kernel's record batches for partition ``index``, held in ``table``; ``rows``
        (``map(..., rows=...)``) come after the table."""
        args = self.args if rows is None else (rows, *self.args)
        kernel = self.kernel
        result = kernel(index, table, *args) if self.indexed else kernel(table, *args)
        for out in _batches(result):
            out = _conform(out, self.declared)
            if self.numbered:
                files = pa.array([index] * out.num_rows, pa.int32())
                out = out.append_column(FILE_COLUMN, files)
            yield out


def _with_file_column(schema: StructType | str) -> StructType | str:
    if isinstance(schema, str):
        return f"{schema}, {FILE_COLUMN} INT"
    return StructType([*schema.fields]).add(FILE_COLUMN, IntegerType(), False)


def in_file_order(combine: Combine) -> Combine:
    """``combine`` over the kernels' outputs sorted by file (stable), without the file column."""

    def ordered(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        received = list(batches)
        if not received:
            yield from combine(iter(()))
            return
        table = pa.Table.from_batches(received).sort_by(FILE_COLUMN).drop_columns(FILE_COLUMN)
        yield from combine(iter(table.to_batches()))

    return ordered


@attrs.frozen
class _Combined:
    mapped: DataFrame  # what is combined: the kernels' outputs, or combine()'s partials
    in_order: Combine


def mark_combined(combined: DataFrame, mapped: DataFrame, in_order: Combine) -> DataFrame:
    """Note that the rows of ``combined`` are ``in_order`` over all the rows of ``mapped``,
    so that iterflow may compute them on the driver (``combined_on_driver``)."""
    with contextlib.suppress(AttributeError, TypeError):  # a DataFrame that takes no attributes
        setattr(combined, _COMBINED_ATTRIBUTE, _Combined(mapped, in_order))
    return combined


def combined_on_driver(df: DataFrame) -> pa.Table | None:
    """The rows of ``df``, a ``map(..., combine=...)`` or ``itf.combine`` result, computed by
    collecting what it combines (one Spark job, no shuffle) and combining it here; None for
    any other DataFrame."""
    combined = getattr(df, "__dict__", {}).get(_COMBINED_ATTRIBUTE)
    if combined is None:
        return None
    received = combined.mapped.toArrow()
    batches = list(combined.in_order(iter(received.to_batches())))
    return pa.Table.from_batches(batches) if batches else None


def _task_slots(spark: SparkSession) -> int:
    """Tasks that run at once: the default parallelism (over Spark Connect, unbounded)."""
    context = spark_context(spark)
    return 1 << 30 if context is None else max(int(context.defaultParallelism), 1)


def plan_key(df: DataFrame) -> int:
    """Equal for DataFrames with the same (canonicalized) plan, built separately or not;
    where the plan cannot be reached (a Spark Connect DataFrame), the object's identity."""
    key = semantic_hash(df)
    return id(df) if key is None else key


class ColumnarData:
    """A DataFrame written once as Arrow files, one per partition, read in place by kernels.

    Made by ``RoundContext.columnar(df)``; released with the iteration.
    """

    def __init__(
        self, spark: SparkSession, locations: list[str], rows: int, directory: str
    ) -> None:
        self.spark = spark
        self.locations = locations
        self.rows = rows
        self.directory = directory

    @classmethod
    def write(
        cls, df: DataFrame, prepare: Prepare | None = None, directory: str | None = None
    ) -> ColumnarData:
        """Write every partition of ``df`` (through ``prepare``) as an Arrow file: one job."""
        if not isinstance(df, DataFrame):
            raise IterflowTypeError(f"columnar() takes a DataFrame, got {type(df).__name__}")
        spark = df.sparkSession
        root = directory or spark.conf.get(DIRECTORY_CONF, None) or tempfile.gettempdir()
        folder = f"{root.rstrip('/')}/iterflow-columnar-{uuid.uuid4().hex}"
        fs, path = _filesystem(folder)
        if fs is None:
            os.makedirs(path, exist_ok=True)
        else:
            fs.create_dir(path, recursive=True)
        write = _writer(folder, prepare, _declared_arrow_schema(spark, df.schema))
        # Planned statically, as resident data is: the partitions are the plan's own on both
        # paths (adaptive execution would coalesce them by the sizes of the moment).
        with static_planning(spark):
            written = map_in_arrow(df, write, "location STRING, rows LONG").collect()
        return cls(spark, [r["location"] for r in written], sum(r["rows"] for r in written), folder)

    @property
    def partitions(self) -> int:
        return len(self.locations)

    def reduce(
        self, kernel: Kernel, partial: str, merging: Any, schema: StructType | str, *args: Any
    ) -> DataFrame:
        """A DataFrame of the rows ``merging`` makes of every file's partial:
        ``kernel(index, table, *args)`` gives a file's (``index``, pickled partial) row
        of ``partial``, and ``merging`` (see ``resident_tree.Merging``) merges them all
        in one task, as resident tasks merge them along their tree."""
        return self.map(
            kernel, partial, *args, indexed=True, combine=merging.whole, combine_schema=schema
        )

    def map(
        self,
        kernel: Kernel,
        schema: StructType | str,
        *args: Any,
        indexed: bool = False,
        combine: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None = None,
        combine_schema: StructType | str | None = None,
        rows: DataFrame | None = None,
        by: str | None = None,
    ) -> DataFrame:
        """A DataFrame of ``kernel(table, *args)`` over every file.

        ``kernel`` gets one partition as a ``pyarrow.Table`` and returns a table,
        a record batch or an iterable of record batches matching ``schema``.
        ``args`` travel with the task (Spark broadcasts large ones). With
        ``indexed=True`` it is called as ``kernel(index, table, *args)``, ``index``
        being the file's number (e.g. to seed a per-partition sample). The files
        are split into at most one task per core (a task costs more than a file's
        kernel often does), each calling ``kernel`` on its files in turn.

        ``combine`` (with ``combine_schema``) then runs once over all the kernels'
        record batches, in one task, as in ``mapInArrow``: to sum per-partition
        partials into a model, say. The kernels still run in parallel (a shuffle
        brings their small outputs together; ``coalesce(1)`` would run them one
        after another in that one task).

        ``rows=df, by=column`` runs the kernels in ``df``'s tasks instead, over its rows
        (which stay in Spark: a vertex-state block, say): each file number found in
        ``df[column]`` is one call ``kernel(table, rows, *args)``, ``rows`` being those
        rows of the task as a ``pyarrow.Table``. Files no row names are not read.
        """
        if combine is not None and combine_schema is None:
            raise IterflowTypeError("map(combine=...) needs combine_schema= as well")
        locations = self.locations
        numbered = combine is not None
        declared = _declared_arrow_schema(self.spark, schema)

        call = KernelCall(kernel, args, indexed, declared, numbered)
        if rows is not None or by is not None:
            return self._map_rows(call, schema, rows, by)

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    yield from call.outputs(index, _open(locations[index]))

        count = max(min(len(locations), _task_slots(self.spark)), 1)
        indices = self.spark.range(0, len(locations), 1, count)
        if combine is None:
            return indices.mapInArrow(run, schema)
        mapped = indices.mapInArrow(run, _with_file_column(schema))
        in_order = in_file_order(combine)
        combined = mapped.repartition(1).mapInArrow(in_order, combine_schema)  # type: ignore[arg-type]
        return mark_combined(combined, mapped, in_order)

    def _map_rows(
        self, call: KernelCall, schema: StructType | str, rows: DataFrame | None, by: str | None
    ) -> DataFrame:
        if call.numbered:
            raise IterflowTypeError("map(rows=...) takes no combine=: combine its result instead")
        if not isinstance(rows, DataFrame) or by is None:
            raise IterflowTypeError("map(rows=..., by=...) needs both: a DataFrame and a column")
        if by not in rows.columns:
            raise IterflowValueError(
                f"map(by='{by}'): the rows have no such column; their columns are {rows.columns}"
            )
        locations = self.locations
        position = rows.columns.index(by)

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            received = list(batches)
            if not received:
                return
            table = pa.Table.from_batches(received)
            numbers = pc.unique(table.column(position)).to_pylist()
            for index in sorted(n for n in numbers if n is not None):
                if not 0 <= index < len(locations):
                    raise IterflowValueError(
                        f"map(by='{by}'): a row names file {index}, and there are "
                        f"{len(locations)} (0 to {len(locations) - 1})"
                    )
                mine = table.filter(pc.equal(table.column(position), index))
                yield from call.outputs(index, _open(locations[index]), mine)

        return map_in_arrow(rows, run, schema)

    def release(self) -> None:
        """Delete the files (driver side)."""
        fs, path = _filesystem(self.directory)
        if fs is None:
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                fs.delete_dir(path)

    def __repr__(self) -> str:
        return f"ColumnarData({self.rows} rows in {self.partitions} files under {self.directory})"
