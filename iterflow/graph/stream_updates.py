"""Results kept up to date as edges come and go: the work of one epoch follows the change.

Each ``Update`` holds one value per vertex of a ``StreamGraph`` and turns an epoch's
``Change`` into the new values, starting from the previous epoch's:

- ``Components``: the smallest id of each weakly connected component. New edges merge
  the components they join (a components pass over the labels they touch, not the
  vertices); a deleted edge makes its component be computed again, from its own edges.
- ``Ranks``: PageRank as networkx defines it, by pushing residuals (Andersen, Chung and
  Lang's local push, every vertex above the threshold at once). The scores ``x`` solve
  ``x = 1 + alpha * P^T x`` up to the residuals ``r``; an edge that comes or goes
  changes ``P`` for its source only, so it adds to ``r`` at that source's targets, and
  the pushes spread from there. The ranks are ``x / sum(x)``: with dangling rank spread
  uniformly, as in networkx, the PageRank vector is proportional to that solution.
- ``Paths``: shortest-path distances from one source (non-negative weights). A new or
  lighter edge relaxes its target and the improvement spreads; a deleted or heavier edge
  that carried a shortest path resets the vertices whose shortest paths may have used
  it (those reached from its target along tight edges) and computes them again from
  their neighbours outside.

``rounds`` counts the passes an epoch ran: push rounds, relaxation rounds, components
passes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse
from scipy.sparse.csgraph import connected_components as component_numbers

from iterflow.graph.graphs import GraphError
from iterflow.graph.stream_graph import Change, StreamGraph, cell, pack, values_of


@attrs.frozen
class Step:
    """What an epoch did: the vertices whose value changed (new ones included), and its
    rounds of propagation."""

    changed: np.ndarray
    rounds: int


def _changed(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Vertices whose value differs from ``before`` (which may be shorter: new vertices)."""
    old = len(before)
    differ = np.flatnonzero(before != after[:old])
    return np.concatenate([differ, np.arange(old, len(after))])


