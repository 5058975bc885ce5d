"""iterflow.graph.GraphFrame, GraphFrames' API: results against networkx and numpy
references, column names and types against GraphFrames' documented ones."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import numpy as np
import pytest
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, MapType, StringType

from iterflow.graph import Graph, GraphError, GraphFrame, Pregel

# A directed graph with a self-loop, a duplicate edge, a dangling vertex (5) and
# an isolated one (6).
PAIRS = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 3), (1, 5), (3, 3), (0, 1), (4, 0)]
IDS = list(range(7))


def frame(spark, pairs=PAIRS, ids=IDS) -> GraphFrame:
    return GraphFrame(
        spark.createDataFrame([(v, f"v{v}") for v in ids], "id long, name string"),
        spark.createDataFrame(
            [(a, b, k) for k, (a, b) in enumerate(pairs)], "src long, dst long, k long"
        ),
    )


def graphx_pagerank(ids, pairs, reset, rounds, source=None) -> dict[int, float]:
    """GraphX's PageRank.runWithOptions in numpy: every copy of an edge carries rank,
    dangling rank is lost, and the ranks are rescaled to sum to n (1 when personalized)."""
    at = {v: i for i, v in enumerate(ids)}
    n = len(ids)
    out = np.zeros(n)
    for a, _ in pairs:
        out[at[a]] += 1
    jump = np.ones(n) if source is None else np.eye(n)[at[source]]
    x = jump.copy()
    for _ in range(rounds):
        heard = np.zeros(n)
        for a, b in pairs:
            heard[at[b]] += x[at[a]] / out[at[a]]
        x = reset * jump + (1 - reset) * heard
    x *= (n if source is None else 1.0) / x.sum()
    return {v: float(x[at[v]]) for v in ids}


def test_bad_graphs_and_arguments_are_graph_errors(spark):
    with pytest.raises(GraphError, match="'id'"):
        GraphFrame(
            spark.createDataFrame([(1,)], "v long"),
            spark.createDataFrame([(1, 1)], "src long, dst long"),
        )
    g = frame(spark)
    with pytest.raises(GraphError, match="exactly one of maxIter"):
        g.pageRank(resetProbability=0.15)
    with pytest.raises(GraphError, match="exactly one of maxIter"):
        g.pageRank(maxIter=3, tol=0.01)
    with pytest.raises(GraphError, match="bigint"):
        g.shortestPaths(landmarks=["a"])
    with pytest.raises(GraphError, match="algorithm"):
        g.connectedComponents(algorithm="magic")
    with pytest.raises(GraphError, match="from_expr"):
        g.bfs("no_such_column = 1", "id = 2")
    with pytest.raises(GraphError, match="aggMsgs"):
        g.pregel.withVertexColumn("x", F.lit(0), F.lit(0)).sendMsgToDst(F.lit(1)).run()
    # Any object with .vertices and .edges is wrapped, a Graph included.
    assert GraphFrame.of(Graph(g.vertices, g.edges)).vertices is g.vertices
    assert GraphFrame.of(g) is g


def test_degrees_and_triplets_have_graphframes_columns(spark):
    g = frame(spark)
    reference = nx.MultiDiGraph(PAIRS)
    out_degrees = g.outDegrees
    assert out_degrees.schema["outDegree"].dataType == IntegerType()
    assert {r["id"]: r["outDegree"] for r in out_degrees.collect()} == {
        v: d for v, d in reference.out_degree() if d
    }
    assert {r["id"]: r["inDegree"] for r in g.inDegrees.collect()} == {
        v: d for v, d in reference.in_degree() if d
    }
    assert {r["id"]: r["degree"] for r in g.degrees.collect()} == {
        v: d for v, d in reference.degree() if d
    }
    triplets = g.triplets
    assert triplets.columns == ["src", "edge", "dst"]
    assert sorted(
        (r["src"]["name"], r["edge"]["k"], r["dst"]["id"]) for r in triplets.collect()
    ) == sorted((f"v{a}", k, b) for k, (a, b) in enumerate(PAIRS))


@pytest.mark.parametrize(
    ("source", "method"), [(None, "arrow"), (2, "arrow"), (None, "dataframe"), (2, "dataframe")]
)
def test_pagerank_follows_graphx_formula_with_graphframes_columns(spark, source, method):
    g = frame(spark)
    result = g.pageRank(
        resetProbability=0.2, sourceId=source, maxIter=12, method=method, progress=False
    )
    assert isinstance(result, GraphFrame)
    assert result.vertices.columns == ["id", "name", "pagerank"]
    assert result.vertices.schema["pagerank"].dataType == DoubleType()
    assert result.edges.columns == ["src", "dst", "k", "weight"]
    assert result.edges.schema["weight"].dataType == DoubleType()
    expected = graphx_pagerank(IDS, PAIRS, 0.2, 12, source)
    got = {r["id"]: r["pagerank"] for r in result.vertices.collect()}
    assert got == pytest.approx(expected, abs=1e-9)
    assert sum(got.values()) == pytest.approx(len(IDS) if source is None else 1.0)
    out = nx.MultiDiGraph(PAIRS).out_degree()
    assert {r["k"]: r["weight"] for r in result.edges.collect()} == {
        k: 1.0 / out[a] for k, (a, _) in enumerate(PAIRS)
    }


def test_pagerank_until_tol_is_networkx_times_n_on_an_undirected_graph(spark):
    # Without dangling vertices and duplicate edges the two normalizations differ by n.
    undirected = nx.cycle_graph(6)
    undirected.add_edges_from([(0, 3), (1, 4)])
    pairs = [(a, b) for a, b in undirected.edges()] + [(b, a) for a, b in undirected.edges()]
    g = frame(spark, pairs, list(range(6)))
    seen = []
    ranks = g.pageRank(resetProbability=0.5, tol=1e-7, listen=seen.append, progress=False)
    expected = nx.pagerank(undirected, alpha=0.5, tol=1e-12)
    got = {r["id"]: r["pagerank"] for r in ranks.vertices.collect()}
    assert got == pytest.approx({v: 6 * p for v, p in expected.items()}, abs=1e-6)
    assert len(seen) > 1  # the listener heard every round


def test_parallel_personalized_pagerank_gives_one_vector_entry_per_source(spark):
    g = frame(spark)
    result = g.parallelPersonalizedPageRank(
        resetProbability=0.15, sourceIds=[0, 4], maxIter=6, progress=False
    )
    assert result.vertices.schema["pageranks"].dataType == VectorUDT()
    assert "weight" in result.edges.columns
    got = {r["id"]: r["pageranks"].toArray() for r in result.vertices.collect()}
    for i, source in enumerate([0, 4]):
        expected = graphx_pagerank(IDS, PAIRS, 0.15, 6, source)
        assert {v: float(ranks[i]) for v, ranks in got.items()} == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow_spark)])
def test_components_match_networkx_with_long_component_ids(spark, seed):
    rng = random.Random(seed)
    pairs = [(rng.randrange(14), rng.randrange(14)) for _ in range(16)]
    g = frame(spark, pairs, list(range(16)))
    reference = nx.MultiDiGraph()
    reference.add_nodes_from(range(16))
    reference.add_edges_from(pairs)
    weak = g.connectedComponents(progress=False)
    assert weak.columns == ["id", "name", "component"]
    assert weak.schema["component"].dataType == LongType()
    assert {r["id"]: r["component"] for r in weak.collect()} == {
        v: min(c) for c in nx.weakly_connected_components(reference) for v in c
    }
    seen = []
    strong = g.stronglyConnectedComponents(maxIter=10, listen=seen.append, progress=False)
    assert strong.schema["component"].dataType == LongType()
    assert {r["id"]: r["component"] for r in strong.collect()} == {
        v: min(c) for c in nx.strongly_connected_components(reference) for v in c
    }
    assert seen[-1].progress.observed["active"] is not None


def test_components_of_string_ids_are_numbered_with_longs(spark):
    vertices = spark.createDataFrame([(v,) for v in "abcde"], "id string")
    edges = spark.createDataFrame([("a", "b"), ("c", "d"), ("d", "c")], "src string, dst string")
    g = GraphFrame(vertices, edges)
    components = {r["id"]: r["component"] for r in g.connectedComponents(progress=False).collect()}
    assert g.connectedComponents(progress=False).schema["component"].dataType == LongType()
    parts = [{"a", "b"}, {"c", "d"}, {"e"}]
    assert all(len({components[v] for v in part}) == 1 for part in parts)
    assert len(set(components.values())) == 3
    labels = g.connectedComponents(useLabelsAsComponents=True, progress=False)
    assert labels.schema["component"].dataType == StringType()


@pytest.mark.parametrize("directed", [True, False])
def test_shortest_paths_match_networkx_as_a_map_of_ints(spark, directed):
    g = frame(spark)
    distances = g.shortestPaths(landmarks=[0, 3], is_directed=directed, progress=False)
    assert (
        distances.schema["distances"].dataType.simpleString()
        == MapType(LongType(), IntegerType()).simpleString()
    )
    reference = nx.DiGraph(PAIRS) if directed else nx.Graph(PAIRS)
    reference.add_nodes_from(IDS)
    expected = {
        v: {
            m: nx.shortest_path_length(reference, v, m)
            for m in (0, 3)
            if nx.has_path(reference, v, m)
        }
        for v in IDS
    }
    assert {r["id"]: dict(r["distances"]) for r in distances.collect()} == expected


def test_label_propagation_labels_are_long_ids_constant_on_cliques(spark):
    cliques = nx.disjoint_union(nx.complete_graph(4), nx.complete_graph(3))
    pairs = list(cliques.edges())
    labels = frame(spark, pairs, list(range(7))).labelPropagation(maxIter=5, progress=False)
    assert labels.schema["label"].dataType == LongType()
    got = {r["id"]: r["label"] for r in labels.collect()}
    for part in nx.connected_components(cliques):
        assert len({got[v] for v in part}) == 1
        assert got[min(part)] in part


def _paths(rows) -> list[tuple]:
    """Each BFS row as its vertex ids and edge keys, in path order."""
    return sorted(
        tuple(
            r[c]["id"] if c in ("from", "to") or c.startswith("v") else r[c]["k"]
            for c in r.asDict()
        )
        for r in rows
    )


def test_bfs_returns_every_shortest_path_as_networkx(spark):
    rng = random.Random(7)
    pairs = [(rng.randrange(12), rng.randrange(12)) for _ in range(30)]
    pairs += [pairs[0]]  # a parallel edge gives a path of its own
    g = frame(spark, pairs, list(range(12)))
    found = g.bfs("id = 0", "id IN (7, 9)", progress=False)
    reference = nx.MultiDiGraph()
    reference.add_nodes_from(range(12))
    reference.add_edges_from((a, b, k) for k, (a, b) in enumerate(pairs))
    lengths = {
        t: nx.shortest_path_length(reference, 0, t) for t in (7, 9) if nx.has_path(reference, 0, t)
    }
    best = min(lengths.values())
    expected = []
    for t in (t for t, d in lengths.items() if d == best):
        for path in nx.all_shortest_paths(reference, 0, t):
            steps = [[k for k in reference[a][b]] for a, b in itertools.pairwise(path)]
            for keys in itertools.product(*steps):
                row = [path[0]]
                for key, vertex in zip(keys, path[1:], strict=True):
                    row += [key, vertex]
                expected.append(tuple(row))
    assert found.columns[0] == "from" and found.columns[-1] == "to"
    assert found.columns[1:-1] == [c for i in range(best) for c in (f"e{i}", f"v{i + 1}")][:-1]
    assert found.schema["e0"].dataType.names == ["src", "dst", "k"]
    assert _paths(found.collect()) == sorted(expected)


def test_bfs_zero_hop_edge_filter_and_no_path(spark):
    g = frame(spark)
    same = g.bfs("id = 3", "name = 'v3'", progress=False)
    assert same.columns == ["from", "to"] and [r["to"]["id"] for r in same.collect()] == [3]
    # Without the edge 2 -> 3 the only way from 0 to 4 is gone.
    assert g.bfs("id = 0", "id = 4", edgeFilter="k != 3", progress=False).collect() == []
    assert g.bfs("id = 0", "id = 6", progress=False).columns == ["id", "name"]


def test_pregel_builder_runs_graphframes_pagerank_example(spark):
    # The PageRank example of GraphFrames' Pregel, on a graph without dangling vertices.
    pairs = [(0, 1), (1, 2), (2, 4), (2, 0), (3, 4), (4, 0), (4, 2)]
    n, alpha = 5, 0.15
    base = frame(spark, pairs, list(range(n)))
    g = GraphFrame(base.vertices.join(base.outDegrees, "id"), base.edges)
    ranks = (
        g.pregel.setMaxIter(5)
        .withVertexColumn(
            "rank",
            F.lit(1.0 / n),
            F.coalesce(Pregel.msg(), F.lit(0.0)) * F.lit(1.0 - alpha) + F.lit(alpha / n),
        )
        .sendMsgToDst(Pregel.src("rank") / Pregel.src("outDegree"))
        .aggMsgs(F.sum(Pregel.msg()))
        .run(progress=False)
    )
    assert ranks.columns == ["id", "name", "outDegree", "rank"]
    x = np.full(n, 1.0 / n)
    out = np.bincount([a for a, _ in pairs], minlength=n)
    for _ in range(5):
        heard = np.zeros(n)
        for a, b in pairs:
            heard[b] += x[a] / out[a]
        x = heard * (1 - alpha) + alpha / n
    assert {r["id"]: r["rank"] for r in ranks.collect()} == pytest.approx(dict(enumerate(x)))


def test_pregel_builder_stops_early_with_graphframes_references(spark):
    # Min-label propagation both ways: connected components, with struct references.
    g = frame(spark)
    rounds = []
    labels = (
        g.pregel.setMaxIter(50)
        .setEarlyStopping(True)
        .setSkipMessagesFromNonActiveVertices(True)
        .withVertexColumn("label", F.col("id"), F.least("label", F.col("_pregel_msg_")))
        .setUpdateActiveVertexExpression(
            F.coalesce(F.col("_pregel_msg_") < F.col("label"), F.lit(False))
        )
        .sendMsgToDst(F.when(F.col("src.label") < F.col("dst.label"), F.col("src.label")))
        .sendMsgToSrc(F.when(F.col("dst.label") < F.col("src.label"), F.col("dst.label")))
        .aggMsgs(F.min(F.col("_pregel_msg_")))
        .run(listen=rounds.append, progress=False)
    )
    reference = nx.Graph(PAIRS)
    reference.add_nodes_from(IDS)
    assert {r["id"]: r["label"] for r in labels.collect()} == {
        v: min(c) for c in nx.connected_components(reference) for v in c
    }
    assert len(rounds) < 50
