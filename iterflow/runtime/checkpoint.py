"""Durable checkpoints of a run: one directory per committed epoch, written off the critical path.

Layout under ``checkpoint_dir``::

    epoch-00000007/
        variables/<name>/    parquet, one dataset per variable
        outputs/<name>/      parquet, only in the checkpoint of the final epoch
        driver.pkl           ctx.state, listener states, emitted values, committed
                             metrics (cloudpickle); the history is in history/
        _COMMITTED           the manifest (JSON): fingerprint, epoch, every file and its
                             size, driver.pkl's sha256, the history segments it reads;
                             written last, atomically
    history/
        00000000-00000009-<token>.pkl   the RoundProgress of epochs 0-9 (cloudpickle)
        00000010-00000019-<token>.pkl   ...

The history is written incrementally: a checkpoint writes one segment, the
rounds since the last committed checkpoint, and its manifest names, in order,
every segment its history is made of (with their sizes and sha256), so the bytes
a checkpoint writes do not grow with the round count. Every ``MERGE`` segments of
one level at the end merge into one of the next level (written by the checkpoint
that makes them), which keeps the files few. A segment is written
before the manifest that names it and never changed; a segment no remaining
epoch names (older epochs deleted, a write that never committed) is deleted
after a commit. With ``keep_history`` the segments wholly before the kept rounds
are no longer named.

An epoch directory without a readable ``_COMMITTED`` manifest, or whose files
(or history segments) differ from it (a truncated write, a changed byte), does not
exist for resuming: resume falls back to the newest epoch that verifies, with a
warning naming the bad file. Older epochs are deleted only after a newer one has
committed, and the one before the newest is always kept to fall back to.
Checkpoint directories written before history segments existed hold the whole
history in ``driver.pkl``; they load as before.
Checkpoint directories are trusted input: they hold pickles.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
import re
import threading
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from pyspark import InheritableThread
from pyspark.cloudpickle import dumps
from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowError, IterflowValueError, IterflowWarning, warn
from iterflow.runtime.files import files_for
from iterflow.runtime.jvm import is_classic, spark_context
from iterflow.runtime.lease import Lease, lease_timeout_s

FORMAT = 1
MARKER = "_COMMITTED"
DRIVER = "driver.pkl"
HISTORY = "history"
#: History segments of one level that merge into one of the next level.
MERGE = 16
_JOB_PROPERTIES = ("spark.scheduler.pool", "spark.job.description")
_EPOCH_DIR = re.compile(r"epoch-(\d{8})\Z")
#: Committed checkpoints pruning keeps at least: the newest, and the one a resume falls
#: back to when the newest does not verify.
MIN_KEEP = 2

log = logging.getLogger("iterflow.checkpoint")


def lost_checkpoint_block(error: BaseException) -> bool:
    """True when ``error`` comes from a local checkpoint block Spark no longer has."""
    return "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in f"{error} {error.__cause__}"


def epoch_dir(epoch: int) -> str:
    return f"epoch-{epoch:08d}"


def fingerprint(iteration: str, inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What identifies an iteration across runs: body name, input names, schemas, replay.

    Termination conditions are left out on purpose, so a finished run can be
    resumed with a larger ``max_rounds``.
    """
    return {
        "format": FORMAT,
        "iteration": iteration,
        "inputs": {k: dict(v) for k, v in inputs.items()},
    }


