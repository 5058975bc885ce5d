"""Vertex programs written as Column expressions, run on the kernel engine.

``iterflow.graph.pregel(init=, update=, send_to_dst=...)`` and GraphFrames' Pregel
builder (``g.pregel``) describe a program with Column expressions. While the vertices
fit the vector path, ``compile_pregel`` and ``compile_builder`` turn such a program into
a ``VertexProgram`` whose functions evaluate the expressions with numpy
(``iterflow.graph.expressions``): the vertex state in arrays on the driver, the edges
resident in the executors, a round's cost following its senders' edges. Each state
column is carried as its values and a validity mask, so nulls keep Spark's meaning, and
a null message is not sent (NaN is a message, as in Spark).

A program with an expression outside the compiled set raises ``Unsupported`` here, and
the caller runs it on the DataFrame path, saying why in the run's event log
(``iteration_started.notes``) and on the ``iterflow.graph`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iterflow.graph.expressions import (
    DTYPES,
    Expr,
    Scope,
    Unsupported,
    Value,
    aggregate_of,
    aggregated_type,
    cast,
    evaluate,
    from_arrow,
    null_safe_equal,
    parse,
    wider,
)
from iterflow.graph.pregel_columns import DST, EDGE, MSG, SRC

_log = logging.getLogger("iterflow.graph")

#: Suffix of a state column's validity mask.
VALID = "#valid"
#: GraphFrames' names of the active flag and of the message.
ACTIVE = "_pregel_is_active"
GRAPHFRAMES_MSG = "_pregel_msg_"
MESSAGE_NAMES = (MSG, GRAPHFRAMES_MSG)
_SIDES = (
    (SRC, "src"),
    ("src.", "src"),
    (DST, "dst"),
    ("dst.", "dst"),
    (EDGE, "edge"),
    ("edge.", "edge"),
)
MERGES: dict[str, Any] = {
    "sum": "sum",
    "count": "sum",
    "min": np.fmin,
    "max": np.maximum,
    "first": "first",
}

Arrays = dict[str, np.ndarray]


def engine_note(reason: str | None, function: str) -> dict[str, Any]:
    """The event log's ``notes`` for a vertex program: the kernel engine, or the DataFrame
    path and why (also logged)."""
    if reason is None:
        return {"engine": "kernel"}
    _log.info("%s runs on the DataFrame path: %s", function, reason)
    return {"engine": "dataframe", "reason": reason}


def refs(expr: Expr) -> set[str]:
    """The names ``expr`` refers to."""
    if expr.kind == "ref":
        return {expr.name}
    return set().union(*(refs(a) for a in expr.args)) if expr.args else set()


def side_of(name: str) -> tuple[str, str]:
    """A message's reference as (``"src"`` | ``"dst"`` | ``"edge"``, column)."""
    for prefix, side in _SIDES:
        if name.startswith(prefix):
            column = name[len(prefix) :]
            if side == "edge" and column in ("src", "dst"):
                return column, "id"
            return side, column
    raise Unsupported(
        f"the column {name!r} in a message (messages read Pregel.src(...), Pregel.dst(...) "
        "and Pregel.edge(...))"
    )


def kept(arrays: Mapping[str, np.ndarray], name: str, spark_type: str) -> Value:
    return Value(arrays[name], arrays[name + VALID], spark_type)


def stored(arrays: Arrays, name: str, value: Value, spark_type: str) -> None:
    value = cast(value, spark_type) if value.type != "void" else value
    arrays[name] = value.data.astype(DTYPES[spark_type])
    arrays[name + VALID] = value.validity()


@attrs.frozen
class Typing:
    """The Spark types a program's expressions see: the vertex columns (``vertex``), the
    edge columns (``edge``), and Spark's ANSI mode."""

    vertex: Mapping[str, str]
    edge: Mapping[str, str]
    ansi: bool

    @classmethod
    def of(cls, vertices: DataFrame, edges: DataFrame) -> Typing:
        conf = vertices.sparkSession.conf.get("spark.sql.ansi.enabled") or "true"
        return cls(
            {f.name: f.dataType.simpleString() for f in vertices.schema.fields},
            {f.name: f.dataType.simpleString() for f in edges.schema.fields},
            conf.strip().lower() == "true",
        )

    def column(self, types: Mapping[str, str], name: str, where: str) -> str:
        if name not in types:
            raise Unsupported(f"{where} reads {name!r}, which is not a column there")
        spark_type = types[name]
        if spark_type not in DTYPES or spark_type == "void":
            raise Unsupported(f"{where} reads {name!r} of type {spark_type}")
        return spark_type

    def empty(self, types: Mapping[str, str], where: str, extra: Mapping[str, str]) -> Scope:
        """A scope of no rows over ``types`` and ``extra`` (name to type): to type an
        expression before it runs."""

        def lookup(name: str) -> Value:
            spark_type = extra[name] if name in extra else self.column(types, name, where)
            return Value(np.zeros(0, DTYPES[spark_type]), None, spark_type)

        return Scope(lookup, 0, self.ansi)


def message_type(typing: Typing, state_types: Mapping[str, str], message: Expr) -> str:
    """The Spark type of ``message`` over vertices of ``state_types`` and ``typing``'s
    edges (``Unsupported`` for a column it cannot read)."""

    def lookup(name: str) -> Value:
        side, column = side_of(name)
        types = typing.edge if side == "edge" else state_types
        spark_type = typing.column(types, column, f"a message's {side}")
        return Value(np.zeros(0, DTYPES[spark_type]), None, spark_type)

    return evaluate(message, Scope(lookup, 0, typing.ansi)).type


