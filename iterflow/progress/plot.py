"""A per-round curve of one run of the event log, drawn with matplotlib.

matplotlib is an optional dependency (``pip install iterflow[plot]``), imported
only when a plot is drawn. The figure is made without pyplot, so drawing
neither needs a display nor touches pyplot's global state.

Example::

    plot_events(read_events("logs/pagerank.jsonl"), log_y=True).savefig("pagerank.png")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from iterflow.errors import IterflowError
from iterflow.progress.event_log import round_ends
from iterflow.progress.table import ending, metric_points, round_values

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def plot_events(
    events: Sequence[Mapping[str, Any]],
    *,
    metric: str | None = None,
    log_y: bool = False,
    output: str | None = None,
) -> Figure:
    """A figure with one point per round that has a value of ``metric``, against the epoch;
    with ``output`` also written to that image file (its suffix picks the format).

    ``metric`` is ``converged_value`` by default, or any name :func:`round_values`
    gives: ``duration_s``, ``eta_s``, ``rounds_remaining_estimate``, ``rows.<name>``,
    ``observed.<name>`` or a user metric (a distribution plots its mean).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise IterflowError("plotting needs matplotlib: pip install iterflow[plot]") from None
    name = metric or "converged_value"
    rounds = [(e["epoch"], round_values(e)) for e in round_ends(events)]
    points = metric_points(rounds, name)
    started = next((e for e in events if e["event"] == "iteration_started"), {})
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3)
    if log_y:
        axes.set_yscale("log")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("epoch")
    axes.set_ylabel(name)
    axes.set_title(f"{started.get('iteration', '?')}: {name} per round ({ending(events)})")
    axes.grid(True, alpha=0.3)
    if output is not None:
        save_figure(figure, output)
    return figure


def save_figure(figure: Figure, output: str) -> None:
    """Write ``figure`` to the image file ``output`` (its suffix picks the format)."""
    try:
        figure.savefig(output, dpi=120)
    except (OSError, ValueError) as error:  # an unwritable path, an unknown image format
        raise IterflowError(
            f"cannot write '{output}': {getattr(error, 'strerror', None) or error}; "
            "pick a writable path ending in .png, .svg or .pdf"
        ) from None
