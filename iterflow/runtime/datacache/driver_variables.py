"""Small variables live on the driver between rounds.

A variable that had at most ``spark.iterflow.driverRows`` rows in the previous
round (a model, a vertex-state vector) is collected as a pyarrow Table rather
than checkpointed, and continues as a DataFrame over those rows: the next body
reads it (``itf.to_arrow``) without a Spark job, and a commit writes it without
one. A resident kernel's result is such rows too. Everything about those rows
is here: which variables qualify, how their frames are made and recognised,
and how they are read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from datetime import timezone
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, TimestampType

from iterflow.errors import IterflowValueError
from iterflow.runtime.spark.jvm import (
    HELD_ATTRIBUTE,
    held_on_driver,
    is_classic,
    is_local,
    lazy_local_frame,
)

#: A variable that had at most this many rows in the previous round is collected rather
#: than checkpointed: the next body (and a commit) reads it without a Spark job...
DRIVER_ROWS = 1_000
#: ... (the Spark setting that changes it; 0 checkpoints every variable) ...
DRIVER_ROWS_CONF = "spark.iterflow.driverRows"
#: ... unless it took more than this many bytes on the driver (one row can be a long vector).
DRIVER_BYTES = 64 << 20


def driver_rows(spark: SparkSession) -> int:
    """The largest variable (in rows) held on the driver between rounds: ``DRIVER_ROWS_CONF``."""
    setting = spark.conf.get(DRIVER_ROWS_CONF, None)
    if setting is None:
        return DRIVER_ROWS
    try:
        limit = int(setting)
    except ValueError:
        limit = -1
    if limit < 0:
        raise IterflowValueError(
            f"{DRIVER_ROWS_CONF}={setting!r}: use a row count (0 keeps every variable in Spark)"
        )
    return limit


@attrs.define
class DriverVariables:
    """Which variables a round holds on the driver, from the rows of the previous round."""

    limit: int  # variables up to this many rows live on the driver
    in_spark: frozenset[str] = frozenset()  # bound with on_driver=False: never held here
    rows: dict[str, int] = attrs.Factory(dict)  # of each variable in the previous round
    tables: dict[str, pa.Table] = attrs.Factory(dict)  # of those held on the driver
    outputs: dict[str, int] = attrs.Factory(dict)  # rows of each output in the previous round

    def count_local(self, inputs: Mapping[str, DataFrame]) -> None:
        """Count the ``inputs`` that are rows on the driver already (local relations, such as
        a model made with ``createDataFrame``), without a Spark job, up to ``limit + 1``:
        what round 0 goes by to hold its feedback on the driver."""
        if self.limit > 0:
            self.rows = {
                name: len(df.limit(self.limit + 1).collect())
                for name, df in inputs.items()
                if is_local(df)
            }

    def small(self, names: Collection[str]) -> list[str]:
        """The variables among ``names`` held on the driver this round: those whose previous
        round had at most ``limit`` rows (unknown counts, as at round 0, do not) and, when
        held on the driver, at most ``DRIVER_BYTES`` bytes."""
        return [
            name
            for name in names
            if name not in self.in_spark
            and self.rows.get(name, self.limit + 1) <= self.limit
            and (name not in self.tables or self.tables[name].nbytes <= DRIVER_BYTES)
        ]

    def small_outputs(self) -> list[str]:
        """The outputs that had at most ``limit`` rows in the previous round (none at round
        0): those a run that holds outputs on the driver collects this round."""
        return [name for name, rows in self.outputs.items() if rows <= self.limit]


def hold_on_driver(df: DataFrame, table: pa.Table) -> DataFrame:
    """Note that ``df`` is a local DataFrame over ``table``: reading it back needs no job."""
    with contextlib.suppress(AttributeError, TypeError):  # a DataFrame that takes no attributes
        setattr(df, HELD_ATTRIBUTE, table)
    return df


def held_frame(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame:
    """A DataFrame over the rows of ``table`` (with ``schema``), held on the driver.

    On a classic session its JVM side is made only when Spark needs it: a variable
    that the next round reads with ``to_arrow`` and a round's bookkeeping (schema
    checks, the driver's own release) then cost no JVM call, which is most of what a
    resident round would otherwise cost. Over Spark Connect it is an ordinary local
    DataFrame.
    """
    if not is_classic(spark):
        return hold_on_driver(local_frame(spark, table, schema), table)
    return lazy_local_frame(spark, table, schema, HELD_ATTRIBUTE)


def from_arrow(
    table: pa.Table, *, spark: SparkSession | None = None, schema: StructType | None = None
) -> DataFrame:
    """A DataFrame over the rows of a pyarrow ``table``, held on the driver: the other way
    of ``to_arrow``. A body that computes on the driver returns its feedback with it; the
    next round (and a commit) reads the rows back with ``to_arrow`` without a Spark job,
    as it reads a small variable. ``schema`` (a ``StructType``) overrides the one made
    from the table's; ``spark`` defaults to the active session.

    Example, in a body::

        counts = pa.table({"key": keys, "n": totals})
        return itf.Declaration(feedback={"counts": itf.from_arrow(counts)})
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    session = spark if spark is not None else SparkSession.getActiveSession()
    if session is None:
        raise IterflowValueError("from_arrow(table): no active SparkSession; pass spark=")
    if not isinstance(table, pa.Table):
        raise IterflowValueError(
            f"from_arrow(table): a pyarrow.Table is needed, not {type(table).__name__}"
        )
    kind = schema if schema is not None else from_arrow_schema(table.schema)
    return held_frame(session, table, kind)


