"""An unbounded iteration started from a Spark Connect client: its stream, and its handle.

The epochs run beside the server (``connect_loop``); the client holds the
``StreamingQuery`` and an ``UnboundedQuery`` over it (``ConnectQuery``). What the
handle shows about the epochs (``history``, ``emitted``, ``metrics``, the ``"iterflow"``
entries of ``lastProgress`` and ``status``) comes from the epoch log, which the client
reads where the server writes it (over Connect the checkpoint location is a directory
both see at the same path): the last commit, so once per micro-batch. Once the stream
is over, the handle ends the iteration beside the server with a second query of one
micro-batch, and reports how it ended.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NoReturn

import attrs
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from iterflow.errors import IterflowError, IterflowValueError
from iterflow.progress.display import History
from iterflow.reports import RoundProgress, Termination
from iterflow.runtime.checkpoint.format import DriverState, fingerprint
from iterflow.runtime.checkpoint.store import CheckpointStore
from iterflow.runtime.checkpoint.writer import CheckpointOptions, resumable
from iterflow.runtime.progresstrack.observers import committed_metrics
from iterflow.runtime.spark.files import LocalFiles, files_for
from iterflow.unbounded.connect_loop import (
    CONNECT_DIR,
    BesideServer,
    failure_path,
    left_failure,
)
from iterflow.unbounded.epoch_log import StreamPosition
from iterflow.unbounded.epochs import RECENT_EPOCHS, EpochOptions
from iterflow.unbounded.inputs import combined
from iterflow.unbounded.query import POLL_S, UnboundedQuery
from iterflow.unbounded.rewind import EPOCHS_DIR, STREAM_DIR, check_stream_checkpoint

#: Under the checkpoint location's ``CONNECT_DIR``: the one-micro-batch queries that end
#: an iteration.
ENDS_DIR = "ends"
#: How often the handle looks for a new commit in the epoch log while the stream runs.
REFRESH_S = 0.5
#: How long a failed stream may take to leave the session's active streams (seconds).
GONE_S = 5.0
#: A line of a Python traceback that names the exception raised, and its message.
RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Warning)): (.*)$", re.MULTILINE)


def started(
    spark: SparkSession,
    beside: BesideServer,
    triggered: Callable[[Any], Any],
    checkpoints: CheckpointOptions,
    available_now: bool,
    query_name: str | None,
) -> ConnectQuery:
    """Start the stream of ``beside`` (the epoch loop to build beside the Connect server)
    from the client ``spark``: its handle. What a classic ``start()`` refuses before its
    stream starts (a damaged commit, another iteration's checkpoints, a streaming
    checkpoint out of step) is refused here too, from the client."""
    iteration = beside.iteration
    _check_connect(beside.launch.options.commit_interval_s, beside.launch.progress)
    # One run id for the processes that run the epochs and the end: one run in the log.
    launch = beside.launch = attrs.evolve(beside.launch, run_id=uuid.uuid4().hex[:12])
    view = EpochLogView(spark, launch.location, iteration._state_names, launch.options)
    described = iteration._described(beside.inputs, beside.streams)
    checkpoint = resumable(
        view.store,
        checkpoints,
        fingerprint(iteration._body.name, described),
        strict=checkpoints.strict,
    )
    view.driver = None if checkpoint is None else checkpoint.driver
    check_stream_checkpoint(
        spark,
        launch.location,
        batch_id=view.batch_id,
        epoch=view.epoch,
        resumed=checkpoint is not None,
        sinks=iteration._sinks_by_output.values(),
    )
    LocalFiles().delete(failure_path(launch.location))  # an earlier run's
    stream = triggered(_writer(beside, query_name)).start()
    return ConnectQuery(
        beside,
        stream,
        view,
        spark,
        available_now=bool(available_now),
        resumed_from=None if checkpoint is None else view.epoch,
    )


def _writer(beside: BesideServer, query_name: str | None) -> Any:
    """The stream's writer: ``beside`` pickled as its ``foreachBatch`` function."""
    streams = combined({name: beside.inputs[name] for name in beside.streams})
    try:
        writer = streams.writeStream.foreachBatch(beside)
    except Exception as exc:  # what cloudpickle cannot send to the server
        raise IterflowError(
            f"UnboundedIteration '{beside.iteration._body.name}' over Spark Connect: its body, "
            "bindings, sinks, listeners and metric sinks are pickled to the foreachBatch "
            f"process beside the server, and one of them does not pickle ({exc}). Keep "
            "them free of open files, locks, sockets and sessions"
        ) from exc
    writer = writer.option("checkpointLocation", f"{beside.launch.location}/{STREAM_DIR}")
    return writer if query_name is None else writer.queryName(query_name)


