"""Block-partitioned vertex state ("blocks"): graphs whose vertex state does not fit on
the driver, at the speed of numpy kernels.

The vertices, in the order of their ids, are split into B ranges (*blocks*). A vertex's
*position* is its rank in that order, and within its block its *offset*; vertex state is
B rows of a variable, each holding the arrays of one block (a *slice*), kept in Spark
(``bind(..., on_driver=False)``) and checkpointed every round like any variable. Ids
that are integers without gaps get their block and offset by arithmetic; other ids by a
numbering in Spark that the edges are joined with. The edges, placed once, are grouped
by source block into one Arrow file
per block (``ctx.columnar(..., resident=False)``) and sorted there by destination
block, so each file holds the edge blocks (source block, destination block) of one
source block. A round is one Spark job of two stages:

1. *send*: each state row meets the file of its block (``map(..., rows=state)``), in
   the task that holds the row: a numpy kernel turns the slice and the edges into one
   partial slice per destination block (dense, or the touched offsets only), plus the
   row itself;
2. *receive*: the partials go to the task of their destination block (a shuffle of
   at most B² arrays, fewer when blocks have no edges between them), where a numpy
   kernel combines them with the old slice into the new state row.

This is the block-matrix scheme of MLlib's ``BlockMatrix.multiply`` and GraphX's 2D
edge partitioning: nothing proportional to the number of vertices reaches the driver;
it holds B sizes and, per round, the counts of its metrics.

B: at least the task slots (every stage uses every core), enough that a block holds at
most ``BLOCK_VERTICES`` vertices and its file at most ``BLOCK_EDGES`` edges, and a
multiple of the slots, so that the tasks of a stage come out even.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from iterflow.graph.graphs import GraphError, stray_ends

#: At most this many vertices in a block (a slice of doubles: 32 MiB).
BLOCK_VERTICES = 1 << 22
#: At most this many edges in a block's file (about 320 MiB for PageRank's columns).
BLOCK_EDGES = 1 << 24
#: Sampled ids per block, from which the block boundaries are picked.
SAMPLE_PER_BLOCK = 64
#: The column of ``edge_rows`` that marks an edge turned around.
TURNED = "_turned"

Kernel = Callable[..., Iterator[pa.RecordBatch]]


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

    def per_block(self, kernel: Kernel, schema: str) -> DataFrame:
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


def edge_rows(
    lay: Layout,
    edges: DataFrame,
    *,
    reverse: bool = False,
    both: bool = False,
    columns: tuple[str, ...] = (),
) -> DataFrame:
    """``edges`` in the partition of their source block, with the block and offset of both
    ends (``sb``, ``so``, ``db``, ``do``; null for an end that is no vertex), except on a
    dense layout, whose edge files compute them from the ids (``edge_file(dense=...)``); with
    ``reverse`` every edge is turned around, with ``both`` every edge is there both ways.
    ``columns`` are kept as they are; ``TURNED`` marks the turned rows, so that an error
    names the end of the edge as given."""
    src, dst = ("dst", "src") if reverse else ("src", "dst")
    ends = edges.select(
        F.col(src).alias("src"),
        F.col(dst).alias("dst"),
        F.lit(reverse).alias(TURNED),
        *(F.col(c) for c in columns),
    )
    if both:
        turned = ends.select(
            F.col("dst").alias("src"),
            F.col("src").alias("dst"),
            (~F.col(TURNED)).alias(TURNED),
            *(F.col(c) for c in columns),
        )
        ends = ends.unionByName(turned)
    if lay.first is not None:  # the edge file places both ends itself
        return lay.placed(ends, lay.place_of("src")[0])
    placed = lay.place(lay.place(ends, "src", "sb", "so"), "dst", "db", "do")
    return lay.placed(placed, "sb")


def edge_file(
    who: str,
    *,
    by_source: bool,
    distinct: bool,
    columns: tuple[str, ...] = (),
    dense: tuple[int, int, int] | None = None,
) -> Callable[[pa.Table], pa.Table]:
    """A ``columnar`` prepare step for one source block's edges (``edge_rows``): a
    ``GraphError`` for an end that is no vertex; self-loops kept; duplicates dropped with
    ``distinct``; sorted by source offset (``by_source``) or by destination block; the
    columns ``so``, ``db``, ``do`` (int32), ``columns``, and for the kernels of PageRank
    ``share`` (1 / the source's out-degree) and ``first`` (the source's first edge).
    ``dense`` (``Layout.dense``): the rows hold ids only, placed here by arithmetic."""

    def prepare(table: pa.Table) -> pa.Table:
        ends = _dense_ends(table, dense) if dense is not None else _joined_ends(table)
        (sb, so, so_ok), (db, do, do_ok) = ends
        if not (so_ok.all() and do_ok.all()):
            raise GraphError(stray_ends(who, _strays(table, so_ok, do_ok)))
        kept = {c: table[c] for c in columns}
        order = sort_order(*((so, db, do) if by_source else (db, so, do)))
        so, db, do = so[order], db[order], do[order]
        kept = {c: v.take(pa.array(order)) for c, v in kept.items()}
        if distinct:
            new = first_of_runs(so, db, do)
            so, db, do = so[new], db[new], do[new]
            kept = {c: v.filter(pa.array(new)) for c, v in kept.items()}
        edges = pa.table({"so": so, "db": db, "do": do, **kept, **_shares(so)})
        held = np.unique(sb).tolist()
        if len(held) > 1:
            raise GraphError(f"{who}: an edge file holds source blocks {held[:3]}; expected one")
        return edges.replace_schema_metadata({"block": str(held[0])} if held else None)

    return prepare


End = tuple[np.ndarray, np.ndarray, np.ndarray]  # block, offset (int32), is a vertex


def _joined_ends(table: pa.Table) -> tuple[End, End]:
    """Both ends' places, from the columns that the joins of ``edge_rows`` added."""

    def end(block: str, offset: str) -> End:
        known = pc.is_valid(table[offset]).to_numpy(zero_copy_only=False)
        places = [pc.fill_null(table[c], 0).to_numpy().astype(np.int32) for c in (block, offset)]
        return places[0], places[1], known

    return end("sb", "so"), end("db", "do")


