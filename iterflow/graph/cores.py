"""Core numbers (GraphFrames' ``k_core``) and a maximal independent set
(``maximal_independent_set``), each an iteration over the undirected simple graph
(edges in either direction, self-loops and repeated edges dropped).

Core numbers follow Mandal and Al Hasan's distributed k-core decomposition (the
algorithm GraphFrames names): every vertex starts at its degree and each round lowers
its estimate to the h-index of its neighbours' estimates (the largest h such that h
neighbours have estimates of at least h), until no estimate changes; the fixed point is
the core number, as ``networkx.core_number`` computes it.

The independent set is Luby's rule with priorities fixed by a seeded hash of the id:
each round, every undecided vertex whose priority is lower than all its undecided
neighbours' joins the set and its neighbours leave; the result is the set a sequential
greedy pass in priority order picks, the same for a seed on any cluster.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.components import undirected_edges
from iterflow.graph.graphs import as_graph, run_iteration


def _h_index(estimates: Column) -> Column:
    """The h-index of an array of estimates: how many of them, sorted from the largest,
    are at least their 1-based position."""
    ordered = F.sort_array(estimates, asc=False)
    return F.size(F.filter(ordered, lambda c, i: c >= i + 1))


@itf.body
def lower_estimates(cores: DataFrame, edges: DataFrame, ctx: Any) -> itf.Declaration:
    """One round: every vertex's estimate becomes at most its neighbours' h-index."""
    heard = ctx.observe(
        "messages",
        edges.join(cores, edges["src"] == cores["id"]).select(
            edges["dst"].alias("id"), cores["kcore"].alias("heard")
        ),
    )
    bound = heard.groupBy("id").agg(_h_index(F.collect_list("heard")).alias("bound"))
    lowered = cores.join(bound, "id", "left").select(
        "id", F.least("kcore", F.coalesce("bound", "kcore")).alias("kcore")
    )
    new_cores = ctx.cache(lowered)
    changed = ctx.observe("active", new_cores.join(cores, ["id", "kcore"], "left_anti"))
    return itf.Declaration(
        feedback={"cores": new_cores},
        outputs={"cores": new_cores},
        until=itf.empty(changed),
    )


def k_core(graph: Any, *, listen: Any = None, **run_options: Any) -> DataFrame:
    """``id`` and ``kcore`` (int): every vertex's core number, the largest k such that it
    lies in a subgraph where every vertex has at least k neighbours (0 for an isolated
    vertex). Edges count in either direction, once per pair of vertices."""
    g = as_graph(graph)
    edges = undirected_edges(g.edges)
    degrees = edges.groupBy(F.col("src").alias("id")).agg(F.count(F.lit(1)).alias("degree"))
    start = g.vertices.select("id").join(degrees, "id", "left")
    start = start.select("id", F.coalesce("degree", F.lit(0)).cast("int").alias("kcore"))
    iteration = (
        itf.BoundedIteration(lower_estimates)
        .bind("cores", start)
        .bind("edges", edges)
        .until(itf.max_rounds(2**31 - 1))
    )
    return run_iteration(iteration, listen, run_options).outputs["cores"]


def _priority(seed: int) -> Column:
    return F.struct(F.xxhash64(F.col("id"), F.lit(seed)).alias("hash"), F.col("id"))


@itf.body
def join_local_minima(
    undecided: DataFrame, chosen: DataFrame, edges: DataFrame, ctx: Any
) -> itf.Declaration:
    """One round: undecided vertices below all undecided neighbours join; their
    neighbours are decided out."""
    a, b = undecided.alias("a"), undecided.alias("b")
    beaten = (
        edges.join(a, F.col("src") == F.col("a.id"))
        .join(b, F.col("dst") == F.col("b.id"))
        .where(F.col("b.priority") < F.col("a.priority"))
        .select(F.col("src").alias("id"))
    )
    joining = ctx.cache(undecided.join(beaten, "id", "left_anti"))
    out = edges.join(joining, edges["src"] == joining["id"]).select(edges["dst"].alias("id"))
    remaining = ctx.cache(undecided.join(joining, "id", "left_anti").join(out, "id", "left_anti"))
    ctx.observe("active", remaining)
    now_chosen = ctx.cache(chosen.unionByName(joining.select("id")))
    return itf.Declaration(
        feedback={"undecided": remaining, "chosen": now_chosen},
        outputs={"chosen": now_chosen},
        until=itf.empty(remaining),
    )


def maximal_independent_set(
    graph: Any, *, seed: int = 42, listen: Any = None, **run_options: Any
) -> DataFrame:
    """The vertices of a maximal independent set of ``graph`` (no two joined by an edge,
    and every other vertex has a neighbour in it), with every vertex column and
    ``selected`` (true): the set a greedy pass in the order of a hash of ``seed`` and
    the id picks. Isolated vertices are always in it."""
    g = as_graph(graph)
    edges = undirected_edges(g.edges)
    iteration = (
        itf.BoundedIteration(join_local_minima)
        .bind("undecided", g.vertices.select("id", _priority(seed).alias("priority")))
        .bind("chosen", g.vertices.select("id").limit(0))
        .bind("edges", edges)
        .until(itf.max_rounds(2**31 - 1))
    )
    chosen = run_iteration(iteration, listen, run_options).outputs["chosen"]
    return g.vertices.join(chosen, "id", "left_semi").withColumn("selected", F.lit(True))
