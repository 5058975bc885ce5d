"""The lease of a checkpoint directory: one live run at a time writes its checkpoints there.

Two runs on one directory would delete each other's epochs when they prune. A run
takes the lease when it starts, in ``_LEASE`` under the directory: a small JSON file
with an owner token, where the run lives (host, process id, its pid namespace) and
when it started. The file is created only if it does not exist (``Files.create``:
atomic on local disks and HDFS), and a thread of the run renews it every quarter of
the lease timeout (``spark.iterflow.checkpoint.leaseTimeout``, 60 s), while the run
lives. The run gives the lease back when it ends, whatever the way.

A run that finds the lease held is refused with ``CheckpointInUseError``, unless
the holder is gone: a process on this host (in this pid namespace) that no longer
runs, a run of this process that has ended, or a lease not renewed for longer than
the holder's timeout (a run killed on another host). Such a lease is taken over,
with a warning. Before it deletes anything there (a commit's pruning, ``resume=False``),
a run checks that the lease is still its own; one that lost it (its process was
paused past the timeout, and another run took over) fails with the same error rather
than touch the other run's checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import SparkSession

from iterflow.durations import duration_us
from iterflow.errors import CheckpointInUseError, IterflowError, IterflowValueError
from iterflow.storage import Files

LEASE = "_LEASE"
TIMEOUT_CONF = "spark.iterflow.checkpoint.leaseTimeout"
DEFAULT_TIMEOUT_S = 60.0
#: Renewals per timeout: a lease survives a few failed renewals in a row.
RENEWALS = 4
#: Reads of a lease that does not parse (someone is writing it) before it counts as garbage.
READS = 3

log = logging.getLogger("iterflow.checkpoint")

#: The tokens of the leases this process holds now.
_HELD: set[str] = set()


def lease_timeout_s(spark: SparkSession) -> float:
    """``spark.iterflow.checkpoint.leaseTimeout``: seconds (``"90"``) or a duration
    (``"2 min"``, ``"90s"``; see ``iterflow.durations``), more than zero."""
    value = spark.conf.get(TIMEOUT_CONF, None)
    if value is None:
        return DEFAULT_TIMEOUT_S
    return duration_us(value, TIMEOUT_CONF) / 1e6


class Lease:
    """The lease of one run on the checkpoint directory ``root`` (``option`` names it in
    errors: ``checkpoint_dir`` or ``checkpoint_location``)."""

    def __init__(self, files: Files, root: str, *, timeout_s: float, option: str) -> None:
        if not timeout_s > 0:
            raise IterflowValueError(f"{TIMEOUT_CONF}={timeout_s:g}: give a positive duration")
        self.files = files
        self.root = root
        self.path = f"{root}/{LEASE}"
        self.timeout_s = timeout_s
        self.option = option
        self.token = uuid.uuid4().hex
        self._record = {
            "token": self.token,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "pid_namespace": _pid_namespace(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "timeout_s": timeout_s,
        }
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._lost: dict[str, Any] | None = None  # the holder that took the lease over

    @property
    def held(self) -> bool:
        return self._thread is not None

    def acquire(self) -> None:
        """Take the lease, or raise ``CheckpointInUseError`` naming the live holder (an
        ``IterflowError`` naming the directory when it cannot be written)."""
        try:
            self._take()
        except IterflowError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise IterflowError(
                f"{self.option} '{self.root}' cannot hold this run's lease '{self.path}' "
                f"({type(exc).__name__}: {first}); give a directory this run can write"
            ) from exc
        _HELD.add(self.token)
        self._thread = threading.Thread(
            target=self._renew_until_stopped, name="iterflow-checkpoint-lease", daemon=True
        )
        self._thread.start()

    def _take(self) -> None:
        """Create the lease file, or take over one its holder left."""
        for _ in range(READS):
            if self.files.create(self.path, self._content()):
                break
            holder = self._holder()
            if holder is None and not self.files.exists(self.path):
                continue  # its holder gave it back meanwhile
            if holder is not None and holder.get("token") == self.token:
                break  # created, but the file system said otherwise
            if holder is not None and _alive(holder):
                raise CheckpointInUseError(self._refusal(holder, held=True))
            log.warning("%s '%s': taking over the lease %s", self.option, self.root, _left(holder))
            # Unless another run has taken it over meanwhile (it would be alive now).
            now = self._holder()
            if (now and now.get("token")) == (holder and holder.get("token")):
                self.files.delete(self.path)
        else:
            raise CheckpointInUseError(
                f"{self.option} '{self.root}': another run took the lease first, {READS} times "
                "in a row; one run at a time may use a checkpoint directory"
            )

    def check(self) -> None:
        """Raise ``CheckpointInUseError`` if another run has taken the lease over (before
        anything under the directory is deleted)."""
        if self.held and self._lost is None:
            self._renew(write=False)
        if self._lost is not None:
            raise CheckpointInUseError(self._refusal(self._lost, held=False))

    def release(self) -> None:
        """Stop renewing and delete the lease file if it is still this run's."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        _HELD.discard(self.token)
        holder = self._holder()
        if holder is not None and holder.get("token") == self.token:
            self.files.delete(self.path)

    def _renew_until_stopped(self) -> None:
        failing = False
        while not self._stop.wait(self.timeout_s / RENEWALS) and self._lost is None:
            try:
                self._renew()
                failing = False
            except Exception as exc:
                if not failing:  # once per spell of failures
                    log.warning(
                        "%s '%s': could not renew the lease (%s: %s); trying again",
                        self.option,
                        self.root,
                        type(exc).__name__,
                        exc,
                    )
                failing = True

    def _renew(self, *, write: bool = True) -> None:
        """Write the lease again with the time now (or, without ``write``, only check it),
        if it is still this run's; note the holder that took it over otherwise."""
        with self._lock:  # the renewing thread and a checkpoint's check
            holder = self._holder()
            if holder is None:
                # Deleted under the run: take it again unless another run has.
                if self.files.create(self.path, self._content()):
                    return
                holder = self._holder()
            if holder is not None and holder.get("token") != self.token:
                self._lost = holder
            elif write:
                self.files.write_bytes(self.path, self._content(), atomic=True)

    def _content(self) -> bytes:
        return json.dumps({**self._record, "renewed": time.time()}, sort_keys=True).encode()

    def _holder(self) -> dict[str, Any] | None:
        """The lease as its holder wrote it; None when there is none, or it is garbage."""
        for attempt in range(READS):
            if not self.files.exists(self.path):
                return None
            try:
                holder = json.loads(self.files.read_bytes(self.path))
                if isinstance(holder, dict) and "token" in holder:
                    return holder
            except FileNotFoundError:
                return None
            except ValueError:
                pass  # being written (a file system that shows a file before it is closed)
            if attempt < READS - 1:
                time.sleep(0.1)
        return None

    def _refusal(self, holder: dict[str, Any], *, held: bool) -> str:
        """Why this run may not write under the directory, naming the holder."""
        who = _describe(holder)
        if held:
            return (
                f"{self.option} '{self.root}' is in use by another live run ({who}); two "
                "runs on one directory would delete each other's checkpoints. Wait for it to "
                f"end, or use another {self.option}. A run that died without ending frees "
                f"it once its lease is {holder.get('timeout_s', DEFAULT_TIMEOUT_S):g} s old "
                f"({TIMEOUT_CONF}), or at once on the same host"
            )
        return (
            f"{self.option} '{self.root}' was taken over by another run ({who}) while this "
            f"run held it: its lease went {self.timeout_s:g} s without renewal (was this "
            "process paused?). This run stops before it writes there again; the other run "
            "goes on with the checkpoints"
        )


def _pid_namespace() -> str | None:
    """The pid namespace of this process (Linux), so that a process id is only compared
    with those of the same namespace (containers on one host name)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the run that wrote the lease ``holder`` may still live."""
    renewed = float(holder.get("renewed", 0))
    fresh = time.time() - renewed <= float(holder.get("timeout_s", DEFAULT_TIMEOUT_S))
    here = (
        holder.get("host") == socket.gethostname()
        and holder.get("pid_namespace") == _pid_namespace()
    )
    if not here:
        return fresh
    pid = int(holder.get("pid", -1))
    if pid == os.getpid():
        return holder.get("token") in _HELD  # else a run of this process that has ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user runs with that id
    return fresh  # running, unless the id was reused since: then the lease has aged


def _describe(holder: dict[str, Any]) -> str:
    ago = time.time() - float(holder.get("renewed", 0))
    return (
        f"host '{holder.get('host')}', pid {holder.get('pid')}, started "
        f"{holder.get('started')}, lease renewed {ago:.0f} s ago"
    )


def _left(holder: dict[str, Any] | None) -> str:
    """The lease being taken over, in words."""
    if holder is None:
        return "file, which does not read"
    return f"of a run that is gone ({_describe(holder)})"