@attrs.frozen
class Messages:
    """The compiled messages of a program: per direction, the message expression; the
    aggregate, its type, and the columns each side's references need."""

    to_dst: Expr | None
    to_src: Expr | None
    aggregate: str
    message_type: str
    merged_type: str

    @classmethod
    def of(
        cls,
        typing: Typing,
        state_types: Mapping[str, str],
        to_dst: Expr | None,
        to_src: Expr | None,
        aggregate: Expr,
    ) -> Messages:
        types = [message_type(typing, state_types, e) for e in (to_dst, to_src) if e is not None]
        common = wider(*types)
        if common == "void":
            raise Unsupported("the messages are untyped nulls")
        name, _ = aggregate_of(aggregate, lambda e: e.kind == "ref" and e.name in MESSAGE_NAMES)
        return cls(to_dst, to_src, name, common, aggregated_type(name, common))

    def columns(self, side: str) -> set[str]:
        """The columns a message reads from ``side`` (``"src"``, ``"dst"``, ``"edge"``)."""
        names: set[str] = set()
        for message in (self.to_dst, self.to_src):
            if message is not None:
                names |= {c for s, c in map(side_of, refs(message)) if s == side}
        return names

    def sender(
        self, message: Expr, state_types: Mapping[str, str], typing: Typing
    ) -> Callable[[Arrays, Arrays, Arrays], np.ndarray]:
        """A ``VertexProgram`` send function evaluating ``message``: values of the merged
        type (ones for ``count``), masked where the message is null."""
        merged = self.merged_type

        def send(src: Arrays, dst: Arrays, edges: Arrays) -> np.ndarray:
            rows = next(len(v) for arrays in (edges, src, dst) for v in arrays.values())

            def lookup(name: str) -> Value:
                side, column = side_of(name)
                if side == "edge":
                    return kept(edges, column, typing.edge[column])
                return kept(src if side == "src" else dst, column, state_types[column])

            value = evaluate(message, Scope(lookup, rows, typing.ansi))
            data = (
                np.ones(rows, dtype=np.int64)
                if self.aggregate == "count"
                else cast(value, merged).data
            )
            return np.ma.MaskedArray(data, mask=~value.validity())

        return send

    def received(self, merged: np.ndarray, reached: np.ndarray) -> Value:
        """The aggregated message of every vertex (null where none reached it)."""
        return Value(merged.astype(DTYPES[self.merged_type]), reached.copy(), self.merged_type)


def edge_frame(edges: DataFrame, columns: Iterable[str], typing: Typing) -> DataFrame:
    """``src``, ``dst`` and the edge ``columns`` a program reads, each as values (nulls
    as zero) and a validity column."""
    read = []
    for c in sorted(columns):
        zero = F.lit(False) if typing.edge[c] == "boolean" else F.lit(0)
        read += [F.coalesce(F.col(c), zero).alias(c), F.col(c).isNotNull().alias(c + VALID)]
    return edges.select("src", "dst", *read)


def vertex_arrays(table: pa.Table, names: Iterable[str], typing: Typing) -> Arrays:
    """The vertex columns ``names`` of ``table`` as values and validity masks."""
    arrays: Arrays = {}
    for name in names:
        spark_type = typing.column(typing.vertex, name, "the program")
        stored(arrays, name, from_arrow(table.column(name), spark_type), spark_type)
    return arrays


def initial(table: pa.Table, expr: Expr, typing: Typing) -> Value:
    """``expr`` over the vertex columns of ``table`` (a state column's initial value)."""

    def lookup(name: str) -> Value:
        return from_arrow(table.column(name), typing.column(typing.vertex, name, "init"))

    return evaluate(expr, Scope(lookup, table.num_rows, typing.ansi))


def state_table(
    ids: pa.Array, arrays: Arrays, types: Mapping[str, str], names: Iterable[str]
) -> pa.Table:
    """``id`` and the state columns ``names``, nulls where invalid, in their Spark types."""
    columns: dict[str, pa.Array] = {"id": ids}
    for name in names:
        dtype = DTYPES[types[name]]
        columns[name] = pa.array(
            arrays[name].astype(dtype), mask=~arrays[name + VALID], type=pa.from_numpy_dtype(dtype)
        )
    return pa.table(columns)


def with_state(vertices: DataFrame, state: pa.Table, names: list[str]) -> DataFrame:
    """``vertices`` (their own columns, in order) with the state columns ``names``."""
    spark = vertices.sparkSession
    own = [c for c in vertices.columns if c not in names]
    joined = vertices.select(*own).join(spark.createDataFrame(state), "id")
    return joined.select(*own, *names)


def changed(new: Arrays, old: Arrays, names: Iterable[str], types: Mapping[str, str]) -> np.ndarray:
    """Whether any of the columns ``names`` differs (null-safe, NaN equal to NaN)."""
    out: np.ndarray | None = None
    for name in names:
        same = null_safe_equal([kept(new, name, types[name]), kept(old, name, types[name])])
        out = ~same.data if out is None else out | ~same.data
    assert out is not None
    return out


def parsed(columns: Mapping[str, Column | None]) -> dict[str, Expr | None]:
    """Each Column parsed (``Unsupported`` names the first that does not compile)."""
    return {name: None if c is None else parse(c) for name, c in columns.items()}
