"""When a run writes its checkpoints, and writing them off the loop's path: a background
writer (at most one write pending, on an ``InheritableThread`` so Spark job properties
follow) and the run's checkpointing (restore, snapshot at a round boundary, write,
settle)."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowError, IterflowValueError, IterflowWarning, warn
from iterflow.runtime.checkpoint.format import (
    MERGE,
    Checkpoint,
    DriverSnapshot,
    DriverState,
    HistorySegment,
    fingerprint_differences,
    history_segment,
    lost_checkpoint_block,
    snapshot,
)
from iterflow.runtime.checkpoint.lease import Lease, lease_timeout_s
from iterflow.runtime.checkpoint.store import CheckpointStore
from iterflow.runtime.spark.jvm import is_classic, spark_context

log = logging.getLogger("iterflow.checkpoint")

_JOB_PROPERTIES = ("spark.scheduler.pool", "spark.job.description")


class CheckpointWriteError(IterflowError):
    """The write of epoch ``epoch`` failed; earlier checkpoints are intact."""

    def __init__(self, epoch: int, cause: BaseException) -> None:
        super().__init__(
            f"the checkpoint of epoch {epoch} failed ({type(cause).__name__}: {cause}); "
            "earlier checkpoints are intact, and a restart resumes from the last one"
        )
        self.epoch = epoch
        self.__cause__ = cause


class CheckpointWriter:
    """Runs checkpoint writes on a background thread, at most one pending at a time.

    The thread is a PySpark ``InheritableThread``: Spark job properties of the
    loop's thread (the round tag metrics use) follow it, and its jobs run in the
    ``iterflow-checkpoint`` scheduler pool. With ``asynchronous=False`` writes
    run on the caller's thread.
    """

    def __init__(self, spark: SparkSession, *, asynchronous: bool) -> None:
        self._spark = spark
        self._asynchronous = asynchronous
        self._thread: threading.Thread | None = None
        self._error: CheckpointWriteError | None = None

    def submit(self, epoch: int, write: Callable[[], None]) -> None:
        """Start writing epoch ``epoch``; waits for the pending write first."""
        self.wait()
        if not self._asynchronous:
            self._run(epoch, write)
            self._raise()
            return
        # A Spark Connect session must be handed over for the thread to use it.
        self._thread = InheritableThread(
            self._run,
            args=(epoch, write),
            session=None if is_classic(self._spark) else self._spark,
            name=f"iterflow-checkpoint-{epoch}",
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until the pending write committed; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _run(self, epoch: int, write: Callable[[], None]) -> None:
        # Job properties need a SparkContext; over Spark Connect, jobs keep the server's.
        context: Any = spark_context(self._spark)
        saved: dict[str, str | None] = {}
        if context is not None:
            saved = {key: context.getLocalProperty(key) for key in _JOB_PROPERTIES}
            context.setLocalProperty("spark.scheduler.pool", "iterflow-checkpoint")
            description = f"iterflow checkpoint of epoch {epoch}"
            context.setLocalProperty("spark.job.description", description)
        try:
            write()
        except BaseException as exc:
            self._error = CheckpointWriteError(epoch, exc)
        finally:
            # Synchronous writes run on the loop's thread: give the user's settings back.
            for key, value in saved.items():
                context.setLocalProperty(key, value)

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error


@attrs.frozen(kw_only=True)
class CheckpointOptions:
    """``run(checkpoint_dir=, checkpoint_every=, checkpoint_async=, checkpoint_keep=, resume=)``."""

    directory: str
    every: int = 10
    asynchronous: bool = True
    keep: int = 2
    resume: bool = True
    #: Fail on a damaged committed epoch rather than fall back to an older one.
    strict: bool = False
    #: How error messages name the directory option, and how to start over.
    option: str = "checkpoint_dir"
    fresh_start: str = (
        "pass resume=False to start over (this deletes those checkpoints), or use another "
        "checkpoint_dir"
    )


class Checkpointing:
    """The durable checkpoints of one run: restore at the start, write every ``every`` rounds.

    The driver state is pickled synchronously at the round boundary; the
    variables are written as parquet on the writer's thread while the next round
    computes. The caller must ``wait()`` before releasing a round's data.
    """

    def __init__(
        self, spark: SparkSession, options: CheckpointOptions, fingerprint: dict[str, Any]
    ) -> None:
        self.options = options
        self.fingerprint = fingerprint
        self.store = CheckpointStore(spark, options.directory, keep=options.keep)
        self.lease = Lease(
            self.store.files,
            self.store.root,
            timeout_s=lease_timeout_s(spark),
            option=options.option,
        )
        self.store.lease = self.lease
        self.writer = CheckpointWriter(spark, asynchronous=options.asynchronous)
        # The history segments of the last checkpoint committed (or restored), and the
        # epoch of their last round: the next checkpoint writes only the rounds after it.
        self._committed: tuple[tuple[HistorySegment, ...], int] = ((), -1)
        # Epochs of the checkpoints this run committed, the newest ``keep`` of them.
        self._epochs: list[int] = []

    def restore(self) -> Checkpoint | None:
        """Take the directory's lease (``CheckpointInUseError`` while another live run
        holds it); the checkpoint to continue from, or None to start at round 0."""
        self.lease.acquire()
        if not self.options.resume:
            self.store.clear()
            return None
        return self.latest(strict=self.options.strict, fingerprint=self.fingerprint)

    def latest(
        self, *, strict: bool = False, fingerprint: dict[str, Any] | None = None
    ) -> Checkpoint | None:
        """The newest valid checkpoint (``resumable``); the history the run continues with
        is its history."""
        checkpoint = resumable(self.store, self.options, fingerprint, strict=strict)
        if checkpoint is not None:
            # Without segments (an older checkpoint) the next one writes all the history.
            segments = checkpoint.segments
            self._committed = (segments, max((s.last for s in segments), default=-1))
        return checkpoint

    @property
    def rollback_floor(self) -> int:
        """The lowest epoch a rollback may run again from: after the oldest checkpoint this
        run committed and keeps (0 before any)."""
        return self._epochs[0] + 1 if self._epochs else 0

    def due(self, epoch: int) -> bool:
        return (epoch + 1) % self.options.every == 0

    def snapshot(self, driver: DriverState, epoch: int) -> DriverSnapshot:
        """``driver`` pickled now, at the round boundary: the history as the segments of
        the last committed checkpoint and one more with the rounds since.

        Segments merge as in a log-structured tree: ``MERGE`` segments of one level
        at the end become one of the next level, so a run keeps a few dozen files
        (a logarithmic number without ``keep_history``), and each round is written
        once per level."""
        base, through = self._committed
        history = driver.history
        if history:  # segments wholly before the kept rounds are not read any more
            first = history[0].epoch
            base = tuple(segment for segment in base if segment.last >= first)
        fresh = [progress for progress in history if progress.epoch > through]
        data = snapshot(attrs.evolve(driver, history=[]), epoch)
        if not fresh:
            return DriverSnapshot(driver=data, segments=base, new=(), through=through)
        segments, content = list(base), {}
        segment, content[segment.name] = history_segment(fresh, level=0)
        segments.append(segment)
        while len(segments) >= MERGE and len({s.level for s in segments[-MERGE:]}) == 1:
            merged = segments[-MERGE:]
            # The rounds they hold that this run keeps (older ones are not kept any more).
            rounds = [p for p in history if merged[0].first <= p.epoch <= merged[-1].last]
            segment, content[segment.name] = history_segment(rounds, level=merged[0].level + 1)
            segments[-MERGE:] = [segment]
        named = {s.name for s in segments}
        return DriverSnapshot(
            driver=data,
            segments=tuple(segments),
            new=tuple((name, raw) for name, raw in content.items() if name in named),
            through=fresh[-1].epoch,
        )

    def write(
        self,
        epoch: int,
        driver: DriverState,
        variables: Mapping[str, DataFrame],
        outputs: Mapping[str, DataFrame] | None = None,
    ) -> None:
        """Snapshot ``driver`` now and write epoch ``epoch`` (in the background when async)."""
        self.write_snapshot(epoch, self.snapshot(driver, epoch), variables, outputs)

    def write_final(
        self,
        epoch: int,
        driver: DriverState,
        variables: Mapping[str, DataFrame],
        outputs: Mapping[str, DataFrame],
    ) -> None:
        """Write the final epoch, with its outputs, and wait for it: it is flushed before
        ``run()`` returns. A failure only warns: the result in hand is still right."""
        try:
            self.write(epoch, driver, variables, outputs)
            self.wait()
        except IterflowError as exc:
            warn(
                f"{exc}. The result is returned, but the final checkpoint is missing: "
                "a later run() with this checkpoint_dir resumes from the last "
                "committed epoch and runs the remaining rounds again",
                log=log,
            )

    def write_snapshot(
        self,
        epoch: int,
        data: DriverSnapshot,
        variables: Mapping[str, DataFrame],
        outputs: Mapping[str, DataFrame] | None = None,
    ) -> None:
        """Write epoch ``epoch`` with the driver state ``data`` taken by ``snapshot``."""
        frames, results = dict(variables), dict(outputs or {})

        def write() -> None:
            self.store.write(
                epoch,
                fingerprint=self.fingerprint,
                variables=frames,
                outputs=results,
                driver=data,
            )
            # Committed: the next checkpoint's history continues from this one's.
            self._committed = (data.segments, data.through)
            self._epochs = [*self._epochs, epoch][-self.store.keep :]

        self.writer.submit(epoch, write)

    def wait(self) -> None:
        """Block until the pending write is done; raise if it failed.

        A write that failed because the round's local checkpoint lost a block is
        skipped with a warning: the next round has cut its lineage already, and
        the next checkpoint covers it.
        """
        try:
            self.writer.wait()
        except CheckpointWriteError as exc:
            if not lost_checkpoint_block(exc):
                raise
            message = (
                f"the checkpoint of epoch {exc.epoch} was skipped: a block of its data was lost "
                "before the write read it (an executor was lost); the next checkpoint covers "
                "the rounds since the last one"
            )
            log.warning("%s", message)
            warnings.warn(message, IterflowWarning, stacklevel=2)

    def close(self) -> None:
        """Give the directory's lease back (the run has ended, its writes are done)."""
        self.lease.release()

    def settle(self) -> None:
        """Let a pending write finish when the run fails; its own failure only warns."""
        try:
            self.writer.wait()
        except IterflowError as exc:
            log.warning("%s", exc)
            warnings.warn(str(exc), IterflowWarning, stacklevel=2)


def resumable(
    store: CheckpointStore,
    options: CheckpointOptions,
    fingerprint: dict[str, Any] | None,
    *,
    strict: bool,
) -> Checkpoint | None:
    """The newest valid checkpoint in ``store`` (``CheckpointStore.latest``), or None; an
    ``IterflowValueError`` when it belongs to a run whose ``fingerprint`` (body, inputs)
    differs from this one's (None: not checked)."""
    checkpoint = store.latest(strict=strict, remedy=options.fresh_start)
    if checkpoint is None or fingerprint is None:
        return checkpoint
    problems = fingerprint_differences(checkpoint.fingerprint, fingerprint)
    if problems:
        raise IterflowValueError(
            f"{options.option} '{store.root}' holds checkpoints of another iteration: "
            + "; ".join(problems)
            + f". Bind the same inputs to the same body to resume, or {options.fresh_start}"
        )
    return checkpoint
