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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, NumericType, StructField, StructType

import iterflow as itf
from iterflow.ml.model import Fitted, MLError, ModelStep, model_field
from iterflow.runtime.jvm import is_classic

MODEL_SCHEMA = "centroids ARRAY<DOUBLE>, cost DOUBLE, shift DOUBLE"
PARTIAL_SCHEMA = "sums ARRAY<DOUBLE>, counts ARRAY<LONG>, cost DOUBLE"


def feature_matrix(features: Sequence[str] | str, dims: int) -> Callable[[pa.Table], pa.Table]:
    """A ``columnar`` prepare step: the features as one flat float64 column ``x`` (row-major)."""

    def prepare(table: pa.Table) -> pa.Table:
        if isinstance(features, str):
            column = table[features].combine_chunks()
            if column.null_count:
                raise MLError(f"column '{features}' has null feature vectors")
            flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
            if len(flat) != len(column) * dims:
                raise MLError(f"feature vectors in '{features}' must all have {dims} values")
        else:
            flat = np.column_stack(
                [table[c].to_numpy(zero_copy_only=False).astype(np.float64) for c in features]
            ).ravel()
        if not np.isfinite(flat).all():
            raise MLError("features must be finite numbers (found NaN, infinity or null)")
        return pa.table({"x": flat})

    return prepare


def nearest(points: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest centroid of every point (the first on a tie), and the squared
    distance to it."""
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2, and |x|^2 is the same for every centroid.
    scores = (centroids**2).sum(axis=1) - 2.0 * points @ centroids.T
    chosen = np.argmin(scores, axis=1)
    best = scores[np.arange(len(points)), chosen]
    return chosen, np.maximum(best + np.einsum("ij,ij->i", points, points), 0.0)


def cluster_sums(points: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Per cluster, the sum ``(k, dims)`` and the number ``(k,)`` of the points nearest to its
    centroid, and the cost of the points (the sum of their squared distances)."""
    k = len(centroids)
    chosen, distance = nearest(points, centroids)
    member = np.zeros((len(points), k))  # one-hot: point i belongs to cluster chosen[i]
    member[np.arange(len(points)), chosen] = 1.0
    return member.T @ points, np.bincount(chosen, minlength=k), float(distance.sum())


def partial_sums(table: pa.Table, centroids: np.ndarray) -> pa.Table:
    """Kernel: the ``PARTIAL_SCHEMA`` row of the points of ``table`` (its column ``x``)."""
    sums, counts, cost = cluster_sums(
        table["x"].to_numpy().reshape(-1, centroids.shape[1]), centroids
    )
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
        points = batch.column("x").to_numpy().reshape(-1, self.centroids.shape[1])
        return tuple(a + b for a, b in zip(acc, cluster_sums(points, self.centroids), strict=True))

    def extract_output(self, acc: tuple[Any, ...]) -> pa.Table:
        sums, counts, cost = acc
        centroids = self.centroids
        moved = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centroids)
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


def kmeans_body(k: int, dims: int, features: Sequence[str] | str, tol: float | None) -> Any:
    """The k-means body: ``model`` (variable, one row) and ``points`` (data)."""
    prepare = feature_matrix(features, dims)
    loss = itf.metrics.gauge("loss")

    @itf.body
    def kmeans_step(model: DataFrame, points: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        centroids = model_centroids(model, dims)  # held on the driver: no Spark job
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


@attrs.frozen
class KMeansModel(Fitted):
    """A fitted k-means model: ``centroids`` (k, d), and the run that made it."""

    centroids: np.ndarray
    features: Sequence[str] | str
    result: itf.IterationResult = attrs.field(repr=False)

    def predict(self, df: DataFrame, output: str = "prediction") -> DataFrame:
        """``df`` with ``output``: the index of the nearest centroid of each row."""
        centroids = self.centroids
        features = self.features
        dims = centroids.shape[1]
        prepare = feature_matrix(features, dims)
        schema = StructType([*df.schema.fields, StructField(output, IntegerType())])

        def assign(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                table = pa.Table.from_batches([batch])
                points = prepare(table)["x"].to_numpy().reshape(-1, dims)
                chosen = nearest(points, centroids)[0].astype(np.int32)
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, pa.array(chosen)], names=[*batch.schema.names, output]
                )

        return df.mapInArrow(assign, schema)

    transform = predict


