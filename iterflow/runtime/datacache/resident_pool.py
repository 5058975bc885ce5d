"""The processes that run a resident task's kernels: every core of its executor.

A resident task holds one task slot, but its executor has more cores. It runs its
partitions' kernels on a pool of processes sized to the executor's cores (``Pool``):
each process maps the files of the partitions it is given (``resident_share``) into
its memory, read-only and without a copy, so the data is in memory once per host
however many processes read it. A kernel call goes to every process at once; each runs
the kernel on its own partitions and sends back the outputs and the metric updates,
and the task hands them to the driver as one reply.

With one core the task runs the kernels itself (no process is started). The processes
are forked by the task before it opens any connection, so they start in milliseconds
with every module the task has. A process
that dies ends the pool: the task then closes its stream, and the driver relaunches
the resident job as for any lost task. A process also ends when the task goes away
(its end of the socket closes), so none outlives the task.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, cast

import pyarrow as pa

from iterflow.metrics._spark import add_updates, captured, kernel_process
from iterflow.runtime.datacache.columnar import KernelCall
from iterflow.runtime.datacache.resident_share import open_shared

#: The first byte of a kernel call from the driver (other messages are pickles, which
#: never start with it).
CALL = b"K"
#: How often a process running a kernel call says how many partitions it has done.
PROGRESS_EVERY_S = 0.25
#: How long a pool waits for a new process to start.
START_TIMEOUT_S = 60.0

Report = Callable[[int], None]


class PoolLost(Exception):
    """A process of the pool went away; the message says which."""


def serve(call: dict[str, Any], parts: dict[int, pa.Table], report: Report | None = None) -> Any:
    """Run one kernel call over ``parts``, in partition order; ``report(n)`` says ``n``
    partitions are done, at most every ``PROGRESS_EVERY_S`` seconds."""
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


def shares(sizes: dict[int, int], processes: int) -> list[list[int]]:
    """Partitions (by their bytes) dealt to ``processes`` so that each gets about the same
    bytes: the largest first, each to the least loaded process."""
    loads = [0] * processes
    dealt: list[list[int]] = [[] for _ in range(processes)]
    for part in sorted(sizes, key=lambda p: (-sizes[p], p)):
        least = loads.index(min(loads))
        dealt[least].append(part)
        loads[least] += sizes[part]
    return dealt


class Pool:
    """The kernel processes of one resident task (or, with one process, the task itself)."""

    def __init__(self, processes: int) -> None:
        self.processes = max(int(processes), 1)
        self._workers: list[tuple[int, Connection]] = []
        self._own: dict[int, pa.Table] = {}  # the partitions the task serves itself
        # Without fork (not a POSIX system) the task runs its kernels itself.
        forks = self.processes if self.processes > 1 and hasattr(os, "fork") else 0
        for _ in range(forks):
            self._workers.append(_fork([conn.fileno() for _, conn in self._workers]))

    @property
    def pids(self) -> list[int]:
        """The process ids of the pool's processes (none when the task runs kernels itself)."""
        return [pid for pid, _ in self._workers]

    def open(self, files: dict[int, str], sizes: dict[int, int]) -> dict[int, int]:
        """Map the partitions' files into the processes; their row counts by partition."""
        if not self._workers:
            self._own.update({part: open_shared(path) for part, path in files.items()})
            return {part: table.num_rows for part, table in self._own.items()}
        dealt = shares(sizes, len(self._workers))
        for (_, conn), parts in zip(self._workers, dealt, strict=True):
            conn.send(("open", {part: files[part] for part in parts}))
        rows: dict[int, int] = {}
        for reply in self._replies(None):
            rows.update(reply)
        return rows

    def call(self, raw: bytes | memoryview, report: Report | None = None) -> Any:
        """Run the pickled kernel call ``raw`` on every partition; one reply for all."""
        import pickle

        if not self._workers:
            return serve(pickle.loads(raw), self._own, report)
        for _, conn in self._workers:
            conn.send_bytes(raw)
        outputs: list[pa.RecordBatch] = []
        metrics: dict[Any, Any] = {}
        for reply in self._replies(report):
            if "error" in reply:
                return reply
            outputs.extend(reply["outputs"])
            add_updates(metrics, reply["metrics"])
        return {"outputs": outputs, "metrics": metrics}

    def _replies(self, report: Report | None) -> list[Any]:
        """One reply from every process, forwarding their progress to ``report``."""
        waiting: dict[Connection, int] = {
            conn: index for index, (_, conn) in enumerate(self._workers)
        }
        replies: list[Any] = [None] * len(self._workers)
        done = [0] * len(self._workers)
        while waiting:
            for ready in wait(list(waiting)):
                conn = cast(Connection, ready)
                index = waiting[conn]
                try:
                    message = conn.recv()
                except (EOFError, OSError) as error:
                    raise PoolLost(f"kernel process {self.pids[index]} ended") from error
                if isinstance(message, tuple) and message[0] == "progress":
                    done[index] = message[1]
                    if report is not None:
                        report(sum(done))
                    continue
                replies[index] = message
                del waiting[conn]
        return replies

    def close(self) -> None:
        """End the processes (they also end by themselves when the task goes away)."""
        self._own = {}
        for _, conn in self._workers:
            conn.close()  # a process ends when it reads the end of its socket
        deadline = time.monotonic() + 5.0
        for pid, _ in self._workers:
            if not _reaped(pid, deadline):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
        self._workers = []


def _reaped(pid: int, deadline: float) -> bool:
    """Whether process ``pid`` ended by ``deadline`` (and was reaped, by us or by a
    ``SIGCHLD`` policy that reaps children itself)."""
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _fork(inherited: list[int]) -> tuple[int, Connection]:
    """Fork one kernel process, connected by a socket pair. A fork has every module the
    task imported (kernels pickled by reference load there too) and starts in
    milliseconds; it closes the task's ends of its siblings' sockets (``inherited``), so
    each process sees its own socket close when the task goes away."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the kernel process: it never returns into the task's code
        status = 0
        try:
            ours.close()
            for fd in inherited:
                with contextlib.suppress(OSError):
                    os.close(fd)
            main(theirs.detach())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    theirs.close()
    return pid, Connection(ours.detach())


def main(fd: int) -> None:
    """A kernel process: open the partitions it is given, then answer kernel calls until
    the task closes its end."""
    import pickle

    kernel_process()
    conn = Connection(fd)
    parts: dict[int, pa.Table] = {}
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            message = pickle.loads(raw)
        except Exception as error:  # e.g. a kernel's module missing in this process
            conn.send({"error": f"{type(error).__name__}: {error}", "trace": ""})
            continue
        if isinstance(message, tuple) and message[0] == "open":
            parts.update({part: open_shared(path) for part, path in message[1].items()})
            conn.send({part: parts[part].num_rows for part in message[1]})
            continue
        conn.send(serve(message, parts, lambda done: conn.send(("progress", done))))
