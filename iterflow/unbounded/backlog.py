"""What the sources of an unbounded iteration have waiting, and the time to drain it.

For each source of the streaming query (``source.<index>.``, its position in
``lastProgress["sources"]``): the rows per second of the last finished
micro-batch, how far behind the source is (files it has not taken, offsets
behind the latest) and, from how fast that shrank over recent micro-batches, the
seconds to drain it. Keys that cannot be known are left out.

No Spark job runs for any of it. The rates divide iterflow's own count of each
input's rows by the times of the query's progress (Spark's per-source row
counts stay 0: the epochs run the micro-batch's plan in the iteration's
session, not through the micro-batch's own execution). Offsets come from the
progress. A file source's backlog compares the files under its path with the
files it has taken, which Spark lists in its metadata log under the checkpoint
(``sources/<index>/``: one file per micro-batch, a version line then a JSON line
per file, compacted every few micro-batches into ``<batch>.compact``).
"""

from __future__ import annotations

import collections
import fnmatch
import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from iterflow.reports import RoundProgress
from iterflow.runtime.spark.files import Files, files_for
from iterflow.runtime.spark.jvm import HadoopFiles, file_sources, stream_checkpoint, time_setting_ms
from iterflow.unbounded.source_log import is_compaction, log_entries, log_files

log = logging.getLogger("iterflow.unbounded")

#: Measurements (one per micro-batch) over which the drain rate is taken.
DRAIN_WINDOW = 10

#: Read options with which the files a source takes are not the files under its path.
_UNMODELLED = ("modifiedbefore", "modifiedafter")
_GLOB = re.compile(r"[{}\[\]*?\\]")


class SourceBacklog:
    """Measures the backlog of every source of ``stream``, once per micro-batch."""

    def __init__(
        self,
        spark: SparkSession,
        stream: StreamingQuery,
        streams: tuple[str, ...],
        history: Callable[[], Sequence[RoundProgress]],
    ) -> None:
        self._spark = spark
        self._stream = stream
        self._streams = streams  # the streaming inputs, in the order of their sources
        self._history = history  # the epochs' progress, oldest first
        self._file_sources: dict[int, FileSourceBacklog] | None = None
        self._measured: tuple[Any, dict[str, float]] | None = None
        self._behind: dict[int, collections.deque[tuple[float, float]]] = {}
        self._previous_start: tuple[int, float] | None = None  # (micro-batch, start time)

    def measure(self) -> dict[str, float]:
        """The backlog keys, measured again once the query has finished another micro-batch
        (the next epoch then runs in the next micro-batch, or drains while it is idle)."""
        last: Any = self._stream.lastProgress or {}
        finished = (last.get("batchId"), last.get("timestamp"))
        if self._measured is None or self._measured[0] != finished:
            try:
                measured = self._measure(last)
            except Exception as exc:  # a report only: the epoch goes on without it
                log.warning("iterflow: the sources' backlog cannot be measured (%s)", exc)
                measured = {}
            self._measured = (finished, measured)
        return dict(self._measured[1])

    def _measure(self, last: Any) -> dict[str, float]:
        backlog: dict[str, float] = {}
        behind: dict[int, float] = {}
        sources = last.get("sources", [])
        rates = self._rates(last, len(sources))
        for index, source in enumerate(sources):
            prefix = f"source.{index}."
            for key, value in (source.get("metrics") or {}).items():
                if (number := _number(value)) is not None:
                    backlog[prefix + key] = number
            for key, rate in rates.get(index, {}).items():
                backlog[prefix + key] = rate
            offsets = offsets_behind(source.get("endOffset"), source.get("latestOffset"))
            if offsets is not None:
                backlog[prefix + "offsets_behind"] = behind[index] = offsets
        for index, source_files in self._files(planned=bool(last)).items():
            files = source_files.behind()
            if files is not None:
                backlog[f"source.{index}.files_behind"] = behind[index] = float(files)
        now = time.monotonic()
        for index, value in behind.items():
            samples = self._behind.setdefault(index, collections.deque(maxlen=DRAIN_WINDOW))
            samples.append((now, value))
            drain = drain_s(samples)
            if drain is not None:
                backlog[f"source.{index}.drain_s"] = drain
        return backlog

    def _rates(self, last: Any, sources: int) -> dict[int, dict[str, float]]:
        """Source index -> rows per second of the micro-batch of progress ``last``, as
        Spark defines its rates: over the time since the previous micro-batch started
        (``input_rows_per_s``) and over its own run (``processed_rows_per_s``). Known
        when each streaming input has one source (source k is then input k)."""
        batch, started = last.get("batchId"), last.get("timestamp")
        if batch is None or started is None:
            return {}
        # Spark writes UTC as "...Z", which Python reads only from 3.11 on.
        start = datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp()
        previous, self._previous_start = self._previous_start, (int(batch), start)
        rows = self._batch_rows(int(batch))
        if rows is None or sources != len(self._streams):
            return {}
        run_ms = _number((last.get("durationMs") or {}).get("triggerExecution"))
        seconds = {
            "input_rows_per_s": start - previous[1]
            if previous is not None and previous[0] == batch - 1
            else 0.0,
            "processed_rows_per_s": (run_ms or 0.0) / 1000,
        }
        return {
            index: {key: rows[name] / s for key, s in seconds.items() if s > 0}
            for index, name in enumerate(self._streams)
        }

    def _batch_rows(self, batch_id: int) -> dict[str, int] | None:
        """Rows of each streaming input that micro-batch ``batch_id`` brought, from its
        epochs' progress; None when an epoch did not count them or none is kept."""
        rows = dict.fromkeys(self._streams, 0)
        found = False
        for progress in list(self._history()):
            if progress.batch_id == batch_id:
                for name in self._streams:
                    counted = progress.input_rows.get(name)
                    if counted is None:
                        return None
                    rows[name] += counted
                found = True
        return rows if found else None

    def _files(self, *, planned: bool) -> dict[int, FileSourceBacklog]:
        """The query's file sources, found once it has planned its first micro-batch
        (``planned``: it has finished one)."""
        if self._file_sources is None:
            try:
                hadoop = HadoopFiles(self._spark)
                found = file_sources(self._stream, hadoop)
                files, root = files_for(self._spark, stream_checkpoint(self._stream))
            except Exception as exc:  # internals of another Spark build: no file backlog
                log.warning("iterflow: the file sources of the stream cannot be found (%s)", exc)
                self._file_sources = {}
                return {}
            if not found and not planned:
                return {}  # perhaps not planned yet: asked again at the next measurement
            self._file_sources = {
                index: FileSourceBacklog(
                    index, path, options, files, f"{root}/sources/{index}", hadoop, self._spark
                )
                for index, (path, options) in found.items()
            }
        return self._file_sources


