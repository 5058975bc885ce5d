"""Unweighted shortest paths to landmarks, as GraphFrames' ``shortestPaths``.

A breadth-first search from every landmark at once, backwards along the edges:
the distance from a vertex to a landmark follows the edges' direction. Only the
vertices reached in the previous round (the frontier) send messages, and a
(vertex, landmark) pair is settled the first round it is reached, which is its
distance since every edge counts 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

import iterflow as itf
from iterflow.graph import block_runner
from iterflow.graph.block_edges import EdgeFile, edge_rows
from iterflow.graph.block_kernels import BlockKernels, Partial, Received, Slice, least_per_block
from iterflow.graph.block_layout import apart, vertex_layout
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


@attrs.frozen
class RingKernels(BlockKernels):
    """A block's slice holds its vertices' distances to every landmark (vertex-major, -1
    while unreached) and which were reached last round (the frontier). The frontier offers
    distance + 1 to its vertices' predecessors (the edges are reversed, the files sorted by
    source: a cost that follows the frontier); a pair reached for the first time settles.
    ``active`` counts the pairs settled: the next frontier."""

    state: ClassVar[dict[str, pa.DataType]] = {"distance": pa.int32(), "fresh": pa.bool_()}
    by_source: ClassVar[bool] = True

    sizes: tuple[int, ...]
    marks: int
    #: The landmarks' (offset, landmark) per block.
    starting: dict[int, list[tuple[int, int]]]
    messages: Any
    active: Any

    def first(self, block: int) -> Slice:
        distance = np.full(self.sizes[block] * self.marks, -1, dtype=np.int32)
        for offset, mark in self.starting.get(block, []):
            distance[offset * self.marks + mark] = 0
        return {"distance": distance, "fresh": distance == 0}

    def send(self, edges: EdgeFile, block: int, state: Slice) -> Iterator[Partial]:
        fresh = np.flatnonzero(state["fresh"])
        at, owner = edges.out_of(fresh // self.marks)
        self.messages.inc(len(at))
        index = edges.do[at].astype(np.int64) * self.marks + fresh[owner] % self.marks
        offered = state["distance"][fresh[owner]] + 1
        # one round offers one distance (the frontier's + 1): the least is any of them
        spaces = [size * self.marks for size in self.sizes]
        yield from least_per_block(edges.db[at], index, offered, spaces)

    def receive(self, block: int, heard: Received) -> Slice:
        new = heard.own.copy()
        for index, value in heard.at_offsets():
            new_here = new[index] < 0
            new[index[new_here]] = value[new_here]
        fresh = (heard.own < 0) & (new >= 0)
        self.active.inc(int(fresh.sum()))
        return {"distance": new, "fresh": fresh}


def _per_vertex(marks: int) -> Any:
    """Final rows: ``block``, ``offset`` and the vertex's distances to every landmark."""

    def split(batches: Any) -> Any:
        for batch in batches:
            for i in range(batch.num_rows):
                block = int(batch.column("block")[i].as_py())
                distance = batch.column("distance")[i].values.to_numpy(zero_copy_only=False)
                size = len(distance) // marks
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(np.full(size, block, dtype=np.int32)),
                        pa.array(np.arange(size, dtype=np.int32)),
                        pa.ListArray.from_arrays(
                            pa.array(np.arange(size + 1, dtype=np.int32) * marks),
                            pa.array(distance.astype(np.int32, copy=False)),
                        ),
                    ],
                    names=["block", "offset", "distance"],
                )

    return split


def _block_paths(
    g: Any, n: int, chosen: list[Any], blocks: int | None, listen: Any, run_options: Any
) -> DataFrame:
    lay = vertex_layout(g.vertices, n, blocks)
    starting: dict[int, list[tuple[int, int]]] = {}
    for _, block, offset, mark in lay.find({m: i for i, m in enumerate(chosen)}, "BIGINT"):
        starting.setdefault(block, []).append((offset, int(mark)))
    messages, active = itf.metrics.counter("messages"), itf.metrics.counter("active")
    kernels = RingKernels(lay.sizes, len(chosen), starting, messages, active)
    rounds = block_runner.Rounds(
        name="shortest_paths_blocks",
        variable="distances",
        who="shortest_paths()",
        stop=(itf.until(block_runner.settled),),
    )
    edges = edge_rows(lay, g.edges, reverse=True)
    final = block_runner.run(lay, kernels, edges, rounds, listen, run_options)
    rows = final.mapInArrow(_per_vertex(len(chosen)), "block INT, offset INT, distance ARRAY<INT>")
    id_type = g.vertices.schema["id"].dataType
    landmarks = F.array(*(F.lit(m).cast(id_type) for m in chosen))
    pairs = F.zip_with(
        landmarks, F.col("distance"), lambda m, d: F.struct(m.alias("key"), d.alias("value"))
    )
    reached = F.map_from_entries(F.filter(pairs, lambda p: p["value"] >= 0))
    return apart(lay.with_ids(rows).select("id", reached.alias("distances")))


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
