"""Iteration bodies: named inputs in, a Declaration of feedback, outputs and criteria out.

Example::

    @itf.body
    def step(ranks, edges, ctx):
        new_ranks = ...
        return itf.Declaration(feedback={"ranks": new_ranks}, outputs={"ranks": new_ranks})
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
from pyspark.sql import DataFrame

from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.termination import Condition

CONTEXT_PARAMETER = "ctx"
Lifecycle = Literal["round", "iteration"]


def _mapping_of_dataframes(field_name: str) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        if not isinstance(value, Mapping):
            raise IterflowTypeError(
                f"Declaration({field_name}=...) takes a dict of name -> DataFrame, "
                f"got {type(value).__name__}"
            )
        for name, df in value.items():
            if not isinstance(name, str):
                raise IterflowTypeError(
                    f"Declaration({field_name}=...): names must be str, got {name!r}"
                )
            if not isinstance(df, DataFrame):
                raise IterflowTypeError(
                    f"Declaration({field_name}=...): '{name}' must be a DataFrame, "
                    f"got {type(df).__name__}"
                )

    return check


def _as_dict(value: Mapping[str, DataFrame]) -> Mapping[str, DataFrame]:
    # A copy, so a Declaration cannot change under the loop; the validator
    # reports anything that is not a mapping.
    return dict(value) if isinstance(value, Mapping) else value


def _check_until(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, Condition):
        raise IterflowTypeError(
            "Declaration(until=...) takes a condition such as itf.empty(df) or "
            f"itf.converged(value, tol), got {type(value).__name__}"
        )


@attrs.frozen(kw_only=True)
class Declaration:
    """What one round of a body declares.

    ``feedback`` maps an input name to the DataFrame that becomes that input in
    the next round (the input is then a *variable*); ``outputs`` maps names to
    DataFrames leaving the iteration; ``until`` adds termination criteria.
    A feedback and an output may share a name only if they are the same object.

    Example::

        return itf.Declaration(feedback={"labels": best}, outputs={"labels": best},
                               until=itf.empty(changed))
    """

    feedback: Mapping[str, DataFrame] = attrs.field(
        factory=dict, converter=_as_dict, validator=_mapping_of_dataframes("feedback")
    )
    outputs: Mapping[str, DataFrame] = attrs.field(
        factory=dict, converter=_as_dict, validator=_mapping_of_dataframes("outputs")
    )
    until: Condition | None = attrs.field(default=None, validator=_check_until)

    def __attrs_post_init__(self) -> None:
        for name in self.feedback.keys() & self.outputs.keys():
            if self.feedback[name] is not self.outputs[name]:
                raise IterflowValueError(
                    f"Declaration: feedback '{name}' and output '{name}' are different "
                    "DataFrames; use the same object for both, or give the output another name"
                )


class RoundScope(Protocol):
    """What the round loop provides behind a RoundContext (runtime-specific)."""

    def observe(self, name: str, df: DataFrame) -> DataFrame: ...

    def cache(self, df: DataFrame, lifecycle: Lifecycle) -> DataFrame: ...

    def columnar(self, df: DataFrame, prepare: Any, resident: bool) -> Any: ...

    def window(self, df: DataFrame, window: Any, allowed_lateness: Any, **options: Any) -> Any: ...

    def join(
        self, left: DataFrame, right: DataFrame, on: Any, within: Any, **options: Any
    ) -> Any: ...

    def late(self, name: str) -> Any: ...


class RoundContext:
    """The round being built: its ``epoch``, the iteration's ``state``, and helpers."""

    def __init__(self, epoch: int, state: dict[str, Any], scope: RoundScope) -> None:
        self.epoch = epoch
        self.state = state
        self._scope = scope

    def observe(self, name: str, df: DataFrame) -> DataFrame:
        """Count the rows of ``df`` in this round's materialization (no extra job).

        Use the returned DataFrame in place of ``df``; the count appears in
        ``RoundProgress.observed[name]`` (None if Spark never evaluated it).
        """
        return self._scope.observe(name, df)

    def cache(self, df: DataFrame, lifecycle: Lifecycle = "round") -> DataFrame:
        """Persist ``df`` until the end of this round or of the whole iteration."""
        return self._scope.cache(df, lifecycle)

    def columnar(
        self, df: DataFrame, prepare: Callable[[Any], Any] | None = None, *, resident: bool = True
    ) -> Any:
        """``df`` held where vectorized kernels read it in place, every round.

        The first call for a plan (in practice: a data input) makes it resident in
        long-running tasks where it can (see the guide, "Resident rounds"), or runs one
        job that writes every partition, passed through ``prepare`` (a function of a
        ``pyarrow.Table`` returning one, e.g. to turn ids into array indices), as
        an Arrow file; later calls in the same iteration return the same
        ``ColumnarData``, and the files are deleted when the iteration ends.
        ``resident=False`` always writes the files (``map(..., rows=...)`` needs them).
        ``ColumnarData.map(kernel, schema, *args)`` is a DataFrame of
        ``kernel(table, *args)`` over the files, one task each, with no data
        crossing from the JVM to Python::

            edges = ctx.columnar(edges_df)
            partial = edges.map(lambda t, r: ..., "total DOUBLE", ranks)
        """
        return self._scope.columnar(df, prepare, bool(resident))

    def window(
        self,
        df: DataFrame,
        window: Any,
        allowed_lateness: Any = None,
        *,
        by: str | Sequence[str] | None = None,
        event_time: str | None = None,
        name: str | None = None,
    ) -> DataFrame:
        """Rows of ``df`` by event-time window, emitted once the watermark passes the window
        (an ``UnboundedIteration`` with an input bound with ``event_time=``).

        ``window`` is ``itf.FixedWindows(size)``, ``itf.SlidingWindows(size, every)``,
        ``itf.SessionWindows(gap)`` (merged per ``by`` key) or an ``itf.WindowFn``. The
        result holds, in the epoch a window fires, every row of it with a ``window``
        column (``start``, ``end``) and ``pane`` (0 the first time, then 1, 2... for each
        update); aggregate it with ``groupBy("window", ...)``. Until the watermark
        passes the window's end plus ``allowed_lateness`` (a duration, default 0), a
        late row fires the window again with all its rows; later rows are dropped into
        ``ctx.late(name)``. ``event_time`` defaults to the column declared with
        ``bind(..., event_time=)`` that ``df`` has, or else to the end of a ``window``
        column (an earlier window step's aggregate). ``name`` (default ``window_0``,
        ``window_1``... in call order) names the step in watermarks, late rows and
        state sizes.

        Example::

            per_minute = ctx.window(clicks, itf.FixedWindows("1 minute"), "5 minutes")
            counts = per_minute.groupBy("window", "page").count()
        """
        return self._scope.window(
            df, window, allowed_lateness, by=by, event_time=event_time, name=name
        )

    def join(
        self,
        left: DataFrame,
        right: DataFrame,
        on: str | Sequence[str],
        *,
        within: Any = None,
        event_time: str | tuple[str, str] | None = None,
        name: str | None = None,
    ) -> DataFrame:
        """Join two streams incrementally: each new row meets the other side's rows of
        earlier epochs (and this one's) with equal ``on`` keys and event times at most
        ``within`` apart (a duration, required); each pair comes out once. Rows are kept
        only while the watermark lets a match still arrive; rows older than the
        watermark are dropped into ``ctx.late(name)``. The result has the keys, then
        the other columns of each side (names must not clash, but for an event-time
        column of the same name on both sides, which then holds the later of the two).

        Example::

            matched = ctx.join(views, clicks, "ad", within="10 minutes")
        """
        return self._scope.join(left, right, on, within, event_time=event_time, name=name)

    def late(self, name: str) -> DataFrame:
        """The rows that step ``name`` (a ``ctx.window`` or ``ctx.join`` called earlier in
        this epoch) dropped as too late, to sink or inspect: a window step's rows with the
        expired ``window`` they were assigned to, a join's rows with a ``side`` column."""
        return self._scope.late(name)

    def __repr__(self) -> str:
        return f"RoundContext(epoch={self.epoch})"


