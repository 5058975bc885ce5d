"""An author's own iterative algorithm as a pyspark.ml Estimator (``IterativeEstimator``):
fitted against a numpy reference, in a Pipeline and a CrossValidator, saved and loaded,
warm-started, resumed from a checkpoint, logged to MLflow, and its errors."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import Evaluator
from pyspark.ml.feature import SQLTransformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.ml import IterativeEstimator, IterativeModel, MLError
from iterflow.progress import read_events

pytestmark = pytest.mark.spark

# The executors' Python workers cannot import this test module: its rounds travel by
# value (an author's module that the executors import, e.g. in a wheel, needs nothing).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ShrinkStep(itf.CombineFn):
    """A round of a damped mean: ``center`` moves ``rate`` of the way to the rows' mean;
    ``change`` is how far it moved, ``count`` the rows seen."""

    def __init__(self, learned, rate):
        self.center, self.rate = learned["center"], rate

    def create_accumulator(self):
        return np.zeros_like(self.center), 0

    def add_input(self, acc, batch):
        x = batch.column("x").to_numpy().reshape(-1, len(self.center))
        return acc[0] + x.sum(axis=0), acc[1] + len(x)

    def merge_accumulators(self, accs):
        return sum(a[0] for a in accs), sum(a[1] for a in accs)

    def extract_output(self, acc):
        moved = self.center + self.rate * (acc[0] / acc[1] - self.center)
        return {
            "center": moved,
            "change": float(np.abs(moved - self.center).max()),
            "count": acc[1],
        }


class ShrinkParams(Params):
    rate = Param(Params._dummy(), "rate", "the step toward the mean", TypeConverters.toFloat)

    def __init__(self):
        super().__init__()
        self._setDefault(rate=0.5)


class ShrinkModel(IterativeModel, ShrinkParams):
    def _transform(self, df):
        center = self.learned["center"].tolist()
        gap = sum((F.col("x")[i] - c) ** 2 for i, c in enumerate(center))
        return df.withColumn("distance", F.sqrt(gap))


class Shrink(IterativeEstimator, ShrinkParams):
    model_class = ShrinkModel
    converge_on = "change"

    def columns(self, dataset):
        return ["x"]

    def preparer(self, dataset):
        return lambda table: pa.table({"x": table["x"].combine_chunks().flatten()})

    def start(self, dataset):
        return {"center": np.zeros(2), "change": np.inf, "count": 0}

    def round(self, learned):
        return ShrinkStep(learned, self.getRate())


def reference(x: np.ndarray, rate: float, rounds: int, start=None) -> np.ndarray:
    center = np.zeros(2) if start is None else start
    for _ in range(rounds):
        center = center + rate * (x.mean(axis=0) - center)
    return center


@pytest.fixture(scope="module")
def rows(spark):
    rng = np.random.default_rng(5)
    x = rng.normal([3.0, -2.0], 1.0, (500, 2))
    return x, spark.createDataFrame(pa.table({"x": list(x)})).repartition(3).cache()


def test_an_authors_estimator_fits_as_its_numpy_reference(rows):
    x, df = rows
    model = Shrink(rate=0.5, maxIter=40, tol=1e-6).setIterationOptions(progress=False).fit(df)
    assert isinstance(model, ShrinkModel) and model.getRate() == 0.5
    assert model.termination.reason == "converged" and model.rounds < 40
    np.testing.assert_allclose(model.learned["center"], reference(x, 0.5, model.rounds), rtol=1e-12)
    assert model.learned["count"] == 500 and isinstance(model.learned["count"], int)
    # Every float learned value is a gauge of the round.
    assert model.history[-1].metrics["Shrink.change"] == pytest.approx(model.learned["change"])
    assert model.learned["change"] <= 1e-6 < model.history[-2].metrics["Shrink.change"]
    # Params: accessors, and the same MLError as the built-ins for an unknown one.
    assert Shrink().setRate(0.25).getRate() == 0.25 and Shrink().getMaxIter() == 100
    with pytest.raises(MLError, match=r"has no Param\(s\) \['rates'\]"):
        Shrink(rates=0.3)


def test_in_a_pipeline_saved_loaded_and_warm_started(rows, tmp_path):
    x, df = rows
    shrink = Shrink(rate=0.3, maxIter=5, tol=0.0).setIterationOptions(progress=False)
    pipeline = Pipeline(stages=[SQLTransformer(statement="SELECT * FROM __THIS__"), shrink])
    fitted = pipeline.fit(df)
    fitted.save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    model, again = fitted.stages[-1], loaded.stages[-1]
    assert isinstance(again, ShrinkModel) and again.getRate() == 0.3 and not again.hasSummary
    np.testing.assert_array_equal(again.learned["center"], model.learned["center"])
    scored = loaded.transform(df).select("x", "distance").collect()
    points = np.array([r["x"] for r in scored])
    np.testing.assert_allclose(
        [r["distance"] for r in scored], np.linalg.norm(points - model.learned["center"], axis=1)
    )

    # Five more rounds from the fitted model: as ten from the start.
    warm = shrink.copy().setInitialModel(model).fit(df)
    np.testing.assert_allclose(warm.learned["center"], reference(x, 0.3, 10), rtol=1e-12)
    # The Estimator saved with its initial model (an object) and loaded: the same start.
    shrink.copy().setInitialModel(model).save(str(tmp_path / "estimator"))
    reloaded = Shrink.load(str(tmp_path / "estimator"))
    assert reloaded.getRate() == 0.3
    again_warm = reloaded.setIterationOptions(progress=False).fit(df)
    np.testing.assert_allclose(again_warm.learned["center"], warm.learned["center"], rtol=1e-15)
    with pytest.raises(MLError, match="initialModel must be a ShrinkModel"):
        shrink.copy().setInitialModel(object()).fit(df)


class NegativeDistance(Evaluator):
    """Larger is better: minus the mean distance to the fitted center."""

    def _evaluate(self, dataset):
        return -dataset.agg(F.mean("distance")).first()[0]


def test_cross_validator_tunes_an_authors_param(rows):
    _, df = rows
    shrink = Shrink(maxIter=3, tol=0.0).setIterationOptions(progress=False)
    grid = ParamGridBuilder().addGrid(shrink.rate, [0.05, 0.9]).build()
    cv = CrossValidator(
        estimator=shrink, estimatorParamMaps=grid, evaluator=NegativeDistance(), numFolds=2
    )
    best = cv.fit(df).bestModel
    assert best.getRate() == 0.9  # 3 rounds of 0.05 stay far from the mean


def test_a_run_resumes_from_its_checkpoint(rows, tmp_path):
    _, df = rows

    def crash(end: itf.RoundEnd) -> None:
        if end.epoch == 3:
            raise RuntimeError("stopped on purpose")

    whole = Shrink(maxIter=8, tol=0.0).setIterationOptions(progress=False).fit(df)
    options = {"progress": False, "checkpoint_dir": str(tmp_path), "checkpoint_every": 1}
    with pytest.raises(itf.RoundError, match="epoch 3"):
        Shrink(maxIter=8, tol=0.0).setIterationOptions(listen=crash, **options).fit(df)
    resumed = Shrink(maxIter=8, tol=0.0).setIterationOptions(**options).fit(df)
    assert resumed.result.resumed_from is not None
    np.testing.assert_array_equal(resumed.learned["center"], whole.learned["center"])


def test_the_event_log_and_mlflow_get_the_estimators_params(rows, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    _, df = rows
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    log = tmp_path / "events.jsonl"
    with mlflow.start_run() as active:
        model = (
            Shrink(rate=0.4, maxIter=4, tol=0.0)
            .setIterationOptions(progress=False, mlflow=True, event_log=str(log))
            .fit(df)
        )
    started = [e for e in read_events(str(log)) if e["event"] == "iteration_started"]
    assert started[0]["iteration"] == "Shrink"
    assert started[0]["notes"]["params"]["rate"] == 0.4
    client = MlflowClient(tracking_uri=uri)
    params = client.get_run(active.info.run_id).data.params
    assert (params["estimator"], params["params.rate"], params["params.maxIter"]) == (
        "Shrink",
        "0.4",
        "4",
    )
    changes = sorted(
        (m.step, m.value) for m in client.get_metric_history(active.info.run_id, "Shrink.change")
    )
    assert [v for _, v in changes] == [p.metrics["Shrink.change"] for p in model.history]


class Missing(Shrink):
    def round(self, learned):
        step = ShrinkStep(learned, 0.5)
        step.extract_output = lambda acc: {"center": np.zeros(2)}  # no change, no count
        return step


def test_a_round_that_loses_a_learned_value_is_named(rows):
    _, df = rows
    with pytest.raises(
        MLError, match=r"ShrinkStep.extract_output lacks learned value\(s\) \['change', 'count'\]"
    ):
        Missing(maxIter=2).setIterationOptions(progress=False).fit(df)
