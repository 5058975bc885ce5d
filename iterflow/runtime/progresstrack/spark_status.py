"""Where a running round's progress is read from, without running a Spark job.

- Classic sessions: the round's jobs carry a job tag (``RoundTag``); Spark's status
  store gives their tasks (total, done, active) and the rows their stages read so
  far, and the live SQL metrics of the round's running executions give the rows out
  of its named steps. A step is found by its row-count observation (the
  ``CollectMetrics`` node of ``ctx.observe`` or of a feedback's or output's
  materialization); its rows are the output rows of the first operator below it
  that counts them, through operators that keep every row (projections,
  exchanges, sorts...). Where the plan puts anything else in between, the step's
  rows are left out until its job ends and counts them exactly.
- Spark Connect: the client's progress handler (``registerProgressHandler``,
  PySpark 4.0 and later) reports each operation's stages: tasks and bytes read.
- Resident kernel calls (``iterflow.runtime.datacache.resident``) report the partitions their
  tasks have served through the data plane.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
from pyspark.sql import SparkSession

from iterflow.progress.sampling import Reading
from iterflow.runtime.progresstrack.tracker import RoundSteps
from iterflow.runtime.spark.jvm import jvm_iterate, spark_context, status_stores

#: Operators that output every row they take, and no metric of their own counts them.
_KEEP_ROWS = frozenset(
    {
        "AQEShuffleRead",
        "AdaptiveSparkPlan",
        "CollectMetrics",
        "ColumnarToRow",
        "DeserializeToObject",
        "Exchange",
        "InputAdapter",
        "Project",
        "ReusedExchange",
        "RowToColumnar",
        "SerializeFromObject",
        "ShuffleQueryStage",
        "Sort",
        "WholeStageCodegen",
    }
)
_OBSERVATION = re.compile(r"^CollectMetrics (iterflow_\w+?_\d+),")
#: A node and an edge of ``SparkPlanGraph.makeDotFile``: id, name, description (escaped);
#: child id, parent id, and the rows the child output so far (when it counts them).
_NODE = re.compile(
    r'^\s*(\d+) \[id="node\d+"(?: labelType="html")? label="([^"]*)" '
    r'tooltip="((?:[^"\\]|\\.)*)"',
    re.M,
)
_EDGE = re.compile(r'^\s*(\d+)->(\d+)(?: \[label="([^"]*)")?', re.M)
#: Spark 4.0 writes a node's name in bold and its metrics after it, in its label.
_BOLD = re.compile(r"<b>([^<]*)</b>")
_LABEL_ROWS = re.compile(r"number of output rows: ([\d,]+)")
#: How many of the newest SQL executions are searched for the round's running ones.
_NEWEST_EXECUTIONS = 3


def round_tag(run_id: str, epoch: int, attempt: int) -> str:
    """The job tag of round ``epoch`` of ``run_id``, the run's ``attempt``-th round begun
    (a round run again after a rollback is tagged anew); nested rounds' jobs carry it too."""
    return f"iterflow-{run_id}-{epoch}-{attempt}"


def _int(text: Any) -> int | None:
    try:
        return int(str(text).replace(",", ""))
    except ValueError:
        return None


def _rows_of_steps(
    dot: str, observations: Mapping[str, tuple[str, ...]]
) -> dict[tuple[str, ...], int] | None:
    """Rows so far of the steps whose observations the plan graph ``dot`` holds; None when
    it holds none of them.

    ``dot`` is Spark's ``SparkPlanGraph.makeDotFile``: each node with its description,
    and the rows each operator has output so far, on the edge to its parent (Spark 4.1
    and later) or among the metrics in its label (Spark 4.0)."""
    names: dict[int, str] = {}
    rows_out: dict[int, int] = {}
    steps_at: dict[int, tuple[str, ...]] = {}
    for m in _NODE.finditer(dot):
        node, label, desc = int(m[1]), m[2], m[3]
        bold = _BOLD.search(label)
        names[node] = bold[1] if bold else label
        if (counted := _LABEL_ROWS.search(label)) is not None:
            rows_out[node] = _int(counted[1]) or 0
        if (found := _OBSERVATION.match(desc)) is not None and found[1] in observations:
            steps_at[node] = observations[found[1]]
    if not steps_at:
        return None
    into: dict[int, list[int]] = {}
    for m in _EDGE.finditer(dot):
        child, parent = int(m[1]), int(m[2])
        into.setdefault(parent, []).append(child)
        if m[3] is not None and (n := _int(m[3])) is not None:
            rows_out[child] = n
    steps: dict[tuple[str, ...], int] = {}
    for node, step in steps_at.items():
        rows = _rows_into(node, names, rows_out, into)
        if rows is not None:
            steps[step] = rows
    return steps


def _rows_into(
    node: int,
    names: Mapping[int, str],
    rows_out: Mapping[int, int],
    into: Mapping[int, list[int]],
) -> int | None:
    """The rows flowing into ``node`` so far: those its one child output, read through
    operators that keep every row; None if another kind of operator comes first."""
    below = into.get(node, [])
    while len(below) == 1:
        child = below[0]
        if child in rows_out:
            return rows_out[child]
        if names.get(child) not in _KEEP_ROWS:
            return None
        below = into.get(child, [])
    return None


