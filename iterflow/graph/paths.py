"""Unweighted shortest paths to landmarks, as GraphFrames' ``shortestPaths``.

A breadth-first search from every landmark at once, backwards along the edges:
the distance from a vertex to a landmark follows the edges' direction. Only the
vertices reached in the previous round (the frontier) send messages, and a
(vertex, landmark) pair is settled the first round it is reached, which is its
distance since every edge counts 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

import iterflow as itf
from iterflow.graph import block_state
from iterflow.graph.graphs import GraphError, as_graph, graph_result, with_column
from iterflow.graph.methods import choose_method
from iterflow.graph.pregel import PregelProgram, shown
from iterflow.graph.pregel_columns import Pregel


@itf.body
def settle_next_ring(
    reached: DataFrame, frontier: DataFrame, edges: DataFrame, ctx: Any
) -> itf.Declaration:
    """One BFS round: the frontier's predecessors that had no distance to a landmark get one."""
    messages = ctx.observe(
        "messages",
        frontier.join(edges, frontier["id"] == edges["dst"]).select(
            edges["src"].alias("id"),
            frontier["landmark"],
            (frontier["distance"] + 1).alias("distance"),
        ),
    )
    ring = ctx.observe(
        "active",
        messages.groupBy("id", "landmark")
        .agg(F.min("distance").alias("distance"))
        .join(reached, ["id", "landmark"], "left_anti"),
    )
    settled = reached.unionByName(ring)
    return itf.Declaration(
        feedback={"reached": settled, "frontier": ring},
        outputs={"reached": settled},
        until=itf.empty(ring),
    )


# -- the block path: breadth-first from every landmark, along reversed edges ----------

#: A state row of the block path: the distances of block b's vertices to every landmark
#: (vertex-major, -1 while unreached) and which were reached last round (the frontier).
DISTANCE_STATE = "block INT, distance ARRAY<INT>, fresh ARRAY<BOOLEAN>"
#: What a block sends: (vertex offset * landmarks + landmark) of block ``to`` and the
#: distance offered; or (``self``) its own distances.
DISTANCE_PARTIAL = "to INT, self BOOLEAN, index ARRAY<INT>, value ARRAY<INT>"


def ring_send(sizes: tuple[int, ...], marks: int, messages: Any) -> block_state.Kernel:
    """Kernel of a block: the frontier offers distance + 1 to its vertices' predecessors
    (the edges of the file are reversed and sorted by source: a cost that follows the
    frontier)."""

    def send(table: pa.Table, rows: pa.Table) -> Any:
        so, db, do = (table[c].to_numpy() for c in ("so", "db", "do"))
        for s, row in block_state.rows_of(rows):
            block_state.check_block(table, s)
            distance = block_state.values(row["distance"], np.int32)
            fresh = np.flatnonzero(block_state.values(row["fresh"], np.bool_))
            at, owner = block_state.gathered(so, fresh // marks)
            messages.inc(len(at))
            index = do[at].astype(np.int64) * marks + fresh[owner] % marks
            offered = distance[fresh[owner]] + 1
            for d, sel in enumerate(block_state.by_block(db[at], len(sizes))):
                if len(sel):
                    # one round offers one distance (the frontier's + 1): any will do
                    index_d, value = block_state.least_per_offset(
                        sizes[d] * marks, index[sel], offered[sel]
                    )
                    yield block_state.sparse_row(d, False, index_d, value, pa.int32())
            yield block_state.sparse_row(s, True, None, distance, pa.int32())

    return send


def ring_receive(active: Any) -> Any:
    """Kernel of a destination block: the pairs reached for the first time settle."""

    def receive(batches: Any) -> Any:
        for d, rows in block_state.grouped(batches):
            old, heard = block_state.received(rows, np.int32)
            new = old.copy()
            for index, value in heard:
                new_here = new[index] < 0
                new[index[new_here]] = value[new_here]
            fresh = (old < 0) & (new >= 0)
            active.inc(int(fresh.sum()))
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([d], pa.int32()),
                    block_state.list_column([new], pa.int32()),
                    block_state.list_column([fresh], pa.bool_()),
                ],
                names=["block", "distance", "fresh"],
            )

    return receive


