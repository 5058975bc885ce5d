"""The Spark bridge of ``iterflow.metrics``: executor-side updates through an accumulator.

The only module of the metrics package that imports Spark. One accumulator per
SparkContext holds what executors recorded, keyed by ``(run_id, epoch, name,
kind)``. The run and epoch come from the local property the round loop sets on
its thread (``iterflow.round``), which Spark hands to every task of the jobs
that thread runs; so an update counts toward the round whose job ran the task,
whenever the function that made it was pickled. Spark drops the updates of
failed task attempts and merges those of successful ones before the job ends.

Resident tasks (``iterflow.runtime.datacache.resident``) outlive their rounds: inside one,
``captured(run_id, epoch)`` collects the updates of a kernel call instead, which
the task ships to the driver with the call's outputs and the driver adds with
``SparkBridge.merge`` once the whole call succeeded (a failed call's updates are
dropped, as Spark drops those of failed attempts).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from pyspark import SparkContext, TaskContext
from pyspark.accumulators import Accumulator, AccumulatorParam

from iterflow.errors import IterflowError, IterflowWarning
from iterflow.metrics.registry import (
    KIND_CLASSES,
    REGISTRY,
    ExecutorStates,
    Metric,
    State,
    add_state,
)
from iterflow.metrics.values import Kind

ROUND_PROPERTY = "iterflow.round"
#: The run id of updates made by tasks of jobs without a round tag.
UNTAGGED = ""

Key = tuple[str, int, str, Kind]

#: Where updates made in this process go instead of the accumulator, and for which
#: round: set by ``captured`` around a resident kernel call (executor side).
_CAPTURE: tuple[tuple[str, int], dict[Key, State]] | None = None


@contextmanager
def captured(run_id: str, epoch: int) -> Iterator[dict[Key, State]]:
    """Inside, metric updates made in this task count toward round ``epoch`` of ``run_id``
    and land in the yielded dict, not in the accumulator (resident tasks only)."""
    global _CAPTURE
    updates: dict[Key, State] = {}
    previous, _CAPTURE = _CAPTURE, ((run_id, epoch), updates)
    try:
        yield updates
    finally:
        _CAPTURE = previous


def add_updates(into: dict[Key, State], updates: dict[Key, State]) -> dict[Key, State]:
    """``updates`` (``captured``) added to ``into``, in place: what the processes of one
    resident task recorded in one kernel call, made one task's updates."""
    for key, state in updates.items():
        into[key] = add_state(key[3], into.get(key), state)
    return into


class _StatesParam(AccumulatorParam[dict[Key, State]]):
    """Accumulates ``{(run_id, epoch, name, kind): state}`` dicts."""

    def zero(self, value: dict[Key, State]) -> dict[Key, State]:
        return {}

    def addInPlace(self, value1: dict[Key, State], value2: dict[Key, State]) -> dict[Key, State]:
        return add_updates(value1, value2)


class _AccumulatorRecorder:
    """Records the updates of a metric unpickled inside a Spark task into the accumulator.

    Called once per update, often once per row: the task's round tag is parsed
    once per task, and states merge straight into the task-local value.
    """

    def __init__(self, accumulator: Accumulator[dict[Key, State]]) -> None:
        self._accumulator = accumulator
        # Python workers reuse one TaskContext object: the attempt id tells tasks apart.
        self._attempt: int | None = None
        self._round: tuple[str, int] = (UNTAGGED, -1)

    def __call__(self, name: str, kind: Kind, state: State) -> None:
        if _CAPTURE is not None:  # a resident kernel call: the updates travel with its outputs
            tag, updates = _CAPTURE
            key = (*tag, name, kind)
            updates[key] = add_state(kind, updates.get(key), state)
            return
        context = TaskContext.get()
        attempt = context.taskAttemptId() if context else None
        if attempt is None or attempt != self._attempt:
            self._attempt = attempt
            token = context.getLocalProperty(ROUND_PROPERTY) if context else None
            if token is None:
                # A job outside any round: not counted (values are per run), but its
                # metric names are kept so a run can warn about them.
                self._round = (UNTAGGED, -1)
            else:
                run_id, epoch = token.rsplit(":", 1)
                self._round = (run_id, int(epoch))
        key = (*self._round, name, kind)
        values = self._accumulator._value  # this task's own value, sent when it ends
        values[key] = add_state(kind, values.get(key), state)


#: Whether this process is a resident task's kernel process (``resident_pool``): a task's
#: helper without a TaskContext of its own, whose metrics record as the task's do.
_KERNEL_PROCESS = False


def kernel_process() -> None:
    """Mark this process as a resident task's kernel process."""
    global _KERNEL_PROCESS
    _KERNEL_PROCESS = True


def _in_task() -> bool:
    return _KERNEL_PROCESS or TaskContext.get() is not None


