"""Unbounded iterations in event time: watermarks per step and through the feedback loop,
incremental joins, late rows, restarts, and the errors of misuse.

Windows against a plain-Python reference are in test_event_windows.py.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from child_jobs import epoch_committed, job_command, kill_when, run_to_end
from pyspark.sql import functions as F
from test_unbounded import write_rows

import iterflow as itf
from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.progress.event_log import read_events
from iterflow.runtime.spark.jvm import is_classic
from iterflow.unbounded.event_time import EventTime, watermark_policy

pytestmark = pytest.mark.spark

SECOND = 1_000_000


def timed_stream(spark, folder: Path, schema: str = "t long, v long"):
    """JSON-lines files of (t seconds, ...), one file per micro-batch, with ``ts`` a timestamp."""
    columns = [c.split()[0] for c in schema.split(",")]
    return (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(folder))
        .select(F.timestamp_seconds("t").alias("ts"), *[c for c in columns if c != "t"])
    )


def windows_of(df, *values: str) -> list[tuple]:
    """(window start s, window end s, values...) of a window step's (aggregated) rows."""
    rows = df.select(
        (F.unix_micros("window.start") / SECOND).cast("long"),
        (F.unix_micros("window.end") / SECOND).cast("long"),
        *values,
    ).collect()
    return sorted(tuple(r) for r in rows)


class Gather(itf.RoundListener):
    """A listener object that keeps, by name, the values ``take(end)`` returns each epoch.
    What it keeps is its committed state (``state_dict``), so over Spark Connect, where
    it runs beside the server, the client's copy holds it too."""

    def __init__(self, take: Callable[[itf.RoundEnd], dict[str, list[Any]]]) -> None:
        self.take = take
        self.kept: dict[str, list[Any]] = {}

    def on_round_end(self, end: itf.RoundEnd) -> None:
        for name, values in self.take(end).items():
            self.kept.setdefault(name, []).extend(values)

    def state_dict(self) -> dict[str, Any]:
        return {"kept": self.kept}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kept = state["kept"]

    def __getitem__(self, name: str) -> list[Any]:
        return self.kept.get(name, [])


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


# -- per-step watermarks: the two-aggregation example -------------------------------------


@itf.body
def max_of_maxes(values, ctx):
    """The max per 3-second window, then the max of those per 6-second window."""
    first = ctx.window(values, itf.FixedWindows("3 seconds"), name="first")
    maxes = first.groupBy("window").agg(F.max("v").alias("v"))
    second = ctx.window(maxes, itf.FixedWindows("6 seconds"), name="second")
    result = second.groupBy("window").agg(F.max("v").alias("v"))
    return itf.Declaration(outputs={"maxes": maxes, "result": result})


