"""Where every vertex of the block path is: the vertices, in the order of their ids, split
into B ranges (*blocks*). A vertex's *position* is its rank in that order, and within its
block its *offset*. Ids that are integers without gaps get their block and offset by
arithmetic; other ids by a numbering in Spark that the edges are joined with.

B: at least the task slots (every stage uses every core), enough that a block holds at
most ``BLOCK_VERTICES`` vertices and its edge file at most ``BLOCK_EDGES`` edges, and a
multiple of the slots, so that the tasks of a stage come out even.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from iterflow.graph.graphs import GraphError

#: At most this many vertices in a block (a slice of doubles: 32 MiB).
BLOCK_VERTICES = 1 << 22
#: At most this many edges in a block's file (about 320 MiB for PageRank's columns).
BLOCK_EDGES = 1 << 24
#: Sampled ids per block, from which the block boundaries are picked.
SAMPLE_PER_BLOCK = 64

#: Makes the rows of one block (a number) as Arrow batches.
BlockRows = Callable[[int], Iterator[pa.RecordBatch]]


def task_slots(spark: SparkSession) -> int:
    """Tasks that run at once: Spark's default parallelism (over Spark Connect, which has
    no SparkContext, ``spark.default.parallelism`` or else 2)."""
    try:
        return max(int(spark.sparkContext.defaultParallelism), 1)
    except PySparkNotImplementedError:
        return max(int(spark.conf.get("spark.default.parallelism", None) or 2), 1)


def block_count(spark: SparkSession, vertices: int, edges: int, blocks: int | None) -> int:
    """B: ``blocks`` when given (checked), else chosen as the module says."""
    if blocks is not None:
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
            raise GraphError(f"blocks={blocks!r}: give a number of blocks of at least 1")
        return blocks
    slots = task_slots(spark)
    needed = max(slots, -(-vertices // BLOCK_VERTICES), -(-edges // BLOCK_EDGES))
    return -(-needed // slots) * slots


@attrs.frozen
class Layout:
    """Where every vertex is: ``positions`` has ``id``, ``block``, ``offset`` and
    ``position`` (persisted until ``release``); block b holds ``sizes[b]`` vertices,
    positions ``starts[b]`` on.

    With ``first`` set, the ids are the integers ``first .. first + n - 1`` and block b
    holds the ``step`` ids from ``first + b * step`` on: a vertex's place is arithmetic
    on its id, and edges and results find it without a join."""

    blocks: int
    sizes: tuple[int, ...]
    keys: tuple[int, ...]  # repartition(blocks, keys[b]) puts block b in partition b
    positions: DataFrame
    first: int | None = None
    step: int = 0

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(int(s) for s in np.concatenate([[0], np.cumsum(self.sizes)[:-1]]))

    @property
    def vertices(self) -> int:
        return int(sum(self.sizes))

    @property
    def dense(self) -> tuple[int, int, int] | None:
        """``(first, step, n)`` of a dense layout (for ``edge_file``), else None."""
        return None if self.first is None else (self.first, self.step, self.vertices)

    def placed(self, df: DataFrame, block: str | Column = "block") -> DataFrame:
        """``df`` in ``blocks`` partitions, the rows of block b (column ``block``) in the b-th."""
        keys = F.array(*(F.lit(k).cast("bigint") for k in self.keys))  # hashed as bigint
        number = F.col(block) if isinstance(block, str) else block
        return df.repartition(self.blocks, F.element_at(keys, number + 1))

    def per_block(self, kernel: BlockRows, schema: str) -> DataFrame:
        """One row per block made by ``kernel(block)`` (a batch), in the block's partition:
        a first state that reads no vertex data."""
        spark = self.positions.sparkSession

        def make(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for block in batch.column(0).to_pylist():
                    yield from kernel(int(block))

        numbers = spark.range(0, self.blocks, 1, max(min(self.blocks, 64), 1))
        return self.placed(
            numbers.select(F.col("id").cast("int").alias("block")).mapInArrow(make, schema)
        )

    def find(self, values: dict[Any, Any], kind: str) -> list[tuple[Any, int, int, Any]]:
        """``(id, block, offset, value)`` of each id of ``values`` (an id to a value of Spark
        type ``kind``) that is a vertex's; the others are left out (one small job)."""
        spark = self.positions.sparkSession
        id_type = self.positions.schema["id"].dataType.simpleString()
        asked = spark.createDataFrame(list(values.items()), f"id {id_type}, value {kind}")
        found = asked.join(self.positions, "id").select("id", "block", "offset", "value")
        return [(r[0], int(r[1]), int(r[2]), r[3]) for r in found.collect()]

    def place(self, df: DataFrame, id_: str, block: str, offset: str) -> DataFrame:
        """``df`` with the ``block`` and ``offset`` of its column ``id_`` (null for an id
        that is no vertex's): arithmetic on a dense layout, else a join (never broadcast)."""
        if self.first is None:
            known = self.positions.select(
                F.col("id").alias(id_), F.col("block").alias(block), F.col("offset").alias(offset)
            )
            return df.join(apart(known), id_, "left")
        number, within, _ = self.place_of(id_)
        return df.withColumns({block: number, offset: within})

    def place_of(self, id_: str) -> tuple[Column, Column, Column]:
        """On a dense layout, the block, offset and position of column ``id_`` (null for an
        id that is no vertex's)."""
        assert self.first is not None
        return _dense_place(F.col(id_), self.first, self.step, self.vertices)

    def named(self, df: DataFrame, position: str, name: str) -> DataFrame:
        """``df`` with column ``name``: the id of the vertex at ``position`` (a position in
        the whole layout, not a block)."""
        if self.first is not None:
            id_type = self.positions.schema["id"].dataType
            return df.withColumn(name, (F.col(position) + F.lit(self.first)).cast(id_type))
        at = self.positions.select(F.col("position").alias(position), F.col("id").alias(name))
        return df.join(apart(at), position)

    def with_ids(self, per_vertex: DataFrame) -> DataFrame:
        """``per_vertex`` (``block``, ``offset`` and values) with each vertex's ``id`` instead."""
        if self.first is not None:
            id_type = self.positions.schema["id"].dataType
            id_ = F.col("block").cast("long") * self.step + F.col("offset") + F.lit(self.first)
            return per_vertex.select(id_.cast(id_type).alias("id"), "*").drop("block", "offset")
        at = apart(self.positions.select("id", "block", "offset"))
        return per_vertex.join(at, ["block", "offset"]).drop("block", "offset")

    def release(self) -> None:
        self.positions.unpersist()


