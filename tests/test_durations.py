"""The one duration grammar (pure Python, no Spark): what every duration parameter reads."""

from __future__ import annotations

from datetime import timedelta

import pytest

import iterflow as itf
from iterflow.durations import duration_us, spark_interval
from iterflow.errors import IterflowTypeError, IterflowValueError
from iterflow.unbounded.iteration import _processing_time_us

S = 1_000_000
MIN = 60 * S
H = 60 * MIN
DAY = 24 * H

#: Input -> microseconds, worked out by hand.
TABLE = [
    # Numbers are seconds; so are number strings (spark.iterflow.checkpoint.leaseTimeout).
    (1.5, 1_500_000),
    (90, 90 * S),
    ("90", 90 * S),
    (" 2.5 ", 2_500_000),
    ("1e3", 1000 * S),
    (timedelta(minutes=2, microseconds=3), 2 * MIN + 3),
    # Spark's interval strings, as trigger(processingTime=) reads them.
    ("10 seconds", 10 * S),
    ("1 second", S),
    ("1 minute", MIN),
    ("500 milliseconds", 500_000),
    ("1 millisecond", 1_000),
    ("250 microseconds", 250),
    ("2 hours", 2 * H),
    ("1 day", DAY),
    ("2 weeks", 14 * DAY),
    ("1 hour 30 minutes", 90 * MIN),
    ("interval 10 seconds", 10 * S),
    ("INTERVAL 1 Hour", H),
    ("  10   SECONDS ", 10 * S),
    (".5 seconds", 500_000),
    ("1.25 seconds", 1_250_000),
    ("+3 seconds", 3 * S),
    ("1 hour -15 minutes", 45 * MIN),
    ("- 5 seconds 10 seconds", 5 * S),
    # The short units windows.py read before.
    ("10s", 10 * S),
    ("5m", 5 * MIN),
    ("500 ms", 500_000),
    ("250us", 250),
    ("2h", 2 * H),
    ("1d", DAY),
    ("30 sec", 30 * S),
    ("30 secs", 30 * S),
    ("5 min", 5 * MIN),
    ("5 mins", 5 * MIN),
    ("1.5 hours", 90 * MIN),
    ("0.5 days", 12 * H),
    ("1h30m", 90 * MIN),
    ("1 week", 7 * DAY),
]


@pytest.mark.parametrize(("value", "expected"), TABLE)
def test_every_spelling_reads_as_its_duration(value, expected):
    assert duration_us(value, "x") == expected


#: What windows.py's parser accepted before (unit names, singular and plural, with and
#: without a space) and what Spark's interval parser accepts for processing_time=: each
#: still reads, as the same number of microseconds.
FORMER_UNITS = {
    "us": 1,
    "microsecond": 1,
    "ms": 1_000,
    "millisecond": 1_000,
    "s": S,
    "sec": S,
    "second": S,
    "m": MIN,
    "min": MIN,
    "minute": MIN,
    "h": H,
    "hour": H,
    "d": DAY,
    "day": DAY,
    "week": 7 * DAY,
}


@pytest.mark.parametrize("unit", sorted(FORMER_UNITS))
def test_every_former_unit_still_reads_singular_and_plural(unit):
    micros = FORMER_UNITS[unit]
    # "ms" is milliseconds, never minutes, as before.
    plural = () if unit == "m" else (f"3 {unit}s",)
    for text in (f"3 {unit}", f"3{unit}", *plural, f"3 {unit.upper()}"):
        assert duration_us(text, "x") == 3 * micros, text


def test_zero_is_allowed_only_where_asked_and_negatives_never():
    assert duration_us("0 seconds", "x", zero=True) == 0
    with pytest.raises(IterflowValueError, match="more than zero"):
        duration_us(0, "x")
    with pytest.raises(IterflowValueError, match="zero or more"):
        duration_us("-1 seconds", "x", zero=True)
    with pytest.raises(IterflowValueError, match="zero or more"):
        duration_us(timedelta(seconds=-1), "x", zero=True)


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        ("ten minutes", IterflowValueError, "cannot be read as a duration"),
        ("", IterflowValueError, "cannot be read as a duration"),
        ("10", None, None),  # a number string reads, as seconds (the control)
        ("10 fortnights", IterflowValueError, "cannot be read as a duration"),
        ("10 seconds later", IterflowValueError, "cannot be read as a duration"),
        ("interval", IterflowValueError, "cannot be read as a duration"),
        ("1 month", IterflowValueError, "'month' has no fixed length"),
        ("2 years", IterflowValueError, "'years' has no fixed length"),
        ("inf", IterflowValueError, "finite"),
        (float("nan"), IterflowValueError, "finite"),
        (True, IterflowTypeError, "a bool is no duration"),
        ([1], IterflowTypeError, "got list"),
    ],
)
def test_bad_durations_are_refused_naming_the_parameter_and_the_value(value, error, words):
    if error is None:
        assert duration_us(value, "bind('clicks', max_delay=)") == 10 * S
        return
    with pytest.raises(error) as raised:
        duration_us(value, "bind('clicks', max_delay=)")
    message = str(raised.value)
    assert message.startswith(f"bind('clicks', max_delay=)={value!r}")
    assert words in message


def test_processing_time_reads_the_same_grammar_and_names_itself():
    assert _processing_time_us("10s") == _processing_time_us(10) == 10 * S
    assert _processing_time_us(timedelta(milliseconds=250)) == 250_000
    assert _processing_time_us("0 seconds") == 0  # Spark's "as fast as possible"
    with pytest.raises(IterflowValueError, match=r"start\(processing_time=\)='soon'"):
        _processing_time_us("soon")


def test_spark_gets_the_interval_in_milliseconds():
    assert spark_interval(10 * S) == "10000 milliseconds"
    assert spark_interval(1_499) == "1 milliseconds"
    assert duration_us(spark_interval(90 * MIN), "x") == 90 * MIN


def test_window_sizes_read_the_grammar_and_name_themselves():
    assert itf.FixedWindows("10m") == itf.FixedWindows(timedelta(minutes=10))
    assert itf.SlidingWindows("interval 10 minutes", every="1 minute").every_us == MIN
    with pytest.raises(IterflowValueError, match="a window's size, every or gap='ten'"):
        itf.SessionWindows("ten")
