"""``aggregate_messages`` on the kernel engine: messages written as Column expressions,
evaluated with numpy over the edges' Arrow batches and merged per vertex, in one Spark
job with no shuffle (``itf.combine``), instead of a join and a group-by over rows.

The vertex columns the messages read ride along as arrays (values and validity); each
edge batch evaluates the messages (``iterflow.graph.expressions``), and every aggregate
merges them per vertex by sorted segments. As on the DataFrame path, a vertex that
received only null messages has a row (``sum`` null, ``count`` 0), and one that
received none has no row. ``Unsupported`` (several messages as a struct, an aggregate
other than ``sum/min/max/count/first`` of the message, an expression outside the
compiled set) leaves the work to the DataFrame path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql.types import StructType

import iterflow as itf
from iterflow.graph.expressions import (
    DTYPES,
    Expr,
    Scope,
    Unsupported,
    Value,
    aggregate_of,
    cast,
    evaluate,
    from_arrow,
    parse,
    wider,
)
from iterflow.graph.graphs import Graph, GraphError
from iterflow.graph.kernel_pregel import (
    MERGES,
    Typing,
    kept,
    message_type,
    refs,
    side_of,
    vertex_arrays,
)
from iterflow.graph.methods import vector_limit
from iterflow.graph.programs import merge_function
from iterflow.graph.vectors import edge_positions, merged_pair, merged_per_key

#: The message's name in aggregates (``AggregateMessages.msg``).
MESSAGE = "MSG"


@attrs.frozen
class Aggregate:
    """One aggregate of the messages: its kind and the Spark type of its result."""

    kind: str
    spark_type: str


@attrs.frozen
class Plan:
    """A compiled ``aggregate_messages``: the message per direction, the aggregates, the
    message's type, and the vertex columns the messages read."""

    to_src: Expr | None
    to_dst: Expr | None
    aggregates: tuple[Aggregate, ...]
    message_type: str
    columns: tuple[str, ...]
    typing: Typing


def plan(
    g: Graph, aggregates: list[Column], to_src: list[Column], to_dst: list[Column]
) -> tuple[Plan, StructType]:
    """The compiled form of an ``aggregate_messages`` call and its result's schema (names
    and types as Spark gives them); ``Unsupported`` names what does not compile."""
    if len(to_src) > 1 or len(to_dst) > 1:
        raise Unsupported("several messages sent as one struct")
    typing = Typing.of(g.vertices, g.edges)
    sent = {end: parse(c[0]) if c else None for end, c in (("src", to_src), ("dst", to_dst))}
    types = [message_type(typing, typing.vertex, e) for e in sent.values() if e is not None]
    common = wider(*types)
    if common == "void":
        raise Unsupported("the messages are untyped nulls")
    kinds = [aggregate_of(parse(a), _is_message)[0] for a in aggregates]
    spark = g.vertices.sparkSession
    schema = spark.createDataFrame([], f"{MESSAGE} {common}").agg(*aggregates).schema
    out = []
    for kind, field in zip(kinds, schema.fields, strict=True):
        result = field.dataType.simpleString()
        if result not in DTYPES:
            raise Unsupported(f"an aggregate of type {result}")
        out.append(Aggregate(kind, result))
    columns: set[str] = set()
    for expr in sent.values():
        if expr is not None:
            columns |= {c for s, c in map(side_of, refs(expr)) if s in ("src", "dst")}
    return (
        Plan(sent["src"], sent["dst"], tuple(out), common, tuple(sorted(columns)), typing),
        schema,
    )


def _is_message(expr: Expr) -> bool:
    return expr.kind == "ref" and expr.name == MESSAGE


class Pending:
    """An accumulator of ``AggregateStep``: the messages of the batches seen since the last
    compaction (targets, and per aggregate the values and which are valid), and the merged
    result so far. Batches are only kept until they hold as many messages as there are
    vertices, so a partition costs one sort per that many messages, not an array per
    vertex per batch; it compacts before it is pickled (sent to its merge)."""

    def __init__(self, step: AggregateStep) -> None:
        self.step = step
        self.chunks: list[tuple[np.ndarray, list[np.ndarray], np.ndarray]] = []
        self.rows = 0
        n = len(step.ids)
        self.merged = [
            (np.zeros(n, DTYPES[a.spark_type]), np.zeros(n, bool)) for a in step.plan.aggregates
        ]
        self.reached = np.zeros(n, dtype=bool)

    def add(self, to: np.ndarray, values: list[np.ndarray], valid: np.ndarray) -> None:
        self.chunks.append((to, values, valid))
        self.rows += len(to)
        if self.rows >= max(len(self.reached), 1 << 16):
            self.compact()

    def compact(self) -> Pending:
        if not self.chunks:
            return self
        to = np.concatenate([c[0] for c in self.chunks])
        valid = np.concatenate([c[2] for c in self.chunks])
        columns = [np.concatenate([c[1][i] for c in self.chunks]) for i in range(len(self.merged))]
        self.chunks, self.rows = [], 0
        self.reached[to] = True
        for i, aggregate in enumerate(self.step.plan.aggregates):
            values = columns[i][valid].astype(self.merged[i][0].dtype)
            part = merged_per_key(to[valid], values, len(self.reached), _merge(aggregate))
            self.merged[i] = _pair(aggregate, self.merged[i], part)
        return self

    def absorb(self, other: Pending) -> None:
        other.compact()
        self.compact()
        self.merged = [
            _pair(a, mine, theirs)
            for a, mine, theirs in zip(
                self.step.plan.aggregates, self.merged, other.merged, strict=True
            )
        ]
        self.reached |= other.reached

    def __getstate__(self) -> dict[str, Any]:
        self.compact()
        return {"merged": self.merged, "reached": self.reached}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.chunks, self.rows = [], 0
        self.merged, self.reached = state["merged"], state["reached"]


