"""k-means (Lloyd's algorithm) as an iterflow body.

The variable is the model, one row: the k centroids (flattened), the cost of the
round that made them and how far the farthest centroid moved. The points are a
data input held for the whole run (``RoundContext.columnar``), as a ``(n, d)``
float64 matrix per partition, so they cross from the JVM to Python once per run.
Every round is one ``itf.combine`` of ``LloydStep``: per partition, numpy assigns
the points to the nearest centroid and adds them up per cluster (the
accumulator); the accumulators are summed in partition order, and every centroid
moves to the mean of its points (a centroid without points stays where it is,
as in Spark MLlib).

It stops after ``max_rounds`` rounds, or when no centroid moved more than
``tol`` (termination ``converged``). The cost of each round (the sum of squared
distances of the points to the centroids they were assigned to) is the gauge
``loss`` in ``RoundProgress.metrics``, so ``iterflow plot`` draws it.

``kmeans()`` seeds and runs it and returns a ``KMeansModel``: the ``pyspark.ml`` Model
that the ``KMeans`` Estimator (``iterflow.ml.estimators``) fits too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import scipy.sparse
from pyspark.ml import Model
from pyspark.ml.linalg import DenseVector, VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasMaxIter,
    HasPredictionCol,
    HasSeed,
    HasTol,
    HasWeightCol,
)
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

import iterflow as itf
from iterflow.ml.features import (
    Features,
    block_rows,
    features_of,
    matrix,
    prepared_matrix,
    used_rows,
    vectors_as_arrays,
    weights,
)
from iterflow.ml.params import MLParams, TrainingSummary, choice, param
from iterflow.ml.persistence import SavedModel
from iterflow.ml.training import Fitted, MLError, ModelStep, model_field, worker_errors

MODEL_SCHEMA = "centroids ARRAY<DOUBLE>, cost DOUBLE, shift DOUBLE"
PARTIAL_SCHEMA = "sums ARRAY<DOUBLE>, counts ARRAY<LONG>, cost DOUBLE"


def feature_matrix(spec: Features, weight: str | None = None) -> Callable[[pa.Table], pa.Table]:
    """A ``columnar`` prepare step: the features as ``x`` (one fixed-size list of float64
    per row), their squared length ``x2`` (the same in every round, so taken once), and the
    row weights ``v`` when ``weight`` names a column."""

    def prepare(table: pa.Table) -> pa.Table:
        x = matrix(table, spec)
        columns = {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), spec.dims),
            "x2": pa.array(np.einsum("ij,ij->i", x, x)),
        }
        if weight is not None:
            columns["v"] = pa.array(weights(table, weight))
        return pa.table(columns)

    return prepare


def points_of(data: pa.Table | pa.RecordBatch, dims: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``(rows, dims)`` points of a prepared table or batch, and its weights (or None):
    views of its buffers, not copies."""
    weights = data.column("v").to_numpy() if "v" in data.schema.names else None
    return prepared_matrix(data, "x", dims), weights


