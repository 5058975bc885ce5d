"""The README's example and the guide's runnable examples give the right results."""

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


GUIDE = EXAMPLES.parent / "docs" / "guide.md"


def guide_example(section: str) -> str:
    """The first Python block under the ``## section`` heading of docs/guide.md."""
    text = GUIDE.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return text.split("```python\n", 1)[1].split("\n```", 1)[0]


def numpy_em(x, weights, means, covs, rounds):
    """Gaussian-mixture EM in numpy and scipy: the model after ``rounds`` steps, and the
    log-likelihood under the model the last step started from."""
    from scipy.stats import multivariate_normal

    for _ in range(rounds):
        joint = np.column_stack(
            [
                w * multivariate_normal(m, c).pdf(x)
                for w, m, c in zip(weights, means, covs, strict=True)
            ]
        )
        loglik = np.log(joint.sum(axis=1)).sum()
        r = joint / joint.sum(axis=1, keepdims=True)
        n = r.sum(axis=0)
        means = (r.T @ x) / n[:, None]
        covs = np.array(
            [(r[:, k] * (x - means[k]).T) @ (x - means[k]) / n[k] for k in range(len(n))]
        )
        weights = n / n.sum()
    return weights, means, covs, loglik


def test_the_guides_gaussian_mixture_matches_numpy(spark: SparkSession) -> None:
    code = guide_example("Custom aggregates: itf.combine")
    scope: dict = {"__name__": "guide_example"}
    exec(compile(code, f"{GUIDE}: Custom aggregates", "exec"), scope)
    result, k, d = scope["result"], scope["K"], scope["D"]
    start = scope["start"].collect()[0]
    weights, means, covs, loglik = numpy_em(
        scope["x"],
        np.array(start["weights"]),
        np.reshape(start["means"], (k, d)),
        np.reshape(start["covs"], (k, d, d)),
        result.rounds,
    )
    fitted = scope["fitted"]
    assert result.rounds == 25
    np.testing.assert_allclose(fitted["weights"], weights, rtol=1e-9)
    np.testing.assert_allclose(np.reshape(fitted["means"], (k, d)), means, rtol=1e-9)
    np.testing.assert_allclose(np.reshape(fitted["covs"], (k, d, d)), covs, rtol=1e-9, atol=1e-12)
    assert fitted["loglik"] == pytest.approx(loglik, rel=1e-12)
    result.release()


def test_event_time_example_counts_each_minute_updates_it_and_keeps_the_late_click(
    spark: SparkSession,
) -> None:
    scope = runpy.run_path(str(EXAMPLES / "event_time_windows.py"), run_name="example")
    minutes = sorted(tuple(r) for r in scope["minutes"].collect())
    assert minutes == [
        ("12:00", "home", 0, 1, 1),
        ("12:00", "home", 1, 2, 2),  # the late click within lateness: counted again
        ("12:00", "shop", 0, 1, 1),
        ("12:01", "home", 0, 1, 3),
        ("12:02", "shop", 0, 1, 3),
        ("12:09", "home", 0, 1, 5),  # fired once the input ended
    ]
    late = scope["late"].read(spark).select("page", "epoch").collect()
    assert [tuple(r) for r in late] == [("shop", 4)]
    assert scope["query"].history[4].late_rows == {"minutes": 1}


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
