"""Hostile metrics endpoints: a slow HTTP server, a refused port, a Graphite server that
closes mid-write, a sink that hangs. None may stall a round or the end of a run beyond
its documented bound (``2 × timeout_s``), and none may lose the final push silently.

The timing assertions are structural: each compares a call with the endpoint's delay,
an order of magnitude above it, or with the documented bound plus a generous margin.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_sinks import RecordingSink, closed_port

import iterflow as itf
from iterflow.errors import IterflowWarning
from iterflow.metrics.pusher import MetricsPusher
from iterflow.metrics.sinks import GraphiteSink, HttpJsonSink, MetricsSink, PrometheusSink
from iterflow.metrics.values import MetricResult, MetricsSnapshot
from iterflow.reports import RoundProgress

TIME = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
#: Slack for thread scheduling on a busy machine, on top of a documented bound.
MARGIN_S = 1.5


def snapshot_source(metrics: int = 2) -> Callable[[bool], MetricsSnapshot]:
    """Snapshots of a run 'pagerank' with ``metrics`` counters, numbered by epoch."""
    taken = iter(range(1_000_000))

    def take(final: bool) -> MetricsSnapshot:
        return MetricsSnapshot(
            iteration="pagerank",
            run_id="run-1",
            time=TIME,
            epoch=next(taken),
            final=final,
            metrics={
                f"m{i:05d}": MetricResult(kind="counter", committed=i, attempted=i)
                for i in range(metrics)
            },
        )

    return take


def ended(epoch: int) -> RoundProgress:
    return RoundProgress(epoch=epoch, epoch_watermark=epoch, started_at=TIME, duration_s=0.01)


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def run_rounds(pusher: MetricsPusher, rounds: int, gap_s: float = 0.05) -> float:
    """End ``rounds`` rounds ``gap_s`` apart, as a loop would; the slowest ``round_ended``."""
    slowest = 0.0
    for epoch in range(rounds):
        slowest = max(slowest, timed(lambda e=epoch: pusher.round_ended(ended(e))))
        time.sleep(gap_s)
    return slowest


def stop_warning(pusher: MetricsPusher) -> tuple[float, list[str]]:
    """How long ``pusher.stop()`` took, and the IterflowWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stop_s = timed(pusher.stop)
    return stop_s, [str(w.message) for w in caught if issubclass(w.category, IterflowWarning)]


class HangingSink(MetricsSink):
    """A push that never returns until released (a sink without a timeout of its own)."""

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.calls = 0
        self.release = threading.Event()

    def push(self, snapshot: MetricsSnapshot) -> None:
        self.calls += 1
        self.release.wait()


class SlowHTTPServer(ThreadingHTTPServer):
    """Answers each POST after ``delay_s`` (at once when released); with ``trickle``,
    sends its answer (250 bytes) one byte every 0.02 s instead, so no single read
    waits long."""

    def __init__(self, delay_s: float, *, trickle: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _SlowHandler)
        self.delay_s = delay_s
        self.trickle = trickle
        self.released = threading.Event()
        self.received = 0
        self.answered = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client gave up waiting: that is the point


