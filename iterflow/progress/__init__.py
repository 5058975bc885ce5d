"""Progress of an iteration: listener dispatch, the progress bar, the event log, the
estimate of what remains, tables and plots. Never imports Spark.

Public as ``itf.progress`` for reading what runs wrote (what ``iterflow report``,
``iterflow plot`` and ``iterflow.testing`` use): ``read_events(path)`` reads an event
log, ``format_report(events)`` makes its table per round, ``plot_events(events, ...)``
draws its curves (matplotlib), ``round_values(event)`` and ``metric_points(events, name)``
read one round's values and one metric's series, ``progress_to_dict(progress)`` is a
``RoundProgress`` as its event-log line holds it; ``main_run(events)``,
``ordered_rounds(events)`` and ``final_event(events)`` are the run the others are nested
in, every round in report order, and how the run ended (what ``iterflow report --format
json`` writes). ``History`` is a run's list of ``RoundProgress`` (``result.history``),
shown as a table in a notebook; its ``frame()`` is that table as a pandas DataFrame."""

from iterflow.progress.display import History
from iterflow.progress.event_log import main_run, ordered_rounds, progress_to_dict, read_events
from iterflow.progress.listeners import (
    Emitter,
    IterationEnd,
    ListenerSet,
    RoundEnd,
    RoundListener,
)
from iterflow.progress.plot import plot_events
from iterflow.progress.table import final_event, format_report, metric_points, round_values
from iterflow.reports import RoundProgress, RoundSample

__all__ = [
    "Emitter",
    "History",
    "IterationEnd",
    "ListenerSet",
    "RoundEnd",
    "RoundListener",
    "RoundProgress",
    "RoundSample",
    "final_event",
    "format_report",
    "main_run",
    "metric_points",
    "ordered_rounds",
    "plot_events",
    "progress_to_dict",
    "read_events",
    "round_values",
]
