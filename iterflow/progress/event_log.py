"""The event log: one JSON object per line, written as an iteration runs.

Pure Python: no Spark import. Each line has ``"event"``, ``"time"`` (UTC, when
written) and ``"run_id"``; several runs may append to one file and are told
apart by ``run_id``. Lines are flushed as they are written, so a crash keeps
every finished round and ``tail -f`` follows a running iteration.

The file is a local path or a URI (``file:``, ``hdfs://``, ``s3a://``, ``abfss://``...),
written and read through the storage layer (``iterflow.storage``); on storage that
cannot append (object stores), each line rewrites the file.

Example::

    with EventLog("logs/pagerank.jsonl") as log:
        log.iteration_started(run_id="r1", iteration="pagerank", inputs={}, conditions=[])
    events = read_events("logs/pagerank.jsonl")
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any

from iterflow.errors import IterflowError, IterflowValueError
from iterflow.metrics.values import MetricResult, results_to_json, value_to_json
from iterflow.reports import Rollback, RoundProgress, RoundSample, Termination
from iterflow.storage import AppendFile, read_bytes


def termination_to_dict(termination: Termination) -> dict[str, Any]:
    """``termination`` as an ``iteration_terminated`` event holds it."""
    return {
        "reason": termination.reason,
        "epoch": termination.epoch,
        "reasons": list(termination.reasons),
    }


def progress_to_dict(p: RoundProgress) -> dict[str, Any]:
    """Every field of ``p`` under its own name, as JSON-ready data.

    >>> start = datetime(2025, 1, 1, tzinfo=timezone.utc)
    >>> progress_to_dict(RoundProgress(epoch=0, epoch_watermark=0, started_at=start,
    ...                                duration_s=0.5))["started_at"]
    '2025-01-01T00:00:00+00:00'
    """
    return {
        "epoch": p.epoch,
        "epoch_watermark": p.epoch_watermark,
        "started_at": p.started_at.isoformat(),
        "duration_s": p.duration_s,
        "rows": dict(p.rows),
        "step_s": dict(p.step_s),
        "criteria_empty": p.criteria_empty,
        "criteria_rows": p.criteria_rows,
        "observed": dict(p.observed),
        "metrics": {name: value_to_json(value) for name, value in p.metrics.items()},
        "converged_value": p.converged_value,
        "rounds_remaining_estimate": p.rounds_remaining_estimate,
        "eta_s": p.eta_s,
        "batch_id": p.batch_id,
        "input_rows": dict(p.input_rows),
        "feedback_rows_in": dict(p.feedback_rows_in),
        "backlog": dict(p.backlog),
        "resident": p.resident,
        "epoch_path": list(p.epoch_path),
        "watermarks": {name: mark.isoformat() for name, mark in p.watermarks.items()},
        "late_rows": dict(p.late_rows),
        "state_rows": dict(p.state_rows),
        "rollback": None if p.rollback is None else rollback_to_dict(p.rollback),
    }


def rollback_to_dict(rollback: Rollback) -> dict[str, Any]:
    """A rollback's fields, and its ``lost`` in words, as JSON-ready data."""
    return {
        "failed_epoch": rollback.failed_epoch,
        "to_epoch": rollback.to_epoch,
        "rounds_recomputed": rollback.rounds_recomputed,
        "lost_blocks": list(rollback.lost_blocks),
        "lost_executors": list(rollback.lost_executors),
        "lost": rollback.lost,
        "at": rollback.at.isoformat(),
    }


def sample_to_dict(sample: RoundSample) -> dict[str, Any]:
    """Every field of ``sample`` under its own name, as JSON-ready data."""
    return {
        "epoch": sample.epoch,
        "elapsed_s": sample.elapsed_s,
        "fraction_done": sample.fraction_done,
        "tasks_total": sample.tasks_total,
        "tasks_done": sample.tasks_done,
        "tasks_active": sample.tasks_active,
        "rows_read": sample.rows_read,
        "bytes_read": sample.bytes_read,
        "rows_by_step": dict(sample.rows_by_step),
        "eta_s": sample.eta_s,
        "final": sample.final,
        "epoch_path": list(sample.epoch_path),
    }


def _finite(data: Any) -> Any:
    # JSON has no NaN or infinity; a diverging value or an unset gauge becomes null.
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, Mapping):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def _iterflow_version() -> str:
    try:
        return version("iterflow")
    except PackageNotFoundError:
        return "unknown"


