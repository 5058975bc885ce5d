"""Resident rounds: ctx.columnar data held by long-running tasks, kernels sent to them.

Every result is compared with the per-round-job path (``spark.iterflow.resident=off``,
Arrow files and a Spark job per map) and, where there is one, an independent
reference (networkx, numpy)."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import networkx as nx
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from sessions import is_connect, jobs_started, server_context

import iterflow as itf
from iterflow.graph import Graph, pagerank
from iterflow.ml import kmeans, logistic_regression
from iterflow.runtime.datacache import resident, resident_policy, resident_task
from iterflow.runtime.datacache.dataplane import Credentials, DataPlane, KeyPair, connect
from iterflow.runtime.datacache.ledger import MAX_BYTES_CONF
from iterflow.runtime.datacache.resident_policy import PORT_CONF, RESIDENT_CONF

pytestmark = pytest.mark.spark


@contextmanager
def settings(spark, **conf: str) -> Iterator[None]:
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in conf:
            spark.conf.unset(key)


def both_paths(spark, run):
    """``run()`` resident (auto) and on the per-round-job path (off)."""
    with settings(spark, **{RESIDENT_CONF: "auto"}):
        resident_result = run()
    with settings(spark, **{RESIDENT_CONF: "off"}):
        jobs_result = run()
    return resident_result, jobs_result


def started_event(path) -> dict:
    with open(path) as lines:
        events = [json.loads(line) for line in lines]
    return next(e for e in events if e["event"] == "iteration_started")


def sums_body(seen: list | None = None) -> itf.IterationBody:
    """acc += sum(x) * (epoch + 1) per round, summed per partition in partition order, plus
    a map without combine whose rows are the partitions' row counts."""

    def partial(index: int, table: pa.Table, scale: float) -> pa.Table:
        x = table["x"].to_numpy()
        return pa.table({"part": [index], "total": [float(np.sum(x)) * scale]})

    def counts(table: pa.Table) -> pa.Table:
        return pa.table({"rows": [table.num_rows]})

    @itf.body
    def sums(acc, points, ctx):
        data = ctx.columnar(points)
        if seen is not None:
            seen.append(data)
        current = acc.first()["acc"]

        def combine(batches):
            table = pa.Table.from_batches(list(batches))
            order = table["part"].to_pylist()
            total = current
            for value in table["total"].to_pylist():  # in partition order: exact sums
                total += value
            yield pa.RecordBatch.from_arrays(
                [pa.array([total]), pa.array([order], pa.list_(pa.int32()))], names=["acc", "order"]
            )

        new_acc = data.map(
            partial,
            "part INT, total DOUBLE",
            ctx.epoch + 1.0,
            indexed=True,
            combine=combine,
            combine_schema="acc DOUBLE, order ARRAY<INT>",
        ).select("acc")
        rows = data.map(counts, "rows LONG")
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc, "rows": rows})

    return sums


def run_sums(spark, points, rounds=3, **run_options):
    return (
        itf.BoundedIteration(sums_body())
        .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
        .bind("points", points)
        .until(itf.max_rounds(rounds))
        .run(progress=False, **run_options)
    )


def test_resident_kernels_equal_the_job_path_with_empty_partitions(spark, tmp_path):
    rng = np.random.default_rng(3)
    values = rng.normal(size=500)
    # Eight partitions for 500 rows of which some hold none: empty ones are kernels' inputs too.
    points = spark.createDataFrame(pa.table({"x": values})).repartition(8).filter("x > -1.5")
    log = tmp_path / "events.jsonl"
    resident_run, jobs_run = both_paths(spark, lambda: run_sums(spark, points, event_log=log))
    got, want = resident_run.outputs["acc"].first()["acc"], jobs_run.outputs["acc"].first()["acc"]
    assert got == want  # same kernels, same partition order: the same bits
    assert got == pytest.approx(6 * values[values > -1.5].sum())  # 1 + 2 + 3 times the sum
    assert sorted(r["rows"] for r in resident_run.outputs["rows"].collect()) == sorted(
        r["rows"] for r in jobs_run.outputs["rows"].collect()
    )
    assert [p.resident for p in resident_run.history] == [True] * 3
    assert [p.resident for p in jobs_run.history] == [False] * 3


