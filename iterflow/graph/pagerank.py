"""PageRank, with networkx's normalization by default: ranks sum to 1, a vertex
without out-edges (dangling) spreads its rank uniformly over all vertices, and

    rank'(v) = (1 - alpha) / n + alpha * (sum over u -> v of rank(u) / out(u) + dangling / n)

With ``normalization="graphx"`` it computes GraphX's (and so GraphFrames') PageRank
instead: the rank of dangling vertices is lost every round, every copy of a
duplicate edge carries rank, and the final ranks are rescaled to sum to the number
of vertices (to 1 with a personalization), as GraphX's ``PageRank.runWithOptions``
does after its rounds.

Three ways to run it, all on iterflow's public API only:

- ``method="arrow"`` (the default while the rank vector fits a broadcast): the
  edges are written once as Arrow files (``RoundContext.columnar``), partitioned
  by source, deduplicated and turned into array indices; every round one kernel
  per file adds up its contributions as one sparse matrix-vector product (the
  file's edges as a scipy CSC matrix, built in its first round and kept with it),
  and one task sums the partials into the next rank vector. The variable is that
  vector, one row.
- ``method="blocks"`` (the default above that): the rank vector in slices kept in
  Spark, with numpy kernels (``RankKernels``) on the block path (``block_runner``).
- ``method="dataframe"``: joins and aggregates over ``(id, rank)`` rows, for
  graphs whose rank vector does not fit in memory; ``iterflow.demo.pagerank_demo``
  runs the same body.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import block_runner
from iterflow.graph.block_edges import EdgeFile, edge_rows
from iterflow.graph.block_kernels import BlockKernels, Partial, Received, Slice
from iterflow.graph.block_layout import Layout, apart, vertex_layout
from iterflow.graph.graphs import (
    Graph,
    GraphError,
    as_graph,
    graph_result,
    run_iteration,
    with_column,
)
from iterflow.graph.methods import choose_method, pagerank_rounds
from iterflow.graph.vectors import (
    built_once,
    cell_values,
    edge_positions,
    sorted_distinct,
    vertex_ids,
)

ALPHA = 0.85


def initial_ranks(vertices: DataFrame, edges: DataFrame) -> DataFrame:
    """Round-0 ranks: ``(id, rank = 1/n, out_degree)`` for every vertex.

    Example::

        ranks = initial_ranks(vertices, edges)  # the "ranks" input of pagerank_body
    """
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
    """The PageRank body for ``n`` vertices; with ``tol`` it stops once the L1 change <= tol.

    Example::

        result = (itf.BoundedIteration(pagerank_body(vertices.count(), tol=1e-8))
                    .bind("ranks", initial_ranks(vertices, edges)).bind("edges", edges)
                    .until(itf.max_rounds(100)).run())
    """

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
        pairs = sorted_distinct(pairs) if distinct else np.sort(pairs)  # sorted by source
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


@attrs.frozen
class EdgeMatrix:
    """One partition's edges as a sparse matrix: ``matrix @ ranks[sources]`` is the rank
    they carry to every vertex. Column j is the j-th distinct source (in order), with the
    ``share`` of each of its edges in the rows of their destinations."""

    sources: np.ndarray
    matrix: Any  # a scipy.sparse.csc_array of shape (n, len(sources))


def edge_matrix(table: pa.Table, n: int) -> EdgeMatrix:
    """The ``EdgeMatrix`` of a partition that ``edge_indices`` prepared, over ``n`` vertices."""
    starts = np.flatnonzero(table["first"].to_numpy(zero_copy_only=False))
    bounds = np.append(starts, table.num_rows)
    shares, ends = table["share"].to_numpy(), table["dst"].to_numpy()
    matrix = scipy.sparse.csc_array((shares, ends, bounds), shape=(n, len(starts)))
    return EdgeMatrix(table["src"].to_numpy()[starts], matrix)


def spread_of(table: pa.Table, ranks: np.ndarray, messages: Any) -> tuple[np.ndarray, float]:
    """The rank that one partition's edges carry to every vertex, and the rank its
    sources hold (the rest is the dangling vertices')."""
    messages.inc(table.num_rows)
    # Built in the partition's first round, then kept with its table. The product adds
    # each vertex's shares in the order of their sources, as a bincount over the edges
    # would, so the sums are the same to the bit (bench_kernels.py: 3x faster).
    edges = built_once(table, edge_matrix, len(ranks))
    held = ranks[edges.sources]
    return edges.matrix @ held, float(held.sum())


def contributions(table: pa.Table, ranks: np.ndarray, messages: Any) -> pa.Table:
    """``spread_of`` as a one-row table (``contribution``, ``held``)."""
    spread, held = spread_of(table, ranks, messages)
    return pa.table([itf.vector_cell(spread), pa.array([held])], names=["contribution", "held"])


class RankStep(itf.CombineFn):
    """One round on the rank vector: each partition's edges add the rank they carry
    (``spread_of``) to a (spread, held) accumulator; ``itf.combine`` sums the
    accumulators along its merge tree (among the resident tasks where the edges are
    resident, so the driver receives the new vector only), and the sum becomes the next
    ranks and their L1 change (the rank of dangling vertices is dropped unless
    ``keep_dangling``)."""

    def __init__(
        self,
        alpha: float,
        ranks: np.ndarray,
        teleport: np.ndarray | float,
        keep_dangling: bool,
        messages: Any,
    ) -> None:
        self.alpha = alpha
        self.ranks = ranks
        self.teleport = teleport
        self.keep_dangling = keep_dangling
        self.messages = messages

    def create_accumulator(self) -> tuple[np.ndarray, float]:
        return np.zeros(len(self.ranks)), 0.0

    def add_inputs(self, acc: Any, table: pa.Table) -> tuple[np.ndarray, float]:
        spread, held = spread_of(table, self.ranks, self.messages)
        acc[0][:] += spread
        return acc[0], acc[1] + held

    def add_input(self, acc: Any, batch: pa.RecordBatch) -> tuple[np.ndarray, float]:
        return self.add_inputs(acc, pa.Table.from_batches([batch]))

    def merge_accumulators(self, accs: list[Any]) -> tuple[np.ndarray, float]:
        spread, held = self.create_accumulator()
        for part, part_held in accs:
            spread += part
            held += part_held
        return spread, held

    def extract_output(self, acc: Any) -> pa.Table:
        spread, held = acc
        ranks, teleport, alpha = self.ranks, self.teleport, self.alpha
        dangling = ranks.sum() - held if self.keep_dangling else 0.0
        new = alpha * (spread + dangling * teleport) + (1.0 - alpha) * teleport
        return _vector_row(new, np.abs(new - ranks).sum())


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
    # Uniform jumps travel as one number, not a vector as long as the ranks (the same
    # arithmetic element by element, so the same ranks to the bit).
    jumps: np.ndarray | float = teleport
    if len(teleport) and np.all(teleport == teleport[0]):
        jumps = float(teleport[0])

    @itf.body
    def pagerank_vector(
        ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext
    ) -> itf.Declaration:
        current = itf.vector(ranks, "rank")  # held on the driver after round 0
        files = ctx.columnar(edges, prepare)
        step = RankStep(alpha, current, jumps, not graphx, messages)
        new_ranks = itf.combine(files, step, VECTOR_SCHEMA, depth=2)
        return itf.Declaration(
            feedback={"ranks": new_ranks},
            outputs={"ranks": new_ranks},
            until=itf.converged(change, tol) if tol is not None else None,
        )

    return pagerank_vector


# -- the block path: the rank vector in B slices, kept in Spark --------------------------


@attrs.frozen
class RankKernels(BlockKernels):
    """PageRank on rank slices: each round, every source block's edges send partial rank
    sums to the destination blocks, which add them up. ``messages`` counts the edges that
    carried rank, ``change`` (a distribution) receives each block's L1 change."""

    state: ClassVar[dict[str, pa.DataType]] = {"rank": pa.float64()}

    sizes: tuple[int, ...]
    n: int
    alpha: float
    #: The personalization's offsets and weights per block (None: uniform).
    teleports: dict[int, tuple[Any, Any]] | None
    #: False: the rank of dangling vertices is dropped, as GraphX does.
    keep_dangling: bool
    messages: Any
    change: Any

    def teleport(self, block: int) -> np.ndarray:
        """Where random jumps land in ``block``: 1/n each, or the personalization."""
        if self.teleports is None:
            return np.full(self.sizes[block], 1.0 / self.n)
        weights = np.zeros(self.sizes[block])
        offsets, shares = self.teleports.get(block, ((), ()))
        weights[np.asarray(offsets, dtype=np.int64)] = shares
        return weights

    def first(self, block: int) -> Slice:
        return {"rank": self.teleport(block)}

    def send(self, edges: EdgeFile, block: int, state: Slice) -> Iterator[Partial]:
        """Every destination block's partial sum, with the rank the dangling vertices hold."""
        rank = state["rank"]
        self.messages.inc(len(edges.so))
        weights = rank[edges.so] * edges.column("share")
        held = rank[edges.so[edges.column("first")]].sum()
        dangling = rank.sum() - held if self.keep_dangling else 0.0
        for d, size in enumerate(self.sizes):
            into = edges.into(d)
            some = into.stop > into.start
            part = np.bincount(edges.do[into], weights[into], minlength=size) if some else None
            yield Partial(d, part, shared=dangling)

    def receive(self, block: int, heard: Received) -> Slice:
        spread = np.zeros(self.sizes[block])
        for _, value in heard.partials:
            if len(value):
                spread += value
        teleport = self.teleport(block)
        new = self.alpha * (spread + heard.shared * teleport) + (1.0 - self.alpha) * teleport
        self.change.update(float(np.abs(new - heard.own).sum()))
        return {"rank": new}


def _block_change(end: itf.RoundEnd) -> float:
    """The round's L1 change of the ranks, summed over the blocks by the ``change`` metric:
    read from the metric, it costs no Spark job."""
    return float(end.progress.metrics["change"].sum)


def _block_teleports(
    lay: Layout, personalization: dict[Any, float] | None
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


@attrs.frozen
class _Ranking:
    """The choices of a ``pagerank`` call that every path reads."""

    alpha: float
    tol: float | None
    max_rounds: int
    personalization: dict[Any, float] | None
    graphx: bool


def _block_ranks(
    g: Graph, n: int, blocks: int | None, how: _Ranking, listen: Any, run_options: Any
) -> DataFrame:
    """``id`` and ``rank`` on the block path."""
    lay = vertex_layout(g.vertices, n, blocks)
    kernels = RankKernels(
        lay.sizes,
        n,
        how.alpha,
        _block_teleports(lay, how.personalization),
        keep_dangling=not how.graphx,
        messages=itf.metrics.counter("messages"),
        change=itf.metrics.distribution("change"),
    )
    rounds = block_runner.Rounds(
        name="pagerank_blocks",
        variable="ranks",
        who="pagerank()",
        distinct=not how.graphx,
        until=itf.converged(_block_change, how.tol) if how.tol is not None else None,
        stop=(itf.max_rounds(how.max_rounds),),
    )
    final = block_runner.run(lay, kernels, edge_rows(lay, g.edges), rounds, listen, run_options)
    return apart(block_runner.per_vertex(lay, final, "rank"))


def _vector_ranks(g: Graph, how: _Ranking, listen: Any, run_options: Any) -> DataFrame:
    """``id`` and ``rank`` on the Arrow path."""
    spark = g.vertices.sparkSession
    ids = vertex_ids(g)
    teleport = _teleport(ids, how.personalization)
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
    iteration = (
        itf.BoundedIteration(vector_body(ids, teleport, how.alpha, how.tol, graphx=how.graphx))
        .bind("ranks", spark.createDataFrame(_vector_row(teleport, 0.0), VECTOR_SCHEMA))
        .bind("edges", g.edges.select("src", "dst").repartition(partitions, "src"))
        .until(itf.max_rounds(how.max_rounds))
    )
    final = run_iteration(iteration, listen, run_options).outputs["ranks"]
    vector = cell_values(final.toArrow().column("rank"))
    return spark.createDataFrame(pa.table({"id": ids, "rank": vector}))


def _frame_ranks(g: Graph, n: int, how: _Ranking, listen: Any, run_options: Any) -> DataFrame:
    """``id`` and ``rank`` (and more columns) on the DataFrame path."""
    edges = g.edges.select("src", "dst")
    edges = edges if how.graphx else edges.distinct()
    ranks = initial_ranks(g.vertices, edges)
    if how.personalization is not None:
        ids = vertex_ids(g)
        weights = pa.table({"id": ids, "teleport": _teleport(ids, how.personalization)})
        ranks = ranks.join(g.vertices.sparkSession.createDataFrame(weights), "id")
        if how.graphx:  # GraphX starts personalized ranks from the teleport, as the arrow path
            ranks = ranks.withColumn("rank", F.col("teleport"))
    body = pagerank_body(n, alpha=how.alpha, tol=how.tol, keep_dangling=not how.graphx)
    iteration = (
        itf.BoundedIteration(body)
        .bind("ranks", ranks)
        .bind("edges", edges)
        .until(itf.max_rounds(how.max_rounds))
    )
    return run_iteration(iteration, listen, run_options).outputs["ranks"]


def _rescaled(ranks: DataFrame, target: float) -> DataFrame:
    """GraphX's ranks, rescaled once after the rounds to sum to ``target``: the rank lost at
    dangling vertices is given back in proportion to the ranks."""
    total = ranks.agg(F.sum("rank")).collect()[0][0]
    return ranks.select("id", (F.col("rank") * F.lit(target / total)).alias("rank"))


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
    memory), ``"blocks"`` (numpy kernels over rank slices kept in Spark; ``blocks``
    of them), ``"dataframe"`` (joins over rank rows) or ``"auto"`` (``"blocks"``
    above ``VECTOR_LIMIT`` vertices; below, the faster of ``"arrow"`` and ``"blocks"``
    by a cost model measured for the number of edges and rounds, ``methods.COSTS``).
    ``listen`` and ``run_options`` are as in ``connected_components``.

    Example::

        ranks = pagerank(Graph(vertices, edges), tol=1e-6)
    """
    g = as_graph(graph)
    if not 0.0 < alpha < 1.0:
        raise GraphError(f"pagerank(alpha={alpha}) must be between 0 and 1")
    if normalization not in ("networkx", "graphx"):
        raise GraphError(f"pagerank(normalization={normalization!r}): use 'networkx' or 'graphx'")
    rounds = pagerank_rounds(alpha, tol, max_rounds)
    method, n = choose_method("pagerank", method, g, rounds=rounds)
    if n == 0:
        raise GraphError("pagerank() needs at least one vertex; the vertices are empty")
    how = _Ranking(alpha, tol, max_rounds, personalization, normalization == "graphx")
    if method == "blocks":
        final = _block_ranks(g, n, blocks, how, listen, run_options)
    elif method == "arrow":
        final = _vector_ranks(g, how, listen, run_options)
    else:
        final = _frame_ranks(g, n, how, listen, run_options)
    if how.graphx:
        final = _rescaled(final, 1.0 if personalization is not None else float(n))
    ranked = final.select("id", F.col("rank").alias("pagerank"))
    return graph_result(graph, with_column(g.vertices, ranked, "pagerank"))
