"""k-means with iterflow.ml: fit, watch every round, predict.

Run: python examples/kmeans.py [points]
"""

import sys

import numpy as np
import pyarrow as pa

import iterflow as itf
from iterflow.ml import kmeans

count = int(sys.argv[1]) if len(sys.argv) > 1 else 30_000
spark = itf.session()
rng = np.random.default_rng(7)
centers = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0], [8.0, 8.0]])
points = centers[rng.integers(0, 4, count)] + rng.normal(0.0, 1.0, (count, 2))
offsets = pa.array(np.arange(count + 1, dtype=np.int32) * 2)
df = spark.createDataFrame(
    pa.table({"features": pa.ListArray.from_arrays(offsets, pa.array(points.ravel()))})
).cache()


def show(ctx: itf.RoundEnd) -> None:
    p = ctx.progress
    print(f"round {p.epoch}: loss {p.metrics['loss']:.1f}, largest move {p.converged_value:.2e}")


model = kmeans(df, 4, max_rounds=30, tol=1e-6, seed=3, listen=show)
print(f"stopped after {model.rounds} rounds: {model.termination.reason}")
print("centroids:\n", np.round(model.centroids, 3))
model.predict(df).groupBy("prediction").count().orderBy("prediction").show()
