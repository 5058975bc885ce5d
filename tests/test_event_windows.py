"""Event-time windows of unbounded iterations against the plain-Python reference.

Each case writes shuffled, partly late rows to one file per micro-batch, runs one
``ctx.window`` step over them with ``available_now=True``, and compares what every
epoch fired and dropped as late with ``tests/event_time_reference.py``.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import event_time_reference as ref
import pytest
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.runtime.spark.jvm import is_classic
from iterflow.unbounded import event_steps

pytestmark = pytest.mark.spark

SECOND = 1_000_000
MINUTE = 60 * SECOND
TEN_MINUTES = 10 * MINUTE
#: 2024-01-01 00:00:00 UTC, a whole hour in microseconds.
BASE = 1_704_067_200 * SECOND


def failure_and_next_three_fn() -> itf.WindowFn:
    """A FAILURE is in its 10-minute window and the next three; other events in their own.

    Made in a function: Spark's Python workers cannot import this test module, so the
    class must travel with the UDF, by value."""

    class FailureAndNextThree(itf.WindowFn):
        def assign_windows(self, timestamp, row):
            start = itf.FixedWindows("10 minutes").assign_windows(timestamp, row)[0][0]
            count = 4 if row["kind"] == "FAILURE" else 1
            ten = timedelta(minutes=10)
            return [(start + i * ten, start + (i + 1) * ten) for i in range(count)]

    return FailureAndNextThree()


def failure_and_next_three(ts: int, row: Any) -> list[tuple[int, int]]:
    start = ts // TEN_MINUTES * TEN_MINUTES
    count = 4 if row["kind"] == "FAILURE" else 1
    return [(start + i * TEN_MINUTES, start + (i + 1) * TEN_MINUTES) for i in range(count)]


@attrs.frozen
class Case:
    window: Any  # the iterflow WindowFn
    reference: Any  # the same windows in event_time_reference
    unit: int  # microseconds per unit of the durations below
    max_delay: int
    lateness: int | None  # None: ctx.window's default
    by: str | None = None
    seed: int = 0
    rows: int = 36
    files: int = 6
    span: int = 30  # event times in [0, span) units after BASE
    #: (weight, least, most) arrival delays in units: on time, late, very late.
    delays: tuple[tuple[float, int, int], ...] = ((0.65, 0, 2), (0.25, 3, 7), (0.1, 8, 14))
    kinds: tuple[str, ...] = ("OK",)
    null_time: bool = False  # one row without event time, in the middle file
    partly_late: bool = False  # some row is late in one of its windows, not in another


def batches(case: Case) -> list[list[dict]]:
    """Rows by arrival: a row of event time t delayed by d arrives in file (t + d) / step."""
    rng = random.Random(case.seed)
    files: list[list[dict]] = [[] for _ in range(case.files)]
    step = case.span / case.files
    weights = [w for w, _, _ in case.delays]
    for i in range(case.rows):
        t = rng.randrange(case.span)
        _, least, most = rng.choices(case.delays, weights)[0]
        arrival = min(case.files - 1, int((t + rng.randint(least, most)) / step))
        files[arrival].append(
            {
                "id": i,
                "key": rng.choice("abc"),
                "kind": rng.choice(case.kinds),
                "ts": BASE + t * case.unit,
            }
        )
    if case.null_time:
        files[case.files // 2].append({"id": case.rows, "key": "a", "kind": "OK", "ts": None})
    for rows in files:
        rng.shuffle(rows)
    assert all(files), "every file must hold rows: one micro-batch each"
    return files


def write_batches(folder: Path, files: list[list[dict]]) -> None:
    """One JSON-lines file per micro-batch, with increasing modification times."""
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time() - 1000
    for index, rows in enumerate(files):
        path = folder / f"part-{index:04d}.json"
        records = ({**r, "ts_us": r["ts"]} for r in rows)  # read as ts_us, then a timestamp
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.utime(path, (start + index, start + index))


def window_body(case: Case) -> itf.IterationBody:
    lateness = None if case.lateness is None else case.lateness * case.unit / SECOND

    @itf.body
    def windowed(events, ctx):
        fired = ctx.window(events, case.window, lateness, by=case.by, name="w")
        return itf.Declaration(outputs={"fired": fired, "late": ctx.late("w")})

    return windowed


def row_of(record: Any) -> tuple:
    return (record["id"], record["key"], record["ts"])


@attrs.define(slots=False)
class Collected:
    """A listener keeping, per epoch: the fired (start, end, pane, row), the late
    (start, end, row), and the step's late and state row counts."""

    fired: list[Counter] = attrs.field(factory=list)
    late: list[Counter] = attrs.field(factory=list)
    late_rows: list[int] = attrs.field(factory=list)
    state_rows: list[int] = attrs.field(factory=list)

    def on_round_end(self, end: Any) -> None:
        bounds = [
            F.unix_micros("window.start").alias("start"),
            F.unix_micros("window.end").alias("end"),
        ]
        rows = ["id", "key", F.unix_micros("ts").alias("ts")]
        fired = end.outputs["fired"].select(*bounds, "pane", *rows).collect()
        late = end.outputs["late"].select(*bounds, *rows).collect()
        self.fired.append(Counter((r["start"], r["end"], r["pane"], row_of(r)) for r in fired))
        self.late.append(Counter((r["start"], r["end"], row_of(r)) for r in late))
        self.late_rows.append(end.progress.late_rows["w"])
        self.state_rows.append(end.progress.state_rows["w"])


