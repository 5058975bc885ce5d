"""GraphFrames' API on iterflow: ``GraphFrame(vertices, edges)`` with GraphFrames'
method names, arguments and results, without its JVM package.

Every algorithm runs as an iterflow iteration, so it takes iterflow's keyword
arguments after GraphFrames' own: ``listen=`` (a listener called after every
round) and the options of ``BoundedIteration.run`` (``progress=``,
``event_log=``, ``checkpoint_dir=``...). GraphFrames' tuning arguments
(checkpoint intervals, storage levels, broadcast thresholds, local checkpoints)
are accepted and have no effect: iterflow persists, releases and checkpoints
rounds itself.
"""

from __future__ import annotations

from typing import Any

import attrs
from pyspark.ml.functions import array_to_vector
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType, StringType
from pyspark.storagelevel import StorageLevel

from iterflow.graph.bfs import bfs
from iterflow.graph.components import connected_components, undirected_edges
from iterflow.graph.frame_methods import GraphFrameMethods
from iterflow.graph.frame_pregel import PregelBuilder
from iterflow.graph.graphs import Graph, GraphError, as_graph
from iterflow.graph.labels import label_propagation
from iterflow.graph.messages import triplets
from iterflow.graph.pagerank import pagerank
from iterflow.graph.paths import shortest_paths
from iterflow.graph.scc import strongly_connected_components

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_DEFAULT_STORAGE = StorageLevel.MEMORY_AND_DISK_DESER
#: GraphX's PageRank until convergence has no bound on its rounds.
_UNBOUNDED = 2**31 - 1


def _algorithm(method: str, algorithm: str, known: tuple[str, ...]) -> None:
    if algorithm not in known:
        raise GraphError(
            f"{method}(algorithm={algorithm!r}): GraphFrames' algorithms are "
            f"{', '.join(repr(a) for a in known)}"
        )