def _dims(df: DataFrame, features: Sequence[str] | str) -> int:
    if isinstance(features, str):
        if features not in df.columns:
            raise MLError(f"no feature column '{features}'; the columns are {df.columns}")
        field = df.schema[features].dataType
        if not (isinstance(field, ArrayType) and isinstance(field.elementType, NumericType)):
            raise MLError(
                f"feature column '{features}' must be an array of numbers, got "
                f"{field.simpleString()}; or pass features=[...] numeric column names"
            )
        first = df.select(F.size(features).alias("d")).where("d >= 0").first()
        if first is None:
            raise MLError("kmeans() needs at least one point")
        return int(first["d"])
    missing = [c for c in features if c not in df.columns]
    if missing:
        raise MLError(f"no feature column(s) {missing}; the columns are {df.columns}")
    return len(features)


def kmeans(
    df: DataFrame,
    k: int,
    *,
    features: Sequence[str] | str = "features",
    max_rounds: int = 20,
    tol: float | None = 1e-4,
    init: Any = "k-means++",
    seed: int = 0,
    listen: Any = None,
    **run_options: Any,
) -> KMeansModel:
    """Fit k-means with Lloyd's algorithm.

    ``features`` is an array column or a list of numeric columns. ``init`` is
    ``"k-means++"`` (k-means++ seeding on a seeded sample of up to
    ``SEEDING_SAMPLE`` points), ``"random"`` (k points drawn with ``seed``) or
    the initial centroids (a ``(k, d)`` array-like); the first two are
    deterministic for a given input and seed. Stops after
    ``max_rounds`` rounds or when no centroid moves more than ``tol``
    (``tol=None``: always ``max_rounds``). ``listen`` and ``run_options`` go to
    the iteration (``progress``, ``event_log``, ``checkpoint_dir``...).

    Example::

        model = kmeans(points, k=3, features="features", max_rounds=50, seed=1)
        model.centroids, model.termination.reason
        model.predict(points).groupBy("prediction").count()
    """
    if not isinstance(k, int) or k < 1:
        raise MLError(f"kmeans(k={k!r}) needs a positive int")
    dims = _dims(df, features)
    if isinstance(init, str):
        if init not in ("k-means++", "random"):
            raise MLError(
                f"kmeans(init={init!r}): use 'k-means++', 'random' or the initial centroids"
            )
        columns = [features] if isinstance(features, str) else list(features)
        wanted = k if init == "random" else max(k, SEEDING_SAMPLE)
        chosen = df.select(*columns)
        if is_classic(chosen.sparkSession):
            drawn = chosen.rdd.takeSample(False, wanted, seed)
        else:  # Spark Connect has no RDDs: a seeded shuffle, then the first rows
            drawn = chosen.orderBy(F.rand(seed)).limit(wanted).collect()
        if not drawn:
            raise MLError("kmeans() needs at least one point")
        rows = [r[0] if isinstance(features, str) else list(r) for r in drawn]
        sample = np.array(rows, dtype=np.float64).reshape(-1, dims)
        start = sample if init == "random" else plus_plus(sample, k, seed)
    else:
        start = np.asarray(init, dtype=np.float64)
        if start.shape != (k, dims):
            raise MLError(f"kmeans(init=...) must have shape ({k}, {dims}), got {start.shape}")
    model = df.sparkSession.createDataFrame(
        pa.table(
            [itf.vector_cell(start.ravel()), pa.array([float("nan")]), pa.array([float("inf")])],
            names=["centroids", "cost", "shift"],
        ),
        MODEL_SCHEMA,
    )
    iteration = (
        itf.BoundedIteration(kmeans_body(len(start), dims, features, tol))
        .bind("model", model)
        .bind("points", df)
        .until(itf.max_rounds(max_rounds))
    )
    if listen is not None:
        iteration = iteration.listen(listen)
    result = iteration.run(**run_options)
    return KMeansModel(model_centroids(result.outputs["model"], dims), features, result)
