"""Alternating least squares for collaborative filtering, as MLlib's ``ALS`` solves it: an
``IterativeEstimator`` (``iterflow.ml.iterative``) whose rounds alternate between the item
factors (given the users') and the user factors (given the items'), so ``maxIter``
iterations are ``2 * maxIter`` rounds, items first as in MLlib.

A round is one ``CombineFn`` over the resident ratings (``NormalEquations``): per batch,
numpy adds every rating's term to its row's normal equations, ``A_u = sum_i c y_i y_i^T``
and ``b_u = sum_i p y_i`` (a sparse indicator matrix times the rows' outer products, no
per-rating Python), and ``extract_output`` solves every row's ``(A_u + lambda n_u I) x =
b_u`` at once (batched ``numpy.linalg.solve``; NNLS with ``nonnegative``), with MLlib's
rules: explicit ratings ``c = 1, p = r``; implicit (``implicitPrefs``) ``c = alpha |r|``
added to ``Y^T Y``, ``p = 1 + c`` for ``r > 0``; ``lambda = regParam`` times the row's
number of (positive) ratings (ALS-WR). Factors start as seeded Gaussian vectors of unit
length (absolute values with ``nonnegative``).

Both factor matrices are the model's one row, held on the driver between rounds: they
suit up to a few million users and items times the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import scipy.optimize
import scipy.sparse
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasPredictionCol, HasRegParam, HasSeed
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    FloatType,
    IntegerType,
    StructField,
    StructType,
)

import iterflow as itf
from iterflow.ml.features import numbers, used_rows
from iterflow.ml.iterative import IterativeEstimator, IterativeModel, Learned
from iterflow.ml.params import choice, keyword_params, param
from iterflow.ml.training import MLError, added

#: Ratings per block of the normal equations' sums (a block's outer products stay small).
BLOCK = 8192
COLD_START = ("nan", "drop")


class ALSModelParams(HasPredictionCol):
    """The Params of ``ALS`` and ``ALSModel``, as MLlib names them."""

    userCol: Param[str] = param(
        Params._dummy(), "userCol", "the column of user ids (integers)", TypeConverters.toString
    )
    itemCol: Param[str] = param(
        Params._dummy(), "itemCol", "the column of item ids (integers)", TypeConverters.toString
    )
    coldStartStrategy: Param[str] = param(
        Params._dummy(),
        "coldStartStrategy",
        "a user or item unseen in training: 'nan' (prediction NaN) or 'drop' (row dropped)",
        choice("coldStartStrategy", COLD_START),
    )
    blockSize: Param[int] = param(
        Params._dummy(), "blockSize", "MLlib's block size (kept, unused)", TypeConverters.toInt
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(userCol="user", itemCol="item", coldStartStrategy="nan", blockSize=4096)

    def getUserCol(self) -> str:
        return str(self.getOrDefault(self.userCol))

    def getItemCol(self) -> str:
        return str(self.getOrDefault(self.itemCol))

    def getColdStartStrategy(self) -> str:
        return str(self.getOrDefault(self.coldStartStrategy))


class ALSParams(ALSModelParams, HasRegParam, HasSeed):
    """``ALS``'s Params: the model's, and the fit's."""

    rank: Param[int] = param(Params._dummy(), "rank", "the factors' length", TypeConverters.toInt)
    ratingCol: Param[str] = param(
        Params._dummy(), "ratingCol", "the column of ratings", TypeConverters.toString
    )
    implicitPrefs: Param[bool] = param(
        Params._dummy(),
        "implicitPrefs",
        "implicit feedback (confidences) instead of explicit ratings",
        TypeConverters.toBoolean,
    )
    alpha: Param[float] = param(
        Params._dummy(), "alpha", "implicit feedback's confidence scale", TypeConverters.toFloat
    )
    nonnegative: Param[bool] = param(
        Params._dummy(), "nonnegative", "non-negative factors (NNLS)", TypeConverters.toBoolean
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            rank=10,
            maxIter=10,
            regParam=0.1,
            ratingCol="rating",
            implicitPrefs=False,
            alpha=1.0,
            nonnegative=False,
            seed=0,
        )


