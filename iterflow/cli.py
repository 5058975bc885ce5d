"""The ``iterflow`` command: ``demo pagerank|kmeans|online-kmeans``, ``report``, ``plot``,
``converge``.

Every command ends with one of the exit codes below (``iterflow --help`` lists them): a
script can tell a failed check from a mistyped command and from an error while running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import iterflow as itf

#: The command did what it was asked.
EXIT_OK = 0
#: A check failed: a case of ``iterflow converge``, or a demo that did not get its result.
EXIT_FAILED = 1
#: The command line is wrong (argparse's own code): an unknown command or option, a bad value.
EXIT_USAGE = 2
#: An error while running: one line on stderr, the traceback with ``--traceback``.
EXIT_ERROR = 3
#: Interrupted (Ctrl-C), as shells report a SIGINT.
EXIT_INTERRUPTED = 130

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    done
  {EXIT_FAILED}    a check failed: a case of `iterflow converge` (or a demo missed its result)
  {EXIT_USAGE}    usage: an unknown command or option, a missing or bad value
  {EXIT_ERROR}    an error while running: an unreadable event log, an unwritable file, an
       unknown case or module, a failed Spark job; one line on stderr, the whole
       traceback with --traceback
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)
"""


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def _non_negative(value: str) -> float:
    number = float(value)
    if not number >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _fraction(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return number


def _add_traceback_argument(command: argparse.ArgumentParser) -> None:
    """``--traceback``, before or after the command's name (suppressed defaults: a command's
    own parser does not undo the flag given to ``iterflow`` itself)."""
    command.add_argument(
        "--traceback",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, print its traceback instead of one line",
    )


def _add_log_arguments(command: argparse.ArgumentParser) -> None:
    """The event log and the run in it, as ``report`` and ``plot`` take them."""
    command.add_argument("log", metavar="LOG", help="event log file (JSON lines)")
    command.add_argument(
        "--run", dest="run_id", default=None, help="run id (default: the last run in the file)"
    )


def _add_session_arguments(command: argparse.ArgumentParser) -> None:
    """Where a demo runs: an embedded session on ``--master``, or a Spark Connect server."""
    where = command.add_mutually_exclusive_group()
    where.add_argument(
        "--master", default=None, help="Spark master URL (default: active session or local[*])"
    )
    where.add_argument(
        "--remote",
        metavar="URL",
        default=None,
        help="a Spark Connect server, e.g. sc://host:15002 (needs iterflow[connect])",
    )


def _session(args: argparse.Namespace) -> Any:
    """The demo's session: ``--remote`` (Spark Connect), ``--master``, or the active one."""
    if args.remote:
        from pyspark.sql import SparkSession

        try:
            return SparkSession.builder.remote(args.remote).getOrCreate()
        except ImportError as error:
            raise itf.IterflowError(
                f"--remote needs Spark Connect's client libraries ({error}): "
                "pip install iterflow[connect]"
            ) from None
    spark = itf.session(args.master)
    _quiet(spark)
    return spark


def _quiet(spark: Any) -> None:
    """Keep the command's own lines readable: Spark logs errors only (classic sessions;
    a Spark Connect server keeps its own log level)."""
    try:
        context = spark.sparkContext
    except Exception:  # a Spark Connect session has no SparkContext
        return
    context.setLogLevel("ERROR")


def _where(spark: Any) -> str:
    """``master local[2]``, or ``Spark Connect`` for a remote session."""
    try:
        return f"master {spark.sparkContext.master}"
    except Exception:  # a Spark Connect session has no SparkContext
        return "Spark Connect"


#: What ``add_subparsers`` returns: its ``add_parser`` makes one command.
_Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_demo_arguments(command: argparse.ArgumentParser, run: Callable[..., int]) -> None:
    """What every demo ends with: where it runs and ``--event-log``; ``run`` runs it."""
    _add_session_arguments(command)
    command.add_argument(
        "--event-log", metavar="PATH", default=None, help="append the run's events (JSON lines)"
    )
    _add_traceback_argument(command)
    command.set_defaults(run=run, prog=command.prog)


def _add_demo_pagerank(demos: _Commands) -> None:
    pagerank = demos.add_parser(
        "pagerank",
        help="PageRank on a random graph, to a tolerance",
        description="Generate a random directed graph, run PageRank until the L1 change of the "
        "ranks is at most --tol (or for --rounds rounds), print the top vertices.",
    )
    pagerank.add_argument("--vertices", type=_positive, default=2000, help="vertex count")
    pagerank.add_argument(
        "--edges", type=_positive, default=None, help="edge count (default: 10 per vertex)"
    )
    stop = pagerank.add_mutually_exclusive_group()
    stop.add_argument("--tol", type=float, default=1e-8, help="L1 tolerance (default 1e-8)")
    stop.add_argument("--rounds", type=_positive, default=None, help="fixed number of rounds")
    pagerank.add_argument(
        "--max-rounds",
        type=_positive,
        default=100,
        help="stop after this many rounds if not converged (default 100)",
    )
    pagerank.add_argument(
        "--seed", type=int, default=1, help="seed of the random graph (default 1)"
    )
    pagerank.add_argument("--top", type=_positive, default=10, help="how many vertices to print")
    _add_demo_arguments(pagerank, run_pagerank_demo)


def _add_demo_kmeans(demos: _Commands) -> None:
    batch = demos.add_parser(
        "kmeans",
        help="k-means (Lloyd's algorithm, iterflow.ml) on generated blobs",
        description="Generate points around --k random centers, fit iterflow.ml.kmeans until "
        "no centroid moves more than --tol (or --max-rounds), print a line per round and the "
        "centroids next to the true centers.",
    )
    batch.add_argument("--points", type=_positive, default=100_000, help="number of points")
    batch.add_argument("--k", type=_positive, default=5, help="number of clusters")
    batch.add_argument("--dims", type=_positive, default=4, help="dimensions")
    batch.add_argument("--tol", type=float, default=1e-6, help="largest centroid move to stop at")
    batch.add_argument(
        "--max-rounds",
        type=_positive,
        default=50,
        help="stop after this many rounds if not converged (default 50)",
    )
    batch.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the points and the initial centroids (default 1)",
    )
    _add_demo_arguments(batch, run_kmeans_demo)


