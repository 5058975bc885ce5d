"""The built-in per-partition kernels against plain numpy and Python, without Spark: k-means'
assignment and cluster sums, the regressions' loss and gradient, PageRank's contributions
and connected components' local joins, on the edge cases a partition can bring (weights,
ties, no rows, a cluster without points, dangling vertices, duplicate edges)."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest

from iterflow.graph.components import edge_ends, local_joins, numbered
from iterflow.graph.pagerank import contributions, edge_indices
from iterflow.graph.vectors import built_once
from iterflow.ml.features import Features, block_rows
from iterflow.ml.kmeans import cluster_sums, feature_matrix, nearest, points_of
from iterflow.ml.regression_problem import design, loss_sums


class Count:
    """A stand-in for a metrics counter."""

    def __init__(self) -> None:
        self.value = 0

    def inc(self, n: int) -> None:
        self.value += n


def close(got: np.ndarray | float, want: np.ndarray | float, rel: float = 1e-12) -> bool:
    """Equal within ``rel`` of the largest magnitude involved (sums of many terms)."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-300)
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= rel * scale))


# -- k-means ----------------------------------------------------------------------------


def lloyd_reference(points, centroids, weights=None):
    """Per point, the squared distance to every centroid taken directly, the first nearest;
    then the sums, counts and cost added up point by point."""
    k, dims = centroids.shape
    weights = np.ones(len(points)) if weights is None else weights
    sums, counts, cost, chosen = np.zeros((k, dims)), np.zeros(k), 0.0, []
    for point, weight in zip(points, weights, strict=True):
        gaps = [float(((point - c) ** 2).sum()) for c in centroids]
        best = gaps.index(min(gaps))
        chosen.append(best)
        sums[best] += weight * point
        counts[best] += weight
        cost += weight * gaps[best]
    return np.array(chosen, dtype=np.intp), sums, counts, cost


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 700, 9000])
def test_cluster_sums_match_point_by_point_sums(rows, weighted):
    rng = np.random.default_rng(rows)
    dims, k = 5, 6
    points = rng.normal(size=(rows, dims)) * 3
    centroids = rng.normal(size=(k, dims)) * 3
    centroids[5] = 100.0  # far from every point: a cluster with no points
    weights = rng.random(rows) * 2 if weighted else None
    chosen, want_sums, want_counts, want_cost = lloyd_reference(points, centroids, weights)
    sums, counts, cost = cluster_sums(points, centroids, weights)
    assert close(sums, want_sums) and close(counts, want_counts) and close(cost, want_cost)
    assert counts[5] == 0 and not sums[5].any()
    assert np.array_equal(nearest(points, centroids)[0], chosen)
    # The squared lengths that prepare takes once give the same sums and cost to the bit.
    squares = np.einsum("ij,ij->i", points, points)
    again = cluster_sums(points, centroids, weights, squares)
    assert all(np.array_equal(a, b) for a, b in zip(again, (sums, counts, cost), strict=True))


