"""Progress of an iteration: round records and listener dispatch. Never imports Spark."""

from iterflow.progress.listeners import (
    Emitter,
    IterationEnd,
    ListenerSet,
    RoundEnd,
    RoundListener,
)
from iterflow.progress.round import RoundProgress

__all__ = ["Emitter", "IterationEnd", "ListenerSet", "RoundEnd", "RoundListener", "RoundProgress"]