def _restore(name: str, kind: Kind, accumulator: Accumulator[dict[Key, State]]) -> Metric:
    """Unpickle a metric: inside a task it records into the accumulator; on the driver
    it is the registry's handle."""
    if not _in_task():
        return REGISTRY.get(name, kind)
    return KIND_CLASSES[kind](name, REGISTRY, _AccumulatorRecorder(accumulator))


def _not_recorded(name: str, kind: Kind) -> Metric:
    """Unpickle a metric shipped over Spark Connect: inside a task its updates go nowhere
    (there is no accumulator to carry them); on the driver it is the registry's handle."""
    if not _in_task():
        return REGISTRY.get(name, kind)
    return KIND_CLASSES[kind](name, REGISTRY, lambda _name, _kind, _state: None)


def _spark_connect() -> bool:
    """Whether this process runs PySpark in Spark Connect mode."""
    from pyspark.sql.utils import is_remote

    return bool(is_remote())


class SparkBridge:
    """Ships metrics to executors of classic sessions and reads back what they recorded."""

    def __init__(self) -> None:
        self._context: SparkContext | None = None
        self._accumulator: Accumulator[dict[Key, State]] | None = None
        self._unrecorded: set[str] = set()  # metrics warned about over Spark Connect
        # What resident kernel calls recorded: kept apart from the accumulator's value,
        # which the accumulator server thread updates on its own.
        self._resident: dict[Key, State] = {}
        self._resident_lock = threading.Lock()

    def on_executor(self) -> bool:
        return _in_task()

    def accumulator(self) -> Accumulator[dict[Key, State]]:
        context = SparkContext._active_spark_context
        if context is None:
            raise IterflowError(
                "metrics cannot be updated inside executor functions without a classic "
                "SparkContext (under Spark Connect there are no accumulators); update them "
                "on the driver, e.g. from a listener"
            )
        if self._accumulator is None or self._context is not context:
            self._accumulator = context.accumulator({}, _StatesParam())
            self._context = context
        return self._accumulator

    def reduce(self, metric: Metric) -> tuple[Any, ...]:
        if _spark_connect():
            # Spark Connect runs Python functions without accumulators: updates made in
            # them cannot come back. The function still runs; the driver is told once.
            if metric.name not in self._unrecorded:
                self._unrecorded.add(metric.name)
                warnings.warn(
                    f"metric '{metric.name}' was pickled for Spark tasks; over Spark Connect "
                    "there are no accumulators, so updates made inside executor functions "
                    "are not recorded: update it on the driver (e.g. from a listener)",
                    IterflowWarning,
                    stacklevel=2,
                )
            return (_not_recorded, (metric.name, metric.kind))
        return (_restore, (metric.name, metric.kind, self.accumulator()))

    def merge(self, updates: dict[Key, State]) -> None:
        """Add what a resident kernel call recorded (``captured``) to the executors' states."""
        with self._resident_lock:
            _StatesParam().addInPlace(self._resident, updates)

    def executor_states(self, run_id: str) -> ExecutorStates:
        """What executors recorded for ``run_id``: ``(epoch, name, kind) -> state``."""
        return {(e, n, k): s for (r, e, n, k), s in self._states().items() if r == run_id}

    def take_untagged(self) -> set[str]:
        """Names of metrics that tasks of untagged jobs updated (jobs started outside a
        round, e.g. from a plain Python thread) since the last call; forgets them."""
        keys = [key for key in self._states() if key[0] == UNTAGGED]
        self._drop(keys)
        return {key[2] for key in keys}

    def forget(self, run_id: str, epochs: Iterable[int]) -> None:
        """Drop what executors recorded for sealed ``epochs`` of ``run_id``."""
        sealed = set(epochs)
        self._drop([key for key in self._states() if key[0] == run_id and key[1] in sealed])

    def _states(self) -> dict[Key, State]:
        """What executors recorded: a copy of the accumulator's value (none without one
        for the active context) with what resident kernel calls recorded added."""
        accumulator = self._accumulator
        states: dict[Key, State] = {}
        if accumulator is not None and self._context is SparkContext._active_spark_context:
            # A C-level copy: the accumulator server thread may be merging meanwhile.
            states = dict(accumulator._value)
        with self._resident_lock:
            return _StatesParam().addInPlace(states, self._resident)

    def _drop(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        if self._accumulator is not None:
            for key in keys:
                self._accumulator._value.pop(key, None)
        with self._resident_lock:
            for key in keys:
                self._resident.pop(key, None)

    @contextmanager
    def round_property(
        self, context: SparkContext | None, run_id: str, epoch: int
    ) -> Iterator[None]:
        """Tag the jobs this thread runs as round ``epoch`` of ``run_id`` while inside."""
        if context is None:  # Spark Connect: executor updates are refused when pickled
            yield
            return
        previous = context.getLocalProperty(ROUND_PROPERTY)
        context.setLocalProperty(ROUND_PROPERTY, f"{run_id}:{epoch}")
        try:
            yield
        finally:
            context.setLocalProperty(ROUND_PROPERTY, previous)  # type: ignore[arg-type]


BRIDGE = SparkBridge()
REGISTRY.install(BRIDGE)
