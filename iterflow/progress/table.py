"""A plain-text report of one run of the event log: a table of rounds and a summary.

Pure Python: no Spark import. ``iterflow report LOG`` prints it.

Example::

    print(format_report(read_events("logs/pagerank.jsonl")))
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from iterflow.errors import IterflowValueError
from iterflow.progress.event_log import main_run, nested_round_ends, ordered_rounds, round_ends

#: Round table headers for the RoundProgress fields; other columns keep their name.
_LABELS = {
    "duration_s": "seconds",
    "converged_value": "converged",
    "rounds_remaining_estimate": "remaining",
}


#: Event fields holding one number per name, and the prefix of their columns.
_PER_NAME = (
    ("rows", "rows"),
    ("step_s", "seconds"),
    ("observed", "observed"),
    ("input_rows", "input"),
    ("feedback_rows_in", "feedback_in"),
    ("backlog", "backlog"),
)


def round_values(event: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of one ``round_end`` event, by the names ``iterflow plot --metric`` takes.

    ``duration_s``, ``rows.<name>``, ``seconds.<name>`` (its job's seconds),
    ``observed.<name>``, for unbounded epochs
    ``input.<name>``, ``feedback_in.<name>``, ``backlog.<key>`` and ``batch_id``, then
    ``converged_value``, ``rounds_remaining_estimate``, ``eta_s``, then each user
    metric by its name (a distribution by its mean). A user metric named like a
    field is hidden by it.
    """
    values: dict[str, Any] = {"duration_s": event.get("duration_s")}
    for field, prefix in _PER_NAME:
        values.update({f"{prefix}.{name}": n for name, n in (event.get(field) or {}).items()})
    values["batch_id"] = event.get("batch_id")
    for field in ("converged_value", "rounds_remaining_estimate", "eta_s"):
        values[field] = event.get(field)
    for name, value in (event.get("metrics") or {}).items():
        values.setdefault(name, value.get("mean") if isinstance(value, dict) else value)
    return values


def metric_points(
    rounds: Sequence[tuple[int, Mapping[str, Any]]], name: str
) -> list[tuple[int, Any]]:
    """``(epoch, value)`` of the rounds (epoch, :func:`round_values`) that have a value of
    ``name``; none is an error that lists the names the rounds do have."""
    points = [(epoch, values[name]) for epoch, values in rounds if values.get(name) is not None]
    if not points:
        available = sorted(
            {key for _, values in rounds for key, value in values.items() if value is not None}
        )
        raise IterflowValueError(
            f"no round of this run has a value for '{name}'; choose a metric from: "
            f"{', '.join(available) or 'none (the run has no round_end event)'}"
        )
    return points


