"""Semantics of the bounded loop, ported from Flink ML's iteration tests as exact assertions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sessions import jobs_started

import iterflow as itf
from iterflow.runtime.datacache.driver_variables import DRIVER_ROWS_CONF

pytestmark = pytest.mark.spark

PASS_SUM = 4 * sum(range(1000))  # 1,998,000


@pytest.fixture(scope="module")
def data(spark: SparkSession) -> DataFrame:
    """4 partitions, each holding 0..999."""
    df = spark.range(0, 4000, numPartitions=4).select((F.col("id") % 1000).alias("x"))
    per_partition = df.groupBy(F.spark_partition_id().alias("p")).agg(
        F.count(F.lit(1)).alias("n"), F.sum("x").alias("s")
    )
    assert sorted(tuple(r) for r in per_partition.collect()) == [
        (p, 1000, sum(range(1000))) for p in range(4)
    ]
    return df


@pytest.fixture
def counter(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(0,)], "round int")


@itf.body
def count_to_four(counter: DataFrame, data: DataFrame) -> itf.Declaration:
    """Feeds the round counter back while round < 4; outputs the sum of the data."""
    following = counter.where("round < 4").select((F.col("round") + 1).alias("round"))
    return itf.Declaration(
        feedback={"counter": following}, outputs={"sum": data.agg(F.sum("x").alias("sum"))}
    )


@itf.body
def count_forever(counter: DataFrame, data: DataFrame) -> itf.Declaration:
    following = counter.select((F.col("round") + 1).alias("round"))
    return itf.Declaration(
        feedback={"counter": following}, outputs={"sum": data.agg(F.sum("x").alias("sum"))}
    )


class Recorder(itf.RoundListener):
    """Records every callback in order, with what it saw."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        total = ctx.outputs["sum"].first()["sum"]
        self.events.append(("round_end", ctx.epoch, ctx.epoch_watermark, total))

    def on_iteration_terminated(self, ctx: itf.IterationEnd) -> None:
        self.events.append(("terminated", ctx.rounds, ctx.termination.reason))


def test_feedback_while_round_below_four_runs_exactly_five_rounds(
    data: DataFrame, counter: DataFrame
) -> None:
    recorder = Recorder()
    with pytest.warns(itf.IterflowWarning, match=r"stops only when its feedback is empty"):
        result = (
            itf.BoundedIteration(count_to_four)
            .bind("counter", counter)
            .bind("data", data)
            .listen(recorder)
            .run()
        )
    assert result.rounds == 5
    assert result.termination == itf.Termination("feedback_empty", 4, ("feedback_empty",))
    assert recorder.events == [
        *[("round_end", k, k, PASS_SUM) for k in range(5)],
        ("terminated", 5, "feedback_empty"),
    ]
    assert [p.epoch for p in result.history] == [0, 1, 2, 3, 4]
    assert [p.rows["counter"] for p in result.history] == [1, 1, 1, 1, 0]
    assert all(p.rows["sum"] == 1 for p in result.history)
    assert result.outputs["sum"].first()["sum"] == PASS_SUM
    assert result.resumed_from is None
    result.release()


def test_max_rounds_four_runs_exactly_four_rounds(data: DataFrame, counter: DataFrame) -> None:
    recorder = Recorder()
    result = (
        itf.BoundedIteration(count_forever)
        .bind("counter", counter)
        .bind("data", data)
        .until(itf.max_rounds(4))
        .listen(recorder)
        .run()
    )
    assert result.rounds == 4
    assert result.termination.reason == "max_rounds"
    assert result.termination.epoch == 3
    assert [e[1] for e in recorder.events if e[0] == "round_end"] == [0, 1, 2, 3]
    assert recorder.events[-1] == ("terminated", 4, "max_rounds")


