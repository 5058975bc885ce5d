"""The progress bar on a real pseudo-terminal and as a notebook widget, without Spark."""

from __future__ import annotations

import os
import select
import sys
import types
from datetime import datetime, timezone

import pytest

from iterflow.progress import bar as bar_module
from iterflow.progress.bar import ProgressBar
from iterflow.reports import RoundProgress


def read_all(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the terminal side is closed and everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def test_the_bar_draws_on_a_terminal_that_reports_no_size() -> None:
    # A fresh pseudo-terminal reports 0 x 0, as some CI terminals do; tqdm alone
    # would print nothing there.
    controller, terminal = os.openpty()
    with os.fdopen(terminal, "w") as out:
        bar = ProgressBar("pagerank", max_rounds=5, enabled=None, file=out)
        assert bar.enabled  # on by default on a terminal
        for epoch in range(2):
            bar.round_end(
                RoundProgress(
                    epoch=epoch,
                    epoch_watermark=epoch,
                    started_at=datetime.now(timezone.utc),
                    duration_s=0.25,
                    converged_value=0.5**epoch,
                    rounds_remaining_estimate=3 - epoch,
                    eta_s=0.75 - 0.25 * epoch,
                )
            )
        bar.close("converged at epoch 1")
        out.flush()
        shown = read_all(controller)
    os.close(controller)
    assert "pagerank round 2/5" in shown
    assert "0.25 s/round, value 0.5, ETA 0.5s (~2 rounds)" in shown
    assert "converged at epoch 1" in shown


def test_no_bar_when_the_output_is_not_a_terminal() -> None:
    with open(os.devnull, "w") as out:
        assert not ProgressBar("x", max_rounds=None, enabled=None, file=out).enabled


def progress(k: int) -> RoundProgress:
    return RoundProgress(
        epoch=k, epoch_watermark=k, started_at=datetime.now(timezone.utc), duration_s=0.25
    )


def widget_bar(monkeypatch: pytest.MonkeyPatch) -> type:
    """Make ProgressBar take tqdm's notebook widget, as in a notebook's kernel."""
    notebook = pytest.importorskip("tqdm.notebook")
    pytest.importorskip("ipywidgets")
    monkeypatch.setattr(bar_module, "notebook_bar", lambda: notebook.tqdm_notebook)
    return notebook.tqdm_notebook  # type: ignore[no-any-return]


def test_in_a_notebook_the_bar_is_a_widget_that_fills_when_the_run_converges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    widget = widget_bar(monkeypatch)
    shown = ProgressBar("pagerank", max_rounds=None, enabled=None)
    assert isinstance(shown._bar, widget)
    shown.round_end(progress(0), max_rounds=10)  # a body's until() gives the total late
    shown.round_end(progress(1), max_rounds=10)
    pbar = shown._bar.container.children[1]
    assert (pbar.value, pbar.max, pbar.bar_style, pbar.layout.width) == (2, 10, "", None)

    shown.close("converged at epoch 1")

    assert (pbar.value, pbar.max, pbar.bar_style) == (2, 2, "success")


def test_in_a_notebook_a_failed_run_leaves_its_bar_red(monkeypatch: pytest.MonkeyPatch) -> None:
    widget_bar(monkeypatch)
    shown = ProgressBar("pagerank", max_rounds=10, enabled=True)
    shown.round_end(progress(0))
    pbar = shown._bar.container.children[1]  # type: ignore[union-attr]

    shown.close("failed at epoch 1", failed=True)

    assert (pbar.max, pbar.bar_style) == (10, "danger")


def test_a_notebook_front_end_without_widgets_gets_the_text_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bar_module, "notebook_bar", lambda: None)
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    assert ProgressBar("x", max_rounds=3, enabled=None).enabled
    with open("/dev/null", "w") as out:  # a file of one's own is shown only if a terminal
        assert not ProgressBar("x", max_rounds=3, enabled=None, file=out).enabled
