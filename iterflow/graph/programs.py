"""Vertex programs written in numpy (``iterflow.graph.VertexProgram``), run on the vector
path: the vertex state in arrays on the driver, the edges resident in the executors.

A round sends, along every edge whose sender is active, the message that
``send_to_dst`` (or ``send_to_src``) computes from the arrays of the two ends' states
and the edge's columns; a NaN or masked message sends nothing. Each partition of the
edges merges its messages per vertex with ``merge``; ``itf.combine`` merges the
partitions' results along its tree among the resident tasks, so the driver receives
one array per state; then ``apply`` gives every vertex its new state and whether it
stays active. The run stops when no vertex is active, or after ``max_rounds``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame

import iterflow as itf
from iterflow.graph.graphs import GraphError, as_graph, run_iteration
from iterflow.graph.vectors import edge_positions, merged_pair, merged_per_key

#: Spark's name for each numpy kind of state.
_SPARK_TYPES = {
    "f8": "DOUBLE",
    "f4": "FLOAT",
    "i8": "BIGINT",
    "i4": "INT",
    "i2": "SMALLINT",
    "i1": "TINYINT",
    "b1": "BOOLEAN",
}


class _First:
    """The ``"first"`` merge: of the messages to a vertex, the one merged first (Spark's
    ``first``, whose pick among the messages is as arbitrary)."""

    @staticmethod
    def reduceat(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return values[starts]

    def __call__(self, kept: np.ndarray, other: np.ndarray) -> np.ndarray:
        return kept


_MERGES: dict[str, Any] = {
    "sum": np.add,
    "min": np.minimum,
    "max": np.maximum,
    "prod": np.multiply,
    "first": _First(),
}
#: Which edges send in a round: those whose sending end is active, or either end.
SENDERS = ("source", "either")

Arrays = dict[str, np.ndarray]


def spark_type(dtype: Any) -> str:
    kind = np.dtype(dtype).str[1:]
    if kind not in _SPARK_TYPES:
        raise GraphError(
            f"VertexProgram state of dtype {np.dtype(dtype)} is not supported; use "
            "float64, float32, int64, int32 or bool"
        )
    return _SPARK_TYPES[kind]


@attrs.frozen
class VertexProgram:
    """A Pregel program in numpy: ``state`` (name to numpy dtype), ``init`` (the vertices
    as an Arrow table to a dict of state arrays), ``send_to_dst`` and/or ``send_to_src``
    (``src`` and ``dst`` state dicts and ``edges``, a dict of the edges' other columns,
    each an array per edge, to one message per edge), ``merge`` (``"sum"``, ``"min"``,
    ``"max"``, ``"prod"``, ``"first"`` or a numpy ufunc), and ``apply`` (the state, the
    merged messages and a mask of the vertices that received any, to the new state and a
    mask of the active vertices; or to ``(state, active, go_on)``, where ``go_on`` False
    ends the run after this round).

    ``senders="source"`` (the default) sends along the edges whose sending end is active
    (``send_to_dst`` from an active source); ``"either"`` along the edges with either end
    active (GraphFrames' ``setSkipMessagesFromNonActiveVertices``). A NaN message sends
    nothing unless ``nan_sends`` (Spark's rule, where NaN is a value and only null is no
    message: what compiled Column expressions use); a masked entry never sends.

    Example, single-source shortest paths by edge length::

        sssp = VertexProgram(
            state={"dist": np.float64},
            init=lambda v: {"dist": np.where(v["id"].to_numpy() == 1, 0.0, np.inf)},
            send_to_dst=lambda src, dst, e: np.where(np.isfinite(src["dist"]),
                                                     src["dist"] + e["km"], np.nan),
            merge="min",
            apply=lambda s, m, got: ({"dist": np.fmin(s["dist"], m)},
                                     got & (m < s["dist"])),
        )
        pregel(g, program=sssp, max_rounds=50)   # vertices with dist
    """

    state: Mapping[str, Any]
    init: Callable[[pa.Table], Arrays]
    apply: Callable[[Arrays, np.ndarray, np.ndarray], tuple[Arrays, np.ndarray]]
    send_to_dst: Callable[[Arrays, Arrays, Arrays], np.ndarray] | None = None
    send_to_src: Callable[[Arrays, Arrays, Arrays], np.ndarray] | None = None
    merge: str | np.ufunc = "sum"
    senders: str = "source"
    nan_sends: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.state:
            raise GraphError("VertexProgram(state=...) needs at least one state array")
        for dtype in self.state.values():
            spark_type(dtype)
        if self.send_to_dst is None and self.send_to_src is None:
            raise GraphError("VertexProgram needs send_to_dst=, send_to_src= or both")
        if not isinstance(self.merge, np.ufunc) and self.merge not in _MERGES:
            raise GraphError(
                f"VertexProgram(merge={self.merge!r}): 'sum', 'min', 'max', 'prod', 'first' "
                "or a numpy ufunc"
            )
        if self.senders not in SENDERS:
            raise GraphError(f"VertexProgram(senders={self.senders!r}): one of {SENDERS}")

    @property
    def ufunc(self) -> Any:
        """The merge as a numpy ufunc (or an object with ``reduceat`` and a call, as one)."""
        return merge_function(self.merge)


def merge_function(merge: str | np.ufunc) -> Any:
    """A merge named as ``VertexProgram(merge=...)`` takes it, as a numpy ufunc (or, for
    ``"first"``, an object with ``reduceat`` and a call, as one)."""
    return merge if isinstance(merge, np.ufunc) else _MERGES[merge]


def sent_messages(
    messages: Any, count: int, who: str, nan_sends: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """A send function's result as (values, which edges send): a masked entry sends
    nothing, nor does NaN unless ``nan_sends``."""
    mask = np.ma.getmaskarray(messages) if np.ma.isMaskedArray(messages) else None
    values = np.asarray(np.ma.getdata(messages))
    if values.shape != (count,):
        raise GraphError(f"VertexProgram.{who} returned shape {values.shape}, not ({count},)")
    sends = np.ones(count, dtype=bool) if mask is None else ~mask
    if values.dtype.kind == "f" and not nan_sends:
        sends &= ~np.isnan(values)
    return values, sends


def _senders(sources: np.ndarray, active: np.ndarray) -> np.ndarray:
    """The edges whose source is active: a mask when many are, else the positions of
    their edges found by binary search in ``sources`` (sorted), so that a round with few
    active vertices costs their edges, not all the partition's."""
    awake = np.flatnonzero(active)
    if len(awake) * 8 >= len(sources):
        return active[sources]
    first = np.searchsorted(sources, awake, "left")
    counts = np.searchsorted(sources, awake, "right") - first
    offsets = np.cumsum(counts) - counts
    return np.arange(int(counts.sum())) + np.repeat(first - offsets, counts)


class MessageStep(itf.CombineFn):
    """One round of a ``VertexProgram``: every partition of the edges merges the messages
    its active senders send into an array per vertex (and a mask of vertices reached); the
    merged arrays become the new state in ``extract_output``."""

    def __init__(self, program: VertexProgram, state: Arrays, active: np.ndarray, messages: Any):
        self.program, self.state, self.active, self.messages = program, state, active, messages

    def create_accumulator(self) -> tuple[np.ndarray | None, np.ndarray, int]:
        """(merged messages or None, which vertices any reached, how many were sent)."""
        return None, np.zeros(len(self.active), dtype=bool), 0

    def add_inputs(self, acc: Any, table: pa.Table) -> Any:
        src, dst = table["_src"].to_numpy(), table["_dst"].to_numpy()
        columns = {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}
        for send, frm, to, who in (
            (self.program.send_to_dst, src, dst, "send_to_dst"),
            (self.program.send_to_src, dst, src, "send_to_src"),
        ):
            if send is None:
                continue
            live = self._live(src, dst, frm, who)
            edges = {c: v[live] for c, v in columns.items() if not c.startswith("_")}
            ends = frm[live], to[live]
            at_src, at_dst = ends if who == "send_to_dst" else ends[::-1]
            values, sends = sent_messages(
                send(
                    {k: v[at_src] for k, v in self.state.items()},
                    {k: v[at_dst] for k, v in self.state.items()},
                    edges,
                ),
                len(ends[0]),
                who,
                self.program.nan_sends,
            )
            count = int(sends.sum())
            self.messages.inc(count)
            acc = self._merged(acc, ends[1][sends], values[sends], count)
        return acc

    def _live(self, src: np.ndarray, dst: np.ndarray, frm: np.ndarray, who: str) -> Any:
        """The edges that send this round (a mask or positions)."""
        if self.program.senders == "either":
            return self.active[src] | self.active[dst]
        return _senders(src, self.active) if who == "send_to_dst" else self.active[frm]

    def add_input(self, acc: Any, batch: pa.RecordBatch) -> Any:
        return self.add_inputs(acc, pa.Table.from_batches([batch]))

    def _merged(self, acc: Any, to: np.ndarray, values: np.ndarray, count: int) -> Any:
        part, hit = merged_per_key(to, values, len(acc[1]), self.program.ufunc)
        return self._both(acc, (part, hit, count))

    def _both(self, one: Any, other: Any) -> Any:
        (a, a_hit, a_sent), (b, b_hit, b_sent) = one, other
        if a is None:
            return b, b_hit, a_sent + b_sent
        if b is None:
            return a, a_hit, a_sent + b_sent
        out, hit = merged_pair(self.program.ufunc, (a, a_hit), (b, b_hit))
        return out, hit, a_sent + b_sent

    def merge_accumulators(self, accs: list[Any]) -> Any:
        acc = self.create_accumulator()
        for other in accs:
            acc = self._both(acc, other)
        return acc

    def extract_output(self, acc: Any) -> pa.Table:
        merged, reached, sent = acc
        if merged is None:
            merged = np.zeros(len(reached))
        applied = self.program.apply(self.state, merged, reached)
        new_state, active = applied[0], np.asarray(applied[1], dtype=bool)
        go_on = bool(applied[2]) if len(applied) > 2 else None
        return _state_row(self.program, new_state, active, go_on, sent)


def _state_row(
    program: VertexProgram,
    state: Arrays,
    active: np.ndarray,
    go_on: bool | None = None,
    sent: int = 0,
) -> pa.Table:
    """The one row of a round's state: an array cell per state, the active mask,
    ``_awake`` (the active count, or 1/0 by ``go_on`` when ``apply`` said it: 0 stops) and
    ``_sent``, the messages the round sent."""
    missing = set(program.state) - set(state)
    if missing:
        raise GraphError(f"VertexProgram returned no array for state {sorted(missing)}")
    cells = [itf.vector_cell(np.asarray(state[k], dtype=d)) for k, d in program.state.items()]
    awake = int(active.sum()) if go_on is None else int(go_on)
    cells += [itf.vector_cell(active), pa.array([awake]), pa.array([sent], pa.int64())]
    return pa.table(cells, names=[*program.state, "_active", "_awake", "_sent"])


def _schema(program: VertexProgram) -> str:
    fields = [f"`{k}` ARRAY<{spark_type(d)}>" for k, d in program.state.items()]
    return ", ".join([*fields, "`_active` ARRAY<BOOLEAN>", "`_awake` BIGINT", "`_sent` BIGINT"])


def _cell(table: pa.Table, column: str) -> np.ndarray:
    """The array in the one row of ``column`` (booleans are copied: Arrow packs them)."""
    return table.column(column)[0].values.to_numpy(zero_copy_only=False)


def _awake(end: itf.RoundEnd) -> float:
    """How many vertices the round left active (read from the driver's variable)."""
    return float(itf.to_arrow(end.variables["state"]).column("_awake")[0].as_py())


def _program_body(program: VertexProgram, ids: pa.Array) -> itf.IterationBody:
    messages = itf.metrics.counter("messages")

    def prepare(table: pa.Table) -> pa.Table:
        """Positions for ids, and the edges sorted by source: a round finds its active
        senders' edges by binary search (``_senders``)."""
        src, dst = edge_positions(table, ids)
        order = np.argsort(src, kind="stable")
        others = {c: table[c].take(order) for c in table.column_names if c not in ("src", "dst")}
        return pa.table({"_src": src[order], "_dst": dst[order], **others})

    @itf.body
    def vertex_program(
        state: DataFrame, edges: DataFrame, ctx: itf.RoundContext
    ) -> itf.Declaration:
        held = itf.to_arrow(state)
        current = {k: _cell(held, k) for k in program.state}
        active = _cell(held, "_active")
        step = MessageStep(program, current, active, messages)
        new_state = itf.combine(ctx.columnar(edges, prepare), step, _schema(program), depth=2)
        return itf.Declaration(
            feedback={"state": new_state},
            outputs={"state": new_state},
            until=itf.converged(_awake, 0.0),
        )

    return vertex_program


def state_counts(ctx: itf.RoundEnd) -> tuple[int, int]:
    """The messages a vector-path round sent and the vertices it left active, from its
    state row."""
    row = itf.to_arrow(ctx.variables["state"])
    return int(row.column("_sent")[0].as_py()), int(_cell(row, "_active").sum())


class CountedListener(itf.RoundListener):
    """A listener of a kernel run of a vertex program, shown each round's progress as the
    DataFrame path of ``pregel`` fills it: ``observed["messages"]`` (sent this round),
    ``["active"]`` (the vertices that send next round, also ``criteria_rows``), as
    ``counts`` reads them from the round; and, when the run ended with no vertex active,
    the termination reasons ``criteria_empty`` (and ``predicate`` when the last round
    sent nothing)."""

    def __init__(
        self, listener: Any, counts: Callable[[itf.RoundEnd], tuple[int, int]] = state_counts
    ) -> None:
        self.listener = listener
        self.counts = counts
        self.history: list[itf.RoundProgress] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        sent, awake = self.counts(ctx)
        observed = {**ctx.progress.observed, "messages": sent, "active": awake}
        progress = attrs.evolve(
            ctx.progress,
            observed=observed,
            criteria_rows=observed["active"],
            criteria_empty=observed["active"] == 0,
        )
        self.history.append(progress)
        ctx = attrs.evolve(ctx, progress=progress)
        if hasattr(self.listener, "on_round_end"):
            self.listener.on_round_end(ctx)
        elif not hasattr(self.listener, "on_iteration_terminated"):
            self.listener(ctx)  # a function

    def on_iteration_terminated(self, ctx: itf.IterationEnd) -> None:
        if hasattr(self.listener, "on_iteration_terminated"):
            kept = {p.epoch: p for p in self.history}
            history = tuple(kept.get(p.epoch, p) for p in ctx.history)
            termination = ctx.termination
            if (
                termination.reason != "max_rounds"
                and history
                and not history[-1].observed["active"]
            ):
                last = history[-1].observed
                reasons: tuple[str, ...] = ("criteria_empty",)
                if not last["messages"]:
                    reasons += ("predicate",)
                termination = attrs.evolve(termination, reason=reasons[0], reasons=reasons)
            self.listener.on_iteration_terminated(
                attrs.evolve(ctx, history=history, termination=termination)
            )

    def on_round_progress(self, sample: Any) -> None:
        if hasattr(self.listener, "on_round_progress"):
            self.listener.on_round_progress(sample)


def run_program(
    graph: Any,
    program: VertexProgram,
    *,
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
) -> DataFrame:
    """The vertices of ``graph`` with a column per state of ``program`` after it ran."""
    if not isinstance(program, VertexProgram):
        raise GraphError(f"pregel(program=...) takes a VertexProgram, got {type(program).__name__}")
    g = as_graph(graph)
    ids, final = run_arrays(
        g, program, max_rounds=max_rounds, listen=listen, run_options=run_options
    )
    columns = {"id": ids, **final}
    spark = g.vertices.sparkSession
    return g.vertices.drop(*program.state).join(spark.createDataFrame(pa.table(columns)), "id")


def run_arrays(
    g: Any,
    program: VertexProgram,
    *,
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
    edges: DataFrame | None = None,
    first_active: Callable[[Arrays], np.ndarray] | None = None,
    notes: Mapping[str, Any] | None = None,
) -> tuple[pa.Array, Arrays]:
    """Run ``program`` on graph ``g``: the vertex ids and the final state arrays (in the
    ids' order). ``edges`` replaces ``g.edges`` (``src``, ``dst`` and the columns the
    program reads); ``first_active`` gives round 0's active vertices from the initial
    state (default: all); ``notes`` go into the run's ``iteration_started`` event."""
    spark = g.vertices.sparkSession
    table = g.vertices.toArrow()
    ids = table.column("id").combine_chunks()
    state = program.init(table)
    active = np.ones(len(ids), dtype=bool) if first_active is None else first_active(state)
    first = _state_row(program, state, np.asarray(active, dtype=bool))
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
    edges = g.edges if edges is None else edges
    iteration = (
        itf.BoundedIteration(_program_body(program, ids))
        .bind("state", spark.createDataFrame(first, _schema(program)))
        .bind("edges", edges.repartition(partitions, "src"))
        .until(itf.max_rounds(max_rounds if max_rounds is not None else 2**31 - 1))
    )
    if notes:
        iteration = iteration.note(**notes)
    counted = None if listen is None else CountedListener(listen)
    final = itf.to_arrow(run_iteration(iteration, counted, run_options).outputs["state"])
    return ids, {k: _cell(final, k) for k in program.state}