def expected(case: Case, files: list[list[dict]]) -> list[ref.Epoch]:
    return ref.run(
        files,
        case.reference,
        max_delay=case.max_delay * case.unit,
        lateness=(case.lateness or 0) * case.unit,
        by=case.by,
    )


def total(counters: list[Counter]) -> Counter:
    return sum(counters, Counter())


CASES: dict[str, Callable[[], Case]] = {
    "fixed-on-time": lambda: Case(
        itf.FixedWindows("3 seconds"),
        ref.Fixed(3 * SECOND),
        SECOND,
        max_delay=2,
        lateness=None,
        seed=22,
        null_time=True,
    ),
    "fixed-lateness": lambda: Case(
        itf.FixedWindows("3 seconds"), ref.Fixed(3 * SECOND), SECOND, 2, lateness=4, seed=18
    ),
    "sliding-on-time": lambda: Case(
        itf.SlidingWindows("4 seconds", every="2 seconds"),
        ref.Sliding(4 * SECOND, 2 * SECOND),
        SECOND,
        max_delay=1,
        lateness=0,
        seed=40,
        partly_late=True,
    ),
    "sliding-lateness": lambda: Case(
        itf.SlidingWindows("4 seconds", every="2 seconds"),
        ref.Sliding(4 * SECOND, 2 * SECOND),
        SECOND,
        max_delay=1,
        lateness=3,
        seed=26,
        partly_late=True,
    ),
    "session-on-time": lambda: Case(
        itf.SessionWindows("3 seconds"),
        ref.Session(3 * SECOND),
        SECOND,
        max_delay=2,
        lateness=0,
        by="key",
        seed=42,
        span=45,
        rows=30,
    ),
    "session-lateness": lambda: Case(
        itf.SessionWindows("3 seconds"),
        ref.Session(3 * SECOND),
        SECOND,
        max_delay=2,
        lateness=5,
        by="key",
        seed=301,
        span=24,
        rows=30,
    ),
    "custom-on-time": lambda: Case(
        failure_and_next_three_fn(),
        ref.Custom(failure_and_next_three),
        MINUTE,
        max_delay=5,
        lateness=0,
        seed=28,
        partly_late=True,
        span=80,
        rows=30,
        delays=((0.65, 0, 5), (0.25, 8, 20), (0.1, 25, 40)),
        kinds=("OK", "OK", "OK", "FAILURE"),
    ),
    "custom-lateness": lambda: Case(
        failure_and_next_three_fn(),
        ref.Custom(failure_and_next_three),
        MINUTE,
        max_delay=5,
        lateness=15,
        seed=288,
        partly_late=True,
        span=80,
        rows=30,
        delays=((0.65, 0, 5), (0.25, 8, 20), (0.1, 25, 40)),
        kinds=("OK", "OK", "OK", "FAILURE"),
    ),
}


#: Cases run with ``-m slow_spark`` only: each kind of window keeps its lateness case in CI.
SLOW = ("sliding-on-time", "session-on-time", "custom-on-time")


