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
or a URI that ``pyarrow.fs`` opens (``s3://``, ``gs://``, ``hdfs://``...). A
task that cannot find its file fails with an error saying so.
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

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iterflow.errors import IterflowError, IterflowTypeError

DIRECTORY_CONF = "spark.iterflow.columnar.dir"

Prepare = Callable[[pa.Table], pa.Table]
Kernel = Callable[..., Iterable[pa.RecordBatch] | pa.Table | pa.RecordBatch]

#: Tables a Python worker has opened, by path, most recent last (worker side).
_OPENED: OrderedDict[str, pa.Table] = OrderedDict()
_OPENED_LIMIT = 64


def _filesystem(location: str) -> tuple[pafs.FileSystem | None, str]:
    if "://" in location and not location.startswith("file://"):
        return pafs.FileSystem.from_uri(location)
    return None, location.removeprefix("file://")


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


def plan_key(df: DataFrame) -> int:
    """Equal for DataFrames with the same (canonicalized) plan, built separately or not;
    where the plan cannot be reached (a Spark Connect DataFrame), the object's identity."""
    try:
        return int(df._jdf.queryExecution().analyzed().semanticHash())
    except AttributeError:
        return id(df)


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
        schema = pa.schema([(f.name, _arrow_type(f.dataType)) for f in df.schema.fields])
        write = _writer(folder, prepare, schema)
        written = df.mapInArrow(write, "location STRING, rows LONG").collect()
        return cls(spark, [r["location"] for r in written], sum(r["rows"] for r in written), folder)

    @property
    def partitions(self) -> int:
        return len(self.locations)

    def map(
        self, kernel: Kernel, schema: StructType | str, *args: Any, indexed: bool = False
    ) -> DataFrame:
        """A DataFrame of ``kernel(table, *args)`` over every file (one task each).

        ``kernel`` gets one partition as a ``pyarrow.Table`` and returns a table,
        a record batch or an iterable of record batches matching ``schema``.
        ``args`` travel with the task (Spark broadcasts large ones). With
        ``indexed=True`` it is called as ``kernel(index, table, *args)``, ``index``
        being the file's number (e.g. to seed a per-partition sample).
        """
        locations = self.locations

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    table = _open(locations[index])
                    result = kernel(index, table, *args) if indexed else kernel(table, *args)
                    yield from _batches(result)

        count = max(len(locations), 1)
        indices = self.spark.range(0, len(locations), 1, count)
        return indices.mapInArrow(run, schema)

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
