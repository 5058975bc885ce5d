"""A round's criteria and convergence values, counted and read by one Spark job.

Before, each criteria cost a job to learn whether it was empty and each convergence
value a job to read its cell; the criteria's rows were never counted, so a loop driven
by its criteria had no remaining-rounds estimate. A ``Tally`` unions one small aggregate
per criteria (its row count) and per value (its row count and first cell) into one
DataFrame: one job reads them all. When the round also collects a target to the driver
(a small variable), the tally rides on that job instead: its rows are observed
(``Observation``) on a branch that keeps none of them, unioned with the target, so the
round runs no job for its bookkeeping at all.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import attrs
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    MapType,
    NullType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from iterflow.errors import IterflowValueError


@attrs.frozen
class Counted:
    """What a tally read: rows of each criteria, and each value's cell (by ``id()``)."""

    rows: dict[int, int]
    values: dict[int, Any]


class Tally:
    """The criteria (``criteria``) and one-cell values (``values``) of one round."""

    def __init__(self, criteria: Sequence[DataFrame], values: Sequence[DataFrame]) -> None:
        self.criteria = list({id(df): df for df in criteria}.values())
        self.values = list({id(df): df for df in values}.values())
        #: The type of each value's cell, which its own column carries in the union.
        self._types: list[DataType] = [df.schema.fields[0].dataType for df in self.values]

    def __bool__(self) -> bool:
        return bool(self.criteria or self.values)

    def frame(self) -> DataFrame:
        """One row per criteria and per value: ``part``, ``rows``, ``v0``, ``v1``, ..."""
        parts = [self._part(i, df, None) for i, df in enumerate(self.criteria)]
        first = len(parts)
        parts += [self._part(first + k, df, k) for k, df in enumerate(self.values)]
        return functools.reduce(DataFrame.union, parts)

    def _part(self, part: int, df: DataFrame, value: int | None) -> DataFrame:
        """The aggregate row of ``df``: its row count, and its first cell as ``v{value}``."""
        cells: list[Column] = [
            F.lit(None).cast(kind).alias(f"v{k}") for k, kind in enumerate(self._types)
        ]
        if value is not None:  # the first column, named by position (any name may be odd)
            df = df.toDF(*[f"c{i}" for i in range(len(df.columns))])
            cells[value] = F.first("c0").alias(f"v{value}")
        return df.agg(F.lit(part).alias("part"), F.count(F.lit(1)).alias("rows"), *cells)

    def collect(self, epoch: int) -> Counted:
        """Read the tally with a job of its own."""
        return self._read([row.asDict() for row in self.frame().collect()], epoch)

    def rides(self) -> bool:
        """Whether the tally can ride on another job: each observed metric is a plain
        value (a value of an array, map or struct type is read by a job of its own)."""
        return not any(isinstance(kind, (ArrayType, MapType, StructType)) for kind in self._types)

    def riding(self, target: DataFrame, observation: Observation) -> DataFrame:
        """``target`` with the tally observed into ``observation`` on the same job: a
        branch that keeps none of the tally's rows (a count is never negative), in the
        shape of ``target``. Read it with ``observed`` after the job."""
        tally = self.frame()
        metrics = [  # one plain metric per part and value (PySpark 4.0 reads no lists)
            F.max(F.when(F.col("part") == part, F.col("rows"))).alias(f"rows{part}")
            for part in range(len(self.criteria) + len(self.values))
        ] + [
            F.max(F.when(F.col("part") == len(self.criteria) + k, F.col(f"v{k}"))).alias(f"v{k}")
            for k in range(len(self.values))
        ]
        side = (
            tally.observe(observation, *metrics)
            .where(F.col("rows") < 0)
            .select(*[zero(f.dataType).alias(f.name) for f in target.schema.fields])
        )
        return target.union(side)

    def observed(self, observation: Observation, epoch: int) -> Counted:
        """What ``riding`` observed, once its job ran."""
        got = dict(observation.get)
        parts = len(self.criteria) + len(self.values)
        cells = {f"v{k}": got.get(f"v{k}") for k in range(len(self.values))}
        rows = [{"part": i, "rows": got.get(f"rows{i}"), **cells} for i in range(parts)]
        return self._read([row for row in rows if row["rows"] is not None], epoch)

    def _read(self, rows: list[dict[str, Any]], epoch: int) -> Counted:
        by_part = {int(row["part"]): row for row in rows}
        if len(by_part) != len(self.criteria) + len(self.values):
            raise RuntimeError(f"epoch {epoch}: the round's tally lost rows ({by_part})")
        counted = {id(df): int(by_part[i]["rows"]) for i, df in enumerate(self.criteria)}
        cells: dict[int, Any] = {}
        for k, df in enumerate(self.values):
            row = by_part[len(self.criteria) + k]
            if row["rows"] != 1:
                count = "no rows" if row["rows"] == 0 else "more than one row"
                raise IterflowValueError(
                    f"epoch {epoch}: the convergence value has {count}; "
                    "it must be a one-row aggregate such as df.agg(F.max(...))"
                )
            cells[id(df)] = row[f"v{k}"]
        return Counted(rows=counted, values=cells)


def zero(kind: DataType) -> Column:
    """A literal of type ``kind`` that is never null (a branch of a union made of such
    columns keeps the other branch's nullability)."""
    if isinstance(kind, StructType):
        return F.struct(*[zero(f.dataType).alias(f.name) for f in kind.fields])
    if isinstance(kind, ArrayType):
        return F.array().cast(kind)
    if isinstance(kind, MapType):
        return F.create_map().cast(kind)
    if isinstance(kind, NullType):
        return F.lit(None)
    literal = _ZEROS.get(type(kind), 0)
    return F.lit(literal).cast(kind)


#: Python values whose literals cast to their type without a chance of null (decimals:
#: from ``decimal(1,0)``, which fits every decimal type but ``decimal(p, p)``... also 0).
_ZEROS: dict[type, Any] = {
    StringType: "",
    BinaryType: bytearray(),
    BooleanType: False,
    DecimalType: Decimal(0),
    DateType: date(1970, 1, 1),
    TimestampType: datetime(1970, 1, 1),
    TimestampNTZType: datetime(1970, 1, 1),
}
