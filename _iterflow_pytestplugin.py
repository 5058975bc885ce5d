"""iterflow's pytest plugin, registered through the ``pytest11`` entry point named
``iterflow``: installing iterflow is enough, and ``pytest -p no:iterflow`` turns it off.

It stays out of the way of projects that do not use it. It lives outside the ``iterflow``
package, so that pytest starts without importing iterflow or PySpark: at start it only
registers its options and markers; iterflow and PySpark are imported when a test first
asks for the ``iterflow_spark`` fixture.

- ``iterflow_spark``: one SparkSession for the whole test run, tuned for tests: a local
  master (``local[2]``), few shuffle partitions (2), no UI, loopback only, and Python
  workers running the test's interpreter. Settings come from the ini file
  (``iterflow_spark_master``, ``iterflow_shuffle_partitions``, ``iterflow_spark_conf`` with
  one ``key=value`` per line). Define your own ``iterflow_spark`` fixture in a
  ``conftest.py`` to replace it.
- ``--iterflow-remote URL`` (or the ini option ``iterflow_spark_remote``) makes
  ``iterflow_spark`` a Spark Connect session instead: ``sc://host:port`` for a running
  server, or ``local[2]`` for one PySpark starts in the test process.
- Markers: ``iterflow_spark`` (the test uses Spark; set on every test that uses the
  fixture), ``iterflow_slow`` (a slow Spark test; deselect with ``-m "not iterflow_slow"``)
  and ``iterflow_classic`` (the test needs a classic session, e.g. it reads the JVM through
  py4j; skipped when ``iterflow_spark`` is a Spark Connect session).

The names of iterflow 0.1 (the fixture ``spark``, the markers ``spark``, ``slow_spark``
and ``spark_classic``) stay as aliases for one release: the old fixture is the same session, and
a test marked with either name of a marker carries both, so ``-m slow_spark`` and
``-m iterflow_slow`` select the same tests. See docs/testing.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

#: marker -> (its name in iterflow 0.1, kept as an alias for one release; what it means).
MARKERS: dict[str, tuple[str, str]] = {
    "iterflow_spark": (
        "spark",
        "the test uses Spark (set on every test that uses the iterflow_spark fixture)",
    ),
    "iterflow_slow": ("slow_spark", "a slow Spark test; deselect with -m 'not iterflow_slow'"),
    "iterflow_classic": (
        "spark_classic",
        "the test needs a classic session, e.g. it reads the JVM through py4j; skipped over "
        "Spark Connect",
    ),
}

#: The Spark settings every session of the fixture has: tests need no UI and stay on loopback.
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("iterflow", "iterflow's Spark fixture (docs/testing.md)")
    group.addoption(
        "--iterflow-remote",
        default=None,
        metavar="URL",
        help="make the iterflow_spark fixture a Spark Connect session: sc://host:port, "
        "or local[N] for a server in the test process",
    )
    parser.addini(
        "iterflow_spark_remote",
        "Spark Connect URL of the iterflow_spark fixture (empty: a classic session)",
        default="",
    )
    parser.addini(
        "iterflow_spark_master", "Spark master of the iterflow_spark fixture", default="local[2]"
    )
    parser.addini(
        "iterflow_shuffle_partitions",
        "spark.sql.shuffle.partitions of the iterflow_spark fixture",
        default="2",
    )
    parser.addini(
        "iterflow_spark_conf",
        "more Spark settings of the iterflow_spark fixture, one key=value per line",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, (old, meaning) in MARKERS.items():
        argument = "(reason)" if name == "iterflow_classic" else ""
        config.addinivalue_line("markers", f"{name}{argument}: {meaning}")
        config.addinivalue_line(
            "markers", f"{old}{argument}: iterflow 0.1's name of {name}, kept for one release"
        )


def spark_remote(config: pytest.Config) -> str | None:
    """The Spark Connect URL of the ``iterflow_spark`` fixture, or None for a classic
    session."""
    return (
        config.getoption("--iterflow-remote") or str(config.getini("iterflow_spark_remote")) or None
    )


def _alias(item: pytest.Item, name: str, old: str) -> None:
    """Give ``item`` the marker it lacks of the pair (``name``, ``old``), with the same
    arguments, so that ``-m`` and ``get_closest_marker`` find it under both names."""
    new_marker, old_marker = item.get_closest_marker(name), item.get_closest_marker(old)
    if new_marker is not None and old_marker is None:
        item.add_marker(getattr(pytest.mark, old)(*new_marker.args, **new_marker.kwargs))
    elif old_marker is not None and new_marker is None:
        item.add_marker(getattr(pytest.mark, name)(*old_marker.args, **old_marker.kwargs))


# First: pytest's own hook deselects by -m, which must see both names of each marker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    remote = spark_remote(config)
    for item in items:
        if "iterflow_spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.iterflow_spark)
        for name, (old, _) in MARKERS.items():
            _alias(item, name, old)
        marker = item.get_closest_marker("iterflow_classic")
        if remote is not None and marker is not None:
            why = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"needs a classic session: {why}".rstrip(": ")))


def spark_settings(config: pytest.Config) -> tuple[str, dict[str, str]]:
    """The master and Spark settings of the ``iterflow_spark`` fixture, from the ini file."""
    conf = {
        "spark.sql.shuffle.partitions": str(config.getini("iterflow_shuffle_partitions")),
        **TEST_CONF,
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
def iterflow_spark(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One SparkSession for the test run, tuned for tests (see docs/testing.md), stopped
    at the end; a Spark Connect session with ``--iterflow-remote``."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Imported here, not at pytest start: a project that never asks for a session never
    # imports iterflow or PySpark.
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


@pytest.fixture(scope="session")
def spark(iterflow_spark: Any) -> Any:
    """iterflow 0.1's name of ``iterflow_spark``, kept for one release: the same session."""
    return iterflow_spark


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
