"""Round-end listeners and their dispatch. Pure Python: no Spark import.

A listener sees every round once, in epoch order, after the round's feedback,
outputs and criteria are materialized; ``on_iteration_terminated`` comes once,
after the last ``on_round_end``. ``on_round_progress`` hears samples of a round
while it runs (``iterflow.progress.sampling``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import attrs

from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.reports import RoundProgress, RoundSample, Termination


class RoundListener:
    """Subclass and override either method; both default to doing nothing.

    Example::

        class Trace(itf.RoundListener):
            def on_round_end(self, ctx):
                print(ctx.epoch, ctx.progress.converged_value)

        iteration.listen(Trace()).run()
    """

    def on_round_end(self, ctx: RoundEnd) -> None:
        """Called after round ``ctx.epoch``."""

    def on_iteration_terminated(self, ctx: IterationEnd) -> None:
        """Called once, after the last round."""

    def on_round_progress(self, sample: RoundSample) -> None:
        """Called while a round runs, every ``run(progress_interval_s=)`` seconds, on a
        thread of the driver (never at the same time as this run's ``on_round_end``); the round's
        last sample (``sample.final``) comes before its ``on_round_end``. Keep it quick:
        the next sample waits for it."""


class Emitter:
    """Collects ``emit(name, value)`` calls into name -> list of values."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {}

    def emit(self, name: str, value: Any) -> None:
        if not isinstance(name, str):
            raise IterflowTypeError(f"emit() takes a str name, got {type(name).__name__}")
        self.values.setdefault(name, []).append(value)


@attrs.frozen(kw_only=True)
class RoundEnd:
    """What a listener sees at the end of round ``epoch``.

    ``inputs`` are the DataFrames the round consumed, ``variables`` the
    materialized feedback (the next round's variable inputs), ``outputs`` the
    materialized outputs. They stay readable until the next round ends.
    """

    epoch: int
    epoch_watermark: int
    inputs: Mapping[str, Any]
    variables: Mapping[str, Any]
    outputs: Mapping[str, Any]
    progress: RoundProgress
    state: dict[str, Any]
    _emitter: Emitter = attrs.field(alias="emitter", repr=False)

    def emit(self, name: str, value: Any) -> None:
        """Record ``value`` under ``name``; the run's result lists them in ``emitted``."""
        self._emitter.emit(name, value)

    @property
    def watermarks(self) -> Mapping[str, datetime]:
        """An unbounded iteration's event-time watermarks after the epoch: per input bound
        with ``event_time=``, per ``ctx.window``/``ctx.join`` step, and ``"loop"`` (see
        ``RoundProgress.watermarks``); empty without event time."""
        return self.progress.watermarks


@attrs.frozen(kw_only=True)
class IterationEnd:
    """What a listener sees once the iteration has terminated."""

    termination: Termination
    rounds: int
    outputs: Mapping[str, Any]
    history: tuple[RoundProgress, ...]
    state: dict[str, Any]
    _emitter: Emitter = attrs.field(alias="emitter", repr=False)

    def emit(self, name: str, value: Any) -> None:
        self._emitter.emit(name, value)


def listener_name(listener: object) -> str:
    """A readable name for error messages: the function or class name."""
    target = getattr(listener, "__name__", None) or type(listener).__name__
    return str(target)


@attrs.define
class _Registration:
    target: Any  # a RoundListener, a plain function, or a factory when per_round
    per_round: bool


class ListenerSet:
    """The listeners of one iteration, in registration order.

    ``per_round`` registrations are factories: a fresh instance is made for each
    round, and the last round's instance also receives ``on_iteration_terminated``.
    """

    def __init__(self) -> None:
        self._registrations: list[_Registration] = []
        self._current: dict[int, Any] = {}

    def add(self, listener: Any, *, per_round: bool = False) -> None:
        if isinstance(listener, type) and not per_round:
            raise IterflowTypeError(
                f"listen({listener.__name__}): pass an instance, or per_round=True to make "
                "a fresh instance every round"
            )
        if per_round and not callable(listener):
            raise IterflowTypeError(
                f"listen(..., per_round=True) takes a zero-argument factory (e.g. a class), "
                f"got {type(listener).__name__}"
            )
        if not callable(listener) and not _is_listener(listener):
            raise IterflowTypeError(
                f"listen() takes a RoundListener, a function (RoundEnd) -> None, or with "
                f"per_round=True a zero-argument factory; got {type(listener).__name__}"
            )
        self._registrations.append(_Registration(listener, per_round))

    def __len__(self) -> int:
        return len(self._registrations)

    def state(self) -> dict[int, tuple[str, Any]]:
        """Registration index -> (name, state) of each listener object, for a checkpoint.

        A listener's ``state_dict()`` when it defines one, else a copy of its
        ``__dict__``. Plain functions and per-round instances carry no state.
        """
        states: dict[int, Any] = {}
        for index, registration in enumerate(self._registrations):
            listener = registration.target
            if registration.per_round or not _is_listener(listener):
                continue
            if callable(getattr(listener, "state_dict", None)):
                state = listener.state_dict()
            elif hasattr(listener, "__dict__"):
                state = dict(vars(listener))
            else:
                raise IterflowTypeError(
                    f"listener '{listener_name(listener)}' has no __dict__ to checkpoint; "
                    "define state_dict() and load_state_dict() on it"
                )
            states[index] = (listener_name(listener), state)
        return states

    def load_state(self, states: Mapping[int, tuple[str, Any]]) -> None:
        """Restore ``state()`` into the listener objects registered now, in place."""
        for index, (name, state) in states.items():
            listener = (
                self._registrations[index].target if index < len(self._registrations) else None
            )
            if listener is None or listener_name(listener) != name:
                found = "none" if listener is None else f"'{listener_name(listener)}'"
                raise IterflowValueError(
                    f"the checkpoint holds the state of listener #{index + 1} '{name}', but "
                    f"listener #{index + 1} now is {found}; listen() with the same listeners, "
                    "in the same order, to resume"
                )
            if callable(getattr(listener, "load_state_dict", None)):
                listener.load_state_dict(state)
            else:
                vars(listener).update(state)

    def round_end(self, ctx: RoundEnd, on_error: Callable[[str, BaseException], None]) -> None:
        """Dispatch ``on_round_end``; ``on_error(name, exc)`` turns a failure into a round error."""
        for index, registration in enumerate(self._registrations):
            listener = registration.target
            name = listener_name(listener)
            try:
                if registration.per_round:
                    listener = registration.target()
                    self._current[index] = listener
                _call_round_end(listener, ctx)
            except Exception as exc:
                on_error(f"listener '{name}'", exc)

    def round_progress(
        self, sample: RoundSample, on_error: Callable[[str, BaseException], None]
    ) -> None:
        """Dispatch ``on_round_progress`` to the listener objects that define it (not to
        per-round ones: a round's instance is made at its end)."""
        for registration in self._registrations:
            listener = registration.target
            if registration.per_round or not hasattr(listener, "on_round_progress"):
                continue
            try:
                listener.on_round_progress(sample)
            except Exception as exc:
                on_error(f"listener '{listener_name(listener)}' (on_round_progress)", exc)

    def iteration_terminated(
        self, ctx: IterationEnd, on_error: Callable[[str, BaseException], None]
    ) -> None:
        for index, registration in enumerate(self._registrations):
            listener = self._current.get(index) if registration.per_round else registration.target
            if listener is None or not hasattr(listener, "on_iteration_terminated"):
                continue  # plain functions, and objects without the method, hear round ends
            try:
                listener.on_iteration_terminated(ctx)
            except Exception as exc:
                on_error(f"listener '{listener_name(registration.target)}'", exc)


def _is_listener(obj: Any) -> bool:
    return any(hasattr(obj, name) for name in _LISTENER_METHODS)


_LISTENER_METHODS = ("on_round_end", "on_iteration_terminated", "on_round_progress")


def _call_round_end(listener: Any, ctx: RoundEnd) -> None:
    if _is_listener(listener):
        if hasattr(listener, "on_round_end"):
            listener.on_round_end(ctx)
    else:
        listener(ctx)