def test_partition_order_reaches_combine_and_the_data_is_loaded_once(spark, tmp_path):
    points = spark.createDataFrame(pa.table({"x": np.arange(100.0)})).repartition(5)
    seen: list = []
    log = tmp_path / "events.jsonl"
    with settings(spark, **{RESIDENT_CONF: "on"}):
        result = (
            itf.BoundedIteration(sums_body(seen))
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(3))
            .run(progress=False, event_log=log)
        )
    assert seen[0] is seen[1] is seen[2]  # loaded at the first call only
    assert isinstance(seen[0], resident.ResidentData)
    assert seen[0].rows == 100 and seen[0].partitions == 5 and seen[0].launches == 1
    assert started_event(log)["resident"] == {"mode": "resident", "reason": None}
    assert result.outputs["acc"].first()["acc"] == 6 * sum(range(100))
    assert seen[0].tasks_alive() == {}  # the tasks ended with the run


def test_kernels_run_on_every_core_over_data_shared_with_the_kernel_processes(spark):
    """local[2]: one task stays (one slot), the load ran on both slots, and each call runs
    the kernels of the six partitions on two processes that map the partitions' files."""
    from iterflow.runtime.datacache.resident_share import PREFIX, SHARED_MEMORY

    points = spark.createDataFrame(pa.table({"x": np.arange(60_000.0)})).repartition(6).cache()
    points.count()
    seen: list = []
    outputs: list = []

    def _where(table: pa.Table) -> pa.Table:
        """Kernel: this process's id, and whether the partition's values are mapped from a
        file (fewer bytes in pyarrow's allocator than the table holds)."""
        mapped = pa.total_allocated_bytes() < table.nbytes or table.num_rows == 0
        return pa.table({"pid": [os.getpid()], "mapped": [mapped], "rows": [table.num_rows]})

    @itf.body
    def where(acc, points, ctx):
        data = ctx.columnar(points)
        seen.append(data)
        outputs.append(itf.to_arrow(data.map(_where, "pid INT, mapped BOOLEAN, rows LONG")))
        return itf.Declaration(feedback={"acc": acc})

    with settings(spark, **{RESIDENT_CONF: "on"}):
        itf.BoundedIteration(where).bind("acc", spark.range(1)).bind("points", points).until(
            itf.max_rounds(2)
        ).run(progress=False)
    data = seen[0]
    assert (data.tasks, data.launched, data.processes) == (1, 2, 2)
    for table in outputs:
        assert sum(table["rows"].to_pylist()) == 60_000
        assert all(table["mapped"].to_pylist())
        assert len(set(table["pid"].to_pylist())) == 2  # both cores worked
    assert set(outputs[0]["pid"].to_pylist()) == set(outputs[1]["pid"].to_pylist())
    if os.path.isdir(SHARED_MEMORY):  # the files went with the run
        left = [e for e in os.listdir(SHARED_MEMORY) if e.startswith(f"{PREFIX}{data.job}")]
        assert left == []
    points.unpersist()


def test_pagerank_resident_equals_the_job_path_and_networkx(spark):
    g = nx.gnm_random_graph(200, 1500, seed=7, directed=True)
    edges = spark.createDataFrame([(int(a), int(b)) for a, b in g.edges()], "src long, dst long")
    vertices = spark.createDataFrame([(i,) for i in range(200)], "id long")
    graph = Graph(vertices, edges)
    resident_ranks, job_ranks = both_paths(
        spark,
        lambda: {
            r["id"]: r["pagerank"]
            for r in pagerank(graph, tol=1e-10, method="arrow", progress=False).collect()
        },
    )
    assert resident_ranks == job_ranks
    expected = nx.pagerank(g, alpha=0.85, tol=1e-12)
    assert max(abs(resident_ranks[v] - expected[v]) for v in expected) < 1e-8


def test_kmeans_and_logistic_regression_resident_equal_the_job_path(spark):
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.normal(c, 0.4, (150, 3)) for c in (0.0, 4.0, 8.0)])
    y = (x.sum(axis=1) + rng.normal(0, 1, len(x)) > 12).astype(float)
    df = spark.createDataFrame(
        pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": y})
    ).repartition(3)

    def fit():
        centroids = kmeans(df, 3, features=["a", "b", "c"], max_rounds=10, seed=2).centroids
        model = logistic_regression(
            df, features=["a", "b", "c"], solver="gd", max_rounds=30, batch_fraction=0.5, seed=4
        )
        return centroids, model.coefficients, model.intercept

    resident_fit, jobs_fit = both_paths(spark, fit)
    np.testing.assert_array_equal(resident_fit[0], jobs_fit[0])
    np.testing.assert_array_equal(resident_fit[1], jobs_fit[1])
    assert resident_fit[2] == jobs_fit[2]