class NormalEquations(itf.CombineFn):
    """Half an ALS iteration: the normal equations of every row of one side (users or
    items, ``solve``) from the other side's factors, summed over the ratings; the output
    is the learned values with that side solved."""

    def __init__(self, learned: Learned, settings: dict[str, Any]) -> None:
        self.learned = learned
        self.settings = settings
        self.items_now = int(learned["half"]) % 2 == 0  # items first, as MLlib
        fixed = learned["users"] if self.items_now else learned["items"]
        self.fixed = np.asarray(fixed, dtype=np.float64)
        self.rows = len(learned["items"] if self.items_now else learned["users"])

    def create_accumulator(self) -> tuple[Any, ...]:
        rank = self.fixed.shape[1]
        return np.zeros((self.rows, rank * rank)), np.zeros((self.rows, rank)), np.zeros(self.rows)

    def add_input(self, acc: tuple[Any, ...], batch: pa.RecordBatch) -> tuple[Any, ...]:
        gram, right, counts = acc
        users = batch.column("u").to_numpy()
        items = batch.column("i").to_numpy()
        ratings = batch.column("r").to_numpy()
        solved, other = (items, users) if self.items_now else (users, items)
        implicit, alpha = self.settings["implicit"], self.settings["alpha"]
        for start in range(0, len(ratings), BLOCK):
            rows, cols, r = (a[start : start + BLOCK] for a in (solved, other, ratings))
            y = self.fixed[cols]
            if implicit:
                confidence = alpha * np.abs(r)
                positive = r > 0
                outer_weight, right_weight = confidence, np.where(positive, 1.0 + confidence, 0.0)
                counted = positive.astype(np.float64)
            else:
                outer_weight, right_weight, counted = np.ones(len(r)), r, np.ones(len(r))
            member = scipy.sparse.csr_array(
                (outer_weight, (rows, np.arange(len(r)))), shape=(self.rows, len(r))
            )
            gram += member @ np.einsum("ni,nj->nij", y, y).reshape(len(r), -1)
            right += (
                scipy.sparse.csr_array(
                    (right_weight, (rows, np.arange(len(r)))), shape=(self.rows, len(r))
                )
                @ y
            )
            counts += np.bincount(rows, weights=counted, minlength=self.rows)
        return gram, right, counts

    def merge_accumulators(self, accs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        return added(self.create_accumulator(), accs)

    def extract_output(self, acc: tuple[Any, ...]) -> dict[str, Any]:
        gram, right, counts = acc
        rank = self.fixed.shape[1]
        systems = gram.reshape(-1, rank, rank)
        if self.settings["implicit"]:
            systems = systems + self.fixed.T @ self.fixed
        systems = systems + (self.settings["reg"] * counts)[:, None, None] * np.eye(rank)
        factors = solve(systems, right, self.settings["nonnegative"])
        side = "items" if self.items_now else "users"
        return {**self.learned, side: factors, "half": int(self.learned["half"]) + 1}


def solve(systems: np.ndarray, right: np.ndarray, nonnegative: bool) -> np.ndarray:
    """Every row's ``systems[k] x = right[k]`` (symmetric positive definite; a row with no
    ratings and no penalty gets 0); with ``nonnegative`` the least squares with ``x >= 0``
    whose normal equations they are (NNLS on the Cholesky factor)."""
    empty = ~np.isfinite(systems).all(axis=(1, 2)) | (np.abs(systems).sum(axis=(1, 2)) == 0)
    systems = np.where(empty[:, None, None], np.eye(systems.shape[1]), systems)
    if not nonnegative:
        factors = np.linalg.solve(systems, right[..., None])[..., 0]
    else:
        factors = np.empty_like(right)
        for k in range(len(right)):
            lower = np.linalg.cholesky(systems[k])
            target = np.linalg.solve(lower, right[k])
            factors[k] = scipy.optimize.nnls(lower.T, target)[0]
    factors[empty] = 0.0
    return factors


class ALSModel(IterativeModel, ALSModelParams):
    """A fitted ``ALS``: ``rank``, ``userFactors`` and ``itemFactors`` (DataFrames of ``id``
    and ``features``), ``transform`` (``predictionCol``: the dot product of the row's user
    and item factors; NaN, or the row dropped, for an id unseen in training), and MLlib's
    ``recommendForAllUsers``/``Items``, ``recommendForUserSubset``/``ItemSubset``. Saved,
    it loads with MLlib's ``pyspark.ml.recommendation.ALSModel``, and this class loads
    MLlib's."""

    mllib_class = "pyspark.ml.recommendation.ALSModel"

    @property
    def rank(self) -> int:
        return int(np.asarray(self.learned["users"]).shape[1])

    def _factors(self, side: str) -> DataFrame:
        ids = np.asarray(self.learned["userIds" if side == "users" else "itemIds"])
        values = np.asarray(self.learned[side], dtype=np.float32)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int32()),
                "features": pa.array(list(values), pa.list_(pa.float32())),
            }
        )
        return SparkSession.active().createDataFrame(table, FACTORS)

    @property
    def userFactors(self) -> DataFrame:
        return self._factors("users")

    @property
    def itemFactors(self) -> DataFrame:
        return self._factors("items")

    def _transform(self, dataset: DataFrame) -> DataFrame:
        learned = self.learned
        user, item, output = self.getUserCol(), self.getItemCol(), self.getPredictionCol()
        schema = StructType([*dataset.schema.fields, StructField(output, FloatType())])

        def score(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                u = lookup(learned["userIds"], batch.column(user).to_numpy(zero_copy_only=False))
                i = lookup(learned["itemIds"], batch.column(item).to_numpy(zero_copy_only=False))
                known = (u >= 0) & (i >= 0)
                values = np.full(batch.num_rows, np.nan, dtype=np.float32)
                users, items = learned["users"][u[known]], learned["items"][i[known]]
                values[known] = np.einsum("ij,ij->i", users, items)
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, pa.array(values, pa.float32())],
                    names=[*batch.schema.names, output],
                )

        scored = dataset.mapInArrow(score, schema)
        if self.getColdStartStrategy() == "drop":
            scored = scored.dropna(subset=[output])
        return scored

    def recommendForAllUsers(self, numItems: int) -> DataFrame:
        return self._recommend("users", None, numItems)

    def recommendForAllItems(self, numUsers: int) -> DataFrame:
        return self._recommend("items", None, numUsers)

    def recommendForUserSubset(self, dataset: DataFrame, numItems: int) -> DataFrame:
        return self._recommend("users", dataset.select(self.getUserCol()), numItems)

    def recommendForItemSubset(self, dataset: DataFrame, numUsers: int) -> DataFrame:
        return self._recommend("items", dataset.select(self.getItemCol()), numUsers)

    def _recommend(self, side: str, subset: DataFrame | None, count: int) -> DataFrame:
        """The ``count`` best of the other side for each row of ``side`` (or of its ids
        in ``subset``), as MLlib's: ``(id, recommendations: [(other id, rating)])``."""
        learned = self.learned
        mine, theirs = ("users", "items") if side == "users" else ("items", "users")
        ids = np.asarray(learned["userIds" if side == "users" else "itemIds"])
        other = np.asarray(learned["itemIds" if side == "users" else "userIds"])
        rows = np.arange(len(ids))
        if subset is not None:
            wanted = np.unique([r[0] for r in subset.collect() if r[0] is not None])
            found = lookup(ids, wanted)
            rows = found[found >= 0]
        scores = learned[mine][rows] @ learned[theirs].T
        best = np.argsort(-scores, axis=1, kind="stable")[:, :count]
        names = ("user", "item") if side == "users" else ("item", "user")
        table = [
            (int(ids[r]), [(int(other[b]), float(scores[k, b])) for b in best[k]])
            for k, r in enumerate(rows)
        ]
        schema = StructType(
            [
                StructField(
                    self.getUserCol() if side == "users" else self.getItemCol(), IntegerType()
                ),
                StructField(
                    "recommendations",
                    ArrayType(
                        StructType(
                            [
                                StructField(names[1], IntegerType()),
                                StructField("rating", FloatType()),
                            ]
                        )
                    ),
                ),
            ]
        )
        return SparkSession.active().createDataFrame(table, schema)

    def _saved_parts(self, spark: SparkSession) -> dict[str, DataFrame]:
        return {"userFactors": self.userFactors, "itemFactors": self.itemFactors}

    def _mllib_metadata(self) -> dict[str, Any]:
        return {"rank": self.rank}

    def _extra(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, extra: Any) -> None:
        """Nothing beyond MLlib's parts."""

    def _restore_parts(self, read: Callable[[str], list[Row]]) -> None:
        learned: dict[str, Any] = {}
        for side, name, key in SIDES:
            rows = sorted(read(name), key=lambda row: row["id"])
            learned[key] = np.array([row["id"] for row in rows], dtype=np.int64)
            learned[side] = np.array([row["features"] for row in rows], dtype=np.float64)
        self.learned = {**learned, "half": 0}


