"""Small files for durable checkpoints: the local file system directly, others through Hadoop.

Checkpoints write a few small files per epoch (driver state, commit marker) and
list, check and delete epoch directories. Through Hadoop's FileSystem API each
of those is a py4j round trip; on a local path Python's own file functions do
the same in microseconds. Spark's parquet writers handle the data either way.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Protocol

from pyspark.sql import SparkSession

from iterflow.errors import IterflowValueError
from iterflow.runtime.spark.jvm import HadoopFiles, is_classic


class Files(Protocol):
    def write_bytes(self, path: str, data: bytes, *, atomic: bool = False) -> None: ...

    def create(self, path: str, data: bytes) -> bool: ...

    def read_bytes(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

    def children(self, path: str) -> list[str]: ...

    def file_sizes(self, path: str) -> dict[str, int]: ...

    def delete(self, path: str) -> None: ...


class LocalFiles:
    """``Files`` on ``file:`` URIs, with Python's file functions.

    Hidden files (``.name``, such as Hadoop's ``.crc`` checksums) are not listed,
    as Hadoop's local file system does not list them either.
    """

    @staticmethod
    def _local(path: str) -> Path:
        # Hadoop's qualified form is "file:/dir" (or "file:///dir"); the rest is a plain
        # path, "#" and "?" included, so no URL parsing.
        local = path[len("file:") :] if path.startswith("file:") else path
        return Path("/" + local.lstrip("/"))

    def write_bytes(self, path: str, data: bytes, *, atomic: bool = False) -> None:
        target = self._local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        written = target.with_name(target.name + "._writing") if atomic else target
        with open(written, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if atomic:
            os.replace(written, target)

    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` unless it exists; False when it does. Written under another name
        and linked in place, so that no one reads it half written, and at most one of
        several processes creates it."""
        target = self._local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        written = target.with_name(f"{target.name}._writing-{os.getpid()}-{threading.get_ident()}")
        with open(written, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(written, target)
        except FileExistsError:
            return False
        finally:
            written.unlink()
        return True

    def read_bytes(self, path: str) -> bytes:
        return self._local(path).read_bytes()

    def exists(self, path: str) -> bool:
        return self._local(path).exists()

    def children(self, path: str) -> list[str]:
        directory = self._local(path)
        if not directory.is_dir():
            return []
        return [p.name for p in directory.iterdir() if not p.name.startswith(".")]

    def file_sizes(self, path: str) -> dict[str, int]:
        root = self._local(path)
        return {
            str(p.relative_to(root)): p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        }

    def delete(self, path: str) -> None:
        target = self._local(path)
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        elif target.exists():
            target.unlink()


def files_for(spark: SparkSession, root: str) -> tuple[Files, str]:
    """The ``Files`` for ``root`` and its qualified URI (``file:/...``, ``hdfs://...``)."""
    if not is_classic(spark):
        return _connect_files(root)
    hadoop = HadoopFiles(spark)
    try:
        qualified = hadoop.qualify(root).rstrip("/")
    except Exception as exc:
        raise IterflowValueError(
            f"checkpoint_dir '{root}' cannot be used: {str(exc).splitlines()[0]}. For "
            "hdfs://, s3a:// and similar paths, Spark needs the file system's connector "
            "and credentials (spark.hadoop.* settings)"
        ) from exc
    return (LocalFiles() if qualified.startswith("file:") else hadoop), qualified


def _connect_files(root: str) -> tuple[Files, str]:
    """Over Spark Connect the client has no Hadoop file system: a local (or mounted)
    directory, which Spark's writers on the server must see at the same path."""
    scheme, sep, _ = root.partition("://")
    if sep and scheme != "file":
        raise IterflowValueError(
            f"checkpoint_dir '{root}': over Spark Connect, iterflow writes its small files "
            "from the client, which has no Hadoop file system; use a directory that the "
            "client and the Connect server both see at the same path (a shared mount)"
        )
    path = os.path.abspath(root.removeprefix("file://").removeprefix("file:"))
    return LocalFiles(), f"file:{path}"