def test_empty_criteria_on_a_data_input_stops_after_one_round_despite_feedback(
    data: DataFrame, counter: DataFrame
) -> None:
    @itf.body
    def criteria_from_data(counter: DataFrame, data: DataFrame) -> itf.Declaration:
        following = counter.select((F.col("round") + 1).alias("round"))
        return itf.Declaration(
            feedback={"counter": following}, until=itf.empty(data.where("x < 0"))
        )

    recorder = Recorder.__new__(Recorder)
    calls: list[int] = []
    result = (
        itf.BoundedIteration(criteria_from_data)
        .bind("counter", counter)
        .bind("data", data)
        .listen(lambda ctx: calls.append(ctx.epoch))
        .until(itf.max_rounds(10))
        .run()
    )
    del recorder
    assert result.rounds == 1
    assert result.termination == itf.Termination("criteria_empty", 0, ("criteria_empty",))
    assert result.history[0].rows == {"counter": 1}
    assert result.history[0].criteria_empty is True
    assert calls == [0]


def test_criteria_that_is_the_feedback_stops_when_it_empties(spark: SparkSession) -> None:
    @itf.body
    def halve(values: DataFrame) -> itf.Declaration:
        remaining = values.select((F.col("v") / 2).cast("int").alias("v")).where("v > 0")
        return itf.Declaration(feedback={"values": remaining}, until=itf.empty(remaining))

    start = spark.createDataFrame([(8,), (3,)], "v int")
    result = itf.BoundedIteration(halve).bind("values", start).run()
    # 8 -> 4 -> 2 -> 1 -> 0: the fourth round (epoch 3) leaves nothing.
    assert result.rounds == 4
    assert result.termination.reasons == ("criteria_empty", "feedback_empty")
    assert [p.criteria_empty for p in result.history] == [False, False, False, True]
    assert [p.rows["values"] for p in result.history] == [2, 1, 1, 0]


def test_body_without_feedback_runs_exactly_one_round(data: DataFrame) -> None:
    @itf.body
    def once(data: DataFrame) -> itf.Declaration:
        return itf.Declaration(outputs={"n": data.agg(F.count(F.lit(1)).alias("n"))})

    result = itf.BoundedIteration(once).bind("data", data).run()
    assert result.rounds == 1
    assert result.termination.reason == "feedback_empty"
    assert result.outputs["n"].first()["n"] == 4000


def test_per_round_listener_starts_fresh_and_iteration_listener_accumulates(
    data: DataFrame, counter: DataFrame
) -> None:
    per_round_totals: list[int] = []
    terminated_by: list[int] = []

    class SumRows(itf.RoundListener):
        instances = 0

        def __init__(self) -> None:
            SumRows.instances += 1
            self.identity = SumRows.instances
            self.total = 0

        def on_round_end(self, ctx: itf.RoundEnd) -> None:
            self.total += ctx.outputs["sum"].first()["sum"]
            per_round_totals.append(self.total)

        def on_iteration_terminated(self, ctx: itf.IterationEnd) -> None:
            terminated_by.append(self.identity)

    class Cumulative(itf.RoundListener):
        def __init__(self) -> None:
            self.total = 0
            self.seen: list[int] = []

        def on_round_end(self, ctx: itf.RoundEnd) -> None:
            self.total += ctx.outputs["sum"].first()["sum"]
            self.seen.append(self.total)

    cumulative = Cumulative()
    (
        itf.BoundedIteration(count_forever)
        .bind("counter", counter)
        .bind("data", data)
        .until(itf.max_rounds(3))
        .listen(SumRows, per_round=True)
        .listen(cumulative)
        .run()
    )
    assert per_round_totals == [PASS_SUM, PASS_SUM, PASS_SUM]
    assert cumulative.seen == [PASS_SUM, 2 * PASS_SUM, 3 * PASS_SUM]
    assert SumRows.instances == 3
    assert terminated_by == [3]  # only the last round's instance hears the end


