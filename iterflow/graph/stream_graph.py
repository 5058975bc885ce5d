"""The graph of an edge stream, held on the driver between epochs.

``StreamGraph`` keeps the edges seen so far as one sorted array of keys, ``src << 32 |
dst`` over vertex indices (the order of first arrival), so that the edges of a vertex
are a slice (``starts``) and an epoch's insertions and deletions are merged in by
binary search: a cost in the size of the change plus one pass of ``memmove`` over the
arrays, never a sort of the whole graph. An edge is its ``(src, dst)`` pair: inserting
it again changes nothing but its weight, deleting it removes it whatever its weight.

It travels between epochs as one row of arrays (``encoded`` / ``decoded``), a variable
held on the driver (``itf.from_arrow``), and is committed with the epoch.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse

from iterflow.graph.graphs import GraphError

#: Vertex indices are packed two to an int64 key.
_SHIFT = 32
_LOW = (1 << _SHIFT) - 1
MAX_VERTICES = 1 << 31


@attrs.frozen
class Change:
    """What an epoch's events changed in a ``StreamGraph``: edges as index arrays."""

    added: tuple[np.ndarray, np.ndarray, np.ndarray]  # src, dst, weight of new edges
    removed: tuple[np.ndarray, np.ndarray, np.ndarray]  # src, dst, old weight of deleted ones
    lighter: tuple[np.ndarray, np.ndarray, np.ndarray]  # kept edges whose weight fell: new one
    heavier: tuple[np.ndarray, np.ndarray, np.ndarray]  # kept edges whose weight rose: old one
    new_vertices: int  # vertices seen for the first time
    missing: int  # deletions of edges the graph did not hold

    @property
    def touched(self) -> np.ndarray:
        """The sources of every edge that came, went or changed weight."""
        parts = [self.added[0], self.removed[0], self.lighter[0], self.heavier[0]]
        return np.unique(np.concatenate(parts))


def _empty_edges() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)


