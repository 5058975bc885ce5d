"""ML algorithms: ``iterflow.ml`` against Spark MLlib (``pyspark.ml``), in the same JVM.

Two workloads, each built once, cached and counted before anything is timed:

1. **k-means.** 1,000,000 points in 16 dimensions (``--quick``: 100,000): 16 centers
   uniform in [-10, 10] from ``numpy.random.default_rng(0)``, each point a center
   chosen uniformly plus Gaussian noise of standard deviation 1
   (``iterflow.demo.online_kmeans_demo.blobs``). iterflow gets an ``array<double>`` column
   ``features`` (``spark.createDataFrame`` of a pyarrow table whose column is a
   ``ListArray`` over the flat points, as ``iterflow demo kmeans`` builds it); MLlib
   gets the same column as a ``Vector`` (``pyspark.ml.functions.array_to_vector``).
   Both are repartitioned to 4, cached and counted. The initial centroids are 16
   distinct points drawn with ``default_rng(1)``.

   - **iterflow**: ``kmeans(points, 16, init=centroids, max_rounds=20, tol=None,
     progress=False)``: always 20 rounds. Its time includes round 0 writing the points
     once as Arrow files (``RoundContext.columnar``).
   - **MLlib, same centroids**: ``pyspark.ml.clustering.KMeans`` cannot start from
     given centroids in PySpark 4.3: it has no ``initialModel`` parameter, neither in
     Python nor on its JVM object (``initMode`` is "random" or "k-means||" only). Its
     row solver runs ``org.apache.spark.mllib.clustering.KMeans``, whose public
     ``setInitialModel`` does. So this variant calls, through py4j, ``new
     mllib.clustering.KMeans().setK(16).setMaxIterations(20).setEpsilon(0.0)
     .setInitialModel(new mllib.clustering.KMeansModel(centroids)).run(rdd)`` where
     ``rdd`` is ``ml.util.DatasetUtils.columnToOldVector(vectors, "features")``: the
     cached Vector column as an RDD of vectors (``run`` persists the vectors with their
     norms during the run, as MLlib does for an uncached input). The centroids cross to
     the JVM as ``Vectors.parse`` of their ``repr`` (exact; checked).
   - **MLlib ``pyspark.ml`` fit, random init** (reference): ``KMeans(k=16,
     maxIter=20, tol=0.0, initMode="random", seed=1).fit(vectors)``: what a
     ``pyspark.ml`` user runs. Its default ``solver="auto"`` picks the block solver
     for dense vectors, after one extra pass over the data to measure the density, and
     ``initMode="random"`` samples its centroids with ``takeSample``; both are inside
     its time. It starts elsewhere, so only its time per iteration is compared.

   MLlib stops early only when no centroid moves at all (``tol`` 0); the iteration
   counts are reported. Check: the final centroids of iterflow's and MLlib's warm-up
   runs from the same centroids, matched by nearest, agree within 1e-6 (and the
   matching is one-to-one); so does the cost of the last assignment (relative).

2. **Logistic regression.** 1,000,000 rows x 20 features (``--quick``: 100,000): the
   features standard normal from ``default_rng(0)``, true weights ``normal(0, 0.5)``,
   intercept 0.3, labels drawn as Bernoulli(sigmoid(x.w + b)) (the noise). One
   DataFrame with 20 double columns and ``label``, repartitioned to 4, cached and
   counted; MLlib's input is its ``VectorAssembler`` output (``features``, ``label``),
   cached and counted.

   - **iterflow**: ``logistic_regression(df, features=[20 columns], max_rounds=50,
     tol=None, solver="gd", learning_rate=1.0, progress=False)``: full-batch gradient descent,
     always 50 rounds.
   - **MLlib**: ``LogisticRegression(maxIter=50, tol=0.0, regParam=0.0,
     standardization=False).fit(assembled)``: L-BFGS, which may stop before 50
     iterations (it did: ``summary.totalIterations`` is reported). Its time includes its
     pass over the data for the feature and label statistics.

   The algorithms differ (L-BFGS converges in far fewer iterations than gradient
   descent), so the figure compared is the time per iteration, total / iterations.
   Accuracy is only sanity-checked: both final losses are finite; iterflow's is the
   ``loss`` gauge of its last round, MLlib's ``summary.objectiveHistory[-1]``.

3. **L-BFGS to MLlib's stopping point** (``--lbfgs``: this workload alone). The
   logistic-regression data above; both fit the same objective with the same stopping
   rule and run until it stops them:

   - **iterflow**: ``logistic_regression(df, features=[20 columns], solver="lbfgs",
     reg=0.01, standardization=True, max_rounds=100, tol=1e-6, progress=False)``. Its time
     includes making the rows resident (or writing them as Arrow files) and its pass for
     the statistics (round 0).
   - **MLlib**: ``LogisticRegression(maxIter=100, tol=1e-6, regParam=0.01).fit(assembled)``
     (``standardization`` is on by default), with its pass for the statistics.

   Target: iterflow / MLlib <= 0.5 in total time. Check: the coefficients and intercept
   agree within 1e-4; the iteration counts (``total_iterations``,
   ``summary.totalIterations``) and final objectives are reported.

What is timed: from the call until the fitted model is back on the driver (both
return their coefficients or centroids as local arrays, so nothing is left lazy).
Each comparison runs one warm-up of every variant, then 3 runs of each (``--quick``:
1), rotating which goes first (A, B, C / B, C, A / C, A, B); figures are medians and
ratios are ratios of medians. Every timed block runs in its own job group, so its
Spark jobs are counted (``_common.count_jobs``); between runs the script collects
garbage (not timed). iterflow's per-round figure is the median ``duration_s`` of its
rounds (from a listener), next to total / rounds.

    python benchmarks/bench_ml.py [--quick] [--lbfgs]
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from _common import (
    Run,
    Runner,
    compare_runners,
    finish,
    log,
    median,
    parse_args,
    print_table,
    ratio,
    start_session,
)
from pyspark.ml.classification import LogisticRegression
from pyspark.ml.clustering import KMeans
from pyspark.ml.feature import VectorAssembler
from pyspark.ml.functions import array_to_vector
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.demo.online_kmeans_demo import blobs
from iterflow.ml import kmeans, logistic_regression

TARGET = 1.0
SEED = 0
INIT_SEED = 1
PARTITIONS = 4
K = 16
DIMS = 16
KMEANS_ROUNDS = 20
LR_FEATURES = 20
LR_ROUNDS = 50
LEARNING_RATE = 1.0
TRUE_INTERCEPT = 0.3
CENTROID_TOL = 1e-6
LBFGS_TARGET = 0.5
LBFGS_MAX_ITER = 100
LBFGS_TOL = 1e-6
LBFGS_REG = 0.01
LBFGS_COEFFICIENT_TOL = 1e-4


class Rounds(itf.RoundListener):
    """Records every round's ``duration_s`` and ``loss`` gauge."""

    def __init__(self) -> None:
        self.duration_s: list[float] = []
        self.loss: list[float] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        self.duration_s.append(ctx.progress.duration_s)
        self.loss.append(float(ctx.progress.metrics["loss"]))

    def summary(self) -> dict[str, Any]:
        return {
            "iterations": len(self.duration_s),
            "round_s_median": median(self.duration_s),
            "duration_s": self.duration_s,
            "final_loss": self.loss[-1],
        }


