"""Every script in examples/ runs, on small data, and gives the right results
(examples/line_search.py runs in tests/test_nested.py; the docs' blocks in test_docs.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_connected_components_example_matches_networkx(spark: SparkSession) -> None:
    scope = runpy.run_path(str(EXAMPLES / "connected_components.py"), run_name="example")
    result = scope["result"]
    got = {r["id"]: r["label"] for r in result.outputs["labels"].collect()}
    graph = nx.Graph([(1, 2), (2, 3), (4, 5)])
    expected = {
        v: min(component) for component in nx.connected_components(graph) for v in component
    }
    assert got == expected
    assert result.termination.reason == "criteria_empty"
    assert result.rounds == 3  # labels settle in round 1, round 2 changes nothing
    result.release()


def test_event_time_example_counts_each_minute_updates_it_and_keeps_the_late_click(
    spark: SparkSession,
) -> None:
    scope = runpy.run_path(str(EXAMPLES / "event_time_windows.py"), run_name="example")
    minutes = sorted(tuple(r) for r in scope["minutes"].collect())
    assert minutes == [
        ("12:00", "home", 0, 1, 1),  # due after the first file: one epoch without input
        ("12:00", "home", 1, 2, 2),  # the late click within lateness: counted again
        ("12:00", "shop", 0, 1, 1),
        ("12:01", "home", 0, 1, 2),  # the second file's 12:09 click makes them due at once
        ("12:02", "shop", 0, 1, 2),
        ("12:09", "home", 0, 1, 4),  # fired once the input ended
    ]
    late = scope["late"].read(spark).select("page", "epoch").collect()
    assert [tuple(r) for r in late] == [("shop", 3)]
    assert scope["query"].history[3].late_rows == {"minutes": 1}


def test_ml_pipeline_example_tunes_like_mllib(spark: SparkSession, monkeypatch) -> None:
    from pyspark.ml.classification import LogisticRegression as MLlibLogistic

    monkeypatch.setattr("sys.argv", ["ml_pipeline.py", "3000"])
    scope = runpy.run_path(str(EXAMPLES / "ml_pipeline.py"), run_name="example")
    assert scope["same"] is True
    best = scope["best"]
    # MLlib's estimator in the same fitted pipeline's place, with the chosen regParam.
    reference = best.stages[-1].getRegParam()
    stages = [*scope["pipeline"].getStages()[:-1], MLlibLogistic(regParam=reference, tol=1e-6)]
    theirs = type(scope["pipeline"])(stages=stages).fit(scope["df"]).stages[-1]
    np.testing.assert_allclose(
        best.stages[-1].coefficients.toArray(), theirs.coefficients.toArray(), atol=1e-3
    )


def run_example(name: str, monkeypatch: pytest.MonkeyPatch, *argv: str) -> dict:
    """Run ``examples/<name>`` as a script with ``argv`` (its small-data switch)."""
    monkeypatch.setattr("sys.argv", [name, *argv])
    return runpy.run_path(str(EXAMPLES / name), run_name="__main__")


def test_every_example_has_a_test() -> None:
    here = Path(__file__).read_text()
    nested = (Path(__file__).parent / "iteration_kill_job.py").read_text()
    for example in EXAMPLES.glob("*.py"):
        assert f'"{example.name}"' in here or example.name in nested, example.name


def test_kmeans_example_finds_the_four_centers(spark: SparkSession, monkeypatch) -> None:
    scope = run_example("kmeans.py", monkeypatch, "2000")
    model = scope["model"]
    found = sorted(map(tuple, np.round(model.centroids)))
    assert found == [(0.0, 0.0), (0.0, 8.0), (8.0, 0.0), (8.0, 8.0)]
    assert model.termination.reason == "converged"


def test_logistic_regression_example_recovers_the_coefficients(
    spark: SparkSession, monkeypatch
) -> None:
    scope = run_example("logistic_regression.py", monkeypatch, "4000")
    model, df = scope["model"], scope["df"]
    # 4000 noisy labels: the fit lands near the true coefficients; the signs and
    # rough sizes of the true coefficients (1.5, -2.0, 0.5; intercept -0.5) are enough here.
    assert np.allclose(model.coefficients.toArray(), [1.5, -2.0, 0.5], atol=0.3)
    assert abs(model.intercept + 0.5) < 0.3
    objective = model.summary.objectiveHistory
    assert objective[-1] < objective[0]
    accuracy = (
        model.transform(df).selectExpr("avg(CAST(prediction = label AS INT)) AS a").first()["a"]
    )
    assert accuracy > 0.75


def test_online_kmeans_example_finds_the_true_centers(spark: SparkSession, monkeypatch) -> None:
    scope = run_example("online_kmeans.py", monkeypatch, "3")
    errors = scope["nearest_distances"](scope["centers"], scope["true_centers"])
    assert scope["last"] == 2  # one epoch per file
    assert max(errors) < 0.5


def test_pagerank_example_ranks_like_networkx(spark: SparkSession, monkeypatch) -> None:
    scope = run_example("pagerank.py", monkeypatch, "60", "1e-6")
    result = scope["result"]
    ranks = dict(zip(scope["ranks"]["id"], scope["ranks"]["rank"], strict=True))
    edges = [(r["src"], r["dst"]) for r in scope["edges"].collect()]
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(ranks)
    expected = nx.pagerank(graph, alpha=0.85, tol=1e-12)
    assert result.termination.reason == "converged"
    assert ranks.keys() == expected.keys()
    assert max(abs(ranks[v] - expected[v]) for v in ranks) < 1e-5


def test_streaming_graph_example_follows_the_edges_that_come_and_go(spark: SparkSession) -> None:
    scope = runpy.run_path(str(EXAMPLES / "streaming_graph.py"), run_name="example")
    by_epoch: dict[int, dict[int, int]] = {}
    for row in scope["components"].collect():
        by_epoch.setdefault(row["epoch"], {})[row["id"]] = row["component"]
    edges: set[tuple[int, int]] = set()
    for epoch, (added, deleted) in enumerate(zip(scope["ADDED"], scope["DELETED"], strict=True)):
        edges = (edges | set(added)) - set(deleted)
        graph = nx.Graph(sorted(edges))
        graph.add_nodes_from(v for pairs in scope["ADDED"][: epoch + 1] for e in pairs for v in e)
        expected = {v: min(c) for c in nx.connected_components(graph) for v in c}
        assert by_epoch[epoch] == expected
    moved = {(r["epoch"], r["id"]) for r in scope["moves"].collect()}
    assert moved == {(0, v) for v in range(1, 6)} | {(1, v) for v in (4, 5, 6, 7)} | {
        (2, v) for v in (4, 5, 6, 7)
    }