class ClassicStatus:
    """Reads a classic session's status store about the jobs of one round (by job tag)."""

    def __init__(self, spark: SparkSession) -> None:
        context = spark_context(spark)
        assert context is not None
        self._tracker, self._store, self._sql = status_stores(spark)
        self._context = context
        #: Finished job -> (tasks, tasks done, rows read, bytes read).
        self._done: dict[int, tuple[int, int, int, int]] = {}
        self._theirs: set[int] = set()  # SQL executions without a step of the round

    @contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        """Inside, the jobs this thread starts carry ``tag``."""
        self._context.addJobTag(tag)
        try:
            yield
        finally:
            self._context.removeJobTag(tag)

    def forget(self) -> None:
        """The round ended: what was cached of its jobs and executions goes."""
        self._done.clear()
        self._theirs.clear()

    def read(self, tag: str, steps: RoundSteps) -> Reading:
        sums = [0, 0, 0, 0]  # tasks, done, rows read, bytes read
        active = 0
        for job_id in self._tracker.getJobIdsForTag(tag):
            job_id = int(job_id)
            known = self._done.get(job_id)
            if known is None:
                job = self._store.job(job_id)
                known = (
                    int(job.numTasks()),
                    int(job.numCompletedIndices()) + int(job.numSkippedTasks()),
                    *self._input(job.stageIds()),
                )
                if str(job.status()) != "RUNNING":
                    self._done[job_id] = known
                else:
                    active += int(job.numActiveTasks())
            sums = [a + b for a, b in zip(sums, known, strict=True)]
        return Reading(
            tasks_total=sums[0],
            tasks_done=sums[1],
            tasks_active=active,
            rows_read=sums[2],
            bytes_read=sums[3],
            rows_by_step=self._live_rows(steps),
        )

    def _input(self, stage_ids: Any) -> tuple[int, int]:
        """Rows and bytes the stages read so far."""
        rows = size = 0
        for stage_id in jvm_iterate(stage_ids.iterator()):
            try:
                stage = self._store.lastStageAttempt(int(stage_id))
            except Exception:  # a stage not in the store yet has read nothing
                continue
            rows += int(stage.inputRecords())
            size += int(stage.inputBytes())
        return rows, size

    def _live_rows(self, steps: RoundSteps) -> dict[str, int]:
        """Rows so far of the steps in the round's running SQL executions."""
        if not steps.observations:
            return {}
        rows: dict[str, int] = {}
        count = int(self._sql.executionsCount())
        start = max(count - _NEWEST_EXECUTIONS, 0)
        if count == start:
            return rows
        executions = list(jvm_iterate(self._sql.executionsList(start, count - start).iterator()))
        # Noted before their executions start: copied after listing them, an execution
        # listed finds every observation of its plan here.
        observations = dict(steps.observations)
        for execution in executions:
            execution_id = int(execution.executionId())
            if execution_id in self._theirs or execution.completionTime().isDefined():
                continue
            graph = self._sql.planGraph(execution_id)
            dot = str(graph.makeDotFile(self._sql.executionMetrics(execution_id)))
            found = _rows_of_steps(dot, observations)
            if found is None:
                self._theirs.add(execution_id)
                continue
            for names, n in found.items():
                rows.update(dict.fromkeys(names, n))
        return rows


@attrs.define
class _Operation:
    tasks: int = 0
    done: int = 0
    active: int = 0
    bytes_read: int = 0


class ConnectStatus:
    """Reads what a Spark Connect client's progress handler reported about a round.

    The handler hears every operation the session runs; those run while the round
    is current, on its thread, count toward it.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._spark: Any = spark
        self._lock = threading.Lock()
        self._thread: int | None = None
        self._operations: dict[str, _Operation] = {}
        self._registered = False
        register = getattr(spark, "registerProgressHandler", None)
        if register is not None:
            register(self._handle)
            self._registered = True

    @property
    def available(self) -> bool:
        return self._registered

    @contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        with self._lock:
            self._thread = threading.get_ident()
        yield

    def forget(self) -> None:
        with self._lock:
            self._thread = None
            self._operations = {}

    def close(self) -> None:
        if self._registered:
            self._registered = False
            # Gone already if the session's handlers were cleared meanwhile.
            with contextlib.suppress(ValueError):
                self._spark.removeProgressHandler(self._handle)

    def _handle(self, **kwargs: Any) -> None:
        if threading.get_ident() != self._thread:
            return
        stages = kwargs.get("stages") or []
        operation = _Operation(
            tasks=sum(int(s.num_tasks) for s in stages),
            done=sum(int(s.num_completed_tasks) for s in stages),
            active=0 if kwargs.get("done") else int(kwargs.get("inflight_tasks") or 0),
            bytes_read=sum(int(s.num_bytes_read) for s in stages),
        )
        with self._lock:
            self._operations[str(kwargs.get("operation_id"))] = operation

    def read(self, tag: str, steps: RoundSteps) -> Reading:
        with self._lock:
            operations = list(self._operations.values())
        return Reading(
            tasks_total=sum(o.tasks for o in operations),
            tasks_done=sum(o.done for o in operations),
            tasks_active=sum(o.active for o in operations),
            bytes_read=sum(o.bytes_read for o in operations) if operations else None,
        )
