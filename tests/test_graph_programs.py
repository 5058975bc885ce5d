"""Vertex programs in numpy (iterflow.graph.VertexProgram) run by pregel(program=...):
shortest paths, components and PageRank as a user writes them, against networkx and
against the same programs written as Column expressions on the DataFrame path."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from pyspark.sql import functions as F

from iterflow.graph import Graph, GraphError, Pregel, VertexProgram, pregel


def random_graph(spark, n=60, m=180, seed=3):
    rng = random.Random(seed)
    pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(m)]
    pairs += [(0, 0), (1, 2), (1, 2)]  # a self-loop and a repeated edge; n - 1 is isolated
    pairs = [(a, b) for a, b in pairs if n - 1 not in (a, b)]
    km = [round(rng.uniform(0.5, 9.5), 3) for _ in pairs]
    g = Graph(
        spark.createDataFrame([(i, f"v{i}") for i in range(n)], "id long, name string"),
        spark.createDataFrame(
            [(a, b, k) for (a, b), k in zip(pairs, km, strict=True)],
            "src long, dst long, km double",
        ),
    )
    return g, pairs, km


SSSP = VertexProgram(
    state={"dist": np.float64},
    init=lambda v: {"dist": np.where(v["id"].to_numpy() == 1, 0.0, np.inf)},
    send_to_dst=lambda src, dst, e: np.where(
        np.isfinite(src["dist"]), src["dist"] + e["km"], np.nan
    ),
    merge="min",
    apply=lambda s, m, got: (
        {"dist": np.where(got, np.fmin(s["dist"], m), s["dist"])},
        got & (m < s["dist"]),
    ),
)


def test_shortest_paths_by_length_match_networkx_and_the_dataframe_path(spark):
    g, pairs, km = random_graph(spark)
    rows = pregel(g, program=SSSP, max_rounds=100).collect()
    h = nx.DiGraph()
    h.add_nodes_from(range(60))
    for (a, b), k in zip(pairs, km, strict=True):
        if not h.has_edge(a, b) or h[a][b]["km"] > k:
            h.add_edge(a, b, km=k)
    reference = nx.single_source_dijkstra_path_length(h, 1, weight="km")
    got = {r.id: r.dist for r in rows}
    assert {v for v, d in got.items() if np.isfinite(d)} == set(reference)
    assert all(got[v] == pytest.approx(d, abs=1e-9) for v, d in reference.items())
    assert {r.name for r in rows} == {f"v{i}" for i in range(60)}
    frame = pregel(
        g,
        init={"dist": F.when(F.col("id") == 1, 0.0).otherwise(float("inf"))},
        update={"dist": F.least(F.col("dist"), Pregel.msg())},
        send_to_dst=Pregel.src("dist") + Pregel.edge("km"),
        aggregate=F.min,
        max_rounds=100,
    )
    same = {r.id: r.dist for r in frame.collect()}
    assert all(abs(same[v] - got[v]) <= 1e-12 or same[v] == got[v] for v in got)


def test_components_by_smallest_label_both_ways_match_networkx(spark):
    g, pairs, _ = random_graph(spark, seed=5)
    program = VertexProgram(
        state={"label": np.int64},
        init=lambda v: {"label": v["id"].to_numpy().astype(np.int64)},
        send_to_dst=lambda src, dst, e: np.ma.masked_array(
            src["label"], src["label"] >= dst["label"]
        ),
        send_to_src=lambda src, dst, e: np.ma.masked_array(
            dst["label"], dst["label"] >= src["label"]
        ),
        merge=np.minimum,
        apply=lambda s, m, got: (
            {"label": np.where(got, np.minimum(s["label"], m), s["label"])},
            got & (m < s["label"]),
        ),
    )
    labels = {r.id: r.label for r in pregel(g, program=program).collect()}
    h = nx.Graph()
    h.add_nodes_from(range(60))
    h.add_edges_from(pairs)
    for component in nx.connected_components(h):
        assert {labels[v] for v in component} == {min(component)}


def test_pagerank_as_a_user_writes_it_matches_networkx(spark):
    rng = random.Random(7)
    n = 40
    pairs = sorted({(a, (a + 1 + rng.randrange(n - 1)) % n) for a in range(n) for _ in range(3)})
    g = Graph(
        spark.createDataFrame([(i,) for i in range(n)], "id long"),
        spark.createDataFrame(pairs, "src long, dst long"),
    )
    out = np.bincount([a for a, _ in pairs], minlength=n).astype(float)
    # the out-degree travels as a second state column the program keeps
    program = VertexProgram(
        state={"rank": np.float64, "out": np.float64},
        init=lambda v: {"rank": np.full(v.num_rows, 1.0 / n), "out": out[v["id"].to_numpy()]},
        send_to_dst=lambda src, dst, e: src["rank"] / src["out"],
        merge="sum",
        apply=lambda s, m, got: (
            {"rank": 0.15 / n + 0.85 * m, "out": s["out"]},
            np.ones(len(m), dtype=bool),
        ),
    )
    ranks = {r.id: r.rank for r in pregel(g, program=program, max_rounds=200).collect()}
    reference = nx.pagerank(nx.DiGraph(pairs), alpha=0.85, tol=1e-14, max_iter=1000)
    assert all(ranks[v] == pytest.approx(reference[v], abs=1e-9) for v in range(n))


def test_bad_programs_are_graph_errors(spark):
    with pytest.raises(GraphError, match="send_to_dst=, send_to_src="):
        VertexProgram(state={"x": np.float64}, init=dict, apply=lambda s, m, g: (s, g))
    with pytest.raises(GraphError, match="merge='mean'"):
        VertexProgram(
            state={"x": np.float64},
            init=dict,
            apply=lambda s, m, g: (s, g),
            send_to_dst=lambda s, d, e: s["x"],
            merge="mean",
        )
    with pytest.raises(GraphError, match="not supported"):
        VertexProgram(
            state={"x": np.complex128},
            init=dict,
            apply=lambda s, m, g: (s, g),
            send_to_dst=lambda s, d, e: s["x"],
        )
    g, _, _ = random_graph(spark, n=5, m=5)
    with pytest.raises(GraphError, match="either program="):
        pregel(g, program=SSSP, init={"dist": F.lit(0.0)}, update={})
    with pytest.raises(GraphError, match="method='dataframe' is for programs written as Column"):
        pregel(g, program=SSSP, method="dataframe")
    reads_the_receiver = VertexProgram(
        state={"x": np.float64},
        init=lambda v: {"x": np.zeros(v.num_rows)},
        send_to_dst=lambda s, d, e: s["x"] - d["x"],
        apply=lambda s, m, got: (s, got),
    )
    with pytest.raises(GraphError, match="reads 'x' of the destination"):
        pregel(g, program=reads_the_receiver, method="blocks")


@pytest.mark.parametrize("blocks", [1, 3])
def test_numpy_programs_on_the_block_path_equal_the_vector_path(spark, blocks):
    g, _, _ = random_graph(spark)
    vector = {r.id: r.dist for r in pregel(g, program=SSSP, max_rounds=100).collect()}
    on_blocks = pregel(g, program=SSSP, method="blocks", blocks=blocks, max_rounds=100)
    rows = on_blocks.collect()
    assert {r.id: r.dist for r in rows} == pytest.approx(vector)
    assert {r.name for r in rows} == {f"v{i}" for i in range(60)}


def test_a_round_finds_its_senders_edges_by_mask_or_binary_search():
    from iterflow.graph.programs import _senders

    rng = np.random.default_rng(1)
    for _ in range(200):
        n, m = int(rng.integers(1, 50)), int(rng.integers(0, 300))
        sources = np.sort(rng.integers(0, n, m))
        active = rng.random(n) < rng.random() * 0.3
        picked = _senders(sources, active)
        positions = np.flatnonzero(picked) if picked.dtype == bool else picked
        assert np.array_equal(positions, np.flatnonzero(active[sources]))