def global_watermark(batches: list[list[tuple[int, int]]]) -> list[tuple[str, float, int]]:
    """The same two aggregations with ONE watermark for both (Structured Streaming's
    model), in plain Python: the rows each step drops as behind the global watermark."""
    watermark = float("-inf")
    first: dict[int, list[int]] = {}
    second: dict[int, list[int]] = {}
    dropped = []
    for batch in [*batches, []]:  # a last, empty batch once the watermark moved
        for t, v in batch:
            if t < watermark:
                dropped.append(("first", t, v))
            else:
                first.setdefault(t // 3 * 3, []).append(v)
        for start in sorted(s for s in first if s + 3 <= watermark):
            at_end, value = start + 3 - 1e-6, max(first.pop(start))  # out at its window's end
            if at_end < watermark:
                dropped.append(("second", at_end, value))
            else:
                second.setdefault(int(at_end // 6 * 6), []).append(value)
        for start in sorted(s for s in second if s + 6 <= watermark):
            second.pop(start)
        watermark = max([watermark, *(t for t, _ in batch)])
    return dropped


#: Values 6, 4, 5 at times 1, 2, 3; then 1 at time 7 moves the watermark on.
BATCHES = [[(1, 6)], [(2, 4)], [(3, 5)], [(7, 1)]]


def run_chained(spark, tmp_path, body) -> tuple[list, list, list, itf.UnboundedQuery]:
    """``body`` (outputs ``maxes`` and ``result``) over ``BATCHES``, one micro-batch each:
    the windows of each output and the watermarks of each epoch, and the ended query."""
    write_rows(tmp_path / "in", [[{"t": t, "v": v} for t, v in b] for b in BATCHES])
    kept = Gather(
        lambda end: {
            "maxes": windows_of(end.outputs["maxes"], "v"),
            "results": windows_of(end.outputs["result"], "v"),
            "marks": [dict(end.watermarks)],
        }
    )
    query = (
        itf.UnboundedIteration(body)
        .bind("values", timed_stream(spark, tmp_path / "in"), event_time="ts")
        .listen(kept)
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, progress=False)
    )
    assert query.await_termination(timeout=180)
    return kept["maxes"], kept["results"], kept["marks"], query


def test_chained_windows_keep_what_a_single_global_watermark_drops(spark, tmp_path):
    maxes, results, marks, query = run_chained(spark, tmp_path, max_of_maxes)
    assert maxes == [(0, 3, 6), (3, 6, 5), (6, 9, 1)]
    # With a watermark per step, the max 6 of [0, 3) reaches the second step in time.
    assert results == [(0, 6, 6), (6, 12, 1)]
    # One global watermark would have dropped it: the second step sees it as late.
    assert ("second", 3 - 1e-6, 6) in global_watermark(BATCHES)
    # The second step's output watermark stays behind the first step's pending maxes.
    assert all(m["second"] <= m["first"] <= m["values"] for m in marks)
    assert all(m["loop"] == min(m.values()) for m in marks)
    assert marks[-1]["loop"] == datetime.max.replace(tzinfo=timezone.utc)  # inputs ended
    # No epoch dropped a row.
    assert all(sum(p.late_rows.values()) == 0 for p in query.progress)


REBUILT = {
    "localCheckpoint": lambda df: df.localCheckpoint(eager=True),
    "createDataFrame": lambda df: df.sparkSession.createDataFrame(df.rdd, df.schema),
}


@pytest.mark.parametrize(
    "rebuild", ["localCheckpoint", pytest.param("createDataFrame", marks=pytest.mark.slow_spark)]
)
def test_chained_windows_keep_their_rows_when_the_first_ones_output_is_rebuilt(
    spark, tmp_path, caplog, rebuild
):
    # As above, with the first step's maxes checkpointed (or rebuilt) before the second
    # step: the rows no longer show that they come from the first step.
    @itf.body
    def rebuilt_maxes(values, ctx):
        first = ctx.window(values, itf.FixedWindows("3 seconds"), name="first")
        maxes = REBUILT[rebuild](first.groupBy("window").agg(F.max("v").alias("v")))
        second = ctx.window(maxes, itf.FixedWindows("6 seconds"), name="second")
        result = second.groupBy("window").agg(F.max("v").alias("v"))
        return itf.Declaration(outputs={"maxes": maxes, "result": result})

    with caplog.at_level(logging.INFO, logger="iterflow.unbounded"):
        maxes, results, _, query = run_chained(spark, tmp_path, rebuilt_maxes)
    assert maxes == [(0, 3, 6), (3, 6, 5), (6, 9, 1)]
    assert results == [(0, 6, 6), (6, 12, 1)]  # the 6 reached the second step in time
    assert all(sum(p.late_rows.values()) == 0 for p in query.progress)
    if is_classic(spark):  # over Spark Connect the loop logs beside the server
        unknown = [
            r.getMessage() for r in caplog.records if "step 'second' reads rows" in r.getMessage()
        ]
        assert len(unknown) == 1  # once per run


# -- the feedback loop holds the watermark --------------------------------------------------


@itf.body
def hops_then_window(events, ctx):
    """Rows with hops > 0 go round the loop (one hop per epoch, event time kept); the rest
    are counted per 10-second window."""
    again = events.where(F.col("hops") > 0).select("ts", "id", (F.col("hops") - 1).alias("hops"))
    done = events.where(F.col("hops") == 0)
    counted = ctx.window(done, itf.FixedWindows("10 seconds"), name="per10")
    counts = counted.groupBy("window").agg(F.count("*").alias("n"), F.max("pane").alias("pane"))
    return itf.Declaration(feedback={"events": again}, outputs={"counts": counts})


def test_rows_in_flight_hold_the_loop_watermark_and_windows_wait_for_them(spark, tmp_path):
    # Epoch 0: a row at t=1 that goes round the loop 5 times, and one that does not; new
    # input is taken while it is in flight, and rows far later (t=100, 200) move the
    # input's watermark past [0, 10) long before the row comes out of the loop.
    files = [
        [{"t": 1, "id": 1, "hops": 5}, {"t": 2, "id": 2, "hops": 0}],
        [{"t": 100, "id": 3, "hops": 0}],
        [{"t": 200, "id": 4, "hops": 0}],
    ]
    write_rows(tmp_path / "in", files)
    kept = Gather(
        lambda end: {
            "counts": windows_of(end.outputs["counts"], "n", "pane"),
            "marks": [end.watermarks],
            "flights": [end.progress.backlog["feedback_rows"]],
        }
    )

    query = (
        itf.UnboundedIteration(hops_then_window)
        .bind(
            "events",
            timed_stream(spark, tmp_path / "in", "t long, id long, hops long"),
            event_time="ts",
        )
        .listen(kept)
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            progress=False,
            max_feedback_rows=10,
            max_epochs_per_batch=1,
        )
    )
    assert query.await_termination(timeout=180)
    counts, marks, flights = kept["counts"], kept["marks"], kept["flights"]
    # [0, 10) fired once, with both of its rows: never before the row in flight came back.
    assert [c for c in counts if c[0] == 0] == [(0, 10, 2, 0)]
    assert sorted(counts) == [(0, 10, 2, 0), (100, 110, 1, 0), (200, 210, 1, 0)]
    for mark, in_flight in zip(marks, flights, strict=True):
        if in_flight:  # the row at t=1 is in flight: the loop stays behind it
            assert mark["loop"] <= at(1)
    assert any(flights) and marks[-1]["loop"] == datetime.max.replace(tzinfo=timezone.utc)
    assert all(sum(p.late_rows.values()) == 0 for p in query.progress)


# -- inputs without rows --------------------------------------------------------------------


@itf.body
def summed_per_10s(a, b, ctx):
    per10 = ctx.window(a.unionByName(b), itf.FixedWindows("10 seconds"), name="per10")
    return itf.Declaration(outputs={"sums": per10.groupBy("window").agg(F.sum("v").alias("v"))})


@pytest.mark.parametrize("policy", ["max", "min"])
def test_an_input_without_rows_holds_windows_back_as_in_structured_streaming(
    spark, tmp_path, caplog, policy
):
    # Structured Streaming counts a source without data at its initial watermark and
    # combines the sources' by spark.sql.streaming.multipleWatermarkPolicy: under "min"
    # (the default) it holds the query back, under "max" the source with data drives it.
    write_rows(tmp_path / "a", [[{"t": 10 * f + 1, "v": f}] for f in range(3)])
    (tmp_path / "b").mkdir()  # never receives a row
    kept = Gather(lambda end: {"fired": windows_of(end.outputs["sums"], "v")})
    setting = "spark.sql.streaming.multipleWatermarkPolicy"
    spark.conf.set(setting, policy)
    try:
        with caplog.at_level(logging.WARNING, logger="iterflow.unbounded"):
            query = (
                itf.UnboundedIteration(summed_per_10s)
                .bind("a", timed_stream(spark, tmp_path / "a"), event_time="ts")
                .bind("b", timed_stream(spark, tmp_path / "b"), event_time="ts")
                .listen(kept)
                .start(
                    checkpoint_location=str(tmp_path / "ckpt"),
                    processing_time="100 milliseconds",
                    progress=False,
                )
            )
            try:
                query.process_all_available()
                marks = query.history[-1].watermarks
            finally:
                query.stop()
    finally:
        spark.conf.unset(setting)
    fired = kept["fired"]
    idle = [r.getMessage() for r in caplog.records if "'b' has seen no row" in r.getMessage()]
    if policy == "max":
        # The last row (t=21) put the watermark at 21: the windows before it fired.
        assert sorted(fired) == [(0, 10, 0), (10, 20, 1)]
        assert marks["loop"] == at(21) and marks["b"] == datetime.min.replace(tzinfo=timezone.utc)
        assert not idle
    else:
        assert fired == []
        assert marks["loop"] == datetime.min.replace(tzinfo=timezone.utc)
        if is_classic(spark):  # over Spark Connect the loop logs beside the server
            assert len(idle) == 1 and f"{setting}=min" in idle[0]  # said once, not per epoch


def test_a_restart_keeps_the_watermark_policy_of_its_commit(caplog):
    timing = {"sources": {"a": ("ts", 0), "b": ("ts", 0)}, "columns": {"a": "ts", "b": "ts"}}
    committed = EventTime(**timing, policy="max").snapshot()
    restarted = EventTime(**timing, policy="min")
    with caplog.at_level(logging.WARNING, logger="iterflow.unbounded"):
        restarted.restore(committed, {})
    assert restarted.policy == "max"  # as a Spark checkpoint keeps its own
    assert "goes on with 'max'" in caplog.text
    old = {k: v for k, v in committed.items() if k != "policy"}  # a commit from before
    restored = EventTime(**timing, policy="min")
    restored.restore(old, {})
    assert restored.policy == "min"
    assert watermark_policy(None) == "min" and watermark_policy(" MAX ") == "max"
    with pytest.raises(IterflowValueError, match="multipleWatermarkPolicy='avg'"):
        watermark_policy("avg")


# -- incremental join ----------------------------------------------------------------------


@itf.body
def matched(views, clicks, ctx):
    pairs = ctx.join(views, clicks, "ad", within="5 seconds", name="pairs")
    return itf.Declaration(outputs={"pairs": pairs})


def test_incremental_join_equals_the_batch_join_and_its_state_stays_bounded(spark, tmp_path):
    views = [
        [{"t": 10 * f + i, "ad": i % 3, "view": 100 * f + i} for i in range(5)] for f in range(8)
    ]
    clicks = [
        [{"t": 10 * f + i + 2, "ad": i % 3, "click": 100 * f + i} for i in range(0, 5, 2)]
        for f in range(8)
    ]
    write_rows(tmp_path / "views", views)
    write_rows(tmp_path / "clicks", clicks)
    pairs = ("ad", "view", "click", F.unix_seconds("ts"))
    kept = Gather(
        lambda end: {
            "out": [tuple(r) for r in end.outputs["pairs"].select(*pairs).collect()],
            "state": [end.progress.state_rows["pairs"]],
        }
    )

    query = (
        itf.UnboundedIteration(matched)
        .bind(
            "views",
            timed_stream(spark, tmp_path / "views", "t long, ad long, view long"),
            event_time="ts",
            max_delay="10 seconds",
        )
        .bind(
            "clicks",
            timed_stream(spark, tmp_path / "clicks", "t long, ad long, click long"),
            event_time="ts",
            max_delay="10 seconds",
        )
        .listen(kept)
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, progress=False)
    )
    assert query.await_termination(timeout=180)
    out, state = kept["out"], kept["state"]
    # The batch join of every row: same key, event times at most 5 seconds apart; the
    # pair's event time is the later of the two.
    all_views = [v for f in views for v in f]
    all_clicks = [c for f in clicks for c in f]
    expected = sorted(
        (v["ad"], v["view"], c["click"], max(v["t"], c["t"]))
        for v, c in itertools.product(all_views, all_clicks)
        if v["ad"] == c["ad"] and abs(v["t"] - c["t"]) <= 5
    )
    assert sorted(out) == expected  # each pair once
    assert len(expected) > 20
    # State is dropped as the watermark passes: a row is kept while ts + 5 s is not behind
    # the watermark (the latest time seen, less 10 s), so the rows of the last three
    # files at most (8 rows a file), however many were read.
    assert max(state) <= 3 * 8 < len(all_views) + len(all_clicks)
    assert state[-1] == state[3]  # steady once the watermark moves


