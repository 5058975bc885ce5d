"""Resident rounds: data kept in the memory of long-running Spark tasks.

``RoundContext.columnar(df)`` makes ``df`` resident where it can: one Spark job
(the *resident job*) starts long-running tasks; each reads its share of the
partitions of ``df`` once, straight from the DataFrame (no files on shared
storage), runs ``prepare`` on every partition and keeps the tables (in its host's
shared memory, one task per executor). From then on
every ``map(kernel, ...)`` is a message, not a Spark job: the driver pickles the
kernel and its arguments, sends them to every resident task over the data plane
(``iterflow.runtime.datacache.dataplane``), and the tasks send back the kernels' outputs,
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
(``iterflow.runtime.datacache.ledger``): the resident tasks of every run together,
nested and concurrent runs included, take at most half the task slots (with fewer than two
slots nothing is made resident), and hold at most
``spark.iterflow.resident.maxBytesPerExecutor`` bytes on an executor
(``executor_budget``). One task stays per executor (one on ``local[2]``), and runs
its partitions' kernels on a process per core of its executor (``resident_pool``).
The load runs on every free slot: the tasks beyond one per executor write their
prepared partitions to the host's shared memory (``resident_share``) and hand them
to the staying task (``resident_task``). A loading task reserves its bytes with the
driver before it keeps them, so data is resident whole or not at all.

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
import pickle
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
import pyarrow as pa
from pyspark import InheritableThread, SparkContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError, gist
from iterflow.metrics._spark import BRIDGE, ROUND_PROPERTY
from iterflow.runtime.datacache.columnar import (
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
from iterflow.runtime.datacache.dataplane import Channel, DataPlane
from iterflow.runtime.datacache.driver_variables import held_frame
from iterflow.runtime.datacache.ledger import ResidentBudget, return_slots
from iterflow.runtime.datacache.resident_pool import CALL
from iterflow.runtime.datacache.resident_task import (
    CONNECT_TIMEOUT_S,
    PARTITION_COLUMN,
    TREE,
    task_main,
)
from iterflow.runtime.datacache.resident_tree import Merging, Peers, holders_of
from iterflow.runtime.progresstrack.tracker import RoundTracker
from iterflow.runtime.spark.jvm import plan_now
from iterflow.runtime.spark.planning import static_planning
from iterflow.runtime.spark.schema import map_in_arrow

#: How long the driver waits for every resident task of a job to start.
START_TIMEOUT_S = 60.0
#: Relaunches of the resident job within one kernel call before the round fails.
RELAUNCHES = 3

logger = logging.getLogger("iterflow.resident")


class ResidentUnavailable(Exception):
    """Data cannot be made resident here; the message says why."""


class ResidentTaskLost(Exception):
    """A resident task went away in the middle of a call."""


class KernelError(RuntimeError):
    """A kernel raised inside a resident task; the message carries the task's traceback."""


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
        tracker: RoundTracker,
        launched: int | None = None,
        processes: int = 1,
        tree: bool = True,
    ) -> None:
        self.spark = df.sparkSession
        self.tracker = tracker  # the run's: kernel calls report their progress to it
        self.context: SparkContext = self.spark.sparkContext
        self.plane = plane
        self.partitions = partitions
        self.tasks = tasks  # slots taken from the application's ledger, given back on release
        #: Tasks of the resident job: one per free slot, so that loading uses every core;
        #: at most ``tasks`` of them stay (one per executor), the others hand over and end.
        self.launched = max(launched or tasks, tasks)
        self.processes = processes  # kernel processes per staying task
        self.tree = tree  # kernel calls pass along a tree of the tasks where they can
        self.budget = budget
        self.job = uuid.uuid4().hex[:12]
        self.rows = 0
        self.calls = 0  # kernel calls answered, for the rounds' ``resident`` flag
        self.launches = 0
        self._prepare = prepare
        self._schema = _declared_arrow_schema(self.spark, df.schema)
        self._input = df.withColumn(PARTITION_COLUMN, F.spark_partition_id()).coalesce(
            self.launched
        )
        self._arrivals: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[int, _Stream] = {}  # the staying tasks' streams
        self._keepers: dict[str, int] = {}  # executor -> the task that keeps its partitions
        self._loaders: dict[int, _Stream] = {}  # tasks that load, hand over and end
        self._reserved: dict[str, int] = {}  # bytes reserved in the ledger, by executor
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._calling = threading.Lock()
        self._held: dict[int, list[int]] = {}  # each task's partitions
        #: The staying tasks as a tree (``resident_tree``); None: every call goes to every
        #: task from the driver, and every output comes back to it.
        self._peers: Peers | None = None
        self._call_number = 0
        #: Where the tasks' reports of the call in flight go (the run's tracker).
        self._progress: Callable[[int, int], None] | None = None
        self._released = False
        plane.register(self.job, self._serve_stream)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Launch the resident job and wait until the staying tasks hold every partition.

        Raises ``ResidentUnavailable`` when the tasks cannot start, reach the
        driver or hold the data.
        """
        self._launch()
        loaded = self._loaded()
        with self._lock:
            keepers = dict(self._keepers)
            executor_of = {t: s.executor for t, s in {**self._streams, **self._loaders}.items()}
        given: dict[int, dict[str, Any]] = {
            task: {"files": {}, "sizes": {}, "empty": []} for task in keepers.values()
        }
        for task, said in loaded.items():
            adopting = given[keepers[executor_of[task]]]
            adopting["files"].update(said.get("files", {}))
            adopting["sizes"].update(said.get("sizes", {}))
        held = {part for said in loaded.values() for part in said["rows"]}
        given[min(given)]["empty"] = [p for p in range(self.partitions) if p not in held]
        replies = self._exchange(lambda task: pickle.dumps({"adopt": given[task]}))
        refused = [reply["refused"] for reply in replies if "refused" in reply]
        if refused:
            raise ResidentUnavailable(refused[0])
        self.rows = sum(n for reply in replies for n in reply["rows"].values())
        with self._lock:
            tasks = sorted(self._streams)
        self._held = {task: list(reply["rows"]) for task, reply in zip(tasks, replies, strict=True)}
        relays = {task: reply.get("relay") for task, reply in zip(tasks, replies, strict=True)}
        if self.tree:
            self._peers = self._tree(relays, [reply.get("no_relay") for reply in replies])

    def _tree(self, relays: dict[int, str | None], failed: list[str | None]) -> Peers | None:
        """Set the staying tasks up as a tree for the model exchange (``resident_tree``);
        None, with a WARNING saying why, when a task cannot serve or reach its peers."""
        reasons = [reason for reason in failed if reason]
        peers = None
        if not reasons:
            known = {task: location for task, location in relays.items() if location}
            peers = Peers(tuple(sorted(known)), known, holders_of(self._held, self.partitions))
            replies = self._exchange(pickle.dumps({"peers": peers}))
            reasons = [reply["unreached"] for reply in replies if reply.get("unreached")]
        if reasons:
            logger.warning(
                "resident tasks cannot reach each other (%s): kernel calls go from the driver "
                "to every task and every output comes back to it, so the driver's bytes per "
                "round grow with the number of tasks; let executors reach each other on "
                "ephemeral ports to pass them along a tree",
                reasons[0],
            )
            return None
        return peers

    def _loaded(self) -> dict[int, dict[str, Any]]:
        """What every task of the launch said once its partitions were loaded, by task."""
        loaded: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(loaded) < self.launched:
            left = deadline - time.monotonic()
            with self._lock:
                started = len(self._streams) + len(self._loaders)
            if left <= 0 and started < self.launched:
                raise ResidentUnavailable(
                    f"only {started} of {self.launched} resident task(s) started within "
                    f"{START_TIMEOUT_S:.0f} s: fewer free task slots than resident tasks, or "
                    "Spark stages before them (a shuffle of the data) took longer than that"
                )
            kind, task, value = self._next(max(left, 0.05) if left > 0 else 1.0)
            if kind in ("ready", "handed"):
                if "error" in value:
                    raise ResidentUnavailable(
                        f"prepare failed in a resident task: {value['error']}"
                    )
                if "refused" in value:
                    raise ResidentUnavailable(value["refused"])
                loaded[task] = value
            elif kind == "lost":
                raise ResidentTaskLost(f"resident task {task} was lost while loading: {value}")
        return loaded

    def _launch(self) -> None:
        self._generation += 1
        self.launches += 1
        self._streams, self._keepers, self._loaders = {}, {}, {}
        generation = self._generation
        function = task_main(
            self.plane.credentials,
            self.job,
            generation,
            self._prepare,
            self._schema,
            self.processes,
        )
        mapped = map_in_arrow(self._input, function, "task INT, unreachable STRING")
        # Planned as the partitions were counted: adaptive execution could coalesce them.
        with static_planning(self.spark):
            plan_now(mapped)
        group = f"iterflow-resident-{self.job}-{generation}"
        staying = "" if self.launched == self.tasks else f", {self.tasks} staying"
        context = self.context

        def run() -> None:
            # Not one of the launching round's jobs: its tasks outlive the round.
            context.clearJobTags()
            context.setJobGroup(
                group,
                f"iterflow resident tasks ({self.launched}{staying})",
                interruptOnCancel=True,
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
        stream = _Stream(task, hello["pid"], hello["host"], hello["executor"])
        with self._lock:
            if generation != self._generation:
                return  # a task of a relaunched job's earlier launch
            if task in self._streams or task in self._loaders:
                # Spark retried a lost task: its partitions' state (the empty ones it
                # adopted) is gone with it, so the whole job is launched again.
                self._arrivals.put(("lost", generation, task, "Spark retried it"))
                return
            role = self._role(stream)
        try:
            channel.send(role)
            self._converse(stream, generation, channel)
        except Exception as error:
            self._arrivals.put(("lost", generation, task, error))

    def _role(self, stream: _Stream) -> dict[str, Any]:
        """What a task that just said hello is to do (under the lock): keep its executor's
        partitions (the first task there, while slots allow), or load and hand over."""
        keeper = self._keepers.get(stream.executor)
        if keeper is None and len(self._keepers) < self.tasks:
            self._keepers[stream.executor] = stream.task
            self._streams[stream.task] = stream
            return {"role": "keep"}
        self._loaders[stream.task] = stream
        if keeper is not None:
            return {"role": "load"}
        return {
            "role": "refuse",
            "reason": f"a resident task started on a further executor ({stream.executor}) "
            f"than the {self.tasks} that may keep data",
        }

    def _converse(self, stream: _Stream, generation: int, channel: Channel) -> None:
        """Trade messages with one task: its reservations, progress and replies."""
        task = stream.task
        message: Any = channel.receive()  # loaded: the task holds (or hands) its partitions
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
            if task in self._loaders:  # its one message: the files it hands over, or why not
                self._arrivals.put(("handed", generation, task, message))
                return
            kind = "ready" if "bytes" in message else "reply"
            self._arrivals.put((kind, generation, task, message))
            outgoing = stream.outbox.get()
            if outgoing is _CLOSE:
                return
            channel.send(None, payload=outgoing)
            message = channel.receive()

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
        while len(replies) < len(streams):
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
            self._keepers, self._loaders, self._peers = {}, {}, None
            for executor, count in self._reserved.items():
                self.budget.release(executor, count)
            self._reserved = {}
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
                self._reserved[stream.executor] = self._reserved.get(stream.executor, 0) + count
                return {"granted": count}
        return {"refused": refused}

    @property
    def along_tree(self) -> bool:
        """Whether kernel calls pass along a tree of the current launch's tasks."""
        return self._peers is not None

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
        if combine is not None and combine_schema is None:
            raise IterflowTypeError("map(combine=...) needs combine_schema= as well")
        declared = _declared_arrow_schema(self.spark, schema)
        call = KernelCall(kernel, args, indexed, declared, numbered=True)
        batches, _ = self._call(self._payload(call))
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

    def reduce(
        self, kernel: Kernel, partial: str, merging: Merging, schema: StructType | str, *args: Any
    ) -> DataFrame:
        """``ColumnarData.reduce`` on the resident partitions (``itf.combine``, PageRank):
        ``kernel(index, table, *args)`` makes each partition's (index, pickled partial)
        row of ``partial``, and the tasks merge them along their tree as ``merging``
        says (``resident_tree``), so that the driver receives the merged rows only;
        without a tree they are merged here, the same way."""
        declared = _declared_arrow_schema(self.spark, partial)
        call = KernelCall(kernel, args, True, declared, numbered=True)
        batches, treed = self._call(self._payload(call, merging), reduce=True)
        if not treed:
            batches = list(merging.whole(iter(batches)))
        target = _declared_arrow_schema(self.spark, schema)
        table = _table([_conform(batch, target) for batch in batches], target)
        self.calls += 1
        return held_frame(self.spark, table, declared_struct(self.spark, schema))

    def _payload(self, call: KernelCall, merging: Merging | None = None) -> bytes:
        """A kernel call pickled once for every task (and, with ``merging``, how the tasks
        merge its outputs)."""
        from pyspark import cloudpickle

        run_id, epoch = current_round(self.context)
        content = {"kernel": call, "run_id": run_id, "epoch": epoch, "reduce": merging}
        return CALL + cloudpickle.dumps(content)

    def _messages(self, payload: bytes, reduce: bool) -> bytes | Callable[[int], bytes]:
        """A kernel call's messages to the tasks: along the tree, a header for every task
        and the payload for the root only; without one, the payload for every task."""
        peers = self._peers
        if peers is None:
            return payload
        self._call_number += 1
        header = pickle.dumps({"call": self._call_number, "reduce": reduce})
        head = TREE + len(header).to_bytes(4, "little") + header
        whole = head + payload
        return lambda task: whole if task == peers.tasks[0] else head

    def _progressed(self, task: int, done: int) -> None:
        """A resident task says it has served ``done`` partitions of the call in flight."""
        progressed = self._progress
        if progressed is not None:
            progressed(task, done)

    def _call(self, payload: bytes, reduce: bool = False) -> tuple[list[pa.RecordBatch], bool]:
        """Send one kernel call to every resident task; relaunch the job and send it again
        when a task is lost on the way, or while reloading (``RELAUNCHES`` times at most).
        One call at a time: the replies carry no call of their own. The outputs, and
        whether the call went along the tree (then a ``reduce`` call's outputs are
        merged already)."""
        held = {task: len(parts) for task, parts in self._held.items()}
        with self._calling, self.tracker.kernel_call(self.partitions, held) as progressed:
            self._progress = progressed
            try:
                replies, treed = self._relaunching(payload, reduce)
            finally:
                self._progress = None
        for reply in replies:
            BRIDGE.merge(reply["metrics"])
        return [batch for reply in replies for batch in reply["outputs"]], treed

    def _relaunching(self, payload: bytes, reduce: bool) -> tuple[list[dict[str, Any]], bool]:
        """``_call``'s exchange, relaunching the resident job when a task is lost."""
        lost: Exception | None = None
        for attempt in range(RELAUNCHES + 1):
            try:
                if lost is not None:
                    self.stop(cancel=True)
                    self.start()
                treed = self._peers is not None
                replies = self._exchange(self._messages(payload, reduce))
            except (ResidentTaskLost, ResidentUnavailable) as error:
                lost = error
                if attempt < RELAUNCHES:
                    logger.warning(
                        "a resident task was lost during a kernel call (%s); relaunching the "
                        "resident job and calling again (relaunch %d of at most %d)",
                        error,
                        attempt + 1,
                        RELAUNCHES,
                    )
                continue
            failed = [reply for reply in replies if "error" in reply]
            if failed:
                raise KernelError(f"{failed[0]['error']}\n{failed[0]['trace']}")
            return replies, treed
        self.stop(cancel=True)
        raise IterflowError(
            f"resident tasks were lost {RELAUNCHES + 1} times in one kernel call "
            f"(last: {lost}); set spark.iterflow.resident=off to run kernels as Spark jobs"
        ) from lost

    def __repr__(self) -> str:
        return (
            f"ResidentData({self.rows} rows in {self.partitions} partitions "
            f"held by {self.tasks} task(s) of {self.processes} kernel process(es) each)"
        )


def _table(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches(batches) if batches else schema.empty_table()
