"""The event log, ``iterflow report`` and ``iterflow plot``, on synthetic logs; no Spark."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest

from iterflow.cli import main
from iterflow.errors import IterflowError, IterflowValueError
from iterflow.metrics.values import DistributionValue, MetricResult
from iterflow.progress.event_log import EventLog, progress_to_dict, read_events
from iterflow.progress.plot import plot_events
from iterflow.progress.table import format_report
from iterflow.reports import RoundProgress
from iterflow.termination import Termination

ROUNDS = 6
START = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
INPUTS = {
    "ranks": {"schema": "id BIGINT, rank DOUBLE", "replay": False},
    "edges": {"schema": "src BIGINT, dst BIGINT", "replay": True},
}
CONDITIONS = [
    {"kind": "max_rounds", "n": 50},
    {"kind": "converged", "tol": 1e-8, "value": "dataframe"},
]


def batch(k: int) -> DistributionValue:
    """Round ``k``'s distribution: values k+1 and 3k+3, so its mean is 2k+2."""
    return DistributionValue(count=2, sum=4.0 * k + 4.0, min=k + 1.0, max=3.0 * k + 3.0)


def round_progress(k: int, converged_value: float | None = None) -> RoundProgress:
    return RoundProgress(
        epoch=k,
        epoch_watermark=k,
        started_at=START + timedelta(seconds=k),
        duration_s=0.25 + 0.125 * k,
        rows={"ranks": 100 + k, "changed": 10 * (ROUNDS - k)},
        criteria_empty=k == ROUNDS - 1,
        observed={"contribs": 1000 + k, "pruned": None},
        metrics={"edges_scanned": 7 * k, "batch": batch(k), "lr": 0.1},
        converged_value=0.5**k if converged_value is None else converged_value,
        rounds_remaining_estimate=ROUNDS - 1 - k if k else None,
        eta_s=0.5 * (ROUNDS - 1 - k) if k else None,
    )


def totals() -> dict[str, MetricResult]:
    return {
        "edges_scanned": MetricResult(kind="counter", committed=105, attempted=112),
        "batch": MetricResult(
            kind="distribution",
            committed=DistributionValue(count=4, sum=10.0, min=1.0, max=6.0),
            attempted=DistributionValue(count=5, sum=11.0, min=1.0, max=6.0),
        ),
    }


def write_run(path: Path, run_id: str, rounds: int = ROUNDS, iteration: str = "pagerank") -> None:
    with EventLog(path) as log:
        log.iteration_started(
            run_id=run_id, iteration=iteration, inputs=INPUTS, conditions=CONDITIONS
        )
        for k in range(rounds):
            log.round_end(run_id=run_id, progress=round_progress(k))
        log.iteration_terminated(
            run_id=run_id,
            termination=Termination("converged", rounds - 1, ("converged", "max_rounds")),
            rounds=rounds,
            duration_s=4.5,
            metrics=totals(),
        )


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    path = tmp_path / "logs" / "run.jsonl"  # the parent directory does not exist yet
    write_run(path, "r1")
    return path


def test_progress_to_dict_has_every_round_progress_field() -> None:
    data = progress_to_dict(round_progress(2))
    assert list(data) == [field.name for field in attrs.fields(RoundProgress)]
    assert data["started_at"] == "2025-03-01T12:00:02+00:00"
    assert data["metrics"]["batch"] == {
        "count": 2,
        "sum": 12.0,
        "min": 3.0,
        "max": 9.0,
        "mean": 6.0,
    }


def test_every_line_is_one_json_event_with_time_and_run_id(log_path: Path) -> None:
    lines = log_path.read_text().splitlines()
    assert len(lines) == ROUNDS + 2
    for line in lines:
        event = json.loads(line)
        assert event["run_id"] == "r1"
        assert datetime.fromisoformat(event["time"]).utcoffset() == timedelta(0)


def test_iteration_started_records_inputs_conditions_and_version(log_path: Path) -> None:
    started = read_events(log_path)[0]
    assert started["event"] == "iteration_started"
    assert started["iteration"] == "pagerank"
    assert started["inputs"] == INPUTS
    assert started["conditions"] == CONDITIONS
    assert isinstance(started["iterflow_version"], str) and started["iterflow_version"]