def test_a_resident_round_runs_no_spark_job(spark):
    points = spark.createDataFrame(pa.table({"x": np.arange(1000.0)})).repartition(4)
    started: list[int] = []

    @itf.body
    def model_only(acc, points, ctx):
        data = ctx.columnar(points)
        started.append(jobs_started(spark))
        new_acc = data.map(
            lambda table: pa.table({"s": [float(np.sum(table["x"].to_numpy()))]}),
            "s DOUBLE",
            combine=lambda batches: iter(
                [
                    pa.RecordBatch.from_pydict(
                        {"acc": [sum(b["s"].to_numpy().sum() for b in batches)]}
                    )
                ]
            ),
            combine_schema="acc DOUBLE",
        )
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    with settings(spark, **{RESIDENT_CONF: "on"}):
        result = (
            itf.BoundedIteration(model_only)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(6))
            .run(progress=False)
        )
    assert result.outputs["acc"].first()["acc"] == sum(range(1000))
    # Round 0 starts the resident job; rounds 1 to 5 start none at all.
    assert started[1:] == [started[1]] * 5


def test_metric_updates_in_resident_kernels_count_toward_their_round(spark):
    points = spark.createDataFrame(pa.table({"x": np.arange(300.0)})).repartition(3)
    seen_rows = itf.metrics.counter("seen_rows")
    sizes = itf.metrics.distribution("x_values")

    def kernel(table: pa.Table, rows, values) -> pa.Table:
        rows.inc(table.num_rows)
        for x in table["x"].to_pylist():
            values.update(x)
        return pa.table({"n": [table.num_rows]})

    @itf.body
    def counting(acc, points, ctx):
        epoch = float(ctx.epoch)
        new_acc = ctx.columnar(points).map(
            kernel,
            "n LONG",
            seen_rows,
            sizes,
            combine=lambda batches: iter([pa.RecordBatch.from_pydict({"acc": [epoch]})]),
            combine_schema="acc DOUBLE",
        )
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    def run():
        return (
            itf.BoundedIteration(counting)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(4))
            .run(progress=False)
        )

    resident_run, jobs_run = both_paths(spark, run)
    for result in (resident_run, jobs_run):
        assert [p.metrics["seen_rows"] for p in result.history] == [300] * 4
        per_round = [p.metrics["x_values"] for p in result.history]
        assert [(d.count, d.sum, d.min, d.max) for d in per_round] == [
            (300, sum(range(300)), 0.0, 299.0)
        ] * 4
        assert result.metrics["seen_rows"].committed == 1200
        assert result.metrics["seen_rows"].attempted == 1200


def test_off_and_too_much_data_fall_back_with_the_reason_in_the_event_log(spark, tmp_path):
    points = spark.createDataFrame(pa.table({"x": np.arange(2000.0)})).repartition(2)
    with settings(spark, **{RESIDENT_CONF: "off"}):
        run_sums(spark, points, event_log=tmp_path / "off.jsonl")
    assert started_event(tmp_path / "off.jsonl")["resident"] == {
        "mode": "jobs",
        "reason": f"{RESIDENT_CONF} is 'off'",
    }
    with settings(spark, **{MAX_BYTES_CONF: "1k"}):
        small = run_sums(spark, points, event_log=tmp_path / "big.jsonl")
    described = started_event(tmp_path / "big.jsonl")["resident"]
    assert described["mode"] == "jobs" and MAX_BYTES_CONF in described["reason"]
    assert small.outputs["acc"].first()["acc"] == 6 * sum(range(2000))
    assert [p.resident for p in small.history] == [False] * 3
    with (
        settings(spark, **{MAX_BYTES_CONF: "1k", RESIDENT_CONF: "on"}),
        pytest.raises(itf.IterflowError, match=f"{RESIDENT_CONF}=on.*{MAX_BYTES_CONF}"),
    ):
        run_sums(spark, points)
    with settings(spark, **{RESIDENT_CONF: "sometimes"}), pytest.raises(itf.IterflowError):
        run_sums(spark, points)
    from iterflow.metrics.registry import REGISTRY

    assert REGISTRY._runs == []  # refused before the run began: nothing left registered