def fingerprint_differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words; empty when they match."""
    problems: list[str] = []
    if stored.get("format") != current["format"]:
        problems.append(f"checkpoint format {stored.get('format')} vs {current['format']}")
    if stored.get("iteration") != current["iteration"]:
        problems.append(f"body '{stored.get('iteration')}' vs '{current['iteration']}'")
    old, new = stored.get("inputs", {}), current["inputs"]
    for name in sorted(set(old) - set(new)):
        problems.append(f"input '{name}' is gone")
    for name in sorted(set(new) - set(old)):
        problems.append(f"input '{name}' is new")
    for name in sorted(set(old) & set(new)):
        if old[name].get("schema") != new[name]["schema"]:
            problems.append(
                f"input '{name}' schema ({old[name].get('schema')}) vs ({new[name]['schema']})"
            )
        for key in sorted((set(old[name]) | set(new[name])) - {"schema"}):
            if old[name].get(key) != new[name].get(key):
                problems.append(
                    f"input '{name}' {key}={old[name].get(key)} vs {new[name].get(key)}"
                )
    return problems


@attrs.frozen(kw_only=True)
class DriverState:
    """What a run holds on the driver at the end of a round, snapshot for a checkpoint."""

    variable_names: tuple[str, ...]
    state: dict[str, Any]
    listeners: dict[int, tuple[str, Any]]
    emitted: dict[str, list[Any]]
    history: list[Any]  # RoundProgress
    metrics: dict[str, Any]  # RunMetrics.export()
    termination: Any  # Termination of the final epoch, else None
    stream: Any = None  # an unbounded iteration's position (unbounded/epochs.py)


@attrs.frozen(kw_only=True)
class HistorySegment:
    """One file of history under ``history/``, as a manifest names it."""

    name: str  # relative to the checkpoint directory
    first: int  # the epoch of its first round
    last: int  # the epoch of its last round
    size: int
    sha256: str
    #: 0: the rounds of one checkpoint; n + 1: ``MERGE`` segments of level n merged.
    level: int = 0


@attrs.frozen(kw_only=True)
class DriverSnapshot:
    """The driver state of one checkpoint, pickled at a round boundary (``Checkpointing.
    snapshot``): ``driver.pkl`` without the history, and the history as segments."""

    driver: bytes
    segments: tuple[HistorySegment, ...]  # the history, oldest rounds first
    new: tuple[tuple[str, bytes], ...]  # the segments this checkpoint writes: name, content
    through: int  # the epoch of the last round the segments hold (-1: none)


@attrs.frozen(kw_only=True)
class Checkpoint:
    """A committed epoch, read back: DataFrames over its parquet files and the driver state
    (its history reassembled from the segments)."""

    epoch: int
    fingerprint: dict[str, Any]
    variables: dict[str, DataFrame]
    outputs: dict[str, DataFrame]
    driver: DriverState
    segments: tuple[HistorySegment, ...] = ()

    @property
    def final(self) -> bool:
        return self.driver.termination is not None


#: Classes a checkpoint's driver state may name by a module they have since moved from:
#: (module, name) -> the module that holds the class now.
MOVED_CLASSES = {
    ("iterflow.progress.round", "RoundProgress"): "iterflow.records",
    ("iterflow.unbounded.epochs", "StreamPosition"): "iterflow.unbounded.epoch_log",
}


class _DriverStateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_CLASSES.get((module, name), module), name)


def load_driver_state(raw: bytes) -> DriverState:
    """The driver state pickled by ``snapshot``, also when an older iterflow wrote it
    (classes that moved since are found where they are now)."""
    driver: DriverState = _DriverStateUnpickler(io.BytesIO(raw)).load()
    for progress in driver.history:
        _fill_defaults(progress)
    return driver


def load_history(raw: bytes) -> list[Any]:
    """The rounds of a history segment (``RoundProgress``), as ``load_driver_state`` reads
    the history of an older ``driver.pkl``."""
    rounds: list[Any] = _DriverStateUnpickler(io.BytesIO(raw)).load()
    for progress in rounds:
        _fill_defaults(progress)
    return rounds


def _fill_defaults(record: Any) -> None:
    """Give ``record`` (an attrs value unpickled from an older iterflow) the default of
    every field it was written without."""
    for field in attrs.fields(type(record)):
        if hasattr(record, field.name) or field.default is attrs.NOTHING:
            continue
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory(record) if default.takes_self else default.factory()
        object.__setattr__(record, field.name, default)


def snapshot(driver: DriverState, epoch: int) -> bytes:
    """``driver`` pickled now, at the round boundary, so later rounds cannot change it."""
    try:
        return bytes(dumps(driver))
    except Exception as exc:
        raise IterflowValueError(
            f"epoch {epoch}: the checkpoint cannot pickle {_unpicklable(driver)} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); keep ctx.state and "
            "listener attributes picklable (no DataFrames or sessions), or give the listener "
            "state_dict()/load_state_dict()"
        ) from exc


def _unpicklable(driver: DriverState) -> str:
    """Which part of ``driver`` does not pickle, in the user's words."""
    for key, value in driver.state.items():
        if not _pickles(value):
            return f"ctx.state['{key}']"
    for index, (name, state) in driver.listeners.items():
        parts = state.items() if isinstance(state, dict) else [("state_dict()", state)]
        for attribute, value in parts:
            if not _pickles(value):
                return f"listener #{index + 1} '{name}' ({attribute})"
    for name, values in driver.emitted.items():
        if not _pickles(values):
            return f"the values emitted as '{name}'"
    return "the driver state"


def _pickles(value: Any) -> bool:
    try:
        dumps(value)
        return True
    except Exception:
        return False


