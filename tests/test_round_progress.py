"""Progress inside a round: samples while a round runs, on the bar, in the log, to listeners."""

from __future__ import annotations

import itertools
import json
import os
import select
import threading
import time
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sessions import jobs_started

import iterflow as itf
from iterflow.progress.event_log import read_events
from iterflow.progress.sampling import Reading, RoundGauge
from iterflow.progress.table import format_report
from iterflow.runtime.datacache.resident_policy import RESIDENT_CONF
from iterflow.runtime.progresstrack.spark_status import _rows_of_steps

ROWS = 24
#: Seconds each row of the slow body takes in its UDF: ROWS * SLOW_S / 2 cores >= 3 s.
SLOW_S = 0.25

pytestmark = pytest.mark.spark_classic  # reads the status of a classic session's jobs


def slow_udf(sleep_s: float) -> Any:
    """A UDF that returns its long argument after sleeping ``sleep_s``."""

    def sleep_then(value):  # type: ignore[no-untyped-def]  # (hints would ask for pandas)
        time.sleep(sleep_s)
        return value

    return F.udf(sleep_then, "long")


def slow_body(sleep_s: float) -> itf.IterationBody:
    """Every round sends each value through a UDF that sleeps ``sleep_s`` per row."""
    slow = slow_udf(sleep_s)

    @itf.body
    def step(x: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        slowed = ctx.observe("slowed", x.repartition(4).withColumn("v", slow("v")))
        nxt = slowed.select((F.col("v") + 1).alias("v"))
        return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})

    return step


def slow_sum_body(sleep_s: float, partitions: int | None = None) -> itf.IterationBody:
    """An unbounded body: ``total`` += the sum of the epoch's ``numbers``, each sent through
    a UDF that sleeps ``sleep_s`` (after repartitioning them into ``partitions``)."""
    slow = slow_udf(sleep_s)

    @itf.body
    def summing(total: DataFrame, numbers: DataFrame) -> itf.Declaration:
        spread = numbers if partitions is None else numbers.repartition(partitions)
        added = spread.select(slow("x").alias("x")).agg(F.sum("x").alias("added"))
        new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
        return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})

    return summing


def values(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, 1, 4).selectExpr("id AS v")


class Recorder(itf.RoundListener):
    """Keeps every sample and round end, and notes if the two ever overlap."""

    def __init__(self) -> None:
        self.samples: list[itf.RoundSample] = []
        self.ends: list[itf.RoundProgress] = []
        self.busy = threading.Lock()
        self.overlaps = 0
        self.threads: set[int] = set()

    def state_dict(self) -> dict[str, Any]:  # what an unbounded run commits: nothing
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def _enter(self) -> None:
        if not self.busy.acquire(blocking=False):
            self.overlaps += 1
            self.busy.acquire()

    def on_round_progress(self, sample: itf.RoundSample) -> None:
        self._enter()
        try:
            if not sample.final:
                self.threads.add(threading.get_ident())
            self.samples.append(sample)
            time.sleep(0.01)
        finally:
            self.busy.release()

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        self._enter()
        try:
            self.ends.append(ctx.progress)
            time.sleep(0.01)
        finally:
            self.busy.release()