class FileSourceBacklog:
    """The files under a file source's path that it has not taken yet."""

    def __init__(
        self,
        index: int,
        path: str,
        options: dict[str, str] | None,
        files: Files,
        log_dir: str,
        hadoop: HadoopFiles,
        spark: SparkSession,
    ) -> None:
        self.index = index
        self.path = path
        self._files = files
        self._log_dir = log_dir
        self._hadoop = hadoop
        self._taken: dict[str, int] = {}  # path -> modification time (ms)
        self._read_through = -1  # the last micro-batch of the log read into _taken
        self._failed = False
        self._countable = options is not None and _countable(options)
        self._max_age_ms: int | None = None
        self._name_filter: str | None = None
        if self._countable and options is not None:
            self._name_filter = options.get("pathglobfilter")
            latest_first = options.get("latestfirst", "false").lower() == "true"
            limited = "maxfilespertrigger" in options or "maxbytespertrigger" in options
            if not (latest_first and limited):  # Spark then ignores maxFileAge
                context = spark.sparkContext
                self._max_age_ms = time_setting_ms(context, options.get("maxfileage", "7d"))

    def behind(self) -> int | None:
        """Files the source has not taken yet; None when that cannot be counted (the error
        is logged once: the backlog is a report, it never fails an epoch)."""
        if not self._countable or self._failed:
            return None
        try:
            self._read_log()
            present = self._present()
        except Exception as exc:
            self._failed = True
            log.warning(
                "iterflow: the files behind source %d (%s) cannot be counted: %s",
                self.index,
                self.path,
                exc,
            )
            return None
        if present is None:
            return None
        oldest = -(2**63)
        if self._max_age_ms is not None and self._taken:
            oldest = max(self._taken.values()) - self._max_age_ms
        return sum(1 for p, t in present.items() if p not in self._taken and t >= oldest)

    def _read_log(self) -> None:
        """Add the files of the micro-batches logged since the last read to ``_taken``."""
        logged = log_files(self._files, self._log_dir)
        compacts = [batch for batch, name in logged.items() if is_compaction(name)]
        newer = [b for b in sorted(logged) if b > self._read_through]
        # A compaction holds every file up to its micro-batch: the files before it are spared.
        latest = max((b for b in compacts if b > self._read_through), default=None)
        for batch in newer if latest is None else [b for b in newer if b >= latest]:
            for _, entry in log_entries(self._files, f"{self._log_dir}/{logged[batch]}"):
                self._taken[_local(str(entry["path"]))] = int(entry["timestamp"])
            self._read_through = batch

    def _present(self) -> dict[str, int] | None:
        """Path -> modification time (ms) of each file the source would read; None when the
        path is another query's file sink output (Spark then reads that sink's log)."""
        if _GLOB.search(self.path):
            roots = [(_local(uri), directory) for uri, directory in self._hadoop.glob(self.path)]
        else:
            roots = [(_local(self.path), True)]
        present: dict[str, int] = {}
        for root, directory in roots:
            if not directory:
                present.update(self._kept({root: self._modified(root)}, root.rpartition("/")[0]))
            elif root.startswith("/"):
                if os.path.isdir(os.path.join(root, "_spark_metadata")):
                    return None
                present.update(self._kept(_walk(root), root))
            else:
                if self._hadoop.exists(f"{root}/_spark_metadata"):
                    return None
                times = {_local(uri): t for uri, t in self._hadoop.modification_times(root).items()}
                present.update(self._kept(times, root))
        return present

    def _modified(self, path: str) -> int:
        if path.startswith("/"):
            return os.stat(path).st_mtime_ns // 1_000_000
        return next(iter(self._hadoop.modification_times(path).values()))

    def _kept(self, times: dict[str, int], root: str) -> dict[str, int]:
        """The files of ``times`` that Spark reads: no hidden name on the way from ``root``,
        and a name the ``pathGlobFilter`` option accepts."""
        kept = {}
        for path, modified in times.items():
            parts = path[len(root) :].strip("/").split("/")
            if any(_hidden(part) for part in parts):
                continue
            if self._name_filter is not None and not _matches(parts[-1], self._name_filter):
                continue
            kept[path] = modified
        return kept