def test_round_end_round_trips_every_progress_field(log_path: Path) -> None:
    rounds = [e for e in read_events(log_path) if e["event"] == "round_end"]
    assert len(rounds) == ROUNDS
    for k, event in enumerate(rounds):
        p = round_progress(k)
        assert event["epoch"] == p.epoch == k
        assert event["epoch_watermark"] == p.epoch_watermark
        assert datetime.fromisoformat(event["started_at"]) == p.started_at
        assert event["duration_s"] == p.duration_s
        assert event["rows"] == {"ranks": 100 + k, "changed": 10 * (ROUNDS - k)}
        assert event["criteria_empty"] is (k == ROUNDS - 1)
        assert event["observed"] == {"contribs": 1000 + k, "pruned": None}
        assert event["metrics"]["edges_scanned"] == 7 * k
        assert event["metrics"]["lr"] == 0.1
        assert event["metrics"]["batch"] == batch(k).to_dict()
        assert event["converged_value"] == 0.5**k
        assert event["rounds_remaining_estimate"] == p.rounds_remaining_estimate
        assert event["eta_s"] == p.eta_s


def test_iteration_terminated_records_termination_and_metric_totals(log_path: Path) -> None:
    end = read_events(log_path)[-1]
    assert end["event"] == "iteration_terminated"
    assert end["termination"] == {
        "reason": "converged",
        "epoch": ROUNDS - 1,
        "reasons": ["converged", "max_rounds"],
    }
    assert end["rounds"] == ROUNDS
    assert end["duration_s"] == 4.5
    assert end["metrics"] == {
        "batch": {
            "kind": "distribution",
            "committed": {"count": 4, "sum": 10.0, "min": 1.0, "max": 6.0, "mean": 2.5},
            "attempted": {"count": 5, "sum": 11.0, "min": 1.0, "max": 6.0, "mean": 2.2},
        },
        "edges_scanned": {"kind": "counter", "committed": 105, "attempted": 112},
    }


def test_iteration_failed_records_the_error_and_its_type(tmp_path: Path) -> None:
    path = tmp_path / "failed.jsonl"
    with EventLog(path) as log:
        log.iteration_started(run_id="f", iteration="kmeans", inputs={}, conditions=[])
        log.round_end(run_id="f", progress=round_progress(0))
        log.iteration_failed(
            run_id="f",
            epoch=1,
            error=ZeroDivisionError("division by zero"),
            duration_s=1.5,
            metrics=totals(),
        )
    end = read_events(path)[-1]
    assert end["event"] == "iteration_failed"
    assert (end["epoch"], end["error"], end["error_type"]) == (
        1,
        "division by zero",
        "ZeroDivisionError",
    )
    assert end["duration_s"] == 1.5
    assert end["metrics"]["edges_scanned"]["committed"] == 105
    report = format_report(read_events(path))
    assert "failed at epoch 1 (ZeroDivisionError): division by zero" in report


def test_lines_are_flushed_before_the_log_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    log = EventLog(path)
    log.iteration_started(run_id="live", iteration="it", inputs={}, conditions=[])
    log.round_end(run_id="live", progress=round_progress(0))
    assert [e["event"] for e in read_events(path)] == ["iteration_started", "round_end"]
    log.close()
    with pytest.raises(IterflowError, match="is closed"):
        log.round_end(run_id="live", progress=round_progress(1))


def test_non_finite_values_are_written_as_null(tmp_path: Path) -> None:
    path = tmp_path / "nan.jsonl"
    progress = attrs.evolve(round_progress(0, converged_value=math.nan), metrics={"loss": math.inf})
    with EventLog(path) as log:
        log.round_end(run_id="n", progress=progress)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    event = json.loads(text)
    assert event["converged_value"] is None
    assert event["metrics"]["loss"] is None


