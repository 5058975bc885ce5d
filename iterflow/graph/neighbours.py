"""Values carried along paths from chosen vertices, hop by hop: GraphFrames'
``aggregate_neighbors``, as an iteration that extends every open path by one edge a round.

Each path starts at a vertex meeting ``starting_vertices`` with accumulators set by
``accumulator_inits`` (over the vertex's columns). Taking an edge sets every accumulator
to its update at once, over the accumulators before the step and the step's rows,
referred to as ``AggregateNeighbors.src_attr(name)`` (the vertex left),
``.dst_attr(name)`` (the vertex reached) and ``.edge_attr(name)``. After the update, a
path whose step meets ``target_condition`` is a result and ends; one that meets
``stopping_condition`` ends, and is a result only when no target condition is given;
the others go on, for at most ``max_hops`` edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.graphs import GraphError, as_graph, column_of, run_iteration, where
from iterflow.graph.simple_paths import extended_round

_SRC, _DST, _EDGE = "src_attributes", "dst_attributes", "edge_attributes"


class AggregateNeighbors:
    """References for ``aggregate_neighbors``' expressions (GraphFrames' names)."""

    @staticmethod
    def src_attr(colName: str) -> Column:
        """An attribute of the vertex a step leaves."""
        return F.col(_SRC).getField(colName)

    @staticmethod
    def dst_attr(colName: str) -> Column:
        """An attribute of the vertex a step reaches."""
        return F.col(_DST).getField(colName)

    @staticmethod
    def edge_attr(colName: str) -> Column:
        """An attribute of the edge a step takes."""
        return F.col(_EDGE).getField(colName)


def _argument(value: Any, name: str) -> Column:
    return column_of(value, f"aggregate_neighbors({name}=...)")


def _rows(
    df: DataFrame,
    keep: Sequence[str] | None,
    name: str,
    always: tuple[str, ...],
    condition: Any = None,
) -> DataFrame:
    """``df``'s rows that meet ``condition`` (over its columns or the struct) as the struct
    ``name`` of the ``always`` and ``keep`` columns (every column when ``keep`` is None);
    vertices also keep their id as ``_key`` for joins."""
    columns = list(df.columns if keep is None else dict.fromkeys([*always, *keep]))
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise GraphError(f"aggregate_neighbors: no column(s) {missing} among {df.columns}")
    rows = df.select(*df.columns, F.struct(*columns).alias(name))
    if condition is not None:
        rows = where(rows, condition, "aggregate_neighbors(edge_filter=...)")
    return rows.select(F.col("id").alias("_key"), name) if "id" in always else rows.select(name)


def _stepped(paths: DataFrame, edges: DataFrame, vertices: DataFrame) -> DataFrame:
    """Every open path joined with each edge out of its vertex and both ends' rows."""
    src = vertices.select(F.col(_DST).alias(_SRC), F.col("_key").alias("_src_key"))
    return (
        paths.join(edges, F.col("id") == F.col(f"{_EDGE}.src"))
        .join(src, F.col("id") == F.col("_src_key"))
        .join(vertices, F.col(f"{_EDGE}.dst") == F.col("_key"))
    )


def _updated(stepped: DataFrame, names: list[str], updates: list[Column]) -> DataFrame:
    """The paths one edge longer: the end, the hops, the updated accumulators, the rows."""
    return stepped.select(
        F.col(f"{_EDGE}.dst").alias("id"),
        (F.col("hop") + 1).alias("hop"),
        *(u.alias(n) for n, u in zip(names, updates, strict=True)),
        _SRC,
        _DST,
        _EDGE,
    )


def _widened(
    starts: DataFrame,
    edges: DataFrame,
    vertices: DataFrame,
    names: list[str],
    updates: list[Column],
) -> DataFrame:
    """``starts`` with each accumulator cast to the type its update gives (``0`` plus a
    long attribute is a long), so every round's paths have one schema; read from the
    plans' schemas, without a job."""
    for _ in range(3):
        after = _updated(_stepped(starts, edges, vertices), names, updates).schema
        changed = [n for n in names if after[n].dataType != starts.schema[n].dataType]
        if not changed:
            return starts
        starts = starts.select(
            *(
                F.col(c).cast(after[c].dataType).alias(c) if c in changed else c
                for c in starts.columns
            )
        )
    raise GraphError(f"aggregate_neighbors: the accumulators {names} change type at every hop")


