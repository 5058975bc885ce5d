"""Output sinks of bounded iterations: every round's output, each epoch exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

import iterflow as itf

pytestmark = pytest.mark.spark


@itf.body
def shift(x):  # type: ignore[no-untyped-def]
    # Row i of round k holds (i, i * 3 + k + 1): each round's rows differ.
    nxt = x.selectExpr("id", "v + 1 AS v")
    return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt, "total": nxt.agg({"v": "sum"})})


def start(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(i, i * 3) for i in range(5)], "id INT, v LONG")


def expected(rounds: int) -> list[tuple[int, int, int]]:
    return sorted((k, i, i * 3 + k + 1) for k in range(rounds) for i in range(5))


def written(spark: SparkSession, path: Path) -> list[tuple[int, int, int]]:
    return sorted((r["epoch"], r["id"], r["v"]) for r in spark.read.parquet(str(path)).collect())


def checkpointed_run(
    spark: SparkSession, tmp_path: Path, rounds: int, output: str, sink: object
) -> itf.IterationResult:
    """``shift`` for ``rounds`` rounds, ``output`` to ``sink``, checkpointed every 2 rounds
    under ``tmp_path`` (so a later call resumes)."""
    return (
        itf.BoundedIteration(shift)
        .bind("x", start(spark))
        .until(itf.max_rounds(rounds))
        .sink(output, sink)
        .run(checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
    )


def test_every_rounds_output_is_written_once_with_its_epoch(
    spark: SparkSession, tmp_path: Path
) -> None:
    stale = tmp_path / "x" / "epoch=99"
    stale.mkdir(parents=True)
    (stale / "part-0.parquet").write_bytes(b"left by an earlier run")
    (tmp_path / "x" / "_NOTES").write_text("not an epoch: kept")
    calls: list[tuple[int, int]] = []
    result = (
        itf.BoundedIteration(shift)
        .bind("x", start(spark))
        .until(itf.max_rounds(20))
        .sink("x", itf.FileSink(str(tmp_path / "x")))
        .sink("total", lambda df, epoch: calls.append((epoch, df.first()[0])))
        .run()
    )
    assert result.rounds == 20
    assert written(spark, tmp_path / "x") == expected(20)  # the stale epoch is gone
    assert (tmp_path / "x" / "_NOTES").exists()
    assert calls == [(k, sum(i * 3 + k + 1 for i in range(5))) for k in range(20)]
    # result.outputs keeps its meaning: the last round's.
    assert sorted(r["v"] for r in result.outputs["x"].collect()) == [i * 3 + 20 for i in range(5)]
    result.release()


def test_a_resumed_run_writes_the_rounds_after_its_checkpoint_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = itf.FileSink(str(tmp_path / "x"))

    def run(rounds: int) -> itf.IterationResult:
        return checkpointed_run(spark, tmp_path, rounds, "x", sink)

    run(5).release()
    # A crashed attempt of epoch 6 left other rows: the resumed run replaces them.
    garbage = tmp_path / "x" / "epoch=6"
    spark.createDataFrame([(9, 9)], "id INT, v LONG").write.mode("overwrite").parquet(str(garbage))
    # ...and one that got further than the resumed run will go: nothing may keep it.
    spark.createDataFrame([(9, 9)], "id INT, v LONG").write.mode("overwrite").parquet(
        str(tmp_path / "x" / "epoch=12")
    )
    more = run(9)  # "train 4 more rounds": resumes after epoch 4
    assert more.resumed_from == 4 and more.rounds == 9
    assert written(spark, tmp_path / "x") == expected(9)
    more.release()


def test_a_sink_needs_an_output_of_its_name(spark: SparkSession, tmp_path: Path) -> None:
    iteration = (
        itf.BoundedIteration(shift)
        .bind("x", start(spark))
        .until(itf.max_rounds(2))
        .sink("nope", itf.FileSink(str(tmp_path / "nope")))
    )
    with pytest.raises(itf.IterflowError, match=r"epoch 0.*sink 'nope' has no output 'nope'"):
        iteration.run()
    with pytest.raises(itf.IterflowError, match="'x' has a sink already"):
        iteration.sink("x", itf.FileSink(str(tmp_path / "a"))).sink("x", print)
    with pytest.raises(itf.IterflowError, match=r"takes itf\.FileSink"):
        iteration.sink("total", 42)


class EpochTotals:
    """A callable sink that keeps each round's total, and drops the rounds after one."""

    def __init__(self) -> None:
        self.totals: dict[int, int] = {}
        self.discarded: list[int] = []

    def __call__(self, df: DataFrame, epoch: int) -> None:
        self.totals[epoch] = df.first()[0]

    def discard_after(self, epoch: int) -> None:
        self.discarded.append(epoch)
        self.totals = {k: v for k, v in self.totals.items() if k <= epoch}


