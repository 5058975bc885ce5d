"""Every misuse error names the culprit and the fix; most are raised before any Spark job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sessions import jobs_started, persisted_rdds

import iterflow as itf
from iterflow.runtime.datacache.driver_variables import DRIVER_ROWS_CONF

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def ranks(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(1, 0.5), (2, 0.5)], "id long, rank double")


@pytest.fixture(scope="module")
def edges(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([(1, 2)], "src long, dst long")


@contextmanager
def no_spark_job(spark: SparkSession) -> Iterator[None]:
    """Asserts that the block started no Spark job."""
    before = jobs_started(spark)
    yield
    assert jobs_started(spark) == before


@itf.body
def step(ranks: DataFrame, edges: DataFrame) -> itf.Declaration:
    return itf.Declaration(feedback={"ranks": ranks})


def test_binding_an_unknown_name_lists_the_inputs(ranks: DataFrame) -> None:
    with pytest.raises(itf.IterflowError, match=r"no input 'rank'.*\['ranks', 'edges'\]") as info:
        itf.BoundedIteration(step).bind("rank", ranks)
    assert isinstance(info.value, ValueError)


def test_binding_twice_is_an_error(ranks: DataFrame) -> None:
    with pytest.raises(itf.IterflowError, match=r"input 'ranks' is bound already; bind each"):
        itf.BoundedIteration(step).bind("ranks", ranks).bind("ranks", ranks)


def test_unbound_input_is_named_before_any_job(spark: SparkSession, ranks: DataFrame) -> None:
    with (
        no_spark_job(spark),
        pytest.raises(itf.IterflowError, match=r"\['edges'\] are not bound.*\.bind\('edges'"),
    ):
        itf.BoundedIteration(step).bind("ranks", ranks).run()


def test_feedback_for_a_name_that_is_not_an_input(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def stray(ranks: DataFrame, edges: DataFrame) -> itf.Declaration:
        return itf.Declaration(feedback={"scores": ranks})

    with (
        no_spark_job(spark),
        pytest.raises(itf.IterflowError, match=r"epoch 0.*feedback 'scores' is not an input"),
    ):
        itf.BoundedIteration(stray).bind("ranks", ranks).bind("edges", edges).run()


def test_feedback_schema_mismatch_lists_each_difference(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def drifted(ranks: DataFrame, edges: DataFrame) -> itf.Declaration:
        wrong = ranks.select(F.col("id").cast("int").alias("id"), F.lit(1).alias("extra"))
        return itf.Declaration(feedback={"ranks": wrong})

    with no_spark_job(spark), pytest.raises(itf.IterflowError) as info:
        itf.BoundedIteration(drifted).bind("ranks", ranks).bind("edges", edges).run()
    message = str(info.value)
    assert "feedback 'ranks' does not match the schema of input 'ranks'" in message
    assert "column 'id' is int, expected bigint" in message
    assert "column 'rank' (double) is missing" in message
    assert "column 'extra' (int) is not in the input" in message


def test_feedback_may_widen_nullability(spark: SparkSession) -> None:
    strict = spark.createDataFrame([(1,)], "v long not null")

    @itf.body
    def nullable(x: DataFrame) -> itf.Declaration:
        return itf.Declaration(feedback={"x": x.select(F.expr("nullif(v, 0)").alias("v"))})

    result = itf.BoundedIteration(nullable).bind("x", strict).until(itf.max_rounds(2)).run()
    assert result.rounds == 2


def test_body_returning_something_else_than_a_declaration(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def returns_dict(ranks: DataFrame, edges: DataFrame) -> dict[str, DataFrame]:
        return {"ranks": ranks}

    with (
        no_spark_job(spark),
        pytest.raises(itf.IterflowError, match=r"'returns_dict' returned dict; return itf.Decl"),
    ):
        itf.BoundedIteration(returns_dict).bind("ranks", ranks).bind("edges", edges).run()


def test_feedback_and_output_of_one_name_must_be_one_object(ranks: DataFrame) -> None:
    with pytest.raises(itf.IterflowError, match=r"feedback 'ranks' and output 'ranks' are diff"):
        itf.Declaration(feedback={"ranks": ranks}, outputs={"ranks": ranks.select("*")})


def test_declaration_values_must_be_dataframes(ranks: DataFrame) -> None:
    with pytest.raises(TypeError, match=r"'ranks' must be a DataFrame, got list"):
        itf.Declaration(feedback={"ranks": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"until=...\) takes a condition"):
        itf.Declaration(until=ranks)  # type: ignore[arg-type]


def test_inputs_from_two_sessions(spark: SparkSession, ranks: DataFrame) -> None:
    try:
        second = spark.newSession()
    except AttributeError:  # PySpark 4.0's Connect client (4.1 added it)
        pytest.skip("this Spark Connect client has no newSession()")
    other = second.createDataFrame([(1, 2)], "src long, dst long")
    with pytest.raises(itf.IterflowError, match=r"2 different SparkSessions"):
        itf.BoundedIteration(step).bind("ranks", ranks).bind("edges", other).run()


def test_exception_in_the_body_names_the_epoch(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def fails_late(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        if ctx.epoch == 2:
            raise KeyError("lost")
        return itf.Declaration(feedback={"ranks": ranks})

    with pytest.raises(itf.RoundError, match=r"epoch 2 failed in body 'fails_late'") as info:
        itf.BoundedIteration(fails_late).bind("ranks", ranks).bind("edges", edges).until(
            itf.max_rounds(5)
        ).run()
    assert info.value.epoch == 2
    assert isinstance(info.value.__cause__, KeyError)


def test_exception_in_a_listener_names_the_epoch_and_listener(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    def picky(ctx: itf.RoundEnd) -> None:
        if ctx.epoch == 1:
            raise RuntimeError("no thanks")

    with pytest.raises(itf.RoundError, match=r"epoch 1 failed in listener 'picky'.*no thanks"):
        itf.BoundedIteration(step).bind("ranks", ranks).bind("edges", edges).until(
            itf.max_rounds(3)
        ).listen(picky).run()


def test_spark_failure_inside_a_round_names_the_epoch(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def divide(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        bad = F.expr("assert_true(id < 0, 'id must be negative')") if ctx.epoch == 1 else F.lit(1)
        return itf.Declaration(feedback={"ranks": ranks.where(bad.isNull() | bad.isNotNull())})

    with pytest.raises(itf.RoundError, match=r"epoch 1 failed in materialization"):
        itf.BoundedIteration(divide).bind("ranks", ranks).bind("edges", edges).until(
            itf.max_rounds(3)
        ).run()


def test_observing_one_name_twice_in_a_round(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def twice(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        ctx.observe("step", ranks)
        ctx.observe("step", edges)
        return itf.Declaration(feedback={"ranks": ranks})

    with pytest.raises(itf.IterflowError, match=r"epoch 0: observe\('step'\) was called twice"):
        itf.BoundedIteration(twice).bind("ranks", ranks).bind("edges", edges).run()


def test_convergence_value_needs_one_numeric_column(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def two_columns(ranks: DataFrame, edges: DataFrame) -> itf.Declaration:
        return itf.Declaration(
            feedback={"ranks": ranks}, until=itf.converged(ranks.agg(F.max("id"), F.min("id")), 1)
        )

    with (
        no_spark_job(spark),
        pytest.raises(itf.IterflowError, match=r"must have one numeric column, it has \(max"),
    ):
        itf.BoundedIteration(two_columns).bind("ranks", ranks).bind("edges", edges).run()


def test_empty_convergence_value_is_an_error(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def no_rows(ranks: DataFrame, edges: DataFrame) -> itf.Declaration:
        value = ranks.where("id < 0").select("rank")
        return itf.Declaration(feedback={"ranks": ranks}, until=itf.converged(value, 1.0))

    with pytest.raises(itf.IterflowError, match=r"epoch 0: the convergence value has no rows"):
        itf.BoundedIteration(no_rows).bind("ranks", ranks).bind("edges", edges).run()


def test_replay_on_a_variable_is_an_error(ranks: DataFrame, edges: DataFrame) -> None:
    with pytest.raises(itf.IterflowError, match=r"'ranks' is bound with replay=True but receives"):
        itf.BoundedIteration(step).bind("ranks", ranks, replay=True).bind("edges", edges).run()


def test_feedback_names_must_not_change_between_rounds(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    @itf.body
    def fickle(ranks: DataFrame, edges: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        if ctx.epoch == 0:
            return itf.Declaration(feedback={"ranks": ranks})
        return itf.Declaration(feedback={"ranks": ranks, "edges": edges})

    with pytest.raises(itf.IterflowError, match=r"epoch 1.*declare the same feedback names"):
        itf.BoundedIteration(fickle).bind("ranks", ranks).bind("edges", edges).until(
            itf.max_rounds(3)
        ).run()


def test_listen_rejects_a_class_without_per_round() -> None:
    with pytest.raises(TypeError, match=r"listen\(RoundListener\): pass an instance"):
        itf.BoundedIteration(step).listen(itf.RoundListener)


def test_body_with_star_args_is_rejected() -> None:
    def star(*frames: DataFrame) -> itf.Declaration:
        return itf.Declaration()

    with pytest.raises(TypeError, match=r"'frames' must be a plain named parameter"):
        itf.body(star)


def test_failed_run_releases_what_it_persisted(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    before = persisted_rdds(spark)

    def boom(ctx: itf.RoundEnd) -> None:
        if ctx.epoch == 2:
            raise RuntimeError("boom")

    with pytest.raises(itf.RoundError):
        itf.BoundedIteration(step).bind("ranks", ranks).bind("edges", edges).until(
            itf.max_rounds(5)
        ).listen(boom).run()
    leaked = {k: v for k, v in persisted_rdds(spark).items() if k not in before}
    assert leaked == {}
    assert edges.storageLevel.useMemory is False


@pytest.mark.spark_classic(
    "a Connect server frees released checkpoints only when its JVM collects them"
)
def test_a_run_that_fails_as_it_terminates_releases_its_last_outputs(
    spark: SparkSession, ranks: DataFrame, edges: DataFrame
) -> None:
    """The last round's outputs are kept only for a result that is returned."""
    before = persisted_rdds(spark)

    @itf.body
    def with_output(ranks: DataFrame, edges: DataFrame) -> itf.Declaration:
        following = ranks.select("id", (F.col("rank") * 0.5).alias("rank"))
        return itf.Declaration(feedback={"ranks": following}, outputs={"ranks": following})

    class FailsAtTheEnd(itf.RoundListener):
        def on_iteration_terminated(self, ctx: itf.IterationEnd) -> None:
            raise RuntimeError("end")

    spark.conf.set(DRIVER_ROWS_CONF, "0")  # the outputs are checkpointed in Spark
    try:
        with pytest.raises(itf.RoundError, match="end"):
            itf.BoundedIteration(with_output).bind("ranks", ranks).bind("edges", edges).until(
                itf.max_rounds(3)
            ).listen(FailsAtTheEnd()).run()
    finally:
        spark.conf.unset(DRIVER_ROWS_CONF)
    leaked = {k: v for k, v in persisted_rdds(spark).items() if k not in before}
    assert leaked == {}


