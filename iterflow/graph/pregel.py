"""Pregel with active vertices: a vertex-centric program as an iterflow body.

Every vertex carries state columns, set by an ``init`` expression. Each round:

1. every *active* vertex sends messages along its edges: ``send_to_dst`` along
   ``src -> dst`` from an active ``src``, ``send_to_src`` back from an active
   ``dst``; a null message is not sent. At round 0 every vertex is active.
2. the messages to a vertex are combined by ``aggregate`` into ``Pregel.msg()``.
3. only the vertices that received messages run their ``update`` expressions;
   the others keep their state.
4. the updated vertices whose state changed (or for which ``active`` is true)
   are the next round's active vertices. The others vote to halt until a message
   wakes them up.

Late rounds of a program that settles (shortest paths, components) therefore
touch only the few vertices still changing and their edges, a delta iteration as
in Flink's workset iterations and GraphX's active sets. The edges are partitioned
by source (and by destination for ``send_to_src``) once and cached for the whole
iteration.

Termination (``IterationEnd.termination``, see ``listen``):

- ``criteria_empty``: no vertex is active after the round: every vertex that
  received a message voted to halt, or none received any;
- ``predicate``: the round sent no messages at all. Such a round leaves no
  vertex active either, so its ``reasons`` are ``["criteria_empty", "predicate"]``;
- ``max_rounds``: ``max_rounds`` rounds have run.

Columns in expressions: ``Pregel.src(name)``, ``Pregel.dst(name)`` and
``Pregel.edge(name)`` in messages; the vertex's own columns by name (``F.col``)
and ``Pregel.msg()`` in ``update``; in ``active`` also ``Pregel.old(name)``, the
value before the update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

import iterflow as itf
from iterflow.graph.block_edges import check_block, edge_file, edge_rows, gathered
from iterflow.graph.block_layout import Layout, apart, vertex_layout
from iterflow.graph.compiled_blocks import (
    BlockProgram,
    check_for_blocks,
    run_compiled_on_blocks,
    run_on_blocks,
)
from iterflow.graph.compiled_programs import compile_pregel, run_compiled
from iterflow.graph.expressions import Unsupported
from iterflow.graph.graphs import (
    Graph,
    GraphError,
    as_graph,
    check_edge_ends,
    graph_result,
    run_iteration,
)
from iterflow.graph.kernel_pregel import Typing, engine_note
from iterflow.graph.methods import choose_method
from iterflow.graph.pregel_columns import DST, EDGE, MSG, OLD, SRC, Pregel, sent_nothing
from iterflow.graph.programs import VertexProgram, run_program

_NEW = "_pregel_new_"
_ACTIVE = "_pregel_active"
_BLOCK = "_pregel_block"
_OFFSET = "_pregel_offset"


def _prefixed(df: DataFrame, prefix: str) -> DataFrame:
    return df.select(*(F.col(c).alias(prefix + c) for c in df.columns))


def _mentions(column: Column | None, prefix: str) -> bool:
    return column is not None and prefix in str(column)


def pregel_body(
    state: Mapping[str, Column],
    send_to_dst: Column | None,
    send_to_src: Column | None,
    aggregate: Callable[[Column], Column],
    active: Column | None,
    gather: BlockGather | None = None,
) -> itf.IterationBody:
    """The body of one Pregel superstep over ``vertices``, ``active`` and the edges.

    ``state`` maps each state column to its update expression. With ``gather`` (the block
    path) the edges are Arrow files per vertex block, and the senders' edges are read
    from them by a kernel, instead of joined.
    """
    changed = F.lit(False)
    for name in state:
        changed = changed | ~F.col(name).eqNullSafe(Pregel.old(name))
    wake = changed if active is None else active

    @itf.body
    def superstep(
        vertices: DataFrame,
        active_vertices: DataFrame,
        out_edges: DataFrame,
        in_edges: DataFrame,
        ctx: itf.RoundContext,
    ) -> itf.Declaration:
        if gather is not None:  # vertex rows are joined, never broadcast from the driver
            vertices = apart(vertices)
        parts = []
        if send_to_dst is not None:
            parts.append(
                _sent(ctx, active_vertices, out_edges, vertices, (True, send_to_dst), gather)
            )
        if send_to_src is not None:
            parts.append(
                _sent(ctx, active_vertices, in_edges, vertices, (False, send_to_src), gather)
            )
        messages = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        messages = ctx.observe("messages", messages)
        combined = messages.groupBy("id").agg(aggregate(F.col(MSG)).alias(MSG))
        columns = vertices.columns
        received = vertices.join(combined, "id").select(
            *((state[c].alias(c) if c in state else F.col(c)) for c in columns),
            *(F.col(c).alias(OLD + c) for c in state),
            F.col(MSG),
        )
        # Both feedbacks read the updated vertices: computed once per round.
        updated = ctx.cache(received.select(*columns, wake.alias(_ACTIVE)))
        woken = ctx.observe("active", updated.where(F.col(_ACTIVE)).select(*columns))
        new_vertices = _with_updates(vertices, updated, columns)
        return itf.Declaration(
            feedback={"vertices": new_vertices, "active_vertices": woken},
            outputs={"vertices": new_vertices},
            until=itf.empty(woken),
        )

    return superstep


def _sent(
    ctx: itf.RoundContext,
    senders: DataFrame,
    edges: DataFrame,
    vertices: DataFrame,
    direction: tuple[bool, Column],
    gather: BlockGather | None,
) -> DataFrame:
    """The messages ``senders`` send along ``edges``: forward (to ``dst``) or backward.

    With ``gather`` the senders' edges are read from the block files by a kernel; the
    other end's vertex row is joined only when the message mentions it.
    """
    forward, message = direction
    me, other = (SRC, DST) if forward else (DST, SRC)
    my_end, other_end = ("src", "dst") if forward else ("dst", "src")
    if gather is not None:
        joined = gather.joined(ctx, senders, edges, forward)
    else:
        joined = _prefixed(senders, me).join(
            _prefixed(edges, EDGE), F.col(me + "id") == F.col(EDGE + my_end)
        )
    if _mentions(message, other):
        joined = joined.join(
            _prefixed(vertices, other), F.col(other + "id") == F.col(EDGE + other_end)
        )
    return joined.select(F.col(EDGE + other_end).alias("id"), message.alias(MSG)).where(
        F.col(MSG).isNotNull()
    )


def _with_updates(vertices: DataFrame, updated: DataFrame, columns: list[str]) -> DataFrame:
    """``vertices`` with the rows that received messages replaced by their ``updated`` form."""
    hit = updated.select(
        "id", *(F.col(c).alias(_NEW + c) for c in columns if c != "id"), F.lit(True).alias(MSG)
    )
    return vertices.join(hit, "id", "left").select(
        *(
            F.when(F.col(MSG), F.col(_NEW + c)).otherwise(F.col(c)).alias(c)
            if c != "id"
            else F.col("id")
            for c in columns
        ),
    )


def pregel(
    graph: Any,
    *,
    init: Mapping[str, Column] | None = None,
    update: Mapping[str, Column] | None = None,
    program: VertexProgram | None = None,
    send_to_dst: Column | None = None,
    send_to_src: Column | None = None,
    aggregate: Callable[[Column], Column] = F.sum,
    active: Column | None = None,
    max_rounds: int | None = None,
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """Run a vertex program on ``graph`` and return its vertices with the state columns.

    ``init`` maps each state column to its initial value (an expression over the
    vertex's columns); ``update`` maps state columns to their value after a round in
    which the vertex received ``Pregel.msg()`` (a state column without an update
    keeps its value). ``aggregate`` combines the messages to one vertex (``F.sum``,
    ``F.min``, ``F.max``...). ``active`` decides which updated vertices send next
    round (default: those whose state changed). Stops when a round sends no
    message, when no vertex is active, or after ``max_rounds``; without
    ``max_rounds`` a program that never settles runs forever.

    ``listen`` takes a listener called after every round: its
    ``RoundEnd.progress.observed`` has ``messages`` (sent this round) and
    ``active`` (vertices that will send next round). Other keyword arguments go to
    ``BoundedIteration.run`` (``progress``, ``event_log``, ``checkpoint_dir``...).

    Example, single-source shortest paths by edge ``weight`` from vertex 1::

        pregel(g,
               init={"dist": F.when(F.col("id") == 1, 0.0).otherwise(float("inf"))},
               update={"dist": F.least(F.col("dist"), Pregel.msg())},
               send_to_dst=Pregel.src("dist") + Pregel.edge("weight"),
               aggregate=F.min)

    ``program=`` runs a ``VertexProgram`` (numpy functions over state arrays) instead of
    expressions: on the vector path, the state on the driver and the edges resident in
    the executors (see ``iterflow.graph.programs``).
    """
    if program is not None:
        if init is not None or update is not None:
            raise GraphError("pregel() takes either program= or init= and update=, not both")
        return _numpy_program(graph, program, (method, blocks), max_rounds, listen, run_options)
    if init is None or update is None:
        raise GraphError("pregel() needs init= and update= (Column expressions), or program=")
    expressions = PregelProgram(
        init=init,
        update=update,
        send_to_dst=send_to_dst,
        send_to_src=send_to_src,
        aggregate=aggregate,
        active=active,
    )
    return _run_expressions(graph, expressions, method, blocks, max_rounds, listen, run_options)


def _run_expressions(
    graph: Any,
    expressions: PregelProgram,
    method: str,
    blocks: int | None,
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
) -> Any:
    """``pregel(init=, update=...)``: compiled to the kernel engine while the vertices fit
    the vector path (``method`` ``"auto"`` or ``"arrow"``), else, or when an expression
    does not compile, on the DataFrame or block path."""
    g = as_graph(graph)
    expressions.check_names(g)
    kernel_method = method in ("auto", "arrow")
    method, n = choose_method(
        "pregel", method, g, below_limit="arrow" if kernel_method else "dataframe"
    )
    notes = None
    if method in ("arrow", "blocks"):
        vertices, notes = _on_kernels(
            g, expressions, (method, n, blocks), max_rounds, listen, run_options
        )
        if vertices is not None:
            return graph_result(graph, vertices)
        if method == "arrow":
            method = "dataframe"
            check_edge_ends(g, "pregel()")
    with itf.worker_errors(GraphError):  # an edge to no vertex, found by a worker
        result = expressions.run(
            g,
            n=n,
            method=method,
            blocks=blocks,
            max_rounds=max_rounds,
            listen=listen,
            notes=notes,
            **run_options,
        )
    return graph_result(graph, shown(result))


def _on_kernels(
    g: Graph,
    expressions: PregelProgram,
    path: tuple[str, int, int | None],
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
) -> tuple[DataFrame | None, dict[str, Any]]:
    """``expressions`` compiled and run on the kernel engine, on the vector path or
    (``path``: the method, the vertices, the blocks) the block path: the vertices, or None
    and the event log's notes naming what did not compile (the DataFrame path, or the
    block path's joins, run it then)."""
    method, n, blocks = path
    typing = Typing.of(g.vertices, g.edges)
    try:
        compiled = compile_pregel(
            typing,
            expressions.init,
            expressions.update,
            (expressions.send_to_dst, expressions.send_to_src),
            expressions.aggregate,
            expressions.active,
        )
        if method == "blocks":
            check_for_blocks(compiled)
    except Unsupported as reason:
        return None, engine_note(str(reason), "pregel()")
    if method == "blocks":
        with itf.worker_errors(GraphError):
            return run_compiled_on_blocks(
                g,
                compiled,
                typing,
                n=n,
                blocks=blocks,
                max_rounds=max_rounds,
                listen=listen,
                run_options=run_options,
            ), {}
    with itf.worker_errors(GraphError):
        vertices = run_compiled(
            g,
            compiled,
            typing,
            max_rounds=max_rounds,
            listen=listen,
            run_options=run_options,
            function="pregel()",
        )
    return vertices, {}


def _numpy_program(
    graph: Any,
    program: VertexProgram,
    path: tuple[str, int | None],
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
) -> Any:
    """``pregel(program=...)``: a ``VertexProgram`` on the vector path, or (``path``: the
    method and the blocks) on the block path (``compiled_blocks``); ``method="dataframe"``
    is a ``GraphError``: a numpy program has no DataFrame form."""
    method, blocks = path
    if not isinstance(program, VertexProgram):
        raise GraphError(f"pregel(program=...) takes a VertexProgram, got {type(program).__name__}")
    g = as_graph(graph)
    chosen, n = choose_method("pregel", method, g)
    if chosen == "dataframe":
        raise GraphError(
            "pregel(program=...) runs numpy functions, on the vector path or the block "
            "path; method='dataframe' is for programs written as Column expressions"
        )
    if chosen == "blocks":
        with itf.worker_errors(GraphError):
            vertices = run_on_blocks(
                g,
                BlockProgram.of_numpy(program, g.edges),
                g.edges,
                n=n,
                blocks=blocks,
                max_rounds=max_rounds,
                listen=listen,
                run_options=run_options,
            )
        return graph_result(graph, vertices)
    with itf.worker_errors(GraphError):
        vertices = run_program(
            graph, program, max_rounds=max_rounds, listen=listen, run_options=run_options
        )
    return graph_result(graph, vertices)


@attrs.frozen(kw_only=True)
class PregelProgram:
    """A vertex program: the arguments of ``pregel`` that describe it, checked."""

    init: Mapping[str, Column]
    update: Mapping[str, Column]
    send_to_dst: Column | None = None
    send_to_src: Column | None = None
    aggregate: Callable[[Column], Column] = F.sum
    active: Column | None = None

    def __attrs_post_init__(self) -> None:
        if self.send_to_dst is None and self.send_to_src is None:
            raise GraphError("pregel() needs a message: send_to_dst=..., send_to_src=... or both")
        if not self.init:
            raise GraphError("pregel(init=...) needs at least one state column")
        unknown = sorted(set(self.update) - set(self.init))
        if unknown:
            raise GraphError(
                f"pregel(update=...) names {unknown}, which are not state columns; "
                f"the state columns (init=...) are {sorted(self.init)}"
            )

    def check_names(self, g: Graph) -> None:
        """The state columns must not overwrite the vertices' own."""
        clash = sorted(set(self.init) & (set(g.vertices.columns) - {"id"}))
        if "id" in self.init or clash:
            raise GraphError(
                f"pregel(init=...) would overwrite the vertex column(s) {clash or ['id']}; "
                "pick new names for the state columns"
            )

    def run(
        self,
        g: Graph,
        *,
        n: int,
        method: str = "dataframe",
        blocks: int | None = None,
        max_rounds: int | None = None,
        listen: Any = None,
        notes: Mapping[str, Any] | None = None,
        **run_options: Any,
    ) -> itf.IterationResult:
        """Run on ``g`` (``n`` vertices) by ``method`` (``"dataframe"`` or ``"blocks"``); the
        ``IterationResult`` has the output ``vertices`` (read it with ``shown``). ``notes``
        go into the event log's ``iteration_started``."""
        init, send_to_dst, send_to_src = self.init, self.send_to_dst, self.send_to_src
        self.check_names(g)
        vertices = g.vertices.select("*", *(expr.alias(name) for name, expr in init.items()))
        lay = None
        gather = None
        if method == "blocks":
            lay = vertex_layout(g.vertices, n, blocks)
            vertices, out_edges, in_edges, gather = _on_blocks(lay, vertices, g.edges)
        else:
            partitions = int(g.vertices.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
            out_edges = g.edges.repartition(partitions, "src")
            in_edges = g.edges.repartition(partitions, "dst")
        iteration = (
            itf.BoundedIteration(
                pregel_body(
                    self.update, send_to_dst, send_to_src, self.aggregate, self.active, gather
                )
            )
            .bind("vertices", vertices, on_driver=lay is None)
            .bind("active_vertices", vertices, on_driver=lay is None)
            .bind(
                "out_edges",
                out_edges if send_to_dst is not None else out_edges.limit(0),
                replay=lay is not None,
            )
            .bind(
                "in_edges",
                in_edges if send_to_src is not None else in_edges.limit(0),
                replay=lay is not None,
            )
            .until(itf.until(sent_nothing))
        )
        if max_rounds is not None:
            iteration = iteration.until(itf.max_rounds(max_rounds))
        if notes:
            iteration = iteration.note(**notes)
        release = lay.release if lay is not None else None
        return run_iteration(iteration, listen, run_options, release=release)


def _on_blocks(
    lay: Layout, vertices: DataFrame, edges: DataFrame
) -> tuple[DataFrame, DataFrame, DataFrame, BlockGather]:
    """The block path's vertices (with their block and offset), out-edges and in-edges (in
    the partition of their source block, and of their destination block), and the gather
    that reads the senders' edges from their edge files."""
    placed = lay.place(vertices, "id", _BLOCK, _OFFSET)
    kept = tuple(EDGE + c for c in edges.columns)
    ends = edges.select("src", "dst", *(F.col(c).alias(EDGE + c) for c in edges.columns))
    gather = BlockGather(
        edge_file("pregel()", by_source=True, distinct=False, columns=kept, dense=lay.dense),
        ends.select(*kept).schema,
    )
    return (
        placed.select(*vertices.columns, _BLOCK, _OFFSET),
        edge_rows(lay, ends, columns=kept),
        edge_rows(lay, ends, reverse=True, columns=kept),
        gather,
    )


def shown(result: itf.IterationResult) -> DataFrame:
    """The vertices a Pregel run ended with, without the block path's own columns."""
    return result.outputs["vertices"].drop(_BLOCK, _OFFSET)


@attrs.frozen
class BlockGather:
    """The block path's senders joined with their edges: a kernel reads each sender's edges
    from the edge file of its block (sorted by source: a cost that follows the senders)."""

    prepare: Callable[[pa.Table], pa.Table]
    edge_schema: StructType  # the edges' columns, prefixed with EDGE

    def joined(
        self, ctx: itf.RoundContext, senders: DataFrame, edges: DataFrame, forward: bool
    ) -> DataFrame:
        me = SRC if forward else DST
        columns = [c for c in senders.columns if c not in (_BLOCK, _OFFSET)]
        fields = [
            StructField(me + f.name, f.dataType) for f in senders.schema.fields if f.name in columns
        ]
        schema = StructType(
            fields + [StructField(f.name, f.dataType) for f in self.edge_schema.fields]
        )
        files = ctx.columnar(edges, self.prepare, resident=False)
        kernel = _gather(me, columns, self.edge_schema.fieldNames())
        return files.map(kernel, schema, rows=senders, by=_BLOCK)


def _gather(me: str, columns: list[str], edge_columns: list[str]) -> Any:
    def gather(table: pa.Table, rows: pa.Table) -> pa.Table:
        check_block(table, int(rows[_BLOCK][0].as_py()))
        offsets = rows[_OFFSET].to_numpy(zero_copy_only=False)
        at, owner = gathered(table["so"].to_numpy(), offsets)
        senders = rows.select(columns).take(pa.array(owner))
        edges = table.select(edge_columns).take(pa.array(at))
        return pa.Table.from_arrays(
            [*senders.columns, *edges.columns], names=[me + c for c in columns] + edge_columns
        )

    return gather
