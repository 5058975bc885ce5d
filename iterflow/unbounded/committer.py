"""When an unbounded iteration's commits are written: before each ``foreachBatch`` call
returns, or off the loop's path (``start(commit_interval_s=...)``).

Off the loop's path, the loop takes a snapshot at an epoch boundary at most every
``interval_s`` seconds and hands it to a background thread that writes one commit at a
time. A snapshot handed while a commit is being written waits, and a newer one replaces
it. The epochs go on meanwhile, and the data a snapshot reads stays pinned until it is
written. This is the trade-off of Spark's asynchronous progress tracking: epochs do not
wait for their commit, and after a crash the epochs since the last commit written run
again. Spark's own checkpoint is then ahead, and ``rewind`` makes it deliver their
micro-batches again.

A failed write fails the iteration at the next epoch boundary, or while it is idle;
later snapshots are not written. The end of the inputs and ``stop()`` write every
snapshot handed over, then a last commit on the loop's thread. The committed
micro-batch never falls more than ``max_batches_behind`` behind the one running: Spark
keeps the offsets of its recent micro-batches only (``minBatchesToRetain``), and a
rewind needs those of the last commit, so the loop then waits for a commit.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from collections.abc import Mapping

from pyspark import InheritableThread
from pyspark.sql import DataFrame

from iterflow.errors import IterflowWarning
from iterflow.unbounded import epoch_log
from iterflow.unbounded.epoch_log import Committed, EpochLog, Snapshot

log = logging.getLogger("iterflow.unbounded")

#: Spark's setting for how many micro-batches of offsets and commits it keeps.
RETAINED_BATCHES_CONF = "spark.sql.streaming.minBatchesToRetain"


class Committer:
    """Writes the commits of one unbounded run to its epoch ``log``, on the loop's thread
    (``interval_s`` None) or on a background thread at most every ``interval_s`` seconds,
    one in flight at a time."""

    def __init__(self, log: EpochLog, *, interval_s: float | None, max_batches_behind: int) -> None:
        self.log = log
        self.interval_s = interval_s
        self.max_batches_behind = max_batches_behind
        #: The last commit written whole; the background thread replaces it.
        self.committed = Committed()
        self._taken_epoch = -1  # the epoch of the last snapshot taken
        self._handed_at = -math.inf  # time.monotonic() when it was taken
        self._changed = threading.Condition()
        self._waiting: Snapshot | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._surfaced = False

    @property
    def in_flight(self) -> bool:
        """A commit is being written in the background."""
        return self._thread is not None

    def commit(self, epoch: int, batch_id: int, pending: Mapping[str, DataFrame]) -> None:
        """At the boundary after ``epoch`` (micro-batch ``batch_id``, variables ``pending``):
        commit what the epochs since the last commit left; off the loop's path, hand a
        snapshot over when one is due."""
        self.raise_failure()
        if epoch in (self.committed.epoch, self._taken_epoch):
            return
        if self.interval_s is None:
            self._write_here(epoch, batch_id, pending)
            return
        behind = batch_id - self.committed.batch_id >= self.max_batches_behind
        if not behind and time.monotonic() - self._handed_at < self.interval_s:
            return
        self._hand(epoch_log.take(self.log, epoch, batch_id, pending))
        if behind:
            self.wait()

    def flush(self, epoch: int, batch_id: int, pending: Mapping[str, DataFrame]) -> None:
        """Write every snapshot handed over, then commit the last epoch run, on this thread."""
        self.wait()
        if epoch != self.committed.epoch:
            self._write_here(epoch, batch_id, pending)

    def wait(self) -> None:
        """Block until no commit is in flight; raise the error of one that failed."""
        with self._changed:
            while self._thread is not None:
                self._changed.wait()
        self.raise_failure()

    def raise_failure(self) -> None:
        if self._error is not None:
            self._surfaced = True
            raise self._error

    def settle(self) -> None:
        """Let the commits in flight finish when the iteration ends otherwise; a failure that
        did not end it only warns."""
        with self._changed:
            while self._thread is not None:
                self._changed.wait()
        if self._error is not None and not self._surfaced:
            log.warning("%s", self._error)
            warnings.warn(str(self._error), IterflowWarning, stacklevel=2)

    def _write_here(self, epoch: int, batch_id: int, pending: Mapping[str, DataFrame]) -> None:
        taken = epoch_log.take(self.log, epoch, batch_id, pending)
        self._taken_epoch = taken.epoch
        epoch_log.write(self.log, taken)
        self.committed = Committed(epoch=taken.epoch, batch_id=taken.batch_id)

    def _hand(self, taken: Snapshot) -> None:
        self._taken_epoch, self._handed_at = taken.epoch, time.monotonic()
        with self._changed:
            replaced, self._waiting = self._waiting, taken
            if self._thread is None:
                self._thread = InheritableThread(self._write_handed, name="iterflow-commit")
                self._thread.start()
        if replaced is not None:
            self.log.cycle.unpin(replaced.pinned)

    def _write_handed(self) -> None:
        """The background thread: write the waiting snapshot until there is none."""
        while True:
            with self._changed:
                taken, self._waiting = self._waiting, None
                if taken is None or self._error is not None:
                    self._thread = None
                    self._changed.notify_all()
                    break
            try:
                epoch_log.write(self.log, taken)
            except BaseException as exc:
                self._error = exc
            else:
                self.committed = Committed(epoch=taken.epoch, batch_id=taken.batch_id)
        if taken is not None:  # not written after a failure
            self.log.cycle.unpin(taken.pinned)
