"""Unbounded iterations: the epoch loop on Structured Streaming."""

from iterflow.unbounded.iteration import UnboundedIteration
from iterflow.unbounded.query import UnboundedQuery
from iterflow.unbounded.sinks import FileSink

__all__ = ["FileSink", "UnboundedIteration", "UnboundedQuery"]
