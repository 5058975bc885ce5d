"""The few places iterflow reaches into Spark's JVM objects (classic sessions only).

Kept in one module so that a change of Spark internals, or a session kind that
has no JVM handle (Spark Connect), touches one file.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from py4j.protocol import Py4JError
from pyspark import SparkConf, SparkContext
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql.types import StructType

from iterflow.errors import IterflowError, IterflowValueError

log = logging.getLogger("iterflow.spark")

# Whether the warning that checkpoint statistics cannot be set was logged.
_statistics_warned = False
# (session id, bytes, rows) -> Some(Statistics): rounds of one iteration usually
# repeat their row counts, and building Statistics costs two plan analyses.
_statistics_made: dict[tuple[int, int, int], Any] = {}


def release_local_checkpoint(df: DataFrame) -> None:
    """Drop the blocks of a DataFrame made by ``localCheckpoint``.

    ``df.unpersist()`` does not release them: only JVM garbage collection
    would, at an unpredictable time. The blocks belong to the checkpointed RDD
    under the ``LogicalRDD`` at the root of the plan; unpersisting that RDD
    frees them now. Any other plan is left alone.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:  # Spark Connect: PySpark releases it when df is garbage collected
        return
    plan = jdf.logicalPlan()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def set_checkpoint_statistics(df: DataFrame, rows: int) -> bool:
    """Give a ``localCheckpoint`` result statistics from its real row count.

    Spark's checkpoint keeps the optimizer's *estimate* of the plan it cut
    (``LogicalRDD.originStats``). A round that joins its variable compounds
    that estimate every round (PageRank: x1e5 per round, thousands of digits
    by round 200), so join strategies drift and planning slows down although
    the plan itself stays small. Replacing the estimate with ``rows`` times
    Spark's per-row size keeps round k's statistics those of round 1.
    Returns False (and logs once) when this Spark build does not allow it.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return False
    plan = jdf.logicalPlan()
    try:
        session: Any = df.sparkSession
        size = max(rows, 1) * (8 + int(plan.schema().defaultSize()))
        _set_field(plan, "originStats", _statistics(session, size, rows))
        plan.invalidateStatsCache()
        return True
    except Exception as exc:  # a Spark build whose LogicalRDD differs
        global _statistics_warned
        if not _statistics_warned:
            _statistics_warned = True
            log.warning("iterflow: cannot set checkpoint statistics on this Spark build: %s", exc)
        return False


def _statistics(session: Any, size: int, rows: int) -> Any:
    """``Some(Statistics(sizeInBytes=size, rowCount=Some(rows)))`` made on the JVM side."""
    key = (id(session), size, rows)
    made = _statistics_made.get(key)
    if made is None:
        # py4j turns every scala.math.BigInt it receives into a Python int, so
        # the values are made by Spark itself: a Range of n longs has
        # sizeInBytes 8n and rowCount n.
        stats = _range_statistics(session, -(-size // 8))
        _set_field(stats, "rowCount", _range_statistics(session, rows).rowCount())
        if len(_statistics_made) >= 64:
            _statistics_made.clear()
        made = _statistics_made[key] = session._jvm.scala.Some(stats)
    return made


def _range_statistics(session: Any, n: int) -> Any:
    return session._jsparkSession.range(n).logicalPlan().stats()


def _set_field(target: Any, name: str, value: Any) -> None:
    field = target.getClass().getDeclaredField(name)
    field.setAccessible(True)
    field.set(target, value)


def observation_ready(observation: Observation) -> bool:
    """Whether Spark has delivered ``observation`` (``get`` would not block)."""
    handle: Any = getattr(observation, "_jo", None)
    if handle is None:  # a Spark Connect Observation: filled in by deliver_observations
        return bool(getattr(observation, "_result", None)) or (
            getattr(observation, "_error", None) is not None
        )
    return bool(handle.future().isCompleted())


#: How long to wait for Spark's listener bus to deliver observations, in milliseconds.
_DELIVERY_WAIT_MS = 2_000


def await_observations(observations: list[Observation]) -> None:
    """Let Spark deliver ``observations`` of jobs that ran: on some versions (4.0) a
    classic Observation is completed by a listener on Spark's asynchronous listener bus,
    after the job has returned. Waits for the bus to empty (at most two seconds) when
    one of them is not completed yet; one that no job evaluated stays incomplete."""
    handles = [getattr(o, "_jo", None) for o in observations]
    pending = [h for h in handles if h is not None and not h.future().isCompleted()]
    if not pending:
        return
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return
    try:
        context._jsc.sc().listenerBus().waitUntilEmpty(_DELIVERY_WAIT_MS)
    except Exception:  # a timeout, or the method moved: report what was delivered
        log.debug("Spark's listener bus did not empty in time", exc_info=True)


def union_keeps_partitions(df: DataFrame) -> bool:
    """True when the first branch of the union in ``df``'s physical plan has a partitioning
    a shuffle set (not ``UnknownPartitioning``): a branch unioned beside it adds its
    partition to this round only, where beside a branch that inherits its input's
    partitions it would add one more every round. Plans ``df``; its action reuses the plan.
    False for a plan of another shape, or over Spark Connect."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return False
    try:
        node = jdf.queryExecution().executedPlan()
        while node.nodeName() != "Union":
            children = node.children()
            if children.size() != 1:
                return False
            node = children.apply(0)
        partitioning = node.children().apply(0).outputPartitioning()
        return str(partitioning.getClass().getSimpleName()) != "UnknownPartitioning"
    except Exception:  # a physical plan of another shape: no union to ride on
        return False


