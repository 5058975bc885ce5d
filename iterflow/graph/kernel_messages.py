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
from iterflow.graph.graphs import Graph
from iterflow.graph.kernel_pregel import MERGES, Typing, kept, refs, side_of, vertex_arrays
from iterflow.graph.vectors import edge_positions

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
    types = [_message_type(typing, e) for e in sent.values() if e is not None]
    message_type = wider(*types)
    if message_type == "void":
        raise Unsupported("the messages are untyped nulls")
    kinds = [aggregate_of(parse(a), _is_message)[0] for a in aggregates]
    spark = g.vertices.sparkSession
    schema = spark.createDataFrame([], f"{MESSAGE} {message_type}").agg(*aggregates).schema
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
        Plan(sent["src"], sent["dst"], tuple(out), message_type, tuple(sorted(columns)), typing),
        schema,
    )


def _is_message(expr: Expr) -> bool:
    return expr.kind == "ref" and expr.name == MESSAGE


def _message_type(typing: Typing, message: Expr) -> str:
    def lookup(name: str) -> Value:
        side, column = side_of(name)
        types = typing.edge if side == "edge" else typing.vertex
        spark_type = typing.column(types, column, f"a message's {side}")
        return Value(np.zeros(0, DTYPES[spark_type]), None, spark_type)

    return evaluate(message, Scope(lookup, 0, typing.ansi)).type


class AggregateStep(itf.CombineFn):
    """Every edge batch's messages merged per vertex, for each aggregate: (values, which
    vertices a valid message reached, which vertices any message reached)."""

    def __init__(self, plan: Plan, ids: pa.Array, arrays: Mapping[str, np.ndarray]) -> None:
        self.plan, self.ids, self.arrays = plan, ids, arrays

    def create_accumulator(self) -> Any:
        n = len(self.ids)
        merged = [
            (np.zeros(n, DTYPES[a.spark_type]), np.zeros(n, bool)) for a in self.plan.aggregates
        ]
        return merged, np.zeros(n, dtype=bool)

    def add_input(self, acc: Any, batch: pa.RecordBatch) -> Any:
        table = pa.Table.from_batches([batch])
        src, dst = edge_positions(table, self.ids)
        for message, to in ((self.plan.to_src, src), (self.plan.to_dst, dst)):
            if message is None:
                continue
            value = self._evaluated(message, table, src, dst)
            acc = self._merged(acc, to, value)
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

    def _merged(self, acc: Any, to: np.ndarray, value: Value) -> Any:
        merged, reached = acc
        reached = reached.copy()
        reached[to] = True
        valid = value.validity()
        order = np.argsort(to[valid], kind="stable")
        targets = to[valid][order]
        starts = np.flatnonzero(np.r_[True, targets[1:] != targets[:-1]])
        out = []
        for aggregate, (values, hit) in zip(self.plan.aggregates, merged, strict=True):
            if aggregate.kind == "count":
                data = np.ones(len(targets), dtype=np.int64)
            else:
                data = cast(value, aggregate.spark_type).data[valid][order]
            part = np.zeros(len(hit), dtype=values.dtype)
            part_hit = np.zeros(len(hit), dtype=bool)
            if len(targets):
                part[targets[starts]] = _merge(aggregate).reduceat(data, starts)
                part_hit[targets[starts]] = True
            out.append(_pair(aggregate, (values, hit), (part, part_hit)))
        return out, reached

    def merge_accumulators(self, accs: list[Any]) -> Any:
        acc = self.create_accumulator()
        for merged, reached in accs:
            acc = (
                [
                    _pair(a, mine, theirs)
                    for a, mine, theirs in zip(self.plan.aggregates, acc[0], merged, strict=True)
                ],
                acc[1] | reached,
            )
        return acc

    def extract_output(self, acc: Any) -> pa.Table:
        merged, reached = acc
        at = np.flatnonzero(reached)
        cells = [itf.vector_cell(at.astype(np.int64))]
        for values, hit in merged:
            cells += [itf.vector_cell(values[at]), itf.vector_cell(hit[at])]
        names = ["_at", *(f"{k}{i}" for i in range(len(merged)) for k in ("_v", "_ok"))]
        return pa.table(cells, names=names)


def _merge(aggregate: Aggregate) -> Any:
    merge = MERGES[aggregate.kind]
    return np.add if merge == "sum" else MERGES["first"] if merge == "first" else merge


def _pair(aggregate: Aggregate, one: Any, other: Any) -> tuple[np.ndarray, np.ndarray]:
    (a, a_hit), (b, b_hit) = one, other
    out = np.where(a_hit, a, b)
    both = a_hit & b_hit
    if both.any():
        out[both] = _merge(aggregate)(a[both], b[both])
    return out, a_hit | b_hit


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
    table = g.vertices.select("id", *compiled.columns).toArrow()
    ids = table.column("id").combine_chunks()
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
