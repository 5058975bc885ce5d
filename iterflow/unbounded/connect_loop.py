"""The epoch loop of an unbounded iteration over Spark Connect, beside the server.

Under Spark Connect the client has no JVM, and ``foreachBatch`` runs its function in a
Python process that the server starts next to itself (one per query, alive while the
query runs; its micro-batches arrive there as DataFrames of a session cloned from the
client's). ``BesideServer`` is that function: ``start()`` pickles it with the
iteration (body, bindings, sinks, listeners, metric sinks) and the options it
decided; at its first micro-batch it builds the epoch loop there, as ``start()`` does
on a classic session, continued from the epoch log, and from then on runs every
micro-batch's epochs and commits them before the call returns (so before Spark
commits the micro-batch: exactly once, as on a classic session).

Nobody calls that process while the stream is idle, so each call also drains the work
feedback its epochs leave (and fires the windows that are due) before it returns.
The end of the iteration (the last epochs once the inputs have ended, or the commit
after ``stop()``, then the listeners' ``iteration_terminated``) runs the same way in
a second, one-micro-batch query that the client starts once the stream is over
(``ending``): see ``connect_query``.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession

from iterflow.body import IterationBody
from iterflow.progress.listeners import ListenerSet
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.spark.files import LocalFiles
from iterflow.runtime.spark.jvm import in_session
from iterflow.unbounded.epochs import EpochLoop, EpochOptions, windows_due

#: Under the checkpoint location: what the loop beside the server leaves for the client
#: (``FAILURE``: the error that failed it) and the one-micro-batch queries that end it.
CONNECT_DIR = "connect"
FAILURE = "failure.pkl"
#: How many errors of a failure's chain of causes reach the client.
MAX_CAUSES = 8


class Iteration(Protocol):
    """What the loop beside the server, and the client's handle, ask of the
    ``UnboundedIteration`` they run."""

    _body: IterationBody
    _listeners: ListenerSet
    _sinks_by_output: dict[str, Sink]

    @property
    def _state_names(self) -> frozenset[str]: ...

    def _described(
        self, inputs: Mapping[str, DataFrame], streams: tuple[str, ...]
    ) -> dict[str, dict[str, Any]]: ...

    def opened(
        self,
        spark: SparkSession,
        inputs: Mapping[str, DataFrame],
        streams: tuple[str, ...],
        launch: Launch,
        *,
        check_stream: bool = True,
        announce: bool = True,
    ) -> tuple[EpochLoop, int | None]: ...


@attrs.frozen(kw_only=True)
class Launch:
    """What ``start()`` decided that the epoch loop is built with, wherever it runs."""

    location: str  # the checkpoint location
    options: EpochOptions
    progress: bool | None
    event_log: str | None
    progress_interval_s: float
    event_log_progress_s: float
    run_id: str | None = None  # the run's id in the event log; None: a new one


@attrs.define(kw_only=True)
class BesideServer:
    """The ``foreachBatch`` function of an unbounded iteration over Spark Connect: the
    epoch loop, built at the first call in the process that runs it. With ``ending``
    set, it ends the iteration instead (whatever micro-batch it is given)."""

    iteration: Iteration
    inputs: Mapping[str, DataFrame]  # as bound on the client; re-planned in each session
    streams: tuple[str, ...]
    launch: Launch
    ending: str | None = None
    _loop: EpochLoop | None = attrs.field(default=None, init=False, repr=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._run(batch, batch_id)
        except BaseException as exc:  # building the loop too (a lease, a checkpoint)
            leave_failure(self.launch.location, exc)
            raise

    def _run(self, batch: DataFrame, batch_id: int) -> None:
        loop = self._ready(batch.sparkSession)
        try:
            if self.ending is None:
                loop.on_batch(batch, batch_id)
                # Nobody calls while the stream is idle: what the epochs fed back drains now.
                while loop.in_flight > 0 or windows_due(loop.event_time):
                    loop.drain_idle()
            else:
                self._end(loop, self.ending)
        except BaseException as exc:
            self._loop = None
            try:
                loop.failed(exc)
            finally:
                loop.close()
            raise

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the loop: a copy builds its own where it runs."""
        return {
            "iteration": self.iteration,
            "inputs": dict(self.inputs),
            "streams": self.streams,
            "launch": self.launch,
            "ending": self.ending,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in {**state, "_loop": None}.items():
            object.__setattr__(self, name, value)

    def _ready(self, spark: SparkSession) -> EpochLoop:
        """The loop, built for ``spark`` (the micro-batches' session) at the first call."""
        if self._loop is not None and self._loop.spark is spark:
            return self._loop
        if self._loop is not None:  # the query's session changed: start over from the log
            self._loop.close()
            self._loop = None
        inputs = {name: in_session(df, spark) for name, df in self.inputs.items()}
        self._loop, _ = self.iteration.opened(
            spark,
            inputs,
            self.streams,
            self.launch,
            check_stream=False,
            announce=self.ending is None,  # the end continues the run the epochs began
        )
        return self._loop

    def _end(self, loop: EpochLoop, reason: str) -> None:
        """The end the client saw: the epochs left after the inputs ended, or the commit of
        the last epoch after ``stop()``; then listeners and observers are told."""
        if reason == "inputs_ended":
            loop.finish()
        else:
            loop.flush()
        loop.terminate(reason)
        self._loop = None
        loop.close()


def failure_path(location: str) -> str:
    """Where the loop beside the server leaves the error that failed it."""
    return f"{location}/{CONNECT_DIR}/{FAILURE}"


def leave_failure(location: str, error: BaseException) -> None:
    """Leave ``error`` for the client, with the errors it was raised from (``__cause__``):
    each one's class, arguments and attributes, pickled (the stream's own error carries
    only their text). Best effort: the text is still there."""
    chain: list[tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]] = []
    current: BaseException | None = error
    while current is not None and len(chain) < MAX_CAUSES:
        chain.append(_portable(current))
        current = current.__cause__
    try:
        raw = cloudpickle.dumps(chain)
    except Exception:  # a class that does not pickle: the text is all there is
        return
    LocalFiles().write_bytes(failure_path(location), raw, atomic=True)


def _portable(error: BaseException) -> tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]:
    """``error``'s class, arguments and attributes; its arguments as text when they or
    its attributes do not pickle."""
    state = (type(error), error.args, dict(getattr(error, "__dict__", {})))
    try:
        cloudpickle.dumps(state)
    except Exception:
        return type(error), tuple(map(str, error.args)), {}
    return state


def left_failure(location: str) -> BaseException | None:
    """The error ``leave_failure`` left, and its causes, rebuilt without calling their
    classes' ``__init__`` (whose arguments are not their ``args``); None when there is
    none or it does not load."""
    files = LocalFiles()
    path = failure_path(location)
    if not files.exists(path):
        return None
    rebuilt: list[BaseException] = []
    try:
        for kind, args, attributes in pickle.loads(files.read_bytes(path)):
            error: BaseException = BaseException.__new__(kind)
            error.args = args
            error.__dict__.update(attributes)
            rebuilt.append(error)
    except Exception:
        return None
    for error, cause in itertools.pairwise(rebuilt):
        error.__cause__ = cause
    return rebuilt[0] if rebuilt else None