def per_iteration(runs: list[Run]) -> dict[str, Any]:
    """The iteration counts of ``runs`` and their seconds per iteration (median, every run)."""
    seconds = [r.seconds / r.info["iterations"] for r in runs]
    return {
        "iterations": [r.info["iterations"] for r in runs],
        "s_per_iteration_median": median(seconds),
        "s_per_iteration": seconds,
    }


#: ``compare_runners`` with every variant's iterations and seconds per iteration.
compare = partial(compare_runners, figures=per_iteration, count="iterations")


# -- 1. k-means ----------------------------------------------------------------------------


def kmeans_inputs(
    spark: SparkSession, n: int
) -> tuple[np.ndarray, np.ndarray, DataFrame, DataFrame, float]:
    """``(points, initial centroids, array input, Vector input, build seconds)``."""
    rng = np.random.default_rng(SEED)
    centers = rng.uniform(-10.0, 10.0, size=(K, DIMS))
    points = blobs(rng, n, centers, spread=1.0)
    start = points[np.random.default_rng(INIT_SEED).choice(n, K, replace=False)]
    clock = time.perf_counter()
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * DIMS)
    column = pa.ListArray.from_arrays(offsets, pa.array(points.ravel()))
    arrays = spark.createDataFrame(pa.table({"features": column}))
    arrays = arrays.repartition(PARTITIONS).cache()
    arrays.count()
    vectors = arrays.select(array_to_vector(F.col("features")).alias("features")).cache()
    vectors.count()
    return points, start, arrays, vectors, time.perf_counter() - clock


