"""What metrics report: per-round values, run totals and the snapshots sinks receive.

Pure Python, like the rest of ``iterflow.metrics`` but its Spark bridge.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import attrs

from iterflow.reports import RoundProgress

Kind = Literal["counter", "distribution", "gauge"]
KINDS: tuple[Kind, ...] = ("counter", "distribution", "gauge")


@attrs.frozen(kw_only=True)
class DistributionValue:
    """What a distribution received: ``count``, ``sum``, ``min``, ``max`` and ``mean``.

    ``min``, ``max`` and ``mean`` are None while ``count`` is 0.
    """

    count: int = 0
    sum: float = 0.0
    min: float | None = None
    max: float | None = None

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
        }


#: The value of one metric: a counter's int, a distribution's summary, a gauge's
#: latest value (None before the first ``set``).
Value = int | float | DistributionValue | None


@attrs.frozen(kw_only=True)
class MetricResult:
    """Totals of one metric over a run.

    ``committed`` counts the updates of rounds that completed; ``attempted`` adds
    the updates of rounds that failed or were rolled back. Spark drops the
    updates of failed task attempts, so a task retry changes neither.
    """

    kind: Kind
    committed: Value
    attempted: Value


def number_fields(value: Value) -> list[tuple[str, int | float | None]]:
    """(name suffix, number) pairs of one value, as flat sinks report it: a distribution
    has five (``.count``, ``.sum``, ``.min``, ``.max``, ``.mean``)."""
    if isinstance(value, DistributionValue):
        return [(f".{field}", number) for field, number in value.to_dict().items()]
    return [("", value)]


def value_to_json(value: Value) -> Any:
    """``value`` as JSON-ready data: distributions become objects, the rest stays."""
    return value.to_dict() if isinstance(value, DistributionValue) else value


@attrs.frozen(kw_only=True)
class MetricsSnapshot:
    """The metrics of a run at one moment, as pushed to sinks.

    ``epoch`` is the last completed round (None before round 0 completes);
    ``final`` is True for the push made when the run ends; ``metrics`` are the
    run's totals. For sinks that record each round: ``rounds`` holds the rounds
    that ended since the previous push to the receiving sink (at its first push,
    every round so far), in the order they ended, each with its metric values;
    ``parameters`` is what the run started with, as its ``iteration_started``
    event tells it (``inputs``, ``conditions``, ``resumed_from``), empty when
    the push came before the run started; ``started_at`` is when the run began
    (None in snapshots made by hand), the start of the totals for sinks that need one.
    """

    iteration: str
    run_id: str
    time: datetime
    epoch: int | None
    final: bool
    metrics: Mapping[str, MetricResult]
    rounds: tuple[RoundProgress, ...] = ()
    parameters: Mapping[str, Any] = attrs.field(factory=dict)
    started_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, the body of ``HttpJsonSink`` posts and ``JsonLinesSink`` lines:
        the totals, without ``rounds`` and ``parameters`` (the event log has those)."""
        return {
            "time": self.time.isoformat(),
            "iteration": self.iteration,
            "run_id": self.run_id,
            "epoch": self.epoch,
            "final": self.final,
            "metrics": results_to_json(self.metrics),
        }


def results_to_json(metrics: Mapping[str, MetricResult]) -> dict[str, Any]:
    """Run totals as JSON-ready data: name -> {"kind", "committed", "attempted"}."""
    return {
        name: {
            "kind": result.kind,
            "committed": value_to_json(result.committed),
            "attempted": value_to_json(result.attempted),
        }
        for name, result in sorted(metrics.items())
    }
