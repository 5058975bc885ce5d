"""method="auto" by measured cost: the cost model's choices at the benchmarked sizes, the
rounds PageRank expects, and the vector limit that still caps the vector path."""

from __future__ import annotations

import logging

import pytest

from iterflow.graph import Graph
from iterflow.graph.methods import COSTS, PathCost, cheaper_path, choose_method, pagerank_rounds


@pytest.mark.parametrize(
    ("edges", "rounds", "expected"),
    [
        (1_000_000, 10, "arrow"),  # bench_graph_cost: 3.3-4.2 s against 6.7 s
        (5_000_000, 10, "arrow"),  # 10.2 s against 12.1 s
        (20_000_000, 10, "blocks"),  # 40.4-49.8 s against 29.3 s
        (20_000_000, 100, "arrow"),  # rounds of 0.6 s against 1.45 s
    ],
)
def test_pagerank_takes_the_faster_path_measured(edges: int, rounds: int, expected: str) -> None:
    assert cheaper_path("pagerank", edges, rounds) == expected


@pytest.mark.parametrize("edges", [1_000_000, 5_000_000, 20_000_000])
def test_components_stay_on_the_vector_path_that_measured_faster(edges: int) -> None:
    # bench_graph_cost: 2.6 / 6.6 / 35.6 s against 8.3 / 18.4 / 57.7 s on blocks
    assert cheaper_path("connected_components", edges, None) == "arrow"


def test_the_model_adds_prepare_rounds_and_finish() -> None:
    cost = PathCost((1.0, 1e-6), (0.5, 0.0), (2.0, 0.0), usual_rounds=3)
    assert cost.seconds(1_000_000, None) == pytest.approx(1.0 + 1.0 + 2 * 0.5 + 2.0)
    assert cost.seconds(0, 1) == pytest.approx(3.0)  # round 0 is part of preparing
    assert set(COSTS) == {
        (f, p) for f in ("pagerank", "connected_components") for p in ("arrow", "blocks")
    }


def test_pagerank_expects_the_rounds_its_tolerance_needs() -> None:
    assert pagerank_rounds(0.85, None, 37) == 37
    assert pagerank_rounds(0.85, 1e-8, 100) == 100  # 0.85 ** k * 2 <= 1e-8 needs 119
    assert pagerank_rounds(0.85, 1e-3, 100) == 48
    assert pagerank_rounds(0.5, 1.0, 100) == 2


@pytest.mark.spark
def test_auto_counts_the_edges_and_says_what_it_chose(spark, monkeypatch, caplog) -> None:
    vertices = spark.range(6)
    edges = spark.createDataFrame([(i, (i + 1) % 6) for i in range(6)], "src LONG, dst LONG")
    g = Graph(vertices, edges)
    with caplog.at_level(logging.INFO, logger="iterflow.graph"):
        assert choose_method("pagerank", "auto", g, rounds=10) == ("arrow", 6)
    assert "for 6 edges and 10 rounds" in caplog.text
    cheap = PathCost((0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    monkeypatch.setitem(COSTS, ("pagerank", "blocks"), cheap)
    assert choose_method("pagerank", "auto", g, rounds=10) == ("blocks", 6)
    assert choose_method("pagerank", "arrow", g) == ("arrow", 6)  # a method named is kept
    # an algorithm without a vector path keeps its own below the limit
    assert choose_method("shortest_paths", "auto", g, below_limit="dataframe")[0] == "dataframe"
