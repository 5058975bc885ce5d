"""iterflow.graph against networkx: the data model, its errors, connected components."""

from __future__ import annotations

import random
from collections import Counter

import networkx as nx
import pytest

from iterflow.graph import (
    Graph,
    GraphError,
    as_graph,
    connected_components,
    label_propagation,
    pagerank,
    shortest_paths,
)


def random_graph(spark, seed: int, vertices: int, edges: int):
    """Directed random edges with self-loops and duplicates, plus isolated vertices."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(vertices), rng.randrange(vertices)) for _ in range(edges)]
    pairs += [(3, 3), pairs[0]]  # a self-loop and a duplicate
    ids = list(range(vertices + 5))  # the last 5 have no edges
    g = Graph(
        spark.createDataFrame([(v, f"v{v}") for v in ids], "id long, name string"),
        spark.createDataFrame(pairs, "src long, dst long"),
    )
    reference = nx.DiGraph()
    reference.add_nodes_from(ids)
    reference.add_edges_from(pairs)
    return g, reference


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_connected_components_match_networkx(spark, seed):
    g, reference = random_graph(spark, seed, vertices=60, edges=45)
    rows = connected_components(g, progress=False).collect()
    expected = {
        v: min(component)
        for component in nx.weakly_connected_components(reference)
        for v in component
    }
    assert {r["id"]: r["component"] for r in rows} == expected
    assert {r["id"]: r["name"] for r in rows} == {v: f"v{v}" for v in expected}  # kept


def test_only_active_vertices_send_messages(spark):
    n = 40
    path = Graph(
        spark.createDataFrame([(v,) for v in range(n)], "id long"),
        spark.createDataFrame([(v, v + 1) for v in range(n - 1)], "src long, dst long"),
    )
    seen = []
    rows = connected_components(path, listen=lambda end: seen.append(end.progress), progress=False)
    assert {r["component"] for r in rows.collect()} == {0}
    messages = [p.observed["messages"] for p in seen]
    frontier = [p.rows["frontier"] for p in seen]
    # Round 0: every vertex sends. After round k-1 the vertices k..n-1 have improved (each
    # took its left neighbour's label), so round k sends 2 (n - k) - 1 labels: the
    # frontier shrinks by one vertex per round, where sending from every vertex would
    # cost 2 (n - 1) labels every round.
    assert messages[0] == 2 * (n - 1)
    expected = [2 * (n - k) - 1 for k in range(1, len(seen))]
    assert messages[1:-1] == expected[:-1]
    # The last round improves nothing, and AQE may skip evaluating its one message:
    # ctx.observe then reports None rather than a partial count.
    assert messages[-1] in (expected[-1], None)
    assert frontier == [n - 1 - k for k in range(len(seen))]
    assert len(seen) == n and frontier[-1] == 0
    assert sum(m or 0 for m in messages) < 0.55 * len(seen) * 2 * (n - 1)


def test_graph_shaped_objects_are_accepted_and_missing_columns_named(spark):
    class GraphFrameLike:
        vertices = spark.createDataFrame([(1,), (2,)], "id long")
        edges = spark.createDataFrame([(1, 2)], "src long, dst long")

    assert as_graph(GraphFrameLike()).edges.count() == 1
    with pytest.raises(GraphError, match=r"vertices DataFrame has no column\(s\) 'id'"):
        Graph(spark.createDataFrame([(1,)], "vid long"), GraphFrameLike.edges)
    with pytest.raises(GraphError, match=r"edges DataFrame has no column\(s\) 'src', 'dst'"):
        Graph(GraphFrameLike.vertices, spark.createDataFrame([(1, 2)], "a long, b long"))
    with pytest.raises(GraphError, match=r"an object with \.vertices and \.edges"):
        connected_components(object())
    with pytest.raises(GraphError, match="must have one type"):
        Graph(
            GraphFrameLike.vertices, spark.createDataFrame([("1", "2")], "src string, dst string")
        )


@pytest.mark.parametrize("seed", [1, 2])
def test_shortest_paths_to_landmarks_match_networkx(spark, seed):
    g, reference = random_graph(spark, seed, vertices=50, edges=80)
    landmarks = [0, 7, 53]  # 53 is isolated: only itself reaches it
    rows = shortest_paths(g, landmarks, progress=False).collect()
    backwards = reference.reverse()
    expected = {v: {} for v in reference.nodes}
    for landmark in landmarks:
        for v, d in nx.single_source_shortest_path_length(backwards, landmark).items():
            expected[v][landmark] = d
    assert {r["id"]: dict(r["distances"]) for r in rows} == expected


def majority_rule(graph: nx.Graph, labels: dict) -> dict:
    """One synchronous round of the rule, in plain Python: the most frequent label among a
    vertex's own and its neighbours' (the smallest on a tie)."""
    new = {}
    for v in graph.nodes:
        votes = Counter([labels[v]] + [labels[u] for u in graph.neighbors(v) if u != v])
        new[v] = min(votes.items(), key=lambda item: (-item[1], item[0]))[0]
    return new


def test_label_propagation_ends_on_a_fixed_point_and_finds_two_cliques(spark):
    left, right = range(0, 6), range(6, 12)
    pairs = [(a, b) for group in (left, right) for a in group for b in group if a < b]
    pairs.append((5, 6))  # one bridge
    g = Graph(
        spark.createDataFrame([(v,) for v in range(12)], "id long"),
        spark.createDataFrame(pairs, "src long, dst long"),
    )
    seen = []
    rows = label_propagation(g, listen=lambda end: seen.append(end.progress), progress=False)
    labels = {r["id"]: r["label"] for r in rows.collect()}
    reference = nx.Graph(pairs)
    assert majority_rule(reference, labels) == labels  # a fixed point of the rule
    assert len({labels[v] for v in left}) == 1 and len({labels[v] for v in right}) == 1
    assert labels[0] != labels[11]
    assert seen[-1].criteria_empty is True  # it stopped because nothing changed
    assert seen[0].observed["messages"] == 2 * len(pairs)


@pytest.mark.parametrize("seed", [4, 5])
def test_label_propagation_matches_the_rule_round_by_round(spark, seed):
    g, directed = random_graph(spark, seed, vertices=30, edges=40)
    reference = nx.Graph(directed)
    reference.remove_edges_from(nx.selfloop_edges(reference))
    rounds = 3
    rows = label_propagation(g, max_rounds=rounds, progress=False).collect()
    expected = {v: v for v in reference.nodes}
    for _ in range(rounds):
        following = majority_rule(reference, expected)
        if following == expected:
            break
        expected = following
    assert {r["id"]: r["label"] for r in rows} == expected


@pytest.mark.parametrize("seed", [1, 2])
def test_pagerank_matches_networkx_with_self_loops_duplicates_and_dangling(spark, seed):
    g, reference = random_graph(spark, seed, vertices=40, edges=90)
    rows = pagerank(g, tol=1e-12, max_rounds=300, progress=False).collect()
    expected = nx.pagerank(reference, alpha=0.85, tol=1e-14, max_iter=2000)
    got = {r["id"]: r["pagerank"] for r in rows}
    assert got.keys() == expected.keys()
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6
    assert {r["id"]: r["name"] for r in rows} == {v: f"v{v}" for v in expected}
