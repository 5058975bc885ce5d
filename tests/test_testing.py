"""iterflow.testing: assertions with evidence on good and bad runs, `iterflow converge`, and
the pytest plugin in a fresh project."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.testing import (
    ConvergenceAssertionError,
    assert_converges,
    assert_frame_close,
    assert_monotone,
    assert_rate,
    assert_terminated_by,
    observed_rate,
)

pytestmark = pytest.mark.spark


def iterate(spark: SparkSession, step: Any, rounds: int = 8, tol: float = 1e-3) -> Any:
    """Iterate ``v -> step(v, epoch)`` on one value; the convergence value is |v - 1|, the
    gauge ``value`` is v; stops when |v - 1| <= tol or after ``rounds`` rounds."""
    gauge = itf.metrics.gauge("value")

    @itf.body
    def body(x: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        v = float(x.collect()[0]["v"])
        new = step(v, ctx.epoch)
        gauge.set(new)
        following = x.sparkSession.createDataFrame([(new,)], "v double")
        return itf.Declaration(feedback={"x": following}, outputs={"x": following})

    return (
        itf.BoundedIteration(body)
        .bind("x", spark.createDataFrame([(3.0,)], "v double"))
        .until(itf.max_rounds(rounds))
        .until(itf.converged(lambda end: abs(end.variables["x"].collect()[0]["v"] - 1.0), tol))
        .run(progress=False)
    )


def contracting(v: float, epoch: int) -> float:  # v -> 1 + (v - 1) / 4: rate 0.25
    return 1.0 + (v - 1.0) / 4.0


def test_a_good_run_passes_every_assertion(spark: SparkSession) -> None:
    result = iterate(spark, contracting)
    assert_converges(result, tol=1e-3, within=8)
    assert_terminated_by(result, "converged")
    assert_monotone(result, "converged_value")
    assert_monotone(result, "value")  # 3, 1.5, 1.125, ... falls to 1
    assert_rate(result, "converged_value", at_most=0.3)
    assert observed_rate([v.converged_value for v in result.history]) == pytest.approx(0.25)
    keyed = result.outputs["x"].withColumn("k", F.lit(1))
    assert_frame_close(keyed, [{"k": 1, "v": 1.0}], key="k", atol=1e-3)


def test_a_diverging_run_fails_with_its_last_rounds(spark: SparkSession) -> None:
    result = iterate(spark, lambda v, epoch: 2.0 * v, rounds=6)
    with pytest.raises(ConvergenceAssertionError) as info:
        assert_converges(result, tol=1e-3)
    message = str(info.value)
    assert "ran out of rounds (max_rounds)" in message and "above tol=0.001" in message
    assert "epoch 5: converged_value=191" in message  # 3 * 2**6 - 1, the evidence
    assert "epoch 0" not in message  # only the last 5 rounds
    with pytest.raises(ConvergenceAssertionError, match="value rose from 6 at epoch 0 to 12"):
        assert_monotone(result, "value")
    with pytest.raises(ConvergenceAssertionError, match="expected termination by 'converged'"):
        assert_terminated_by(result, "converged")
    assert_terminated_by(result, "max_rounds")


def test_a_stalled_run_fails_the_rate(spark: SparkSession) -> None:
    # Halves the distance once, then barely moves: it never gets within tol.
    result = iterate(spark, lambda v, epoch: 2.0 if epoch == 0 else 1.0 + (v - 1.0) * 0.999)
    with pytest.raises(ConvergenceAssertionError) as info:
        assert_rate(result, "converged_value", at_most=0.5)
    assert "shrinks by a factor of 0.99" in str(info.value)
    assert "epoch 7: converged_value=0.99" in str(info.value)
    with pytest.raises(ConvergenceAssertionError, match="within=3"):
        assert_converges(result, within=3)


def test_a_run_converging_to_the_wrong_answer_fails_the_frame_check(spark: SparkSession) -> None:
    result = iterate(spark, contracting)
    assert_converges(result, tol=1e-3)  # it converged...
    with pytest.raises(ConvergenceAssertionError) as info:  # ...but not to 2
        assert_frame_close(
            result.outputs["x"].withColumn("k", F.lit(1)), [{"k": 1, "v": 2.0}], key="k"
        )
    message = str(info.value)
    assert "1 of 1 rows differ" in message and "v (expected)" in message and "2.0" in message


def test_an_oscillating_run_fails_monotone_and_rate(spark: SparkSession) -> None:
    result = iterate(spark, lambda v, epoch: 1.5 if epoch % 2 else 1.25)
    with pytest.raises(ConvergenceAssertionError) as info:
        assert_monotone(result, "converged_value")
    assert "converged_value rose from 0.25 at epoch 0 to 0.5 at epoch 1" in str(info.value)
    # With a tolerance above the swing, it counts as monotone.
    assert_monotone(result, "converged_value", tolerance=0.3)
    with pytest.raises(ConvergenceAssertionError, match=r"slower than at_most=0\.9"):
        assert_rate(result, "converged_value", at_most=0.9)


def test_a_fitted_model_and_a_metric_from_iterflow_ml(spark: SparkSession) -> None:
    from iterflow.ml import linear_regression

    df = spark.createDataFrame(
        [(x / 5, 2.0 * x / 5 + 1.0) for x in range(-5, 6)], "x double, label double"
    )
    model = linear_regression(
        df, features=["x"], solver="gd", learning_rate=1.0, tol=1e-8, max_rounds=300, progress=False
    )
    assert_converges(model)
    assert_monotone(model, "loss")
    with pytest.raises(itf.IterflowError, match=r"has a value for 'nope'.*loss"):
        assert_monotone(model, "nope")
    with pytest.raises(itf.IterflowError, match="expected an iteration's result"):
        assert_converges(df)


def test_frame_close_takes_each_kind_of_expected_and_names_key_differences(
    spark: SparkSession,
) -> None:
    actual = spark.createDataFrame(
        [(1, 0.5, "a", [1.0, 2.0]), (2, 0.25, "b", [3.0])],
        "id long, x double, s string, v array<double>",
    )
    rows = [
        {"id": 2, "x": 0.25 + 1e-9, "s": "b", "v": [3.0]},
        {"id": 1, "x": 0.5, "s": "a", "v": [1.0, 2.0]},
    ]
    assert_frame_close(actual, rows, key="id")
    assert_frame_close(actual, pd.DataFrame(rows), key=["id"])
    assert_frame_close(actual, spark.createDataFrame(actual.toPandas()), key="id")
    assert_frame_close(
        actual.select("id", "x"), [{"id": 1, "x": 0.51}, {"id": 2, "x": 0.25}], key="id", atol=0.02
    )
    with pytest.raises(ConvergenceAssertionError) as info:
        assert_frame_close(actual, [{"id": 1, "s": "a"}, {"id": 3, "s": "c"}], key="id")
    message = str(info.value)
    assert "1 expected key(s) missing from actual_df, e.g. [{'id': 3}]" in message
    assert "1 key(s) in actual_df that are not expected, e.g. [{'id': 2}]" in message
    with pytest.raises(ConvergenceAssertionError, match="1 of 2 rows differ"):
        assert_frame_close(actual, [{"id": 1, "v": [1.0, 2.5]}, {"id": 2, "v": [3.0]}], key="id")
    with pytest.raises(ConvergenceAssertionError, match="no column"):
        assert_frame_close(actual, [{"id": 1, "y": 1.0}], key="id")
    with pytest.raises(itf.IterflowError, match="duplicate keys"):
        assert_frame_close(actual, [{"id": 1}, {"id": 1}], key="id")
    with pytest.raises(itf.IterflowError, match="list of dicts"):
        assert_frame_close(actual, 42, key="id")


def test_frame_close_compares_maps_and_structs_within_the_tolerances(spark: SparkSession) -> None:
    # As pyspark.testing.assertDataFrameEqual does: nested numbers within rtol/atol too.
    actual = spark.createDataFrame(
        [(1, {"a": 1.0}, (2.0, "x")), (2, {"a": float("nan")}, (None, "y"))],
        "id long, m map<string, double>, s struct<v: double, t: string>",
    )
    close = [
        {"id": 1, "m": {"a": 1.0 + 1e-9}, "s": (2.0 + 1e-9, "x")},
        {"id": 2, "m": {"a": None}, "s": (None, "y")},  # a missing value equals NaN
    ]
    assert_frame_close(actual, spark.createDataFrame(close, actual.schema), key="id")
    far = [{**close[0], "s": (2.1, "x")}, close[1]]
    with pytest.raises(ConvergenceAssertionError, match="1 of 2 rows differ"):
        assert_frame_close(actual, spark.createDataFrame(far, actual.schema), key="id")
    with pytest.raises(ConvergenceAssertionError, match="1 of 2 rows differ"):  # NaN is no 1.0
        assert_frame_close(
            actual, [{"id": 1, "m": {"a": 1.0}}, {"id": 2, "m": {"a": 1.0}}], key="id"
        )


BROKEN_CASES = """
import numpy as np
from iterflow.testing import ConvergenceCase
from iterflow.testing import builtin

