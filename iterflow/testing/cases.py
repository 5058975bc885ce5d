"""Convergence cases: an iteration on a problem with a known answer, run and judged.

A :class:`ConvergenceCase` names a problem, a function that runs an iteration
on it (and returns its answer), a reference answer computed independently, an
error measure between the two, and what counts as converged: the final error
at most ``tol``, optionally within ``max_rounds`` rounds and at a geometric
rate of at most ``rate``. :func:`run_cases` runs cases on one session and
judges each; ``iterflow converge`` prints the table, writes the JSON report
and draws the error of every round.

Example::

    def run(spark, listen):
        model = kmeans(points(spark), 3, init=START, tol=1e-9, listen=listen)
        return model.centroids

    case = ConvergenceCase(
        name="my-kmeans",
        run=run,
        reference=lambda: lloyd(POINTS, START),            # numpy, no Spark
        error=lambda got, want: float(np.abs(got - want).max()),
        tol=1e-9,
        round_answer=lambda end: centroids_of(end.variables["model"]),
    )
"""

from __future__ import annotations

import importlib
import json
import math
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

import iterflow as itf
from iterflow.testing.assertions import observed_rate

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from pyspark.sql import SparkSession


@attrs.frozen
class ConvergenceCase:
    """A problem with a known answer, and what converging on it means.

    - ``run(spark, listen)`` builds and runs the iteration and returns its answer;
      it must pass ``listen`` on (``listen=`` of iterflow.ml and iterflow.graph
      functions, or ``BoundedIteration.listen``), which records the rounds.
    - ``reference()`` computes the answer independently (numpy, networkx...).
    - ``error(answer, reference)`` is a non-negative float; 0 is a perfect answer.
    - ``tol``: the final error must be at most this.
    - ``round_answer(end)``, optional: the answer after a round, from its
      ``RoundEnd``; with it, the error of every round is reported and plotted,
      and the rate is measured on it (else on the convergence value).
    - ``max_rounds`` and ``rate``, optional: the run must take at most that many
      rounds, and its error must shrink at least that fast per round.
    """

    name: str
    run: Callable[[SparkSession, Any], Any]
    reference: Callable[[], Any]
    error: Callable[[Any, Any], float]
    tol: float
    round_answer: Callable[[itf.RoundEnd], Any] | None = None
    max_rounds: int | None = None
    rate: float | None = None
    description: str = ""


@attrs.define
class CaseReport:
    """How one case went: ``passed``, and the evidence for it."""

    name: str
    passed: bool
    rounds: int | None
    termination: str | None
    final_error: float | None
    tol: float
    rate: float | None
    seconds: float
    errors: list[float | None]  # per round, when the case gives round answers
    converged_values: list[float | None]
    failures: list[str]
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class _Recorder(itf.RoundListener):
    """Records every round's error (with ``round_answer``) and the iteration's end."""

    def __init__(self, case: ConvergenceCase, reference: Any) -> None:
        self.case = case
        self.reference = reference
        self.errors: list[float | None] = []
        self.end: itf.IterationEnd | None = None

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        if self.case.round_answer is not None:
            self.errors.append(
                _finite(self.case.error(self.case.round_answer(ctx), self.reference))
            )

    def on_iteration_terminated(self, ctx: itf.IterationEnd) -> None:
        self.end = ctx


