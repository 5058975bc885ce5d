"""What training shares across iterflow.ml's trainers: the error type, reading the one-row
model variable, the CombineFn base of a round (``ModelStep``), and the run behind a fitted
model (``Fitted``)."""

from __future__ import annotations

import contextlib
import pickle
import warnings
from typing import Any, cast

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
        # The one column: the model row may hold much more (an optimizer's state).
        return float(itf.to_arrow(end.variables["model"]).column(column)[0].as_py())

    return value


class ModelStep(itf.CombineFn):
    """The base of a trainer's round, one ``itf.combine``: ``loss`` is the gauge that its
    ``extract_output`` sets with the round's loss; accumulators of sums merge by adding."""

    def __init__(self, loss: Any) -> None:
        self.loss = loss

    def merge_accumulators(self, accs: list[tuple[Any, ...]]) -> Any:
        """Sums: the accumulators are tuples of numbers and arrays, added place by place."""
        return added(self.create_accumulator(), accs)

    def __getstate__(self) -> dict[str, Any]:
        # Tasks carry this object to feed accumulators, which never touch the gauge: only
        # extract_output does, on the driver for a model iterflow holds there (a one-row
        # model, unless spark.iterflow.driverRows is 0), or in the resident task that
        # merges last (its updates count toward the round). Over Spark Connect a metric that
        # tasks carry draws a warning that their updates are lost, so the gauge travels
        # without it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", itf.IterflowWarning)
            loss = pickle.dumps(self.loss)
        return {**self.__dict__, "loss": loss}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, loss=pickle.loads(state["loss"]))


def added(start: tuple[Any, ...], accs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """``start`` plus every accumulator of ``accs``, place by place: the merge of
    accumulators that are tuples of sums (numbers and arrays)."""
    merged = start
    for acc in accs:
        merged = tuple(a + b for a, b in zip(merged, acc, strict=True))
    return merged


class Fitted:
    """The run behind a fitted model: ``rounds``, ``termination`` and ``history``. A model
    loaded from storage has no run: these raise an ``MLError`` saying so."""

    result: Any

    @property
    def fitted_result(self) -> itf.IterationResult:
        """The run that fitted this model."""
        if self.result is None:
            raise MLError(
                "this model was loaded, not fitted here: its run (rounds, termination, "
                "history, summary) is not saved with it"
            )
        return cast(itf.IterationResult, self.result)

    @property
    def hasSummary(self) -> bool:  # MLlib's name
        """Whether the run is here (a fitted model) or not (a loaded one)."""
        return self.result is not None

    @property
    def rounds(self) -> int:
        return int(self.fitted_result.rounds)

    @property
    def termination(self) -> itf.Termination:
        return self.fitted_result.termination

    @property
    def history(self) -> list[itf.RoundProgress]:
        return list(self.fitted_result.history)


def worker_errors() -> contextlib.AbstractContextManager[None]:
    """Bad input found where the rows are read (a NaN feature, a negative weight) raises
    an ``MLError`` in a Python worker, which reaches the driver as a ``RoundError``
    wrapping Spark's error: re-raise it here as the ``MLError`` it was, with its message
    (which names the column)."""
    return itf.worker_errors(MLError)