def _step_body(
    names: list[str], updates: list[Column], target: Column | None, stopping: Column | None
) -> itf.IterationBody:
    """The round of ``aggregate_neighbors`` for these accumulators and conditions."""

    @itf.body
    def take_step(
        paths: DataFrame, found: DataFrame, edges: DataFrame, vertices: DataFrame, ctx: Any
    ) -> itf.Declaration:
        """One hop: every open path takes each edge out of its vertex; results and ends
        are sorted out after the accumulators' update."""
        stepped = _stepped(paths, edges, vertices)
        ctx.observe("messages", stepped)
        updated = _updated(stepped, names, updates)
        no = F.lit(False)
        judged = ctx.cache(
            updated.select(
                "id",
                "hop",
                *names,
                (no if target is None else F.coalesce(target, no)).alias("_target"),
                (no if stopping is None else F.coalesce(stopping, no)).alias("_stop"),
            )
        )
        result = F.col("_target") if target is not None else F.col("_stop")
        arrived = judged.where(result).select("id", "hop", *names)
        open_paths = judged.where(~F.col("_target") & ~F.col("_stop")).select(*paths.columns)
        return extended_round(ctx, ctx.cache(open_paths), found, arrived)

    return take_step


def aggregate_neighbors(
    graph: Any,
    starting_vertices: Any,
    accumulator_names: list[str],
    accumulator_inits: list[Any],
    accumulator_updates: list[Any],
    *,
    max_hops: int = 3,
    stopping_condition: Any = None,
    target_condition: Any = None,
    required_vertex_attributes: list[str] | None = None,
    required_edge_attributes: list[str] | None = None,
    edge_filter: Any = None,
    remove_loops: bool = False,
    listen: Any = None,
    **run_options: Any,
) -> DataFrame:
    """``id`` (the vertex a path reached), ``hop`` (its edges) and one column per
    accumulator, a row per path that ended as a result (see the module's description).
    ``required_*_attributes`` limit the columns the steps carry (None: all)."""
    names = list(accumulator_names)
    if not names or not len(names) == len(accumulator_inits) == len(accumulator_updates):
        raise GraphError(
            "aggregate_neighbors needs as many accumulator_inits and accumulator_updates "
            f"as accumulator_names, got {len(names)}, {len(accumulator_inits)}, "
            f"{len(accumulator_updates)}"
        )
    if {"id", "hop"} & set(names) or len(set(names)) < len(names):
        raise GraphError(f"aggregate_neighbors: accumulator names {names} repeat or use id/hop")
    if target_condition is None and stopping_condition is None:
        raise GraphError(
            "aggregate_neighbors needs a target_condition, a stopping_condition or both"
        )
    if not isinstance(max_hops, int) or max_hops < 1:
        raise GraphError(f"aggregate_neighbors(max_hops={max_hops!r}) must be a count >= 1")
    g = as_graph(graph)
    edges = g.edges.where(F.col("src") != F.col("dst")) if remove_loops else g.edges
    edge_rows = _rows(edges, required_edge_attributes, _EDGE, ("src", "dst"), edge_filter)
    starts = where(
        g.vertices, starting_vertices, "aggregate_neighbors(starting_vertices=...)"
    ).select(
        "id",
        F.lit(0).alias("hop"),
        *(
            _argument(c, "accumulator_inits").alias(n)
            for n, c in zip(names, accumulator_inits, strict=True)
        ),
    )
    updates = [_argument(c, "accumulator_updates") for c in accumulator_updates]
    target = None if target_condition is None else _argument(target_condition, "target_condition")
    stopping = (
        None if stopping_condition is None else _argument(stopping_condition, "stopping_condition")
    )
    vertex_rows = _rows(g.vertices, required_vertex_attributes, _DST, ("id",))
    starts = _widened(starts, edge_rows, vertex_rows, names, updates)
    iteration = (
        itf.BoundedIteration(_step_body(names, updates, target, stopping))
        .bind("paths", starts)
        .bind("found", starts.limit(0))
        .bind("edges", edge_rows)
        .bind("vertices", vertex_rows)
        .until(itf.max_rounds(max_hops))
    )
    return run_iteration(iteration, listen, run_options).outputs["found"]
