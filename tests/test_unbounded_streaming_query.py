"""Code written for Structured Streaming's ``StreamingQuery`` against an ``UnboundedQuery``:
its names (``id``, ``runId``, ``name``, ``isActive``, ``awaitTermination``,
``processAllAvailable``, ``lastProgress``, ``recentProgress``, ``status``, ``explain``,
``exception()``), ``start(query_name=...)`` and the ``with`` block that stops it."""

from __future__ import annotations

import time

import pytest
from pyspark.sql import functions as F
from test_unbounded import numbers_stream, running_sum, write_numbers

import iterflow as itf
from iterflow.errors import IterflowError, IterflowValueError

pytestmark = pytest.mark.spark


def iteration(spark, folder):
    return (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, folder))
    )


def progress_of(query, batch: int) -> dict:
    """``lastProgress`` once the stream has reported ``batch`` (it reports just after the
    batch commits)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        last = query.lastProgress
        if last is not None and last["batchId"] >= batch:
            return last
        time.sleep(0.05)
    raise AssertionError(f"no progress of micro-batch {batch}: {query.lastProgress}")


def test_streaming_query_code_runs_against_an_unbounded_query(spark, tmp_path, capsys):
    write_numbers(tmp_path / "in", [[1, 2, 3], [10, 20]])
    ckpt = str(tmp_path / "ckpt")
    with iteration(spark, tmp_path / "in").start(checkpoint_location=ckpt, query_name="sums") as q:
        assert q.name == "sums" and q.isActive and q.exception() is None
        assert "sums" in [s.name for s in spark.streams.active]
        q.processAllAvailable()
        last = progress_of(q, 1)
        assert last["numInputRows"] == 2
        assert [e["epoch"] for e in last["iterflow"]["epochs"]] == [1]
        assert last["iterflow"]["epochs"][0]["input_rows"] == {"numbers": 2}
        assert last["iterflow"]["feedback_rows_in_flight"] == 0
        recent = q.recentProgress
        assert [p["batchId"] for p in recent] == [0, 1]
        assert [[e["epoch"] for e in p["iterflow"]["epochs"]] for p in recent] == [[0], [1]]
        assert q.awaitTermination(0.05) is False
        status = q.status
        assert {"message", "isDataAvailable", "isTriggerActive"} <= set(status)
        assert status["state"] == "running" and status["epoch"] == 1
        q.explain()
        assert "Physical Plan" in capsys.readouterr().out
        first_id, first_run = q.id, q.runId
    # The with block stopped it: the epochs committed, the stream is gone.
    assert not q.isActive and q.termination.reason == "stopped"
    assert q.awaitTermination() is None
    assert "sums" not in [s.name for s in spark.streams.active]

    # A restart from the same location is the same query (id), a new run (runId).
    write_numbers(tmp_path / "in", [[1, 2, 3], [10, 20], [100]])
    with iteration(spark, tmp_path / "in").start(checkpoint_location=ckpt) as again:
        again.processAllAvailable()
        assert again.id == first_id and again.runId != first_run
        assert again.name is None
        assert [e["epoch"] for e in progress_of(again, 2)["iterflow"]["epochs"]] == [2]
        assert again.history[-1].epoch == 2


@itf.body
def failing(total, numbers):
    bad = numbers.select((F.col("x") / F.lit(0)).alias("x")).agg(F.sum("x").alias("total"))
    raise_at = bad.select(F.raise_error(F.lit("boom in the body")).cast("long").alias("total"))
    return itf.Declaration(feedback={"total": raise_at}, outputs={"total": raise_at})


def test_await_termination_raises_the_failure_and_exception_returns_it(spark, tmp_path):
    write_numbers(tmp_path / "in", [[1]])
    query = (
        itf.UnboundedIteration(failing)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
    )
    with pytest.raises(Exception, match="boom in the body"):
        query.awaitTermination(60)
    assert query.exception() is query.error is not None
    assert not query.isActive
    with pytest.raises(IterflowError, match="awaitTermination"):
        query.awaitTermination(-1)


def test_a_query_name_must_be_a_non_empty_string(spark, tmp_path):
    write_numbers(tmp_path / "in", [[1]])
    with pytest.raises(IterflowValueError, match="query_name"):
        iteration(spark, tmp_path / "in").start(
            checkpoint_location=str(tmp_path / "ckpt"), query_name=""
        )
