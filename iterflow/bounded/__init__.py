"""Bounded iterations: a loop of rounds on batch DataFrames."""

from iterflow.bounded.iteration import BoundedIteration
from iterflow.bounded.result import IterationResult

__all__ = ["BoundedIteration", "IterationResult"]
