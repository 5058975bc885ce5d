"""Helpers of the vector ("arrow") paths: vertex state held as one numpy vector, indexed
by the position of each vertex id in the vertex id array, and edges as Arrow files
(``RoundContext.columnar``) in those positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iterflow.graph.graphs import Graph, GraphError, stray_ends


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