class IterationBody:
    """An iteration body with configuration: set ``inputs`` and define ``iterate``.

    Example::

        class Step(itf.IterationBody):
            inputs = ("centroids", "points")
            def __init__(self, k): self.k = k
            def iterate(self, centroids, points, ctx): ...
    """

    inputs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def input_names(self) -> tuple[str, ...]:
        names = tuple(self.inputs)
        if not names:
            raise IterflowValueError(
                f"body '{self.name}' declares no inputs; set inputs = ('a', 'b', ...)"
            )
        if len(set(names)) != len(names) or CONTEXT_PARAMETER in names:
            raise IterflowValueError(
                f"body '{self.name}': inputs {names} must be distinct and must not be 'ctx'"
            )
        return names

    def iterate(self, *args: DataFrame, ctx: RoundContext) -> Declaration:
        raise NotImplementedError(f"body '{self.name}' must define iterate(...)")

    def __call__(self, inputs: Mapping[str, DataFrame], ctx: RoundContext) -> Declaration:
        """Run one round: call ``iterate`` with the inputs by name."""
        return self.iterate(**inputs, ctx=ctx)


class FunctionBody(IterationBody):
    """A body made from a function by :func:`body`; parameters are input names."""

    def __init__(self, fn: Callable[..., Declaration]) -> None:
        self._fn = fn
        parameters = list(inspect.signature(fn).parameters.values())
        for parameter in parameters:
            if parameter.kind not in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                inspect.Parameter.KEYWORD_ONLY,
            ):
                raise IterflowTypeError(
                    f"body '{fn.__name__}': parameter '{parameter.name}' must be a plain named "
                    "parameter (its name is an input name); *args and **kwargs are not inputs"
                )
        self._takes_ctx = any(p.name == CONTEXT_PARAMETER for p in parameters)
        self.inputs = tuple(p.name for p in parameters if p.name != CONTEXT_PARAMETER)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        return str(getattr(self._fn, "__name__", "body"))

    def __call__(self, inputs: Mapping[str, DataFrame], ctx: RoundContext) -> Declaration:
        if self._takes_ctx:
            return self._fn(**inputs, ctx=ctx)
        return self._fn(**inputs)

    def __repr__(self) -> str:
        return f"<iterflow body '{self.name}' inputs={self.inputs}>"


def body(fn: Callable[..., Declaration]) -> IterationBody:
    """Turn a function into an IterationBody; its parameters (but ``ctx``) are the inputs.

    Example::

        @itf.body
        def halve(x, ctx):  # one input, "x"; ctx is the round's RoundContext
            smaller = x.selectExpr("v / 2 AS v")
            return itf.Declaration(feedback={"x": smaller}, outputs={"x": smaller})
    """
    if not callable(fn):
        raise IterflowTypeError(f"itf.body takes a function, got {type(fn).__name__}")
    return FunctionBody(fn)
