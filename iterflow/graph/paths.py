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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

import iterflow as itf
from iterflow.graph.model import GraphError, as_graph, checked, graph_result
from iterflow.graph.pregel import Pregel, PregelProgram


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


def shortest_paths(
    graph: Any, landmarks: Iterable[Any], *, listen: Any = None, **run_options: Any
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
    chosen = list(landmarks)
    if not chosen:
        raise GraphError("shortest_paths(landmarks=...) needs at least one landmark id")
    checked(g, "shortest_paths()")
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
    # A shortest path has fewer than n edges: one more round means a negative cycle.
    bound = checked(g, "weighted_shortest_paths()") + 1
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
    result = program.run(g, max_rounds=bound, listen=listen, **run_options)
    if result.termination.reason == "max_rounds":
        raise GraphError(
            f"weighted_shortest_paths: distances still shrink after {bound} rounds, so a "
            f"cycle of negative '{weight}' is reachable from {source!r}"
        )
    return graph_result(graph, result.outputs["vertices"])