def _split(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return keys >> _SHIFT, keys & _LOW, weights


@attrs.define
class StreamGraph:
    """The vertices (ids in order of arrival) and edges (sorted keys, their weights) so far."""

    ids: np.ndarray  # int64 ids, or an object array of strings
    keys: np.ndarray  # int64, sorted and distinct: src << 32 | dst
    weights: np.ndarray  # float64, one per key (1.0 for unweighted streams)
    _index: pd.Index | None = None  # id -> index, for the ids as they are now
    _starts: np.ndarray | None = None  # where each vertex's out-edges start among the keys
    _transposed: Any = None  # scipy's transposed adjacency, made on first use

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def src(self) -> np.ndarray:
        return self.keys >> _SHIFT

    @property
    def dst(self) -> np.ndarray:
        return self.keys & _LOW

    @property
    def starts(self) -> np.ndarray:
        """The CSR offsets of the out-edges: vertex v's are ``keys[starts[v]:starts[v+1]]``."""
        if self._starts is None:
            bounds = np.arange(self.n + 1, dtype=np.int64) << _SHIFT
            self._starts = np.searchsorted(self.keys, bounds)
        return self._starts

    @property
    def transposed(self) -> Any:
        """The adjacency matrix transposed (``A[v, u] = 1`` for an edge u -> v), a scipy
        CSC matrix over the key arrays: ``transposed @ x`` sums ``x`` over in-edges."""
        if self._transposed is None:
            ones = np.ones(len(self.keys))
            shape = (self.n, self.n)
            rows = scipy.sparse.csr_matrix((ones, self.dst, self.starts), shape=shape)
            self._transposed = rows.T
        return self._transposed

    @property
    def out_degrees(self) -> np.ndarray:
        return np.diff(self.starts)

    def out_edges(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The edges leaving ``vertices`` (distinct indices): sources, targets, weights."""
        starts = self.starts
        first, last = starts[vertices], starts[vertices + 1]
        counts = last - first
        total = int(counts.sum())
        if total == 0:
            return _empty_edges()
        # Positions first[i] .. last[i]-1 for every i, without a Python loop.
        offsets = np.repeat(first - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        positions = offsets + np.arange(total)
        return self.keys[positions] >> _SHIFT, self.keys[positions] & _LOW, self.weights[positions]

    # -- vertices --------------------------------------------------------------------

    @property
    def _indexed(self) -> pd.Index:
        """Vertex id -> index, made again once ids were added."""
        if self._index is None:
            self._index = pd.Index(self.ids)
        return self._index

    def indices(self, values: np.ndarray) -> np.ndarray:
        """The indices of the vertex ids ``values``, adding those not seen before."""
        if len(values) == 0:
            return np.zeros(0, np.int64)
        codes = self._indexed.get_indexer(values)
        unknown = codes < 0
        if unknown.any():
            fresh = pd.unique(values[unknown])
            if self.n + len(fresh) > MAX_VERTICES:
                raise GraphError(f"a streaming graph holds at most {MAX_VERTICES} vertices")
            self.ids = np.concatenate([self.ids, np.asarray(fresh, dtype=self.ids.dtype)])
            self._index = self._starts = self._transposed = None
            codes = self._indexed.get_indexer(values)
        return codes.astype(np.int64)

    def known(self, values: np.ndarray) -> np.ndarray:
        """The indices of the vertex ids ``values``; -1 for ids not seen (added: none)."""
        if len(values) == 0 or self.n == 0:
            return np.full(len(values), -1, np.int64)
        return self._indexed.get_indexer(values).astype(np.int64)

    def lookup(self, value: Any) -> int | None:
        """The index of vertex id ``value``, or None before it has been seen."""
        if self.n == 0:
            return None
        code = int(self._indexed.get_indexer([value])[0])
        return None if code < 0 else code

    # -- edges -----------------------------------------------------------------------

    def update(
        self,
        inserted: tuple[np.ndarray, np.ndarray, np.ndarray],
        deleted: tuple[np.ndarray, np.ndarray],
        new_vertices: int,
    ) -> Change:
        """Merge an epoch's insertions (index arrays and weights) and deletions (index
        arrays); what changed. A pair inserted twice in one epoch keeps its smallest
        weight; a pair both inserted and deleted in one epoch is deleted."""
        gone = np.unique(pack(*deleted))
        keys, weights = _distinct(*inserted)
        inserted_keys = keys  # a pair inserted and deleted at once is no missing deletion
        kept = ~np.isin(keys, gone)
        keys, weights = keys[kept], weights[kept]
        at, held = _found(self.keys, keys)
        kept_keys, new, old = keys[held], weights[held], self.weights[at[held]]
        fell, rose = new < old, new > old
        at_gone, found = _found(self.keys, gone)
        removed = _split(gone[found], self.weights[at_gone[found]])
        weighted = self.weights.copy() if held.any() else self.weights
        weighted[at[held]] = new
        survive = np.ones(len(self.keys), dtype=bool)
        survive[at_gone[found]] = False
        base_keys, base_weights = self.keys[survive], weighted[survive]
        into = np.searchsorted(base_keys, keys[~held])
        self.keys = np.insert(base_keys, into, keys[~held])
        self.weights = np.insert(base_weights, into, weights[~held])
        self._starts = self._transposed = None
        return Change(
            added=_split(keys[~held], weights[~held]),
            removed=removed,
            lighter=_split(kept_keys[fell], new[fell]),
            heavier=_split(kept_keys[rose], old[rose]),
            new_vertices=new_vertices,
            missing=int(np.count_nonzero(~found & ~np.isin(gone, inserted_keys))),
        )

    # -- as one row of arrays ---------------------------------------------------------

    def encoded(self, id_type: pa.DataType) -> dict[str, pa.Array]:
        """The graph's columns of its one-row state."""
        return {
            "ids": cell(pa.array(self.ids, type=id_type)),
            "keys": cell(pa.array(self.keys)),
            "weights": cell(pa.array(self.weights)),
        }

    @classmethod
    def empty(cls, kind: Any = np.int64) -> StreamGraph:
        """A graph with no vertex yet, whose ids will be of numpy type ``kind``."""
        return cls(ids=np.zeros(0, kind), keys=np.zeros(0, np.int64), weights=np.zeros(0))

    @classmethod
    def decoded(cls, row: pa.Table) -> StreamGraph:
        """The graph that ``encoded`` wrote into ``row``."""
        ids = values_of(row, "ids")
        kind = np.int64 if pa.types.is_integer(ids.type) else object
        return cls(
            ids=ids.to_numpy(zero_copy_only=False).astype(kind),
            keys=values_of(row, "keys").to_numpy(zero_copy_only=False).astype(np.int64),
            weights=values_of(row, "weights").to_numpy(zero_copy_only=False).astype(np.float64),
        )


def pack(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The keys of the edges ``src -> dst`` (vertex indices): ``src << 32 | dst``."""
    return (src << _SHIFT) | dst


def _found(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``keys`` is (or would go) in ``sorted_keys``, and whether it is there."""
    at = np.searchsorted(sorted_keys, keys)
    there = at < len(sorted_keys)
    there[there] = sorted_keys[at[there]] == keys[there]
    return at, there


def _distinct(
    src: np.ndarray, dst: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct keys of the pairs, each with its smallest weight."""
    keys = pack(src, dst)
    distinct, inverse = np.unique(keys, return_inverse=True)
    least = np.full(len(distinct), np.inf)
    np.minimum.at(least, inverse, weights)
    return distinct, least


def cell(values: pa.Array) -> pa.ListArray:
    """One list cell holding ``values``."""
    return pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()), values)


def values_of(row: pa.Table, column: str) -> Any:
    """The array in the one cell of ``column``."""
    return row.column(column).combine_chunks()[0].values
