"""Vertex programs on the block path: ``pregel(init=, update=...)`` (compiled,
``compiled_programs``) and ``pregel(program=VertexProgram(...))`` beyond the vector
path's limit, on the same numpy functions as the vector path, with the vertex state in
blocks held by Spark's tasks (``block_runner``).

A block's state is one array (``packed``): every state column, its validity mask and the
active mask, each stored as 64-bit integers (floats by their bits), so that the block
runner carries it unchanged. A round's *send* evaluates the messages of the block's
active vertices over their edges (read from the block's edge file by source offset, a
cost that follows the active vertices) and merges them per destination vertex; the
*receive* merges what reached a block and runs the updates (``apply``) on that block's
vertices. A message may read its sender and the edge, not its receiver (which lives in
another block): a compiled program whose messages read the receiver runs on the block
path's joins instead, and says so; a ``VertexProgram`` that reads it is a
``GraphError``. ``init`` and ``apply`` see one block at a time, so they must work vertex
by vertex (as every example does); a ``go_on`` from ``apply`` is a ``GraphError`` here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

import iterflow as itf
from iterflow.graph import block_runner
from iterflow.graph.block_edges import TURNED, EdgeFile, edge_rows, first_of_runs
from iterflow.graph.block_kernels import BlockKernels, Partial, Received, Slice
from iterflow.graph.block_layout import Layout, apart, vertex_layout
from iterflow.graph.compiled_programs import Compiled
from iterflow.graph.expressions import DTYPES, Unsupported
from iterflow.graph.graphs import GraphError
from iterflow.graph.kernel_pregel import VALID, Typing, edge_frame, engine_note, refs, side_of
from iterflow.graph.programs import CountedListener, VertexProgram, sent_messages, spark_type
from iterflow.graph.vectors import merged_per_key

#: The packed state's own column of the active mask.
ACTIVE = "_active"
Packing = tuple[tuple[str, str], ...]  # (array name, numpy dtype string), in packed order


def pack(arrays: Mapping[str, np.ndarray], layout: Packing) -> np.ndarray:
    """The arrays of ``layout`` as one int64 array (floats by their bits)."""
    return np.concatenate([_as_int64(arrays[name]) for name, _ in layout])


def _as_int64(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "f":
        return values.astype(np.float64).view(np.int64)
    return values.astype(np.int64)


def _from_int64(values: np.ndarray, dtype: str) -> np.ndarray:
    kind = np.dtype(dtype)
    if kind.kind == "f":
        return values.view(np.float64).astype(kind)
    if kind.kind == "b":
        return values != 0
    return values.astype(kind)


def unpack(packed: np.ndarray, layout: Packing) -> dict[str, np.ndarray]:
    """``pack``'s arrays back, by name."""
    size = len(packed) // len(layout)
    return {
        name: _from_int64(packed[i * size : (i + 1) * size], dtype)
        for i, (name, dtype) in enumerate(layout)
    }


def check_for_blocks(compiled: Compiled) -> None:
    """A message may read its sender and the edge only (``Unsupported`` otherwise)."""
    for message, sender in ((compiled.messages.to_dst, "src"), (compiled.messages.to_src, "dst")):
        if message is None:
            continue
        read = {side for side, _ in map(side_of, refs(message))} - {sender, "edge"}
        if read:
            raise Unsupported(
                "on the block path a message reads its sender and the edge only, and this "
                f"one reads the {'destination' if sender == 'src' else 'source'}"
            )


@attrs.frozen
class BlockProgram:
    """What the block path needs of a vertex program: the ``VertexProgram``, its output
    columns (name to Spark type and numpy dtype; ``masked``: each has a validity array),
    the edge columns its messages read, and the numpy dtype of its merged messages."""

    program: VertexProgram
    outputs: Mapping[str, tuple[str, str]]
    edge_columns: tuple[str, ...]
    message_dtype: str
    masked: bool

    @classmethod
    def of_compiled(cls, compiled: Compiled) -> BlockProgram:
        types = compiled.types
        outputs = {n: (types[n], np.dtype(DTYPES[types[n]]).str) for n in compiled.state}
        read = tuple(c for name in sorted(compiled.edge_columns) for c in (name, name + VALID))
        dtype = np.dtype(DTYPES[compiled.messages.merged_type]).str
        return cls(compiled.program, outputs, read, dtype, masked=True)

    @classmethod
    def of_numpy(cls, program: VertexProgram, edges: DataFrame) -> BlockProgram:
        """A ``VertexProgram`` checked for the block path (``GraphError`` otherwise): its
        messages' dtype found by calling the send functions on no edges."""
        if program.senders != "source":
            raise GraphError("on the block path a VertexProgram sends with senders='source'")
        read = tuple(c for c in edges.columns if c not in ("src", "dst") and c[:1] != "_")
        types = {f.name: f.dataType.simpleString() for f in edges.schema.fields}
        none = {c: np.zeros(0, dtype=DTYPES.get(types[c], object)) for c in read}
        state = {k: np.zeros(0, dtype=d) for k, d in program.state.items()}
        dtypes = []
        for send, backwards in ((program.send_to_dst, False), (program.send_to_src, True)):
            if send is None:
                continue
            try:
                out = send({}, state, none) if backwards else send(state, {}, none)
            except KeyError as missing:
                end = "source" if backwards else "destination"
                raise GraphError(
                    "on the block path a VertexProgram's messages read their sender and the "
                    f"edge, and this one reads {missing} of the {end} (held by another "
                    "block); run it on the vector path, or send the value along instead"
                ) from None
            dtypes.append(np.asarray(np.ma.getdata(out)).dtype)
        outputs = {n: (spark_type(d), np.dtype(d).str) for n, d in program.state.items()}
        return cls(program, outputs, read, np.result_type(*dtypes).str, masked=False)


