"""Metrics by name, and their bookkeeping per run and per round. Pure Python.

A metric handle (``Counter``, ``Distribution``, ``Gauge``) is created on the
driver and records *states*: a counter's int, a distribution's
``(count, sum, min, max)``, a gauge's ``(stamp, value)``. On the driver, states
go to the active run's current round. A handle captured by a function that runs
on executors travels as a pickle; the Spark bridge (the only module of this
package that imports Spark) makes the executor copy record into an accumulator,
keyed by the run and epoch of the Spark job that ran the task.

A run seals a round when the next one starts or the run ends: a completed
round's states count as committed and attempted, a failed or rolled-back
round's as attempted only.
"""

from __future__ import annotations

import math
import numbers
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, ClassVar, Protocol

from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.metrics.values import (
    DistributionValue,
    Kind,
    MetricResult,
    MetricsSnapshot,
    Value,
)

State = Any  # int | tuple[int, float, float, float] | tuple[float, float]
# Executor states of one run: (epoch, name, kind) -> state.
ExecutorStates = Mapping[tuple[int, str, Kind], State]

Recorder = Callable[[str, Kind, State], None]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")


def merge_state(kind: Kind, a: State, b: State) -> State:
    """Two states of one metric as one; associative and commutative."""
    if kind == "counter":
        return a + b
    if kind == "distribution":
        return (a[0] + b[0], a[1] + b[1], min(a[2], b[2]), max(a[3], b[3]))
    return max(a, b)  # gauge: (stamp, value), the latest wins


def add_state(kind: Kind, total: State | None, state: State) -> State:
    """``state`` merged into ``total`` (None: nothing recorded yet)."""
    return state if total is None else merge_state(kind, total, state)


def state_value(kind: Kind, state: State | None) -> Value:
    """The reported value of a state: an int, a DistributionValue, a float or None."""
    if kind == "counter":
        return 0 if state is None else int(state)
    if kind == "distribution":
        if state is None:
            return DistributionValue()
        count, total, low, high = state
        return DistributionValue(count=count, sum=total, min=low, max=high)
    return None if state is None else state[1]