def test_a_body_without_columnar_data_says_so(spark, tmp_path):
    @itf.body
    def plain(acc, ctx):
        return itf.Declaration(feedback={"acc": acc.selectExpr("acc + 1 AS acc")})

    log = tmp_path / "plain.jsonl"
    itf.BoundedIteration(plain).bind("acc", spark.createDataFrame([(0.0,)], "acc double")).until(
        itf.max_rounds(2)
    ).run(progress=False, event_log=log)
    described = started_event(log)["resident"]
    assert described["mode"] == "jobs" and "ctx.columnar" in described["reason"]


def test_an_unreachable_data_plane_falls_back_or_fails_under_on(spark, tmp_path, monkeypatch):
    points = spark.createDataFrame(pa.table({"x": np.arange(50.0)})).repartition(2)
    original = resident_policy.ResidentPolicy._data_plane

    def unreachable(self, context):
        plane = original(self, context)
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        plane.credentials = attrs.evolve(plane.credentials, location=f"grpc+tcp://127.0.0.1:{port}")
        return plane

    monkeypatch.setattr(resident_policy.ResidentPolicy, "_data_plane", unreachable)
    monkeypatch.setattr(resident_task, "CONNECT_TIMEOUT_S", 2.0)
    result = run_sums(spark, points, event_log=tmp_path / "unreachable.jsonl")
    assert result.outputs["acc"].first()["acc"] == 6 * sum(range(50))
    described = started_event(tmp_path / "unreachable.jsonl")["resident"]
    assert described["mode"] == "jobs" and "cannot reach" in described["reason"]
    with (
        settings(spark, **{RESIDENT_CONF: "on"}),
        pytest.raises(itf.IterflowError, match="cannot reach the driver's data plane"),
    ):
        run_sums(spark, points)


def test_a_pinned_port_is_used_and_a_taken_one_is_named(spark, tmp_path):
    points = spark.createDataFrame(pa.table({"x": np.arange(50.0)})).repartition(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with settings(spark, **{PORT_CONF: str(port)}):
            run_sums(spark, points, event_log=tmp_path / "taken.jsonl")
            with (
                settings(spark, **{RESIDENT_CONF: "on"}),
                pytest.raises(itf.IterflowError, match=PORT_CONF),
            ):
                run_sums(spark, points)
    described = started_event(tmp_path / "taken.jsonl")["resident"]
    assert described["mode"] == "jobs" and str(port) in described["reason"]
    # Free now: the run's data plane listens there.
    with settings(spark, **{PORT_CONF: str(port)}):
        seen: list = []
        (
            itf.BoundedIteration(sums_body(seen))
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(1))
            .run(progress=False)
        )
    assert seen[0].plane.location.endswith(f":{port}")


def test_the_data_plane_refuses_calls_without_the_run_secret():
    plane = DataPlane("127.0.0.1", "127.0.0.1", 0)
    try:
        client = flight.FlightClient(plane.location)
        ping = flight.Action("ping", b"")
        assert [
            r.body.to_pybytes() for r in client.do_action(ping, plane.credentials.call_options())
        ] == [b"ok"]
        wrong = Credentials(plane.location, "0" * 64)
        for options in (flight.FlightCallOptions(timeout=5), wrong.call_options(timeout=5)):
            with pytest.raises(flight.FlightUnauthenticatedError):
                list(client.do_action(ping, options))
            descriptor = flight.FlightDescriptor.for_command(b"{}")
            with pytest.raises(flight.FlightUnauthenticatedError):
                _writer, reader = client.do_exchange(descriptor, options)
                reader.read_chunk()
        assert plane.refused >= 4
    finally:
        plane.close()


