"""iterflow on a Spark standalone cluster that the test starts: a master and two workers of
two cores, from the pyspark package's own launcher, with ``spark.authenticate`` and
``spark.network.crypto.enabled`` on. Jobs are submitted with ``spark-submit`` (client mode):
resident rounds over the TLS data plane, a checkpointed run killed and resumed, and an
unbounded iteration killed mid-stream and restarted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from child_jobs import epoch_committed, kill_when, run_to_end
from iteration_kill_job import SINK_ROUNDS, sink_rows
from standalone import standalone_cluster
from test_unbounded import write_numbers
from test_unbounded_kill import FILES, assert_each_row_once

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

HERE = Path(__file__).resolve().parent
ROWS = 200_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with standalone_cluster(tmp_path_factory.mktemp("standalone")) as running:
        yield running


def test_a_submitted_job_runs_resident_over_tls_on_a_secured_cluster(cluster) -> None:
    stdout = cluster.submit(
        HERE / "cluster_standalone_job.py",
        spark__app__name="secured-resident",
        spark__executor__memory="512m",
        spark__ui__enabled="false",
        # one resident task stays per executor registered at load: wait for both workers'
        spark__cores__max="4",
        spark__scheduler__minRegisteredResourcesRatio="1.0",
    )
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["master"] == cluster.url and out["app"] == "secured-resident"
    assert out["authenticate"] == "true" and out["crypto"] == "true"
    assert out["shuffle_partitions"] == "200"  # Spark's own: nothing of iterflow's added
    assert out["location"].startswith("grpc+tls://")
    assert out["resident"] == [True] * 3 and out["tasks"] == 2 and out["executors"] == 2
    assert out["kernel_rows"] == [ROWS] * 3
    assert out["total"] == float(sum(range(ROWS)))
    # a combine along the two tasks' tree (TLS between executors): the driver's bytes are
    # the model and the result only, and every round's result is the one through the driver
    tree, driver = out["exchange"]["tree"], out["exchange"]["driver"]
    assert tree["tree"] == [True] * 4 and driver["tree"] == [False] * 4
    assert tree["digests"] == driver["digests"]
    assert all(4_000_000 < b < 4_020_000 for b in tree["bytes_per_round"])
    assert all(b > 4 * 2_000_000 for b in driver["bytes_per_round"])


@pytest.mark.slow_spark
def test_a_submitted_run_killed_after_a_checkpoint_resumes_with_every_epoch_once(
    cluster, spark, tmp_path: Path
) -> None:
    command = cluster.submit_command(
        HERE / "iteration_kill_job.py", "sink", str(tmp_path), spark__executor__memory="512m"
    )
    out = tmp_path / "out"
    kill_when(
        command,
        lambda: (
            (tmp_path / "ckpt" / "epoch-00000012" / "_COMMITTED").exists()
            and (out / "epoch=14" / "_SUCCESS").exists()
        ),
    )
    assert not (tmp_path / "result.json").exists()
    run_to_end(command)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"rounds": SINK_ROUNDS, "resumed_from": 12}
    rows = sorted((r["epoch"], r["id"], r["v"]) for r in spark.read.parquet(str(out)).collect())
    assert rows == sink_rows(SINK_ROUNDS)


@pytest.mark.slow_spark
def test_a_submitted_stream_killed_mid_stream_restarts_exactly_once(
    cluster, spark, tmp_path: Path
) -> None:
    write_numbers(tmp_path / "in", FILES)
    folders = (str(tmp_path / name) for name in ("in", "ckpt", "sinks", "out.json"))
    command = cluster.submit_command(
        HERE / "unbounded_kill_job.py", *folders, spark__executor__memory="512m"
    )
    kill_when(command, epoch_committed(tmp_path / "ckpt", 4), after_s=0.15)
    run_to_end(command)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["termination"] == "inputs_ended" and out["resumed_from"] is not None
    totals = assert_each_row_once(spark, tmp_path / "sinks", FILES)
    assert [tuple(t) for t in out["totals"]] == totals[out["resumed_from"] + 1 :]
