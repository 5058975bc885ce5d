"""Gaussian mixtures by expectation-maximization, as MLlib's ``GaussianMixture`` fits them:
an ``IterativeEstimator`` (``iterflow.ml.iterative``).

The learned values are the mixture (``weights`` (k,), ``means`` (k, d), ``covs``
(k, d, d)), the log-likelihood of the rows under the mixture the round started from,
and ``change``, how much that log-likelihood moved. Each round is one ``CombineFn``
(``ExpectationStep``): per batch of rows, numpy computes every row's responsibilities
and adds up, per component, their weight, the weighted sum of the rows and of their
outer products, and the log-likelihood; ``extract_output`` is the M-step.

As MLlib: a component's density is ``EPSILON + weight * pdf`` (``EPSILON`` is the
machine epsilon), the pdf uses the pseudo-inverse and pseudo-determinant of the
covariance (eigenvalues above ``EPSILON * max * d``), the start is MLlib's (uniform
weights over k groups of 5 rows drawn with replacement with ``seed``; on a classic
session drawn by the JVM exactly as MLlib draws them, so the same ``seed`` starts both
at the same mixture), and the run stops when the log-likelihood changed by at most
``tol`` (MLlib's default 0.01), or after ``maxIter`` rounds.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import DenseMatrix, DenseVector, MatrixUDT, Vectors, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasSeed,
    HasWeightCol,
)
from pyspark.ml.stat import MultivariateGaussian
from pyspark.mllib import linalg as mllib_linalg
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StructField, StructType

import iterflow as itf
from iterflow.ml.features import (
    Features,
    block_rows,
    features_of,
    matrix,
    used_rows,
    vectors_as_arrays,
)
from iterflow.ml.iterative import IterativeEstimator, IterativeModel, Learned
from iterflow.ml.kmeans import feature_matrix, points_of
from iterflow.ml.params import MLParams, keyword_params, param, weight_column
from iterflow.ml.training import MLError, added

#: MLlib's ``MLUtils.EPSILON``: the machine epsilon of doubles.
EPSILON = float(np.finfo(np.float64).eps)
#: The gauge of every round's log-likelihood (``IterativeEstimator``'s naming).
GAUGE = "GaussianMixture.logLikelihood"
#: Rows drawn per component for the start, as MLlib.
SAMPLES_PER_COMPONENT = 5


class GaussianMixtureParams(
    MLParams, HasFeaturesCol, HasPredictionCol, HasProbabilityCol, HasWeightCol, HasSeed
):
    """The Params of ``GaussianMixture`` and its model, as MLlib names them."""

    k: Param[int] = param(
        Params._dummy(), "k", "the number of components (> 1)", TypeConverters.toInt
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(k=2, seed=0)

    def getK(self) -> int:
        return int(self.getOrDefault(self.k))


@attrs.frozen
class Components:
    """A mixture's components, ready to score rows: each one's weight, the pseudo-inverse
    square roots of the covariances side by side (``stacked``, (d, k*d): a component's
    root padded with zero columns where its covariance is singular), the means through
    them (``offsets``, (k*d,)) and each log-normalizing constant. One matrix product then
    scales the rows for every component at once."""

    weights: np.ndarray
    stacked: np.ndarray
    offsets: np.ndarray
    constants: np.ndarray

    @classmethod
    def of(cls, weights: np.ndarray, means: np.ndarray, covs: np.ndarray) -> Components:
        k, d = means.shape
        stacked, constants = np.zeros((d, k * d)), []
        for i, cov in enumerate(covs):
            values, vectors = np.linalg.eigh(cov)
            tol = EPSILON * float(values.max(initial=0.0)) * len(values)
            kept = values > tol
            stacked[:, i * d : i * d + int(kept.sum())] = vectors[:, kept] / np.sqrt(values[kept])
            constants.append(-0.5 * (d * np.log(2 * np.pi) + float(np.log(values[kept]).sum())))
        offsets = np.einsum("ki,kij->kj", means, stacked.reshape(d, k, d).transpose(1, 0, 2))
        return cls(weights, stacked, offsets.ravel(), np.array(constants))

    def joint(self, x: np.ndarray) -> np.ndarray:
        """``EPSILON + weight * pdf`` of every row (rows) and component (columns)."""
        k = len(self.weights)
        scaled = (x @ self.stacked - self.offsets).reshape(len(x), k, -1)
        log_pdf = self.constants - 0.5 * np.einsum("nkd,nkd->nk", scaled, scaled)
        return EPSILON + self.weights * np.exp(log_pdf)


class ExpectationStep(itf.CombineFn):
    """The E-step over a batch of prepared rows (``x`` and, when weighted, ``v``): per
    component the responsibilities' weight, the weighted sum of the rows and of their
    outer products, and the log-likelihood. ``extract_output`` is the M-step."""

    def __init__(self, learned: Learned) -> None:
        self.weights = np.asarray(learned["weights"], dtype=np.float64)
        self.means = np.asarray(learned["means"], dtype=np.float64)
        self.covs = np.asarray(learned["covs"], dtype=np.float64)
        self.previous = float(learned["logLikelihood"])
        self.components = Components.of(self.weights, self.means, self.covs)

    def create_accumulator(self) -> tuple[Any, ...]:
        k, d = self.means.shape
        return np.zeros(k), np.zeros((k, d)), np.zeros((k, d, d)), 0.0

    def add_input(self, acc: tuple[Any, ...], batch: pa.RecordBatch) -> tuple[Any, ...]:
        totals, sums, squares = (part.copy() for part in acc[:3])
        likelihood = acc[3]
        k, d = self.means.shape
        x, v = points_of(batch, d)
        # Block by block: a block's rows, scores and weighted rows stay in the cache.
        step = block_rows(2 * k * d + d)
        for start in range(0, len(x), step):
            xs = x[start : start + step]
            joint = self.components.joint(xs)
            probability = joint.sum(axis=1)
            share = joint / probability[:, None]
            logs = np.log(probability)
            if v is not None:
                vs = v[start : start + step]
                share *= vs[:, None]
                likelihood += float(logs @ vs)
            else:
                likelihood += float(logs.sum())
            totals += share.sum(axis=0)
            sums += share.T @ xs
            # Every component's weighted outer products in one matrix product.
            weighted = (share[:, :, None] * xs[:, None, :]).reshape(len(xs), k * d)
            squares += (weighted.T @ xs).reshape(k, d, d)
        return totals, sums, squares, likelihood

    def merge_accumulators(self, accs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        return added(self.create_accumulator(), accs)

    def extract_output(self, acc: tuple[Any, ...]) -> dict[str, Any]:
        totals, sums, squares, likelihood = acc
        if not totals.sum() > 0:
            raise MLError("GaussianMixture has no rows to fit (empty, or every weight 0)")
        with np.errstate(divide="ignore", invalid="ignore"):
            means = sums / totals[:, None]
            covs = squares / totals[:, None, None] - np.einsum("ki,kj->kij", means, means)
        return {
            "weights": totals / totals.sum(),
            "means": means,
            "covs": covs,
            "logLikelihood": likelihood,
            "change": abs(likelihood - self.previous),
        }


class GaussianMixtureSummary:
    """MLlib's ``GaussianMixtureSummary``: ``logLikelihood`` (of the rows under the
    mixture the last round started from), ``k``, ``numIter``, ``clusterSizes``,
    ``predictions``, ``probability``, ``cluster``; with iterflow's run (``result``)."""

    def __init__(self, model: GaussianMixtureModel) -> None:
        self.model = model
        self.result = model.fitted_result
        self.logLikelihood = float(model.learned["logLikelihood"])
        self.k = len(model.weights)
        self.numIter = int(self.result.rounds)
        self.objectiveHistory = [
            float(p.metrics[GAUGE]) for p in self.result.history if GAUGE in p.metrics
        ]

    @functools.cached_property
    def predictions(self) -> DataFrame:
        if self.model.training is None:
            raise MLError("this summary has no training rows")
        return self.model.transform(self.model.training)

    @property
    def probability(self) -> DataFrame:
        return self.predictions.select(self.model.getProbabilityCol())

    @property
    def cluster(self) -> DataFrame:
        return self.predictions.select(self.model.getPredictionCol())

    @functools.cached_property
    def clusterSizes(self) -> list[int]:
        column = self.model.getPredictionCol()
        sizes = [0] * self.k
        for row in self.predictions.groupBy(column).count().collect():
            sizes[row[0]] = int(row[1])
        return sizes


