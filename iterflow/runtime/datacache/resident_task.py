"""The executor side of resident rounds: the function each task of a resident job runs.

The resident job has a task per free slot, so the data is read by every core at once.
Each task reaches the driver's data plane (``dataplane``) and learns its role: the first
task on an executor *keeps* that executor's partitions, the others *load* and leave.
Every task reads its share of the data's partitions from the DataFrame once, reserving
their bytes with the driver before it keeps them (data is resident whole or not at
all), prepares each partition and writes it to the host's shared memory
(``resident_share``). A loading task then hands its files to the driver and ends,
freeing its slot. The keeping task maps its executor's files into its kernel processes
(``resident_pool``: one per core), says how many rows it holds, and answers kernel calls
until the driver closes its stream. Everything a task needs arrives in its closure; see
``resident`` for the driver.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from pyspark import TaskContext

from iterflow.metrics._spark import add_updates, captured
from iterflow.runtime.datacache.columnar import Prepare
from iterflow.runtime.datacache.dataplane import Channel, Credentials, connect
from iterflow.runtime.datacache.resident_pool import CALL, Pool, PoolLost
from iterflow.runtime.datacache.resident_share import forget, remove, share_dir, write
from iterflow.runtime.datacache.resident_tree import (
    Failed,
    Links,
    Peers,
    Relay,
    RelayClosed,
    reduce_here,
)

#: How long a resident task tries to reach the driver's data plane.
CONNECT_TIMEOUT_S = 10.0
#: The column that carries each row's partition of the resident DataFrame into the job.
PARTITION_COLUMN = "__iterflow_partition"
#: The first byte of a kernel call along the tree (``resident_tree``): then the length
#: of a pickled header (4 bytes, little-endian), the header, and the payload, which
#: only the root receives from the driver.
TREE = b"T"


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


def task_main(
    credentials: Credentials,
    job: str,
    generation: int,
    prepare: Prepare | None,
    schema: pa.Schema,
    processes: int = 1,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function of the resident job's tasks (``mapInArrow``); a staying task runs its
    kernels on ``processes`` processes."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        host = socket.gethostname()
        # Python workers of one executor share its daemon (or the executor itself).
        executor = f"{host}, Python daemon {os.getppid()}"
        hello = {"job": job, "generation": generation, "task": task, "pid": os.getpid()}
        hello.update(host=host, executor=executor)
        # Forked before any connection exists: a fork of a process with network threads
        # would inherit their locks. A task that turns out to load only ends them.
        pool = Pool(processes)
        try:
            try:
                channel = connect(credentials, hello, CONNECT_TIMEOUT_S)
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as error:
                # Said in the job's result, not by failing it: Spark would retry the task.
                yield _task_row(task, f"{credentials.location}: {str(error).splitlines()[0]}")
                return
            role = channel.receive()  # what the driver wants of this task
            if role is not None:
                load = (job, generation, prepare, schema)
                _play(channel, role, batches, _Keeping(task, channel, pool, credentials), load)
        finally:
            pool.close()
        yield _task_row(task, None)

    return run


def _play(
    channel: Channel,
    role: dict[str, Any],
    batches: Iterator[pa.RecordBatch],
    keeper: _Keeping,
    load: tuple,
) -> None:
    """Load this task's partitions and keep them (``keep``: answer kernel calls after) or
    hand them to the task that keeps its executor's (``load``); ``refuse`` says why
    neither may be."""
    job, generation, prepare, schema = load
    if role["role"] == "refuse":
        channel.send({"bytes": 0, "refused": role["reason"]})
        return
    keeping = role["role"] == "keep"
    if not keeping:
        keeper.pool.close()  # its processes are not needed
    try:
        tables, held = _load(batches, prepare, schema, _reserver(channel))
        files = _shared(job, generation, tables)
    except _Refused as refused:  # nothing is kept: the data is not resident at all
        channel.send({"bytes": 0, "refused": str(refused)})
    except Exception as error:  # prepare failed: said, not retried by Spark as a loss
        channel.send({"bytes": 0, "error": f"{type(error).__name__}: {error}"})
    else:
        sizes = {part: table.nbytes for part, table in tables.items()}
        rows = {part: table.num_rows for part, table in tables.items()}
        said = {"rows": rows, "bytes": held, "files": files, "sizes": sizes}
        channel.send(said if keeping else {**said, "handed": True})
    if keeping:
        try:
            _loop(channel, keeper, load)
        finally:
            keeper.close()
            forget(job, generation)


def _shared(job: str, generation: int, tables: dict[int, pa.Table]) -> dict[int, str]:
    """This task's prepared partitions written to the host's shared memory; their files."""
    if not tables:
        return {}
    size = sum(t.nbytes for t in tables.values())
    try:
        directory = share_dir(job, generation, size)
        return {part: write(directory, part, table) for part, table in tables.items()}
    except OSError:  # shared memory filled up beside other tasks: the temporary directory
        directory = share_dir(job, generation, size, shared=False)
        return {part: write(directory, part, table) for part, table in tables.items()}


def _task_row(task: int, unreachable: str | None) -> pa.RecordBatch:
    """The one row a resident task leaves in the job's result."""
    return pa.RecordBatch.from_arrays(
        [pa.array([task], pa.int32()), pa.array([unreachable], pa.string())],
        names=["task", "unreachable"],
    )


