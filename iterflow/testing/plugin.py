"""iterflow's pytest plugin, registered through the ``pytest11`` entry point: installing
iterflow is enough.

- ``spark``: one SparkSession for the whole test run, tuned for tests: a local
  master (``local[2]``), few shuffle partitions (2), no UI, loopback only, and
  Python workers running the test's interpreter. Settings come from the ini
  file (``iterflow_spark_master``, ``iterflow_shuffle_partitions``,
  ``iterflow_spark_conf`` with one ``key=value`` per line). Define your own
  ``spark`` fixture in a ``conftest.py`` to replace it.
- Markers: ``spark`` (the test uses Spark) and ``slow_spark`` (a slow Spark
  test; deselect with ``-m "not slow_spark"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from iterflow.errors import IterflowValueError


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "iterflow_spark_master", "Spark master of iterflow's `spark` fixture", default="local[2]"
    )
    parser.addini(
        "iterflow_shuffle_partitions",
        "spark.sql.shuffle.partitions of iterflow's `spark` fixture",
        default="2",
    )
    parser.addini(
        "iterflow_spark_conf",
        "more Spark settings of iterflow's `spark` fixture, one key=value per line",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: the test uses a SparkSession (the `spark` fixture)")
    config.addinivalue_line(
        "markers", "slow_spark: a slow Spark test; deselect with -m 'not slow_spark'"
    )


def spark_settings(config: pytest.Config) -> tuple[str, dict[str, str]]:
    """The master and Spark settings of the ``spark`` fixture, from the ini file."""
    conf = {
        "spark.sql.shuffle.partitions": str(config.getini("iterflow_shuffle_partitions")),
        "spark.ui.enabled": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
    }
    for line in config.getini("iterflow_spark_conf"):
        key, sep, value = str(line).partition("=")
        if not sep or not key.strip():
            raise IterflowValueError(
                f"iterflow_spark_conf: '{line}' is not a key=value line, e.g. "
                "spark.sql.adaptive.enabled=false"
            )
        conf[key.strip()] = value.strip()
    return str(config.getini("iterflow_spark_master")), conf


@pytest.fixture(scope="session")
def spark(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One SparkSession for the test run (see the module docstring), stopped at the end."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from iterflow.runtime.session import embedded_session

    master, conf = spark_settings(pytestconfig)
    session = embedded_session(master, app_name="iterflow-tests", conf=conf)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