class GaussianMixtureModel(IterativeModel, GaussianMixtureParams):
    """A fitted Gaussian mixture: ``weights``, ``gaussians`` (MLlib's
    ``MultivariateGaussian``s), ``gaussiansDF``; ``transform`` adds ``probabilityCol``
    (a Vector of the components' probabilities) and ``predictionCol`` (the most probable
    component, INT). Saved, it loads with MLlib's
    ``pyspark.ml.clustering.GaussianMixtureModel``, and this class loads MLlib's."""

    mllib_class = "pyspark.ml.clustering.GaussianMixtureModel"

    @property
    def weights(self) -> list[float]:
        return [float(w) for w in self.learned["weights"]]

    @property
    def gaussians(self) -> list[MultivariateGaussian]:
        return [
            MultivariateGaussian(DenseVector(mean), _matrix(cov))
            for mean, cov in zip(self.learned["means"], self.learned["covs"], strict=True)
        ]

    @property
    def gaussiansDF(self) -> DataFrame:
        rows = [(g.mean, g.cov) for g in self.gaussians]
        schema = StructType([StructField("mean", VectorUDT()), StructField("cov", MatrixUDT())])
        return SparkSession.active().createDataFrame(rows, schema)

    @property
    def summary(self) -> GaussianMixtureSummary:
        return GaussianMixtureSummary(self)

    def _components(self) -> Components:
        learned = self.learned
        return Components.of(
            np.asarray(learned["weights"]), np.asarray(learned["means"]), learned["covs"]
        )

    def predictProbability(self, value: Any) -> DenseVector:
        joint = self._components().joint(_point(value))[0]
        return Vectors.dense(joint / joint.sum())

    def predict(self, value: Any) -> Any:
        """One point: its most probable component. A DataFrame: ``transform``."""
        if isinstance(value, DataFrame):
            return self.transform(value)
        return int(np.argmax(self.predictProbability(value).toArray()))

    def _transform(self, dataset: DataFrame) -> DataFrame:
        components = self._components()
        spec = features_of(dataset, self.getFeaturesCol(), "GaussianMixtureModel")
        probability, prediction = self.getProbabilityCol(), self.getPredictionCol()
        scratch = "__iterflow_probability"
        schema = StructType(
            [
                *dataset.schema.fields,
                StructField(scratch, ArrayType(DoubleType())),
                StructField(prediction, IntegerType()),
            ]
        )

        def score(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                joint = components.joint(matrix(pa.Table.from_batches([batch]), spec))
                shares = joint / joint.sum(axis=1, keepdims=True)
                chosen = np.argmax(shares, axis=1).astype(np.int32)
                cells = pa.FixedSizeListArray.from_arrays(pa.array(shares.ravel()), shares.shape[1])
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, cells.cast(pa.list_(pa.float64())), pa.array(chosen)],
                    names=[*batch.schema.names, scratch, prediction],
                )

        scored = dataset.mapInArrow(score, schema)
        return scored.withColumn(probability, array_to_vector(F.col(scratch))).drop(scratch)

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        # MLlib saves a mixture's means and covariances as the RDD API's (pyspark.mllib)
        # vectors and matrices, and reads them back as those.
        schema = StructType(
            [
                StructField("weights", ArrayType(DoubleType())),
                StructField("mus", ArrayType(mllib_linalg.VectorUDT())),
                StructField("sigmas", ArrayType(mllib_linalg.MatrixUDT())),
            ]
        )
        mus = [mllib_linalg.DenseVector(mean) for mean in self.learned["means"]]
        sigmas = [
            mllib_linalg.DenseMatrix(len(cov), len(cov), np.asarray(cov).T.ravel().tolist())
            for cov in self.learned["covs"]
        ]
        return spark.createDataFrame([(self.weights, mus, sigmas)], schema)

    def _extra(self) -> dict[str, Any]:
        return {"logLikelihood": float(self.learned.get("logLikelihood", float("nan")))}

    def _restore_extra(self, extra: Mapping[str, Any]) -> None:
        self._loglik = float(extra.get("logLikelihood", float("nan")))

    def _restore_data(self, rows: list[Row]) -> None:
        row = rows[0]
        self.learned = {
            "weights": np.asarray(row["weights"], dtype=np.float64),
            "means": np.array([m.toArray() for m in row["mus"]]),
            "covs": np.array([s.toArray() for s in row["sigmas"]]),
            "logLikelihood": getattr(self, "_loglik", float("nan")),
            "change": float("nan"),
        }