def jvm_centroids(spark: SparkSession, centroids: np.ndarray) -> Any:
    """``centroids`` as a JVM ``Array[mllib.linalg.Vector]`` (``Vectors.parse`` of reprs)."""
    jvm = spark._jvm
    assert jvm is not None
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    linalg = jvm.org.apache.spark.mllib.linalg
    array = gateway.new_array(linalg.Vector, len(centroids))
    for i, row in enumerate(centroids.tolist()):
        array[i] = linalg.Vectors.parse("[" + ",".join(repr(float(x)) for x in row) + "]")
    return array


def from_jvm(vectors: Any) -> np.ndarray:
    """A JVM array of (mllib or ml) vectors as a ``(k, d)`` numpy array."""
    return np.array([list(v.toArray()) for v in vectors], dtype=np.float64)


def iterflow_kmeans(
    points: DataFrame, start: np.ndarray, recorder: type[Rounds] = Rounds
) -> Runner:
    """``kmeans(points, K, init=start, ...)`` for ``KMEANS_ROUNDS`` rounds; ``recorder`` listens."""

    def run() -> tuple[Any, dict[str, Any]]:
        rounds = recorder()
        model = kmeans(
            points, K, init=start, max_rounds=KMEANS_ROUNDS, tol=None, progress=False, listen=rounds
        )
        return model.centroids, {**rounds.summary(), "termination": model.termination.reason}

    return run


def mllib_kmeans_same_init(spark: SparkSession, vectors: DataFrame, start: Any) -> Runner:
    """``mllib.clustering.KMeans`` (the engine of ``ml.KMeans``' row solver) from ``start``."""

    def run() -> tuple[Any, dict[str, Any]]:
        jvm = spark._jvm
        assert jvm is not None
        clustering = jvm.org.apache.spark.mllib.clustering
        algorithm = (
            clustering.KMeans()
            .setK(K)
            .setMaxIterations(KMEANS_ROUNDS)
            .setEpsilon(0.0)
            .setInitialModel(clustering.KMeansModel(start))
        )
        rdd = jvm.org.apache.spark.ml.util.DatasetUtils.columnToOldVector(vectors._jdf, "features")
        model = algorithm.run(rdd)
        return from_jvm(model.clusterCenters()), {
            "iterations": int(model.numIter()),
            "final_cost": float(model.trainingCost()),
        }

    return run


def ml_kmeans_random_init(vectors: DataFrame) -> Runner:
    """``pyspark.ml.clustering.KMeans(...).fit``: default solver, ``initMode="random"``."""

    def run() -> tuple[Any, dict[str, Any]]:
        estimator = KMeans(k=K, maxIter=KMEANS_ROUNDS, tol=0.0, initMode="random", seed=INIT_SEED)
        model = estimator.fit(vectors)
        centroids = np.array([c.tolist() for c in model.clusterCenters()])
        return centroids, {
            "iterations": int(model.summary.numIter),
            "final_cost": float(model.summary.trainingCost),
            "solver": estimator.getSolver(),
        }

    return run