class UnusableCheckpoint(Exception):
    """Why an epoch cannot be resumed from, naming the file that does not verify."""


class CheckpointStore:
    """Reads and writes the checkpoints under ``root`` (any Hadoop file system path)."""

    def __init__(self, spark: SparkSession, root: str, *, keep: int = 2) -> None:
        self.spark = spark
        self.files, self.root = files_for(spark, str(root))
        #: Committed epochs pruning keeps; never fewer than ``MIN_KEEP``, so that a
        #: checkpoint to fall back to is there when the newest does not verify.
        self.keep = max(keep, MIN_KEEP)
        #: The run's lease on ``root``, checked before anything there is deleted.
        self.lease: Lease | None = None

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def epochs(self) -> list[int]:
        """Epochs that have a directory, committed or not, in increasing order."""
        found = (_EPOCH_DIR.match(name) for name in self.files.children(self.root))
        return sorted(int(m.group(1)) for m in found if m)

    # -- reading -------------------------------------------------------------------

    def latest(self, *, strict: bool = False, remedy: str = "") -> Checkpoint | None:
        """The newest checkpoint whose data all verifies; newer ones that do not are skipped
        with a warning (on ``iterflow.checkpoint`` and as an ``IterflowWarning``) naming
        the bad file. None when no epoch ever committed.

        When epochs committed but none verifies, that is an error naming the bad files
        (``remedy`` says how to start over): starting from round 0 would silently drop
        what they held. With ``strict``, a newer epoch that committed but does not
        verify is an error at once: an unbounded iteration whose stream cannot be put
        back cannot go back to an older commit, because Spark has committed the
        micro-batches after it.
        """
        damaged: list[str] = []
        for epoch in reversed(self.epochs()):
            try:
                return self._read(epoch)
            except UnusableCheckpoint as unusable:
                committed = self.files.exists(self._path(epoch_dir(epoch), MARKER))
                if strict and committed:
                    raise IterflowError(
                        f"checkpoint epoch {epoch} in '{self.root}' committed but is damaged "
                        f"({unusable}); the micro-batches it consumed cannot be read again, "
                        "so the iteration cannot resume exactly once. Restore the directory "
                        "from a copy, or delete the whole location to start over"
                    ) from unusable
                if committed:
                    damaged.append(f"epoch {epoch}: {unusable}")
                message = (
                    f"checkpoint epoch {epoch} in '{self.root}' is not usable ({unusable}); "
                    "skipping it for an older one"
                )
                log.warning("%s", message)
                warn(message)
        if damaged:
            raise IterflowError(
                f"no checkpoint in '{self.root}' can be resumed from: "
                + "; ".join(damaged)
                + f". Restore the files named from a copy, or {remedy or 'start over'}"
            )
        return None

    def _manifest(self, epoch: int) -> dict[str, Any]:
        manifest = json.loads(self.files.read_bytes(self._path(epoch_dir(epoch), MARKER)))
        if not isinstance(manifest, dict) or manifest.get("epoch") != epoch:
            raise ValueError("not the manifest of this epoch")
        return manifest

    def _verified(self, epoch: int) -> tuple[dict[str, Any], bytes, list[bytes]]:
        """The manifest of epoch ``epoch``, its ``driver.pkl`` and its history segments,
        each checked against the manifest (sizes, sha256); its parquet data opened. Raises
        ``UnusableCheckpoint`` naming the first file that does not verify."""
        base = self._path(epoch_dir(epoch))
        marker = f"{base}/{MARKER}"
        if not self.files.exists(marker):
            raise UnusableCheckpoint(f"no commit marker '{marker}': its write did not finish")
        try:
            manifest = self._manifest(epoch)
        except Exception as exc:
            raise UnusableCheckpoint(f"unreadable commit marker '{marker}': {exc}") from exc
        sizes = self.files.file_sizes(base)
        for name, size in manifest["files"].items():
            if sizes.get(name) != size:
                raise UnusableCheckpoint(
                    f"file '{base}/{name}' has {sizes.get(name)} bytes, the manifest says {size}"
                )
        driver = self.files.read_bytes(f"{base}/{DRIVER}")
        if hashlib.sha256(driver).hexdigest() != manifest["driver_sha256"]:
            raise UnusableCheckpoint(f"'{base}/{DRIVER}' does not match its sha256")
        segments = _segments(manifest)
        missing = self._missing(segments)
        if missing is not None:
            raise UnusableCheckpoint(missing)
        history = []
        for segment in segments:
            raw = self.files.read_bytes(self._path(segment.name))
            if hashlib.sha256(raw).hexdigest() != segment.sha256:
                path = self._path(segment.name)
                raise UnusableCheckpoint(f"history segment '{path}' does not match its sha256")
            history.append(raw)
        for kind in ("variables", "outputs"):
            for name in manifest[kind]:
                self._check_parquet(f"{base}/{kind}/{name}")
        return manifest, driver, history

    def _check_parquet(self, path: str) -> None:
        """Spark opens the parquet dataset ``path``: every file's footer reads (schemas
        merged), so a file replaced or overwritten in place is found before a round
        reads it."""
        try:
            self._parquet(path, mergeSchema="true").schema  # noqa: B018 (analysis reads it)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise UnusableCheckpoint(
                f"parquet data '{path}' does not read ({type(exc).__name__}: {first})"
            ) from exc

    def _parquet(self, path: str, **options: str) -> DataFrame:
        """The parquet dataset ``path``; a corrupt file fails the read, whatever
        ``spark.sql.files.ignoreCorruptFiles`` says: a checkpoint never loses rows silently."""
        return self.spark.read.options(ignoreCorruptFiles="false", **options).parquet(path)

    def _missing(self, segments: tuple[HistorySegment, ...]) -> str | None:
        """Which of the history ``segments`` is not there whole, or None."""
        sizes = (
            self.files.file_sizes(self._path(HISTORY))
            if self.files.exists(self._path(HISTORY))
            else {}
        )
        for segment in segments:
            size = sizes.get(segment.name.removeprefix(f"{HISTORY}/"))
            if size != segment.size:
                return (
                    f"history segment '{self._path(segment.name)}' has {size} bytes, the "
                    f"manifest says {segment.size}"
                )
        return None

    def _read(self, epoch: int) -> Checkpoint:
        """Epoch ``epoch`` read back, once all its data verifies (``_verified``)."""
        manifest, raw, history = self._verified(epoch)
        base = self._path(epoch_dir(epoch))
        segments = _segments(manifest)
        try:
            driver: DriverState = load_driver_state(raw)
            if segments:
                rounds = [progress for segment in history for progress in load_history(segment)]
                driver = attrs.evolve(driver, history=rounds)
        except Exception as exc:
            raise IterflowError(
                f"checkpoint epoch {epoch} in '{self.root}': its driver state does not load "
                f"({type(exc).__name__}: {exc}); the classes it holds (ctx.state, listener "
                "state) must be importable as when it was written; otherwise start over with "
                "an empty checkpoint directory"
            ) from exc
        return Checkpoint(
            epoch=epoch,
            fingerprint=manifest["fingerprint"],
            variables={n: self._parquet(f"{base}/variables/{n}") for n in manifest["variables"]},
            outputs={n: self._parquet(f"{base}/outputs/{n}") for n in manifest["outputs"]},
            driver=driver,
            segments=segments,
        )

    # -- writing -------------------------------------------------------------------

    def write(
        self,
        epoch: int,
        *,
        fingerprint: Mapping[str, Any],
        variables: Mapping[str, DataFrame],
        outputs: Mapping[str, DataFrame],
        driver: DriverSnapshot,
    ) -> None:
        """Write epoch ``epoch`` and commit it; then delete epochs beyond ``keep``, and the
        history segments no epoch left names."""
        base = self._path(epoch_dir(epoch))
        self._check_lease()
        self.files.delete(base)  # what an interrupted earlier write left
        for kind, frames in (("variables", variables), ("outputs", outputs)):
            for name, df in frames.items():
                df.write.mode("overwrite").parquet(f"{base}/{kind}/{name}")
        for name, raw in driver.new:
            self.files.write_bytes(self._path(name), raw)
        # Never commit a history with a hole: the segments of earlier checkpoints it reads
        # must all be there (they are, unless something else deleted them).
        missing = self._missing(driver.segments)
        if missing is not None:
            raise IterflowError(f"epoch {epoch}: {missing}; the checkpoint is not committed")
        self.files.write_bytes(f"{base}/{DRIVER}", driver.driver)
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "fingerprint": dict(fingerprint),
            "variables": sorted(variables),
            "outputs": sorted(outputs),
            "files": self.files.file_sizes(base),
            "driver_sha256": hashlib.sha256(driver.driver).hexdigest(),
            "history": [attrs.asdict(segment) for segment in driver.segments],
        }
        # The manifest is the commit marker: once it is there, whole, the epoch exists.
        raw = json.dumps(manifest, sort_keys=True).encode()
        self.files.write_bytes(f"{base}/{MARKER}", raw, atomic=True)
        try:
            self._prune(epoch)
        except Exception as exc:  # epoch ``epoch`` is committed all the same
            warnings.warn(
                f"checkpoint epoch {epoch} committed, but older epochs in '{self.root}' "
                f"could not be deleted: {exc}",
                IterflowWarning,
                stacklevel=2,
            )

    def _prune(self, committed: int) -> None:
        self._check_lease()
        older = [e for e in self.epochs() if e < committed]
        committed_older = [e for e in older if self.files.exists(self._path(epoch_dir(e), MARKER))]
        keep = set(committed_older[-(self.keep - 1) :])
        for epoch in older:
            if epoch not in keep:
                self.files.delete(self._path(epoch_dir(epoch)))
        self._prune_history()

    def _prune_history(self) -> None:
        """Delete the history segments that no epoch directory left names. Runs after a
        commit, with no other write in flight: a segment not named by a manifest then
        belongs to an epoch deleted, or to a write that never committed."""
        named: set[str] = set()
        for epoch in self.epochs():
            try:
                manifest = self._manifest(epoch)
            except Exception:  # no marker or a damaged one: it cannot be resumed from
                continue
            named.update(segment.name for segment in _segments(manifest))
        for name in self.files.children(self._path(HISTORY)):
            if f"{HISTORY}/{name}" not in named:
                self.files.delete(self._path(HISTORY, name))

    def _check_lease(self) -> None:
        """Raise ``CheckpointInUseError`` when another run has taken the directory over."""
        if self.lease is not None:
            self.lease.check()

    def clear(self) -> None:
        """Delete every epoch directory and the history (an explicit fresh start)."""
        self._check_lease()
        for epoch in self.epochs():
            self.files.delete(self._path(epoch_dir(epoch)))
        self.files.delete(self._path(HISTORY))