def test_the_tls_data_plane_admits_only_this_runs_tasks_and_they_only_this_server():
    """With Spark's security on, the data plane speaks TLS: a task holding the run's
    credentials exchanges messages; a cleartext client, a client without the run's client
    certificate or with another one, and one without the secret are all refused before any
    handler sees them; a task pinned to another run's certificate does not talk to it."""
    plane = DataPlane("127.0.0.1", "127.0.0.1", 0, tls=True)
    handled: list[dict] = []

    def echo(hello, channel):
        handled.append(hello)
        channel.send({"echo": channel.receive()})

    plane.register("job", echo)
    good = plane.credentials
    other = KeyPair.make()
    ping = flight.Action("ping", b"")
    try:
        assert good.location.startswith("grpc+tls://")
        channel = connect(good, {"job": "job", "task": 0}, timeout=10)
        channel.send([1, 2, 3])
        assert channel.receive() == {"echo": [1, 2, 3]}
        assert handled == [{"job": "job", "task": 0}]

        cleartext = flight.FlightClient(good.location.replace("grpc+tls", "grpc+tcp"))
        no_client_cert = flight.FlightClient(
            good.location, tls_root_certs=good.server_cert, override_hostname="iterflow-data-plane"
        )
        wrong_client = attrs.evolve(good, client=other).client_for()
        for client in (cleartext, no_client_cert, wrong_client):
            with pytest.raises((flight.FlightUnavailableError, flight.FlightTimedOutError)):
                list(client.do_action(ping, good.call_options(timeout=5)))
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(good.client_for().do_action(ping, flight.FlightCallOptions(timeout=5)))
        pinned_elsewhere = attrs.evolve(good, server_cert=other.cert)
        with pytest.raises((flight.FlightUnavailableError, flight.FlightTimedOutError)):
            connect(pinned_elsewhere, {"job": "job", "task": 1}, timeout=5)
        assert len(handled) == 1
        assert "secret" not in repr(good) and good.secret not in repr(good)
    finally:
        plane.close()


def test_the_data_plane_listens_and_is_reached_on_ipv6():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        plane = DataPlane("::1", "::1", 0)
    except itf.IterflowError as error:
        pytest.skip(f"no IPv6 loopback: {error}")
    plane.register("job", lambda hello, channel: channel.send(hello["task"]))
    try:
        assert plane.location.startswith("grpc+tcp://[::1]:")
        assert connect(plane.credentials, {"job": "job", "task": 7}, timeout=10).receive() == 7
    finally:
        plane.close()


def test_a_body_mixing_a_resident_kernel_with_joins_observations_and_checkpoints(spark, tmp_path):
    """Resident tasks hold their slots while the same rounds run DataFrame jobs: a join,
    ctx.observe, an emptiness criterion and durable checkpoint writes (no deadlock)."""
    points = spark.createDataFrame(pa.table({"x": np.arange(400.0)})).repartition(4)
    labels = spark.createDataFrame([(i, i % 7) for i in range(400)], "id long, label long")

    @itf.body
    def mixed(acc, rows, points, labels, ctx):
        current = acc.first()["acc"]
        new_acc = ctx.columnar(points).map(
            lambda table: pa.table({"s": [float(np.sum(table["x"].to_numpy()))]}),
            "s DOUBLE",
            combine=lambda batches: iter(
                [
                    pa.RecordBatch.from_pydict(
                        {"acc": [current + sum(b["s"].to_numpy().sum() for b in batches)]}
                    )
                ]
            ),
            combine_schema="acc DOUBLE",
        )
        joined = ctx.observe("joined", rows.join(labels, "id").where(f"label <> {ctx.epoch}"))
        new_rows = joined.select("id")
        return itf.Declaration(
            feedback={"acc": new_acc, "rows": new_rows},
            outputs={"acc": new_acc},
            until=itf.empty(new_rows),
        )

    def run(directory):
        return (
            itf.BoundedIteration(mixed)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("rows", spark.range(400))
            .bind("points", points)
            .bind("labels", labels)
            .until(itf.max_rounds(10))
            .run(progress=False, checkpoint_dir=str(directory), checkpoint_every=1)
        )

    resident_run, jobs_run = both_paths(
        spark, lambda: run(tmp_path / f"ck-{len(os.listdir(tmp_path))}")
    )
    assert resident_run.termination.reason == jobs_run.termination.reason == "criteria_empty"
    assert resident_run.rounds == jobs_run.rounds == 7  # every label removed by epoch 6
    assert resident_run.outputs["acc"].first()["acc"] == 7 * sum(range(400))
    assert [p.observed["joined"] for p in resident_run.history] == [
        p.observed["joined"] for p in jobs_run.history
    ]
    assert all(p.resident for p in resident_run.history)