# The real k-means, judged against a reference that is off by one.
WRONG = ConvergenceCase(
    name="kmeans-against-a-wrong-answer",
    run=builtin.KMEANS.run,
    reference=lambda: builtin.KMEANS.reference() + 1.0,
    error=builtin.KMEANS.error,
    tol=1e-6,
)

def crash(spark, listen):
    raise RuntimeError("the case itself is broken")

CRASHING = ConvergenceCase(
    name="crashing", run=crash, reference=lambda: 0, error=lambda a, b: 0.0, tol=1.0
)
"""


def test_iterflow_converge_runs_the_built_in_cases_and_names_a_broken_one(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from iterflow.cli import main

    report, plot = tmp_path / "report.json", tmp_path / "errors.png"
    assert main(["converge", "--report", str(report), "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "5 of 5 cases passed" in out
    document = json.loads(report.read_text())
    assert document["passed"] is True
    cases = {c["name"]: c for c in document["cases"]}
    assert set(cases) == {
        "pagerank",
        "connected-components",
        "kmeans",
        "linear-regression",
        "logistic-regression",
    }
    for case in cases.values():
        assert case["final_error"] <= case["tol"] and case["rounds"] >= 1
        assert len(case["errors"]) == case["rounds"]  # an error for every round
    # PageRank's error shrinks geometrically, roughly by alpha = 0.85 per round or faster.
    assert cases["pagerank"]["rate"] < 0.9
    assert plot.stat().st_size > 10_000

    (tmp_path / "broken_cases.py").write_text(BROKEN_CASES)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["converge", "broken_cases", "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert "0 of 2 cases passed" in out
    assert "kmeans-against-a-wrong-answer: final error 1 is above tol=1e-06" in out
    assert "crashing: raised RuntimeError: the case itself is broken" in out
    assert json.loads(report.read_text())["passed"] is False

    assert main(["converge", "--list"]) == 0
    assert "kmeans: k-means" in capsys.readouterr().out
    assert main(["converge", "--case", "nope"]) == 3
    assert "no case named ['nope']" in capsys.readouterr().err
    assert main(["converge", "no_such_module_here"]) == 3


@pytest.mark.slow_spark  # a project of its own with its own Spark session
def test_the_plugin_works_in_a_fresh_project(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(
        textwrap.dedent(
            """
            import pytest
            import iterflow as itf
            from iterflow.testing import assert_converges, assert_frame_close

            @pytest.mark.slow_spark
            def test_halving(spark):
                @itf.body
                def halve(x):
                    half = x.selectExpr("v / 2 AS v")
                    return itf.Declaration(
                        feedback={"x": half}, outputs={"x": half},
                        until=itf.converged(half.agg({"v": "max"}), 0.01),
                    )

                result = itf.BoundedIteration(halve).bind(
                    "x", spark.createDataFrame([(1.0,)], "v double")).run(progress=False)
                assert_converges(result, tol=0.01, within=7)
                assert_frame_close(result.outputs["x"], [{"v": 2.0 ** -7}], key="v")
                assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
            """
        )
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\niterflow_shuffle_partitions = 3\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
