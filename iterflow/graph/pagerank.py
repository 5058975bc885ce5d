"""PageRank, with networkx's normalization by default: ranks sum to 1, a vertex
without out-edges (dangling) spreads its rank uniformly over all vertices, and

    rank'(v) = (1 - alpha) / n + alpha * (sum over u -> v of rank(u) / out(u) + dangling / n)

With ``normalization="graphx"`` it computes GraphX's (and so GraphFrames') PageRank
instead: the rank of dangling vertices is lost every round, every copy of a
duplicate edge carries rank, and the final ranks are rescaled to sum to the number
of vertices (to 1 with a personalization), as GraphX's ``PageRank.runWithOptions``
does after its rounds.

Two ways to run it, both on iterflow's public API only:

- ``method="arrow"`` (the default while the rank vector fits a broadcast): the
  edges are written once as Arrow files (``RoundContext.columnar``), partitioned
  by source, deduplicated and turned into array indices; every round one numpy
  kernel per file adds up its contributions with ``np.bincount``, and one task
  sums the partials into the next rank vector. The variable is that vector, one
  row.
- ``method="dataframe"``: joins and aggregates over ``(id, rank)`` rows, for
  graphs whose rank vector does not fit in memory; ``iterflow.demo.pagerank``
  runs the same body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import block_state
from iterflow.graph.graphs import GraphError, as_graph, graph_result, with_column
from iterflow.graph.methods import choose_method
from iterflow.graph.vectors import cell_values, edge_positions, vertex_ids

ALPHA = 0.85


def initial_ranks(vertices: DataFrame, edges: DataFrame) -> DataFrame:
    """Round-0 ranks: ``(id, rank = 1/n, out_degree)`` for every vertex."""
    n = vertices.count()
    degrees = edges.groupBy(F.col("src").alias("id")).agg(F.count(F.lit(1)).alias("out_degree"))
    return (
        vertices.select("id")
        .join(degrees, "id", "left")
        .select(
            "id",
            F.lit(1.0 / n).alias("rank"),
            F.coalesce(F.col("out_degree"), F.lit(0)).cast("long").alias("out_degree"),
        )
    )


def pagerank_update(
    ranks: DataFrame,
    edges: DataFrame,
    n: int,
    alpha: float = ALPHA,
    observe: Callable[[str, DataFrame], DataFrame] = lambda _name, df: df,
    *,
    keep_dangling: bool = True,
) -> tuple[DataFrame, DataFrame]:
    """One PageRank step: ``(new_ranks, delta)``.

    ``delta`` is a one-row DataFrame holding the L1 change of the ranks. With a
    ``teleport`` column in ``ranks`` (personalization, summing to 1) random jumps
    and dangling rank go there instead of uniformly;
    ``observe`` wraps the per-vertex contributions (e.g. ``ctx.observe``).
    ``keep_dangling=False`` drops the rank of dangling vertices, as GraphX does.
    """
    shares = ranks.where(F.col("out_degree") > 0).select(
        F.col("id").alias("src"), (F.col("rank") / F.col("out_degree")).alias("share")
    )
    contributions = observe(
        "contributions",
        edges.join(shares, "src").groupBy(F.col("dst").alias("id")).agg(F.sum("share").alias("in")),
    )
    dangling = ranks.where(F.col("out_degree") == 0).agg(
        (F.coalesce(F.sum("rank"), F.lit(0.0)) * F.lit(1.0 if keep_dangling else 0.0)).alias(
            "dangling"
        )
    )
    # A "teleport" column (personalization, summing to 1) replaces the uniform 1/n.
    personal = "teleport" in ranks.columns
    teleport = F.col("teleport") if personal else F.lit(1.0 / n)
    new_ranks = (
        ranks.join(contributions, "id", "left")
        .crossJoin(F.broadcast(dangling))
        .select(
            "id",
            (
                F.lit(1.0 - alpha) * teleport
                + F.lit(alpha)
                * (F.coalesce(F.col("in"), F.lit(0.0)) + F.col("dangling") * teleport)
            ).alias("rank"),
            "out_degree",
            *(["teleport"] if personal else []),
        )
    )
    delta = (
        new_ranks.alias("new")
        .join(ranks.alias("old"), "id")
        .agg(F.coalesce(F.sum(F.abs(F.col("new.rank") - F.col("old.rank"))), F.lit(0.0)))
    )
    return new_ranks, delta


def pagerank_body(
    n: int, *, alpha: float = ALPHA, tol: float | None = None, keep_dangling: bool = True
) -> itf.IterationBody:
    """The PageRank body for ``n`` vertices; with ``tol`` it stops once the L1 change <= tol."""

    @itf.body
    def pagerank_step(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        new_ranks, delta = pagerank_update(
            ranks, edges, n, alpha, observe=ctx.observe, keep_dangling=keep_dangling
        )
        return itf.Declaration(
            feedback={"ranks": new_ranks},
            outputs={"ranks": new_ranks},
            until=itf.converged(delta, tol) if tol is not None else None,
        )

    return pagerank_step


# -- the Arrow path: edges as files, ranks as one vector ------------------------------

#: The variable of the Arrow path: the rank vector (in the order of the vertex ids
#: array) and the L1 change of the round that made it.
VECTOR_SCHEMA = "rank ARRAY<DOUBLE>, delta DOUBLE"
PARTIAL_SCHEMA = "contribution ARRAY<DOUBLE>, held DOUBLE"


def edge_indices(ids: pa.Array, *, distinct: bool = True) -> Callable[[pa.Table], pa.Table]:
    """A ``columnar`` prepare step for the edges of one source partition.

    Turns ids into positions in ``ids``, drops duplicate edges (unless
    ``distinct=False``: then every copy is an out-edge), sorts by source and adds
    ``share`` (1 / out-degree of the source: every out-edge of a source is in its
    partition) and ``first`` (the first edge of each source).
    """

    def prepare(table: pa.Table) -> pa.Table:
        src, dst = edge_positions(table, ids)
        n = len(ids)
        pairs = src * n + dst
        pairs = np.unique(pairs) if distinct else np.sort(pairs)  # sorted by source
        src, dst = pairs // n, pairs % n
        first = np.ones(len(src), dtype=bool)
        first[1:] = src[1:] != src[:-1]
        starts = np.flatnonzero(first)
        degree = np.diff(np.append(starts, len(src)))
        return pa.table(
            {
                "src": src,
                "dst": dst,
                "share": 1.0 / np.repeat(degree, degree).astype(np.float64),
                "first": first,
            }
        )

    return prepare


def _vector_row(values: np.ndarray, extra: float) -> pa.Table:
    return pa.table([itf.vector_cell(values), pa.array([float(extra)])], names=["rank", "delta"])


def contributions(table: pa.Table, ranks: np.ndarray, messages: Any) -> pa.Table:
    """Kernel: the rank that one partition's edges carry to every vertex, and the rank
    its sources hold (the rest is the dangling vertices')."""
    src = table["src"].to_numpy()
    messages.inc(len(src))
    spread = np.bincount(
        table["dst"].to_numpy(),
        weights=ranks[src] * table["share"].to_numpy(),
        minlength=len(ranks),
    )
    held = ranks[src[table["first"].to_numpy(zero_copy_only=False)]].sum()
    return pa.table([itf.vector_cell(spread), pa.array([held])], names=["contribution", "held"])


def next_ranks(
    alpha: float, ranks: np.ndarray, teleport: np.ndarray, keep_dangling: bool = True
) -> Callable[[Any], pa.Table]:
    """Kernel over all partials: the next rank vector and its L1 change (the rank of
    dangling vertices is dropped unless ``keep_dangling``)."""

    def finish(batches: Any) -> Any:
        spread = np.zeros(len(ranks))
        held = 0.0
        for batch in batches:
            for row in range(batch.num_rows):
                spread += cell_values(batch.column(0), row)
            held += float(np.sum(batch.column(1).to_numpy()))
        dangling = ranks.sum() - held if keep_dangling else 0.0
        new = alpha * (spread + dangling * teleport) + (1.0 - alpha) * teleport
        yield from _vector_row(new, np.abs(new - ranks).sum()).to_batches()

    return finish


def change(end: itf.RoundEnd) -> float:
    """The L1 change of the round, read from the rank vector variable. A callable rather
    than a DataFrame: iterflow holds the one-row vector on the driver, so reading it
    runs no Spark job (and the combine step can run on the driver)."""
    return float(itf.to_arrow(end.variables["ranks"]).column("delta")[0].as_py())


def vector_body(
    ids: pa.Array,
    teleport: np.ndarray,
    alpha: float,
    tol: float | None,
    graphx: bool = False,
) -> itf.IterationBody:
    """PageRank on the rank vector, with the edges as Arrow files read in place.

    Every round, ``RoundProgress.metrics["messages"]`` counts the edges that carried rank.
    ``graphx``: duplicate edges each carry rank and dangling rank is dropped.
    """
    prepare = edge_indices(ids, distinct=not graphx)
    messages = itf.metrics.counter("messages")

    @itf.body
    def pagerank_vector(
        ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext
    ) -> itf.Declaration:
        current = itf.vector(ranks, "rank")  # held on the driver after round 0
        files = ctx.columnar(edges, prepare)
        new_ranks = files.map(
            contributions,
            PARTIAL_SCHEMA,
            current,
            messages,
            combine=next_ranks(alpha, current, teleport, keep_dangling=not graphx),
            combine_schema=VECTOR_SCHEMA,
        )
        return itf.Declaration(
            feedback={"ranks": new_ranks},
            outputs={"ranks": new_ranks},
            until=itf.converged(change, tol) if tol is not None else None,
        )

    return pagerank_vector


# -- the block path: the rank vector in B slices, kept in Spark --------------------------

#: A state row of the block path: block b's ranks.
RANK_STATE = "block INT, rank ARRAY<DOUBLE>"
#: What a block sends: a partial sum of the ranks of block ``to`` (null when no edge
#: goes there) with the rank the sending block's dangling vertices hold; or (``self``)
#: the sending block's own ranks, for the L1 change.
RANK_PARTIAL = "to INT, self BOOLEAN, value ARRAY<DOUBLE>, dangling DOUBLE"


def _rank_row(to: int, itself: bool, value: np.ndarray | None, dangling: float) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([to], pa.int32()),
            pa.array([itself]),
            block_state.list_column([value], pa.float64()),
            pa.array([float(dangling)]),
        ],
        names=["to", "self", "value", "dangling"],
    )


