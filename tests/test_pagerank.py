"""PageRank on iterflow agrees with networkx (same normalization: ranks sum to 1,
dangling mass spread uniformly, alpha 0.85)."""

from __future__ import annotations

import networkx as nx
import pytest
from pyspark.sql import SparkSession

from iterflow.cli import main
from iterflow.demo.pagerank_demo import pagerank, random_graph

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pagerank_matches_networkx_on_random_graphs_with_dangling_vertices(
    spark: SparkSession, seed: int
) -> None:
    n = 150
    vertices, edges = random_graph(spark, n, 900, seed=seed, dangling_fraction=0.15)
    edge_list = [(r["src"], r["dst"]) for r in edges.collect()]
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(edge_list)
    dangling = [v for v in graph if graph.out_degree(v) == 0]
    assert len(dangling) >= 0.15 * n - 1  # the case under test really has dangling vertices

    result = pagerank(vertices, edges, tol=1e-10, max_rounds=200)
    assert result.termination.reason == "converged"
    assert result.history[-1].converged_value <= 1e-10
    got = {r["id"]: r["rank"] for r in result.outputs["ranks"].collect()}
    expected = nx.pagerank(graph, alpha=0.85, tol=1e-13, max_iter=1000)
    assert got.keys() == expected.keys()
    assert max(abs(got[v] - expected[v]) for v in expected) < 1e-6
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    # ctx.observe counted the contribution rows: one per vertex with an in-edge from a
    # vertex that has out-edges, which is every edge target.
    targets = len({dst for _, dst in edge_list})
    assert {p.observed["contributions"] for p in result.history} == {targets}
    assert all(p.rows["ranks"] == n for p in result.history)
    # After round 5 the backlog estimate is within 30% of the rounds that remained.
    remained = result.rounds - 6
    estimate = result.history[5].rounds_remaining_estimate
    assert estimate is not None
    assert abs(estimate - remained) <= 0.3 * remained
    result.release()


def test_fixed_rounds_stop_on_max_rounds(spark: SparkSession) -> None:
    vertices, edges = random_graph(spark, 50, 200, seed=7)
    result = pagerank(vertices, edges, tol=None, max_rounds=3)
    assert result.rounds == 3
    assert result.termination.reason == "max_rounds"
    assert all(p.converged_value is None for p in result.history)
    result.release()


def test_demo_command_prints_rounds_termination_and_top_vertices(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "pagerank", "--vertices", "120", "--tol", "1e-6", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "termination: converged" in out
    assert "top 3 vertices:" in out
    ranks = [float(line.split()[1]) for line in out.splitlines()[-3:]]
    assert ranks == sorted(ranks, reverse=True) and all(0 < r < 1 for r in ranks)
