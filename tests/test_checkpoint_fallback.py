"""A checkpoint whose data does not verify (a history segment, driver.pkl or a parquet
file with a changed byte) is skipped: resume falls back to the newest one that verifies,
warns naming the file, and ends as an uninterrupted run; when none verifies, it is an
error naming the files."""

from __future__ import annotations

import json
import logging
from itertools import accumulate
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from test_checkpoints import committed_epochs, expected, run, values
from test_unbounded import numbers_stream, running_sum, write_numbers

import iterflow as itf
from iterflow.runtime.checkpoint.format import DRIVER, epoch_dir

pytestmark = pytest.mark.spark


def flip_a_byte(path: Path) -> None:
    """Change one byte in the middle of ``path``: its size stays, its sha256 does not."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def own_segment(directory: Path, epoch: int) -> Path:
    """The history segment that the checkpoint of ``epoch`` wrote (its rounds since the
    previous checkpoint, with checkpoint_every=1 round ``epoch`` alone)."""
    (segment,) = (directory / "history").glob(f"{epoch:08d}-{epoch:08d}-*.pkl")
    return segment


def failed_after_epoch_5(spark: SparkSession, directory: Path, **options: object) -> None:
    """A run that fails in round 6 with a checkpoint after every round: epochs 4 and 5
    committed."""
    with pytest.raises(itf.RoundError, match="epoch 6"):
        run(spark, directory, [], fail_at=6, checkpoint_every=1, **options)  # type: ignore[arg-type]
    assert committed_epochs(directory) == [4, 5]


def resume_warned(
    spark: SparkSession, directory: Path, caplog: pytest.LogCaptureFixture, **options: object
) -> tuple[itf.IterationResult, list[int], list[str]]:
    """Run again: the result, the epochs whose rounds ran, and the warnings logged on
    ``iterflow.checkpoint``."""
    calls: list[int] = []
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="iterflow.checkpoint"),
        pytest.warns(itf.IterflowWarning, match="not usable"),
    ):
        result = run(spark, directory, calls, checkpoint_every=1, **options)  # type: ignore[arg-type]
    logged = [r.getMessage() for r in caplog.records if r.name == "iterflow.checkpoint"]
    return result, calls, logged


@pytest.mark.parametrize("damaged", ["history segment", DRIVER])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture, damaged: str
) -> None:
    failed_after_epoch_5(spark, tmp_path)
    bad = own_segment(tmp_path, 5) if damaged != DRIVER else tmp_path / epoch_dir(5) / DRIVER
    flip_a_byte(bad)

    result, calls, logged = resume_warned(spark, tmp_path, caplog)
    assert result.resumed_from == 4 and calls == [5, 6, 7]
    # As an uninterrupted run: the values, every round's history, the termination.
    assert values(result) == expected(8)
    assert [p.epoch for p in result.history] == list(range(8))
    assert result.termination.reason == "max_rounds"
    [warning] = logged
    assert "checkpoint epoch 5 " in warning and f"{bad.name}' does not match its sha256" in warning
    assert str(bad.parent) in warning


def test_a_parquet_file_overwritten_in_place_falls_back(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failed_after_epoch_5(spark, tmp_path)
    variables = tmp_path / epoch_dir(5) / "variables" / "v"
    part = next(variables.glob("part-*.parquet"))
    part.write_bytes(b"\0" * part.stat().st_size)  # the size the manifest recorded

    result, calls, logged = resume_warned(spark, tmp_path, caplog)
    assert result.resumed_from == 4 and calls == [5, 6, 7]
    assert values(result) == expected(8)
    [warning] = logged
    assert "checkpoint epoch 5 " in warning
    assert f"parquet data 'file:{variables}'" in warning


def test_checkpoint_keep_1_still_keeps_a_checkpoint_to_fall_back_to(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failed_after_epoch_5(spark, tmp_path, checkpoint_keep=1)
    flip_a_byte(own_segment(tmp_path, 5))

    result, calls, _ = resume_warned(spark, tmp_path, caplog, checkpoint_keep=1)
    assert result.resumed_from == 4 and calls == [5, 6, 7]
    assert values(result) == expected(8)
    assert committed_epochs(tmp_path) == [6, 7]


def test_when_no_checkpoint_verifies_resuming_is_an_error_naming_the_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    failed_after_epoch_5(spark, tmp_path)
    flip_a_byte(tmp_path / epoch_dir(5) / DRIVER)
    flip_a_byte(own_segment(tmp_path, 4))  # epoch 5's history reads it too
    calls: list[int] = []
    with (
        pytest.raises(itf.IterflowError, match=r"no checkpoint in '.*' can be resumed from") as no,
        pytest.warns(itf.IterflowWarning, match="not usable"),
    ):
        run(spark, tmp_path, calls, checkpoint_every=1)
    message = str(no.value)
    assert f"epoch 5: 'file:{tmp_path / epoch_dir(5) / DRIVER}' does not match" in message
    assert f"epoch 4: history segment 'file:{own_segment(tmp_path, 4)}' does not" in message
    assert "resume=False" in message
    assert calls == []  # no round ran from scratch over the damaged checkpoints
    assert committed_epochs(tmp_path) == [4, 5]  # and nothing was deleted


def newest_segment(epochs: Path) -> Path:
    """The history segment only the newest commit of the epoch log ``epochs`` names."""
    manifests = [json.loads(p.read_text()) for p in sorted(epochs.glob("epoch-*/_COMMITTED"))]
    older = {s["name"] for m in manifests[:-1] for s in m["history"]}
    [name] = [s["name"] for s in manifests[-1]["history"] if s["name"] not in older]
    return epochs / name


def summing(spark: SparkSession, tmp_path: Path, **options: object) -> itf.UnboundedQuery:
    """The running sum over the files under ``tmp_path/in``, its totals in a FileSink."""
    return (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .sink("total", itf.FileSink(str(tmp_path / "out")))
        .start(
            checkpoint_location=str(tmp_path / "ckpt"),
            available_now=True,
            progress=False,
            **options,  # type: ignore[arg-type]
        )
    )


def test_an_unbounded_commit_with_a_corrupt_segment_is_a_named_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Commits on the loop's path: Spark has committed the micro-batches after the newest
    commit, so an older one cannot serve."""
    write_numbers(tmp_path / "in", [[1], [2], [3]])
    assert summing(spark, tmp_path).await_termination(timeout=120)
    bad = newest_segment(tmp_path / "ckpt" / "epochs")
    flip_a_byte(bad)
    with pytest.raises(
        itf.IterflowError,
        match=rf"epoch 2 .* committed but is damaged \(history segment '.*{bad.name}' does not "
        "match its sha256\\)",
    ):
        summing(spark, tmp_path)


