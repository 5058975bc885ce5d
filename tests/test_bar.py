"""The progress bar on a real pseudo-terminal, without Spark."""

from __future__ import annotations

import os
import select
from datetime import datetime, timezone

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
