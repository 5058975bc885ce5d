"""What both iteration kinds share before they run: the body, bindings, listeners, metric
sinks, and the assembly of a run's checkpointing and observers."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.body import IterationBody, body
from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.metrics.pusher import validate_timing
from iterflow.metrics.sinks import MetricsSink
from iterflow.progress.listeners import ListenerSet
from iterflow.runtime.checkpoint.format import fingerprint
from iterflow.runtime.checkpoint.output_sinks import Sink, sink_of
from iterflow.runtime.checkpoint.writer import Checkpointing, CheckpointOptions
from iterflow.runtime.progresstrack.observers import ObserverOptions, RunObservers
from iterflow.runtime.spark.schema import repeated_columns
from iterflow.runtime.spark.session import session_of
from iterflow.termination import Condition


@attrs.frozen
class Binding:
    name: str
    data: Any  # a DataFrame, or rows/pandas to turn into one with the run's session
    replay: bool = False  # bounded: re-evaluate from the source every round
    on_driver: bool = True  # bounded: a small variable may be held on the driver
    state: bool = False  # unbounded: a state variable, not work in flight


Builder = TypeVar("Builder", bound="IterationBuilder")


class IterationBuilder:
    """The chainable set-up shared by ``BoundedIteration`` and ``UnboundedIteration``."""

    kind = "Iteration"

    def __init__(self, iteration_body: IterationBody | Callable[..., Any]) -> None:
        if not isinstance(iteration_body, IterationBody):
            if not callable(iteration_body):
                raise IterflowTypeError(
                    f"{self.kind} takes an iteration body (@itf.body function or "
                    f"IterationBody), got {type(iteration_body).__name__}"
                )
            iteration_body = body(iteration_body)
        self._body = iteration_body
        self._input_names = iteration_body.input_names
        self._bindings: dict[str, Binding] = {}
        self._listeners = ListenerSet()
        self._sinks: list[tuple[MetricsSink, float]] = []
        self._notes: dict[str, Any] = {}
        self._sinks_by_output: dict[str, Sink] = {}

    @property
    def body(self) -> IterationBody:
        return self._body

    def _bind(self, binding: Binding) -> None:
        name = binding.name
        if name not in self._input_names:
            raise IterflowValueError(
                f"bind('{name}'): body '{self._body.name}' has no input '{name}'; "
                f"its inputs are {list(self._input_names)}"
            )
        if name in self._bindings:
            raise IterflowValueError(
                f"bind('{name}'): input '{name}' is bound already; bind each input once"
            )
        self._bindings[name] = binding

    def listen(self: Builder, listener: Any, *, per_round: bool = False) -> Builder:
        """Add a RoundListener or a function called as ``on_round_end``.

        With ``per_round=True``, ``listener`` is a factory called for a fresh
        instance every round.
        """
        self._listeners.add(listener, per_round=per_round)
        return self

    def note(self: Builder, **fields: Any) -> Builder:
        """Add ``fields`` (JSON values) to the run's ``iteration_started`` event, under
        ``notes``: what a library built on iterflow wants the event log to say about the
        run, such as which engine it chose and why."""
        self._notes.update(fields)
        return self

    def sink(self: Builder, name: str, target: Any) -> Builder:
        """Send output ``name`` of every round (epoch) to ``target``.

        ``target`` is an ``itf.FileSink(path, format=...)``: each round's rows under
        ``path/epoch=<n>`` (read back with an ``epoch`` column), exactly once, crashes and
        resumes included. Or a function ``(df, epoch) -> None``, called at least once per
        round and again with the same epoch and rows for a round that runs again after a
        crash: make it idempotent per epoch. A function with a ``discard_after(epoch)``
        method is told, as a ``FileSink`` is, to drop what it holds of the rounds after
        the one a run starts from (-1 on a fresh start); an unbounded run with
        ``commit_interval_s`` needs it.
        """
        if not isinstance(name, str) or not name:
            raise IterflowTypeError(f"sink() takes an output name (str), got {name!r}")
        if name in self._sinks_by_output:
            raise IterflowValueError(
                f"sink('{name}'): output '{name}' has a sink already; one sink per output"
            )
        self._sinks_by_output[name] = sink_of(name, target)
        return self

    def push_metrics(self: Builder, sink: MetricsSink, *, every_s: float = 5.0) -> Builder:
        """Push the run's metrics to ``sink`` every ``every_s`` seconds, and once at the end.

        The final push completes before the run ends, or is given up after the
        sink's ``timeout_s`` (twice that if a push was still under way), with an
        ``IterflowWarning`` saying what the sink missed. A failing sink logs a
        warning and never fails or stalls the iteration: pushes run on threads of
        their own, and no round waits for one.
        """
        if not isinstance(sink, MetricsSink):
            raise IterflowTypeError(
                "push_metrics() takes a sink such as itf.metrics.JsonLinesSink(path), "
                f"got {type(sink).__name__}"
            )
        self._sinks.append((sink, validate_timing(sink, every_s)))
        return self

    def _bound_inputs(
        self, spark: SparkSession | None
    ) -> tuple[SparkSession, dict[str, DataFrame]]:
        """The session and every input as a DataFrame, in the body's order; all must be bound."""
        unbound = [name for name in self._input_names if name not in self._bindings]
        if unbound:
            raise IterflowValueError(
                f"body '{self._body.name}': input(s) {unbound} are not bound; "
                + " ".join(f"call .bind('{name}', df)." for name in unbound)
            )
        frames = {
            name: b.data for name, b in self._bindings.items() if isinstance(b.data, DataFrame)
        }
        active = session_of(frames, spark)
        inputs = {
            name: frames[name] if name in frames else _to_dataframe(active, name, b.data)
            for name, b in self._bindings.items()
        }
        case_sensitive = str(active.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"
        for name, df in inputs.items():
            repeated = repeated_columns(df.columns, case_sensitive)
            if repeated:
                raise IterflowValueError(
                    f"bind('{name}', ...): input '{name}' has more than one column named "
                    + " and ".join(f"'{c}'" for c in repeated)
                    + f" (its columns are {df.columns}), so no column of that name can be "
                    "read; rename or drop the copies (a join on a list of names keeps one)"
                )
        return active, {name: inputs[name] for name in self._input_names}

    def _assemble(
        self,
        spark: SparkSession,
        *,
        described_inputs: Mapping[str, Mapping[str, Any]],
        checkpoints: CheckpointOptions | None,
        progress: bool | None,
        event_log: str | os.PathLike[str] | None,
        static_conditions: Sequence[Condition] = (),
        nestable: bool = True,
        progress_from: str | None = None,
        progress_interval_s: float = 0.5,
        event_log_progress_s: float = 5.0,
        run_id: str | None = None,
    ) -> tuple[Checkpointing | None, RunObservers]:
        """A run's checkpointing (None without ``checkpoints``), for the body and the
        ``described_inputs`` (their fingerprint), and its observers (progress bar, event
        log, metric sinks): what a bounded and an unbounded run both need to start."""
        checkpointing = None
        if checkpoints is not None:
            checkpointing = Checkpointing(
                spark, checkpoints, fingerprint(self._body.name, described_inputs)
            )
        observers = RunObservers(
            iteration=self._body.name,
            spark=spark,
            options=ObserverOptions(
                progress=progress,
                event_log=event_log,
                sinks=tuple(self._sinks),
                notes=dict(self._notes),
                nestable=nestable,
                progress_from=progress_from,
                progress_interval_s=check_interval("progress_interval_s", progress_interval_s),
                event_log_progress_s=check_interval("event_log_progress_s", event_log_progress_s),
            ),
            static_conditions=static_conditions,
            run_id=run_id,
        )
        return checkpointing, observers


def check_progress_option(progress: Any) -> None:
    if progress is not None and not isinstance(progress, bool):
        raise IterflowTypeError(f"progress=... takes True, False or None, got {progress!r}")


def at_least_one(option: str, value: int, *, zero: bool = False) -> int:
    """``value`` of ``option``, an int >= 1 (>= 0 when ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise IterflowTypeError(f"{option}=... takes an int, got {value!r}")
    if value < (0 if zero else 1):
        raise IterflowValueError(f"{option}={value}: pass {0 if zero else 1} or more")
    return value


def keep_history_option(value: int | None) -> int | None:
    """``keep_history=``: None (every round) or the int >= 1 of rounds of history kept."""
    return None if value is None else at_least_one("keep_history", value)


def _to_dataframe(spark: SparkSession, name: str, data: Any) -> DataFrame:
    try:
        return spark.createDataFrame(data)
    except Exception as exc:
        raise IterflowTypeError(
            f"bind('{name}', ...): cannot make a DataFrame of {type(data).__name__} ({exc}); "
            "bind a DataFrame, a pandas DataFrame or a list of rows"
        ) from exc


def check_interval(option: str, value: Any) -> float:
    """``value`` of ``option`` (seconds, 0 turns it off), as a float >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value >= 0 and math.isfinite(value))
    ):
        raise IterflowValueError(f"{option}={value!r}: pass a number of seconds >= 0 (0: off)")
    return float(value)
