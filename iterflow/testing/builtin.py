"""The built-in convergence cases: iterflow.graph and iterflow.ml against references
computed without Spark (networkx, numpy), on generated data with fixed seeds.

``iterflow converge`` runs them; ``CASES`` lists them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

import iterflow as itf
from iterflow.graph import Graph, connected_components, pagerank
from iterflow.ml import kmeans, linear_regression, logistic_regression
from iterflow.testing.cases import ConvergenceCase

SEED = 7


def _networkx() -> Any:
    try:
        import networkx
    except ImportError:
        raise itf.IterflowError(
            "the built-in graph cases compute their reference with networkx: "
            "pip install iterflow[converge]"
        ) from None
    return networkx


def _model_vector(end: itf.RoundEnd, column: str) -> np.ndarray:
    """A vector column of the one-row variable ``model`` (iterflow.ml) after a round."""
    return np.array(end.variables["model"].collect()[0][column], dtype=np.float64)


# -- PageRank ------------------------------------------------------------------

PAGERANK_VERTICES = 300


def _random_digraph() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    src = rng.integers(0, PAGERANK_VERTICES, 6 * PAGERANK_VERTICES)
    dst = rng.integers(0, PAGERANK_VERTICES, 6 * PAGERANK_VERTICES)
    keep = src != dst
    return src[keep], dst[keep]


def _graph(spark: Any, src: np.ndarray, dst: np.ndarray, vertices: int) -> Graph:
    # One partition keeps the vertices in id order: vector positions are ids.
    ids = spark.createDataFrame(pa.table({"id": np.arange(vertices, dtype=np.int64)}))
    edges = spark.createDataFrame(pa.table({"src": src, "dst": dst}))
    return Graph(ids.coalesce(1), edges)


def _pagerank_run(spark: Any, listen: Any) -> np.ndarray:
    src, dst = _random_digraph()
    ranks = pagerank(
        _graph(spark, src, dst, PAGERANK_VERTICES),
        tol=1e-10,
        max_rounds=200,
        method="arrow",
        listen=listen,
        progress=False,
    )
    rows = sorted((r["id"], r["pagerank"]) for r in ranks.collect())
    return np.array([rank for _, rank in rows])


def _pagerank_reference() -> np.ndarray:
    nx = _networkx()
    src, dst = _random_digraph()
    graph = nx.DiGraph()
    graph.add_nodes_from(range(PAGERANK_VERTICES))
    graph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    found = nx.pagerank(graph, alpha=0.85, tol=1e-14, max_iter=1000)
    return np.array([found[v] for v in range(PAGERANK_VERTICES)])


def _l1(answer: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(np.asarray(answer) - reference).sum())


PAGERANK = ConvergenceCase(
    name="pagerank",
    description="PageRank of a 300-vertex random digraph vs networkx.pagerank (L1 error)",
    run=_pagerank_run,
    reference=_pagerank_reference,
    error=_l1,
    tol=1e-8,
    round_answer=lambda end: np.array(end.variables["ranks"].collect()[0]["rank"]),
    max_rounds=200,
    rate=0.9,
)


# -- connected components --------------------------------------------------------

COMPONENT_VERTICES = 400


def _forest() -> tuple[np.ndarray, np.ndarray]:
    """Random edges within 8 blocks of vertices, ids shuffled: 8 or more components."""
    rng = np.random.default_rng(SEED)
    block = rng.permutation(COMPONENT_VERTICES) % 8
    src = rng.integers(0, COMPONENT_VERTICES, 3 * COMPONENT_VERTICES)
    dst = rng.integers(0, COMPONENT_VERTICES, 3 * COMPONENT_VERTICES)
    keep = block[src] == block[dst]
    return src[keep], dst[keep]


def _components_run(spark: Any, listen: Any) -> np.ndarray:
    src, dst = _forest()
    found = connected_components(
        _graph(spark, src, dst, COMPONENT_VERTICES), method="arrow", listen=listen, progress=False
    )
    return np.array([c for _, c in sorted((r["id"], r["component"]) for r in found.collect())])


def _components_reference() -> np.ndarray:
    nx = _networkx()
    src, dst = _forest()
    graph = nx.Graph()
    graph.add_nodes_from(range(COMPONENT_VERTICES))
    graph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    labels = np.empty(COMPONENT_VERTICES, dtype=np.int64)
    for component in nx.connected_components(graph):
        labels[list(component)] = min(component)
    return labels


def _misplaced(answer: np.ndarray, reference: np.ndarray) -> float:
    """Vertices not labelled like the rest of their true component, plus true components
    that share a label with another one (0 when the partitions are equal)."""
    answer = np.asarray(answer)
    wrong = 0
    majority: dict[int, int] = {}
    for component in np.unique(reference):
        labels, counts = np.unique(answer[reference == component], return_counts=True)
        majority[int(component)] = int(labels[np.argmax(counts)])
        wrong += int(counts.sum() - counts.max())
    merged = len(majority) - len(set(majority.values()))
    return float(wrong + merged)


COMPONENTS = ConvergenceCase(
    name="connected-components",
    description="components of a 400-vertex random forest of 8 blocks vs networkx "
    "(misplaced vertices)",
    run=_components_run,
    reference=_components_reference,
    error=_misplaced,
    tol=0.0,
    round_answer=lambda end: np.array(end.variables["labels"].collect()[0]["label"]),
    max_rounds=4,
)


# -- k-means -----------------------------------------------------------------------

KMEANS_POINTS, KMEANS_K, KMEANS_DIMS = 3_000, 4, 3


def _blobs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    centers = rng.uniform(-10, 10, (KMEANS_K, KMEANS_DIMS))
    points = centers[rng.integers(0, KMEANS_K, KMEANS_POINTS)]
    points = points + rng.normal(0, 2.0, points.shape)
    return points, points[:KMEANS_K].copy()


def lloyd(points: np.ndarray, centroids: np.ndarray, tol: float, max_rounds: int) -> np.ndarray:
    """Lloyd's algorithm in numpy: centroids until none moves more than ``tol``."""
    for _ in range(max_rounds):
        gaps = ((points[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
        chosen = gaps.argmin(axis=1)
        moved = np.array(
            [
                points[chosen == c].mean(axis=0) if (chosen == c).any() else centroids[c]
                for c in range(len(centroids))
            ]
        )
        shift = float(np.sqrt(((moved - centroids) ** 2).sum(axis=1)).max())
        centroids = moved
        if shift <= tol:
            break
    return centroids


def _kmeans_run(spark: Any, listen: Any) -> np.ndarray:
    points, start = _blobs()
    df = spark.createDataFrame(pa.table({"features": [list(p) for p in points]})).repartition(2)
    model = kmeans(
        df, KMEANS_K, init=start, tol=1e-9, max_rounds=100, listen=listen, progress=False
    )
    return model.centroids


def _kmeans_reference() -> np.ndarray:
    points, start = _blobs()
    return lloyd(points, start, tol=1e-9, max_rounds=100)


def _max_abs(answer: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(np.asarray(answer) - reference).max())


KMEANS = ConvergenceCase(
    name="kmeans",
    description="k-means (k=4) on 3,000 blob points vs numpy Lloyd's from the same "
    "centroids (max centroid difference)",
    run=_kmeans_run,
    reference=_kmeans_reference,
    error=_max_abs,
    tol=1e-9,
    round_answer=lambda end: _model_vector(end, "centroids").reshape(KMEANS_K, KMEANS_DIMS),
    max_rounds=100,
)


# -- regression -----------------------------------------------------------------------

ROWS, FEATURES = 2_000, 3


def _regression_data(kind: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.normal(0, 1, (ROWS, FEATURES))
    score = x @ np.array([1.5, -2.0, 0.5]) + 0.3
    if kind == "linear":
        return x, score + rng.normal(0, 0.5, ROWS)
    return x, (rng.random(ROWS) < 1 / (1 + np.exp(-score))).astype(np.float64)


def _regression_frame(spark: Any, kind: str) -> Any:
    x, y = _regression_data(kind)
    columns = {f"x{j}": x[:, j] for j in range(FEATURES)}
    return spark.createDataFrame(pa.table({**columns, "label": y})).repartition(2)


NAMES = [f"x{j}" for j in range(FEATURES)]


def _regression_run(kind: str, learning_rate: float, tol: float, max_rounds: int) -> Any:
    fit = linear_regression if kind == "linear" else logistic_regression

    def run(spark: Any, listen: Any) -> np.ndarray:
        model = fit(
            _regression_frame(spark, kind),
            features=NAMES,
            solver="gd",
            learning_rate=learning_rate,
            tol=tol,
            max_rounds=max_rounds,
            listen=listen,
            progress=False,
        )
        return np.append(model.coefficients, model.intercept)

    return run


def _least_squares() -> np.ndarray:
    x, y = _regression_data("linear")
    design = np.column_stack([x, np.ones(ROWS)])
    return np.linalg.lstsq(design, y, rcond=None)[0]


LINEAR = ConvergenceCase(
    name="linear-regression",
    description="gradient descent on 2,000 x 3 vs numpy least squares (max coefficient "
    "difference, intercept included)",
    run=_regression_run("linear", learning_rate=1.0, tol=1e-12, max_rounds=500),
    reference=_least_squares,
    error=_max_abs,
    tol=1e-6,
    round_answer=lambda end: _model_vector(end, "coefficients"),
    max_rounds=500,
    rate=0.9,
)


def newton_logistic(x: np.ndarray, y: np.ndarray, rounds: int = 50) -> np.ndarray:
    """The maximum-likelihood logistic regression (intercept last) by Newton's method."""
    design = np.column_stack([x, np.ones(len(y))])
    w = np.zeros(design.shape[1])
    for _ in range(rounds):
        p = 1 / (1 + np.exp(-design @ w))
        hessian = design.T @ (design * (p * (1 - p))[:, None])
        step = np.linalg.solve(hessian, design.T @ (p - y))
        w = w - step
        if np.abs(step).max() < 1e-15:
            break
    return w


LOGISTIC = ConvergenceCase(
    name="logistic-regression",
    description="gradient descent on 2,000 x 3 noisy labels vs Newton's method in numpy "
    "(max coefficient difference)",
    run=_regression_run("logistic", learning_rate=5.0, tol=1e-10, max_rounds=2_000),
    reference=lambda: newton_logistic(*_regression_data("logistic")),
    error=_max_abs,
    tol=1e-6,
    round_answer=lambda end: _model_vector(end, "coefficients"),
    max_rounds=2_000,
    rate=0.9,
)

CASES = [PAGERANK, COMPONENTS, KMEANS, LINEAR, LOGISTIC]
