"""iterflow against the PageRank loop a user would write by hand, same process and session.

Fixed rounds: a loop checkpointing each round with ``localCheckpoint(eager=True)``
(old checkpoints left to the garbage collector, as users do) against
``pagerank_body(n)`` for the same number of rounds. With convergence: the hand
loop also runs ``delta.collect()`` every round (as written, Spark recomputes the
round for it; a second hand loop caches the new ranks first, as iterflow does)
against ``pagerank_body(n, tol=-1.0)``, which never converges and so runs the
same number of rounds. Both loops start from the same cached ranks and edges.
Runs alternate (the starting variant rotates every repetition) after one
warm-up run of each, and the ratios are of medians. Target: iterflow / hand <= 1.10.

    python benchmarks/bench_hand_loop.py [--quick]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _common import (
    PageRankWorkload,
    RoundClock,
    alternate,
    count_jobs,
    finish,
    log,
    median,
    pagerank_workload,
    parse_args,
    print_table,
    round_times,
    settle,
    start_session,
)
from pyspark import StorageLevel
from pyspark.sql import SparkSession

from iterflow.graph.pagerank import pagerank_body, pagerank_update

TARGET = 1.10
# An L1 change is never negative, so every variant runs all rounds. (With tol=0.0 the
# 20,000-vertex PageRank stops at round 49, where the change becomes exactly 0.0 when
# the round is evaluated once, but not when the hand loop recomputes it for delta.)
TOL = -1.0


def hand_fixed(w: PageRankWorkload) -> list[float]:
    """Clock readings at the end of each round of the hand loop."""
    ranks, stamps = w.ranks0, []
    for _ in range(w.rounds):
        new_ranks, _delta = pagerank_update(ranks, w.edges, w.n)
        ranks = new_ranks.localCheckpoint(eager=True)
        stamps.append(time.perf_counter())
    return stamps


def hand_converging(w: PageRankWorkload) -> list[float]:
    """The hand loop with a convergence check as usually written: ``delta`` recomputes the round."""
    ranks, stamps = w.ranks0, []
    for _ in range(w.rounds):
        new_ranks, delta = pagerank_update(ranks, w.edges, w.n)
        ranks = new_ranks.localCheckpoint(eager=True)
        change = delta.collect()[0][0]
        stamps.append(time.perf_counter())
        if change <= TOL:
            break
    return stamps


def hand_converging_cached(w: PageRankWorkload) -> list[float]:
    """The careful hand loop: new ranks cached while they are checkpointed and ``delta`` is read."""
    ranks, stamps = w.ranks0, []
    for _ in range(w.rounds):
        new_ranks, delta = pagerank_update(ranks, w.edges, w.n)
        new_ranks.persist(StorageLevel.MEMORY_AND_DISK)
        ranks = new_ranks.localCheckpoint(eager=True)
        change = delta.collect()[0][0]
        new_ranks.unpersist()
        stamps.append(time.perf_counter())
        if change <= TOL:
            break
    return stamps


def iterflow_run(tol: float | None) -> Callable[[PageRankWorkload], list[float]]:
    def run(w: PageRankWorkload) -> list[float]:
        clock = RoundClock()
        result = w.iteration(pagerank_body(w.n, tol=tol)).listen(clock).run()
        end = time.perf_counter()
        result.release()
        # The loop's return (releasing round k-1, returning the result) belongs to the last round.
        return [*clock.stamps[:-1], end]

    return run


def measure(
    spark: SparkSession,
    name: str,
    run: Callable[[PageRankWorkload], list[float]],
    w: PageRankWorkload,
) -> dict[str, Any]:
    settle(spark)
    with count_jobs(spark, f"hand-loop-{name}") as jobs:
        start = time.perf_counter()
        stamps = run(w)
    rounds = round_times(stamps, start)
    log(f"  {name}: {len(rounds)} rounds, {stamps[-1] - start:.2f} s, {jobs.jobs} jobs")
    return {"total_s": stamps[-1] - start, "round_s": rounds, "jobs": jobs.jobs}


def compare(
    spark: SparkSession,
    variants: dict[str, Callable[[PageRankWorkload], list[float]]],
    w: PageRankWorkload,
    repetitions: int,
    warm_up: PageRankWorkload | None,
) -> dict[str, Any]:
    """Run every variant ``repetitions`` times, rotating which goes first; per-variant medians."""
    names = list(variants)
    if warm_up is not None:
        for name in names:
            measure(spark, f"{name} (warm-up)", variants[name], warm_up)
    sequence, runs = alternate(
        names, repetitions, lambda name: measure(spark, name, variants[name], w)
    )
    summary = {
        name: {
            "total_s_median": median([r["total_s"] for r in rs]),
            "round_s_median": median([median(r["round_s"]) for r in rs]),
            "jobs_per_round": rs[0]["jobs"] / len(rs[0]["round_s"]),
        }
        for name, rs in runs.items()
    }
    return {"sequence": sequence, "summary": summary, "runs": runs}


def ratios(summary: dict[str, Any], flow: str, hand: str) -> dict[str, float]:
    return {
        "total": summary[flow]["total_s_median"] / summary[hand]["total_s_median"],
        "round_median": summary[flow]["round_s_median"] / summary[hand]["round_s_median"],
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        vertices, edge_target, rounds, repetitions, warm_up_rounds = 500, 5_000, 3, 2, 0
    else:
        vertices, edge_target, rounds, repetitions, warm_up_rounds = 20_000, 200_000, 60, 3, 10

    spark = start_session()
    w = pagerank_workload(spark, vertices, edge_target, rounds)
    warm_up = w._replace(rounds=warm_up_rounds) if warm_up_rounds else None

    log(f"fixed rounds: {rounds}, {repetitions} runs each")
    fixed = compare(
        spark, {"hand": hand_fixed, "iterflow": iterflow_run(None)}, w, repetitions, warm_up
    )
    log(f"with convergence (tol={TOL}, never reached): {rounds} rounds, {repetitions} runs each")
    converging = compare(
        spark,
        {
            "hand": hand_converging,
            "hand_cached": hand_converging_cached,
            "iterflow": iterflow_run(TOL),
        },
        w,
        repetitions,
        warm_up,
    )

    results = {
        "target": TARGET,
        "fixed": {
            **fixed,
            "ratio_iterflow_over_hand": ratios(fixed["summary"], "iterflow", "hand"),
        },
        "converging": {
            **converging,
            "ratio_iterflow_over_hand": ratios(converging["summary"], "iterflow", "hand"),
            "ratio_iterflow_over_hand_cached": ratios(
                converging["summary"], "iterflow", "hand_cached"
            ),
        },
    }
    rows: list[tuple[str, Any]] = []
    for label, key in [("fixed rounds", "fixed"), ("with convergence", "converging")]:
        part = results[key]
        for name, s in part["summary"].items():
            rows += [
                (f"{label}: {name} total (s)", s["total_s_median"]),
                (f"{label}: {name} median round (s)", s["round_s_median"]),
                (f"{label}: {name} jobs per round", s["jobs_per_round"]),
            ]
        for ratio_key in [k for k in part if k.startswith("ratio_")]:
            peer = ratio_key.removeprefix("ratio_iterflow_over_")
            r = part[ratio_key]
            rows += [
                (f"{label}: iterflow / {peer}, total (target <= {TARGET})", r["total"]),
                (f"{label}: iterflow / {peer}, median round", r["round_median"]),
            ]
    print_table(w.title(repetitions), rows)
    config = w.settings(
        body=f"pagerank_body(n) / pagerank_body(n, tol={TOL})",
        repetitions=repetitions,
        warm_up_rounds=warm_up_rounds,
        tol=TOL,
    )
    finish(spark, "bench_hand_loop", args.quick, results, **config)


if __name__ == "__main__":
    main()
