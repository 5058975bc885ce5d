"""Whether a run's ``ctx.columnar`` data is made resident, and where it may be.

``spark.iterflow.resident`` = ``auto`` (default) | ``on`` | ``off`` chooses. The policy
takes task slots for resident tasks from the application's ledger (``ledger``: at most
half the slots for every run of the SparkContext together), sets the run's byte budget
(per executor, ``executor_budget``, and an optional cap on the run), owns the run's data
plane, and reports how the run's kernels run to the run's tracker. Under ``auto`` data
that cannot be resident is read from Arrow files by a Spark job per round
(``columnar``), with the reason in the event log and a WARNING on ``iterflow.resident``;
under ``on`` that is an error.
"""

from __future__ import annotations

import logging
import socket
import threading

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowError, IterflowValueError
from iterflow.runtime.datacache.columnar import Prepare
from iterflow.runtime.datacache.dataplane import DataPlane, secured
from iterflow.runtime.datacache.ledger import (
    MAX_BYTES_CONF,
    MAX_BYTES_PER_EXECUTOR_CONF,
    ResidentBudget,
    return_slots,
    take_slots,
)
from iterflow.runtime.datacache.resident import ResidentData, ResidentTaskLost, ResidentUnavailable
from iterflow.runtime.progresstrack.tracker import Residency, RoundTracker
from iterflow.runtime.spark.jvm import byte_setting, executor_count, is_classic, task_slots
from iterflow.runtime.spark.planning import static_planning

RESIDENT_CONF = "spark.iterflow.resident"
PORT_CONF = "spark.iterflow.resident.port"
#: Kernel processes per resident task; by default one per core of its executor.
PROCESSES_CONF = "spark.iterflow.resident.processes"
#: Whether kernel calls pass along a tree of the staying tasks (``resident_tree``):
#: ``true`` (default) or ``false`` (every call and output through the driver).
TREE_CONF = "spark.iterflow.resident.tree"
MODES = ("auto", "on", "off")
#: The share of an executor's Python memory that resident data may take by default:
#: the rest is the kernels' working memory and the other Python workers'.
PYTHON_MEMORY_SHARE = 0.5

logger = logging.getLogger("iterflow.resident")


def executor_budget(spark: SparkSession, context: SparkContext) -> int:
    """Bytes of resident data one executor may hold, for every run together:
    ``spark.iterflow.resident.maxBytesPerExecutor`` where set; otherwise half of the
    executor's Python memory, ``spark.executor.pyspark.memory``; where that is not set
    either (Spark then bounds no Python memory), half of the executor's memory,
    ``spark.executor.memory``, or of ``spark.driver.memory`` on a ``local`` master,
    whose one executor is the driver (Spark's default for both: 1g)."""
    explicit = spark.conf.get(MAX_BYTES_PER_EXECUTOR_CONF, None)
    if explicit:
        return byte_setting(context, MAX_BYTES_PER_EXECUTOR_CONF, explicit)
    conf = context.getConf()
    master = str(context.master)
    local = master == "local" or master.startswith("local[")
    for name in (
        "spark.executor.pyspark.memory",
        "spark.driver.memory" if local else "spark.executor.memory",
    ):
        value = conf.get(name, None)
        if value:
            return int(byte_setting(context, name, value) * PYTHON_MEMORY_SHARE)
    return int((1 << 30) * PYTHON_MEMORY_SHARE)


def resident_setting(spark: SparkSession) -> str:
    """``spark.iterflow.resident`` of ``spark``, checked: ``auto``, ``on`` or ``off``."""
    setting = str(spark.conf.get(RESIDENT_CONF, "auto")).strip().lower()
    if setting not in MODES:
        raise IterflowValueError(f"{RESIDENT_CONF}={setting!r}: use 'auto', 'on' or 'off'")
    return setting


