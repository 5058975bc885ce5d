"""Users' own graph programs: shortest paths written as a numpy ``VertexProgram`` and as
Column expressions, against GraphX's ``ShortestPaths``, and ``aggregate_messages``
against the same aggregation written as a DataFrame join and groupBy.

On the random graph of ``bench_graph.py`` (100,000 vertices, 1,000,000 edges; uniform
``src`` and ``dst`` from ``numpy.random.default_rng(0)``; ``--quick``: a tenth):

- single-source shortest paths in hops from vertex 0, until no distance changes:
  ``pregel(g, program=VertexProgram(...))`` (numpy, vector path), ``pregel(g,
  init=..., update=..., send_to_dst=...)`` (Column expressions compiled to kernels, on
  the vector path and with ``method="blocks"`` on the block path), and
  GraphX's ``ShortestPaths.run`` with one landmark (vertex 0; GraphX measures hops *to*
  the landmark, the same work on the reversed edges), GraphX's load of the edge list
  counted separately. Distances are checked against scipy's breadth-first search.
- the cost of a round against the edges its active vertices send along: weighted
  shortest paths on ``bench_graph.py``'s layered DAG (25 layers of 200 vertices,
  960,200 edges; ``--quick``: 8 x 60), written as a numpy ``VertexProgram`` and as
  Column expressions (compiled to kernels), each sending only where a distance
  improves (one layer active a round) and along every edge of every vertex that heard
  a message; per way of writing it, a line fitted to (messages, seconds) of its rounds
  gives the cost per message and per round.
- the sum of the in-neighbours' ``x`` for every vertex: ``aggregate_messages`` (its
  default, and ``method="arrow"``) against ``edges.join(vertices).groupBy("dst").sum()``
  written by hand, each forced with a ``count()``, checked equal.

One ``local[2]`` session; one warm-up run of each variant, then 3 runs each taking
turns (``--quick``: 1). Results go to ``benchmarks/results/bench_programs.json``.

    python benchmarks/bench_programs.py            # ~5 min
    python benchmarks/bench_programs.py --quick    # ~1 min
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import graphx_peer
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
from _common import compare_runners, finish, log, print_table, ratio
from bench_graph import Rounds, cached_inputs, layered_dag, random_edges, release_graphx
from pyspark.sql import functions as F

from iterflow.graph import (
    AggregateMessages,
    Graph,
    Pregel,
    VertexProgram,
    aggregate_messages,
    pregel,
)


def hops_program() -> VertexProgram:
    """Hops from vertex 0, in numpy: a vertex reached sends its distance + 1 along its
    out-edges once, in the round after it was reached."""
    return VertexProgram(
        state={"hops": np.float64},
        init=lambda v: {"hops": np.where(v["id"].to_numpy() == 0, 0.0, np.inf)},
        send_to_dst=lambda src, dst, e: np.where(
            src["hops"] + 1 < dst["hops"], src["hops"] + 1, np.nan
        ),
        merge="min",
        apply=lambda s, m, got: (
            {"hops": np.where(got, np.fmin(s["hops"], m), s["hops"])},
            got & (m < s["hops"]),
        ),
    )


def expressions_run(g: Graph, method: str = "auto") -> Any:
    return pregel(
        g,
        init={"hops": F.when(F.col("id") == 0, 0.0).otherwise(F.lit(None).cast("double"))},
        update={"hops": F.least(F.col("hops"), Pregel.msg())},
        send_to_dst=Pregel.src("hops") + F.lit(1.0),
        aggregate=F.min,
        method=method,
        progress=False,
    )


def reference_hops(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    matrix = scipy.sparse.csr_array((np.ones(len(src)), (src, dst)), shape=(n, n))
    return scipy.sparse.csgraph.shortest_path(matrix, unweighted=True, indices=0)


def check_hops(results: dict[str, Any], expected: np.ndarray) -> dict[str, Any]:
    for name in ("numpy", "expressions", "expressions_blocks"):
        table = results[name].select("id", "hops").toArrow()
        got = np.full(len(expected), np.inf)
        values = table.column("hops").to_numpy(zero_copy_only=False)
        got[table.column("id").to_numpy()] = np.where(np.isnan(values), np.inf, values)
        if not np.array_equal(got, expected):
            raise RuntimeError(f"{name}: hops differ from scipy's")
    return {"checked_against_scipy": True}


def shortest_paths(spark: Any, g: Graph, path: Path, expected: np.ndarray, reps: int) -> Any:
    jgraph = graphx_peer.load_graph(spark, path, 8)

    def numpy_run() -> tuple[Any, dict[str, Any]]:
        result = pregel(g, program=hops_program(), progress=False)
        result.count()
        return result, {}

    def expressions() -> tuple[Any, dict[str, Any]]:
        result = expressions_run(g)
        result.count()
        return result, {}

    def on_blocks() -> tuple[Any, dict[str, Any]]:
        result = expressions_run(g, "blocks")
        result.count()
        return result, {}

    def graphx() -> tuple[Any, dict[str, Any]]:
        return graphx_peer.shortest_paths(spark, jgraph, [0]), {}

    def load() -> tuple[Any, dict[str, Any]]:
        loaded = graphx_peer.load_graph(spark, path, 8)
        loaded.unpersist(True)
        return None, {}

    summary = compare_runners(
        spark,
        "shortest paths",
        {
            "numpy": numpy_run,
            "expressions": expressions,
            "expressions_blocks": on_blocks,
            "graphx": graphx,
            "graphx_load": load,
        },
        reps,
        lambda results: check_hops(results, expected),
        release=release_graphx,
    )
    graphx_peer.release(jgraph)
    return summary


def messages(spark: Any, g: Graph, reps: int) -> Any:
    vertices = g.vertices.withColumn("x", F.col("id") % 7)
    graph = Graph(vertices, g.edges)

    def facade(method: str) -> Any:
        def run() -> tuple[Any, dict[str, Any]]:
            out = aggregate_messages(
                graph,
                F.sum(AggregateMessages.msg).alias("total"),
                send_to_dst=AggregateMessages.src["x"],
                method=method,
            )
            out.count()
            return out, {}

        return run

    def by_hand() -> tuple[Any, dict[str, Any]]:
        out = (
            g.edges.join(vertices, g.edges["src"] == vertices["id"])
            .groupBy(F.col("dst").alias("id"))
            .agg(F.sum("x").alias("total"))
        )
        out.count()
        return out, {}

    def check(results: dict[str, Any]) -> dict[str, Any]:
        a, b, c = (
            {r.id: r.total for r in results[k].collect()}
            for k in ("aggregate_messages", "aggregate_messages_arrow", "join")
        )
        if not a == b == c:
            raise RuntimeError("aggregate_messages differs from the join and groupBy")
        return {"equal": True}

    runners = {
        "aggregate_messages": facade("auto"),
        "aggregate_messages_arrow": facade("arrow"),
        "join": by_hand,
    }
    return compare_runners(spark, "messages", runners, reps, check)


def weighted_program(every_edge: bool) -> VertexProgram:
    """Shortest paths by ``weight`` from vertex 0; ``every_edge``: every vertex stays
    active and sends along every edge every round (the same distances, all the work)."""

    def send(src: dict, dst: dict, e: dict) -> np.ndarray:  # type: ignore[type-arg]
        offer = src["dist"] + e["weight"]
        return offer if every_edge else np.where(offer < dst["dist"], offer, np.nan)

    return VertexProgram(
        state={"dist": np.float64},
        init=lambda v: {"dist": np.where(v["id"].to_numpy() == 0, 0.0, np.inf)},
        send_to_dst=send,
        merge="min",
        apply=lambda s, m, got: (
            {"dist": np.where(got, np.fmin(s["dist"], m), s["dist"])},
            np.ones(len(m), dtype=bool) if every_edge else got & (m < s["dist"]),
        ),
    )


def weighted_expressions(g: Graph, every_edge: bool, rounds: Any, max_rounds: int) -> Any:
    """Shortest paths by ``weight`` from vertex 0 as Column expressions (compiled to
    kernels); ``every_edge``: every vertex that received a message sends along all its
    edges next round, whether its distance changed or not."""
    offer = Pregel.src("dist") + Pregel.edge("weight")
    return pregel(
        g,
        init={"dist": F.when(F.col("id") == 0, 0.0).otherwise(float("inf"))},
        update={"dist": F.least(F.col("dist"), Pregel.msg())},
        send_to_dst=offer if every_edge else F.when(offer < Pregel.dst("dist"), offer),
        aggregate=F.min,
        active=F.lit(True) if every_edge else None,
        max_rounds=max_rounds,
        listen=rounds,
        progress=False,
    )


def _fit(runs: list[dict[str, Any]]) -> dict[str, float]:
    """``seconds = intercept + slope * messages`` over ``runs``' rounds but round 0 (which
    loads the edges)."""
    xs = [m for v in runs for m in v["messages"][1:]]
    ys = [t for v in runs for t in v["round_s"][1:]]
    slope, intercept = np.polyfit(xs, ys, 1)
    return {"intercept_s": float(intercept), "s_per_million_messages": float(slope) * 1e6}


def dag_rounds(spark: Any, layers: int, width: int) -> dict[str, Any]:
    """Per-round seconds and messages of the numpy and the expression programs on the
    layered DAG, each sending along the edges that improve a distance or along every
    edge, and per way of writing them the line ``seconds = intercept + slope *
    messages`` fitted to their rounds."""
    src, dst, weight = layered_dag(layers, width)
    n = 1 + layers * width
    vertices, edges = cached_inputs(spark, {"src": src, "dst": dst, "weight": weight}, n)
    g = Graph(vertices, edges)
    out: dict[str, Any] = {}
    variants = [
        (f"{way}_{name}", way, every)
        for way in ("numpy", "expressions")
        for name, every in (("active", False), ("every_edge", True))
    ]
    for name, way, every in variants:
        for attempt in ("warm-up", "measured"):
            rounds = Rounds()
            if way == "numpy":
                result = pregel(
                    g,
                    program=weighted_program(every),
                    max_rounds=layers + 1,
                    listen=rounds,
                    progress=False,
                )
            else:
                result = weighted_expressions(g, every, rounds, layers + 1)
            result.count()
            log(f"  dag {name} ({attempt}): {len(rounds.progress)} rounds")
        summary = rounds.summary()
        out[name] = {
            "messages": [c.get("messages") or 0 for c in summary["counts"]],
            "round_s": summary["duration_s"],
        }
    out["fit"] = {
        way: _fit([out[name] for name, w, _ in variants if w == way])
        for way in ("numpy", "expressions")
    }
    vertices.unpersist()
    edges.unpersist()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, m = (10_000, 100_000) if args.quick else (100_000, 1_000_000)
    reps = 1 if args.quick else 3
    spark = graphx_peer.start_session()
    src, dst = random_edges(n, m)
    vertices, edges = cached_inputs(spark, {"src": src, "dst": dst}, n)
    g = Graph(vertices, edges)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "edges.txt"
        graphx_peer.write_edge_list(path, src, dst)
        # GraphX's ShortestPaths measures hops to the landmark: the reversed edges give
        # hops from vertex 0, the same work as iterflow's programs.
        reversed_path = Path(folder) / "reversed.txt"
        graphx_peer.write_edge_list(reversed_path, dst, src)
        log(f"shortest paths on {n:,} / {m:,}")
        paths = shortest_paths(spark, g, reversed_path, reference_hops(src, dst, n), reps)
    log("aggregate_messages")
    sums = messages(spark, g, reps)
    log("rounds against active edges on the layered DAG")
    dag = dag_rounds(spark, *((8, 60) if args.quick else (25, 200)))
    graphx_total = {
        "s_median": paths["graphx"]["s_median"] + paths["graphx_load"]["s_median"],
        "s": [a + b for a, b in zip(paths["graphx"]["s"], paths["graphx_load"]["s"], strict=True)],
    }
    results = {
        "shortest_paths": paths,
        "numpy_over_graphx_run": ratio(paths["numpy"], paths["graphx"]),
        "numpy_over_graphx_load_and_run": ratio(paths["numpy"], graphx_total),
        "expressions_over_graphx_run": ratio(paths["expressions"], paths["graphx"]),
        "expressions_over_graphx_load_and_run": ratio(paths["expressions"], graphx_total),
        "expressions_blocks_over_graphx_run": ratio(paths["expressions_blocks"], paths["graphx"]),
        "aggregate_messages": sums,
        "aggregate_messages_over_join": ratio(sums["aggregate_messages"], sums["join"]),
        "aggregate_messages_arrow_over_join": ratio(sums["aggregate_messages_arrow"], sums["join"]),
        "dag_rounds": dag,
    }
    rows = [
        (f"shortest paths {k} s (median)", paths[k]["s_median"])
        for k in ("numpy", "expressions", "expressions_blocks", "graphx", "graphx_load")
    ]
    rows += [
        ("numpy / GraphX run", results["numpy_over_graphx_run"]["of_medians"]),
        ("numpy / GraphX load + run", results["numpy_over_graphx_load_and_run"]["of_medians"]),
        ("expressions / GraphX run", results["expressions_over_graphx_run"]["of_medians"]),
        (
            "expressions on blocks / GraphX run",
            results["expressions_blocks_over_graphx_run"]["of_medians"],
        ),
        ("aggregate_messages s (median)", sums["aggregate_messages"]["s_median"]),
        ("join + groupBy s (median)", sums["join"]["s_median"]),
        ("aggregate_messages / join", results["aggregate_messages_over_join"]["of_medians"]),
        (
            "aggregate_messages(method='arrow') / join",
            results["aggregate_messages_arrow_over_join"]["of_medians"],
        ),
    ]
    for way in ("numpy", "expressions"):
        rows += [
            (f"DAG {way}: intercept s", dag["fit"][way]["intercept_s"]),
            (f"DAG {way}: s per million messages", dag["fit"][way]["s_per_million_messages"]),
            (
                f"DAG {way} active: median round s",
                float(np.median(dag[f"{way}_active"]["round_s"][1:])),
            ),
            (
                f"DAG {way} every edge: median round s",
                float(np.median(dag[f"{way}_every_edge"]["round_s"][1:])),
            ),
        ]
    print_table(f"users' graph programs, {n:,} / {m:,}", rows)
    finish(spark, "bench_programs", args.quick, results, vertices=n, edges=m)


if __name__ == "__main__":
    main()
