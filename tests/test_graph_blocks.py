"""The block path of iterflow.graph (``method="blocks"``: vertex state in B ranges of ids,
kept in Spark) against networkx, a numpy power iteration, and the vector ("arrow") and
DataFrame paths, on graphs with dangling and isolated vertices, self-loops, duplicate
edges and scattered negative ids, for B = 1, a few, and more blocks than vertices.

Every run on blocks costs a few Spark jobs per round, so the graphs are small and the
cases combined; the extra block counts and seeds run with the slow tests."""

from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np
import pytest
from pyspark.sql import functions as F

from iterflow.graph import (
    Graph,
    GraphError,
    Pregel,
    block_layout,
    connected_components,
    label_propagation,
    pagerank,
    pregel,
    shortest_paths,
    weighted_shortest_paths,
)
from iterflow.graph.methods import LIMIT_CONF, choose_method

pytestmark = pytest.mark.spark
SLOW = pytest.mark.slow_spark  # extra block counts and seeds: `bash run.sh test --slow`


def vid(k: int) -> int:
    """Vertex k's id: scattered over -40..37 in steps of 7, not in the order of k."""
    return 7 * ((5 * k) % 12) - 40


# (k of src, k of dst, weight) for 12 vertices k = 0..11: 5 and 10 are dangling (no
# out-edge), 11 is isolated, 4 -> 4 a self-loop, 1 -> 2 a duplicate (two weights), 8 <-> 9
# both ways; three weakly connected components {0..6}, {7..10}, {11}.
SMALL = [
    (0, 1, 1.0),
    (1, 2, 5.0),
    (1, 2, 2.0),
    (2, 0, 0.5),
    (2, 3, 4.0),
    (0, 3, 10.0),
    (3, 4, 1.5),
    (4, 4, 3.0),
    (4, 5, 2.5),
    (6, 3, 1.0),
    (7, 8, 1.0),
    (9, 8, 2.0),
    (8, 9, 0.75),
    (8, 10, 0.25),
]
N_SMALL = 12
PERSONAL = {vid(1): 2.0, vid(11): 1.0}  # one of them isolated


class Case:
    """A graph on Spark (vertices with a ``name``, edges with a ``weight``) and the same
    graph in networkx, where a duplicate edge keeps the lighter weight."""

    def __init__(self, spark, ids: list[int], triples: list[tuple[int, int, float]]):
        self.ids = ids
        self.triples = triples
        self.g = Graph(
            spark.createDataFrame([(v, f"v{v}") for v in reversed(ids)], "id long, name string"),
            spark.createDataFrame(triples, "src long, dst long, weight double"),
        )
        self.nx = nx.DiGraph()
        self.nx.add_nodes_from(ids)
        for u, v, w in triples:
            if not self.nx.has_edge(u, v) or self.nx[u][v]["weight"] > w:
                self.nx.add_edge(u, v, weight=w)


@pytest.fixture(scope="module")
def small(spark) -> Case:
    return Case(spark, [vid(k) for k in range(N_SMALL)], [(vid(u), vid(v), w) for u, v, w in SMALL])


@pytest.fixture
def vector_limit(spark):
    """Sets ``LIMIT_CONF`` for one test, and puts back what was there."""
    before = spark.conf.get(LIMIT_CONF, None)

    def set_limit(value) -> None:
        spark.conf.set(LIMIT_CONF, str(value))

    try:
        yield set_limit
    finally:
        if before is None:
            spark.conf.unset(LIMIT_CONF)
        else:
            spark.conf.set(LIMIT_CONF, before)


class Recorder:
    """A listener that keeps the ``IterationEnd`` (rounds, termination, history)."""

    def __init__(self) -> None:
        self.end = None

    def on_round_end(self, end) -> None:
        pass

    def on_iteration_terminated(self, end) -> None:
        self.end = end


def column(rows, name: str) -> dict:
    return {r["id"]: r[name] for r in rows}


