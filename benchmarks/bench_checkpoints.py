"""What durable checkpoints cost, and what they save after a crash: PageRank, 30 rounds.

Overhead: the same fixed-round PageRank run (``itf.max_rounds``, no tolerance,
``progress=False``) with no checkpoint ("none"), with a checkpoint after every
round written in the background ("async-1", ``checkpoint_every=1``), the same
written on the loop's thread ("sync-1", ``checkpoint_async=False``) and every 10
rounds in the background ("async-10"). Every checkpointed run writes into a fresh
temporary directory, deleted afterwards. Runs alternate (the starting mode rotates
every repetition) after one warm-up run of each mode, and the ratios are of
medians. Target: async-1 / none <= 1.15, on the total time of ``run()``.
``RoundProgress.duration_s`` leaves out the time a round waits at its end for the
previous checkpoint write, so the total (and the wall round time read by a
listener) is the honest figure; the median ``duration_s`` is reported as well.

Recovery: a second process (this script with a hidden ``--child DIR``) builds the
same graph and runs the same iteration with ``checkpoint_every=5`` and an event
log; it is killed with SIGKILL as soon as the checkpoint of epoch 19 has committed.
This process then runs the iteration again on the same checkpoint directory and
measures the time from calling ``run()`` to the end of the first resumed round,
the time of the whole resumed run, the epoch it resumed from and how many rounds
the killed process had finished beyond it (rounds computed twice). The resumed
ranks are compared with those of an uninterrupted run.

    python benchmarks/bench_checkpoints.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from _common import (
    PageRankWorkload,
    alternate,
    count_jobs,
    finish,
    log,
    median,
    pagerank_workload,
    print_table,
    round_times,
    settle,
    start_session,
)
from pyspark.sql import DataFrame, SparkSession

from iterflow.progress.event_log import read_events

TARGET = 1.15
# mode -> run() options; "none" writes no checkpoint.
MODES: dict[str, dict[str, Any]] = {
    "none": {},
    "async-1": {"checkpoint_every": 1, "checkpoint_async": True},
    "sync-1": {"checkpoint_every": 1, "checkpoint_async": False},
    "async-10": {"checkpoint_every": 10, "checkpoint_async": True},
}
POLL_S = 0.02
CHILD_TIMEOUT_S = 900.0
JVM_EXIT_TIMEOUT_S = 60.0


class Size(NamedTuple):
    """Graph size, rounds and the recovery scenario of a full or a quick run."""

    vertices: int
    edges: int
    rounds: int
    repetitions: int
    kill_every: int  # checkpoint_every of the killed run
    kill_epoch: int  # the parent kills the child once this epoch has committed


FULL = Size(20_000, 200_000, 30, 4, kill_every=5, kill_epoch=19)
QUICK = Size(2_000, 20_000, 12, 1, kill_every=2, kill_epoch=5)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes and fewer rounds (a smoke test, about two minutes)",
    )
    # The process that is killed in the recovery measurement.
    parser.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)
    return parser.parse_args()


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- overhead ----------------------------------------------------------------------------


def measure(spark: SparkSession, label: str, mode: str, w: PageRankWorkload) -> dict[str, Any]:
    """One run in ``mode``: total time of ``run()``, per-round times, jobs, checkpoint sizes."""
    settle(spark)
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        options = dict(MODES[mode])
        if options:
            options["checkpoint_dir"] = Path(tmp) / "ckpt"
        stamps: list[float] = []
        it = w.iteration().listen(lambda _ctx: stamps.append(time.perf_counter()))
        with count_jobs(spark, f"checkpoints-{mode}") as jobs:
            start = time.perf_counter()
            result = it.run(progress=False, **options)
            total_s = time.perf_counter() - start
        rounds = [p.duration_s for p in result.history]
        run: dict[str, Any] = {
            "total_s": total_s,
            "round_s": rounds,
            "wall_round_s": round_times(stamps, start),
            "rounds": len(rounds),
            "jobs": jobs.jobs,
        }
        if options:
            # Kept: the last two epochs; the last one also holds the outputs.
            epochs = sorted((Path(tmp) / "ckpt").glob("epoch-*"))
            run["epochs_kept"] = [e.name for e in epochs]
            run["epoch_bytes"] = dir_bytes(epochs[-2]) if len(epochs) > 1 else None
            run["final_epoch_bytes"] = dir_bytes(epochs[-1])
            run["driver_pkl_bytes"] = (epochs[-1] / "driver.pkl").stat().st_size
        result.release()
        del result
    log(
        f"  {label}: {run['rounds']} rounds, {total_s:.2f} s, median round "
        f"{median(rounds):.3f} s (wall {median(run['wall_round_s']):.3f} s), {jobs.jobs} jobs"
    )
    return run


def overhead(spark: SparkSession, w: PageRankWorkload, repetitions: int) -> dict[str, Any]:
    names = list(MODES)
    log(f"warm-up: one run of each mode, {w.rounds} rounds")
    for mode in names:
        measure(spark, f"{mode} (warm-up)", mode, w)
    log(f"{w.rounds} rounds, {repetitions} runs of each mode")
    sequence, runs = alternate(names, repetitions, lambda mode: measure(spark, mode, mode, w))
    summary = {
        mode: {
            "total_s_median": median([r["total_s"] for r in rs]),
            "round_s_median": median([median(r["round_s"]) for r in rs]),
            "wall_round_s_median": median([median(r["wall_round_s"]) for r in rs]),
            "jobs_per_round": rs[0]["jobs"] / rs[0]["rounds"],
            **({"epoch_bytes": rs[0]["epoch_bytes"]} if "epoch_bytes" in rs[0] else {}),
        }
        for mode, rs in runs.items()
    }
    none = summary["none"]
    ratios = {
        mode: {
            "total": s["total_s_median"] / none["total_s_median"],
            "round_median": s["round_s_median"] / none["round_s_median"],
            "wall_round_median": s["wall_round_s_median"] / none["wall_round_s_median"],
        }
        for mode, s in summary.items()
        if mode != "none"
    }
    return {"sequence": sequence, "summary": summary, "ratio_over_none": ratios, "runs": runs}


# -- recovery ----------------------------------------------------------------------------


def child(directory: Path, size: Size) -> None:
    """The run that gets killed: same graph, same iteration, checkpoints and an event log."""
    spark = start_session()
    w = pagerank_workload(spark, size.vertices, size.edges, size.rounds)
    log(f"child: {size.rounds} rounds, checkpoint_every={size.kill_every}")
    w.iteration().run(
        progress=False,
        event_log=directory / "events.jsonl",
        checkpoint_dir=directory / "ckpt",
        checkpoint_every=size.kill_every,
    )
    log("child: finished (it should have been killed before)")


def ranks_by_id(df: DataFrame) -> np.ndarray:
    rows = sorted((r["id"], r["rank"]) for r in df.select("id", "rank").collect())
    return np.array([rank for _, rank in rows])


def run_and_kill(directory: Path, size: Size, quick: bool) -> dict[str, Any]:
    """Start the child, SIGKILL it once epoch ``kill_epoch`` has committed, let its JVM go."""
    marker = directory / "ckpt" / f"epoch-{size.kill_epoch:08d}" / "_COMMITTED"
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(directory)]
    command += ["--quick"] if quick else []
    output = (directory / "child.log").open("w")
    start = time.perf_counter()
    # Its own session (process group): the child's Spark JVM is in it too.
    process = subprocess.Popen(
        command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )
    # The marker is written under a temporary name and renamed: it appears whole.
    while not marker.exists():
        if process.poll() is not None or time.perf_counter() - start > CHILD_TIMEOUT_S:
            process.kill()
            process.wait()
            output.close()
            tail = (directory / "child.log").read_text()[-3000:]
            raise RuntimeError(f"the child ended or timed out before {marker.name}:\n{tail}")
        time.sleep(POLL_S)
    seen_s = time.perf_counter() - start
    process.send_signal(signal.SIGKILL)
    process.wait()
    output.close()
    # Its JVM exits when its parent's pipe closes; wait for that before measuring anything.
    killed = time.perf_counter()
    while _group_alive(process.pid):
        if time.perf_counter() - killed > JVM_EXIT_TIMEOUT_S:
            os.killpg(process.pid, signal.SIGKILL)
        time.sleep(0.1)
    events = read_events(directory / "events.jsonl")
    done = [e["epoch"] for e in events if e["event"] == "round_end"]
    log(
        f"child killed {seen_s:.1f} s after its start, at the commit of epoch "
        f"{size.kill_epoch}: {len(done)} rounds had ended (epochs {min(done)}-{max(done)})"
    )
    return {
        "child_start_to_marker_s": seen_s,
        "child_jvm_exit_s": time.perf_counter() - killed,
        "child_rounds_done": len(done),
        "child_last_epoch": max(done),
        "child_last_event": events[-1]["event"],
        "epochs_on_disk_after_kill": sorted(p.name for p in (directory / "ckpt").glob("epoch-*")),
    }


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def recovery(spark: SparkSession, w: PageRankWorkload, size: Size, quick: bool) -> dict[str, Any]:
    settle(spark)
    log(f"reference: an uninterrupted run of {w.rounds} rounds")
    start = time.perf_counter()
    reference = w.iteration().run(progress=False)
    reference_s = time.perf_counter() - start
    expected = ranks_by_id(reference.outputs["ranks"])
    reference.release()
    del reference
    settle(spark)
    with tempfile.TemporaryDirectory(prefix="iterflow-bench-") as tmp:
        directory = Path(tmp)
        killed = run_and_kill(directory, size, quick)
        settle(spark)
        stamps: list[float] = []
        it = w.iteration().listen(lambda _ctx: stamps.append(time.perf_counter()))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()
            result = it.run(
                progress=False,
                checkpoint_dir=directory / "ckpt",
                checkpoint_every=size.kill_every,
            )
            total_s = time.perf_counter() - start
        resumed_from = result.resumed_from
        if resumed_from is None:
            raise RuntimeError("the second run did not resume from a checkpoint")
        first = result.history[resumed_from + 1]
        got = ranks_by_id(result.outputs["ranks"])
        numbers = {
            **killed,
            "resumed_from": resumed_from,
            "rounds": result.rounds,
            "history_epochs_complete": [p.epoch for p in result.history] == list(range(w.rounds)),
            "rounds_recomputed": killed["child_rounds_done"] - (resumed_from + 1),
            "rounds_resumed": w.rounds - (resumed_from + 1),
            "run_to_first_round_end_s": stamps[0] - start,
            "first_round_duration_s": first.duration_s,
            "resumed_round_s": [p.duration_s for p in result.history[resumed_from + 1 :]],
            "resumed_total_s": total_s,
            "uninterrupted_total_s": reference_s,
            "max_abs_rank_difference": float(np.max(np.abs(got - expected))),
            "warnings": [str(m.message) for m in caught],
        }
        result.release()
        del result
    numbers["resumed_round_s_median"] = median(numbers["resumed_round_s"])
    numbers["restore_s"] = numbers["run_to_first_round_end_s"] - numbers["first_round_duration_s"]
    log(
        f"resumed from epoch {resumed_from}: first round ended "
        f"{numbers['run_to_first_round_end_s']:.2f} s after run(), whole run {total_s:.2f} s, "
        f"{numbers['rounds_recomputed']} rounds recomputed, max |rank difference| "
        f"{numbers['max_abs_rank_difference']:.3g}"
    )
    return numbers


# -- main --------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    size = QUICK if args.quick else FULL
    if args.child is not None:
        child(Path(args.child), size)
        return

    began = time.perf_counter()
    spark = start_session()
    w = pagerank_workload(spark, size.vertices, size.edges, size.rounds)
    measured = overhead(spark, w, size.repetitions)
    log(
        f"recovery: checkpoint_every={size.kill_every}, kill after the commit of epoch "
        f"{size.kill_epoch}"
    )
    recovered = recovery(spark, w, size, args.quick)
    results = {
        "target": TARGET,
        **measured,
        "recovery": recovered,
        "benchmark_s": time.perf_counter() - began,
    }

    summary, ratios = measured["summary"], measured["ratio_over_none"]
    rows: list[tuple[str, Any]] = []
    for mode, s in summary.items():
        rows += [
            (f"{mode}: total (s)", s["total_s_median"]),
            (f"{mode}: median round, duration_s (s)", s["round_s_median"]),
            (f"{mode}: median round, wall (s)", s["wall_round_s_median"]),
            (f"{mode}: jobs per round", s["jobs_per_round"]),
        ]
    for mode, r in ratios.items():
        target = f" (target <= {TARGET})" if mode == "async-1" else ""
        rows += [
            (f"{mode} / none, total{target}", r["total"]),
            (f"{mode} / none, median round duration_s", r["round_median"]),
            (f"{mode} / none, median wall round", r["wall_round_median"]),
        ]
    rows += [
        ("bytes of one epoch (every=1)", summary["async-1"]["epoch_bytes"]),
        ("recovery: child rounds ended before the kill", recovered["child_rounds_done"]),
        ("recovery: resumed_from", recovered["resumed_from"]),
        ("recovery: rounds recomputed", recovered["rounds_recomputed"]),
        ("recovery: run() to end of first round (s)", recovered["run_to_first_round_end_s"]),
        ("recovery: first round duration_s (s)", recovered["first_round_duration_s"]),
        ("recovery: restore before it (s)", recovered["restore_s"]),
        (
            f"recovery: resumed run, {recovered['rounds_resumed']} rounds (s)",
            recovered["resumed_total_s"],
        ),
        ("recovery: uninterrupted run (s)", recovered["uninterrupted_total_s"]),
        ("recovery: max |rank - uninterrupted|", recovered["max_abs_rank_difference"]),
        ("recovery: warnings", len(recovered["warnings"])),
    ]
    print_table(w.title(size.repetitions), rows)
    config = w.settings(
        repetitions=size.repetitions,
        warm_up_rounds=size.rounds,
        modes={mode: f"run(progress=False, **{options})" for mode, options in MODES.items()},
        checkpoint_keep=2,
        checkpoint_location="a fresh temporary directory on local disk per run",
        recovery=(
            f"child process: checkpoint_every={size.kill_every}, SIGKILL once "
            f"epoch-{size.kill_epoch:08d}/_COMMITTED is written (polled every "
            f"{POLL_S * 1000:.0f} ms); rerun here with the same checkpoint_dir"
        ),
    )
    finish(spark, "bench_checkpoints", args.quick, results, **config)


if __name__ == "__main__":
    main()
