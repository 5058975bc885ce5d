"""iterflow.graph against networkx: the data model, its errors, connected components."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import networkx as nx
import pytest
from pyspark.sql import functions as F

from iterflow.graph import (
    Graph,
    GraphError,
    Pregel,
    as_graph,
    connected_components,
    label_propagation,
    pagerank,
    pregel,
    shortest_paths,
    weighted_shortest_paths,
)


def path_graph(spark, ids: list[int]) -> Graph:
    """The vertices ``ids`` joined one after another in that order: a path."""
    return Graph(
        spark.createDataFrame([(v,) for v in sorted(ids)], "id long"),
        spark.createDataFrame(
            [(ids[k], ids[k + 1]) for k in range(len(ids) - 1)], "src long, dst long"
        ),
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


@pytest.mark.parametrize(
    ("seed", "method"), [(1, "arrow"), (2, "arrow"), (3, "dataframe"), (4, "dataframe")]
)
def test_connected_components_match_networkx(spark, seed, method):
    g, reference = random_graph(spark, seed, vertices=60, edges=45)
    rows = connected_components(g, method=method, progress=False).collect()
    expected = {
        v: min(component)
        for component in nx.weakly_connected_components(reference)
        for v in component
    }
    assert {r["id"]: r["component"] for r in rows} == expected
    assert {r["id"]: r["name"] for r in rows} == {v: f"v{v}" for v in expected}  # kept


@pytest.mark.parametrize(
    "order", ["sorted", pytest.param("shuffled", marks=pytest.mark.slow_spark)]
)
def test_components_of_a_long_path_take_few_rounds_and_ever_fewer_messages(spark, order):
    n = 2000
    ids = list(range(n))
    if order == "shuffled":
        random.Random(5).shuffle(ids)
    path = path_graph(spark, ids)
    seen = []
    rows = connected_components(
        path, method="dataframe", listen=lambda end: seen.append(end.progress), progress=False
    )
    assert {r["component"] for r in rows.collect()} == {0}
    messages = [p.observed["messages"] for p in seen]
    # Round 0 hooks across every edge; each later round only across the edges still
    # joining different labels. Once none is left, Spark may skip evaluating the
    # (empty) workset join, and ctx.observe reports None rather than a guess.
    assert messages[0] == n - 1
    sent = [m for m in messages if m is not None]
    assert all(later < earlier for earlier, later in itertools.pairwise(sent))
    assert all(m is None for m in messages[len(sent) :])
    # Min-label propagation from every vertex every round would take n - 1 rounds of
    # 2 (n - 1) messages; hooking and jumping takes about log2(n) rounds.
    assert len(seen) <= 16
    assert sum(sent) < 0.3 * len(seen) * (n - 1)
    assert seen[-1].observed["active"] == 0 and seen[-1].criteria_empty is True


def test_vector_components_join_each_partition_locally_then_all_at_once(spark):
    n = 2000
    ids = list(range(n))
    random.Random(6).shuffle(ids)
    path = path_graph(spark, ids)
    seen = []
    rows = connected_components(
        path, method="arrow", listen=lambda end: seen.append(end.progress), progress=False
    )
    assert {r["component"] for r in rows.collect()} == {0}
    # Round 0 joins everything its edges connect; round 1 finds no edge across labels.
    assert [p.metrics["messages"] for p in seen] == [n - 1, 0]
    assert [p.metrics["active"] for p in seen] == [n - 1, 0]


def test_settle_is_union_find():
    import numpy as np

    from iterflow.graph.components import settle

    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 500, 300), rng.integers(0, 500, 300)
    labels = settle(np.arange(500), a, b)
    reference = nx.Graph()
    reference.add_nodes_from(range(500))
    reference.add_edges_from(zip(a.tolist(), b.tolist(), strict=True))
    assert {v: int(labels[v]) for v in range(500)} == {
        v: min(c) for c in nx.connected_components(reference) for v in c
    }


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
    seen = []
    rows = shortest_paths(
        g, landmarks, listen=lambda end: seen.append(end.progress), progress=False
    ).collect()
    backwards = reference.reverse()
    expected = {v: {} for v in reference.nodes}
    for landmark in landmarks:
        for v, d in nx.single_source_shortest_path_length(backwards, landmark).items():
            expected[v][landmark] = d
    assert {r["id"]: dict(r["distances"]) for r in rows} == expected
    # Round k reaches the pairs at distance k + 1: the frontier of the next round.
    at = Counter(d for distances in expected.values() for d in distances.values())
    assert [p.observed["active"] for p in seen] == [at.get(k + 1, 0) for k in range(len(seen))]


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
    assert seen[-1].observed["active"] == 0 < seen[0].observed["active"]
    assert [p.observed["active"] for p in seen] == [p.rows["changed"] for p in seen]


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


@pytest.mark.parametrize(
    ("seed", "method", "personal"),
    [
        (1, "arrow", False),
        (2, "arrow", True),
        pytest.param(3, "dataframe", True, marks=pytest.mark.slow_spark),
    ],
)
def test_pagerank_matches_networkx_with_self_loops_duplicates_and_dangling(
    spark, seed, method, personal
):
    g, reference = random_graph(spark, seed, vertices=40, edges=90)
    weights = {1: 2.0, 7: 1.0, 44: 1.0} if personal else None  # 44 is isolated
    seen = []
    rows = pagerank(
        g,
        tol=1e-9,
        max_rounds=300,
        method=method,
        personalization=weights,
        listen=lambda end: seen.append(end.progress),
        progress=False,
    ).collect()
    if method == "arrow":  # every distinct edge carries rank every round
        assert {p.metrics["messages"] for p in seen} == {reference.number_of_edges()}
    expected = nx.pagerank(reference, alpha=0.85, personalization=weights, tol=1e-14, max_iter=2000)
    got = {r["id"]: r["pagerank"] for r in rows}
    assert got.keys() == expected.keys()
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6
    assert {r["id"]: r["name"] for r in rows} == {v: f"v{v}" for v in expected}


def test_arrow_methods_survive_empty_edge_partitions(spark):
    """More edge partitions than edges: some kernels see no edges, and numpy types an
    empty ``bincount`` int64; the declared double column must still reach Spark."""
    g, reference = random_graph(spark, 5, vertices=6, edges=4)
    sparse = Graph(g.vertices, g.edges.repartition(11))
    ranks = {
        r["id"]: r["pagerank"]
        for r in pagerank(
            sparse, method="arrow", tol=1e-10, max_rounds=200, progress=False
        ).collect()
    }
    expected = nx.pagerank(reference, alpha=0.85, tol=1e-14, max_iter=2000)
    assert max(abs(ranks[v] - expected[v]) for v in expected) < 1e-6
    labels = {
        r["id"]: r["component"]
        for r in connected_components(sparse, method="arrow", progress=False).collect()
    }
    for members in nx.weakly_connected_components(reference):
        assert {labels[v] for v in members} == {min(members)}


def test_pagerank_errors_name_the_problem(spark):
    g, _ = random_graph(spark, 1, vertices=10, edges=10)
    with pytest.raises(GraphError, match="not in the graph"):
        pagerank(g, personalization={999: 1.0}, progress=False)
    with pytest.raises(GraphError, match="method='fast'"):
        pagerank(g, method="fast")
    with pytest.raises(GraphError, match=r"alpha=1\.5"):
        pagerank(g, alpha=1.5)
    stray = Graph(g.vertices, spark.createDataFrame([(1, 12345)], "src long, dst long"))
    with pytest.raises(GraphError, match=r"not a vertex 'id' \('dst' 12345\)"):
        pagerank(stray, progress=False)


def weighted_graph(spark, seed: int, vertices: int, edges: int, low: float = 0.1):
    rng = random.Random(seed)
    triples = [
        (rng.randrange(vertices), rng.randrange(vertices), rng.uniform(low, 5.0))
        for _ in range(edges)
    ]
    triples += [(2, 2, 1.0), (triples[0][0], triples[0][1], 9.0)]  # a self-loop, a parallel edge
    g = Graph(
        spark.createDataFrame([(v,) for v in range(vertices + 3)], "id long"),
        spark.createDataFrame(triples, "src long, dst long, weight double"),
    )
    reference = nx.DiGraph()
    reference.add_nodes_from(range(vertices + 3))
    for u, v, w in triples:  # parallel edges: the lighter one counts
        if not reference.has_edge(u, v) or reference[u][v]["weight"] > w:
            reference.add_edge(u, v, weight=w)
    return g, reference


@pytest.mark.parametrize("seed", [1, 2])
def test_weighted_shortest_paths_match_dijkstra(spark, seed):
    g, reference = weighted_graph(spark, seed, vertices=40, edges=100)
    seen = []
    rows = weighted_shortest_paths(
        g, 0, listen=lambda end: seen.append(end.progress), progress=False
    ).collect()
    expected = nx.single_source_dijkstra_path_length(reference, 0)
    got = {r["id"]: r["distance"] for r in rows}
    assert {v for v, d in got.items() if d is not None} == set(expected)
    assert max(abs(got[v] - d) for v, d in expected.items()) < 1e-9
    # Only vertices whose distance shrank send: round 0 only the source has a distance
    # (everyone else sends null, which is not sent).
    assert seen[0].observed["messages"] == reference.out_degree(0)
    assert sum(p.observed["messages"] or 0 for p in seen) < len(seen) * reference.number_of_edges()


def test_weighted_shortest_paths_with_negative_weights_and_cycles(spark):
    g, _ = weighted_graph(spark, 3, vertices=30, edges=40)
    edges = g.edges.where("src != dst").withColumn(
        "weight", F.when(F.col("src") < F.col("dst"), -F.col("weight")).otherwise(F.col("weight"))
    )
    dag = nx.DiGraph()  # negative only on edges to larger ids: possibly negative cycles
    for r in edges.collect():
        if not dag.has_edge(r.src, r.dst) or dag[r.src][r.dst]["weight"] > r.weight:
            dag.add_edge(r.src, r.dst, weight=r.weight)
    negative = Graph(g.vertices, edges)
    if nx.negative_edge_cycle(dag.subgraph(nx.descendants(dag, 0) | {0}).copy()):
        with pytest.raises(GraphError, match="cycle of negative 'weight'"):
            weighted_shortest_paths(negative, 0, progress=False)
    acyclic = Graph(g.vertices, edges.where("src < dst"))
    expected = nx.single_source_bellman_ford_path_length(
        nx.DiGraph([(u, v, d) for u, v, d in dag.edges(data=True) if u < v]), 0
    )
    got = {
        r["id"]: r["distance"]
        for r in weighted_shortest_paths(acyclic, 0, progress=False).collect()
    }
    assert {v for v, d in got.items() if d is not None} == set(expected)
    assert max(abs(got[v] - d) for v, d in expected.items()) < 1e-9
    with pytest.raises(GraphError, match="no vertex has that id"):
        weighted_shortest_paths(acyclic, 999)
    with pytest.raises(GraphError, match="weight='km'"):
        weighted_shortest_paths(acyclic, 0, weight="km")


def test_pregel_messages_both_ways_and_reads_the_other_end(spark):
    g, reference = random_graph(spark, 6, vertices=30, edges=50)
    ends = []
    rows = pregel(
        g,
        init={"top": F.lit(None).cast("long")},
        update={"top": Pregel.msg()},
        send_to_dst=Pregel.src("id") * 1000 + Pregel.dst("id"),  # reads the receiver too
        send_to_src=Pregel.dst("id"),
        aggregate=F.max,
        max_rounds=1,
        listen=itf_end_recorder(ends),
        progress=False,
    ).collect()
    expected = {}
    for u, v in set(reference.edges):
        expected[v] = max(expected.get(v, -1), u * 1000 + v)
        expected[u] = max(expected.get(u, -1), v)
    assert {r["id"]: r["top"] for r in rows if r["top"] is not None} == expected
    assert ends[-1].termination.reason == "max_rounds"
    # Duplicates are messages too: one per edge row in each direction.
    assert ends[-1].history[0].observed["messages"] == 2 * g.edges.count()


def itf_end_recorder(ends):
    class Recorder:
        def on_round_end(self, end):
            pass

        def on_iteration_terminated(self, end):
            ends.append(end)

    return Recorder()


def test_pregel_termination_reasons(spark):
    path = Graph(
        spark.createDataFrame([(v,) for v in range(6)], "id long"),
        spark.createDataFrame([(v, v + 1, 1.0) for v in range(5)], "src long, dst long, w double"),
    )
    program = {
        "init": {"d": F.when(F.col("id") == 0, 0.0).otherwise(F.lit(None).cast("double"))},
        "update": {"d": F.least(F.col("d"), Pregel.msg())},
        "send_to_dst": Pregel.src("d") + Pregel.edge("w"),
        "aggregate": F.min,
    }
    ends = []
    rows = pregel(path, listen=itf_end_recorder(ends), progress=False, **program).collect()
    assert {r["id"]: r["d"] for r in rows} == {v: float(v) for v in range(6)}
    # Each round only the newest vertex sends: 1 message per round, then the end of the
    # path has no out-edge, so the last round sends nothing (None: adaptive execution
    # saw that no active vertex has an edge and skipped evaluating the messages).
    messages = [p.observed["messages"] for p in ends[-1].history]
    assert messages[:5] == [1, 1, 1, 1, 1] and messages[5] in (0, None)
    assert ends[-1].termination.reasons == ("criteria_empty", "predicate")

    # Everyone votes to halt after the first update: messages were sent, none active.
    halted = []
    pregel(path, active=F.lit(False), listen=itf_end_recorder(halted), progress=False, **program)
    assert halted[-1].rounds == 1 and halted[-1].termination.reasons == ("criteria_empty",)

    # A cycle with everyone always active never settles: max_rounds ends it.
    ring = Graph(
        path.vertices,
        spark.createDataFrame([(v, (v + 1) % 6) for v in range(6)], "src long, dst long"),
    )
    capped = []
    rows = pregel(
        ring,
        init={"hops": F.lit(0)},
        update={"hops": F.col("hops") + 1},
        send_to_dst=F.lit(1),
        active=F.lit(True),
        max_rounds=4,
        listen=itf_end_recorder(capped),
        progress=False,
    ).collect()
    assert capped[-1].termination.reason == "max_rounds" and capped[-1].rounds == 4
    assert {r["hops"] for r in rows} == {4}


def test_pregel_rejects_bad_programs(spark):
    g, _ = random_graph(spark, 1, vertices=5, edges=5)
    with pytest.raises(GraphError, match="needs a message"):
        pregel(g, init={"x": F.lit(1)}, update={})
    with pytest.raises(GraphError, match=r"names \['y'\], which are not state columns"):
        pregel(g, init={"x": F.lit(1)}, update={"y": F.lit(2)}, send_to_dst=F.lit(1))
    with pytest.raises(GraphError, match=r"overwrite the vertex column\(s\) \['name'\]"):
        pregel(g, init={"name": F.lit(1)}, update={}, send_to_dst=F.lit(1))


def test_a_graphframe_in_gives_a_graphframe_out(spark, monkeypatch):
    import sys
    import types

    class GraphFrame:  # graphframes-py's class, without its JVM package
        def __init__(self, v, e):
            self.vertices, self.edges = v, e

    monkeypatch.setitem(sys.modules, "graphframes", types.SimpleNamespace(GraphFrame=GraphFrame))
    g, reference = random_graph(spark, 1, vertices=20, edges=15)
    result = connected_components(GraphFrame(g.vertices, g.edges), progress=False)
    assert isinstance(result, GraphFrame) and result.edges is g.edges
    assert result.vertices.count() == reference.number_of_nodes()
    assert "component" in result.vertices.columns
