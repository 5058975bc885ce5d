"""Which way a graph algorithm runs (``method=``): ``"arrow"`` (vertex state as one
vector on the driver), ``"blocks"`` (vertex state in slices kept in Spark) or
``"dataframe"`` (joins over vertex rows), and the number of vertices that decides it.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from iterflow.graph.graphs import Graph, GraphError, check_edge_ends, checked

#: Above this many vertices ``method="auto"`` keeps vertex state in blocks (``blocks``)...
VECTOR_LIMIT = 5_000_000
#: ... unless the session sets another number of vertices here.
LIMIT_CONF = "spark.iterflow.graph.vectorLimit"
METHODS = ("auto", "arrow", "blocks", "dataframe")


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
    function: str, method: str, g: Graph, *, below_limit: str = "arrow"
) -> tuple[str, int]:
    """The path to run ``function`` on, and the number of vertices: one Spark job that also
    checks the vertex ids (``graphs.checked``). ``"auto"`` picks ``below_limit`` (``"arrow"``,
    or ``"dataframe"`` for an algorithm without a vector path) up to ``vector_limit``
    vertices and ``"blocks"`` above. The DataFrame path checks the edges' ends first; the
    others check them where they read the edges, in the workers."""
    allowed = METHODS if below_limit == "arrow" else tuple(m for m in METHODS if m != "arrow")
    if method not in allowed:
        named = ", ".join(repr(m) for m in allowed)
        raise GraphError(f"{function}(method={method!r}): use one of {named}")
    n = checked(g, f"{function}()", edges=False)
    if method == "auto":
        method = below_limit if n <= vector_limit(g.vertices.sparkSession) else "blocks"
    if method == "dataframe":
        check_edge_ends(g, f"{function}()")
    return method, n
