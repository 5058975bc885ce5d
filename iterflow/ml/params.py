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

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
from pyspark.ml.param import Param, Params, TypeConverters

import iterflow as itf
from iterflow.ml.training import MLError

F = TypeVar("F", bound=Callable[..., Any])


class MLParams(Params):
    """The Params base of every iterflow.ml Estimator and Model: a ``setX``/``getX`` pair
    for each Param (made when the class is defined, for the Params it declares or
    inherits and that have none yet, as MLlib writes one by hand per Param), and one error
    for a Param that does not exist or a value it refuses: an ``MLError`` naming it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if isinstance(getattr(cls, name, None), Param):
                suffix = name[0].upper() + name[1:]
                if not hasattr(cls, f"get{suffix}"):
                    setattr(cls, f"get{suffix}", _getter(name))
                if not hasattr(cls, f"set{suffix}"):
                    setattr(cls, f"set{suffix}", _setter(name))

    def _set_checked(self, values: Mapping[str, Any]) -> Any:
        """``_set`` with an ``MLError`` for an unknown Param or a value it refuses."""
        unknown = sorted(name for name in values if not self.hasParam(name))
        if unknown:
            raise MLError(f"{type(self).__name__} has no Param(s) {unknown}")
        try:
            return self._set(**values)
        except TypeError as error:
            raise MLError(f"{type(self).__name__}: {error}") from error

    def setParams(self, **kwargs: Any) -> Any:
        """Sets the Params given by name; returns this object."""
        return self._set_checked(kwargs)


def _getter(name: str) -> Callable[[Params], Any]:
    def get(self: Params) -> Any:
        return self.getOrDefault(getattr(self, name))

    get.__name__ = f"get{name[0].upper()}{name[1:]}"
    get.__doc__ = f"The value of Param ``{name}`` (set, or its default)."
    return get


def _setter(name: str) -> Callable[[MLParams, Any], Any]:
    def set_value(self: MLParams, value: Any) -> Any:
        return self._set_checked({name: value})

    set_value.__name__ = f"set{name[0].upper()}{name[1:]}"
    set_value.__doc__ = f"Sets Param ``{name}``; returns this object."
    return set_value


def keyword_params(init: F) -> F:
    """A constructor that takes its Params by keyword only, as pyspark.ml's
    ``keyword_only``, and sets those given: a positional argument or a name that is not in
    its signature is an ``MLError`` naming it (not Python's ``TypeError``), the same error
    as ``setParams`` and the setters give."""
    names = set(list(inspect.signature(init).parameters)[1:])

    @functools.wraps(init)
    def wrapper(self: MLParams, *args: Any, **kwargs: Any) -> None:
        cls = type(self).__name__
        if args:
            raise MLError(f"{cls}() takes its Params by name, e.g. {cls}(maxIter=10)")
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise MLError(f"{cls} has no Param(s) {unknown}")
        init(self, **kwargs)
        self._set_checked(kwargs)

    return wrapper  # type: ignore[return-value]


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


class HasInitialModel(Params):
    """``initialModel``: a fitted model to start from (warm start): iterflow's or MLlib's
    model of the same type, or the path where one is saved. MLlib has this Param in Scala
    only; every iterflow Estimator has it."""

    initialModel: Param[Any] = param(
        Params._dummy(),
        "initialModel",
        "a fitted model of the same type (iterflow's or MLlib's), or the path of a saved "
        "one, to start from",
        TypeConverters.identity,
    )

    def initial_model(self, model_class: Any) -> Any:
        """``initialModel``: None when unset; a path loads with ``model_class``."""
        if not self.isDefined(self.initialModel):
            return None
        value = self.getOrDefault(self.initialModel)
        if isinstance(value, str):
            return model_class.load(value)
        return value
