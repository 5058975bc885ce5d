"""Resident rounds: data kept in the memory of long-running Spark tasks.

``RoundContext.columnar(df)`` makes ``df`` resident where it can: one Spark job
(the *resident job*) starts a few long-running tasks; each reads its share of the
partitions of ``df`` once, straight from the DataFrame (no files, no shared
storage), runs ``prepare`` on every partition and keeps the tables. From then on
every ``map(kernel, ...)`` is a message, not a Spark job: the driver pickles the
kernel and its arguments, sends them to every resident task over the data plane
(``iterflow.runtime.dataplane``), and the tasks send back the kernels' outputs,
numbered by partition, plus the metric updates the kernels made. The driver then
combines the outputs in partition order, as the per-round-job path does, so the
results are the same to the bit::

    driver (round loop, listeners, checkpoints)        executors
    +----------------------------------------+        +-------------------------+
    | ResidentData.map(kernel, args)         |  call  | resident task 0         |
    |   -> data plane (Arrow Flight, secret) | -----> |   partitions 0, 2 held  |
    |   <- outputs + metric updates          | <----- |   kernel(table, *args)  |
    | combine in partition order             |        | resident task 1 ...     |
    +----------------------------------------+        +-------------------------+

The driver stays in charge: rounds, termination, listeners, metrics and
checkpoints are the loop's, and the tasks do nothing unless asked. They end when
the run ends, fails or is interrupted: closing their streams ends them, and the
resident job's group is cancelled besides.

Slots and memory: resident tasks hold their task slots and their memory for the
whole run, while a round may also run ordinary Spark jobs (DataFrame steps,
observations, checkpoint writes). The driver keeps one ledger per SparkContext
(``iterflow.runtime.resident_ledger``): the resident tasks of every run together,
nested and concurrent runs included, take at most half the task slots (one task on
``local[2]``, four on ``local[8]``; with fewer than two slots nothing is made
resident), and hold at most ``spark.iterflow.resident.maxBytesPerExecutor`` bytes on
an executor (``executor_budget``). A loading task reserves its bytes with the driver
before it keeps them, so data is resident whole or not at all. A resident task runs
the kernels of its partitions one after another.

Failures: when a resident task is lost (its Python worker killed, its executor
gone) the call in progress is abandoned, the resident job is relaunched (its
tasks load their partitions again) and the call is sent again; the metric updates
of the abandoned call are dropped, as Spark drops those of failed task attempts.
An exception raised by a kernel fails the round instead.

``spark.iterflow.resident`` = ``auto`` (default) | ``on`` | ``off`` chooses; under
``auto`` a data set that cannot be resident is written as Arrow files and read by a
Spark job per round (``ColumnarData``), with the reason in the event log.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from pyspark import InheritableThread, SparkContext, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError, gist
from iterflow.metrics._spark import BRIDGE, ROUND_PROPERTY, captured
from iterflow.progress.sampling import Reading
from iterflow.runtime.columnar import (
    FILE_COLUMN,
    Combine,
    Kernel,
    KernelCall,
    Prepare,
    _conform,
    _declared_arrow_schema,
    declared_struct,
    in_file_order,
)
from iterflow.runtime.dataplane import Channel, Credentials, DataPlane, connect, secured
from iterflow.runtime.driver_variables import held_frame
from iterflow.runtime.jvm import byte_setting, is_classic, task_slots
from iterflow.runtime.resident_ledger import (
    MAX_BYTES_CONF,
    MAX_BYTES_PER_EXECUTOR_CONF,
    ResidentBudget,
    return_slots,
    take_slots,
)
from iterflow.runtime.schema import map_in_arrow

RESIDENT_CONF = "spark.iterflow.resident"
PORT_CONF = "spark.iterflow.resident.port"
MODES = ("auto", "on", "off")
#: The share of an executor's Python memory that resident data may take by default:
#: the rest is the kernels' working memory and the other Python workers'.
PYTHON_MEMORY_SHARE = 0.5
#: How long a resident task tries to reach the driver's data plane.
CONNECT_TIMEOUT_S = 10.0
#: How long the driver waits for every resident task of a job to start.
START_TIMEOUT_S = 60.0
#: Relaunches of the resident job within one kernel call before the round fails.
RELAUNCHES = 3
#: The column that carries each row's partition of the resident DataFrame into the job.
PARTITION_COLUMN = "__iterflow_partition"
#: How often a resident task running a kernel call says how many partitions it has done.
PROGRESS_EVERY_S = 0.25


@attrs.define
class _RoundCalls:
    """The resident kernel calls of one round: partitions called, and done so far."""

    epoch: int
    called: int = 0
    done: int = 0
    #: The call in flight: each task's partitions, and how many it has done.
    tasks: dict[int, tuple[int, int]] = attrs.Factory(dict)


#: Run id -> the resident kernel calls of its current round (read by progress sampling).
_ROUND_CALLS: dict[str, _RoundCalls] = {}
_ROUND_CALLS_LOCK = threading.Lock()


def resident_reading(run_id: str, epoch: int) -> Reading | None:
    """The partitions the resident kernel calls of round ``epoch`` of ``run_id`` were
    called on and have served so far (as tasks), or None when it made none."""
    with _ROUND_CALLS_LOCK:
        calls = _ROUND_CALLS.get(run_id)
        if calls is None or calls.epoch != epoch:
            return None
        working = [done for parts, done in calls.tasks.values() if done < parts]
        return Reading(
            tasks_total=calls.called,
            tasks_done=calls.done + sum(done for _parts, done in calls.tasks.values()),
            tasks_active=len(working),
        )


def forget_resident_calls(run_id: str) -> None:
    with _ROUND_CALLS_LOCK:
        _ROUND_CALLS.pop(run_id, None)


logger = logging.getLogger("iterflow.resident")


def executor_budget(spark: SparkSession, context: SparkContext) -> int:
    """Bytes of resident data one executor may hold, for every run together:
    ``spark.iterflow.resident.maxBytesPerExecutor`` where set; otherwise half of the
    executor's Python memory, ``spark.executor.pyspark.memory``; where that is not set
    either (Spark then bounds no Python memory), half of the executor's memory,
    ``spark.executor.memory``, or of ``spark.driver.memory`` on a ``local`` master,
    whose one executor is the driver (Spark's default for both: 1g)."""
    explicit = spark.conf.get(MAX_BYTES_PER_EXECUTOR_CONF, None)
    if explicit:
        return byte_setting(context, MAX_BYTES_PER_EXECUTOR_CONF, explicit)
    conf = context.getConf()
    master = str(context.master)
    local = master == "local" or master.startswith("local[")
    for name in (
        "spark.executor.pyspark.memory",
        "spark.driver.memory" if local else "spark.executor.memory",
    ):
        value = conf.get(name, None)
        if value:
            return int(byte_setting(context, name, value) * PYTHON_MEMORY_SHARE)
    return int((1 << 30) * PYTHON_MEMORY_SHARE)


class ResidentUnavailable(Exception):
    """Data cannot be made resident here; the message says why."""


class ResidentTaskLost(Exception):
    """A resident task went away in the middle of a call."""


class KernelError(RuntimeError):
    """A kernel raised inside a resident task; the message carries the task's traceback."""


@attrs.frozen
class Residency:
    """How a run executes its kernels: ``mode`` is ``"resident"`` or ``"jobs"``, and
    ``reason`` says why a run that could have been resident was not."""

    mode: str
    reason: str | None = None

    def describe(self) -> dict[str, str | None]:
        return {"mode": self.mode, "reason": self.reason}


# -- the executor side ----------------------------------------------------------


def _split(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``batch`` cut by the partition column, row order kept, without that column."""
    parts = batch.column(PARTITION_COLUMN)
    rows = batch.drop_columns([PARTITION_COLUMN])
    values = pc.unique(parts).to_pylist()
    if len(values) == 1:
        yield values[0], rows
        return
    for value in values:
        yield value, rows.filter(pc.equal(parts, value))


class _Refused(Exception):
    """The driver refused the bytes a loading task asked for; the message says why."""


#: Bytes a loading task reads between two reservations with the driver.
RESERVE_EVERY = 64 << 20


def _reserver(channel: Channel) -> Callable[[int], None]:
    """A task's way to reserve bytes with the driver before it keeps them; raises
    ``_Refused`` when the driver's ledger has no room for them."""

    def reserve(count: int) -> None:
        channel.send({"reserve": count})
        answer = channel.receive()
        if answer is None:
            raise _Refused("the driver closed the stream")
        if "refused" in answer:
            raise _Refused(answer["refused"])

    return reserve


def _load(
    batches: Iterator[pa.RecordBatch],
    prepare: Prepare | None,
    schema: pa.Schema,
    reserve: Callable[[int], None],
) -> tuple[dict[int, pa.Table], int]:
    """This task's partitions as prepared tables, and the bytes they take: what Spark
    sent, or the prepared tables when larger. Every byte is reserved with the driver
    (``reserve``, every ``RESERVE_EVERY`` bytes read and once more at the end), so a
    refusal stops the load (``_Refused``) instead of keeping part of the data."""
    received: dict[int, list[pa.RecordBatch]] = {}
    sent = reserved = 0
    for batch in batches:
        sent += batch.nbytes
        for part, rows in _split(batch):
            received.setdefault(part, []).append(rows)
        if sent - reserved >= RESERVE_EVERY:
            reserve(sent - reserved)
            reserved = sent
    tables = {part: _prepared(rows, prepare, schema) for part, rows in received.items()}
    held = max(sent, sum(table.nbytes for table in tables.values()))
    if held > reserved:
        reserve(held - reserved)
    return tables, held


def _prepared(rows: list[pa.RecordBatch], prepare: Prepare | None, schema: pa.Schema) -> pa.Table:
    # Spark's batches may mark nested fields nullable where the DataFrame's schema does
    # not (an array of non-null elements): take their own schema when there are any.
    table = pa.Table.from_batches(rows) if rows else schema.empty_table()
    if prepare is not None:
        table = prepare(table)
    return table.combine_chunks()


def _serve(
    call: dict[str, Any], parts: dict[int, pa.Table], report: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Run one kernel call over this task's partitions, in partition order; ``report(n)``
    says ``n`` partitions are done, at most every ``PROGRESS_EVERY_S`` seconds."""
    kernel: KernelCall = call["kernel"]
    outputs: list[pa.RecordBatch] = []
    reported = time.monotonic()
    with captured(call["run_id"], call["epoch"]) as updates:
        try:
            for done, part in enumerate(sorted(parts), start=1):
                outputs.extend(kernel.outputs(part, parts[part]))
                if report is not None and time.monotonic() - reported >= PROGRESS_EVERY_S:
                    report(done)
                    reported = time.monotonic()
        except Exception as error:
            return {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
    return {"outputs": outputs, "metrics": dict(updates)}


def task_main(
    credentials: Credentials,
    job: str,
    generation: int,
    prepare: Prepare | None,
    schema: pa.Schema,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function of the resident job's tasks (``mapInArrow``)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        host = socket.gethostname()
        # Python workers of one executor share its daemon (or the executor itself).
        executor = f"{host}, Python daemon {os.getppid()}"
        hello = {"job": job, "generation": generation, "task": task, "pid": os.getpid()}
        hello.update(host=host, executor=executor)
        try:
            channel = connect(credentials, hello, CONNECT_TIMEOUT_S)
        except (flight.FlightUnavailableError, flight.FlightTimedOutError) as error:
            # Said in the job's result, not by failing it: Spark would retry the task.
            yield _task_row(task, f"{credentials.location}: {str(error).splitlines()[0]}")
            return
        parts: dict[int, pa.Table] = {}
        try:
            parts, held = _load(batches, prepare, schema, _reserver(channel))
        except _Refused as refused:  # nothing is kept: the data is not resident at all
            channel.send({"bytes": 0, "refused": str(refused)})
        except Exception as error:  # prepare failed: said, not retried by Spark as a loss
            channel.send({"bytes": 0, "error": f"{type(error).__name__}: {error}"})
        else:
            channel.send({"rows": {p: t.num_rows for p, t in parts.items()}, "bytes": held})
        _loop(channel, parts, prepare, schema)
        yield _task_row(task, None)

    return run


def _task_row(task: int, unreachable: str | None) -> pa.RecordBatch:
    """The one row a resident task leaves in the job's result."""
    return pa.RecordBatch.from_arrays(
        [pa.array([task], pa.int32()), pa.array([unreachable], pa.string())],
        names=["task", "unreachable"],
    )


def _loop(
    channel: Channel, parts: dict[int, pa.Table], prepare: Prepare | None, schema: pa.Schema
) -> None:
    """Answer the driver's messages until it closes the stream."""
    while True:
        raw = channel.receive_bytes()
        if raw is None:
            return
        try:
            message = pickle.loads(raw)
        except Exception as error:  # e.g. a kernel's module missing on this executor
            channel.send({"error": f"{type(error).__name__}: {error}", "trace": ""})
            continue
        if "adopt" in message:  # partitions no task received rows of: empty ones
            for part in message["adopt"]:
                parts[part] = _prepared([], prepare, schema)
            channel.send({"rows": {p: t.num_rows for p, t in parts.items()}})
            continue
        channel.send(_serve(message, parts, lambda done: channel.send({"progress": done})))


# -- the driver side ------------------------------------------------------------


def _busy_slots(context: SparkContext) -> int:
    tracker = context.statusTracker()
    stages = (tracker.getStageInfo(s) for s in tracker.getActiveStageIds())
    return sum(stage.numActiveTasks for stage in stages if stage is not None)


def current_round(context: SparkContext) -> tuple[str, int]:
    """The run and epoch the driver's round loop tagged this thread's jobs with."""
    token = context.getLocalProperty(ROUND_PROPERTY)
    if token is None:
        return "", -1
    run_id, epoch = token.rsplit(":", 1)
    return run_id, int(epoch)


_CLOSE = object()


@attrs.define
class _Stream:
    """The driver's end of one resident task's stream, served on a data-plane thread."""

    task: int
    pid: int
    host: str
    executor: str
    #: Bytes the task reserved in the application's ledger, given back when it ends.
    reserved: int = 0
    outbox: queue.Queue[Any] = attrs.field(factory=queue.Queue)


class ResidentData:
    """A DataFrame held by resident tasks; ``map`` runs kernels on it without a Spark job.

    Made by ``ResidentPolicy.load`` (behind ``RoundContext.columnar``); released
    with the iteration. Its ``map`` has ``ColumnarData.map``'s signature and
    results, computed at once: the result is a local DataFrame over the rows the
    tasks sent back.
    """

    def __init__(
        self,
        plane: DataPlane,
        df: DataFrame,
        prepare: Prepare | None,
        partitions: int,
        tasks: int,
        budget: ResidentBudget,
    ) -> None:
        self.spark = df.sparkSession
        self.context: SparkContext = self.spark.sparkContext
        self.plane = plane
        self.partitions = partitions
        self.tasks = tasks  # slots taken from the application's ledger, given back on release
        self.budget = budget
        self.job = uuid.uuid4().hex[:12]
        self.rows = 0
        self.calls = 0  # kernel calls answered, for the rounds' ``resident`` flag
        self.launches = 0
        self._prepare = prepare
        self._schema = _declared_arrow_schema(self.spark, df.schema)
        self._input = df.withColumn(PARTITION_COLUMN, F.spark_partition_id()).coalesce(self.tasks)
        self._arrivals: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[int, _Stream] = {}
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._calling = threading.Lock()
        self._held: dict[int, list[int]] = {}  # each task's partitions
        self._calls: _RoundCalls | None = None  # the round of the kernel call in flight
        self._released = False
        plane.register(self.job, self._serve_stream)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Launch the resident job and wait until every task holds its partitions.

        Raises ``ResidentUnavailable`` when the tasks cannot start, reach the
        driver or hold the data.
        """
        self._launch()
        ready: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(ready) < self.tasks:
            left = deadline - time.monotonic()
            if left <= 0 and len(self._streams) < self.tasks:
                raise ResidentUnavailable(
                    f"only {len(self._streams)} of {self.tasks} resident task(s) started within "
                    f"{START_TIMEOUT_S:.0f} s: fewer free task slots than resident tasks, or "
                    "Spark stages before them (a shuffle of the data) took longer than that"
                )
            kind, task, value = self._next(max(left, 0.05) if left > 0 else 1.0)
            if kind == "ready":
                if "error" in value:
                    raise ResidentUnavailable(
                        f"prepare failed in a resident task: {value['error']}"
                    )
                if "refused" in value:
                    raise ResidentUnavailable(value["refused"])
                ready[task] = value
            elif kind == "lost":
                raise ResidentTaskLost(f"resident task {task} was lost while loading: {value}")
        held = {part for r in ready.values() for part in r["rows"]}
        empty = [part for part in range(self.partitions) if part not in held]
        replies = self._exchange(lambda task: pickle.dumps({"adopt": empty if task == 0 else []}))
        self.rows = sum(n for reply in replies for n in reply["rows"].values())
        with self._lock:
            tasks = sorted(self._streams)
        self._held = {task: list(reply["rows"]) for task, reply in zip(tasks, replies, strict=True)}

    def _launch(self) -> None:
        self._generation += 1
        self.launches += 1
        self._streams = {}
        generation = self._generation
        function = task_main(
            self.plane.credentials, self.job, generation, self._prepare, self._schema
        )
        mapped = map_in_arrow(self._input, function, "task INT, unreachable STRING")
        group = f"iterflow-resident-{self.job}-{generation}"
        context = self.context

        def run() -> None:
            # Not one of the launching round's jobs: its tasks outlive the round.
            context.clearJobTags()
            context.setJobGroup(
                group, f"iterflow resident tasks ({self.tasks})", interruptOnCancel=True
            )
            try:
                rows = mapped.collect()
            except BaseException as error:
                self._arrivals.put(("ended", generation, -1, error))
            else:
                self._arrivals.put(("ended", generation, -1, rows))

        self._group = group
        self._thread = InheritableThread(target=run, daemon=True)
        self._thread.start()

    def _serve_stream(self, hello: dict[str, Any], channel: Channel) -> None:
        """Serve one task's stream (on a data-plane thread) until it is closed."""
        generation, task = hello["generation"], hello["task"]
        with self._lock:
            if generation != self._generation:
                return  # a task of a relaunched job's earlier launch
            if task in self._streams:
                # Spark retried a lost task: its partitions' state (the empty ones it
                # adopted) is gone with it, so the whole job is launched again.
                self._arrivals.put(("lost", generation, task, "Spark retried it"))
                return
            stream = _Stream(task, hello["pid"], hello["host"], hello["executor"])
            self._streams[task] = stream
        try:
            message: Any = channel.receive()  # ready: the task holds its partitions
            while True:
                if message is None:
                    raise ResidentTaskLost("its stream closed")
                if "reserve" in message:  # bytes a loading task asks for before keeping them
                    channel.send(self._reserve(stream, generation, message["reserve"]))
                    message = channel.receive()
                    continue
                if "progress" in message:  # partitions done so far in the call in flight
                    self._progressed(task, message["progress"])
                    message = channel.receive()
                    continue
                kind = "ready" if "bytes" in message else "reply"
                self._arrivals.put((kind, generation, task, message))
                outgoing = stream.outbox.get()
                if outgoing is _CLOSE:
                    return
                channel.send(None, payload=outgoing)
                message = channel.receive()
        except Exception as error:
            self._arrivals.put(("lost", generation, task, error))

    def _next(self, timeout: float) -> tuple[str, int, Any]:
        """The next event of the current launch: (kind, task, value); raises when it ended."""
        while True:
            try:
                event = self._arrivals.get(timeout=timeout)
            except queue.Empty:
                return "wait", -1, None
            kind, generation = event[0], event[1]
            if generation != self._generation:
                continue
            if kind == "ended":
                self._ended(event[3])
                continue
            return kind, event[2], event[3]

    def _ended(self, outcome: Any) -> None:
        """The resident job ended while the driver still needed it."""
        if isinstance(outcome, BaseException):
            raise ResidentTaskLost(f"the resident job failed: {gist(outcome)}")
        unreachable = [row["unreachable"] for row in outcome if row["unreachable"]]
        if unreachable:
            raise ResidentUnavailable(
                f"the executors cannot reach the driver's data plane at {unreachable[0]} "
                f"within {CONNECT_TIMEOUT_S:.0f} s"
            )
        raise ResidentTaskLost("the resident job ended")

    def _exchange(self, message: bytes | Callable[[int], bytes]) -> list[dict[str, Any]]:
        """Send every task its pickled message (one for all, pickled once, or one per task);
        their replies, in task order."""
        with self._lock:
            streams = dict(self._streams)
        for task, stream in streams.items():
            stream.outbox.put(message if isinstance(message, bytes) else message(task))
        replies: dict[int, dict[str, Any]] = {}
        while len(replies) < self.tasks:
            kind, task, value = self._next(1.0)
            if kind == "reply":
                replies[task] = value
            elif kind == "lost":
                raise ResidentTaskLost(f"resident task {task} was lost: {value}")
        return [replies[task] for task in sorted(replies)]

    def stop(self, wait_s: float = 30.0, cancel: bool = False) -> None:
        """End the current launch: close its streams and wait for its job to end, cancelling
        it (at once with ``cancel``, as after a lost task) when it does not end by itself."""
        with self._lock:
            self._generation += 1  # nothing of the old launch is heeded any more
            streams, self._streams = list(self._streams.values()), {}
            for stream in streams:
                self.budget.release(stream.executor, stream.reserved)
                stream.reserved = 0
        for stream in streams:
            stream.outbox.put(_CLOSE)
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=0 if cancel else min(wait_s, 5.0))
            if thread.is_alive():
                self.context.cancelJobGroup(self._group)
                thread.join(timeout=wait_s)
        self._thread = None

    def release(self) -> None:
        """End the resident job for good (driver side), and give back its slots."""
        self.stop()
        self.plane.unregister(self.job)
        if not self._released:
            self._released = True
            return_slots(self.budget.app, self.tasks)

    def _reserve(self, stream: _Stream, generation: int, count: int) -> dict[str, Any]:
        """The driver's answer to a loading task asking for ``count`` more bytes."""
        with self._lock:
            if generation != self._generation:
                return {"refused": "the resident job was stopped"}
            refused = self.budget.reserve(stream.executor, count)
            if refused is None:
                stream.reserved += count
                return {"granted": count}
        return {"refused": refused}

    def executors(self) -> set[str]:
        """The executors the current launch's resident tasks run on."""
        with self._lock:
            return {stream.executor for stream in self._streams.values()}

    def tasks_alive(self) -> dict[int, tuple[str, int]]:
        """Each resident task's (host, Python process id) in the current launch."""
        with self._lock:
            return {task: (s.host, s.pid) for task, s in self._streams.items()}

    # -- kernels --------------------------------------------------------------

    def map(
        self,
        kernel: Kernel,
        schema: StructType | str,
        *args: Any,
        indexed: bool = False,
        combine: Combine | None = None,
        combine_schema: StructType | str | None = None,
        rows: DataFrame | None = None,
        by: str | None = None,
    ) -> DataFrame:
        """``ColumnarData.map`` on the resident partitions: the kernels run in the resident
        tasks now, and the result is a local DataFrame over what they returned (combined
        on the driver with ``combine``, in partition order)."""
        if rows is not None or by is not None:
            raise IterflowValueError(
                "map(rows=...) reads the data's files in the rows' own tasks, and this data is "
                "resident in long-running tasks instead: make it with "
                "ctx.columnar(df, prepare, resident=False)"
            )
        from pyspark import cloudpickle

        if combine is not None and combine_schema is None:
            raise IterflowTypeError("map(combine=...) needs combine_schema= as well")
        declared = _declared_arrow_schema(self.spark, schema)
        run_id, epoch = current_round(self.context)
        call = KernelCall(kernel, args, indexed, declared, numbered=True)
        payload = cloudpickle.dumps({"kernel": call, "run_id": run_id, "epoch": epoch})
        replies = self._call(payload, run_id, epoch)
        for reply in replies:
            BRIDGE.merge(reply["metrics"])
        batches = [batch for reply in replies for batch in reply["outputs"]]
        if combine is not None:
            target = _declared_arrow_schema(self.spark, combine_schema)  # type: ignore[arg-type]
            combined = in_file_order(combine)(iter(batches))
            table = _table([_conform(b, target) for b in combined], target)
            out_schema: StructType | str = combine_schema  # type: ignore[assignment]
        else:
            numbered = _table(batches, declared.append(pa.field(FILE_COLUMN, pa.int32())))
            table = numbered.sort_by(FILE_COLUMN).drop_columns(FILE_COLUMN)
            out_schema = schema
        self.calls += 1
        return held_frame(self.spark, table, declared_struct(self.spark, out_schema))

    @contextmanager
    def _counted(self, run_id: str, epoch: int) -> Iterator[None]:
        """Inside, a kernel call of round ``epoch`` of ``run_id`` runs: its partitions
        count toward the round's progress (``resident_reading``)."""
        with _ROUND_CALLS_LOCK:
            calls = _ROUND_CALLS.get(run_id)
            if calls is None or calls.epoch != epoch:
                calls = _ROUND_CALLS[run_id] = _RoundCalls(epoch)
            calls.called += self.partitions
            calls.tasks = {task: (len(parts), 0) for task, parts in self._held.items()}
        self._calls = calls
        try:
            yield
        finally:
            with _ROUND_CALLS_LOCK:
                calls.done += sum(parts for parts, _done in calls.tasks.values())
                calls.tasks = {}
            self._calls = None

    def _progressed(self, task: int, done: int) -> None:
        with _ROUND_CALLS_LOCK:
            calls = self._calls
            if calls is not None and task in calls.tasks:
                calls.tasks[task] = (calls.tasks[task][0], done)

    def _call(self, payload: bytes, run_id: str, epoch: int) -> list[dict[str, Any]]:
        """Send one kernel call to every resident task; relaunch the job and send it again
        when a task is lost on the way, or while reloading (``RELAUNCHES`` times at most).
        One call at a time: the replies carry no call of their own."""
        with self._calling, self._counted(run_id, epoch):
            lost: Exception | None = None
            for _attempt in range(RELAUNCHES + 1):
                try:
                    if lost is not None:
                        self.stop(cancel=True)
                        self.start()
                    replies = self._exchange(payload)
                except (ResidentTaskLost, ResidentUnavailable) as error:
                    lost = error
                    continue
                failed = [reply for reply in replies if "error" in reply]
                if failed:
                    raise KernelError(f"{failed[0]['error']}\n{failed[0]['trace']}")
                return replies
            self.stop(cancel=True)
            raise IterflowError(
                f"resident tasks were lost {RELAUNCHES + 1} times in one kernel call "
                f"(last: {lost}); set {RESIDENT_CONF}=off to run kernels as Spark jobs"
            ) from lost

    def __repr__(self) -> str:
        return (
            f"ResidentData({self.rows} rows in {self.partitions} partitions "
            f"held by {self.tasks} task(s))"
        )


def _table(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches(batches) if batches else schema.empty_table()


class ResidentPolicy:
    """Decides, per run, whether data is made resident, and owns the run's data plane.

    ``unavailable`` is a reason known before any data is seen (an unbounded run, say).
    """

    def __init__(self, spark: SparkSession, unavailable: str | None = None) -> None:
        self.spark = spark
        setting = str(spark.conf.get(RESIDENT_CONF, "auto")).strip().lower()
        if setting not in MODES:
            raise IterflowValueError(f"{RESIDENT_CONF}={setting!r}: use 'auto', 'on' or 'off'")
        self.setting = setting
        self.reason = unavailable
        if setting == "off":
            self.reason = f"{RESIDENT_CONF} is 'off'"
        elif not is_classic(spark):
            self.reason = "the session is Spark Connect: executors cannot reach its client"
        if setting == "on" and self.reason is not None:
            self._refuse(self.reason)
        self.decision: Residency | None = None
        #: Called once the run's mode is known (its ``iteration_started`` event can go).
        self.on_decided: Callable[[], None] | None = None
        self.loaded: list[ResidentData] = []
        self._plane: DataPlane | None = None
        self._bytes: ResidentBudget | None = None

    def residency(self) -> Residency:
        """The run's mode so far: of its first data set, or why none could be resident."""
        if self.decision is not None:
            return self.decision
        if self.reason is not None:
            return Residency("jobs", self.reason)
        return Residency("jobs", "no data was made resident (no ctx.columnar in the first round)")

    @property
    def calls(self) -> int:
        """Kernel calls answered by resident tasks so far."""
        return sum(data.calls for data in self.loaded)

    def load(self, df: DataFrame, prepare: Prepare | None) -> ResidentData | None:
        """``df`` made resident, or None (under ``auto``) when it cannot be."""
        if self.reason is not None:
            self._decide(Residency("jobs", self.reason))
            return None
        data: ResidentData | None = None
        try:
            data = self._resident(df, prepare)
            data.start()
        except (ResidentUnavailable, ResidentTaskLost, IterflowError) as error:
            if data is not None:
                data.release()
            if self.setting == "on":
                self._refuse(str(error))
            logger.warning(
                "ctx.columnar data is not resident; its kernels run as a Spark job per round "
                "(%s=auto): %s",
                RESIDENT_CONF,
                error,
            )
            self._decide(Residency("jobs", str(error)))
            return None
        except BaseException:  # interrupted while loading (Ctrl-C), or a JVM error
            if data is not None:
                data.release()
            raise
        self.loaded.append(data)
        self._decide(Residency("resident"))
        return data

    def decline(self, reason: str) -> None:
        """Data that asked not to be resident: the run's mode is jobs, for ``reason``,
        unless data was made resident before."""
        self._decide(Residency("jobs", reason))

    def _resident(self, df: DataFrame, prepare: Prepare | None) -> ResidentData:
        """``df`` with slots taken for its resident tasks (not started yet)."""
        context = self.spark.sparkContext
        partitions = int(df.rdd.getNumPartitions())
        if partitions == 0:
            raise ResidentUnavailable("the data has no partitions")
        slots = task_slots(context)
        app = str(context.applicationId)
        # coalesce makes no more tasks than partitions
        tasks, held = take_slots(app, slots, partitions)
        if tasks < 1:
            raise ResidentUnavailable(
                f"fewer free task slots than resident tasks: {slots} slot(s), {held} held by "
                "resident tasks of this application already (of this run, or of runs it is "
                "nested in or running beside it), and half the slots stay free for the "
                "rounds' Spark jobs"
            )
        try:
            busy = _busy_slots(context)
            if slots - busy < tasks:
                raise ResidentUnavailable(
                    f"fewer free task slots ({slots - busy} of {slots}) than resident tasks "
                    f"({tasks})"
                )
            plane = self._data_plane(context)
            return ResidentData(plane, df, prepare, partitions, tasks, self._budget(context))
        except BaseException:
            return_slots(app, tasks)
            raise

    def _budget(self, context: SparkContext) -> ResidentBudget:
        """The run's byte budget: ``maxBytesPerExecutor`` (see ``executor_budget``) and the
        optional ``maxBytes`` cap on the run."""
        if self._bytes is None:
            cap = self.spark.conf.get(MAX_BYTES_CONF, None)
            self._bytes = ResidentBudget(
                str(context.applicationId),
                executor_budget(self.spark, context),
                byte_setting(context, MAX_BYTES_CONF, cap) if cap else None,
            )
        return self._bytes

    def _data_plane(self, context: SparkContext) -> DataPlane:
        if self._plane is None:
            conf = context.getConf()
            if str(context.master).startswith("local"):
                bind = advertised = "127.0.0.1"
            else:
                advertised = conf.get("spark.driver.host", None) or socket.gethostname()
                bind = conf.get("spark.driver.bindAddress", None) or advertised
            setting = self.spark.conf.get(PORT_CONF, None) or "0"
            try:
                port = int(setting)
            except ValueError:
                port = -1
            if not 0 <= port <= 65535:
                raise IterflowValueError(f"{PORT_CONF}={setting!r}: use a port number (0: any)")
            self._plane = DataPlane(bind, advertised, port, tls=secured(dict(conf.getAll())))
        return self._plane

    def _decide(self, residency: Residency) -> None:
        if self.decision is None:
            self.decision = residency
            if self.on_decided is not None:
                self.on_decided()

    def _refuse(self, reason: str) -> None:
        raise IterflowError(
            f"{RESIDENT_CONF}=on, but data cannot be made resident: {reason}. "
            f"Set {RESIDENT_CONF}=auto to fall back to a Spark job per round"
        )

    def close(self) -> None:
        """End every resident job and the data plane."""
        try:
            for data in self.loaded:
                data.release()
        finally:
            self.loaded = []
            if self._plane is not None:
                plane, self._plane = self._plane, None
                closer = threading.Thread(target=plane.close, daemon=True)
                closer.start()
                closer.join(timeout=10.0)