def _check_connect(commit_interval_s: float | None, progress: bool | None) -> None:
    """What ``start()`` refuses over Spark Connect, and why."""
    if commit_interval_s is not None:
        raise IterflowValueError(
            f"start(commit_interval_s={commit_interval_s}) over Spark Connect: the epoch "
            "loop runs in the foreachBatch process beside the server, which Spark stops "
            "with its query, so commits written later could be lost with it; leave "
            "commit_interval_s=None (every micro-batch commits before it returns)"
        )
    if progress:
        raise IterflowValueError(
            "start(progress=True) over Spark Connect: the epochs run beside the server, "
            "where no one sees a progress bar; watch query.lastProgress, query.history or "
            "an event_log= instead"
        )


class EpochLogView:
    """The epoch log of an iteration whose loop runs elsewhere, read where it is written:
    its last commit whole (``CheckpointStore.newest``)."""

    def __init__(
        self,
        spark: SparkSession,
        location: str,
        state_names: frozenset[str],
        options: EpochOptions,
    ) -> None:
        self.store = CheckpointStore(spark, f"{location}/{EPOCHS_DIR}")
        self._state_names = state_names
        self._keep = RECENT_EPOCHS if options.keep_history is None else options.keep_history
        self._lock = threading.Lock()
        self._read: int | None = None  # the epoch read last
        self.driver: DriverState | None = None

    def refresh(self) -> bool:
        """Read the last commit, when a newer one may be there; True when one was read."""
        with self._lock:
            epochs = self.store.epochs()
            if not epochs or epochs[-1] == self._read:
                return False
            checkpoint = self.store.newest()
            if checkpoint is None or checkpoint.epoch == self._read:
                return False
            self.driver, self._read = checkpoint.driver, checkpoint.epoch
            return True

    @property
    def _position(self) -> StreamPosition | None:
        return None if self.driver is None else self.driver.stream

    @property
    def epoch(self) -> int:
        """The epoch of the last commit (-1 before the first)."""
        return -1 if self._position is None else self._position.epoch

    @property
    def batch_id(self) -> int:
        """The last micro-batch the last commit consumed (-1 before the first)."""
        return -1 if self._position is None else self._position.batch_id

    @property
    def in_flight(self) -> int:
        """Work feedback rows the last commit left in flight."""
        rows = {} if self._position is None else self._position.rows
        return sum(n for name, n in rows.items() if name not in self._state_names)

    @property
    def history(self) -> list[RoundProgress]:
        """The epochs the run keeps (``keep_history``), oldest first."""
        return [] if self.driver is None else list(self.driver.history[-self._keep :])

    @property
    def emitted(self) -> dict[str, list[Any]]:
        return {} if self.driver is None else {k: list(v) for k, v in self.driver.emitted.items()}

    def metrics(self) -> dict[str, Any]:
        """The user metrics' totals at the last commit (name -> ``MetricResult``)."""
        return committed_metrics(self.driver.metrics if self.driver is not None else None)


