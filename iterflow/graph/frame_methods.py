"""The rest of GraphFrames' ``GraphFrame`` methods, as a base of iterflow's ``GraphFrame``:
subgraphs, directions, typed degrees, validation, motifs, messages, and the structure
algorithms (triangles, cores, independent sets, cycles, paths, neighbourhood sketches,
power iteration clustering).

Each keeps GraphFrames' argument names, defaults and result columns. GraphFrames'
tuning arguments (checkpoint intervals, local checkpoints, storage levels) are accepted
and ignored: iterflow persists, releases and checkpoints each round itself. The
iterative ones are iterflow iterations and take ``listen=`` and ``run``'s options as
keywords after GraphFrames' own.
"""

from __future__ import annotations

import warnings
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from iterflow.graph import cores, messages, motifs, neighbours, simple_paths, triangles, views
from iterflow.graph.graphs import GraphError

_DEFAULT_STORAGE = StorageLevel.MEMORY_AND_DISK_DESER


def _not_built(method: str, instead: str) -> NotImplementedError:
    return NotImplementedError(f"GraphFrame.{method} is not built in iterflow; {instead}")


class GraphFrameMethods:
    """GraphFrames' methods beyond the classic algorithms (mixed into ``GraphFrame``)."""

    vertices: DataFrame
    edges: DataFrame

    def _with(self, parts: tuple[DataFrame, DataFrame]) -> Any:
        return type(self)(parts[0], parts[1])  # type: ignore[call-arg]

    # -- caching ----------------------------------------------------------------

    def cache(self) -> Any:
        """Persist the vertices and edges (Spark's default level); returns the graph."""
        self.vertices.cache()
        self.edges.cache()
        return self

    def persist(self, storageLevel: StorageLevel = StorageLevel.MEMORY_ONLY) -> Any:
        """Persist the vertices and edges at ``storageLevel``; returns the graph."""
        self.vertices.persist(storageLevel)
        self.edges.persist(storageLevel)
        return self

    def unpersist(self, blocking: bool = False) -> Any:
        """Release what ``cache``/``persist`` held; returns the graph."""
        self.vertices.unpersist(blocking)
        self.edges.unpersist(blocking)
        return self

    # -- views ------------------------------------------------------------------

    def filterVertices(self, condition: str | Column) -> Any:
        """The vertices meeting ``condition``, and the edges between them."""
        return self._with(views.filter_vertices(self, condition))  # type: ignore[arg-type]

    def filterEdges(self, condition: str | Column) -> Any:
        """Every vertex, and the edges meeting ``condition``."""
        return self._with(views.filter_edges(self, condition))  # type: ignore[arg-type]

    def dropIsolatedVertices(self) -> Any:
        """The vertices that are an end of some edge, and every edge."""
        return self._with(views.drop_isolated_vertices(self))  # type: ignore[arg-type]

    def as_undirected(self) -> Any:
        """Every edge in both directions (attributes kept on both copies)."""
        return type(self)(self.vertices, views.both_directions(self.edges))  # type: ignore[call-arg]

    def as_reversed(self) -> Any:
        """Every edge reversed (attributes kept)."""
        return type(self)(self.vertices, views.reversed_edges(self.edges))  # type: ignore[call-arg]

    def type_out_degree(self, edge_type_col: str, edge_types: list[Any] | None = None) -> DataFrame:
        """``id``, ``outDegrees``: a struct of out-edge counts (int) per edge type."""
        return views.typed_degrees(self, "out", edge_type_col, edge_types)  # type: ignore[arg-type]

    def type_in_degree(self, edge_type_col: str, edge_types: list[Any] | None = None) -> DataFrame:
        """``id``, ``inDegrees``: a struct of in-edge counts (int) per edge type."""
        return views.typed_degrees(self, "in", edge_type_col, edge_types)  # type: ignore[arg-type]

    def type_degree(self, edge_type_col: str, edge_types: list[Any] | None = None) -> DataFrame:
        """``id``, ``degrees``: a struct of edge counts (int) per edge type, both ways."""
        return views.typed_degrees(self, "both", edge_type_col, edge_types)  # type: ignore[arg-type]

    def validate(
        self, check_vertices: bool = True, intermediate_storage_level: Any = _DEFAULT_STORAGE
    ) -> None:
        """Raise a ``GraphError`` (a ValueError) for a null or repeated vertex id, and with
        ``check_vertices`` for an edge end that is no vertex id."""
        views.validate(self, check_vertices=check_vertices)  # type: ignore[arg-type]

    # -- motifs and messages -------------------------------------------------------

    def find(self, pattern: str) -> DataFrame:
        """Every match of a motif such as ``"(a)-[e]->(b); !(b)-[]->(a)"``
        (see ``iterflow.graph.motifs``)."""
        return motifs.find(self, pattern)

    def aggregateMessages(
        self,
        aggCol: Any,
        sendToSrc: Any = None,
        sendToDst: Any = None,
        intermediate_storage_level: Any = _DEFAULT_STORAGE,
    ) -> DataFrame:
        """``id`` and the aggregates of the messages each vertex receives
        (``iterflow.graph.aggregate_messages``); a single Column instead of a list warns
        as GraphFrames does."""
        for name, value in (("aggCol", aggCol), ("sendToSrc", sendToSrc), ("sendToDst", sendToDst)):
            if value is not None and not isinstance(value, list):
                warnings.warn(
                    f"Passing single column to {name} is deprecated, use list",
                    DeprecationWarning,
                    stacklevel=2,
                )
        return messages.aggregate_messages(
            self, aggCol, send_to_src=sendToSrc, send_to_dst=sendToDst
        )

    # -- structure algorithms ----------------------------------------------------

    def triangleCount(
        self,
        storage_level: Any = _DEFAULT_STORAGE,
        algorithm: str = "exact",
        lg_nom_entries: int = 12,
    ) -> DataFrame:
        """The vertices with ``count``: triangles through each. ``algorithm="approx"`` is
        accepted and counts exactly."""
        if algorithm not in ("exact", "approx"):
            raise GraphError(f"triangleCount(algorithm={algorithm!r}): 'exact' or 'approx'")
        return triangles.triangle_count(self)

    def k_core(
        self,
        checkpoint_interval: int = 2,
        use_local_checkpoints: bool = False,
        storage_level: Any = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """``id`` and ``kcore``: every vertex's core number."""
        return cores.k_core(self, listen=listen, **run_options)

    def maximal_independent_set(
        self,
        seed: int = 42,
        checkpoint_interval: int = 2,
        use_local_checkpoints: bool = False,
        storage_level: Any = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """The vertices of a maximal independent set, with ``selected`` (true)."""
        return cores.maximal_independent_set(self, seed=seed, listen=listen, **run_options)

    def detectingCycles(
        self,
        checkpoint_interval: int = 2,
        use_local_checkpoints: bool = False,
        storage_level: Any = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """``id`` and ``found_cycles``: each directed cycle once, from its smallest id."""
        return simple_paths.detecting_cycles(self, listen=listen, **run_options)

    def all_paths(
        self,
        from_expr: Column | str,
        to_expr: Column | str,
        edge_filter: Column | str | None = None,
        max_path_length: int = 5,
        is_directed: bool = True,
        checkpoint_interval: int = 2,
        use_local_checkpoints: bool = False,
        storage_level: Any = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """``path`` and ``len``: every simple path of at most ``max_path_length`` edges."""
        return simple_paths.all_paths(
            self,
            from_expr,
            to_expr,
            edge_filter=edge_filter,
            max_path_length=max_path_length,
            is_directed=is_directed,
            listen=listen,
            **run_options,
        )

    def hyper_anf(
        self,
        n_hops: int = 3,
        lg_nom_entries: int = 12,
        edge_filter: Column | str | None = None,
        checkpoint_interval: int = 2,
        use_local_checkpoints: bool = False,
        storage_level: Any = _DEFAULT_STORAGE,
    ) -> DataFrame:
        """``id``, ``hop_0`` ... ``hop_{n_hops}``: HyperLogLog sketches of the vertices
        at each number of hops (``iterflow.graph.triangles.hyper_anf``)."""
        return triangles.hyper_anf(
            self, n_hops=n_hops, lg_nom_entries=lg_nom_entries, edge_filter=edge_filter
        )

    def powerIterationClustering(
        self, k: int, maxIter: int, weightCol: str | None = None
    ) -> DataFrame:
        """``id``, ``cluster``: MLlib's ``PowerIterationClustering`` (the algorithm GraphX
        runs for GraphFrames) on the edges, as an undirected affinity matrix."""
        from pyspark.ml.clustering import PowerIterationClustering

        edges = self.edges.select(
            "src", "dst", (F.col(weightCol) if weightCol else F.lit(1.0)).alias("_weight")
        )
        pic = PowerIterationClustering(k=k, maxIter=maxIter, weightCol="_weight")
        return pic.assignClusters(edges)

    def svdPlusPlus(self, *args: Any, **kwargs: Any) -> tuple[DataFrame, float]:
        """Not built: ``pyspark.ml.recommendation.ALS`` factors a rating graph's edges."""
        raise _not_built(
            "svdPlusPlus", "factor the ratings with pyspark.ml.recommendation.ALS on the edges"
        )

    def neighborhood_aware_cdlp(
        self,
        max_iter: int = 10,
        structural_similarity_multiplier: float = 0.0,
        ignore_direct_links: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> DataFrame:
        """Not built: ``labelPropagation`` finds communities by labels."""
        if ignore_direct_links and structural_similarity_multiplier <= 0:
            raise GraphError(
                "structural_similarity_multiplier must be > 0 when ignore_direct_links is True"
            )
        raise _not_built("neighborhood_aware_cdlp", "use GraphFrame.labelPropagation(maxIter=...)")

    def aggregate_neighbors(
        self,
        starting_vertices: Column | str,
        accumulator_names: list[str],
        accumulator_inits: list[Column | str],
        accumulator_updates: list[Column | str],
        max_hops: int = 3,
        stopping_condition: Column | str | None = None,
        target_condition: Column | str | None = None,
        required_vertex_attributes: list[str] | None = None,
        required_edge_attributes: list[str] | None = None,
        edge_filter: Column | str | None = None,
        remove_loops: bool = False,
        checkpoint_interval: int = 2,
        use_local_checkpoints: bool = False,
        storage_level: Any = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """``id``, ``hop`` and the accumulators of every path from a starting vertex that
        ended as a result (``iterflow.graph.neighbours.aggregate_neighbors``)."""
        return neighbours.aggregate_neighbors(
            self,
            starting_vertices,
            accumulator_names,
            accumulator_inits,
            accumulator_updates,
            max_hops=max_hops,
            stopping_condition=stopping_condition,
            target_condition=target_condition,
            required_vertex_attributes=required_vertex_attributes,
            required_edge_attributes=required_edge_attributes,
            edge_filter=edge_filter,
            remove_loops=remove_loops,
            listen=listen,
            **run_options,
        )