def _per_vertex(marks: int) -> Any:
    """Final rows: ``block``, ``offset`` and the vertex's distances to every landmark."""

    def split(batches: Any) -> Any:
        for batch in batches:
            for b, row in block_state.rows_of(pa.Table.from_batches([batch])):
                distance = block_state.values(row["distance"], np.int32)
                size = len(distance) // marks
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.full(size, b, dtype=np.int32)),
                        pa.array(np.arange(size, dtype=np.int32)),
                        pa.ListArray.from_arrays(
                            pa.array(np.arange(size + 1, dtype=np.int32) * marks),
                            pa.array(distance),
                        ),
                    ],
                    names=["block", "offset", "distance"],
                )

    return split


def _block_paths(
    g: Any, n: int, chosen: list[Any], blocks: int | None, listen: Any, run_options: Any
) -> DataFrame:
    spark = g.vertices.sparkSession
    lay = block_state.layout(g.vertices, n, block_state.block_count(spark, n, 0, blocks))
    id_type = g.vertices.schema["id"].dataType
    starting: dict[int, list[tuple[int, int]]] = {}
    for _, block, offset, mark in lay.find({m: i for i, m in enumerate(chosen)}, "BIGINT"):
        starting.setdefault(block, []).append((offset, int(mark)))
    marks, sizes = len(chosen), lay.sizes

    def first(block: int) -> Any:
        distance = np.full(sizes[block] * marks, -1, dtype=np.int32)
        for offset, mark in starting.get(block, []):
            distance[offset * marks + mark] = 0
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([block], pa.int32()),
                block_state.list_column([distance], pa.int32()),
                block_state.list_column([distance == 0], pa.bool_()),
            ],
            names=["block", "distance", "fresh"],
        )

    step = block_state.block_step(
        lay,
        block_state.edge_file("shortest_paths()", by_source=True, distinct=True, dense=lay.dense),
        ring_send(lay.sizes, marks, itf.metrics.counter("messages")),
        DISTANCE_PARTIAL,
        ring_receive(itf.metrics.counter("active")),
        DISTANCE_STATE,
    )

    @itf.body
    def shortest_paths_blocks(distances: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> Any:
        new = step(distances, edges, ctx)
        return itf.Declaration(feedback={"distances": new}, outputs={"distances": new})

    iteration = (
        itf.BoundedIteration(shortest_paths_blocks)
        .bind("distances", lay.per_block(first, DISTANCE_STATE), on_driver=False)
        .bind("edges", block_state.edge_rows(lay, g.edges, reverse=True), replay=True)
        .until(itf.until(lambda progress: progress.metrics.get("active") == 0))
    )
    final = block_state.run_on_blocks(iteration, lay, listen, run_options, "distances")
    rows = final.mapInArrow(_per_vertex(marks), "block INT, offset INT, distance ARRAY<INT>")
    landmarks = F.array(*(F.lit(m).cast(id_type) for m in chosen))
    pairs = F.zip_with(
        landmarks, F.col("distance"), lambda m, d: F.struct(m.alias("key"), d.alias("value"))
    )
    return block_state.apart(
        block_state.final_rows(lay, rows).select(
            "id", F.map_from_entries(F.filter(pairs, lambda p: p["value"] >= 0)).alias("distances")
        )
    )


def shortest_paths(
    graph: Any,
    landmarks: Iterable[Any],
    *,
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with ``distances``: a map from each landmark that the vertex
    can reach along the edges to the number of edges on the shortest path (empty when none).

    Each round's ``RoundProgress.observed`` has ``messages`` (distances sent by the
    frontier) and ``active`` (the (vertex, landmark) pairs reached for the first
    time: the next frontier). ``listen`` and ``run_options`` are as in
    ``connected_components``.

    Example::

        shortest_paths(Graph(vertices, edges), landmarks=[1, 4])
    """
    g = as_graph(graph)
    chosen = list(dict.fromkeys(landmarks))  # a landmark named twice is one landmark
    if not chosen:
        raise GraphError("shortest_paths(landmarks=...) needs at least one landmark id")
    method, n = choose_method("shortest_paths", method, g, below_limit="dataframe")
    if method == "blocks":
        with itf.worker_errors(GraphError):  # an edge to no vertex, found by a worker
            found = _block_paths(g, n, chosen, blocks, listen, run_options)
        return graph_result(graph, with_column(g.vertices, found, "distances"))
    id_type = g.vertices.schema["id"].dataType
    marks = g.vertices.sparkSession.createDataFrame(
        [(m,) for m in chosen], StructType([StructField("landmark", id_type)])
    )
    start = g.vertices.join(marks, g.vertices["id"] == marks["landmark"]).select(
        "id", "landmark", F.lit(0).alias("distance")
    )
    iteration = (
        itf.BoundedIteration(settle_next_ring)
        .bind("reached", start)
        .bind("frontier", start)
        .bind("edges", g.edges.select("src", "dst").distinct())
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    reached = iteration.run(**run_options).outputs["reached"]
    distances = reached.groupBy("id").agg(
        F.map_from_entries(F.collect_list(F.struct("landmark", "distance"))).alias("distances")
    )
    return graph_result(
        graph,
        g.vertices.drop("distances")
        .join(distances, "id", "left")
        .withColumn(
            "distances",
            F.coalesce("distances", F.create_map().cast(distances.schema["distances"].dataType)),
        ),
    )


def weighted_shortest_paths(
    graph: Any,
    source: Any,
    *,
    weight: str = "weight",
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with ``distance``: the length of the shortest path from
    ``source`` along the edges, summing the edge column ``weight`` (null when unreachable).

    Bellman-Ford as a Pregel program (``iterflow.graph.pregel``): only the
    vertices whose distance shrank in a round send in the next one. Negative
    weights are allowed; a negative cycle reachable from ``source`` is a
    ``GraphError``. ``listen`` and ``run_options`` are as in ``connected_components``.

    Example::

        weighted_shortest_paths(Graph(vertices, edges), source=1, weight="km")
    """
    g = as_graph(graph)
    if weight not in g.edges.columns:
        raise GraphError(
            f"weighted_shortest_paths(weight={weight!r}): the edges have no such column; "
            f"their columns are {g.edges.columns}"
        )
    if not g.vertices.where(F.col("id") == F.lit(source)).take(1):
        raise GraphError(f"weighted_shortest_paths(source={source!r}): no vertex has that id")
    method, n = choose_method("weighted_shortest_paths", method, g, below_limit="dataframe")
    # A shortest path has fewer than n edges: one more round means a negative cycle.
    bound = n + 1
    program = PregelProgram(
        init={
            "distance": F.when(F.col("id") == F.lit(source), F.lit(0.0)).otherwise(
                F.lit(None).cast("double")
            )
        },
        update={"distance": F.least(F.col("distance"), Pregel.msg())},
        send_to_dst=Pregel.src("distance") + Pregel.edge(weight).cast("double"),
        aggregate=F.min,
    )
    with itf.worker_errors(GraphError):  # an edge to no vertex, found by a worker
        result = program.run(
            g, n=n, method=method, blocks=blocks, max_rounds=bound, listen=listen, **run_options
        )
    if result.termination.reason == "max_rounds":
        raise GraphError(
            f"weighted_shortest_paths: distances still shrink after {bound} rounds, so a "
            f"cycle of negative '{weight}' is reachable from {source!r}"
        )
    return graph_result(graph, shown(result))