def _matrix(cov: np.ndarray) -> DenseMatrix:
    d = cov.shape[0]
    return DenseMatrix(d, d, np.asarray(cov).T.ravel().tolist())


def _point(value: Any) -> np.ndarray:
    return np.asarray(value.toArray() if hasattr(value, "toArray") else value, float)[None, :]


class GaussianMixture(IterativeEstimator, GaussianMixtureParams):
    """Gaussian mixtures by EM as a ``pyspark.ml`` Estimator, with MLlib's Params and
    defaults (``k=2``, ``maxIter=100``, ``tol=0.01``) and its start (``seed``), or
    ``initialModel`` (iterflow's or MLlib's ``GaussianMixtureModel``). See the module
    docstring; ``gaussian_mixture()`` is the short form.

    Example::

        model = GaussianMixture(k=3, seed=1).fit(df)   # "features": a Vector column
        model.weights, model.gaussians, model.summary.logLikelihood
    """

    model_class = GaussianMixtureModel
    converge_on = "change"
    metrics_prefix = "GaussianMixture"

    @keyword_params
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        weightCol: str | None = None,
        k: int = 2,
        maxIter: int = 100,
        seed: int = 0,
        tol: float = 0.01,
        initialModel: Any = None,
    ) -> None:
        super().__init__()
        self._setDefault(tol=0.01)

    def _spec(self, dataset: DataFrame) -> Features:
        if self.getK() < 2:
            raise MLError(f"GaussianMixture(k={self.getK()}) needs k >= 2 (as MLlib)")
        return features_of(dataset, self.getFeaturesCol(), "GaussianMixture")

    def columns(self, dataset: DataFrame) -> list[str]:
        return [c for c in (self.getFeaturesCol(), weight_column(self)) if c is not None]

    def rows(self, dataset: DataFrame) -> DataFrame:
        return vectors_as_arrays(super().rows(dataset), self._spec(dataset))

    def preparer(self, dataset: DataFrame) -> Callable[[pa.Table], pa.Table]:
        return feature_matrix(self._spec(dataset), weight_column(self))

    def start(self, dataset: DataFrame) -> Learned:
        spec = self._spec(dataset)
        rows = used_rows(dataset, self.columns(dataset), "GaussianMixture")
        points, weights = mllib_sample(rows, spec, weight_column(self), self.getK(), self.getSeed())
        return mllib_start(points, weights, self.getK())

    def round(self, learned: Learned) -> itf.CombineFn:
        return ExpectationStep(learned)

    def warm_start(self, model: Any, dataset: DataFrame) -> Learned:
        weights = np.asarray(model.weights, dtype=np.float64)
        means = np.array([np.asarray(g.mean.toArray()) for g in model.gaussians])
        covs = np.array([g.cov.toArray() for g in model.gaussians])
        if self.isSet(self.k) and len(weights) != self.getK():
            raise MLError(
                f"GaussianMixture(k={self.getK()}): the initialModel has {len(weights)} components"
            )
        return {
            "weights": weights,
            "means": means,
            "covs": covs,
            "logLikelihood": -sys.float_info.max,
            "change": sys.float_info.max,
        }

    def _fit(self, dataset: DataFrame) -> GaussianMixtureModel:
        model = super()._fit(dataset)
        assert isinstance(model, GaussianMixtureModel)
        return model._set(k=len(model.weights))  # an initialModel's k when k is unset


