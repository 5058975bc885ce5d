"""MlflowSink on real runs, read back through MLflow's own client from a local file store."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402 (only once mlflow is known to be there)
from test_sinks import closed_port  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file store of the test's own; MLflow 3 takes one only when allowed to."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def halving(prefix: str) -> itf.IterationBody:
    """Halves every v each round until the largest is at most 0.1, recording a counter,
    a gauge and a distribution on the driver."""
    added = itf.metrics.counter(f"{prefix}.added")
    scale = itf.metrics.gauge(f"{prefix}.scale")
    sizes = itf.metrics.distribution(f"{prefix}.sizes")

    @itf.body
    def halve(v: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        added.inc(ctx.epoch + 1)
        scale.set(0.5**ctx.epoch)
        sizes.update(ctx.epoch)
        sizes.update(2 * ctx.epoch + 1)
        half = v.select((F.col("v") / 2).alias("v"))
        return itf.Declaration(
            feedback={"v": half},
            outputs={"half": half},
            until=itf.converged(half.agg(F.max("v")), tol=0.1),
        )

    return halve


def start_values(spark: SparkSession) -> DataFrame:
    # Round k makes the largest value 3 / 2**(k + 1), at most 0.1 from round 4: five rounds.
    return spark.createDataFrame([(1.0,), (2.0,), (3.0,)], "v double")


def points(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of every point MLflow holds for ``key``, in step order."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_sink_writes_one_point_per_round_to_the_active_run(
    spark: SparkSession, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    param_batches: list[Any] = []
    log_batch = MlflowClient.log_batch

    def counting_log_batch(self: MlflowClient, run_id: str, **entities: Any) -> Any:
        if entities.get("params"):
            param_batches.append(entities["params"])
        return log_batch(self, run_id, **entities)

    monkeypatch.setattr(MlflowClient, "log_batch", counting_log_batch)
    with mlflow.start_run() as active:
        # Pushes every 0.2 s: several during the run, each with the rounds since the last.
        result = (
            itf.BoundedIteration(halving("h"))
            .bind("v", start_values(spark))
            .push_metrics(itf.metrics.MlflowSink(), every_s=0.2)
            .run(progress=False)
        )
    run_id = active.info.run_id
    client = MlflowClient(tracking_uri=tracking_uri)
    assert result.rounds == 5 and result.termination.reason == "converged"
    epochs = [p.epoch for p in result.history]
    assert epochs == list(range(5))

    def expect(key: str, values: list[float]) -> None:
        assert points(client, run_id, key) == list(zip(epochs, values, strict=True)), key

    expect("h.added", [float(e + 1) for e in epochs])
    expect("h.scale", [0.5**e for e in epochs])
    expect("h.sizes.count", [2.0] * 5)
    expect("h.sizes.sum", [float(3 * e + 1) for e in epochs])
    expect("h.sizes.min", [float(e) for e in epochs])
    expect("h.sizes.max", [float(2 * e + 1) for e in epochs])
    expect("h.sizes.mean", [(3 * e + 1) / 2 for e in epochs])
    # The same figures as the run's own history, and its built-in ones.
    for name in ("h.added", "h.scale"):
        expect(name, [float(p.metrics[name]) for p in result.history])
    expect("iterflow.converged_value", [p.converged_value for p in result.history])
    expect("iterflow.converged_value", [3.0 / 2 ** (e + 1) for e in epochs])
    expect("iterflow.duration_s", [p.duration_s for p in result.history])
    expect("iterflow.rows.v", [3.0] * 5)
    expect("iterflow.rows.half", [3.0] * 5)

    assert len(param_batches) == 1  # the parameters went once, in one request
    params = client.get_run(run_id).data.params
    assert params["iterflow.iteration"] == "halve"
    assert json.loads(params["iterflow.inputs.v"]) == {"replay": False, "schema": "v DOUBLE"}
    assert json.loads(params["iterflow.conditions"]) == []  # the body's own: none static
    assert len(params["iterflow.run_id"]) == 12


def test_without_an_active_run_the_sink_creates_and_ends_one_per_run(
    spark: SparkSession, tracking_uri: str
) -> None:
    sink = itf.metrics.MlflowSink(tracking_uri=tracking_uri, prefix="first/")
    it = (
        itf.BoundedIteration(halving("c"))
        .bind("v", start_values(spark))
        .until(itf.max_rounds(3))
        .push_metrics(sink, every_s=60)
    )
    results = [it.run(progress=False), it.run(progress=False)]
    assert len(sink.runs) == 2 and len(set(sink.runs.values())) == 2
    client = MlflowClient(tracking_uri=tracking_uri)
    for run_id in sink.runs.values():
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.info.run_name == "halve"
        # '/' is no part of an MLflow key: the prefix keeps its place with '_'.
        assert points(client, run_id, "first_c.added") == [(0, 1.0), (1, 2.0), (2, 3.0)]
        conditions = json.loads(run.data.params["first_iterflow.conditions"])
        assert conditions == [{"kind": "max_rounds", "n": 3}]
    assert [r.rounds for r in results] == [3, 3]


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://127.0.0.1:{port}", "http://127.0.0.1:{port}"),
        # Credentials stay out of the name, and out of MLflow's errors, which quote the URI.
        ("http://alice:s3cret@127.0.0.1:{port}/mlflow", "http://***@127.0.0.1:{port}/mlflow"),
    ],
)
def test_a_refused_tracking_server_neither_fails_nor_stalls_the_run(
    spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    uri: str,
    shown: str,
) -> None:
    # The sink's thread, still retrying when the test ends, gives up soon after.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    port = closed_port()
    uri, shown = uri.format(port=port), shown.format(port=port)
    sink = itf.metrics.MlflowSink("0" * 32, tracking_uri=uri, timeout_s=1.0)
    assert sink.name == f"mlflow {shown}"
    it = (
        itf.BoundedIteration(halving("r"))
        .bind("v", start_values(spark))
        .until(itf.max_rounds(2))
        .push_metrics(sink, every_s=60)
    )
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="iterflow.metrics"),
        pytest.warns(itf.IterflowWarning, match="did not receive the final push") as warned,
    ):
        result = it.run(progress=False)
    # MLflow retries a refused connection for minutes; the run waits one timeout_s.
    assert time.monotonic() - started < 30
    assert result.rounds == 2
    assert f"metrics sink 'mlflow {shown}' failed" in caplog.text
    [final] = [str(w.message) for w in warned if "final push" in str(w.message)]
    assert final.startswith(f"metrics sink 'mlflow {shown}'")
    assert "the rounds of epochs 0-1 did not reach it" in final
    said = caplog.text + final
    assert f"{shown}/api/" in said  # MLflow's error, naming the URI it called
    assert "alice" not in said and "s3cret" not in said


@pytest.fixture
def no_private_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's private way to the current experiment raises, as it may in any release."""
    import mlflow.tracking.fluent

    def private(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("MlflowSink called MLflow's private _get_experiment_id")

    monkeypatch.setattr(mlflow.tracking.fluent, "_get_experiment_id", private)
    # What mlflow.set_experiment changes in the process is put back after the test.
    monkeypatch.setattr(mlflow.tracking.fluent, "_active_experiment_id", None)
    for name in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def created_run_experiment(spark: SparkSession, tracking_uri: str) -> str:
    """The name of the experiment of the MLflow run the sink creates for one run."""
    sink = itf.metrics.MlflowSink(tracking_uri=tracking_uri)
    (
        itf.BoundedIteration(halving("e"))
        .bind("v", start_values(spark))
        .until(itf.max_rounds(1))
        .push_metrics(sink, every_s=60)
        .run(progress=False)
    )
    client = MlflowClient(tracking_uri=tracking_uri)
    [run_id] = sink.runs.values()
    return str(client.get_experiment(client.get_run(run_id).info.experiment_id).name)


@pytest.mark.usefixtures("no_private_mlflow")
@pytest.mark.parametrize("chosen_by", ["set_experiment", "MLFLOW_EXPERIMENT_NAME", "default"])
def test_a_created_run_goes_to_the_experiment_the_user_chose(
    spark: SparkSession, tracking_uri: str, monkeypatch: pytest.MonkeyPatch, chosen_by: str
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    if chosen_by == "set_experiment":
        client.create_experiment("decoy")  # another experiment the name must not confuse
        mlflow.set_experiment("chosen in code")
        expected = "chosen in code"
    elif chosen_by == "MLFLOW_EXPERIMENT_NAME":
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "chosen by name")  # created on first use
        expected = "chosen by name"
    else:
        expected = "Default"  # experiment "0"
    assert created_run_experiment(spark, tracking_uri) == expected


@pytest.mark.usefixtures("no_private_mlflow")
def test_the_experiment_id_variable_chooses_the_experiment(
    spark: SparkSession, tracking_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment_id = MlflowClient(tracking_uri=tracking_uri).create_experiment("chosen by id")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", experiment_id)
    assert created_run_experiment(spark, tracking_uri) == "chosen by id"


def test_without_the_extra_the_sink_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    with pytest.raises(itf.IterflowError, match=r"pip install 'iterflow\[mlflow\]'"):
        itf.metrics.MlflowSink()