def _placement_keys(spark: SparkSession, blocks: int) -> tuple[int, ...]:
    """For each b, a bigint that Spark's hash partitioning into ``blocks`` partitions sends to
    partition b (one small job): the first of 0, 1, 2... that lands there."""
    span = 64 * blocks
    while True:
        found = (
            spark.range(0, span)
            .select("id", F.expr(f"pmod(hash(id), {blocks})").alias("partition"))
            .groupBy("partition")
            .agg(F.min("id").alias("key"))
            .collect()
        )
        keys = {int(r["partition"]): int(r["key"]) for r in found}
        if len(keys) == blocks:
            return tuple(keys[b] for b in range(blocks))
        span *= 16


def vertex_layout(vertices: DataFrame, n: int, blocks: int | None) -> Layout:
    """The ``Layout`` of ``vertices`` (``n`` of them) in ``blocks`` blocks, or when None in as
    many as the module says."""
    return layout(vertices, n, block_count(vertices.sparkSession, n, 0, blocks))


def layout(vertices: DataFrame, n: int, blocks: int) -> Layout:
    """The ``Layout`` of ``vertices`` (``id`` unique, not null, ``n`` of them) in ``blocks``.

    The boundaries between blocks are ids picked from a seeded sample (sorted by Spark,
    so in Spark's order of the id type), so the layout is the same every time it is
    computed: a lost cache or a resumed run finds every vertex where it was.
    """
    spark = vertices.sparkSession
    ids = vertices.select("id")
    id_type = ids.schema["id"].dataType
    lowest = _dense_start(ids, n)
    if lowest is not None:
        step = max(-(-n // blocks), 1)
        number, offset, at = _dense_place(F.col("id"), lowest, step, n)
        dense = ids.select(
            "id", number.alias("block"), offset.alias("offset"), at.alias("position")
        )
        sizes = tuple(int(min(max(n - b * step, 0), step)) for b in range(blocks))
        return Layout(blocks, sizes, _placement_keys(spark, blocks), dense, lowest, step)
    bounds: list[Any] = []
    if blocks > 1 and n > 0:
        fraction = min(1.0, SAMPLE_PER_BLOCK * blocks * 1.5 / n)
        sample = [r[0] for r in ids.sample(fraction=fraction, seed=0).sort("id").collect()]
        bounds = [sample[len(sample) * k // blocks] for k in range(1, blocks)] if sample else []
    if bounds:
        edges = F.array(*(F.lit(b).cast(id_type) for b in bounds))
        block = F.size(F.filter(edges, lambda bound: bound <= F.col("id")))
    else:
        block = F.lit(0)
    ranked = ids.select("id", block.cast("int").alias("block")).withColumn(
        "offset", (F.row_number().over(Window.partitionBy("block").orderBy("id")) - 1).cast("int")
    )
    counts = {int(r["block"]): int(r["count"]) for r in ranked.groupBy("block").count().collect()}
    sizes = tuple(counts.get(b, 0) for b in range(blocks))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
    first = F.array(*(F.lit(int(s)) for s in starts))
    positions = ranked.withColumn(
        "position", F.element_at(first, F.col("block") + 1).cast("long") + F.col("offset")
    ).persist()
    return Layout(blocks, sizes, _placement_keys(spark, blocks), positions)


def _dense_place(id_: Column, first: int, step: int, n: int) -> tuple[Column, Column, Column]:
    """Block, offset and position of ``id_`` in the dense layout of the ids ``first ..
    first + n - 1`` in blocks of ``step`` (null for any other id)."""
    shifted = id_.cast("long") - F.lit(first)
    at = F.when((shifted >= 0) & (shifted < F.lit(n)), shifted)
    number = F.floor(at / F.lit(step)).cast("int")
    return number, (at - number.cast("long") * step).cast("int"), at


def _dense_start(ids: DataFrame, n: int) -> int | None:
    """The smallest id when the ``n`` (unique) ids are integers without gaps, else None
    (one small aggregate job)."""
    if n == 0 or not isinstance(ids.schema["id"].dataType, IntegralType):
        return None
    row = ids.agg(F.min("id"), F.max("id")).first()
    assert row is not None  # an aggregate without grouping has one row
    low, high = int(row[0]), int(row[1])
    return low if high - low + 1 == n else None


def apart(df: DataFrame) -> DataFrame:
    """``df``, joined by shuffling both sides, never broadcast: adaptive execution broadcasts
    a join side it finds under ``spark.sql.autoBroadcastJoinThreshold``, and a broadcast is
    collected to the driver first, which the block path must never do with vertex rows."""
    return df.hint("merge")
