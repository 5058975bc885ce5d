"""What tests need to see behind a session, classic or Spark Connect.

Run with ``--iterflow-remote local[2]``, the ``spark`` fixture is a Spark Connect
session whose server PySpark started in this process: the server's SparkContext
is then reachable here, and tests count its jobs and persisted RDDs as they do on
a classic session.
"""

from __future__ import annotations

import re

import pytest
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession


def is_connect(spark: SparkSession) -> bool:
    return not hasattr(spark, "_jsparkSession")


def server_context(spark: SparkSession) -> SparkContext:
    """The SparkContext that runs ``spark``'s jobs."""
    if not is_connect(spark):
        return spark.sparkContext
    context = SparkContext._active_spark_context
    if context is None:
        pytest.skip("needs the Connect server in this process: --iterflow-remote 'local[N]'")
    return context


def jobs_started(spark: SparkSession) -> int:
    """How many Spark jobs the driver behind ``spark`` has started so far."""
    return int(server_context(spark)._jsc.sc().dagScheduler().nextJobId())


def persisted_rdds(spark: SparkSession) -> dict[int, str]:
    """Persisted RDDs (cached or checkpointed) behind ``spark``: id -> description."""
    rdds = server_context(spark)._jsc.getPersistentRDDs()
    return {int(k): str(rdds.get(k)) for k in rdds.keySet().toArray()}


def plan_nodes(df: DataFrame) -> int:
    """Node count of the analyzed logical plan (one line per node in Spark's tree string)."""
    if not is_connect(df.sparkSession):
        return len(df._jdf.queryExecution().analyzed().treeString().splitlines())
    text = df._explain_string(extended=True)  # type: ignore[operator]
    analyzed = text.split("== Analyzed Logical Plan ==")[1].split("== Optimized")[0]
    return len(analyzed.strip().splitlines()) - 1  # the first line is the output schema


_UNITS = {
    "B": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "PiB": 2**50,
    "EiB": 2**60,
}


def estimated_bytes(df: DataFrame) -> int:
    """The optimizer's size estimate of ``df``'s plan (what join planning sees); over
    Connect read from ``explain("cost")``, to three significant digits."""
    if not is_connect(df.sparkSession):
        return int(df._jdf.logicalPlan().stats().sizeInBytes())
    text = df._explain_string(mode="cost")  # type: ignore[operator]
    found = re.search(r"sizeInBytes=([0-9.E+]+) (\w+)", text)
    assert found, text
    return int(float(found.group(1)) * _UNITS[found.group(2)])