def test_runs_sharing_a_file_default_to_the_last_and_are_picked_by_run_id(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.jsonl"
    write_run(path, "first", rounds=3, iteration="a")
    write_run(path, "second", rounds=2, iteration="b")
    last = read_events(path)
    assert {e["run_id"] for e in last} == {"second"}
    assert [e["event"] for e in last].count("round_end") == 2
    first = read_events(path, run_id="first")
    assert first[0]["iteration"] == "a"
    assert [e["event"] for e in first].count("round_end") == 3
    with pytest.raises(IterflowValueError, match=r"no run 'third'; runs in it: 'first', 'second'"):
        read_events(path, run_id="third")


def test_a_line_that_is_not_an_event_is_an_error_naming_its_line(log_path: Path) -> None:
    lines = log_path.read_text().splitlines()
    log_path.write_text("\n".join([*lines[:3], "not json", *lines[3:]]) + "\n")
    with pytest.raises(IterflowValueError, match=r"run\.jsonl' line 4 is not JSON"):
        read_events(log_path)
    log_path.write_text("\n".join([*lines[:2], '{"epoch": 3}']) + "\n")
    with pytest.raises(IterflowValueError, match=r"line 3 is not an event"):
        read_events(log_path)


def test_a_partial_last_line_from_a_crash_is_left_out(log_path: Path) -> None:
    whole = read_events(log_path)
    text = log_path.read_text()
    log_path.write_text(text + '{"event": "round_end", "time": "2025-')  # died mid-write
    assert read_events(log_path) == whole


def test_a_missing_log_is_an_error_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(IterflowError, match=r"cannot read event log '.*missing\.jsonl'"):
        read_events(tmp_path / "missing.jsonl")


def table_rows(report: str) -> list[list[str]]:
    """The rows of the round table: the lines after the header, up to the blank line."""
    table = report.split("\n\n")[0].splitlines()
    return [line.split() for line in table[1:]]


def test_report_has_one_row_per_round_and_the_termination(log_path: Path) -> None:
    events = read_events(log_path)
    report = format_report(events)
    rows = table_rows(report)
    assert len(rows) == sum(e["event"] == "round_end" for e in events) == ROUNDS
    header = report.splitlines()[0].split()
    assert header == [
        "epoch",
        "seconds",
        "rows.ranks",
        "rows.changed",
        "observed.contribs",
        "converged",
        "remaining",
        "eta_s",
        "edges_scanned",
        "batch",
        "lr",
    ]
    for k, row in enumerate(rows):
        cells = dict(zip(header, row, strict=True))
        assert int(cells["epoch"]) == k
        assert int(cells["rows.ranks"]) == 100 + k
        assert float(cells["converged"]) == pytest.approx(0.5**k, rel=5e-3)  # three digits
        assert float(cells["batch"]) == 2 * k + 2  # the distribution's mean
    assert rows[0][header.index("remaining")] == "-"
    assert "ended: converged at epoch 5 (reasons: converged, max_rounds)" in report
    assert "rounds: 6, 4.5 s in total" in report
    assert "mean 2.5 of 4" in report


def line_data(events: list[dict[str, Any]], **options: Any) -> tuple[list[float], list[float]]:
    figure = plot_events(events, **options)
    (axes,) = figure.axes
    (line,) = axes.get_lines()
    return list(line.get_xdata()), list(line.get_ydata())


def test_plot_draws_the_converged_value_once_per_round(log_path: Path) -> None:
    events = read_events(log_path)
    xs, ys = line_data(events)
    assert xs == [float(k) for k in range(ROUNDS)]
    assert ys == [0.5**k for k in range(ROUNDS)]
    assert len(xs) == sum(e["event"] == "round_end" for e in events)
    figure = plot_events(events)
    assert "pagerank" in figure.axes[0].get_title()
    assert "converged at epoch 5" in figure.axes[0].get_title()
    assert figure.axes[0].get_yscale() == "linear"


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("batch", [2.0 * k + 2 for k in range(ROUNDS)]),
        ("edges_scanned", [7.0 * k for k in range(ROUNDS)]),
        ("rows.changed", [10.0 * (ROUNDS - k) for k in range(ROUNDS)]),
        ("observed.contribs", [1000.0 + k for k in range(ROUNDS)]),
        ("duration_s", [0.25 + 0.125 * k for k in range(ROUNDS)]),
    ],
)
def test_plot_metric_selects_a_user_metric_or_a_progress_field(
    log_path: Path, metric: str, expected: list[float]
) -> None:
    xs, ys = line_data(read_events(log_path), metric=metric)
    assert xs == [float(k) for k in range(ROUNDS)]
    assert ys == expected


def test_plot_skips_rounds_without_a_value(log_path: Path) -> None:
    xs, ys = line_data(read_events(log_path), metric="eta_s")
    assert xs == [float(k) for k in range(1, ROUNDS)]
    assert ys == [0.5 * (ROUNDS - 1 - k) for k in range(1, ROUNDS)]


