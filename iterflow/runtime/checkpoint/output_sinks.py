"""Where an iteration's outputs go, epoch by epoch (round by round), exactly once.

Both loops take sinks through ``.sink(name, target)``: an unbounded iteration
writes every epoch's output, a bounded one every round's (``result.outputs`` still
holds only the last round's).

``FileSink`` writes each epoch's rows of an output to its own directory,
``<path>/epoch=<n>``, replacing whatever an interrupted earlier attempt left
there: an epoch that runs again after a crash writes the same directory again,
so the sink holds every row once. Reading ``<path>`` back gives an ``epoch``
column (Spark's partition discovery).

A callable sink ``(df, epoch) -> None`` is called at least once per epoch; after
a crash it is called again with the same epoch and rows, so it must be
idempotent per epoch (e.g. a MERGE keyed by epoch, or an overwrite of the
epoch's partition).

Where a run starts decides what a sink keeps: a bounded run that starts fresh
drops every epoch (``discard_after(-1)``), and one that resumes from a checkpoint
(or rolls back to one) drops the epochs after it, which run again; an unbounded
query drops the epochs after its last commit. A ``FileSink`` deletes their
``epoch=<n>`` directories. A callable sink is told through its own
``discard_after(epoch)`` method when it has one (an object with ``__call__(df,
epoch)`` and ``discard_after(epoch)``). Only an unbounded query that commits off
the loop's path needs it: after a rewind, Spark plans the micro-batches after the
last commit afresh, so the epochs after it may hold other rows, or fewer epochs
may run, and a sink that kept the crashed attempt's epochs would hold them twice
or hold epochs that no longer exist (``check_discarding``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.runtime.spark.files import files_for
from iterflow.runtime.spark.jvm import held_on_driver
from iterflow.runtime.spark.schema import without_nullability

FORMATS = ("parquet", "json", "csv", "orc")
EPOCH_COLUMN = "epoch"
#: The method of a callable sink that drops what it holds of the epochs after one.
DISCARD_HOOK = "discard_after"


#: The one file of an epoch written from the driver.
PART_FILE = "part-00000-driver.parquet"
#: The key of the parquet footer under which Spark keeps a file's Spark schema.
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


def parquet_bytes(table: Any, schema: StructType) -> bytes | None:
    """``table`` as a parquet file of Spark's ``schema`` (its JSON in the footer, as Spark
    writes it); None when the table's Arrow types are not those Spark reads back as that
    schema (then Spark's writer converts them)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        rows = table.select(schema.fieldNames())
        same = _plain_types(rows.schema) and without_nullability(
            from_arrow_schema(rows.schema)
        ) == without_nullability(schema)
    except (pa.ArrowException, TypeError, ValueError, KeyError):
        return None
    if not same:
        return None
    rows = rows.replace_schema_metadata({SPARK_SCHEMA_KEY: schema.json().encode()})
    sink = pa.BufferOutputStream()
    # Spark reads microseconds (pandas makes nanoseconds): as Spark's writer, truncate.
    pq.write_table(rows, sink, coerce_timestamps="us", allow_truncated_timestamps=True)
    return bytes(sink.getvalue().to_pybytes())


def _plain_types(schema: pa.Schema) -> bool:
    """Arrow types that parquet keeps as Spark writes them: numbers, booleans, strings,
    binary, lists and structs of them, and timestamps with a time zone (instants)."""

    def plain(kind: pa.DataType) -> bool:
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return plain(kind.value_type)
        if pa.types.is_struct(kind):
            return all(plain(kind.field(i).type) for i in range(kind.num_fields))
        if pa.types.is_timestamp(kind):
            return kind.tz is not None
        return bool(
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
        )

    return all(plain(field.type) for field in schema)


class Sink(Protocol):
    def write(self, df: DataFrame, epoch: int, rows: int) -> None: ...

    def discard_after(self, spark: SparkSession, epoch: int) -> None: ...


def _format(_instance: Any, _attribute: Any, value: str) -> None:
    if value not in FORMATS:
        raise IterflowValueError(f"FileSink(format='{value}'): use one of {list(FORMATS)}")


@attrs.frozen
class FileSink:
    """Each epoch's rows of an output under ``path/epoch=<n>``, exactly once, crashes included.

    Example::

        .sink("predictions", itf.FileSink("/data/predictions", format="parquet"))
        spark.read.parquet("/data/predictions")   # every epoch, with an ``epoch`` column
    """

    path: str = attrs.field(converter=str)
    format: str = attrs.field(default="parquet", validator=_format)
    options: Mapping[str, str] = attrs.field(factory=dict, converter=dict)

    def epoch_path(self, epoch: int) -> str:
        return f"{self.path.rstrip('/')}/{EPOCH_COLUMN}={epoch}"

    def write(self, df: DataFrame, epoch: int, rows: int) -> None:
        if EPOCH_COLUMN in df.columns:
            raise IterflowValueError(
                f"FileSink('{self.path}'): the output has a column '{EPOCH_COLUMN}', which "
                "is the name of the directory level each epoch is written to; rename it"
            )
        if rows == 0:
            # Nothing to hold; drop what an earlier attempt of this epoch may have left.
            files, target = files_for(df.sparkSession, self.epoch_path(epoch))
            files.delete(target)
            return
        if self._written_from_driver(df, epoch):
            return
        (
            df.write.mode("overwrite")
            .format(self.format)
            .options(**self.options)
            .save(self.epoch_path(epoch))
        )

    def _written_from_driver(self, df: DataFrame, epoch: int) -> bool:
        """Write rows held on the driver (``itf.from_arrow``, a small variable) as one
        parquet file with pyarrow, as Spark's writer would lay them out (Spark's schema in
        the footer), without a Spark job: a job over driver-side rows first ships them to
        the JVM. False where that does not apply (another format, options, types that
        Arrow does not map back), and Spark writes them."""
        table = held_on_driver(df)
        if table is None or self.format != "parquet" or self.options:
            return False
        data = parquet_bytes(table, df.schema)
        if data is None:
            return False
        files, target = files_for(df.sparkSession, self.epoch_path(epoch))
        files.delete(target)
        hidden = f"{target}/_writing-{PART_FILE}"  # hidden from readers until renamed
        files.write_bytes(hidden, data)
        files.rename(hidden, f"{target}/{PART_FILE}")
        files.write_bytes(f"{target}/_SUCCESS", b"")
        return True

    def discard_after(self, spark: SparkSession, epoch: int) -> None:
        """Delete the epochs after ``epoch`` (the last committed one): a crashed attempt
        wrote them, and the restarted iteration may take them with other rows."""
        files, root = files_for(spark, self.path)
        for name in files.children(root):
            number = name.removeprefix(f"{EPOCH_COLUMN}=")
            if number != name and number.isdigit() and int(number) > epoch:
                files.delete(f"{root}/{name}")

    def read(self, spark: SparkSession, schema: Any = None) -> DataFrame:
        """Every epoch written so far, with an ``epoch`` column."""
        reader = spark.read.format(self.format).options(**self.options)
        return (reader.schema(schema) if schema is not None else reader).load(self.path)


@attrs.frozen
class CallableSink:
    """A user function ``(df, epoch) -> None`` for output ``name``; it must be idempotent
    per epoch. Its ``discard_after(epoch)`` method, if it has one, drops what the function
    holds of the epochs after ``epoch``."""

    name: str
    fn: Callable[[DataFrame, int], Any]

    @property
    def discards(self) -> bool:
        """The function has a ``discard_after(epoch)`` method."""
        return callable(getattr(self.fn, DISCARD_HOOK, None))

    def write(self, df: DataFrame, epoch: int, rows: int) -> None:
        self.fn(df, epoch)

    def discard_after(self, spark: SparkSession, epoch: int) -> None:
        """The function's own ``discard_after(epoch)``; without one, nothing: it is called
        again for every epoch that runs again (``check_discarding`` refuses it where
        that is not enough)."""
        if self.discards:
            getattr(self.fn, DISCARD_HOOK)(epoch)


def sink_of(name: str, target: Any) -> Sink:
    if isinstance(target, FileSink):
        return target
    if callable(target):
        hook = getattr(target, DISCARD_HOOK, None)
        if hook is not None and not _takes_an_epoch(hook):
            raise IterflowTypeError(
                f"sink('{name}', ...): the sink's {DISCARD_HOOK} must be a method "
                f"{DISCARD_HOOK}(epoch) -> None, called with the last epoch whose writes stay "
                "(it drops the epochs after it); give it that signature, or rename it"
            )
        return CallableSink(name, target)
    raise IterflowTypeError(
        f"sink('{name}', ...) takes itf.FileSink(path, format=...) or a function "
        f"(df, epoch) -> None, got {type(target).__name__}"
    )


def _takes_an_epoch(hook: Any) -> bool:
    if not callable(hook):
        return False
    try:
        inspect.signature(hook).bind(0)
    except TypeError:
        return False
    except ValueError:
        return True  # no signature to read (a builtin): trust it
    return True


def check_discarding(sinks: Mapping[str, Sink], option: str) -> None:
    """Every sink can drop the epochs after the last commit, as ``option`` needs: a
    callable sink must have a ``discard_after(epoch)`` method."""
    for name, sink in sinks.items():
        if isinstance(sink, CallableSink) and not sink.discards:
            raise IterflowValueError(
                f"{option}: sink '{name}' is a function without a {DISCARD_HOOK}(epoch) "
                "method. After a crash the epochs since the last commit run again on the "
                "micro-batches Spark plans afresh, possibly with other rows or as fewer "
                "epochs, and the function would keep what the crashed attempt gave it. "
                f"Give it a {DISCARD_HOOK}(epoch) method that drops what it holds of the "
                "epochs after that epoch (an object with __call__(df, epoch) and "
                f"{DISCARD_HOOK}(epoch)), use itf.FileSink, or use commit_interval_s=None"
            )