def _dense_ends(table: pa.Table, dense: tuple[int, int, int]) -> tuple[End, End]:
    """Both ends' places on a dense layout, computed from the ids."""
    first, step, n = dense

    def end(name: str) -> End:
        at = pc.fill_null(pc.cast(table[name], pa.int64()), first - 1).to_numpy() - first
        known = (at >= 0) & (at < n)
        at = np.where(known, at, 0)
        block = at // step
        return block.astype(np.int32), (at - block * step).astype(np.int32), known

    return end("src"), end("dst")


def _strays(table: pa.Table, so_ok: np.ndarray, do_ok: np.ndarray) -> list[tuple[str, Any]]:
    """Up to 3 ends that are no vertex, named as the edge was given (``TURNED`` rows were
    turned around by ``edge_rows``)."""
    rows = np.flatnonzero(~(so_ok & do_ok))[:6]
    turned = table[TURNED].to_pylist() if TURNED in table.column_names else None
    found = []
    for i in rows.tolist():
        is_turned = bool(turned[i]) if turned is not None else False
        for end, ok, given in (("src", so_ok, "dst"), ("dst", do_ok, "src")):
            if not ok[i]:
                found.append((given if is_turned else end, table[end][i].as_py()))
    return list(dict.fromkeys(found))[:3]


def _shares(so: np.ndarray) -> dict[str, np.ndarray]:
    """``share`` (1 / the out-degree of each edge's source) and ``first`` (True at the
    first edge of each source)."""
    if not len(so):
        return {"share": np.zeros(0), "first": np.zeros(0, dtype=bool)}
    degree = np.bincount(so)
    at = np.full(len(degree), len(so))
    np.minimum.at(at, so, np.arange(len(so)))
    first = np.zeros(len(so), dtype=bool)
    first[at[degree > 0]] = True
    return {"share": 1.0 / degree[so], "first": first}


def sort_order(*keys: np.ndarray) -> np.ndarray:
    """The stable order that sorts by ``keys`` (non-negative integers), the first one first:
    one sort of a key packed into 63 bits when they fit, else ``np.lexsort``."""
    if not len(keys[0]):
        return np.zeros(0, dtype=np.int64)
    widths = [int(k.max()).bit_length() for k in keys]
    if sum(widths) > 63:
        return np.lexsort(keys[::-1])
    packed = np.zeros(len(keys[0]), dtype=np.int64)
    for key, width in zip(keys, widths, strict=True):
        packed = (packed << width) | key.astype(np.int64)
    return np.argsort(packed, kind="stable")


def check_block(table: pa.Table, block: int) -> None:
    """That ``table``, an edge file, holds the edges of source block ``block`` (or none)."""
    held = (table.schema.metadata or {}).get(b"block")
    if held is not None and int(held) != block:
        raise GraphError(f"the edge file of block {block} holds block {int(held)}'s edges")


def block_bounds(db: np.ndarray, blocks: int) -> np.ndarray:
    """Where each destination block's edges start in a file sorted by destination block."""
    return np.searchsorted(db, np.arange(blocks + 1))


