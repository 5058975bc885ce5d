"""Schemas: feedback compared with its input (nullability ignored), described as DDL,
whether rows of a schema can be held on the driver as Arrow, and column names quoted."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    NumericType,
    StructField,
    StructType,
    UserDefinedType,
)


def quoted_name(column: str) -> str:
    """``column`` as a quoted identifier: a name with dots or backticks, taken whole."""
    return "`" + column.replace("`", "``") + "`"


def quoted(column: str) -> Column:
    """The column named ``column`` (dots and backticks in it taken literally)."""
    return F.col(quoted_name(column))


def map_in_arrow(
    df: DataFrame,
    function: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: Any,
) -> DataFrame:
    """``df.mapInArrow(function, schema)`` for any column names: PySpark resolves each
    column of ``df`` by name (``df[name]``), which fails for a name with a dot or a
    backtick, so such columns reach Spark renamed and ``function`` sees them under their
    own names again."""
    names = df.columns
    if not any("." in name or "`" in name for name in names):
        return df.mapInArrow(function, schema)

    def renamed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return function(pa.RecordBatch.from_arrays(b.columns, names=names) for b in batches)

    return df.toDF(*(f"_{i}" for i in range(len(names)))).mapInArrow(renamed, schema)


def without_nullability(data_type: DataType) -> DataType:
    """``data_type`` with every nullability flag set to True (so widening compares equal)."""
    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, without_nullability(f.dataType), True) for f in data_type.fields]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(without_nullability(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(
            without_nullability(data_type.keyType), without_nullability(data_type.valueType), True
        )
    return data_type


def schema_differences(expected: StructType, actual: StructType) -> list[str]:
    """Human-readable differences between two schemas; empty when they match.

    Column order and nullability do not count.
    """
    want = {f.name: f.dataType for f in expected.fields}
    have = {f.name: f.dataType for f in actual.fields}
    problems: list[str] = []
    for name, data_type in want.items():
        if name not in have:
            problems.append(f"column '{name}' ({data_type.simpleString()}) is missing")
        elif without_nullability(have[name]) != without_nullability(data_type):
            problems.append(
                f"column '{name}' is {have[name].simpleString()}, "
                f"expected {data_type.simpleString()}"
            )
    problems.extend(
        f"column '{name}' ({have[name].simpleString()}) is not in the input"
        for name in have
        if name not in want
    )
    return problems


def repeated_columns(columns: Sequence[str], case_sensitive: bool = False) -> list[str]:
    """The names that two or more of ``columns`` share (compared as Spark resolves them:
    ignoring case unless ``spark.sql.caseSensitive``), each once, in order."""
    key = (lambda c: c) if case_sensitive else str.lower
    seen: dict[str, int] = {}
    for column in columns:
        seen[key(column)] = seen.get(key(column), 0) + 1
    named: dict[str, None] = {}
    for column in columns:
        if seen[key(column)] > 1:
            named.setdefault(column)
    return list(named)


def has_user_type(data_type: DataType) -> bool:
    """True when ``data_type`` is or contains a user-defined type (such as an ML vector),
    which Arrow tables do not carry back into a DataFrame."""
    if isinstance(data_type, UserDefinedType):
        return True
    if isinstance(data_type, StructType):
        return any(has_user_type(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return has_user_type(data_type.elementType)
    if isinstance(data_type, MapType):
        return has_user_type(data_type.keyType) or has_user_type(data_type.valueType)
    return False


def is_numeric(data_type: Any) -> bool:
    return isinstance(data_type, NumericType)


def schema_ddl(schema: StructType) -> str:
    """``schema`` as DDL, e.g. ``"id BIGINT, rank DOUBLE"``."""
    return ", ".join(f"{f.name} {f.dataType.simpleString().upper()}" for f in schema.fields)


def describe_inputs(
    inputs: Mapping[str, DataFrame], replay: Collection[str]
) -> dict[str, dict[str, Any]]:
    """Input name -> ``{"schema": DDL, "replay": bool}``, as event logs and checkpoints keep it."""
    return {
        name: {"schema": schema_ddl(df.schema), "replay": name in replay}
        for name, df in inputs.items()
    }