#: Each side of the factorization: its learned factors, MLlib's name for them (a model's
#: property and its saved directory), and its learned ids.
SIDES = (("users", "userFactors", "userIds"), ("items", "itemFactors", "itemIds"))

FACTORS = StructType(
    [StructField("id", IntegerType()), StructField("features", ArrayType(FloatType()))]
)


def lookup(ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value's position in the sorted ``ids``, or -1 where it is not there."""
    ids = np.asarray(ids)
    values = np.asarray(values, dtype=np.float64)
    valid = np.isfinite(values)
    keys = np.where(valid, values, 0).astype(np.int64)
    at = np.clip(np.searchsorted(ids, keys), 0, max(len(ids) - 1, 0))
    found = valid & (len(ids) > 0) & (ids[at] == keys) if len(ids) else np.zeros(len(keys), bool)
    return np.where(found, at, -1)


class ALS(IterativeEstimator, ALSParams):
    """Alternating least squares as a ``pyspark.ml`` Estimator, with MLlib's Params and
    defaults (``rank=10``, ``maxIter=10``, ``regParam=0.1``, ``implicitPrefs=False``,
    ``alpha=1.0``, ``nonnegative=False``, ``coldStartStrategy="nan"``); see the module
    docstring. ``als()`` is the short form.

    Example::

        model = ALS(rank=10, maxIter=10, regParam=0.1).fit(ratings)  # user, item, rating
        model.transform(test).select("prediction"), model.recommendForAllUsers(5)
    """

    model_class = ALSModel

    @keyword_params
    def __init__(
        self,
        *,
        rank: int = 10,
        maxIter: int = 10,
        regParam: float = 0.1,
        implicitPrefs: bool = False,
        alpha: float = 1.0,
        userCol: str = "user",
        itemCol: str = "item",
        seed: int = 0,
        ratingCol: str = "rating",
        nonnegative: bool = False,
        coldStartStrategy: str = "nan",
        blockSize: int = 4096,
        initialModel: Any = None,
    ) -> None:
        super().__init__()
        self._setDefault(maxIter=10)

    def rounds(self) -> int:
        return 2 * int(self.getMaxIter())

    def columns(self, dataset: DataFrame) -> list[str]:
        return [self.getUserCol(), self.getItemCol(), self.getOrDefault(self.ratingCol)]

    def preparer(self, dataset: DataFrame) -> Callable[[pa.Table], pa.Table]:
        user, item, rating = self.columns(dataset)
        users, items = self._ids(dataset)

        def prepare(table: pa.Table) -> pa.Table:
            u = lookup(users, table[user].to_numpy(zero_copy_only=False))
            i = lookup(items, table[item].to_numpy(zero_copy_only=False))
            for name, found in ((user, u), (item, i)):
                if (found < 0).any():
                    raise MLError(f"ALS: column '{name}' has a null id")
            return pa.table({"u": u, "i": i, "r": numbers(table, rating, "rating")})

        return prepare

    def _ids(self, dataset: DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct user and item ids (one Spark job each, once per fit)."""
        cached = getattr(self, "_fitting_ids", None)
        if cached is not None and cached[0] is dataset:
            return cached[1], cached[2]
        found = []
        for column in (self.getUserCol(), self.getItemCol()):
            if column not in dataset.columns:
                raise MLError(f"ALS: no column '{column}'; the columns are {dataset.columns}")
            values = dataset.select(F.col(column)).where(F.col(column).isNotNull()).distinct()
            ids = np.array(sorted(r[0] for r in values.collect()))
            if ids.size and (ids.dtype.kind not in "iu" or np.abs(ids).max() > 2**31 - 1):
                raise MLError(f"ALS: column '{column}' must hold integer ids (as MLlib's)")
            found.append(ids.astype(np.int64))
        self._fitting_ids = (dataset, found[0], found[1])
        return found[0], found[1]

    def start(self, dataset: DataFrame) -> Learned:
        for name in self.columns(dataset):
            if name not in dataset.columns:
                raise MLError(f"ALS: no column '{name}'; the columns are {dataset.columns}")
        used_rows(dataset, self.columns(dataset), "ALS")  # names a reserved column name
        users, items = self._ids(dataset)
        if not len(users) or not len(items):
            raise MLError("ALS needs ratings (the DataFrame is empty)")
        rank = int(self.getOrDefault(self.rank))
        rng = np.random.default_rng(int(self.getSeed()) & (2**63 - 1))
        return {
            "userIds": users,
            "itemIds": items,
            "users": self._initial(rng, len(users), rank),
            "items": self._initial(rng, len(items), rank),
            "half": 0,
        }

    def _initial(self, rng: np.random.Generator, rows: int, rank: int) -> np.ndarray:
        factors = rng.standard_normal((rows, rank))
        factors /= np.linalg.norm(factors, axis=1, keepdims=True)
        return np.abs(factors) if self.getOrDefault(self.nonnegative) else factors

    def round(self, learned: Learned) -> itf.CombineFn:
        settings = {
            "implicit": bool(self.getOrDefault(self.implicitPrefs)),
            "alpha": float(self.getOrDefault(self.alpha)),
            "reg": float(self.getRegParam()),
            "nonnegative": bool(self.getOrDefault(self.nonnegative)),
        }
        return NormalEquations(learned, settings)

    def warm_start(self, model: Any, dataset: DataFrame) -> Learned:
        """The factors of ``model`` (iterflow's or MLlib's ``ALSModel``) for the ids it
        knows; the ids only ``dataset`` has start as in a fresh fit."""
        learned = dict(self.start(dataset))
        for side, frame, key in SIDES:
            rows = getattr(model, frame).collect()
            if rows and len(rows[0]["features"]) != learned[side].shape[1]:
                raise MLError(
                    f"ALS(rank={learned[side].shape[1]}): the initialModel has rank "
                    f"{len(rows[0]['features'])}"
                )
            at = lookup(learned[key], np.array([row["id"] for row in rows]))
            for row, k in zip(rows, at, strict=True):
                if k >= 0:
                    learned[side][k] = row["features"]
        return learned


def als(
    df: DataFrame,
    *,
    rank: int = 10,
    max_rounds: int = 10,
    reg: float = 0.1,
    implicit: bool = False,
    alpha: float = 1.0,
    user: str = "user",
    item: str = "item",
    rating: str = "rating",
    nonnegative: bool = False,
    seed: int = 0,
    initial: Any = None,
    listen: Any = None,
    **run_options: Any,
) -> ALSModel:
    """Fit ALS: ``ALS(rank=rank, maxIter=max_rounds, regParam=reg, ...).fit(df)`` with the
    short forms' names (``max_rounds`` counts iterations, each two rounds; ``initial`` a
    fitted ``ALSModel`` to start from); ``listen`` and ``run_options`` go to the iteration
    (``progress``, ``event_log``, ``checkpoint_dir``...).

    Example::

        model = als(ratings, rank=10, max_rounds=10, reg=0.1)
        model.transform(test).select("user", "item", "prediction")
    """
    estimator = ALS(
        rank=rank,
        maxIter=max_rounds,
        regParam=reg,
        implicitPrefs=implicit,
        alpha=alpha,
        userCol=user,
        itemCol=item,
        ratingCol=rating,
        nonnegative=nonnegative,
        seed=seed,
        initialModel=initial,
    )
    options = {**run_options, **({"listen": listen} if listen is not None else {})}
    model: ALSModel = estimator.setIterationOptions(**options).fit(df)
    return model