def check_centroids(
    iterflow_centroids: np.ndarray, mllib_centroids: np.ndarray, start: np.ndarray
) -> dict[str, Any]:
    """Match every iterflow centroid with its nearest MLlib centroid."""
    gaps = np.linalg.norm(iterflow_centroids[:, None, :] - mllib_centroids[None, :, :], axis=2)
    nearest = gaps.argmin(axis=1)
    largest = float(gaps.min(axis=1).max())
    one_to_one = len(set(nearest.tolist())) == len(mllib_centroids)
    moved = np.linalg.norm(iterflow_centroids - start, axis=1)
    return {
        "max_distance_to_nearest_mllib_centroid": largest,
        "matching_is_one_to_one": one_to_one,
        "same_order": bool(np.array_equal(nearest, np.arange(len(nearest)))),
        "within_tolerance": bool(one_to_one and largest <= CENTROID_TOL),
        "tolerance": CENTROID_TOL,
        "max_centroid_move_from_start": float(moved.max()),
    }


def kmeans_comparison(spark: SparkSession, n: int, repetitions: int) -> dict[str, Any]:
    points, start, arrays, vectors, build_s = kmeans_inputs(spark, n)
    log(f"k-means inputs: {n:,} points x {DIMS}, cached and counted in {build_s:.1f} s")
    jstart = jvm_centroids(spark, start)
    exact = bool(np.array_equal(from_jvm(jstart), start))
    if not exact:
        raise RuntimeError("the initial centroids changed on their way to the JVM")
    runners = {
        "iterflow": iterflow_kmeans(arrays, start),
        "mllib_same_init": mllib_kmeans_same_init(spark, vectors, jstart),
        "ml_fit_random_init": ml_kmeans_random_init(vectors),
    }

    def check(results: dict[str, Any]) -> dict[str, Any]:
        found = check_centroids(results["iterflow"], results["mllib_same_init"], start)
        if not found["within_tolerance"]:
            log(f"  CHECK FAILED: centroids differ: {found}")
        return {"centroids": found, "initial_centroids_exact_in_jvm": exact}

    log(f"k-means, {KMEANS_ROUNDS} rounds: {repetitions} runs each after a warm-up")
    summary = compare(spark, "kmeans", runners, repetitions, check)
    iterflow_cost = summary["iterflow"]["warm_up"]["final_loss"]
    mllib_cost = summary["mllib_same_init"]["warm_up"]["final_cost"]
    summary["check"]["final_cost_iterflow"] = iterflow_cost
    summary["check"]["final_cost_mllib"] = mllib_cost
    summary["check"]["final_cost_relative_difference"] = abs(iterflow_cost - mllib_cost) / abs(
        mllib_cost
    )
    summary["check"]["final_cost_ml_fit_random_init"] = summary["ml_fit_random_init"]["warm_up"][
        "final_cost"
    ]
    log(f"  checks: {summary['check']}")
    summary["ratio_iterflow_over_mllib_same_init"] = ratio(
        summary["iterflow"], summary["mllib_same_init"]
    )
    summary["ratio_per_iteration_iterflow_over_mllib_same_init"] = ratio(
        summary["iterflow"], summary["mllib_same_init"], "s_per_iteration"
    )
    summary["ratio_per_iteration_iterflow_over_ml_fit_random_init"] = ratio(
        summary["iterflow"], summary["ml_fit_random_init"], "s_per_iteration"
    )
    summary["iterflow"]["round_s_median"] = median(
        [r["round_s_median"] for r in summary["iterflow"]["runs"]]
    )
    summary["inputs"] = {
        "points": n,
        "dims": DIMS,
        "k": K,
        "build_and_cache_s": build_s,
        "initial_centroids": f"{K} distinct points drawn with default_rng({INIT_SEED})",
    }
    del points
    vectors.unpersist()
    arrays.unpersist()
    return summary


# -- 2. logistic regression ------------------------------------------------------------------