def _add_demo_online_kmeans(demos: _Commands) -> None:
    kmeans = demos.add_parser(
        "online-kmeans",
        help="online k-means on points streamed into a watched folder",
        description="Start an unbounded iteration (online k-means, as Spark MLlib's "
        "StreamingKMeans) on a folder, write --files files of points into it one by one while "
        "it runs, print a line per epoch, and stop once every point is consumed.",
    )
    kmeans.add_argument("--k", type=_positive, default=8, help="cluster count (default 8)")
    kmeans.add_argument("--dims", type=_positive, default=16, help="dimensions (default 16)")
    kmeans.add_argument("--files", type=_positive, default=20, help="files to stream (default 20)")
    kmeans.add_argument(
        "--points-per-file", type=_positive, default=2000, help="points per file (default 2000)"
    )
    kmeans.add_argument(
        "--decay", type=_fraction, default=1.0, help="weight kept per epoch, 0..1 (default 1)"
    )
    kmeans.add_argument(
        "--interval",
        type=_non_negative,
        default=0.2,
        metavar="SECONDS",
        help="pause between two files (default 0.2)",
    )
    kmeans.add_argument(
        "--seed", type=int, default=1, help="seed of the centers and points (default 1)"
    )
    _add_demo_arguments(kmeans, run_online_kmeans_demo)


def _add_report(commands: _Commands) -> None:
    report = commands.add_parser(
        "report",
        help="print a table of the rounds of a run from its event log",
        description="Print one line per round (time, row counts, convergence value, estimates, "
        "user metrics) and a summary of one run recorded in an event log; or, with --format "
        "json, the same as one JSON document.",
    )
    _add_log_arguments(report)
    report.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: a table and a summary (default); json: one document, "
        '{"run_id", "iteration", "rounds": [one object per round], "termination", ...}',
    )
    _add_traceback_argument(report)
    report.set_defaults(run=run_report, prog=report.prog)


