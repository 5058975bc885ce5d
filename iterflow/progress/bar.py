"""The progress bar of a run, drawn with tqdm: a widget in a notebook, text on stderr
elsewhere. Pure Python.

In a notebook front-end (Jupyter, VS Code, Databricks: whatever ``tqdm.auto`` finds)
the bar is an ipywidgets progress bar; without ipywidgets it is tqdm's text bar in
the cell's output.

It redraws at round ends, and while a round runs whenever the round is sampled
(``run(progress_interval_s=)``): the round's fraction done and the time it has
left follow the last round's figures on the same line. Spark's own console
progress bar is off in iterflow's embedded session; in a session of your own,
set ``spark.ui.showConsoleProgress=false`` so the two do not share the line.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

from tqdm import tqdm
from tqdm.auto import tqdm as auto_tqdm

from iterflow.reports import RoundProgress, RoundSample

_WITH_TOTAL = "{desc} round {n_fmt}/{total_fmt} |{bar}| [{elapsed}{postfix}]"
_OPEN = "{desc} round {n_fmt} [{elapsed}{postfix}]"


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    minutes, seconds = divmod(round(s), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _size(out: IO[str]) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(out.fileno())
    except (AttributeError, OSError, ValueError):  # not a terminal, or no file descriptor
        return 0, 0
    return size.columns, size.lines


def notebook_bar() -> type[tqdm[None]] | None:
    """tqdm's widget bar when this process is a notebook's kernel (the class ``tqdm.auto``
    chose when first imported), or None: a terminal or no front-end at all."""
    notebook = sys.modules.get("tqdm.notebook")
    widget: type[tqdm[None]] | None = getattr(notebook, "tqdm_notebook", None)
    return auto_tqdm if widget is not None and issubclass(auto_tqdm, widget) else None


def _front_end() -> bool:
    """Whether this process is a notebook's kernel (ipykernel), whose front-end shows
    what it writes to stderr."""
    return "ipykernel.zmqshell" in sys.modules


def _set_total(bar: tqdm[None], total: int) -> None:
    """Make ``total`` the bar's end; a widget's own maximum follows (tqdm sets it once),
    and an open counter's narrow "info" widget becomes a bar (as tqdm's ``reset``)."""
    container = getattr(bar, "container", None)  # tqdm.notebook's widget box
    if container is not None:
        widget = container.children[1]
        if not bar.total:
            widget.bar_style = ""
            widget.layout.width = None
        widget.max = total
    bar.total = total


def describe_round(progress: RoundProgress) -> str:
    """One line on a round: seconds it took, convergence value, estimated time left."""
    parts = [f"{progress.duration_s:.2f} s/round"]
    if progress.converged_value is not None:
        parts.append(f"value {progress.converged_value:.3g}")
    if progress.rounds_remaining_estimate is not None:
        eta = f"ETA {_seconds(progress.eta_s)}" if progress.eta_s is not None else "ETA"
        parts.append(f"{eta} (~{progress.rounds_remaining_estimate} rounds)")
    return ", ".join(parts)


def describe_sample(sample: RoundSample) -> str:
    """One line on a running round: its fraction done and the time it has left."""
    done = "..." if sample.fraction_done is None else f"{sample.fraction_done:.0%}"
    left = "" if sample.eta_s is None else f", {_seconds(sample.eta_s)} left"
    return f"epoch {sample.epoch} {done}{left}"


class ProgressBar:
    """Rounds done out of ``max_rounds`` (or an open counter), updated at every round end.

    ``enabled=None`` shows the bar when ``file`` (stderr by default) is a terminal, or
    when a notebook front-end shows this process's output. Without ``file``, a notebook
    gets tqdm's widget. ``position`` > 0 is the line of a nested run's bar below its
    outer run's; it is cleared when the nested run ends.
    """

    def __init__(
        self,
        iteration: str,
        *,
        max_rounds: int | None,
        enabled: bool | None,
        file: IO[str] | None = None,
        position: int = 0,
    ) -> None:
        out = file if file is not None else sys.stderr
        widget = notebook_bar() if file is None else None
        if enabled is None:
            shown = widget is not None or (file is None and _front_end())
            enabled = shown or bool(getattr(out, "isatty", bool)())
        self._bar: tqdm[None] | None = None
        self._last_round = ""  # what the last round end showed
        if not enabled:
            return
        common: dict[str, Any] = {
            "total": max_rounds,
            "desc": iteration,
            "bar_format": _WITH_TOTAL if max_rounds else _OPEN,
            # A nested run's bar sits below its outer run's and goes when it ends.
            "position": position,
            "leave": position == 0,
            "mininterval": 0,
        }
        if widget is not None:  # the widget takes the cell's width
            self._bar = widget(**common)
            return
        # Follow the terminal's width. One that reports 0 columns or lines (some
        # pseudo-terminals) would make tqdm print nothing: use 100 x 20 there.
        columns, lines = _size(out)
        follow = columns > 0
        self._bar = tqdm(
            file=out,
            dynamic_ncols=follow,
            ncols=None if follow else 100,
            nrows=None if lines > 0 else 20,
            **common,
        )

    @property
    def enabled(self) -> bool:
        return self._bar is not None

    def resume(self, rounds: int) -> None:
        """Count ``rounds`` restored from a checkpoint as done."""
        if self._bar is not None:
            self._bar.n = self._bar.last_print_n = rounds
            self._bar.refresh()

    def round_end(self, progress: RoundProgress, *, max_rounds: int | None = None) -> None:
        """Count round ``progress.epoch`` done; ``max_rounds`` updates the total (a body's
        own ``until`` is known only once it has run)."""
        if self._bar is None:
            return
        if max_rounds is not None and max_rounds != self._bar.total:
            _set_total(self._bar, max_rounds)
            self._bar.bar_format = _WITH_TOTAL
        self._last_round = describe_round(progress)
        self._bar.set_postfix_str(self._last_round, refresh=False)
        self._bar.update(1)

    def round_progress(self, sample: RoundSample) -> None:
        """Show how far the running round is, after the last round's figures."""
        if self._bar is None or sample.final:
            return
        shown = [part for part in (self._last_round, describe_sample(sample)) if part]
        self._bar.set_postfix_str("; ".join(shown), refresh=True)

    def close(self, outcome: str, *, failed: bool = False) -> None:
        """Show how the run ended (``"converged at epoch 17"``) and release the line.

        A widget that stops short of its total turns red: a run that ended well
        (converged before ``max_rounds``) fills it instead; ``failed`` keeps it red."""
        if self._bar is None:
            return
        bar = self._bar
        if not failed and hasattr(bar, "container") and bar.total and 0 < bar.n < bar.total:
            _set_total(bar, bar.n)
        self._bar.set_postfix_str(outcome, refresh=True)
        self._bar.close()
        self._bar = None
