"""keep_history bounds the history a run holds; checkpoints write the history incrementally."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.cloudpickle import dumps
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.errors import IterflowTypeError, IterflowValueError, IterflowWarning, RoundError
from iterflow.runtime.checkpoint.store import CheckpointStore

pytestmark = pytest.mark.spark

#: The fields of a RoundProgress that do not depend on timing.
STABLE = ("epoch", "epoch_watermark", "rows", "criteria_empty", "observed", "epoch_path")


#: The epoch at which ``halve`` fails once (a crash), or None.
CRASH: dict[str, int | None] = {"at": None}


@itf.body
def halve(x, ctx):
    """One row; every round adds one to n and halves v; fails once at ``CRASH["at"]``."""
    if ctx.epoch == CRASH["at"]:
        CRASH["at"] = None  # the run after the crash goes on
        raise RuntimeError("crash")
    return itf.Declaration(
        feedback={"x": x.select((F.col("n") + 1).alias("n"), (F.col("v") / 2).alias("v"))}
    )


@itf.body
def total(sum_, numbers):
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("a"))
    new = sum_.crossJoin(added).select((F.col("s") + F.col("a")).alias("s"))
    return itf.Declaration(feedback={"sum_": new}, outputs={"sum_": new})


def start(spark):
    return spark.createDataFrame([(0, 1.0)], "n long, v double")


def iteration(spark, rounds: int, **listeners: Any) -> itf.BoundedIteration:
    it = itf.BoundedIteration(halve).bind("x", start(spark)).until(itf.max_rounds(rounds))
    for listener in listeners.values():
        it = it.listen(listener)
    return it


def stable(progress: itf.RoundProgress) -> tuple[Any, ...]:
    return tuple(getattr(progress, name) for name in STABLE)


def named_segments(root: Path) -> set[str]:
    """The history segments the committed manifests under ``root`` name."""
    named: set[str] = set()
    for marker in root.glob("epoch-*/_COMMITTED"):
        named.update(s["name"] for s in json.loads(marker.read_text()).get("history", []))
    return named


def segment_files(root: Path) -> set[str]:
    return {f"history/{p.name}" for p in (root / "history").glob("*")}


def test_keep_history_is_checked(spark, tmp_path):
    it = iteration(spark, 2)
    with pytest.raises(IterflowValueError, match="keep_history=0"):
        it.run(keep_history=0, progress=False)
    with pytest.raises(IterflowTypeError, match="keep_history"):
        it.run(keep_history=2.5, progress=False)
    stream = spark.readStream.schema("x long").json(str(tmp_path))
    unbounded = (
        itf.UnboundedIteration(total)
        .bind("sum_", spark.createDataFrame([(0,)], "s long"), state=True)
        .bind("numbers", stream)
    )
    with pytest.raises(IterflowValueError, match="keep_history=-1"):
        unbounded.start(checkpoint_location=str(tmp_path / "c"), keep_history=-1)


def test_keep_history_keeps_the_last_rounds_and_the_event_log_all(spark, tmp_path):
    log = tmp_path / "events.jsonl"
    full = iteration(spark, 12).run(progress=False)
    kept = iteration(spark, 12).run(progress=False, keep_history=3, event_log=str(log))
    assert kept.rounds == 12
    assert [p.epoch for p in kept.history] == [9, 10, 11]
    assert [stable(p) for p in kept.history] == [stable(p) for p in full.history[-3:]]
    rounds = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "round_end"]
    assert [e["epoch"] for e in rounds] == list(range(12))  # the full record


def test_checkpoints_write_only_the_new_rounds_of_history(spark, tmp_path, monkeypatch):
    """The history bytes a checkpoint writes stay the same from the first checkpoint to
    the last; pickling the whole history (as before) would grow 12-fold."""
    written: list[tuple[int, int, int]] = []  # epoch, bytes of new history, driver.pkl bytes
    real = CheckpointStore.write

    def spy(self, epoch, **kwargs):
        snapshot = kwargs["driver"]
        written.append((epoch, sum(len(raw) for _, raw in snapshot.new), len(snapshot.driver)))
        real(self, epoch, **kwargs)

    monkeypatch.setattr(CheckpointStore, "write", spy)
    root = tmp_path / "ckpt"
    result = iteration(spark, 60).run(
        progress=False, checkpoint_dir=str(root), checkpoint_every=5, checkpoint_async=False
    )
    assert [e for e, _, _ in written] == list(range(4, 60, 5))  # 59: the final one
    periodic = [b for _, b, _ in written]  # 5 rounds each
    assert max(periodic) <= 1.1 * min(periodic)
    driver = [d for _, _, d in written[:-1]]  # the final one holds the termination too
    assert max(driver) <= 1.1 * min(driver)
    whole = len(dumps(result.history))  # what the last checkpoint pickled before
    assert whole > 8 * periodic[-1]
    # Older epochs are gone, and with them the segments no remaining epoch names.
    assert segment_files(root) == named_segments(root)
    assert len(segment_files(root)) == 12


def test_a_resumed_run_reassembles_the_history_of_an_uninterrupted_one(spark, tmp_path):
    full = iteration(spark, 30).run(progress=False)
    seen: list[itf.RoundEnd] = []
    root = tmp_path / "ckpt"
    options = dict(progress=False, checkpoint_dir=str(root), checkpoint_every=4)

    CRASH["at"] = 14
    with pytest.raises(RoundError, match="crash"):
        iteration(spark, 30, record=seen.append).run(**options)
    resumed = iteration(spark, 30).run(**options)
    assert resumed.resumed_from == 11
    assert [p.epoch for p in resumed.history] == list(range(30))
    # Rounds 0-11 come back from the checkpoint as they were recorded, every field.
    assert resumed.history[:12] == [end.progress for end in seen[:12]]
    assert [stable(p) for p in resumed.history] == [stable(p) for p in full.history]
    assert segment_files(root) == named_segments(root)

    # The finished run read back from its final checkpoint, whole or trimmed.
    again = iteration(spark, 30).run(**options)
    assert again.history == resumed.history
    trimmed = iteration(spark, 30).run(**options, keep_history=4)
    assert trimmed.rounds == 30
    assert trimmed.history == resumed.history[-4:]


def test_resume_with_keep_history_keeps_the_window_and_drops_old_segments(spark, tmp_path):
    root = tmp_path / "ckpt"
    options = dict(progress=False, checkpoint_dir=str(root), checkpoint_every=3, keep_history=4)
    first = iteration(spark, 10).run(**options)
    assert [p.epoch for p in first.history] == [6, 7, 8, 9]
    # The final checkpoint names only the segments the last 4 rounds are in.
    final = json.loads((root / "epoch-00000009" / "_COMMITTED").read_text())["history"]
    assert [(s["first"], s["last"]) for s in final] == [(6, 8), (9, 9)]
    assert segment_files(root) == named_segments(root)
    more = iteration(spark, 20).run(**options)  # max_rounds grew: the run continues
    assert more.resumed_from == 9
    assert [p.epoch for p in more.history] == [16, 17, 18, 19]
    assert len(segment_files(root)) <= 4


def test_history_segments_merge_so_that_a_run_keeps_few_files(spark, tmp_path):
    """A checkpoint every round: every 16 segments of one level become one of the next,
    and the history read back is every round, in order."""
    root = tmp_path / "ckpt"
    options = dict(progress=False, checkpoint_dir=str(root), checkpoint_every=1)
    first = iteration(spark, 40).run(**options)
    final = json.loads((root / "epoch-00000039" / "_COMMITTED").read_text())["history"]
    assert [(s["first"], s["last"], s["level"]) for s in final] == [
        (0, 15, 1),
        (16, 31, 1),
        *[(e, e, 0) for e in range(32, 40)],
    ]
    assert segment_files(root) == named_segments(root)
    more = iteration(spark, 45).run(**options)
    assert more.resumed_from == 39
    assert more.history[:40] == first.history
    assert [p.epoch for p in more.history] == list(range(45))


def test_a_write_that_dies_before_its_commit_leaves_no_hole(spark, tmp_path, monkeypatch):
    """The history segment of epoch 7 is written, then the write fails before the commit:
    epoch 3 is what a restart finds, whole; the orphan segment goes at the next commit."""
    root = tmp_path / "ckpt"
    real = CheckpointStore._missing
    calls = {"n": 0}

    def dying(self, segments):
        calls["n"] += 1
        if calls["n"] == 2:  # the write of epoch 7, after its segment
            raise OSError("disk gone")
        return real(self, segments)

    monkeypatch.setattr(CheckpointStore, "_missing", dying)
    options = dict(progress=False, checkpoint_dir=str(root), checkpoint_every=4)
    with pytest.raises(itf.IterflowError, match="disk gone"):
        iteration(spark, 12).run(**options, checkpoint_async=False)
    monkeypatch.setattr(CheckpointStore, "_missing", real)
    assert len(segment_files(root)) == 2  # epoch 3's and the orphan of epoch 7
    assert len(named_segments(root)) == 1
    with pytest.warns(IterflowWarning, match="epoch 7 .* not usable"):
        resumed = iteration(spark, 12).run(**options)
    assert resumed.resumed_from == 3
    assert [p.epoch for p in resumed.history] == list(range(12))
    assert segment_files(root) == named_segments(root)


def test_unbounded_keep_history(spark, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(4):
        (folder / f"part-{index}.json").write_text(json.dumps({"x": index}) + "\n")

    def run() -> Any:
        stream = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(str(folder))
        query = (
            itf.UnboundedIteration(total)
            .bind("sum_", spark.createDataFrame([(0,)], "s long"), state=True)
            .bind("numbers", stream)
            .start(
                checkpoint_location=str(tmp_path / "ckpt"),
                available_now=True,
                progress=False,
                keep_history=2,
            )
        )
        assert query.await_termination(timeout=120)
        return query

    query = run()
    assert [p.epoch for p in query.history] == [2, 3]
    root = tmp_path / "ckpt" / "epochs"
    assert segment_files(root) == named_segments(root)
    (folder / "part-4.json").write_text(json.dumps({"x": 4}) + "\n")
    again = run()
    assert again.resumed_from == 3
    assert [p.epoch for p in again.history] == [3, 4]