def round_table(events: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The round table of :func:`format_report` as values: its header, then one row per
    round (the first cell the epoch, or a nested round's epoch path as a tuple; None
    where a round has no value). Columns that no round has a value for are left out."""
    run = main_run(events)
    # The rounds of runs nested in a round follow it, their epoch as a path: (3, 0).
    ordered = [(e, e.get("run_id") != run) for _, e in ordered_rounds(events)]
    values = [round_values(e) for e, _ in ordered]
    columns = [
        name
        for name in dict.fromkeys(name for row in values for name in row)
        if any(row.get(name) is not None for row in values)
    ]
    rows = [
        [_path(e) if inner else e.get("epoch"), *(row.get(name) for name in columns)]
        for (e, inner), row in zip(ordered, values, strict=True)
    ]
    return ["epoch", *(_LABELS.get(name, name) for name in columns)], rows


def format_report(events: Sequence[Mapping[str, Any]]) -> str:
    """The rounds of one run as a table, then its summary: rounds, time, ending, metrics.

    ``events`` are the events of one run, as :func:`read_events` returns them.
    Columns that no round has a value for are left out.
    """
    header, rows = round_table(events)
    table = _table(
        header, [[_cell(value) for value in row] for row in rows], align=">" * len(header)
    )
    summary = _summary(events, round_ends(events), nested_round_ends(events))
    return "\n".join([*table, "", *summary]) + "\n"


def _path(event: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(event.get("epoch_path") or (event.get("epoch", 0),))


def final_event(events: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The ``iteration_terminated`` or ``iteration_failed`` event of the run (not of a run
    nested in it), or None while running."""
    run = main_run(events)
    return next(
        (
            e
            for e in events
            if e["event"] in ("iteration_terminated", "iteration_failed") and e.get("run_id") == run
        ),
        None,
    )


def ending(events: Sequence[Mapping[str, Any]]) -> str:
    """How the run ended, in a few words: "converged at epoch 11", "failed at epoch 3 (...)"."""
    end = final_event(events)
    if end is None:
        return "no final event"
    if end["event"] == "iteration_terminated":
        return f"{end['termination']['reason']} at epoch {end['termination']['epoch']}"
    return f"failed at epoch {end.get('epoch')} ({end.get('error_type')})"


def _summary(
    events: Sequence[Mapping[str, Any]],
    rounds: Sequence[Mapping[str, Any]],
    nested: Sequence[Mapping[str, Any]],
) -> list[str]:
    run = main_run(events)
    started = next(
        (e for e in events if e["event"] == "iteration_started" and e.get("run_id") == run), {}
    )
    end = final_event(events)
    durations = [e["duration_s"] for e in rounds if e.get("duration_s") is not None]
    total = end["duration_s"] if end and end.get("duration_s") is not None else sum(durations)
    median = f", median {statistics.median(durations):.3g} s per round" if durations else ""
    if end is None:
        detail = " (the run is still going, or its process died)"
    elif end["event"] == "iteration_terminated":
        detail = f" (reasons: {', '.join(end['termination']['reasons'])})"
    else:
        detail = f": {end.get('error')}"
    lines = [
        f"iteration '{started.get('iteration', '?')}', run {started.get('run_id', '?')}, "
        f"iterflow {started.get('iterflow_version', '?')}",
        f"rounds: {(end or {}).get('rounds', len(rounds))}, {total:.3g} s in total{median}",
        f"ended: {ending(events)}{detail}",
    ]
    lines += [
        f"rolled back: {_rollback(e)}"
        for e in events
        if e["event"] == "rolled_back" and e.get("run_id") == run
    ]
    if nested:
        inner = {e.get("run_id") for e in nested}
        lines.append(f"nested runs: {len(inner)}, {len(nested)} rounds in all")
    metrics: Mapping[str, Any] = (end.get("metrics") or {}) if end else {}
    if metrics:
        lines += ["", "metric totals:"]
        lines += _table(
            ["metric", "kind", "committed", "attempted"],
            [
                [name, m["kind"], _total(m["committed"]), _total(m["attempted"])]
                for name, m in metrics.items()
            ],
            align="<<>>",
        )
    return lines


def _rollback(event: Mapping[str, Any]) -> str:
    """A ``rolled_back`` event in words (a log from before it said what was lost: less)."""
    back = f"to the durable checkpoint of epoch {event.get('to_epoch')}"
    if event.get("failed_epoch") is None:
        return back
    return (
        f"epoch {event['failed_epoch']} lost {event.get('lost', 'data')}; {back}, "
        f"{event.get('rounds_recomputed')} completed round(s) recomputed"
    )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        # Three significant digits keep many columns narrow; thousands read better whole.
        return f"{value:.0f}" if 1e3 <= abs(value) < 1e7 else f"{value:.3g}"
    return str(value)


def _total(value: Any) -> str:
    if isinstance(value, dict):
        return f"mean {_cell(value.get('mean'))} of {value.get('count')}"
    return _cell(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, align: str) -> list[str]:
    """Rows of text cells padded to aligned columns, two spaces apart."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(line, align, widths, strict=True)).rstrip()
        for line in (header, *rows)
    ]