def test_an_unbounded_run_with_background_commits_falls_back_and_reads_again(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Commits off the loop's path: Spark's checkpoint is put back to the commit resumed
    from, so the epochs after it run again, and the sink holds each epoch once."""
    files = [[f + 1, 10 * (f + 1)] for f in range(6)]
    write_numbers(tmp_path / "in", files)
    assert summing(spark, tmp_path, commit_interval_s=0.01).await_termination(timeout=120)
    epochs = tmp_path / "ckpt" / "epochs"
    newest, previous = sorted(committed_epochs(epochs), reverse=True)
    assert newest == len(files) - 1
    bad = newest_segment(epochs)
    flip_a_byte(bad)

    with (
        caplog.at_level(logging.WARNING, logger="iterflow.checkpoint"),
        pytest.warns(itf.IterflowWarning, match="not usable"),
    ):
        query = summing(spark, tmp_path, commit_interval_s=0.01)
    assert query.await_termination(timeout=120)
    assert query.resumed_from == previous
    [warning] = [r.getMessage() for r in caplog.records if r.name == "iterflow.checkpoint"]
    assert f"checkpoint epoch {newest} " in warning and bad.name in warning
    totals = list(accumulate(sum(f) for f in files))
    written = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted((r["epoch"], r["total"]) for r in written) == list(enumerate(totals))
