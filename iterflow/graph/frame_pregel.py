"""GraphFrames' Pregel builder (``g.pregel``), run as an iterflow iteration.

It follows GraphFrames' ``Pregel`` rather than ``iterflow.graph.pregel``: every
round all vertices send messages along their edges (only the edges with an active
end after ``setSkipMessagesFromNonActiveVertices(True)``), and all vertices run
their update expressions, with ``Pregel.msg()`` null when no message reached them.
It runs ``setMaxIter`` rounds (10 by default), fewer with ``setEarlyStopping``
(a round that would send no message is not run) or
``setStopIfAllNonActiveVertices`` (no vertex is active after a round).

Columns in expressions are referenced either way: ``Pregel.src(name)``,
``Pregel.dst(name)``, ``Pregel.edge(name)`` and ``Pregel.msg()`` of
``iterflow.graph``, or those of ``graphframes.lib.Pregel`` (``src.name``...,
``_pregel_msg_``).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.graph.compiled_programs import BuilderRules, compile_builder, run_compiled
from iterflow.graph.expressions import Unsupported
from iterflow.graph.graphs import GraphError, as_graph, check_edge_ends, nested
from iterflow.graph.kernel_pregel import ACTIVE, GRAPHFRAMES_MSG, Typing, engine_note
from iterflow.graph.methods import choose_method
from iterflow.graph.pregel_columns import DST, EDGE, MSG, SRC, Pregel, sent_nothing


def _triplet_side(df: DataFrame, name: str, prefix: str) -> DataFrame:
    """``df``'s rows as the struct ``name`` (GraphFrames' references) and as flat columns
    named ``prefix + column`` (iterflow's)."""
    return df.select(
        nested(df, name),
        *(F.col(c).alias(prefix + c) for c in df.columns),
    )


class PregelBuilder:
    """GraphFrames' ``Pregel`` builder on iterflow; ``GraphFrame.pregel`` returns one.

    Example, PageRank without dangling vertices in 5 rounds::

        ranks = (g.pregel.setMaxIter(5)
                 .withVertexColumn("rank", F.lit(1.0 / n),
                                   F.coalesce(Pregel.msg(), F.lit(0.0)) * 0.85 + 0.15 / n)
                 .sendMsgToDst(Pregel.src("rank") / Pregel.src("outDegree"))
                 .aggMsgs(F.sum(Pregel.msg()))
                 .run())
    """

    msg = staticmethod(Pregel.msg)
    src = staticmethod(Pregel.src)
    dst = staticmethod(Pregel.dst)
    edge = staticmethod(Pregel.edge)

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self._max_iter = 10
        self._checkpoint_interval = 2
        self._early_stopping = False
        self._stop_if_all_inactive = False
        self._skip_inactive = False
        self._initial_active: Column = F.lit(True)
        self._update_active: Column = F.lit(True)
        self._columns: list[tuple[str, Column, Column]] = []
        self._messages: list[tuple[str, Column]] = []
        self._aggregate: Column | None = None

    def setMaxIter(self, value: int) -> PregelBuilder:
        """The number of rounds (default 10)."""
        self._max_iter = int(value)
        return self

    def setCheckpointInterval(self, value: int) -> PregelBuilder:
        """Rounds between durable checkpoints when ``run(checkpoint_dir=...)`` is given
        (0: none). iterflow's plans do not grow with rounds, so no checkpoint is needed
        otherwise."""
        self._checkpoint_interval = int(value)
        return self

    def setEarlyStopping(self, value: bool) -> PregelBuilder:
        """Stop before a round that would send no message."""
        self._early_stopping = bool(value)
        return self

    def setStopIfAllNonActiveVertices(self, value: bool) -> PregelBuilder:
        """Stop after a round that leaves no vertex active."""
        self._stop_if_all_inactive = bool(value)
        return self

    def setInitialActiveVertexExpression(self, expression: Column) -> PregelBuilder:
        """Which vertices are active before round 0 (default: all)."""
        self._initial_active = expression
        return self

    def setUpdateActiveVertexExpression(self, expression: Column) -> PregelBuilder:
        """Which vertices are active after a round, over the updated columns (default: all)."""
        self._update_active = expression
        return self

    def setSkipMessagesFromNonActiveVertices(self, value: bool) -> PregelBuilder:
        """Send messages only along edges with an active end."""
        self._skip_inactive = bool(value)
        return self

    def setUseLocalCheckpoints(self, value: bool) -> PregelBuilder:
        """Accepted for GraphFrames' code and ignored: iterflow keeps each round's state
        itself (``run(checkpoint_dir=...)`` for durable checkpoints)."""
        return self

    def setIntermediateStorageLevel(self, storage_level: Any) -> PregelBuilder:
        """Accepted for GraphFrames' code and ignored: iterflow persists and releases each
        round's state itself."""
        return self

    def required_src_columns(self, col_name: str, *col_names: str) -> PregelBuilder:
        """Accepted for GraphFrames' code and ignored: every vertex column is available in
        the triplets (GraphFrames uses it to prune them)."""
        return self

    def required_dst_columns(self, col_name: str, *col_names: str) -> PregelBuilder:
        """Accepted and ignored, as ``required_src_columns``."""
        return self

    def required_edge_columns(self, col_name: str, *col_names: str) -> PregelBuilder:
        """Accepted and ignored, as ``required_src_columns``."""
        return self

    def withVertexColumn(
        self,
        colName: str,
        initialExpr: Column,
        updateAfterAggMsgsExpr: Column,
    ) -> PregelBuilder:
        """A state column: its value before round 0, and after every round."""
        taken = {"id", MSG, GRAPHFRAMES_MSG, ACTIVE} | set(self.graph.vertices.columns)
        taken |= {name for name, _, _ in self._columns}
        if not colName or colName in taken:
            raise GraphError(
                f"pregel.withVertexColumn({colName!r}): the name is taken by the vertices, "
                "another state column or Pregel itself; pick another name"
            )
        self._columns.append((colName, initialExpr, updateAfterAggMsgsExpr))
        return self

    def sendMsgToSrc(self, msgExpr: Column) -> PregelBuilder:
        """A message from every edge to its source (a null message is not sent)."""
        self._messages.append(("src", msgExpr))
        return self

    def sendMsgToDst(self, msgExpr: Column) -> PregelBuilder:
        """A message from every edge to its destination (a null message is not sent)."""
        self._messages.append(("dst", msgExpr))
        return self

    def aggMsgs(self, aggExpr: Column) -> PregelBuilder:
        """How the messages to one vertex combine, e.g. ``F.sum(Pregel.msg())``."""
        self._aggregate = aggExpr
        return self

    def run(self, *, listen: Any = None, **run_options: Any) -> DataFrame:
        """Run the program; the vertices with their state columns after the last round.

        ``listen`` and ``run_options`` are as in ``iterflow.graph.pregel``; each round's
        ``RoundProgress.observed["messages"]`` counts the messages sent.
        """
        if not self._messages:
            raise GraphError("pregel needs a message: call sendMsgToDst or sendMsgToSrc")
        if self._aggregate is None:
            raise GraphError("pregel needs aggMsgs(...), e.g. aggMsgs(F.sum(Pregel.msg()))")
        if not self._columns:
            raise GraphError("pregel needs at least one withVertexColumn(...)")
        if self._max_iter < 1:
            raise GraphError(f"pregel.setMaxIter({self._max_iter}): must be >= 1")
        if self._checkpoint_interval < 0:
            raise GraphError(
                f"pregel.setCheckpointInterval({self._checkpoint_interval}): must be >= 0"
            )
        if run_options.get("checkpoint_dir") and self._checkpoint_interval:
            run_options.setdefault("checkpoint_every", self._checkpoint_interval)
        kernels, notes = self._on_kernels(listen, run_options)
        if kernels is not None:
            return kernels.drop(ACTIVE)
        vertices = self.graph.vertices.select(
            "*",
            *(initial.alias(name) for name, initial, _ in self._columns),
            self._initial_active.alias(ACTIVE),
        )
        iteration = (
            itf.BoundedIteration(self._body())
            .bind("vertices", vertices)
            .bind("edges", self.graph.edges)
            .until(itf.max_rounds(self._max_iter))
        )
        if self._early_stopping:
            iteration = iteration.until(itf.until(sent_nothing))
        if listen is not None:
            iteration = iteration.listen(listen)
        result = iteration.note(**notes).run(**run_options)
        last = result.history[-1]
        # GraphFrames checks for messages before a round and does not run one without.
        name = "previous" if self._early_stopping and sent_nothing(last) else "vertices"
        return result.outputs[name].drop(ACTIVE)

    def _on_kernels(
        self, listen: Any, run_options: dict[str, Any]
    ) -> tuple[DataFrame | None, dict[str, Any]]:
        """The program compiled and run on the kernel engine (the vertices), or None and the
        event log's notes saying why not: the graph is above the vector path's limit, or an
        expression does not compile (``iterflow.graph.expressions``)."""
        g = as_graph(self.graph)
        assert self._aggregate is not None  # run() checked
        path, n = choose_method("pregel", "auto", g)
        if path != "arrow":
            check_edge_ends(g, "pregel.run()")
            reason = f"{n:,} vertices are above spark.iterflow.graph.vectorLimit"
            return None, engine_note(reason, "pregel.run()")
        typing = Typing.of(g.vertices, g.edges)
        try:
            compiled = compile_builder(
                typing,
                self._columns,
                self._messages,
                self._aggregate,
                (self._initial_active, self._update_active),
                BuilderRules(self._skip_inactive, self._early_stopping, self._stop_if_all_inactive),
            )
        except Unsupported as reason:
            check_edge_ends(g, "pregel.run()")
            return None, engine_note(str(reason), "pregel.run()")
        with itf.worker_errors(GraphError):
            vertices = run_compiled(
                g,
                compiled,
                typing,
                max_rounds=self._max_iter,
                listen=listen,
                run_options=run_options,
                function="pregel.run()",
            )
        return vertices, {}

    def _body(self) -> itf.IterationBody:
        updates = {name: update for name, _, update in self._columns}
        messages, aggregate = self._messages, self._aggregate
        assert aggregate is not None
        skip_inactive, update_active = self._skip_inactive, self._update_active
        stop_if_all_inactive = self._stop_if_all_inactive

        @itf.body
        def graphframes_superstep(
            vertices: DataFrame, edges: DataFrame, ctx: itf.RoundContext
        ) -> itf.Declaration:
            triplets = (
                _triplet_side(vertices, "src", SRC)
                .join(
                    _triplet_side(edges, "edge", EDGE),
                    F.col(SRC + "id") == F.col(EDGE + "src"),
                )
                .join(
                    _triplet_side(vertices, "dst", DST),
                    F.col(EDGE + "dst") == F.col(DST + "id"),
                )
            )
            if skip_inactive:
                triplets = triplets.where(F.col(SRC + ACTIVE) | F.col(DST + ACTIVE))
            parts = [
                triplets.select(
                    F.col(SRC + "id" if to == "src" else DST + "id").alias("id"),
                    message.alias(MSG),
                )
                for to, message in messages
            ]
            sent = parts[0]
            for part in parts[1:]:
                sent = sent.unionByName(part)
            sent = ctx.observe("messages", sent.where(F.col(MSG).isNotNull()))
            combined = (
                sent.withColumn(GRAPHFRAMES_MSG, F.col(MSG)).groupBy("id").agg(aggregate.alias(MSG))
            )
            received = vertices.join(combined, "id", "left").withColumn(GRAPHFRAMES_MSG, F.col(MSG))
            # As in GraphFrames, every expression reads the columns before the update.
            updates_now = {**updates, ACTIVE: update_active}
            new_vertices = ctx.cache(
                received.select(
                    *(
                        updates_now[c].alias(c) if c in updates_now else F.col(c)
                        for c in vertices.columns
                    )
                )
            )
            return itf.Declaration(
                feedback={"vertices": new_vertices},
                outputs={"vertices": new_vertices, "previous": vertices},
                until=itf.empty(new_vertices.where(F.col(ACTIVE)))
                if stop_if_all_inactive
                else None,
            )

        return graphframes_superstep
