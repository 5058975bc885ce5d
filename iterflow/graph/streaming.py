"""Graph results kept up to date over a stream of edges: ``iterflow.graph.streaming``.

``connected_components``, ``pagerank`` and ``shortest_paths`` each start an
``UnboundedIteration`` over a streaming DataFrame of edges (``src``, ``dst``, GraphFrames'
data model) and return its ``UnboundedQuery``. Every micro-batch is one epoch: its
insertions (and, from an optional second stream, deletions) are merged into the graph,
and the result is brought up to date from the previous epoch's by work that follows the
change (``stream_updates``), not the graph. The output ``"vertices"`` is the whole result
after each epoch, ``"changed"`` only the vertices whose value changed in it; each is
written to a sink exactly once per epoch, and a restart from the same
``checkpoint_location`` resumes after the last committed epoch.

The graph is held on the driver between epochs, as one row of arrays (the variable
``"graph"``, committed with every epoch): 16 bytes an edge and 16 a vertex (24 for
PageRank). A restart must give the settings the checkpoint was made with.

Example::

    edges = spark.readStream.schema("src long, dst long").parquet(folder)
    query = streaming.connected_components(
        edges, sink=itf.FileSink(out), checkpoint_location=ckpt, available_now=True
    )
    query.awaitTermination()

``builder(...)`` gives the ``UnboundedIteration`` itself, not started, to add listeners,
more sinks or metric sinks first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

import iterflow as itf
from iterflow.graph.graphs import GraphError
from iterflow.graph.stream_graph import StreamGraph
from iterflow.graph.stream_updates import UPDATES, Step, check_weights

__all__ = ["builder", "connected_components", "pagerank", "shortest_paths"]

#: The algorithms ``builder`` knows, by name.
ALGORITHMS = {
    "connected_components": "components",
    "pagerank": "pagerank",
    "shortest_paths": "paths",
}
#: The Arrow type of each Spark integer id type, for the output's columns.
_ARROW_IDS: dict[type[T.DataType], pa.DataType] = {
    T.ByteType: pa.int8(),
    T.ShortType: pa.int16(),
    T.IntegerType: pa.int32(),
    T.LongType: pa.int64(),
}
#: Tags of the events an epoch reads in one Spark job.
_INSERT, _DELETE, _VERTEX = 0, 1, 2


def connected_components(
    edges: DataFrame,
    *,
    vertices: DataFrame | None = None,
    deletions: DataFrame | None = None,
    sink: Any = None,
    listen: Any = None,
    **start: Any,
) -> itf.UnboundedQuery:
    """Weakly connected components of the edges so far, after every micro-batch: the
    output ``"vertices"`` has ``id`` and ``component`` (the least id in the component).

    ``edges`` and ``deletions`` are streaming DataFrames with ``src`` and ``dst``;
    ``vertices`` (a batch or streaming DataFrame with ``id``) adds vertices that have no
    edge yet. A new edge merges the components it joins; a deleted edge makes its own
    component be computed again from its edges. ``sink`` receives ``"vertices"`` (as
    ``UnboundedIteration.sink``), ``listen`` is called after every epoch, and ``start``
    goes to ``UnboundedIteration.start`` (``checkpoint_location`` is required).

    Example::

        query = streaming.connected_components(
            edges_stream, deletions=removed_stream, sink=itf.FileSink(out),
            checkpoint_location=ckpt)
    """
    iteration = builder("connected_components", edges, vertices=vertices, deletions=deletions)
    return _started(iteration, sink, listen, start)


def pagerank(
    edges: DataFrame,
    *,
    vertices: DataFrame | None = None,
    deletions: DataFrame | None = None,
    alpha: float = 0.85,
    tol: float = 1e-6,
    sink: Any = None,
    listen: Any = None,
    **start: Any,
) -> itf.UnboundedQuery:
    """PageRank of the edges so far, as ``networkx.pagerank`` (and
    ``iterflow.graph.pagerank``) define it, after every micro-batch: ``"vertices"`` has
    ``id`` and ``pagerank`` (summing to 1). An edge that comes or goes moves rank from its
    source only; the residual it leaves is pushed on until every vertex's is small, so
    that the L1 distance from the exact ranks is at most ``tol``. Output ``"changed"``
    holds the vertices whose unscaled score moved (all ranks move a little when one does:
    they sum to 1). Other arguments as in ``connected_components``.

    Example::

        query = streaming.pagerank(edges_stream, tol=1e-6, sink=itf.FileSink(out),
                                   checkpoint_location=ckpt)
    """
    if not 0.0 < alpha < 1.0:
        raise GraphError(f"streaming pagerank(alpha={alpha}) must be between 0 and 1")
    if not tol > 0:
        raise GraphError(f"streaming pagerank(tol={tol}) must be positive")
    iteration = builder(
        "pagerank", edges, vertices=vertices, deletions=deletions, alpha=alpha, tol=tol
    )
    return _started(iteration, sink, listen, start)


def shortest_paths(
    edges: DataFrame,
    source: Any,
    *,
    weight: str | None = None,
    vertices: DataFrame | None = None,
    deletions: DataFrame | None = None,
    sink: Any = None,
    listen: Any = None,
    **start: Any,
) -> itf.UnboundedQuery:
    """Shortest-path distances from ``source`` along the edges so far, after every
    micro-batch: ``"vertices"`` has ``id`` and ``distance`` (a double; null where
    ``source`` cannot reach). Edges count 1 each, or the value of their column ``weight``
    (finite, non-negative). Inserting an edge again sets its weight. Other arguments as
    in ``connected_components``.

    Example::

        query = streaming.shortest_paths(roads_stream, "depot", weight="km",
                                         sink=itf.FileSink(out), checkpoint_location=ckpt)
    """
    if source is None:
        raise GraphError("streaming shortest_paths(source=...) needs the id of the source")
    iteration = builder(
        "shortest_paths",
        edges,
        vertices=vertices,
        deletions=deletions,
        source=source,
        weight=weight,
    )
    return _started(iteration, sink, listen, start)


def builder(
    algorithm: str,
    edges: DataFrame,
    *,
    vertices: DataFrame | None = None,
    deletions: DataFrame | None = None,
    **options: Any,
) -> itf.UnboundedIteration:
    """The ``UnboundedIteration`` that ``algorithm`` (``"connected_components"``,
    ``"pagerank"`` or ``"shortest_paths"``) runs, not started: add sinks (``"vertices"``,
    ``"changed"``), listeners or metric sinks, then ``start(checkpoint_location=...)``.
    ``options`` are the algorithm's own (``alpha``, ``tol``; ``source``, ``weight``).

    Example::

        query = (streaming.builder("pagerank", edges, tol=1e-5)
                   .sink("changed", itf.FileSink(out))
                   .start(checkpoint_location=ckpt))
    """
    if algorithm not in ALGORITHMS:
        raise GraphError(
            f"streaming.builder({algorithm!r}): the algorithms are {sorted(ALGORITHMS)}"
        )
    id_type = _checked(edges, vertices, deletions, options.get("weight"))
    if algorithm == "shortest_paths":
        _check_source(options.get("source"), id_type)
    streams = {"edges": edges, "deletions": deletions, "vertices": vertices}
    bound = {name: df for name, df in streams.items() if df is not None}
    body = StreamingGraphBody(ALGORITHMS[algorithm], id_type, tuple(bound), options)
    iteration = itf.UnboundedIteration(body).bind(
        "graph", body.initial(edges.sparkSession), state=True
    )
    for name, df in bound.items():
        iteration = iteration.bind(name, df)
    return iteration


def _started(
    iteration: itf.UnboundedIteration, sink: Any, listen: Any, start: Mapping[str, Any]
) -> itf.UnboundedQuery:
    if sink is not None:
        iteration = iteration.sink("vertices", sink)
    if listen is not None:
        iteration = iteration.listen(listen)
    return iteration.start(**start)


# -- checks ----------------------------------------------------------------------------


def _checked(edges: Any, vertices: Any, deletions: Any, weight: str | None) -> T.DataType:
    """The vertex id type, once the inputs are checked against the data model."""
    _frame("edges", edges, ("src", "dst"), streaming=True)
    id_type = edges.schema["src"].dataType
    if not isinstance(id_type, (T.IntegralType, T.StringType)):
        raise GraphError(
            f"streaming graphs take integer or string vertex ids; 'src' is {id_type.simpleString()}"
        )
    typed = {"edges.dst": edges.schema["dst"].dataType}
    if deletions is not None:
        _frame("deletions", deletions, ("src", "dst"), streaming=True)
        typed.update({f"deletions.{c}": deletions.schema[c].dataType for c in ("src", "dst")})
    if vertices is not None:
        _frame("vertices", vertices, ("id",), streaming=None)
        typed["vertices.id"] = vertices.schema["id"].dataType
    wrong = {name: kind for name, kind in typed.items() if kind != id_type}
    if wrong:
        raise GraphError(
            f"every vertex id must have the type of edges.src ({id_type.simpleString()}); "
            + ", ".join(f"{name} is {kind.simpleString()}" for name, kind in wrong.items())
        )
    if weight is not None:
        if weight not in edges.columns:
            raise GraphError(f"weight={weight!r}: the edges have no such column: {edges.columns}")
        if not isinstance(edges.schema[weight].dataType, T.NumericType):
            raise GraphError(f"weight={weight!r}: the column is not numeric")
    return id_type


def _check_source(source: Any, id_type: T.DataType) -> None:
    """The source of shortest paths is an id of the vertices' type: a string or an int."""
    text = isinstance(id_type, T.StringType)
    fits = isinstance(source, str) if text else isinstance(source, int)
    if not fits or isinstance(source, bool):
        kind = "string" if text else "integer"
        raise GraphError(
            f"streaming shortest_paths(source={source!r}): the vertex ids are {kind}s; give "
            f"the source as one (no vertex could ever match it)"
        )


