"""The executor side of resident rounds: the function each task of a resident job runs.

A resident task reaches the driver's data plane (``dataplane``), reads its share of the
data's partitions from the DataFrame once, reserving their bytes with the driver before
it keeps them (data is resident whole or not at all), prepares each partition, says
how many rows it holds, and then answers kernel calls until the driver closes its
stream. Everything it needs arrives in its closure; see ``resident`` for the driver.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
from pyspark import TaskContext

from iterflow.metrics._spark import captured
from iterflow.runtime.datacache.columnar import KernelCall, Prepare
from iterflow.runtime.datacache.dataplane import Channel, Credentials, connect

#: How long a resident task tries to reach the driver's data plane.
CONNECT_TIMEOUT_S = 10.0
#: The column that carries each row's partition of the resident DataFrame into the job.
PARTITION_COLUMN = "__iterflow_partition"
#: How often a resident task running a kernel call says how many partitions it has done.
PROGRESS_EVERY_S = 0.25


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
