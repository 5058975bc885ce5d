"""``BoundedIteration``: bind inputs, add conditions and listeners, run."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.body import IterationBody, body
from iterflow.bounded.loop import RoundLoop
from iterflow.bounded.result import IterationResult
from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.metrics.pusher import validate_interval
from iterflow.metrics.sinks import MetricsSink
from iterflow.progress.listeners import ListenerSet
from iterflow.runtime.checkpoint import Checkpointing, CheckpointOptions, fingerprint
from iterflow.runtime.observers import ObserverOptions, RunObservers
from iterflow.runtime.schema import describe_inputs
from iterflow.runtime.session import session_of
from iterflow.termination import Condition


@attrs.frozen
class Binding:
    name: str
    data: Any  # a DataFrame, or rows/pandas to turn into one with the run's session
    replay: bool


class BoundedIteration:
    """A bounded iteration of ``body``.

    Example::

        result = (itf.BoundedIteration(step)
                    .bind("ranks", ranks).bind("edges", edges)
                    .until(itf.max_rounds(50))
                    .run())
    """

    def __init__(self, iteration_body: IterationBody | Callable[..., Any]) -> None:
        if not isinstance(iteration_body, IterationBody):
            if not callable(iteration_body):
                raise IterflowTypeError(
                    "BoundedIteration takes an iteration body (@itf.body function or "
                    f"IterationBody), got {type(iteration_body).__name__}"
                )
            iteration_body = body(iteration_body)
        self._body = iteration_body
        self._input_names = iteration_body.input_names
        self._bindings: dict[str, Binding] = {}
        self._conditions: list[Condition] = []
        self._listeners = ListenerSet()
        self._sinks: list[tuple[MetricsSink, float]] = []

    @property
    def body(self) -> IterationBody:
        return self._body

    def bind(self, name: str, data: Any, *, replay: bool = False) -> BoundedIteration:
        """Bind input ``name`` to a DataFrame (or rows / a pandas frame for the run's session).

        A variable's binding is its round-0 value. A data input is cached once and
        released at the end, unless ``replay=True``: then it is re-evaluated from
        its source every round.
        """
        if name not in self._input_names:
            raise IterflowValueError(
                f"bind('{name}'): body '{self._body.name}' has no input '{name}'; "
                f"its inputs are {list(self._input_names)}"
            )
        if name in self._bindings:
            raise IterflowValueError(
                f"bind('{name}'): input '{name}' is bound already; bind each input once"
            )
        self._bindings[name] = Binding(name, data, bool(replay))
        return self

    def until(self, *conditions: Condition) -> BoundedIteration:
        """Add termination conditions; the iteration stops when any of them holds."""
        for condition in conditions:
            if not isinstance(condition, Condition):
                raise IterflowTypeError(
                    "until() takes conditions such as itf.max_rounds(n), "
                    f"got {type(condition).__name__}"
                )
        self._conditions.extend(conditions)
        return self

    def listen(self, listener: Any, *, per_round: bool = False) -> BoundedIteration:
        """Add a RoundListener or a function called as ``on_round_end``.

        With ``per_round=True``, ``listener`` is a factory called for a fresh
        instance every round.
        """
        self._listeners.add(listener, per_round=per_round)
        return self

    def push_metrics(self, sink: MetricsSink, *, every_s: float = 5.0) -> BoundedIteration:
        """Push the run's metrics to ``sink`` every ``every_s`` seconds, and once at the end.

        The final push completes before ``run()`` returns. A failing sink logs a
        warning and never fails or stalls the iteration.
        """
        if not isinstance(sink, MetricsSink):
            raise IterflowTypeError(
                "push_metrics() takes a sink such as itf.metrics.JsonLinesSink(path), "
                f"got {type(sink).__name__}"
            )
        self._sinks.append((sink, validate_interval(sink, every_s)))
        return self

    def run(
        self,
        *,
        spark: SparkSession | None = None,
        progress: bool | None = None,
        event_log: str | os.PathLike[str] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 10,
        checkpoint_async: bool = True,
        checkpoint_keep: int = 2,
        resume: bool = True,
    ) -> IterationResult:
        """Run rounds until a termination condition holds; return the result.

        ``spark`` is the session for inputs bound as rows or pandas frames; by
        default the session of the bound DataFrames, else ``itf.session()``.
        ``progress`` shows a progress bar on stderr (default: when it is a
        terminal); ``event_log`` appends the run's events to a JSON-lines file
        (see docs/events.md).

        ``checkpoint_dir`` (any path Spark can write: local, ``hdfs://``,
        ``s3a://``) makes the run durable: every ``checkpoint_every`` rounds and
        after the last one, the variables and the driver-side state are written
        there (in the background unless ``checkpoint_async=False``), keeping the
        newest ``checkpoint_keep``. A later ``run()`` with the same directory and
        the same body and inputs resumes after the last committed epoch;
        ``resume=False`` deletes those checkpoints and starts over. See
        docs/checkpoints.md.
        """
        if progress is not None and not isinstance(progress, bool):
            raise IterflowTypeError(
                f"run(progress=...) takes True, False or None, got {progress!r}"
            )
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
            name: b.data if isinstance(b.data, DataFrame) else _to_dataframe(active, name, b.data)
            for name, b in self._bindings.items()
        }
        replay = {name for name, b in self._bindings.items() if b.replay}
        options = ObserverOptions(progress=progress, event_log=event_log, sinks=tuple(self._sinks))
        checkpointing = None
        if checkpoint_dir is not None:
            checkpointing = Checkpointing(
                active,
                CheckpointOptions(
                    directory=os.fspath(checkpoint_dir),
                    every=_at_least_one("checkpoint_every", checkpoint_every),
                    asynchronous=bool(checkpoint_async),
                    keep=_at_least_one("checkpoint_keep", checkpoint_keep),
                    resume=bool(resume),
                ),
                fingerprint(self._body.name, describe_inputs(inputs, replay)),
            )
        loop = RoundLoop(
            body=self._body,
            inputs={name: inputs[name] for name in self._input_names},
            replay=replay,
            conditions=tuple(self._conditions),
            listeners=self._listeners,
            observers=RunObservers(
                iteration=self._body.name,
                spark=active,
                options=options,
                static_conditions=self._conditions,
            ),
            checkpointing=checkpointing,
        )
        return loop.run()


def _at_least_one(option: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise IterflowTypeError(f"run({option}=...) takes an int, got {value!r}")
    if value < 1:
        raise IterflowValueError(f"run({option}={value}): pass 1 or more")
    return value


def _to_dataframe(spark: SparkSession, name: str, data: Any) -> DataFrame:
    try:
        return spark.createDataFrame(data)
    except Exception as exc:
        raise IterflowTypeError(
            f"bind('{name}', ...): cannot make a DataFrame of {type(data).__name__} ({exc}); "
            "bind a DataFrame, a pandas DataFrame or a list of rows"
        ) from exc