def _adopt(message: dict[str, Any], pool: Pool, load: tuple) -> dict[str, Any]:
    """Map the partitions the driver gives this task (its own, its executor's other loading
    tasks', and empty ones no task received rows of) into the kernel processes; their
    rows by partition."""
    job, generation, prepare, schema = load
    files: dict[int, str] = dict(message["files"])
    sizes: dict[int, int] = dict(message["sizes"])
    if message["empty"]:
        directory = share_dir(job, generation, 0)
        for part in message["empty"]:
            files[part] = write(directory, part, _prepared([], prepare, schema))
            sizes[part] = 0
    try:
        rows = pool.open(files, sizes)
    except PoolLost as lost:
        return {"refused": f"the resident task's kernel processes did not start: {lost}"}
    finally:
        remove(list(files.values()))  # mapped: the memory goes with the last process
    return {"rows": rows}


class _Keeping:
    """A staying task between the driver's messages: its kernel processes, and its place
    in the tree of staying tasks (``resident_tree``) once the driver has said it."""

    def __init__(self, task: int, channel: Channel, pool: Pool, credentials: Credentials):
        self.task = task
        self.channel = channel
        self.pool = pool
        self.credentials = credentials
        self.relay: Relay | None = None
        self.links: Links | None = None
        self.peers: Peers | None = None

    def adopt(self, message: dict[str, Any], load: tuple) -> dict[str, Any]:
        """Map the partitions given to this task, and open its relay for its peers."""
        reply = _adopt(message, self.pool, load)
        if "rows" in reply:
            try:
                self.relay = Relay(self.credentials)
                reply["relay"] = self.relay.location
            except (pa.ArrowException, OSError) as error:  # then no tree: said, not fatal
                reply["relay"] = None
                reply["no_relay"] = f"{type(error).__name__}: {error}"
        return reply

    def join(self, peers: Peers) -> dict[str, Any]:
        """Take this task's place in the tree: reach its parent, or say why it cannot."""
        self.peers = peers
        self.links = Links(self.credentials, peers)
        parent = peers.parent(self.task)
        return {"unreached": None if parent is None else self.links.reach(parent)}

    def call(self, raw: memoryview) -> dict[str, Any]:
        """A kernel call along the tree: the payload from the driver (root) or from this
        task's parent, served to its children; the kernels' outputs, or this task's part
        of the combine's merges."""
        assert self.relay is not None and self.links is not None and self.peers is not None
        size = int.from_bytes(raw[1:5], "little")
        header = pickle.loads(raw[5 : 5 + size])
        payload: Any = raw[5 + size :]
        call = header["call"]
        if not len(payload):
            parent = self.peers.parent(self.task)
            payload = memoryview(self.links.fetch(parent, call))  # type: ignore[arg-type]
        self.relay.publish(call, payload)
        reply = self.pool.call(payload[1:], lambda done: self.channel.send({"progress": done}))
        if not header["reduce"] or "error" in reply:
            return reply
        items = {
            index: data
            for batch in reply["outputs"]
            for index, data in zip(
                batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
            )
        }
        links, relay = self.links, self.relay
        content = pickle.loads(payload[1:])
        # Metrics the merges update (extract_output's gauges) count toward the round.
        with captured(content["run_id"], content["epoch"]) as updates:
            merged = reduce_here(
                self.task,
                self.peers,
                content["reduce"],
                items,
                lambda owner, level, index, item: links.deliver(owner, call, level, index, item),
                lambda level, index: relay.take(call, level, index),
            )
        if isinstance(merged, Failed):
            return {"error": merged.error, "trace": merged.trace}
        return {"outputs": merged or [], "metrics": add_updates(reply["metrics"], updates)}

    def close(self) -> None:
        if self.links is not None:
            self.links.close()
        if self.relay is not None:
            self.relay.close()


def _loop(channel: Channel, keeper: _Keeping, load: tuple) -> None:
    """Answer the driver's messages until it closes the stream, or a kernel process or a
    peer on the tree goes away (then the stream is closed: the driver relaunches the job
    as for a lost task)."""
    while True:
        raw = channel.receive_bytes()
        if raw is None:
            return
        view = memoryview(raw)
        if view[:1] in (CALL, TREE):
            try:
                if view[:1] == CALL:
                    report = lambda done: channel.send({"progress": done})  # noqa: E731
                    reply = keeper.pool.call(view[1:], report)
                else:
                    reply = keeper.call(view)
            except (PoolLost, RelayClosed, pa.ArrowException, OSError):
                return
            channel.send(reply)
            continue
        try:
            message = pickle.loads(view)
        except Exception as error:
            channel.send({"error": f"{type(error).__name__}: {error}", "trace": ""})
            continue
        if "adopt" in message:
            channel.send(keeper.adopt(message["adopt"], load))
        elif "peers" in message:
            channel.send(keeper.join(message["peers"]))
