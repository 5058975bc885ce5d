"""Sends metrics snapshots to an OpenTelemetry collector: OTLP over HTTP, by the SDK's exporter.

Pure Python: no Spark import. ``opentelemetry`` is imported only when a sink is built,
so the other sinks work without the ``otlp`` extra.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from datetime import datetime
from importlib import metadata
from typing import TYPE_CHECKING, Any

from iterflow.errors import IterflowError, IterflowValueError
from iterflow.metrics.sinks import (
    STATES,
    DeliveryError,
    HeldBackLogs,
    MetricsSink,
    redacted_url,
    without_secrets,
)
from iterflow.metrics.values import DistributionValue, MetricResult, MetricsSnapshot

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import Metric, MetricsData

#: Where the OpenTelemetry exporter logs why an export failed (and its retries, quoting
#: the URL); a failed push quotes it, with the secrets taken out.
EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"
#: The path of the metrics signal on an OTLP/HTTP collector (its port is 4318).
METRICS_PATH = "/v1/metrics"

AttributeValue = str | bool | int | float


class OtlpSink(MetricsSink):
    """Exports each snapshot to an OpenTelemetry collector with OTLP over HTTP (protobuf).

    ``endpoint`` is the collector's metrics URL (``http://collector:4318/v1/metrics``; a
    URL without a path gets ``/v1/metrics``). Each metric is named ``prefix`` + its name:
    a counter becomes a monotonic cumulative sum, a gauge a gauge, a distribution a
    cumulative histogram of one bucket with its count, sum, min and max. Every point has
    the attributes ``iterflow.iteration`` (the body's name) and ``iterflow.state``
    (``committed`` or ``attempted``); the resource has ``service.name``
    (``service_name``) and ``service.instance.id`` (the run id), then
    ``resource_attributes`` and ``OTEL_RESOURCE_ATTRIBUTES`` (the arguments win).

    The SDK's exporter sends the request and tries again, with backoff, what its release
    counts as transient (5xx answers; 429 in recent ones), all within ``timeout_s``. A
    push it gives up raises ``DeliveryError`` with the exporter's reason (the pusher
    warns, naming the sink).

    >>> OtlpSink("http://collector:4318/v1/metrics", headers={"api-key": "k"})  # doctest: +SKIP
    """

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        service_name: str = "iterflow",
        resource_attributes: Mapping[str, AttributeValue] | None = None,
        prefix: str = "iterflow.",
    ) -> None:
        exporter_class = _import_exporter()
        self.endpoint = metrics_endpoint(endpoint)
        self.timeout_s = timeout_s
        self.service_name = service_name
        self.resource_attributes = dict(resource_attributes or {})
        self.prefix = prefix
        self.name = f"otlp {redacted_url(self.endpoint)}"
        self._exporter = exporter_class(
            endpoint=self.endpoint, headers=dict(headers or {}), timeout=timeout_s
        )
        # Runs pushing to one sink at once share its exporter (and its HTTP session).
        self._lock = threading.Lock()

    def push(self, snapshot: MetricsSnapshot) -> None:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        data = self.metrics_data(snapshot)
        with self._lock, HeldBackLogs(EXPORTER_LOGGER) as reasons:
            result = self._exporter.export(data, timeout_millis=self.timeout_s * 1000)
        if result is not MetricExportResult.SUCCESS:
            raise DeliveryError(
                "the OTLP exporter gave up: " + ("; ".join(reasons.messages) or "no reason given")
            )

    def metrics_data(self, snapshot: MetricsSnapshot) -> MetricsData:
        """``snapshot`` as the SDK's ``MetricsData``, the exporter's input."""
        from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        resource = Resource.create(
            {
                "service.name": self.service_name,
                "service.instance.id": snapshot.run_id,
                **self.resource_attributes,
            }
        )
        scope = InstrumentationScope("iterflow", _iterflow_version())
        metrics = list(otlp_metrics(snapshot, self.prefix))
        return MetricsData(
            resource_metrics=[
                ResourceMetrics(
                    resource=resource,
                    scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
                    schema_url="",
                )
            ]
        )

    def redact(self, text: str) -> str:
        return without_secrets(text, self.endpoint)

    def close(self) -> None:
        """Shut the exporter down (its HTTP session); the sink takes no pushes after."""
        self._exporter.shutdown()


def metrics_endpoint(endpoint: str) -> str:
    """``endpoint`` with ``/v1/metrics`` as its path when it has none, or an error naming it
    when it is not an http(s) URL."""
    parts = urllib.parse.urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        shown = redacted_url(endpoint) if isinstance(endpoint, str) else repr(endpoint)
        raise IterflowValueError(
            f"OtlpSink endpoint '{shown}' is not an http(s) URL; give the collector's "
            "metrics URL, e.g. 'http://collector:4318/v1/metrics'"
        )
    if parts.path in ("", "/"):
        return urllib.parse.urlunsplit(parts._replace(path=METRICS_PATH))
    return endpoint


def otlp_metrics(snapshot: MetricsSnapshot, prefix: str) -> Iterator[Metric]:
    """The SDK metrics of ``snapshot``'s totals, one per iterflow metric that has a value."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        Metric,
        Sum,
    )

    cumulative = AggregationTemporality.CUMULATIVE
    for name, result in sorted(snapshot.metrics.items()):
        points = list(_points(snapshot, result))
        if not points:  # a gauge never set
            continue
        data: Any
        if result.kind == "counter":
            data = Sum(data_points=points, aggregation_temporality=cumulative, is_monotonic=True)
        elif result.kind == "distribution":
            data = Histogram(data_points=points, aggregation_temporality=cumulative)
        else:
            data = Gauge(data_points=points)
        yield Metric(
            name=prefix + name, description=f"iterflow {result.kind} '{name}'", unit="", data=data
        )


def _points(snapshot: MetricsSnapshot, result: MetricResult) -> Iterator[Any]:
    """The committed and attempted points of one metric; a value of None has none."""
    from opentelemetry.sdk.metrics.export import HistogramDataPoint, NumberDataPoint

    # Totals count from the run's start: the start of every cumulative point.
    start = _nanos(snapshot.started_at or snapshot.time)
    now = _nanos(snapshot.time)
    for state in STATES:
        value = getattr(result, state)
        attributes = {"iterflow.iteration": snapshot.iteration, "iterflow.state": state}
        if isinstance(value, DistributionValue):
            # One bucket, no bounds: what a distribution keeps (count, sum, min, max) is all
            # the histogram says; min and max stay unset while it received nothing.
            yield HistogramDataPoint(
                attributes=attributes,
                start_time_unix_nano=start,
                time_unix_nano=now,
                count=value.count,
                sum=value.sum,
                bucket_counts=[value.count],
                explicit_bounds=[],
                min=value.min,  # type: ignore[arg-type]
                max=value.max,  # type: ignore[arg-type]
            )
        elif value is not None:
            yield NumberDataPoint(
                attributes=attributes,
                start_time_unix_nano=start,
                time_unix_nano=now,
                value=value,
            )


def _nanos(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _iterflow_version() -> str | None:
    try:
        return metadata.version("iterflow")
    except metadata.PackageNotFoundError:  # run from a source tree
        return None


def _import_exporter() -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as error:
        raise IterflowError(
            "OtlpSink needs the OpenTelemetry SDK and its OTLP/HTTP exporter, which are not "
            "installed: pip install 'iterflow[otlp]'"
        ) from error
    return OTLPMetricExporter