class AggregateStep(itf.CombineFn):
    """Every edge batch's messages merged per vertex, for each aggregate (``Pending``)."""

    def __init__(self, plan: Plan, ids: pa.Array, arrays: Mapping[str, np.ndarray]) -> None:
        self.plan, self.ids, self.arrays = plan, ids, arrays

    def create_accumulator(self) -> Pending:
        return Pending(self)

    def add_input(self, acc: Pending, batch: pa.RecordBatch) -> Pending:
        table = pa.Table.from_batches([batch])
        src, dst = edge_positions(table, self.ids)
        for message, to in ((self.plan.to_src, src), (self.plan.to_dst, dst)):
            if message is None:
                continue
            value = self._evaluated(message, table, src, dst)
            values = [
                np.ones(len(to), dtype=np.int64)
                if a.kind == "count"
                else cast(value, a.spark_type).data
                for a in self.plan.aggregates
            ]
            acc.add(to, values, value.validity())
        return acc

    def _evaluated(self, message: Expr, table: pa.Table, src: np.ndarray, dst: np.ndarray) -> Value:
        typing = self.plan.typing

        def lookup(name: str) -> Value:
            side, column = side_of(name)
            if side == "edge":
                return from_arrow(table.column(column), typing.edge[column])
            at = src if side == "src" else dst
            whole = kept(self.arrays, column, typing.vertex[column])
            return Value(whole.data[at], whole.validity()[at], whole.type)

        return evaluate(message, Scope(lookup, table.num_rows, typing.ansi))

    def merge_accumulators(self, accs: list[Pending]) -> Pending:
        acc = self.create_accumulator()
        for other in accs:
            other.step = self
            acc.absorb(other)
        return acc

    def extract_output(self, acc: Pending) -> pa.Table:
        acc.compact()
        at = np.flatnonzero(acc.reached)
        cells = [itf.vector_cell(at.astype(np.int64))]
        for values, hit in acc.merged:
            cells += [itf.vector_cell(values[at]), itf.vector_cell(hit[at])]
        names = ["_at", *(f"{k}{i}" for i in range(len(acc.merged)) for k in ("_v", "_ok"))]
        return pa.table(cells, names=names)


def _merge(aggregate: Aggregate) -> Any:
    return merge_function(MERGES[aggregate.kind])


def _pair(aggregate: Aggregate, one: Any, other: Any) -> tuple[np.ndarray, np.ndarray]:
    return merged_pair(_merge(aggregate), one, other)


def _combined_schema(plan: Plan) -> str:
    fields = ["`_at` ARRAY<BIGINT>"]
    for i, a in enumerate(plan.aggregates):
        fields += [f"`_v{i}` ARRAY<{a.spark_type.upper()}>", f"`_ok{i}` ARRAY<BOOLEAN>"]
    return ", ".join(fields)


def on_kernels(
    g: Graph, aggregates: list[Column], to_src: list[Column], to_dst: list[Column]
) -> DataFrame:
    """``aggregate_messages`` on the kernel engine; ``Unsupported`` when it does not
    compile (the caller runs the DataFrame path then)."""
    compiled, schema = plan(g, aggregates, to_src, to_dst)
    limit = vector_limit(g.vertices.sparkSession)
    table = g.vertices.select("id", *compiled.columns).limit(limit + 1).toArrow()
    if table.num_rows > limit:
        raise Unsupported(f"more than {limit:,} vertices (spark.iterflow.graph.vectorLimit)")
    ids = table.column("id").combine_chunks()
    if ids.null_count or len(pc.unique(ids)) < len(ids):
        raise GraphError(
            "aggregate_messages(): vertex ids must be unique and not null; "
            "GraphFrame.validate() names the rows"
        )
    arrays = vertex_arrays(table, compiled.columns, compiled.typing)
    step = AggregateStep(compiled, ids, arrays)
    edges = g.edges.select("src", "dst", *_edge_columns(compiled))
    row = itf.to_arrow(itf.combine(edges, step, _combined_schema(compiled)))
    at = row.column("_at")[0].values.to_numpy()
    columns: dict[str, pa.Array] = {"id": ids.take(pa.array(at))}
    for i, field in enumerate(schema.fields):
        aggregate = compiled.aggregates[i]
        values = row.column(f"_v{i}")[0].values.to_numpy(zero_copy_only=False)
        ok = row.column(f"_ok{i}")[0].values.to_numpy(zero_copy_only=False)
        dtype = DTYPES[aggregate.spark_type]
        missing = None if aggregate.kind == "count" else ~ok  # a count of no message is 0
        columns[field.name] = pa.array(
            values.astype(dtype), mask=missing, type=pa.from_numpy_dtype(dtype)
        )
    spark = g.vertices.sparkSession
    return spark.createDataFrame(pa.table(columns))


def _edge_columns(compiled: Plan) -> list[str]:
    names: set[str] = set()
    for expr in (compiled.to_src, compiled.to_dst):
        if expr is not None:
            names |= {c for s, c in map(side_of, refs(expr)) if s == "edge"}
    return sorted(names - {"src", "dst", "id"})
