"""The fixed cost of one iterflow round: a no-op body on a one-row variable.

The body feeds its input back unchanged (``feedback={"x": x}``), so a round is
pure iterflow overhead plus whatever Spark jobs it runs. Compared with the
smallest Spark job there is, ``spark.range(1).count()`` (the floor is about one
such job per round), with a hand loop doing ``x = x.localCheckpoint(eager=True)``,
and with the same hand loop counting the rows on the way as iterflow does
(``x.observe(...)`` before the checkpoint, then reading the observation).

    python benchmarks/bench_noop_round.py [--quick]
"""

from __future__ import annotations

import time

from _common import (
    RoundClock,
    count_jobs,
    finish,
    log,
    median,
    parse_args,
    print_table,
    round_times,
    start_session,
)
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

import iterflow as itf


@itf.body
def noop(x: DataFrame) -> itf.Declaration:
    return itf.Declaration(feedback={"x": x})


def run_iterflow(spark: SparkSession, rounds: int) -> dict[str, object]:
    clock = RoundClock()
    with count_jobs(spark, "noop-iterflow") as jobs:
        clock.start = time.perf_counter()
        result = (
            itf.BoundedIteration(noop)
            .bind("x", spark.range(1).toDF("x"))
            .until(itf.max_rounds(rounds))
            .listen(clock)
            .run()
        )
        total = time.perf_counter() - clock.start
    assert result.rounds == rounds, result.termination
    result.release()
    return {
        "total_s": total,
        "round_s": clock.round_times,
        "duration_s": [p.duration_s for p in result.history],
        "jobs": jobs.jobs,
    }


def run_hand(spark: SparkSession, rounds: int, observed: bool) -> dict[str, object]:
    x = spark.range(1).toDF("x")
    stamps, counted = [], 0
    with count_jobs(spark, f"noop-hand-{observed}") as jobs:
        start = time.perf_counter()
        for _ in range(rounds):
            if observed:
                rows = Observation()
                x = x.observe(rows, F.count(F.lit(1)).alias("rows")).localCheckpoint(eager=True)
                counted += rows.get["rows"]
            else:
                x = x.localCheckpoint(eager=True)
            stamps.append(time.perf_counter())
    return {
        "total_s": stamps[-1] - start,
        "round_s": round_times(stamps, start),
        "jobs": jobs.jobs,
        "rows_observed": counted,
    }


def run_count(spark: SparkSession, repeats: int) -> dict[str, object]:
    times = []
    with count_jobs(spark, "noop-count") as jobs:
        for _ in range(repeats):
            start = time.perf_counter()
            spark.range(1).count()
            times.append(time.perf_counter() - start)
    return {"total_s": sum(times), "round_s": times, "jobs": jobs.jobs}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 20 if args.quick else 100
    spark = start_session()

    log("warm-up")
    run_count(spark, 10)
    run_iterflow(spark, 10)
    run_hand(spark, 10, observed=False)
    run_hand(spark, 10, observed=True)

    log(f"spark.range(1).count() x {rounds}")
    count = run_count(spark, rounds)
    log(f"iterflow no-op body, {rounds} rounds")
    flow = run_iterflow(spark, rounds)
    log(f"hand loop x = x.localCheckpoint(eager=True), {rounds} rounds")
    hand = run_hand(spark, rounds, observed=False)
    log(f"hand loop with a row-count observation on each checkpoint, {rounds} rounds")
    hand_observed = run_hand(spark, rounds, observed=True)

    count_s = median(count["round_s"])
    flow_s = median(flow["round_s"])
    hand_s = median(hand["round_s"])
    hand_observed_s = median(hand_observed["round_s"])
    results = {
        "count_median_s": count_s,
        "count_jobs_per_call": count["jobs"] / rounds,
        "iterflow_round_median_s": flow_s,
        "iterflow_round_mean_s": flow["total_s"] / rounds,
        "iterflow_duration_s_median": median(flow["duration_s"]),
        "iterflow_jobs_per_round": flow["jobs"] / rounds,
        "iterflow_over_count": flow_s / count_s,
        "hand_checkpoint_round_median_s": hand_s,
        "hand_checkpoint_jobs_per_round": hand["jobs"] / rounds,
        "iterflow_over_hand_checkpoint": flow_s / hand_s,
        "hand_observed_checkpoint_round_median_s": hand_observed_s,
        "hand_observed_checkpoint_jobs_per_round": hand_observed["jobs"] / rounds,
        "iterflow_over_hand_observed_checkpoint": flow_s / hand_observed_s,
        "runs": {
            "count": count,
            "iterflow": flow,
            "hand_checkpoint": hand,
            "hand_observed_checkpoint": hand_observed,
        },
    }
    print_table(
        f"no-op round, {rounds} rounds (median seconds; jobs counted with a job group)",
        [
            ("spark.range(1).count()", count_s),
            ("  jobs per count()", results["count_jobs_per_call"]),
            ("iterflow round (wall, listener to listener)", flow_s),
            ("iterflow round (RoundProgress.duration_s)", results["iterflow_duration_s_median"]),
            ("  jobs per round", results["iterflow_jobs_per_round"]),
            ("hand localCheckpoint round", hand_s),
            ("  jobs per round", results["hand_checkpoint_jobs_per_round"]),
            ("hand observe + localCheckpoint round", hand_observed_s),
            ("  jobs per round", results["hand_observed_checkpoint_jobs_per_round"]),
            ("ratio iterflow / count()", results["iterflow_over_count"]),
            ("ratio iterflow / hand localCheckpoint", results["iterflow_over_hand_checkpoint"]),
            (
                "ratio iterflow / hand observe + localCheckpoint",
                results["iterflow_over_hand_observed_checkpoint"],
            ),
        ],
    )
    finish(spark, "bench_noop_round", args.quick, results, rounds=rounds)


if __name__ == "__main__":
    main()