def least_ids(ids: np.ndarray, members: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """For each of ``count`` groups, the member (an index into ``ids``) with the least id."""
    frame = pd.DataFrame({"group": groups, "id": ids[members], "member": members})
    first = frame.sort_values(["group", "id"], kind="stable").drop_duplicates("group")
    least = np.empty(count, dtype=np.int64)
    least[first["group"].to_numpy()] = first["member"].to_numpy()
    return least


def _groups(size: int, a: np.ndarray, b: np.ndarray) -> tuple[int, np.ndarray]:
    """The weakly connected components of ``size`` nodes joined by the pairs ``a``, ``b``."""
    ones = np.ones(len(a), dtype=np.int8)
    matrix = scipy.sparse.coo_matrix((ones, (a, b)), shape=(size, size)).tocsr()
    count, groups = component_numbers(matrix, directed=False)
    return int(count), groups


@attrs.define
class Components:
    """Each vertex's component, as the index of its vertex with the least id."""

    labels: np.ndarray
    column: ClassVar[str] = "component"

    def step(self, graph: StreamGraph, change: Change) -> Step:
        before = self.labels
        labels = np.concatenate([before, np.arange(len(before), graph.n, dtype=np.int64)])
        rounds = 0
        if len(change.added[0]):
            labels, rounds = self._merged(graph, labels, change.added), rounds + 1
        if len(change.removed[0]):
            labels, rounds = self._split(graph, labels, change.removed[0]), rounds + 1
        self.labels = labels
        return Step(changed=_changed(before, labels), rounds=rounds)

    @staticmethod
    def _merged(graph: StreamGraph, labels: np.ndarray, added: Any) -> np.ndarray:
        """Join the components that the ``added`` edges connect."""
        a, b = labels[added[0]], labels[added[1]]
        across = a != b
        if not across.any():
            return labels
        reps = np.unique(np.concatenate([a[across], b[across]]))
        count, groups = _groups(
            len(reps), np.searchsorted(reps, a[across]), np.searchsorted(reps, b[across])
        )
        winners = least_ids(graph.ids, reps, groups, count)[groups]
        moved = winners != reps
        labels = labels.copy()
        mask = np.isin(labels, reps[moved])
        labels[mask] = winners[np.searchsorted(reps, labels[mask])]
        return labels

    @staticmethod
    def _split(graph: StreamGraph, labels: np.ndarray, sources: np.ndarray) -> np.ndarray:
        """Compute again the components that lost an edge, from their own edges."""
        members = np.flatnonzero(np.isin(labels, np.unique(labels[sources])))
        src, dst, _ = graph.out_edges(members)
        count, groups = _groups(
            len(members), np.searchsorted(members, src), np.searchsorted(members, dst)
        )
        labels = labels.copy()
        labels[members] = least_ids(graph.ids, members, groups, count)[groups]
        return labels

    def values(self, graph: StreamGraph, id_type: pa.DataType) -> pa.Array:
        return pa.array(graph.ids[self.labels], type=id_type)

    def encoded(self) -> dict[str, pa.Array]:
        return {"labels": cell(pa.array(self.labels))}

    @classmethod
    def empty(cls, _options: Any) -> Components:
        return cls(labels=np.zeros(0, np.int64))

    @classmethod
    def decoded(cls, row: pa.Table, _options: Any) -> Components:
        return cls(labels=_numbers(row, "labels", np.int64))


def _numbers(row: pa.Table, column: str, kind: Any) -> np.ndarray:
    return np.asarray(values_of(row, column).to_numpy(zero_copy_only=False), dtype=kind)


@attrs.define
class Ranks:
    """PageRank by residual push: ``scores`` (x) and ``residuals`` (r)."""

    alpha: float
    tol: float  # the L1 distance of the ranks from the exact ones is at most this
    scores: np.ndarray
    residuals: np.ndarray
    column: ClassVar[str] = "pagerank"

    def step(self, graph: StreamGraph, change: Change) -> Step:
        before = self.scores
        new = graph.n - len(before)
        x = np.concatenate([before, np.zeros(new)])
        r = np.concatenate([self.residuals, np.ones(new)])  # a new vertex brings its own 1
        r += self._moved_shares(graph, change, x)
        rounds = self._push(graph, x, r)
        self.scores, self.residuals = x, r
        return Step(changed=_changed(before, x), rounds=rounds)

    def _moved_shares(self, graph: StreamGraph, change: Change, x: np.ndarray) -> np.ndarray:
        """What the edges that came and went change in ``r = 1 - x + alpha P^T x``: each
        touched source's share now, less its share before."""
        n, touched = graph.n, change.touched
        delta = np.zeros(n)
        if not len(touched):
            return delta
        degrees = graph.out_degrees
        before = degrees - np.bincount(change.added[0], minlength=n)
        before += np.bincount(change.removed[0], minlength=n)
        src, dst, _ = graph.out_edges(touched)
        share = self.alpha * x[src] / degrees[src]
        delta += np.bincount(dst, weights=share, minlength=n)
        # The edges before: those now, but the added ones, and the removed ones.
        old = ~np.isin(pack(src, dst), pack(change.added[0], change.added[1]))
        src = np.concatenate([src[old], change.removed[0]])
        dst = np.concatenate([dst[old], change.removed[1]])
        delta -= np.bincount(dst, weights=self.alpha * x[src] / before[src], minlength=n)
        return delta

    def _push(self, graph: StreamGraph, x: np.ndarray, r: np.ndarray) -> int:
        """Push every residual above the threshold, round after round, in place; the rounds.
        Once every ``|r[v]| <= eps``, ``|x - x*|_1 <= n eps / (1 - alpha)`` and the ranks
        are within ``2 eps / (1 - alpha) = tol`` of the exact ones (``sum(x*) >= n``)."""
        eps = self.tol * (1.0 - self.alpha) / 2.0
        degrees, rounds = graph.out_degrees, 0
        shares = np.divide(self.alpha, degrees, out=np.zeros(graph.n), where=degrees > 0)
        while len(frontier := np.flatnonzero(np.abs(r) > eps)):
            rounds += 1
            pushed = r[frontier]
            x[frontier] += pushed
            r[frontier] = 0.0
            spread = np.zeros(graph.n)
            spread[frontier] = pushed * shares[frontier]
            if degrees[frontier].sum() * 8 > len(graph.keys):  # most edges: one product
                r += graph.transposed @ spread
            else:
                src, dst, _ = graph.out_edges(frontier)
                r += np.bincount(dst, weights=spread[src], minlength=graph.n)
        return rounds

    def values(self, graph: StreamGraph, _id_type: pa.DataType) -> pa.Array:
        total = self.scores.sum()
        return pa.array(self.scores / total if total > 0 else self.scores)

    def encoded(self) -> dict[str, pa.Array]:
        return {"scores": cell(pa.array(self.scores)), "residuals": cell(pa.array(self.residuals))}

    @classmethod
    def empty(cls, options: Any) -> Ranks:
        return cls(options["alpha"], options["tol"], np.zeros(0), np.zeros(0))

    @classmethod
    def decoded(cls, row: pa.Table, options: Any) -> Ranks:
        return cls(
            alpha=options["alpha"],
            tol=options["tol"],
            scores=_numbers(row, "scores", np.float64),
            residuals=_numbers(row, "residuals", np.float64),
        )


@attrs.define
class Paths:
    """Distances from ``source`` (``inf`` where it cannot be reached)."""

    source: Any
    distances: np.ndarray
    column: ClassVar[str] = "distance"

    def step(self, graph: StreamGraph, change: Change) -> Step:
        before = self.distances
        d = np.concatenate([before, np.full(graph.n - len(before), np.inf)])
        found = graph.lookup(self.source)
        if found is not None:
            d[found] = 0.0
        frontier, rounds = self._reset(graph, change, d, found)
        src, dst, w = _joined(change.added, change.lighter)
        frontier = np.concatenate([frontier, _relaxed(d, src, dst, w)])
        while len(frontier):
            rounds += 1
            frontier = _relaxed(d, *graph.out_edges(np.unique(frontier)))
        self.distances = d
        return Step(changed=_changed(before, d), rounds=rounds)

    @staticmethod
    def _reset(
        graph: StreamGraph, change: Change, d: np.ndarray, source: int | None
    ) -> tuple[np.ndarray, int]:
        """Forget the distances that a deleted or heavier edge may have carried, and take
        them again from outside; the vertices to relax from, and the rounds spent."""
        src, dst, w = _joined(change.removed, change.heavier)
        tight = np.isfinite(d[src]) & (d[src] + w == d[dst])
        reached, rounds = _tight_closure(graph, d, np.unique(dst[tight]))
        if not len(reached):
            return np.zeros(0, np.int64), rounds
        d[reached] = np.inf
        if source is not None:
            d[source] = 0.0
        inside = np.zeros(graph.n, dtype=bool)
        inside[reached] = True
        a, b, weights = graph.src, graph.dst, graph.weights
        enter = inside[b] & ~inside[a] & np.isfinite(d[a])
        np.minimum.at(d, b[enter], d[a[enter]] + weights[enter])
        return reached[np.isfinite(d[reached])], rounds

    def values(self, _graph: StreamGraph, _id_type: pa.DataType) -> pa.Array:
        d = self.distances
        return pa.array(d, mask=~np.isfinite(d))

    def encoded(self) -> dict[str, pa.Array]:
        return {"distances": cell(pa.array(self.distances))}

    @classmethod
    def empty(cls, options: Any) -> Paths:
        return cls(source=options["source"], distances=np.zeros(0))

    @classmethod
    def decoded(cls, row: pa.Table, options: Any) -> Paths:
        return cls(source=options["source"], distances=_numbers(row, "distances", np.float64))


def _joined(one: Any, other: Any) -> tuple[np.ndarray, ...]:
    """Two ``(src, dst, weight)`` edge lists as one."""
    return tuple(np.concatenate(parts) for parts in zip(one, other, strict=True))


def _relaxed(d: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Lower ``d`` along the edges, in place; the targets that got nearer."""
    reach = d[src] + w
    nearer = reach < d[dst]
    np.minimum.at(d, dst[nearer], reach[nearer])
    return np.unique(dst[nearer])


def _tight_closure(graph: StreamGraph, d: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, int]:
    """The vertices reached from ``seeds`` along edges on a shortest path (``d[u] + w ==
    d[v]``): all whose distance a lost edge may have carried. And the rounds spent."""
    seen = np.zeros(len(d), dtype=bool)
    seen[seeds] = True
    frontier, rounds = seeds, 0
    while len(frontier):
        rounds += 1
        src, dst, w = graph.out_edges(frontier)
        # ``<``: an edge added or made lighter in this epoch, whose target the relaxation
        # after the reset reaches again; following it resets a few more vertices, never
        # too few (a lighter edge below a lost one must not keep a stale distance).
        on_path = (d[src] + w <= d[dst]) & ~seen[dst]
        frontier = np.unique(dst[on_path])
        seen[frontier] = True
    return np.flatnonzero(seen), rounds


UPDATES: dict[str, Any] = {"components": Components, "pagerank": Ranks, "paths": Paths}


def check_weights(weights: np.ndarray, column: str) -> None:
    """Shortest paths take finite, non-negative weights."""
    bad = ~np.isfinite(weights) | (weights < 0)
    if bad.any():
        raise GraphError(
            f"streaming shortest_paths: the edge column '{column}' must hold finite, "
            f"non-negative weights; {int(bad.sum())} edge(s) of this micro-batch do not "
            f"(e.g. {weights[bad][0]})"
        )
