"""Community detection by label propagation, as GraphFrames' ``labelPropagation``.

Every vertex starts with its own id as label. In each round a vertex takes the
label that is most frequent among its own and its neighbours' labels (edges in
either direction; the smallest label on a tie, so the result does not depend on
task order). It stops when a round changes no label (a fixed point of the rule,
termination ``criteria_empty``) or after ``max_rounds``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph import block_runner
from iterflow.graph.block_edges import EdgeFile, first_of_runs
from iterflow.graph.block_kernels import LabelKernels, Partial, Received, Slice
from iterflow.graph.components import undirected_edges
from iterflow.graph.graphs import as_graph, graph_result, run_iteration, with_column
from iterflow.graph.methods import choose_method


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


# -- the block path --------------------------------------------------------------------


@attrs.frozen
class MajorityKernels(LabelKernels):
    """Every vertex sends its label along every edge, and takes the majority of its own and
    those heard (the smallest label on a tie: the smallest id, as on the DataFrame path)."""

    state: ClassVar[dict[str, pa.DataType]] = {"label": pa.int64()}

    def first(self, block: int) -> Slice:
        return {"label": self.own_labels(block)}

    def send(self, edges: EdgeFile, block: int, state: Slice) -> Iterator[Partial]:
        label = state["label"]
        self.messages.inc(len(edges.so))
        for d in range(edges.blocks):
            into = edges.into(d)
            if into.stop > into.start:
                yield Partial(d, label[edges.so[into]], edges.do[into])

    def receive(self, block: int, heard: Received) -> Slice:
        new = majority(heard.own, list(heard.at_offsets()))
        self.active.inc(int(np.count_nonzero(new != heard.own)))
        return {"label": new}


def majority(own: np.ndarray, heard: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Every offset's most frequent label among its own and those heard (the smallest on a
    tie)."""
    offsets = np.concatenate([np.arange(len(own))] + [h[0] for h in heard])
    labels = np.concatenate([own] + [h[1] for h in heard])
    order = np.lexsort((labels, offsets))
    offsets, labels = offsets[order], labels[order]
    starts = first_of_runs(offsets, labels)
    counts = np.diff(np.append(np.flatnonzero(starts), len(offsets)))
    offsets, labels = offsets[starts], labels[starts]
    order = np.lexsort((labels, -counts, offsets))
    offsets, labels = offsets[order], labels[order]
    best = first_of_runs(offsets)
    new = own.copy()
    new[offsets[best]] = labels[best]
    return new


def _block_labels(
    g: Any, n: int, blocks: int | None, max_rounds: int, listen: Any, run_options: Any
) -> DataFrame:
    rounds = block_runner.Rounds(
        name="label_propagation_blocks",
        variable="labels",
        who="label_propagation()",
        stop=(itf.max_rounds(max_rounds), itf.until(block_runner.settled)),
    )
    return block_runner.run_labels(
        g, n, blocks, MajorityKernels, rounds, "label", listen, run_options
    )


def label_propagation(
    graph: Any,
    *,
    max_rounds: int = 20,
    method: str = "auto",
    blocks: int | None = None,
    listen: Any = None,
    **run_options: Any,
) -> Any:
    """The vertices of ``graph`` with a ``label`` column: their community.

    Each round's ``RoundProgress.observed`` has ``messages`` (labels heard) and
    ``active`` (vertices whose label changed). ``listen`` and ``run_options`` are
    as in ``connected_components``.

    Example::

        label_propagation(Graph(vertices, edges), max_rounds=10)
    """
    g = as_graph(graph)
    method, n = choose_method("label_propagation", method, g, below_limit="dataframe")
    if method == "blocks":
        labels = _block_labels(g, n, blocks, max_rounds, listen, run_options)
    else:
        iteration = (
            itf.BoundedIteration(adopt_majority_label)
            .bind("labels", g.vertices.select("id", F.col("id").alias("label")))
            .bind("edges", undirected_edges(g.edges))
            .until(itf.max_rounds(max_rounds))
        )
        labels = run_iteration(iteration, listen, run_options).outputs["labels"]
    return graph_result(graph, with_column(g.vertices, labels, "label"))