def regression_inputs(
    spark: SparkSession, n: int
) -> tuple[list[str], DataFrame, DataFrame, dict[str, Any]]:
    """``(feature names, columns input, assembled input, facts about them)``."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(n, LR_FEATURES))
    weights = rng.normal(0.0, 0.5, size=LR_FEATURES)
    probability = 1.0 / (1.0 + np.exp(-(x @ weights + TRUE_INTERCEPT)))
    label = (rng.random(n) < probability).astype(np.float64)
    names = [f"x{i}" for i in range(LR_FEATURES)]
    clock = time.perf_counter()
    table = pa.table({**{name: x[:, i] for i, name in enumerate(names)}, "label": label})
    columns = spark.createDataFrame(table).repartition(PARTITIONS).cache()
    columns.count()
    assembled = VectorAssembler(inputCols=names, outputCol="features").transform(columns)
    assembled = assembled.select("features", "label").cache()
    assembled.count()
    return (
        names,
        columns,
        assembled,
        {
            "rows": n,
            "features": LR_FEATURES,
            "build_and_cache_s": time.perf_counter() - clock,
            "positive_fraction": float(label.mean()),
            "true_intercept": TRUE_INTERCEPT,
        },
    )


def iterflow_logistic(df: DataFrame, names: list[str], recorder: type[Rounds] = Rounds) -> Runner:
    """``logistic_regression(df, ...)`` for ``LR_ROUNDS`` rounds; ``recorder`` listens."""

    def run() -> tuple[Any, dict[str, Any]]:
        rounds = recorder()
        model = logistic_regression(
            df,
            features=names,
            max_rounds=LR_ROUNDS,
            tol=None,
            solver="gd",
            learning_rate=LEARNING_RATE,
            progress=False,
            listen=rounds,
        )
        value = np.append(model.coefficients, model.intercept)
        return value, {**rounds.summary(), "termination": model.termination.reason}

    return run


def mllib_logistic(assembled: DataFrame) -> Runner:
    def run() -> tuple[Any, dict[str, Any]]:
        model = LogisticRegression(
            maxIter=LR_ROUNDS, tol=0.0, regParam=0.0, standardization=False
        ).fit(assembled)
        history = list(model.summary.objectiveHistory)
        value = np.append(model.coefficients.toArray(), model.intercept)
        return value, {
            "iterations": int(model.summary.totalIterations),
            "objective_history_length": len(history),
            "final_loss": float(history[-1]),
        }

    return run


def regression_comparison(spark: SparkSession, n: int, repetitions: int) -> dict[str, Any]:
    names, columns, assembled, inputs = regression_inputs(spark, n)
    log(
        f"regression inputs: {n:,} rows x {LR_FEATURES}, cached and counted in "
        f"{inputs['build_and_cache_s']:.1f} s"
    )
    runners = {"iterflow": iterflow_logistic(columns, names), "mllib": mllib_logistic(assembled)}

    def check(results: dict[str, Any]) -> dict[str, Any]:
        finite = all(np.isfinite(v).all() for v in results.values())
        if not finite:
            log("  CHECK FAILED: a coefficient is not finite")
        return {"coefficients_finite": bool(finite)}

    log(f"logistic regression, {LR_ROUNDS} rounds: {repetitions} runs each after a warm-up")
    summary = compare(spark, "logistic", runners, repetitions, check)
    check_ = summary["check"]
    check_["final_loss_iterflow"] = summary["iterflow"]["warm_up"]["final_loss"]
    check_["final_loss_mllib"] = summary["mllib"]["warm_up"]["final_loss"]
    check_["losses_finite"] = math.isfinite(check_["final_loss_iterflow"]) and math.isfinite(
        check_["final_loss_mllib"]
    )
    log(f"  checks: {check_}")
    summary["ratio_iterflow_over_mllib"] = ratio(summary["iterflow"], summary["mllib"])
    summary["ratio_per_iteration_iterflow_over_mllib"] = ratio(
        summary["iterflow"], summary["mllib"], "s_per_iteration"
    )
    summary["iterflow"]["round_s_median"] = median(
        [r["round_s_median"] for r in summary["iterflow"]["runs"]]
    )
    summary["inputs"] = inputs
    assembled.unpersist()
    columns.unpersist()
    return summary


# -- 3. L-BFGS to the stopping point -----------------------------------------------------


class Evaluations(itf.RoundListener):
    """Records every round's ``duration_s`` and whether its kernels ran resident."""

    def __init__(self) -> None:
        self.duration_s: list[float] = []
        self.resident: list[bool] = []

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        self.duration_s.append(ctx.progress.duration_s)
        self.resident.append(bool(ctx.progress.resident))


