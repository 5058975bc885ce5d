"""The value a bounded iteration returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from pyspark.sql import DataFrame

from iterflow.reports import Rollback, RoundProgress, Termination
from iterflow.runtime.round.materialize import release


@attrs.frozen(kw_only=True)
class IterationResult:
    """Outputs of the last round, how the iteration ended, and its per-round history.

    ``outputs`` are materialized and stay valid until :meth:`release`. ``rollbacks``
    lists the times this ``run()`` went back to a durable checkpoint after losing data
    Spark could not recompute (also on the ``RoundProgress.rollback`` of the round run
    first after each).
    """

    outputs: Mapping[str, DataFrame]
    rounds: int
    termination: Termination
    history: list[RoundProgress]
    emitted: dict[str, list[Any]]
    metrics: dict[str, Any] = attrs.field(factory=dict)
    resumed_from: int | None = None
    rollbacks: list[Rollback] = attrs.field(factory=list)

    def release(self) -> None:
        """Free the memory held by ``outputs``; they cannot be read afterwards."""
        for df in {id(df): df for df in self.outputs.values()}.values():
            release(df)
