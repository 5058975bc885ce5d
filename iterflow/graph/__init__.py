"""Iterative graph algorithms on iterflow, in GraphFrames' data model.

Written only against ``iterflow``'s public API, as any user would write them.
``GraphFrame`` offers them under GraphFrames' method names and result columns.
``pagerank_body`` and ``initial_ranks`` are PageRank's DataFrame body and its round-0
ranks, for users who run or compose the body in an iteration of their own.
"""

from iterflow.graph.bfs import bfs
from iterflow.graph.components import connected_components
from iterflow.graph.frame import GraphFrame
from iterflow.graph.graphs import Graph, GraphError, as_graph
from iterflow.graph.labels import label_propagation
from iterflow.graph.messages import AggregateMessages, aggregate_messages
from iterflow.graph.neighbours import AggregateNeighbors
from iterflow.graph.pagerank import initial_ranks, pagerank, pagerank_body
from iterflow.graph.paths import shortest_paths, weighted_shortest_paths
from iterflow.graph.pregel import pregel
from iterflow.graph.pregel_columns import Pregel
from iterflow.graph.programs import VertexProgram
from iterflow.graph.scc import strongly_connected_components

__all__ = [
    "AggregateMessages",
    "AggregateNeighbors",
    "Graph",
    "GraphError",
    "GraphFrame",
    "Pregel",
    "VertexProgram",
    "aggregate_messages",
    "as_graph",
    "bfs",
    "connected_components",
    "initial_ranks",
    "label_propagation",
    "pagerank",
    "pagerank_body",
    "pregel",
    "shortest_paths",
    "strongly_connected_components",
    "weighted_shortest_paths",
]