def _number(metric: Metric, operation: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise IterflowTypeError(
            f"metric '{metric.name}': {operation} takes a number, got {type(x).__name__} {x!r}"
        )
    value = float(x)
    if not math.isfinite(value):
        raise IterflowValueError(
            f"metric '{metric.name}': {operation} got {value}; record finite numbers only"
        )
    return value


class Metric:
    """A named metric; get one with ``itf.metrics.counter/distribution/gauge(name)``."""

    kind: ClassVar[Kind]

    def __init__(self, name: str, registry: Registry, record: Recorder | None = None) -> None:
        self._name = name
        self._registry = registry
        # Where updates go: the registry's active run, or (inside a Spark task) the bridge.
        self._recorder: Recorder = record or registry.record

    @property
    def name(self) -> str:
        return self._name

    def _record(self, state: State) -> None:
        self._recorder(self._name, self.kind, state)

    def __reduce__(self) -> tuple[Any, ...]:
        # Captured by a function shipped to executors: the bridge decides what travels.
        return self._registry.bridge().reduce(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"


class Counter(Metric):
    """Counts events: ``inc(n=1)``."""

    kind = "counter"

    def inc(self, n: int = 1) -> None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise IterflowTypeError(
                f"metric '{self.name}': inc() takes an int, got {type(n).__name__} {n!r}"
            )
        self._record(int(n))


class Distribution(Metric):
    """Summarizes values: ``update(x)``; reports count, sum, min, max and mean."""

    kind = "distribution"

    def update(self, x: float) -> None:
        value = _number(self, "update()", x)
        self._record((1, value, value, value))


class Gauge(Metric):
    """The latest of the values ``set(x)`` received."""

    kind = "gauge"

    def set(self, x: float) -> None:
        self._record((time.time(), _number(self, "set()", x)))


KIND_CLASSES: dict[Kind, type[Metric]] = {
    "counter": Counter,
    "distribution": Distribution,
    "gauge": Gauge,
}


class Bridge(Protocol):
    """How metrics reach Spark executors; implemented by ``iterflow.metrics._spark``."""

    def on_executor(self) -> bool: ...

    def reduce(self, metric: Metric) -> tuple[Any, ...]: ...


class _NoBridge:
    def on_executor(self) -> bool:
        return False

    def reduce(self, metric: Metric) -> tuple[Any, ...]:
        raise IterflowError(
            f"metric '{metric.name}' cannot travel to executors: no Spark bridge is loaded; "
            "import iterflow before building functions that capture metrics"
        )


class _Round:
    """What one epoch recorded on the driver, and how it ended."""

    def __init__(self) -> None:
        self.driver: dict[tuple[str, Kind], State] = {}
        self.completed = False


class RunMetrics:
    """The metrics of one ``run()``: per-round values, committed and attempted totals.

    ``executor_states`` returns what executors recorded for this run so far;
    ``forget`` drops the executor states of sealed epochs.
    """

    def __init__(
        self,
        *,
        iteration: str,
        run_id: str,
        kinds: Mapping[str, Kind],
        executor_states: Callable[[], ExecutorStates] = dict,
        forget: Callable[[Iterable[int]], None] = lambda epochs: None,
    ) -> None:
        self.iteration = iteration
        self.run_id = run_id
        #: When the run began: the start of its cumulative totals for OTLP.
        self.started_at = datetime.now(timezone.utc)
        self._executor_states = executor_states
        self._forget = forget
        self._lock = threading.Lock()
        self._kinds: dict[str, Kind] = dict(kinds)
        self._rounds: dict[int, _Round] = {}
        self._current: int | None = None
        self._last_completed: int | None = None
        # Sealed rounds a rollback may still go back before: epoch -> (completed, states);
        # their running totals below (``settle`` folds the others into the base).
        self._sealed: dict[int, tuple[bool, dict[tuple[str, Kind], State]]] = {}
        self._committed: dict[str, State] = {}
        self._attempted: dict[str, State] = {}
        # Committed totals restored from a checkpoint, and of the rounds settled since.
        self._base_committed: dict[str, State] = {}

    # -- recording ---------------------------------------------------------------

    def declare(self, name: str, kind: Kind) -> None:
        with self._lock:
            self._kinds.setdefault(name, kind)

    def record(self, name: str, kind: Kind, state: State) -> None:
        """A driver-side update; before round 0 starts it counts toward round 0."""
        with self._lock:
            self._kinds.setdefault(name, kind)
            epoch = 0 if self._current is None else self._current
            cells = self._rounds.setdefault(epoch, _Round()).driver
            key = (name, kind)
            cells[key] = add_state(kind, cells.get(key), state)

    def start_round(self, epoch: int) -> None:
        """Round ``epoch`` starts: earlier rounds are sealed into the totals."""
        with self._lock:
            self._seal(lambda e: e < epoch)
            self._rounds.setdefault(epoch, _Round())
            self._current = epoch

    def complete_round(self, epoch: int) -> None:
        """Round ``epoch`` completed: its updates become committed."""
        with self._lock:
            self._rounds.setdefault(epoch, _Round()).completed = True
            self._last_completed = epoch

    def settle(self, before: int) -> None:
        """No rollback will go back before epoch ``before``: fold the sealed rounds before
        it into the base totals and forget them (else one entry per round stays in memory
        for the whole run)."""
        with self._lock:
            settled = [e for e in self._sealed if e < before]
            for epoch in settled:
                completed, states = self._sealed.pop(epoch)
                if completed:
                    self._fold(self._base_committed, states)

    def roll_back(self, epoch: int) -> None:
        """Round ``epoch`` will run again: what it recorded so far counts as attempted only."""
        with self._lock:
            for e, round_ in self._rounds.items():
                round_.completed = round_.completed and e < epoch
            self._seal(lambda e: e >= epoch)
            if self._last_completed is not None and self._last_completed >= epoch:
                self._last_completed = epoch - 1 if epoch > 0 else None
            redone = [e for e, (completed, _) in self._sealed.items() if completed and e >= epoch]
            for e in redone:
                self._sealed[e] = (False, self._sealed[e][1])
            if redone:
                self._committed = dict(self._base_committed)
                for completed, states in self._sealed.values():
                    if completed:
                        self._fold(self._committed, states)

    def finish(self) -> dict[str, MetricResult]:
        """The run ended: seal every round and return the totals."""
        with self._lock:
            self._seal(lambda e: True)
            return self._results(self._committed, self._attempted)

    def roll_up(self, outer: RunMetrics) -> None:
        """Count what this (nested, finished) run committed toward ``outer``'s current
        round, as driver-side updates there."""
        with self._lock:
            kinds, committed = dict(self._kinds), dict(self._committed)
        for name, kind in kinds.items():
            outer.declare(name, kind)
            if name in committed:
                outer.record(name, kind, committed[name])

    def export(self) -> dict[str, Any]:
        """The committed and attempted states so far, for a durable checkpoint."""
        executor = self._executor_states()
        with self._lock:
            committed, attempted = self._running_totals(executor)
            return {
                "kinds": dict(self._kinds),
                "committed": committed,
                "attempted": attempted,
                "last_completed": self._last_completed,
            }

    def restore(self, exported: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's ``export()``: its totals are this run's base."""
        with self._lock:
            for name, kind in exported["kinds"].items():
                self._kinds.setdefault(name, kind)
            self._committed = dict(exported["committed"])
            self._base_committed = dict(exported["committed"])
            self._attempted = dict(exported["attempted"])
            self._last_completed = exported["last_completed"]

    # -- reading -----------------------------------------------------------------

    def round_values(self, epoch: int) -> dict[str, Value]:
        """What round ``epoch`` recorded so far, for every metric of the run.

        A gauge the round did not set shows its latest committed value.
        """
        executor = self._executor_states()
        with self._lock:
            states = self._epoch_states(epoch, executor)
            values: dict[str, Value] = {}
            for name, kind in sorted(self._kinds.items()):
                state = states.get((name, kind))
                if kind == "gauge" and state is None:
                    state = self._committed.get(name)
                values[name] = state_value(kind, state)
            return values

    def totals(self) -> dict[str, MetricResult]:
        """Committed and attempted totals, including the rounds not sealed yet."""
        executor = self._executor_states()
        with self._lock:
            return self._results(*self._running_totals(executor))

    def snapshot(self, final: bool) -> MetricsSnapshot:
        """The totals as a snapshot for sinks."""
        metrics = self.totals()
        return MetricsSnapshot(
            iteration=self.iteration,
            run_id=self.run_id,
            time=datetime.now(timezone.utc),
            epoch=self._last_completed,
            final=final,
            metrics=metrics,
            started_at=self.started_at,
        )

    # -- internals (called with the lock held) -------------------------------------

    def _epoch_states(self, epoch: int, executor: ExecutorStates) -> dict[tuple[str, Kind], State]:
        round_ = self._rounds.get(epoch)
        states = dict(round_.driver) if round_ else {}
        for (e, name, kind), state in executor.items():
            if e == epoch:
                self._kinds.setdefault(name, kind)
                states[(name, kind)] = add_state(kind, states.get((name, kind)), state)
        return states

    def _seal(self, which: Callable[[int], bool]) -> None:
        epochs = sorted(e for e in self._rounds if which(e))
        if not epochs:
            return
        executor = self._executor_states()
        for epoch in epochs:
            states = self._epoch_states(epoch, executor)
            completed = self._rounds.pop(epoch).completed
            # The latest attempt of the epoch; earlier ones are in the attempted totals.
            self._sealed[epoch] = (completed, states)
            self._fold(self._attempted, states)
            if completed:
                self._fold(self._committed, states)
        self._forget(epochs)

    @staticmethod
    def _fold(totals: dict[str, State], states: Mapping[tuple[str, Kind], State]) -> None:
        for (name, kind), state in states.items():
            totals[name] = add_state(kind, totals.get(name), state)

    def _running_totals(
        self, executor: ExecutorStates
    ) -> tuple[dict[str, State], dict[str, State]]:
        """Committed and attempted states: the sealed totals plus the rounds not sealed yet."""
        committed, attempted = dict(self._committed), dict(self._attempted)
        for epoch, round_ in self._rounds.items():
            states = self._epoch_states(epoch, executor)
            self._fold(attempted, states)
            if round_.completed:
                self._fold(committed, states)
        return committed, attempted

    def _results(
        self, committed: Mapping[str, State], attempted: Mapping[str, State]
    ) -> dict[str, MetricResult]:
        return {
            name: MetricResult(
                kind=kind,
                committed=state_value(kind, committed.get(name)),
                attempted=state_value(kind, attempted.get(name)),
            )
            for name, kind in sorted(self._kinds.items())
        }


class Registry:
    """Metrics by name for this process, and the runs that record them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, Metric] = {}
        # Metrics created since the last run ended belong to the next run.
        self._pending: dict[str, Kind] = {}
        self._runs: list[RunMetrics] = []
        self._bridge: Bridge = _NoBridge()

    def install(self, bridge: Bridge) -> None:
        self._bridge = bridge

    def bridge(self) -> Bridge:
        return self._bridge

    def get(self, name: str, kind: Kind) -> Metric:
        """The metric ``name`` of ``kind``, created on first use."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise IterflowValueError(
                f"metric name {name!r} is not valid; use letters, digits, '_' and '.', "
                "starting with a letter or '_' (e.g. 'rows_seen')"
            )
        if self._bridge.on_executor():
            raise IterflowError(
                f"metric '{name}' was created inside a Spark task; create metrics on the "
                "driver (in the body, a listener or before run()) and use them in the function"
            )
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = self._metrics[name] = KIND_CLASSES[kind](name, self)
            elif metric.kind != kind:
                raise IterflowValueError(
                    f"metric '{name}' is a {metric.kind} already; it cannot also be a {kind}, "
                    "use another name"
                )
            if self._runs:
                self._runs[-1].declare(name, kind)
            else:
                self._pending[name] = kind
            return metric

    def record(self, name: str, kind: Kind, state: State) -> None:
        """A driver-side update; outside a run it is not counted (values are per run)."""
        with self._lock:
            run = self._runs[-1] if self._runs else None
        if run is not None:
            run.record(name, kind, state)

    def begin_run(
        self,
        *,
        iteration: str,
        run_id: str,
        executor_states: Callable[[], ExecutorStates] = dict,
        forget: Callable[[Iterable[int]], None] = lambda epochs: None,
    ) -> RunMetrics:
        """A run starts: it takes the metrics declared for it and every later update."""
        with self._lock:
            run = RunMetrics(
                iteration=iteration,
                run_id=run_id,
                kinds=self._pending,
                executor_states=executor_states,
                forget=forget,
            )
            self._pending = {}
            self._runs.append(run)
            return run

    def end_run(self, run: RunMetrics) -> None:
        with self._lock:
            if run in self._runs:
                self._runs.remove(run)


REGISTRY = Registry()


def counter(name: str) -> Counter:
    """The counter ``name`` (created on first use): ``inc(n=1)``.

    Example::

        seen = itf.metrics.counter("rows_seen")
        seen.inc(10)
    """
    metric = REGISTRY.get(name, "counter")
    assert isinstance(metric, Counter)
    return metric


def distribution(name: str) -> Distribution:
    """The distribution ``name`` (created on first use): ``update(x)``."""
    metric = REGISTRY.get(name, "distribution")
    assert isinstance(metric, Distribution)
    return metric


def gauge(name: str) -> Gauge:
    """The gauge ``name`` (created on first use): ``set(x)``, reports the latest value."""
    metric = REGISTRY.get(name, "gauge")
    assert isinstance(metric, Gauge)
    return metric
