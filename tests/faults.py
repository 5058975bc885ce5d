"""Faults the cluster fault tests inject: SIGKILL an executor JVM (from the driver, or
from a task of its own), SIGKILL a task's Python worker, fail a task once. Shipped to
the executors with ``addPyFile``, so it imports nothing of the tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import psutil

#: What a task does when its fault is due (once: the first task to create the marker).
Fault = Callable[[], None]


def executor_pids() -> list[int]:
    """The executor JVMs this driver's cluster started (children of its JVM)."""
    return sorted(
        p.pid
        for p in psutil.Process().children(recursive=True)
        if any("CoarseGrainedExecutorBackend" in part for part in _cmdline(p))
    )


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def kill_own_executor() -> None:
    """SIGKILL the executor JVM this Python worker runs for (its nearest java ancestor)."""
    for parent in psutil.Process().parents():
        if any("CoarseGrainedExecutorBackend" in part for part in _cmdline(parent)):
            os.kill(parent.pid, signal.SIGKILL)
            return
    raise RuntimeError("no executor JVM above this Python worker")


def kill_own_worker() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fail_once() -> None:
    raise RuntimeError("injected task failure")


TASK_FAULTS: dict[str, Fault] = {
    "executor-mid": kill_own_executor,
    "worker": kill_own_worker,
    "task": fail_once,
}


class Injector:
    """The fault of one case: ``due(epoch)`` in a task runs it once, the first time a task
    of round ``epoch`` asks (a marker file, created exclusively, says it ran)."""

    def __init__(self, kind: str, epoch: int, marker: str) -> None:
        self.kind, self.epoch, self.marker = kind, epoch, marker

    def due(self, epoch: int) -> None:
        if epoch != self.epoch or self.kind not in TASK_FAULTS:
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        TASK_FAULTS[self.kind]()


class BetweenRounds:
    """A listener that SIGKILLs one executor JVM (``injector.kind`` ``executor``) or all of
    them (``executors``) at the end of round ``injector.epoch``."""

    def __init__(self, injector: Injector) -> None:
        self.injector = injector
        self.killed: list[int] = []

    def __call__(self, end: Any) -> None:
        if end.epoch == self.injector.epoch and not self.killed:
            pids = executor_pids()
            for pid in pids if self.injector.kind == "executors" else pids[:1]:
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)