def _counted_source(spark: SparkSession) -> tuple[DataFrame, Any]:
    """100 rows whose evaluation adds 1 per row to an accumulator (a UDF on executors)."""
    evaluated = spark.sparkContext.accumulator(0)

    def touch(x):  # type: ignore[no-untyped-def]  # hints would make Spark guess a pandas UDF
        evaluated.add(1)
        return x

    touched = F.udf(touch, "long")
    return spark.range(100, numPartitions=2).select(touched("id").alias("x")), evaluated


@pytest.mark.spark_classic("counts evaluations with an accumulator, which Connect lacks")
@pytest.mark.parametrize(("replay", "evaluations"), [(False, 100), (True, 300)])
def test_data_input_is_evaluated_once_or_once_per_round_with_replay(
    spark: SparkSession, counter: DataFrame, replay: bool, evaluations: int
) -> None:
    source, evaluated = _counted_source(spark)

    @itf.body
    def use_source(counter: DataFrame, points: DataFrame) -> itf.Declaration:
        following = counter.select((F.col("round") + 1).alias("round"))
        total = points.agg(F.sum("x").alias("sum"))
        return itf.Declaration(feedback={"counter": following}, outputs={"sum": total})

    result = (
        itf.BoundedIteration(use_source)
        .bind("counter", counter)
        .bind("points", source, replay=replay)
        .until(itf.max_rounds(3))
        .run()
    )
    assert result.outputs["sum"].first()["sum"] == sum(range(100))
    assert evaluated.value == evaluations
    assert source.storageLevel.useMemory is False  # released at the end either way


@pytest.mark.spark_classic("counts evaluations with an accumulator, which Connect lacks")
def test_each_declared_dataframe_is_evaluated_once_per_round(
    spark: SparkSession, counter: DataFrame
) -> None:
    source, evaluated = _counted_source(spark)

    @itf.body
    def shared(counter: DataFrame, points: DataFrame) -> itf.Declaration:
        following = (
            counter.crossJoin(points.agg(F.max("x").alias("m")))
            .where(F.col("m") >= 0)
            .select((F.col("round") + 1).alias("round"))
        )
        return itf.Declaration(feedback={"counter": following}, outputs={"counter": following})

    itf.BoundedIteration(shared).bind("counter", counter).bind("points", source, replay=True).until(
        itf.max_rounds(2)
    ).run()
    assert evaluated.value == 200  # feedback == output: one evaluation per round


