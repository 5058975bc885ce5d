"""The columns both Pregels (``iterflow.graph.pregel`` and GraphFrames' builder in
``frame_pregel``) write their expressions over: the message, the prefixed columns of an
edge's triplet, ``Pregel``'s references to them; and the stop rule they share, a round
that sent no message.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

import iterflow as itf

#: The combined message a vertex received.
MSG = "_pregel_msg"
#: Prefixes of a triplet's columns: the source's, the destination's, the edge's.
SRC = "_pregel_src_"
DST = "_pregel_dst_"
EDGE = "_pregel_edge_"
#: Prefix of a vertex's columns as they were before the round's update.
OLD = "_pregel_old_"


class Pregel:
    """Column references for ``pregel`` expressions, named as in GraphFrames' ``Pregel``."""

    @staticmethod
    def msg() -> Column:
        """The aggregated message a vertex received (in ``update`` and ``active``)."""
        return F.col(MSG)

    @staticmethod
    def src(name: str) -> Column:
        """Column ``name`` of the edge's source vertex (in messages)."""
        return F.col(SRC + name)

    @staticmethod
    def dst(name: str) -> Column:
        """Column ``name`` of the edge's destination vertex (in messages)."""
        return F.col(DST + name)

    @staticmethod
    def edge(name: str) -> Column:
        """Column ``name`` of the edge (in messages)."""
        return F.col(EDGE + name)

    @staticmethod
    def old(name: str) -> Column:
        """Column ``name`` of the vertex before this round's update (in ``active``)."""
        return F.col(OLD + name)


def sent_nothing(progress: itf.RoundProgress) -> bool:
    """A round that sent no message (its ``messages`` observation counted none)."""
    # None: Spark never evaluated the messages, because adaptive execution had
    # proved them empty (no active vertex had an edge) and skipped the join.
    return not progress.observed.get("messages")