@attrs.frozen(init=False)
class GraphFrame(GraphFrameMethods, Graph):
    """A graph with GraphFrames' methods: vertices with ``id``, edges with ``src`` and ``dst``.

    ``GraphFrame.of(g)`` wraps a ``graphframes.GraphFrame`` or any object with
    ``.vertices`` and ``.edges``. Results have GraphFrames' column names and types.

    Example::

        g = GraphFrame(spark.createDataFrame([(1,), (2,), (3,)], "id long"),
                       spark.createDataFrame([(1, 2), (2, 3)], "src long, dst long"))
        g.pageRank(resetProbability=0.15, maxIter=20).vertices   # id, pagerank
        g.connectedComponents()                                  # id, component
    """

    def __init__(
        self,
        v: DataFrame | None = None,
        e: DataFrame | None = None,
        *,
        vertices: DataFrame | None = None,
        edges: DataFrame | None = None,
    ) -> None:
        """``GraphFrame(v, e)``, as GraphFrames takes it (also ``v=``, ``e=``, or
        ``vertices=``, ``edges=``); a missing column is a ``GraphError``, a ValueError."""
        given_v, given_e = (v if v is not None else vertices), (e if e is not None else edges)
        if given_v is None or given_e is None:
            raise GraphError("GraphFrame(v, e) needs a vertices and an edges DataFrame")
        self.__attrs_init__(given_v, given_e)

    @classmethod
    def of(cls, graph: Any) -> GraphFrame:
        """``graph`` (a graphframes GraphFrame, an ``iterflow.graph.Graph``...) as a GraphFrame."""
        if isinstance(graph, GraphFrame):
            return graph
        g = as_graph(graph)
        return cls(g.vertices, g.edges)

    # -- the basics ------------------------------------------------------------

    @property
    def nodes(self) -> DataFrame:
        """The vertices."""
        return self.vertices

    @property
    def outDegrees(self) -> DataFrame:
        """``id``, ``outDegree`` (int): vertices with out-edges only."""
        return self.edges.groupBy(F.col("src").alias("id")).agg(
            F.count(F.lit(1)).cast("int").alias("outDegree")
        )

    @property
    def inDegrees(self) -> DataFrame:
        """``id``, ``inDegree`` (int): vertices with in-edges only."""
        return self.edges.groupBy(F.col("dst").alias("id")).agg(
            F.count(F.lit(1)).cast("int").alias("inDegree")
        )

    @property
    def degrees(self) -> DataFrame:
        """``id``, ``degree`` (int): vertices with edges only; a self-loop counts twice."""
        return (
            self.edges.select(F.explode(F.array("src", "dst")).alias("id"))
            .groupBy("id")
            .agg(F.count(F.lit(1)).cast("int").alias("degree"))
        )

    @property
    def triplets(self) -> DataFrame:
        """``src``, ``edge``, ``dst``: every edge with its two vertices, as structs."""
        return triplets(self)

    @property
    def pregel(self) -> PregelBuilder:
        """GraphFrames' Pregel builder: ``withVertexColumn``, ``sendMsgToDst``, ``aggMsgs``,
        ``run()``... (see ``iterflow.graph.frame_pregel``)."""
        return PregelBuilder(self)

    # -- algorithms -------------------------------------------------------------

    def pageRank(
        self,
        resetProbability: float = 0.15,
        sourceId: Any | None = None,
        maxIter: int | None = None,
        tol: float | None = None,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> GraphFrame:
        """GraphX's PageRank, as GraphFrames computes it: vertices with ``pagerank``
        (double) and edges with ``weight`` (double, 1 / the out-degree of ``src``).

        Exactly one of ``maxIter`` (that many rounds) and ``tol`` (until the L1
        change of the ranks is at most ``tol``) is given. Ranks sum to the number
        of vertices, or to 1 with ``sourceId`` (personalized PageRank).
        """
        if (maxIter is None) == (tol is None):
            raise GraphError(
                "pageRank() takes exactly one of maxIter= (a number of rounds) and tol= "
                f"(a tolerance), got maxIter={maxIter!r}, tol={tol!r}"
            )
        ranked = self._pagerank(
            resetProbability,
            None if sourceId is None else {sourceId: 1.0},
            maxIter,
            tol,
            listen,
            run_options,
        )
        return GraphFrame(ranked, self._weighted_edges())

    def parallelPersonalizedPageRank(
        self,
        resetProbability: float = 0.15,
        sourceIds: list[Any] | None = None,
        maxIter: int | None = None,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> GraphFrame:
        """Personalized PageRank from every vertex of ``sourceIds`` for ``maxIter`` rounds:
        vertices with ``pageranks``, a vector whose entry i is the rank from
        ``sourceIds[i]`` (each entry sums to 1 over the vertices), edges with ``weight``.

        The sources run one after another, each an iteration of its own; a
        ``checkpoint_dir`` gets one subdirectory per source.
        """
        if not sourceIds:
            raise GraphError("parallelPersonalizedPageRank(sourceIds=...) needs at least one id")
        if maxIter is None:
            raise GraphError("parallelPersonalizedPageRank(maxIter=...) needs a number of rounds")
        ranks = None
        for i, source in enumerate(sourceIds):
            options = dict(run_options)
            if options.get("checkpoint_dir"):
                options["checkpoint_dir"] = f"{options['checkpoint_dir']}/source-{i}"
            ranked = self._pagerank(
                resetProbability, {source: 1.0}, maxIter, None, listen, options
            ).select("id", F.col("pagerank").alias(f"_rank{i}"))
            ranks = ranked if ranks is None else ranks.join(ranked, "id")
        assert ranks is not None
        vectors = ranks.select(
            "id",
            array_to_vector(F.array(*(f"_rank{i}" for i in range(len(sourceIds))))).alias(
                "pageranks"
            ),
        )
        return GraphFrame(self.vertices.join(vectors, "id"), self._weighted_edges())

    def connectedComponents(
        self,
        algorithm: str = "graphframes",
        checkpointInterval: int = 2,
        broadcastThreshold: int = 1000000,
        useLabelsAsComponents: bool = False,
        use_local_checkpoints: bool = False,
        max_iter: int | None = None,
        storage_level: StorageLevel = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """Vertices with ``component`` (long): the smallest id of their weakly connected
        component (for ids that are not integers, a long numbering the components;
        with ``useLabelsAsComponents=True`` the smallest id itself)."""
        _algorithm(
            "connectedComponents",
            algorithm,
            ("graphframes", "graphx", "two_phase", "randomized_contraction"),
        )
        components = connected_components(self, max_rounds=max_iter, listen=listen, **run_options)
        if useLabelsAsComponents:
            return components
        return self._long_labels(components, "component")

    def stronglyConnectedComponents(
        self,
        maxIter: int,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """Vertices with ``component`` (long): the smallest id of their strongly connected
        component. ``maxIter`` bounds the splits of ``strongly_connected_components``."""
        components = strongly_connected_components(
            self, max_splits=maxIter, listen=listen, **run_options
        )
        return self._long_labels(components, "component")

    def labelPropagation(
        self,
        maxIter: int,
        algorithm: str = "graphx",
        use_local_checkpoints: bool = False,
        checkpoint_interval: int = 2,
        storage_level: StorageLevel = _DEFAULT_STORAGE,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """Vertices with ``label`` (long): their community after at most ``maxIter``
        rounds of ``label_propagation`` (which counts a vertex's own label and breaks
        ties by the smallest label, where GraphX breaks them arbitrarily)."""
        _algorithm("labelPropagation", algorithm, ("graphx", "graphframes"))
        labels = label_propagation(self, max_rounds=maxIter, listen=listen, **run_options)
        return self._long_labels(labels, "label")

    def shortestPaths(
        self,
        landmarks: list[Any],
        algorithm: str = "graphx",
        use_local_checkpoints: bool = False,
        checkpoint_interval: int = 2,
        storage_level: StorageLevel = _DEFAULT_STORAGE,
        is_directed: bool = True,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """Vertices with ``distances``, a map from every landmark the vertex reaches to
        the hops to it (``is_directed=False``: along edges in either direction)."""
        _algorithm("shortestPaths", algorithm, ("graphx", "graphframes"))
        self._check_ids("shortestPaths(landmarks=...)", list(landmarks))
        g = self if is_directed else Graph(self.vertices, undirected_edges(self.edges))
        return shortest_paths(g, landmarks, listen=listen, **run_options)

    def bfs(
        self,
        fromExpr: str | Column,
        toExpr: str | Column,
        edgeFilter: str | Column | None = None,
        maxPathLength: int = 10,
        *,
        listen: Any = None,
        **run_options: Any,
    ) -> DataFrame:
        """Every shortest path from a vertex matching ``fromExpr`` to one matching
        ``toExpr``: columns ``from``, ``e0``, ``v1``, ... ``to`` (see ``iterflow.graph.bfs``)."""
        return bfs(
            self,
            fromExpr,
            toExpr,
            edge_filter=edgeFilter,
            max_path_length=maxPathLength,
            listen=listen,
            **run_options,
        )

    # -- helpers ----------------------------------------------------------------

    def _pagerank(
        self,
        reset: float,
        personalization: dict[Any, float] | None,
        max_iter: int | None,
        tol: float | None,
        listen: Any,
        run_options: dict[str, Any],
    ) -> DataFrame:
        if not 0.0 < reset < 1.0:
            raise GraphError(f"resetProbability={reset} must be between 0 and 1")
        if max_iter is not None and max_iter < 1:
            raise GraphError(f"maxIter={max_iter} must be >= 1")
        if personalization is not None:
            self._check_ids("sourceId", list(personalization))
        return pagerank(
            self,
            # GraphX's tolerance bounds every vertex's change of its rank out of n;
            # iterflow's bounds the sum of the changes of ranks out of 1.
            tol=None if tol is None else tol / self.vertices.count(),
            max_rounds=_UNBOUNDED if max_iter is None else max_iter,
            alpha=1.0 - reset,
            personalization=personalization,
            normalization="graphx",
            listen=listen,
            **run_options,
        )

    def _weighted_edges(self) -> DataFrame:
        """The edges with ``weight``: 1 / the out-degree of ``src``, every copy counted."""
        degrees = self.edges.groupBy("src").agg(F.count(F.lit(1)).alias("_out"))
        return self.edges.join(degrees, "src").select(
            *self.edges.columns, (F.lit(1.0) / F.col("_out")).alias("weight")
        )

    def _check_ids(self, what: str, ids: list[Any]) -> None:
        """A clear error for ids of the wrong Python type (a str for long ids...)."""
        id_type = self.vertices.schema["id"].dataType
        if isinstance(id_type, _INTEGRAL):
            strays = [i for i in ids if not isinstance(i, int) or isinstance(i, bool)]
        elif isinstance(id_type, StringType):
            strays = [i for i in ids if not isinstance(i, str)]
        else:
            return
        if strays:
            raise GraphError(
                f"{what}: {strays[:3]!r} do not fit the vertex ids' type "
                f"{id_type.simpleString()}; give ids of that type"
            )

    def _long_labels(self, df: DataFrame, column: str) -> DataFrame:
        """``column`` (vertex ids) as a long, as GraphFrames returns it: the id itself for
        integer ids, otherwise the rank of the id among the distinct labels."""
        if isinstance(df.schema[column].dataType, _INTEGRAL):
            return df.withColumn(column, F.col(column).cast("long"))
        labels = df.select(column).distinct()
        numbered = labels.select(
            column, (F.dense_rank().over(Window.orderBy(column)) - 1).cast("long").alias("_n")
        )
        return df.join(numbered, column).select(
            *(F.col("_n").alias(c) if c == column else F.col(c) for c in df.columns)
        )
