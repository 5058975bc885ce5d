"""Where iterflow keeps files: one layer for the event log, checkpoints and columnar files.

A place is a local path or a Hadoop-compatible URI (``file:``, ``hdfs://``, ``s3a://``,
``abfss://``, ``gs://``...). Which code reaches it:

- plain paths and ``file:`` URIs: the local file system, through Python's own file
  functions (fast, and what Spark's local file system sees too);
- any other scheme, in a driver with a classic Spark session, when Hadoop has a file
  system for it: Hadoop's FileSystem in Spark's JVM, configured by the session's
  ``spark.hadoop.*`` settings (the connector and credentials Spark's own readers and
  writers use); ``iterflow.runtime.spark`` hands it in through :func:`use_hadoop`, as
  this leaf imports no Spark;
- otherwise (no session, as in ``iterflow report``; Spark Connect; Python tasks reading
  columnar files; a scheme Hadoop has no connector for): ``pyarrow.fs``, for the schemes
  it opens (``hdfs://``, ``s3://``, ``gs://``, ``abfs://``...).

Anything else fails with an ``IterflowValueError`` naming the scheme and what works.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs

from iterflow.errors import IterflowValueError

#: A URI's scheme: a letter, then letters, digits, "+", "-", "."; one letter alone is a
#: Windows drive ("C:\\logs"), not a scheme.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")

SUPPORTED = (
    "plain paths and file: URIs (the local file system); with a classic Spark session, "
    "every scheme Hadoop has a connector for (hdfs://, s3a://, abfss://, gs://..., set up "
    "by spark.hadoop.* settings); otherwise, the schemes pyarrow.fs opens (hdfs://, "
    "s3://, gs://, abfs://...)"
)


@attrs.frozen
class Location:
    """A place in storage: ``uri`` as given, its ``scheme`` in lower case ("" for a plain
    path) and, for plain paths and ``file:`` URIs, its ``local`` path."""

    uri: str
    scheme: str

    @property
    def local(self) -> str | None:
        if self.scheme == "":
            return self.uri
        if self.scheme == "file":
            # "file:/dir", "file:///dir" and "file://localhost/dir"; the rest is a plain
            # path ("#" and "?" included), so no URL parsing.
            rest = self.uri[len("file:") :].removeprefix("//localhost")
            return "/" + rest.lstrip("/")
        return None

    def join(self, name: str) -> Location:
        return Location(f"{self.uri.rstrip('/')}/{name}", self.scheme)


def location(value: str | os.PathLike[str], what: str) -> Location:
    """``value`` (a path or a URI) as a ``Location``; ``what`` names it in errors."""
    try:
        uri = os.fspath(value)
    except TypeError:
        raise IterflowValueError(
            f"{what}={value!r}: give a path or a URI such as 'file:/logs/run.jsonl' or "
            "'hdfs://namenode/logs/run.jsonl'"
        ) from None
    if not isinstance(uri, str) or not uri:
        raise IterflowValueError(f"{what}={value!r}: give a path or a URI")
    match = _SCHEME.match(uri)
    return Location(uri, match.group(1).lower() if match else "")


class AppendStream(Protocol):
    """A file open for appending: each ``flush`` makes what was written durable and visible."""

    def write(self, data: bytes) -> Any: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Files(Protocol):
    """Small files and directories on one kind of storage, by URI."""

    def write_bytes(self, path: str, data: bytes, *, atomic: bool = False) -> None: ...

    def create(self, path: str, data: bytes) -> bool: ...

    def read_bytes(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool: ...

    def children(self, path: str) -> list[str]: ...

    def file_sizes(self, path: str) -> dict[str, int]: ...

    def delete(self, path: str) -> None: ...

    def rename(self, source: str, target: str) -> None: ...

    def append_stream(self, path: str) -> AppendStream | None:
        """``path`` open for appending (made, with its directories, when missing); None
        where the storage cannot append (object stores)."""
        ...


class LocalFiles:
    """``Files`` on plain paths and ``file:`` URIs, with Python's file functions.

    Hidden files (``.name``, such as Hadoop's ``.crc`` checksums) are not listed,
    as Hadoop's local file system does not list them either.
    """

    @staticmethod
    def _local(path: str) -> Path:
        local = location(path, "path").local
        return Path(local if local is not None else path)

    def write_bytes(self, path: str, data: bytes, *, atomic: bool = False) -> None:
        target = self._local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        written = target.with_name(target.name + "._writing") if atomic else target
        _write_durably(written, data)
        if atomic:
            os.replace(written, target)

    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` unless it exists; False when it does. Written under another name
        and linked in place, so that no one reads it half written, and at most one of
        several processes creates it."""
        target = self._local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        written = target.with_name(f"{target.name}._writing-{os.getpid()}-{threading.get_ident()}")
        _write_durably(written, data)
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

    def rename(self, source: str, target: str) -> None:
        os.replace(self._local(source), self._local(target))

    def append_stream(self, path: str) -> AppendStream:
        target = self._local(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        return open(target, "ab")  # the caller closes it


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and wait until it is on disk (a crash keeps it whole)."""
    with open(path, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


class ArrowFiles:
    """``Files`` through a ``pyarrow.fs`` file system (no Spark needed)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def _path(self, path: str) -> str:
        import pyarrow.fs as pafs

        return str(pafs.FileSystem.from_uri(path)[1]) if "://" in path else path

    def _parent(self, path: str) -> None:
        parent = self._path(path).rpartition("/")[0]
        if parent:
            self.fs.create_dir(parent, recursive=True)  # object stores: nothing to do

    def write_bytes(self, path: str, data: bytes, *, atomic: bool = False) -> None:
        # Object stores show an object only once it is written, and rename by copying.
        self._parent(path)
        with self.fs.open_output_stream(self._path(path)) as out:
            out.write(data)

    def create(self, path: str, data: bytes) -> bool:
        if self.exists(path):
            return False
        self.write_bytes(path, data)
        return True

    def read_bytes(self, path: str) -> bytes:
        with self.fs.open_input_stream(self._path(path)) as source:
            return bytes(source.read())

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(self._path(path)).type != pafs.FileType.NotFound)

    def _infos(self, path: str, recursive: bool) -> list[Any]:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._path(path), allow_not_found=True, recursive=recursive)
        return list(self.fs.get_file_info(selector))

    def children(self, path: str) -> list[str]:
        return [info.base_name for info in self._infos(path, recursive=False)]

    def file_sizes(self, path: str) -> dict[str, int]:
        import pyarrow.fs as pafs

        root = self._path(path).rstrip("/") + "/"
        return {
            info.path.removeprefix(root): int(info.size)
            for info in self._infos(path, recursive=True)
            if info.type == pafs.FileType.File
        }

    def delete(self, path: str) -> None:
        import pyarrow.fs as pafs

        kind = self.fs.get_file_info(self._path(path)).type
        if kind == pafs.FileType.Directory:
            self.fs.delete_dir(self._path(path))
        elif kind == pafs.FileType.File:
            self.fs.delete_file(self._path(path))

    def rename(self, source: str, target: str) -> None:
        self.fs.move(self._path(source), self._path(target))

    def append_stream(self, path: str) -> AppendStream | None:
        import pyarrow.fs as pafs

        if not isinstance(self.fs, (pafs.LocalFileSystem, pafs.HadoopFileSystem)):
            return None  # object stores: an object is written whole or not at all
        self._parent(path)
        stream: AppendStream = self.fs.open_append_stream(self._path(path))
        return stream