@attrs.frozen
class CompiledKernels(BlockKernels):
    """A vertex program's send and receive on one block's packed state."""

    state: ClassVar[dict[str, pa.DataType]] = {"packed": pa.int64()}
    by_source: ClassVar[bool] = True

    compiled: BlockProgram
    layout: Packing
    edge_columns: tuple[str, ...]
    messages: Any
    active: Any

    def first(self, block: int) -> Slice:
        raise NotImplementedError("compiled programs start from their vertices' rows")

    def send(self, edges: EdgeFile, block: int, state: Slice) -> Iterator[Partial]:
        arrays = unpack(state["packed"], self.layout)
        sources = np.flatnonzero(arrays[ACTIVE]).astype(np.int32)
        at, owner = edges.out_of(sources)
        sender = {k: v[sources[owner]] for k, v in arrays.items()}
        columns = {c: edges.column(c)[at] for c in self.edge_columns}
        turned = edges.column(TURNED)[at].astype(bool)
        program = self.compiled.program
        values: list[np.ndarray] = []
        keep: list[np.ndarray] = []
        for send, back in ((program.send_to_dst, False), (program.send_to_src, True)):
            if send is None:
                continue
            these = turned == back
            part = {k: v[these] for k, v in sender.items()}
            sent = (
                send({}, part, _picked(columns, these))
                if back
                else send(part, {}, _picked(columns, these))
            )
            data, ok = sent_messages(sent, int(these.sum()), "send", program.nan_sends)
            values.append(data[ok].astype(self.compiled.message_dtype))
            keep.append(np.flatnonzero(these)[ok])
        if not values:
            return
        chosen = at[np.concatenate(keep)]  # positions in the edge file
        self.messages.inc(len(chosen))
        yield from _merged_per_block(
            edges.db[chosen], edges.do[chosen], np.concatenate(values), program.ufunc
        )

    def receive(self, block: int, heard: Received) -> Slice:
        old = unpack(heard.own, self.layout)
        size = len(heard.own) // len(self.layout)
        pairs = [(i, v) for i, v in heard.at_offsets() if len(i)]
        index = np.concatenate([i for i, _ in pairs]) if pairs else np.zeros(0, np.int64)
        bits = np.concatenate([v for _, v in pairs]) if pairs else np.zeros(0, np.int64)
        value = _from_int64(bits, self.compiled.message_dtype)
        merged, reached = merged_per_key(index, value, size, self.compiled.program.ufunc)
        applied = self.compiled.program.apply(old, merged, reached)
        if len(applied) > 2:
            raise GraphError("on the block path apply returns (state, active), not go_on")
        new, active = dict(applied[0]), np.asarray(applied[1], dtype=bool)
        new[ACTIVE] = active
        self.active.inc(int(active.sum()))
        return {"packed": pack(new, self.layout)}


def _picked(columns: Mapping[str, np.ndarray], these: np.ndarray) -> dict[str, np.ndarray]:
    return {c: v[these] for c, v in columns.items()}


def _merged_per_block(
    db: np.ndarray, do: np.ndarray, values: np.ndarray, ufunc: Any
) -> Iterator[Partial]:
    """One partial per destination block: each offset's messages merged, as int64 bits."""
    order = np.lexsort((do, db))
    db, do, values = db[order], do[order], values[order]
    starts = np.flatnonzero(first_of_runs(db, do))
    merged = ufunc.reduceat(values, starts) if len(starts) else values[:0]
    blocks, offsets = db[starts], do[starts]
    if not len(blocks):
        return
    bounds = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
    ends = [*bounds[1:], len(blocks)]
    for lo, hi in zip(bounds, ends, strict=True):
        yield Partial(int(blocks[lo]), _as_int64(merged[lo:hi]), offsets[lo:hi].astype(np.int32))


