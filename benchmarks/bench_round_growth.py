"""Does a round get slower as the iteration goes on? PageRank for 200 rounds.

iterflow cuts lineage every round, so round 190 should cost what round 20 costs
(API.md: "Plans do not grow with the round count"). Reported for the demo body
``pagerank_body(n)``: the median round time of rounds 150-199 over the median of
rounds 10-30 (target <= 1.25) and the least-squares slope from round 10 on. The
contrast is a plain PySpark loop without lineage cutting (``ranks = new_ranks``,
each round forced with an aggregate), stopped at 25 rounds.

Runs that grow without bound are stopped by a guard: the iterflow run stops
(``itf.until``) after the first round slower than ``guard_s``, the plain loop
likewise (its rounds about double, so the overrun stays about twice the guard;
a round that fails, e.g. out of driver memory, ends it too). Per round, the log10 of the optimizer's
size estimate of the new ranks is recorded too: an estimate that compounds
round after round made iterflow stall before commit 49836da (see the README).

    python benchmarks/bench_round_growth.py [--quick]
"""

from __future__ import annotations

import time
from typing import Any

from _common import (
    PageRankWorkload,
    RoundClock,
    count_jobs,
    finish,
    log,
    median,
    pagerank_workload,
    parse_args,
    print_table,
    settle,
    size_estimate_log10,
    slope,
    start_session,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.pagerank import pagerank_body, pagerank_update

TARGET = 1.25
# Past some 10^5 digits even printing the size estimate gets slow; stop reading it there.
SIZE_LOG10_READ_LIMIT = 1e5


class SizeProbe:
    """Listener: log10 of the size estimate of each round's new ranks (while cheap to read)."""

    def __init__(self) -> None:
        self.values: list[float | None] = []

    def __call__(self, ctx: itf.RoundEnd) -> None:
        last = self.values[-1] if self.values else 0.0
        readable = last is not None and last < SIZE_LOG10_READ_LIMIT
        self.values.append(size_estimate_log10(ctx.variables["ranks"]) if readable else None)


def run_iterflow(
    spark: SparkSession, w: PageRankWorkload, body: itf.IterationBody, guard_s: float
) -> dict[str, Any]:
    clock, sizes = RoundClock(), SizeProbe()
    with count_jobs(spark, "growth-iterflow") as jobs:
        clock.start = time.perf_counter()
        result = (
            w.iteration(body)
            .until(itf.until(lambda p: p.duration_s > guard_s))
            .listen(clock)
            .listen(sizes)
            .run()
        )
        total = time.perf_counter() - clock.start
    rank_sum = result.outputs["ranks"].agg(F.sum("rank")).first()[0]
    result.release()
    return {
        "rounds_completed": result.rounds,
        "termination": result.termination.reason,
        "total_s": total,
        "jobs": jobs.jobs,
        "rank_sum": rank_sum,
        "duration_s": [p.duration_s for p in result.history],
        "round_s": clock.round_times,
        "size_estimate_log10": sizes.values,
    }


def run_plain(
    n: int, ranks0: DataFrame, edges: DataFrame, rounds: int, guard_s: float
) -> dict[str, Any]:
    """The loop users write first: no lineage cutting, one action per round."""
    ranks = ranks0
    times, build_times, sizes = [], [], []
    failure = None
    for i in range(rounds):
        start = time.perf_counter()
        new_ranks, _delta = pagerank_update(ranks, edges, n)
        built = time.perf_counter()
        try:
            new_ranks.agg(F.sum("rank")).collect()
        except Exception as exc:  # e.g. the driver running out of memory for a broadcast
            failure = f"round {i} failed after {time.perf_counter() - start:.0f} s: {exc}"[:400]
            log(f"  plain {failure}")
            break
        ranks = new_ranks
        times.append(time.perf_counter() - start)
        build_times.append(built - start)
        sizes.append(size_estimate_log10(new_ranks))
        log(
            f"  plain round {i}: {times[-1]:.3f} s (building the DataFrame {build_times[-1]:.3f} s)"
        )
        if times[-1] > guard_s:
            break
    return {
        "rounds_completed": len(times),
        "stopped_by_guard": failure is None and len(times) < rounds,
        "failure": failure,
        "round_s": times,
        "build_s": build_times,
        "size_estimate_log10": sizes,
    }


def window(values: list[float], first: int, last: int) -> list[float]:
    """Rounds ``first`` to ``last`` inclusive."""
    return values[first : last + 1]


def growth(run: dict[str, Any], early: tuple[int, int], late: tuple[int, int]) -> dict[str, Any]:
    """Early/late medians, their ratio and the slope of a run (None where not reached)."""
    durations, wall = run["duration_s"], run["round_s"]
    has_early, has_late = len(durations) > early[1], len(durations) > late[1]
    early_s = median(window(durations, *early)) if has_early else None
    late_s = median(window(durations, *late)) if has_late else None
    return {
        "rounds_completed": run["rounds_completed"],
        "termination": run["termination"],
        "early_median_s": early_s,
        "late_median_s": late_s,
        "growth_ratio": late_s / early_s if has_late else None,
        "growth_ratio_wall": (
            median(window(wall, *late)) / median(window(wall, *early)) if has_late else None
        ),
        "slope_s_per_round": (
            slope(durations[early[0] :], first_round=early[0]) if has_early else None
        ),
        "jobs_per_round": run["jobs"] / run["rounds_completed"],
        "slowest_round_s": max(durations),
        "total_s": run["total_s"],
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if args.quick:
        vertices, edge_target, rounds, plain_rounds, guard_s, warm_up = 1_000, 10_000, 20, 8, 2.0, 3
    else:
        vertices, edge_target, rounds, plain_rounds, guard_s, warm_up = (
            20_000,
            200_000,
            200,
            25,
            30.0,
            10,
        )
    # Rounds 10-30 and 150-199 of 200, scaled with the round count.
    early = (rounds // 20, (rounds * 3) // 20)
    late = ((rounds * 3) // 4, rounds - 1)

    spark = start_session()
    w = pagerank_workload(spark, vertices, edge_target, rounds)
    body = pagerank_body(w.n)

    log(f"warm-up: iterflow, {warm_up} rounds")
    run_iterflow(spark, w._replace(rounds=warm_up), body, guard_s)
    settle(spark)
    log(f"iterflow, pagerank_body(n): up to {rounds} rounds")
    flow = run_iterflow(spark, w, body, guard_s)
    settle(spark)
    log(f"plain loop without lineage cutting: up to {plain_rounds} rounds")
    plain = run_plain(w.n, w.ranks0, w.edges, plain_rounds, guard_s)

    g = growth(flow, early, late)
    plain_s = plain["round_s"]
    results = {
        "early_rounds": list(early),
        "late_rounds": list(late),
        "growth_target": TARGET,
        "iterflow": g,
        "plain": {
            **plain,
            "slope_s_per_round": slope(plain_s) if len(plain_s) >= 2 else None,
            # The plain loop's rounds grow geometrically; this is the mean factor per round.
            "growth_factor_per_round": (
                (plain_s[-1] / plain_s[0]) ** (1 / (len(plain_s) - 1))
                if len(plain_s) >= 2
                else None
            ),
        },
        "iterflow_run": flow,
    }
    sizes = [v for v in flow["size_estimate_log10"] if v is not None]
    rows: list[tuple[str, Any]] = [
        ("iterflow rounds run", f"{g['rounds_completed']} ({g['termination']})"),
        (f"  median rounds {early[0]}-{early[1]} (s)", g["early_median_s"]),
        (f"  median rounds {late[0]}-{late[1]} (s)", g["late_median_s"]),
        (f"  growth ratio (target <= {TARGET})", g["growth_ratio"]),
        ("  growth ratio, wall round times", g["growth_ratio_wall"]),
        (f"  slope from round {early[0]} (s/round/round)", g["slope_s_per_round"]),
        ("  slowest round (s)", g["slowest_round_s"]),
        ("  jobs per round", g["jobs_per_round"]),
        ("  log10 size estimate, first/last round", f"{sizes[0]:.3g} / {sizes[-1]:.3g}"),
        (
            "plain loop rounds run"
            + (" (guard)" if plain["stopped_by_guard"] else "")
            + (" (then a round failed)" if plain["failure"] else ""),
            len(plain_s),
        ),
        *[(f"  round {i} (s)", t) for i, t in enumerate(plain_s)],
        ("  slope (s/round/round)", results["plain"]["slope_s_per_round"]),
        ("  growth factor per round", results["plain"]["growth_factor_per_round"]),
        ("  log10 size estimate, last round", (plain["size_estimate_log10"] or [None])[-1]),
    ]
    print_table(f"PageRank {w.n} vertices / {w.edge_count} edges, up to {rounds} rounds", rows)
    config = w.settings(warm_up_rounds=warm_up, guard_s=guard_s, plain_rounds=plain_rounds)
    finish(spark, "bench_round_growth", args.quick, results, **config)


if __name__ == "__main__":
    main()