def test_ties_go_to_the_first_centroid_in_every_block():
    # More rows than one block holds, so that the later blocks are checked too.
    rows = 3 * block_rows(2 + 3) + 17
    points = np.zeros((rows, 2))
    points[:, 0] = np.tile([0.0, 2.0, -2.0], rows // 3 + 1)[:rows]
    # Centroid 1 equals centroid 3; 0.0 lies half-way between centroids 1 and 2.
    centroids = np.array([[9.0, 9.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [2.0, 0.0]])
    chosen, distance = nearest(points, centroids)
    want = np.where(points[:, 0] == 0.0, 1, np.where(points[:, 0] == 2.0, 4, 1))
    assert np.array_equal(chosen, want)
    assert np.array_equal(
        distance, np.where(points[:, 0] == 0.0, 1.0, np.where(points[:, 0] == 2.0, 0.0, 1.0))
    )
    sums, counts, _ = cluster_sums(points, centroids)
    assert counts.tolist() == [0, int((want == 1).sum()), 0, 0, int((want == 4).sum())]
    lefts, rights = int((points[:, 0] == -2.0).sum()), int((want == 4).sum())
    assert sums.tolist() == [
        [0.0, 0.0],
        [-2.0 * lefts, 0.0],
        [0.0, 0.0],
        [0.0, 0.0],
        [2.0 * rights, 0.0],
    ]


def test_nearest_over_many_blocks_matches_direct_distances():
    rng = np.random.default_rng(7)
    points, centroids = rng.normal(size=(20_011, 50)), rng.normal(size=(7, 50))
    direct = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    chosen, distance = nearest(points, centroids)
    assert np.array_equal(chosen, direct.argmin(axis=1))
    assert np.allclose(distance, direct.min(axis=1), rtol=1e-12, atol=1e-9)


def shares_buffer(view: np.ndarray, column: pa.ChunkedArray) -> bool:
    values = column.chunk(0).values.buffers()[1]
    return view.ctypes.data == values.address and view.nbytes == values.size


def test_prepared_points_are_read_without_a_copy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 4))
    table = pa.table({f"f{j}": x[:, j] for j in range(4)} | {"w": rng.random(1000)})
    spec = Features(tuple(f"f{j}" for j in range(4)), "columns", 4)
    # A resident task keeps combine_chunks() of what prepare made; kernels read it every round.
    prepared = feature_matrix(spec, "w")(table).combine_chunks()
    assert np.allclose(prepared["x2"].to_numpy(), (x * x).sum(axis=1), rtol=1e-15)
    for data in (prepared, prepared.to_batches()[0]):
        points, weights = points_of(data, 4)
        assert np.array_equal(points, x) and points.flags.c_contiguous
        assert points.dtype == np.float64 and shares_buffer(points, prepared["x"])
        assert weights is not None and np.shares_memory(weights, prepared["v"].to_numpy())
    rows = design(spec, "w", None, None)(table.append_column("__partition", pa.array([0] * 1000)))
    rows = rows.combine_chunks()
    from iterflow.ml.features import prepared_matrix

    assert shares_buffer(prepared_matrix(rows, "x", 4), rows["x"])
    assert np.array_equal(prepared_matrix(rows.slice(10, 5), "x", 4), x[10:15])


# -- regressions ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "logistic"])
@pytest.mark.parametrize("rows", [0, 3, 40_000])
def test_loss_sums_match_the_plain_formulas(kind, rows):
    rng = np.random.default_rng(rows)
    dims = 6
    x = rng.normal(size=(rows, dims))
    y = (rng.random(rows) < 0.4).astype(float)
    v = rng.random(rows) * 3
    coefficients = rng.normal(size=dims + 1) * 2  # some large |z|: logaddexp's far ends
    z = x @ coefficients[:-1] + coefficients[-1]
    if kind == "linear":
        want_loss = 0.5 * float(np.sum(v * (z - y) ** 2))
        slope = v * (z - y)
    else:
        want_loss = float(np.sum(v * np.logaddexp(0.0, -(2 * y - 1) * z)))
        slope = v * (1.0 / (1.0 + np.exp(-z)) - y)
    want = np.append(x.T @ slope, slope.sum())
    gradient, loss = loss_sums(kind, x, y, v, coefficients)
    assert close(gradient, want) and close(loss, want_loss)


# -- PageRank ---------------------------------------------------------------------------


def pagerank_reference(src, dst, ranks, distinct):
    """Rank carried along every edge one by one, and the rank of the sources."""
    edges = (
        sorted(set(zip(src, dst, strict=True))) if distinct else list(zip(src, dst, strict=True))
    )
    out: dict[int, int] = {}
    for s, _ in edges:
        out[s] = out.get(s, 0) + 1
    spread = np.zeros(len(ranks))
    for s, d in edges:
        spread[d] += ranks[s] / out[s]
    return spread, float(sum(ranks[s] for s in out))


