"""Window functions (pure Python, no Spark); durations are tested in test_durations.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

import iterflow as itf
from iterflow.errors import IterflowValueError
from iterflow.windows import MAX_US, MIN_US, to_datetime, to_micros

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)


def test_times_convert_both_ways_and_clamp_at_the_ends():
    assert to_datetime(to_micros(T0)) == T0
    assert to_micros(T0.replace(tzinfo=None)) == to_micros(T0)  # naive: UTC
    assert to_datetime(MIN_US) == datetime.min.replace(tzinfo=timezone.utc)
    assert to_datetime(MAX_US) == datetime.max.replace(tzinfo=timezone.utc)


def test_fixed_sliding_and_session_windows_assign_as_documented():
    at = T0 + timedelta(minutes=7, seconds=30)
    assert itf.FixedWindows("10 minutes").assign_windows(at, None) == [
        (T0, T0 + timedelta(minutes=10))
    ]
    shifted = itf.FixedWindows("10 minutes", offset="5 minutes").assign_windows(at, None)
    assert shifted == [(T0 + timedelta(minutes=5), T0 + timedelta(minutes=15))]
    sliding = itf.SlidingWindows("10 minutes", every="5 minutes").assign_windows(at, None)
    assert sliding == [
        (T0, T0 + timedelta(minutes=10)),
        (T0 + timedelta(minutes=5), T0 + timedelta(minutes=15)),
    ]
    # Every window of a sliding assignment holds the time, and no other window does.
    uneven = itf.SlidingWindows("10 minutes", every="3 minutes")
    windows = uneven.assign_windows(at, None)
    assert len(windows) == 3 and all(start <= at < end for start, end in windows)
    session = itf.SessionWindows("5 minutes")
    assert session.merging and not itf.FixedWindows(1).merging
    assert session.assign_windows(at, None) == [(at, at + timedelta(minutes=5))]
    with pytest.raises(IterflowValueError, match="every is longer than size"):
        itf.SlidingWindows("1 minute", every="2 minutes")


class FailureAndNextThree(itf.WindowFn):
    def assign_windows(self, timestamp, row):
        start = itf.FixedWindows("10 minutes").assign_windows(timestamp, row)[0][0]
        ten = timedelta(minutes=10)
        return [(start + i * ten, start + (i + 1) * ten) for i in range(4 if row else 1)]


class Backwards(itf.WindowFn):
    def assign_windows(self, timestamp, row):
        return [(timestamp, timestamp - timedelta(seconds=1))]


def test_custom_windows_are_checked_in_microseconds():
    at = to_micros(T0 + timedelta(minutes=3))
    ten = 600_000_000
    base = to_micros(T0)
    assert FailureAndNextThree().assigned_us(at, True) == [
        (base + i * ten, base + (i + 1) * ten) for i in range(4)
    ]
    assert FailureAndNextThree().assigned_us(at, False) == [(base, base + ten)]
    with pytest.raises(IterflowValueError, match="its end must be after its start"):
        Backwards().assigned_us(at, None)
    with pytest.raises(NotImplementedError, match="must define assign_windows"):
        itf.WindowFn().assigned_us(at, None)