def test_plot_log_y_sets_a_log_scale(log_path: Path) -> None:
    figure = plot_events(read_events(log_path), log_y=True)
    assert figure.axes[0].get_yscale() == "log"


def test_plot_of_an_unknown_metric_lists_the_available_ones(log_path: Path) -> None:
    with pytest.raises(IterflowValueError, match=r"'nope'.*batch, converged_value, duration_s"):
        plot_events(read_events(log_path), metric="nope")


def test_cli_report_prints_the_report_of_the_chosen_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shared.jsonl"
    write_run(path, "first", rounds=3, iteration="a")
    write_run(path, "second", rounds=2, iteration="b")
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert len(table_rows(out)) == 2 and "iteration 'b'" in out
    assert main(["report", str(path), "--run", "first"]) == 0
    out = capsys.readouterr().out
    assert len(table_rows(out)) == 3 and "iteration 'a'" in out


def test_cli_plot_saves_a_png_and_prints_its_path(
    log_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = tmp_path / "curve.png"
    assert main(["plot", str(log_path), "-o", str(image), "--metric", "batch", "--log-y"]) == 0
    assert capsys.readouterr().out.strip() == str(image)
    assert image.read_bytes().startswith(b"\x89PNG")


def test_cli_errors_print_one_line_and_exit_3(
    tmp_path: Path, log_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("iterflow report: error: cannot read event log")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["plot", str(log_path), "-o", str(tmp_path / "x.png"), "--metric", "nope"]) == 3
    assert "'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def _nested_log(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _started(run: str, parent: str | None = None, at: list[int] | None = None) -> dict[str, Any]:
    return {
        "event": "iteration_started",
        "run_id": run,
        "iteration": run,
        "parent_run_id": parent,
        "epoch_path": at or [],
    }


def _round(run: str, path: list[int]) -> dict[str, Any]:
    return {
        "event": "round_end",
        "run_id": run,
        "epoch": path[-1],
        "epoch_path": path,
        "duration_s": 0.1,
    }


def test_two_runs_nested_in_one_round_both_show_in_the_report(tmp_path: Path) -> None:
    log = _nested_log(
        tmp_path / "events.jsonl",
        [
            _started("a", "outer", [0]),  # a nested run may log its start first
            _round("a", [0, 0]),
            _round("a", [0, 1]),
            _started("outer"),
            _started("b", "outer", [0]),
            _round("b", [0, 0]),
            _started("c", "b", [0, 0]),  # nested two deep
            _round("c", [0, 0, 0]),
            _round("outer", [0]),
            _started("d", "outer", [1]),
            _round("d", [1, 0]),
            _round("outer", [1]),
        ],
    )
    events = read_events(log)
    assert {e["run_id"] for e in events} == {"outer", "a", "b", "c", "d"}
    report = format_report(events)
    rows = [re.match(r"\s*(\(.*?\)|\d+)", line) for line in report.splitlines()[1:8]]
    # Each outer round, then the rounds of the runs nested in it in the order they started:
    # a's two, b's, then c's (nested in b's round 0).
    assert [row.group(1) for row in rows if row] == [
        "0",
        "(0, 0)",
        "(0, 1)",
        "(0, 0)",
        "(0, 0, 0)",
        "1",
        "(1, 0)",
    ]
    assert "nested runs: 4, 5 rounds in all" in report


def test_a_rolled_back_round_keeps_only_the_runs_of_its_last_attempt(tmp_path: Path) -> None:
    log = _nested_log(
        tmp_path / "events.jsonl",
        [
            _started("outer"),
            _round("outer", [0]),
            _started("first", "outer", [1]),
            _round("first", [1, 0]),
            {"event": "rolled_back", "run_id": "outer", "to_epoch": 0},
            _started("again", "outer", [1]),
            _round("again", [1, 0]),
            _round("again", [1, 1]),
            _round("outer", [1]),
        ],
    )
    report = format_report(read_events(log))
    assert "nested runs: 1, 2 rounds in all" in report


def test_a_nested_run_with_its_own_log_reads_as_a_run_of_its_own(tmp_path: Path) -> None:
    log = _nested_log(
        tmp_path / "inner.jsonl",
        [_started("inner", "elsewhere", [3]), _round("inner", [3, 0]), _round("inner", [3, 1])],
    )
    events = read_events(log)
    assert [e["epoch"] for e in events if e["event"] == "round_end"] == [0, 1]
    assert "nested runs" not in format_report(events)