class ResidentPolicy:
    """Decides, per run, whether data is made resident, and owns the run's data plane;
    reports the run's residency, and its kernel calls' progress, to the run's ``tracker``.

    ``unavailable`` is a reason known before any data is seen.
    """

    def __init__(
        self, spark: SparkSession, tracker: RoundTracker, unavailable: str | None = None
    ) -> None:
        self.spark = spark
        self.tracker = tracker
        setting = resident_setting(spark)
        self.setting = setting
        self.reason = unavailable
        if setting == "off":
            self.reason = f"{RESIDENT_CONF} is 'off'"
        elif not is_classic(spark):
            self.reason = "the session is Spark Connect: executors cannot reach its client"
        if setting == "on" and self.reason is not None:
            self._refuse(self.reason)
        # The run's mode until its first data set decides it: why none could be resident.
        tracker.expect(
            Residency(
                "jobs",
                self.reason or "no data was made resident (no ctx.columnar in the first round)",
            )
        )
        self.loaded: list[ResidentData] = []
        self._plane: DataPlane | None = None
        self._bytes: ResidentBudget | None = None

    @property
    def calls(self) -> int:
        """Kernel calls answered by resident tasks so far."""
        return sum(data.calls for data in self.loaded)

    def load(self, df: DataFrame, prepare: Prepare | None) -> ResidentData | None:
        """``df`` made resident, or None (under ``auto``) when it cannot be."""
        if self.reason is not None:
            self._fall_back(self.reason)
            return None
        data: ResidentData | None = None
        try:
            data = self._resident(df, prepare)
            data.start()
        except (ResidentUnavailable, ResidentTaskLost, IterflowError) as error:
            if data is not None:
                data.release()
            if self.setting == "on":
                self._refuse(str(error))
            logger.warning(
                "ctx.columnar data is not resident; its kernels run as a Spark job per round "
                "(%s=auto): %s",
                RESIDENT_CONF,
                error,
            )
            self._decide(Residency("jobs", str(error)))
            return None
        except BaseException:  # interrupted while loading (Ctrl-C), or a JVM error
            if data is not None:
                data.release()
            raise
        self.loaded.append(data)
        self._decide(Residency("resident"))
        return data

    def decline(self, reason: str) -> None:
        """Data that asked not to be resident: the run's mode is jobs, for ``reason``,
        unless data was made resident before."""
        self._fall_back(reason, chosen=True)

    def _fall_back(self, reason: str, *, chosen: bool = False) -> None:
        """The run's kernels run as a Spark job per round, for ``reason``: said once per
        run on ``iterflow.resident``, as a WARNING unless the user chose it (``off``,
        ``resident=False``), which is INFO."""
        if not self.tracker.decided:
            chosen = chosen or self.setting == "off"
            logger.log(
                logging.INFO if chosen else logging.WARNING,
                "ctx.columnar data is not resident; its kernels run as a Spark job per round: %s",
                reason,
            )
        self._decide(Residency("jobs", reason))

    def _resident(self, df: DataFrame, prepare: Prepare | None) -> ResidentData:
        """``df`` with slots taken for its resident tasks (not started yet).

        One task per executor stays (while half the slots allow: a task per executor
        holds one slot) and runs its partitions' kernels on a process per core of its
        executor; the load runs on every free slot.
        """
        context = self.spark.sparkContext
        with static_planning(self.spark):  # an adaptive plan would run a job to count them
            partitions = int(df.rdd.getNumPartitions())
        if partitions == 0:
            raise ResidentUnavailable("the data has no partitions")
        slots = task_slots(context)
        executors = min(executor_count(context), slots)
        app = str(context.applicationId)
        # coalesce makes no more tasks than partitions
        tasks, held = take_slots(app, slots, min(executors, partitions))
        if tasks < 1:
            raise ResidentUnavailable(
                f"fewer free task slots than resident tasks: {slots} slot(s), {held} held by "
                "resident tasks of this application already (of this run, or of runs it is "
                "nested in or running beside it), and half the slots stay free for the "
                "rounds' Spark jobs"
            )
        try:
            free = slots - _busy_slots(context)
            if free < tasks:
                raise ResidentUnavailable(
                    f"fewer free task slots ({free} of {slots}) than resident tasks ({tasks})"
                )
            # Loading tasks beside the staying ones only where every executor may keep:
            # a loading task hands its partitions to a staying task on its own host.
            launched = min(free, partitions) if tasks >= executors else tasks
            processes = self._processes(slots // max(executors, 1), partitions, tasks)
            plane = self._data_plane(context)
            budget = self._budget(context)
            tree = str(self.spark.conf.get(TREE_CONF, "true")).strip().lower() != "false"
            return ResidentData(
                plane,
                df,
                prepare,
                partitions,
                tasks,
                budget,
                self.tracker,
                launched,
                processes,
                tree=tree,
            )
        except BaseException:
            return_slots(app, tasks)
            raise

    def _processes(self, cores: int, partitions: int, tasks: int) -> int:
        """Kernel processes per staying task: ``spark.iterflow.resident.processes`` where
        set, else one per core of its executor, and never more than its partitions."""
        setting = self.spark.conf.get(PROCESSES_CONF, None)
        if setting:
            try:
                cores = int(setting)
            except ValueError:
                cores = 0
            if cores < 1:
                raise IterflowValueError(
                    f"{PROCESSES_CONF}={setting!r}: use a number of processes (1 or more)"
                )
        return max(min(cores, -(-partitions // tasks)), 1)

    def _budget(self, context: SparkContext) -> ResidentBudget:
        """The run's byte budget: ``maxBytesPerExecutor`` (see ``executor_budget``) and the
        optional ``maxBytes`` cap on the run."""
        if self._bytes is None:
            cap = self.spark.conf.get(MAX_BYTES_CONF, None)
            self._bytes = ResidentBudget(
                str(context.applicationId),
                executor_budget(self.spark, context),
                byte_setting(context, MAX_BYTES_CONF, cap) if cap else None,
            )
        return self._bytes

    def _data_plane(self, context: SparkContext) -> DataPlane:
        if self._plane is None:
            conf = context.getConf()
            if str(context.master).startswith("local"):
                bind = advertised = "127.0.0.1"
            else:
                advertised = conf.get("spark.driver.host", None) or socket.gethostname()
                bind = conf.get("spark.driver.bindAddress", None) or advertised
            setting = self.spark.conf.get(PORT_CONF, None) or "0"
            try:
                port = int(setting)
            except ValueError:
                port = -1
            if not 0 <= port <= 65535:
                raise IterflowValueError(f"{PORT_CONF}={setting!r}: use a port number (0: any)")
            self._plane = DataPlane(bind, advertised, port, tls=secured(dict(conf.getAll())))
        return self._plane

    def _decide(self, residency: Residency) -> None:
        self.tracker.decide(residency)

    def _refuse(self, reason: str) -> None:
        raise IterflowError(
            f"{RESIDENT_CONF}=on, but data cannot be made resident: {reason}. "
            f"Set {RESIDENT_CONF}=auto to fall back to a Spark job per round"
        )

    def close(self) -> None:
        """End every resident job and the data plane."""
        try:
            for data in self.loaded:
                data.release()
        finally:
            self.loaded = []
            if self._plane is not None:
                plane, self._plane = self._plane, None
                closer = threading.Thread(target=plane.close, daemon=True)
                closer.start()
                closer.join(timeout=10.0)


def _busy_slots(context: SparkContext) -> int:
    tracker = context.statusTracker()
    stages = (tracker.getStageInfo(s) for s in tracker.getActiveStageIds())
    return sum(stage.numActiveTasks for stage in stages if stage is not None)
