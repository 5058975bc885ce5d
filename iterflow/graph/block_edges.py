"""The edges of the block path: placed once, grouped by source block into one Arrow file per
block (``ctx.columnar(..., resident=False)``), and read by the kernels of that block.

A file holds the edge blocks (source block, destination block) of one source block, sorted
by destination block (kernels that send along every edge) or by source offset (kernels
whose cost follows the vertices that send: ``EdgeFile.out_of``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iterflow.graph.block_layout import Layout
from iterflow.graph.graphs import GraphError, stray_ends

#: The column of ``edge_rows`` that marks an edge turned around.
TURNED = "_turned"


def edge_rows(
    lay: Layout,
    edges: DataFrame,
    *,
    reverse: bool = False,
    both: bool = False,
    columns: tuple[str, ...] = (),
) -> DataFrame:
    """``edges`` in the partition of their source block, with the block and offset of both
    ends (``sb``, ``so``, ``db``, ``do``; null for an end that is no vertex), except on a
    dense layout, whose edge files compute them from the ids (``edge_file(dense=...)``); with
    ``reverse`` every edge is turned around, with ``both`` every edge is there both ways.
    ``columns`` are kept as they are; ``TURNED`` marks the turned rows, so that an error
    names the end of the edge as given."""
    src, dst = ("dst", "src") if reverse else ("src", "dst")
    ends = edges.select(
        F.col(src).alias("src"),
        F.col(dst).alias("dst"),
        F.lit(reverse).alias(TURNED),
        *(F.col(c) for c in columns),
    )
    if both:
        turned = ends.select(
            F.col("dst").alias("src"),
            F.col("src").alias("dst"),
            (~F.col(TURNED)).alias(TURNED),
            *(F.col(c) for c in columns),
        )
        ends = ends.unionByName(turned)
    if lay.first is not None:  # the edge file places both ends itself
        return lay.placed(ends, lay.place_of("src")[0])
    placed = lay.place(lay.place(ends, "src", "sb", "so"), "dst", "db", "do")
    return lay.placed(placed, "sb")


def edge_file(
    who: str,
    *,
    by_source: bool,
    distinct: bool,
    columns: tuple[str, ...] = (),
    dense: tuple[int, int, int] | None = None,
) -> Callable[[pa.Table], pa.Table]:
    """A ``columnar`` prepare step for one source block's edges (``edge_rows``): a
    ``GraphError`` for an end that is no vertex; self-loops kept; duplicates dropped with
    ``distinct``; sorted by source offset (``by_source``) or by destination block; the
    columns ``so``, ``db``, ``do`` (int32), ``columns``, and for the kernels of PageRank
    ``share`` (1 / the source's out-degree) and ``first`` (the source's first edge).
    ``dense`` (``Layout.dense``): the rows hold ids only, placed here by arithmetic."""

    def prepare(table: pa.Table) -> pa.Table:
        ends = _dense_ends(table, dense) if dense is not None else _joined_ends(table)
        (sb, so, so_ok), (db, do, do_ok) = ends
        if not (so_ok.all() and do_ok.all()):
            raise GraphError(stray_ends(who, _strays(table, so_ok, do_ok)))
        kept = {c: table[c] for c in columns}
        order = sort_order(*((so, db, do) if by_source else (db, so, do)))
        so, db, do = so[order], db[order], do[order]
        kept = {c: v.take(pa.array(order)) for c, v in kept.items()}
        if distinct:
            new = first_of_runs(so, db, do)
            so, db, do = so[new], db[new], do[new]
            kept = {c: v.filter(pa.array(new)) for c, v in kept.items()}
        edges = pa.table({"so": so, "db": db, "do": do, **kept, **_shares(so)})
        held = np.unique(sb).tolist()
        if len(held) > 1:
            raise GraphError(f"{who}: an edge file holds source blocks {held[:3]}; expected one")
        return edges.replace_schema_metadata({"block": str(held[0])} if held else None)

    return prepare


End = tuple[np.ndarray, np.ndarray, np.ndarray]  # block, offset (int32), is a vertex


def _joined_ends(table: pa.Table) -> tuple[End, End]:
    """Both ends' places, from the columns that the joins of ``edge_rows`` added."""

    def end(block: str, offset: str) -> End:
        known = pc.is_valid(table[offset]).to_numpy(zero_copy_only=False)
        places = [pc.fill_null(table[c], 0).to_numpy().astype(np.int32) for c in (block, offset)]
        return places[0], places[1], known

    return end("sb", "so"), end("db", "do")


