"""The built-in kernels against the floor: one partition, one core, no Spark.

Every built-in kernel runs once per data partition per round, in a resident task or a
Spark task, on one core (PySpark's Python workers start with one BLAS thread). This
script builds one partition of the size ``bench_resident.py`` gives each of its 4
partitions, prepares it as the iteration's ``prepare`` step does, and times three
things on it:

- **before**: the kernel as it was at commit ``3a64ca9`` (the copies below, ``old_*``:
  verbatim but for their names; the two ``add_input`` methods as functions, gradient
  descent's without its mini-batch branch, which a full batch skips);
- **now**: the kernel as the library runs it (its public-to-the-body entry point:
  ``LloydStep.add_input``, ``GradientStep.add_input``, ``contributions``,
  ``local_joins``);
- **floor**: a single-thread numpy/scipy reference doing the same arithmetic on the
  same arrays (already numpy, no Arrow) in the fewest, most direct calls.

The partitions:

1. **k-means**: 250,000 points x 16 from ``bench_ml``'s blobs (seed 0; the first
   250,000 of the 1,000,000), k = 16 from ``bench_ml``'s initial centroids; unweighted,
   and with uniform random weights (``weightCol``). Floor: ``d = |c|^2 - 2 X @ C.T``,
   ``argmin``, the cost from ``take_along_axis`` and the row norms, the sums as one
   ``scipy.sparse`` product (one-hot CSC k x n @ X), the counts by ``bincount``. Two
   more references: ``X @ C.T`` alone (the whole partition's product), and "bare": the
   scores and their argmin in blocks of 8,192 rows, the sums and counts, no cost.
2. **Logistic regression** (and linear, same rows): 250,000 rows x 20 as
   ``bench_ml.regression_inputs`` draws them. Floor: ``z = X @ w + b``, the loss by
   ``np.logaddexp``, ``scipy.special.expit``, ``X.T @ r``.
3. **PageRank**: the edges of ``bench_graph.random_edges(100_000, 1_000_000)`` whose
   source is 0 mod 4 (one of 4 partitions by source, ~250,000 edges, as the vector
   path partitions them), prepared by ``edge_indices``. Floor: ``M @ ranks`` with M the
   partition's n x n matrix of shares in scipy CSR (rows = destinations) or CSC, the
   faster of the two, plus the rank its sources hold; building M is not timed (the
   kernel's own build, done once per partition, is reported on its own).
4. **Components**, the same partition prepared by ``edge_ends``: round 1 (every label
   its own vertex) and round 2 (the labels after round 1: no edge across). Floor:
   ``scipy.sparse.csgraph.connected_components`` of the edges across two labels
   (n x n, weak), and the smallest vertex of each component.

Each variant is warmed up (3 calls), then the variants take turns, ``REPETITIONS``
calls each; figures are the median (and the fastest) in milliseconds. The script sets
``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` to 1 before numpy
is imported, and checks every "now" result against "before" (largest relative
difference; 0 means the same to the bit).

    python benchmarks/bench_kernels.py [--quick]
"""

from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"  # before numpy loads BLAS, as in PySpark's Python workers

import gc  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import bench_graph  # noqa: E402
import bench_ml  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse  # noqa: E402
import scipy.special  # noqa: E402
from _common import COMMIT, median, parse_args, print_table, write_result  # noqa: E402
from scipy.sparse import csgraph  # noqa: E402

import iterflow as itf  # noqa: E402
from iterflow.demo.online_kmeans_demo import blobs  # noqa: E402
from iterflow.graph.components import edge_ends, local_joins, settle  # noqa: E402
from iterflow.graph.pagerank import contributions, edge_indices, edge_matrix  # noqa: E402
from iterflow.ml.features import PARTITION, Features  # noqa: E402
from iterflow.ml.kmeans import LloydStep, feature_matrix  # noqa: E402
from iterflow.ml.regression import GradientStep  # noqa: E402
from iterflow.ml.regression_problem import FitOptions, binary_labels, design  # noqa: E402

REPETITIONS = 40
WARM_UP = 3
POINTS, EDGES, VERTICES = 250_000, 1_000_000, 100_000


