"""Connected components by hooking and pointer jumping over a shrinking edge set.

Two ways to run it, both on iterflow's public API only:

- ``method="arrow"`` (the default while the label vector fits in memory): the
  labels are one vector and the edges Arrow files (``RoundContext.columnar``) in
  vertex positions. Every round one numpy kernel per file takes the edges whose
  ends have different labels and joins them locally (union-find by hooking and
  pointer jumping, ``settle``); one task joins the pairs of every file the same
  way. A round thus merges everything its edges connect, and the next one
  finds no edge across two labels (``messages`` 0) and ends the iteration.
- ``method="dataframe"``, described below, for graphs whose labels do not fit.

In the DataFrame method every vertex points to a *label* (at first itself). Each round works on the
edges between different labels only, the *workset*, as in Flink's delta
iterations:

1. hooking: for every workset edge, the endpoint whose label has the larger
   priority, and that label's own vertex, are pointed at the smaller label;
2. pointer jumping: every vertex points to its label's label, so chains halve;
3. the workset becomes the edges between the new labels, without duplicates and
   without the edges that now lie inside one label.

Priorities are a hash of the label (ties broken by the label), so the number of
rounds does not depend on how the ids happen to be ordered: a path of n vertices
takes about log2(n) rounds, whatever its ids. The iteration ends when a round
changes no label (termination ``criteria_empty``); every vertex of a weakly
connected component then has the same label, and ``component`` is the smallest
id among them, as in GraphFrames.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import block_runner
from iterflow.graph.block_edges import EdgeFile
from iterflow.graph.block_kernels import LabelKernels, Partial, Received, Slice, least_per_block
from iterflow.graph.graphs import as_graph, graph_result, run_iteration, with_column
from iterflow.graph.methods import choose_method
from iterflow.graph.vectors import cell_values, edge_positions, vertex_ids


def undirected_edges(edges: DataFrame) -> DataFrame:
    """Both directions of every edge, self-loops and duplicates dropped: ``src, dst``."""
    ends = edges.select("src", "dst").where(F.col("src") != F.col("dst"))
    flipped = ends.select(F.col("dst").alias("src"), F.col("src").alias("dst"))
    return ends.unionByName(flipped).distinct()


def _priority(label: Column) -> Column:
    return F.struct(F.xxhash64(label).alias("hash"), label.alias("label"))


@itf.body
def hook_and_jump(labels: DataFrame, workset: DataFrame, ctx: Any) -> itf.Declaration:
    """One round: hook across the workset edges, jump once, contract the workset."""
    ends = ctx.observe(
        "messages",
        workset.join(labels.select(F.col("id").alias("a"), F.col("label").alias("la")), "a").join(
            labels.select(F.col("id").alias("b"), F.col("label").alias("lb")), "b"
        ),
    )
    a_first = _priority(F.col("la")) < _priority(F.col("lb"))
    low = F.when(a_first, F.col("la")).otherwise(F.col("lb"))
    high_end = F.when(a_first, F.col("b")).otherwise(F.col("a"))
    high_label = F.when(a_first, F.col("lb")).otherwise(F.col("la"))
    hooks = (
        ends.select(high_end.alias("id"), low.alias("candidate"))
        .unionByName(ends.select(high_label.alias("id"), low.alias("candidate")))
        .groupBy("id")
        .agg(F.min(_priority(F.col("candidate"))).alias("best"))
    )
    hooked = labels.join(hooks, "id", "left").select(
        "id",
        F.when(
            F.col("best").isNotNull() & (F.col("best") < _priority(F.col("label"))),
            F.col("best.label"),
        )
        .otherwise(F.col("label"))
        .alias("label"),
    )
    parents = hooked.select(F.col("id").alias("label"), F.col("label").alias("jumped"))
    jumped = ctx.cache(hooked.join(parents, "label").select("id", F.col("jumped").alias("label")))
    moved = ctx.observe("active", jumped.join(labels, ["id", "label"], "left_anti"))
    relabelled = workset.join(
        jumped.select(F.col("id").alias("a"), F.col("label").alias("la")), "a"
    ).join(jumped.select(F.col("id").alias("b"), F.col("label").alias("lb")), "b")
    next_workset = (
        relabelled.where(F.col("la") != F.col("lb"))
        .select(F.least("la", "lb").alias("a"), F.greatest("la", "lb").alias("b"))
        .distinct()
    )
    return itf.Declaration(
        feedback={"labels": jumped, "workset": next_workset},
        outputs={"labels": jumped, "moved": moved},
        until=itf.empty(moved),
    )


# -- the Arrow path -----------------------------------------------------------------

#: The variable of the Arrow path: every vertex's label (a vertex position), and
#: how many labels the round that made it changed.
LABELS_SCHEMA = "label ARRAY<LONG>, changed LONG"
JOINS_SCHEMA = "label ARRAY<LONG>, root ARRAY<LONG>"


def edge_ends(ids: pa.Array) -> Any:
    """A ``columnar`` prepare step: the edges' ends as vertex positions, self-loops dropped."""

    def prepare(table: pa.Table) -> pa.Table:
        src, dst = edge_positions(table, ids)
        keep = src != dst
        return pa.table({"u": src[keep], "v": dst[keep]})

    return prepare


