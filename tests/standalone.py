"""A Spark standalone cluster started by a test: a master and workers from the ``pyspark``
package's own launcher (``bin/spark-class``), secured with ``spark.authenticate`` and
``spark.network.crypto.enabled``, and ``spark-submit`` (client mode) against it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import pyspark
from child_jobs import job_env

BIN = Path(pyspark.__file__).resolve().parent / "bin"
#: How long the master and its workers may take to come up.
START_S = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Standalone:
    """A running standalone cluster: ``url`` of its master, ``settings`` every application
    must use (the shared authentication secret among them), ``submit`` to run a job."""

    def __init__(self, root: Path, url: str, settings: dict[str, str]) -> None:
        self.root = root
        self.url = url
        self.settings = settings

    def submit_command(self, script: Path, *args: str, **conf: str) -> list[str]:
        """``spark-submit`` of ``script`` (client mode) to this cluster, with its settings
        and ``conf`` (dots written as ``__``: ``spark__ui__enabled="false"``)."""
        settings = {**self.settings, **{k.replace("__", "."): v for k, v in conf.items()}}
        options = [item for key, value in settings.items() for item in ("--conf", f"{key}={value}")]
        return [str(BIN / "spark-submit"), "--master", self.url, *options, str(script), *args]

    def submit(self, script: Path, *args: str, timeout: float = 900, **conf: str) -> str:
        """Run ``script`` to its end on this cluster; its standard output."""
        command = self.submit_command(script, *args, **conf)
        done = subprocess.run(
            command, env=job_env(), capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout


def _daemon(command: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            list(command),
            env=job_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as page:
            return int(json.load(page).get("aliveworkers", 0))
    except OSError:
        return 0


@contextmanager
def standalone_cluster(
    root: Path, workers: int = 2, cores: int = 2, memory: str = "1g"
) -> Iterator[Standalone]:
    """A master and ``workers`` workers of ``cores`` cores on loopback, with Spark's
    authentication and network encryption on; stopped (process groups killed) on exit."""
    root.mkdir(parents=True, exist_ok=True)
    settings = {
        "spark.authenticate": "true",
        "spark.authenticate.secret": secrets.token_hex(16),
        "spark.network.crypto.enabled": "true",
    }
    properties = root / "spark.properties"
    properties.write_text("".join(f"{key} {value}\n" for key, value in settings.items()))
    port, ui_port = free_port(), free_port()
    spark_class = str(BIN / "spark-class")
    daemons = [
        _daemon(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
                "--properties-file",
                str(properties),
            ],
            root / "master.log",
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    try:
        for i in range(workers):
            work = root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            daemons.append(
                _daemon(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--webui-port",
                        "0",
                        "--work-dir",
                        str(work),
                        "--properties-file",
                        str(properties),
                        url,
                    ],
                    root / f"worker-{i}.log",
                )
            )
        deadline = time.monotonic() + START_S
        while _alive_workers(ui_port) < workers:
            assert time.monotonic() < deadline, (root / "master.log").read_text()[-3000:]
            assert all(d.poll() is None for d in daemons), "a cluster daemon exited"
            time.sleep(0.5)
        yield Standalone(root, url, settings)
    finally:
        for daemon in daemons:
            with suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
