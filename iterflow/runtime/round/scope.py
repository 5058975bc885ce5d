"""What a RoundContext does on Spark: per-round observations and caches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pyspark.sql import DataFrame, Observation

from iterflow.body import Lifecycle
from iterflow.errors import IterflowError, IterflowTypeError, IterflowValueError
from iterflow.runtime.datacache.columnar import ColumnarData, Prepare, plan_key
from iterflow.runtime.datacache.resident import ResidentData
from iterflow.runtime.datacache.resident_policy import ResidentPolicy
from iterflow.runtime.progresstrack.tracker import RoundTracker
from iterflow.runtime.round.materialize import (
    observe_rows,
    persist_owned,
    step_observation,
)
from iterflow.runtime.spark.jvm import await_observations
from iterflow.runtime.spark.observations import observed_rows

#: Columns iterflow adds to the rows of ``ctx.columnar`` (``__iterflow_partition``) and to
#: its kernels' outputs (``__iterflow_file``): a user column may not start so.
RESERVED_PREFIX = "__iterflow_"


class CacheRegistry:
    """DataFrames iterflow persisted, by lifecycle; releases only what it persisted.

    With a ``residency`` policy, columnar data is made resident where it can be
    (``iterflow.runtime.datacache.resident``), and written as Arrow files otherwise.
    """

    def __init__(
        self,
        residency: ResidentPolicy | None = None,
        changing: Callable[[DataFrame], str | None] | None = None,
    ) -> None:
        self._owned: dict[str, list[DataFrame]] = {"round": [], "iteration": []}
        self._columnar: dict[int, ColumnarData | ResidentData] = {}
        self.residency = residency
        #: Why data is read anew every epoch (from a stream's micro-batch, say), or None
        #: when it stays the same for the whole run: only such data is made resident.
        self.changing = changing

    def columnar(
        self, df: DataFrame, prepare: Prepare | None, resident: bool = True
    ) -> ColumnarData | ResidentData:
        """``df`` resident or as Arrow files, at the first call for its plan in this iteration;
        always as files with ``resident=False``."""
        key = plan_key(df)
        if key not in self._columnar:
            loaded = None
            changes = self.changing(df) if self.changing is not None else None
            if self.residency is not None:
                if resident and changes is None:
                    loaded = self.residency.load(df, prepare)
                else:
                    self.residency.decline(
                        changes or "ctx.columnar(..., resident=False) asked for files"
                    )
            self._columnar[key] = loaded or ColumnarData.write(df, prepare)
        data = self._columnar[key]
        if not resident and isinstance(data, ResidentData):
            raise IterflowValueError(
                "ctx.columnar(..., resident=False): this DataFrame was made resident by an "
                "earlier ctx.columnar call in the run; pass resident=False there too"
            )
        return data

    @property
    def resident_calls(self) -> int:
        """Kernel calls that resident tasks answered so far in this iteration."""
        return self.residency.calls if self.residency is not None else 0

    def cache(self, df: DataFrame, lifecycle: Lifecycle) -> DataFrame:
        if lifecycle not in self._owned:
            raise IterflowValueError(f"cache(lifecycle={lifecycle!r}): use 'round' or 'iteration'")
        if persist_owned(df):
            self._owned[lifecycle].append(df)
        return df

    def release(self, lifecycle: Lifecycle) -> None:
        for df in self._owned[lifecycle]:
            df.unpersist(blocking=False)
        self._owned[lifecycle] = []
        if lifecycle == "iteration":
            try:
                for data in self._columnar.values():
                    data.release()
            finally:
                self._columnar = {}
                if self.residency is not None:
                    self.residency.close()


class EventTimeSteps(Protocol):
    """An epoch's event-time steps, behind ``ctx.window``, ``ctx.join`` and ``ctx.late``:
    what the round scope calls. The unbounded loop provides them
    (``iterflow.unbounded.event_steps.EpochSteps``); a bounded round has none."""

    def window(
        self,
        df: DataFrame,
        window: Any,
        allowed_lateness: Any,
        *,
        by: Any,
        event_time: Any,
        name: Any,
    ) -> DataFrame: ...

    def join(
        self,
        left: DataFrame,
        right: DataFrame,
        on: Any,
        within: Any,
        *,
        event_time: Any,
        name: Any,
    ) -> DataFrame: ...

    def late(self, name: str) -> DataFrame: ...


def outside_unbounded(kind: str) -> IterflowError:
    """The error of an event-time step in a run that has no event time."""
    return IterflowError(
        f"ctx.{kind}() is an event-time step of an UnboundedIteration: bind a streaming "
        "input with event_time='<column>' (and max_delay=) and start() it"
    )


class SparkRoundScope:
    """Backs a ``RoundContext`` for one epoch: observations, caches and (in an unbounded
    iteration with event time) the event-time steps ``events``."""

    def __init__(
        self,
        epoch: int,
        caches: CacheRegistry,
        tracker: RoundTracker,
        events: EventTimeSteps | None = None,
    ) -> None:
        self.epoch = epoch
        self._caches = caches
        self.tracker = tracker
        self._observations: dict[str, Observation] = {}
        self.events = events

    def _events(self, kind: str) -> EventTimeSteps:
        if self.events is None:
            raise outside_unbounded(kind)
        return self.events

    def window(self, df: DataFrame, window: Any, allowed_lateness: Any, **options: Any) -> Any:
        return self._events("window").window(df, window, allowed_lateness, **options)

    def join(self, left: DataFrame, right: DataFrame, on: Any, within: Any, **options: Any) -> Any:
        return self._events("join").join(left, right, on, within, **options)

    def late(self, name: str) -> Any:
        return self._events("late").late(name)

    def observe(self, name: str, df: DataFrame) -> DataFrame:
        if not isinstance(name, str) or not name:
            raise IterflowTypeError(f"observe() takes a non-empty str name, got {name!r}")
        if not isinstance(df, DataFrame):
            raise IterflowTypeError(f"observe('{name}', ...) takes a DataFrame")
        if name in self._observations:
            raise IterflowValueError(
                f"epoch {self.epoch}: observe('{name}') was called twice in one round; "
                "give each observed step its own name"
            )
        observation = step_observation("observe", (name,), self.tracker)
        self._observations[name] = observation
        return observe_rows(df, observation)

    def cache(self, df: DataFrame, lifecycle: Lifecycle) -> DataFrame:
        if not isinstance(df, DataFrame):
            raise IterflowTypeError(f"cache() takes a DataFrame, got {type(df).__name__}")
        return self._caches.cache(df, lifecycle)

    def columnar(
        self, df: DataFrame, prepare: Prepare | None, resident: bool = True
    ) -> ColumnarData | ResidentData:
        if not isinstance(df, DataFrame):
            raise IterflowTypeError(f"columnar() takes a DataFrame, got {type(df).__name__}")
        reserved = [c for c in df.columns if c.startswith(RESERVED_PREFIX)]
        if reserved:
            raise IterflowValueError(
                f"columnar(): column '{reserved[0]}' of the DataFrame clashes with iterflow's "
                f"own columns (names starting with '{RESERVED_PREFIX}', which columnar data "
                "adds to the rows it holds); rename it or drop it before ctx.columnar"
            )
        return self._caches.columnar(df, prepare, resident)

    def observed(self) -> dict[str, int | None]:
        await_observations(list(self._observations.values()))
        return {name: observed_rows(obs) for name, obs in self._observations.items()}
