"""Where a declarative round's Spark jobs come from, and what they cost: this tree against
another commit, in the same run.

For each body of ``_bodies.py`` (the PageRank body of ``bench_round_growth.py``, the
README's connected components, k-means as DataFrame steps), a child process per tree
(a session of its own) runs one warm-up iteration, then the measured one. Per tree and
body it reports: Spark jobs per round by source (``_job_sources.JobSources``: the
action and the iterflow function that started it; rounds 2 on), the median round
(rounds 10-30; 2 on with ``--quick`` or a run of fewer rounds), round 0, the
remaining-rounds estimates of rounds 3-5 against the rounds that really remained,
and a digest of the outputs. Children of the two trees alternate (A B B A).

    python benchmarks/bench_round_jobs.py [--quick] [--against REV]

``--against`` (default ``HEAD``) is checked out into a temporary git worktree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TREE = HERE.parent
BODIES = ("pagerank", "components", "kmeans", "readme")


def child(body_name: str, quick: bool) -> dict[str, Any]:
    """Run ``body_name`` in this process's iterflow and measure it."""
    from _bodies import bodies
    from _common import median, start_session
    from _job_sources import JobSources, next_job_id

    import iterflow as itf

    spark = start_session()
    body, inputs, rounds = bodies(spark, quick)[body_name]

    def iteration(limit: int) -> Any:
        it = itf.BoundedIteration(body)
        for name, df in inputs.items():
            it = it.bind(name, df)
        return it.until(itf.max_rounds(limit))

    iteration(3).run(progress=False).release()  # warm-up: the JVM's first plans
    sources, marks, times, estimates = JobSources(spark), [], [], []

    def listener(end: itf.RoundEnd) -> None:
        marks.append((next_job_id(spark), {**sources.counts, **sources.phases}))
        times.append(end.progress.duration_s)
        estimates.append(end.progress.rounds_remaining_estimate)

    with sources.active():
        result = iteration(rounds).listen(listener).run(progress=False)
    first = 2 if len(marks) > 4 else 1
    (start_id, start_counts), (end_id, end_counts) = marks[first - 1], marks[-1]
    measured = len(marks) - first
    by_source = {
        label: (end_counts.get(label, 0) - start_counts.get(label, 0)) / measured
        for label in end_counts
    }
    output = sorted(tuple(row) for row in next(iter(result.outputs.values())).collect())
    window = times[first:] if quick or len(times) < 12 else times[10:31]
    return {
        "rounds": result.rounds,
        "termination": result.termination.reason,
        "jobs_per_round": (end_id - start_id) / measured,
        "jobs_by_source": {k: v for k, v in sorted(by_source.items()) if v and k in sources.counts},
        "planning_s_per_round": {k: v for k, v in by_source.items() if k in sources.phases},
        "median_round_s": median(window),
        "round0_s": times[0],
        "round_s": times,
        "estimates_3_to_5": estimates[3:6],
        "remaining_3_to_5": [result.rounds - 1 - r for r in range(3, 6)],
        "output_digest": hashlib.sha256(repr(output).encode()).hexdigest()[:16],
    }


def run_child(tree: Path, body_name: str, quick: bool) -> dict[str, Any]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": f"{tree}:{HERE}"}
    args = [sys.executable, __file__, "--child", body_name] + (["--quick"] if quick else [])
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=3600, cwd=HERE)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{body_name} on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--against", default="HEAD")
    parser.add_argument("--child")
    parser.add_argument("--bodies", default=",".join(BODIES))
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.quick)), flush=True)
        return
    sys.path.insert(0, str(HERE))
    from _common import log, print_table, write_result

    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(TREE), "worktree", "add", "--detach", str(other), args.against],
            check=True,
            capture_output=True,
        )
        try:
            trees = {"this tree": TREE, args.against: other}
            results: dict[str, dict[str, Any]] = {}
            for body_name in args.bodies.split(","):
                results[body_name] = {name: [] for name in trees}
                for rep, name in enumerate([*trees, *reversed(trees)]):
                    clock = time.perf_counter()
                    results[body_name][name].append(run_child(trees[name], body_name, args.quick))
                    log(f"{body_name} / {name} ({rep}): {time.perf_counter() - clock:.0f} s")
        finally:
            subprocess.run(["git", "-C", str(TREE), "worktree", "remove", "--force", str(other)])
    rows: list[tuple[str, Any]] = []
    for body_name, by_tree in results.items():
        for name, runs in by_tree.items():
            best = min(runs, key=lambda r: r["median_round_s"])
            rows += [
                (f"{body_name} / {name}: jobs per round", runs[0]["jobs_per_round"]),
                ("  median round s (each run)", [round(r["median_round_s"], 3) for r in runs]),
                ("  round 0 s", round(best["round0_s"], 3)),
                ("  estimates rounds 3-5", best["estimates_3_to_5"]),
                ("  rounds that remained after rounds 3-5", best["remaining_3_to_5"]),
                ("  output digest", {r["output_digest"] for r in runs}),
            ]
            rows += [(f"    {k}", v) for k, v in runs[0]["jobs_by_source"].items()]
            rows += [
                (f"  Spark's {k} s per round", round(v, 4))
                for k, v in runs[0]["planning_s_per_round"].items()
            ]
    print_table("Declarative rounds: jobs and time per round", rows)
    write_result("bench_round_jobs", args.quick, {"against": args.against}, results)


if __name__ == "__main__":
    main()
