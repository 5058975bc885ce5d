"""The shared SparkSession comes from iterflow's pytest plugin (the module
_iterflow_pytestplugin), registered when iterflow is installed: local[2], 4 shuffle
partitions (pyproject.toml), no UI, loopback only. The suite's tests still use the plugin's
names of iterflow 0.1 (the ``spark`` fixture, the ``slow_spark``, ``spark`` and
``spark_classic`` markers), which it keeps as aliases: ``-m slow_spark`` and
``-m iterflow_slow`` select the same tests."""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cluster: runs on cluster-shaped Spark (local-cluster, a standalone master with "
        "workers, spark-submit); `bash run.sh test --cluster` runs them all, slow ones included",
    )
