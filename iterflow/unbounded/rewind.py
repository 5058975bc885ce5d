"""Rewinding Spark's streaming checkpoint to the epoch log's last commit, so that Spark
delivers the micro-batches after it again.

With commits off the loop's path (``start(commit_interval_s=...)``), Spark commits a
micro-batch (``commits/<batch>`` under the stream's checkpoint) as soon as
``foreachBatch`` returns, while the epoch log commits later: after a crash, Spark's
checkpoint may be ahead of the last commit, and Spark would not deliver the
micro-batches in between again. Before the stream starts, its checkpoint is put back
to the micro-batch of the last commit (``StreamPosition.batch_id``, K):

- a file source's metadata log (``sources/<id>/``: the files it took, one entry per
  log offset) loses the entries after the log offset that ``offsets/K`` recorded for
  it. Spark writes ``offsets/<b>`` in one of two formats, named by its first line
  (``spark.sql.streaming.offsetLog.formatVersion``): ``v1`` lists one offset per line
  in the order of the sources, whose ids are their positions; ``v2`` (an
  ``OffsetMap``) writes ``<id>:<offset>`` per line, the id being the source's position
  or, with named sources, its name. Either way ``sources/<id>/`` is its log. Any other
  format is refused: iterflow cannot tell which offset belongs to which log. Spark
  compacts that log every ``spark.sql.streaming.fileSource.log.compactInterval``
  entries into ``<n>.compact`` (all entries up to n) and may delete the entries it
  compacted; a compaction after the log offset is replaced by the files Spark reads at
  that offset (the compaction before it and the entries since), rebuilt from the
  entries, each of which names its log offset;
- ``offsets/<b>`` and then ``commits/<b>`` for every b > K are deleted.

Spark then plans micro-batch K + 1 afresh from the offsets it recorded for K, as it
plans every new micro-batch. Each step can run again after a crash in the middle (the
commits go last, and they are what says a rewind is due). Only sources that can read
again what they delivered once are allowed (``check_replayable``); a stream with
state of its own (``state/``) is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowError, IterflowValueError
from iterflow.runtime.checkpoint.output_sinks import Sink
from iterflow.runtime.spark.files import Files, files_for
from iterflow.runtime.spark.jvm import stream_sources
from iterflow.unbounded.source_log import is_compaction, log_entries, log_files

#: Under ``checkpoint_location``: Spark's own streaming checkpoint, and iterflow's epoch log.
STREAM_DIR = "stream"
EPOCHS_DIR = "epochs"

#: Sources that read again what they delivered once, from the offsets Spark recorded.
REPLAYABLE = ("kafka", "rate", "rate-micro-batch")
FILE_SOURCE = "FileSource["
COMPACT_INTERVAL_CONF = "spark.sql.streaming.fileSource.log.compactInterval"
#: Spark's setting for the format of its offset log (``offsets/<batch>``).
OFFSET_LOG_FORMAT_CONF = "spark.sql.streaming.offsetLog.formatVersion"
#: The offset log formats iterflow reads (``_source_offsets``).
OFFSET_LOG_FORMATS = ("1", "2")
#: The offset of a source that had none at a micro-batch, in either format.
NO_OFFSET = "-"


class UnreplayableStreamError(IterflowError):
    """A streaming input cannot deliver again the micro-batches after the last commit."""


def check_replayable(streams: dict[str, DataFrame]) -> None:
    """Every source of the streaming inputs ``streams`` can be read again from recorded
    offsets (``start(commit_interval_s=...)`` relies on it after a crash)."""
    for name, df in streams.items():
        for source, options in stream_sources(df):
            if source.startswith(FILE_SOURCE):
                if options.get("cleansource", "off").lower() != "off":
                    raise UnreplayableStreamError(
                        f"start(commit_interval_s=...): input '{name}' reads files with "
                        f"cleanSource='{options['cleansource']}', which moves or deletes "
                        "the files of a micro-batch once Spark commits it, before the epoch "
                        "log may have; drop the option, or use commit_interval_s=None"
                    )
            elif source not in REPLAYABLE:
                raise UnreplayableStreamError(
                    f"start(commit_interval_s=...): input '{name}' reads source '{source}', "
                    "which cannot deliver a micro-batch again after Spark committed it; "
                    "commits off the loop's path need a source that replays from recorded "
                    f"offsets (files, {', '.join(REPLAYABLE)}), or use commit_interval_s=None"
                )


def rewind(spark: SparkSession, stream_dir: str, batch_id: int) -> bool:
    """Put the streaming checkpoint ``stream_dir`` back to micro-batch ``batch_id`` (the
    last one the epoch log committed) when Spark committed micro-batches after it; True
    when it did."""
    files, root = files_for(spark, stream_dir)
    committed = _logged(files, f"{root}/commits")
    if not committed or max(committed) <= batch_id:
        return False
    where = f"checkpoint_location's stream checkpoint '{root}'"
    if files.children(f"{root}/state"):
        raise UnreplayableStreamError(
            f"{where} holds the state of stateful operators, which cannot be put back to "
            f"micro-batch {batch_id} of the last commit; bind streaming inputs without "
            "aggregations or deduplication, or use commit_interval_s=None"
        )
    offsets = _logged(files, f"{root}/offsets")
    if batch_id >= 0 and batch_id not in offsets:
        raise IterflowError(
            f"{where} no longer holds the offsets of micro-batch {batch_id}, the last one "
            "the epoch log committed (Spark keeps spark.sql.streaming.minBatchesToRetain "
            "micro-batches), so the micro-batches after it cannot be read again. Delete "
            "the whole location to start over"
        )
    # Both read before anything changes: a format iterflow cannot read changes nothing.
    latest = _source_offsets(files, f"{root}/offsets/{max(offsets)}") if offsets else {}
    at = _source_offsets(files, f"{root}/offsets/{batch_id}") if batch_id >= 0 else {}
    interval = int(spark.conf.get(COMPACT_INTERVAL_CONF, "10") or 10)
    for source, recorded in latest.items():
        if _log_offset(recorded) is None:
            continue  # not a file source: its own files under sources/ stay
        offset = _log_offset(at.get(source, NO_OFFSET))
        _rewind_file_log(
            files, f"{root}/sources/{source}", -1 if offset is None else offset, interval
        )
    for log in ("offsets", "commits"):
        for batch in sorted(_logged(files, f"{root}/{log}")):
            if batch > batch_id:
                _delete(files, f"{root}/{log}", str(batch))
    return True


def check_stream_checkpoint(
    spark: SparkSession,
    location: str,
    *,
    batch_id: int,
    epoch: int,
    resumed: bool,
    sinks: Iterable[Sink],
) -> None:
    """The epoch log (its last commit: micro-batch ``batch_id``, ``epoch``; ``resumed``
    when there is one) and Spark's own streaming checkpoint must agree: Spark's is rewound
    to the last commit when it is ahead (commits off the loop's path); ``sinks`` drop what
    a crashed attempt wrote after the last commit."""
    stream_files, stream_root = files_for(spark, f"{location}/{STREAM_DIR}", "checkpoint_location")
    stream_started = bool(stream_files.children(f"{stream_root}/offsets"))
    if batch_id >= 0 and not stream_started:
        raise IterflowValueError(
            f"checkpoint_location '{location}': the epoch log has consumed micro-batch "
            f"{batch_id}, but the stream's own checkpoint ('{STREAM_DIR}/') is "
            "gone, so Spark would number micro-batches from 0 again and iterflow would "
            "skip them. Delete the whole location to start over"
        )
    rewind(spark, f"{location}/{STREAM_DIR}", batch_id)
    if stream_started or resumed:
        # A crashed attempt wrote these epochs after the last commit; this start may run
        # them on other rows (or not at all).
        for sink in sinks:
            sink.discard_after(spark, epoch)


def _logged(files: Files, directory: str) -> list[int]:
    return [int(name) for name in files.children(directory) if name.isdigit()]


def check_offset_log(spark: SparkSession, stream_dir: str) -> None:
    """``start(commit_interval_s=...)``: the offset log of the streaming checkpoint
    ``stream_dir`` is in a format a rewind can read, as is the one Spark is set to write;
    refused at start rather than at the restart after a crash."""
    setting = spark.conf.get(OFFSET_LOG_FORMAT_CONF, None)
    if setting is not None and setting.strip() not in OFFSET_LOG_FORMATS:
        raise UnreplayableStreamError(_unknown_format(f"v{setting.strip()}", "the session"))
    files, root = files_for(spark, stream_dir)
    offsets = _logged(files, f"{root}/offsets")
    if offsets:
        _source_offsets(files, f"{root}/offsets/{max(offsets)}")


def _source_offsets(files: Files, path: str) -> dict[str, str]:
    """Source id (its directory under ``sources/``) -> its offset (``-`` for none) in the
    ``offsets/`` entry ``path``, in the format its first line names."""
    lines = files.read_bytes(path).decode("utf-8").splitlines()
    version = lines[0].strip() if lines else ""
    recorded = lines[2:]  # after the version and the metadata lines
    if version == "v1":
        return {str(index): line for index, line in enumerate(recorded)}
    if version != "v2":
        raise UnreplayableStreamError(_unknown_format(version, f"'{path}'"))
    offsets: dict[str, str] = {}
    for line in recorded:
        source, colon, offset = line.partition(":")
        if not colon or not source or "/" in source or source in (".", ".."):
            raise UnreplayableStreamError(
                f"the offset log entry '{path}' (format v2) has the line {line!r}, not "
                "'<source id>:<offset>'; it cannot be put back. Delete the whole checkpoint "
                "location to start over, or use commit_interval_s=None"
            )
        offsets[source] = offset
    return offsets


def _unknown_format(version: str, where: str) -> str:
    return (
        f"start(commit_interval_s=...): {where} uses Spark's offset log format {version!r}, "
        f"which iterflow cannot read to put the stream back to its last commit (it reads "
        f"{', '.join('v' + v for v in OFFSET_LOG_FORMATS)}). Set {OFFSET_LOG_FORMAT_CONF} "
        "to 1 or 2 for a new checkpoint location, or use commit_interval_s=None"
    )


def _log_offset(line: str) -> int | None:
    """A file source's offset (``{"logOffset": n}``), or None for another source's."""
    try:
        offset = json.loads(line)
    except ValueError:
        return None
    if isinstance(offset, dict) and set(offset) == {"logOffset"}:
        return int(offset["logOffset"])
    return None


def _rewind_file_log(files: Files, directory: str, offset: int, default_interval: int) -> None:
    """Drop a file source's log entries after log offset ``offset``, leaving the files that
    Spark reads at ``offset`` (rebuilt from a later compaction where they are gone)."""
    entries = log_files(files, directory)
    later = sorted(n for n in entries if n > offset)
    if not later:
        return
    compactions = [n for n in later if is_compaction(entries[n])]
    rebuilt = _entries(files, f"{directory}/{entries[compactions[0]]}") if compactions else []
    kept = [n for n, name in entries.items() if n <= offset and is_compaction(name)]
    interval = compact_interval(kept, default_interval)
    for batch in valid_batches(offset, interval):
        name = file_name(batch, interval)
        if entries.get(batch) == name or not rebuilt:
            continue  # there already, or nothing to rebuild it from (checked below)
        compaction = is_compaction(name)
        lines = [line for line, of in rebuilt if (of <= batch if compaction else of == batch)]
        text = "\n".join(["v1", *lines])
        files.write_bytes(f"{directory}/{name}", text.encode("utf-8"), atomic=True)
    for batch in later:
        _delete(files, directory, entries[batch])
    entries = log_files(files, directory)
    kept = [n for n, name in entries.items() if is_compaction(name)]
    interval = compact_interval(kept, default_interval)
    missing = [
        file_name(b, interval)
        for b in valid_batches(offset, interval)
        if entries.get(b) != file_name(b, interval)
    ]
    if missing:
        raise IterflowError(
            f"the file source log '{directory}' lacks {missing}, which Spark reads at log "
            f"offset {offset} of the last commit, and no compaction holds them. Delete the "
            "whole checkpoint location to start over"
        )


def _entries(files: Files, path: str) -> list[tuple[str, int]]:
    """Each entry of a file source log file (its JSON line) with its log offset."""
    return [(line, int(entry["batchId"])) for line, entry in log_entries(files, path)]


def compact_interval(compactions: Sequence[int], default: int) -> int:
    """The compaction interval Spark takes for a log with ``compactions`` (the log offsets
    of its ``.compact`` files) when its setting is ``default``
    (``CompactibleFileStreamLog.compactInterval``)."""
    latest = sorted(compactions, reverse=True)
    if len(latest) >= 2:
        return latest[0] - latest[1]
    if not latest:
        return default
    total = latest[0] + 1
    if total <= default or default >= total // 2:
        return total
    return next((i for i in range(default, total // 2 + 1) if total % i == 0), total)


def valid_batches(offset: int, interval: int) -> range:
    """The log offsets whose files Spark reads for the log at ``offset``: the last
    compaction up to it and every entry since (``getAllValidBatches``)."""
    return range(max(0, (offset + 1) // interval * interval - 1), offset + 1)


def file_name(batch: int, interval: int) -> str:
    return f"{batch}.compact" if (batch + 1) % interval == 0 else str(batch)


def _delete(files: Files, directory: str, name: str) -> None:
    """Delete a log entry and the checksum Hadoop's local file system keeps beside it (a
    stale one would fail the read of the entry Spark writes again under that name)."""
    files.delete(f"{directory}/{name}")
    files.delete(f"{directory}/.{name}.crc")
