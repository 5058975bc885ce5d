"""Durable checkpoints in one process: resume after a failure, finished runs, invalid
checkpoints, fingerprints (shared local[2] session)."""

from __future__ import annotations

import logging
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
from checkpoint_kill_job import RoundCounter
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.progress.event_log import read_events, round_ends
from iterflow.progress.table import format_report
from iterflow.runtime.checkpoint.format import MARKER, epoch_dir
from iterflow.runtime.datacache.driver_variables import DRIVER_ROWS_CONF

pytestmark = pytest.mark.spark


class Seen(itf.RoundListener):
    """Keeps every epoch it saw; no state_dict, so its __dict__ is checkpointed."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        self.epochs.append(ctx.epoch)


def make_body(calls: list[int], fail_at: int | None = None, name: str = "grow") -> Any:
    """x -> 2x + epoch: every round changes every value, so a resumed run that restored
    the wrong epoch gives different numbers."""

    def grow(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        calls.append(ctx.epoch)
        ctx.state["sum_of_epochs"] = ctx.state.get("sum_of_epochs", 0) + ctx.epoch
        if ctx.epoch == fail_at:
            raise RuntimeError("the body failed")
        nxt = v.select((F.col("x") * 2 + ctx.epoch).alias("x"))
        return itf.Declaration(feedback={"v": nxt}, outputs={"v": nxt})

    grow.__name__ = name
    return itf.body(grow)


def start(spark: SparkSession) -> DataFrame:
    return spark.range(4).select(F.col("id").alias("x"))


def expected(rounds: int) -> list[int]:
    values = list(range(4))
    for epoch in range(rounds):
        values = [2 * x + epoch for x in values]
    return values


def values(result: itf.IterationResult) -> list[int]:
    return sorted(r["x"] for r in result.outputs["v"].collect())


def run(
    spark: SparkSession,
    directory: Path,
    calls: list[int],
    *,
    rounds: int = 8,
    fail_at: int | None = None,
    listeners: tuple[Any, ...] = (),
    **options: Any,
) -> itf.IterationResult:
    it = itf.BoundedIteration(make_body(calls, fail_at)).bind("v", start(spark))
    for listener in listeners:
        it.listen(listener)
    return it.until(itf.max_rounds(rounds)).run(checkpoint_dir=directory, **options)


def committed_epochs(directory: Path) -> list[int]:
    return sorted(
        int(p.name.split("-")[1]) for p in directory.glob("epoch-*") if (p / MARKER).exists()
    )


def test_a_failed_round_keeps_the_checkpoints_and_the_next_run_resumes(
    spark: SparkSession, tmp_path: Path
) -> None:
    calls: list[int] = []
    counter, seen = RoundCounter(), Seen()
    with pytest.raises(itf.RoundError, match="epoch 5"):
        run(spark, tmp_path, calls, fail_at=5, checkpoint_every=1, listeners=(counter, seen))
    assert committed_epochs(tmp_path) == [3, 4]  # the last two, checkpoint_keep=2

    calls.clear()
    counter, seen = RoundCounter(), Seen()
    result = run(spark, tmp_path, calls, checkpoint_every=1, listeners=(counter, seen))
    assert result.resumed_from == 4
    assert calls == [5, 6, 7]  # only the rounds after the checkpoint ran
    assert values(result) == expected(8)
    assert result.rounds == 8 and [p.epoch for p in result.history] == list(range(8))
    assert counter.rounds == 8  # state_dict / load_state_dict
    assert seen.epochs == list(range(8))  # pickled __dict__
    assert result.termination.reason == "max_rounds"


def test_ctx_state_and_committed_metrics_survive_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    rounds = itf.metrics.counter("checkpoint_test.rounds")

    def count(ctx: itf.RoundEnd) -> None:
        rounds.inc()
        ctx.emit("state", ctx.state["sum_of_epochs"])

    with pytest.raises(itf.RoundError):
        run(spark, tmp_path, [], fail_at=3, checkpoint_every=1, listeners=(count,))
    result = run(spark, tmp_path, [], checkpoint_every=1, listeners=(count,))
    assert result.metrics["checkpoint_test.rounds"].committed == 8
    assert result.emitted["state"] == [sum(range(k + 1)) for k in range(8)]


def test_a_finished_run_returns_its_result_without_recomputing(
    spark: SparkSession, tmp_path: Path
) -> None:
    first = run(spark, tmp_path, [], checkpoint_every=3)
    assert committed_epochs(tmp_path) == [5, 7]  # every 3 rounds (epochs 2, 5), then the last
    calls: list[int] = []
    again = run(spark, tmp_path, calls, checkpoint_every=3)
    assert calls == []
    assert values(again) == values(first) == expected(8)
    assert (again.rounds, again.resumed_from) == (8, 7)
    assert again.termination == first.termination
    assert again.history == first.history


def test_a_finished_run_continues_with_a_larger_max_rounds(
    spark: SparkSession, tmp_path: Path
) -> None:
    run(spark, tmp_path, [], rounds=4, checkpoint_every=2)
    calls: list[int] = []
    more = run(spark, tmp_path, calls, rounds=6, checkpoint_every=2)
    assert calls == [4, 5]
    assert values(more) == expected(6)
    assert more.resumed_from == 3


def test_synchronous_checkpoints_give_the_same_result(spark: SparkSession, tmp_path: Path) -> None:
    result = run(spark, tmp_path, [], checkpoint_every=2, checkpoint_async=False)
    assert values(result) == expected(8)
    assert committed_epochs(tmp_path) == [5, 7]


def test_a_checkpoint_without_its_marker_is_ignored(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(itf.RoundError):
        run(spark, tmp_path, [], fail_at=6, checkpoint_every=1)
    (tmp_path / epoch_dir(5) / MARKER).unlink()  # as if the process died before the marker
    calls: list[int] = []
    with pytest.warns(itf.IterflowWarning, match=r"epoch 5 .*no commit marker"):
        result = run(spark, tmp_path, calls, checkpoint_every=1)
    assert result.resumed_from == 4 and calls == [5, 6, 7]
    assert values(result) == expected(8)


def test_a_checkpoint_with_a_truncated_file_is_ignored(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(itf.RoundError):
        run(spark, tmp_path, [], fail_at=6, checkpoint_every=1)
    part = next((tmp_path / epoch_dir(5) / "variables" / "v").glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:20])
    calls: list[int] = []
    with pytest.warns(itf.IterflowWarning, match=r"epoch 5 .*bytes, the manifest says"):
        result = run(spark, tmp_path, calls, checkpoint_every=1)
    assert result.resumed_from == 4 and calls == [5, 6, 7]
    assert values(result) == expected(8)


def test_another_iteration_in_the_directory_is_an_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    run(spark, tmp_path, [], rounds=2)
    renamed = itf.BoundedIteration(make_body([], name="other")).bind("v", start(spark))
    with pytest.raises(itf.IterflowError, match=r"body 'grow' vs 'other'.*resume=False"):
        renamed.until(itf.max_rounds(2)).run(checkpoint_dir=tmp_path)
    doubles = spark.range(4).select(F.col("id").cast("double").alias("x"))
    retyped = itf.BoundedIteration(make_body([])).bind("v", doubles)
    with pytest.raises(itf.IterflowError, match=r"input 'v' schema \(x BIGINT\) vs \(x DOUBLE\)"):
        retyped.until(itf.max_rounds(2)).run(checkpoint_dir=tmp_path)
    # A run refused before its first round leaves no run behind to take metric updates.
    from iterflow.metrics.registry import REGISTRY

    assert REGISTRY._runs == []


def test_resume_false_starts_over(spark: SparkSession, tmp_path: Path) -> None:
    run(spark, tmp_path, [], rounds=3)
    calls: list[int] = []
    fresh = run(spark, tmp_path, calls, rounds=3, resume=False)
    assert calls == [0, 1, 2] and fresh.resumed_from is None
    assert values(fresh) == expected(3)


def test_unpicklable_state_is_a_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    @itf.body
    def keeps_a_lock(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        import threading

        ctx.state["lock"] = threading.Lock()
        return itf.Declaration(feedback={"v": v}, outputs={"v": v})

    it = itf.BoundedIteration(keeps_a_lock).bind("v", start(spark)).until(itf.max_rounds(2))
    with pytest.raises(itf.IterflowError, match=r"epoch 0: the checkpoint cannot pickle.*'lock'"):
        it.run(checkpoint_dir=tmp_path, checkpoint_every=1)


@pytest.mark.parametrize("option", ["checkpoint_every", "checkpoint_keep"])
def test_checkpoint_options_are_validated(spark: SparkSession, tmp_path: Path, option: str) -> None:
    it = itf.BoundedIteration(make_body([])).bind("v", start(spark)).until(itf.max_rounds(2))
    with pytest.raises(itf.IterflowError, match=f"{option}=0"):
        it.run(checkpoint_dir=tmp_path, **{option: 0})


def test_no_warning_without_checkpoints(spark: SparkSession, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(spark, tmp_path, [], rounds=2)


@pytest.fixture
def checkpointed_variables(spark: SparkSession) -> Any:
    """Small variables stay in Spark (local checkpoints that can lose a block), not on the
    driver."""
    spark.conf.set(DRIVER_ROWS_CONF, "0")
    yield
    spark.conf.unset(DRIVER_ROWS_CONF)


def lose_block_at(epoch: int) -> Any:
    """A listener that drops a block of the variable's local checkpoint after round
    ``epoch``, as a lost executor would: Spark cannot recompute it."""
    from iterflow.runtime.spark.jvm import release_local_checkpoint

    lost: list[int] = []

    def lose(ctx: itf.RoundEnd) -> None:
        if ctx.epoch == epoch and not lost:
            lost.append(epoch)
            release_local_checkpoint(ctx.variables["v"])

    return lose


@pytest.mark.spark_classic("drops a checkpoint block through the py4j handle")
@pytest.mark.usefixtures("checkpointed_variables")
def test_a_lost_checkpoint_block_rolls_back_to_the_durable_checkpoint(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rounds = itf.metrics.counter("rollback_test.rounds")
    calls: list[int] = []

    def count(ctx: itf.RoundEnd) -> None:
        rounds.inc()

    log = tmp_path / "events.jsonl"
    with pytest.warns(
        itf.IterflowWarning,
        match=r"epoch 5: block rdd_\d+_\d+ of the previous round's local checkpoint is gone "
        r".*; rolling back to the durable checkpoint of epoch 3 .*\(1 completed round",
    ):
        result = run(
            spark,
            tmp_path / "ckpt",
            calls,
            checkpoint_every=2,
            listeners=(count, lose_block_at(4)),
            event_log=log,
        )
    # The rollback is a WARNING on iterflow.checkpoint too, for applications that log.
    assert [
        r.getMessage()
        for r in caplog.records
        if r.name == "iterflow.checkpoint" and r.levelno == logging.WARNING
        if "rolling back to the durable checkpoint of epoch 3" in r.getMessage()
    ]
    # Epochs 4 (completed) and 5 (failed) ran again from the checkpoint of epoch 3.
    assert calls == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7]
    assert values(result) == expected(8)
    assert [p.epoch for p in result.history] == list(range(8))
    assert result.metrics["rollback_test.rounds"].committed == 8
    assert result.metrics["rollback_test.rounds"].attempted == 9  # round 4's first attempt
    events = read_events(log)
    assert [e.get("epoch", e.get("to_epoch")) for e in events if e["event"] != "iteration_started"][
        :-1
    ] == [0, 1, 2, 3, 4, 3, 4, 5, 6, 7]
    assert [e["event"] for e in events].count("rolled_back") == 1
    assert [e["epoch"] for e in round_ends(events)] == list(range(8))
    # The rollback is on the result, on the round run first after it, and in the report.
    (rollback,) = result.rollbacks
    assert (rollback.failed_epoch, rollback.to_epoch, rollback.rounds_recomputed) == (5, 3, 1)
    assert len(rollback.lost_blocks) == 1 and rollback.lost_blocks[0].startswith("rdd_")
    assert rollback.lost_executors == ()  # the block was dropped, no executor left
    assert [p.epoch for p in result.history if p.rollback is not None] == [4]
    assert result.history[4].rollback == rollback
    (logged,) = [e for e in events if e["event"] == "rolled_back"]
    assert logged["lost_blocks"] == list(rollback.lost_blocks)
    assert round_ends(events)[4]["rollback"]["failed_epoch"] == 5
    assert (
        f"rolled back: epoch 5 lost block {rollback.lost_blocks[0]}; to the durable checkpoint "
        "of epoch 3, 1 completed round(s) recomputed" in format_report(events)
    )


@pytest.mark.spark_classic("drops a checkpoint block through the py4j handle")
@pytest.mark.usefixtures("checkpointed_variables")
def test_a_lost_checkpoint_block_without_checkpoints_names_the_remedy(
    spark: SparkSession,
) -> None:
    it = itf.BoundedIteration(make_body([])).bind("v", start(spark)).listen(lose_block_at(2))
    with pytest.raises(
        itf.IterflowError,
        match=r"epoch 3: block rdd_\d+_\d+ of the previous round's local checkpoint is gone "
        r"\(its executor was lost, or dynamic allocation removed it\).* checkpoint_dir=",
    ):
        it.until(itf.max_rounds(5)).run()


def test_a_failing_checkpoint_write_fails_the_run_naming_the_epoch(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_write(monkeypatch, lambda epoch, outputs: epoch == 1, "disk full")
    with pytest.raises(itf.IterflowError, match=r"the checkpoint of epoch 1 failed.*disk full"):
        run(spark, tmp_path, [], checkpoint_every=2)


def test_a_directory_that_cannot_be_written_fails_before_the_first_round(
    spark: SparkSession, tmp_path: Path
) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the checkpoints should go")
    calls: list[int] = []
    with pytest.raises(itf.IterflowError, match=r"checkpoint_dir '.*not-a-directory' cannot hold"):
        run(spark, blocked, calls, checkpoint_every=2)
    assert calls == []


def test_resuming_past_a_smaller_max_rounds_is_an_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    with pytest.raises(itf.RoundError):
        run(spark, tmp_path, [], fail_at=6, checkpoint_every=1)  # epoch 5 committed
    with pytest.raises(itf.IterflowError, match=r"epoch 5, but max_rounds\(4\)"):
        run(spark, tmp_path, [], rounds=4, checkpoint_every=1)
    result = run(spark, tmp_path, [], rounds=8, checkpoint_every=1)
    assert result.resumed_from == 5 and values(result) == expected(8)


def test_a_directory_name_with_hash_and_space_resumes(spark: SparkSession, tmp_path: Path) -> None:
    odd = tmp_path / "run #1 ?x"
    with pytest.raises(itf.RoundError):
        run(spark, odd, [], fail_at=3, checkpoint_every=1)
    assert committed_epochs(odd) == [1, 2]
    calls: list[int] = []
    result = run(spark, odd, calls, checkpoint_every=1)
    assert result.resumed_from == 2 and calls == [3, 4, 5, 6, 7]


@pytest.mark.spark_classic("job descriptions are SparkContext properties")
def test_synchronous_writes_keep_the_users_job_description(
    spark: SparkSession, tmp_path: Path
) -> None:
    spark.sparkContext.setJobDescription("nightly ranks")
    try:
        run(spark, tmp_path, [], rounds=3, checkpoint_every=1, checkpoint_async=False)
        assert spark.sparkContext.getLocalProperty("spark.job.description") == "nightly ranks"
    finally:
        spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]


def test_a_run_refused_before_its_first_round_logs_its_failure(
    spark: SparkSession, tmp_path: Path
) -> None:
    with pytest.raises(itf.RoundError):
        run(spark, tmp_path / "ckpt", [], fail_at=3, checkpoint_every=1, listeners=(Seen(),))
    log = tmp_path / "events.jsonl"
    with pytest.raises(itf.IterflowError, match=r"listener #1 'Seen'.*same listeners"):
        run(spark, tmp_path / "ckpt", [], checkpoint_every=1, event_log=log)
    events = read_events(log)
    assert [e["event"] for e in events] == ["iteration_started", "iteration_failed"]
    assert events[1]["epoch"] is None and events[0]["resumed_from"] == 2


@pytest.mark.spark_classic("a Spark Connect DataFrame pickles; a classic one does not")
def test_an_unpicklable_listener_attribute_is_named(spark: SparkSession, tmp_path: Path) -> None:
    class KeepsOutputs(itf.RoundListener):
        def __init__(self) -> None:
            self.last: Any = None

        def on_round_end(self, ctx: itf.RoundEnd) -> None:
            self.last = ctx.outputs["v"]

    with pytest.raises(itf.IterflowError, match=r"listener #1 'KeepsOutputs' \(last\)"):
        run(spark, tmp_path, [], checkpoint_every=1, listeners=(KeepsOutputs(),))


def failing_write(monkeypatch: pytest.MonkeyPatch, fails: Any, message: str) -> None:
    """Make CheckpointStore.write raise ``message`` for the writes ``fails(epoch, outputs)``."""
    from iterflow.runtime.checkpoint.store import CheckpointStore

    real = CheckpointStore.write

    def write(self: CheckpointStore, epoch: int, **kwargs: Any) -> None:
        if fails(epoch, kwargs["outputs"]):
            raise RuntimeError(message)
        real(self, epoch, **kwargs)

    monkeypatch.setattr(CheckpointStore, "write", write)


def test_a_write_whose_data_was_lost_is_skipped(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_write(
        monkeypatch,
        lambda epoch, outputs: epoch == 3,
        "[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_1_0 not found!",
    )
    with pytest.warns(itf.IterflowWarning, match="checkpoint of epoch 3 was skipped"):
        result = run(spark, tmp_path, [], checkpoint_every=2)
    assert values(result) == expected(8)
    assert committed_epochs(tmp_path) == [5, 7]


def test_a_failing_final_write_warns_and_returns_the_result(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_write(monkeypatch, lambda epoch, outputs: bool(outputs), "disk full")
    log = tmp_path / "events.jsonl"
    with pytest.warns(itf.IterflowWarning, match="epoch 7 failed.*disk full.*final checkpoint"):
        result = run(spark, tmp_path / "ckpt", [], checkpoint_every=2, event_log=log)
    assert values(result) == expected(8)
    assert read_events(log)[-1]["event"] == "iteration_terminated"
    assert committed_epochs(tmp_path / "ckpt") == [3, 5]


def test_driver_states_written_before_classes_moved_still_load() -> None:
    """A checkpoint names its classes by module: RoundProgress was in
    iterflow.progress.round and StreamPosition in iterflow.unbounded.epochs."""
    from datetime import datetime, timezone

    from iterflow.reports import RoundProgress
    from iterflow.runtime.checkpoint.format import DriverState, load_driver_state
    from iterflow.unbounded.epoch_log import StreamPosition

    progress = RoundProgress(
        epoch=3, epoch_watermark=3, started_at=datetime.now(timezone.utc), duration_s=0.25
    )
    position = StreamPosition(epoch=3, batch_id=2, rows={"work": 5}, inline={})
    driver = DriverState(
        variable_names=("work",),
        state={"k": 1},
        listeners={},
        emitted={},
        history=[progress],
        metrics={},
        termination=None,
        stream=position,
    )
    raw = pickle.dumps(driver, protocol=2)  # names classes as "module\nname" text
    old = raw.replace(
        b"iterflow.reports\nRoundProgress", b"iterflow.progress.round\nRoundProgress"
    ).replace(
        b"iterflow.unbounded.epoch_log\nStreamPosition",
        b"iterflow.unbounded.epochs\nStreamPosition",
    )
    assert old != raw and b"iterflow.reports\nRoundProgress" not in old
    loaded = load_driver_state(old)
    assert loaded.history == [progress] and loaded.stream == position


def test_progress_pickled_before_epoch_paths_existed_gets_its_default() -> None:
    from datetime import datetime, timezone

    from iterflow.reports import RoundProgress
    from iterflow.runtime.checkpoint.format import _fill_defaults

    progress = RoundProgress(
        epoch=4, epoch_watermark=4, started_at=datetime.now(timezone.utc), duration_s=0.1
    )
    assert progress.epoch_path == (4,)
    object.__delattr__(progress, "epoch_path")  # as unpickled from an older iterflow
    assert not hasattr(progress, "epoch_path")
    _fill_defaults(progress)
    assert progress.epoch_path == (4,) and progress.resident is False