def test_resident_tasks_end_when_the_run_fails_or_is_interrupted(spark):
    points = spark.createDataFrame(pa.table({"x": np.arange(100.0)})).repartition(2)
    context = server_context(spark)

    def stop_at_epoch_2(error):
        def listener(end):
            if end.epoch == 2:
                raise error

        return listener

    for error in (ValueError("listener gave up"), KeyboardInterrupt()):
        seen: list = []
        iteration = (
            itf.BoundedIteration(sums_body(seen))
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(10))
            .listen(stop_at_epoch_2(error))
        )
        with pytest.raises((itf.IterflowError, KeyboardInterrupt)):
            iteration.run(progress=False)
        assert seen[0].tasks_alive() == {}
        assert list(context.statusTracker().getActiveJobsIds()) == []


def test_a_kernel_error_fails_its_round_by_epoch(spark):
    points = spark.createDataFrame(pa.table({"x": np.arange(10.0)})).repartition(2)

    def kernel(table: pa.Table, epoch: int) -> pa.Table:
        if epoch == 2:
            raise ZeroDivisionError("no rank to share")
        return pa.table({"s": [1.0]})

    @itf.body
    def failing(acc, points, ctx):
        new_acc = ctx.columnar(points).map(
            kernel,
            "s DOUBLE",
            ctx.epoch,
            combine=lambda batches: iter([pa.RecordBatch.from_pydict({"acc": [1.0]})]),
            combine_schema="acc DOUBLE",
        )
        return itf.Declaration(feedback={"acc": new_acc})

    with pytest.raises(itf.RoundError, match=r"epoch 2.*ZeroDivisionError: no rank to share"):
        (
            itf.BoundedIteration(failing)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(5))
            .run(progress=False)
        )


def test_a_killed_resident_worker_is_relaunched_and_the_round_recomputed(spark):
    if is_connect(spark):
        pytest.skip("resident rounds run on classic sessions only")
    points = spark.createDataFrame(pa.table({"x": np.arange(600.0)})).repartition(3)
    seen: list = []
    killed: list[int] = []

    def kill_at_epoch_2(end):
        if end.epoch == 2:
            for _host, pid in seen[0].tasks_alive().values():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    def run(listeners=()):
        iteration = (
            itf.BoundedIteration(sums_body(seen))
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(5))
        )
        for listener in listeners:
            iteration = iteration.listen(listener)
        return iteration.run(progress=False)

    with settings(spark, **{RESIDENT_CONF: "on"}):
        interrupted = run([kill_at_epoch_2])
        assert killed and seen[0].launches == 2  # relaunched once, after the kill
        seen.clear()
        uninterrupted = run()
    assert interrupted.outputs["acc"].first()["acc"] == uninterrupted.outputs["acc"].first()["acc"]
    assert interrupted.outputs["acc"].first()["acc"] == 15 * sum(range(600))
    assert [p.resident for p in interrupted.history] == [True] * 5


def test_to_arrow_reads_rows_held_on_the_driver_without_a_job(spark):
    held = spark.createDataFrame(pa.table({"id": [1, 2], "w": [[0.5, 1.5], [2.5]]}))
    before = jobs_started(spark)
    table = itf.to_arrow(held)  # rows in the plan: no Spark job
    assert jobs_started(spark) == before
    assert table.to_pylist() == [{"id": 1, "w": [0.5, 1.5]}, {"id": 2, "w": [2.5]}]
    in_spark = spark.range(3).selectExpr("id", "id * 2 AS twice")
    assert itf.to_arrow(in_spark).to_pylist() == in_spark.toArrow().to_pylist()