def gathered(so: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges out of ``sources`` in a file sorted by source offset, a cost that follows
    the active vertices rather than the block: their indices, and for each the index in
    ``sources`` of its source (a source may be listed more than once)."""
    lo = np.searchsorted(so, sources, "left")
    counts = np.searchsorted(so, sources, "right") - lo
    total = int(counts.sum())
    owners = np.repeat(np.arange(len(sources)), counts)
    if total == 0:
        return np.zeros(0, dtype=np.int64), owners
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return starts + np.arange(total), owners


def by_block(db: np.ndarray, blocks: int) -> list[np.ndarray]:
    """For each destination block, the indices of ``db`` that name it."""
    # numpy sorts 16-bit integers by radix: one pass over the edges, not n log n
    order = np.argsort(db.astype(np.int16) if blocks <= 1 << 15 else db, kind="stable")
    bounds = np.searchsorted(db[order], np.arange(blocks + 1))
    return [order[bounds[d] : bounds[d + 1]] for d in range(blocks)]


def least_per_offset(size: int, offsets: np.ndarray, values: np.ndarray) -> tuple[Any, Any]:
    """The touched offsets of a block of ``size``, each once, with its smallest value."""
    top = np.iinfo(values.dtype).max
    least = np.full(size, top, dtype=values.dtype)
    np.minimum.at(least, offsets, values)
    touched = np.flatnonzero(least != top)
    return touched, least[touched]


def first_of_runs(*keys: np.ndarray) -> np.ndarray:
    """For arrays sorted together by ``keys``: True where a run of equal keys starts."""
    starts = np.zeros(len(keys[0]), dtype=bool)
    if len(starts):
        starts[0] = True
        for key in keys:
            starts[1:] |= key[1:] != key[:-1]
    return starts


def rows_of(table: pa.Table, block: str = "block") -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a state table: (block number, {column: the cell's Arrow scalar})."""
    for i in range(table.num_rows):
        yield int(table[block][i].as_py()), {c: table[c][i] for c in table.column_names}


def values(cell: Any, dtype: Any) -> np.ndarray:
    """The numpy array in an Arrow list cell (empty for a null cell)."""
    if not cell.is_valid:
        return np.zeros(0, dtype=dtype)
    return cell.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def list_column(arrays: list[np.ndarray | None], kind: pa.DataType) -> pa.Array:
    """An Arrow list column of ``arrays`` (None: a null cell)."""
    return pa.array([None if a is None else a for a in arrays], type=pa.list_(kind))


def sparse_row(to: int, itself: bool, index: Any, value: Any, kind: pa.DataType) -> Any:
    """A row sent to block ``to`` (``index``, ``value``: offsets there and their values), or
    with ``itself`` the sending block's own values (``index`` None)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([to], pa.int32()),
            pa.array([itself]),
            list_column([index], pa.int32()),
            list_column([value], kind),
        ],
        names=["to", "self", "index", "value"],
    )


def received(rows: pa.Table, kind: Any) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """A destination block's own values and the (offsets, values) sent to it."""
    own = np.zeros(0, dtype=kind)
    heard = []
    for i in range(rows.num_rows):
        value = values(rows["value"][i], kind)
        if rows["self"][i].as_py():
            own = value
        else:
            heard.append((values(rows["index"][i], np.int64), value))
    return own, heard


def grouped(batches: Iterator[pa.RecordBatch], key: str = "to") -> Iterator[tuple[int, pa.Table]]:
    """The rows received by a receive task, by destination block."""
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received)
    for block in sorted(pc.unique(table[key]).to_pylist()):
        yield int(block), table.filter(pc.equal(table[key], block))


def block_step(
    lay: Layout,
    prepare: Callable[[pa.Table], pa.Table],
    send: Kernel,
    partial: str,
    receive: Callable[[Any], Any],
    state: str,
) -> Callable[[DataFrame, DataFrame, Any], DataFrame]:
    """A round of the block path as a body calls it, ``step(state_rows, edges, ctx)``: the
    edge files (written at the first call), ``send`` per state row with its file (rows
    ``partial``), the partials to their destination block, ``receive`` there (rows
    ``state``)."""

    def step(rows: DataFrame, edges: DataFrame, ctx: Any) -> DataFrame:
        files = ctx.columnar(edges, prepare, resident=False)
        partials = files.map(send, partial, rows=rows, by="block")
        return lay.placed(partials, "to").mapInArrow(receive, state)

    return step


def run_on_blocks(
    iteration: Any, lay: Layout, listen: Any, run_options: Any, output: str
) -> DataFrame:
    """Run ``iteration`` (``listen`` called after every round) and release ``lay``: the
    state rows of its ``output``."""
    if listen is not None:
        iteration = iteration.listen(listen)
    try:
        return iteration.run(**run_options).outputs[output]
    finally:
        lay.release()


def run_labels(iteration: Any, lay: Layout, listen: Any, run_options: Any) -> DataFrame:
    """``run_on_blocks`` of a ``labels`` output, as ``id`` and ``label`` (a position) rows."""
    final = run_on_blocks(iteration, lay, listen, run_options, "labels")
    return final_rows(lay, exploded(final, "label"))


def final_rows(lay: Layout, per_vertex: DataFrame) -> DataFrame:
    """``per_vertex`` (``block``, ``offset`` and values) with each vertex's ``id`` instead."""
    if lay.first is not None:
        id_type = lay.positions.schema["id"].dataType
        id_ = F.col("block").cast("long") * lay.step + F.col("offset") + F.lit(lay.first)
        return per_vertex.select(id_.cast(id_type).alias("id"), "*").drop("block", "offset")
    at = apart(lay.positions.select("id", "block", "offset"))
    return per_vertex.join(at, ["block", "offset"]).drop("block", "offset")


def exploded(state: DataFrame, column: str) -> DataFrame:
    """``block``, ``offset`` and the element of array ``column`` at that offset."""
    return state.select("block", F.posexplode(column).alias("offset", column)).withColumn(
        "offset", F.col("offset").cast("int")
    )
