"""Unbounded iterations on Structured Streaming: epochs, feedback first, drain, exactly once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.errors import IterflowError, IterflowValueError


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


def test_running_sum_over_files_is_exact_per_epoch_and_ends_available_now(spark, tmp_path):
    files = [[1, 2, 3], [10, 20], [100], [1000, 2000, 3000, 4000]]
    write_numbers(tmp_path / "in", files)
    out = itf.FileSink(str(tmp_path / "out"))
    seen: list[tuple[int, int]] = []
    query = (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers_stream(spark, tmp_path / "in"))
        .sink("total", out)
        .listen(lambda end: seen.append((end.epoch, end.outputs["total"].first()["total"])))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True)
    )
    assert query.await_termination(timeout=120)
    assert query.termination.reason == "inputs_ended"
    expected = [sum(sum(f) for f in files[: i + 1]) for i in range(len(files))]
    assert seen == list(enumerate(expected))
    written = sorted((r["epoch"], r["total"]) for r in out.read(spark).collect())
    assert written == list(enumerate(expected))
    assert [p.input_rows["numbers"] for p in query.progress] == [len(f) for f in files]
    assert all(p.backlog["feedback_rows"] == 0 for p in query.progress)