def test_round_error_shows_what_a_python_worker_raised():
    from iterflow.errors import RoundError

    worker = RuntimeError(
        "An exception was thrown from the Python worker:\n"
        "Traceback (most recent call last):\n"
        '  File "kernel.py", line 3, in prepare\n'
        "iterflow.graph.graphs.GraphError: edges end at ids that are not vertices, e.g. [7]\n"
    )
    assert str(RoundError(2, "body 'step'", worker)) == (
        "epoch 2 failed in body 'step': RuntimeError: An exception was thrown from the "
        "Python worker: iterflow.graph.graphs.GraphError: edges end at ids that are not "
        "vertices, e.g. [7]"
    )
    older = RuntimeError(  # PySpark 4.0's header
        "An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "Traceback (most recent call last):\n"
        "iterflow.errors.IterflowError: features must be finite\n"
    )
    assert str(RoundError(0, "body 'step'", older)).endswith(
        "below. iterflow.errors.IterflowError: features must be finite"
    )
    plain = ValueError("first line\nsecond line")
    assert str(RoundError(0, "body 'step'", plain)).endswith("ValueError: first line")


def test_iterflow_warnings_point_at_the_line_that_called_iterflow() -> None:
    """However deep iterflow's own frames (and a ``with`` block's) are, a warning names
    the first frame outside iterflow: the user's call."""
    inner: dict[str, Any] = {"__name__": "iterflow.fake"}
    exec(
        "import contextlib\n"
        "from iterflow.errors import warn\n"
        "def deep():\n"
        "    with contextlib.nullcontext():\n"
        "        warn('deep')\n"
        "def outer():\n"
        "    deep()\n",
        inner,
    )
    with pytest.warns(itf.IterflowWarning, match="deep") as caught:
        inner["outer"]()  # this line
    assert caught[0].filename == __file__