class EventLog:
    """Appends the events of iteration runs to the JSON-lines file ``path`` (a path or a
    URI).

    The file and its parent directories are created when missing. Use it as a
    context manager, or call ``close()``. An ``OSError`` when it cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file = AppendFile(path, "event_log")
        self._closed = False
        # Rounds are sampled on a thread of their own: one line at a time.
        self._lock = threading.Lock()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._file.close()

    def iteration_started(
        self,
        *,
        run_id: str,
        iteration: str,
        inputs: Mapping[str, Mapping[str, Any]],
        conditions: Sequence[Mapping[str, Any]],
        resumed_from: int | None = None,
        resident: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
        epoch_path: Sequence[int] = (),
        notes: Mapping[str, Any] | None = None,
    ) -> None:
        """The run began: body name, inputs (name -> {"schema", "replay"}), conditions and
        how its kernels run (``resident``: {"mode": "resident" | "jobs", "reason"}). A run
        nested in a round of another names that run (``parent_run_id``) and the round's
        ``epoch_path``; ``notes`` are what the code that built the run added to it
        (``IterationBuilder.note``)."""
        self._write(
            "iteration_started",
            run_id,
            iteration=iteration,
            inputs={name: dict(spec) for name, spec in inputs.items()},
            conditions=[dict(condition) for condition in conditions],
            resumed_from=resumed_from,
            resident=dict(resident) if resident is not None else None,
            parent_run_id=parent_run_id,
            epoch_path=list(epoch_path),
            notes=dict(notes or {}),
            iterflow_version=_iterflow_version(),
        )

    def round_end(self, *, run_id: str, progress: RoundProgress) -> None:
        """A round finished: every ``RoundProgress`` field at the top level."""
        self._write("round_end", run_id, **progress_to_dict(progress))

    def round_progress(self, *, run_id: str, sample: RoundSample) -> None:
        """A round in progress: every ``RoundSample`` field at the top level."""
        self._write("round_progress", run_id, **sample_to_dict(sample))

    def iteration_terminated(
        self,
        *,
        run_id: str,
        termination: Termination,
        rounds: int,
        duration_s: float,
        metrics: Mapping[str, MetricResult],
        epoch_path: Sequence[int] = (),
    ) -> None:
        """The run stopped on a termination condition after ``rounds`` rounds (a nested
        run: in the outer round at ``epoch_path``)."""
        self._write(
            "iteration_terminated",
            run_id,
            termination=termination_to_dict(termination),
            rounds=rounds,
            duration_s=duration_s,
            metrics=results_to_json(metrics),
            epoch_path=list(epoch_path),
        )

    def iteration_failed(
        self,
        *,
        run_id: str,
        epoch: int | None,
        error: BaseException,
        duration_s: float,
        metrics: Mapping[str, MetricResult],
        epoch_path: Sequence[int] = (),
    ) -> None:
        """The run failed in round ``epoch`` (None when no round had started); a nested run
        in the outer round at ``epoch_path``."""
        self._write(
            "iteration_failed",
            run_id,
            epoch=epoch,
            error=str(error),
            error_type=type(error).__name__,
            duration_s=duration_s,
            metrics=results_to_json(metrics),
            epoch_path=list(epoch_path),
        )

    def rolled_back(self, *, run_id: str, rollback: Rollback) -> None:
        """The run went back to the durable checkpoint of ``rollback.to_epoch``; the rounds
        after it run again and log ``round_end`` again."""
        self._write("rolled_back", run_id, **rollback_to_dict(rollback))

    def _write(self, event: str, run_id: str, **fields: Any) -> None:
        record = {
            "event": event,
            "time": datetime.now(timezone.utc).isoformat(),
            "run_id": run_id,
            **fields,
        }
        line = json.dumps(_finite(record), allow_nan=False) + "\n"
        with self._lock:
            if self._closed:
                raise IterflowError(f"event log '{self.path}' is closed; open a new EventLog")
            self._file.append(line.encode("utf-8"))


def _parents(events: Sequence[Mapping[str, Any]]) -> dict[Any, Any]:
    """run_id -> the run it is nested in (None for a run of its own), for the runs that
    have an ``iteration_started`` line in ``events``."""
    return {
        e.get("run_id"): e.get("parent_run_id")
        for e in events
        if e.get("event") == "iteration_started"
    }


def main_run(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The run of ``events`` that the others are nested in (the first event's run, or the
    outermost run around it)."""
    if not events:
        return None
    parents = _parents(events)
    run = events[0].get("run_id")
    logged = [above for above in _ancestors(run, parents) if above in parents]
    return logged[-1] if logged else run