def _add_plot(commands: _Commands) -> None:
    plot = commands.add_parser(
        "plot",
        help="draw a per-round curve of a run from its event log",
        description="Draw one value per round of one run recorded in an event log, by default "
        "the convergence value, and save it as an image.",
    )
    _add_log_arguments(plot)
    plot.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        required=True,
        help="image file to write (.png, .svg, .pdf)",
    )
    plot.add_argument(
        "--metric",
        metavar="NAME",
        default=None,
        help="what to plot: converged_value (default), duration_s, eta_s, "
        "rounds_remaining_estimate, rows.NAME, observed.NAME or a user metric's name",
    )
    plot.add_argument("--log-y", action="store_true", help="logarithmic y axis")
    _add_traceback_argument(plot)
    plot.set_defaults(run=run_plot, prog=plot.prog)


def _add_converge(commands: _Commands) -> None:
    converge = commands.add_parser(
        "converge",
        help="run convergence cases against their reference answers",
        description="Run convergence cases (the built-in ones, or those of the given modules), "
        "print a table (case, rounds, termination, final error vs reference, observed rate, "
        f"seconds); exit {EXIT_FAILED} when a case fails.",
    )
    converge.add_argument(
        "modules",
        metavar="MODULE",
        nargs="*",
        help="importable modules holding ConvergenceCase objects or a CASES list "
        "(default: iterflow.testing.builtin)",
    )
    converge.add_argument(
        "--case", dest="cases", action="append", default=[], help="run only this case (repeat)"
    )
    converge.add_argument("--report", metavar="FILE", default=None, help="write a JSON report")
    converge.add_argument(
        "--plot", metavar="FILE", default=None, help="draw the error per round (.png, .svg)"
    )
    converge.add_argument("--list", action="store_true", help="list the cases and exit")
    converge.add_argument(
        "--master", default=None, help="Spark master (default: the configured one, or local[*])"
    )
    _add_traceback_argument(converge)
    converge.set_defaults(run=run_converge, prog=converge.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iterflow",
        description="Bounded and unbounded iterations on Apache Spark.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the table of exit codes
    )
    parser.add_argument("--version", action="version", version=f"iterflow {itf.__version__}")
    _add_traceback_argument(parser)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (COMMAND -h: its help)"
    )
    demo = commands.add_parser(
        "demo",
        help="run a demonstration job",
        description="Run a demonstration job on generated data.",
    )
    demos = demo.add_subparsers(
        dest="demo", required=True, metavar="DEMO", help="which demonstration to run"
    )
    _add_demo_pagerank(demos)
    _add_demo_kmeans(demos)
    _add_demo_online_kmeans(demos)
    _add_report(commands)
    _add_plot(commands)
    _add_converge(commands)
    return parser


def run_converge(args: argparse.Namespace) -> int:
    from iterflow.testing import (
        format_table,
        load_cases,
        plot_reports,
        run_cases,
        select,
        write_report,
    )

    found = [
        c for module in args.modules or ["iterflow.testing.builtin"] for c in load_cases(module)
    ]
    cases = select(found, args.cases)
    if args.list:
        for case in cases:
            print(f"{case.name}: {case.description}" if case.description else case.name)
        return EXIT_OK
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Inside a process that has a session already (a test), use it as it is.
    spark = itf.session(
        args.master,
        app_name="iterflow-converge",
        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )
    _quiet(spark)
    print(f"iterflow converge: {len(cases)} case(s) on {_where(spark)}", flush=True)

    def progress(report: object) -> None:
        print(f"  {getattr(report, 'name', '?')}: done", flush=True)

    reports = run_cases(cases, spark, on_report=progress)
    print(format_table(reports))
    if args.report:
        write_report(reports, args.report)
        print(f"report: {args.report}")
    if args.plot:
        plot_reports(reports).savefig(args.plot)
        print(f"plot: {args.plot}")
    return EXIT_OK if all(r.passed for r in reports) else EXIT_FAILED


