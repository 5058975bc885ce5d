"""iterflow on a Spark Connect session: bounded iterations (lineage cut by local
checkpoints on the server, rows counted by observations, ctx.observe, convergence,
criteria, listeners, driver-side metrics), durable checkpoints, iterflow.ml and
iterflow.testing give what they give on a classic session."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyspark
import pytest
from child_jobs import job_env, run_job
from test_ml_kmeans import numpy_lloyd
from test_ml_regression import newton_logistic

import iterflow as itf

pytestmark = pytest.mark.spark

JOB = Path(__file__).with_name("connect_job.py")


@pytest.fixture(scope="module")
def connect_run() -> dict[str, Any]:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", 15002))
        except OSError:
            pytest.fail("port 15002, where PySpark's local Connect server listens, is taken")
    return run_job(JOB)


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_bounded_iteration_runs_as_on_a_classic_session(
    connect_run: dict[str, Any], size: str
) -> None:
    run = connect_run[size]
    rows = 10 if size == "small" else 3000
    assert "connect" in run["session"]
    assert run["rounds"] == 7 and run["reason"] == "converged"  # 2**-7 <= 0.01
    assert run["rows"] == [rows] * 7  # counted by the observation on the checkpoint
    assert run["observed"] == [rows] * 7  # ctx.observe, delivered over Connect
    assert run["converged"] == [2.0**-k for k in range(1, 8)]
    assert run["rounds_seen"] == 7  # a metric updated on the driver, from a listener


def test_released_rounds_leave_the_client_and_the_server(connect_run: dict[str, Any]) -> None:
    # The client drops each round's checkpoint when the next round has its own (PySpark
    # caches DataFrames that isLocal()/isEmpty() were asked about: iterflow must not ask
    # through that cache), so the server frees the blocks during the run.
    released = connect_run["released"]
    referred, before, after = released["referred"], released["before"], released["after"]
    assert len(referred) == 30 and max(referred) <= 3, referred
    assert after[-1] <= before[-1], (before, after)  # 30 more before iterflow let them go


def test_criteria_and_ml(connect_run: dict[str, Any]) -> None:
    assert connect_run["criteria"] == {"rounds": 5, "reason": "criteria_empty"}
    rng = np.random.default_rng(5)
    points = np.concatenate([rng.normal(c, 0.3, (100, 2)) for c in ([0, 0], [5, 0], [0, 5])])
    expected = numpy_lloyd(points, points[[0, 100, 200]], 5)[-1]
    np.testing.assert_allclose(connect_run["kmeans"], expected, atol=1e-9)
    # k-means++ seeding samples without RDDs over Connect and still finds the three blobs.
    assert connect_run["kmeans_seeded"] == [[0.0, 0.0], [0.0, 5.0], [5.0, 0.0]]
    # Over Connect the executors cannot call the client: kernels run as Spark jobs.
    assert connect_run["kmeans_resident"]["mode"] == "jobs"
    assert "Spark Connect" in connect_run["kmeans_resident"]["reason"]
    assert connect_run["kmeans_rounds_resident"] == [False] * 5
    x = rng.normal(size=(200, 2))
    y = x @ np.array([1.5, -0.5]) + 0.25
    solution = np.linalg.lstsq(np.column_stack([x, np.ones(200)]), y, rcond=None)[0]
    np.testing.assert_allclose(connect_run["coefficients"], solution, atol=1e-6)


def test_a_pyspark_ml_estimator_fits_saves_and_loads(connect_run: dict[str, Any]) -> None:
    fit = connect_run["estimator"]
    x, y = np.array(fit["x"]), np.array(fit["y"])
    expected = newton_logistic(x, y, np.ones(len(y)), 0.0)
    np.testing.assert_allclose(fit["coefficients"], expected, atol=1e-4)
    assert fit["loaded"] == fit["coefficients"] and 1 <= fit["iterations"] <= 100
    # GaussianMixture (an IterativeEstimator) fits over Connect too, started from a
    # seeded shuffle's rows: a mixture of the two features, and its log-likelihood.
    assert sum(fit["mixture_weights"]) == pytest.approx(1.0)
    assert np.isfinite(fit["mixture_loglik"]) and fit["mixture_loglik"] < 0


def test_rounds_are_sampled_from_the_clients_progress_handler(
    connect_run: dict[str, Any],
) -> None:
    sampled = connect_run["sampled"]
    for epoch, duration in enumerate(sampled["durations"]):
        samples = [s for s in sampled["samples"] if s["epoch"] == epoch]
        assert len(samples) >= 3, (duration, samples)
        fractions = [s["fraction"] for s in samples if s["fraction"] is not None]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
        assert [s["final"] for s in samples] == [False] * (len(samples) - 1) + [True]
        # Tasks come from the stages the server reported to the client.
        assert samples[-1]["total"] > 0 and samples[-1]["done"] <= samples[-1]["total"]
        # The last sample has the round's exact counts.
        assert samples[-1]["rows_by_step"] == sampled["counts"][epoch]
        assert sampled["counts"][epoch]["x"] == 24


#: The foundation's core semantics tests (bodies, bounded iterations, termination,
#: listeners and progress, errors) and the durable checkpoint tests, run again with
#: the `spark` fixture a Spark Connect session (the plugin's --iterflow-remote).
CORE = [
    "test_bounded_semantics.py",
    "test_termination.py",
    "test_lineage.py",
    "test_errors.py",
    "test_pagerank.py",
    "test_checkpoints.py",
    "test_observability.py",
    "test_events.py",
    "test_estimate.py",
    "test_bar.py",
    "test_nested.py",
    "test_output_sinks.py",
]


def run_remote(files: list[str]) -> tuple[dict[str, int], list[str], str]:
    """Run the test ``files`` with the ``spark`` fixture a Spark Connect session (the
    plugin's --iterflow-remote), the test directory importable beside the server too
    (bodies that call test helpers travel by reference): the counts of passed, skipped
    and failed tests, the skip lines, and the output."""
    here = Path(__file__).parent
    path = os.pathsep.join(p for p in (str(here), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"),
            *("--iterflow-remote", "local[2]", *(str(here / name) for name in files)),
        ],
        capture_output=True,
        text=True,
        timeout=2400,
        env={**os.environ, **job_env(), "PYTHONPATH": path},
        cwd=here.parent,
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-6000:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|failed)", summary)}
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    return counts, skips, summary


@pytest.mark.slow_spark  # the whole core suite again: minutes; the tests above stay in CI
def test_the_core_semantics_tests_pass_on_a_connect_session(connect_run: dict[str, Any]) -> None:
    """The same test functions as on the classic session. Skipped, by their marker, are
    only those that reach into the JVM: counting evaluations with an accumulator or
    updating metrics in executor functions (Connect has no accumulators), dropping a
    checkpoint block, job descriptions, pickling a py4j handle, and one that needs
    released checkpoints freed at once (a Connect server frees them when its JVM
    collects them)."""
    counts, skips, summary = run_remote(CORE)
    older = pyspark.__version__.startswith("4.0.")  # its Connect client lacks newSession()
    assert counts.get("passed", 0) >= 194 - older, summary
    assert counts.get("skipped") == 12 + older, summary
    expected = ("needs a classic session", "has no newSession()")
    assert skips and all(any(e in line for e in expected) for line in skips), skips


#: The unbounded semantics tests (epochs, feedback, exactly once, the StreamingQuery
#: handle, event time and windows against their reference).
UNBOUNDED = [
    "test_unbounded.py",
    "test_unbounded_streaming_query.py",
    "test_event_windows.py",
    "test_event_time.py",
]
#: Of them, the tests that pass over Connect, and those that skip by their marker.
UNBOUNDED_PASSED, UNBOUNDED_SKIPPED = 32, 7


@pytest.mark.slow_spark  # minutes, as the core suite; the unbounded Connect job stays in CI
def test_the_unbounded_semantics_tests_pass_on_a_connect_session() -> None:
    """The same test functions as on the classic session, their epochs beside the Connect
    server. Skipped, by their marker, are those that need the loop in the test's process:
    a listener that stops the query or a callable sink that fills a list of the test, a
    patched module, draining while idle, metrics counted in executor functions and
    resident tasks."""
    counts, skips, summary = run_remote(UNBOUNDED)
    assert counts.get("passed", 0) >= UNBOUNDED_PASSED, summary
    assert counts.get("skipped") == UNBOUNDED_SKIPPED, summary
    assert skips and all("needs a classic session" in line for line in skips), skips


def test_executor_metrics_warn_and_graph_arrow_paths_match_networkx(
    connect_run: dict[str, Any],
) -> None:
    import networkx as nx
    from connect_job import GRAPH_EDGES, GRAPH_VERTICES

    metric = connect_run["executor_metric"]
    assert metric["rounds"] == 3 and metric["values"] == [3.0]
    assert len(metric["warnings"]) == 1  # once per metric, however many tasks ran
    assert "metric 'evaluated'" in metric["warnings"][0]
    assert "not recorded" in metric["warnings"][0]
    reference = nx.DiGraph()
    reference.add_nodes_from(range(GRAPH_VERTICES))
    reference.add_edges_from(GRAPH_EDGES)
    expected = nx.pagerank(reference, alpha=0.85, tol=1e-14, max_iter=2000)
    ranks = {int(k): v for k, v in connect_run["graph"]["ranks"].items()}
    assert max(abs(ranks[v] - expected[v]) for v in expected) < 1e-8
    labels = {int(k): v for k, v in connect_run["graph"]["components"].items()}
    assert labels == {
        v: min(members) for members in nx.weakly_connected_components(reference) for v in members
    }
    graph = connect_run["graph"]
    assert {int(k): v for k, v in graph["program_components"].items()} == labels
    assert {int(k): v for k, v in graph["expression_components"].items()} == labels
    assert graph["engines"] == ["kernel", "kernel"]
    rank = dict.fromkeys(range(GRAPH_VERTICES), 1 / GRAPH_VERTICES)
    for _ in range(6):  # GraphFrames' builder PageRank by hand (no dangling redistribution)
        got = dict.fromkeys(rank, 0.0)
        for a, b in GRAPH_EDGES:
            got[b] += rank[a] / reference.out_degree(a)
        rank = {v: got[v] * 0.85 + 0.15 / GRAPH_VERTICES for v in rank}
    builder = {int(k): v for k, v in graph["builder_ranks"].items()}
    assert max(abs(builder[v] - rank[v]) for v in rank) < 1e-12
    heard = {int(k): v for k, v in graph["heard"].items()}
    assert heard == {b: sum(a for a, d in GRAPH_EDGES if d == b) for _, b in GRAPH_EDGES}
    simple = nx.Graph((a, b) for a, b in GRAPH_EDGES if a != b)
    simple.add_nodes_from(range(GRAPH_VERTICES))
    assert {int(k): v for k, v in graph["triangles"].items()} == nx.triangles(simple)
    assert {int(k): v for k, v in graph["cores"].items()} == nx.core_number(simple)
    assert graph["two_step_paths"] == sum(
        1 for _, b in GRAPH_EDGES for c, _ in GRAPH_EDGES if c == b
    )


def test_checkpoint_dir_over_connect_is_a_directory_both_sides_see() -> None:
    from iterflow.runtime.spark.files import LocalFiles, _connect_files

    files, root = _connect_files("file:///data/ckpt/")
    assert isinstance(files, LocalFiles) and root == "file:/data/ckpt"
    with pytest.raises(itf.IterflowError, match=r"s3a://b/c.*client and the Connect server"):
        _connect_files("s3a://b/c")


# -- unbounded iterations over Connect -------------------------------------------------

UNBOUNDED_JOB = Path(__file__).with_name("connect_unbounded_job.py")


@pytest.fixture(scope="module")
def unbounded_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_job(UNBOUNDED_JOB, "suite", str(tmp_path_factory.mktemp("connect-unbounded")))


def test_an_unbounded_iteration_runs_beside_the_connect_server(
    unbounded_run: dict[str, Any],
) -> None:
    run = unbounded_run["sums"]
    assert run["handle"] and run["ended"] and run["name"] == "sums"
    assert run["termination"] == ["inputs_ended", 3]
    totals = [6, 36, 136, 143]
    # Each epoch's output in the sink once, listeners' values and history on the client.
    assert run["written"] == [[epoch, total] for epoch, total in enumerate(totals)]
    assert run["emitted"] == {"total": totals}
    # A Spark 4.0 Connect server reports only a command's outermost observation: the
    # first epoch's input, counted inside its commit's job, has no count there.
    older = pyspark.__version__.startswith("4.0.")
    assert run["input_rows"] == [None if older else 3, 2, 1, 1]
    assert run["batches"] == [0, 1, 2, 3]
    assert run["last"]["epochs"][0]["epoch"] == 3 and run["last"]["committed_epoch"] == 3
    # The event log beside the server: the epochs, then how the client saw the end.
    assert run["events"][0] == "iteration_started" and run["events"][-1] == "iteration_terminated"
    assert run["events"].count("round_end") == 4 and run["ending"] == ["inputs_ended"]


def test_feedback_drains_beside_the_server_before_the_next_micro_batch(
    unbounded_run: dict[str, Any],
) -> None:
    run = unbounded_run["drains"]
    # 4 rows n = 1..4 lose one a epoch; then one row n = 2 in the second micro-batch.
    assert run["rows"] == [3, 2, 1, 0, 1, 0]
    assert run["batches"] == [0, 0, 0, 0, 1, 1]
    assert run["watermarks"] == [-1, -1, -1, 3, 3, 5]
    assert run["in_flight"] == 0


def test_streaming_query_code_runs_against_a_connect_unbounded_query(
    unbounded_run: dict[str, Any],
) -> None:
    run = unbounded_run["streaming_query_code"]
    assert "counted" in run["active"] and run["running"]
    assert run["status"] == [1, 1, "running"]
    assert [epochs for epochs in run["recent"] if epochs] == [[0], [1]]
    assert run["last_rows"] == 1
    # The with block stopped it; the listeners heard of it beside the server.
    assert run["after"] == [False, "stopped", True]
    assert run["ending"] == ["stopped"]


def test_an_error_beside_the_server_is_raised_as_itself_on_the_client(
    unbounded_run: dict[str, Any],
) -> None:
    run = unbounded_run["failure"]
    assert run["raised"] == [
        "RoundError",
        1,
        "epoch 1 failed in body 'breaks': ZeroDivisionError: boom",
    ]
    assert run["exception"] == "RoundError"
    assert len(run["refused"]) == 2
    assert "commit_interval_s=1.0" in run["refused"][0] and "progress=True" in run["refused"][1]


def test_streaming_components_over_connect_match_networkx_after_every_epoch(
    unbounded_run: dict[str, Any],
) -> None:
    import networkx as nx
    from connect_unbounded_job import GRAPH_FILES

    for epoch in range(len(GRAPH_FILES)):
        reference = nx.Graph([e for f in GRAPH_FILES[: epoch + 1] for e in f])
        expected = {v: min(c) for c in nx.connected_components(reference) for v in c}
        got = {int(k): v for k, v in unbounded_run["graph"][str(epoch)].items()}
        assert got == expected, epoch


def test_event_time_windows_fire_beside_the_server_or_are_refused_on_spark_4_0(
    unbounded_run: dict[str, Any],
) -> None:
    run = unbounded_run["windows"]
    if pyspark.__version__.startswith("4.0."):
        assert "Spark 4.0's Connect server reports only the outermost" in run["error"]
        return
    # [0, 10) is due in the epoch of t=11, [10, 20) in that of t=25, [20, 30) at the end.
    assert run["fired"] == [[1, 0, 2], [2, 10, 1], [3, 20, 1]]


def test_a_killed_connect_client_resumes_exactly_once(tmp_path: Path) -> None:
    """SIGKILL the process (the client and its in-process server) mid-stream; a new one
    resumes from the epoch log: every file's numbers in the sink once, the totals right."""
    import pyarrow.dataset as ds
    from child_jobs import kill_when
    from test_unbounded import write_rows

    files = [[10 * k + i for i in range(3)] for k in range(8)]
    write_rows(tmp_path / "in", [[{"x": x} for x in f] for f in files])
    epochs, sink = tmp_path / "ckpt" / "epochs", tmp_path / "sink"
    command = [
        *(sys.executable, str(UNBOUNDED_JOB), "run"),
        *(str(tmp_path / "in"), str(tmp_path / "ckpt"), str(sink)),
    ]

    def committed() -> int:
        return len(list(epochs.glob("epoch-*/_COMMITTED"))) if epochs.exists() else 0

    kill_when(command, lambda: committed() >= 2)
    resumed = run_job(UNBOUNDED_JOB, "run", *command[3:], "available_now")
    assert resumed["resumed_from"] is not None and resumed["resumed_from"] >= 1

    def read(name: str) -> list[tuple[int, int]]:
        table = ds.dataset(str(sink / name), format="parquet", partitioning="hive").to_table()
        return sorted(zip(table["epoch"].to_pylist(), table.column(0).to_pylist(), strict=True))

    assert read("numbers") == sorted((k, x) for k, f in enumerate(files) for x in f)
    assert read("total") == [(k, int(np.sum(files[: k + 1]))) for k in range(len(files))]