def test_to_arrow_reads_the_instants_of_timestamps_held_in_the_plan(spark):
    """Rows in the plan come back through ``collect()``, whose datetimes are local times:
    the table holds the same instants as Spark's own ``toArrow`` (in any time zone)."""
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        local = spark.createDataFrame(
            [(1, "2026-01-05 12:00:00"), (2, None)], "id long, at string"
        ).selectExpr("id", "to_timestamp(at) AS at")
        local = spark.createDataFrame(local.collect(), local.schema)  # rows in the plan
        table = itf.to_arrow(local)
        want = local.toArrow()
        assert table.column("at").cast("int64").to_pylist() == (
            want.column("at").cast("int64").to_pylist()
        )
        assert table.column("at").to_pylist()[1] is None
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_a_resident_result_is_a_full_dataframe_for_joins_and_checkpoints(spark, tmp_path):
    """The model a resident kernel returns is rows on the driver; the next round joins it
    with Spark data and durable checkpoints write it, as any DataFrame."""
    points = spark.createDataFrame(pa.table({"x": np.arange(40.0)})).repartition(2)
    keys = spark.createDataFrame([(1, "a"), (2, "b")], "k long, name string")
    names: list[str] = []

    @itf.body
    def step(model, points, ctx):
        names.extend(r["name"] for r in model.join(keys, "k").collect())  # a Spark join
        total = float(itf.to_arrow(model).column("s")[0].as_py())
        new_model = ctx.columnar(points).map(
            lambda table: pa.table({"p": [float(np.sum(table["x"].to_numpy()))]}),
            "p DOUBLE",
            combine=lambda batches: iter(
                [
                    pa.RecordBatch.from_pydict(
                        {"k": [2], "s": [total + sum(b["p"].to_numpy().sum() for b in batches)]}
                    )
                ]
            ),
            combine_schema="k LONG, s DOUBLE",
        )
        return itf.Declaration(feedback={"model": new_model}, outputs={"model": new_model})

    def run(rounds: int) -> itf.IterationResult:
        return (
            itf.BoundedIteration(step)
            .bind("model", spark.createDataFrame([(1, 0.0)], "k long, s double"))
            .bind("points", points)
            .until(itf.max_rounds(rounds))
            .run(progress=False, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=1)
        )

    result = run(3)
    assert names == ["a", "b", "b"]
    assert result.outputs["model"].collect()[0]["s"] == 3 * sum(range(40))
    assert result.outputs["model"].count() == 1
    resumed = run(4)  # a finished run goes on from its last checkpoint
    assert resumed.resumed_from is not None  # the checkpoint wrote the held model
    assert resumed.outputs["model"].collect()[0]["s"] == 4 * sum(range(40))


def test_a_held_frame_makes_one_jvm_dataset_when_threads_race_for_it(spark):
    """A checkpoint writer thread and the next body may both need a held variable's
    Dataset: columns of one must resolve in joins built from the other."""
    from concurrent.futures import ThreadPoolExecutor

    from iterflow.runtime.datacache.driver_variables import held_frame

    table = pa.table({"id": pa.array(range(50), pa.int64())})
    frame = held_frame(spark, table, spark.createDataFrame(table).schema)
    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: frame._jdf, range(8)))
    assert all(jdf is made[0] for jdf in made)
    other = spark.range(50)
    assert frame.join(other, frame.id == other.id).count() == 50


def test_too_few_task_slots_fall_back_with_the_reason(spark, tmp_path, monkeypatch):
    """One slot (local[1], say): a resident task would leave none for the round's jobs."""
    points = spark.createDataFrame(pa.table({"x": np.arange(30.0)})).repartition(2)
    monkeypatch.setattr(resident_policy, "task_slots", lambda context: 1)
    result = run_sums(spark, points, event_log=tmp_path / "slots.jsonl")
    assert result.outputs["acc"].first()["acc"] == 6 * sum(range(30))
    described = started_event(tmp_path / "slots.jsonl")["resident"]
    assert described["mode"] == "jobs" and "fewer free task slots" in described["reason"]
    with (
        settings(spark, **{RESIDENT_CONF: "on"}),
        pytest.raises(itf.IterflowError, match="fewer free task slots"),
    ):
        run_sums(spark, points)


def test_a_kernel_that_cannot_be_unpickled_in_the_task_fails_its_round(spark, tmp_path):
    """Named by the round's error, not relaunched as a lost task (nothing was lost)."""
    module = tmp_path / "driver_only_kernels.py"
    module.write_text(
        "import pyarrow as pa\n\ndef kernel(table):\n    return pa.table({'s': [1.0]})\n"
    )
    points = spark.createDataFrame(pa.table({"x": np.arange(10.0)})).repartition(2)
    sys.path.insert(0, str(tmp_path))
    try:
        from driver_only_kernels import kernel  # importable here, not in the Python workers

        seen: list = []

        @itf.body
        def step(acc, points, ctx):
            data = ctx.columnar(points)
            seen.append(data)
            new_acc = data.map(
                kernel,
                "s DOUBLE",
                combine=lambda batches: iter([pa.RecordBatch.from_pydict({"acc": [1.0]})]),
                combine_schema="acc DOUBLE",
            )
            return itf.Declaration(feedback={"acc": new_acc})

        with (
            settings(spark, **{RESIDENT_CONF: "on"}),
            pytest.raises(itf.RoundError, match=r"epoch 0.*driver_only_kernels"),
        ):
            (
                itf.BoundedIteration(step)
                .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
                .bind("points", points)
                .until(itf.max_rounds(2))
                .run(progress=False)
            )
        assert seen[0].launches == 1
    finally:
        sys.path.remove(str(tmp_path))


