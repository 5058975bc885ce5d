"""Checkpoints written by iterflow 0.1.0 before its runtime moved into packages
(``tests/data/checkpoints-0.1.0``, written by ``python tests/test_checkpoint_compat.py
OUT``) still load and resume: a bounded run's checkpoint directory and an unbounded run's
epoch log."""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.checkpoint.store import CheckpointStore

DATA = Path(__file__).with_name("data") / "checkpoints-0.1.0"


class Keeper(itf.RoundListener):
    """A listener with state of its own, saved in the checkpoints."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        self.seen.append(ctx.epoch)
        ctx.emit("total", ctx.outputs["x"].agg(F.sum("v")).first()[0])


@itf.body
def shift(x, ctx):  # type: ignore[no-untyped-def]
    ctx.state["rounds"] = ctx.state.get("rounds", 0) + 1
    itf.metrics.counter("steps").inc()
    nxt = x.selectExpr("id", "v * 2 + id AS v")
    return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})


@itf.body
def running_sum(total, numbers, ctx):  # type: ignore[no-untyped-def]
    ctx.state["epochs"] = ctx.state.get("epochs", 0) + 1
    added = numbers.agg(F.coalesce(F.sum("x"), F.lit(0)).cast("long").alias("added"))
    new_total = total.crossJoin(added).select((F.col("total") + F.col("added")).alias("total"))
    return itf.Declaration(feedback={"total": new_total}, outputs={"total": new_total})


def shifted(rounds: int) -> list[int]:
    values = list(range(8))
    for _ in range(rounds):
        values = [v * 2 + i for i, v in enumerate(values)]
    return sorted(values)


def bounded(spark: SparkSession, rounds: int, listener: Keeper) -> itf.BoundedIteration:
    x0 = spark.createDataFrame([(i, i) for i in range(8)], "id long, v long")
    it = itf.BoundedIteration(shift).bind("x", x0).until(itf.max_rounds(rounds))
    return it.listen(listener)


def write_checkpoints(out: Path) -> None:
    """The fixture: 4 rounds of ``shift`` and 3 epochs of ``running_sum``."""
    spark = itf.session("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    bounded(spark, 4, Keeper()).run(
        progress=False, checkpoint_dir=str(out / "bounded"), checkpoint_every=1
    )
    folder = out / "in"
    folder.mkdir(parents=True)
    for f in range(3):
        lines = (f'{{"x": {100 * f + j}}}\n' for j in range(f + 1))
        (folder / f"{f}.json").write_text("".join(lines))
    numbers = spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(str(folder))
    (
        itf.UnboundedIteration(running_sum)
        .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
        .bind("numbers", numbers)
        .start(checkpoint_location=str(out / "stream"), available_now=True, progress=False)
        .await_termination()
    )
    shutil.move(out / "stream" / "epochs", out / "epochs")  # Spark's own part names paths
    for scratch in ("in", "stream"):
        shutil.rmtree(out / scratch)


def test_a_bounded_checkpoint_of_0_1_0_resumes(spark: SparkSession, tmp_path: Path) -> None:
    shutil.copytree(DATA / "bounded", tmp_path / "bounded")
    listener = Keeper()
    result = bounded(spark, 6, listener).run(
        progress=False, checkpoint_dir=str(tmp_path / "bounded"), checkpoint_every=1
    )
    assert result.resumed_from == 3 and result.rounds == 6
    assert sorted(r["v"] for r in result.outputs["x"].collect()) == shifted(6)
    assert listener.seen == [0, 1, 2, 3, 4, 5]  # restored state, then two more rounds
    assert result.emitted["total"] == [sum(shifted(k)) for k in range(1, 7)]
    assert [p.epoch for p in result.history] == list(range(6))
    assert result.metrics["steps"].committed == 6


def test_an_unbounded_epoch_log_of_0_1_0_loads(spark: SparkSession) -> None:
    latest = CheckpointStore(spark, str(DATA / "epochs")).latest()
    assert latest is not None and latest.epoch == 2
    assert [p.epoch for p in latest.driver.history] == [0, 1, 2]
    assert latest.driver.state["epochs"] == 3


def test_driver_state_naming_moved_graph_and_ml_modules_loads() -> None:
    """A driver state whose user state names classes by the graph and ml modules they
    lived in before the move (``iterflow.graph.model``, ``iterflow.ml.model``) loads."""
    from iterflow.graph import Graph
    from iterflow.ml import MLError
    from iterflow.runtime.checkpoint.format import DriverState, load_driver_state

    driver = DriverState(
        variable_names=("x",),
        state={"graph": Graph, "error": MLError},
        listeners={},
        emitted={},
        history=[],
        metrics={},
        termination=None,
    )
    raw = pickle.dumps(driver, protocol=0)  # text opcodes: module names can be rewritten
    assert b"iterflow.graph.graphs" in raw and b"iterflow.ml.training" in raw
    old = raw.replace(b"iterflow.graph.graphs", b"iterflow.graph.model").replace(
        b"iterflow.ml.training", b"iterflow.ml.model"
    )
    assert load_driver_state(old).state == {"graph": Graph, "error": MLError}


if __name__ == "__main__":
    write_checkpoints(Path(sys.argv[1]))
