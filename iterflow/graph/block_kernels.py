"""What a graph algorithm brings to the block path: its kernels, numpy code on the slice
of one block (``BlockKernels``), and the partials they send each other.

A round runs every block's ``send`` on the block's slice and edge file, giving one
``Partial`` per destination block it reaches; each destination block then runs
``receive`` on what reached it (``Received``) and returns its new slice. Everything else
(the layout, the edge files, the rows that carry slices and partials through Spark, the
end of a run) is the runner's (``block_runner``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
import pyarrow as pa

from iterflow.graph.block_edges import EdgeFile

#: A block's slice: one array per state column, one element per vertex (or per vertex and
#: landmark, for shortest paths).
Slice = dict[str, np.ndarray]


@attrs.frozen
class Partial:
    """What a block sends to block ``to``: ``value`` at the offsets ``index`` there (None: at
    every offset, in order; a None ``value``: no values), and ``shared``, a number that
    ``to`` adds up over every block that sends to it (PageRank's dangling rank)."""

    to: int
    value: np.ndarray | None
    index: np.ndarray | None = None
    shared: float = 0.0


@attrs.frozen
class Received:
    """What reached a block in a round: its own values (its slice's first column, as it
    sent them), each partial's offsets (None: every offset) and values (empty: none), and
    the sum of the partials' ``shared``."""

    own: np.ndarray
    partials: list[tuple[np.ndarray | None, np.ndarray]]
    shared: float

    def at_offsets(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Each partial's offsets (for a dense one, every offset) and values."""
        for index, value in self.partials:
            yield (np.arange(len(value)) if index is None else index), value


class BlockKernels(abc.ABC):
    """A graph algorithm on the block path: its state columns and the numpy code that runs on
    one block's slice. The kernels run in Spark's tasks, so they hold plain values (sizes,
    metrics, settings), never a DataFrame."""

    #: The state columns and the Arrow type of their elements. The first is what a block
    #: sends itself every round (``Received.own``), and its type that of the partials' values.
    state: ClassVar[dict[str, pa.DataType]]
    #: Edge files sorted by source offset (for ``EdgeFile.out_of``: kernels whose cost follows
    #: the vertices that send), else by destination block (``EdgeFile.into``).
    by_source: ClassVar[bool] = False

    @abc.abstractmethod
    def first(self, block: int) -> Slice:
        """The slice of ``block`` at round 0."""

    @abc.abstractmethod
    def send(self, edges: EdgeFile, block: int, state: Slice) -> Iterator[Partial]:
        """What ``block`` (its ``state`` and its edge file ``edges``) sends this round."""

    @abc.abstractmethod
    def receive(self, block: int, heard: Received) -> Slice:
        """The new slice of ``block`` from what reached it."""


@attrs.frozen
class LabelKernels(BlockKernels):
    """Kernels of a label per vertex that starts as the vertex's own position (so the
    smallest label of a set is its smallest id: positions follow the ids), as connected
    components and label propagation keep them. ``messages`` counts the labels sent,
    ``active`` those changed."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    messages: Any
    active: Any

    def own_labels(self, block: int) -> np.ndarray:
        """Every vertex of ``block`` labelled with its own position."""
        return self.starts[block] + np.arange(self.sizes[block], dtype=np.int64)


def least_per_block(
    to_block: np.ndarray, index: np.ndarray, value: np.ndarray, sizes: Sequence[int]
) -> Iterator[Partial]:
    """For each destination block (``to_block``, one per message), a partial of its touched
    offsets (``index``, below ``sizes`` of that block), each once with its smallest value."""
    for d, sel in enumerate(_by_block(to_block, len(sizes))):
        if len(sel):
            touched, least = _least_per_offset(sizes[d], index[sel], value[sel])
            yield Partial(d, least, touched)


def _by_block(db: np.ndarray, blocks: int) -> list[np.ndarray]:
    """For each destination block, the indices of ``db`` that name it."""
    # numpy sorts 16-bit integers by radix: one pass over the edges, not n log n
    order = np.argsort(db.astype(np.int16) if blocks <= 1 << 15 else db, kind="stable")
    bounds = np.searchsorted(db[order], np.arange(blocks + 1))
    return [order[bounds[d] : bounds[d + 1]] for d in range(blocks)]


def _least_per_offset(size: int, offsets: np.ndarray, values: np.ndarray) -> tuple[Any, Any]:
    """The touched offsets of a block of ``size``, each once, with its smallest value."""
    top = np.iinfo(values.dtype).max
    least = np.full(size, top, dtype=values.dtype)
    np.minimum.at(least, offsets, values)
    touched = np.flatnonzero(least != top)
    return touched, least[touched]
