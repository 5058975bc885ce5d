"""Strongly connected components by forward and backward coloring.

Every vertex belongs to a *class* (at first one class holds them all) and carries
two colors: ``fwd``, the smallest id that reaches it, and ``bwd``, the smallest id
it reaches, both along edges inside its class. The rounds alternate between two
kinds:

- a *coloring* round takes one step of both propagations: ``fwd`` flows along
  the edges, ``bwd`` against them, each vertex keeping the smallest color it
  hears. Coloring rounds go on until one changes no color;
- once a round changes no color, the next one first *splits*: it makes every
  ``(fwd, bwd)`` pair a class of its own, resets the colors to the vertices' own
  ids, and then takes its coloring step.

Two vertices of one strongly connected component reach each other, so they
always have the same colors and never part. A class that no longer splits is a
component: its smallest id ``m`` reaches every member (it is every member's
``fwd``) and every member reaches ``m`` (it is every member's ``bwd``). The
iteration stops at the first split that splits nothing (termination
``converged``), and a component is named by its smallest id, as in GraphX.

A path takes one split: its vertices all differ in ``bwd``. A round reads the
kind of round to run from a one-row ``status`` variable, held on the driver.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.graphs import GraphError, as_graph, checked, graph_result, with_column

#: The status variable: the colors the last round changed (0: split next), the
#: number of classes, the splits done so far, and 0 once the classes are final.
STATUS_SCHEMA = "changed LONG, classes LONG, splits LONG, unsettled LONG"


def _colored(colors: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> DataFrame:
    """One coloring step: every vertex takes the smallest color it hears inside its class."""
    ends = edges.join(
        colors.select(
            F.col("id").alias("src"), F.col("class").alias("c_src"), F.col("fwd").alias("heard")
        ),
        "src",
    ).join(
        colors.select(
            F.col("id").alias("dst"), F.col("class").alias("c_dst"), F.col("bwd").alias("told")
        ),
        "dst",
    )
    inside = ends.where(F.col("c_src").eqNullSafe(F.col("c_dst")))
    messages = ctx.observe(
        "messages",
        inside.select(F.col("dst").alias("id"), "heard", F.lit(None).alias("told")).unionByName(
            inside.select(F.col("src").alias("id"), F.lit(None).alias("heard"), "told")
        ),
    )
    heard = messages.groupBy("id").agg(F.min("heard").alias("heard"), F.min("told").alias("told"))
    return colors.join(heard, "id", "left").select(
        "id",
        "class",
        F.least("fwd", "heard").alias("fwd"),
        F.least("bwd", "told").alias("bwd"),
    )


def coloring_body(max_splits: int | None) -> itf.IterationBody:
    """The SCC body; after ``max_splits`` splits (if given) the classes are final."""

    @itf.body
    def color_or_split(
        colors: DataFrame, status: DataFrame, edges: DataFrame, ctx: itf.RoundContext
    ) -> itf.Declaration:
        """A coloring round, after a split when the last round changed no color."""
        return _round(colors, status, edges, ctx, max_splits)

    return color_or_split


def _round(
    colors: DataFrame,
    status: DataFrame,
    edges: DataFrame,
    ctx: itf.RoundContext,
    max_splits: int | None,
) -> itf.Declaration:
    last = status.first()  # one row, already materialized: no extra job
    assert last is not None
    split = not last["changed"]
    if split:  # the colors settled last round: every (fwd, bwd) pair becomes a class
        colors = colors.select(
            "id",
            F.struct(F.col("fwd").alias("fwd"), F.col("bwd").alias("bwd")).alias("class"),
            F.col("id").alias("fwd"),
            F.col("id").alias("bwd"),
        )
    new_colors = ctx.cache(_colored(colors, edges, ctx))
    changed = ctx.observe("active", new_colors.join(colors, ["id", "fwd", "bwd"], "left_anti")).agg(
        F.count(F.lit(1)).alias("changed")
    )
    splits = last["splits"] + int(split)
    if split:
        classes = new_colors.agg(F.count_distinct("class").alias("classes"))
        bounded = max_splits is not None and splits >= max_splits
        unsettled = F.lit(0) if bounded else F.col("classes") - F.lit(last["classes"])
    else:
        classes = status.select("classes")
        unsettled = F.lit(1)
    new_status = changed.crossJoin(classes).select(
        "changed",
        F.col("classes").cast("long").alias("classes"),
        F.lit(splits).cast("long").alias("splits"),
        unsettled.cast("long").alias("unsettled"),
    )
    return itf.Declaration(
        feedback={"colors": new_colors, "status": new_status},
        outputs={"colors": new_colors, "status": new_status},
        until=itf.converged(new_status.select("unsettled"), 0.0),
    )


def strongly_connected_components(
    graph: Any,
    *,
    max_splits: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with a ``component`` column: the smallest id of their
    strongly connected component (the vertices that they reach and that reach them).

    ``max_splits`` bounds the split rounds: the iteration then stops after that
    many (reason ``converged``) and a component is a class reached so far, which
    may join several components. Each coloring round's
    ``RoundProgress.observed`` has ``messages`` (colors sent along edges inside a
    class) and ``active`` (vertices whose colors changed). ``listen`` and
    ``run_options`` are as in ``connected_components``. Returns a DataFrame, or a
    GraphFrame when ``graph`` is one.

    Example::

        components = strongly_connected_components(Graph(vertices, edges))
    """
    g = as_graph(graph)
    if max_splits is not None and max_splits < 1:
        raise GraphError(f"strongly_connected_components(max_splits={max_splits}) must be >= 1")
    checked(g, "strongly_connected_components()")
    spark = g.vertices.sparkSession
    id_type = g.vertices.schema["id"].dataType
    colors = g.vertices.select(
        "id",
        F.struct(
            F.lit(None).cast(id_type).alias("fwd"), F.lit(None).cast(id_type).alias("bwd")
        ).alias("class"),
        F.col("id").alias("fwd"),
        F.col("id").alias("bwd"),
    )
    iteration = (
        itf.BoundedIteration(coloring_body(max_splits))
        .bind("colors", colors)
        .bind("status", spark.createDataFrame([(1, 1, 0, 1)], STATUS_SCHEMA))
        .bind("edges", g.edges.select("src", "dst").where(F.col("src") != F.col("dst")).distinct())
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    final = iteration.run(**run_options).outputs["colors"]
    # After the last split every class holds its smallest id as both colors.
    components = final.select("id", F.col("class.fwd").alias("component"))
    return graph_result(graph, with_column(g.vertices, components, "component"))