def mllib_sample(
    rows: DataFrame, spec: Features, weight: str | None, k: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``k * 5`` rows drawn with replacement with ``seed`` (``itf.take_sample``: on a
    classic session what MLlib's ``GaussianMixture`` draws), as points and weights."""
    wanted = k * SAMPLES_PER_COMPONENT
    columns = [spec.as_array().alias("x"), (F.col(weight) if weight else F.lit(1.0)).alias("v")]
    drawn = itf.take_sample(rows.select(*columns), wanted, seed, with_replacement=True)
    pairs = [(list(r["x"]), float(r["v"])) for r in drawn]
    if not pairs:
        raise MLError("GaussianMixture needs at least one row (the DataFrame is empty)")
    if any(None in x for x, _ in pairs):
        raise MLError(f"feature column(s) {list(spec.columns)}: a row has a null value")
    points = np.array([x for x, _ in pairs], dtype=np.float64).reshape(-1, spec.dims)
    if not np.isfinite(points).all():
        raise MLError(f"feature column(s) {list(spec.columns)}: a row has a NaN or infinite value")
    while len(points) < wanted:  # fewer rows than wanted (Connect's draw): repeat them
        points = np.concatenate([points, points])[:wanted]
        pairs = (pairs * 2)[:wanted]
    return points[:wanted], np.array([v for _, v in pairs[:wanted]])


def mllib_start(points: np.ndarray, weights: np.ndarray, k: int) -> dict[str, Any]:
    """MLlib's start from the drawn rows: component i takes rows ``5i .. 5i+4``: its
    weight is their share of the weight, its mean their weighted mean and its covariance
    diagonal, their weighted (biased) variances."""
    d = points.shape[1]
    share, means, covs = np.zeros(k), np.zeros((k, d)), np.zeros((k, d, d))
    for i in range(k):
        rows = slice(i * SAMPLES_PER_COMPONENT, (i + 1) * SAMPLES_PER_COMPONENT)
        x, v = points[rows], weights[rows]
        share[i] = v.sum() / weights.sum()
        means[i] = (v @ x) / v.sum()
        covs[i] = np.diag((v @ (x - means[i]) ** 2) / v.sum())
    return {
        "weights": share,
        "means": means,
        "covs": covs,
        "logLikelihood": -sys.float_info.max,
        "change": sys.float_info.max,
    }


def gaussian_mixture(
    df: DataFrame,
    k: int = 2,
    *,
    features: str = "features",
    weight: str | None = None,
    max_rounds: int = 100,
    tol: float = 0.01,
    seed: int = 0,
    initial: Any = None,
    listen: Any = None,
    **run_options: Any,
) -> GaussianMixtureModel:
    """Fit a Gaussian mixture of ``k`` components by EM: ``GaussianMixture(k=k, ...).fit``
    with the short forms' names (``features`` a Vector or array column, ``weight``,
    ``max_rounds``, ``initial`` a fitted model to start from); ``listen`` and
    ``run_options`` go to the iteration (``progress``, ``event_log``,
    ``checkpoint_dir``...).

    Example::

        model = gaussian_mixture(df, k=3, seed=1)
        model.weights, model.summary.logLikelihood, model.transform(df)
    """
    estimator = GaussianMixture(
        k=k, featuresCol=features, maxIter=max_rounds, tol=tol, seed=seed, initialModel=initial
    )
    if weight is not None:
        estimator._set(weightCol=weight)
    options = {**run_options, **({"listen": listen} if listen is not None else {})}
    model: GaussianMixtureModel = estimator.setIterationOptions(**options).fit(df)
    return model
