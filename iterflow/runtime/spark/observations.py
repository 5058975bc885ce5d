"""Reading what a DataFrame observation (``DataFrame.observe``) counted, without waiting
for it: the round's row counts, read by materialization and by progress sampling."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Observation

from iterflow.runtime.spark.jvm import observation_ready


def observed_metrics(observation: Observation) -> dict[str, Any] | None:
    """Every metric ``observation`` holds, or None when Spark never (fully) evaluated it."""
    if not observation_ready(observation):
        return None
    try:
        return dict(observation.get)
    except Exception:  # pruned by the optimizer: Spark completes it with an error
        return None


def observed_rows(observation: Observation) -> int | None:
    """Rows counted by ``observation``, or None when Spark never (fully) evaluated it."""
    metrics = observed_metrics(observation)
    return None if metrics is None else int(metrics["rows"])
