"""The block path's runner: graphs whose vertex state does not fit on the driver, at the
speed of numpy kernels (``BlockKernels``), each graph algorithm bringing only its own.

Vertex state is B rows of a variable, each holding the arrays of one block (a *slice*,
``block_layout``), kept in Spark (``bind(..., on_driver=False)``) and checkpointed every
round like any variable. The edges, placed once, are one Arrow file per source block
(``block_edges``). A round is one Spark job of two stages:

1. *send*: each state row meets the file of its block (``map(..., rows=state)``), in
   the task that holds the row: the kernel turns the slice and the edges into one
   partial per destination block (dense, or the touched offsets only), plus the row's
   own values;
2. *receive*: the partials go to the task of their destination block (a shuffle of
   at most B² arrays, fewer when blocks have no edges between them), where the kernel
   combines them with the old slice into the new state row.

This is the block-matrix scheme of MLlib's ``BlockMatrix.multiply`` and GraphX's 2D
edge partitioning: nothing proportional to the number of vertices reaches the driver;
it holds B sizes and, per round, the counts of its metrics.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.block_edges import EdgeFile, check_block, edge_file, edge_rows
from iterflow.graph.block_kernels import BlockKernels, LabelKernels, Partial, Received, Slice
from iterflow.graph.block_layout import Layout, apart, vertex_layout
from iterflow.graph.graphs import Graph, run_iteration

#: Spark's names of the element types a slice may hold.
_SPARK_TYPES = {"int32": "INT", "int64": "BIGINT", "double": "DOUBLE", "bool": "BOOLEAN"}


@attrs.frozen(kw_only=True)
class Rounds:
    """How an algorithm's block iteration runs, besides its kernels."""

    #: The body's name, by which errors, the event log and a checkpoint know the run.
    name: str
    #: The state variable's name.
    variable: str
    #: The caller, as the error for an edge to no vertex names it (``"pagerank()"``).
    who: str
    #: Duplicate edges count once.
    distinct: bool = True
    #: Declared by every round (``Declaration.until``).
    until: Any = None
    #: The iteration's own termination criteria, in order.
    stop: tuple[Any, ...] = ()
    #: The edge columns the kernels read besides the ends (``EdgeFile.column``).
    columns: tuple[str, ...] = ()


def settled(progress: itf.RoundProgress) -> bool:
    """A round that changed no vertex: its kernels' ``active`` metric counted none."""
    return bool(progress.metrics.get("active") == 0)


def run(
    lay: Layout,
    kernels: BlockKernels,
    edges: DataFrame,
    rounds: Rounds,
    listen: Any,
    run_options: Mapping[str, Any],
    *,
    start: DataFrame | None = None,
    notes: Mapping[str, Any] | None = None,
) -> DataFrame:
    """Run ``kernels`` over ``edges`` (``block_edges.edge_rows``) from their first slices
    (or the state rows ``start``, placed by block) until ``rounds`` stop, then release
    ``lay``: the last state rows. ``notes`` go into the event log's ``iteration_started``."""
    if start is None:
        start = lay.per_block(_first(kernels), _state_schema(kernels))
    iteration = (
        itf.BoundedIteration(BlockRound(lay, kernels, rounds))
        .bind(rounds.variable, start, on_driver=False)
        .bind("edges", edges, replay=True)
        .until(*rounds.stop)
    )
    if notes:
        iteration = iteration.note(**notes)
    result = run_iteration(iteration, listen, run_options, release=lay.release)
    return result.outputs[rounds.variable]


def per_vertex(lay: Layout, state: DataFrame, column: str) -> DataFrame:
    """Each vertex's ``id`` with its element of the state rows' array ``column``."""
    exploded = state.select("block", F.posexplode(column).alias("offset", column))
    return lay.with_ids(exploded.withColumn("offset", F.col("offset").cast("int")))


def run_labels(
    g: Graph,
    n: int,
    blocks: int | None,
    kernels: type[LabelKernels],
    rounds: Rounds,
    name: str,
    listen: Any,
    run_options: Mapping[str, Any],
) -> DataFrame:
    """``run`` of ``kernels`` over the edges both ways, self-loops left out: each vertex's
    ``id`` with column ``name``, the id of the vertex that its last label names."""
    lay = vertex_layout(g.vertices, n, blocks)
    labels = kernels(
        lay.starts, lay.sizes, itf.metrics.counter("messages"), itf.metrics.counter("active")
    )
    ends = g.edges.where(F.col("src") != F.col("dst"))
    final = run(lay, labels, edge_rows(lay, ends, both=True), rounds, listen, run_options)
    found = lay.named(per_vertex(lay, final, "label"), "label", "_named")
    return apart(found.select("id", F.col("_named").alias(name)))


