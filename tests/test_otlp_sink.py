"""OtlpSink against an OTLP/HTTP collector stub on 127.0.0.1: the requests it receives are
decoded with opentelemetry-proto, independently of the SDK objects the sink builds."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from test_sinks import (
    Answer,
    Request,
    SnapshotSource,
    StubHTTPServer,
    closed_port,
    make_snapshot,
    scripted,
    stub,
)

import iterflow as itf
from iterflow.errors import IterflowError, IterflowValueError, IterflowWarning
from iterflow.metrics import DeliveryError, OtlpSink
from iterflow.metrics.pusher import MetricsPusher
from iterflow.reports import RoundProgress


def collector_answer(request: Request, n: int) -> Answer:
    """What a collector answers a metrics export it takes: 200 and an empty response."""
    return 200, {"Content-Type": "application/x-protobuf"}, b""


@pytest.fixture
def collector() -> Iterator[StubHTTPServer]:
    with stub(collector_answer) as server:
        yield server


def decoded(server: StubHTTPServer) -> list[ExportMetricsServiceRequest]:
    """The export requests ``server`` received, decoded."""
    return [ExportMetricsServiceRequest.FromString(r.body) for r in server.requests]


def attributes(pairs: Any) -> dict[str, object]:
    """OTLP key-values as a dict of plain values."""

    def plain(pair: KeyValue) -> object:
        return getattr(pair.value, pair.value.WhichOneof("value"))

    return {pair.key: plain(pair) for pair in pairs}


def exported(request: ExportMetricsServiceRequest) -> dict[str, Any]:
    """The metrics of a one-resource request by name: {name: (kind, metric)}."""
    [resource_metrics] = request.resource_metrics
    [scope_metrics] = resource_metrics.scope_metrics
    return {m.name: (m.WhichOneof("data"), m) for m in scope_metrics.metrics}


def by_state(points: Any) -> dict[object, Any]:
    return {attributes(p.attributes)["iterflow.state"]: p for p in points}


def test_otlp_sink_exports_every_kind_of_metric(collector: StubHTTPServer) -> None:
    sink = OtlpSink(
        collector.url + "/v1/metrics",
        headers={"api-key": "k-123"},
        resource_attributes={"deployment.environment": "test"},
    )
    started = datetime(2024, 1, 2, 3, 0, 0, tzinfo=timezone.utc)
    snapshot = make_snapshot()
    sink.push(attrs.evolve(snapshot, started_at=started))
    sink.close()

    [received] = collector.requests
    assert (received.method, received.path) == ("POST", "/v1/metrics")
    assert received.headers["api-key"] == "k-123"
    assert received.headers["content-type"] == "application/x-protobuf"
    [request] = decoded(collector)
    [resource_metrics] = request.resource_metrics
    resource = attributes(resource_metrics.resource.attributes)
    assert resource["service.name"] == "iterflow"
    assert resource["service.instance.id"] == "run-1"
    assert resource["deployment.environment"] == "test"
    assert resource_metrics.scope_metrics[0].scope.name == "iterflow"

    metrics = exported(request)
    # The gauge never set has no point, so no metric.
    assert sorted(metrics) == [
        "iterflow.empty",
        "iterflow.loss.delta",
        "iterflow.lr",
        "iterflow.rows_seen",
    ]

    kind, rows = metrics["iterflow.rows_seen"]
    assert kind == "sum"
    assert rows.sum.is_monotonic
    assert (
        rows.sum.aggregation_temporality
        == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    )
    points = by_state(rows.sum.data_points)
    assert {state: p.as_int for state, p in points.items()} == {"committed": 10, "attempted": 12}
    for point in points.values():
        assert attributes(point.attributes)["iterflow.iteration"] == "pagerank"
        # Cumulative totals start with the run: 2024-01-02T03:00:00Z; taken at 03:04:05.
        assert point.start_time_unix_nano == 1704164400 * 10**9
        assert point.time_unix_nano == 1704164645 * 10**9

    kind, loss = metrics["iterflow.loss.delta"]
    assert kind == "histogram"
    points = by_state(loss.histogram.data_points)
    committed, attempted = points["committed"], points["attempted"]
    assert (committed.count, committed.sum, committed.min, committed.max) == (2, 3.0, 1.0, 2.0)
    assert (attempted.count, attempted.sum, attempted.min, attempted.max) == (4, 10.0, 1.0, 4.0)
    assert list(committed.bucket_counts) == [2] and list(committed.explicit_bounds) == []

    kind, empty = metrics["iterflow.empty"]
    point = by_state(empty.histogram.data_points)["committed"]
    assert point.count == 0 and not point.HasField("min") and not point.HasField("max")

    kind, lr = metrics["iterflow.lr"]
    assert kind == "gauge"
    points = by_state(lr.gauge.data_points)
    assert {state: p.as_double for state, p in points.items()} == {
        "committed": 0.5,
        "attempted": 0.25,
    }


def test_otlp_sink_sends_to_v1_metrics_when_the_endpoint_has_no_path(
    collector: StubHTTPServer,
) -> None:
    sink = OtlpSink(collector.url, service_name="nightly-jobs", prefix="jobs.")
    assert sink.endpoint == collector.url + "/v1/metrics"
    sink.push(make_snapshot())

    assert [r.path for r in collector.requests] == ["/v1/metrics"]
    [request] = decoded(collector)
    resource = attributes(request.resource_metrics[0].resource.attributes)
    assert resource["service.name"] == "nightly-jobs"
    assert "jobs.rows_seen" in exported(request)


def test_a_collector_that_refuses_the_metrics_fails_the_push_with_its_reason() -> None:
    with stub(scripted([400])) as collector:
        sink = OtlpSink(collector.url)
        with pytest.raises(DeliveryError, match=r"the OTLP exporter gave up: .*code: 400"):
            sink.push(make_snapshot())

    assert len(collector.requests) == 1  # a 400 is not tried again


def test_a_refused_collector_fails_the_final_push_and_the_pusher_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="iterflow.metrics")
    sink = OtlpSink(f"http://127.0.0.1:{closed_port()}/v1/metrics?token=abcdef123456", timeout_s=1)
    assert sink.name == f"otlp {sink.endpoint.split('?')[0]}?token=***"
    pusher = MetricsPusher(SnapshotSource(), [(sink, 3600.0)])
    with pytest.warns(IterflowWarning, match="did not receive the final push") as warned:
        pusher.stop()

    [message] = [str(w.message) for w in warned]
    assert message.startswith(f"metrics sink '{sink.name}' did not receive the final push")
    assert "abcdef123456" not in message + caplog.text
    assert any(r.levelname == "WARNING" and "final push" in r.getMessage() for r in caplog.records)


def test_the_pusher_delivers_each_push_to_the_collector(collector: StubHTTPServer) -> None:
    sink = OtlpSink(collector.url)
    pusher = MetricsPusher(SnapshotSource(), [(sink, 3600.0)])
    pusher.round_ended(
        RoundProgress(
            epoch=0, epoch_watermark=0, started_at=datetime.now(timezone.utc), duration_s=0.1
        )
    )
    pusher.stop()

    [request] = decoded(collector)
    rows = exported(request)["iterflow.rows_seen"][1]
    assert by_state(rows.sum.data_points)["committed"].as_int == 10


@pytest.mark.parametrize("endpoint", ["collector:4318", "grpc://collector:4317", ""])
def test_otlp_sink_refuses_an_endpoint_that_is_not_http(endpoint: str) -> None:
    with pytest.raises(IterflowValueError, match="is not an http\\(s\\) URL"):
        OtlpSink(endpoint)


def test_otlp_sink_without_the_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail, as when the package is not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.metric_exporter", None)
    with pytest.raises(IterflowError, match=r"pip install 'iterflow\[otlp\]'"):
        OtlpSink("http://collector:4318")


@pytest.mark.spark
def test_a_run_exports_its_metrics_to_the_collector(
    spark: SparkSession, collector: StubHTTPServer
) -> None:
    rounds = itf.metrics.counter("otlp.rounds")
    sizes = itf.metrics.distribution("otlp.sizes")

    @itf.body
    def step(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        rounds.inc()
        sizes.update(ctx.epoch + 1.0)
        return itf.Declaration(feedback={"v": v.select((F.col("x") + 1).alias("x"))})

    before = datetime.now(timezone.utc) - timedelta(seconds=1)
    result = (
        itf.BoundedIteration(step)
        .bind("v", spark.range(3).select(F.col("id").alias("x")))
        .until(itf.max_rounds(3))
        .push_metrics(OtlpSink(collector.url), every_s=3600)
        .run()
    )

    assert result.rounds == 3
    [request] = decoded(collector)  # the final push only: the interval never came
    metrics = exported(request)
    points = by_state(metrics["iterflow.otlp.rounds"][1].sum.data_points)
    assert points["committed"].as_int == 3
    assert points["committed"].start_time_unix_nano >= before.timestamp() * 10**9
    sizes_point = by_state(metrics["iterflow.otlp.sizes"][1].histogram.data_points)["committed"]
    assert (sizes_point.count, sizes_point.sum, sizes_point.min, sizes_point.max) == (
        3,
        6.0,
        1.0,
        3.0,
    )
