"""``spark-submit`` (client mode) of scripts that call ``itf.session()``: the submission's
master, app name and settings win, and the examples run unchanged on ``local-cluster``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from child_jobs import job_env
from standalone import BIN

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
APP = """
import json
import iterflow as itf

spark = itf.session()
print(json.dumps({
    "master": spark.sparkContext.master,
    "app": spark.sparkContext.appName,
    "time_zone": spark.conf.get("spark.sql.session.timeZone"),
    "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
    "same": itf.session() is spark,
}))
"""


def spark_submit(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(BIN / "spark-submit"), *args],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_itf_session_takes_spark_submits_master_name_and_settings(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    stdout = spark_submit(
        "--master",
        "local[1]",
        "--name",
        "mine",
        "--conf",
        "spark.sql.session.timeZone=America/New_York",
        "--conf",
        "spark.ui.enabled=false",
        str(app),
    )
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out == {
        "master": "local[1]",
        "app": "mine",
        "time_zone": "America/New_York",
        "shuffle_partitions": "200",  # Spark's default: iterflow added nothing of its own
        "same": True,
    }


@pytest.mark.slow_spark
@pytest.mark.parametrize(
    ("example", "says"),
    [("connected_components.py", "\n3 criteria_empty\n"), ("kmeans.py", "rounds: converged\n")],
)
def test_an_example_runs_unchanged_under_spark_submit_on_local_cluster(
    example: str, says: str
) -> None:
    stdout = spark_submit(
        "--master",
        "local-cluster[2,1,1024]",
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.ui.enabled=false",
        str(EXAMPLES / example),
    )
    assert says in stdout
