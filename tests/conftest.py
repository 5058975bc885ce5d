"""One SparkSession for the whole test run: local[2], few shuffle partitions, no UI."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from iterflow.runtime.session import embedded_session

    session = embedded_session(
        "local[2]",
        app_name="iterflow-tests",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.enabled": "false",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
