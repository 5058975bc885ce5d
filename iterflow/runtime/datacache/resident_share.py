"""Resident partitions in shared memory: written once on a host, mapped by every process.

A task that loads partitions writes each prepared table as an Arrow IPC file in the
host's shared memory (``/dev/shm`` when it has room, else the temporary directory,
whose files the page cache keeps in memory), and the processes that run kernels map
those files (``open_shared``): the tables are read where they lie, without a copy.
The resident task that adopts the files removes them once its processes have mapped
them (``remove``), so the memory is freed when the last process ends, whatever ends
it. Files left by a load that never finished are removed by the next load on the
host after ``STALE_S``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

import pyarrow as pa

#: Where resident partitions go first: the host's shared memory.
SHARED_MEMORY = "/dev/shm"
#: The prefix of every directory of resident partitions.
PREFIX = "iterflow-resident-"
#: The age after which a directory of resident partitions is a leftover of a load that
#: never finished: files are removed seconds after they are written.
STALE_S = 600.0


def share_dir(job: str, generation: int, size: int, shared: bool = True) -> str:
    """A new directory for ``size`` bytes of one load's partitions: in shared memory when
    it has room for them (a fifth more) and ``shared``, else in the temporary directory."""
    base = tempfile.gettempdir()
    if shared and os.path.isdir(SHARED_MEMORY) and os.access(SHARED_MEMORY, os.W_OK):
        stats = os.statvfs(SHARED_MEMORY)
        if stats.f_bavail * stats.f_frsize >= size * 1.2:
            base = SHARED_MEMORY
    _sweep(base)
    path = os.path.join(base, f"{PREFIX}{job}-{generation}-{os.getpid()}{'' if shared else '-t'}")
    os.makedirs(path, exist_ok=True)
    return path


def write(directory: str, part: int, table: pa.Table) -> str:
    """``table`` as an Arrow IPC file in ``directory``; its path."""
    path = os.path.join(directory, f"part-{part}.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def open_shared(path: str) -> pa.Table:
    """The table of ``path``, mapped into memory: no byte is copied."""
    return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()


def remove(paths: list[str]) -> None:
    """Remove the files ``paths`` and their directories when empty (mapped tables stay
    readable until they are dropped)."""
    directories = set()
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        directories.add(os.path.dirname(path))
    for directory in directories:
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _sweep(base: str) -> None:
    """Remove directories of resident partitions in ``base`` older than ``STALE_S``."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if now - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
                        shutil.rmtree(entry.path, ignore_errors=True)


def forget(job: str, generation: int) -> None:
    """Remove whatever one launch of a resident job left on this host (files of tasks
    whose partitions were never adopted, as when the load was refused)."""
    for base in (SHARED_MEMORY, tempfile.gettempdir()):
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                if entry.name.startswith(f"{PREFIX}{job}-{generation}-"):
                    shutil.rmtree(entry.path, ignore_errors=True)
