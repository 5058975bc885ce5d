"""The ``iterflow`` loggers: what a run says at INFO and WARNING, and that importing
iterflow configures no logging of the application's."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import iterflow as itf
from iterflow.runtime.datacache import resident_policy
from iterflow.runtime.datacache.resident_policy import RESIDENT_CONF


def test_importing_iterflow_leaves_logging_to_the_application() -> None:
    code = (
        "import logging, iterflow; "
        "print(logging.root.handlers, logging.getLogger('iterflow').handlers)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[] [<NullHandler (NOTSET)>]"
    assert logging.getLogger("iterflow").propagate


def records(caplog: pytest.LogCaptureFixture, logger: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == level]


def test_a_run_logs_its_start_and_end_at_info(spark, caplog) -> None:
    @itf.body
    def count_up(acc, ctx):
        return itf.Declaration(feedback={"acc": acc.selectExpr("acc + 1 AS acc")})

    caplog.set_level(logging.INFO, logger="iterflow")
    itf.BoundedIteration(count_up).bind("acc", spark.createDataFrame([(0,)], "acc int")).until(
        itf.max_rounds(3)
    ).run(progress=False)

    started, ended = records(caplog, "iterflow.bounded", logging.INFO)
    assert re.fullmatch(r"iteration 'count_up' \(run \w+\) started", started)
    assert re.fullmatch(
        r"iteration 'count_up' \(run \w+\) ended: max_rounds at epoch 2 after 3 round\(s\) "
        r"in \d+\.\d\d s",
        ended,
    )


def rows_body() -> itf.IterationBody:
    """A round whose kernel counts the rows of each partition of ``points``."""

    def rows(table: pa.Table) -> pa.Table:
        return pa.table({"n": [table.num_rows]})

    @itf.body
    def counted(acc, points, ctx):
        counts = ctx.columnar(points).map(rows, "n LONG")
        nxt = acc.selectExpr("acc + 1 AS acc")
        return itf.Declaration(feedback={"acc": nxt}, outputs={"n": counts})

    return counted


def run_rows(spark) -> itf.IterationResult:
    points = spark.createDataFrame(pa.table({"x": np.arange(20.0)})).repartition(2)
    return (
        itf.BoundedIteration(rows_body())
        .bind("acc", spark.createDataFrame([(0,)], "acc int"))
        .bind("points", points)
        .until(itf.max_rounds(2))
        .run(progress=False)
    )


@pytest.mark.spark_classic("pretends that the classic test session is Spark Connect")
def test_kernels_falling_back_to_a_job_per_round_warn_once_with_the_reason(
    spark, caplog, monkeypatch
) -> None:
    # Under Spark Connect executors cannot reach the client: no resident data.
    monkeypatch.setattr(resident_policy, "is_classic", lambda session: False)
    caplog.set_level(logging.INFO, logger="iterflow")

    result = run_rows(spark)

    assert not any(p.resident for p in result.history)
    (warned,) = records(caplog, "iterflow.resident", logging.WARNING)
    assert "Spark job per round" in warned and "Spark Connect" in warned


def test_kernels_run_as_jobs_by_choice_say_so_at_info(spark, caplog) -> None:
    caplog.set_level(logging.INFO, logger="iterflow")
    spark.conf.set(RESIDENT_CONF, "off")
    try:
        run_rows(spark)
    finally:
        spark.conf.unset(RESIDENT_CONF)

    assert records(caplog, "iterflow.resident", logging.WARNING) == []
    (said,) = records(caplog, "iterflow.resident", logging.INFO)
    assert "Spark job per round" in said and f"{RESIDENT_CONF} is 'off'" in said
