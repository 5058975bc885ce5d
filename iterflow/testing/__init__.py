"""Testing iterative algorithms: assertions with evidence, convergence cases, a pytest plugin.

- Assertions about a run (an ``IterationResult``, a fitted ``iterflow.ml`` model
  or an ``IterationEnd``): :func:`assert_converges`, :func:`assert_terminated_by`,
  :func:`assert_monotone`, :func:`assert_rate`; and about a result DataFrame:
  :func:`assert_frame_close`.
- :class:`ConvergenceCase` and :func:`run_cases`, which ``iterflow converge`` runs, with
  :func:`load_cases`, :func:`select`, :func:`format_table`, :func:`write_report` and
  :func:`plot_reports` for its table, JSON report and plot.
- The pytest plugin, registered on install and kept outside this package (the module
  ``_iterflow_pytestplugin``) so that pytest starts without importing iterflow: a
  session-scoped ``iterflow_spark`` fixture and the ``iterflow_spark``, ``iterflow_slow``
  and ``iterflow_classic`` markers (iterflow 0.1's names are aliases for one release).

See docs/testing.md.
"""

from iterflow.testing.assertions import (
    ConvergenceAssertionError,
    assert_converges,
    assert_frame_close,
    assert_monotone,
    assert_rate,
    assert_terminated_by,
    metric_values,
    observed_rate,
)
from iterflow.testing.cases import (
    CaseReport,
    ConvergenceCase,
    format_table,
    load_cases,
    plot_reports,
    run_case,
    run_cases,
    select,
    write_report,
)

__all__ = [
    "CaseReport",
    "ConvergenceAssertionError",
    "ConvergenceCase",
    "assert_converges",
    "assert_frame_close",
    "assert_monotone",
    "assert_rate",
    "assert_terminated_by",
    "format_table",
    "load_cases",
    "metric_values",
    "observed_rate",
    "plot_reports",
    "run_case",
    "run_cases",
    "select",
    "write_report",
]
