"""Community detection by label propagation, as GraphFrames' ``labelPropagation``.

Every vertex starts with its own id as label. In each round a vertex takes the
label that is most frequent among its own and its neighbours' labels (edges in
either direction; the smallest label on a tie, so the result does not depend on
task order). It stops when a round changes no label (a fixed point of the rule,
termination ``criteria_empty``) or after ``max_rounds``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import block_state
from iterflow.graph.components import undirected_edges
from iterflow.graph.graphs import GraphError, as_graph, graph_result, with_column
from iterflow.graph.methods import choose_method


@itf.body
def adopt_majority_label(labels: DataFrame, edges: DataFrame, ctx: Any) -> itf.Declaration:
    """One round: every vertex takes the most frequent label around it, itself included."""
    heard = ctx.observe(
        "messages",
        edges.join(labels, edges["src"] == labels["id"]).select(
            edges["dst"].alias("id"), labels["label"]
        ),
    )
    votes = heard.unionByName(labels).groupBy("id", "label").count()
    best = votes.groupBy("id").agg(
        F.min(F.struct((-F.col("count")).alias("minus_count"), "label")).alias("best")
    )
    new_labels = ctx.cache(best.select("id", F.col("best.label").alias("label")))
    changed = ctx.observe("active", new_labels.join(labels, ["id", "label"], "left_anti"))
    return itf.Declaration(
        feedback={"labels": new_labels},
        outputs={"labels": new_labels, "changed": changed},
        until=itf.empty(changed),
    )


# -- the block path --------------------------------------------------------------------

#: A state row of the block path: block b's labels (positions, which follow the ids, so
#: the smallest label of a tie is the smallest id as on the DataFrame path).
VOTE_STATE = "block INT, label ARRAY<LONG>"
#: What a block sends: for each of its edges into block ``to``, the destination offset and
#: the label of the source; or (``self``) its own labels.
VOTE_PARTIAL = "to INT, self BOOLEAN, index ARRAY<INT>, value ARRAY<LONG>"


def vote_send(blocks: int, messages: Any) -> block_state.Kernel:
    """Kernel of a source block: its vertices' labels along every edge."""

    def send(table: pa.Table, rows: pa.Table) -> Any:
        so, db, do = (table[c].to_numpy() for c in ("so", "db", "do"))
        bounds = block_state.block_bounds(db, blocks)
        for s, row in block_state.rows_of(rows):
            block_state.check_block(table, s)
            label = block_state.values(row["label"], np.int64)
            messages.inc(len(so))
            for d in range(blocks):
                a, b = bounds[d], bounds[d + 1]
                if b > a:
                    yield block_state.sparse_row(d, False, do[a:b], label[so[a:b]], pa.int64())
            yield block_state.sparse_row(s, True, None, label, pa.int64())

    return send


def majority(own: np.ndarray, heard: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Every offset's most frequent label among its own and those heard (the smallest on a
    tie)."""
    offsets = np.concatenate([np.arange(len(own))] + [h[0] for h in heard])
    labels = np.concatenate([own] + [h[1] for h in heard])
    order = np.lexsort((labels, offsets))
    offsets, labels = offsets[order], labels[order]
    starts = block_state.first_of_runs(offsets, labels)
    counts = np.diff(np.append(np.flatnonzero(starts), len(offsets)))
    offsets, labels = offsets[starts], labels[starts]
    order = np.lexsort((labels, -counts, offsets))
    offsets, labels = offsets[order], labels[order]
    best = block_state.first_of_runs(offsets)
    new = own.copy()
    new[offsets[best]] = labels[best]
    return new


def vote_receive(active: Any) -> Any:
    """Kernel of a destination block: every vertex takes the majority label."""

    def receive(batches: Any) -> Any:
        for d, rows in block_state.grouped(batches):
            own, heard = block_state.received(rows, np.int64)
            new = majority(own, heard)
            active.inc(int(np.count_nonzero(new != own)))
            yield pa.RecordBatch.from_arrays(
                [pa.array([d], pa.int32()), block_state.list_column([new], pa.int64())],
                names=["block", "label"],
            )

    return receive


def _block_labels(
    g: Any, n: int, blocks: int | None, max_rounds: int, listen: Any, run_options: Any
) -> DataFrame:
    spark = g.vertices.sparkSession
    lay = block_state.layout(g.vertices, n, block_state.block_count(spark, n, 0, blocks))
    starts, sizes = lay.starts, lay.sizes

    def first(block: int) -> Any:
        label = starts[block] + np.arange(sizes[block], dtype=np.int64)
        yield pa.RecordBatch.from_arrays(
            [pa.array([block], pa.int32()), block_state.list_column([label], pa.int64())],
            names=["block", "label"],
        )

    step = block_state.block_step(
        lay,
        block_state.edge_file(
            "label_propagation()", by_source=False, distinct=True, dense=lay.dense
        ),
        vote_send(lay.blocks, itf.metrics.counter("messages")),
        VOTE_PARTIAL,
        vote_receive(itf.metrics.counter("active")),
        VOTE_STATE,
    )

    @itf.body
    def label_propagation_blocks(labels: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> Any:
        new_labels = step(labels, edges, ctx)
        return itf.Declaration(feedback={"labels": new_labels}, outputs={"labels": new_labels})

    ends = g.edges.where(F.col("src") != F.col("dst"))
    iteration = (
        itf.BoundedIteration(label_propagation_blocks)
        .bind("labels", lay.per_block(first, VOTE_STATE), on_driver=False)
        .bind("edges", block_state.edge_rows(lay, ends, both=True), replay=True)
        .until(itf.max_rounds(max_rounds))
        .until(itf.until(lambda progress: progress.metrics.get("active") == 0))
    )
    labelled = block_state.run_labels(iteration, lay, listen, run_options)
    found = lay.named(labelled, "label", "named")
    return block_state.apart(found.select("id", F.col("named").alias("label")))


def label_propagation(
    graph: Any,
    *,
    max_rounds: int = 20,
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with a ``label`` column: their community.

    Each round's ``RoundProgress.observed`` has ``messages`` (labels heard) and
    ``active`` (vertices whose label changed). ``listen`` and ``run_options`` are
    as in ``connected_components``.

    Example::

        label_propagation(Graph(vertices, edges), max_rounds=10)
    """
    g = as_graph(graph)
    method, n = choose_method("label_propagation", method, g, below_limit="dataframe")
    if method == "blocks":
        with itf.worker_errors(GraphError):  # an edge to no vertex, found by a worker
            labels = _block_labels(g, n, blocks, max_rounds, listen, run_options)
        return graph_result(graph, with_column(g.vertices, labels, "label"))
    iteration = (
        itf.BoundedIteration(adopt_majority_label)
        .bind("labels", g.vertices.select("id", F.col("id").alias("label")))
        .bind("edges", undirected_edges(g.edges))
        .until(itf.max_rounds(max_rounds))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    labels = iteration.run(**run_options).outputs["labels"]
    return graph_result(graph, with_column(g.vertices, labels, "label"))
