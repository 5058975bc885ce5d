"""Connected components by min-label propagation over active vertices only.

Each vertex starts with its own id as label. In every round only the vertices
whose label changed in the previous round (the *frontier*, all vertices at
round 0) send their label to their neighbours; a vertex that receives a smaller
label takes it and joins the next frontier. The iteration ends when a round
improves no label (termination ``criteria_empty``): the label of every vertex is
then the smallest id of its (weakly) connected component, as in GraphFrames.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.model import as_graph


def undirected_edges(edges: DataFrame) -> DataFrame:
    """Both directions of every edge, self-loops and duplicates dropped: ``src, dst``."""
    ends = edges.select("src", "dst").where(F.col("src") != F.col("dst"))
    flipped = ends.select(F.col("dst").alias("src"), F.col("src").alias("dst"))
    return ends.unionByName(flipped).distinct()


@itf.body
def propagate_min_label(
    labels: DataFrame, frontier: DataFrame, edges: DataFrame, ctx: Any
) -> itf.Declaration:
    """One round: the frontier sends its labels; improved vertices form the next frontier."""
    messages = ctx.observe(
        "messages",
        frontier.join(edges, frontier["id"] == edges["src"]).select(
            edges["dst"].alias("id"), frontier["component"]
        ),
    )
    best = messages.groupBy("id").agg(F.min("component").alias("candidate"))
    improved = (
        best.join(labels, "id")
        .where(F.col("candidate") < F.col("component"))
        .select("id", F.col("candidate").alias("component"))
    )
    better = improved.withColumnRenamed("component", "better")
    new_labels = labels.join(better, "id", "left").select(
        "id", F.coalesce("better", "component").alias("component")
    )
    return itf.Declaration(
        feedback={"labels": new_labels, "frontier": improved},
        outputs={"labels": new_labels},
        until=itf.empty(improved),
    )


def connected_components(
    graph: Any,
    *,
    max_rounds: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> DataFrame:
    """The vertices of ``graph`` with a ``component`` column: the smallest id in their
    weakly connected component.

    ``graph`` is an ``iterflow.graph.Graph`` or any object with ``.vertices`` and
    ``.edges`` (a GraphFrame). ``max_rounds`` bounds the rounds (the labels are
    then those reached so far); ``listen`` takes a listener called after every
    round, whose ``RoundEnd.progress.observed["messages"]`` counts the labels sent
    and ``rows["frontier"]`` the vertices that changed. Other keyword arguments go
    to ``BoundedIteration.run`` (``progress``, ``event_log``, ``checkpoint_dir``...).

    Example::

        components = connected_components(Graph(vertices, edges))
    """
    g = as_graph(graph)
    labels = g.vertices.select("id", F.col("id").alias("component"))
    iteration = (
        itf.BoundedIteration(propagate_min_label)
        .bind("labels", labels)
        .bind("frontier", labels)
        .bind("edges", undirected_edges(g.edges))
    )
    if max_rounds is not None:
        iteration = iteration.until(itf.max_rounds(max_rounds))
    if listen is not None:
        iteration = iteration.listen(listen)
    result = iteration.run(**run_options)
    return g.vertices.join(result.outputs["labels"], "id")