class _SlowHandler(BaseHTTPRequestHandler):
    server: SlowHTTPServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received += 1
        answer = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
        if self.server.trickle:
            answer = answer.replace(b"\r\n", b"\r\nX-Padding: " + b"." * 200 + b"\r\n", 1)
            for byte in answer:
                self.server.released.wait(0.02)
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        else:
            self.server.released.wait(self.server.delay_s)
            self.wfile.write(answer)
        self.server.answered += 1

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def slow_http(delay_s: float, *, trickle: bool = False) -> Iterator[SlowHTTPServer]:
    server = SlowHTTPServer(delay_s, trickle=trickle)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def graphite_closing_mid_write(read_bytes: int = 64) -> Iterator[tuple[int, list[int]]]:
    """A port where a server reads the first ``read_bytes`` of each connection, then
    closes it; yields the port and the bytes it read per connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # to see ``done`` between connections
    read: list[int] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                read.append(len(conn.recv(read_bytes)))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], read
    finally:
        done.set()
        thread.join()
        listener.close()


def test_a_slow_http_endpoint_stalls_no_round_and_the_end_is_bounded() -> None:
    timeout_s = 0.3
    with slow_http(delay_s=5.0) as server:
        sink = HttpJsonSink(server.url, timeout_s=timeout_s)
        healthy = RecordingSink()
        pusher = MetricsPusher(snapshot_source(), [(sink, 0.05), (healthy, 0.05)])
        pusher.start()
        slowest_round = run_rounds(pusher, 10)
        stop_s, warned = stop_warning(pusher)
        answered = server.answered

    assert server.received >= 2  # pushes reached the endpoint and waited on it
    assert answered == 0  # none was answered before the run ended
    assert slowest_round < 0.5  # the endpoint takes 5 s: no round waited for it
    assert stop_s < 2 * timeout_s + MARGIN_S
    # The healthy sink got every round, and the final push, meanwhile.
    assert [p.epoch for s in healthy.snapshots for p in s.rounds] == list(range(10))
    assert healthy.snapshots[-1].final
    [message] = warned
    assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
    assert "of metrics 'm00000', 'm00001'" in message
    assert "the rounds of epochs 0-9 did not reach it either" in message


def test_an_endpoint_that_answers_byte_by_byte_is_cut_at_the_timeout() -> None:
    timeout_s = 0.5
    take = snapshot_source()
    with slow_http(delay_s=0, trickle=True) as server:
        # Each read gets a byte within 0.02 s, so the socket timeout never fires: the push
        # takes as long as the answer (5 s), here until the server is told to hurry.
        threading.Timer(1.5, server.released.set).start()
        direct_s = timed(lambda: HttpJsonSink(server.url, timeout_s=timeout_s).push(take(False)))
    assert direct_s >= 1.5
    with slow_http(delay_s=0, trickle=True) as server:
        sink = HttpJsonSink(server.url, timeout_s=timeout_s)
        pusher = MetricsPusher(snapshot_source(), [(sink, 0.05)])
        pusher.start()
        slowest_round = run_rounds(pusher, 5)
        stop_s, warned = stop_warning(pusher)

    assert slowest_round < 0.5
    assert stop_s < 2 * timeout_s + MARGIN_S
    [message] = warned
    assert f"'{sink.name}' did not receive the final push" in message
    assert "TimeoutError" in message and "epochs 0-4" in message


def test_refused_endpoints_fail_fast_and_the_final_push_warns_per_sink() -> None:
    port = closed_port()
    # Its 3 retries wait 0.03 s in all (0.75 s with the default backoff_s).
    http = HttpJsonSink(f"http://127.0.0.1:{port}/m", backoff_s=0.01)
    graphite = GraphiteSink("127.0.0.1", port)
    pusher = MetricsPusher(snapshot_source(), [(http, 0.05), (graphite, 0.05)])
    pusher.start()
    slowest_round = run_rounds(pusher, 6)
    stop_s, warned = stop_warning(pusher)

    assert slowest_round < 0.5
    assert stop_s < 1.0  # refused at once: far below the 5 s timeout
    assert len(warned) == 2
    for sink, message in zip((http, graphite), warned, strict=True):
        assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
        assert "Connection refused" in message and "epochs 0-5" in message


@pytest.mark.parametrize("metrics", [3, 20_000], ids=["a-few-lines", "megabytes-of-lines"])
def test_a_graphite_server_that_closes_mid_write_fails_the_push(metrics: int) -> None:
    with graphite_closing_mid_write() as (port, read):
        sink = GraphiteSink("127.0.0.1", port, timeout_s=2.0)
        lines = 2 * metrics
        with pytest.raises(
            ConnectionResetError, match=f"closed the connection before reading all {lines} lines"
        ):
            sink.push(snapshot_source(metrics)(False))
    assert read == [64]


def test_a_graphite_server_that_closes_mid_write_loses_no_final_push_silently() -> None:
    with graphite_closing_mid_write() as (port, read):
        sink = GraphiteSink("127.0.0.1", port, timeout_s=1.0)
        pusher = MetricsPusher(snapshot_source(), [(sink, 0.05)])
        pusher.start()
        slowest_round = run_rounds(pusher, 4)
        stop_s, warned = stop_warning(pusher)

    assert len(read) >= 2 and set(read) == {64}
    assert slowest_round < 0.5
    assert stop_s < 2 * sink.timeout_s + MARGIN_S
    [message] = warned
    assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
    assert "before reading all 4 lines" in message and "epochs 0-3" in message


def test_hanging_sinks_delay_neither_the_others_nor_each_other() -> None:
    timeout_s = 0.4
    hanging = [HangingSink(f"hanging {i}", timeout_s) for i in range(3)]
    healthy = RecordingSink()
    pusher = MetricsPusher(
        snapshot_source(), [*((sink, 0.05) for sink in hanging), (healthy, 0.05)]
    )
    try:
        pusher.start()
        slowest_round = run_rounds(pusher, 20)
        pushes_meanwhile = len(healthy.snapshots)
        stop_s, warned = stop_warning(pusher)
    finally:
        for sink in hanging:
            sink.release.set()

    assert slowest_round < 0.5
    # 20 rounds 0.05 s apart: 1 s with the healthy sink due every 0.05 s.
    assert pushes_meanwhile >= 5
    assert healthy.snapshots[-1].final
    # Each hung in its first push: a sink gets one push at a time.
    assert [sink.calls for sink in hanging] == [1, 1, 1]
    # The sinks are waited for together: 2 × timeout_s in all, not per sink.
    assert stop_s < 2 * timeout_s + MARGIN_S
    assert len(warned) == 3
    for sink, message in zip(hanging, warned, strict=True):
        assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
        assert "its previous push was still under way" in message
        assert "epochs 0-19" in message


def test_prometheus_sink_serves_on_loopback_unless_told_otherwise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="iterflow.metrics")
    sink = PrometheusSink(port=0)
    try:
        assert sink._server.socket.getsockname()[0] == "127.0.0.1"
        assert sink.url == f"http://127.0.0.1:{sink.port}/metrics"
        assert sink.name == f"prometheus 127.0.0.1:{sink.port}"
        assert f"serves the metrics at {sink.url}" in caplog.text
        with socket.create_connection(("127.0.0.1", sink.port), timeout=5):
            pass
    finally:
        sink.close()


@pytest.mark.slow_spark
def test_an_endpoint_taking_10_s_per_request_with_the_default_timeout() -> None:
    with slow_http(delay_s=10.0) as server:
        sink = HttpJsonSink(server.url)  # timeout_s=5.0
        pusher = MetricsPusher(snapshot_source(), [(sink, 1.0)])
        pusher.start()
        slowest_round = run_rounds(pusher, 30, gap_s=0.25)
        stop_s, warned = stop_warning(pusher)

    assert server.received >= 2
    assert slowest_round < 1.0
    assert stop_s < 2 * sink.timeout_s + MARGIN_S
    [message] = warned
    assert f"'{sink.name}' did not receive the final push" in message
    assert "epochs 0-29" in message


@pytest.mark.spark
def test_a_run_pushing_to_a_slow_endpoint_is_not_stalled_and_warns(spark: SparkSession) -> None:
    rounds = itf.metrics.counter("sink_faults.rounds")

    @itf.body
    def step(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        rounds.inc()
        nxt = v.select((F.col("x") + 1).alias("x"))
        return itf.Declaration(feedback={"v": nxt}, outputs={"v": nxt})

    timeout_s = 0.3
    with slow_http(delay_s=30.0) as server:
        sink = HttpJsonSink(server.url, timeout_s=timeout_s)
        it = (
            itf.BoundedIteration(step)
            .bind("v", spark.range(3).select(F.col("id").alias("x")))
            .until(itf.max_rounds(4))
            .push_metrics(sink, every_s=0.05)
        )
        with pytest.warns(IterflowWarning, match="did not receive the final push") as warned:
            start = time.perf_counter()
            result = it.run()
            run_s = time.perf_counter() - start
            returned_at = time.time()
        answered = server.answered

    assert result.rounds == 4 and result.metrics["sink_faults.rounds"].committed == 4
    assert server.received >= 1 and answered == 0
    # Any push waited for would cost 30 s.
    assert run_s < 30
    last = result.history[-1]
    ended_at = last.started_at.timestamp() + last.duration_s
    assert returned_at - ended_at < 2 * timeout_s + 5  # the end: 2 × timeout_s, and Spark's own
    [message] = [str(w.message) for w in warned if "final push" in str(w.message)]
    assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
    assert "'sink_faults.rounds'" in message and "epochs 0-3" in message
