"""Metrics sinks and the pusher against real servers on 127.0.0.1, without Spark."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from iterflow.errors import IterflowValueError, IterflowWarning
from iterflow.metrics.pusher import MetricsPusher
from iterflow.metrics.sinks import (
    DeliveryError,
    GraphiteSink,
    HttpJsonSink,
    JsonLinesSink,
    MetricsSink,
    PrometheusSink,
)
from iterflow.metrics.values import DistributionValue, MetricResult, MetricsSnapshot
from iterflow.reports import RoundProgress

# 2024-01-02T03:04:05Z as Unix time.
TIME = datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
UNIX_TIME = 1704164645


def make_snapshot(
    iteration: str = "pagerank", *, epoch: int | None = 3, final: bool = False
) -> MetricsSnapshot:
    return MetricsSnapshot(
        iteration=iteration,
        run_id="run-1",
        time=TIME,
        epoch=epoch,
        final=final,
        metrics={
            "rows_seen": MetricResult(kind="counter", committed=10, attempted=12),
            "loss.delta": MetricResult(
                kind="distribution",
                committed=DistributionValue(count=2, sum=3.0, min=1.0, max=2.0),
                attempted=DistributionValue(count=4, sum=10.0, min=1.0, max=4.0),
            ),
            "empty": MetricResult(
                kind="distribution", committed=DistributionValue(), attempted=DistributionValue()
            ),
            "lr": MetricResult(kind="gauge", committed=0.5, attempted=0.25),
            "unset": MetricResult(kind="gauge", committed=None, attempted=None),
        },
    )


def wait_until(condition: Callable[[], bool], deadline_s: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail if it does not within ``deadline_s``."""
    give_up = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < give_up, "condition not reached before the deadline"
        time.sleep(0.01)


def closed_port() -> int:
    """A port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class RecordingSink(MetricsSink):
    """Keeps what it receives, and whether it was closed, for the pusher tests."""

    def __init__(self, name: str = "recording") -> None:
        self.name = name
        self.snapshots: list[MetricsSnapshot] = []
        self.closed = False

    def push(self, snapshot: MetricsSnapshot) -> None:
        self.snapshots.append(snapshot)

    def close(self) -> None:
        self.closed = True


class FlakySink(RecordingSink):
    """Fails its first ``failures`` pushes, then records like ``RecordingSink``."""

    def __init__(self, failures: int) -> None:
        super().__init__("flaky")
        self.failures_left = failures

    def push(self, snapshot: MetricsSnapshot) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise ConnectionError("collector unavailable")
        super().push(snapshot)


class Request(NamedTuple):
    """One request a ``StubHTTPServer`` received; header names in lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


#: What a stub answers: status, headers, body.
Answer = tuple[int, dict[str, str], bytes]


