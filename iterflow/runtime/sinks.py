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

Where a run starts decides what a ``FileSink`` keeps: a bounded run that starts
fresh deletes every ``epoch=<n>`` directory under its path, and one that resumes
from a checkpoint (or rolls back to one) deletes the epochs after it, which run
again; an unbounded query drops the epochs after its last commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.runtime.files import files_for

FORMATS = ("parquet", "json", "csv", "orc")
EPOCH_COLUMN = "epoch"


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
        (
            df.write.mode("overwrite")
            .format(self.format)
            .options(**self.options)
            .save(self.epoch_path(epoch))
        )

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
    """A user function ``(df, epoch) -> None``; it must be idempotent per epoch."""

    fn: Callable[[DataFrame, int], Any]

    def write(self, df: DataFrame, epoch: int, rows: int) -> None:
        self.fn(df, epoch)

    def discard_after(self, spark: SparkSession, epoch: int) -> None:
        """Nothing to do: a callable sink is called again for every epoch that runs again."""


def sink_of(name: str, target: Any) -> Sink:
    if isinstance(target, FileSink):
        return target
    if callable(target):
        return CallableSink(target)
    raise IterflowTypeError(
        f"sink('{name}', ...) takes itf.FileSink(path, format=...) or a function "
        f"(df, epoch) -> None, got {type(target).__name__}"
    )