def test_kernel_columns_are_taken_by_position_and_a_wrong_count_is_named(spark):
    """As mapInArrow does: names come from the declared schema, whatever the kernel called
    its columns; a kernel with too few columns fails its round saying so."""
    points = spark.createDataFrame(pa.table({"x": np.arange(20.0)})).repartition(2)

    def run(kernel):
        @itf.body
        def step(acc, points, ctx):
            sums = ctx.columnar(points).map(kernel, "total DOUBLE, n LONG")
            return itf.Declaration(feedback={"acc": acc}, outputs={"sums": sums})

        result = (
            itf.BoundedIteration(step)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(1))
            .run(progress=False)
        )
        return sorted(tuple(r) for r in result.outputs["sums"].collect()), itf.to_arrow(
            result.outputs["sums"]
        ).column_names

    def renamed(table: pa.Table) -> pa.Table:
        return pa.table({"s": [float(np.sum(table["x"].to_numpy()))], "count": [table.num_rows]})

    resident_sums, jobs_sums = both_paths(spark, lambda: run(renamed))
    assert resident_sums == jobs_sums
    rows = resident_sums[0]
    assert sum(total for total, _ in rows) == 190.0 and sum(n for _, n in rows) == 20
    assert resident_sums[1] == ["total", "n"]

    def too_few(table: pa.Table) -> pa.Table:
        return pa.table({"s": [1.0]})

    with (
        settings(spark, **{RESIDENT_CONF: "on"}),
        pytest.raises(itf.RoundError, match=r"epoch 0.*1 column\(s\) \['s'\].*total, n"),
    ):
        run(too_few)


def finishes_within(spark, seconds: float, run):
    """``run()``'s value, or a failure (its jobs cancelled) when it has not finished in
    ``seconds``: a deadlock fails the test instead of hanging it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(run)
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            spark.sparkContext.cancelAllJobs()
            pytest.fail(f"did not finish within {seconds:.0f} s: resident tasks took every slot")


def test_a_resident_run_nested_in_a_resident_run_finishes(spark, tmp_path, caplog):
    """Resident slots are counted per SparkContext, not per run: the outer run's resident task
    holds one of local[2]'s two slots, so a run nested in its round, whose body runs a Spark
    job, takes none (it runs its kernels as jobs, with the reason and a warning) instead of
    the last slot, which its own job would then wait for forever."""
    points = spark.createDataFrame(pa.table({"x": np.arange(100.0)})).repartition(2)
    inner: list = []

    @itf.body
    def counting(acc, points, ctx):
        rows = points.count()  # a Spark job inside the nested round
        data = ctx.columnar(points)
        total = data.map(
            lambda table: pa.table({"s": [float(np.sum(table["x"].to_numpy()))]}), "s DOUBLE"
        )
        new_acc = total.selectExpr(f"sum(s) + {rows} AS acc")
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    def nested(end: itf.RoundEnd) -> None:
        if end.epoch == 0:
            run = itf.BoundedIteration(counting).bind("acc", zero(spark)).bind("points", points)
            inner.append(
                run.until(itf.max_rounds(2)).run(progress=False, event_log=tmp_path / "in.jsonl")
            )

    def outer():
        it = itf.BoundedIteration(sums_body()).bind("acc", zero(spark)).bind("points", points)
        return it.until(itf.max_rounds(2)).listen(nested).run(progress=False)

    with caplog.at_level(logging.WARNING, logger="iterflow.resident"):
        result = finishes_within(spark, 240, outer)
    assert result.outputs["acc"].first()["acc"] == 3 * sum(range(100))
    assert inner[0].outputs["acc"].first()["acc"] == sum(range(100)) + 100
    described = started_event(tmp_path / "in.jsonl")["resident"]
    assert described["mode"] == "jobs" and "held by resident tasks" in described["reason"]
    assert any("fewer free task slots" in r.getMessage() for r in caplog.records)
    assert result.history[-1].resident and not inner[0].history[-1].resident


def zero(spark):
    return spark.createDataFrame([(0.0,)], "acc double")