def run_pagerank_demo(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from iterflow.demo.pagerank_demo import pagerank, random_graph

    spark = _session(args)
    edges_wanted = args.edges or 10 * args.vertices
    print(
        f"iterflow demo pagerank: {args.vertices} vertices, ~{edges_wanted} edges, "
        f"on {_where(spark)}"
    )
    vertices, edges = random_graph(spark, args.vertices, edges_wanted, seed=args.seed)
    edges = edges.cache()
    print(f"graph: {edges.count()} edges after dropping self-loops and duplicates")

    def report(ctx: itf.RoundEnd) -> None:
        p = ctx.progress
        change = "" if p.converged_value is None else f"  L1 change {p.converged_value:.3e}"
        left = ""
        if p.rounds_remaining_estimate is not None and p.eta_s is not None:
            left = f"  ~{p.rounds_remaining_estimate} rounds left, ETA {p.eta_s:.0f} s"
        print(f"  round {p.epoch:3d}  {p.duration_s:6.2f} s{change}{left}", flush=True)

    started = time.perf_counter()
    result = pagerank(
        vertices,
        edges,
        tol=None if args.rounds else args.tol,
        max_rounds=args.rounds or args.max_rounds,
        listen=(report,),
        progress=False,  # the demo prints a line per round instead
        event_log=args.event_log,
    )
    elapsed = time.perf_counter() - started
    print(
        f"rounds: {result.rounds}  termination: {result.termination.reason}  time: {elapsed:.1f} s"
    )
    top = result.outputs["ranks"].orderBy(F.desc("rank"), "id").limit(args.top).collect()
    print(f"top {len(top)} vertices:")
    print("  vertex        rank")
    for row in top:
        print(f"  {row['id']:6d}  {row['rank']:.8f}")
    if args.event_log:
        print(f"event log: {args.event_log} (try: iterflow report {args.event_log})")
    result.release()
    edges.unpersist()
    return EXIT_OK


def run_kmeans_demo(args: argparse.Namespace) -> int:
    import numpy as np

    from iterflow.demo.kmeans_demo import random_blobs
    from iterflow.ml import kmeans

    spark = _session(args)
    print(
        f"iterflow demo kmeans: {args.points} points, k={args.k}, {args.dims} dimensions, "
        f"on {_where(spark)}"
    )
    df, centers = random_blobs(spark, args.points, args.k, args.dims, seed=args.seed)
    df = df.cache()
    df.count()

    def report(ctx: itf.RoundEnd) -> None:
        p = ctx.progress
        shift = p.converged_value
        moved = "" if shift is None else f"  largest move {shift:.3e}"
        print(f"  round {p.epoch:3d}  {p.duration_s:6.2f} s  loss {p.metrics['loss']:.6g}{moved}")

    started = time.perf_counter()
    model = kmeans(
        df,
        args.k,
        max_rounds=args.max_rounds,
        tol=args.tol,
        seed=args.seed,
        listen=report,
        progress=False,  # the demo prints a line per round instead
        event_log=args.event_log,
    )
    elapsed = time.perf_counter() - started
    print(f"rounds: {model.rounds}  termination: {model.termination.reason}  time: {elapsed:.1f} s")
    print("centroid -> nearest true center (distance)")
    for centroid in sorted(model.centroids.tolist()):
        gaps = np.linalg.norm(centers - np.array(centroid), axis=1)
        shown = ", ".join(f"{x:7.3f}" for x in centroid)
        print(f"  [{shown}] -> center {int(gaps.argmin())} ({gaps.min():.3f})")
    if args.event_log:
        print(f"event log: {args.event_log} (try: iterflow plot {args.event_log} --metric loss)")
    df.unpersist()
    return EXIT_OK


def run_online_kmeans_demo(args: argparse.Namespace) -> int:
    from iterflow.demo.online_kmeans_demo import run_online_kmeans

    spark = _session(args)
    print(
        f"iterflow demo online-kmeans: k={args.k}, {args.dims} dimensions, {args.files} files "
        f"of {args.points_per_file} points, decay {args.decay:g}, "
        f"on {_where(spark)}",
        flush=True,
    )
    run = run_online_kmeans(
        spark,
        k=args.k,
        dims=args.dims,
        files=args.files,
        points_per_file=args.points_per_file,
        decay=args.decay,
        seed=args.seed,
        interval_s=args.interval,
        out=lambda line: print(line, flush=True),
        event_log=args.event_log,
        progress=False,  # the demo prints a line per epoch instead
    )
    rate = run.points_consumed / run.epoch_seconds if run.epoch_seconds > 0 else float("nan")
    print(
        f"epochs: {run.epochs}  points: {run.points_consumed} of {run.points_written}  "
        f"time: {run.seconds:.1f} s (in epochs {run.epoch_seconds:.1f} s, {rate:,.0f} points/s)"
    )
    print(f"centers: at most {run.center_error:.4f} from the true centers")
    if args.event_log:
        print(f"event log: {args.event_log} (try: iterflow report {args.event_log})")
    if run.points_consumed < run.points_written:
        print(
            f"iterflow demo online-kmeans: only {run.points_consumed} of {run.points_written} "
            "points were consumed before the time limit",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def run_report(args: argparse.Namespace) -> int:
    events = itf.progress.read_events(args.log, args.run_id)
    if args.format == "json":
        print(json.dumps(report_document(events), indent=2))
    else:
        print(itf.progress.format_report(events), end="")
    return EXIT_OK


def report_document(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``iterflow report --format json`` prints: the run, its rounds (the rows of the
    text table, each under the names ``iterflow plot --metric`` takes) and how it ended.

    ``termination`` is set when the run stopped on its conditions, ``failure`` when it
    failed; both are null while it runs (or after its process died).
    """
    run = itf.progress.main_run(events)
    started = next(
        (e for e in events if e["event"] == "iteration_started" and e.get("run_id") == run), {}
    )
    end = itf.progress.final_event(events) or {}
    failed = end.get("event") == "iteration_failed"
    return {
        "run_id": run,
        "iteration": started.get("iteration"),
        "iterflow_version": started.get("iterflow_version"),
        "rounds": [_report_round(e) for _, e in itf.progress.ordered_rounds(events)],
        "termination": end.get("termination"),
        "failure": {k: end.get(k) for k in ("epoch", "error_type", "error")} if failed else None,
        "duration_s": end.get("duration_s"),
        "metrics": end.get("metrics") or {},
        "rollbacks": [
            {k: v for k, v in e.items() if k not in ("event", "run_id")}
            for e in events
            if e["event"] == "rolled_back" and e.get("run_id") == run
        ],
    }


def _report_round(event: Mapping[str, Any]) -> dict[str, Any]:
    """One round of the report: where it stands (a nested run's round has a longer
    ``epoch_path``), then its values; a user metric named like those is hidden by them."""
    row: dict[str, Any] = {
        "epoch": event.get("epoch"),
        "epoch_path": list(event.get("epoch_path") or [event.get("epoch")]),
        "run_id": event.get("run_id"),
        "time": event.get("time"),
    }
    for name, value in itf.progress.round_values(event).items():
        row.setdefault(name, value)
    return row


def run_plot(args: argparse.Namespace) -> int:
    events = itf.progress.read_events(args.log, args.run_id)
    itf.progress.plot_events(events, metric=args.metric, log_y=args.log_y, output=args.output)
    print(args.output)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv`` and return its exit code (:data:`EXIT_CODES`); a wrong
    command line exits through argparse (``SystemExit(2)``)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader stopped reading (`| head`): what it wanted it has; nothing to report.
        # Standard output goes nowhere from now on, so that exiting does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:
        return _error(args, error)


def _error(args: argparse.Namespace, error: Exception) -> int:
    """Report ``error`` in one line on stderr (its whole traceback with ``--traceback``)."""
    if getattr(args, "traceback", False):
        traceback.print_exc()
        return EXIT_ERROR
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[0] if lines else ""
    hint = ""
    if not isinstance(error, itf.IterflowError):
        # Not an error iterflow foresaw: name its type, and where to see more.
        message = f"{type(error).__name__}: {message}".rstrip(": ")
        hint = " (run again with --traceback to see where it came from)"
    elif len(lines) > 1:
        hint = " (--traceback shows all of it)"
    print(f"{args.prog}: error: {message}{hint}", file=sys.stderr)
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