def nearest(
    points: np.ndarray, centroids: np.ndarray, squares: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest centroid of every point (the first on a tie), and the squared
    distance to it; ``squares``, every point's squared length, when it is known."""
    rows, k = len(points), len(centroids)
    chosen = np.empty(rows, dtype=np.int32 if rows < 2**31 else np.intp)
    distance = np.empty(rows)
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2, and |x|^2 is the same for every centroid.
    # x.(-2c) is exactly -2 (x.c): one product, no scaling pass over the scores.
    lengths = (centroids**2).sum(axis=1)
    scaled = (-2.0 * centroids).T
    # Block by block (8,192 rows at k = d = 16), so that the scores never leave the cache.
    step = block_rows(k + points.shape[1])
    scores = np.empty((min(step, rows), k))
    for start in range(0, rows, step):
        block = points[start : start + step]
        end = start + len(block)
        part = np.matmul(block, scaled, out=scores[: len(block)])
        part += lengths
        best = np.argmin(part, axis=1)
        chosen[start:end] = best
        near = np.take_along_axis(part, best[:, None], axis=1)[:, 0]
        near += np.einsum("ij,ij->i", block, block) if squares is None else squares[start:end]
        np.maximum(near, 0.0, out=distance[start:end])
    return chosen, distance


#: Ones and 0, 1, 2, ... for the one-hot matrix of ``cluster_sums``, kept from call to call
#: (as long as the longest partition): made afresh, they cost as much as the product.
_UNITS = (np.ones(0), np.arange(1, dtype=np.int32))


def _units(rows: int) -> tuple[np.ndarray, np.ndarray]:
    global _UNITS
    if len(_UNITS[0]) < rows:
        ones, positions = np.ones(rows), np.arange(rows + 1, dtype=np.int32)
        ones.flags.writeable = positions.flags.writeable = False
        _UNITS = ones, positions
    return _UNITS[0][:rows], _UNITS[1][: rows + 1]


def cluster_sums(
    points: np.ndarray,
    centroids: np.ndarray,
    weights: np.ndarray | None = None,
    squares: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per cluster, the (weighted) sum ``(k, dims)`` and the number (total weight) ``(k,)``
    of the points nearest to its centroid, and the cost of the points (the sum of their
    weighted squared distances); ``squares``, every point's squared length, if known."""
    k, rows = len(centroids), len(points)
    chosen, distance = nearest(points, centroids, squares)
    # The sums are one sparse product: column i of the (k, rows) one-hot matrix holds point
    # i's weight in row chosen[i] (CSC, built from the labels as they are: no sort, no
    # dense (rows, k) matrix).
    ones, positions = _units(rows)
    if chosen.dtype != positions.dtype:  # 2**31 rows or more
        positions = np.arange(rows + 1, dtype=chosen.dtype)
    member = scipy.sparse.csc_array(
        (ones if weights is None else weights, chosen, positions), shape=(k, rows)
    )
    counts = np.bincount(chosen, weights=weights, minlength=k)
    cost = distance if weights is None else distance * weights
    return np.asarray(member @ points), counts, float(cost.sum())


def partial_sums(table: pa.Table, centroids: np.ndarray) -> pa.Table:
    """Kernel: the ``PARTIAL_SCHEMA`` row of the (unweighted) points of ``table``."""
    sums, counts, cost = cluster_sums(points_of(table, centroids.shape[1])[0], centroids)
    return pa.table(
        [
            itf.vector_cell(sums.ravel()),
            itf.vector_cell(counts.astype(np.int64)),
            pa.array([cost]),
        ],
        names=["sums", "counts", "cost"],
    )


def add_partials(
    batches: Iterable[pa.RecordBatch], k: int, dims: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """``PARTIAL_SCHEMA`` rows added up: per cluster the sum ``(k, dims)`` and the number
    ``(k,)`` of its points, and the cost."""
    sums, counts, cost = np.zeros((k, dims)), np.zeros(k), 0.0
    for batch in batches:
        for row in range(batch.num_rows):
            sums += batch.column(0)[row].values.to_numpy().reshape(k, dims)
            counts += batch.column(1)[row].values.to_numpy()
        cost += float(np.sum(batch.column(2).to_numpy()))
    return sums, counts, cost


class LloydStep(ModelStep):
    """One round of Lloyd's algorithm from ``centroids``: the accumulator is per cluster the
    sum and the number of its points, and their cost; the output is the model row with
    every centroid moved to the mean of its points (the cost goes to the ``loss`` gauge)."""

    def __init__(self, centroids: np.ndarray, loss: Any) -> None:
        super().__init__(loss)
        self.centroids = centroids

    def create_accumulator(self) -> tuple[Any, ...]:
        k, dims = self.centroids.shape
        return np.zeros((k, dims)), np.zeros(k), 0.0

    def add_input(self, acc: tuple[Any, ...], batch: pa.RecordBatch) -> Any:
        points, weights = points_of(batch, self.centroids.shape[1])
        squares = batch.column("x2").to_numpy() if "x2" in batch.schema.names else None
        sums = cluster_sums(points, self.centroids, weights, squares)
        return tuple(a + b for a, b in zip(acc, sums, strict=True))

    def extract_output(self, acc: tuple[Any, ...]) -> pa.Table:
        sums, counts, cost = acc
        centroids = self.centroids
        # counts are weights with weightCol: a cluster may weigh less than 1.
        divisor = np.where(counts > 0, counts, 1.0)[:, None]
        moved = np.where(counts[:, None] > 0, sums / divisor, centroids)
        shift = float(np.sqrt(((moved - centroids) ** 2).sum(axis=1)).max())
        self.loss.set(cost)
        return pa.table(
            [itf.vector_cell(moved.ravel()), pa.array([cost]), pa.array([shift])],
            names=["centroids", "cost", "shift"],
        )


#: How many points k-means++ seeding picks its centroids from (a seeded sample).
SEEDING_SAMPLE = 10_000


def plus_plus(sample: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means++ seeding on ``sample``: each next centroid is drawn with probability
    proportional to its squared distance to the nearest centroid chosen so far."""
    rng = np.random.default_rng(seed)
    chosen = [sample[rng.integers(len(sample))]]
    for _ in range(1, min(k, len(sample))):
        gaps = nearest(sample, np.array(chosen))[1]
        if gaps.sum() <= 0:  # fewer distinct points than k: repeat one
            chosen.append(chosen[-1])
            continue
        chosen.append(sample[rng.choice(len(sample), p=gaps / gaps.sum())])
    return np.array(chosen)


def initial_centroids(df: DataFrame, spec: Features, k: int, init: Any, seed: int) -> np.ndarray:
    """The ``(k, dims)`` centroids of round 0: ``init`` itself when it is an array, else
    drawn from the rows with ``seed`` (``"random"``: k rows; ``"k-means++"``: k-means++
    seeding on a sample of up to ``SEEDING_SAMPLE`` rows)."""
    if hasattr(init, "clusterCenters"):  # a fitted KMeansModel, iterflow's or MLlib's
        init = np.array([np.asarray(c, dtype=np.float64) for c in init.clusterCenters()])
    if not isinstance(init, str):
        start = np.asarray(init, dtype=np.float64)
        if start.shape != (k, spec.dims):
            raise MLError(f"kmeans(init=...) must have shape ({k}, {spec.dims}), got {start.shape}")
        return start
    if init not in ("k-means++", "random"):
        raise MLError(f"kmeans(init={init!r}): use 'k-means++', 'random' or the initial centroids")
    if init == "random":
        return seeding_sample(df, spec, k, seed)
    return plus_plus(seeding_sample(df, spec, max(k, SEEDING_SAMPLE), seed), k, seed)


def seeding_sample(df: DataFrame, spec: Features, wanted: int, seed: int) -> np.ndarray:
    """Up to ``wanted`` rows' features as a ``(rows, dims)`` array, drawn with ``seed``: as
    MLlib draws them (``RDD.takeSample``) where the session has RDDs. A null, NaN or
    infinite value, or no row at all, is an ``MLError``."""
    chosen = df.select(spec.as_array().alias("x"))
    try:
        rows = chosen.rdd
    except NotImplementedError:  # Spark Connect has no RDDs: a seeded shuffle, then the first rows
        drawn = chosen.orderBy(F.rand(seed)).limit(wanted).collect()
    else:
        drawn = rows.takeSample(False, wanted, seed)
    if not drawn:
        raise MLError(
            f"kmeans() needs at least one point, and feature column(s) "
            f"{list(spec.columns)} have no row (the DataFrame is empty)"
        )
    if any(r[0] is None or None in r[0] for r in drawn):
        raise MLError(f"feature column(s) {list(spec.columns)}: a row has a null value")
    sample = np.array([r[0] for r in drawn], dtype=np.float64).reshape(-1, spec.dims)
    if not np.isfinite(sample).all():
        raise MLError(f"feature column(s) {list(spec.columns)}: a row has a NaN or infinite value")
    return sample


def kmeans_body(spec: Features, weight: str | None, tol: float | None) -> Any:
    """The k-means body: ``model`` (variable, one row) and ``points`` (data)."""
    prepare = feature_matrix(spec, weight)
    loss = itf.metrics.gauge("loss")

    @itf.body
    def kmeans_step(model: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        centroids = model_centroids(model, spec.dims)  # held on the driver: no Spark job
        # depth 1: the accumulators of columnar data meet in one place (the driver, or one
        # task), where a tree would only change the order of the sums.
        step = LloydStep(centroids, loss)
        new_model = itf.combine(ctx.columnar(points, prepare), step, MODEL_SCHEMA, depth=1)
        return itf.Declaration(
            feedback={"model": new_model},
            outputs={"model": new_model},
            until=itf.converged(model_field("shift"), tol) if tol is not None else None,
        )

    return kmeans_step


def model_centroids(model: DataFrame, dims: int) -> np.ndarray:
    """The centroids in a one-row model DataFrame, as a ``(k, dims)`` array."""
    return itf.vector(model, "centroids").astype(np.float64).reshape(-1, dims)


#: ``initMode`` values: MLlib's two, and ``"k-means++"``. ``"k-means||"`` (MLlib's
#: default, a parallel k-means++) runs k-means++ seeding on a seeded sample here.
INIT_MODES = ("k-means||", "k-means++", "random")


class KMeansParams(
    MLParams, HasFeaturesCol, HasPredictionCol, HasMaxIter, HasTol, HasSeed, HasWeightCol
):
    """The Params of ``KMeans`` and ``KMeansModel``, as MLlib names them."""

    k: Param[int] = param(
        Params._dummy(), "k", "the number of clusters to create (> 0)", TypeConverters.toInt
    )
    initMode: Param[str] = param(
        Params._dummy(),
        "initMode",
        f"how the initial centroids are chosen: one of {list(INIT_MODES)}",
        choice("initMode", INIT_MODES),
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(k=2, maxIter=20, tol=1e-4, initMode="k-means||", seed=0)

    def getK(self) -> int:
        return int(self.getOrDefault(self.k))

    def getInitMode(self) -> str:
        return str(self.getOrDefault(self.initMode))


@attrs.frozen
class KMeansSummary(TrainingSummary):
    """MLlib's ``KMeansSummary``: ``trainingCost`` (the cost of the last round's
    assignment), ``clusterSizes`` (the points nearest each final centroid, counted on the
    training rows by one Spark job when first read), ``k`` and ``numIter``; with
    ``objectiveHistory`` (every round's cost) and iterflow's run."""

    model: KMeansModel = attrs.field(repr=False)
    training: DataFrame | None = attrs.field(repr=False)

    @property
    def trainingCost(self) -> float:
        return float(self.objectiveHistory[-1]) if self.objectiveHistory else float("nan")

    @property
    def k(self) -> int:
        return len(self.model.centroids)

    @property
    def numIter(self) -> int:
        return self.totalIterations

    @functools.cached_property
    def clusterSizes(self) -> list[int]:
        column = "__iterflow_cluster"
        counted = self.model.predict(self._training(), column).groupBy(column).count().collect()
        sizes = [0] * self.k
        for row in counted:
            sizes[row[0]] = int(row[1])
        return sizes

    @property
    def predictions(self) -> DataFrame:
        """The training rows with ``predictionCol``, as MLlib's summary."""
        return self.model.transform(self._training())

    def _training(self) -> DataFrame:
        if self.training is None:
            raise MLError("this summary has no training rows (the model was made, not fitted)")
        return self.training


class KMeansModel(Model, KMeansParams, SavedModel, Fitted):
    """A fitted k-means model: ``centroids`` (k, d) and, when it was fitted here (not
    loaded), the run that made it (``rounds``, ``termination``, ``history``, ``summary``).

    Both the short form's result (``kmeans(df, k)``) and ``KMeans().fit(df)``'s: a
    ``pyspark.ml`` Model, so ``transform`` adds ``predictionCol`` (the index of the
    nearest centroid, INT). Saved, it loads with MLlib's
    ``pyspark.ml.clustering.KMeansModel``, and ``KMeansModel.load`` reads MLlib's.
    """

    mllib_class = "pyspark.ml.clustering.KMeansModel"

    def __init__(
        self,
        centroids: Any = None,
        features: Sequence[str] | str | None = None,
        result: itf.IterationResult | None = None,
        training: DataFrame | None = None,
    ) -> None:
        super().__init__()
        self.centroids = np.zeros((0, 0)) if centroids is None else np.asarray(centroids, float)
        self._columns = None if features is None or isinstance(features, str) else list(features)
        if isinstance(features, str):
            self._set(featuresCol=features)
        self.result = result
        self._training = training

    @property
    def features(self) -> Sequence[str] | str:
        """The feature columns: a list of numeric columns, or ``featuresCol``."""
        return self._columns if self._columns is not None else self.getFeaturesCol()

    def clusterCenters(self) -> list[np.ndarray]:
        """The centroids, one array each, as MLlib's ``KMeansModel.clusterCenters()``."""
        return [row.copy() for row in self.centroids]

    @property
    def summary(self) -> KMeansSummary:
        """``objectiveHistory`` (the cost of every round), ``trainingCost``,
        ``clusterSizes``, ``totalIterations``, and the run."""
        result = self.fitted_result
        costs = [float(p.metrics["loss"]) for p in result.history if "loss" in p.metrics]
        return KMeansSummary(costs, int(result.rounds), result, self, self._training)

    def predict(self, data: Any, output: str | None = None) -> Any:
        """``data`` a DataFrame: it with ``output`` (``predictionCol`` by default), the index
        of each row's nearest centroid. ``data`` one vector (as MLlib's ``predict``): that
        index."""
        if not isinstance(data, DataFrame):
            point = np.asarray(data.toArray() if hasattr(data, "toArray") else data, float)
            return int(nearest(point.reshape(1, -1), self.centroids)[0][0])
        return self._assign(data, output or self.getPredictionCol())

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return self._assign(dataset, self.getPredictionCol())

    def _assign(self, df: DataFrame, output: str) -> DataFrame:
        centroids = self.centroids
        dims = centroids.shape[1]
        spec = features_of(df, self.features, "KMeansModel", dims=dims)
        schema = StructType([*df.schema.fields, StructField(output, IntegerType())])

        def assign(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                points = matrix(pa.Table.from_batches([batch]), spec)
                chosen = nearest(points, centroids)[0].astype(np.int32)
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, pa.array(chosen)], names=[*batch.schema.names, output]
                )

        return df.mapInArrow(assign, schema)

    def _mllib_value(self, name: str, value: Any) -> Any:
        return None if (name, value) == ("initMode", "k-means++") else value

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        schema = StructType(
            [StructField("clusterIdx", IntegerType()), StructField("clusterCenter", VectorUDT())]
        )
        rows = [(i, DenseVector(c)) for i, c in enumerate(self.centroids.tolist())]
        return spark.createDataFrame(rows, schema)

    def _restore_data(self, rows: list[Row]) -> None:
        ordered = sorted(rows, key=lambda row: row["clusterIdx"])
        self.centroids = np.array([row["clusterCenter"].toArray() for row in ordered])

    def _extra(self) -> dict[str, Any]:
        return {"columns": self._columns}

    def _restore_extra(self, extra: Mapping[str, Any]) -> None:
        self._columns = extra.get("columns")

    def _restore(self, learned: Mapping[str, Any]) -> None:
        self.centroids = np.asarray(learned["centroids"], dtype=np.float64)
        self._columns = learned.get("columns")


def kmeans(
    df: DataFrame,
    k: int,
    *,
    features: Sequence[str] | str = "features",
    weight: str | None = None,
    max_rounds: int = 20,
    tol: float | None = 1e-4,
    init: Any = "k-means++",
    seed: int = 0,
    listen: Any = None,
    **run_options: Any,
) -> KMeansModel:
    """Fit k-means with Lloyd's algorithm.

    ``features`` is a Vector column (dense or sparse), an array column or a list of
    numeric columns; ``weight`` a column of non-negative row weights. ``init`` is
    ``"k-means++"`` (k-means++ seeding on a seeded sample of up to
    ``SEEDING_SAMPLE`` points), ``"random"`` (k points drawn with ``seed``),
    the initial centroids (a ``(k, d)`` array-like) or a fitted ``KMeansModel``
    (iterflow's or MLlib's: warm start); the first two are
    deterministic for a given input and seed. Stops after
    ``max_rounds`` rounds or when no centroid moves more than ``tol``
    (``tol=None``: always ``max_rounds``). ``listen`` and ``run_options`` go to
    the iteration (``progress``, ``event_log``, ``checkpoint_dir``...).

    Example::

        model = kmeans(points, k=3, features="features", max_rounds=50, seed=1)
        model.centroids, model.termination.reason
        model.predict(points).groupBy("prediction").count()
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise MLError(f"kmeans(k={k!r}) needs a positive int")
    spec = features_of(df, features, "kmeans()")
    if weight is not None and weight not in df.columns:
        raise MLError(f"kmeans(): no weight column '{weight}'; the columns are {df.columns}")
    seed = int(seed) & (2**63 - 1)  # pyspark.ml's default seeds may be negative
    start = initial_centroids(df, spec, k, init, seed)
    model = df.sparkSession.createDataFrame(
        pa.table(
            [itf.vector_cell(start.ravel()), pa.array([float("nan")]), pa.array([float("inf")])],
            names=["centroids", "cost", "shift"],
        ),
        MODEL_SCHEMA,
    )
    iteration = (
        itf.BoundedIteration(kmeans_body(spec, weight, tol))
        .bind("model", model)
        .bind("points", vectors_as_arrays(used_rows(df, [*spec.columns, weight], "kmeans()"), spec))
        .until(itf.max_rounds(max_rounds))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    with worker_errors():
        result = iteration.run(**run_options)
    centroids = model_centroids(result.outputs["model"], spec.dims)
    return KMeansModel(centroids, features, result, df)._set_checked(
        {"k": k, "maxIter": max_rounds, "seed": seed, **({"tol": tol} if tol is not None else {})}
    )
