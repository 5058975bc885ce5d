"""k-means, linear regression and PageRank on ``local-cluster[2,1,1024]`` (two executor
JVMs with their own Python workers reading the Arrow files of ``RoundContext.columnar``);
prints the results as one JSON line. Run by tests/test_ml_cluster.py in its own process:
a process has one SparkContext."""

from __future__ import annotations

import json
import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np
import pyarrow as pa
from child_jobs import job_session

from iterflow.graph import Graph, pagerank
from iterflow.ml import kmeans, linear_regression


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
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main()
