"""Community detection by label propagation, as GraphFrames' ``labelPropagation``.

Every vertex starts with its own id as label. In each round a vertex takes the
label that is most frequent among its own and its neighbours' labels (edges in
either direction; the smallest label on a tie, so the result does not depend on
task order). It stops when a round changes no label (a fixed point of the rule,
termination ``criteria_empty``) or after ``max_rounds``.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.components import undirected_edges
from iterflow.graph.model import as_graph, checked, graph_result, with_column


@itf.body
def adopt_majority_label(labels: DataFrame, edges: DataFrame, ctx: Any) -> itf.Declaration:
    """One round: every vertex takes the most frequent label around it, itself included."""
    heard = ctx.observe(
        "messages",
        edges.join(labels, edges["src"] == labels["id"]).select(
            edges["dst"].alias("id"), labels["label"]
        ),
    )
    votes = heard.unionByName(labels).groupBy("id", "label").count()
    best = votes.groupBy("id").agg(
        F.min(F.struct((-F.col("count")).alias("minus_count"), "label")).alias("best")
    )
    new_labels = ctx.cache(best.select("id", F.col("best.label").alias("label")))
    changed = ctx.observe("active", new_labels.join(labels, ["id", "label"], "left_anti"))
    return itf.Declaration(
        feedback={"labels": new_labels},
        outputs={"labels": new_labels, "changed": changed},
        until=itf.empty(changed),
    )


def label_propagation(
    graph: Any, *, max_rounds: int = 20, listen: Any = None, **run_options: Any
) -> Any:
    """The vertices of ``graph`` with a ``label`` column: their community.

    Each round's ``RoundProgress.observed`` has ``messages`` (labels heard) and
    ``active`` (vertices whose label changed). ``listen`` and ``run_options`` are
    as in ``connected_components``.

    Example::

        label_propagation(Graph(vertices, edges), max_rounds=10)
    """
    g = as_graph(graph)
    checked(g, "label_propagation()")
    iteration = (
        itf.BoundedIteration(adopt_majority_label)
        .bind("labels", g.vertices.select("id", F.col("id").alias("label")))
        .bind("edges", undirected_edges(g.edges))
        .until(itf.max_rounds(max_rounds))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    labels = iteration.run(**run_options).outputs["labels"]
    return graph_result(graph, with_column(g.vertices, labels, "label"))
