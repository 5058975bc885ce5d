"""Files on Spark's side of the storage layer (``iterflow.storage``): Hadoop's FileSystem.

Checkpoints write a few small files per epoch (driver state, commit marker) and
list, check and delete epoch directories. Through Hadoop's FileSystem API each
of those is a py4j round trip; on a local path Python's own file functions do
the same in microseconds. Spark's parquet writers handle the data either way.

Importing this module hands Hadoop to ``iterflow.storage`` (``use_hadoop``), so that the
event log reaches every scheme Spark's session does.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from iterflow.errors import IterflowValueError
from iterflow.runtime.spark.jvm import HadoopFiles, active_context, is_classic
from iterflow.storage import SUPPORTED, Files, LocalFiles, Location, location, use_hadoop

__all__ = ["Files", "HadoopFiles", "LocalFiles", "files_for"]


def _hadoop_files(place: Location) -> Files | None:
    """Hadoop's ``Files`` for ``place`` when a classic session runs in this process and
    Hadoop has a file system for its scheme (the storage layer's first way to schemes
    other than ``file:``); None otherwise."""
    context = active_context()
    if context is None:
        return None
    hadoop = HadoopFiles(context)
    return hadoop if hadoop.knows(place.scheme) else None


def _known(hadoop: HadoopFiles, place: Location, what: str) -> HadoopFiles:
    """``hadoop``, once it is known to have a file system for ``place``'s scheme."""
    if place.local is None and not hadoop.knows(place.scheme):
        raise IterflowValueError(
            f"{what}='{place.uri}': Hadoop has no file system for the scheme "
            f"'{place.scheme}' (add its connector to Spark's class path, or set "
            f"spark.hadoop.fs.{place.scheme}.impl); supported: {SUPPORTED}"
        )
    return hadoop


use_hadoop(_hadoop_files)


def files_for(spark: SparkSession, root: str, what: str = "checkpoint_dir") -> tuple[Files, str]:
    """The ``Files`` for ``root`` and its qualified URI (``file:/...``, ``hdfs://...``);
    ``what`` names it in errors."""
    place = location(root, what)
    if not is_classic(spark):
        return _connect_files(root, what)
    hadoop = _known(HadoopFiles(spark), place, what)
    try:
        qualified = hadoop.qualify(root).rstrip("/")
    except Exception as exc:
        raise IterflowValueError(
            f"{what} '{root}' cannot be used: {str(exc).splitlines()[0]}. For "
            "hdfs://, s3a:// and similar paths, Spark needs the file system's connector "
            "and credentials (spark.hadoop.* settings)"
        ) from exc
    return (LocalFiles() if qualified.startswith("file:") else hadoop), qualified


def _connect_files(root: str, what: str = "checkpoint_dir") -> tuple[Files, str]:
    """Over Spark Connect the client has no Hadoop file system: a local (or mounted)
    directory, which Spark's writers on the server must see at the same path."""
    place = location(root, what)
    if place.local is None:
        raise IterflowValueError(
            f"{what} '{place.uri}': over Spark Connect, iterflow writes its small files "
            "from the client, which has no Hadoop file system; use a directory that the "
            "client and the Connect server both see at the same path (a shared mount)"
        )
    return LocalFiles(), f"file:{os.path.abspath(place.local)}"