@pytest.fixture(params=["driver", "spark"])
def window_plan(request, monkeypatch):
    """Where the window step runs: on the driver (its state held there and its new rows
    taken as small whatever Spark estimates), or planned in Spark (never on the driver).
    Yields the name and the list of the step's runs on the driver (``windowed`` calls)."""
    runs: list[int] = []
    real = event_steps.windowed

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(event_steps, "windowed", counted)
    if request.param == "spark":
        monkeypatch.setattr(event_steps, "DRIVER_WINDOW_BYTES", -1)
    else:
        monkeypatch.setattr(event_steps, "estimated_bytes", lambda df: 0)
    return request.param, runs


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow_spark) if n in SLOW else n for n in CASES],
)
def test_windows_fire_and_drop_as_the_reference(spark, tmp_path, name, window_plan):
    case = CASES[name]()
    check_against_reference(spark, tmp_path, case)
    # The step ran where the case asked (a custom window always runs in Spark, and over
    # Spark Connect the loop beside the server is not patched).
    plan, runs = window_plan
    builtin = (itf.FixedWindows, itf.SlidingWindows, itf.SessionWindows)
    on_driver = plan == "driver" and isinstance(case.window, builtin)
    if is_classic(spark):
        assert bool(runs) == on_driver


@pytest.mark.parametrize(
    "name", ["session-lateness", pytest.param("sliding-lateness", marks=pytest.mark.slow_spark)]
)
@pytest.mark.iterflow_classic(reason="patches where the loop runs its window step")
def test_a_step_that_moves_between_the_driver_and_spark_keeps_its_state(
    spark, tmp_path, monkeypatch, name
):
    """Every other epoch Spark's size estimate says the new rows are large: the step goes
    on in Spark from a state the driver left, and back on the driver from Spark's."""
    sizes = iter([0, None] * 100)
    runs: list[int] = []
    real = event_steps.windowed

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(event_steps, "estimated_bytes", lambda df: next(sizes))
    monkeypatch.setattr(event_steps, "windowed", counted)
    case = CASES[name]()
    epochs = check_against_reference(spark, tmp_path, case)
    assert 2 <= len(runs) < epochs


def check_against_reference(spark, tmp_path, case: Case) -> int:
    """Run ``case`` and compare every epoch's firings and late rows with the reference;
    the number of epochs."""
    files = batches(case)
    epochs = expected(case, files)
    want_fired = [
        Counter((s, e, pane, row_of(r)) for s, e, pane, r in epoch.fired) for epoch in epochs
    ]
    want_late = [Counter((s, e, row_of(r)) for s, e, r in epoch.late) for epoch in epochs]
    # The data exercises what the case is about: several windows, very late rows, and
    # with lateness, late rows that update a fired window.
    assert len({(s, e) for c in want_fired for s, e, _, _ in c}) >= 4
    assert sum(len(epoch.late) for epoch in epochs) > 0
    if case.lateness:
        assert any(pane > 0 for c in want_fired for _, _, pane, _ in c)
    if case.partly_late:
        fired_ids = {row[0] for _, _, _, row in total(want_fired)}
        assert any(row[0] in fired_ids for _, _, row in total(want_late))
    if case.lateness and case.reference.merging:  # a fired session grown by a late row
        windows_of: dict[int, set] = {}
        for s, e, _, row in total(want_fired):
            windows_of.setdefault(row[0], set()).add((s, e))
        assert any(len(windows) > 1 for windows in windows_of.values())

    write_batches(tmp_path / "in", files)
    stream = (
        spark.readStream.schema("id long, key string, kind string, ts_us long")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
        .select("id", "key", "kind", F.timestamp_micros("ts_us").alias("ts"))
    )
    seen = Collected()
    query = (
        itf.UnboundedIteration(window_body(case))
        .bind("events", stream, event_time="ts", max_delay=case.max_delay * case.unit / SECOND)
        .listen(seen)
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, progress=False)
    )
    assert query.await_termination(timeout=120)
    assert query.termination.reason == "inputs_ended"

    # Every window fired, with the same rows and panes; the same rows were too late.
    assert total(seen.fired) == total(want_fired)
    assert total(seen.late) == total(want_late)
    assert sum(seen.late_rows) == sum(len(epoch.late) for epoch in epochs)
    assert seen.late_rows == [sum(c.values()) for c in seen.late]
    # Epoch by epoch, as the watermark moved.
    assert seen.fired == want_fired
    assert seen.late == want_late
    assert seen.late_rows == [len(epoch.late) for epoch in epochs]
    # Nothing is left behind once the input has ended.
    assert seen.state_rows[-1] == 0
    return len(epochs)