def _countable(options: dict[str, str]) -> bool:
    """Whether the files under the path, less those taken, are what the source will read."""
    if any(option in options for option in _UNMODELLED):
        return False
    if options.get("filenameonly", "false").lower() == "true":
        return False
    glob_filter = options.get("pathglobfilter")
    return glob_filter is None or "{" not in glob_filter


def _walk(root: str) -> dict[str, int]:
    """Path -> modification time (ms) of every file under the local directory ``root``,
    skipping hidden directories."""
    times: dict[str, int] = {}
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if not _hidden(d)]
        for name in names:
            path = os.path.join(directory, name)
            times[path] = os.stat(path).st_mtime_ns // 1_000_000
    return times


def _hidden(name: str) -> bool:
    """Names Spark's file listing skips (``HadoopFSUtils.shouldFilterOutPathName``)."""
    skipped = (
        (name.startswith("_") and "=" not in name)
        or name.startswith(".")
        or name.endswith("._COPYING_")
    )
    return skipped and not name.startswith(("_common_metadata", "_metadata"))


def _matches(name: str, pattern: str) -> bool:
    """Hadoop's glob without ``{a,b}`` (refused earlier) is fnmatch with ``[^`` for ``[!``."""
    return fnmatch.fnmatchcase(name, pattern.replace("[^", "[!"))


def _local(uri: str) -> str:
    """A file's URI as one key: a plain path for the local file system, else the decoded URI."""
    decoded = unquote(uri)
    if decoded.startswith("file:"):
        return "/" + decoded[len("file:") :].lstrip("/")
    return decoded


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def offsets_behind(end: Any, latest: Any) -> float | None:
    """How far ``latest`` (the newest offsets the source holds) is past ``end`` (where the
    micro-batch stopped): the sum over their numeric offsets (Kafka: records per
    partition); None when the source reports no latest offset or the two do not match."""

    def parsed(offset: Any) -> Any:
        return json.loads(offset) if isinstance(offset, str) else offset

    def difference(end: Any, latest: Any) -> float | None:
        if isinstance(latest, dict) and isinstance(end, dict):
            if not latest or set(latest) != set(end):
                return None
            parts = [difference(end[key], latest[key]) for key in latest]
            return None if None in parts else sum(p for p in parts if p is not None)
        if isinstance(latest, int | float) and isinstance(end, int | float):
            if isinstance(latest, bool) or isinstance(end, bool):
                return None
            return float(latest - end)
        return None

    try:
        total = difference(parsed(end), parsed(latest))
    except ValueError:  # not JSON
        return None
    return total if total is not None and total >= 0 else None


def drain_s(samples: collections.deque[tuple[float, float]]) -> float | None:
    """Seconds until the backlog (the last of ``samples``, (time, backlog) oldest first)
    reaches 0 at the rate it fell since the oldest sample; 0 when nothing is behind; None
    when it did not fall (it then does not drain)."""
    now, behind = samples[-1]
    if behind == 0:
        return 0.0
    then, before = samples[0]
    if now <= then or before <= behind:
        return None
    return behind / ((before - behind) / (now - then))