def local_frame(spark: SparkSession, table: pa.Table, schema: StructType) -> DataFrame:
    """A DataFrame over the rows of a pyarrow ``table``, held in the plan (no Spark job)."""
    # One chunk: PySpark 4.0.0's Connect client keeps only the first chunk of a table
    # (a table collected from two partitions came back with half its rows).
    return spark.createDataFrame(table.combine_chunks(), schema=schema)


def to_arrow(df: DataFrame) -> pa.Table:
    """The rows of ``df`` as a ``pyarrow.Table``: read from the driver, with no Spark job
    and no JVM call, when iterflow holds them there (a variable of at most
    ``spark.iterflow.driverRows`` rows between rounds, a resident kernel's result);
    from a ``collect()`` for other rows held in the plan (no Spark job either);
    otherwise ``df.toArrow()``.

    Example, in a body or a listener::

        weights = itf.to_arrow(model).column("w")[0].values.to_numpy()
    """
    held = held_on_driver(df)
    if held is not None:
        return held
    if is_local(df):  # rows in the plan: collect() runs no Spark job, toArrow() would
        rows = [_plain(row, df.schema) for row in df.collect()]
        with contextlib.suppress(pa.ArrowException, TypeError, ValueError):
            return pa.Table.from_pylist(rows, schema=_arrow_schema(df.schema))
    return df.toArrow()


def _arrow_schema(schema: StructType) -> pa.Schema:
    """``schema`` in Arrow's terms, timestamps as UTC instants (PySpark 4.0 makes them so
    without being asked, and takes no ``timezone``)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:
        return to_arrow_schema(schema)


def _plain(value: Any, kind: DataType) -> Any:
    """A collected value as ``pa.Table.from_pylist`` takes it: rows as dicts, following
    the schema, so that a list of numbers is passed as it is (``Row.asDict(recursive=True)``
    visits every element: 3 s for a vector of 2,000,000 ranks)."""
    if value is None:
        return None
    if isinstance(kind, TimestampType) and value.tzinfo is None:
        return value.astimezone(timezone.utc)  # collect() gives the local time of the instant
    if isinstance(kind, StructType):
        return {f.name: _plain(value[i], f.dataType) for i, f in enumerate(kind.fields)}
    if isinstance(kind, ArrayType):
        if not _nested(kind.elementType):
            return value
        return [_plain(item, kind.elementType) for item in value]
    if isinstance(kind, MapType) and _nested(kind.valueType):
        return {key: _plain(item, kind.valueType) for key, item in value.items()}
    return value


def _nested(kind: DataType) -> bool:
    """Whether values of ``kind`` hold rows that ``_plain`` must turn into dicts."""
    return isinstance(kind, (StructType, ArrayType, MapType))


def vector(df: DataFrame, column: str, row: int = 0) -> np.ndarray:
    """The array in ``column`` of row ``row`` of ``df`` as a numpy array: the way to read
    a model or a vertex-state vector kept as one row (a variable held on the driver
    between rounds is read without a Spark job, as ``to_arrow`` reads it).

    The array may share the rows' memory and then be read-only: copy it (``.copy()``,
    ``.astype(...)``) to change it in place. Null elements read as NaN.

    Example, in a body::

        centroids = itf.vector(model, "centroids").reshape(k, dims)
    """
    table = to_arrow(df)
    if column not in table.column_names:
        raise IterflowValueError(
            f"vector(df, '{column}'): no column '{column}'; the columns are {table.column_names}"
        )
    if not 0 <= row < table.num_rows:
        raise IterflowValueError(
            f"vector(df, '{column}', row={row}): the DataFrame has {table.num_rows} row(s)"
        )
    cell = table.column(column)[row]
    if not isinstance(cell, (pa.ListScalar, pa.LargeListScalar, pa.FixedSizeListScalar)):
        raise IterflowValueError(
            f"vector(df, '{column}'): the column is {table.schema.field(column).type}, not an array"
        )
    if not cell.is_valid:
        raise IterflowValueError(f"vector(df, '{column}', row={row}): the array is null")
    return cell.values.to_numpy(zero_copy_only=False)


def vector_cell(values: Any) -> pa.ListArray:
    """One list cell holding ``values`` (a whole vector in one row): how a kernel returns
    a vector, e.g. ``pa.table([itf.vector_cell(gradient)], names=["gradient"])``."""
    array = pa.array(values)
    return pa.ListArray.from_arrays(pa.array(np.array([0, len(array)], dtype=np.int32)), array)
