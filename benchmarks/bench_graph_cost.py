"""iterflow's graph paths against one thread of scipy (the COST measure), and the measured
costs behind ``method="auto"``.

On random graphs built as in ``bench_graph.py`` (uniform ``src`` and ``dst`` from
``numpy.random.default_rng(0)``), at 100,000 / 1,000,000, 500,000 / 5,000,000 and
2,000,000 / 20,000,000 vertices / edges (``--quick``: the first two at a tenth):

- PageRank, 10 rounds (``tol=None``), with ``method="arrow"`` (the rank vector on the
  driver, the edges resident), ``method="blocks"`` and the default (``"auto"``), from
  the call to ``count()`` of the result, preparation counted; against the same 10
  power iterations in scipy on one thread from the edge arrays in memory, building the
  CSR matrix counted. Every iterflow result is checked against the scipy ranks.
- Connected components, ``"arrow"``, ``"blocks"`` and the default, against
  ``scipy.sparse.csgraph.connected_components(connection="weak")`` (the CSR matrix
  built from the edge arrays counted); labels checked to give the same partition.

``--sizes`` picks a subset (``--sizes 2000000:20000000``). One session ``local[2]`` with
``--driver-memory`` (default 12g); variants alternate, one run each after a warm-up at
the smallest size. Results go to ``benchmarks/results/bench_graph_cost.json``.

    python benchmarks/bench_graph_cost.py            # ~15 min
    python benchmarks/bench_graph_cost.py --quick    # ~3 min
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import graphx_peer
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
from _common import finish, log, print_table, time_run
from bench_graph import ROUNDS, cached_inputs, iterflow_components, iterflow_pagerank, random_edges
from pyspark.sql import DataFrame

from iterflow.graph import Graph
from iterflow.graph.methods import choose_method

SIZES = ((100_000, 1_000_000), (500_000, 5_000_000), (2_000_000, 20_000_000))


def scipy_pagerank(src: np.ndarray, dst: np.ndarray, n: int, rounds: int) -> np.ndarray:
    """networkx's PageRank (distinct edges, dangling rank spread uniformly, alpha 0.85) for
    ``rounds`` power iterations from 1/n, with a CSR matrix built from the edge arrays."""
    matrix = scipy.sparse.csr_array(
        (np.ones(len(src)), (dst, src)), shape=(n, n)
    )  # duplicates summed: counted once below
    matrix.data[:] = 1.0
    out = np.asarray(matrix.sum(axis=0)).ravel()
    dangling = out == 0
    scale = np.divide(1.0, out, out=np.zeros(n), where=~dangling)
    ranks = np.full(n, 1.0 / n)
    for _ in range(rounds):
        spread = matrix @ (ranks * scale)
        ranks = 0.85 * (spread + ranks[dangling].sum() / n) + 0.15 / n
    return ranks


def scipy_components(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    matrix = scipy.sparse.csr_array((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))
    return scipy.sparse.csgraph.connected_components(matrix, connection="weak")[1]


def timed(function: Any, *args: Any) -> tuple[float, Any]:
    clock = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - clock, value


def ranks_of(ranks: DataFrame, n: int) -> np.ndarray:
    rows = ranks.select("id", "pagerank").toPandas()
    out = np.zeros(n)
    out[rows["id"].to_numpy()] = rows["pagerank"].to_numpy()
    return out


def same_partition(labels: np.ndarray, expected: np.ndarray) -> bool:
    """Whether two labellings group the vertices alike."""
    pairs = np.unique(np.stack([labels, expected]), axis=1)
    return len(pairs[0]) == len(np.unique(labels)) == len(np.unique(expected))


def components_of(components: DataFrame, n: int) -> np.ndarray:
    rows = components.select("id", "component").toPandas()
    out = np.zeros(n, dtype=np.int64)
    out[rows["id"].to_numpy()] = rows["component"].to_numpy()
    return out


def one_size(spark: Any, n: int, m: int) -> dict[str, Any]:
    """Every variant at ``n`` vertices and ``m`` edges."""
    src, dst = random_edges(n, m)
    vertices, edges = cached_inputs(spark, {"src": src, "dst": dst}, n)
    g = Graph(vertices, edges)
    scipy_s, expected = timed(scipy_pagerank, src, dst, n, ROUNDS)
    csgraph_s, labels = timed(scipy_components, src, dst, n)
    out: dict[str, Any] = {
        "auto_picks": choose_method("pagerank", "auto", g, rounds=ROUNDS)[0],
        "auto_picks_components": choose_method("connected_components", "auto", g)[0],
        "scipy_pagerank_s": scipy_s,
        "scipy_components_s": csgraph_s,
    }
    for method in ("arrow", "blocks", "auto"):
        run = time_run(spark, f"pagerank {method} {n}", iterflow_pagerank(g, method))
        error = float(np.abs(ranks_of(run.value, n) - expected).max())
        out[f"pagerank_{method}"] = {"s": run.seconds, "jobs": run.jobs, "max_abs_error": error}
        run = time_run(spark, f"components {method} {n}", iterflow_components(g, method))
        same = same_partition(components_of(run.value, n), labels)
        out[f"components_{method}"] = {"s": run.seconds, "jobs": run.jobs, "same": same}
    for kind, reference in (("pagerank", scipy_s), ("components", csgraph_s)):
        for method in ("arrow", "blocks", "auto"):
            out[f"{kind}_{method}"]["over_scipy"] = out[f"{kind}_{method}"]["s"] / reference
    edges.unpersist()
    vertices.unpersist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default=None, help="e.g. 100000:1000000,2000000:20000000")
    parser.add_argument("--driver-memory", default="12g")
    args = parser.parse_args()
    sizes = tuple((n // 10, m // 10) for n, m in SIZES[:2]) if args.quick else SIZES
    if args.sizes:
        sizes = tuple(tuple(int(x) for x in size.split(":")) for size in args.sizes.split(","))
    spark = graphx_peer.start_session(driver_memory=args.driver_memory)
    log("warm-up at 10,000 / 100,000")
    one_size(spark, 10_000, 100_000)
    results: dict[str, Any] = {}
    for n, m in sizes:
        log(f"{n} / {m}")
        results[f"{n}_{m}"] = one_size(spark, n, m)
    rows: list[tuple[str, Any]] = []
    for size, out in results.items():
        rows.append((f"{size}: auto picks", out["auto_picks"]))
        for kind in ("pagerank", "components"):
            for method in ("arrow", "blocks", "auto"):
                measured = out[f"{kind}_{method}"]
                rows.append((f"{size}: {kind} {method} s", measured["s"]))
                rows.append((f"{size}: {kind} {method} / scipy", measured["over_scipy"]))
    print_table("graph paths against one thread of scipy", rows)
    finish(spark, "bench_graph_cost", args.quick, results, sizes=[list(s) for s in sizes])


if __name__ == "__main__":
    main()