def _dense_ends(table: pa.Table, dense: tuple[int, int, int]) -> tuple[End, End]:
    """Both ends' places on a dense layout, computed from the ids."""
    first, step, n = dense

    def end(name: str) -> End:
        at = pc.fill_null(pc.cast(table[name], pa.int64()), first - 1).to_numpy() - first
        known = (at >= 0) & (at < n)
        at = np.where(known, at, 0)
        block = at // step
        return block.astype(np.int32), (at - block * step).astype(np.int32), known

    return end("src"), end("dst")


def _strays(table: pa.Table, so_ok: np.ndarray, do_ok: np.ndarray) -> list[tuple[str, Any]]:
    """Up to 3 ends that are no vertex, named as the edge was given (``TURNED`` rows were
    turned around by ``edge_rows``)."""
    rows = np.flatnonzero(~(so_ok & do_ok))[:6]
    turned = table[TURNED].to_pylist() if TURNED in table.column_names else None
    found = []
    for i in rows.tolist():
        is_turned = bool(turned[i]) if turned is not None else False
        for end, ok, given in (("src", so_ok, "dst"), ("dst", do_ok, "src")):
            if not ok[i]:
                found.append((given if is_turned else end, table[end][i].as_py()))
    return list(dict.fromkeys(found))[:3]


def _shares(so: np.ndarray) -> dict[str, np.ndarray]:
    """``share`` (1 / the out-degree of each edge's source) and ``first`` (True at the
    first edge of each source)."""
    if not len(so):
        return {"share": np.zeros(0), "first": np.zeros(0, dtype=bool)}
    degree = np.bincount(so)
    at = np.full(len(degree), len(so))
    np.minimum.at(at, so, np.arange(len(so)))
    first = np.zeros(len(so), dtype=bool)
    first[at[degree > 0]] = True
    return {"share": 1.0 / degree[so], "first": first}


def sort_order(*keys: np.ndarray) -> np.ndarray:
    """The stable order that sorts by ``keys`` (non-negative integers), the first one first:
    one sort of a key packed into 63 bits when they fit, else ``np.lexsort``."""
    if not len(keys[0]):
        return np.zeros(0, dtype=np.int64)
    widths = [int(k.max()).bit_length() for k in keys]
    if sum(widths) > 63:
        return np.lexsort(keys[::-1])
    packed = np.zeros(len(keys[0]), dtype=np.int64)
    for key, width in zip(keys, widths, strict=True):
        packed = (packed << width) | key.astype(np.int64)
    return np.argsort(packed, kind="stable")


def check_block(table: pa.Table, block: int) -> None:
    """That ``table``, an edge file, holds the edges of source block ``block`` (or none)."""
    held = (table.schema.metadata or {}).get(b"block")
    if held is not None and int(held) != block:
        raise GraphError(f"the edge file of block {block} holds block {int(held)}'s edges")


class EdgeFile:
    """One source block's edge file as its kernels read it: every edge's source offset
    ``so``, destination block ``db`` and destination offset ``do``, and its other columns."""

    def __init__(self, table: pa.Table, blocks: int) -> None:
        self.table = table
        self.blocks = blocks
        self.so, self.db, self.do = (table[c].to_numpy() for c in ("so", "db", "do"))

    def column(self, name: str) -> np.ndarray:
        """Another column of the file (PageRank's ``share`` and ``first``), as numpy."""
        return self.table[name].to_numpy(zero_copy_only=False)

    @functools.cached_property
    def bounds(self) -> np.ndarray:
        """Where each destination block's edges start, in a file sorted by destination block."""
        return np.searchsorted(self.db, np.arange(self.blocks + 1))

    def into(self, block: int) -> slice:
        """The edges into ``block``, in a file sorted by destination block."""
        return slice(int(self.bounds[block]), int(self.bounds[block + 1]))

    def out_of(self, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The edges out of ``sources`` (offsets) in a file sorted by source offset: see
        ``gathered``."""
        return gathered(self.so, sources)


def gathered(so: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges out of ``sources`` in a file sorted by source offset, a cost that follows
    the active vertices rather than the block: their indices, and for each the index in
    ``sources`` of its source (a source may be listed more than once)."""
    lo = np.searchsorted(so, sources, "left")
    counts = np.searchsorted(so, sources, "right") - lo
    total = int(counts.sum())
    owners = np.repeat(np.arange(len(sources)), counts)
    if total == 0:
        return np.zeros(0, dtype=np.int64), owners
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return starts + np.arange(total), owners


def first_of_runs(*keys: np.ndarray) -> np.ndarray:
    """For arrays sorted together by ``keys``: True where a run of equal keys starts."""
    starts = np.zeros(len(keys[0]), dtype=bool)
    if len(starts):
        starts[0] = True
        for key in keys:
            starts[1:] |= key[1:] != key[:-1]
    return starts
