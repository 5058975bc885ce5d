"""What the resident tasks of one SparkContext hold together: task slots, and bytes per
executor.

Resident tasks keep their slots and their memory for a whole run. A run nested in
another's round, or runs on several threads of one driver, share the same executors,
so the limits hold for all of them together, never run by run: resident tasks take at
most half the slots of the SparkContext (the other half stays free for the rounds'
Spark jobs, whoever runs them), and the data held on an executor stays within that
executor's budget (``spark.iterflow.resident.maxBytesPerExecutor``).

The driver is the one place that sees every run, so it keeps the ledger: tasks ask it
for bytes before they keep them (``reserve``), and a refusal makes the whole data set
not resident, never a part of it.
"""

from __future__ import annotations

import threading

import attrs


@attrs.define
class _Holdings:
    """One SparkContext's resident slots, and bytes by executor."""

    slots: int = 0
    bytes: dict[str, int] = attrs.Factory(dict)


_HOLDINGS: dict[str, _Holdings] = {}
_LOCK = threading.Lock()


def take_slots(app: str, slots: int, wanted: int) -> tuple[int, int]:
    """Take up to ``wanted`` task slots for resident tasks of SparkContext ``app``, whose
    cluster has ``slots``: at most half of them go to resident tasks of every run together.
    Returns (taken, held by resident tasks before); ``taken`` may be 0."""
    with _LOCK:
        holdings = _HOLDINGS.setdefault(app, _Holdings())
        held = holdings.slots
        taken = max(min(wanted, slots // 2 - held), 0)
        holdings.slots += taken
        return taken, held


def return_slots(app: str, count: int) -> None:
    """Give back ``count`` slots taken with ``take_slots``."""
    with _LOCK:
        holdings = _HOLDINGS.setdefault(app, _Holdings())
        holdings.slots = max(holdings.slots - count, 0)


def reserve_bytes(app: str, executor: str, count: int, budget: int) -> tuple[bool, int]:
    """Reserve ``count`` bytes on ``executor`` if what resident tasks of ``app`` hold there
    stays within ``budget`` (nothing is reserved otherwise). Returns (reserved, the bytes
    held there before)."""
    with _LOCK:
        holdings = _HOLDINGS.setdefault(app, _Holdings())
        held = holdings.bytes.get(executor, 0)
        if held + count > budget:
            return False, held
        holdings.bytes[executor] = held + count
        return True, held


def release_bytes(app: str, executor: str, count: int) -> None:
    """Give back ``count`` bytes reserved on ``executor``."""
    with _LOCK:
        holdings = _HOLDINGS.setdefault(app, _Holdings())
        left = holdings.bytes.get(executor, 0) - count
        if left > 0:
            holdings.bytes[executor] = left
        else:
            holdings.bytes.pop(executor, None)


#: The bytes resident data may take on one executor, for every run together.
MAX_BYTES_PER_EXECUTOR_CONF = "spark.iterflow.resident.maxBytesPerExecutor"
#: An optional cap on the bytes all resident data of one run takes.
MAX_BYTES_CONF = "spark.iterflow.resident.maxBytes"


@attrs.define
class ResidentBudget:
    """The bytes one run's resident data may take: ``per_executor`` on each executor
    (in the application's ledger, so with every other run's data there), and
    ``run_cap`` (or no cap) for the whole run."""

    app: str
    per_executor: int
    run_cap: int | None = None
    run_held: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def reserve(self, executor: str, count: int) -> str | None:
        """Reserve ``count`` bytes on ``executor``; None when done, or why not."""
        with self._lock:
            if self.run_cap is not None and self.run_held + count > self.run_cap:
                return (
                    f"the data takes more than {MAX_BYTES_CONF}={self.run_cap} bytes "
                    f"(at least {self.run_held + count} read)"
                )
            reserved, held = reserve_bytes(self.app, executor, count, self.per_executor)
            if not reserved:
                return (
                    f"executor {executor} would hold more than "
                    f"{MAX_BYTES_PER_EXECUTOR_CONF}={self.per_executor} bytes of resident data "
                    f"({held} held already, {count} more asked for)"
                )
            self.run_held += count
            return None

    def release(self, executor: str, count: int) -> None:
        """Give back ``count`` bytes reserved on ``executor``."""
        if count <= 0:
            return
        with self._lock:
            self.run_held -= count
            release_bytes(self.app, executor, count)
