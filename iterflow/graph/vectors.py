"""Helpers of the vector ("arrow") paths: vertex state held as one numpy vector, indexed
by the position of each vertex id in the vertex id array, and edges as Arrow files
(``RoundContext.columnar``) in those positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from iterflow.graph.model import Graph, GraphError, check_edge_ends, checked, stray_ends

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
    checks the vertex ids (``model.checked``). ``"auto"`` picks ``below_limit`` (``"arrow"``,
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


def vertex_ids(g: Graph) -> pa.Array:
    """Every vertex id, in the order that positions refer to (a collect of one column)."""
    return g.vertices.select("id").toArrow().column("id").combine_chunks()


def edge_positions(table: pa.Table, ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The positions in ``ids`` of the ``src`` and ``dst`` of ``table``'s edges."""
    src_at, dst_at = (pc.index_in(table[end], value_set=ids) for end in ("src", "dst"))
    if src_at.null_count or dst_at.null_count:
        strays = [("src", v) for v in pc.filter(table["src"], pc.is_null(src_at)).to_pylist()]
        strays += [("dst", v) for v in pc.filter(table["dst"], pc.is_null(dst_at)).to_pylist()]
        raise GraphError(stray_ends("the graph", strays[:3]))
    return (
        src_at.to_numpy(zero_copy_only=False).astype(np.int64),
        dst_at.to_numpy(zero_copy_only=False).astype(np.int64),
    )


def cell_values(column: Any, row: int = 0) -> np.ndarray:
    """The vector in list cell ``row`` of an Arrow list column, as numpy."""
    return column[row].values.to_numpy()
