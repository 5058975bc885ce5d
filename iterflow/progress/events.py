"""The event log: one JSON object per line, written as an iteration runs.

Pure Python: no Spark import. Each line has ``"event"``, ``"time"`` (UTC, when
written) and ``"run_id"``; several runs may append to one file and are told
apart by ``run_id``. Lines are flushed as they are written, so a crash keeps
every finished round and ``tail -f`` follows a running iteration.

Example::

    with EventLog("logs/pagerank.jsonl") as log:
        log.iteration_started(run_id="r1", iteration="pagerank", inputs={}, conditions=[])
    events = read_events("logs/pagerank.jsonl")
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import TracebackType
from typing import Any

from iterflow.errors import IterflowError, IterflowValueError
from iterflow.metrics.values import MetricResult, results_to_json, value_to_json
from iterflow.records import RoundProgress, Termination


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
        "criteria_empty": p.criteria_empty,
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
    """Appends the events of iteration runs to the JSON-lines file ``path``.

    The file and its parent directories are created when missing. Use it as a
    context manager, or call ``close()``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

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
    ) -> None:
        """The run began: body name, inputs (name -> {"schema", "replay"}), conditions and
        how its kernels run (``resident``: {"mode": "resident" | "jobs", "reason"}). A run
        nested in a round of another names that run (``parent_run_id``) and the round's
        ``epoch_path``."""
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
            iterflow_version=_iterflow_version(),
        )

    def round_end(self, *, run_id: str, progress: RoundProgress) -> None:
        """A round finished: every ``RoundProgress`` field at the top level."""
        self._write("round_end", run_id, **progress_to_dict(progress))

    def iteration_terminated(
        self,
        *,
        run_id: str,
        termination: Termination,
        rounds: int,
        duration_s: float,
        metrics: Mapping[str, MetricResult],
    ) -> None:
        """The run stopped on a termination condition after ``rounds`` rounds."""
        self._write(
            "iteration_terminated",
            run_id,
            termination={
                "reason": termination.reason,
                "epoch": termination.epoch,
                "reasons": list(termination.reasons),
            },
            rounds=rounds,
            duration_s=duration_s,
            metrics=results_to_json(metrics),
        )

    def iteration_failed(
        self,
        *,
        run_id: str,
        epoch: int | None,
        error: BaseException,
        duration_s: float,
        metrics: Mapping[str, MetricResult],
    ) -> None:
        """The run failed in round ``epoch`` (None when no round had started)."""
        self._write(
            "iteration_failed",
            run_id,
            epoch=epoch,
            error=str(error),
            error_type=type(error).__name__,
            duration_s=duration_s,
            metrics=results_to_json(metrics),
        )

    def rolled_back(self, *, run_id: str, to_epoch: int) -> None:
        """The run went back to the durable checkpoint of ``to_epoch``; the rounds after it
        run again and log ``round_end`` again."""
        self._write("rolled_back", run_id, to_epoch=to_epoch)

    def _write(self, event: str, run_id: str, **fields: Any) -> None:
        if self._file.closed:
            raise IterflowError(f"event log '{self.path}' is closed; open a new EventLog")
        record = {
            "event": event,
            "time": datetime.now(timezone.utc).isoformat(),
            "run_id": run_id,
            **fields,
        }
        self._file.write(json.dumps(_finite(record), allow_nan=False) + "\n")
        self._file.flush()


def main_run(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The run of ``events`` that the others are nested in (the first event's run, or the
    outermost run around it)."""
    if not events:
        return None
    parents = {
        e.get("run_id"): e.get("parent_run_id")
        for e in events
        if e.get("event") == "iteration_started"
    }
    run = events[0].get("run_id")
    seen = {run}
    while parents.get(run) in parents and parents[run] not in seen:
        run = parents[run]
        seen.add(run)
    return run


def round_ends(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``round_end`` events of a run (not of the runs nested in it), one per epoch in
    epoch order: after a rollback, the last attempt of a round wins."""
    run = main_run(events)
    last = {
        e["epoch"]: e for e in events if e.get("event") == "round_end" and e.get("run_id") == run
    }
    return [last[epoch] for epoch in sorted(last)]


def nested_round_ends(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``round_end`` events of the runs nested in the main run of ``events``, one per
    epoch path, in path order (a round run again after a resume or rollback: the last)."""
    run = main_run(events)
    last = {
        tuple(e.get("epoch_path") or (e["epoch"],)): e
        for e in events
        if e.get("event") == "round_end" and e.get("run_id") != run
    }
    return [last[path] for path in sorted(last)]


def read_events(path: str | os.PathLike[str], run_id: str | None = None) -> list[dict[str, Any]]:
    """The events of one run in the event log ``path``, and of the runs nested in it (run
    by its body or listeners, whose lines name it as ``parent_run_id``), in file order.

    With ``run_id`` None, the run of the last ``iteration_started`` line that is not
    nested in another; otherwise the run ``run_id``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise IterflowValueError(
            f"cannot read event log '{path}': {error.strerror}; pass the file given as "
            "event_log= to run()"
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
    if run_id is None:
        started = [
            e for e in events if e["event"] == "iteration_started" and not e.get("parent_run_id")
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
    family = {run_id}
    for event in events:  # a nested run starts after the run it is nested in
        if event["event"] == "iteration_started" and event.get("parent_run_id") in family:
            family.add(event.get("run_id"))
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