class ConnectQuery(UnboundedQuery):
    """The handle of an unbounded iteration whose epochs run beside a Spark Connect server.

    It answers as ``UnboundedQuery`` does. What it shows of the epochs is the last
    commit of the epoch log (a micro-batch's epochs appear once they are committed).
    The watcher follows the stream; once it is over (its inputs ended, or ``stop()``),
    the watcher ends the iteration beside the server and records how it ended.
    """

    def __init__(
        self,
        beside: BesideServer,
        stream: StreamingQuery,
        view: EpochLogView,
        spark: SparkSession,
        *,
        available_now: bool,
        resumed_from: int | None,
    ) -> None:
        self._beside = beside
        self._spark = spark
        self._view = view
        name = beside.iteration._body.name
        self._follow(name, stream, available_now, resumed_from, threading.Event())

    # -- what the epoch log shows ----------------------------------------------------------

    @property
    def history(self) -> History:
        """Per-epoch progress of the committed epochs, oldest first (``UnboundedQuery``)."""
        return History(self._view.history)

    @property
    def emitted(self) -> dict[str, list[Any]]:
        """Values listeners emitted beside the server, as committed."""
        return self._view.emitted

    @property
    def metrics(self) -> dict[str, Any]:
        """The user metrics' totals, as committed."""
        return self._view.metrics()

    def _position(self) -> dict[str, Any]:
        view = self._view
        return {
            "epoch": view.epoch,
            "committed_epoch": view.epoch,
            "commit_in_flight": False,
            "batch_id": view.batch_id,
            "feedback_rows_in_flight": view.in_flight,
        }

    # -- waiting and stopping ----------------------------------------------------------------

    def _settle(self) -> None:
        """Each micro-batch drains its feedback beside the server before it returns: once
        the stream has processed what is available, the epoch log has it all."""
        self._refresh()

    def _inside(self) -> bool:
        return threading.current_thread() is self._watcher

    def _between_batches(self) -> None:
        """Return once no micro-batch runs (or the query is over): a micro-batch stopped
        halfway is not lost (it runs again after a restart), but its epochs would run
        twice. ``stop()`` then ends the iteration beside the server (listeners'
        ``iteration_terminated`` runs there)."""
        while not self._done.is_set():
            with contextlib.suppress(Exception):  # the query is gone: nothing runs
                if not self._stream.status.get("isTriggerActive"):
                    return
            self._done.wait(POLL_S / 2)

    # -- the watcher ----------------------------------------------------------------------------

    def _watch(self) -> None:
        try:
            waited = 0.0
            while True:
                try:
                    if self._stream.awaitTermination(POLL_S):  # type: ignore[arg-type]
                        break
                except Exception as exc:
                    self._raise_failure(exc)
                waited += POLL_S
                if waited >= REFRESH_S:
                    self._refresh()
                    waited = 0.0
            reason = "stopped" if self._stop_asked.is_set() else "inputs_ended"
            self._end(reason)
            self._refresh()
            self._termination = Termination(
                reason=reason, epoch=self._view.epoch, reasons=(reason,)
            )
        except BaseException as exc:
            self._error = exc
            with contextlib.suppress(Exception):
                self._stream.stop()
            self._gone()
        finally:
            with contextlib.suppress(Exception):
                self._refresh()
            self._done.set()

    def _refresh(self) -> None:
        """Read the last commit; the listener objects registered on the client take the
        state their copies beside the server committed (``state_dict()`` or ``__dict__``,
        as a restart restores it), so that what a listener collects shows here too."""
        if self._view.refresh() and self._view.driver is not None:
            self._beside.iteration._listeners.load_state(self._view.driver.listeners)

    def _gone(self) -> None:
        """Wait (a few seconds at most) until the failed stream has left the session's
        active streams, as a stopped one has when ``stop()`` returns."""
        deadline = time.monotonic() + GONE_S
        with contextlib.suppress(Exception):
            while time.monotonic() < deadline and any(
                s.id == self._stream.id for s in self._spark.streams.active
            ):
                time.sleep(POLL_S / 2)

    def _end(self, reason: str) -> None:
        """End the iteration beside the server: a query of one micro-batch (a file that
        names ``reason``) whose ``foreachBatch`` builds the loop from the epoch log, runs
        what is left and tells the listeners."""
        spark = self._spark
        files, root = files_for(spark, self._beside.launch.location, "checkpoint_location")
        place = f"{root}/{CONNECT_DIR}/{ENDS_DIR}/{uuid.uuid4().hex}"
        files.write_bytes(f"{place}/input/reason.json", json.dumps({"reason": reason}).encode())
        try:
            ending = (
                spark.readStream.schema("reason string")
                .json(f"{place}/input")
                .writeStream.foreachBatch(attrs.evolve(self._beside, ending=reason))
                .option("checkpointLocation", f"{place}/stream")
                .trigger(availableNow=True)
                .start()
            )
            try:
                ending.awaitTermination()
            except Exception as exc:
                self._raise_failure(exc)
        finally:
            files.delete(place)

    def _raise_failure(self, error: BaseException) -> NoReturn:
        """Raise the error that failed the stream (``error``) as the epoch loop raised it
        (a ``RoundError`` naming the epoch, an ``IterflowValueError``...), left by the loop
        beside the server, with its causes; else one made from the stream's error text."""
        left = left_failure(self._beside.launch.location)
        failure = left if left is not None else failed_beside_server(self._iteration, error)
        raise failure from failure.__cause__ or error


def failed_beside_server(iteration: str, error: BaseException) -> IterflowError:
    """The error that ended a query over Spark Connect, as the client raises it: the
    exception the epoch loop raised beside the server (an iterflow error keeps its class),
    with the stream's error as its cause."""
    text = str(error).split("JVM stacktrace")[0]
    raised = RAISED.findall(text)
    name, message = raised[-1] if raised else ("", text.strip().splitlines()[0] if text else "")
    kind = _iterflow_error(name)
    what = f"UnboundedIteration '{iteration}' failed beside the Spark Connect server"
    try:
        return kind(f"{what}: {message}")
    except TypeError:
        return IterflowError(f"{what}: {name}: {message}")


def _iterflow_error(name: str) -> type[IterflowError]:
    """The iterflow error class a traceback names (``iterflow.errors.IterflowValueError``),
    else ``IterflowError``."""
    module, _, cls = name.rpartition(".")
    if not module.startswith("iterflow"):
        return IterflowError
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return IterflowError
    return found if isinstance(found, type) and issubclass(found, IterflowError) else IterflowError