def deliver_observations(df: DataFrame) -> None:
    """After a command on the Spark Connect DataFrame ``df`` (such as ``localCheckpoint``),
    hand its observed metrics to the plan's ``Observation`` objects.

    PySpark's Connect client fills Observations in on ``collect()``, but not after
    ``localCheckpoint``; the server sends the metrics all the same, and they are in
    ``df.executionInfo.flows``. A classic DataFrame needs nothing: the JVM delivers them.
    """
    if hasattr(df, "_jdf"):
        return
    info = getattr(df, "executionInfo", None)
    observations = getattr(getattr(df, "_plan", None), "observations", None) or {}
    for name, values in getattr(info, "flows", None) or []:
        target = observations.get(name)
        if target is not None and getattr(target, "_result", None) is not None:
            target._result.update(values)


def undelivered_observations(df: DataFrame) -> list[str]:
    """The observations in the plan of the Spark Connect DataFrame ``df`` that a command
    on it ran but whose metrics did not come back (``deliver_observations`` found none):
    a Spark 4.0 Connect server reports only the plan's outermost observation after a
    command. Empty for a classic DataFrame."""
    if hasattr(df, "_jdf"):
        return []
    observations = getattr(getattr(df, "_plan", None), "observations", None) or {}
    return sorted(name for name, o in observations.items() if not observation_ready(o))


