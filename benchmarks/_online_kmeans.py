"""The partial sums of bench_unbounded.py's "plain" variant: the online k-means demo's kernel,
laid out one row per cluster and added up with a ``groupBy``, as a hand-written
``foreachBatch`` query without iterflow would add them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iterflow.demo.online_kmeans_demo import added_partials, partials_kernel

# Spark's Python workers cannot import this module (benchmarks/ is on the driver's path
# only), so its kernels travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def cluster_sums_kernel(
    centers: np.ndarray,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: per partition, one row per cluster, ``cluster, n, s0..s{d-1}``."""
    k, dims = centers.shape
    partials = partials_kernel(centers)

    def kernel(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sums, counts = added_partials(partials(batches), k, dims)
        columns = [pa.array(np.arange(k, dtype=np.int32)), pa.array(counts.astype(np.int64))]
        columns += [pa.array(sums[:, d]) for d in range(dims)]
        yield pa.RecordBatch.from_arrays(columns, names=["cluster", "n", *sum_columns(dims)])

    return kernel


def sum_columns(dims: int) -> list[str]:
    return [f"s{d}" for d in range(dims)]


def batch_sums(points: DataFrame, centers: np.ndarray) -> DataFrame:
    """Per cluster, the sum (``total``, an array) and count (``n``) of its nearest new points."""
    columns = sum_columns(centers.shape[1])
    schema = ", ".join(["cluster INT", "n LONG", *(f"{c} DOUBLE" for c in columns)])
    partial = points.select("features").mapInArrow(cluster_sums_kernel(centers), schema)
    summed = partial.groupBy("cluster").agg(
        F.sum("n").alias("n"), *(F.sum(c).alias(c) for c in columns)
    )
    return summed.select("cluster", "n", F.array(*columns).alias("total"))
