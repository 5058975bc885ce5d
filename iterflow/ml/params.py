"""What the ``pyspark.ml`` face of ``iterflow.ml`` shares: Params named as MLlib names
them, the iteration's own options, training summaries, and saving and loading.

An Estimator's Params are plain values, saved with it (``DefaultParamsWritable``); the
iteration-level options (``listen``, ``progress``, ``event_log``, ``checkpoint_dir``...)
are objects, set with ``setIterationOptions`` and not saved. A fitted model saves its
Params and its learned values (as JSON in the model's metadata, which
``DefaultParamsWriter`` writes through the Spark session, so any Spark file system
works); a loaded model has no training summary, as in MLlib.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

import iterflow as itf
from iterflow.ml.training import MLError

M = TypeVar("M", bound="SavedModel")


class IterationOptions:
    """``setIterationOptions(**options)``: what goes to ``BoundedIteration.run`` (and
    ``listen=`` to ``listen``) when the Estimator fits. Not a Param: the values are objects
    (listeners, sinks, paths), kept by ``copy`` but not saved."""

    _iteration_options: Mapping[str, Any] = {}

    def setIterationOptions(self, **options: Any) -> Any:
        """Options of the iteration run by ``fit``: ``listen=``, ``progress=``,
        ``event_log=``, ``checkpoint_dir=``, ``checkpoint_every=``... (those of
        ``BoundedIteration.run``). Returns the Estimator."""
        self._iteration_options = {**self._iteration_options, **options}
        return self

    def getIterationOptions(self) -> dict[str, Any]:
        """The options set by ``setIterationOptions``."""
        return dict(self._iteration_options)


def choice(name: str, allowed: Sequence[str]) -> Any:
    """A ``TypeConverters`` function: a string among ``allowed`` (an ``MLError`` names the
    Param and the choices otherwise)."""

    def convert(value: Any) -> str:
        text = TypeConverters.toString(value)
        if text not in allowed:
            raise MLError(f"{name}={value!r}: use one of {list(allowed)}")
        return text

    return convert


def param(owner: Any, name: str, doc: str, converter: Any) -> Param[Any]:
    """A Param of ``owner`` (``Params._dummy()`` in a class body, as pyspark.ml does)."""
    return Param(owner, name, doc, typeConverter=converter)


def weight_column(params: Any) -> str | None:
    """An Estimator's ``weightCol``, or None when it is not set (or set empty)."""
    if not params.isDefined(params.weightCol):
        return None
    return params.getOrDefault(params.weightCol) or None


@attrs.frozen
class TrainingSummary:
    """What a fit did: MLlib's ``objectiveHistory`` (the objective at every iteration)
    and ``totalIterations``, plus iterflow's run: ``termination``, ``rounds`` and the
    per-round ``history`` (``RoundProgress``), and the ``result`` itself."""

    objectiveHistory: list[float]
    totalIterations: int
    result: itf.IterationResult = attrs.field(repr=False)

    @property
    def termination(self) -> itf.Termination:
        return self.result.termination

    @property
    def rounds(self) -> int:
        return int(self.result.rounds)

    @property
    def history(self) -> list[itf.RoundProgress]:
        return list(self.result.history)


class SavedModel(Params, MLWritable, MLReadable[Any]):
    """A fitted model's learned values, saved with its Params: ``_learned`` returns them
    as JSON-able values and ``_restore`` takes them back."""

    def _learned(self) -> dict[str, Any]:
        raise NotImplementedError

    def _restore(self, learned: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def write(self) -> MLWriter:
        return ModelWriter(self)

    @classmethod
    def read(cls) -> ModelReader[Any]:
        return ModelReader(cls)


class ModelWriter(MLWriter):
    """Writes a ``SavedModel``: its Params and learned values in one metadata file."""

    def __init__(self, instance: SavedModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(
            self.instance,
            path,
            self.sparkSession,
            extraMetadata={"learned": self.instance._learned()},
        )


class ModelReader(MLReader[M], Generic[M]):
    """Reads what ``ModelWriter`` wrote into a new ``cls``."""

    def __init__(self, cls: type[M]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> M:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        if "learned" not in metadata:
            raise MLError(f"{path} holds no iterflow model (its class is {metadata['class']})")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance._restore(metadata["learned"])
        return instance
