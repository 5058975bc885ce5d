"""The value a bounded iteration returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
from pyspark.sql import DataFrame

from iterflow.progress.display import (
    History,
    history_events,
    history_frame,
    history_html,
    plot_history,
    summary_html,
)
from iterflow.progress.table import ending
from iterflow.reports import Rollback, Termination
from iterflow.runtime.round.materialize import release

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


@attrs.frozen(kw_only=True)
class IterationResult:
    """Outputs of the last round, how the iteration ended, and its per-round history.

    ``outputs`` are materialized and stay valid until :meth:`release`. ``rollbacks``
    lists the times this ``run()`` went back to a durable checkpoint after losing data
    Spark could not recompute (also on the ``RoundProgress.rollback`` of the round run
    first after each). ``iteration`` is the body's name. In a notebook the result shows
    as a table (how it ended, then a row per round).
    """

    outputs: Mapping[str, DataFrame]
    rounds: int
    termination: Termination
    history: History = attrs.field(converter=History)
    emitted: dict[str, list[Any]]
    metrics: dict[str, Any] = attrs.field(factory=dict)
    resumed_from: int | None = None
    rollbacks: list[Rollback] = attrs.field(factory=list)
    iteration: str = ""

    def release(self) -> None:
        """Free the memory held by ``outputs``; they cannot be read afterwards."""
        for df in {id(df): df for df in self.outputs.values()}.values():
            release(df)

    def history_frame(self) -> pd.DataFrame:
        """The history as a pandas DataFrame: one row per round, with the columns of
        ``iterflow report`` (``epoch``, ``seconds``, ``rows.<name>``, ``converged``, ...,
        then each user metric)."""
        return history_frame(self._events())

    def plot(
        self, metric: str | None = None, *, log_y: bool = False, output: str | None = None
    ) -> Figure:
        """The curve ``iterflow plot`` draws: ``metric`` (``converged_value`` by default,
        or any column name ``iterflow plot --metric`` takes) per round, on a logarithmic
        axis with ``log_y``, saved to the image file ``output`` when given. Needs
        matplotlib (``pip install iterflow[plot]``)."""
        return plot_history(self._events(), metric=metric, log_y=log_y, output=output)

    def _events(self) -> list[dict[str, Any]]:
        return history_events(
            self.history, iteration=self.iteration, termination=self.termination, rounds=self.rounds
        )

    def _repr_html_(self) -> str:
        events = self._events()
        fields = {
            "termination": ending(events),
            "reasons": ", ".join(self.termination.reasons),
            "rounds": self.rounds,
            "outputs": ", ".join(self.outputs) or None,
            "resumed from epoch": self.resumed_from,
            "rollbacks": len(self.rollbacks) or None,
        }
        title = f"IterationResult of '{self.iteration}'" if self.iteration else "IterationResult"
        return summary_html(title, fields, history_html(events))
