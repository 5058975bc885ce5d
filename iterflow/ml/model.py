"""What every iterflow.ml trainer shares: its error type, one-row models, the CombineFn
base of its round, fitted models."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

from pyspark.sql import DataFrame

import iterflow as itf


class MLError(itf.IterflowError, ValueError):
    """Bad input to an ``iterflow.ml`` algorithm: a column, a shape, a parameter."""


def model_row(model: DataFrame) -> dict[str, Any]:
    """The one row of a model DataFrame. ``itf.to_arrow``: iterflow holds a small variable
    on the driver between rounds, and reading it then runs no Spark job (nor a JVM call)."""
    return itf.to_arrow(model).slice(0, 1).to_pylist()[0]


def model_field(column: str) -> Any:
    """A convergence value read from ``column`` of this round's ``model`` variable: a
    callable, so that it is read from the rows on the driver (no Spark job)."""

    def value(end: itf.RoundEnd) -> float:
        return float(model_row(end.variables["model"])[column])

    return value


class ModelStep(itf.CombineFn):
    """The base of a trainer's round, one ``itf.combine``: ``loss`` is the gauge that its
    ``extract_output`` sets with the round's loss; accumulators of sums merge by adding."""

    def __init__(self, loss: Any) -> None:
        self.loss = loss

    def merge_accumulators(self, accs: list[tuple[Any, ...]]) -> Any:
        """Sums: the accumulators are tuples of numbers and arrays, added place by place."""
        merged = self.create_accumulator()
        for acc in accs:
            merged = tuple(a + b for a, b in zip(merged, acc, strict=True))
        return merged

    def __getstate__(self) -> dict[str, Any]:
        # Tasks carry this object to feed accumulators, which never touch the gauge: only
        # extract_output does, on the driver for a model iterflow holds there (a one-row
        # model, unless spark.iterflow.driverRows is 0). Over Spark Connect a metric that
        # tasks carry draws a warning that their updates are lost, so the gauge travels
        # without it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", itf.IterflowWarning)
            loss = pickle.dumps(self.loss)
        return {**self.__dict__, "loss": loss}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, loss=pickle.loads(state["loss"]))


class Fitted:
    """The run behind a fitted model: ``rounds``, ``termination`` and ``history``."""

    result: Any

    @property
    def rounds(self) -> int:
        return int(self.result.rounds)

    @property
    def termination(self) -> itf.Termination:
        return self.result.termination

    @property
    def history(self) -> list[itf.RoundProgress]:
        return list(self.result.history)
