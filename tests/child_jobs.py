"""Jobs that tests run in a child process (a cluster master, a Spark Connect session):
starting the job's session there, and running a job script here for its JSON result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from iterflow.runtime.spark.session import embedded_session


def job_env() -> dict[str, str]:
    """The environment of a job's process: loopback only, workers on this interpreter."""
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def job_master(default: str) -> str | None:
    """The master a job asks for: ``default``, or None under spark-submit, whose master (and
    every setting) the job's session then takes."""
    return None if "PYSPARK_GATEWAY_PORT" in os.environ else default


def kill_when(command: list[str], ready: Callable[[], bool], *, after_s: float = 0.0) -> None:
    """Start ``command`` and SIGKILL it, with every process it started (its JVM, a
    spark-submit driver's Python), ``after_s`` seconds after ``ready()`` holds; it must still
    be running then."""
    child = subprocess.Popen(
        command,
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline and not ready():
        time.sleep(0.02)
    assert child.poll() is None, "the job ended before it could be killed"
    time.sleep(after_s)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert child.stderr is not None
    child.stderr.close()


def run_to_end(command: list[str]) -> None:
    """Run ``command`` (again) until it ends, successfully."""
    finished = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]


def run_job(script: Path, *args: str, timeout: int = 900) -> dict[str, Any]:
    """Run ``script`` with this interpreter; its last line of output is its JSON result."""
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=job_env(),
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


def job_command(job: Path, tmp_path: Path, *extra: str) -> list[str]:
    """``job INPUT CHECKPOINT SINKS OUT_JSON [extra...]`` with this interpreter, for the
    kill tests' jobs, their folders ``in``, ``ckpt``, ``sinks`` and ``out.json`` under
    ``tmp_path``."""
    folders = (str(tmp_path / name) for name in ("in", "ckpt", "sinks", "out.json"))
    return [sys.executable, str(job), *folders, *extra]


def epoch_committed(checkpoint: Path, epoch: int) -> Callable[[], bool]:
    """Whether the epoch log under ``checkpoint`` holds a commit of ``epoch`` or later."""
    return lambda: any(
        int(marker.parent.name.removeprefix("epoch-")) >= epoch
        for marker in (checkpoint / "epochs").glob("epoch-*/_COMMITTED")
    )
