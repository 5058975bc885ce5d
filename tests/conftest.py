"""The shared SparkSession comes from iterflow's pytest plugin (iterflow.testing.plugin),
registered when iterflow is installed: local[2], 4 shuffle partitions (pyproject.toml),
no UI, loopback only."""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