def test_a_callable_sink_with_discard_after_holds_every_round_once_across_a_resume(
    spark: SparkSession, tmp_path: Path
) -> None:
    sink = EpochTotals()
    sink.totals[12] = -1  # left by an earlier run: a fresh start drops it

    def run(rounds: int) -> itf.IterationResult:
        return checkpointed_run(spark, tmp_path, rounds, "total", sink)

    run(5).release()
    assert sink.discarded == [-1]
    # A crashed attempt that got further than the resumed run will go: nothing may keep it.
    sink.totals[12] = -1
    more = run(9)  # resumes after epoch 4
    assert more.resumed_from == 4
    assert sink.discarded == [-1, 4]
    assert sink.totals == {k: sum(i * 3 + k + 1 for i in range(5)) for k in range(9)}
    more.release()


def test_a_callable_sinks_discard_after_must_take_an_epoch(spark: SparkSession) -> None:
    class Mirrored(EpochTotals):
        def discard_after(self, spark: SparkSession, epoch: int) -> None:  # type: ignore[override]
            pass

    iteration = itf.BoundedIteration(shift).bind("x", start(spark)).until(itf.max_rounds(1))
    with pytest.raises(itf.IterflowError, match=r"sink\('total'.*discard_after\(epoch\)"):
        iteration.sink("total", Mirrored())


def test_rows_held_on_the_driver_are_written_without_a_spark_job_and_read_back_by_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    import pyarrow as pa

    from iterflow.runtime.checkpoint.output_sinks import PART_FILE

    table = pa.table(
        {
            "id": pa.array([3, 1, 2], pa.int64()),
            "name": ["c", "a", None],
            "v": pa.array([[1.5], [], [2.0, 3.0]], pa.large_list(pa.float64())),
        }
    )
    held = itf.from_arrow(table, spark=spark)
    assert itf.to_arrow(held) is table  # the rows stay on the driver
    sink = itf.FileSink(str(tmp_path / "out"))
    sink.write(held, 4, 3)
    sink.write(held, 4, 3)  # an epoch written again replaces its rows
    assert sorted(p.name for p in (tmp_path / "out" / "epoch=4").iterdir()) == [
        "_SUCCESS",
        PART_FILE,
    ]
    back = spark.read.parquet(str(tmp_path / "out"))
    assert back.schema["id"].dataType.simpleString() == "bigint"
    assert back.schema["v"].dataType.simpleString() == "array<double>"
    assert sorted(tuple(r) for r in back.collect()) == [
        (1, "a", [], 4),
        (2, None, [2.0, 3.0], 4),
        (3, "c", [1.5], 4),
    ]
    # A format other than parquet goes through Spark's writer.
    itf.FileSink(str(tmp_path / "json"), format="json").write(held, 0, 3)
    assert spark.read.json(str(tmp_path / "json")).count() == 3


def test_from_arrow_needs_a_table(spark: SparkSession) -> None:
    with pytest.raises(itf.IterflowError, match=r"pyarrow\.Table"):
        itf.from_arrow([1, 2], spark=spark)  # type: ignore[arg-type]