#: A place -> Hadoop's ``Files`` when a classic Spark session runs in this process and
#: Hadoop has a file system for the place's scheme, else None.
_hadoop: Callable[[Location], Files | None] | None = None


def use_hadoop(provider: Callable[[Location], Files | None]) -> None:
    """Reach schemes other than ``file:`` through ``provider`` (Hadoop's FileSystem) when it
    gives ``Files``: called by ``iterflow.runtime.spark``, which this leaf cannot import."""
    global _hadoop
    _hadoop = provider


def files_at(place: Location, what: str) -> Files:
    """The ``Files`` that reach ``place`` (see the module for which); ``what`` names it in
    errors."""
    if place.local is not None:
        return LocalFiles()
    hadoop = _hadoop(place) if _hadoop is not None else None
    if hadoop is not None:
        return hadoop
    fs, _ = arrow_filesystem(place.uri, what)
    return ArrowFiles(fs)


def arrow_filesystem(uri: str, what: str) -> tuple[Any, str]:
    """The ``pyarrow.fs`` file system of ``uri`` and the path in it; (None, the local path)
    for plain paths and ``file:`` URIs, which callers open directly (memory-mapped)."""
    place = location(uri, what)
    if place.local is not None:
        return None, place.local
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(place.uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
        raise IterflowValueError(
            f"{what}='{place.uri}': no file system for the scheme '{place.scheme}' here "
            f"({str(error).splitlines()[0]}); supported: {SUPPORTED}"
        ) from None
    return fs, str(path)


def _os_error(error: Exception) -> OSError:
    """``error`` of a file system reached through another runtime (a JVM exception) as an
    ``OSError``, its first line the reason."""
    if isinstance(error, OSError):
        return error
    return OSError(errno.EIO, str(error).strip().splitlines()[0] if str(error).strip() else "")


def read_bytes(value: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of the file at ``value``; an ``OSError`` when it cannot be read."""
    place = location(value, what)
    files = files_at(place, what)
    try:
        return files.read_bytes(place.uri)
    except Exception as error:
        raise _os_error(error) from error


class AppendFile:
    """A file that grows by appends, each durable before ``append`` returns: a crash keeps
    every append that returned.

    Where the storage appends (local files, HDFS, ABFS), one stream stays open and each
    append is flushed. Where it cannot (object stores such as S3), each append writes the
    whole file again, which object stores replace in one step; that costs the file's size
    per append, and two processes appending to one such file overwrite each other.
    """

    def __init__(self, value: str | os.PathLike[str], what: str) -> None:
        self.location = location(value, what)
        self._files = files_at(self.location, what)
        try:
            self._stream = self._files.append_stream(self.location.uri)
            exists = self._stream is None and self._files.exists(self.location.uri)
            self._content = self._files.read_bytes(self.location.uri) if exists else b""
        except Exception as error:
            raise _os_error(error) from error

    @property
    def rewrites(self) -> bool:
        """Whether each append writes the whole file (the storage cannot append)."""
        return self._stream is None

    def append(self, data: bytes) -> None:
        try:
            if self._stream is not None:
                self._stream.write(data)
                self._stream.flush()
            else:
                self._files.write_bytes(self.location.uri, self._content + data)
                self._content += data
        except Exception as error:
            raise _os_error(error) from error

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