def close(got: dict, expected: dict, tol: float) -> bool:
    assert got.keys() == expected.keys()
    return max(abs(got[v] - expected[v]) for v in expected) <= tol


def reached(got: dict, expected: dict) -> bool:
    """``got`` (null where unreachable) has the distances of ``expected`` to 1e-12."""
    assert {v for v, d in got.items() if d is not None} == set(expected)
    return close({v: got[v] for v in expected}, expected, 1e-12)


def power_iteration(
    case: Case,
    rounds: int,
    *,
    alpha: float = 0.85,
    personalization: dict | None = None,
    graphx: bool = False,
) -> tuple[dict, list[float]]:
    """PageRank in numpy, started as iterflow starts it (1/n each, or the personalization):
    the ranks after ``rounds`` rounds and each round's L1 change. ``graphx``: every copy
    of an edge is an out-edge, dangling rank is lost, the ranks are rescaled at the end."""
    index = {v: i for i, v in enumerate(case.ids)}
    n = len(case.ids)
    pairs = [(u, v) for u, v, _ in case.triples]
    if not graphx:
        pairs = sorted(set(pairs))
    src = np.array([index[u] for u, _ in pairs])
    dst = np.array([index[v] for _, v in pairs])
    out = np.bincount(src, minlength=n).astype(float)
    if personalization is None:
        teleport = np.full(n, 1.0 / n)
    else:
        teleport = np.zeros(n)
        for v, w in personalization.items():
            teleport[index[v]] = w
        teleport /= teleport.sum()
    x = teleport.copy()
    changes = []
    for _ in range(rounds):
        spread = np.bincount(dst, weights=x[src] / out[src], minlength=n)
        dangling = 0.0 if graphx else x[out == 0].sum()
        new = alpha * (spread + dangling * teleport) + (1 - alpha) * teleport
        changes.append(float(np.abs(new - x).sum()))
        x = new
    if graphx:
        x = x * ((1.0 if personalization else n) / x.sum())
    return dict(zip(case.ids, x.tolist(), strict=True)), changes


def weak_components(reference: nx.DiGraph) -> dict:
    return {v: min(c) for c in nx.weakly_connected_components(reference) for v in c}


def majority_rule(graph: nx.Graph, labels: dict) -> dict:
    """One synchronous round of label propagation in plain Python: the most frequent label
    among a vertex's own and its neighbours' (each once), the smallest on a tie."""
    new = {}
    for v in graph.nodes:
        votes = Counter([labels[v]] + [labels[u] for u in graph.neighbors(v) if u != v])
        new[v] = min(votes.items(), key=lambda item: (-item[1], item[0]))[0]
    return new


def sssp(source: int) -> dict:
    """Pregel's single-source shortest paths by ``weight`` (the messages are added)."""
    return {
        "init": {"dist": F.when(F.col("id") == source, 0.0).otherwise(F.lit(None).cast("double"))},
        "update": {"dist": F.least(F.col("dist"), Pregel.msg())},
        "aggregate": F.min,
    }


# -- the choice of path ------------------------------------------------------------------


def test_auto_goes_to_blocks_above_the_vector_limit(spark, small, vector_limit):
    assert choose_method("pagerank", "auto", small.g) == ("arrow", N_SMALL)  # default limit
    vector_limit(N_SMALL)
    assert choose_method("pagerank", "auto", small.g) == ("arrow", N_SMALL)
    assert choose_method("pregel", "auto", small.g, below_limit="dataframe")[0] == "dataframe"
    vector_limit(N_SMALL - 1)
    assert choose_method("pagerank", "auto", small.g) == ("blocks", N_SMALL)
    assert choose_method("pregel", "auto", small.g, below_limit="dataframe")[0] == "blocks"
    assert choose_method("pagerank", "arrow", small.g)[0] == "arrow"  # only "auto" switches
    for bad in ("many", "-1"):
        vector_limit(bad)
        with pytest.raises(GraphError, match=LIMIT_CONF):
            choose_method("pagerank", "auto", small.g)