def test_observe_counts_rows_of_a_step_without_extra_jobs(
    spark: SparkSession, data: DataFrame, counter: DataFrame
) -> None:
    @itf.body
    def observed(counter: DataFrame, data: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        small = ctx.observe("small", data.where(F.col("x") < 10 * (ctx.epoch + 1)))
        ctx.observe("never_used", data)
        following = counter.crossJoin(small.agg(F.count(F.lit(1)).alias("n"))).select(
            (F.col("round") + 1).alias("round")
        )
        return itf.Declaration(feedback={"counter": following})

    result = (
        itf.BoundedIteration(observed)
        .bind("counter", counter)
        .bind("data", data)
        .until(itf.max_rounds(3))
        .run()
    )
    assert [p.observed["small"] for p in result.history] == [40, 80, 120]
    assert [p.observed["never_used"] for p in result.history] == [None, None, None]


def test_ctx_cache_lifecycles_and_user_caches_survive(
    spark: SparkSession, counter: DataFrame
) -> None:
    users_cache = spark.range(50).select(F.col("id").alias("x")).cache()
    users_cache.count()
    seen: dict[str, list[bool]] = {"round": [], "iteration": []}
    kept: dict[str, DataFrame] = {}

    @itf.body
    def caching(counter: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        kept["round"] = ctx.cache(points.where("x > 1"), lifecycle="round")
        if ctx.epoch == 0:
            kept["iteration"] = ctx.cache(points.where("x > 2"), lifecycle="iteration")
        following = counter.select((F.col("round") + 1).alias("round"))
        return itf.Declaration(feedback={"counter": following})

    def check(ctx: itf.RoundEnd) -> None:
        for lifecycle, df in kept.items():
            seen[lifecycle].append(df.storageLevel.useMemory)

    itf.BoundedIteration(caching).bind("counter", counter).bind("points", users_cache).until(
        itf.max_rounds(2)
    ).listen(check).run()
    assert seen == {"round": [True, True], "iteration": [True, True]}
    assert kept["round"].storageLevel.useMemory is False
    assert kept["iteration"].storageLevel.useMemory is False
    assert users_cache.storageLevel.useMemory is True  # never unpersist a user's cache
    users_cache.unpersist()


def test_listeners_emit_values_and_feedback_columns_may_be_reordered(
    spark: SparkSession,
) -> None:
    @itf.body
    def swap(pairs: DataFrame) -> itf.Declaration:
        following = pairs.select((F.col("b") + 1).alias("b"), F.col("a"))  # other column order
        return itf.Declaration(feedback={"pairs": following}, outputs={"pairs": following})

    def emit_b(ctx: itf.RoundEnd) -> None:
        assert ctx.variables["pairs"].columns == ["a", "b"]
        ctx.emit("b", ctx.variables["pairs"].first()["b"])

    start = spark.createDataFrame([("x", 0)], "a string, b long")
    result = (
        itf.BoundedIteration(swap).bind("pairs", start).until(itf.max_rounds(3)).listen(emit_b)
    ).run()
    assert result.emitted == {"b": [1, 2, 3]}
    assert result.outputs["pairs"].first()["b"] == 3


def test_converged_value_from_a_dataframe_and_from_a_callable(spark: SparkSession) -> None:
    @itf.body
    def shrink(x: DataFrame) -> itf.Declaration:
        following = x.select((F.col("v") / 10).alias("v"))
        return itf.Declaration(
            feedback={"x": following},
            until=itf.converged(following.agg(F.max("v")), tol=1e-3),
        )

    start = spark.createDataFrame([(1.0,)], "v double")
    result = itf.BoundedIteration(shrink).bind("x", start).run()
    assert result.rounds == 3
    assert result.termination.reason == "converged"
    assert [p.converged_value for p in result.history] == pytest.approx([0.1, 0.01, 0.001])

    by_callable = (
        itf.BoundedIteration(shrink)
        .bind("x", start)
        .until(itf.converged(lambda end: 1.0 / (end.epoch + 1), tol=0.3))
        .run()
    )
    # The callable fires at epoch 3 (0.25 <= 0.3), after the DataFrame value at epoch 2.
    assert by_callable.rounds == 3
    assert by_callable.history[0].converged_value == pytest.approx(1.0)


def test_nan_convergence_value_raises_divergence_naming_the_epoch(spark: SparkSession) -> None:
    @itf.body
    def blow_up(x: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        following = x.select((F.col("v") * 1e200).alias("v"))
        delta = following.agg((F.max("v") - F.max("v")).alias("d"))
        return itf.Declaration(feedback={"x": following}, until=itf.converged(delta, tol=-1.0))

    start = spark.createDataFrame([(1.0,)], "v double")
    with pytest.raises(itf.DivergenceError, match=r"epoch 1") as info:
        itf.BoundedIteration(blow_up).bind("x", start).until(itf.max_rounds(5)).run()
    assert info.value.epoch == 1


def test_rows_bound_without_a_dataframe_use_the_inputs_session(
    spark: SparkSession, data: DataFrame
) -> None:
    result = (
        itf.BoundedIteration(count_to_four)
        .bind("counter", [{"round": 2}])
        .bind("data", data)
        .until(itf.max_rounds(10))
        .run()
    )
    assert result.rounds == 3  # rounds 2, 3, 4 of the counter
    assert itf.session() is spark  # the active session, not a new embedded one


def test_small_variables_are_held_on_the_driver_after_the_first_round(
    spark: SparkSession,
) -> None:
    @itf.body
    def grow(small: DataFrame, big: DataFrame) -> itf.Declaration:
        following = small.select((F.col("v") + 1).alias("v"))
        return itf.Declaration(
            feedback={"small": following, "big": big.select((F.col("v") + 1).alias("v"))},
            outputs={"small": following},
        )

    seen: dict[str, list[bool]] = {"small": [], "big": []}
    jobs_to_read: list[int] = []

    def check(ctx: itf.RoundEnd) -> None:
        for name in seen:
            seen[name].append(ctx.variables[name].isLocal())
        before = jobs_started(spark)
        ctx.variables["small"].collect()
        jobs_to_read.append(jobs_started(spark) - before)

    def run() -> itf.IterationResult:
        return (
            itf.BoundedIteration(grow)
            .bind("small", spark.range(3).select(F.col("id").alias("v")))
            .bind("big", spark.range(1500).select(F.col("id").alias("v")))
            .until(itf.max_rounds(3))
            .listen(check)
            .run()
        )

    assert sorted(r["v"] for r in run().outputs["small"].collect()) == [3, 4, 5]
    # Round 0 cannot know the sizes; from round 1 the 3-row variable lives on the driver,
    # and reading it runs no Spark job. The 1,500-row one (over DRIVER_ROWS) stays in Spark.
    assert seen == {"small": [False, True, True], "big": [False, False, False]}
    assert jobs_to_read[1:] == [0, 0]

    seen = {"small": [], "big": []}
    spark.conf.set(DRIVER_ROWS_CONF, "0")
    try:
        result = run()
    finally:
        spark.conf.unset(DRIVER_ROWS_CONF)
    assert seen == {"small": [False, False, False], "big": [False, False, False]}
    assert sorted(r["v"] for r in result.outputs["small"].collect()) == [3, 4, 5]

    spark.conf.set(DRIVER_ROWS_CONF, "many")
    try:
        with pytest.raises(itf.IterflowError, match=DRIVER_ROWS_CONF):
            run()
    finally:
        spark.conf.unset(DRIVER_ROWS_CONF)


def test_vector_reads_a_one_row_model_and_vector_cell_writes_one(spark: SparkSession) -> None:
    """Gradient descent on f(w) = |w - target|^2 / 2 with the model as one array row:
    each round reads it with itf.vector and writes the next with itf.vector_cell."""
    target = np.array([3.0, -1.0, 0.5])
    schema = "w ARRAY<DOUBLE>"

    @itf.body
    def descend(model: DataFrame) -> itf.Declaration:
        w = itf.vector(model, "w")
        following = spark.createDataFrame(
            pa.table([itf.vector_cell(w - 0.5 * (w - target))], names=["w"]), schema=schema
        )
        return itf.Declaration(feedback={"model": following}, outputs={"model": following})

    jobs_to_read: list[int] = []

    def read(end: itf.RoundEnd) -> None:
        before = jobs_started(spark)
        itf.vector(end.variables["model"], "w")
        jobs_to_read.append(jobs_started(spark) - before)

    start = spark.createDataFrame([([0.0, 0.0, 0.0],)], schema)
    result = (
        itf.BoundedIteration(descend)
        .bind("model", start)
        .until(itf.max_rounds(4))
        .listen(read)
        .run()
    )
    expected = target * (1 - 0.5**4)  # w_k = target (1 - 2^-k) from w_0 = 0
    np.testing.assert_allclose(itf.vector(result.outputs["model"], "w"), expected, rtol=1e-15)
    assert jobs_to_read[1:] == [0, 0, 0]  # held on the driver from round 1 on

    for column, row, match in [("v", 0, "no column 'v'"), ("w", 1, "has 1 row")]:
        with pytest.raises(itf.IterflowError, match=match):
            itf.vector(start, column, row)
    with pytest.raises(itf.IterflowError, match="not an array"):
        itf.vector(spark.createDataFrame([(1.0,)], "w DOUBLE"), "w")
    with pytest.raises(itf.IterflowError, match="is null"):
        itf.vector(spark.createDataFrame([(None,)], schema), "w")