def iterflow_lbfgs(df: DataFrame, names: list[str]) -> Runner:
    def run() -> tuple[Any, dict[str, Any]]:
        rounds = Evaluations()
        model = logistic_regression(
            df,
            features=names,
            solver="lbfgs",
            reg=LBFGS_REG,
            standardization=True,
            max_rounds=LBFGS_MAX_ITER,
            tol=LBFGS_TOL,
            progress=False,
            listen=rounds,
        )
        return np.append(model.coefficients, model.intercept), {
            "iterations": model.total_iterations,
            "rounds": model.rounds,
            "stop_reason": model.stop_reason,
            "final_objective": float(model.objective_history[-1]),
            "round_0_s": rounds.duration_s[0],
            "round_s_median_after_0": median(rounds.duration_s[1:]),
            "resident_rounds": sum(rounds.resident),
        }

    return run


def mllib_lbfgs(assembled: DataFrame) -> Runner:
    def run() -> tuple[Any, dict[str, Any]]:
        model = LogisticRegression(maxIter=LBFGS_MAX_ITER, tol=LBFGS_TOL, regParam=LBFGS_REG).fit(
            assembled
        )
        return np.append(model.coefficients.toArray(), model.intercept), {
            "iterations": int(model.summary.totalIterations),
            "final_objective": float(model.summary.objectiveHistory[-1]),
        }

    return run


def lbfgs_comparison(spark: SparkSession, n: int, repetitions: int) -> dict[str, Any]:
    names, columns, assembled, inputs = regression_inputs(spark, n)
    log(f"L-BFGS inputs: {n:,} rows x {LR_FEATURES}, built in {inputs['build_and_cache_s']:.1f} s")
    runners = {"iterflow": iterflow_lbfgs(columns, names), "mllib": mllib_lbfgs(assembled)}

    def check(results: dict[str, Any]) -> dict[str, Any]:
        gap = float(np.abs(results["iterflow"] - results["mllib"]).max())
        if not gap <= LBFGS_COEFFICIENT_TOL:
            log(f"  CHECK FAILED: coefficients differ by {gap:.3g}")
        return {
            "max_coefficient_difference": gap,
            "within_tolerance": gap <= LBFGS_COEFFICIENT_TOL,
            "tolerance": LBFGS_COEFFICIENT_TOL,
        }

    log(f"L-BFGS to the stopping point: {repetitions} runs each after a warm-up")
    summary = compare(spark, "lbfgs", runners, repetitions, check)
    summary["ratio_iterflow_over_mllib"] = ratio(summary["iterflow"], summary["mllib"])
    summary["inputs"] = inputs
    assembled.unpersist()
    columns.unpersist()
    return summary


