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
import pickle
import re
import uuid
from collections.abc import Mapping
from typing import Any

import attrs
from pyspark.cloudpickle import dumps
from pyspark.sql import DataFrame

from iterflow.errors import IterflowValueError

FORMAT = 1
MARKER = "_COMMITTED"
DRIVER = "driver.pkl"
HISTORY = "history"
#: History segments of one level that merge into one of the next level.
MERGE = 16
EPOCH_DIR = re.compile(r"epoch-(\d{8})\Z")
#: Committed checkpoints pruning keeps at least: the newest, and the one a resume falls
#: back to when the newest does not verify.
MIN_KEEP = 2


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
    ("iterflow.progress.round", "RoundProgress"): "iterflow.reports",
    ("iterflow.unbounded.epochs", "StreamPosition"): "iterflow.unbounded.epoch_log",
    ("iterflow.runtime.checkpoint", "DriverState"): "iterflow.runtime.checkpoint.format",
    ("iterflow.graph.block_state", "Layout"): "iterflow.graph.block_layout",
}
#: Modules whose every class a checkpoint may name has moved: old module -> new one.
MOVED_MODULES = {
    "iterflow.records": "iterflow.reports",
    "iterflow.ml.model": "iterflow.ml.training",
    "iterflow.graph.model": "iterflow.graph.graphs",
}


class _DriverStateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        module = MOVED_MODULES.get(module, module)
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


def history_segment(rounds: list[Any], *, level: int) -> tuple[HistorySegment, bytes]:
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


def manifest_segments(manifest: Mapping[str, Any]) -> tuple[HistorySegment, ...]:
    """The history segments a manifest names (none in checkpoints written before them)."""
    return tuple(HistorySegment(**segment) for segment in manifest.get("history", ()))
