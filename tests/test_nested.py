"""Nested iterations: a BoundedIteration run by a body or a listener of another.

The line-search example (examples/line_search.py) is checked against its numpy
reference; the event log, the report, listeners, metrics and checkpoints are checked
on it and on small nested runs.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from iteration_kill_job import line_search
from pyspark.sql import DataFrame, SparkSession

import iterflow as itf
from iterflow.progress.bar import ProgressBar
from iterflow.progress.event_log import read_events
from iterflow.progress.table import format_report

pytestmark = pytest.mark.spark


def points_of(spark: SparkSession, x: np.ndarray, label: np.ndarray) -> DataFrame:
    rows = [(list(map(float, xi)), float(yi)) for xi, yi in zip(x, label, strict=True)]
    return spark.createDataFrame(rows, "x ARRAY<DOUBLE>, label DOUBLE").cache()


def test_a_line_search_inside_gradient_descent_equals_numpy(
    spark: SparkSession, tmp_path: Path
) -> None:
    example = line_search()
    x, label = example.data(300)
    points = points_of(spark, x, label)
    inner_paths: list[tuple[int, ...]] = []
    log = tmp_path / "events.jsonl"
    result = example.fit(points, dims=3, rounds=6, event_log=str(log))
    got = itf.vector(result.outputs["model"], "w")
    np.testing.assert_allclose(got, example.reference(x, label, 6), rtol=1e-9, atol=1e-12)
    # The inner run ended every outer round (feedback_empty); the outer one went on.
    assert result.rounds == 6 and result.termination.reason == "max_rounds"
    assert [p.epoch_path for p in result.history] == [(k,) for k in range(6)]

    events = read_events(log)  # the outer run and the runs nested in it
    started = [e for e in events if e["event"] == "iteration_started"]
    (outer_start,) = [e for e in started if e["parent_run_id"] is None]
    outer_id = outer_start["run_id"]
    inner_started = [e for e in started if e["parent_run_id"] is not None]
    assert len(inner_started) == 6
    assert all(e["parent_run_id"] == outer_id for e in inner_started)
    assert [e["epoch_path"] for e in inner_started] == [[k] for k in range(6)]
    inner_rounds = [e for e in events if e["event"] == "round_end" and e["run_id"] != outer_id]
    inner_paths = [tuple(e["epoch_path"]) for e in inner_rounds]
    # Every outer round k ran inner rounds (k, 0), (k, 1)... in order.
    for k in range(6):
        mine = [path for path in inner_paths if path[0] == k]
        assert mine == [(k, j) for j in range(len(mine))] and mine
    # The line search halved the step at least once somewhere.
    assert len(inner_paths) > 6
    # Inner metrics roll up into the outer round that ran them.
    per_round = [p.metrics["line_search_trials"] for p in result.history]
    assert per_round == [len([p for p in inner_paths if p[0] == k]) for k in range(6)]
    assert result.metrics["line_search_trials"].committed == len(inner_paths)

    report = format_report(events)
    assert "(0, 0)" in report and f"nested runs: 6, {len(inner_paths)} rounds" in report
    assert "ended: max_rounds at epoch 5" in report
    result.release()
    points.unpersist()


def test_a_listener_may_run_a_nested_iteration_and_sees_its_paths(spark: SparkSession) -> None:
    seen: list[tuple[int, tuple[int, ...]]] = []

    @itf.body
    def halve(y):  # type: ignore[no-untyped-def]
        nxt = y.selectExpr("v / 2 AS v")
        return itf.Declaration(feedback={"y": nxt}, outputs={"y": nxt})

    def inner_listener(ctx: itf.RoundEnd) -> None:
        seen.append((ctx.epoch, ctx.progress.epoch_path))

    def outer_listener(ctx: itf.RoundEnd) -> None:
        inner = (
            itf.BoundedIteration(halve)
            .bind("y", ctx.outputs["x"])
            .until(itf.max_rounds(2))
            .listen(inner_listener)
            .run()
        )
        ctx.emit("halved", inner.outputs["y"].first()["v"])
        inner.release()

    @itf.body
    def double(x):  # type: ignore[no-untyped-def]
        nxt = x.selectExpr("v * 2 AS v")
        return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})

    result = (
        itf.BoundedIteration(double)
        .bind("x", spark.createDataFrame([(1.0,)], "v DOUBLE"))
        .until(itf.max_rounds(3))
        .listen(outer_listener)
        .run()
    )
    assert result.emitted["halved"] == [0.5, 1.0, 2.0]
    assert seen == [(j, (k, j)) for k in range(3) for j in range(2)]
    result.release()


def test_a_nested_run_ignores_its_checkpoint_dir_with_a_warning(
    spark: SparkSession, tmp_path: Path
) -> None:
    @itf.body
    def inner(y):  # type: ignore[no-untyped-def]
        nxt = y.selectExpr("v + 1 AS v")
        return itf.Declaration(feedback={"y": nxt}, outputs={"y": nxt})

    @itf.body
    def outer(x):  # type: ignore[no-untyped-def]
        run = (
            itf.BoundedIteration(inner)
            .bind("y", x)
            .until(itf.max_rounds(2))
            .run(checkpoint_dir=str(tmp_path / "inner"))
        )
        nxt = run.outputs["y"]
        return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = (
            itf.BoundedIteration(outer)
            .bind("x", spark.createDataFrame([(0.0,)], "v DOUBLE"))
            .until(itf.max_rounds(2))
            .run(checkpoint_dir=str(tmp_path / "outer"), checkpoint_every=1)
        )
    assert result.outputs["x"].first()["v"] == 4.0
    messages = [str(w.message) for w in caught if issubclass(w.category, itf.IterflowWarning)]
    assert any("is ignored" in m and "epoch path (0,)" in m for m in messages), messages
    assert not (tmp_path / "inner").exists()
    assert (tmp_path / "outer").exists()
    result.release()


def test_a_nested_bar_goes_below_the_outer_one_and_is_cleared() -> None:
    out = io.StringIO()
    outer = ProgressBar("outer", max_rounds=3, enabled=True, file=out)
    inner = ProgressBar("inner", max_rounds=2, enabled=True, file=out, position=1)
    assert inner._bar is not None and inner._bar.pos in (1, -1)
    assert inner._bar.leave is False and outer._bar is not None and outer._bar.leave
    inner.close("feedback_empty at epoch 1")
    outer.close("max_rounds at epoch 2")
    text = out.getvalue()
    assert "inner" in text and "outer" in text


def test_a_nested_runs_bar_follows_the_outer_runs(spark: SparkSession) -> None:
    shown: list[bool] = []

    @itf.body
    def inner(y):  # type: ignore[no-untyped-def]
        return itf.Declaration(outputs={"y": y})

    def outer_listener(ctx: itf.RoundEnd) -> None:
        import iterflow.runtime.progresstrack.observers as observers

        made = []
        original = observers.ProgressBar

        def spy(*args: Any, **kwargs: Any) -> Any:
            bar = original(*args, **kwargs)
            made.append((kwargs.get("position"), kwargs.get("enabled")))
            return bar

        observers.ProgressBar = spy  # type: ignore[misc]
        try:
            itf.BoundedIteration(inner).bind("y", ctx.outputs["x"]).run().release()
        finally:
            observers.ProgressBar = original  # type: ignore[misc]
        shown.extend(enabled for position, enabled in made if position == 1)

    @itf.body
    def outer(x):  # type: ignore[no-untyped-def]
        return itf.Declaration(outputs={"x": x})

    (
        itf.BoundedIteration(outer)
        .bind("x", spark.createDataFrame([(1.0,)], "v DOUBLE"))
        .listen(outer_listener)
        .run(progress=False)
        .release()
    )
    assert shown == [False]  # the outer run shows no bar: neither does the nested one


def test_a_failing_nested_round_names_its_epoch_path(spark: SparkSession, tmp_path: Path) -> None:
    @itf.body
    def inner(y, ctx):  # type: ignore[no-untyped-def]
        if ctx.epoch == 1:
            raise ValueError("no step size left")
        return itf.Declaration(feedback={"y": y}, outputs={"y": y})

    @itf.body
    def outer(x, ctx):  # type: ignore[no-untyped-def]
        if ctx.epoch == 2:
            itf.BoundedIteration(inner).bind("y", x).until(itf.max_rounds(3)).run()
        return itf.Declaration(feedback={"x": x}, outputs={"x": x})

    log = tmp_path / "events.jsonl"
    with pytest.raises(
        itf.RoundError, match=r"epoch 1 \(epoch path \(2, 1\)\) failed in body"
    ) as e:
        (
            itf.BoundedIteration(outer)
            .bind("x", spark.createDataFrame([(1.0,)], "v DOUBLE"))
            .until(itf.max_rounds(4))
            .run(event_log=str(log))
        )
    assert e.value.epoch == 1 and e.value.epoch_path == (2, 1)
    events = read_events(log)
    (outer_id,) = [
        e["run_id"] for e in events if e["event"] == "iteration_started" and not e["parent_run_id"]
    ]
    failed = [
        (e["run_id"] == outer_id, e["epoch"], e["epoch_path"])
        for e in events
        if e["event"] == "iteration_failed"
    ]
    assert failed == [(False, 1, [2]), (True, 2, [])]  # the nested run, then the outer one


@pytest.mark.spark_classic("drops a checkpoint block through the py4j handle")
def test_a_block_lost_in_a_nested_run_rolls_the_outer_run_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    from iterflow.runtime.datacache.driver_variables import DRIVER_ROWS_CONF
    from iterflow.runtime.spark.jvm import release_local_checkpoint

    lost: list[tuple[int, ...]] = []

    def lose_once(ctx: itf.RoundEnd) -> None:
        if ctx.epoch == 0 and not lost:  # the next inner round cannot read its input
            lost.append(ctx.progress.epoch_path)
            release_local_checkpoint(ctx.variables["y"])

    @itf.body
    def inner(y):  # type: ignore[no-untyped-def]
        nxt = y.selectExpr("v + 1 AS v")
        return itf.Declaration(feedback={"y": nxt}, outputs={"y": nxt})

    @itf.body
    def outer(x, ctx):  # type: ignore[no-untyped-def]
        run = itf.BoundedIteration(inner).bind("y", x).until(itf.max_rounds(2))
        if ctx.epoch == 2:
            run = run.listen(lose_once)
        nxt = run.run().outputs["y"]
        return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})

    spark.conf.set(DRIVER_ROWS_CONF, "0")  # variables in Spark, where a block can be lost
    try:
        with pytest.warns(itf.IterflowWarning, match="rolling back to the durable checkpoint"):
            result = (
                itf.BoundedIteration(outer)
                .bind("x", spark.createDataFrame([(0.0,)], "v DOUBLE"))
                .until(itf.max_rounds(4))
                .run(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
            )
    finally:
        spark.conf.unset(DRIVER_ROWS_CONF)
    assert lost == [(2, 0)]
    assert result.outputs["x"].first()["v"] == 8.0  # 4 outer rounds of 2 inner steps
    assert [p.epoch for p in result.history] == [0, 1, 2, 3]
    result.release()


def test_a_query_started_in_a_round_is_not_nested(spark: SparkSession) -> None:
    from iterflow.runtime.progresstrack.observers import ObserverOptions, RunObservers

    def observers(**options: Any) -> RunObservers:
        return RunObservers(
            iteration="x",
            spark=spark,
            options=ObserverOptions(progress=False, **options),
            static_conditions=(),
        )

    outer = observers()
    try:
        with outer.round(3):
            inner, query = observers(), observers(nestable=False)
            assert (inner.parent, inner.path) == (outer, (3,))
            assert (query.parent, query.path) == (None, ())
            inner.close()
            query.close()
        after = observers()
        assert after.path == ()  # outside the round again
        after.close()
    finally:
        outer.close()
