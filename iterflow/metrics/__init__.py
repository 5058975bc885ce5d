"""User metrics: counters, distributions and gauges, per run, with sinks.

Create metrics on the driver, update them there or inside functions that run on
executors (UDFs, ``mapInPandas``, ``mapInArrow``) that captured them::

    seen = itf.metrics.counter("rows_seen")

    @F.udf("long")
    def plus_one(x):
        seen.inc()
        return x + 1

    result = it.push_metrics(itf.metrics.JsonLinesSink("metrics.jsonl")).run()
    result.metrics["rows_seen"].committed

Everything here is pure Python but the Spark bridge, which the round loops load.
"""

from iterflow.metrics.mlflow_sink import MlflowSink
from iterflow.metrics.otlp_sink import OtlpSink
from iterflow.metrics.registry import (
    Counter,
    Distribution,
    Gauge,
    Metric,
    counter,
    distribution,
    gauge,
)
from iterflow.metrics.sinks import (
    DeliveryError,
    GraphiteSink,
    HttpJsonSink,
    JsonLinesSink,
    MetricsSink,
    PrometheusSink,
)
from iterflow.metrics.values import DistributionValue, MetricResult, MetricsSnapshot

__all__ = [
    "Counter",
    "DeliveryError",
    "Distribution",
    "DistributionValue",
    "Gauge",
    "GraphiteSink",
    "HttpJsonSink",
    "JsonLinesSink",
    "Metric",
    "MetricResult",
    "MetricsSink",
    "MetricsSnapshot",
    "MlflowSink",
    "OtlpSink",
    "PrometheusSink",
    "counter",
    "distribution",
    "gauge",
]
