"""GraphFrame's methods beyond the classic algorithms (GraphFrames 0.12's API): views,
typed degrees, validation, motifs, messages, triangles, cores, independent sets, cycles,
paths and sketches, each against networkx or a plain-Python reference on a graph with a
self-loop, a repeated edge, a dangling and an isolated vertex."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import networkx as nx
import pytest
from pyspark.sql import functions as F

from iterflow.graph import AggregateMessages as AM
from iterflow.graph import GraphError, GraphFrame, aggregate_messages

# 0 -> 1 -> 2 -> 0 is a cycle, 2 -> 3 <-> 4, 4 -> 0, a self-loop at 3, (0, 1) twice,
# 5 is dangling (only an in-edge), 6 is isolated; 7, 8, 9 close a triangle with 0.
PAIRS = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 3), (1, 5), (3, 3), (0, 1), (4, 0)]
PAIRS += [(0, 7), (7, 8), (8, 0), (8, 9), (9, 7)]
IDS = list(range(10))
KINDS = ["a", "b", "a", "c", "b", "a", "c", "a", "b", "c", "a", "a", "b", "c", "a"]


@pytest.fixture(scope="module")
def g(spark) -> GraphFrame:
    return GraphFrame(
        v=spark.createDataFrame(
            [(v, f"v{v}", v * 10) for v in IDS], "id long, name string, x long"
        ),
        e=spark.createDataFrame(
            [(a, b, KINDS[i], float(i)) for i, (a, b) in enumerate(PAIRS)],
            "src long, dst long, kind string, w double",
        ),
    )


def undirected() -> nx.Graph:
    h = nx.Graph()
    h.add_nodes_from(IDS)
    h.add_edges_from((a, b) for a, b in PAIRS if a != b)
    return h


def test_constructor_keywords_and_the_missing_column_is_a_value_error(spark, g):
    assert GraphFrame(g.vertices, g.edges).edges.count() == len(PAIRS)
    with pytest.raises(ValueError, match="'src'"):
        GraphFrame(g.vertices, spark.createDataFrame([(1, 2)], "a long, dst long"))


def test_views_filter_drop_reverse_and_undirect(g):
    kept = g.filterVertices("id < 3")
    assert sorted(r.id for r in kept.vertices.collect()) == [0, 1, 2]
    assert sorted((r.src, r.dst) for r in kept.edges.collect()) == sorted(
        (a, b) for a, b in PAIRS if a < 3 and b < 3
    )
    by_column = g.filterEdges(F.col("kind") == "a")
    assert by_column.vertices.count() == len(IDS)
    assert by_column.edges.count() == KINDS.count("a")
    lone = g.filterEdges("src = 3").dropIsolatedVertices()
    assert sorted(r.id for r in lone.vertices.collect()) == [3, 4]
    reversed_ = g.as_reversed().edges
    assert reversed_.columns == ["src", "dst", "kind", "w"]
    assert sorted((r.src, r.dst, r.kind) for r in reversed_.collect()) == sorted(
        (b, a, KINDS[i]) for i, (a, b) in enumerate(PAIRS)
    )
    both = g.as_undirected().edges.collect()
    assert Counter((r.src, r.dst) for r in both) == Counter(PAIRS) + Counter(
        (b, a) for a, b in PAIRS
    )
    with pytest.raises(GraphError, match="SQL condition"):
        g.filterVertices(3)


def test_typed_degrees_count_each_kind_with_explicit_and_found_types(g):
    for side, column, ends in (
        ("out", "outDegrees", lambda a, b: [a]),
        ("in", "inDegrees", lambda a, b: [b]),
        ("", "degrees", lambda a, b: [a, b]),
    ):
        expected: dict[int, Counter] = defaultdict(Counter)
        for i, (a, b) in enumerate(PAIRS):
            for v in ends(a, b):
                expected[v][KINDS[i]] += 1
        method = getattr(g, f"type_{side}_degree" if side else "type_degree")
        for types in (None, ["a", "b", "c"]):
            df = method("kind", types)
            assert df.columns == ["id", column]
            got = {r.id: r[column].asDict() for r in df.collect()}
            assert got == {v: {k: c[k] for k in "abc"} for v, c in expected.items()}
    with pytest.raises(GraphError, match="no column 'colour'"):
        g.type_out_degree("colour")


def test_validate_names_repeated_ids_and_stray_edge_ends(spark, g):
    g.validate()
    twice = GraphFrame(g.vertices.unionByName(g.vertices.limit(1)), g.edges)
    with pytest.raises(ValueError, match="more than once"):
        twice.validate()
    stray = GraphFrame(
        g.vertices, g.edges.unionByName(g.edges.limit(1).withColumn("dst", F.lit(99).cast("long")))
    )
    with pytest.raises(ValueError, match="99"):
        stray.validate()
    stray.validate(check_vertices=False)


def test_motifs_match_a_brute_force_search(g):
    edges = set(PAIRS)
    rows = g.find("(a)-[e]->(b); (b)-[]->(c); !(c)-[]->(a)").collect()
    got = Counter((r.a.id, r.b.id, r.c.id, r.e.kind) for r in rows)
    expected = Counter(
        (a, b, c, KINDS[i])
        for i, (a, b) in enumerate(PAIRS)
        for (b2, c) in PAIRS
        if b2 == b and (c, a) not in edges
    )
    assert got == expected
    assert g.find("(a)-[e]->(b)").columns == ["a", "e", "b"]
    loops = g.find("(a)-[]->(a)").collect()
    assert [r.a.id for r in loops] == [3]
    assert g.find("(a)").count() == len(IDS)
    with pytest.raises(GraphError, match="not a term"):
        g.find("(a)-->(b)")
    with pytest.raises(GraphError, match="negated term"):
        g.find("(a)-[]->(b); !(a)-[]->(c)")


def test_aggregate_messages_sums_and_counts_like_python(g):
    got = {
        r.id: (r.total, r.n)
        for r in aggregate_messages(
            g,
            [F.sum(AM.msg).alias("total"), F.count(AM.msg).alias("n")],
            send_to_dst=AM.src["x"],
            send_to_src="dst.x",
        ).collect()
    }
    expected: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for a, b in PAIRS:
        for to, frm in ((b, a), (a, b)):
            expected[to][0] += frm * 10
            expected[to][1] += 1
    assert got == {v: tuple(t) for v, t in expected.items()}
    with pytest.deprecated_call():
        single = g.aggregateMessages(F.max(AM.msg).alias("m"), sendToDst=AM.edge["w"])
    assert {r.id: r.m for r in single.collect()} == {
        b: max(float(i) for i, (_, d) in enumerate(PAIRS) if d == b) for _, b in PAIRS
    }
    with pytest.raises(GraphError, match="send_to_src=, send_to_dst="):
        aggregate_messages(g, F.sum(AM.msg))


def test_triangles_and_core_numbers_match_networkx(g):
    h = undirected()
    triangles = {r.id: r["count"] for r in g.triangleCount().collect()}
    assert triangles == nx.triangles(h)
    assert {r.id: r.kcore for r in g.k_core().collect()} == nx.core_number(h)


def test_maximal_independent_set_is_independent_maximal_and_seeded(g):
    h = undirected()
    chosen = {r.id for r in g.maximal_independent_set(seed=7).collect()}
    assert all(not h.has_edge(a, b) for a, b in itertools.combinations(chosen, 2))
    assert all(v in chosen or any(u in chosen for u in h[v]) for v in IDS)
    assert 6 in chosen
    assert chosen == {r.id for r in g.maximal_independent_set(seed=7).collect()}


def test_cycles_are_networkx_simple_cycles_from_their_smallest_vertex(g):
    rows = g.detectingCycles().collect()
    got = sorted(tuple(r.found_cycles) for r in rows)
    expected = []
    for cycle in nx.simple_cycles(nx.DiGraph(PAIRS)):
        start = cycle.index(min(cycle))
        turned = cycle[start:] + cycle[:start]
        expected.append((*turned, turned[0]))
    assert got == sorted(expected)
    assert all(r.id == r.found_cycles[0] for r in rows)


@pytest.mark.parametrize("directed", [True, False])
def test_all_paths_are_networkx_simple_paths(g, directed):
    rows = g.all_paths(
        "id = 0", F.col("id").isin(3, 9), max_path_length=4, is_directed=directed
    ).collect()
    h = nx.DiGraph(PAIRS) if directed else undirected()
    expected = sorted(tuple(p) for t in (3, 9) for p in nx.all_simple_paths(h, 0, t, cutoff=4))
    assert sorted(tuple(r.path) for r in rows) == expected
    assert all(r.len == len(r.path) - 1 for r in rows)
    filtered = g.all_paths("id = 0", "id = 3", edge_filter="kind != 'c'").collect()
    assert all(
        any(KINDS[i] != "c" for i, e in enumerate(PAIRS) if e == (a, b))
        for r in filtered
        for a, b in itertools.pairwise(r.path)
    )


def test_hyper_anf_sketches_estimate_the_vertices_at_each_hop(g):
    result = g.hyper_anf(n_hops=2)
    assert result.columns == ["id", "hop_0", "hop_1", "hop_2"]
    estimates = result.select(
        "id", *(F.hll_sketch_estimate(f"hop_{k}").alias(f"n{k}") for k in range(3))
    ).collect()
    h = nx.DiGraph(set(PAIRS))
    for r in estimates:
        at = {r.id}
        for k in range(3):
            # HyperLogLog is exact on sets this small; no sketch where no walk is that long
            assert (r[f"n{k}"] or 0) == len(at)
            at = {b for a in at for b in h.successors(a)}
    assert {r.id for r in estimates} == {a for a, _ in PAIRS}
    with pytest.raises(GraphError, match="n_hops must be a positive integer"):
        g.hyper_anf(n_hops=0)


def test_power_iteration_clustering_and_the_methods_not_built(spark):
    pairs = [(a, b, 1.0) for a, b in itertools.combinations(range(4), 2)]
    pairs += [(a, b, 1.0) for a, b in itertools.combinations(range(4, 8), 2)] + [(3, 4, 0.01)]
    g = GraphFrame(
        spark.createDataFrame([(i,) for i in range(8)], "id long"),
        spark.createDataFrame(pairs, "src long, dst long, weight double"),
    )
    clusters = {r.id: r.cluster for r in g.powerIterationClustering(2, 20, "weight").collect()}
    assert len({clusters[i] for i in range(4)}) == 1
    assert len({clusters[i] for i in range(4, 8)}) == 1
    assert clusters[0] != clusters[4]
    with pytest.raises(NotImplementedError, match="ALS"):
        g.svdPlusPlus()
    with pytest.raises(NotImplementedError, match="labelPropagation"):
        g.neighborhood_aware_cdlp(max_iter=1)
    with pytest.raises(ValueError, match="must be > 0 when ignore_direct_links"):
        g.neighborhood_aware_cdlp(structural_similarity_multiplier=0.0, ignore_direct_links=True)


def _walks(start: int, hops: int, allowed) -> list[list[tuple[int, int, int]]]:
    """Every walk of 1..hops edges from ``start`` over the edges (index, src, dst) that
    ``allowed`` keeps, as lists of edges."""
    walks, frontier = [], [[]]
    for _ in range(hops):
        frontier = [
            [*w, (i, a, b)]
            for w in frontier
            for i, (a, b) in enumerate(PAIRS)
            if allowed(i) and a == (w[-1][2] if w else start)
        ]
        walks += frontier
    return walks


def test_aggregate_neighbors_carries_accumulators_along_walks_to_targets(g):
    from iterflow.graph import AggregateNeighbors as AN

    rows = g.aggregate_neighbors(
        starting_vertices="id = 0",
        accumulator_names=["total", "weights"],
        accumulator_inits=[F.lit(0), F.lit(0.0)],  # an int that widens to long,
        accumulator_updates=[
            F.col("total") + AN.dst_attr("x"),
            F.col("weights") + AN.edge_attr("w"),
        ],
        max_hops=4,
        target_condition=AN.dst_attr("id").isin(3, 9),
        edge_filter=AN.edge_attr("kind") != "c",
    ).collect()
    expected = Counter()
    for walk in _walks(0, 4, lambda i: KINDS[i] != "c"):
        if any(b in (3, 9) for _, _, b in walk[:-1]):
            continue  # a path ends at its first target
        *_, (_, _, end) = walk
        if end in (3, 9):
            total = sum(b * 10 for _, _, b in walk)
            expected[(end, len(walk), total, sum(float(i) for i, _, _ in walk))] += 1
    assert Counter((r.id, r.hop, r.total, r.weights) for r in rows) == expected
    stopped = g.aggregate_neighbors(
        F.col("id") == 1,
        ["n"],
        [F.lit(0)],
        [F.col("n") + 1],
        max_hops=3,
        stopping_condition=AN.src_attr("id") == 2,
        remove_loops=True,
    ).collect()
    ends = Counter()
    for walk in _walks(1, 3, lambda i: PAIRS[i][0] != PAIRS[i][1]):
        if any(a == 2 for _, a, _ in walk[:-1]):
            continue
        if walk[-1][1] == 2:
            ends[(walk[-1][2], len(walk))] += 1
    assert Counter((r.id, r.hop) for r in stopped) == ends
    with pytest.raises(GraphError, match="target_condition, a stopping_condition"):
        g.aggregate_neighbors("id = 0", ["n"], [F.lit(0)], [F.col("n") + 1])
