"""``UnboundedIteration``: an iteration body over streaming inputs, on Structured Streaming."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import TimestampType

from iterflow.body import IterationBody
from iterflow.builder import (
    Binding,
    IterationBuilder,
    at_least_one,
    check_progress_option,
    keep_history_option,
)
from iterflow.durations import duration_us, spark_interval
from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.runtime.checkpoint.output_sinks import Sink, check_discarding
from iterflow.runtime.checkpoint.writer import Checkpointing, CheckpointOptions
from iterflow.runtime.datacache.driver_variables import driver_rows
from iterflow.runtime.progresstrack.observers import RunObservers
from iterflow.runtime.spark.jvm import is_classic
from iterflow.runtime.spark.schema import describe_inputs
from iterflow.unbounded import connect_query
from iterflow.unbounded.committer import RETAINED_BATCHES_CONF
from iterflow.unbounded.connect_loop import BesideServer, Launch
from iterflow.unbounded.epochs import EpochLoop, EpochOptions
from iterflow.unbounded.event_time import WATERMARK_POLICY_CONF, EventTime, watermark_policy
from iterflow.unbounded.inputs import combined
from iterflow.unbounded.query import UnboundedQuery
from iterflow.unbounded.rewind import (
    EPOCHS_DIR,
    STREAM_DIR,
    check_offset_log,
    check_replayable,
    check_stream_checkpoint,
)


class UnboundedIteration(IterationBuilder):
    """An iteration whose inputs never end, run on Structured Streaming.

    Each micro-batch of the streaming inputs starts an epoch; work feedback is
    processed in further epochs before new input (feedback first); a state
    variable carries a value (a model, a total) from epoch to epoch.

    Example::

        query = (itf.UnboundedIteration(online_step)
                   .bind("model", initial_model, state=True)
                   .bind("points", spark.readStream.schema(s).json(folder))
                   .sink("model", itf.FileSink(out))
                   .start(checkpoint_location=ckpt, available_now=True))
        query.await_termination()
    """

    kind = "UnboundedIteration"

    def __init__(self, iteration_body: IterationBody | Callable[..., Any]) -> None:
        super().__init__(iteration_body)
        self._event_times: dict[str, tuple[str, int]] = {}  # name -> (column, max delay)

    def bind(
        self,
        name: str,
        data: Any,
        *,
        state: bool = False,
        event_time: str | None = None,
        max_delay: Any = None,
    ) -> UnboundedIteration:
        """Bind input ``name`` to a streaming DataFrame, or to a batch one.

        A streaming input's rows arrive micro-batch by micro-batch. A variable
        bound to a batch DataFrame takes it as its value at epoch 0; a data input
        bound to one is cached once and available every epoch. ``state=True``
        makes the variable a state variable: its feedback replaces its value each
        epoch and is never work in flight.

        ``event_time="ts"`` names the input's event-time column (a timestamp) and
        ``max_delay`` (a duration such as ``"10 minutes"``, default 0) how late its
        rows may arrive: a streaming input's watermark is the latest event time seen
        less ``max_delay``. A work variable's fed-back rows keep their event time and
        hold the loop's watermark behind the oldest one in flight. See
        ``ctx.window`` and ``ctx.join``.
        """
        timing = _event_time(name, data, state, event_time, max_delay)
        self._bind(Binding(name, data, state=bool(state)))
        self._event_times.pop(name, None)
        if timing is not None:
            self._event_times[name] = timing
        return self

    def start(
        self,
        *,
        checkpoint_location: str | os.PathLike[str] | None = None,
        available_now: bool = False,
        processing_time: Any = None,
        max_rows_per_epoch: int | None = None,
        max_feedback_rows: int = 0,
        max_epochs_per_batch: int = 100,
        progress: bool | None = None,
        event_log: str | os.PathLike[str] | None = None,
        spark: SparkSession | None = None,
        progress_interval_s: float = 0.5,
        event_log_progress_s: float = 5.0,
        commit_interval_s: float | None = None,
        keep_history: int | None = None,
        query_name: str | None = None,
    ) -> UnboundedQuery:
        """Start the streaming query; returns its handle, an ``UnboundedQuery``, at once.

        ``checkpoint_location`` (required) holds Spark's streaming checkpoint and iterflow's
        epoch log: ``start()`` again with the same location resumes exactly where the last
        commit left off. ``available_now=True`` reads what the inputs hold at start and
        ends once it and all work feedback are processed; ``processing_time="10 seconds"``
        (a duration: also ``10``, ``"10s"``, a ``timedelta``; docs/unbounded.md,
        "Durations") starts a micro-batch at that interval; without either, micro-batches
        run back to back until ``stop()``.

        New input is taken only while at most ``max_feedback_rows`` work feedback rows are
        in flight (feedback first; default 0: all of it is processed first).
        ``max_rows_per_epoch`` cuts large micro-batches into several epochs. After a
        micro-batch's input, up to ``max_epochs_per_batch`` epochs drain feedback before
        Spark may start the next micro-batch. ``progress_interval_s`` and
        ``event_log_progress_s`` sample running epochs as ``BoundedIteration.run`` does.

        ``commit_interval_s=None`` commits every micro-batch before Spark does. A number
        of seconds writes commits in the background instead, at most that often, so
        epochs do not wait for them; after a crash the epochs since the last commit run
        again (file sinks still hold every row once; a callable sink needs a
        ``discard_after(epoch)`` method to, and is refused without one). It needs
        sources that replay (files, Kafka, rate). See docs/unbounded.md, "Commits that
        do not stall the loop".

        ``keep_history=N`` keeps the last N epochs' ``RoundProgress`` in ``query.history``
        and the epoch log (default: 1,000, ``RECENT_EPOCHS``; docs/checkpoints.md).
        ``query_name`` names the stream in the Spark UI (``writeStream.queryName``). On a
        Spark Connect session the epochs run beside the server (docs/unbounded.md, "On
        Spark Connect")::

            with iteration.start(checkpoint_location=ckpt, query_name="ranks") as query:
                query.processAllAvailable()
        """
        location = _check_start(checkpoint_location, available_now, processing_time, progress)
        _check_name(query_name)
        interval = _commit_interval(commit_interval_s)
        active, inputs = self._bound_inputs(spark)
        limits = (max_rows_per_epoch, max_feedback_rows, max_epochs_per_batch)
        launch = Launch(
            location=location,
            options=_epoch_options(active, limits, interval, keep_history),
            progress=progress,
            event_log=None if event_log is None else os.fspath(event_log),
            progress_interval_s=progress_interval_s,
            event_log_progress_s=event_log_progress_s,
        )
        streams = self._streams(active, inputs)
        triggered = _trigger(available_now, processing_time)
        if not is_classic(active):  # refuses commit_interval_s, which _check_replays is for
            beside = BesideServer(iteration=self, inputs=inputs, streams=streams, launch=launch)
            checkpoints = _epoch_log_options(location, interval)
            return connect_query.started(
                active, beside, triggered, checkpoints, available_now, query_name
            )
        _check_replays(
            active, interval, {n: inputs[n] for n in streams}, self._sinks_by_output, location
        )
        loop, resumed_from = self.opened(active, inputs, streams, launch)
        return _started(loop, inputs, location, triggered, available_now, query_name, resumed_from)

    def opened(
        self,
        spark: SparkSession,
        inputs: Mapping[str, DataFrame],
        streams: tuple[str, ...],
        launch: Launch,
        *,
        check_stream: bool = True,
        announce: bool = True,
    ) -> tuple[EpochLoop, int | None]:
        """The epoch loop of ``start()``, continued from its epoch log (its epoch, or None
        from the beginning), its observers told (unless ``announce`` is off): ready for
        its stream's micro-batches. ``check_stream`` checks Spark's streaming checkpoint
        against the epoch log (before the stream starts; over Connect the client checks
        it)."""
        checkpointing, observers = self._assemble(
            spark,
            described_inputs=self._described(inputs, streams),
            checkpoints=_epoch_log_options(launch.location, launch.options.commit_interval_s),
            progress=launch.progress,
            event_log=launch.event_log,
            nestable=False,
            progress_interval_s=launch.progress_interval_s,
            event_log_progress_s=launch.event_log_progress_s,
            run_id=launch.run_id,
        )
        loop = self._epoch_loop(spark, inputs, streams, observers, checkpointing, launch.options)
        try:
            resumed_from = loop.restore()
            if check_stream:
                check_stream_checkpoint(
                    spark,
                    launch.location,
                    batch_id=loop.batch_id,
                    epoch=loop.epoch,
                    resumed=resumed_from is not None,
                    sinks=loop.sinks.values(),
                )
            if announce:
                observers.started(inputs, set(), (), resumed_from, resident=True)
        except BaseException as exc:
            loop.failed(exc)
            loop.close()
            raise
        return loop, resumed_from

    @property
    def _state_names(self) -> frozenset[str]:
        return frozenset(name for name, b in self._bindings.items() if b.state)

    def _described(
        self, inputs: Mapping[str, DataFrame], streams: tuple[str, ...]
    ) -> dict[str, dict[str, Any]]:
        """The inputs as the run's fingerprint and event log describe them."""
        return {
            name: {**described, "state": name in self._state_names, "streaming": name in streams}
            for name, described in describe_inputs(inputs, ()).items()
        }

    def _epoch_loop(
        self,
        spark: SparkSession,
        inputs: Mapping[str, DataFrame],
        streams: tuple[str, ...],
        observers: RunObservers,
        checkpointing: Checkpointing | None,
        options: EpochOptions,
    ) -> EpochLoop:
        assert checkpointing is not None  # the epoch log's checkpoints were given
        return EpochLoop(
            body=self._body,
            spark=spark,
            inputs=inputs,
            streams=streams,
            state_names=self._state_names,
            sinks=self._sinks_by_output,
            listeners=self._listeners,
            observers=observers,
            checkpointing=checkpointing,
            options=options,
            event_time=self._event_time(spark, streams),
        )

    def _event_time(self, spark: SparkSession, streams: tuple[str, ...]) -> EventTime | None:
        """The run's watermarks and event-time steps; None when no input has event time."""
        if not self._event_times:
            return None
        return EventTime(
            sources={n: t for n, t in self._event_times.items() if n in streams},
            columns={n: column for n, (column, _) in self._event_times.items()},
            policy=watermark_policy(spark.conf.get(WATERMARK_POLICY_CONF, None)),
        )

    def _streams(self, spark: SparkSession, inputs: Mapping[str, DataFrame]) -> tuple[str, ...]:
        """The streaming inputs' names; there must be one."""
        streams = tuple(name for name, df in inputs.items() if df.isStreaming)
        if not streams:
            raise IterflowValueError(
                f"body '{self._body.name}': no input is a streaming DataFrame; bind at least "
                "one spark.readStream... input, or run a BoundedIteration over batch inputs"
            )
        return streams


def _event_time(
    name: str, data: Any, state: bool, column: Any, max_delay: Any
) -> tuple[str, int] | None:
    """``bind(event_time=, max_delay=)`` checked: the column and the delay in microseconds."""
    if column is None:
        if max_delay is not None:
            raise IterflowValueError(
                f"bind('{name}', ..., max_delay={max_delay!r}) without event_time=: name the "
                "event-time column the delay applies to"
            )
        return None
    if not isinstance(column, str) or not column:
        raise IterflowTypeError(
            f"bind('{name}', ..., event_time={column!r}): give the event-time column's name"
        )
    if state:
        raise IterflowValueError(
            f"bind('{name}', ..., state=True, event_time='{column}'): a state variable is no "
            "stream of events (its value is replaced every epoch); bind event time on the "
            "streaming inputs and work variables"
        )
    if isinstance(data, DataFrame):
        if column not in data.columns:
            raise IterflowValueError(
                f"bind('{name}', ..., event_time='{column}'): no such column in {data.columns}"
            )
        kind = data.schema[column].dataType
        if not isinstance(kind, TimestampType):
            raise IterflowTypeError(
                f"bind('{name}', ..., event_time='{column}'): the column is "
                f"{kind.simpleString()}, not a timestamp; convert it, e.g. "
                f"F.timestamp_seconds('{column}') or F.col('{column}').cast('timestamp')"
            )
    delay = (
        0 if max_delay is None else duration_us(max_delay, f"bind('{name}', max_delay=)", zero=True)
    )
    return column, delay


def _started(
    loop: EpochLoop,
    inputs: Mapping[str, DataFrame],
    location: str,
    triggered: Callable[[Any], Any],
    available_now: bool,
    query_name: str | None,
    resumed_from: int | None,
) -> UnboundedQuery:
    """Start the stream of ``loop`` (restored from its epoch log): the running query."""
    try:
        writer = (
            combined({name: inputs[name] for name in loop.streams})
            .writeStream.foreachBatch(loop.on_batch)
            .option("checkpointLocation", f"{location}/{STREAM_DIR}")
        )
        if query_name is not None:
            writer = writer.queryName(query_name)
        stream = triggered(writer).start()
    except BaseException as exc:
        loop.failed(exc)
        loop.close()
        raise
    return UnboundedQuery(
        loop, stream, available_now=bool(available_now), resumed_from=resumed_from
    )


def _trigger(available_now: bool, processing_time: Any) -> Callable[[Any], Any]:
    """``start(available_now=, processing_time=)`` as a function that sets a writer's
    trigger."""
    trigger_us = None if processing_time is None else _processing_time_us(processing_time)
    return partial(_triggered, available_now=available_now, processing_time_us=trigger_us)


def _triggered(writer: Any, *, available_now: bool, processing_time_us: int | None) -> Any:
    if available_now:
        return writer.trigger(availableNow=True)
    if processing_time_us is not None:
        return writer.trigger(processingTime=spark_interval(processing_time_us))
    return writer


def _processing_time_us(value: Any) -> int:
    """``start(processing_time=)`` in microseconds; zero (Spark's "as fast as possible")
    is allowed, as Spark allows it."""
    return duration_us(value, "start(processing_time=)", zero=True)


def _check_name(query_name: str | None) -> None:
    if query_name is not None and (not isinstance(query_name, str) or not query_name):
        raise IterflowValueError(f"start(query_name={query_name!r}): give a non-empty string")


def _check_start(
    checkpoint_location: str | os.PathLike[str] | None,
    available_now: bool,
    processing_time: Any,
    progress: bool | None,
) -> str:
    """``start()``'s location, trigger and progress option, checked: the location without
    a trailing ``/``."""
    check_progress_option(progress)
    if checkpoint_location is None:
        raise IterflowValueError(
            "start(checkpoint_location=...) is required: it holds the stream's offsets "
            "and the epoch log that make restarts exactly once. Pass a directory "
            "(local, hdfs://, s3a://...) that this query alone uses"
        )
    if available_now and processing_time is not None:
        raise IterflowValueError(
            f"start(available_now=True, processing_time={processing_time!r}): choose one trigger"
        )
    return os.fspath(checkpoint_location).rstrip("/")


def _check_replays(
    spark: SparkSession,
    commit_interval_s: float | None,
    streams: Mapping[str, DataFrame],
    sinks: Mapping[str, Sink],
    location: str,
) -> None:
    """``start(commit_interval_s=...)`` replays the epochs after the last commit on a restart:
    the sources must read them again, the offset log must be one a rewind reads, and the
    sinks must drop what a crashed attempt wrote. Nothing to check without it."""
    if commit_interval_s is None:
        return
    check_replayable(dict(streams))
    check_offset_log(spark, f"{location}/{STREAM_DIR}")
    check_discarding(sinks, "start(commit_interval_s=...)")


def _commit_interval(value: object) -> float | None:
    """``start(commit_interval_s=...)``: None, or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise IterflowValueError(
            f"start(commit_interval_s={value!r}): give the seconds between commits written "
            "in the background as a number > 0 (such as 5), or None to commit every "
            "micro-batch before it returns"
        )
    if value == float("inf"):
        raise IterflowValueError(
            "start(commit_interval_s=inf): commits must be written at some interval; give "
            "a finite number of seconds, or None"
        )
    return float(value)


def _epoch_options(
    spark: SparkSession,
    limits: tuple[int | None, int, int],
    commit_interval_s: float | None,
    keep_history: int | None,
) -> EpochOptions:
    """``start()``'s options of the epoch loop, checked; ``limits`` are its
    ``max_rows_per_epoch``, ``max_feedback_rows`` and ``max_epochs_per_batch``."""
    max_rows_per_epoch, max_feedback_rows, max_epochs_per_batch = limits
    return EpochOptions(
        max_rows_per_epoch=None
        if max_rows_per_epoch is None
        else at_least_one("max_rows_per_epoch", max_rows_per_epoch),
        max_feedback_rows=at_least_one("max_feedback_rows", max_feedback_rows, zero=True),
        max_epochs_per_batch=at_least_one("max_epochs_per_batch", max_epochs_per_batch),
        driver_rows=driver_rows(spark),
        commit_interval_s=commit_interval_s,
        keep_history=keep_history_option(keep_history),
        max_batches_behind=max(1, int(spark.conf.get(RETAINED_BATCHES_CONF, "100") or 100) // 2),
    )


def _epoch_log_options(location: str, commit_interval_s: float | None) -> CheckpointOptions:
    """The epoch log's checkpoints under ``location``: one commit per epoch written."""
    return CheckpointOptions(
        directory=f"{location}/{EPOCHS_DIR}",
        every=1,
        asynchronous=False,
        keep=2,
        # Commits off the loop's path rewind Spark's checkpoint to the commit resumed
        # from, so an older one serves too; otherwise Spark has committed the
        # micro-batches after the newest, and only it will do.
        strict=commit_interval_s is None,
        option="checkpoint_location",
        fresh_start="use another checkpoint_location, or delete this one to start over",
    )
