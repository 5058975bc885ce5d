"""Apache Spark GraphX as a benchmark peer, driven from PySpark through the py4j gateway.

GraphX ships inside the pyspark wheel (``pyspark/jars/spark-graphx_2.13-*.jar``), so the
algorithms run in the same JVM as the session, with nothing to download. The Scala calls
take their implicit ``ClassTag`` evidence explicitly: a graph loaded by ``GraphLoader`` is
a ``Graph[Int, Int]``, so both tags are ``scala.reflect.ClassTag.Int()``.

Typical use (load once, time only the algorithm, convert afterwards)::

    jgraph = load_graph(spark, path, partitions=4)        # cached and materialized
    t0 = time.perf_counter()
    jranks = pagerank(spark, jgraph, rounds=10)           # runs and forces the result
    seconds = time.perf_counter() - t0
    ids, ranks = ranks_of(spark, jranks)                  # numpy, sorted by vertex id
    release(jranks)

What ``PageRank.run(graph, numIter, resetProb)`` computes (Spark 4.x; checked against
a numpy replica, :func:`reference_pagerank`, to ~1e-15 by the self-check)
---------------------------------------------------------------------------------------
* Vertices are only those that appear in an edge (``GraphLoader`` builds them from
  the edge list). Parallel edges are kept and self-loops are kept: each copy counts
  in the out-degree and carries rank, so the matching networkx graph is a
  ``MultiDiGraph`` built from the same (src, dst) pairs (``nx.pagerank`` sums
  parallel edges as weights).
* Start: every rank is ``1.0`` (sum ``n``).
* Each of the ``numIter`` rounds:
  ``PR[v] = resetProb + (1 - resetProb) * sum(PR[u] / outDeg[u] for edges u -> v)``.
  Not normalized during the rounds: rank of a dangling vertex (out-degree 0) is
  simply lost, so with dangling vertices the sum drops below ``n``.
* Once, after the last round (SPARK-18847): all ranks are multiplied by
  ``n / sum(PR)``, so the returned ranks **sum to n** (not 1).

Relation to ``nx.pagerank(G, alpha=1 - resetProb)`` (sums to 1, teleport uniform,
dangling rank spread uniformly over all vertices):

* Converged results agree exactly after rescaling: ``graphx / n == networkx``, with or
  without dangling vertices. (Both fixed points are proportional to
  ``(I - alpha * P^T)^-1 * 1``: uniform dangling redistribution only adds a multiple of
  the all-ones vector, the same direction as the teleport term, and GraphX's final
  renormalization restores the sum.) So use enough rounds (the error shrinks like
  ``alpha ** rounds``; 10 rounds are ~0.2 from converged) or compare against
  :func:`reference_pagerank` for a fixed number of rounds.
* For a fixed number of rounds from the uniform start, GraphX round ``k`` divided by
  ``n`` equals networkx's power-iteration iterate ``k`` exactly only on graphs without
  dangling vertices (then the GraphX sum stays ``n`` in every round). With dangling
  vertices the intermediate iterates differ (lost mass vs. uniform redistribution,
  renormalized once at the end), only the limit is shared.

``ConnectedComponents.run(graph)`` labels each vertex with the smallest vertex id in its
weakly connected component (edge direction ignored), i.e. ``min(c)`` for each ``c`` in
``nx.weakly_connected_components(G)``.

Run ``python benchmarks/graphx_peer.py`` for the self-check against networkx and the
timings on a 100,000-vertex, 1,000,000-edge random graph (random src/dst, so it has
self-loops, parallel edges and dangling vertices; none are filtered).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def start_session(master: str = "local[2]", driver_memory: str = "6g") -> SparkSession:
    """A SparkSession for the peer: UI and progress bar off, 4 shuffle partitions, quiet logs.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` and ``PYSPARK_PYTHON=sys.executable`` first, so it
    must be called before any other session is started in the process.
    """
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def write_edge_list(path: str | Path, src: np.ndarray, dst: np.ndarray) -> None:
    """Write edges as text, one ``"src dst"`` pair of non-negative integers per line.

    This is the format ``GraphLoader.edgeListFile`` reads (lines starting with ``#``
    would be comments; none are written). Duplicates and self-loops are written as given.
    """
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    if s.shape != d.shape or s.ndim != 1:
        raise ValueError("src and dst must be 1-d arrays of equal length")
    if s.size and (s.min() < 0 or d.min() < 0):
        raise ValueError("vertex ids must be non-negative")
    np.savetxt(path, np.column_stack([s, d]), fmt="%d")


def _int_tag(spark: SparkSession) -> Any:
    """``ClassTag[Int]``: the VD and ED evidence of a ``GraphLoader`` graph."""
    jvm = spark._jvm
    assert jvm is not None
    return jvm.scala.reflect.ClassTag.Int()


def load_graph(spark: SparkSession, edges_path: str | Path, partitions: int) -> Any:
    """Load an edge-list file into a cached, materialized ``Graph[Int, Int]`` (Java object).

    Calls ``GraphLoader.edgeListFile(sc, path, canonicalOrientation=false,
    numEdgePartitions=partitions, MEMORY_ONLY, MEMORY_ONLY)`` and counts vertices and
    edges, so that loading is not part of a later algorithm's time. Every vertex and edge
    attribute is ``1``.
    """
    jvm = spark._jvm
    assert jvm is not None
    level = jvm.org.apache.spark.storage.StorageLevel.MEMORY_ONLY()
    uri = Path(edges_path).resolve().as_uri()
    jsc = spark.sparkContext._jsc.sc()
    jgraph = jvm.org.apache.spark.graphx.GraphLoader.edgeListFile(
        jsc, uri, False, int(partitions), level, level
    )
    jgraph.vertices().count()
    jgraph.edges().count()
    return jgraph


def pagerank(spark: SparkSession, jgraph: Any, rounds: int, reset_prob: float = 0.15) -> Any:
    """Run ``PageRank.run(graph, rounds, reset_prob)`` and force it; return the Java graph.

    ``jgraph`` must be a ``Graph[Int, Int]`` as returned by :func:`load_graph`. The
    result is a ``Graph[Double, Double]`` whose vertex attributes are the ranks (summing
    to the number of vertices, see the module docstring); it is forced with
    ``vertices().count()``. Read it with :func:`ranks_of`, free it with :func:`release`.
    """
    jvm = spark._jvm
    assert jvm is not None
    tag = _int_tag(spark)
    jranks = jvm.org.apache.spark.graphx.lib.PageRank.run(
        jgraph, int(rounds), float(reset_prob), tag, tag
    )
    jranks.vertices().count()
    return jranks


def connected_components(spark: SparkSession, jgraph: Any) -> Any:
    """Run ``ConnectedComponents.run(graph)`` and force it; return the Java graph.

    ``jgraph`` must be a ``Graph[Int, Int]`` as returned by :func:`load_graph`. Each
    vertex of the result carries the smallest vertex id of its weakly connected
    component. Read it with :func:`components_of`, free it with :func:`release`.
    """
    jvm = spark._jvm
    assert jvm is not None
    tag = _int_tag(spark)
    jcc = jvm.org.apache.spark.graphx.lib.ConnectedComponents.run(jgraph, tag, tag)
    jcc.vertices().count()
    return jcc


def shortest_paths(spark: SparkSession, jgraph: Any, landmarks: list[int]) -> Any:
    """Run ``ShortestPaths.run(graph, landmarks)`` and force it; return the Java graph.

    Each vertex of the result carries a map from the landmarks it can reach along the
    edges to the number of edges on the shortest path (GraphX's Pregel program of its
    library). The landmarks go to the JVM as ``java.lang.Long`` (a one-column Dataset
    collected there), since py4j would box small ints as ``Integer``.
    """
    jvm = spark._jvm
    assert jvm is not None
    if not landmarks:
        raise ValueError("give at least one landmark")
    session = spark._jsparkSession
    chosen = session.range(landmarks[0], landmarks[0] + 1)
    for mark in landmarks[1:]:
        chosen = chosen.union(session.range(mark, mark + 1))
    seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq(chosen.collectAsList())
    jpaths = jvm.org.apache.spark.graphx.lib.ShortestPaths.run(jgraph, seq, _int_tag(spark))
    jpaths.vertices().count()
    return jpaths


def _vertex_pairs(spark: SparkSession, jgraph: Any) -> list[tuple[int, Any]]:
    """Collect ``graph.vertices`` as Python ``(id, attr)`` tuples.

    The JVM pickles the ``(Long, attr)`` pairs in batches (``SerDeUtil.pairRDDToPython``,
    as ``sc.sequenceFile`` does) and the driver unpickles them: no Python workers and no
    per-element py4j calls.
    """
    from pyspark import RDD

    jvm = spark._jvm
    assert jvm is not None
    pickled = jvm.org.apache.spark.api.python.SerDeUtil.pairRDDToPython(jgraph.vertices(), 0)
    return RDD(pickled.toJavaRDD(), spark.sparkContext).collect()


def _sorted_arrays(
    pairs: list[tuple[int, Any]], dtype: type[np.generic]
) -> tuple[np.ndarray, np.ndarray]:
    if not pairs:
        return np.empty(0, np.int64), np.empty(0, dtype)
    ids_t, vals_t = zip(*pairs, strict=True)
    ids = np.array(ids_t, dtype=np.int64)
    vals = np.array(vals_t, dtype=dtype)
    order = np.argsort(ids, kind="stable")
    return ids[order], vals[order]


def ranks_of(spark: SparkSession, jranks: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, ranks)`` of a :func:`pagerank` result: int64 and float64, sorted by id."""
    return _sorted_arrays(_vertex_pairs(spark, jranks), np.float64)


def components_of(spark: SparkSession, jcc: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, labels)`` of a :func:`connected_components` result, int64, sorted by id."""
    return _sorted_arrays(_vertex_pairs(spark, jcc), np.int64)


def release(jgraph: Any) -> None:
    """Unpersist a result graph (its vertices and edges), blocking until done.

    Only for graphs returned by :func:`pagerank` or :func:`connected_components`; the
    input graph from :func:`load_graph` stays cached.
    """
    jgraph.unpersist(True)


def reference_pagerank(
    src: np.ndarray, dst: np.ndarray, rounds: int, reset_prob: float = 0.15
) -> tuple[np.ndarray, np.ndarray]:
    """GraphX ``PageRank.run`` replicated in numpy: ``(ids, ranks)`` sorted by id.

    Same vertex set (ids present in an edge), start 1.0, ``rounds`` unnormalized rounds
    (dangling rank lost), then one rescale to sum ``n``. Parallel edges and self-loops
    count like in GraphX.
    """
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    ids, inv = np.unique(np.concatenate([s, d]), return_inverse=True)
    n = ids.size
    si, di = inv[: s.size], inv[s.size :]
    out_deg = np.bincount(si, minlength=n).astype(np.float64)
    pr: np.ndarray = np.ones(n)
    for _ in range(rounds):
        pr = reset_prob + (1.0 - reset_prob) * np.bincount(
            di, weights=pr[si] / out_deg[si], minlength=n
        )
    return ids, pr * (n / pr.sum())


def _self_check(spark: SparkSession, tmp: Path) -> None:
    import networkx as nx

    rng = np.random.default_rng(42)
    n, m = 200, 800
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    path = tmp / "small.txt"
    write_edge_list(path, src, dst)
    jgraph = load_graph(spark, path, partitions=2)

    g = nx.MultiDiGraph()
    g.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    nodes = np.array(sorted(g.nodes()), dtype=np.int64)
    dangling = sum(1 for v in g.nodes() if g.out_degree(v) == 0)
    loops = int((src == dst).sum())
    print(
        f"small graph: {nodes.size} vertices (ids present in edges), {m} edges, "
        f"{dangling} dangling, {loops} self-loops, "
        f"{m - len(set(zip(src.tolist(), dst.tolist(), strict=True)))} duplicate edges"
    )

    for rounds in (10, 100):
        jranks = pagerank(spark, jgraph, rounds)
        ids, ranks = ranks_of(spark, jranks)
        release(jranks)
        ref_ids, ref = reference_pagerank(src, dst, rounds)
        assert np.array_equal(ids, nodes) and np.array_equal(ref_ids, nodes)
        print(
            f"PageRank {rounds:3d} rounds: sum={ranks.sum():.10f} (n={nodes.size}); "
            f"max |graphx - numpy replica| = {np.abs(ranks - ref).max():.3e}"
        )
    nx_pr = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    nx_arr = np.array([nx_pr[v] for v in nodes.tolist()])
    print(
        f"PageRank 100 rounds vs networkx (converged): max |graphx/n - nx| = "
        f"{np.abs(ranks / nodes.size - nx_arr).max():.3e} "
        f"(max nx rank {nx_arr.max():.3e}); max |graphx - n*nx| = "
        f"{np.abs(ranks - nodes.size * nx_arr).max():.3e}"
    )

    jgraph.unpersist(False)
    # Components on this graph and on a sparse one with many components (160 edges).
    sparse_src, sparse_dst = rng.integers(0, n, 160), rng.integers(0, n, 160)
    for name, (s, d) in {"dense": (src, dst), "sparse": (sparse_src, sparse_dst)}.items():
        cc_path = tmp / f"cc_{name}.txt"
        write_edge_list(cc_path, s, d)
        jg = load_graph(spark, cc_path, partitions=2)
        jcc = connected_components(spark, jg)
        cc_ids, labels = components_of(spark, jcc)
        release(jcc)
        jg.unpersist(False)
        h = nx.MultiDiGraph()
        h.add_edges_from(zip(s.tolist(), d.tolist(), strict=True))
        expected = {v: min(c) for c in nx.weakly_connected_components(h) for v in c}
        assert np.array_equal(cc_ids, np.array(sorted(h.nodes()), dtype=np.int64))
        exp_arr = np.array([expected[v] for v in cc_ids.tolist()], dtype=np.int64)
        print(
            f"ConnectedComponents ({name}, {cc_ids.size} vertices, {s.size} edges): "
            f"{np.unique(labels).size} components (nx: {len(set(expected.values()))}); "
            f"max |graphx label - min id of nx weak component| = {np.abs(labels - exp_arr).max()}"
        )


def _timings(spark: SparkSession, tmp: Path, repeats: int = 3) -> None:
    n, m, rounds, partitions = 100_000, 1_000_000, 10, 4
    rng = np.random.default_rng(0)
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    path = tmp / "big.txt"
    t0 = time.perf_counter()
    write_edge_list(path, src, dst)
    print(f"\nbig graph: {n} ids, {m} edges (self-loops/duplicates kept), {partitions} partitions")
    print(f"write edge list: {time.perf_counter() - t0:.2f} s")

    t0 = time.perf_counter()
    jgraph = load_graph(spark, path, partitions)
    print(
        f"load (edgeListFile + count): {time.perf_counter() - t0:.2f} s "
        f"({jgraph.vertices().count()} vertices, {jgraph.edges().count()} edges)"
    )

    ids: np.ndarray = np.empty(0)
    ranks: np.ndarray = np.empty(0)
    for i in range(repeats):
        t0 = time.perf_counter()
        jranks = pagerank(spark, jgraph, rounds)
        t_run = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids, ranks = ranks_of(spark, jranks)
        t_get = time.perf_counter() - t0
        release(jranks)
        print(f"PageRank {rounds} rounds, run {i + 1}: {t_run:.2f} s (ranks_of: {t_get:.2f} s)")
    _, ref = reference_pagerank(src, dst, rounds)
    print(
        f"  {ids.size} ranks, sum={ranks.sum():.4f}; "
        f"max |graphx - numpy replica| = {np.abs(ranks - ref).max():.3e}"
    )

    labels: np.ndarray = np.empty(0)
    for i in range(repeats):
        t0 = time.perf_counter()
        jcc = connected_components(spark, jgraph)
        t_run = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, labels = components_of(spark, jcc)
        t_get = time.perf_counter() - t0
        release(jcc)
        print(f"ConnectedComponents, run {i + 1}: {t_run:.2f} s (components_of: {t_get:.2f} s)")
    print(f"  {np.unique(labels).size} components")
    jgraph.unpersist(False)


def main() -> None:
    """Self-check against networkx, then timings on the 100k / 1M random graph."""
    spark = start_session()
    tmp = Path(tempfile.mkdtemp(prefix="graphx_peer_"))
    try:
        _self_check(spark, tmp)
        _timings(spark, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    main()