class HadoopFiles:
    """Small files and directories on any Hadoop file system (local, HDFS, S3A, ...).

    Used by durable checkpoints for what Spark's writers do not cover: the
    manifest, driver state and commit marker, listing and deleting epochs.
    """

    def __init__(self, spark: SparkSession | SparkContext) -> None:
        context: Any = spark if isinstance(spark, SparkContext) else spark.sparkContext
        self._jvm = context._jvm
        self._conf = context._jsc.hadoopConfiguration()

    def knows(self, scheme: str) -> bool:
        """Whether Hadoop has a file system for ``scheme`` (its connector is on the class
        path, or a ``spark.hadoop.fs.<scheme>.impl`` setting names one)."""
        try:
            self._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, self._conf)
        except Exception:
            return False
        return True

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def _fs(self, path: str) -> Any:
        return self._path(path).getFileSystem(self._conf)

    def qualify(self, path: str) -> str:
        """``path`` with its scheme (``file:``, ``hdfs:``, ...), as Spark resolves it."""
        return str(self._fs(path).makeQualified(self._path(path)).toString())

    def write_bytes(self, path: str, data: bytes, *, atomic: bool = False) -> None:
        """Write ``path``; ``atomic`` writes a temporary name first and renames it (atomic
        on HDFS; object stores show an object only once it is written anyway)."""
        fs = self._fs(path)
        written = self._path(f"{path}._writing" if atomic else path)
        stream = fs.create(written, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
        if atomic:
            fs.delete(self._path(path), False)
            if not fs.rename(written, self._path(path)):
                raise OSError(f"could not rename {written} to {path}")

    def create(self, path: str, data: bytes) -> bool:
        """Write ``path`` unless it exists; False when it does. The file system decides
        (``create`` without overwrite): atomic on HDFS, where one of several processes
        wins; readers may see it empty until it is closed."""
        fs = self._fs(path)
        try:
            stream = fs.create(self._path(path), False)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()
        except Exception:
            if fs.exists(self._path(path)):
                return False  # another process created it first
            raise
        return True

    def read_bytes(self, path: str) -> bytes:
        stream = self._fs(path).open(self._path(path))
        try:
            # py4j returns a Java byte[] as Python bytes (a copy).
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def exists(self, path: str) -> bool:
        return bool(self._fs(path).exists(self._path(path)))

    def children(self, path: str) -> list[str]:
        """Names of the entries directly under ``path`` (none when it does not exist)."""
        if not self.exists(path):
            return []
        return [str(s.getPath().getName()) for s in self._fs(path).listStatus(self._path(path))]

    def file_sizes(self, path: str) -> dict[str, int]:
        """Relative path -> size of every file under the directory ``path``."""
        root = self._fs(path).makeQualified(self._path(path)).toString()
        return {
            str(s.getPath().toString())[len(root) :].lstrip("/"): int(s.getLen())
            for s in jvm_iterate(self._fs(path).listFiles(self._path(path), True))
        }

    def delete(self, path: str) -> None:
        self._fs(path).delete(self._path(path), True)

    def rename(self, source: str, target: str) -> None:
        if not self._fs(source).rename(self._path(source), self._path(target)):
            raise OSError(f"could not rename {source} to {target}")

    def append_stream(self, path: str) -> _HadoopStream | None:
        """``path`` open for appending (created when missing), or None where the file
        system cannot append (S3A, and Hadoop's checksummed local file system)."""
        fs, target = self._fs(path), self._path(path)
        if not fs.hasPathCapability(target, "fs.capability.paths.append"):
            return None
        if fs.exists(target):
            return _HadoopStream(fs.append(target))
        fs.mkdirs(target.getParent())
        return _HadoopStream(fs.create(target, False))

    def glob(self, pattern: str) -> list[tuple[str, bool]]:
        """The URI and whether it is a directory of each path ``pattern`` matches (Hadoop's
        glob syntax, as Spark expands a path it reads)."""
        found = self._fs(pattern).globStatus(self._path(pattern)) or []
        return [(str(s.getPath().toUri().toString()), bool(s.isDirectory())) for s in found]

    def modification_times(self, path: str) -> dict[str, int]:
        """URI -> modification time (ms since the epoch) of every file under ``path``."""
        return {
            str(s.getPath().toUri().toString()): int(s.getModificationTime())
            for s in jvm_iterate(self._fs(path).listFiles(self._path(path), True))
        }


class _HadoopStream:
    """A Hadoop output stream as ``iterflow.storage.AppendStream``: ``flush`` is ``hflush``
    (what is written is visible to readers, and survives this process)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: bytes) -> None:
        self._stream.write(bytearray(data))

    def flush(self) -> None:
        self._stream.hflush()

    def close(self) -> None:
        self._stream.close()


def active_context() -> SparkContext | None:
    """The SparkContext running in this process (a classic session's), or None."""
    return SparkContext._active_spark_context


def jvm_iterate(iterator: Any) -> Iterator[Any]:
    """The elements of a JVM iterator handed over by py4j (a Scala ``Iterator``, a Hadoop
    ``RemoteIterator``: anything with ``hasNext`` and ``next``)."""
    while iterator.hasNext():
        yield iterator.next()


def in_session(df: DataFrame, spark: SparkSession) -> DataFrame:
    """``df``'s plan as a DataFrame of ``spark``.

    A ``foreachBatch`` micro-batch belongs to the streaming query's own session.
    An observation registers with the session of the DataFrame it observes and
    is delivered only by actions of that session, so an observed micro-batch
    joined with the iteration's DataFrames would never report its rows. The
    micro-batch plan is a ``LogicalRDD``, which any session can run.

    Over Spark Connect the plan is the client's, sent again in ``spark``'s name (Connect
    refuses to join DataFrames of two sessions).
    """
    if df.sparkSession is spark:
        return df
    if not is_classic(spark):
        return type(df)(df._plan, spark)
    try:
        jvm: Any = spark._jvm
        moved = jvm.org.apache.spark.sql.classic.Dataset.ofRows(
            spark._jsparkSession, df._jdf.logicalPlan()
        )
        return DataFrame(moved, spark)
    except Exception as exc:  # another Spark build: rows of inputs may then be unknown
        log.warning("iterflow: a micro-batch cannot join the iteration's session (%s)", exc)
        return df


def is_classic(spark: SparkSession) -> bool:
    """Whether ``spark`` is a classic session, with a JVM in this process; False for a
    Spark Connect session (which has no SparkContext). The one place iterflow asks."""
    return spark_context(spark) is not None


def spark_context(spark: SparkSession) -> SparkContext | None:
    """The SparkContext of a classic session; None under Spark Connect, which has none."""
    try:
        return spark.sparkContext
    except Exception:
        return None


#: Lazy local frames make their JVM Dataset under this lock, so each makes exactly one.
_MAKING = threading.RLock()


class _LazyLocalFrame(ClassicDataFrame):
    """A classic DataFrame over rows held in Python, whose JVM Dataset (a local relation)
    is made on first use."""

    def __new__(cls, *args: Any) -> Any:
        # PySpark's DataFrame.__new__ takes (jdf, session) and, in some versions
        # (4.0.0), builds a classic DataFrame from them: make this class's object.
        return object.__new__(cls)

    def __init__(self, spark: SparkSession, table: Any, schema: StructType, attribute: str) -> None:
        # What the classic DataFrame's constructor sets, less the JVM Dataset.
        self._session = spark
        self._sc = spark.sparkContext
        self.is_cached = False
        self._support_repr_html = False
        self.__dict__["schema"] = schema  # the cached_property, filled in
        self.__dict__[attribute] = table
        self.__dict__["_rows_attribute"] = attribute

    @property
    def _jdf(self) -> Any:
        # Once: a column taken from one Dataset does not resolve in another, and a
        # checkpoint writer thread may ask for it while the next body does.
        with _MAKING:
            made = self.__dict__.get("_made_jdf")
            if made is None:
                table = self.__dict__[self.__dict__["_rows_attribute"]].combine_chunks()
                try:
                    made = self._session.createDataFrame(table, schema=self.schema)._jdf
                except AttributeError as error:  # not to pass for a missing attribute
                    raise RuntimeError(f"cannot make the held rows a Dataset: {error}") from error
                self.__dict__["_made_jdf"] = made
        return made


#: Where a DataFrame over rows held on the driver keeps them (a pyarrow Table).
HELD_ATTRIBUTE = "_iterflow_held"


def held_on_driver(df: DataFrame) -> Any:
    """The rows of ``df`` (a pyarrow Table) when it is a DataFrame over rows held on the
    driver (a small variable, a resident kernel's result), else None."""
    return getattr(df, "__dict__", {}).get(HELD_ATTRIBUTE)


def lazy_local_frame(
    spark: SparkSession, table: Any, schema: StructType, attribute: str
) -> DataFrame:
    """A classic DataFrame over the pyarrow ``table`` (kept in its attribute ``attribute``)
    whose JVM side is made only when Spark needs it."""
    return _LazyLocalFrame(spark, table, schema, attribute)


def semantic_hash(df: DataFrame) -> int | None:
    """A hash equal for DataFrames with the same canonicalized plan; None where the plan
    cannot be reached (a Spark Connect DataFrame)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    return int(jdf.queryExecution().analyzed().semanticHash())


def plan_leaves(df: DataFrame) -> frozenset[int] | None:
    """Where the rows of ``df`` come from: the semantic hash of each leaf of its analyzed
    plan (a scan, local rows, a checkpoint, a micro-batch...), equal for the same leaf
    in every DataFrame built on it; None where the plan cannot be reached (a Spark
    Connect DataFrame)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    leaves = jdf.queryExecution().analyzed().collectLeaves()
    return frozenset(int(leaves.apply(k).semanticHash()) for k in range(leaves.size()))


#: Physical operators that may run Spark jobs before the plan's own tasks do (a shuffle,
#: a broadcast, a subquery, an adaptive query stage).
_RUNS_JOBS = ("Exchange", "Subquery", "QueryStage")


def planned_partitions(df: DataFrame) -> int | None:
    """The number of partitions of ``df``, read from its physical plan without a Spark job;
    None when only running the plan would tell, or under Spark Connect (no plan to read).

    Making the RDD of a plan with a shuffle (which adaptive execution may coalesce), a
    broadcast, a subquery or a cache not filled yet runs jobs; a plan of scans, local
    rows, checkpoints, filled caches and narrow steps over them runs none.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    try:
        execution = jdf.queryExecution()
        plan = execution.executedPlan()
        if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
            plan = plan.initialPlan()  # only table caches make such a plan run nothing first
        pending = [plan]
        while pending:
            node = pending.pop()
            kind = node.getClass().getSimpleName()
            if any(word in kind for word in _RUNS_JOBS) or node.subqueries().nonEmpty():
                return None
            if kind == "InMemoryTableScanExec" and not node.isMaterialized():
                return None
            children = node.children()
            pending.extend(children.apply(i) for i in range(children.size()))
        return int(execution.toRdd().getNumPartitions())
    except Exception:  # a Spark build whose plan classes differ: unknown, as under Connect
        log.debug("the partitions of a plan could not be read", exc_info=True)
        return None


def plan_now(df: DataFrame) -> None:
    """Make ``df``'s physical plan now, under the session's settings of this moment: the
    action that follows reuses it (as ``union_keeps_partitions`` relies on too)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        jdf.queryExecution().executedPlan()


def task_slots(context: SparkContext) -> int:
    """Tasks the cluster runs at once now, as Spark counts them for barrier stages
    (executor cores over ``spark.task.cpus``; ``local[N]``: N)."""
    scala = context._jsc.sc()
    try:
        profile = scala.resourceProfileManager().defaultResourceProfile()
        return max(int(scala.maxNumConcurrentTasks(profile)), 1)
    except Exception:  # an internal method that moved: the cores Spark defaults to
        return max(int(context.defaultParallelism), 1)


def executor_count(context: SparkContext) -> int:
    """Executors the application has now (``local`` masters: one, the driver itself)."""
    master = str(context.master)
    if master == "local" or master.startswith("local["):
        return 1
    try:
        known = int(context._jsc.sc().getExecutorMemoryStatus().size())
    except Exception:  # an internal method that moved: count none, so every task may stay
        return 1
    return max(known - 1, 1)  # the driver's block manager is one of them


def byte_setting(context: SparkContext, name: str, value: str) -> int:
    """``value`` of the size setting ``name`` in bytes, parsed as Spark parses sizes."""
    try:
        utils = context._jvm.org.apache.spark.network.util.JavaUtils  # type: ignore[union-attr]
        return int(utils.byteStringAsBytes(value))
    except Exception as error:
        raise IterflowValueError(
            f"{name}={value!r} is not a size; use bytes or a unit, e.g. '512m' or '4g'"
        ) from error


def time_setting_ms(context: SparkContext, value: str) -> int:
    """``value`` (``"7d"``, ``"1h"``, ``"500"``) in milliseconds, parsed as Spark parses times."""
    utils = context._jvm.org.apache.spark.network.util.JavaUtils  # type: ignore[union-attr]
    return int(utils.timeStringAsMs(value))


def stream_checkpoint(query: Any) -> str:
    """The qualified checkpoint location of the running streaming query ``query``."""
    return str(query._jsq.streamingQuery().resolvedCheckpointRoot())


def stream_sources(df: DataFrame) -> list[tuple[str, dict[str, str]]]:
    """The sources a streaming DataFrame reads, in plan order: each one's name as Spark
    gives it (``"FileSource[<path>]"``, ``"kafka"``, ``"rate"``, ``"socket"``...) and its
    read options, keys in lower case."""
    leaves = df._jdf.queryExecution().analyzed().collectLeaves()
    converters = df.sparkSession._jvm.scala.jdk.javaapi.CollectionConverters  # type: ignore[union-attr]
    found: list[tuple[str, dict[str, str]]] = []
    for k in range(leaves.size()):
        leaf = leaves.apply(k)
        kind = leaf.getClass().getSimpleName()
        if kind == "StreamingRelation":
            options = converters.asJava(leaf.dataSource().options())
        elif kind == "StreamingRelationV2":
            options = leaf.extraOptions().asCaseSensitiveMap()
        else:
            continue
        found.append(
            (str(leaf.sourceName()), {str(key).lower(): str(v) for key, v in options.items()})
        )
    return found


def file_sources(query: Any, hadoop: HadoopFiles) -> dict[int, tuple[str, dict[str, str] | None]]:
    """Source index -> (qualified path, read options with keys in lower case) of each file
    source of the running streaming query ``query`` (a ``StreamingQuery``); the index is
    the source's position in ``lastProgress["sources"]`` and its directory under the
    checkpoint's ``sources/``.

    The options are None when the query reads the same path twice with different options.
    Empty before the query planned its first micro-batch.
    """
    execution = query._jsq.streamingQuery()
    # The reads as the user wrote them, with their options, keyed by the qualified path.
    options_at: dict[str, list[dict[str, str]]] = {}
    leaves = execution.analyzedPlan().collectLeaves()
    converters = hadoop._jvm.scala.jdk.javaapi.CollectionConverters
    for k in range(leaves.size()):
        leaf = leaves.apply(k)
        if leaf.getClass().getSimpleName() != "StreamingRelation":
            continue
        options = {
            str(key).lower(): str(value)
            for key, value in converters.asJava(leaf.dataSource().options()).items()
        }
        path = options.get("path")
        if path is not None:
            options_at.setdefault(hadoop.qualify(path), []).append(options)
    # The sources as Spark numbers them: distinct, in plan order.
    sources = execution.sources()
    if sources is None:
        return {}
    sources = sources.distinct()
    found: dict[int, tuple[str, dict[str, str] | None]] = {}
    for index in range(sources.size()):
        described = str(sources.apply(index).toString())
        if not (described.startswith("FileStreamSource[") and described.endswith("]")):
            continue
        path = described[len("FileStreamSource[") : -1]
        reads = options_at.get(path, [])
        same = bool(reads) and all(r == reads[0] for r in reads)
        found[index] = (path, reads[0] if same else None)
    return found


def status_stores(spark: SparkSession) -> tuple[Any, Any, Any]:
    """JVM handles on what a classic session's driver knows of its jobs, without running
    one: Spark's status tracker, its app status store (jobs, stages) and its SQL status
    store (executions, their plans and live metrics)."""
    context = spark_context(spark)
    if context is None:
        raise IterflowError("Spark's status stores need a classic session")
    jsc = context._jsc.sc()
    sql = spark._jsparkSession.sharedState().statusStore()
    return jsc.statusTracker(), jsc.statusStore(), sql


def removed_executors(spark: SparkSession, since_ms: int) -> list[str] | None:
    """The executors Spark removed at or after ``since_ms`` (ms since the epoch), each as
    ``"ID at HOST:PORT (REASON)"``, from the driver's app status store (which keeps removed
    executors); None without a classic session or when Spark's internals do not say."""
    context = spark_context(spark)
    if context is None:
        return None
    try:
        executors = context._jsc.sc().statusStore().executorList(False)
        removed = []
        for summary in jvm_iterate(executors.iterator()):
            when = summary.removeTime()
            if summary.isActive() or when.isEmpty() or when.get().getTime() < since_ms:
                continue
            reason = summary.removeReason()
            described = f"{summary.id()} at {summary.hostPort()}"
            removed.append(described if reason.isEmpty() else f"{described} ({reason.get()})")
        return removed
    except Exception as exc:  # an internal API: without it, the error says less
        log.debug("could not list removed executors: %s", exc)
        return None


def is_local(df: DataFrame) -> bool:
    """``df.isLocal()``, without PySpark Connect's cache of it (see ``_uncached``)."""
    return bool(_uncached(df, "isLocal")())


def is_empty(df: DataFrame) -> bool:
    """``df.isEmpty()``, without PySpark Connect's cache of it (see ``_uncached``)."""
    return bool(_uncached(df, "isEmpty")())


def _uncached(df: DataFrame, method: str) -> Any:
    """``df``'s bound ``method``, bypassing a ``functools.cache`` on it.

    PySpark's Connect DataFrame caches ``isLocal``, ``isEmpty`` and a few more with
    ``functools.cache`` on the class: the cache keeps every DataFrame it was asked
    about, so a DataFrame over a released checkpoint is never garbage collected, its
    ``CachedRemoteRelation`` never tells the server to drop it, and the server keeps
    every round's checkpoint blocks until the session ends. Calling the function under
    the cache leaves nothing behind.
    """
    bound = getattr(df, method)
    wrapped = getattr(getattr(type(df), method, None), "__wrapped__", None)
    return bound if wrapped is None else wrapped.__get__(df, type(df))


def jvm_heap_after_gc(spark: SparkSession) -> int:
    """Bytes of the driver JVM's heap in use right after a full garbage collection
    (``System.gc()``), for measuring what a long run holds (the soak benchmark)."""
    jvm: Any = spark._jvm
    jvm.java.lang.System.gc()
    return int(
        jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed()
    )


def persistent_rdd_count(spark: SparkSession) -> int:
    """How many RDDs the driver's SparkContext holds persisted now."""
    context = spark_context(spark)
    if context is None:
        raise IterflowError("the persisted RDDs can be counted on a classic session only")
    return int(context._jsc.getPersistentRDDs().size())


def jvm_pid(spark: SparkSession) -> int:
    """The process id of the driver's JVM."""
    jvm: Any = spark._jvm
    return int(jvm.java.lang.ProcessHandle.current().pid())


#: Settings PySpark's own launcher (``pyspark-shell``) writes when nothing was configured:
#: they are not the user's choice, so they do not count as configured.
_LAUNCHER_PLACEHOLDERS = {
    "spark.app.name": "pyspark-shell",
    "spark.master": "local[*]",
    "spark.ui.showConsoleProgress": "true",
}


def configured_settings(driver_memory: str) -> dict[str, str]:
    """The Spark settings this process was configured with: spark-submit's ``--master``,
    ``--name`` and ``--conf``, ``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``.

    Starts the JVM when this process has none yet, with ``driver_memory`` as the lowest
    precedence default (the ``SPARK_DRIVER_MEMORY`` variable, which every configured
    ``spark.driver.memory`` overrides). When PySpark launched the JVM itself rather than
    spark-submit, the launcher's placeholders are left out.
    """
    launched_by_spark = "PYSPARK_GATEWAY_PORT" in os.environ
    if SparkContext._gateway is None and not launched_by_spark:
        before = os.environ.get("SPARK_DRIVER_MEMORY")
        os.environ.setdefault("SPARK_DRIVER_MEMORY", driver_memory)
        try:
            SparkContext._ensure_initialized()
        finally:
            if before is None:
                os.environ.pop("SPARK_DRIVER_MEMORY", None)
    SparkContext._ensure_initialized()
    settings = dict(SparkConf().getAll())
    if not launched_by_spark:
        for key, placeholder in _LAUNCHER_PLACEHOLDERS.items():
            if settings.get(key) == placeholder:
                del settings[key]
    return settings


def take_sample(
    df: DataFrame, count: int, seed: int, *, with_replacement: bool = False
) -> list[Any]:
    """``count`` rows of ``df`` drawn with ``seed``, as a list of ``Row``.

    On a classic session the rows are those Spark's ``RDD.takeSample`` draws (the JVM's,
    not PySpark's Python sampler): the sample Spark MLlib draws from the same rows, so a
    library can start where MLlib starts for the same seed. Spark Connect has no RDDs:
    there the rows are the first of a seeded shuffle (without replacement).

    Example::

        rows = itf.take_sample(df.select("features"), 10, seed=7, with_replacement=True)
    """
    if not isinstance(df, ClassicDataFrame):
        return df.orderBy(F.rand(seed)).limit(count).collect()
    spark = df.sparkSession
    drawn = df._jdf.rdd().takeSample(bool(with_replacement), int(count), int(seed))
    jvm: Any = spark.sparkContext._jvm
    rows = jvm.java.util.ArrayList()
    for row in drawn:  # a sample: few rows, one call each
        rows.add(row)
    sampled = spark._jsparkSession.createDataFrame(rows, df._jdf.schema())
    return ClassicDataFrame(sampled, spark).collect()


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's estimate of the size of ``df``'s rows, from its optimized plan's statistics
    (file sizes for a scan of files, rows times row size for local rows), without a job;
    None where the plan cannot be reached (Spark Connect) or Spark knows no size (its
    default, ``spark.sql.defaultSizeInBytes``, is as good as none). The plan is made
    once per DataFrame: an action on ``df`` afterwards reuses it."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    try:
        size = int(str(jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
        unknown = int(jdf.sparkSession().sessionState().conf().defaultSizeInBytes())
    except Py4JError:  # a plan whose statistics Spark cannot compute: no estimate
        log.debug("no size estimate for a plan", exc_info=True)
        return None
    return None if size >= unknown else size