class StubHTTPServer(ThreadingHTTPServer):
    """Answers the n-th POST or PUT (from 0) with ``answer(request, n)`` and keeps every
    request in ``requests``."""

    def __init__(self, answer: Callable[[Request, int], Answer]) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.answer = answer
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _StubHandler(BaseHTTPRequestHandler):
    server: StubHTTPServer

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = Request(self.command, self.path, headers, body)
        with self.server._lock:
            status, answer_headers, answer = self.server.answer(request, len(self.server.requests))
            self.server.requests.append(request)
        self.send_response(status)
        for name, value in {**answer_headers, "Content-Length": str(len(answer))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(answer)

    do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def by_path(request: Request, n: int) -> Answer:
    """500 for /fail, 400 for /bad, a redirect for /moved, else 204."""
    statuses = {"/fail": 500, "/bad": 400, "/moved": 302}
    return (
        statuses.get(request.path, 204),
        {"Location": "/"} if request.path == "/moved" else {},
        b"",
    )


def scripted(
    statuses: list[int], headers: dict[str, str] | None = None
) -> Callable[[Request, int], Answer]:
    """Answers the n-th request with ``statuses[n]``, the last one from then on."""
    return lambda request, n: (statuses[min(n, len(statuses) - 1)], headers or {}, b"")


@contextlib.contextmanager
def stub(answer: Callable[[Request, int], Answer]) -> Iterator[StubHTTPServer]:
    server = StubHTTPServer(answer)
    with serving(server):
        yield server


class GraphiteServer(socketserver.ThreadingTCPServer):
    """Reads plaintext lines until each connection closes, as carbon does."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _GraphiteHandler)
        self.lines: list[str] = []
        self.connections = 0

    @property
    def port(self) -> int:
        port: int = self.server_address[1]
        return port


class _GraphiteHandler(socketserver.StreamRequestHandler):
    server: GraphiteServer

    def handle(self) -> None:
        lines = self.rfile.read().decode("utf-8").splitlines()
        self.server.lines.extend(lines)
        self.server.connections += 1


@contextlib.contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[None]:
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def http_server() -> Iterator[StubHTTPServer]:
    with stub(by_path) as server:
        yield server


@pytest.fixture
def graphite_server() -> Iterator[GraphiteServer]:
    server = GraphiteServer()
    with serving(server):
        yield server


@pytest.fixture
def silent_server() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        # The kernel completes connections in the backlog; nobody ever reads them.
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/"


@pytest.fixture
def prometheus_sink() -> Iterator[PrometheusSink]:
    sink = PrometheusSink(port=0)
    yield sink
    sink.close()


def scrape(text: str) -> dict[tuple[str, str, str], float]:
    """Samples of an exposition as {(sample name, iteration, state): value}."""
    return {
        (sample.name, sample.labels["iteration"], sample.labels["state"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_http_json_sink_posts_the_snapshot_as_json(http_server: StubHTTPServer) -> None:
    sink = HttpJsonSink(http_server.url + "/metrics", headers={"X-Team": "graphs"})
    sink.push(make_snapshot())
    sink.close()

    [request] = http_server.requests
    assert (request.method, request.path) == ("POST", "/metrics")
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-team"] == "graphs"
    body = json.loads(request.body)
    assert body["iteration"] == "pagerank"
    assert body["run_id"] == "run-1"
    assert body["epoch"] == 3
    assert body["final"] is False
    assert body["time"] == "2024-01-02T03:04:05+00:00"
    metrics = body["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["rows_seen"] == {"kind": "counter", "committed": 10, "attempted": 12}
    assert metrics["loss.delta"]["committed"] == {
        "count": 2,
        "sum": 3.0,
        "min": 1.0,
        "max": 2.0,
        "mean": 1.5,
    }
    assert metrics["loss.delta"]["attempted"]["mean"] == 2.5
    assert metrics["lr"] == {"kind": "gauge", "committed": 0.5, "attempted": 0.25}
    assert metrics["unset"]["committed"] is None


@pytest.mark.parametrize(
    ("path", "answer", "tries"),
    [
        ("/fail", "500 Internal Server Error", 3),  # a 5xx is tried again
        ("/bad", "400 Bad Request", 1),  # the request itself is wrong: once
        ("/moved", "302 Found", 1),  # redirects are not followed
    ],
)
def test_http_json_sink_raises_on_a_status_other_than_2xx(
    http_server: StubHTTPServer, path: str, answer: str, tries: int
) -> None:
    sink = HttpJsonSink(http_server.url + path, retries=2, backoff_s=0.01)
    with pytest.raises(DeliveryError) as raised:
        sink.push(make_snapshot())
    s = "y" if tries == 1 else "ies"
    assert str(raised.value) == f"the server answered {answer} (after {tries} tr{s})"
    assert [request.path for request in http_server.requests] == [path] * tries


def test_http_json_sink_sends_the_urls_user_info_as_basic_authentication(
    http_server: StubHTTPServer,
) -> None:
    url = http_server.url.replace("http://", "http://alice:s3cret@") + "/metrics"
    HttpJsonSink(url).push(make_snapshot())

    # "alice:s3cret" in base64.
    [request] = http_server.requests
    assert request.headers["authorization"] == "Basic YWxpY2U6czNjcmV0"


@pytest.mark.parametrize("url", ["collector.example/ingest?token=abcdef123456", "ftp://x/y", 7])
def test_http_json_sink_refuses_a_url_that_is_not_http(url: object) -> None:
    with pytest.raises(IterflowValueError, match="is not an http\\(s\\) URL") as raised:
        HttpJsonSink(url)  # type: ignore[arg-type]
    assert "abcdef123456" not in str(raised.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("retries", -1), ("retries", 1.5), ("retries", True), ("backoff_s", -0.1), ("backoff_s", "1")],
)
def test_http_json_sink_refuses_retries_or_backoff_that_are_not_counts(
    option: str, value: object
) -> None:
    with pytest.raises(IterflowValueError, match=f"HttpJsonSink {option} is {value!r}"):
        HttpJsonSink("http://collector:8080/m", **{option: value})  # type: ignore[arg-type]


def test_http_json_sink_tries_a_503_again_and_delivers_once() -> None:
    with stub(scripted([503, 503, 204])) as server:
        HttpJsonSink(server.url, backoff_s=0.01).push(make_snapshot())

    # Three tries, one delivery: only the last was taken.
    bodies = [json.loads(request.body) for request in server.requests]
    assert bodies == [make_snapshot().to_dict()] * 3


def test_http_json_sink_gives_up_after_its_retries_and_the_pusher_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    with stub(scripted([503])) as server:
        sink = HttpJsonSink(server.url, retries=2, backoff_s=0.01)
        pusher = MetricsPusher(SnapshotSource(), [(sink, 3600.0)])
        with pytest.warns(IterflowWarning, match="did not receive the final push"):
            pusher.stop()

    assert len(server.requests) == 3  # the first try and 2 retries: bounded
    failed = (
        f"metrics sink '{sink.name}' failed: DeliveryError: the server answered "
        "503 Service Unavailable (after 3 tries)"
    )
    first = caplog.records[0]
    assert (first.levelname, first.getMessage().split(" (further")[0]) == ("WARNING", failed)
    # Giving up the final push is logged at WARNING too, where logs are collected.
    [given_up] = [r for r in caplog.records if "did not receive the final push" in r.getMessage()]
    assert given_up.levelname == "WARNING"
    assert "503 Service Unavailable (after 3 tries)" in given_up.getMessage()


def test_http_json_sink_tries_a_refused_connection_again_then_gives_up() -> None:
    sink = HttpJsonSink(f"http://127.0.0.1:{closed_port()}/m", retries=2, backoff_s=0.01)
    with pytest.raises(DeliveryError, match=r"no delivery after 3 tries: .*Connection refused"):
        sink.push(make_snapshot())


def test_http_json_sink_does_not_wait_for_a_retry_after_beyond_its_timeout() -> None:
    with stub(scripted([429], headers={"Retry-After": "3600"})) as server:
        sink = HttpJsonSink(server.url, timeout_s=2.0)
        with pytest.raises(DeliveryError, match=r"answered 429 Too Many Requests \(after 1 try\)"):
            sink.push(make_snapshot())

    assert len(server.requests) == 1


def test_http_json_sink_waits_for_a_retry_after_within_its_timeout() -> None:
    with stub(scripted([429, 204], headers={"Retry-After": "0"})) as server:
        HttpJsonSink(server.url, timeout_s=2.0).push(make_snapshot())

    assert len(server.requests) == 2


def test_graphite_sink_sends_one_plaintext_line_per_value(graphite_server: GraphiteServer) -> None:
    sink = GraphiteSink("127.0.0.1", graphite_server.port, prefix="jobs.iterflow")
    sink.push(make_snapshot(iteration="page rank/v2.1"))
    sink.close()

    wait_until(lambda: graphite_server.connections == 1)
    base = "jobs.iterflow.page_rank_v2_1"
    assert graphite_server.lines == [
        f"{base}.empty.committed.count 0 {UNIX_TIME}",
        f"{base}.empty.committed.sum 0.0 {UNIX_TIME}",
        f"{base}.empty.attempted.count 0 {UNIX_TIME}",
        f"{base}.empty.attempted.sum 0.0 {UNIX_TIME}",
        f"{base}.loss.delta.committed.count 2 {UNIX_TIME}",
        f"{base}.loss.delta.committed.sum 3.0 {UNIX_TIME}",
        f"{base}.loss.delta.committed.min 1.0 {UNIX_TIME}",
        f"{base}.loss.delta.committed.max 2.0 {UNIX_TIME}",
        f"{base}.loss.delta.committed.mean 1.5 {UNIX_TIME}",
        f"{base}.loss.delta.attempted.count 4 {UNIX_TIME}",
        f"{base}.loss.delta.attempted.sum 10.0 {UNIX_TIME}",
        f"{base}.loss.delta.attempted.min 1.0 {UNIX_TIME}",
        f"{base}.loss.delta.attempted.max 4.0 {UNIX_TIME}",
        f"{base}.loss.delta.attempted.mean 2.5 {UNIX_TIME}",
        f"{base}.lr.committed 0.5 {UNIX_TIME}",
        f"{base}.lr.attempted 0.25 {UNIX_TIME}",
        f"{base}.rows_seen.committed 10 {UNIX_TIME}",
        f"{base}.rows_seen.attempted 12 {UNIX_TIME}",
    ]


def test_prometheus_sink_serves_the_latest_snapshot_of_each_iteration(
    prometheus_sink: PrometheusSink,
) -> None:
    prometheus_sink.push(make_snapshot("pagerank", epoch=1))
    prometheus_sink.push(make_snapshot("pagerank", epoch=2))
    prometheus_sink.push(
        MetricsSnapshot(
            iteration="kmeans",
            run_id="run-2",
            time=TIME,
            epoch=0,
            final=True,
            metrics={"rows_seen": MetricResult(kind="counter", committed=7, attempted=7)},
        )
    )

    url = f"http://127.0.0.1:{prometheus_sink.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode("utf-8")
    families = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert families == {
        "iterflow_empty": "summary",
        "iterflow_empty_min": "gauge",
        "iterflow_empty_max": "gauge",
        "iterflow_loss_delta": "summary",
        "iterflow_loss_delta_min": "gauge",
        "iterflow_loss_delta_max": "gauge",
        "iterflow_lr": "gauge",
        "iterflow_rows_seen": "counter",
        "iterflow_unset": "gauge",
    }
    assert scrape(text) == {
        ("iterflow_empty_count", "pagerank", "committed"): 0,
        ("iterflow_empty_sum", "pagerank", "committed"): 0,
        ("iterflow_empty_count", "pagerank", "attempted"): 0,
        ("iterflow_empty_sum", "pagerank", "attempted"): 0,
        ("iterflow_loss_delta_count", "pagerank", "committed"): 2,
        ("iterflow_loss_delta_sum", "pagerank", "committed"): 3.0,
        ("iterflow_loss_delta_count", "pagerank", "attempted"): 4,
        ("iterflow_loss_delta_sum", "pagerank", "attempted"): 10.0,
        ("iterflow_loss_delta_min", "pagerank", "committed"): 1.0,
        ("iterflow_loss_delta_min", "pagerank", "attempted"): 1.0,
        ("iterflow_loss_delta_max", "pagerank", "committed"): 2.0,
        ("iterflow_loss_delta_max", "pagerank", "attempted"): 4.0,
        ("iterflow_lr", "pagerank", "committed"): 0.5,
        ("iterflow_lr", "pagerank", "attempted"): 0.25,
        ("iterflow_rows_seen_total", "kmeans", "committed"): 7,
        ("iterflow_rows_seen_total", "kmeans", "attempted"): 7,
        ("iterflow_rows_seen_total", "pagerank", "committed"): 10,
        ("iterflow_rows_seen_total", "pagerank", "attempted"): 12,
    }


def test_prometheus_sink_without_port_fills_its_registry_only() -> None:
    sink = PrometheusSink(prefix="jobs.v2")
    sink.push(make_snapshot())
    sink.close()

    assert sink.port is None
    samples = scrape(generate_latest(sink.registry).decode("utf-8"))
    assert samples[("jobs_v2_rows_seen_total", "pagerank", "attempted")] == 12
    assert samples[("jobs_v2_loss_delta_max", "pagerank", "committed")] == 2.0


def test_prometheus_sink_close_stops_the_server() -> None:
    sink = PrometheusSink(port=0)
    sink.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=5)


def test_prometheus_sink_pushes_each_snapshot_to_the_push_gateway() -> None:
    with stub(scripted([200])) as gateway:
        address = gateway.url.removeprefix("http://")
        sink = PrometheusSink(
            push_gateway=address, job="nightly", grouping_key={"instance": "host-1"}
        )
        sink.push(make_snapshot("pagerank", epoch=3))
        sink.push(make_snapshot("kmeans", epoch=1, final=True))

    assert sink.name == f"prometheus push-gateway {address} job=nightly"
    assert [(request.method, request.path) for request in gateway.requests] == [
        ("PUT", "/metrics/job/nightly/instance/host-1")
    ] * 2
    # A PUT replaces the group: the second holds both iterations' latest values.
    samples = scrape(gateway.requests[1].body.decode("utf-8"))
    for iteration in ("pagerank", "kmeans"):
        assert samples[("iterflow_rows_seen_total", iteration, "committed")] == 10
        assert samples[("iterflow_loss_delta_sum", iteration, "attempted")] == 10.0
        assert samples[("iterflow_lr", iteration, "committed")] == 0.5
    assert ("iterflow_rows_seen_total", "kmeans", "committed") not in scrape(
        gateway.requests[0].body.decode("utf-8")
    )


def test_a_push_gateway_that_refuses_the_push_fails_it_and_the_pusher_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    with stub(scripted([500])) as gateway:
        sink = PrometheusSink(push_gateway=gateway.url, job="nightly")
        pusher = MetricsPusher(SnapshotSource(), [(sink, 3600.0)])
        with pytest.warns(IterflowWarning, match="did not receive the final push") as warned:
            pusher.stop()

    assert len(gateway.requests) == 1
    [message] = [str(w.message) for w in warned]
    assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
    assert "500" in message
    assert f"metrics sink '{sink.name}' failed" in caplog.text


@pytest.mark.parametrize("job", ["", None])
def test_prometheus_sink_needs_a_job_name_to_push(job: object) -> None:
    with pytest.raises(IterflowValueError, match="give the Pushgateway job a non-empty string"):
        PrometheusSink(push_gateway="127.0.0.1:9091", job=job)  # type: ignore[arg-type]


def test_json_lines_sink_appends_one_line_per_push(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "metrics.jsonl"
    sink = JsonLinesSink(path)
    sink.push(make_snapshot(epoch=0))
    sink.push(make_snapshot(epoch=1, final=True))
    sink.close()

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [0, 1]
    assert [line["final"] for line in lines] == [False, True]
    assert lines[1]["metrics"]["rows_seen"]["attempted"] == 12
    assert lines[1]["metrics"]["loss.delta"]["committed"]["max"] == 2.0
    assert lines[1] == make_snapshot(epoch=1, final=True).to_dict()


class SnapshotSource:
    """Builds numbered snapshots, as the run's snapshot function does."""

    def __init__(self) -> None:
        self.taken = 0

    def __call__(self, final: bool) -> MetricsSnapshot:
        self.taken += 1
        return make_snapshot(epoch=self.taken, final=final)


def test_pusher_pushes_periodically_and_finally_before_stop_returns() -> None:
    fast, slow = RecordingSink("fast"), RecordingSink("slow")
    pusher = MetricsPusher(SnapshotSource(), [(fast, 0.05), (slow, 3600.0)])
    pusher.start()
    wait_until(lambda: len(fast.snapshots) >= 3)
    pusher.stop()

    assert [s.final for s in fast.snapshots] == [False] * (len(fast.snapshots) - 1) + [True]
    assert [s.epoch for s in fast.snapshots] == list(range(1, len(fast.snapshots) + 1))
    # The slow sink was never due: it gets only the final push, the same as the fast one.
    assert slow.snapshots == [fast.snapshots[-1]]
    assert not fast.closed and not slow.closed  # the caller owns the sinks


def test_pusher_without_start_still_makes_the_final_push() -> None:
    sink = RecordingSink()
    pusher = MetricsPusher(SnapshotSource(), [(sink, 1.0)])
    pusher.stop()
    pusher.stop()

    assert [s.final for s in sink.snapshots] == [True]


def ended(epoch: int) -> RoundProgress:
    return RoundProgress(epoch=epoch, epoch_watermark=epoch, started_at=TIME, duration_s=0.1)


def test_each_sink_is_pushed_each_round_once_with_the_parameters() -> None:
    fast, slow, flaky = RecordingSink("fast"), RecordingSink("slow"), FlakySink(failures=1)
    pusher = MetricsPusher(SnapshotSource(), [(fast, 0.05), (slow, 3600.0), (flaky, 0.05)])
    pusher.started({"conditions": [{"kind": "max_rounds", "n": 4}]})
    pusher.start()
    for epoch in range(4):
        pusher.round_ended(ended(epoch))
        # The next round ends after a push to the fast sinks, with this one in it.
        wait_until(lambda n=epoch + 1: sum(len(s.rounds) for s in fast.snapshots) >= n)
        wait_until(lambda: flaky.failures_left == 0 and flaky.snapshots)
    pusher.stop()

    def epochs(sink: RecordingSink) -> list[int]:
        return [p.epoch for snapshot in sink.snapshots for p in snapshot.rounds]

    assert epochs(fast) == [0, 1, 2, 3] and len(fast.snapshots) > 2
    assert [len(s.rounds) for s in slow.snapshots] == [4]  # all in its only push, the final
    # The failed push carried round 0: it is not sent again.
    assert epochs(flaky) == [1, 2, 3]
    for snapshot in fast.snapshots + slow.snapshots + flaky.snapshots:
        assert snapshot.parameters == {"conditions": [{"kind": "max_rounds", "n": 4}]}


def test_rounds_a_rollback_reruns_are_pushed_once_as_rerun() -> None:
    slow = RecordingSink("slow")
    pusher = MetricsPusher(SnapshotSource(), [(slow, 3600.0)])
    pusher.start()
    first = [ended(epoch) for epoch in range(4)]
    for progress in first:
        pusher.round_ended(progress)
    pusher.rolled_back(1)  # rounds 2 and 3 run again
    rerun = [ended(2), ended(3)]
    for progress in rerun:
        pusher.round_ended(progress)
    pusher.stop()
    assert [list(s.rounds) for s in slow.snapshots] == [[*first[:2], *rerun]]
    assert all(a is b for a, b in zip(slow.snapshots[0].rounds, [*first[:2], *rerun], strict=True))


def test_a_refused_sink_warns_once_and_others_get_every_push(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    source = SnapshotSource()
    refused = GraphiteSink("127.0.0.1", closed_port(), timeout_s=0.2)
    healthy = RecordingSink()
    pusher = MetricsPusher(source, [(refused, 0.05), (healthy, 0.05)])
    pusher.start()
    wait_until(lambda: len(healthy.snapshots) >= 3)
    with pytest.warns(IterflowWarning) as warned:
        pusher.stop()

    # Both sinks are due at the same ticks, so each snapshot went to both.
    assert [s.epoch for s in healthy.snapshots] == list(range(1, source.taken + 1))
    assert healthy.snapshots[-1].final
    messages = [record.getMessage() for record in caplog.records]
    first_failures = [m for m in messages if "failed: ConnectionRefusedError" in m]
    assert len(first_failures) == 1
    assert refused.name in first_failures[0]
    # The end of the run warns once, for the refused sink only.
    [final] = [str(w.message) for w in warned]
    assert final.startswith(f"metrics sink '{refused.name}' did not receive the final push")
    assert "ConnectionRefusedError" in final and "in a row failed" in final


def test_a_sink_that_recovers_is_logged_once_failing_and_once_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    flaky = FlakySink(failures=2)
    pusher = MetricsPusher(SnapshotSource(), [(flaky, 0.05)])
    pusher.start()
    wait_until(lambda: len(flaky.snapshots) >= 1)
    pusher.stop()

    assert [record.getMessage() for record in caplog.records] == [
        "metrics sink 'flaky' failed: ConnectionError: collector unavailable "
        "(further failures are counted, not logged, until it recovers)",
        "metrics sink 'flaky' recovered after 2 failed push(es)",
    ]
    assert flaky.snapshots[-1].final


def test_a_hanging_sink_is_bounded_by_its_timeout(
    silent_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    hanging = HttpJsonSink(silent_server, timeout_s=0.2)
    healthy = RecordingSink()
    pusher = MetricsPusher(SnapshotSource(), [(hanging, 0.05), (healthy, 0.05)])
    pusher.start()
    wait_until(lambda: len(healthy.snapshots) >= 2)
    with pytest.warns(IterflowWarning, match=f"'{hanging.name}' did not receive the final push"):
        pusher.stop()

    assert healthy.snapshots[-1].final
    assert any(
        hanging.name in record.getMessage() and "timed out" in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.parametrize("every_s", [0, -1.0, float("nan"), float("inf")])
def test_pusher_rejects_an_interval_that_is_not_a_positive_number(every_s: float) -> None:
    with pytest.raises(IterflowValueError, match=rf"'recording' is {every_s!r}"):
        MetricsPusher(SnapshotSource(), [(RecordingSink(), every_s)])


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("nan"), None, "5"])
def test_pusher_rejects_a_sink_timeout_that_is_not_a_positive_number(timeout_s: object) -> None:
    sink = RecordingSink()
    sink.timeout_s = timeout_s  # type: ignore[assignment]
    with pytest.raises(IterflowValueError, match="timeout_s of metrics sink 'recording' is "):
        MetricsPusher(SnapshotSource(), [(sink, 1.0)])


def test_a_sink_that_recovers_names_the_rounds_its_failed_pushes_carried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    flaky = FlakySink(failures=2)
    pusher = MetricsPusher(SnapshotSource(), [(flaky, 0.05)])
    for epoch in range(3):
        pusher.round_ended(ended(epoch))
    pusher.start()  # the first push carries rounds 0-2 and fails, so does the second
    wait_until(lambda: len(flaky.snapshots) >= 1)
    pusher.round_ended(ended(3))
    pusher.stop()

    assert [p.epoch for s in flaky.snapshots for p in s.rounds] == [3]
    assert caplog.records[-1].getMessage() == (
        "metrics sink 'flaky' recovered after 2 failed push(es); "
        "the rounds of epochs 0-2 did not reach it"
    )


SECRETS = ("alice", "s3cret", "abcdef123456")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # Refused: the warnings quote the sink's name.
        (
            "http://alice:s3cret@127.0.0.1:{port}/ingest?token=abcdef123456&team=graphs#x",
            "http-json http://***@127.0.0.1:{port}/ingest?token=***&team=***",
        ),
        # Refused, with the password in the query only.
        (
            "http://127.0.0.1:{port}/ingest?password=abcdef123456",
            "http-json http://127.0.0.1:{port}/ingest?password=***",
        ),
    ],
)
def test_the_http_sink_keeps_the_urls_secrets_out_of_its_name_and_warnings(
    caplog: pytest.LogCaptureFixture, url: str, shown: str
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    port = closed_port()
    sink = HttpJsonSink(url.format(port=port), timeout_s=0.5)
    assert sink.name == shown.format(port=port)
    assert repr(sink) == f"<HttpJsonSink {sink.name}>"
    pusher = MetricsPusher(SnapshotSource(), [(sink, 0.05)])
    pusher.start()
    wait_until(lambda: "failed" in caplog.text)
    with pytest.warns(IterflowWarning, match="did not receive the final push") as warned:
        pusher.stop()
    said = caplog.text + "".join(str(w.message) for w in warned)
    assert f"metrics sink '{sink.name}' failed" in caplog.text
    for secret in SECRETS:
        assert secret not in said
