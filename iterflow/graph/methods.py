"""Which way a graph algorithm runs (``method=``): ``"arrow"`` (vertex state as one
vector on the driver), ``"blocks"`` (vertex state in slices kept in Spark) or
``"dataframe"`` (joins over vertex rows).

``"auto"`` keeps vertex state in blocks above ``spark.iterflow.graph.vectorLimit``
vertices (the driver holds the vector). Below it, an algorithm with both a vector and a
block path (PageRank, connected components) takes the one its measured cost model says
is faster for the graph's edges and the rounds it will run; the others take their
``below_limit`` path.
"""

from __future__ import annotations

import logging
import math

import attrs
from pyspark.sql import SparkSession

from iterflow.graph.graphs import Graph, GraphError, check_edge_ends, checked

#: Above this many vertices ``method="auto"`` keeps vertex state in blocks (``blocks``)...
VECTOR_LIMIT = 5_000_000
#: ... unless the session sets another number of vertices here.
LIMIT_CONF = "spark.iterflow.graph.vectorLimit"
METHODS = ("auto", "arrow", "blocks", "dataframe")

_log = logging.getLogger("iterflow.graph")


@attrs.frozen
class PathCost:
    """Seconds a path takes on ``local[2]``, each part ``a + b * edges``: preparing the
    graph (round 0 included), one more round, and making the result. Fitted to
    ``benchmarks/bench_graph_cost.py`` at 1,000,000, 5,000,000 and 20,000,000 edges
    (uniform random graphs, ten edges per vertex), split by the time of each round's
    end; docs/graph.md lists the measurements. Both paths spread their edge work over
    the same task slots, so the choice holds on more cores as well."""

    prepare: tuple[float, float]
    round: tuple[float, float]
    finish: tuple[float, float]
    #: The rounds the path runs when the algorithm, not the caller, decides (components).
    usual_rounds: int = 0

    def seconds(self, edges: int, rounds: int | None) -> float:
        """The predicted seconds for ``edges`` edges and ``rounds`` rounds."""
        rounds = self.usual_rounds if rounds is None else rounds
        parts = (self.prepare, self.finish) + (self.round,) * max(rounds - 1, 0)
        return sum(a + b * edges for a, b in parts)


#: (algorithm, path) -> its cost. The vector path prepares more (the edges resident, a
#: sparse matrix per partition, the result vector back into rows) and runs rounds for
#: less (one message per task, no Spark job): PageRank on 20,000,000 edges is faster on
#: blocks for 10 rounds and on the vector for more than about 20.
COSTS = {
    ("pagerank", "arrow"): PathCost((1.6, 1.5e-6), (0.0, 2.9e-8), (1.8, 3.4e-7)),
    ("pagerank", "blocks"): PathCost((5.1, 8.1e-7), (0.45, 5.0e-8), (2.0, 0.0)),
    ("connected_components", "arrow"): PathCost(
        (0.85, 1.1e-6), (0.03, 2.4e-8), (0.5, 3.7e-7), usual_rounds=2
    ),
    ("connected_components", "blocks"): PathCost(
        (3.5, 2.0e-6), (0.5, 1.4e-7), (0.7, 8.0e-8), usual_rounds=6
    ),
}


def vector_limit(spark: SparkSession) -> int:
    """The most vertices whose state ``method="auto"`` holds as one vector on the driver:
    ``LIMIT_CONF``, else ``VECTOR_LIMIT``."""
    setting = spark.conf.get(LIMIT_CONF, None)
    if setting is None:
        return VECTOR_LIMIT
    try:
        limit = int(setting)
    except ValueError:
        limit = -1
    if limit < 0:
        raise GraphError(f"{LIMIT_CONF}={setting!r}: use a number of vertices")
    return limit


def choose_method(
    function: str,
    method: str,
    g: Graph,
    *,
    below_limit: str = "arrow",
    rounds: int | None = None,
) -> tuple[str, int]:
    """The path to run ``function`` on, and the number of vertices: one Spark job that also
    checks the vertex ids (``graphs.checked``). ``"auto"`` picks ``"blocks"`` above
    ``vector_limit`` vertices; below, the cheaper of ``COSTS``' paths for the number of
    edges (one more job counts them) and ``rounds`` (None: the path's usual rounds), or
    ``below_limit`` (``"dataframe"`` for an algorithm without a vector path). The
    DataFrame path checks the edges' ends first; the others check them where they read
    the edges, in the workers."""
    allowed = METHODS if below_limit == "arrow" else tuple(m for m in METHODS if m != "arrow")
    if method not in allowed:
        named = ", ".join(repr(m) for m in allowed)
        raise GraphError(f"{function}(method={method!r}): use one of {named}")
    n = checked(g, f"{function}()", edges=False)
    if method == "auto":
        method = below_limit if n <= vector_limit(g.vertices.sparkSession) else "blocks"
        if method == "arrow" and (function, "blocks") in COSTS:
            method = cheaper_path(function, g.edges.count(), rounds)
    if method == "dataframe":
        check_edge_ends(g, f"{function}()")
    return method, n


def cheaper_path(function: str, edges: int, rounds: int | None) -> str:
    """``"arrow"`` or ``"blocks"``, whichever ``COSTS`` predicts faster for ``function``."""
    vector = COSTS[(function, "arrow")].seconds(edges, rounds)
    blocks = COSTS[(function, "blocks")].seconds(edges, rounds)
    chosen = "arrow" if vector <= blocks else "blocks"
    _log.info(
        "%s(method='auto'): %s for %d edges and %s rounds (predicted %.1f s on the vector "
        "path, %.1f s on blocks)",
        function,
        chosen,
        edges,
        "the usual" if rounds is None else rounds,
        vector,
        blocks,
    )
    return chosen


def pagerank_rounds(alpha: float, tol: float | None, max_rounds: int) -> int:
    """The rounds PageRank runs: ``max_rounds``, or fewer when the L1 change, which shrinks
    by ``alpha`` a round from at most 2, reaches ``tol`` first."""
    if tol is None or tol <= 0:
        return max_rounds
    return max(1, min(max_rounds, math.ceil(math.log(tol / 2) / math.log(alpha)) + 1))