# -- PageRank ----------------------------------------------------------------------------


def test_power_iteration_reference_is_networkx_pagerank(small):
    """The numpy reference, run to convergence, is networkx's PageRank of the DiGraph."""
    for weights in (None, PERSONAL):
        for alpha in (0.85, 0.5):
            ranks, _ = power_iteration(small, 400, alpha=alpha, personalization=weights)
            expected = nx.pagerank(
                small.nx, alpha=alpha, personalization=weights, weight=None, tol=1e-15
            )
            assert close(ranks, expected, 1e-12)


def test_pagerank_auto_over_the_limit_runs_on_blocks_until_tol(spark, small, vector_limit):
    """Personalized, in one block, stopped by ``tol``: each round is the numpy one."""
    vector_limit(N_SMALL - 1)  # "auto" then runs on blocks
    recorder = Recorder()
    tol = 1e-2
    options = {"alpha": 0.5, "personalization": PERSONAL}
    rows = pagerank(small.g, tol=tol, blocks=1, listen=recorder, progress=False, **options)
    rows = rows.collect()
    end = recorder.end
    assert end.termination.reason == "converged"
    # It stops after the first round whose L1 change is at most tol, the numpy one's.
    _, changes = power_iteration(small, 50, **options)
    assert end.rounds == next(r + 1 for r, change in enumerate(changes) if change <= tol)
    expected, changes = power_iteration(small, end.rounds, **options)
    assert close(column(rows, "pagerank"), expected, 1e-12)
    assert column(rows, "name") == {v: f"v{v}" for v in small.ids}
    # Every distinct edge (the self-loop too) carries rank every round, and the blocks'
    # changes add up to the round's L1 change.
    assert {p.metrics["messages"] for p in end.history} == {small.nx.number_of_edges()}
    assert [p.metrics["change"].sum for p in end.history] == pytest.approx(changes, abs=1e-12)


@SLOW  # CI: the case above, the graph with more blocks than vertices, the random graphs
def test_pagerank_in_more_blocks_than_vertices_is_the_power_iteration(spark, small):
    rows = pagerank(
        small.g, tol=None, max_rounds=3, method="blocks", blocks=50, progress=False
    ).collect()
    assert close(column(rows, "pagerank"), power_iteration(small, 3)[0], 1e-12)


@SLOW  # the random graphs below check GraphX's PageRank on blocks against the arrow path
@pytest.mark.parametrize("weights", [None, PERSONAL])
def test_graphx_pagerank_on_blocks_equals_the_arrow_path(spark, small, weights):
    got = {}
    for method, blocks in (("blocks", 3), ("arrow", None)):
        rows = pagerank(
            small.g,
            tol=None,
            max_rounds=4,
            personalization=weights,
            normalization="graphx",
            method=method,
            blocks=blocks,
            progress=False,
        ).collect()
        got[method] = column(rows, "pagerank")
    assert close(got["blocks"], got["arrow"], 1e-12)
    expected, _ = power_iteration(small, 4, personalization=weights, graphx=True)
    assert close(got["blocks"], expected, 1e-12)


def test_more_blocks_than_vertices(spark):
    """4 vertices, two at the int64 limits, in 5 blocks: some blocks are empty."""
    a, b, c, d = -(2**63), -3, 5, 2**63 - 1
    tiny = Case(spark, [a, b, c, d], [(a, b, 1.0), (b, c, 2.0), (b, c, 1.0), (a, a, 1.0)])
    lay = block_layout.layout(tiny.g.vertices, 4, 5)
    try:
        at = {r["id"]: r["position"] for r in lay.positions.collect()}
    finally:
        lay.release()
    assert at == {a: 0, b: 1, c: 2, d: 3} and 0 in lay.sizes and sum(lay.sizes) == 4

    rows = pagerank(
        tiny.g, tol=None, max_rounds=2, method="blocks", blocks=5, progress=False
    ).collect()
    assert close(column(rows, "pagerank"), power_iteration(tiny, 2)[0], 1e-12)
    rows = connected_components(tiny.g, method="blocks", blocks=5, progress=False).collect()
    assert column(rows, "component") == {a: a, b: a, c: a, d: d}