def test_a_slow_round_is_sampled_while_it_runs(spark: SparkSession, tmp_path: Path) -> None:
    recorder = Recorder()
    log = tmp_path / "events.jsonl"
    result = (
        itf.BoundedIteration(slow_body(SLOW_S))
        .bind("x", values(spark))
        .until(itf.max_rounds(2))
        .listen(recorder)
        .run(progress=False, event_log=log, event_log_progress_s=1.0)
    )
    assert len(result.history) == 2
    assert recorder.overlaps == 0
    # Samples come from a thread of their own; only a round's final one from the run's.
    assert threading.get_ident() not in recorder.threads
    for progress in result.history:
        assert progress.duration_s >= 3.0
        samples = [s for s in recorder.samples if s.epoch == progress.epoch]
        assert len(samples) >= 3
        fractions = [s.fraction_done for s in samples if s.fraction_done is not None]
        assert fractions == sorted(fractions)
        assert samples[-1].final and samples[-1].fraction_done == 1.0
        assert all(not s.final for s in samples[:-1])
        assert all(s.fraction_done is None or s.fraction_done < 1 for s in samples[:-1])
        assert [s.elapsed_s for s in samples] == sorted(s.elapsed_s for s in samples)
        # The last sample is taken as the round's end is recorded, just after its duration.
        assert all(s.elapsed_s <= progress.duration_s + 0.5 for s in samples)
        assert all(s.tasks_done <= s.tasks_total for s in samples)
        assert samples[-1].tasks_total > 0 and samples[-1].tasks_active == 0
        final_counts = {**progress.rows, **progress.observed}
        for sample in samples:
            for step, rows in sample.rows_by_step.items():
                assert rows <= final_counts[step], (step, sample)
        # The last sample counts every step exactly, and the rows the round read.
        assert dict(samples[-1].rows_by_step) == final_counts == {"x": ROWS, "slowed": ROWS}
        assert samples[-1].rows_read is not None and samples[-1].rows_read >= ROWS
        # A range reads no bytes; round 1 reads round 0's checkpoint from the block manager.
        assert samples[-1].bytes_read is not None
        assert samples[-1].bytes_read > 0 or progress.epoch == 0
        # The job materializing x took most of the round: the slow UDF runs in it.
        assert set(progress.step_s) == {"x"}
        assert progress.duration_s * 0.5 <= progress.step_s["x"] <= progress.duration_s
    # Round 1 knows how many tasks round 0 ran: its fraction weighs them from the start.
    assert any(0 < (s.fraction_done or 0) < 1 for s in recorder.samples if s.epoch == 1)
    # Every end came after that round's final sample.
    order = [(s.epoch, s.final) for s in recorder.samples]
    assert order.index((1, True)) > order.index((0, True))

    events = [json.loads(line) for line in log.read_text().splitlines()]
    sampled = [e for e in events if e["event"] == "round_progress"]
    assert sampled, "the log has round_progress lines"
    assert all(e["elapsed_s"] >= 1.0 for e in sampled)  # none for a round's first second
    times = [
        e["elapsed_s"] + sum(p.duration_s for p in result.history[: e["epoch"]]) for e in sampled
    ]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))  # at most one per second
    assert set(sampled[0]) >= {
        "epoch",
        "elapsed_s",
        "fraction_done",
        "tasks_total",
        "tasks_done",
        "tasks_active",
        "rows_read",
        "bytes_read",
        "rows_by_step",
        "eta_s",
        "epoch_path",
    }
    # The report has each round's step counts and seconds.
    header = format_report(read_events(log)).splitlines()[0].split()
    assert {"seconds", "rows.x", "seconds.x", "observed.slowed"} <= set(header)
    # Samples logged come before their round's end.
    kinds = [(e["event"], e.get("epoch")) for e in events]
    for e in sampled:
        assert kinds.index(("round_progress", e["epoch"])) < kinds.index(("round_end", e["epoch"]))


