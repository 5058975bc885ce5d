"""A run shown in a notebook: its history as a pandas frame and as an HTML table, a
result's or a query's summary, and the plot of ``iterflow plot``. Pure Python.

The history of a run (``RoundProgress`` records) becomes the events its event log
would hold, so the table of ``iterflow report`` and the curve of ``iterflow plot``
are drawn by the same code from either.

Example::

    history_frame(history_events(result.history, iteration="pagerank"))
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from iterflow.progress.event_log import progress_to_dict, termination_to_dict
from iterflow.progress.plot import plot_events
from iterflow.progress.table import _cell, round_table
from iterflow.reports import RoundProgress, Termination

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: The rounds an HTML history shows at most: the first and last half of them.
SHOWN_ROUNDS = 20


class History(list[RoundProgress]):
    """A run's ``RoundProgress`` records, oldest first: a list that a notebook shows as a
    table (``_repr_html_``) and that :meth:`frame` turns into a pandas DataFrame."""

    def frame(self) -> pd.DataFrame:
        """One row per round, with the columns of ``iterflow report``."""
        return history_frame(history_events(self))

    def _repr_html_(self) -> str:
        return history_html(history_events(self))


def history_events(
    history: Iterable[RoundProgress],
    *,
    iteration: str = "",
    termination: Termination | None = None,
    rounds: int | None = None,
) -> list[dict[str, Any]]:
    """The events a run with this ``history`` wrote to its event log: its start, one
    ``round_end`` per round and, with ``termination``, its end after ``rounds``."""
    run = "history"  # one run: any id does
    events: list[dict[str, Any]] = [
        {"event": "iteration_started", "run_id": run, "iteration": iteration}
    ]
    events += [{"event": "round_end", "run_id": run, **progress_to_dict(p)} for p in history]
    if termination is not None:
        events.append(
            {
                "event": "iteration_terminated",
                "run_id": run,
                "termination": termination_to_dict(termination),
                "rounds": rounds,
            }
        )
    return events


def history_frame(events: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The round table of ``iterflow report`` for ``events``: one row per round, a
    column per value some round has (missing values are NaN)."""
    import pandas as pd

    header, rows = round_table(events)
    return pd.DataFrame(rows, columns=header)


def plot_history(
    events: Sequence[Mapping[str, Any]],
    *,
    metric: str | None = None,
    log_y: bool = False,
    output: str | None = None,
) -> Figure:
    """``iterflow plot``'s figure of ``events``, also saved to ``output`` when given.

    A notebook shows the figure as an image: made without pyplot, it would otherwise
    show as its ``repr`` unless pyplot's inline backend happens to be on (whose
    formatter, when on, IPython prefers to ``_repr_png_``)."""
    figure = plot_events(events, metric=metric, log_y=log_y, output=output)
    figure._repr_png_ = partial(_png, figure)  # type: ignore[attr-defined]
    return figure


def _png(figure: Figure) -> bytes:
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    return image.getvalue()


def history_html(events: Sequence[Mapping[str, Any]]) -> str:
    """The round table of ``events`` in HTML, without each step's seconds; a long run
    shows its first and last ``SHOWN_ROUNDS // 2`` rounds."""
    header, rows = round_table(events)
    keep = [i for i, name in enumerate(header) if not name.startswith("seconds.")]
    half = SHOWN_ROUNDS // 2
    cut = len(rows) > SHOWN_ROUNDS
    shown = [*rows[:half], None, *rows[-half:]] if cut else rows
    lines = ["<table>", _row("th", [header[i] for i in keep])]
    for row in shown:
        cells = ["…"] * len(keep) if row is None else [_cell(row[i]) for i in keep]
        lines.append(_row("td", cells))
    lines.append("</table>")
    return "\n".join(lines)


def summary_html(title: str, fields: Mapping[str, Any], history: str) -> str:
    """A notebook's view of a run: ``title``, a two-column table of ``fields`` (those
    that are None are left out) and the ``history`` table (HTML) below."""
    lines = [f"<div><strong>{html.escape(title)}</strong>", "<table>"]
    lines += [
        f"<tr><th style='text-align:left'>{html.escape(name)}</th>"
        f"<td style='text-align:left'>{html.escape(str(value))}</td></tr>"
        for name, value in fields.items()
        if value is not None
    ]
    lines += ["</table>", "<details open><summary>rounds</summary>", history, "</details></div>"]
    return "\n".join(lines)


def _row(tag: str, cells: Sequence[str]) -> str:
    inner = "".join(f"<{tag}>{html.escape(str(cell))}</{tag}>" for cell in cells)
    return f"<tr>{inner}</tr>"
