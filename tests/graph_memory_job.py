"""A graph job under a driver-side memory cap (run by tests/test_graph_memory.py).

    python tests/graph_memory_job.py VERTICES EDGES ROUNDS DIRECTORY

The session caps what any Spark action may bring to the driver at 1 MiB
(``spark.driver.maxResultSize=1m``, with ``spark.driver.memory=1g``) and sets the vector
limit of ``iterflow.graph`` to 1,000 vertices, so ``method="auto"`` runs the block path.
A rank or label vector of VERTICES doubles is larger than the cap: collecting it fails,
as the job shows with ``method="arrow"`` first. Then PageRank (ROUNDS rounds) and
connected components run on the block path and are compared, in Spark, with numpy
references written next to the graph as Parquet. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp
from child_jobs import job_session
from scipy.sparse.csgraph import connected_components as scipy_components

from iterflow.graph import Graph, connected_components, pagerank


def reference_ranks(src: np.ndarray, dst: np.ndarray, n: int, rounds: int) -> np.ndarray:
    """networkx's PageRank normalization by power iteration, from 1/n, ``rounds`` rounds."""
    pairs = np.unique(src * n + dst)
    s, d = pairs // n, pairs % n
    out = np.bincount(s, minlength=n).astype(float)
    rank = np.full(n, 1.0 / n)
    for _ in range(rounds):
        spread = np.bincount(d, weights=rank[s] / out[s], minlength=n)
        dangling = rank[out == 0].sum()
        rank = 0.85 * (spread + dangling / n) + 0.15 / n
    return rank


def main() -> None:
    n, m, rounds, directory = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    spark = job_session(
        "local[2]",
        "graph-memory",
        **{
            "spark.driver.memory": "1g",
            "spark.driver.maxResultSize": "1m",
            "spark.iterflow.graph.vectorLimit": "1000",
        },
    )
    rng = np.random.default_rng(7)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    root = Path(directory)
    pq.write_table(pa.table({"src": src, "dst": dst}), root / "edges.parquet")
    pq.write_table(pa.table({"id": np.arange(n)}), root / "vertices.parquet")
    adjacency = sp.coo_matrix((np.ones(m), (src, dst)), shape=(n, n))
    labels = scipy_components(adjacency, directed=True, connection="weak")[1]
    smallest = np.full(labels.max() + 1, n)
    np.minimum.at(smallest, labels, np.arange(n))
    pq.write_table(
        pa.table(
            {
                "id": np.arange(n),
                "rank": reference_ranks(src, dst, n, rounds),
                "component": smallest[labels],
            }
        ),
        root / "reference.parquet",
    )
    g = Graph(
        spark.read.parquet(str(root / "vertices.parquet")),
        spark.read.parquet(str(root / "edges.parquet")),
    )
    # joined by shuffles: a broadcast of the reference would collect it past the cap
    reference = spark.read.parquet(str(root / "reference.parquet")).hint("merge")
    result: dict[str, object] = {}
    try:  # the cap bites: the vector path collects the rank vector
        pagerank(g, tol=None, max_rounds=1, method="arrow", progress=False).count()
        result["arrow"] = "ran"
    except Exception as error:  # the job reports whatever stopped it
        said = str(error)
        at = said.find("maxResultSize")
        result["arrow"] = said[max(at - 200, 0) : at + 100] if at >= 0 else said[:2000]
    ranks = pagerank(g, tol=None, max_rounds=rounds, progress=False)
    row = (
        ranks.join(reference, "id")
        .selectExpr("count(*) AS n", "max(abs(pagerank - rank)) AS error", "sum(pagerank) AS total")
        .first()
    )
    result["pagerank"] = row.asDict() if row is not None else None
    components = connected_components(g, progress=False)
    row = (
        components.join(reference.withColumnRenamed("component", "expected"), "id")
        .selectExpr("count(*) AS n", "sum(CAST(component != expected AS INT)) AS wrong")
        .first()
    )
    result["components"] = row.asDict() if row is not None else None
    spark.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
