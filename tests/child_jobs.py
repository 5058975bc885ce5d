"""Jobs that tests run in a child process (a cluster master, a Spark Connect session):
starting the job's session there, and running a job script here for its JSON result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from iterflow.runtime.session import embedded_session


def run_job(script: Path, *args: str, timeout: int = 900) -> dict[str, Any]:
    """Run ``script`` with this interpreter; its last line of output is its JSON result."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def job_session(master: str, app_name: str, **conf: str) -> SparkSession:
    """A job's classic session on ``master``: no UI, 4 shuffle partitions, 512m executors
    (``local-cluster`` starts them), errors-only logging; ``conf`` adds settings."""
    spark = embedded_session(
        master,
        app_name=app_name,
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.executor.memory": "512m",
            **conf,
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