def test_no_progress_lines_when_the_log_interval_is_zero(
    spark: SparkSession, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    recorder = Recorder()
    (
        itf.BoundedIteration(slow_body(0.05))
        .bind("x", values(spark))
        .until(itf.max_rounds(1))
        .listen(recorder)
        .run(progress=False, event_log=log, progress_interval_s=0.1, event_log_progress_s=0)
    )
    assert recorder.samples  # sampled, but not logged
    assert all(
        json.loads(line)["event"] != "round_progress" for line in log.read_text().splitlines()
    )


def rounds_jobs(spark: SparkSession, interval_s: float, recorder: Recorder) -> list[int]:
    started = [jobs_started(spark)]
    (
        itf.BoundedIteration(slow_body(0.05))
        .bind("x", values(spark))
        .until(itf.max_rounds(3))
        .listen(recorder)
        .listen(lambda end: started.append(jobs_started(spark)))
        .run(progress=False, progress_interval_s=interval_s)
    )
    return [after - before for before, after in itertools.pairwise(started)]


def test_sampling_adds_no_spark_job(spark: SparkSession) -> None:
    unsampled, sampled = Recorder(), Recorder()
    without = rounds_jobs(spark, 0, unsampled)
    with_sampling = rounds_jobs(spark, 0.05, sampled)
    assert not unsampled.samples
    assert len(sampled.samples) >= 3  # the rounds were sampled, several times
    assert with_sampling == without


def test_a_listener_failing_on_a_sample_fails_the_round(spark: SparkSession) -> None:
    class Broken(itf.RoundListener):
        def on_round_progress(self, sample: itf.RoundSample) -> None:
            raise ValueError("no room for samples")

    with pytest.raises(itf.RoundError, match=r"Broken.*on_round_progress") as raised:
        (
            itf.BoundedIteration(slow_body(0.05))
            .bind("x", values(spark))
            .until(itf.max_rounds(2))
            .listen(Broken())
            .run(progress=False, progress_interval_s=0.1)
        )
    assert raised.value.epoch == 0
    assert isinstance(raised.value.__cause__, ValueError)


@pytest.mark.parametrize("value", [-1, "fast", float("nan"), True])
def test_intervals_must_be_seconds(spark: SparkSession, value: Any) -> None:
    it = itf.BoundedIteration(slow_body(0)).bind("x", values(spark)).until(itf.max_rounds(1))
    with pytest.raises(itf.IterflowError, match="progress_interval_s"):
        it.run(progress=False, progress_interval_s=value)
    with pytest.raises(itf.IterflowError, match="event_log_progress_s"):
        it.run(progress=False, event_log_progress_s=value)


def test_the_bar_shows_the_running_round_on_a_terminal(spark: SparkSession) -> None:
    controller, terminal = os.openpty()
    shown: list[bytes] = []
    done = threading.Event()

    def drain() -> None:  # read as it is written: a full terminal would block the run
        while not done.is_set() or select.select([controller], [], [], 0)[0]:
            if select.select([controller], [], [], 0.1)[0]:
                try:
                    shown.append(os.read(controller, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        with os.fdopen(terminal, "w") as out, redirect_stderr(out):
            (
                itf.BoundedIteration(slow_body(0.1))
                .bind("x", values(spark))
                .until(itf.max_rounds(2))
                .run(progress_interval_s=0.2)  # the bar is on: stderr is a terminal
            )
    finally:
        done.set()
        reader.join()
        os.close(controller)
    text = b"".join(shown).decode("utf-8", "replace")
    assert "step round" in text
    # While round 1 runs, the line shows round 0's figures, then round 1's fraction done.
    assert "rounds); epoch 1 " in text
    assert any(f"epoch 1 {p}%" in text for p in range(1, 100))


def test_the_gauge_never_goes_back_and_ends_at_one() -> None:
    gauge = RoundGauge(4, (4,), expected_tasks=10, expected_s=8.0)
    first = gauge.sample(Reading(tasks_total=4, tasks_done=2, tasks_active=2), 1.0)
    assert first.fraction_done == 0.2  # 2 of the 10 tasks the round before ran
    assert first.eta_s == pytest.approx(4.0)  # 1 s for 20%
    # A new job adds tasks: done over known would drop to 0.14; the sample keeps 0.2.
    second = gauge.sample(Reading(tasks_total=14, tasks_done=2, tasks_active=1), 2.0)
    assert second.fraction_done == 0.2
    assert second.eta_s == pytest.approx(12.0)  # the time left follows 2 of 14 done
    # Every known task done, yet the round goes on: never 1 before the end, and the
    # time left comes from the round before.
    third = gauge.sample(Reading(tasks_total=14, tasks_done=14), 7.0)
    assert third.fraction_done == 0.99 and third.eta_s == pytest.approx(1.0)
    last = gauge.sample(Reading(tasks_total=14, tasks_done=14), 7.5, final=True)
    assert (last.fraction_done, last.eta_s, last.final) == (1.0, 0.0, True)


def test_the_gauge_knows_nothing_before_any_task() -> None:
    gauge = RoundGauge(0, (0,))
    sample = gauge.sample(Reading(), 0.5)
    assert (sample.fraction_done, sample.eta_s, sample.rows_read) == (None, None, None)
    # Early on, the time left is the round before's duration minus the time spent.
    early = RoundGauge(1, (1,), expected_tasks=100, expected_s=10.0)
    assert early.sample(Reading(tasks_total=100, tasks_done=1), 2.0).eta_s == pytest.approx(8.0)


def test_exact_counts_win_and_live_rows_never_go_back() -> None:
    gauge = RoundGauge(0, (0,))
    gauge.sample(Reading(rows_by_step={"x": 30, "seen": 10}), 1.0)
    # A re-planned stage starts its live metric again: the sample keeps what it showed.
    assert gauge.sample(Reading(rows_by_step={"x": 5}), 2.0).rows_by_step == {"x": 30, "seen": 10}
    gauge.counted = {"x": 25}  # its job finished: the exact count
    assert gauge.sample(Reading(rows_by_step={"x": 40}), 3.0).rows_by_step["x"] == 25


def test_resident_kernel_calls_report_their_partitions(spark: SparkSession) -> None:
    partitions = 8

    def slow_sum(table: pa.Table) -> pa.Table:
        time.sleep(0.3)
        return pa.table({"total": [float(pc.sum(table["x"]).as_py() or 0.0)]})

    @itf.body
    def sums(acc: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        totals = ctx.columnar(points).map(slow_sum, "total DOUBLE")
        new_acc = totals.agg(F.sum("total").alias("acc"))
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    points = spark.createDataFrame(pa.table({"x": np.arange(80.0)})).repartition(partitions)
    recorder = Recorder()
    spark.conf.set(RESIDENT_CONF, "on")
    try:
        result = (
            itf.BoundedIteration(sums)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(2))
            .listen(recorder)
            .run(progress=False, progress_interval_s=0.1)
        )
    finally:
        spark.conf.unset(RESIDENT_CONF)
    assert result.history[1].resident
    assert result.outputs["acc"].first()["acc"] == pytest.approx(np.arange(80.0).sum())
    # Round 1's kernel call runs in the resident task, not as a Spark job: while it is in
    # flight, the round's tasks are its partitions, counted as the task serves them.
    resident_round = [s for s in recorder.samples if s.epoch == 1]
    calling = [s for s in resident_round if s.tasks_total == partitions]
    serving = [s.tasks_done for s in calling if 0 < s.tasks_done < partitions]
    assert serving, resident_round  # partitions done while the call was in flight
    assert serving == sorted(serving)
    assert all(s.tasks_active == 1 for s in calling if s.tasks_done < partitions)
    last = resident_round[-1]
    assert last.final and last.tasks_done == last.tasks_total >= partitions


def test_an_unbounded_epoch_is_sampled_with_its_streaming_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "part-0.json").write_text("".join(f'{{"x": {i}}}\n' for i in range(ROWS)))

    recorder = Recorder()
    query = (
        itf.UnboundedIteration(slow_sum_body(SLOW_S / 4, partitions=4))
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", spark.readStream.schema("x long").json(str(folder)))
        .listen(recorder)
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            progress_interval_s=0.2,
        )
    )
    assert query.await_termination(timeout=120)
    epoch = query.progress[0]
    assert epoch.input_rows == {"numbers": ROWS}
    samples = [s for s in recorder.samples if s.epoch == epoch.epoch]
    assert len(samples) >= 3, samples
    assert samples[-1].final and samples[-1].fraction_done == 1.0
    # The streaming input is a step too: its rows are counted as the epoch reads them.
    assert samples[-1].rows_by_step["numbers"] == ROWS
    assert all(s.rows_by_step.get("numbers", 0) <= ROWS for s in samples)
    assert recorder.overlaps == 0


def test_a_nested_runs_rounds_count_toward_the_outer_round(spark: SparkSession) -> None:
    inner_recorder, outer_recorder = Recorder(), Recorder()

    @itf.body
    def outer(x: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        inner = (
            itf.BoundedIteration(slow_body(0.05))
            .bind("x", x)
            .until(itf.max_rounds(2))
            .listen(inner_recorder)
            .run(progress=False, progress_interval_s=0.1)
        )
        return itf.Declaration(
            feedback={"x": inner.outputs["x"]}, outputs={"x": inner.outputs["x"]}
        )

    (
        itf.BoundedIteration(outer)
        .bind("x", values(spark))
        .until(itf.max_rounds(1))
        .listen(outer_recorder)
        .run(progress=False, progress_interval_s=0.1)
    )
    assert {s.epoch_path for s in inner_recorder.samples} == {(0, 0), (0, 1)}
    assert {s.epoch_path for s in outer_recorder.samples} == {(0,)}
    # The inner rounds' jobs are jobs of the outer round too: it counts their tasks.
    inner_tasks = sum(s.tasks_total for s in inner_recorder.samples if s.final)
    assert outer_recorder.samples[-1].tasks_total >= inner_tasks > 0


#: The plan graph of a running observed step as Spark 4.3 writes it (rows on the edges)
#: and as Spark 4.0 does (rows among the metrics in each node's label, edges bare).
DOT_EDGES = (Path(__file__).parent / "data" / "plan_graph_edges.dot").read_text()
DOT_LABELS = (Path(__file__).parent / "data" / "plan_graph_labels.dot").read_text()


def test_step_rows_are_read_from_both_plan_graph_formats() -> None:
    steps = {"iterflow_rows_7": ("x",), "iterflow_observe_6": ("seen",)}
    # Through a projection and a nested observation, to the UDF's rows; a filter with no
    # rows counted yet stops nothing here, it is below the counted operator.
    assert _rows_of_steps(DOT_EDGES, steps) == {("x",): 1234, ("seen",): 1234}
    assert _rows_of_steps(DOT_LABELS, steps) == {("x",): 7}
    # A plan without the round's observations is not the round's.
    assert _rows_of_steps(DOT_LABELS, {"iterflow_rows_99": ("y",)}) is None
    # An operator that may drop rows, with no count of its own, hides the step's rows.
    unknown = DOT_LABELS.replace("number of output rows: 7<br>", "")
    assert _rows_of_steps(unknown, steps) == {}


def test_an_unbounded_query_stops_from_on_round_progress(
    spark: SparkSession, tmp_path: Path
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for part in range(3):  # one file per micro-batch: the first epoch's sample stops it
        (folder / f"part-{part}.json").write_text("".join(f'{{"x": {i}}}\n' for i in range(8)))

    class Stopper(Recorder):
        query: itf.UnboundedQuery | None = None
        refused: Exception | None = None

        def on_round_progress(self, sample: itf.RoundSample) -> None:
            super().on_round_progress(sample)
            if self.query is not None and not sample.final:
                try:
                    self.query.process_all_available()  # would wait for this very epoch
                except itf.IterflowError as exc:
                    self.refused = exc
                self.query.stop()  # returns at once, as from on_round_end

    stopper = Stopper()
    stopper.query = (
        itf.UnboundedIteration(slow_sum_body(0.2))
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind(
            "numbers",
            spark.readStream.option("maxFilesPerTrigger", 1).schema("x long").json(str(folder)),
        )
        .listen(stopper)
        .start(checkpoint_location=str(tmp_path / "ckpt"), progress_interval_s=0.2)
    )
    assert stopper.query.await_termination(timeout=120)
    assert stopper.query.termination is not None
    assert stopper.query.termination.reason == "stopped"
    assert stopper.samples and stopper.refused is not None
    assert "from a listener" in str(stopper.refused)
    # The epoch in progress finished and committed: fewer epochs than files.
    assert 1 <= len(stopper.query.progress) < 3