def settle(labels: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union-find in numpy: ``labels`` (every label a root, ``labels[labels] == labels``)
    after joining the labels at both ends of every pair ``(a[i], b[i])``.

    Each pass hooks every root at the end of a pair to the smallest root across
    its pairs, then jumps pointers until every entry points at a root; the
    roots stay the smallest member of their set.
    """
    labels = labels.copy()
    while True:
        la, lb = labels[a], labels[b]
        across = la != lb
        if not across.any():
            return labels
        a, b = a[across], b[across]
        np.minimum.at(
            labels, np.maximum(la[across], lb[across]), np.minimum(la[across], lb[across])
        )
        while True:
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped


def numbered(values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for values in ``[0, size)``: the distinct
    values in increasing order, and the index of each value among them."""
    if len(values) * 16 < size:  # few values: sorting them costs less than a pass over size
        distinct, index = np.unique(values, return_inverse=True)
        return distinct, index.reshape(-1)
    # Many: a mark per possible value numbers them without a sort (5x faster on a round-1
    # partition, bench_kernels.py).
    seen = np.zeros(size, dtype=bool)
    seen[values] = True
    distinct = np.flatnonzero(seen)
    number = np.empty(size, dtype=np.intp)
    number[distinct] = np.arange(len(distinct))
    return distinct, number[values]


def local_joins(table: pa.Table, labels: np.ndarray, messages: Any) -> pa.Table:
    """Kernel: this partition's edges between different labels, joined locally.

    Returns pairs ``(label, root)``: every label at the end of such an edge and
    the smallest label it is connected to through this partition's edges.
    """
    a, b = labels[table["u"].to_numpy()], labels[table["v"].to_numpy()]
    across = a != b
    half = int(across.sum())
    messages.inc(half)
    touched, ends = numbered(np.concatenate([a[across], b[across]]), len(labels))
    local = settle(np.arange(len(touched)), ends[:half], ends[half:])
    moved = local != np.arange(len(touched))
    return pa.table(
        [itf.vector_cell(touched[moved]), itf.vector_cell(touched[local[moved]])],
        names=["label", "root"],
    )


def join_all(labels: np.ndarray, active: Any) -> Any:
    """Kernel over every partition's pairs: the labels after joining them all."""

    def finish(batches: Any) -> Any:
        pairs = [
            (cell_values(batch.column(0), row), cell_values(batch.column(1), row))
            for batch in batches
            for row in range(batch.num_rows)
        ]
        a = np.concatenate([p[0] for p in pairs]) if pairs else np.zeros(0, dtype=np.int64)
        b = np.concatenate([p[1] for p in pairs]) if pairs else np.zeros(0, dtype=np.int64)
        new = settle(labels, a, b)
        changed = int(np.count_nonzero(new != labels))
        active.inc(changed)
        yield from pa.table(
            [itf.vector_cell(new), pa.array([changed])], names=["label", "changed"]
        ).to_batches()

    return finish


def vector_components_body(ids: pa.Array, messages: Any, active: Any) -> itf.IterationBody:
    prepare = edge_ends(ids)

    @itf.body
    def components_vector(
        labels: DataFrame, edges: DataFrame, ctx: itf.RoundContext
    ) -> itf.Declaration:
        current = itf.vector(labels, "label")  # held on the driver after round 0
        new_labels = ctx.columnar(edges, prepare).map(
            local_joins,
            JOINS_SCHEMA,
            current,
            messages,
            combine=join_all(current, active),
            combine_schema=LABELS_SCHEMA,
        )
        return itf.Declaration(
            feedback={"labels": new_labels},
            outputs={"labels": new_labels},
        )

    return components_vector


# -- the block path: min-label propagation over label slices kept in Spark -------------


@attrs.frozen
class LeastLabelKernels(LabelKernels):
    """The vertices whose label moved last round send it along their edges (an edge file
    sorted by source: a cost that follows them); every label is lowered to the smallest
    one heard, the smallest id of the component in the end."""

    state: ClassVar[dict[str, pa.DataType]] = {"label": pa.int64(), "moved": pa.bool_()}
    by_source: ClassVar[bool] = True

    def first(self, block: int) -> Slice:
        return {"label": self.own_labels(block), "moved": np.ones(self.sizes[block], dtype=bool)}

    def send(self, edges: EdgeFile, block: int, state: Slice) -> Iterator[Partial]:
        label, moved = state["label"], state["moved"]
        at = np.arange(len(edges.so)) if moved.all() else edges.out_of(np.flatnonzero(moved))[0]
        self.messages.inc(len(at))
        yield from least_per_block(edges.db[at], edges.do[at], label[edges.so[at]], self.sizes)

    def receive(self, block: int, heard: Received) -> Slice:
        new = heard.own.copy()
        for index, value in heard.at_offsets():
            np.minimum.at(new, index, value)
        moved = new < heard.own
        self.active.inc(int(moved.sum()))
        return {"label": new, "moved": moved}


def _block_components(
    g: Any, n: int, blocks: int | None, max_rounds: int | None, listen: Any, run_options: Any
) -> DataFrame:
    rounds = block_runner.Rounds(
        name="components_blocks",
        variable="labels",
        who="connected_components()",
        stop=(itf.until(block_runner.settled), *_at_most(max_rounds)),
    )
    return block_runner.run_labels(
        g, n, blocks, LeastLabelKernels, rounds, "component", listen, run_options
    )


def _at_most(max_rounds: int | None) -> tuple[Any, ...]:
    """The criteria of an optional bound on the rounds."""
    return () if max_rounds is None else (itf.max_rounds(max_rounds),)


def connected_components(
    graph: Any,
    *,
    max_rounds: int | None = None,
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with a ``component`` column: the smallest id in their
    weakly connected component.

    ``graph`` is an ``iterflow.graph.Graph`` or any object with ``.vertices`` and
    ``.edges`` (a GraphFrame). ``max_rounds`` bounds the rounds (the labels are
    then those reached so far); ``listen`` takes a listener called after every
    round. With ``method="dataframe"`` its ``RoundEnd.progress.observed`` has
    ``messages`` (the workset edges hooked across) and ``active`` (the vertices
    whose label changed); with ``method="arrow"`` (numpy kernels, the label vector
    in memory; ``"auto"`` picks it up to ``VECTOR_LIMIT`` vertices unless the measured
    cost model, ``methods.COSTS``, predicts blocks faster) the same two
    counts are ``progress.metrics["messages"]`` and ``["active"]``. Other
    keyword arguments go to ``BoundedIteration.run`` (``progress``, ``event_log``,
    ``checkpoint_dir``...); with ``method="dataframe"`` the estimate of the rounds
    left follows ``messages`` unless ``progress_from=`` names another count.
    Returns a DataFrame, or a GraphFrame when ``graph`` is one.

    Example::

        components = connected_components(Graph(vertices, edges))
    """
    g = as_graph(graph)
    method, n = choose_method("connected_components", method, g)
    if method == "arrow":
        components = _vector_components(g, max_rounds, listen, run_options)
    elif method == "blocks":
        components = _block_components(g, n, blocks, max_rounds, listen, run_options)
    else:
        components = _frame_components(g, max_rounds, listen, run_options)
    return graph_result(graph, with_column(g.vertices, components, "component"))


def _frame_components(
    g: Any, max_rounds: int | None, listen: Any, run_options: dict[str, Any]
) -> DataFrame:
    ends = g.edges.where(F.col("src") != F.col("dst"))
    iteration = (
        itf.BoundedIteration(hook_and_jump)
        .bind("labels", g.vertices.select("id", F.col("id").alias("label")))
        .bind(
            "workset",
            ends.select(
                F.least("src", "dst").alias("a"), F.greatest("src", "dst").alias("b")
            ).distinct(),
        )
        .until(*_at_most(max_rounds))
    )
    # The labels a round moves jump up and down as pointers jump; the workset edges
    # hooked across shrink steadily to none: the rounds left follow them.
    options = {"progress_from": "messages", **run_options}
    labels = run_iteration(iteration, listen, options).outputs["labels"]
    smallest = labels.groupBy("label").agg(F.min("id").alias("component"))
    return labels.join(smallest, "label").select("id", "component")


def _vector_components(
    g: Any, max_rounds: int | None, listen: Any, run_options: dict[str, Any]
) -> DataFrame:
    spark = g.vertices.sparkSession
    ids = vertex_ids(g)
    start = pa.table(
        [itf.vector_cell(np.arange(len(ids), dtype=np.int64)), pa.array([len(ids)])],
        names=["label", "changed"],
    )
    body = vector_components_body(
        ids, itf.metrics.counter("messages"), itf.metrics.counter("active")
    )
    iteration = (
        itf.BoundedIteration(body)
        .bind("labels", spark.createDataFrame(start, LABELS_SCHEMA))
        .bind("edges", g.edges.select("src", "dst"))
        # The kernel counts the labels it changed: a round that changed none ends it.
        .until(itf.until(block_runner.settled), *_at_most(max_rounds))
    )
    final = run_iteration(iteration, listen, run_options).outputs["labels"]
    # A root is the first position of its component; components are named by smallest id.
    roots = cell_values(final.toArrow().column("label"))
    table = pa.table({"id": ids, "root": roots})
    named = table.group_by("root").aggregate([("id", "min")]).rename_columns(["root", "component"])
    labelled = table.join(named, "root").select(["id", "component"])
    return spark.createDataFrame(labelled.combine_chunks())  # PySpark 4.0 Connect: one chunk
