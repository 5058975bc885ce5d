"""The k-means demo's data: points in blobs around random centers, for ``iterflow.ml.kmeans``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from iterflow.demo.online_kmeans_demo import blobs


def random_blobs(
    spark: SparkSession, points: int, k: int, dims: int, *, seed: int = 1
) -> tuple[DataFrame, np.ndarray]:
    """``points`` points around ``k`` centers drawn uniformly from [-10, 10]^dims, with
    Gaussian noise 0.5: a DataFrame with an ``array<double>`` column ``features``, and the
    centers, ``(k, dims)``. Both depend only on the arguments.

    Example::

        points, centers = random_blobs(spark, 10_000, k=3, dims=2)
        kmeans(points, 3).centroids  # iterflow.ml.kmeans: next to centers, in some order
    """
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10.0, 10.0, size=(k, dims))
    flat = blobs(rng, points, centers).ravel()
    offsets = pa.array(np.arange(points + 1, dtype=np.int32) * dims)
    features = pa.ListArray.from_arrays(offsets, pa.array(flat))
    return spark.createDataFrame(pa.table({"features": features})), centers