def rank_send(sizes: tuple[int, ...], keep_dangling: bool, messages: Any) -> block_state.Kernel:
    """Kernel of a source block: its edges' contributions to every destination block."""

    def send(table: pa.Table, rows: pa.Table) -> Any:
        so, db, do = (table[c].to_numpy() for c in ("so", "db", "do"))
        share = table["share"].to_numpy()
        first = table["first"].to_numpy(zero_copy_only=False)
        bounds = block_state.block_bounds(db, len(sizes))
        for s, row in block_state.rows_of(rows):
            block_state.check_block(table, s)
            rank = block_state.values(row["rank"], np.float64)
            messages.inc(len(so))
            weights = rank[so] * share
            dangling = rank.sum() - rank[so[first]].sum() if keep_dangling else 0.0
            for d, size in enumerate(sizes):
                a, b = bounds[d], bounds[d + 1]
                part = np.bincount(do[a:b], weights[a:b], minlength=size) if b > a else None
                yield _rank_row(d, False, part, dangling)
            yield _rank_row(s, True, rank, 0.0)

    return send


def rank_receive(
    alpha: float,
    n: int,
    sizes: tuple[int, ...],
    teleports: dict[int, tuple[Any, Any]] | None,
    change: Any,
) -> Callable[[Any], Any]:
    """Kernel of a destination block: the next ranks from the partials (``teleports``: the
    personalization's offsets and weights per block, else uniform); ``change`` (a
    distribution) receives each block's L1 change."""

    def receive(batches: Any) -> Any:
        for d, rows in block_state.grouped(batches):
            spread = np.zeros(sizes[d])
            old, dangling = spread, 0.0
            for i in range(rows.num_rows):
                value = block_state.values(rows["value"][i], np.float64)
                if rows["self"][i].as_py():
                    old = value
                    continue
                dangling += float(rows["dangling"][i].as_py())
                if len(value):
                    spread += value
            if teleports is None:
                teleport = np.full(sizes[d], 1.0 / n)
            else:
                teleport = np.zeros(sizes[d])
                offsets, weights = teleports.get(d, ((), ()))
                teleport[np.asarray(offsets, dtype=np.int64)] = weights
            new = alpha * (spread + dangling * teleport) + (1.0 - alpha) * teleport
            change.update(float(np.abs(new - old).sum()))
            yield pa.RecordBatch.from_arrays(
                [pa.array([d], pa.int32()), block_state.list_column([new], pa.float64())],
                names=["block", "rank"],
            )

    return receive


