"""Unbounded iterations: the epoch loop on Structured Streaming."""

from iterflow.runtime.checkpoint.output_sinks import FileSink
from iterflow.unbounded.iteration import UnboundedIteration
from iterflow.unbounded.query import UnboundedQuery

__all__ = ["FileSink", "UnboundedIteration", "UnboundedQuery"]
