"""A result in a notebook: its HTML, ``history_frame()`` and ``plot()``. No Spark."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from iterflow.bounded.result import IterationResult
from iterflow.errors import IterflowError, IterflowValueError
from iterflow.progress.display import History
from iterflow.progress.event_log import EventLog, read_events
from iterflow.progress.table import format_report
from iterflow.reports import RoundProgress, Termination

START = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
TERMINATION = Termination("converged", 5, ("converged",))


def progress(k: int) -> RoundProgress:
    return RoundProgress(
        epoch=k,
        epoch_watermark=k,
        started_at=START + timedelta(seconds=k),
        duration_s=0.25 + k,
        rows={"ranks": 100 + k},
        step_s={"ranks": 0.125},
        metrics={"loss": 10.0 - k},
        converged_value=0.5**k,
    )


def result(rounds: int = 6, iteration: str = "pagerank") -> IterationResult:
    return IterationResult(
        outputs={},
        rounds=rounds,
        termination=Termination("converged", rounds - 1, ("converged",)),
        history=[progress(k) for k in range(rounds)],
        emitted={},
        iteration=iteration,
    )


def test_history_frame_has_a_row_per_round_and_the_columns_of_the_report(
    tmp_path: Path,
) -> None:
    res = result()
    path = tmp_path / "run.jsonl"
    with EventLog(path) as log:  # the same rounds, as a run writes them
        log.iteration_started(run_id="r", iteration="pagerank", inputs={}, conditions=[])
        for p in res.history:
            log.round_end(run_id="r", progress=p)
    header = format_report(read_events(path)).splitlines()[0].split()

    frame = res.history_frame()

    assert list(frame.columns) == header
    assert header[:2] == ["epoch", "seconds"]
    assert frame["epoch"].tolist() == list(range(6))
    assert frame["seconds"].tolist() == [0.25 + k for k in range(6)]
    assert frame["rows.ranks"].tolist() == [100 + k for k in range(6)]
    assert frame["converged"].tolist() == [0.5**k for k in range(6)]
    assert frame["loss"].tolist() == [10.0 - k for k in range(6)]


def test_the_result_shows_its_termination_and_a_row_per_round_escaped() -> None:
    shown = result(iteration="<b>x&y</b>")._repr_html_()

    assert "converged at epoch 5" in shown
    assert "&lt;b&gt;x&amp;y&lt;/b&gt;" in shown
    assert "<b>x" not in shown
    assert shown.count("<tr><td>") == 6
    # A step's seconds stay out of the summary table; they are in the frame.
    assert "seconds.ranks" not in shown
    assert "rows.ranks" in shown


def test_a_long_history_shows_its_first_and_last_rounds() -> None:
    shown = History(progress(k) for k in range(50))._repr_html_()

    rows = [line for line in shown.splitlines() if line.startswith("<tr><td>")]
    assert len(rows) == 21  # 10 + the gap + 10
    assert rows[0].startswith("<tr><td>0</td>")
    assert rows[10].startswith("<tr><td>…</td>")
    assert rows[-1].startswith("<tr><td>49</td>")


def test_the_history_is_still_a_list() -> None:
    res = result()
    assert isinstance(res.history, list)
    assert res.history == [progress(k) for k in range(6)]
    assert res.history.frame().shape[0] == 6


def test_plot_draws_a_point_per_round_and_saves_the_image(tmp_path: Path) -> None:
    out = tmp_path / "curve.png"

    figure = result().plot("loss", log_y=True, output=str(out))

    (axes,) = figure.axes
    (line,) = axes.get_lines()
    assert list(line.get_xdata()) == list(range(6))
    assert list(line.get_ydata()) == [10.0 - k for k in range(6)]
    assert axes.get_yscale() == "log"
    assert "pagerank" in axes.get_title()
    assert "converged at epoch 5" in axes.get_title()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_an_unknown_metric_lists_the_known_ones() -> None:
    with pytest.raises(IterflowValueError, match=r"'nope'.*loss"):
        result().plot("nope")


def test_plot_to_an_unwritable_path_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IterflowError, match=r"cannot write .*nowhere"):
        result().plot(output=str(tmp_path / "nowhere" / "curve.png"))


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(IterflowError, match=r"pip install iterflow\[plot\]"):
        result().plot()