# -- late rows -----------------------------------------------------------------------------


@itf.body
def counted_with_late(events, ctx):
    per5 = ctx.window(events, itf.FixedWindows("5 seconds"), allowed_lateness="5 seconds")
    counts = per5.groupBy("window", "pane").agg(F.sum("v").alias("total"))
    return itf.Declaration(outputs={"counts": counts, "late": ctx.late("window_0")})


def test_late_rows_update_a_window_or_go_to_the_late_output_and_are_counted(spark, tmp_path):
    files = [
        [{"t": 1, "v": 1}, {"t": 6, "v": 10}],  # the watermark passes 5: [0, 5) fires
        [{"t": 2, "v": 1000}],  # late, within lateness: [0, 5) fires again with 1001
        [{"t": 30, "v": 10000}],  # the watermark passes 15: [0, 5) and [5, 10) expire
        [{"t": 3, "v": 100000}],  # too late: dropped into the late output
    ]
    write_rows(tmp_path / "in", files)
    sink = itf.FileSink(str(tmp_path / "late"), format="json")
    kept = Gather(lambda end: {"counts": windows_of(end.outputs["counts"], "pane", "total")})
    query = (
        itf.UnboundedIteration(counted_with_late)
        .bind("events", timed_stream(spark, tmp_path / "in"), event_time="ts")
        .sink("late", sink)
        .listen(kept)
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, progress=False)
    )
    assert query.await_termination(timeout=180)
    counts = kept["counts"]
    assert sorted(counts) == [
        (0, 5, 0, 1),
        (0, 5, 1, 1001),  # an update: every row of the window again
        (5, 10, 0, 10),
        (30, 35, 0, 10000),
    ]
    late = [p.late_rows["window_0"] for p in query.progress]
    assert sum(late) == 1
    written = sink.read(spark).select("v", "epoch").collect()
    assert [r["v"] for r in written] == [100000]
    assert late[written[0]["epoch"]] == 1