def block_body(
    lay: block_state.Layout,
    alpha: float,
    tol: float | None,
    teleports: dict[int, tuple[Any, Any]] | None,
    graphx: bool = False,
) -> itf.IterationBody:
    """PageRank on rank slices: each round, every source block's edges (Arrow files read
    in place) send partial rank sums to the destination blocks, which add them up.
    ``RoundProgress.metrics["messages"]`` counts the edges that carried rank, and
    ``["change"]`` the blocks' L1 changes (its ``sum`` is the round's, which ``tol``
    bounds: read from the metric, it costs no Spark job)."""
    change = itf.metrics.distribution("change")
    step = block_state.block_step(
        lay,
        block_state.edge_file("pagerank()", by_source=False, distinct=not graphx, dense=lay.dense),
        rank_send(lay.sizes, not graphx, itf.metrics.counter("messages")),
        RANK_PARTIAL,
        rank_receive(alpha, lay.vertices, lay.sizes, teleports, change),
        RANK_STATE,
    )

    @itf.body
    def pagerank_blocks(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> Any:
        new_ranks = step(ranks, edges, ctx)
        return itf.Declaration(
            feedback={"ranks": new_ranks},
            outputs={"ranks": new_ranks},
            until=itf.converged(_block_change, tol) if tol is not None else None,
        )

    return pagerank_blocks


def _block_change(end: itf.RoundEnd) -> float:
    """The round's L1 change of the ranks, summed over the blocks by the ``change`` metric."""
    return float(end.progress.metrics["change"].sum)


def _block_teleports(
    lay: block_state.Layout, personalization: dict[Any, float] | None
) -> dict[int, tuple[Any, Any]] | None:
    """The personalization's weights (normalized) by block: offsets and weights."""
    if personalization is None:
        return None
    _check_weights(personalization.values())
    found = lay.find({k: float(w) for k, w in personalization.items()}, "DOUBLE")
    known = {id_ for id_, _, _, _ in found}
    unknown = [v for v in personalization if v not in known]
    if unknown:
        raise GraphError(
            f"pagerank(personalization=...) names vertices that are not in the graph: {unknown[:5]}"
        )
    total = sum(weight for _, _, _, weight in found)
    by: dict[int, tuple[list[int], list[float]]] = {}
    for _, block, offset, weight in found:
        offsets, shares = by.setdefault(block, ([], []))
        offsets.append(offset)
        shares.append(float(weight) / total)
    return {b: (np.asarray(o), np.asarray(w)) for b, (o, w) in by.items()}


def _first_ranks(
    lay: block_state.Layout, teleports: dict[int, tuple[Any, Any]] | None
) -> block_state.Kernel:
    """The ranks of round 0, block by block: 1/n each, or the personalization."""
    sizes, n = lay.sizes, lay.vertices

    def first(block: int) -> Any:
        if teleports is None:
            rank = np.full(sizes[block], 1.0 / n)
        else:
            rank = np.zeros(sizes[block])
            offsets, weights = teleports.get(block, ((), ()))
            rank[np.asarray(offsets, dtype=np.int64)] = weights
        yield pa.RecordBatch.from_arrays(
            [pa.array([block], pa.int32()), block_state.list_column([rank], pa.float64())],
            names=["block", "rank"],
        )

    return first


def _teleport(ids: pa.Array, personalization: dict[Any, float] | None) -> np.ndarray:
    n = len(ids)
    if personalization is None:
        return np.full(n, 1.0 / n)
    weights = np.zeros(n)
    positions = pc.index_in(pa.array(list(personalization)), value_set=ids).to_pylist()
    unknown = [v for v, at in zip(personalization, positions, strict=True) if at is None]
    if unknown:
        raise GraphError(
            f"pagerank(personalization=...) names vertices that are not in the graph: {unknown[:5]}"
        )
    _check_weights(personalization.values())
    for at, weight in zip(positions, personalization.values(), strict=True):
        weights[at] += float(weight)
    return weights / weights.sum()


def _check_weights(weights: Any) -> None:
    given = np.asarray([float(w) for w in weights])
    if not np.isfinite(given).all() or (given < 0).any() or given.sum() <= 0:
        raise GraphError(
            "pagerank(personalization=...) needs finite, non-negative weights with a positive sum"
        )


def pagerank(
    graph: Any,
    *,
    tol: float | None = 1e-8,
    max_rounds: int = 100,
    alpha: float = ALPHA,
    personalization: dict[Any, float] | None = None,
    normalization: str = "networkx",
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with a ``pagerank`` column, iterated until the L1 change of
    the ranks is at most ``tol`` (``tol=None``: exactly ``max_rounds`` rounds).

    Duplicate edges count once and a self-loop counts as an out-edge, as in a networkx
    ``DiGraph``. ``personalization`` maps vertex ids to weights (normalized to sum 1):
    random jumps and the rank of dangling vertices go there instead of uniformly,
    as in ``networkx.pagerank(personalization=...)``.

    ``normalization="graphx"`` computes GraphX's PageRank, which GraphFrames
    returns: every copy of a duplicate edge is an out-edge, the rank of dangling
    vertices is lost in every round rather than spread, and the ranks are rescaled
    at the end to sum to the number of vertices (to 1 with ``personalization``).
    ``tol`` then bounds the L1 change of the ranks before that rescaling, which
    sum to at most 1. ``method`` is ``"arrow"``
    (numpy kernels over the edges kept as Arrow files; the rank vector is held in
    memory), ``"dataframe"`` (joins over rank rows) or ``"auto"`` (``"arrow"`` up
    to ``VECTOR_LIMIT`` vertices). ``listen`` and ``run_options`` are as in
    ``connected_components``.

    Example::

        ranks = pagerank(Graph(vertices, edges), tol=1e-6)
    """
    g = as_graph(graph)
    if not 0.0 < alpha < 1.0:
        raise GraphError(f"pagerank(alpha={alpha}) must be between 0 and 1")
    if normalization not in ("networkx", "graphx"):
        raise GraphError(f"pagerank(normalization={normalization!r}): use 'networkx' or 'graphx'")
    graphx = normalization == "graphx"
    spark = g.vertices.sparkSession
    method, n = choose_method("pagerank", method, g)
    if n == 0:
        raise GraphError("pagerank() needs at least one vertex; the vertices are empty")
    lay = None
    if method == "blocks":
        lay = block_state.layout(g.vertices, n, block_state.block_count(spark, n, 0, blocks))
        teleports = _block_teleports(lay, personalization)
        start = lay.per_block(_first_ranks(lay, teleports), RANK_STATE)
        iteration = (
            itf.BoundedIteration(block_body(lay, alpha, tol, teleports, graphx=graphx))
            .bind("ranks", start, on_driver=False)
            .bind("edges", block_state.edge_rows(lay, g.edges), replay=True)
            .until(itf.max_rounds(max_rounds))
        )
    elif method == "arrow":
        ids = vertex_ids(g)
        teleport = _teleport(ids, personalization)
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
        start = spark.createDataFrame(
            _vector_row(teleport if personalization else np.full(len(ids), 1.0 / len(ids)), 0.0),
            VECTOR_SCHEMA,
        )
        iteration = (
            itf.BoundedIteration(vector_body(ids, teleport, alpha, tol, graphx=graphx))
            .bind("ranks", start)
            .bind("edges", g.edges.select("src", "dst").repartition(partitions, "src"))
            .until(itf.max_rounds(max_rounds))
        )
    else:
        edges = g.edges.select("src", "dst")
        edges = edges if graphx else edges.distinct()
        ranks = initial_ranks(g.vertices, edges)
        if personalization is not None:
            ids = vertex_ids(g)
            weights = pa.table({"id": ids, "teleport": _teleport(ids, personalization)})
            ranks = ranks.join(spark.createDataFrame(weights), "id")
            if graphx:  # GraphX starts personalized ranks from the teleport, as the arrow path
                ranks = ranks.withColumn("rank", F.col("teleport"))
        iteration = (
            itf.BoundedIteration(pagerank_body(n, alpha=alpha, tol=tol, keep_dangling=not graphx))
            .bind("ranks", ranks)
            .bind("edges", edges)
            .until(itf.max_rounds(max_rounds))
        )
    if listen is not None:
        iteration = iteration.listen(listen)
    try:
        with itf.worker_errors(GraphError):  # an edge to no vertex, found by a worker
            final = iteration.run(**run_options).outputs["ranks"]
        if lay is not None:
            final = block_state.apart(
                block_state.final_rows(lay, block_state.exploded(final, "rank"))
            )
    finally:
        if lay is not None:
            lay.release()
    if method == "arrow":
        vector = cell_values(final.toArrow().column("rank"))
        final = spark.createDataFrame(pa.table({"id": ids, "rank": vector}))
    if graphx:
        # GraphX rescales once, after its rounds: the rank lost at dangling vertices
        # is given back in proportion to the ranks.
        total = final.agg(F.sum("rank")).collect()[0][0]
        target = 1.0 if personalization is not None else float(n)
        final = final.select("id", (F.col("rank") * F.lit(target / total)).alias("rank"))
    ranked = final.select("id", F.col("rank").alias("pagerank"))
    return graph_result(graph, with_column(g.vertices, ranked, "pagerank"))
