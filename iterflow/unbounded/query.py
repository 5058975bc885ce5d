"""The handle of a started unbounded iteration: wait for it, stop it, watch its epochs.

It answers Structured Streaming's ``StreamingQuery`` names (``id``, ``runId``, ``name``,
``isActive``, ``awaitTermination``, ``processAllAvailable``, ``stop``, ``exception()``,
``lastProgress``, ``recentProgress``, ``status``, ``explain``), so code written for a
streaming query runs against it, and is a context manager that stops the query on exit.
The progress dicts are the stream's, each with an ``"iterflow"`` entry: the epochs that
its micro-batch ran (as ``iterflow report`` and the event log show them).
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StreamingQuery

from iterflow.errors import IterflowError, gist
from iterflow.progress.display import (
    History,
    history_events,
    history_frame,
    history_html,
    summary_html,
)
from iterflow.progress.event_log import progress_to_dict
from iterflow.progress.table import ending
from iterflow.reports import RoundProgress, Termination
from iterflow.runtime.progresstrack.sampler import on_sampler_thread
from iterflow.unbounded.backlog import SourceBacklog
from iterflow.unbounded.epochs import EpochLoop

if TYPE_CHECKING:
    import pandas as pd

#: How often the watcher looks at the streaming query (seconds).
POLL_S = 0.1


class UnboundedQuery:
    """A running unbounded iteration, returned by ``UnboundedIteration.start()``.

    A watcher thread follows the Structured Streaming query: when the stream is
    idle it drains feedback left in flight (processing-time triggers); when the
    inputs have ended (available-now) it drains what is left and ends the
    iteration; it reports the outcome to listeners and observers once.
    """

    def __init__(
        self, loop: EpochLoop, stream: StreamingQuery, *, available_now: bool, resumed_from: Any
    ) -> None:
        self._loop = loop
        loop.source_backlog = SourceBacklog(
            loop.spark, stream, loop.streams, lambda: loop.loop.history
        ).measure
        self._follow(loop.body.name, stream, available_now, resumed_from, loop.stopping)

    def _follow(
        self,
        iteration: str,
        stream: StreamingQuery,
        available_now: bool,
        resumed_from: Any,
        stopping: threading.Event,
    ) -> None:
        """Hold ``stream`` and start the watcher that follows it; ``stopping`` is set once
        ``stop()`` is asked."""
        self._iteration = iteration
        self._stream = stream
        self._stop_asked = stopping
        self._available_now = available_now
        self.resumed_from: int | None = resumed_from
        self._done = threading.Event()
        self._stopper: threading.Thread | None = None  # stops the stream, once asked
        self._stop_error: Exception | None = None  # what Spark's stop() raised there
        self._error: BaseException | None = None
        self._termination: Termination | None = None
        self._watcher = threading.Thread(
            target=self._watch, name=f"iterflow-unbounded-{iteration}", daemon=True
        )
        self._watcher.start()

    # -- public ----------------------------------------------------------------------

    @property
    def history(self) -> History:
        """Per-epoch progress, oldest first (the most recent ``keep_history`` epochs, 1,000
        by default), like ``IterationResult.history``."""
        return History(self._loop.loop.history)

    def history_frame(self) -> pd.DataFrame:
        """The epochs of ``history`` as a pandas DataFrame, one row per epoch, with the
        columns of ``iterflow report`` (as ``IterationResult.history_frame()``)."""
        return history_frame(self._events())

    def _events(self) -> list[dict[str, Any]]:
        history = self.history
        return history_events(
            history,
            iteration=self._iteration,
            termination=self._termination,
            rounds=history[-1].epoch + 1 if history else 0,
        )

    def _repr_html_(self) -> str:
        """How the query is doing, then a row per epoch kept (notebooks show this)."""
        status = self.status
        fields = {
            "state": status["state"],
            "epoch": status["epoch"],
            "committed epoch": status["committed_epoch"],
            "feedback rows in flight": status["feedback_rows_in_flight"],
            "termination": None if self._termination is None else ending(self._events()),
            "error": None if self._error is None else gist(self._error),
        }
        title = f"UnboundedQuery '{self._iteration}'"
        return summary_html(title, fields, history_html(self._events()))

    @property
    def progress(self) -> list[RoundProgress]:
        """The same list as ``history``; unrelated to ``start(progress=...)``, which shows
        a progress bar."""
        return self.history

    @property
    def emitted(self) -> dict[str, list[Any]]:
        """Values listeners emitted with ``ctx.emit(name, value)``, by name, as on
        ``IterationResult.emitted`` (restored from the checkpoint on a restart)."""
        values = self._loop.loop.emitter.values
        return {k: list(v) for k, v in list(values.items())}

    @property
    def metrics(self) -> dict[str, Any]:
        """The user metrics of this query, name -> ``MetricResult``, as on
        ``IterationResult.metrics``: the totals so far while it runs, the final ones
        once it has ended."""
        return self._loop.loop.observers.metrics.totals()

    @property
    def termination(self) -> Termination | None:
        """Why the iteration ended (``"inputs_ended"`` or ``"stopped"``); None while running."""
        return self._termination

    @property
    def error(self) -> BaseException | None:
        """The error that ended the iteration, or None (``exception()`` returns it too)."""
        return self._error

    def exception(self) -> BaseException | None:
        """The error that ended the iteration, or None: ``StreamingQuery.exception()``."""
        return self._error

    @property
    def is_active(self) -> bool:
        """Whether the iteration still runs (``isActive``)."""
        return not self._done.is_set()

    @property
    def isActive(self) -> bool:
        return self.is_active

    @property
    def id(self) -> str:
        """The stream's id: the same across restarts from the same checkpoint location
        (``StreamingQuery.id``)."""
        return str(self._stream.id)

    @property
    def runId(self) -> str:
        """This start's id, new at every restart (``StreamingQuery.runId``)."""
        return str(self._stream.runId)

    @property
    def name(self) -> str | None:
        """``start(query_name=...)``: the stream's name in the Spark UI, or None."""
        return self._stream.name

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """The stream's progress of its last micro-batch (``StreamingQuery.lastProgress``),
        or None before the first; its ``"iterflow"`` entry holds the epochs that
        micro-batch ran, the committed epoch and the feedback rows in flight."""
        last = self._stream_progress(recent=False)
        if not last:
            return None
        progress = last[0]
        position = self._position()
        progress["iterflow"] = {
            **progress["iterflow"],
            "committed_epoch": position["committed_epoch"],
            "feedback_rows_in_flight": position["feedback_rows_in_flight"],
        }
        return progress

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        """The stream's progress of its recent micro-batches, oldest first
        (``StreamingQuery.recentProgress``), each with the epochs it ran under
        ``"iterflow"``."""
        return self._stream_progress(recent=True)

    def _stream_progress(self, *, recent: bool) -> list[dict[str, Any]]:
        """The stream's progress dicts (its last one, or its recent ones), each with the
        epochs of its micro-batch under ``"iterflow"`` (the stream is gone: none)."""
        try:
            if recent:
                reports = [dict(p) for p in self._stream.recentProgress]
            else:
                last = self._stream.lastProgress
                reports = [] if last is None else [dict(last)]
        except Exception:  # the query is gone: no progress to give
            return []
        epochs: dict[int, list[dict[str, Any]]] = {}
        for p in self.history:
            if p.batch_id is not None:
                epochs.setdefault(p.batch_id, []).append(progress_to_dict(p))
        for report in reports:
            ran = epochs.get(int(report.get("batchId", -1)), [])
            report["iterflow"] = {"epochs": ran}
            if not report.get("numInputRows"):
                # Over Spark Connect, Spark counts no rows read by foreachBatch's process:
                # the micro-batch's rows are iterflow's count of them.
                counted = [n for e in ran for n in (e.get("input_rows") or {}).values()]
                if counted and None not in counted:
                    report["numInputRows"] = sum(counted)
        return reports

    def explain(self, extended: bool = False) -> None:
        """Print the plan of the stream's last micro-batch (``StreamingQuery.explain``)."""
        self._stream.explain(extended)

    @property
    def status(self) -> dict[str, Any]:
        """What the iteration is doing now: the stream's status (``message``,
        ``isDataAvailable``, ``isTriggerActive``: ``StreamingQuery.status``) and
        iterflow's: state, last epoch, the epoch of the last commit written whole (a
        restart continues after it) and whether one is being written, feedback in
        flight; ``stream`` repeats the stream's status."""
        if self._done.is_set():
            state = "failed" if self._error is not None else "terminated"
        else:
            state = "stopping" if self._stopping() else "running"
        stream: dict[str, Any] = {}
        with contextlib.suppress(Exception):  # the query is gone
            stream = dict(self._stream.status)
        return {
            **stream,
            "state": state,
            **self._position(),
            "termination": None if self._termination is None else self._termination.reason,
            "stream": stream,
        }

    def _position(self) -> dict[str, Any]:
        """Where the epochs stand: the last one, the last commit written whole, whether one
        is being written, the last micro-batch taken and the feedback rows in flight."""
        loop = self._loop
        return {
            "epoch": loop.epoch,
            "committed_epoch": loop.committed_epoch,
            "commit_in_flight": loop.commits.in_flight,
            "batch_id": loop.batch_id,
            "feedback_rows_in_flight": loop.in_flight,
        }

    def _stopping(self) -> bool:
        return self._stop_asked.is_set()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait until the iteration ends (at most ``timeout`` seconds); True when it has.
        Raises the error that failed it."""
        ended = self._done.wait(timeout)
        if ended and self._error is not None:
            raise self._error
        return ended

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """``StreamingQuery.awaitTermination``: with ``timeout`` (seconds), whether the
        iteration ended within it; without, waits and returns None. Raises the error that
        failed it."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise IterflowError(f"awaitTermination(timeout={timeout!r}): use seconds, >= 0")
        ended = self.await_termination(timeout)
        return ended if timeout is not None else None

    def processAllAvailable(self) -> None:
        """``process_all_available()`` under StreamingQuery's name."""
        self.process_all_available()

    def __enter__(self) -> UnboundedQuery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stops the query (its epochs in progress finish and commit first)."""
        self.stop()

    def process_all_available(self) -> None:
        """Block until the rows the inputs hold now, and the work feedback they cause, are
        processed and committed (for tests and demos; Spark's ``processAllAvailable``).
        With ``start(commit_interval_s=...)`` it does not wait for their commit, which
        comes at that interval.

        Raises the error that failed the iteration, if it failed.
        """
        if self._inside():
            raise IterflowError(
                "process_all_available() was called from a listener (or another thread the "
                "iteration runs on): it would wait for the epoch that called it. Call it "
                "from your own thread; stop() works from a listener"
            )
        if self._available_now:
            self.await_termination()
            return
        try:
            self._stream.processAllAvailable()
        except Exception:
            self._done.wait()  # the watcher records the round's own error
            self.await_termination()
            if self._termination is not None:  # stopped meanwhile
                return
            raise
        self._settle()

    def _settle(self) -> None:
        """After the stream's ``processAllAvailable``: wait until the feedback left after
        the last micro-batch has drained while idle, and is committed."""
        loop = self._loop
        while True:
            with loop.guard.exclusive():
                committed = loop.committed_epoch == loop.epoch
                if loop.in_flight == 0 and (committed or loop.options.commit_interval_s):
                    return
            if self._done.wait(POLL_S):
                self.await_termination()
                return

    def stop(self) -> None:
        """Let the micro-batch in progress finish its epochs and commit, then stop the stream.

        Feedback still in flight stays committed, and a later ``start()`` with the
        same checkpoint location continues from there. Called from a listener,
        it returns at once and the stream stops after the current micro-batch.
        """
        if not self._stop_asked.is_set():
            self._stop_asked.set()
            self._stopper = threading.Thread(
                target=self._stop_stream, name="iterflow-stop", daemon=True
            )
            self._stopper.start()
        if not self._inside():
            self._done.wait()
            if self._stopper is not None:  # Spark's stop() returns once the stream is gone
                self._stopper.join()
            if self._stop_error is not None:
                raise self._stop_error

    def _inside(self) -> bool:
        """True on a thread the iteration runs on (or one delivering its samples): waiting
        there for the end would deadlock."""
        return (
            self._loop.guard.in_this_thread
            or threading.current_thread() is self._watcher
            or on_sampler_thread()
        )

    def _stop_stream(self) -> None:
        self._between_batches()
        try:
            self._stream.stop()
        except Exception as exc:  # stop() raises it in the caller's thread
            self._stop_error = exc

    def _between_batches(self) -> None:
        """Return once no epoch runs: the epochs in progress finish and commit first."""
        with self._loop.guard.exclusive():
            pass

    def __repr__(self) -> str:
        status = self.status
        return (
            f"<UnboundedQuery '{self._iteration}' {status['state']} "
            f"epoch={status['epoch']} in_flight={status['feedback_rows_in_flight']}>"
        )

    # -- the watcher ---------------------------------------------------------------------

    def _watch(self) -> None:
        loop = self._loop
        try:
            while True:
                try:
                    if self._stream.awaitTermination(POLL_S):  # type: ignore[arg-type]
                        break
                except Exception:
                    error = loop.guard.error
                    if error is None:
                        if loop.stopping.is_set():
                            break  # a micro-batch refused after stop(); it runs again later
                        raise
                    raise error from error.__cause__  # the round's own error, as raised
                if not self._available_now and not loop.stopping.is_set() and loop.in_flight > 0:
                    loop.drain_idle()
                if not loop.stopping.is_set():
                    loop.commit_idle()
            if not loop.stopping.is_set():
                loop.finish()  # drains every epoch left, unless stop() comes first
            else:
                loop.flush()  # the commits in flight, and one of the last epoch
            ended = "stopped" if loop.stopping.is_set() else "inputs_ended"
            self._termination = loop.terminate(ended)
        except BaseException as exc:
            self._error = exc
            loop.stopping.set()
            with contextlib.suppress(Exception):  # Spark must not call the loop again
                self._stream.stop()
            loop.failed(exc)
        finally:
            try:
                loop.close()
            finally:
                self._done.set()
