"""Breadth-first search for the shortest paths between two sets of vertices, as
GraphFrames' ``bfs``.

The search is an iteration over *levels*: round k takes the edges out of the
vertices first reached in round k - 1 (the frontier; the start vertices at
round 0) and gives level k + 1 to the vertices they reach for the first time. It
stops at the first level holding a target vertex, when no new vertex is
reached, or after ``max_path_length`` levels.

The paths are then read off the levels: a shortest path of length L steps from
level i to level i + 1 at every edge, so the paths are the chains of edges from
the start vertices to the targets at level L through the vertices at levels 1,
2, ... L - 1 from which a target can still be reached. Every such chain is one
row, so parallel edges give one path each, as in GraphFrames.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.graphs import GraphError, as_graph, checked, nested, where


@itf.body
def next_level(
    reached: DataFrame,
    frontier: DataFrame,
    edges: DataFrame,
    targets: DataFrame,
    ctx: itf.RoundContext,
) -> itf.Declaration:
    """One level: the vertices that the frontier's edges reach for the first time."""
    stepped = ctx.observe(
        "messages", frontier.join(edges, frontier["id"] == edges["src"]).select(edges["dst"])
    )
    level = (
        stepped.select(F.col("dst").alias("id"))
        .distinct()
        .join(reached, "id", "left_anti")
        .select("id", F.lit(ctx.epoch + 1).alias("level"))
    )
    level = ctx.observe("active", ctx.cache(level))
    found = level.join(targets, "id", "left_semi")
    levels = reached.unionByName(level)
    return itf.Declaration(
        feedback={"reached": levels, "frontier": level.select("id")},
        outputs={"reached": levels, "found": found},
        until=itf.empty(level),
    )


def _found_target(progress: itf.RoundProgress) -> bool:
    return bool(progress.rows.get("found"))


def bfs(
    graph: Any,
    from_expr: str | Column,
    to_expr: str | Column,
    *,
    edge_filter: str | Column | None = None,
    max_path_length: int = 10,
    listen: Any = None,
    **run_options: Any,
) -> DataFrame:
    """Every shortest path from a vertex matching ``from_expr`` to a vertex matching
    ``to_expr``, as GraphFrames' ``bfs`` returns them.

    ``from_expr`` and ``to_expr`` are SQL conditions (strings or Columns) on the
    vertex columns, ``edge_filter`` one on the edge columns: only the edges
    matching it are walked. "Shortest" is global: every returned path has the
    length of the shortest one between any start and any target, at most
    ``max_path_length`` edges. The result has one row per path and the columns
    ``from``, ``e0``, ``v1``, ``e1``, ... ``to``: structs of the vertex and edge
    rows along the path. A vertex matching both conditions is a path of no edge
    (columns ``from`` and ``to`` only); when no path is found the result is an
    empty DataFrame with the vertices' columns, as in GraphFrames.

    Each round's ``RoundProgress.observed`` has ``messages`` (edges walked from
    the frontier) and ``active`` (vertices reached for the first time).
    ``listen`` and ``run_options`` are as in ``connected_components``.

    Example::

        bfs(Graph(vertices, edges), "name = 'Esther'", "age < 32", max_path_length=3)
    """
    g = as_graph(graph)
    if max_path_length < 0:
        raise GraphError(f"bfs(max_path_length={max_path_length}) must be >= 0")
    checked(g, "bfs()", edges=False)  # an edge to a missing vertex is no step of a path
    vertices, spark = g.vertices, g.vertices.sparkSession
    starts = where(vertices, from_expr, "bfs(from_expr=...)")
    targets = where(vertices, to_expr, "bfs(to_expr=...)")
    edges = g.edges if edge_filter is None else where(g.edges, edge_filter, "bfs(edge_filter=...)")
    nothing = spark.createDataFrame([], vertices.schema)
    if not starts.take(1) or not targets.take(1):
        return nothing
    both = where(starts, to_expr, "bfs(to_expr=...)")
    if both.take(1):
        return both.select(nested(both, "from"), nested(both, "to"))
    if max_path_length == 0:
        return nothing
    ids = vertices.select("id")
    # Only edges between vertices: an edge to a missing vertex is no step of a path.
    walked = (
        edges.where(F.col("src") != F.col("dst"))
        .join(ids.withColumnRenamed("id", "src"), "src", "left_semi")
        .join(ids.withColumnRenamed("id", "dst"), "dst", "left_semi")
        .select(*edges.columns)
    )
    start = starts.select("id", F.lit(0).alias("level"))
    iteration = (
        itf.BoundedIteration(next_level)
        .bind("reached", start)
        .bind("frontier", start.select("id"))
        .bind("edges", walked.select("src", "dst").distinct())
        .bind("targets", targets.select("id"))
        .until(itf.until(_found_target) | itf.max_rounds(max_path_length))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    result = iteration.run(**run_options)
    if not _found_target(result.history[-1]):
        return nothing
    return _paths(vertices, walked, result.outputs["reached"], result.outputs["found"])


def _paths(vertices: DataFrame, edges: DataFrame, levels: DataFrame, found: DataFrame) -> DataFrame:
    """The chains of edges from level 0 to the targets at the last level."""
    length = int(found.first()["level"])  # type: ignore[index]
    # on_path[i]: the vertices of level i from which a target at level `length` is reached.
    on_path = [found.select("id")]
    for level in range(length - 1, 0, -1):
        layer = levels.where(F.col("level") == level).select(F.col("id").alias("src"))
        ahead = on_path[0].select(F.col("id").alias("dst"))
        steps = edges.select("src", "dst").join(ahead, "dst", "left_semi")
        on_path.insert(0, layer.join(steps, "src", "left_semi").select(F.col("src").alias("id")))
    starts = levels.where(F.col("level") == 0).select("id")
    on_path.insert(0, starts)

    rows = vertices.select(F.col("id").alias("_at"), nested(vertices, "v"))
    edge_rows = edges.select(
        F.col("src").alias("_from"), F.col("dst").alias("_to"), nested(edges, "e")
    )
    paths = (
        on_path[0]
        .join(rows, on_path[0]["id"] == rows["_at"])
        .select(F.col("v").alias("from"), F.col("_at"))
    )
    names = ["from"]
    for i in range(length):
        vertex = "to" if i == length - 1 else f"v{i + 1}"
        step = edge_rows.join(on_path[i + 1], edge_rows["_to"] == on_path[i + 1]["id"], "left_semi")
        paths = (
            paths.join(step, paths["_at"] == step["_from"])
            .select(*names, F.col("e").alias(f"e{i}"), F.col("_to").alias("_at"))
            .join(rows, "_at")
            .select(*names, f"e{i}", F.col("v").alias(vertex), "_at")
        )
        names += [f"e{i}", vertex]
    return paths.select(*names)
