"""The rounds left of loops without a convergence value: estimated from a count the loop
drives to zero (its criteria's rows, an observed step), with no Spark job added."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sessions import jobs_started
from test_graph import path_graph

import iterflow as itf
from iterflow.graph import Graph, Pregel, connected_components, label_propagation, pregel

#: 1024 rows halved every round: 512 rows after round 0, 1 after round 9, none after
#: round 10, which ends the loop.
ITEMS = 1024
LAST_EPOCH = 10


#: A body without criteria stops on its empty feedback alone, which ``run()`` warns about.
NO_CONDITION_WARNING = pytest.mark.filterwarnings("ignore:body 'halve' has no max_rounds")


def halving_body(
    *, criteria: str = "feedback", spare: bool = False, observe: bool = True
) -> Callable[..., itf.Declaration]:
    """A body that keeps the even ids of ``items`` and halves them (so half the rows go).

    ``criteria``: ``"feedback"`` ends the loop on ``itf.empty`` of the feedback (counted by
    its checkpoint), ``"separate"`` on a DataFrame of its own (counted on the job that
    checkpoints the feedback), and ``"none"`` declares no criteria (the loop ends on empty
    feedback, in the same round).
    ``observe`` observes the rows kept as ``kept``; ``spare`` adds an output observed as
    ``spare``: the ids divisible by 4, one round ahead.
    """

    @itf.body
    def halve(items: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        kept = items.where(F.col("id") % 2 == 0)
        if observe:
            kept = ctx.observe("kept", kept)
        following = kept.select((F.col("id") / 2).cast("long").alias("id"))
        outputs = {}
        if spare:
            outputs["spare"] = ctx.observe("spare", items.where(F.col("id") % 4 == 0))
        until = {
            "feedback": itf.empty(following),
            "separate": itf.empty(following.where(F.col("id") > 0)),
            "none": None,
        }[criteria]
        return itf.Declaration(feedback={"items": following}, outputs=outputs, until=until)

    return halve


def run_halving(spark: SparkSession, body: Any, **run_options: Any) -> list[itf.RoundProgress]:
    items = spark.range(1, ITEMS + 1).select(F.col("id").cast("long"))
    result = itf.BoundedIteration(body).bind("items", items).run(progress=False, **run_options)
    assert result.rounds == LAST_EPOCH + 1
    return result.history


def within_a_factor_of_two(estimate: int | None, truth: int) -> bool:
    return estimate is not None and truth / 2 <= estimate <= 2 * truth


def test_a_halving_criteria_only_loop_estimates_the_rounds_left_within_a_factor_of_two(
    spark: SparkSession,
) -> None:
    history = run_halving(spark, halving_body())
    # The criteria is the feedback: its checkpoint's job counted its rows.
    assert [p.criteria_rows for p in history] == [
        ITEMS // 2 ** (k + 1) for k in range(LAST_EPOCH + 1)
    ]
    estimates = [p.rounds_remaining_estimate for p in history]
    assert estimates[:2] == [None, None]  # two counts show no trend yet
    assert all(e is not None for e in estimates[2:])
    for epoch in range(5, LAST_EPOCH + 1):
        truth = LAST_EPOCH - epoch
        assert within_a_factor_of_two(estimates[epoch], truth), epoch
    assert estimates[-1] == 0  # the round whose criteria are empty ends the run


def test_a_criteria_of_its_own_is_counted_on_the_rounds_job_and_followed(
    spark: SparkSession,
) -> None:
    history = run_halving(spark, halving_body(criteria="separate", observe=False))
    # The criteria (the feedback's positive ids: all of them) is counted on the job that
    # checkpoints the feedback: its rows are there every round, followed to the loop's end.
    assert [p.criteria_rows for p in history] == [p.rows["items"] for p in history]
    assert history[-1].criteria_rows == 0
    estimates = [p.rounds_remaining_estimate for p in history]
    assert all(e is not None for e in estimates[2:])
    for epoch in range(5, LAST_EPOCH):
        assert within_a_factor_of_two(estimates[epoch], LAST_EPOCH - epoch), epoch


def test_connected_components_of_a_long_path_estimate_the_rounds_left_after_round_3(
    spark: SparkSession,
) -> None:
    n = 60
    ids = list(range(n))
    random.Random(11).shuffle(ids)
    path = path_graph(spark, ids)
    seen: list[itf.RoundProgress] = []
    rows = connected_components(
        path, method="dataframe", listen=lambda end: seen.append(end.progress), progress=False
    ).collect()
    assert {r["component"] for r in rows} == {0}
    # The criteria (vertices whose label moved) are an output: counted by its checkpoint.
    assert all(p.criteria_rows == p.observed["active"] for p in seen)
    last = len(seen) - 1
    assert last >= 4
    for p in seen[3:]:
        assert within_a_factor_of_two(p.rounds_remaining_estimate, last - p.epoch), p.epoch


@pytest.mark.parametrize("algorithm", ["label_propagation", "pregel"])
def test_graph_algorithms_ending_on_empty_criteria_count_them_in_the_round(
    spark: SparkSession, algorithm: str
) -> None:
    n = 12
    g = Graph(
        spark.createDataFrame([(v,) for v in range(n)], "id long"),
        spark.createDataFrame([(v, v + 1) for v in range(n - 1)], "src long, dst long"),
    )
    seen: list[itf.RoundProgress] = []

    def listen(end: itf.RoundEnd) -> None:
        seen.append(end.progress)

    if algorithm == "label_propagation":
        label_propagation(g, max_rounds=4, listen=listen, progress=False).collect()
    else:
        pregel(
            g,
            init={"hops": F.when(F.col("id") == 0, 0).otherwise(n)},
            update={"hops": F.least(F.col("hops"), Pregel.msg())},
            send_to_dst=Pregel.src("hops") + 1,
            aggregate=F.min,
            max_rounds=4,
            listen=listen,
            progress=False,
        ).collect()
    # Their criteria (the vertices that changed) are a feedback or output, counted by its
    # checkpoint, and observed as ``active``.
    assert [p.criteria_rows for p in seen] == [p.observed["active"] for p in seen]
    assert all(p.criteria_rows is not None for p in seen)


def test_progress_from_names_the_observed_step_the_estimate_follows(spark: SparkSession) -> None:
    body = halving_body(spare=True)
    default = [p.rounds_remaining_estimate for p in run_halving(spark, body)]
    named = [p.rounds_remaining_estimate for p in run_halving(spark, body, progress_from="spare")]
    # ``spare`` (256, 128, ... 1, 0) has no row left in round 9, the criteria in round 10.
    assert default[2:LAST_EPOCH] == [LAST_EPOCH - k for k in range(2, LAST_EPOCH)]
    assert named[2:LAST_EPOCH] == [LAST_EPOCH - 1 - k for k in range(2, LAST_EPOCH)]


@pytest.mark.parametrize(
    ("progress_from", "error", "message"),
    [
        ("sapre", itf.IterflowError, r"progress_from='sapre'.*\['kept'\]"),
        (3, TypeError, "progress_from=.*got int 3"),
    ],
    ids=["unknown name", "not a str"],
)
def test_progress_from_must_name_a_count_of_the_round(
    spark: SparkSession, progress_from: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        run_halving(spark, halving_body(), progress_from=progress_from)
    assert isinstance(raised.value, itf.IterflowError)


@NO_CONDITION_WARNING
def test_criteria_named_on_a_loop_without_criteria_is_an_error(spark: SparkSession) -> None:
    with pytest.raises(itf.IterflowError, match=r"'criteria'.*declares no itf\.empty"):
        run_halving(spark, halving_body(criteria="none"), progress_from="criteria")


def jobs_per_round(
    spark: SparkSession, body: Any, **run_options: Any
) -> tuple[list[int], list[int | None]]:
    """Spark jobs started in each round (up to its listener), and the estimates."""
    items = spark.range(1, ITEMS + 1).select(F.col("id").cast("long"))
    started = [jobs_started(spark)]
    result = (
        itf.BoundedIteration(body)
        .bind("items", items)
        .listen(lambda end: started.append(jobs_started(spark)))
        .run(progress=False, **run_options)
    )
    jobs = [after - before for before, after in itertools.pairwise(started)]
    return jobs, [p.rounds_remaining_estimate for p in result.history]


@NO_CONDITION_WARNING
def test_estimating_from_counts_adds_no_spark_job(spark: SparkSession) -> None:
    # The same rounds with nothing to follow (no criteria, no observed step), and with
    # the criteria's rows or an observed step's followed: the same jobs in each round.
    plain, nothing = jobs_per_round(spark, halving_body(criteria="none", observe=False))
    criteria, from_criteria = jobs_per_round(spark, halving_body())
    observed, from_observed = jobs_per_round(spark, halving_body(), progress_from="kept")
    assert nothing == [None] * (LAST_EPOCH + 1)
    assert all(e is not None for e in from_criteria[2:])
    assert all(e is not None for e in from_observed[2:])
    assert len(plain) == LAST_EPOCH + 1
    assert criteria == plain
    assert observed == plain