@pytest.mark.parametrize("distinct", [True, False])
def test_contributions_match_edge_by_edge_sums(distinct):
    rng = np.random.default_rng(5)
    n = 300
    ids = pa.array(rng.permutation(np.arange(1000, 1000 + n)))  # ids are not positions
    src, dst = rng.integers(0, n // 2, 2000), rng.integers(0, n, 2000)  # half the vertices dangle
    src[:50], dst[:50] = 7, 9  # a duplicated edge
    src[50:60] = dst[50:60]  # self-loops
    ranks = rng.random(n)
    table = edge_indices(ids, distinct=distinct)(
        pa.table({"src": ids.take(pa.array(src)), "dst": ids.take(pa.array(dst))})
    ).combine_chunks()
    want_spread, want_held = pagerank_reference(src.tolist(), dst.tolist(), ranks, distinct)
    messages = Count()
    for _ in range(2):  # the second round reads the structure the first one built
        row = contributions(table, ranks, messages)
        assert close(row["contribution"][0].values.to_numpy(), want_spread)
        assert close(row["held"][0].as_py(), want_held)
    assert messages.value == 2 * table.num_rows


def test_contributions_of_an_empty_partition_are_zero():
    ids = pa.array(np.arange(10))
    table = edge_indices(ids)(
        pa.table({"src": pa.array([], pa.int64()), "dst": pa.array([], pa.int64())})
    )
    row = contributions(table, np.full(10, 0.1), Count())
    assert row["contribution"][0].values.to_numpy().tolist() == [0.0] * 10
    assert row["held"][0].as_py() == 0.0


def test_built_once_keeps_a_value_per_table_while_the_table_lives():
    calls = []

    def build(table: pa.Table, n: int) -> list[int]:
        calls.append(n)
        return [table.num_rows, n]

    first, second = pa.table({"a": [1, 2]}), pa.table({"a": [1, 2]})
    held = built_once(first, build, 5)
    assert built_once(first, build, 5) is held and calls == [5]
    assert built_once(second, build, 5) is not held and calls == [5, 5]
    assert built_once(first, build, 6) == [2, 6] and calls == [5, 5, 6]
    from iterflow.graph import vectors

    before = len(vectors._BUILT)
    del first
    gc.collect()
    assert len(vectors._BUILT) == before - 2  # both of first's values went with it


# -- connected components ---------------------------------------------------------------


def joins_reference(u, v, labels):
    """Union-find in plain Python over the labels at both ends of every edge across two
    labels: each label that is not the smallest of its set, and that smallest."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a, b in zip(labels[u].tolist(), labels[v].tolist(), strict=True):
        if a != b:
            ra, rb = root(a), root(b)
            parent.setdefault(ra, ra)
            parent.setdefault(rb, rb)
            parent[max(ra, rb)] = min(ra, rb)
    return {x: root(x) for x in sorted(parent) if root(x) != x}


@pytest.mark.parametrize("merged", [False, True])  # many labels touched (round 1), or few
def test_local_joins_match_union_find(merged):
    rng = np.random.default_rng(11)
    n = 4000
    src, dst = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    labels = np.arange(n)
    if merged:  # most vertices already share a label: few edges cross two labels
        labels = np.where(rng.random(n) < 0.995, 0, labels)
    table = edge_ends(pa.array(np.arange(n)))(pa.table({"src": src, "dst": dst}))
    messages = Count()
    row = local_joins(table, labels, messages)
    got = dict(
        zip(row["label"][0].values.to_pylist(), row["root"][0].values.to_pylist(), strict=True)
    )
    keep = src != dst
    assert got == joins_reference(src[keep], dst[keep], labels)
    assert messages.value == int((labels[src] != labels[dst]).sum())


def test_numbered_is_unique_with_inverse():
    rng = np.random.default_rng(2)
    for count, size in [(0, 10), (5, 1000), (5000, 1000), (3, 3)]:
        values = rng.integers(0, size, count)
        distinct, index = numbered(values, size)
        want_distinct, want_index = np.unique(values, return_inverse=True)
        assert np.array_equal(distinct, want_distinct)
        assert np.array_equal(index, want_index.reshape(-1))