EDGE_WINDOWS = {
    "fixed": lambda: itf.FixedWindows("10 seconds"),
    "sliding": lambda: itf.SlidingWindows("10 seconds", every="4 seconds"),
    "session": lambda: itf.SessionWindows("3 seconds"),
}


@pytest.mark.parametrize(
    "window",
    ["fixed", "session", pytest.param("sliding", marks=pytest.mark.slow_spark)],
)
@pytest.mark.iterflow_classic(reason="patches where the loop runs its window step")
def test_null_keys_and_times_window_alike_on_the_driver_and_in_spark(
    spark, tmp_path, monkeypatch, window
):
    """Two key columns with nulls, rows without an event time, late rows and a late
    firing, in a session time zone other than UTC: the driver gives what Spark's plans
    give, epoch by epoch."""
    rng = random.Random(7)
    files = []
    for batch in range(6):
        rows = []
        for i in range(40):
            ts = (batch * 8 + rng.randint(-30, 6)) * SECOND + BASE
            rows.append(
                {
                    "id": batch * 100 + i,
                    "k1": rng.choice(["a", "b", None]),
                    "k2": rng.choice([1, 2, None]),
                    "ts_us": None if rng.random() < 0.05 else ts,
                }
            )
        files.append(rows)
    folder = tmp_path / "in"
    folder.mkdir()
    start = time.time() - 1000
    for index, rows in enumerate(files):
        path = folder / f"part-{index:04d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (start + index, start + index))

    @itf.body
    def windowed(events, ctx):
        fired = ctx.window(events, EDGE_WINDOWS[window](), "4 seconds", by=["k1", "k2"], name="w")
        return itf.Declaration(outputs={"fired": fired, "late": ctx.late("w")})

    def run(plan: str) -> list[tuple[Counter, Counter, int, int]]:
        if plan == "spark":
            monkeypatch.setattr(event_steps, "DRIVER_WINDOW_BYTES", -1)
        else:
            monkeypatch.setattr(event_steps, "DRIVER_WINDOW_BYTES", 2**40)
            monkeypatch.setattr(event_steps, "estimated_bytes", lambda df: 0)
        epochs = []

        def gather(end):
            bounds = [F.unix_micros("window.start"), F.unix_micros("window.end")]
            keyed = ["id", "k1", "k2", F.unix_micros("ts")]
            fired = end.outputs["fired"].select(*bounds, "pane", *keyed).collect()
            late = end.outputs["late"].select(*bounds, *keyed).collect()
            progress = end.progress
            epochs.append(
                (
                    Counter(map(tuple, fired)),
                    Counter(map(tuple, late)),
                    progress.late_rows["w"],
                    progress.state_rows["w"],
                )
            )

        stream = (
            spark.readStream.schema("id long, k1 string, k2 int, ts_us long")
            .option("maxFilesPerTrigger", 1)
            .json(str(folder))
            .select("id", "k1", "k2", F.timestamp_micros("ts_us").alias("ts"))
        )
        query = (
            itf.UnboundedIteration(windowed)
            .bind("events", stream, event_time="ts", max_delay="5 seconds")
            .listen(gather)
            .start(
                checkpoint_location=str(tmp_path / f"ckpt-{plan}"),
                available_now=True,
                progress=False,
            )
        )
        assert query.await_termination(timeout=120)
        return epochs

    # In a session time zone other than UTC (the windows are instants all the same).
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        in_spark, on_driver = run("spark"), run("driver")
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert on_driver == in_spark
    # The data has what the test is about: null keys fired, rows without a time and late
    # rows dropped, and a window fired again by late rows within its lateness.
    fired = sum((e[0] for e in in_spark), Counter())
    late = sum((e[1] for e in in_spark), Counter())
    assert any(row[4] is None or row[5] is None for row in fired)
    assert any(row[-1] is None for row in late)
    assert any(row[-1] is not None for row in late)
    assert any(row[2] > 0 for row in fired)
