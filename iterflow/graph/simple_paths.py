"""Paths that visit no vertex twice: the cycles of a graph (GraphFrames'
``detectingCycles``) and every simple path between two sets of vertices (``all_paths``),
each an iteration that extends every open path by one edge a round.

Cycles follow Rocha and Thatte: every vertex starts a path; a path that comes back to its
first vertex is a cycle, kept once (from its smallest vertex); a path that meets any other
of its vertices again stops. The work grows with the number of simple paths, as it does
in GraphFrames: these are for sparse graphs and short paths.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.graphs import GraphError, as_graph, run_iteration, where
from iterflow.graph.views import both_directions


def _extended(paths: DataFrame, edges: DataFrame) -> DataFrame:
    """Every path one edge longer: ``id`` (the edge's end), ``path`` (without it)."""
    return paths.join(edges, paths["id"] == edges["src"]).select(
        edges["dst"].alias("id"), paths["path"]
    )


def _appended(path: Column, vertex: Column) -> Column:
    return F.concat(path, F.array(vertex))


def extended_round(
    ctx: Any, open_paths: DataFrame, found: DataFrame, arrived: DataFrame
) -> itf.Declaration:
    """The end of a round that extends paths: the open ones (cached by the caller) go on
    and are the round's ``active``, the ``arrived`` ones join those ``found`` before; it
    stops when none is open."""
    going_on = open_paths
    ctx.observe("active", going_on)
    all_found = ctx.cache(found.unionByName(arrived))
    return itf.Declaration(
        feedback={"paths": going_on, "found": all_found},
        outputs={"found": all_found},
        until=itf.empty(going_on),
    )


@itf.body
def close_cycles(paths: DataFrame, found: DataFrame, edges: DataFrame, ctx: Any) -> itf.Declaration:
    """One round: paths back at their start are cycles (kept from their smallest vertex);
    paths at a new vertex go on."""
    stepped = ctx.observe("messages", _extended(paths, edges))
    closed = stepped.where(F.col("path")[0] == F.col("id"))
    cycles = closed.where(F.col("id") == F.array_min("path")).select(
        "id", _appended(F.col("path"), F.col("id")).alias("found_cycles")
    )
    going_on = stepped.where(~F.array_contains("path", F.col("id"))).select(
        "id", _appended(F.col("path"), F.col("id")).alias("path")
    )
    return extended_round(ctx, ctx.cache(going_on), found, cycles)


def detecting_cycles(graph: Any, *, listen: Any = None, **run_options: Any) -> DataFrame:
    """``id`` and ``found_cycles``: a row per cycle of ``graph`` (directed), the cycle's
    vertex ids from its smallest id back to it (``[1, 2, 3, 1]``); a self-loop is
    ``[v, v]``."""
    g = as_graph(graph)
    edges = g.edges.select("src", "dst").distinct()
    ids = g.vertices.select("id")
    iteration = (
        itf.BoundedIteration(close_cycles)
        .bind("paths", ids.select("id", F.array("id").alias("path")))
        .bind("found", ids.select("id", F.array("id").alias("found_cycles")).limit(0))
        .bind("edges", edges)
        .until(itf.max_rounds(2**31 - 1))
    )
    return run_iteration(iteration, listen, run_options).outputs["found"]


@itf.body
def extend_paths(
    paths: DataFrame, found: DataFrame, edges: DataFrame, targets: DataFrame, ctx: Any
) -> itf.Declaration:
    """One round: every open path takes each edge to a vertex it has not visited; those
    at a target are found."""
    stepped = ctx.observe("messages", _extended(paths, edges))
    longer = ctx.cache(
        stepped.where(~F.array_contains("path", F.col("id"))).select(
            "id", _appended(F.col("path"), F.col("id")).alias("path")
        )
    )
    arrived = longer.join(targets, "id", "left_semi").select("path")
    return extended_round(ctx, longer, found, arrived)


def all_paths(
    graph: Any,
    from_expr: Any,
    to_expr: Any,
    *,
    edge_filter: Any = None,
    max_path_length: int = 5,
    is_directed: bool = True,
    listen: Any = None,
    **run_options: Any,
) -> DataFrame:
    """``path`` (the vertex ids in order) and ``len`` (edges, long): every simple path of
    at most ``max_path_length`` edges from a vertex matching ``from_expr`` to a different
    vertex matching ``to_expr``, along edges that meet ``edge_filter`` (in either direction
    when not ``is_directed``). Parallel edges give one path."""
    if not isinstance(max_path_length, int) or max_path_length < 1:
        raise GraphError(f"all_paths(max_path_length={max_path_length!r}) must be a count >= 1")
    g = as_graph(graph)
    edges = (
        g.edges
        if edge_filter is None
        else where(g.edges, edge_filter, "all_paths(edge_filter=...)")
    )
    edges = edges.select("src", "dst")
    edges = (edges if is_directed else both_directions(edges)).distinct()
    starts = where(g.vertices, from_expr, "all_paths(from_expr=...)").select("id")
    targets = where(g.vertices, to_expr, "all_paths(to_expr=...)").select("id")
    iteration = (
        itf.BoundedIteration(extend_paths)
        .bind("paths", starts.select("id", F.array("id").alias("path")))
        .bind("found", starts.select(F.array("id").alias("path")).limit(0))
        .bind("edges", edges)
        .bind("targets", targets)
        .until(itf.max_rounds(max_path_length))
    )
    found = run_iteration(iteration, listen, run_options).outputs["found"]
    return found.select("path", (F.size("path") - 1).cast("long").alias("len"))
