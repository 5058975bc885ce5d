"""Iterative graph algorithms on iterflow, in GraphFrames' data model.

Written only against ``iterflow``'s public API, as any user would write them.
"""

from iterflow.graph.components import connected_components
from iterflow.graph.labels import label_propagation
from iterflow.graph.model import Graph, GraphError, as_graph
from iterflow.graph.pagerank import pagerank
from iterflow.graph.paths import shortest_paths, weighted_shortest_paths
from iterflow.graph.pregel import Pregel, pregel

__all__ = [
    "Graph",
    "GraphError",
    "Pregel",
    "as_graph",
    "connected_components",
    "label_propagation",
    "pagerank",
    "pregel",
    "shortest_paths",
    "weighted_shortest_paths",
]
