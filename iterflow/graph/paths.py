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
from iterflow.graph.model import GraphError, as_graph


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
    ring = (
        messages.groupBy("id", "landmark")
        .agg(F.min("distance").alias("distance"))
        .join(reached, ["id", "landmark"], "left_anti")
    )
    settled = reached.unionByName(ring)
    return itf.Declaration(
        feedback={"reached": settled, "frontier": ring},
        outputs={"reached": settled},
        until=itf.empty(ring),
    )


def shortest_paths(
    graph: Any, landmarks: Iterable[Any], *, listen: Any = None, **run_options: Any
) -> DataFrame:
    """The vertices of ``graph`` with ``distances``: a map from each landmark that the vertex
    can reach along the edges to the number of edges on the shortest path (empty when none).

    ``listen`` and ``run_options`` are as in ``connected_components``.

    Example::

        shortest_paths(Graph(vertices, edges), landmarks=[1, 4])
    """
    g = as_graph(graph)
    chosen = list(landmarks)
    if not chosen:
        raise GraphError("shortest_paths(landmarks=...) needs at least one landmark id")
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
    return g.vertices.join(distances, "id", "left").withColumn(
        "distances",
        F.coalesce("distances", F.create_map().cast(distances.schema["distances"].dataType)),
    )