def lbfgs_main(spark: SparkSession, rows: int, repetitions: int, quick: bool) -> None:
    started = time.perf_counter()
    lb = lbfgs_comparison(spark, rows, repetitions)
    elapsed = time.perf_counter() - started
    it, ml = lb["iterflow"], lb["mllib"]
    print_table(
        f"L-BFGS logistic regression to MLlib's stopping point, {rows:,} x {LR_FEATURES}, "
        f"reg {LBFGS_REG}, tol {LBFGS_TOL:g} (medians of {repetitions})",
        [
            ("iterflow solver='lbfgs' (s)", it["s_median"]),
            ("MLlib LogisticRegression (s)", ml["s_median"]),
            (
                f"iterflow / MLlib (target <= {LBFGS_TARGET})",
                lb["ratio_iterflow_over_mllib"]["of_medians"],
            ),
            ("iterations, iterflow / MLlib", f"{it['iterations'][0]} / {ml['iterations'][0]}"),
            ("iterflow rounds (statistics + evaluations)", it["warm_up"]["rounds"]),
            ("iterflow round 0 (s, warm-up)", it["warm_up"]["round_0_s"]),
            ("iterflow median later round (s, warm-up)", it["warm_up"]["round_s_median_after_0"]),
            ("iterflow resident rounds (warm-up)", it["warm_up"]["resident_rounds"]),
            ("Spark jobs, iterflow / MLlib", f"{it['jobs'][0]} / {ml['jobs'][0]}"),
            ("max |coefficient difference|", lb["check"]["max_coefficient_difference"]),
            (
                "final objective, iterflow / MLlib",
                f"{it['warm_up']['final_objective']:.10f} / "
                f"{ml['warm_up']['final_objective']:.10f}",
            ),
            ("script wall time (s)", elapsed),
        ],
    )
    finish(
        spark,
        "bench_ml_lbfgs",
        quick,
        {"target_iterflow_over_mllib": LBFGS_TARGET, "lbfgs": lb, "script_s": elapsed},
        seed=SEED,
        partitions=PARTITIONS,
        regression_rows=rows,
        regression_features=LR_FEATURES,
        repetitions=repetitions,
        warm_up_runs=1,
        iterflow_lbfgs=f"logistic_regression(df, features=[x0..x19], solver='lbfgs', "
        f"reg={LBFGS_REG}, standardization=True, max_rounds={LBFGS_MAX_ITER}, "
        f"tol={LBFGS_TOL}, progress=False)",
        mllib_lbfgs=f"LogisticRegression(maxIter={LBFGS_MAX_ITER}, tol={LBFGS_TOL}, "
        f"regParam={LBFGS_REG}).fit(VectorAssembler output)",
    )


# -- main ----------------------------------------------------------------------------------