# -- restarts, the event log ----------------------------------------------------------------


@itf.body
def per_window_sum(events, ctx):
    summed = ctx.window(events, itf.SlidingWindows("4 seconds", every="2 seconds"), name="sums")
    return itf.Declaration(
        outputs={"sums": summed.groupBy("window").agg(F.sum("v").alias("total"))}
    )


@pytest.mark.parametrize(
    "commit_interval_s", [pytest.param(None, marks=pytest.mark.slow_spark), 0.5]
)
@pytest.mark.iterflow_classic(reason="a listener stops the query through the client's handle")
def test_window_state_and_watermarks_survive_a_stop_and_restart(spark, tmp_path, commit_interval_s):
    files = [[{"t": 3 * f + i, "v": 10 * f + i} for i in range(3)] for f in range(6)]
    write_rows(tmp_path / "in", files)
    sink = itf.FileSink(str(tmp_path / "sums"))
    log = tmp_path / "events.jsonl"
    holder: list[itf.UnboundedQuery] = []

    def stop_at_2(end):
        if end.epoch == 2 and holder:
            holder[0].stop()

    def start(**options):
        query = (
            itf.UnboundedIteration(per_window_sum)
            .bind("events", timed_stream(spark, tmp_path / "in"), event_time="ts")
            .sink("sums", sink)
            .listen(stop_at_2)
            .start(
                checkpoint_location=str(tmp_path / "ckpt"),
                progress=False,
                event_log=str(log),
                commit_interval_s=commit_interval_s,
                **options,
            )
        )
        holder[:] = [query]
        return query

    query = start(processing_time="200 milliseconds")
    assert query.await_termination(timeout=180)
    assert query.termination.reason == "stopped"
    holder.clear()
    query = start(available_now=True)
    assert query.await_termination(timeout=180)
    assert query.resumed_from is not None
    totals: dict[int, int] = {}
    for f in files:
        for row in f:
            for start_s in (row["t"] // 2 * 2 - 2, row["t"] // 2 * 2):
                totals[start_s] = totals.get(start_s, 0) + row["v"]
    got = sorted(
        (int(r[0]), int(r[1]))
        for r in sink.read(spark)
        .select((F.unix_micros("window.start") / SECOND).cast("long"), "total")
        .collect()
    )
    assert got == sorted(totals.items())  # every window once, across the restart
    ends = [e for e in read_events(log) if e["event"] == "round_end"]
    assert ends and all({"sums", "events", "loop"} <= set(e["watermarks"]) for e in ends)
    assert ends[-1]["state_rows"] == {"sums": 0}


# -- errors --------------------------------------------------------------------------------


def test_event_time_misuse_is_a_clear_error(spark, tmp_path):
    write_rows(tmp_path / "in", [[{"t": 1, "v": 1}]])
    stream = timed_stream(spark, tmp_path / "in")
    with pytest.raises(IterflowTypeError, match=r"event_time='v'.*not a timestamp"):
        itf.UnboundedIteration(max_of_maxes).bind("values", stream, event_time="v")
    with pytest.raises(IterflowValueError, match=r"max_delay=.*without event_time"):
        itf.UnboundedIteration(max_of_maxes).bind("values", stream, max_delay="1 minute")
    with pytest.raises(
        IterflowValueError, match=r"max_delay.*'soon'.*cannot be read as a duration"
    ):
        itf.UnboundedIteration(max_of_maxes).bind(
            "values", stream, event_time="ts", max_delay="soon"
        )
    with pytest.raises(IterflowValueError, match=r"every is longer than size"):
        itf.SlidingWindows("1 minute", every="2 minutes")

    @itf.body
    def bounded_window(x, ctx):
        return itf.Declaration(outputs={"x": ctx.window(x, itf.FixedWindows(1))})

    batch = spark.createDataFrame([(1,)], "v long").select(F.timestamp_seconds("v").alias("ts"))
    with pytest.raises(IterflowError, match=r"ctx.window\(\) is an event-time step"):
        itf.BoundedIteration(bounded_window).bind("x", batch).until(itf.max_rounds(1)).run(
            progress=False
        )

    def failing(body) -> str:
        query = (
            itf.UnboundedIteration(body)
            .bind("values", timed_stream(spark, tmp_path / "in"), event_time="ts")
            .start(
                checkpoint_location=str(tmp_path / f"ckpt-{body.name}"),
                available_now=True,
                progress=False,
            )
        )
        with pytest.raises(IterflowError) as raised:
            query.await_termination(timeout=120)
        return str(raised.value)

    @itf.body
    def twice(values, ctx):
        ctx.window(values, itf.FixedWindows(1), name="w")
        return itf.Declaration(outputs={"w": ctx.window(values, itf.FixedWindows(2), name="w")})

    assert "step 'w' was called twice in one epoch" in failing(twice)

    @itf.body
    def unknown_late(values, ctx):
        return itf.Declaration(outputs={"late": ctx.late("nope")})

    assert "ctx.late('nope'): no step of that name" in failing(unknown_late)

    @itf.body
    def no_within(values, ctx):
        return itf.Declaration(outputs={"j": ctx.join(values, values, "v")})

    assert "within= is required" in failing(no_within)

    @itf.body
    def clashing(values, ctx):
        left, right = values.withColumn("w", F.lit(1)), values.withColumn("w", F.lit(2))
        return itf.Declaration(outputs={"j": ctx.join(left, right, "v", within=1)})

    assert "both sides have a column 'w'" in failing(clashing)


# -- a killed process ------------------------------------------------------------------------


@pytest.mark.slow_spark
def test_a_killed_event_time_stream_restarts_with_every_window_once(spark, tmp_path):
    files = [[{"t": 3 * f + i, "v": 10 * f + i} for i in range(3)] for f in range(12)]
    write_rows(tmp_path / "in", files)
    command = job_command(Path(__file__).with_name("event_time_kill_job.py"), tmp_path)
    # Into the next epoch's work after epoch 4 or later committed.
    kill_when(command, epoch_committed(tmp_path / "ckpt", 4), after_s=0.15)
    assert not (tmp_path / "out.json").exists()
    run_to_end(command)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["termination"] == "inputs_ended" and out["resumed_from"] >= 4
    assert out["late"] == 0
    expected: dict[int, int] = {}
    for row in (r for f in files for r in f):
        for start in (row["t"] // 2 * 2 - 2, row["t"] // 2 * 2):
            expected[start] = expected.get(start, 0) + row["v"]
    written = (
        spark.read.parquet(str(tmp_path / "sinks" / "sums"))
        .select((F.unix_micros("window.start") / SECOND).cast("long"), "total", "pane")
        .collect()
    )
    # Each window once (no update: nothing was late), with the sum of all its rows.
    assert sorted((r[0], r[1]) for r in written) == sorted(expected.items())
    assert {r[2] for r in written} == {0}
