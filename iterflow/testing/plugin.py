"""iterflow's pytest plugin, registered through the ``pytest11`` entry point: installing
iterflow is enough.

- ``spark``: one SparkSession for the whole test run, tuned for tests: a local
  master (``local[2]``), few shuffle partitions (2), no UI, loopback only, and
  Python workers running the test's interpreter. Settings come from the ini
  file (``iterflow_spark_master``, ``iterflow_shuffle_partitions``,
  ``iterflow_spark_conf`` with one ``key=value`` per line). Define your own
  ``spark`` fixture in a ``conftest.py`` to replace it.
- ``--iterflow-remote URL`` (or the ini option ``iterflow_spark_remote``) makes
  ``spark`` a Spark Connect session instead: ``sc://host:port`` for a running
  server, or ``local[2]`` for one PySpark starts in the test process. The same
  tests then check that a job behaves the same over Connect.
- Markers: ``spark`` (the test uses Spark), ``slow_spark`` (a slow Spark
  test; deselect with ``-m "not slow_spark"``) and ``spark_classic`` (the test
  needs a classic session, e.g. it reads the JVM through py4j; skipped when
  ``spark`` is a Connect session).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--iterflow-remote",
        default=None,
        metavar="URL",
        help="make iterflow's `spark` fixture a Spark Connect session: sc://host:port, "
        "or local[N] for a server in the test process",
    )
    parser.addini(
        "iterflow_spark_remote",
        "Spark Connect URL of iterflow's `spark` fixture (empty: a classic session)",
        default="",
    )
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
    config.addinivalue_line(
        "markers",
        "spark_classic(reason): the test needs a classic session; skipped over Spark Connect",
    )


def spark_remote(config: pytest.Config) -> str | None:
    """The Spark Connect URL of the ``spark`` fixture, or None for a classic session."""
    return (
        config.getoption("--iterflow-remote") or str(config.getini("iterflow_spark_remote")) or None
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if spark_remote(config) is None:
        return
    for item in items:
        marker = item.get_closest_marker("spark_classic")
        if marker is not None:
            why = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"needs a classic session: {why}".rstrip(": ")))


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
            import iterflow as itf

            raise itf.IterflowValueError(
                f"iterflow_spark_conf: '{line}' is not a key=value line, e.g. "
                "spark.sql.adaptive.enabled=false"
            )
        conf[key.strip()] = value.strip()
    return str(config.getini("iterflow_spark_master")), conf


@pytest.fixture(scope="session")
def spark(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One SparkSession for the test run (see the module docstring), stopped at the end."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import iterflow as itf

    master, conf = spark_settings(pytestconfig)
    remote = spark_remote(pytestconfig)
    if remote is None:
        session = itf.session(master, app_name="iterflow-tests", conf=conf)
        session.sparkContext.setLogLevel("ERROR")
    else:
        session = connect_session(remote, conf)
    yield session
    session.stop()


def connect_session(remote: str, conf: dict[str, str]) -> Any:
    """A Spark Connect session on ``remote`` with the SQL settings of ``conf``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote).appName("iterflow-tests")
    settings = {key: value for key, value in conf.items() if key.startswith("spark.sql.")}
    if remote.startswith("local"):  # driver settings would only warn: the server has its own
        for key, value in settings.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    for key, value in settings.items():
        session.conf.set(key, value)
    return session