def round_ends(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``round_end`` events of a run (not of the runs nested in it), one per epoch in
    epoch order: after a rollback, the last attempt of a round wins."""
    run = main_run(events)
    last = {
        e["epoch"]: e for e in events if e.get("event") == "round_end" and e.get("run_id") == run
    }
    return [last[epoch] for epoch in sorted(last)]


def ordered_rounds(
    events: Sequence[Mapping[str, Any]],
) -> list[tuple[tuple[int, ...], Mapping[str, Any]]]:
    """Every round of the main run of ``events`` and of the runs nested in it, each with a
    sort key, in the order they belong in: a round, then the rounds of the runs nested in
    it (several runs in one round one after the other, in the order they started), and so
    on down. A round the main run rolled back and ran again keeps only its last attempt,
    with the runs nested in that attempt."""
    run = main_run(events)
    parents = _parents(events)
    where: dict[Any, tuple[Any, int]] = {}  # nested run -> its parent round, in start order
    for e in events:
        kind, rid = e.get("event"), e.get("run_id")
        if kind == "iteration_started" and rid != run and e.get("epoch_path"):
            where[rid] = (parents.get(rid), int(e["epoch_path"][-1]))
        elif kind == "rolled_back" and rid == run:
            # The main run runs its rounds after ``to_epoch`` again: drop what ran in them.
            dropped = {r for r, (p, k) in where.items() if p == run and k > e["to_epoch"]}
            where = {
                r: w
                for r, w in where.items()
                if r not in dropped and not _inside(r, dropped, parents)
            }
    started: dict[Any, tuple[tuple[Any, int], int]] = {}  # -> (parent round, ordinal in it)
    ordinals: dict[tuple[Any, int], int] = {}
    for rid, parent_round in where.items():
        started[rid] = (parent_round, ordinals.get(parent_round, 0))
        ordinals[parent_round] = started[rid][1] + 1

    def key(rid: Any, epoch: int) -> tuple[int, ...] | None:
        if rid == run:
            return (epoch,)
        if rid not in started:
            return None
        (parent, parent_epoch), ordinal = started[rid]
        above = key(parent, parent_epoch)
        return None if above is None else (*above, ordinal, epoch)

    last: dict[tuple[int, ...], Mapping[str, Any]] = {}
    for e in events:
        if e.get("event") == "round_end":
            found = key(e.get("run_id"), int(e["epoch"]))
            if found is not None:
                last[found] = e
    return sorted(last.items(), key=lambda item: item[0])


def _ancestors(rid: Any, parents: Mapping[Any, Any]) -> Iterator[Any]:
    """The runs ``rid`` is nested in, innermost first, as far as start lines tell."""
    seen = {rid}
    while rid in parents and parents[rid] is not None and parents[rid] not in seen:
        rid = parents[rid]
        seen.add(rid)
        yield rid


def _inside(rid: Any, runs: set[Any], parents: Mapping[Any, Any]) -> bool:
    """Whether run ``rid`` is nested, at any depth, in one of ``runs``."""
    return any(above in runs for above in _ancestors(rid, parents))


def nested_round_ends(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``round_end`` events of the runs nested in the main run of ``events``, in the
    order of :func:`ordered_rounds`."""
    run = main_run(events)
    return [e for _, e in ordered_rounds(events) if e.get("run_id") != run]


def read_events(path: str | os.PathLike[str], run_id: str | None = None) -> list[dict[str, Any]]:
    """The events of one run in the event log ``path`` (a path or a URI, as ``event_log=``
    takes), and of the runs nested in it (run
    by its body or listeners, whose lines name it as ``parent_run_id``), in file order.

    With ``run_id`` None, the run of the last ``iteration_started`` line that is not
    nested in another; otherwise the run ``run_id``.
    """
    try:
        text = read_bytes(path, "event log").decode("utf-8")
    except OSError as error:
        raise IterflowValueError(
            f"cannot read event log '{os.fspath(path)}': {error.strerror or error}; pass the "
            "file given as event_log= to run()"
        ) from None
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        # A process that died mid-write leaves a partial last line: keep what is whole.
        try:
            _parse_line(lines[-1], path, len(lines))
        except IterflowValueError:
            lines.pop()
    events = [
        _parse_line(line, path, number)
        for number, line in enumerate(lines, start=1)
        if line.strip()  # a trailing or hand-inserted blank line carries no event
    ]
    runs = ", ".join(f"'{run}'" for run in dict.fromkeys(e.get("run_id") for e in events))
    parents = _parents(events)
    if run_id is None:
        # Runs of their own: not nested, or nested in a run that logs elsewhere.
        started = [
            e
            for e in events
            if e["event"] == "iteration_started" and e.get("parent_run_id") not in parents
        ]
        if not started:
            raise IterflowValueError(
                f"event log '{path}' has no iteration_started event to find its last run by; "
                f"name a run (runs in it: {runs or 'none'})"
            )
        run_id = started[-1].get("run_id")
    elif not any(e.get("run_id") == run_id for e in events):
        raise IterflowValueError(
            f"event log '{path}' has no run '{run_id}'; runs in it: {runs or 'none'}"
        )
    family = {run_id} | {run for run in parents if _inside(run, {run_id}, parents)}
    return [event for event in events if event.get("run_id") in family]


def _parse_line(line: str, path: str | os.PathLike[str], number: int) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except json.JSONDecodeError as error:
        raise IterflowValueError(
            f"event log '{path}' line {number} is not JSON ({error.msg}); "
            "each line must be one JSON object"
        ) from None
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        raise IterflowValueError(
            f"event log '{path}' line {number} is not an event: expected a JSON object "
            'with a string field "event"'
        )
    return event
