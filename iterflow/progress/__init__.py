"""Progress of an iteration: listener dispatch, the progress bar, the event log, the
estimate of what remains, reports and plots. Never imports Spark."""

from iterflow.progress.listeners import (
    Emitter,
    IterationEnd,
    ListenerSet,
    RoundEnd,
    RoundListener,
)
from iterflow.reports import RoundProgress, RoundSample

__all__ = [
    "Emitter",
    "IterationEnd",
    "ListenerSet",
    "RoundEnd",
    "RoundListener",
    "RoundProgress",
    "RoundSample",
]
