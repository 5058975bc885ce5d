"""Unbounded iterations on Structured Streaming: epochs, feedback first, drain, exactly once."""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.progress.event_log import read_events
from iterflow.progress.table import format_report
from iterflow.runtime.spark.jvm import is_classic


def write_numbers(folder: Path, files: list[list[int]]) -> None:
    """One JSON-lines file per list; modification times make the file source read them in order."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time() - 1000
    for index, numbers in enumerate(files):
        path = folder / f"part-{index:04d}.json"
        with open(path, "w") as out:
            out.writelines(json.dumps({"x": x}) + "\n" for x in numbers)
        os.utime(path, (start + index, start + index))


def numbers_stream(spark, folder: Path, files_per_trigger: int = 1):
    return (
        spark.readStream.schema("x long")
        .option("maxFilesPerTrigger", files_per_trigger)
        .json(str(folder))
    )


@itf.body
def running_sum(total, numbers):
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})


def test_running_sum_over_files_is_exact_per_epoch_and_ends_available_now(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="iterflow")
    files = [[1, 2, 3], [10, 20], [100], [1000, 2000, 3000, 4000]]
    write_numbers(tmp_path / "in", files)
    out = itf.FileSink(str(tmp_path / "out"))
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .sink("total", out)
        .listen(lambda end: end.emit("seen", (end.epoch, end.outputs["total"].first()["total"])))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
    )
    assert query.await_termination(timeout=120)
    seen = [tuple(value) for value in query.emitted["seen"]]
    assert query.termination.reason == "inputs_ended"
    expected = [sum(sum(f) for f in files[: i + 1]) for i in range(len(files))]
    assert seen == list(enumerate(expected))
    written = sorted((r["epoch"], r["total"]) for r in out.read(spark).collect())
    assert written == list(enumerate(expected))
    assert [p.input_rows["numbers"] for p in query.progress] == [len(f) for f in files]
    assert all(p.backlog["feedback_rows"] == 0 for p in query.progress)
    # In a notebook: a row per epoch, and how the query ended; in the log, its end.
    frame = query.history_frame()
    assert frame["epoch"].tolist() == list(range(len(files)))
    assert frame["input.numbers"].tolist() == [len(f) for f in files]
    shown = query._repr_html_()
    assert "inputs_ended at epoch 3" in shown and "terminated" in shown
    if is_classic(spark):  # over Spark Connect the loop logs beside the server
        ended = [r.getMessage() for r in caplog.records if r.name == "iterflow.unbounded"]
        assert [m for m in ended if "'running_sum'" in m and "ended: inputs_ended at epoch 3" in m]


@itf.body
def countdown(work):
    """Work rows (id, n): each epoch takes one off n and drops the rows that reach 0."""
    left = work.select("id", (F.col("n") - 1).alias("n")).where(F.col("n") > 0)
    return itf.Declaration(feedback={"work": left}, outputs={"left": left})


def countdown_stream(spark, folder: Path):
    return (
        spark.readStream.schema("id long, n long").option("maxFilesPerTrigger", 1).json(str(folder))
    )


def write_rows(folder: Path, files: list[list[dict]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time() - 1000
    for index, rows in enumerate(files):
        path = folder / f"part-{index:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (start + index, start + index))


def run_countdown(spark, tmp_path: Path, files: list[list[dict]], **options):
    write_rows(tmp_path / "in", files)
    query = (
        itf.UnboundedIteration(countdown)
        .bind("work", countdown_stream(spark, tmp_path / "in"))
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            progress=False,
            **options,
        )
    )
    assert query.await_termination(timeout=180)
    return query


def test_feedback_drains_after_the_input_ends_one_row_per_epoch(spark, tmp_path):
    rows = [{"id": i, "n": i} for i in range(1, 8)]  # n = 1..7: one row reaches 0 per epoch
    query = run_countdown(spark, tmp_path, [rows], max_epochs_per_batch=2)
    progress = query.progress
    assert len(progress) == 7
    assert [p.rows["work"] for p in progress] == [6, 5, 4, 3, 2, 1, 0]
    assert [p.input_rows["work"] for p in progress] == [7, 0, 0, 0, 0, 0, 0]
    # Epochs 0-2 ran in the micro-batch's call (its rows, then 2 drain epochs); the rest
    # drained after the stream had ended.
    assert [p.batch_id for p in progress] == [0, 0, 0, None, None, None, None]
    assert query.termination.reason == "inputs_ended"
    assert query.termination.epoch == 6
    # Rows that entered at epoch 0 are in flight until epoch 6 drains the last of them.
    assert [p.epoch_watermark for p in progress] == [-1] * 6 + [6]


@pytest.mark.iterflow_classic(reason="patches a module of the process that runs the epochs")
def test_an_unbounded_run_past_its_kept_history_goes_on(spark, tmp_path, monkeypatch):
    from iterflow.unbounded import epochs

    monkeypatch.setattr(epochs, "RECENT_EPOCHS", 3)  # as a run past 1,000 epochs
    rows = [{"id": i, "n": i} for i in range(1, 8)]
    query = run_countdown(spark, tmp_path, [rows], max_epochs_per_batch=2)
    assert [p.epoch for p in query.history] == [4, 5, 6]
    assert query.termination.epoch == 6
    assert query.history[-1].epoch_watermark == 6


def feedback_first(files: list[list[int]], bound: int, budget: int) -> list[tuple[int, int]]:
    """The rule, written out: (input rows, feedback rows in) of each epoch, for files of
    countdown values with micro-batches of one file."""
    waiting: list[int] = []
    epochs: list[tuple[int, int]] = []

    def epoch(new: list[int]) -> None:
        nonlocal waiting
        epochs.append((len(new), len(waiting)))
        waiting = [n - 1 for n in new + waiting if n > 1]

    for new in files:
        while len(waiting) > bound:
            epoch([])
        epoch(new)
        for _ in range(budget):
            if waiting:
                epoch([])
    while waiting:
        epoch([])
    return epochs


@pytest.mark.parametrize(("bound", "budget"), [(0, 1), (2, 1), (0, 100)])
def test_feedback_is_consumed_before_new_input_up_to_the_backpressure_bound(
    spark, tmp_path, bound, budget
):
    countdowns = [[3, 3], [3, 3], [2], [3, 1, 2]]
    files = [
        [{"id": 10 * f + i, "n": n} for i, n in enumerate(ns)] for f, ns in enumerate(countdowns)
    ]
    query = run_countdown(
        spark, tmp_path, files, max_feedback_rows=bound, max_epochs_per_batch=budget
    )
    seen = [(p.input_rows["work"], p.feedback_rows_in.get("work", 0)) for p in query.progress]
    # Over Spark Connect nobody calls the loop while the stream is idle: each micro-batch
    # drains its feedback before the next, whatever max_epochs_per_batch says.
    drained = budget if is_classic(spark) else len(query.progress)
    assert seen == feedback_first(countdowns, bound, drained)
    assert all(fed <= bound for new, fed in seen if new > 0)
    # The watermark lags behind the epoch exactly while work feedback is in flight, and
    # never goes back.
    marks = [(p.epoch, p.epoch_watermark, p.backlog["feedback_rows"]) for p in query.progress]
    assert all((mark < epoch) == (flight > 0) for epoch, mark, flight in marks)
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(marks))


def test_max_rows_per_epoch_cuts_a_micro_batch_into_epochs(spark, tmp_path):
    rows = [{"id": i, "n": 2} for i in range(5)]
    query = run_countdown(spark, tmp_path, [rows], max_rows_per_epoch=2)
    seen = [(p.input_rows["work"], p.feedback_rows_in.get("work", 0)) for p in query.progress]
    assert seen == [(2, 0), (0, 2), (2, 0), (0, 2), (1, 0), (0, 1)]
    assert {p.batch_id for p in query.progress} == {0}


@pytest.mark.iterflow_classic(reason="a callable sink appends to a list of the client")
def test_a_second_start_continues_from_the_commit_with_new_files(spark, tmp_path):
    first, second = [[1, 2], [3]], [[4], [5, 6]]
    write_numbers(tmp_path / "in", first)
    calls: list[tuple[int, int]] = []

    def start():
        return (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .sink("total", lambda df, epoch: calls.append((epoch, df.first()["total"])))
            .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
        )

    query = start()
    assert query.await_termination(timeout=120) and query.resumed_from is None
    write_numbers(tmp_path / "more", second)  # new files, newer than the first ones
    for path in sorted((tmp_path / "more").iterdir()):
        os.replace(path, tmp_path / "in" / f"later-{path.name}")
    query = start()
    assert query.await_termination(timeout=120)
    assert query.resumed_from == 1
    assert calls == [(0, 3), (1, 6), (2, 10), (3, 21)]
    assert [p.epoch for p in query.progress] == [0, 1, 2, 3]


@pytest.mark.iterflow_classic(
    reason="drains while idle (over Connect each micro-batch drains its feedback)"
)
def test_processing_time_runs_until_stop_and_drains_while_idle(spark, tmp_path):
    rows = [{"id": 0, "n": 6}]
    write_rows(tmp_path / "in", [rows])
    ended: list[itf.IterationEnd] = []

    class Ends(itf.RoundListener):
        def on_iteration_terminated(self, ctx):
            ended.append(ctx)

    query = (
        itf.UnboundedIteration(countdown)
        .bind("work", countdown_stream(spark, tmp_path / "in"))
        .listen(Ends())
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            processing_time="100 milliseconds",
            max_epochs_per_batch=1,
        )
    )
    query.process_all_available()
    assert query.status["feedback_rows_in_flight"] == 0
    assert query.status["committed_epoch"] == 5
    assert not query.await_termination(timeout=0.5)  # idle, not ended
    query.stop()
    assert query.termination.reason == "stopped"
    assert [p.rows["work"] for p in query.progress] == [1, 1, 1, 1, 1, 0]
    assert [p.batch_id for p in query.progress] == [0, 0, None, None, None, None]
    assert len(ended) == 1 and ended[0].termination.reason == "stopped"


def test_bad_bindings_and_sinks_are_clear_errors(spark, tmp_path):
    stream = numbers_stream(spark, tmp_path)
    total = spark.createDataFrame([(0,)], "total long")
    with pytest.raises(IterflowValueError, match=r"'numbers'.*streaming.*UnboundedIteration"):
        itf.BoundedIteration(running_sum).bind("numbers", stream)
    with pytest.raises(IterflowValueError, match="no input is a streaming DataFrame"):
        (
            itf.UnboundedIteration(running_sum)
            .bind("total", total, state=True)
            .bind("numbers", spark.createDataFrame([(1,)], "x long"))
            .start(checkpoint_location=str(tmp_path / "ckpt"))
        )
    with pytest.raises(IterflowValueError, match=r"checkpoint_location=...\) is required"):
        itf.UnboundedIteration(running_sum).bind("total", total).bind("numbers", stream).start()
    with pytest.raises(IterflowValueError, match="choose one trigger"):
        itf.UnboundedIteration(running_sum).start(
            checkpoint_location=str(tmp_path), available_now=True, processing_time="1 second"
        )
    with pytest.raises(IterflowTypeError, match=r"sink\('total', ...\) takes itf.FileSink"):
        itf.UnboundedIteration(running_sum).sink("total", "/some/path")
    with pytest.raises(IterflowValueError, match="FileSink\\(format='delta'\\)"):
        itf.FileSink(str(tmp_path), format="delta")


def test_a_sink_for_an_undeclared_output_fails_the_first_epoch(spark, tmp_path):
    write_numbers(tmp_path / "in", [[1]])
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .sink("predictions", itf.FileSink(str(tmp_path / "out")))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
    )
    with pytest.raises(IterflowValueError, match=r"epoch 0.*sink 'predictions' has no output"):
        query.await_termination(timeout=120)
    assert isinstance(query.error, IterflowValueError)
    assert not (tmp_path / "out").exists()


def test_a_state_variable_without_feedback_is_an_error(spark, tmp_path):
    @itf.body
    def no_feedback(total, numbers):
        return itf.Declaration(outputs={"numbers": numbers})

    write_numbers(tmp_path / "in", [[1]])
    query = (
        itf.UnboundedIteration(no_feedback)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
    )
    with pytest.raises(IterflowValueError, match="'total' is bound with state=True"):
        query.await_termination(timeout=120)


def test_a_failing_body_fails_the_query_naming_the_epoch(spark, tmp_path):
    @itf.body
    def breaks(total, numbers, ctx):
        if ctx.epoch == 1:
            raise ZeroDivisionError("boom")
        return running_sum({"total": total, "numbers": numbers}, ctx)

    write_numbers(tmp_path / "in", [[1], [2], [3]])
    query = (
        itf.UnboundedIteration(breaks)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            event_log=str(tmp_path / "events.jsonl"),
        )
    )
    with pytest.raises(itf.RoundError, match="epoch 1 failed in body 'breaks'") as caught:
        query.await_termination(timeout=120)
    assert isinstance(caught.value.__cause__, ZeroDivisionError)
    events = read_events(tmp_path / "events.jsonl")
    assert [e["event"] for e in events] == ["iteration_started", "round_end", "iteration_failed"]
    assert events[-1]["epoch"] == 1


def test_two_streaming_inputs_are_split_per_micro_batch(spark, tmp_path):
    @itf.body
    def both(total, numbers, words):
        counted = numbers.agg(F.count("*").alias("n")).crossJoin(
            words.agg(F.count("*").alias("w"), F.max(F.length("word")).alias("longest"))
        )
        new_total = total.crossJoin(counted).select(
            (F.col("total") + F.col("n") + F.col("w")).alias("total")
        )
        return itf.Declaration(feedback={"total": new_total}, outputs={"words": words})

    write_numbers(tmp_path / "numbers", [[1, 2, 3]])
    write_rows(tmp_path / "words", [[{"word": "feedback"}, {"word": "first"}]])
    query = (
        itf.UnboundedIteration(both)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "numbers", files_per_trigger=5))
        .bind("words", spark.readStream.schema("word string").json(str(tmp_path / "words")))
        .sink("words", itf.FileSink(str(tmp_path / "out"), format="json"))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, max_rows_per_epoch=4)
    )
    assert query.await_termination(timeout=120)
    seen = list(query.history)
    assert sum(p.input_rows["numbers"] for p in seen) == 3
    assert sum(p.input_rows["words"] for p in seen) == 2
    assert [p.rows["total"] for p in seen] == [1] * len(seen)
    assert len(seen) == 2  # 5 rows in chunks of at most 4
    words = itf.FileSink(str(tmp_path / "out"), format="json").read(spark).collect()
    assert sorted(r["word"] for r in words) == ["feedback", "first"]


@pytest.mark.iterflow_classic(reason="counts in an executor function (Connect has no accumulators)")
def test_epochs_report_metrics_and_write_the_event_log(spark, tmp_path):
    seen = itf.metrics.counter("numbers_seen")

    @F.udf("long")
    def counted(x):
        seen.inc()
        return x

    @itf.body
    def summing(total, numbers, ctx):
        return running_sum(
            {"total": total, "numbers": numbers.select(counted("x").alias("x"))}, ctx
        )

    files = [[1, 2, 3], [4], [5, 6]]
    write_numbers(tmp_path / "in", files)
    log = tmp_path / "events.jsonl"
    query = (
        itf.UnboundedIteration(summing)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .listen(lambda ctx: ctx.emit("epochs", ctx.epoch))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, event_log=str(log))
    )
    assert query.await_termination(timeout=120)
    assert [p.metrics["numbers_seen"] for p in query.progress] == [3, 1, 2]
    # What IterationResult has, the query has too.
    assert query.emitted == {"epochs": [0, 1, 2]}
    assert query.metrics["numbers_seen"].committed == 6
    assert query.metrics["numbers_seen"].attempted == 6
    events = read_events(log)
    assert [e["event"] for e in events] == ["iteration_started"] + ["round_end"] * 3 + [
        "iteration_terminated"
    ]
    assert [e["input_rows"] for e in events[1:4]] == [
        {"numbers": 3},
        {"numbers": 1},
        {"numbers": 2},
    ]
    assert [e["batch_id"] for e in events[1:4]] == [0, 1, 2]
    assert events[-1]["termination"]["reason"] == "inputs_ended"
    assert events[-1]["metrics"]["numbers_seen"]["committed"] == 6
    report = format_report(events)
    header = report.splitlines()[0].split()
    assert {"rows.total", "input.numbers", "backlog.feedback_rows", "batch_id"} <= set(header)
    assert "ended: inputs_ended at epoch 2" in report
    epochs = [line.split() for line in report.splitlines()[1:4]]
    assert [row[header.index("input.numbers")] for row in epochs] == ["3", "1", "2"]


@pytest.mark.iterflow_classic(reason="a listener stops the query through the client's handle")
def test_stop_from_a_listener_commits_the_micro_batch_and_a_restart_continues(spark, tmp_path):
    write_numbers(tmp_path / "in", [[1], [2], [3], [4]])
    totals: list[tuple[int, int]] = []
    holder: list[itf.UnboundedQuery] = []

    def record(end):
        totals.append((end.epoch, end.outputs["total"].first()["total"]))
        if end.epoch == 1 and holder:
            holder[0].stop()  # from inside the epoch: returns at once

    def start(**options):
        query = (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .listen(record)
            .start(checkpoint_location=str(tmp_path / "ckpt"), **options)
        )
        holder[:] = [query]
        return query

    query = start(processing_time="200 milliseconds")
    assert query.await_termination(timeout=120)
    assert query.termination.reason == "stopped"
    stopped_at = query.status["committed_epoch"]
    assert stopped_at >= 1 and query.status["epoch"] == stopped_at
    holder.clear()
    query = start(available_now=True)
    assert query.await_termination(timeout=120)
    assert query.resumed_from == stopped_at
    # Every epoch ran once, across the stop and the restart.
    assert totals == [(0, 1), (1, 3), (2, 6), (3, 10)]


def test_a_restart_drops_sink_epochs_after_the_commit_and_checks_the_location(spark, tmp_path):
    write_numbers(tmp_path / "in", [[1], [2]])
    out = itf.FileSink(str(tmp_path / "out"))
    ckpt = str(tmp_path / "ckpt")

    def start(state: bool = True):
        return (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=state)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .sink("total", out)
            .start(checkpoint_location=ckpt, available_now=True)
        )

    assert start().await_termination(timeout=120)
    # What a crashed attempt of a later epoch might have left behind.
    spark.createDataFrame([(999,)], "total long").write.parquet(out.epoch_path(7))
    assert start().await_termination(timeout=120)
    assert sorted((r["epoch"], r["total"]) for r in out.read(spark).collect()) == [(0, 1), (1, 3)]

    with pytest.raises(IterflowValueError, match=r"input 'total' state=True vs False"):
        start(state=False)
    shutil.rmtree(tmp_path / "ckpt" / "stream")
    with pytest.raises(IterflowValueError, match=r"consumed micro-batch 1.*'stream/'\) is gone"):
        start()


def test_a_small_state_variable_with_reordered_columns_survives_a_restart(spark, tmp_path):
    @itf.body
    def reordered(acc, numbers):
        added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
        new = acc.crossJoin(added).select(  # the input's columns are (n, total)
            (F.col("total") + F.col("added")).alias("total"), (F.col("n") + 1).alias("n")
        )
        return itf.Declaration(feedback={"acc": new})

    def start():
        return (
            itf.UnboundedIteration(reordered)
            .bind("acc", spark.createDataFrame([(0, 0)], "n long, total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .listen(lambda end: end.emit("acc", end.variables["acc"].first().asDict()))
            .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
        )

    write_numbers(tmp_path / "in", [[1], [2], [3]])
    assert start().await_termination(timeout=120)
    write_numbers(tmp_path / "more", [[4]])
    os.replace(tmp_path / "more" / "part-0000.json", tmp_path / "in" / "later.json")
    query = start()
    assert query.await_termination(timeout=120) and query.resumed_from == 2
    assert query.emitted["acc"][-1] == {"n": 4, "total": 10}


def test_a_failure_while_draining_idle_stops_the_stream(spark, tmp_path):
    @itf.body
    def fails_late(work, ctx):
        if ctx.epoch == 3:
            raise RuntimeError("late")
        return countdown({"work": work}, ctx)

    write_rows(tmp_path / "in", [[{"id": 0, "n": 6}]])
    query = (
        itf.UnboundedIteration(fails_late)
        .bind("work", countdown_stream(spark, tmp_path / "in"))
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            processing_time="100 milliseconds",
            max_epochs_per_batch=1,
        )
    )
    with pytest.raises(itf.RoundError, match="epoch 3 failed in body 'fails_late'"):
        query.await_termination(timeout=120)
    assert query.status["state"] == "failed"
    assert not spark.streams.active  # Spark no longer calls the loop
    assert query.status["committed_epoch"] == 2


def test_a_damaged_commit_is_an_error_not_a_silent_step_back(spark, tmp_path):
    write_numbers(tmp_path / "in", [[1], [2]])

    def start():
        return (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
        )

    assert start().await_termination(timeout=120)
    driver = tmp_path / "ckpt" / "epochs" / "epoch-00000001" / "driver.pkl"
    driver.write_bytes(driver.read_bytes()[:-1])  # one byte short of what was committed
    with pytest.raises(IterflowError, match=r"epoch 1 .* committed but is damaged"):
        start()


def weighted_sum_body() -> itf.IterationBody:
    """total += sum(x) + sum(w): w from a data input bound once (resident), x from the
    stream's micro-batch (a job of the epoch). Kernels defined here travel by value."""
    import pyarrow as pa

    def column_total(table):
        return pa.table({"w": [int(sum(table["w"].to_pylist()))]})

    def added(batches):
        yield pa.RecordBatch.from_pydict({"w": [sum(sum(b["w"].to_pylist()) for b in batches)]})

    def total_of(data):
        mapped = data.map(column_total, "w LONG", combine=added, combine_schema="w LONG")
        return itf.to_arrow(mapped)["w"][0].as_py()

    @itf.body
    def weighted_sum(total, numbers, weights, ctx):
        weight = total_of(ctx.columnar(weights))
        added_now = total_of(ctx.columnar(numbers.select(F.col("x").alias("w"))))
        new_total = total.select((F.col("total") + F.lit(weight + added_now)).alias("total"))
        return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})

    return weighted_sum


@pytest.mark.iterflow_classic(reason="resident tasks need a classic session")
def test_data_bound_once_is_resident_in_an_unbounded_run_and_a_stream_runs_as_jobs(spark, tmp_path):
    files = [[1, 2, 3], [10, 20], [100]]
    write_numbers(tmp_path / "in", files)
    weights = spark.range(0, 1000, 1, 4).select(F.col("id").alias("w"))
    log = tmp_path / "events.jsonl"
    query = (
        itf.UnboundedIteration(weighted_sum_body())
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .bind("weights", weights)
        .listen(lambda end: end.emit("total", end.outputs["total"].first()["total"]))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, event_log=log)
    )
    assert query.await_termination(timeout=180)
    seen = query.emitted["total"]
    w = sum(range(1000))
    assert seen == list(itertools.accumulate(sum(f) + w for f in files))
    assert [p.resident for p in query.progress] == [True] * len(files)
    started = next(e for e in read_events(str(log)) if e["event"] == "iteration_started")
    assert started["resident"] == {"mode": "resident", "reason": None}
