"""iterflow.ml's third-wave algorithms against MLlib's, same data, same session:

- ``GaussianMixture``, k = 8 on 1,000,000 x 16 (8 Gaussian blobs), 20 EM iterations
  (``tol=0``), the same ``seed`` (so the same start: the log-likelihoods are checked
  equal). Target iterflow / MLlib <= 0.5.
- ``ALS``, rank 10, 10 iterations, ``regParam=0.1`` on 1,000,000 ratings of 10,000
  users x 2,000 items (a rank-10 structure plus noise), 80/20 split: held-out RMSE
  checked within 1 %. Target <= 0.7.
- ``LinearSVC``, 1,000,000 x 20, ``regParam=0.01``, MLlib's default ``tol`` (each to its
  own stopping point): coefficients checked within 1e-4. Target <= 0.5.
- ``HalvingCrossValidator`` against ``CrossValidator``, both tuning iterflow's
  ``LogisticRegression`` (``maxIter=100``) on a 9-point grid (``regParam`` x
  ``elasticNetParam``), 3 folds, 1,000,000 x 20, ``BinaryClassificationEvaluator``: the
  same winner checked. Target <= 0.4 of the time. Both fit a fold's candidates together
  (``fitMultiple``); ``CrossValidator`` tuning MLlib's ``LogisticRegression`` on the same
  grid is the third variant (what MLlib users run today).

One ``local[2]`` session; a warm-up of every variant on a twentieth of the rows, then
``--reps`` measured runs of each taking turns (default 1: MLlib's EM alone takes
minutes). Each fit is timed from the call to the fitted model (which both libraries
make eagerly). ``--quick``: a twentieth of the rows. Results go to
``benchmarks/results/bench_ml_algorithms.json``.

    python benchmarks/bench_ml_algorithms.py            # ~20 min
    python benchmarks/bench_ml_algorithms.py --quick    # ~3 min
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from _common import finish, log, print_table, start_session
from pyspark.ml import classification, clustering, recommendation
from pyspark.ml.evaluation import BinaryClassificationEvaluator, RegressionEvaluator
from pyspark.ml.functions import array_to_vector
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iterflow.ml import ALS, GaussianMixture, HalvingCrossValidator, LinearSVC, LogisticRegression


def vectors(spark: SparkSession, x: np.ndarray, **columns: np.ndarray) -> DataFrame:
    """``x`` as a Vector column ``features`` with ``columns``, cached in 4 partitions."""
    table = pa.table(
        {"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]), **columns}
    )
    df = spark.createDataFrame(table).repartition(4)
    df = df.select(array_to_vector(F.col("x").cast("array<double>")).alias("features"), *columns)
    df = df.cache()
    df.count()
    return df


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    clock = time.perf_counter()
    value = run()
    return time.perf_counter() - clock, value


def compare(
    name: str, runs: dict[str, Callable[[DataFrame], Any]], full: Any, small: Any, reps: int
) -> dict[str, Any]:
    """A warm-up of every variant on ``small``, then ``reps`` turns of each on ``full``."""
    for variant, run in runs.items():
        seconds, _ = timed(lambda run=run: run(small))
        log(f"  {name} {variant} warm-up: {seconds:.2f} s")
    seconds_of: dict[str, list[float]] = {v: [] for v in runs}
    values: dict[str, Any] = {}
    for _ in range(reps):
        for variant, run in runs.items():
            seconds, values[variant] = timed(lambda run=run: run(full))
            seconds_of[variant].append(seconds)
            log(f"  {name} {variant}: {seconds:.2f} s")
    medians = {v: float(np.median(s)) for v, s in seconds_of.items()}
    first, second = list(runs)[:2]
    return {
        "s": seconds_of,
        "s_median": medians,
        "ratio_of_medians": medians[first] / medians[second],
        "values": values,
    }


def mixture(spark: SparkSession, rows: int, reps: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 6, (8, 16))
    x = centers[rng.integers(0, 8, rows)] + rng.normal(0, 1.0, (rows, 16))
    full, small = vectors(spark, x), vectors(spark, x[: rows // 20])
    options = {"k": 8, "maxIter": 20, "tol": 0.0, "seed": 5}
    runs = {
        "iterflow": lambda df: (
            GaussianMixture(**options).setIterationOptions(progress=False).fit(df)
        ),
        "mllib": lambda df: clustering.GaussianMixture(**options).fit(df),
    }
    out = compare("GaussianMixture", runs, full, small, reps)
    ours, theirs = out.pop("values").values()
    out["check"] = {
        "loglik_iterflow": ours.summary.logLikelihood,
        "loglik_mllib": theirs.summary.logLikelihood,
        "iterations": [ours.summary.numIter, theirs.summary.numIter],
        "weights_max_gap": float(np.max(np.abs(np.array(ours.weights) - theirs.weights))),
    }
    return out


def factorization(spark: SparkSession, ratings: int, reps: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    users, items = max(ratings // 100, 50), max(ratings // 500, 20)
    u_f, i_f = rng.normal(0, 0.5, (users, 10)), rng.normal(0, 0.5, (items, 10))
    u, i = rng.integers(0, users, ratings), rng.integers(0, items, ratings)
    value = np.einsum("ij,ij->i", u_f[u], i_f[i]) + rng.normal(0, 0.3, ratings)
    table = pa.table({"user": u.astype(np.int32), "item": i.astype(np.int32), "rating": value})
    df = spark.createDataFrame(table).dropDuplicates(["user", "item"]).repartition(4)
    train, test = (part.cache() for part in df.randomSplit([0.8, 0.2], seed=2))
    small = train.limit(max(ratings // 20, 1000)).cache()
    for frame in (train, test, small):
        frame.count()
    options = {"rank": 10, "maxIter": 10, "regParam": 0.1, "coldStartStrategy": "drop"}
    runs = {
        "iterflow": lambda d: ALS(**options).setIterationOptions(progress=False).fit(d),
        "mllib": lambda d: recommendation.ALS(**options, seed=3).fit(d),
    }
    out = compare("ALS", runs, train, small, reps)
    evaluator = RegressionEvaluator(metricName="rmse", labelCol="rating")
    ours, theirs = out.pop("values").values()
    out["check"] = {
        "rmse_iterflow": evaluator.evaluate(ours.transform(test)),
        "rmse_mllib": evaluator.evaluate(theirs.transform(test)),
        "users": users,
        "items": items,
    }
    return out


def classified(spark: SparkSession, rows: int) -> tuple[DataFrame, DataFrame]:
    """1,000,000 x 20 features and a noisy 0/1 label (full, and a twentieth)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(rows, 20))
    margin = x @ rng.normal(0, 1, 20) + rng.normal(0, 2.0, rows)
    label = (margin > 0).astype(np.float64)
    return vectors(spark, x, label=label), vectors(
        spark, x[: rows // 20], label=label[: rows // 20]
    )


def svm(full: DataFrame, small: DataFrame, reps: int) -> dict[str, Any]:
    runs = {
        "iterflow": lambda d: LinearSVC(regParam=0.01).setIterationOptions(progress=False).fit(d),
        "mllib": lambda d: classification.LinearSVC(regParam=0.01).fit(d),
    }
    out = compare("LinearSVC", runs, full, small, reps)
    ours, theirs = out.pop("values").values()
    gap = np.abs(
        np.append(ours.coefficients.toArray(), ours.intercept)
        - np.append(theirs.coefficients.toArray(), theirs.intercept)
    )
    out["check"] = {
        "coefficients_max_gap": float(gap.max()),
        "iterations": [ours.summary.totalIterations, theirs.summary().totalIterations],
    }
    return out


class TimedEvaluator(BinaryClassificationEvaluator):
    """``BinaryClassificationEvaluator`` adding up the seconds its evaluations take (per
    variant: ``seconds`` is reset before each timed run)."""

    seconds = 0.0

    def evaluate(self, dataset: DataFrame, params: Any = None) -> float:
        clock = time.perf_counter()
        try:
            return float(super().evaluate(dataset, params))
        finally:
            TimedEvaluator.seconds += time.perf_counter() - clock


def tuning(full: DataFrame, small: DataFrame, reps: int) -> dict[str, Any]:
    lr = LogisticRegression(maxIter=100).setIterationOptions(progress=False)
    grid = (
        ParamGridBuilder()
        .addGrid(lr.regParam, [0.001, 0.01, 0.1])
        .addGrid(lr.elasticNetParam, [0.0, 0.5, 1.0])
        .build()
    )
    options = {
        "estimator": lr,
        "estimatorParamMaps": grid,
        "evaluator": TimedEvaluator(),
        "numFolds": 3,
        "seed": 7,
    }
    mllib_lr = classification.LogisticRegression(maxIter=100)
    mllib_grid = [{mllib_lr.getParam(p.name): v for p, v in m.items()} for m in grid]
    mllib = {**options, "estimator": mllib_lr, "estimatorParamMaps": mllib_grid}
    evaluation_s: dict[str, list[float]] = {}

    def evaluated(name: str, validator: Any) -> Callable[[DataFrame], Any]:
        def run(df: DataFrame) -> Any:
            TimedEvaluator.seconds = 0.0
            fitted = validator.fit(df)
            evaluation_s.setdefault(name, []).append(TimedEvaluator.seconds)
            return fitted

        return run

    runs = {
        "halving": evaluated("halving", HalvingCrossValidator(**options)),
        "cross_validator": evaluated("cross_validator", CrossValidator(**options)),
        "cross_validator_mllib": evaluated("cross_validator_mllib", CrossValidator(**mllib)),
    }
    out = compare("tuning", runs, full, small, reps)
    # The evaluator's share of each run (the warm-up's first entry dropped).
    out["evaluation_s"] = {name: seconds[1:] for name, seconds in evaluation_s.items()}
    medians = out["s_median"]
    out["halving_to_mllib_cross_validator"] = medians["halving"] / medians["cross_validator_mllib"]
    out["cross_validator_to_mllib"] = medians["cross_validator"] / medians["cross_validator_mllib"]
    halving, full_cv, _ = out.pop("values").values()
    best = int(np.argmax(full_cv.avgMetrics))
    chosen = [halving.bestModel.getRegParam(), halving.bestModel.getElasticNetParam()]
    picked = next(
        j for j, m in enumerate(grid) if [m[lr.regParam], m[lr.elasticNetParam]] == chosen
    )
    out["check"] = {
        "same_winner": chosen == [grid[best][lr.regParam], grid[best][lr.elasticNetParam]],
        # The binned AUC of one model on the same rows moves by ~1e-6 from run to run:
        # candidates closer than that are tied.
        "winner_gap": float(full_cv.avgMetrics[best] - full_cv.avgMetrics[picked]),
        "halving_winner": chosen,
        "cross_validator_metrics": list(full_cv.avgMetrics),
        "rungs": [(r.rounds, r.metrics) for r in halving.rungs],
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--only", choices=["mixture", "als", "svm", "tuning"])
    args = parser.parse_args()
    rows = 50_000 if args.quick else 1_000_000
    spark = start_session()
    results: dict[str, Any] = {}
    if args.only in (None, "mixture"):
        log(f"GaussianMixture k=8, {rows:,} x 16, 20 iterations")
        results["gaussian_mixture"] = mixture(spark, rows, args.reps)
    if args.only in (None, "als"):
        log(f"ALS rank 10, 10 iterations, {rows:,} ratings")
        results["als"] = factorization(spark, rows, args.reps)
    if args.only in (None, "svm", "tuning"):
        full, small = classified(spark, rows)
        if args.only in (None, "svm"):
            log(f"LinearSVC {rows:,} x 20")
            results["linear_svc"] = svm(full, small, args.reps)
        if args.only in (None, "tuning"):
            log(f"HalvingCrossValidator / CrossValidator, 9 ParamMaps, 3 folds, {rows:,} x 20")
            results["tuning"] = tuning(full, small, args.reps)
    table = [(f"{name}: ratio of medians", r["ratio_of_medians"]) for name, r in results.items()]
    table += [(f"{name}: check", r["check"]) for name, r in results.items()]
    print_table("iterflow.ml against MLlib", table)
    finish(spark, "bench_ml_algorithms", args.quick, results, rows=rows, reps=args.reps)


if __name__ == "__main__":
    main()
