"""Connected components by hooking and pointer jumping over a shrinking edge set.

Every vertex points to a *label* (at first itself). Each round works on the
edges between different labels only, the *workset*, as in Flink's delta
iterations:

1. hooking: for every workset edge, the endpoint whose label has the larger
   priority, and that label's own vertex, are pointed at the smaller label;
2. pointer jumping: every vertex points to its label's label, so chains halve;
3. the workset becomes the edges between the new labels, without duplicates and
   without the edges that now lie inside one label.

Priorities are a hash of the label (ties broken by the label), so the number of
rounds does not depend on how the ids happen to be ordered: a path of n vertices
takes about log2(n) rounds, whatever its ids. The iteration ends when a round
changes no label (termination ``criteria_empty``); every vertex of a weakly
connected component then has the same label, and ``component`` is the smallest
id among them, as in GraphFrames.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.model import as_graph, graph_result


def undirected_edges(edges: DataFrame) -> DataFrame:
    """Both directions of every edge, self-loops and duplicates dropped: ``src, dst``."""
    ends = edges.select("src", "dst").where(F.col("src") != F.col("dst"))
    flipped = ends.select(F.col("dst").alias("src"), F.col("src").alias("dst"))
    return ends.unionByName(flipped).distinct()


def _priority(label: Column) -> Column:
    return F.struct(F.xxhash64(label).alias("hash"), label.alias("label"))


@itf.body
def hook_and_jump(labels: DataFrame, workset: DataFrame, ctx: Any) -> itf.Declaration:
    """One round: hook across the workset edges, jump once, contract the workset."""
    ends = ctx.observe(
        "messages",
        workset.join(labels.select(F.col("id").alias("a"), F.col("label").alias("la")), "a").join(
            labels.select(F.col("id").alias("b"), F.col("label").alias("lb")), "b"
        ),
    )
    a_first = _priority(F.col("la")) < _priority(F.col("lb"))
    low = F.when(a_first, F.col("la")).otherwise(F.col("lb"))
    high_end = F.when(a_first, F.col("b")).otherwise(F.col("a"))
    high_label = F.when(a_first, F.col("lb")).otherwise(F.col("la"))
    hooks = (
        ends.select(high_end.alias("id"), low.alias("candidate"))
        .unionByName(ends.select(high_label.alias("id"), low.alias("candidate")))
        .groupBy("id")
        .agg(F.min(_priority(F.col("candidate"))).alias("best"))
    )
    hooked = labels.join(hooks, "id", "left").select(
        "id",
        F.when(
            F.col("best").isNotNull() & (F.col("best") < _priority(F.col("label"))),
            F.col("best.label"),
        )
        .otherwise(F.col("label"))
        .alias("label"),
    )
    parents = hooked.select(F.col("id").alias("label"), F.col("label").alias("jumped"))
    jumped = ctx.cache(hooked.join(parents, "label").select("id", F.col("jumped").alias("label")))
    moved = ctx.observe("active", jumped.join(labels, ["id", "label"], "left_anti"))
    relabelled = workset.join(
        jumped.select(F.col("id").alias("a"), F.col("label").alias("la")), "a"
    ).join(jumped.select(F.col("id").alias("b"), F.col("label").alias("lb")), "b")
    next_workset = (
        relabelled.where(F.col("la") != F.col("lb"))
        .select(F.least("la", "lb").alias("a"), F.greatest("la", "lb").alias("b"))
        .distinct()
    )
    return itf.Declaration(
        feedback={"labels": jumped, "workset": next_workset},
        outputs={"labels": jumped, "moved": moved},
        until=itf.empty(moved),
    )


def connected_components(
    graph: Any,
    *,
    max_rounds: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with a ``component`` column: the smallest id in their
    weakly connected component.

    ``graph`` is an ``iterflow.graph.Graph`` or any object with ``.vertices`` and
    ``.edges`` (a GraphFrame). ``max_rounds`` bounds the rounds (the labels are
    then those reached so far); ``listen`` takes a listener called after every
    round, whose ``RoundEnd.progress.observed`` has ``messages`` (the workset
    edges hooked across) and ``active`` (the vertices whose label changed). Other
    keyword arguments go to ``BoundedIteration.run`` (``progress``, ``event_log``,
    ``checkpoint_dir``...). Returns a DataFrame, or a GraphFrame when ``graph`` is one.

    Example::

        components = connected_components(Graph(vertices, edges))
    """
    g = as_graph(graph)
    ends = g.edges.where(F.col("src") != F.col("dst"))
    iteration = (
        itf.BoundedIteration(hook_and_jump)
        .bind("labels", g.vertices.select("id", F.col("id").alias("label")))
        .bind(
            "workset",
            ends.select(
                F.least("src", "dst").alias("a"), F.greatest("src", "dst").alias("b")
            ).distinct(),
        )
    )
    if max_rounds is not None:
        iteration = iteration.until(itf.max_rounds(max_rounds))
    if listen is not None:
        iteration = iteration.listen(listen)
    labels = iteration.run(**run_options).outputs["labels"]
    smallest = labels.groupBy("label").agg(F.min("id").alias("component"))
    components = labels.join(smallest, "label").select("id", "component")
    return graph_result(graph, g.vertices.join(components, "id"))