class BlockRound(itf.IterationBody):
    """A round of the block path: the state rows and the edges in, the new state rows out
    (one Spark job: ``send`` by source block, ``receive`` by destination block)."""

    def __init__(self, lay: Layout, kernels: BlockKernels, rounds: Rounds) -> None:
        self.inputs = (rounds.variable, "edges")
        self._rounds = rounds
        self._lay = lay
        self._prepare = edge_file(
            rounds.who,
            by_source=kernels.by_source,
            distinct=rounds.distinct,
            columns=rounds.columns,
            dense=lay.dense,
        )
        self._send = _sender(kernels, lay.blocks)
        self._receive = _receiver(kernels)
        self._partial = _partial_schema(kernels)
        self._state = _state_schema(kernels)

    @property
    def name(self) -> str:
        return self._rounds.name

    def __call__(self, inputs: Mapping[str, DataFrame], ctx: itf.RoundContext) -> itf.Declaration:
        variable = self._rounds.variable
        files = ctx.columnar(inputs["edges"], self._prepare, resident=False)
        partials = files.map(self._send, self._partial, rows=inputs[variable], by="block")
        new = self._lay.placed(partials, "to").mapInArrow(self._receive, self._state)
        return itf.Declaration(
            feedback={variable: new}, outputs={variable: new}, until=self._rounds.until
        )


# -- the rows that carry slices and partials through Spark ------------------------------


def _element(kernels: BlockKernels) -> pa.DataType:
    """The type of the values a block sends: that of its first state column."""
    return next(iter(kernels.state.values()))


def _state_schema(kernels: BlockKernels) -> str:
    """A state row: ``block`` and one array per state column."""
    arrays = (f"{c} ARRAY<{_SPARK_TYPES[str(t)]}>" for c, t in kernels.state.items())
    return ", ".join(["block INT", *arrays])


def _partial_schema(kernels: BlockKernels) -> str:
    """A partial as a row (``self``: a block's own values, sent to itself)."""
    value = _SPARK_TYPES[str(_element(kernels))]
    return f"to INT, self BOOLEAN, index ARRAY<INT>, value ARRAY<{value}>, shared DOUBLE"


def _state_row(block: int, state: Slice, kernels: BlockKernels) -> pa.RecordBatch:
    columns = [_list_column(state[c], t) for c, t in kernels.state.items()]
    return pa.RecordBatch.from_arrays(
        [pa.array([block], pa.int32()), *columns], names=["block", *kernels.state]
    )


def _partial_row(partial: Partial, itself: bool, kind: pa.DataType) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partial.to], pa.int32()),
            pa.array([itself]),
            _list_column(partial.index, pa.int32()),
            _list_column(partial.value, kind),
            pa.array([float(partial.shared)]),
        ],
        names=["to", "self", "index", "value", "shared"],
    )


def _list_column(array: np.ndarray | None, kind: pa.DataType) -> pa.Array:
    """A one-cell Arrow list column holding ``array`` (None: a null cell)."""
    return pa.array([array], type=pa.list_(kind))


def _values(cell: Any, dtype: Any) -> np.ndarray:
    """The numpy array in an Arrow list cell (empty for a null cell)."""
    if not cell.is_valid:
        return np.zeros(0, dtype=dtype)
    return cell.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _first(kernels: BlockKernels) -> Any:
    def first(block: int) -> Iterator[pa.RecordBatch]:
        yield _state_row(block, kernels.first(block), kernels)

    return first


def _sender(kernels: BlockKernels, blocks: int) -> Any:
    """The send stage: each state row (with its block's edge file) to its partials, then
    the row's own values."""
    kind = _element(kernels)
    dtypes = {c: t.to_pandas_dtype() for c, t in kernels.state.items()}
    own = next(iter(kernels.state))

    def send(table: pa.Table, rows: pa.Table) -> Iterator[pa.RecordBatch]:
        edges = EdgeFile(table, blocks)
        for i in range(rows.num_rows):
            block = int(rows["block"][i].as_py())
            check_block(table, block)
            state = {c: _values(rows[c][i], dtype) for c, dtype in dtypes.items()}
            for partial in kernels.send(edges, block, state):
                yield _partial_row(partial, False, kind)
            yield _partial_row(Partial(block, state[own]), True, kind)

    return send


def _receiver(kernels: BlockKernels) -> Any:
    """The receive stage: the partials that reached each block to its new state row."""
    dtype = _element(kernels).to_pandas_dtype()

    def receive(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        arrived = list(batches)
        if not arrived:
            return
        table = pa.Table.from_batches(arrived)
        for block in sorted(pc.unique(table["to"]).to_pylist()):
            heard = _received(table.filter(pc.equal(table["to"], block)), dtype)
            yield _state_row(int(block), kernels.receive(int(block), heard), kernels)

    return receive


def _received(rows: pa.Table, dtype: Any) -> Received:
    """One destination block's partial rows, read."""
    own = np.zeros(0, dtype=dtype)
    partials: list[tuple[np.ndarray | None, np.ndarray]] = []
    shared = 0.0
    for i in range(rows.num_rows):
        value = _values(rows["value"][i], dtype)
        if rows["self"][i].as_py():
            own = value
            continue
        index = rows["index"][i]
        partials.append((_values(index, np.int64) if index.is_valid else None, value))
        shared += float(rows["shared"][i].as_py())
    return Received(own, partials, shared)
