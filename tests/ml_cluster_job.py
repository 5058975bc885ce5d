"""k-means, linear regression and PageRank on ``local-cluster[2,1,1024]`` (two executor
JVMs with their own Python workers reading the Arrow files of ``RoundContext.columnar``),
and the third wave's Estimators (a logistic grid fitted together, GaussianMixture, ALS,
LinearSVC) beside MLlib's on the same cluster; prints the results as one JSON line. Run
by tests/test_ml_cluster.py in its own process: a process has one SparkContext."""

from __future__ import annotations

import json
import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pyarrow as pa
from child_jobs import job_session
from pyspark.ml import classification, clustering, recommendation
from pyspark.ml.evaluation import RegressionEvaluator
from pyspark.ml.linalg import Vectors
from pyspark.sql import DataFrame, SparkSession

from iterflow.graph import Graph, pagerank
from iterflow.ml import (
    ALS,
    GaussianMixture,
    LinearSVC,
    LogisticRegression,
    kmeans,
    linear_regression,
)


def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    points = np.concatenate([rng.normal(c, 0.5, (300, 2)) for c in ([0, 0], [6, 0], [0, 6])])
    x = rng.normal(size=(300, 2))
    y = x @ np.array([2.0, -1.0]) + 0.5 + rng.normal(0, 0.1, 300)
    src, dst = rng.integers(0, 50, 200), rng.integers(0, 50, 200)
    return {"points": points, "x": x, "y": y, "src": src, "dst": dst}


def main() -> None:
    spark = job_session("local-cluster[2,1,1024]", "iterflow-ml-cluster")
    d = data()
    points = d["points"]
    offsets = pa.array(np.arange(len(points) + 1, dtype=np.int32) * 2)
    frame = spark.createDataFrame(
        pa.table({"features": pa.ListArray.from_arrays(offsets, pa.array(points.ravel()))})
    ).repartition(4)
    model = kmeans(frame, 3, init=points[[0, 1, 2]], max_rounds=5, tol=None, progress=False)
    rows = spark.createDataFrame(
        pa.table({"x0": d["x"][:, 0], "x1": d["x"][:, 1], "label": d["y"]})
    ).repartition(4)
    fit = linear_regression(
        rows,
        features=["x0", "x1"],
        solver="gd",
        learning_rate=0.9,
        max_rounds=100,
        tol=1e-9,
        progress=False,
    )
    graph = Graph(
        spark.range(50),
        spark.createDataFrame(pa.table({"src": d["src"], "dst": d["dst"]})).repartition(4),
    )
    ranks = pagerank(graph, tol=1e-10, method="arrow", progress=False).collect()
    print(
        json.dumps(
            {
                "executors": spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1,
                "centroids": model.centroids.tolist(),
                "coefficients": [*fit.coefficients.tolist(), fit.intercept],
                "ranks": {int(r["id"]): r["pagerank"] for r in ranks},
                **third_wave(spark),
            }
        )
    )
    spark.stop()


def third_wave(spark: SparkSession) -> dict[str, object]:
    """iterflow's and MLlib's fits of the same data on this cluster, side by side."""
    d = data()
    labels = (d["x"] @ np.array([1.0, -1.0]) + 0.3 * d["y"] > 0.4).astype(float)
    rows = vectors(spark, d["x"], labels)
    ours, theirs = (
        LogisticRegression().setIterationOptions(progress=False),
        (classification.LogisticRegression()),
    )
    regs = [0.0, 0.01, 0.1]
    joint = dict(ours.fitMultiple(rows, [{ours.regParam: r} for r in regs]))
    logistic = [
        [
            joint[j].coefficients.toArray().tolist(),
            theirs.fit(rows, {theirs.regParam: r}).coefficients.toArray().tolist(),
        ]
        for j, r in enumerate(regs)
    ]
    svm = [
        LinearSVC(regParam=0.01).setIterationOptions(progress=False).fit(rows).coefficients,
        classification.LinearSVC(regParam=0.01).fit(rows).coefficients,
    ]
    # Cached: MLlib's start is a takeSample over the partitions, which a repartition made
    # anew for each fit could fill in another order on a cluster.
    blobs = vectors(spark, d["points"], np.zeros(len(d["points"]))).cache()
    blobs.count()
    options = {"k": 3, "seed": 4, "maxIter": 10, "tol": 0.0}
    mixture = [
        GaussianMixture(**options).setIterationOptions(progress=False).fit(blobs),
        clustering.GaussianMixture(**options).fit(blobs),
    ]
    return {
        "logistic": logistic,
        "svm": [model.toArray().tolist() for model in svm],
        "mixture": [model.summary.logLikelihood for model in mixture],
        "als": factorization(spark),
    }


def vectors(spark: SparkSession, x: np.ndarray, label: np.ndarray) -> DataFrame:
    rows = [(Vectors.dense(r.tolist()), float(v)) for r, v in zip(x, label, strict=True)]
    return spark.createDataFrame(rows, ["features", "label"]).repartition(4)


def factorization(spark: SparkSession) -> list[float]:
    """The training RMSE of iterflow's ALS and MLlib's, rank 3, on a rank-3 matrix."""
    rng = np.random.default_rng(5)
    users, items = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    u, i = rng.integers(0, 40, 600), rng.integers(0, 30, 600)
    ratings = (
        spark.createDataFrame(
            pa.table(
                {
                    "user": u.astype(np.int32),
                    "item": i.astype(np.int32),
                    "rating": np.einsum("ij,ij->i", users[u], items[i]),
                }
            )
        )
        .dropDuplicates(["user", "item"])
        .repartition(4)
    )
    options = {"rank": 3, "maxIter": 10, "regParam": 0.01}
    fits = [
        ALS(**options).setIterationOptions(progress=False).fit(ratings),
        recommendation.ALS(**options, seed=1).fit(ratings),
    ]
    rmse = RegressionEvaluator(metricName="rmse", labelCol="rating")
    return [rmse.evaluate(model.transform(ratings)) for model in fits]


if __name__ == "__main__":
    main()