def _frame(name: str, df: Any, columns: tuple[str, ...], *, streaming: bool | None) -> None:
    if not isinstance(df, DataFrame):
        raise GraphError(f"streaming graphs take '{name}' as a DataFrame, not {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise GraphError(
            f"the '{name}' DataFrame has no column(s) {missing}; its columns are {df.columns}"
        )
    if streaming and not df.isStreaming:
        raise GraphError(
            f"'{name}' must be a streaming DataFrame (spark.readStream...); for a batch "
            "graph, use iterflow.graph's functions"
        )


# -- the body --------------------------------------------------------------------------


class StreamingGraphBody(itf.IterationBody):
    """One epoch: read the micro-batch's events in one Spark job, merge them into the
    graph, bring the result up to date; the graph goes on as the state ``"graph"``.

    The graph and the result stay in memory between epochs (keyed by a token the state
    row carries): the row is decoded only at the start or after a restart."""

    def __init__(
        self, kind: str, id_type: T.DataType, streams: tuple[str, ...], options: Mapping[str, Any]
    ) -> None:
        self.kind = kind
        self.id_type = id_type
        self.arrow_id = pa.string() if isinstance(id_type, T.StringType) else pa.int64()
        self.output_id = _ARROW_IDS.get(type(id_type), self.arrow_id)  # as Spark declares it
        self.streams = streams
        self.inputs = ("graph", *streams)
        self.options = {"alpha": 0.85, "tol": 1e-6, "source": None, "weight": None, **options}
        self._held: tuple[int, StreamGraph, Any] | None = None

    @property
    def name(self) -> str:
        return f"streaming_{self.kind}"

    def initial(self, spark: SparkSession) -> DataFrame:
        """The state before the first epoch: an empty graph, token 0."""
        graph = StreamGraph.empty(np.int64 if self.arrow_id == pa.int64() else object)
        update = UPDATES[self.kind].empty(self.options)
        return itf.from_arrow(self._row(graph, update, 0), spark=spark)

    @property
    def _settings(self) -> str:
        """What a checkpoint of this graph must have been made with (JSON)."""
        kept = {"algorithm": self.kind, "id": self.id_type.simpleString()}
        kept.update({k: self.options[k] for k in ("alpha", "source", "weight")})
        return json.dumps(kept, sort_keys=True)

    def _check_options(self, row: pa.Table) -> None:
        """A restart goes on with the settings its checkpoint was made with, or stops."""
        stored = row.column("settings")[0].as_py()
        if stored != self._settings:
            raise GraphError(
                f"the checkpoint of this streaming graph was made with {stored}, and this "
                f"start asks for {self._settings}; start again with the same arguments, "
                "or at a new checkpoint_location"
            )

    def _row(self, graph: StreamGraph, update: Any, token: int) -> pa.Table:
        columns = {
            "token": pa.array([token], pa.int64()),
            "settings": pa.array([self._settings]),
            **graph.encoded(self.arrow_id),
            **update.encoded(),
        }
        return pa.table(columns)

    def __call__(self, inputs: Mapping[str, DataFrame], ctx: itf.RoundContext) -> itf.Declaration:
        row = itf.to_arrow(inputs["graph"])
        token = int(row.column("token")[0].as_py())
        held, self._held = self._held, None  # an epoch that fails leaves nothing to reuse
        if held is not None and held[0] == token:
            graph, update = held[1], held[2]
        else:
            self._check_options(row)
            graph, update = StreamGraph.decoded(row), UPDATES[self.kind].decoded(row, self.options)
        events = self._events(inputs, first=token == 0)
        step = update.step(graph, self._change(graph, events))
        token = int.from_bytes(os.urandom(8), "big") >> 1 or 1
        self._held = (token, graph, update)
        spark = _spark_of(inputs)
        state = itf.from_arrow(self._row(graph, update, token), spark=spark)
        return itf.Declaration(
            feedback={"graph": state}, outputs=self._outputs(graph, update, step, spark)
        )

    def _events(self, inputs: Mapping[str, DataFrame], first: bool) -> pa.Table:
        """The micro-batch's insertions, deletions and new vertices, in one Spark job."""
        weight = self.options["weight"]
        width = F.col(weight).cast("double") if weight else F.lit(1.0)
        parts = [
            inputs["edges"].select(F.lit(_INSERT).alias("tag"), "src", "dst", width.alias("weight"))
        ]
        if "deletions" in inputs:
            parts.append(
                inputs["deletions"].select(F.lit(_DELETE).alias("tag"), "src", "dst", F.lit(0.0))
            )
        vertices = inputs.get("vertices")
        if vertices is not None and (vertices.isStreaming or first):
            parts.append(
                vertices.select(
                    F.lit(_VERTEX).alias("tag"),
                    F.col("id").alias("src"),
                    F.lit(None).cast(self.id_type).alias("dst"),
                    F.lit(0.0),
                )
            )
        frame = parts[0]
        for part in parts[1:]:
            frame = frame.union(part)
        return frame.toArrow()

    def _change(self, graph: StreamGraph, events: pa.Table) -> Any:
        """Merge ``events`` into ``graph``; what changed."""
        _no_nulls(events)
        tags = events.column("tag").to_numpy()
        src = _ids(events.column("src"), self.arrow_id)
        dst = _ids(events.column("dst"), self.arrow_id)
        weights = events.column("weight").to_numpy(zero_copy_only=False).astype(np.float64)
        inserts, deletes = tags == _INSERT, tags == _DELETE
        if self.kind == "paths":
            check_weights(weights[inserts], self.options["weight"] or "weight")
        before = graph.n
        graph.indices(src[tags == _VERTEX])
        ends = graph.indices(np.concatenate([src[inserts], dst[inserts]]))
        count = int(inserts.sum())
        gone = graph.known(np.concatenate([src[deletes], dst[deletes]]))
        half = int(deletes.sum())
        a, b = gone[:half], gone[half:]
        seen = (a >= 0) & (b >= 0)
        change = graph.update(
            (ends[:count], ends[count:], weights[inserts]), (a[seen], b[seen]), graph.n - before
        )
        itf.metrics.counter("missing_deletions").inc(change.missing + int((~seen).sum()))
        return change

    def _outputs(
        self, graph: StreamGraph, update: Any, step: Step, spark: SparkSession
    ) -> dict[str, DataFrame]:
        itf.metrics.counter("rounds").inc(step.rounds)
        itf.metrics.counter("changed").inc(len(step.changed))
        itf.metrics.gauge("edges").set(len(graph.keys))
        values = update.values(graph, self.arrow_id)
        if self.kind == "components":
            values = values.cast(self.output_id)
        ids = pa.array(graph.ids, type=self.arrow_id).cast(self.output_id)
        whole = pa.table({"id": ids, update.column: values})
        schema = T.StructType(
            [
                T.StructField("id", self.id_type, False),
                T.StructField(
                    update.column,
                    self.id_type if self.kind == "components" else T.DoubleType(),
                    self.kind == "paths",
                ),
            ]
        )
        changed = whole.take(pa.array(step.changed))
        return {
            "vertices": itf.from_arrow(whole, spark=spark, schema=schema),
            "changed": itf.from_arrow(changed, spark=spark, schema=schema),
        }


def _spark_of(inputs: Mapping[str, DataFrame]) -> SparkSession:
    return inputs["edges"].sparkSession


def _ids(column: Any, arrow_id: pa.DataType) -> np.ndarray:
    """Vertex ids as numpy: int64, or objects (strings); the nulls of vertex rows' ``dst``
    read as 0 or None and are never used."""
    values = column.combine_chunks()
    if arrow_id == pa.int64():
        return values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    return values.to_numpy(zero_copy_only=False).astype(object)


def _no_nulls(events: pa.Table) -> None:
    """An edge needs both ends, a vertex its id: a null one is an error, never dropped."""
    edge = pc.not_equal(events.column("tag"), _VERTEX)
    null_dst = pc.and_(edge, pc.is_null(events.column("dst")))
    if pc.any(pc.or_(pc.is_null(events.column("src")), null_dst)).as_py():
        raise GraphError(
            "a streaming graph's micro-batch holds an edge with a null 'src' or 'dst', or a "
            "vertex with a null 'id'; filter them out of the stream first"
        )