def _segment(rounds: list[Any], *, level: int) -> tuple[HistorySegment, bytes]:
    """A history segment of ``rounds`` (``RoundProgress``, in order), and its content."""
    raw = bytes(dumps(rounds))
    first, last = rounds[0].epoch, rounds[-1].epoch
    segment = HistorySegment(
        name=f"{HISTORY}/{first:08d}-{last:08d}-{uuid.uuid4().hex[:12]}.pkl",
        first=first,
        last=last,
        size=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        level=level,
    )
    return segment, raw


def _segments(manifest: Mapping[str, Any]) -> tuple[HistorySegment, ...]:
    """The history segments a manifest names (none in checkpoints written before them)."""
    return tuple(HistorySegment(**segment) for segment in manifest.get("history", ()))


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
        checkpoint = self.latest(strict=self.options.strict)
        if checkpoint is None:
            return None
        problems = fingerprint_differences(checkpoint.fingerprint, self.fingerprint)
        if problems:
            raise IterflowValueError(
                f"{self.options.option} '{self.store.root}' holds checkpoints of another "
                "iteration: "
                + "; ".join(problems)
                + f". Bind the same inputs to the same body to resume, or "
                f"{self.options.fresh_start}"
            )
        return checkpoint

    def latest(self, *, strict: bool = False) -> Checkpoint | None:
        """The newest valid checkpoint (``CheckpointStore.latest``); the history the run
        continues with is its history."""
        checkpoint = self.store.latest(strict=strict, remedy=self.options.fresh_start)
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
        segment, content[segment.name] = _segment(fresh, level=0)
        segments.append(segment)
        while len(segments) >= MERGE and len({s.level for s in segments[-MERGE:]}) == 1:
            merged = segments[-MERGE:]
            # The rounds they hold that this run keeps (older ones are not kept any more).
            rounds = [p for p in history if merged[0].first <= p.epoch <= merged[-1].last]
            segment, content[segment.name] = _segment(rounds, level=merged[0].level + 1)
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
            warnings.warn(
                f"the checkpoint of epoch {exc.epoch} was skipped: a block of its data was lost "
                "before the write read it (an executor was lost); the next checkpoint covers "
                "the rounds since the last one",
                IterflowWarning,
                stacklevel=2,
            )

    def close(self) -> None:
        """Give the directory's lease back (the run has ended, its writes are done)."""
        self.lease.release()

    def settle(self) -> None:
        """Let a pending write finish when the run fails; its own failure only warns."""
        try:
            self.writer.wait()
        except IterflowError as exc:
            warnings.warn(str(exc), IterflowWarning, stacklevel=2)
