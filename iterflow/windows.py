"""Event-time windows for unbounded iterations: which windows a row belongs to.

A window is a half-open interval of event time ``[start, end)``. ``ctx.window(df,
window)`` assigns each row to the windows its ``WindowFn`` gives it and emits a
window's rows once the step's watermark passes its end (see docs/unbounded.md,
"Event time"). Sizes, gaps and offsets are durations (``iterflow.durations``: a
``timedelta``, seconds, or a string such as ``"10 minutes"`` or ``"10m"``)::

    itf.FixedWindows("10 minutes")                    # [12:00, 12:10), [12:10, 12:20), ...
    itf.SlidingWindows("10 minutes", every="1 minute")  # ten overlapping windows per row
    itf.SessionWindows("5 minutes")                   # rows closer than 5 minutes, merged

A custom window function subclasses ``WindowFn``::

    class FailureAndNextThree(itf.WindowFn):
        def assign_windows(self, timestamp, row):
            start = itf.FixedWindows("10 minutes").assign_windows(timestamp, row)[0][0]
            count = 4 if row["kind"] == "FAILURE" else 1
            return [(start + i * TEN, start + (i + 1) * TEN) for i in range(count)]

A leaf: pure Python, no Spark. Times are microseconds since the Unix epoch inside
iterflow, and timezone-aware UTC datetimes at the API.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import attrs

from iterflow.durations import duration_us
from iterflow.errors import IterflowTypeError, IterflowValueError

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

#: Watermarks before any row (-inf) and once every input has ended (+inf), in microseconds.
MIN_US = -(1 << 62)
MAX_US = 1 << 62


def to_datetime(micros: int) -> datetime:
    """Microseconds since the Unix epoch as an aware UTC datetime (clamped to the range
    of ``datetime``: ``datetime.min``/``datetime.max`` in UTC stand for -inf/+inf)."""
    try:
        return EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        return (datetime.min if micros < 0 else datetime.max).replace(tzinfo=timezone.utc)


def to_micros(value: datetime) -> int:
    """An aware datetime (a naive one is taken as UTC) in microseconds since the epoch."""
    if not isinstance(value, datetime):
        raise IterflowTypeError(
            f"a window bound must be a datetime, got {type(value).__name__} ({value!r})"
        )
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return (value - EPOCH) // timedelta(microseconds=1)


class WindowFn:
    """Assigns a row to the event-time windows it belongs to.

    Subclass it and define ``assign_windows(timestamp, row)``: ``timestamp`` is the
    row's event time (an aware UTC datetime), ``row`` the row (a ``pyspark.sql.Row``:
    ``row["kind"]``); return a list of ``(start, end)`` datetimes, one per window
    (none: the row is in no window and is dropped). It runs in a Python UDF, so it
    must be picklable. Custom windows never merge; ``SessionWindows`` do.
    """

    #: Windows of the same key that overlap become one (sessions).
    merging = False

    def __repr__(self) -> str:
        """The class and its attributes: the same in every process, so that a restart (or
        the process beside a Spark Connect server) finds the window step unchanged."""
        fields = ", ".join(f"{k}={v!r}" for k, v in sorted(getattr(self, "__dict__", {}).items()))
        return f"{type(self).__qualname__}({fields})"

    def assign_windows(self, timestamp: datetime, row: Any) -> list[tuple[datetime, datetime]]:
        raise NotImplementedError(
            f"{type(self).__name__} must define assign_windows(timestamp, row) returning "
            "a list of (start, end) datetimes"
        )

    def assigned_us(self, timestamp_us: int, row: Any) -> list[tuple[int, int]]:
        """``assign_windows`` in microseconds, checked (what iterflow's UDF calls)."""
        windows = self.assign_windows(to_datetime(timestamp_us), row)
        if not isinstance(windows, Sequence) or isinstance(windows, (str, bytes)):
            raise IterflowTypeError(
                f"{type(self).__name__}.assign_windows returned {type(windows).__name__}; "
                "return a list of (start, end) datetimes"
            )
        result = []
        for window in windows:
            start, end = (to_micros(bound) for bound in window)
            if end <= start:
                raise IterflowValueError(
                    f"{type(self).__name__}.assign_windows gave the window "
                    f"[{to_datetime(start)}, {to_datetime(end)}): its end must be after its start"
                )
            result.append((start, end))
        return result


def _length(value: Any) -> int:
    return duration_us(value, "a window's size, every or gap")


def _offset(value: Any) -> int:
    return duration_us(value, "a window's offset", zero=True)


@attrs.frozen
class FixedWindows(WindowFn):
    """Windows of ``size`` one after the other: ``[offset + k*size, offset + (k+1)*size)``."""

    size_us: int = attrs.field(converter=_length, alias="size")
    offset_us: int = attrs.field(default=0, converter=_offset, alias="offset")

    def assign_windows(self, timestamp: datetime, row: Any) -> list[tuple[datetime, datetime]]:
        ts = to_micros(timestamp)
        start = ts - (ts - self.offset_us) % self.size_us
        return [(to_datetime(start), to_datetime(start + self.size_us))]


@attrs.frozen
class SlidingWindows(WindowFn):
    """Windows of ``size`` starting ``every`` apart: a row is in ``size / every`` of them."""

    size_us: int = attrs.field(converter=_length, alias="size")
    every_us: int = attrs.field(converter=_length, alias="every")
    offset_us: int = attrs.field(default=0, converter=_offset, alias="offset")

    def __attrs_post_init__(self) -> None:
        if self.every_us > self.size_us:
            raise IterflowValueError(
                "SlidingWindows(size, every): every is longer than size, so some rows "
                "would be in no window; use FixedWindows(size) for every == size"
            )

    @property
    def windows_per_row(self) -> int:
        return -(-self.size_us // self.every_us)

    def assign_windows(self, timestamp: datetime, row: Any) -> list[tuple[datetime, datetime]]:
        ts = to_micros(timestamp)
        last = ts - (ts - self.offset_us) % self.every_us
        starts = (last - i * self.every_us for i in range(self.windows_per_row))
        return [
            (to_datetime(s), to_datetime(s + self.size_us))
            for s in sorted(starts)
            if s + self.size_us > ts
        ]


@attrs.frozen
class SessionWindows(WindowFn):
    """Sessions: each row opens ``[t, t + gap)``, and overlapping windows of the same key
    (``ctx.window(..., by=)``) merge into one."""

    gap_us: int = attrs.field(converter=_length, alias="gap")
    merging = True

    def assign_windows(self, timestamp: datetime, row: Any) -> list[tuple[datetime, datetime]]:
        return [(timestamp, to_datetime(to_micros(timestamp) + self.gap_us))]