def _starts(lay: Layout, vertices: DataFrame, compiled: BlockProgram, layout: Packing) -> DataFrame:
    """Each block's first packed state, from its vertices' rows (all active)."""
    program = compiled.program
    sizes = lay.sizes

    def first(table: pa.Table) -> pa.Table:
        table = table.sort_by("_offset")
        block = int(table["_block"][0].as_py())
        if table.num_rows != sizes[block]:
            raise itf.IterflowError(f"block {block} holds {table.num_rows} of {sizes[block]} rows")
        arrays = dict(program.init(table))
        arrays[ACTIVE] = np.ones(table.num_rows, dtype=bool)
        packed = pa.array([pack(arrays, layout)], type=pa.list_(pa.int64()))
        return pa.table({"block": pa.array([block], pa.int32()), "packed": packed})

    placed = lay.place(vertices, "id", "_block", "_offset")
    starts = placed.groupBy("_block").applyInArrow(first, "block INT, packed ARRAY<BIGINT>")
    return lay.placed(starts)


def _rows(lay: Layout, final: DataFrame, compiled: BlockProgram, layout: Packing) -> DataFrame:
    """Each vertex's ``id`` and state columns (nulls where invalid) from the last state."""
    outputs = compiled.outputs
    names = list(outputs)
    fields = ", ".join(f"`{n}` {spark}" for n, (spark, _) in outputs.items())

    def split(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in range(batch.num_rows):
                block = int(batch.column("block")[i].as_py())
                packed = batch.column("packed")[i].values.to_numpy(zero_copy_only=False)
                arrays = unpack(packed, layout)
                size = len(packed) // len(layout)
                columns = [
                    pa.array(np.full(size, block, np.int32)),
                    pa.array(np.arange(size, dtype=np.int32)),
                ]
                for n, (_, dtype) in outputs.items():
                    mask = ~arrays[n + VALID] if compiled.masked else None
                    values = arrays[n].astype(dtype)
                    kind = pa.from_numpy_dtype(values.dtype)
                    columns.append(pa.array(values, mask=mask, type=kind))
                yield pa.RecordBatch.from_arrays(columns, names=["block", "offset", *names])

    per_vertex = final.mapInArrow(split, f"block INT, offset INT, {fields}")
    return lay.with_ids(per_vertex)


def _metric_counts(ctx: itf.RoundEnd) -> tuple[int, int]:
    """A block round's messages and active vertices, from its kernels' metrics."""
    metrics = ctx.progress.metrics
    return int(metrics.get("messages") or 0), int(metrics.get("active") or 0)


def run_compiled_on_blocks(g: Any, compiled: Compiled, typing: Typing, **options: Any) -> DataFrame:
    """Run ``compiled`` (``check_for_blocks``) on the block path: the vertices with their
    state columns."""
    edges = edge_frame(g.edges, compiled.edge_columns, typing)
    return run_on_blocks(g, BlockProgram.of_compiled(compiled), edges, **options)


def run_on_blocks(
    g: Any,
    compiled: BlockProgram,
    edges: DataFrame,
    *,
    n: int,
    blocks: int | None,
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
) -> DataFrame:
    """Run ``compiled`` on the block path over ``edges`` (``src``, ``dst`` and the
    columns its messages read): the vertices with their state columns."""
    lay = vertex_layout(g.vertices, n, blocks)
    layout: Packing = (
        *((name, np.dtype(d).str) for name, d in compiled.program.state.items()),
        (ACTIVE, "|b1"),
    )
    read = compiled.edge_columns
    program = compiled.program
    if program.send_to_dst is None:  # only backwards: every edge turned
        rows = edge_rows(lay, edges, reverse=True, columns=read)
    else:
        rows = edge_rows(lay, edges, both=program.send_to_src is not None, columns=read)
    kernels = CompiledKernels(
        compiled, layout, read, itf.metrics.counter("messages"), itf.metrics.counter("active")
    )
    rounds = block_runner.Rounds(
        name="pregel_compiled_blocks",
        variable="state",
        who="pregel()",
        distinct=False,
        columns=(*read, TURNED),
        stop=(
            itf.until(block_runner.settled),
            *(() if max_rounds is None else (itf.max_rounds(max_rounds),)),
        ),
    )
    vertices = g.vertices.select("id", *[c for c in g.vertices.columns if c != "id"])
    start = _starts(lay, vertices, compiled, layout)
    run_options = dict(run_options)
    counted = None if listen is None else CountedListener(listen, _metric_counts)
    final = block_runner.run(
        lay,
        kernels,
        rows,
        rounds,
        counted,
        run_options,
        start=start,
        notes=engine_note(None, "pregel()") | {"path": "blocks"},
    )
    state = apart(_rows(lay, final, compiled, layout))
    own = [c for c in g.vertices.columns if c not in compiled.outputs]
    joined = g.vertices.select(*own).join(state, "id")
    return joined.select(*own, *compiled.outputs)