def main() -> None:
    args = parse_args(
        __doc__.splitlines()[0], lbfgs="only L-BFGS to MLlib's stopping point (workload 3)"
    )
    if args.quick:
        points, rows, repetitions = 100_000, 100_000, 1
    else:
        points, rows, repetitions = 1_000_000, 1_000_000, 3
    started = time.perf_counter()
    spark = start_session()
    if args.lbfgs:
        lbfgs_main(spark, rows, repetitions, args.quick)
        return
    km = kmeans_comparison(spark, points, repetitions)
    lr = regression_comparison(spark, rows, repetitions)
    elapsed = time.perf_counter() - started

    results = {
        "target_kmeans_iterflow_over_mllib": TARGET,
        "kmeans": km,
        "logistic_regression": lr,
        "script_s": elapsed,
    }
    it, same, fit = km["iterflow"], km["mllib_same_init"], km["ml_fit_random_init"]
    kc = km["check"]
    lit, lml = lr["iterflow"], lr["mllib"]
    rows_out: list[tuple[str, Any]] = [
        ("k-means: inputs built and cached (s, not timed)", km["inputs"]["build_and_cache_s"]),
        (f"k-means {KMEANS_ROUNDS} rounds: iterflow (s)", it["s_median"]),
        ("k-means: MLlib from the same centroids (s)", same["s_median"]),
        (
            f"k-means: iterflow / MLlib same centroids (target <= {TARGET})",
            km["ratio_iterflow_over_mllib_same_init"]["of_medians"],
        ),
        (
            "k-means: iterations, iterflow / MLlib",
            f"{it['iterations'][0]} / {same['iterations'][0]}",
        ),
        ("k-means: iterflow s per round (total / rounds)", it["s_per_iteration_median"]),
        ("k-means: iterflow median round duration_s", it["round_s_median"]),
        ("k-means: MLlib same centroids s per iteration", same["s_per_iteration_median"]),
        (
            "k-means: per iteration, iterflow / MLlib same centroids",
            km["ratio_per_iteration_iterflow_over_mllib_same_init"]["of_medians"],
        ),
        ("k-means: ml KMeans.fit, random init (s)", fit["s_median"]),
        ("k-means: ml KMeans.fit iterations", fit["iterations"][0]),
        ("k-means: ml KMeans.fit s per iteration", fit["s_per_iteration_median"]),
        (
            "k-means: per iteration, iterflow / ml KMeans.fit",
            km["ratio_per_iteration_iterflow_over_ml_fit_random_init"]["of_medians"],
        ),
        (
            "k-means: Spark jobs, iterflow / MLlib same / ml fit",
            f"{it['jobs'][0]} / {same['jobs'][0]} / {fit['jobs'][0]}",
        ),
        (
            "k-means: max centroid distance iterflow-MLlib",
            kc["centroids"]["max_distance_to_nearest_mllib_centroid"],
        ),
        (f"k-means: centroids agree within {CENTROID_TOL:g}", kc["centroids"]["within_tolerance"]),
        ("k-means: final cost relative difference", kc["final_cost_relative_difference"]),
        ("logistic: inputs built and cached (s, not timed)", lr["inputs"]["build_and_cache_s"]),
        (f"logistic {LR_ROUNDS} rounds: iterflow (s)", lit["s_median"]),
        ("logistic: MLlib L-BFGS (s)", lml["s_median"]),
        ("logistic: iterflow / MLlib, total", lr["ratio_iterflow_over_mllib"]["of_medians"]),
        (
            "logistic: iterations, iterflow / MLlib",
            f"{lit['iterations'][0]} / {lml['iterations'][0]}",
        ),
        ("logistic: iterflow s per round (total / rounds)", lit["s_per_iteration_median"]),
        ("logistic: iterflow median round duration_s", lit["round_s_median"]),
        ("logistic: MLlib s per iteration", lml["s_per_iteration_median"]),
        (
            "logistic: per iteration, iterflow / MLlib",
            lr["ratio_per_iteration_iterflow_over_mllib"]["of_medians"],
        ),
        ("logistic: Spark jobs, iterflow / MLlib", f"{lit['jobs'][0]} / {lml['jobs'][0]}"),
        ("logistic: final loss, iterflow", lr["check"]["final_loss_iterflow"]),
        ("logistic: final loss, MLlib objectiveHistory[-1]", lr["check"]["final_loss_mllib"]),
        ("script wall time (s)", elapsed),
    ]
    print_table(
        f"iterflow.ml vs Spark MLlib: k-means {points:,} x {DIMS}, k={K}; logistic regression "
        f"{rows:,} x {LR_FEATURES} (medians of {repetitions})",
        rows_out,
    )
    finish(
        spark,
        "bench_ml",
        args.quick,
        results,
        seed=SEED,
        init_seed=INIT_SEED,
        partitions=PARTITIONS,
        kmeans_points=points,
        kmeans_dims=DIMS,
        k=K,
        kmeans_rounds=KMEANS_ROUNDS,
        regression_rows=rows,
        regression_features=LR_FEATURES,
        regression_rounds=LR_ROUNDS,
        solver="gd",
        learning_rate=LEARNING_RATE,
        repetitions=repetitions,
        warm_up_runs=1,
        iterflow_kmeans="kmeans(points, 16, init=centroids, max_rounds=20, tol=None, "
        "progress=False)",
        mllib_kmeans_same_init="mllib.clustering.KMeans().setK(16).setMaxIterations(20)"
        ".setEpsilon(0.0).setInitialModel(KMeansModel(centroids))"
        ".run(DatasetUtils.columnToOldVector(vectors, 'features')) via py4j",
        ml_kmeans_random_init="pyspark.ml.clustering.KMeans(k=16, maxIter=20, tol=0.0, "
        "initMode='random', seed=1).fit(vectors)",
        iterflow_logistic="logistic_regression(df, features=[x0..x19], max_rounds=50, tol=None, "
        "solver='gd', learning_rate=1.0, progress=False)",
        mllib_logistic="LogisticRegression(maxIter=50, tol=0.0, regParam=0.0, "
        "standardization=False).fit(VectorAssembler output)",
    )


if __name__ == "__main__":
    main()
