"""One round of messages along the edges, aggregated per vertex: GraphFrames'
``aggregateMessages``, the primitive its Pregel is made of.

A message is a Column over the edge's triplet: ``AggregateMessages.src`` and ``.dst``
are the two end vertices' rows (structs of every vertex column), ``.edge`` the edge's
row, and the aggregate refers to the message as ``AggregateMessages.msg``. Several
messages are sent as one struct of them. Vertices that receive no message have no row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iterflow.graph.expressions import Unsupported
from iterflow.graph.graphs import GraphError, as_graph, column_of, nested
from iterflow.graph.kernel_messages import on_kernels
from iterflow.graph.kernel_pregel import engine_note

#: The column that holds a message while it is aggregated (GraphFrames' name).
MESSAGE = "MSG"


class _ClassColumn:
    """A read-only class attribute made afresh on each access (a Column per use)."""

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.__doc__ = doc

    def __get__(self, instance: Any, owner: type) -> Column:
        return F.col(self.name)


class AggregateMessages:
    """Columns to write ``aggregate_messages``' messages and aggregates with, as
    GraphFrames names them: ``AggregateMessages.src["rank"]``, ``.dst``, ``.edge``,
    ``.msg``.

    Example::

        from iterflow.graph import AggregateMessages as AM
        g.aggregateMessages(F.sum(AM.msg).alias("total"), sendToDst=AM.src["value"])
    """

    src = _ClassColumn("src", "The source vertex's row (a struct of every vertex column).")
    dst = _ClassColumn("dst", "The destination vertex's row.")
    edge = _ClassColumn("edge", "The edge's row (a struct of every edge column).")
    msg = _ClassColumn(MESSAGE, "The message, in the aggregate.")


def _columns(what: str, given: Any) -> list[Column]:
    """``given`` (a Column, SQL text, or a list of them; None for none) as Columns."""
    if given is None:
        return []
    items = list(given) if isinstance(given, list | tuple) else [given]
    return [column_of(item, f"aggregate_messages({what}=...)") for item in items]


def _message(columns: Sequence[Column]) -> Column:
    """One message column: the column itself, or a struct of several."""
    return (columns[0] if len(columns) == 1 else F.struct(*columns)).alias(MESSAGE)


def triplets(graph: Any) -> DataFrame:
    """``src``, ``edge``, ``dst``: every edge with its two vertices, as structs."""
    g = as_graph(graph)
    v = g.vertices
    source, target = v.select(nested(v, "src")), v.select(nested(v, "dst"))
    edge = g.edges.select(nested(g.edges, "edge"))
    return (
        edge.join(source, F.col("edge.src") == F.col("src.id"))
        .join(target, F.col("edge.dst") == F.col("dst.id"))
        .select("src", "edge", "dst")
    )


def aggregate_messages(
    graph: Any,
    agg: Any,
    *,
    send_to_src: Any = None,
    send_to_dst: Any = None,
    method: str = "auto",
) -> DataFrame:
    """``id`` and one column per aggregate in ``agg`` (named by its alias), for every vertex
    that receives a message: each edge sends ``send_to_src`` to its source and
    ``send_to_dst`` to its destination (a null message is aggregated as Spark's
    aggregates treat nulls).

    ``method="arrow"`` evaluates compiled messages with numpy over the edges' Arrow
    batches (``iterflow.graph.kernel_messages``; falls back, logged, when they do not
    compile); ``"dataframe"`` and ``"auto"`` join and aggregate in Spark, which is faster
    for a single round: one pass of the edges into Python costs more than Spark's join
    (``benchmarks/bench_programs.py``). Inside an iteration, where the edges stay
    resident, ``pregel`` runs the same messages on kernels.

    ``agg``, ``send_to_src`` and ``send_to_dst`` are Columns or SQL text, or lists of
    them (several messages go as one struct). Example, the sum of the in-neighbours'
    ``value``::

        aggregate_messages(g, F.sum(AggregateMessages.msg).alias("total"),
                           send_to_dst=AggregateMessages.src["value"])
    """
    aggregates = _columns("agg", agg)
    to_src, to_dst = _columns("send_to_src", send_to_src), _columns("send_to_dst", send_to_dst)
    if not aggregates:
        raise GraphError("aggregate_messages needs at least one aggregate (agg=...)")
    if not to_src and not to_dst:
        raise GraphError("aggregate_messages needs send_to_src=, send_to_dst= or both")
    if method not in ("auto", "arrow", "dataframe"):
        raise GraphError(f"aggregate_messages(method={method!r}): 'auto', 'arrow' or 'dataframe'")
    g = as_graph(graph)
    if method == "arrow":
        try:
            return on_kernels(g, aggregates, to_src, to_dst)
        except Unsupported as reason:
            engine_note(str(reason), "aggregate_messages()")
    sent_columns = [*to_src, *to_dst]
    edges = g.edges.select(nested(g.edges, "edge"))
    for end in ("src", "dst"):
        # A side no message mentions is not joined (the one join the hand-written
        # aggregation has); the check errs towards joining.
        if any(_mentions(column, end) for column in sent_columns):
            side = g.vertices.select(nested(g.vertices, end))
            edges = edges.join(side, F.col(f"edge.{end}") == F.col(f"{end}.id"))
    sent = [
        edges.select(F.col(f"edge.{end}").alias("id"), _message(columns))
        for end, columns in (("src", to_src), ("dst", to_dst))
        if columns
    ]
    messages = sent[0] if len(sent) == 1 else sent[0].unionByName(sent[1])
    return messages.groupBy("id").agg(*aggregates)


def _mentions(column: Column, name: str) -> bool:
    """Whether ``column``'s expression may refer to the struct column ``name`` (a word not
    after a dot: ``src['x']``, ``src.x``; ``edge.src`` is not a mention)."""
    return re.search(rf"(?<![\w.]){name}(?!\w)", str(column)) is not None
