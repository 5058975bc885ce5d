"""Durations: the one grammar of every duration iterflow takes.

``start(processing_time=)``, ``bind(max_delay=)``, window sizes, ``allowed_lateness``,
``within`` and ``spark.iterflow.checkpoint.leaseTimeout`` all read a duration the same way:

- a ``datetime.timedelta``;
- a number of seconds (``1.5``), also as a string (``"90"``);
- Spark's interval strings, as ``trigger(processingTime=)`` reads them: ``"10 seconds"``,
  ``"1 minute"``, ``"500 milliseconds"``, ``"2 hours"``, ``"1 day"``, ``"1 week"``,
  ``"1 hour 30 minutes"``, ``"interval 10 seconds"``, units singular or plural, in any
  case, each part with its own sign (``"1 hour -15 minutes"``);
- short units, with or without a space: ``"10s"``, ``"5m"`` (minutes), ``"500 ms"``,
  ``"250us"``, ``"2h"``, ``"1d"``, ``"30 sec"``, ``"5 min"``; every unit takes a fraction
  (``"1.5 hours"``).

Months and years are refused: they have no fixed length. A leaf: pure Python, no Spark.

>>> duration_us("1 hour 30 minutes", "x") == duration_us(5400, "x")
True
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from iterflow.errors import IterflowTypeError, IterflowValueError

#: Microseconds per unit; a trailing "s" (plural) is also read.
UNITS = {
    "us": 1,
    "microsecond": 1,
    "ms": 1_000,
    "millisecond": 1_000,
    "s": 1_000_000,
    "sec": 1_000_000,
    "second": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "minute": 60_000_000,
    "h": 3_600_000_000,
    "hour": 3_600_000_000,
    "d": 86_400_000_000,
    "day": 86_400_000_000,
    "week": 604_800_000_000,
}
#: Units of Spark's intervals that are no duration.
_CALENDAR = ("month", "year")

_PART = re.compile(r"\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*")
_HINT = (
    "write seconds (e.g. 90) or e.g. '10 seconds', '500 milliseconds', '5 minutes', "
    "'1 hour 30 minutes', '10s' (units: us, ms, s, m/min, h, day, week)"
)


def duration_us(value: Any, what: str, *, zero: bool = False) -> int:
    """``value`` as a whole number of microseconds (see the module for what it accepts);
    ``what`` names the parameter in errors. Zero is refused unless ``zero``; a negative
    duration always."""
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
    elif isinstance(value, bool):
        raise IterflowTypeError(f"{what}={value!r}: a bool is no duration; {_HINT}")
    elif isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise IterflowValueError(f"{what}={value!r}: give a finite duration; {_HINT}")
        micros = round(value * 1_000_000)
    elif isinstance(value, str):
        micros = _parse(value, what)
    else:
        raise IterflowTypeError(
            f"{what}={value!r}: got {type(value).__name__}; give a duration: a timedelta, "
            f"seconds, or a string: {_HINT}"
        )
    if micros < 0 or (micros == 0 and not zero):
        least = "zero or more" if zero else "more than zero"
        raise IterflowValueError(f"{what}={value!r}: the duration must be {least}")
    return int(micros)


def _parse(text: str, what: str) -> int:
    lowered = text.strip().lower()
    try:
        seconds = float(lowered)  # "90", "1.5", "1e3": seconds, as for a number
    except ValueError:
        pass
    else:
        if seconds != seconds or abs(seconds) == float("inf"):
            raise IterflowValueError(f"{what}={text!r}: give a finite duration; {_HINT}")
        return round(seconds * 1_000_000)
    if lowered.startswith("interval") and lowered[len("interval") :][:1].isspace():
        lowered = lowered[len("interval") :]  # Spark's optional prefix
    position, total = 0, 0.0
    while position < len(lowered) or position == 0:
        match = _PART.match(lowered, position)
        word = match.group(3) if match else ""
        unit = UNITS.get(word) or (UNITS.get(word[:-1]) if word.endswith("s") else None)
        if match is None or unit is None:
            calendar = word.rstrip("s") in _CALENDAR
            reason = (
                f"'{word}' has no fixed length" if calendar else "it cannot be read as a duration"
            )
            raise IterflowValueError(f"{what}={text!r}: {reason}; {_HINT}")
        sign = -1.0 if match.group(1) == "-" else 1.0
        total += sign * float(match.group(2)) * unit
        position = match.end()
    return round(total)


def spark_interval(micros: int) -> str:
    """``micros`` as an interval string Spark reads (``trigger(processingTime=)``), to the
    millisecond as Spark triggers are."""
    return f"{round(micros / 1000)} milliseconds"