class Count:
    """A stand-in for the kernels' metrics counter."""

    def inc(self, n: int) -> None:
        pass


# -- the kernels at 3a64ca9, verbatim but for their names ------------------------------


def old_points_of(data: Any, dims: int) -> tuple[np.ndarray, np.ndarray | None]:
    x = data.column("x")
    flat = (x.combine_chunks() if isinstance(x, pa.ChunkedArray) else x).flatten()
    weights = data.column("v").to_numpy() if "v" in data.schema.names else None
    return flat.to_numpy().reshape(-1, dims), weights


def old_nearest(points: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = (centroids**2).sum(axis=1) - 2.0 * points @ centroids.T
    chosen = np.argmin(scores, axis=1)
    best = scores[np.arange(len(points)), chosen]
    return chosen, np.maximum(best + np.einsum("ij,ij->i", points, points), 0.0)


def old_cluster_sums(
    points: np.ndarray, centroids: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    k = len(centroids)
    chosen, distance = old_nearest(points, centroids)
    member = np.zeros((len(points), k))
    member[np.arange(len(points)), chosen] = 1.0 if weights is None else weights
    counts = np.bincount(chosen, weights=weights, minlength=k)
    cost = distance if weights is None else distance * weights
    return member.T @ points, counts, float(cost.sum())


def old_lloyd_add_input(centroids: np.ndarray, acc: tuple[Any, ...], batch: Any) -> Any:
    points, weights = old_points_of(batch, centroids.shape[1])
    sums = old_cluster_sums(points, centroids, weights)
    return tuple(a + b for a, b in zip(acc, sums, strict=True))


def old_loss_sums(
    kind: str, x: np.ndarray, y: np.ndarray, v: np.ndarray, coefficients: np.ndarray
) -> tuple[np.ndarray, float]:
    z = x @ coefficients[:-1] + coefficients[-1]
    if kind == "linear":
        residual = z - y
        loss = 0.5 * float(np.sum(v * residual**2))
        slope = v * residual
    else:
        sign = 2.0 * y - 1.0
        loss = float(np.sum(v * np.logaddexp(0.0, -sign * z)))
        slope = v * (1.0 / (1.0 + np.exp(-z)) - y)
    return np.append(x.T @ slope, slope.sum()), loss


def old_gradient_add_input(
    kind: str, coefficients: np.ndarray, acc: tuple[Any, ...], batch: Any
) -> tuple[Any, ...]:
    # GradientStep.add_input with batch_fraction = 1 (no mini-batch).
    gradient, loss, weight, seen = acc
    x = batch.column("x").flatten().to_numpy().reshape(-1, len(coefficients) - 1)
    y, v = batch.column("y").to_numpy(), batch.column("v").to_numpy()
    part_gradient, part_loss = old_loss_sums(kind, x, y, v, coefficients)
    return gradient + part_gradient, loss + part_loss, weight + float(v.sum()), seen + len(y)


def old_contributions(table: pa.Table, ranks: np.ndarray, messages: Any) -> pa.Table:
    src = table["src"].to_numpy()
    messages.inc(len(src))
    spread = np.bincount(
        table["dst"].to_numpy(),
        weights=ranks[src] * table["share"].to_numpy(),
        minlength=len(ranks),
    )
    held = ranks[src[table["first"].to_numpy(zero_copy_only=False)]].sum()
    return pa.table([itf.vector_cell(spread), pa.array([held])], names=["contribution", "held"])


def old_local_joins(table: pa.Table, labels: np.ndarray, messages: Any) -> pa.Table:
    a, b = labels[table["u"].to_numpy()], labels[table["v"].to_numpy()]
    across = a != b
    messages.inc(int(across.sum()))
    touched, ends = np.unique(np.concatenate([a[across], b[across]]), return_inverse=True)
    half = int(across.sum())
    local = settle(np.arange(len(touched)), ends[:half], ends[half:])
    moved = local != np.arange(len(touched))
    return pa.table(
        [itf.vector_cell(touched[moved]), itf.vector_cell(touched[local[moved]])],
        names=["label", "root"],
    )


# -- timing -------------------------------------------------------------------------------


def timed(variants: dict[str, Callable[[], Any]], repetitions: int) -> dict[str, dict[str, float]]:
    """Median and fastest milliseconds of every variant: warmed up, then taking turns."""
    for call in variants.values():
        for _ in range(WARM_UP):
            call()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    gc.collect()
    for _ in range(repetitions):
        for name, call in variants.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return {
        name: {"median_ms": 1e3 * median(values), "fastest_ms": 1e3 * min(values)}
        for name, values in seconds.items()
    }


def difference(got: Any, want: Any) -> float:
    """The largest difference between two results, relative to the largest magnitude."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-300)
    return float(np.abs(got - want).max(initial=0.0) / scale)


def cell(table: pa.Table, column: str) -> np.ndarray:
    return np.asarray(table[column][0].values.to_numpy(zero_copy_only=False))


# -- the workloads -------------------------------------------------------------------------


def kmeans_kernels(points: int, repetitions: int) -> dict[str, Any]:
    """k-means' ``LloydStep.add_input`` on one partition, unweighted and weighted."""
    rng = np.random.default_rng(bench_ml.SEED)
    centers = rng.uniform(-10.0, 10.0, size=(bench_ml.K, bench_ml.DIMS))
    x = blobs(rng, 4 * points, centers, spread=1.0)
    start = x[np.random.default_rng(bench_ml.INIT_SEED).choice(4 * points, bench_ml.K, False)]
    x = x[:points]
    weights = np.random.default_rng(2).random(points)
    raw = pa.table({f"f{j}": x[:, j] for j in range(bench_ml.DIMS)} | {"w": weights})
    spec = Features(tuple(f"f{j}" for j in range(bench_ml.DIMS)), "columns", bench_ml.DIMS)
    out: dict[str, Any] = {}
    for weight in (None, "w"):
        batch = feature_matrix(spec, weight)(raw).combine_chunks().to_batches()[0]
        step = LloydStep(start, None)
        w = None if weight is None else weights

        def floor(w: np.ndarray | None = w) -> tuple[Any, ...]:
            d = (start * start).sum(axis=1) - 2.0 * (x @ start.T)
            chosen = d.argmin(axis=1)
            gaps = np.take_along_axis(d, chosen[:, None], axis=1)[:, 0] + (x * x).sum(axis=1)
            ones = np.ones(points) if w is None else w
            member = scipy.sparse.csc_array(
                (ones, chosen, np.arange(points + 1)), (len(start), points)
            )
            cost = gaps.sum() if w is None else gaps @ w
            return member @ x, np.bincount(chosen, w, len(start)), cost

        def bare(w: np.ndarray | None = w) -> tuple[Any, ...]:
            # Only what an assignment cannot skip: the scores and their argmin (in blocks of
            # 8,192 rows, as the kernel), the sums and counts; no distances, no cost.
            chosen = np.empty(points, dtype=np.intp)
            lengths, scaled = (start * start).sum(axis=1), -2.0 * start.T
            for at in range(0, points, 8192):
                chosen[at : at + 8192] = (x[at : at + 8192] @ scaled + lengths).argmin(axis=1)
            ones = np.ones(points) if w is None else w
            member = scipy.sparse.csc_array(
                (ones, chosen, np.arange(points + 1)), (len(start), points)
            )
            return member @ x, np.bincount(chosen, w, len(start))

        variants = {
            "before": lambda step=step, batch=batch: old_lloyd_add_input(
                start, step.create_accumulator(), batch
            ),
            "now": lambda step=step, batch=batch: step.add_input(step.create_accumulator(), batch),
            "floor": floor,
            "X @ C.T alone": lambda: x @ start.T,
            "bare: blocked X @ C.T, argmin, sums": bare,
        }
        before, now = variants["before"](), variants["now"]()
        name = "k-means" if weight is None else "k-means, weighted"
        out[name] = {
            "times": timed(variants, repetitions),
            "now_vs_before": [difference(n, b) for n, b in zip(now, before, strict=True)],
        }
    return out


def regression_kernels(rows: int, repetitions: int) -> dict[str, Any]:
    """Gradient descent's ``GradientStep.add_input`` (L-BFGS's ``Evaluation`` runs the same
    ``loss_sums``) on one partition: logistic, and linear on the same rows."""
    rng = np.random.default_rng(bench_ml.SEED)
    x = rng.normal(size=(rows, bench_ml.LR_FEATURES))
    true = rng.normal(0.0, 0.5, size=bench_ml.LR_FEATURES)
    z = x @ true + bench_ml.TRUE_INTERCEPT
    y = (rng.random(rows) < 1.0 / (1.0 + np.exp(-z))).astype(np.float64)
    names = [f"x{j}" for j in range(bench_ml.LR_FEATURES)]
    raw = pa.table({n: x[:, j] for j, n in enumerate(names)} | {"label": y, PARTITION: [0] * rows})
    spec = Features(tuple(names), "columns", len(names))
    batch = binary_labels(design(spec, "label", None, None), "label")(raw)
    batch = batch.combine_chunks().to_batches()[0]
    v = np.ones(rows)
    coefficients = np.append(rng.normal(0.0, 0.3, size=len(names)), 0.1)
    w, b = coefficients[:-1], coefficients[-1]
    out: dict[str, Any] = {}
    for kind in ("logistic", "linear"):
        options = FitOptions(
            kind=kind, features=names, label="label", weight=None, learning_rate=1.0, reg=0.0,
            max_rounds=50, tol=None, loss_tol=None, batch_fraction=1.0, seed=0, listen=None,
            run_options={},
        )  # fmt: skip
        step = GradientStep(kind, coefficients, options, 0, None)

        def floor(kind: str = kind) -> tuple[Any, ...]:
            z = x @ w + b
            if kind == "linear":
                r = z - y
                return x.T @ (v * r), r.sum(), 0.5 * (v * r * r).sum()
            r = v * (scipy.special.expit(z) - y)
            return x.T @ r, r.sum(), (v * np.logaddexp(0.0, (1.0 - 2.0 * y) * z)).sum()

        variants = {
            "before": lambda kind=kind, step=step: old_gradient_add_input(
                kind, coefficients, step.create_accumulator(), batch
            ),
            "now": lambda step=step: step.add_input(step.create_accumulator(), batch),
            "floor": floor,
        }
        before, now = variants["before"](), variants["now"]()
        out[f"{kind} regression"] = {
            "times": timed(variants, repetitions),
            "now_vs_before": [difference(n, o) for n, o in zip(now, before, strict=True)],
        }
    return out


def partition_edges(vertices: int, edges: int) -> tuple[pa.Array, pa.Table]:
    """The vertex ids and the raw edges of one of 4 partitions by source."""
    src, dst = bench_graph.random_edges(vertices, edges)
    mine = src % 4 == 0
    return pa.array(np.arange(vertices)), pa.table({"src": src[mine], "dst": dst[mine]})


def pagerank_kernel(vertices: int, edges: int, repetitions: int) -> dict[str, Any]:
    """PageRank's ``contributions`` on one partition of the vector path."""
    ids, raw = partition_edges(vertices, edges)
    table = edge_indices(ids)(raw).combine_chunks()
    src, dst = table["src"].to_numpy(), table["dst"].to_numpy()
    share = table["share"].to_numpy()
    sources = src[table["first"].to_numpy(zero_copy_only=False)]
    ranks = np.random.default_rng(3).random(vertices)
    ranks /= ranks.sum()
    by_rows = scipy.sparse.csr_array((share, (dst, src)), shape=(vertices, vertices))
    by_columns = scipy.sparse.csc_array((share, (dst, src)), shape=(vertices, vertices))
    variants = {
        "before": lambda: old_contributions(table, ranks, Count()),
        "now": lambda: contributions(table, ranks, Count()),
        "floor (CSR)": lambda: (by_rows @ ranks, ranks[sources].sum()),
        "floor (CSC)": lambda: (by_columns @ ranks, ranks[sources].sum()),
        "now's build, once per partition": lambda: edge_matrix(table, vertices),
    }
    before, now = variants["before"](), variants["now"]()
    times = timed(variants, repetitions)
    times["floor"] = min(times["floor (CSR)"], times["floor (CSC)"], key=lambda t: t["median_ms"])
    return {
        "PageRank": {
            "edges": table.num_rows,
            "times": times,
            "now_vs_before": [
                difference(cell(now, "contribution"), cell(before, "contribution")),
                difference(now["held"][0].as_py(), before["held"][0].as_py()),
            ],
        }
    }


def components_floor(table: pa.Table, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The smallest vertex of every component of the edges across two labels (scipy)."""
    a, b = labels[table["u"].to_numpy()], labels[table["v"].to_numpy()]
    across = a != b
    n = len(labels)
    graph = scipy.sparse.coo_array(
        (np.ones(int(across.sum()), dtype=np.int8), (a[across], b[across])), shape=(n, n)
    )
    count, component = csgraph.connected_components(graph, directed=True, connection="weak")
    smallest = np.full(count, n)
    np.minimum.at(smallest, component, np.arange(n))
    return component, smallest


def components_kernel(vertices: int, edges: int, repetitions: int) -> dict[str, Any]:
    """Components' ``local_joins`` on one partition: round 1, and round 2 (nothing across)."""
    ids, raw = partition_edges(vertices, edges)
    table = edge_ends(ids)(raw).combine_chunks()
    first = np.arange(vertices)
    src, dst = bench_graph.random_edges(vertices, edges)
    settled = settle(first, src, dst)  # every partition's edges joined: round 2's labels
    out: dict[str, Any] = {}
    for name, labels in (("components, round 1", first), ("components, round 2", settled)):
        variants = {
            "before": lambda labels=labels: old_local_joins(table, labels, Count()),
            "now": lambda labels=labels: local_joins(table, labels, Count()),
            "floor": lambda labels=labels: components_floor(table, labels),
        }
        before, now = variants["before"](), variants["now"]()
        same = all(np.array_equal(cell(now, c), cell(before, c)) for c in ("label", "root"))
        out[name] = {"times": timed(variants, repetitions), "now_equals_before": same}
    return out


# -- the report ----------------------------------------------------------------------------


def blas() -> Any:
    """What BLAS numpy was built with (``np.show_config``), where it says."""
    try:
        config = np.show_config(mode="dicts")
        return config["Build Dependencies"]["blas"]  # type: ignore[index]
    except Exception as error:  # older numpy: no dicts
        return f"unknown ({error})"


def table_rows(results: dict[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [("kernel: before / now / floor (median ms); now/floor", "")]
    for name, result in results.items():
        t = {k: v["median_ms"] for k, v in result["times"].items()}
        shown = f"{t['before']:7.2f} / {t['now']:7.2f} / {t['floor']:7.2f}"
        shown += f";  {t['now'] / t['floor']:.2f}"
        rows.append((name, shown))
    return rows


def main() -> None:
    args = parse_args(__doc__ or "")
    points, edges, vertices = (
        (POINTS, EDGES, VERTICES) if not args.quick else (25_000, 100_000, 10_000)
    )
    repetitions = REPETITIONS if not args.quick else 5
    load_before = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, Any] = {}
    results |= kmeans_kernels(points, repetitions)
    results |= regression_kernels(points, repetitions)
    results |= pagerank_kernel(vertices, edges, repetitions)
    results |= components_kernel(vertices, edges, repetitions)
    print_table(
        f"Kernels on one partition, one thread ({repetitions} calls each)", table_rows(results)
    )
    for name, result in results.items():
        extras = {
            k: round(v["median_ms"], 3)
            for k, v in result["times"].items()
            if k not in ("before", "now", "floor")
        }
        check = result.get("now_vs_before", result.get("now_equals_before"))
        print(f"  {name}: now vs before {check}; {extras}")
    config = {
        "iterflow_commit": COMMIT,
        "before_commit": "3a64ca9",
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pyarrow": pa.__version__,
        "blas": blas(),
        "threads": {
            v: os.environ[v] for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
        },
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load_before,
        "repetitions": repetitions,
        "warm_up_calls": WARM_UP,
        "kmeans": {"points": points, "dims": bench_ml.DIMS, "k": bench_ml.K},
        "regression": {"rows": points, "features": bench_ml.LR_FEATURES},
        "graph": {"vertices": vertices, "edges": edges, "partition": "src % 4 == 0"},
    }
    write_result("bench_kernels", args.quick, config, results)


if __name__ == "__main__":
    main()
