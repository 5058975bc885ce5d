"""Metrics, event log, progress bar and sinks on real runs (shared local[2] session)."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.cli import main
from iterflow.metrics.values import DistributionValue, MetricResult
from iterflow.progress.event_log import progress_to_dict, read_events

pytestmark = pytest.mark.spark


def countdown(spark: SparkSession, n: int) -> DataFrame:
    return spark.range(n).select(F.col("id").alias("x"))


def counting_body(prefix: str, fail_at: int | None = None) -> itf.IterationBody:
    """Each round adds 1 to every x through a UDF that counts its calls and keeps x < 5."""
    calls = itf.metrics.counter(f"{prefix}.calls")
    values = itf.metrics.distribution(f"{prefix}.values")

    @F.udf("long")
    def plus_one(x):  # type: ignore[no-untyped-def]  # hints would make it a pandas UDF
        calls.inc()
        values.update(x)
        return x + 1

    @itf.body
    def step(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        itf.metrics.gauge(f"{prefix}.epoch").set(ctx.epoch)
        # Project first and persist inside the round, so the UDF runs once per row.
        nxt = ctx.cache(v.select(plus_one("x").alias("x"))).where("x < 5")
        if ctx.epoch == fail_at:
            nxt.count()  # the round's jobs run (and count), then the round fails
            raise RuntimeError("boom")
        return itf.Declaration(feedback={"v": nxt}, outputs={"v": nxt}, until=itf.max_rounds(10))

    return step


@pytest.mark.spark_classic("metrics updated in executor functions need accumulators")
def test_metrics_from_udfs_and_the_driver_per_round_and_in_total(spark: SparkSession) -> None:
    result = itf.BoundedIteration(counting_body("a")).bind("v", countdown(spark, 6)).run()
    # Round 0 sees x = 0..5; round k >= 1 sees the values still below 5: x = k..4.
    inputs = [list(range(6))] + [list(range(k, 5)) for k in range(1, 5)]
    assert result.rounds == 5
    for progress, xs in zip(result.history, inputs, strict=True):
        assert progress.metrics["a.calls"] == len(xs)
        assert progress.metrics["a.values"] == DistributionValue(
            count=len(xs), sum=float(sum(xs)), min=float(min(xs)), max=float(max(xs))
        )
        assert progress.metrics["a.epoch"] == progress.epoch
    total = sum(len(xs) for xs in inputs)
    assert result.metrics["a.calls"] == MetricResult(
        kind="counter", committed=total, attempted=total
    )
    assert result.metrics["a.epoch"].committed == 4.0
    assert result.metrics["a.values"].committed.count == total  # type: ignore[union-attr]


@pytest.mark.spark_classic("metrics updated in executor functions need accumulators")
def test_a_failed_round_is_attempted_not_committed_and_sinks_get_the_final_push(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink_path = tmp_path / "metrics.jsonl"
    it = (
        itf.BoundedIteration(counting_body("b", fail_at=2))
        .bind("v", countdown(spark, 6))
        .push_metrics(itf.metrics.JsonLinesSink(sink_path), every_s=60)
    )
    with pytest.raises(itf.RoundError, match="epoch 2"):
        it.run()
    final = json.loads(sink_path.read_text().splitlines()[-1])
    assert final["final"] is True and final["epoch"] == 1
    # Rounds 0 and 1 completed (6 + 4 calls); round 2 ran its job (3 calls), then failed.
    assert final["metrics"]["b.calls"] == {"kind": "counter", "committed": 10, "attempted": 13}


def test_event_log_agrees_with_the_history(spark: SparkSession, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "events.jsonl"
    result = (
        itf.BoundedIteration(counting_body("c"))
        .bind("v", countdown(spark, 6))
        .until(itf.max_rounds(3))
        .run(event_log=log)
    )
    events = read_events(log)
    assert [e["event"] for e in events] == [
        "iteration_started",
        "round_end",
        "round_end",
        "round_end",
        "iteration_terminated",
    ]
    started, *rounds, ended = events
    assert started["iteration"] == "step"
    assert started["inputs"] == {"v": {"schema": "x BIGINT", "replay": False}}
    assert started["conditions"] == [{"kind": "max_rounds", "n": 3}]
    for event, progress in zip(rounds, result.history, strict=True):
        recorded = {k: v for k, v in event.items() if k not in ("event", "time", "run_id")}
        assert recorded == json.loads(json.dumps(progress_to_dict(progress)))
    assert ended["termination"] == {"reason": "max_rounds", "epoch": 2, "reasons": ["max_rounds"]}
    assert ended["rounds"] == 3
    assert ended["metrics"]["c.calls"]["committed"] == result.metrics["c.calls"].committed

    assert main(["report", str(log)]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in table[1:]] == ["0", "1", "2"]


def test_the_progress_bar_shows_rounds_value_and_reason(spark: SparkSession, capsys) -> None:  # type: ignore[no-untyped-def]
    @itf.body
    def halve(x: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        nxt = x.select((F.col("v") / 2).alias("v"))
        return itf.Declaration(
            feedback={"x": nxt}, outputs={"x": nxt}, until=itf.converged(nxt, tol=0.01)
        )

    result = (
        itf.BoundedIteration(halve)
        .bind("x", spark.createDataFrame([(1.0,)], "v double"))
        .until(itf.max_rounds(20))
        .run(progress=True)
    )
    assert result.termination.reason == "converged"
    err = capsys.readouterr().err
    assert f"halve round {result.rounds}/20" in err
    assert "value 0.00781" in err  # 2**-7, the value of the last round
    assert f"converged at epoch {result.rounds - 1}" in err


def test_no_progress_bar_when_off_or_not_a_terminal(spark: SparkSession, capsys) -> None:  # type: ignore[no-untyped-def]
    for progress in (False, None):  # pytest's captured stderr is not a terminal
        itf.BoundedIteration(counting_body("d")).bind("v", countdown(spark, 2)).run(
            progress=progress
        )
        assert "round" not in capsys.readouterr().err


def test_a_sink_on_a_closed_port_warns_and_the_iteration_finishes(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    with pytest.warns(itf.IterflowWarning, match="did not receive the final push") as final:
        result = (
            itf.BoundedIteration(counting_body("e"))
            .bind("v", countdown(spark, 3))
            .push_metrics(itf.metrics.HttpJsonSink(f"http://127.0.0.1:{port}/m"), every_s=0.05)
            .push_metrics(itf.metrics.GraphiteSink("127.0.0.1", port), every_s=0.05)
            .run()
        )
    assert result.termination.reason == "feedback_empty"
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"http-json http://127.0.0.1:{port}/m" in warned and "graphite" in warned
    # The end of the run names each sink that missed the final push, and what it missed.
    missed = [str(w.message) for w in final if "final push" in str(w.message)]
    assert [m.split("'")[1] for m in missed] == [
        f"http-json http://127.0.0.1:{port}/m",
        f"graphite 127.0.0.1:{port}",
    ]
    assert all(f"epochs 0-{result.rounds - 1}" in m and "'e.calls'" in m for m in missed)


def test_creating_a_metric_inside_a_task_is_an_error(spark: SparkSession) -> None:
    @F.udf("long")
    def creates(x):  # type: ignore[no-untyped-def]
        itf.metrics.counter("made_on_an_executor").inc()
        return x

    @itf.body
    def step(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        return itf.Declaration(outputs={"v": v.select(creates("x").alias("x"))})

    with pytest.raises(itf.RoundError, match="epoch 0") as failure:
        itf.BoundedIteration(step).bind("v", countdown(spark, 2)).run()
    assert "created inside a Spark task" in str(failure.value.__cause__)


def test_an_event_log_that_cannot_be_opened_is_a_clear_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    from iterflow.metrics.registry import REGISTRY

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    it = itf.BoundedIteration(counting_body("f")).bind("v", countdown(spark, 2))
    with pytest.raises(itf.IterflowError, match=r"run\(event_log='.*file/events.jsonl'\)"):
        it.run(event_log=blocker / "events.jsonl")
    assert REGISTRY._runs == []


@pytest.mark.spark_classic("metrics updated in executor functions need accumulators")
def test_updates_from_jobs_started_on_plain_threads_are_not_counted_and_warn(
    spark: SparkSession,
) -> None:
    import threading

    hits = itf.metrics.counter("g.hits")

    @F.udf("long")
    def touch(x):  # type: ignore[no-untyped-def]
        hits.inc()
        return x

    side = countdown(spark, 3)

    def listener(ctx: itf.RoundEnd) -> None:
        worker = threading.Thread(target=lambda: side.select(touch("x")).collect())
        worker.start()
        worker.join()

    it = itf.BoundedIteration(counting_body("g")).bind("v", countdown(spark, 6)).listen(listener)
    with pytest.warns(itf.IterflowWarning, match=r"\['g.hits'\] were updated by tasks"):
        result = it.run()
    assert result.metrics["g.hits"].committed == 0