def _finite(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def run_case(case: ConvergenceCase, spark: SparkSession) -> CaseReport:
    """Run ``case`` on ``spark`` and judge it; a case that raises fails with its error."""
    failures: list[str] = []
    started = time.perf_counter()
    recorder: _Recorder | None = None
    final_error: float | None = None
    try:
        reference = case.reference()
        recorder = _Recorder(case, reference)
        answer = case.run(spark, recorder)
        final_error = _finite(case.error(answer, reference))
    except Exception as exc:  # a broken case is a failed case, named, not a crash
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        failures.append(f"raised {last}")
    seconds = time.perf_counter() - started
    end = recorder.end if recorder is not None else None
    errors = list(recorder.errors) if recorder is not None else []
    converged = [p.converged_value for p in end.history] if end is not None else []
    measured = [e for e in errors if e is not None] or [v for v in converged if v is not None]
    rate = observed_rate(measured)
    if not failures:
        if end is None:
            failures.append("run() did not pass `listen` on to the iteration: no rounds seen")
        if final_error is None:
            failures.append("the final error is not a finite number")
        elif not final_error <= case.tol:
            failures.append(f"final error {final_error:.3g} is above tol={case.tol:g}")
        if end is not None and case.max_rounds is not None and end.rounds > case.max_rounds:
            failures.append(f"took {end.rounds} rounds, more than max_rounds={case.max_rounds}")
        if case.rate is not None and (rate is None or not rate <= case.rate):
            observed = "unmeasurable" if rate is None else f"{rate:.3g}"
            failures.append(f"rate {observed} per round, slower than rate={case.rate:g}")
    return CaseReport(
        name=case.name,
        passed=not failures,
        rounds=end.rounds if end is not None else None,
        termination=end.termination.reason if end is not None else None,
        final_error=final_error,
        tol=case.tol,
        rate=rate,
        seconds=seconds,
        errors=errors,
        converged_values=converged,
        failures=failures,
        description=case.description,
    )


def run_cases(
    cases: Sequence[ConvergenceCase],
    spark: SparkSession,
    on_report: Callable[[CaseReport], None] | None = None,
) -> list[CaseReport]:
    """Run every case in turn; ``on_report`` hears each report as it is made."""
    reports = []
    for case in cases:
        report = run_case(case, spark)
        if on_report is not None:
            on_report(report)
        reports.append(report)
    return reports


def load_cases(module_name: str) -> list[ConvergenceCase]:
    """The cases of a module: its ``CASES`` if it has one, else every module-level
    ``ConvergenceCase``, in the order they are defined."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise itf.IterflowValueError(f"cannot import case module '{module_name}': {exc}") from exc
    found: Iterable[Any] = getattr(module, "CASES", None) or vars(module).values()
    cases = [c for c in found if isinstance(c, ConvergenceCase)]
    if not cases:
        raise itf.IterflowValueError(
            f"module '{module_name}' has no ConvergenceCase (define CASES = [...] or "
            "module-level ConvergenceCase objects)"
        )
    return cases


def select(cases: Sequence[ConvergenceCase], names: Sequence[str]) -> list[ConvergenceCase]:
    """The cases named in ``names`` (all when empty); an unknown name is an error."""
    if not names:
        return list(cases)
    known = {c.name: c for c in cases}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise itf.IterflowValueError(f"no case named {unknown}; the cases are {sorted(known)}")
    return [known[n] for n in names]


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def format_table(reports: Sequence[CaseReport]) -> str:
    """One line per case: rounds, termination, final error against tol, rate, seconds."""
    header = ("case", "rounds", "termination", "final error", "tol", "rate", "seconds", "result")
    rows = [
        (
            r.name,
            _cell(r.rounds),
            _cell(r.termination),
            _cell(r.final_error),
            _cell(r.tol),
            _cell(r.rate),
            f"{r.seconds:.1f}",
            "ok" if r.passed else "FAILED",
        )
        for r in reports
    ]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    title = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    failed = [r for r in reports if not r.passed]
    notes = [f"{r.name}: {'; '.join(r.failures)}" for r in failed]
    summary = f"{len(reports) - len(failed)} of {len(reports)} cases passed"
    return "\n".join([title, "-" * len(title), *lines, "", *notes, summary])


def write_report(reports: Sequence[CaseReport], path: str | os.PathLike[str]) -> None:
    """The reports as JSON: ``{"passed": bool, "cases": [...]}``."""
    document = {
        "iterflow_version": itf.__version__,
        "passed": all(r.passed for r in reports),
        "cases": [r.to_dict() for r in reports],
    }
    with open(path, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2)
        out.write("\n")


def plot_reports(reports: Sequence[CaseReport]) -> Figure:
    """The error of every round of every case (log scale); a case without round answers
    shows its convergence value instead, so labelled."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise itf.IterflowError("plotting needs matplotlib: pip install iterflow[plot]") from None
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for report in reports:
        values, what = report.errors, "error"
        if not any(v is not None for v in values):
            values, what = report.converged_values, "convergence value"
        points = [(k, v) for k, v in enumerate(values) if v is not None and v > 0]
        status = "" if report.passed else ", FAILED"
        if not points and any(v == 0 for v in values if v is not None):
            axes.plot([], [], label=f"{report.name} ({what} 0 in every round{status})")
        elif points:
            axes.plot(
                [k for k, _ in points],
                [v for _, v in points],
                marker="o",
                markersize=3,
                label=f"{report.name} ({what}{status})",
            )
    axes.set_yscale("log")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("epoch")
    axes.set_ylabel("error vs reference (log)")
    passed = sum(r.passed for r in reports)
    axes.set_title(f"iterflow converge: {passed} of {len(reports)} cases passed")
    axes.grid(True, alpha=0.3)
    if axes.get_lines():
        axes.legend(fontsize="small")
    else:
        axes.text(
            0.5, 0.5, "no case has a positive error to draw", ha="center", transform=axes.transAxes
        )
    return figure