def test_ids_without_gaps_are_placed_by_arithmetic(spark):
    """Ids -5 .. 8 (14 vertices, rows in no order): the layout computes every place from
    the id, and every algorithm still matches networkx; a gap makes it number the ids."""
    ids = list(range(-5, 9))
    order = np.random.default_rng(3).permutation(ids).tolist()
    ends = [(-5, -4), (-4, -3), (-3, -5), (-3, 0), (0, 0), (0, 1), (1, 2), (2, 1), (4, 5)]
    ends += [(5, 8), (8, 7), (1, 2), (7, 6)]  # a duplicate; 3 is isolated, 6 dangling
    dense = Case(spark, order, [(u, v, 1.0 + (u * 7 + v) % 5) for u, v in ends])
    lay = block_layout.layout(dense.g.vertices, len(ids), 3)
    try:
        at = {r["id"]: (r["block"], r["offset"], r["position"]) for r in lay.positions.collect()}
    finally:
        lay.release()
    assert lay.first == -5 and lay.sizes == (5, 5, 4)
    assert at == {v: ((v + 5) // 5, (v + 5) % 5, v + 5) for v in ids}
    gap = Case(spark, [*ids[:-1], 20], [])
    assert block_layout.layout(gap.g.vertices, len(ids), 3).first is None

    rows = pagerank(dense.g, tol=None, max_rounds=4, method="blocks", blocks=3, progress=False)
    assert close(column(rows.collect(), "pagerank"), power_iteration(dense, 4)[0], 1e-12)
    rows = connected_components(dense.g, method="blocks", blocks=3, progress=False).collect()
    assert column(rows, "component") == weak_components(dense.nx)
    rows = shortest_paths(dense.g, [1, 7], method="blocks", blocks=2, progress=False).collect()
    expected = {
        v: {
            m: nx.shortest_path_length(dense.nx, v, m)
            for m in (1, 7)
            if nx.has_path(dense.nx, v, m)
        }
        for v in ids
    }
    assert {r["id"]: dict(r["distances"]) for r in rows} == expected
    rows = weighted_shortest_paths(dense.g, -5, method="blocks", blocks=3, progress=False)
    assert reached(
        column(rows.collect(), "distance"), nx.single_source_dijkstra_path_length(dense.nx, -5)
    )


@SLOW  # CI: the graphs above and the random graphs below
@pytest.mark.parametrize("blocks", [None, 1, 2, 3, 50])
def test_components_on_blocks_match_networkx(spark, small, vector_limit, blocks):
    vector_limit(0)  # "auto" then runs on blocks; B = blocks, or the task slots
    recorder = Recorder()
    rows = connected_components(small.g, blocks=blocks, listen=recorder, progress=False)
    rows = rows.collect()
    assert column(rows, "component") == weak_components(small.nx)
    assert column(rows, "name") == {v: f"v{v}" for v in small.ids}
    # Min-label spreading: in the first round every vertex sends along its edges (both
    # ways, without self-loops, duplicates once); at the end no label moves.
    undirected = nx.Graph(small.nx)
    undirected.remove_edges_from(nx.selfloop_edges(undirected))
    history = recorder.end.history
    assert history[0].metrics["messages"] == 2 * undirected.number_of_edges()
    assert history[-1].metrics["active"] == 0


# -- label propagation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "blocks",
    [3, pytest.param(1, marks=SLOW), pytest.param(50, marks=SLOW)],
)
def test_label_propagation_on_blocks_equals_the_dataframe_path(spark, small, vector_limit, blocks):
    rounds = 3
    frames = label_propagation(small.g, max_rounds=rounds, method="dataframe", progress=False)
    on_frames = column(frames.collect(), "label")
    vector_limit(0)  # "auto" then runs on blocks
    recorder = Recorder()
    rows = label_propagation(
        small.g, max_rounds=rounds, blocks=blocks, listen=recorder, progress=False
    ).collect()
    assert "messages" in recorder.end.history[0].metrics  # the block path ran
    got = column(rows, "label")
    assert got == on_frames
    expected = {v: v for v in small.ids}
    for _ in range(rounds):
        expected = majority_rule(nx.Graph(small.nx), expected)
    assert got == expected
    assert set(got.values()) <= set(small.ids)
    assert column(rows, "name") == {v: f"v{v}" for v in small.ids}


# -- shortest paths ----------------------------------------------------------------------


def test_shortest_paths_to_landmarks_match_networkx(spark, small):
    landmarks = [vid(3), vid(8), vid(3), 999, vid(11)]  # named twice, no vertex, isolated
    expected = {v: {} for v in small.ids}
    for landmark in (vid(3), vid(8), vid(11)):  # hops from every vertex to the landmark
        for v, hops in nx.shortest_path_length(small.nx, target=landmark).items():
            expected[v][landmark] = hops
    for method, blocks in (("blocks", 3), ("dataframe", None)):
        rows = shortest_paths(
            small.g, landmarks, method=method, blocks=blocks, progress=False
        ).collect()
        assert {r["id"]: dict(r["distances"]) for r in rows} == expected, method
        assert column(rows, "name") == {v: f"v{v}" for v in small.ids}


def test_pregel_shortest_paths_on_blocks_and_active_vertices(spark, small):
    """Weighted shortest paths (Pregel with the default ``active``: the vertices whose
    distance changed) and the same program with every updated vertex active."""
    source = vid(0)
    expected = nx.single_source_dijkstra_path_length(small.nx, source)
    changed = Recorder()
    rows = weighted_shortest_paths(
        small.g, source, method="blocks", blocks=1, listen=changed, progress=False
    ).collect()
    assert reached(column(rows, "distance"), expected)

    everyone = Recorder()
    rows = pregel(
        small.g,
        send_to_dst=Pregel.src("dist") + Pregel.edge("weight"),
        active=F.lit(True),
        max_rounds=changed.end.rounds,
        method="blocks",
        blocks=2,
        listen=everyone,
        progress=False,
        **sssp(source),
    ).collect()
    assert reached(column(rows, "dist"), expected)
    sent = {
        name: [p.observed["messages"] or 0 for p in recorder.end.history]
        for name, recorder in (("changed", changed), ("everyone", everyone))
    }
    # Round 0: only the source has a distance (null messages are not sent), one message
    # per edge row out of it, duplicates included. Then the active vertices save messages.
    out_of_source = sum(1 for u, _, _ in small.triples if u == source)
    assert sent["changed"][0] == sent["everyone"][0] == out_of_source
    assert sum(sent["changed"]) < sum(sent["everyone"])


def test_pregel_on_blocks_sends_against_the_edges(spark, small):
    target = vid(5)  # dangling: the distance of every vertex to it
    rows = pregel(
        small.g,
        send_to_src=Pregel.dst("dist") + Pregel.edge("weight"),
        method="blocks",
        blocks=3,
        progress=False,
        **sssp(target),
    ).collect()
    expected = nx.single_source_dijkstra_path_length(small.nx.reverse(), target)
    assert reached(column(rows, "dist"), expected)


# -- random graphs: blocks against the vector path -------------------------------------------


def random_case(spark, seed: int, vertices: int = 200, edges: int = 800) -> Case:
    """Random directed edges with a self-loop and duplicates, 10 isolated vertices, and ids
    scattered over negative and positive numbers."""
    rng = np.random.default_rng(seed)
    ids = (rng.permutation(vertices + 10) * 3 - 250).tolist()
    ends = rng.integers(0, vertices, size=(edges, 2))
    triples = [(ids[a], ids[b], 1.0) for a, b in ends.tolist()]
    triples += [(ids[0], ids[0], 1.0), triples[0], triples[1]]
    return Case(spark, ids, triples)


@pytest.mark.parametrize(
    ("seed", "normalization"),
    [(0, "graphx"), pytest.param(1, "networkx", marks=SLOW), pytest.param(2, "graphx", marks=SLOW)],
)
def test_random_graphs_blocks_equal_the_vector_path(spark, seed, normalization):
    case = random_case(spark, seed)
    ranks, labels = {}, {}
    for method, blocks in (("blocks", 3), ("arrow", None)):
        options = {"method": method, "blocks": blocks, "progress": False}
        rows = pagerank(
            case.g, tol=None, max_rounds=4, normalization=normalization, **options
        ).collect()
        ranks[method] = column(rows, "pagerank")
        labels[method] = column(connected_components(case.g, **options).collect(), "component")
    assert close(ranks["blocks"], ranks["arrow"], 1e-12)
    expected, _ = power_iteration(case, 4, graphx=normalization == "graphx")
    assert close(ranks["blocks"], expected, 1e-12)
    assert labels["blocks"] == labels["arrow"] == weak_components(case.nx)


# -- bad input -------------------------------------------------------------------------------


def test_bad_method_and_block_counts_are_graph_errors(spark, small):
    with pytest.raises(GraphError, match="method='block'"):
        pagerank(small.g, method="block")
    with pytest.raises(GraphError, match="method='arrow'"):  # no vector path
        label_propagation(small.g, method="arrow")
    calls = [
        lambda b: pagerank(small.g, method="blocks", blocks=b, progress=False),
        lambda b: connected_components(small.g, method="blocks", blocks=b, progress=False),
        lambda b: label_propagation(small.g, method="blocks", blocks=b, progress=False),
        lambda b: shortest_paths(small.g, [vid(0)], method="blocks", blocks=b, progress=False),
        lambda b: weighted_shortest_paths(
            small.g, vid(0), method="blocks", blocks=b, progress=False
        ),
        lambda b: pregel(
            small.g,
            send_to_dst=Pregel.src("dist") + Pregel.edge("weight"),
            method="blocks",
            blocks=b,
            progress=False,
            **sssp(vid(0)),
        ),
    ]
    for call in calls:
        with pytest.raises(GraphError, match=r"blocks=0: give a number of blocks of at least 1"):
            call(0)
    for bad in (-2, 2.5, True, "3"):
        with pytest.raises(GraphError, match="blocks="):
            calls[0](bad)


def stray_run(spark, small, who: str):
    """Runs ``who`` on blocks with one more edge, to 12345, which is no vertex."""
    stray = Graph(
        small.g.vertices,
        small.g.edges.unionByName(
            spark.createDataFrame([(vid(2), 12345, 1.0)], "src long, dst long, weight double")
        ),
    )
    options = {"method": "blocks", "blocks": 2, "progress": False}
    if who == "pagerank":
        return pagerank(stray, **options)
    if who == "connected_components":
        return connected_components(stray, **options)
    if who == "shortest_paths":
        return shortest_paths(stray, [vid(3)], **options)
    return pregel(
        stray, send_to_src=Pregel.dst("dist") + Pregel.edge("weight"), **options, **sssp(vid(3))
    )


@pytest.mark.parametrize(
    "who",
    [
        "connected_components",
        "shortest_paths",
        pytest.param("pagerank", marks=SLOW),
        pytest.param("pregel", marks=SLOW),
    ],
)
def test_an_edge_to_no_vertex_is_named_on_the_block_path(spark, small, who):
    """The error names the end of the edge as given, also where the block path turns the
    edges around (both ways for components, against them for shortest paths, and for
    messages to ``src``)."""
    with pytest.raises(GraphError) as raised:
        stray_run(spark, small, who)
    message = str(raised.value)
    assert message.startswith(f"{who}(): edges must join vertices"), message
    assert "not a vertex 'id' ('dst' 12345)" in message, message
