"""Event-time windows of an unbounded iteration, written out in plain Python.

The expected behaviour of one ``ctx.window`` step fed directly by one streaming input
(no feedback), from the rules alone, for tests to compare iterflow against. Times
are integer microseconds since the Unix epoch; a watermark may also be -inf or +inf.

- Each micro-batch runs one epoch with its rows. After an epoch, while some window
  is due, an epoch with no new rows runs. Once the input has ended, the watermark
  is +inf and epochs with no new rows run while anything is due.
- The watermark after an epoch is the latest event time seen so far less
  ``max_delay`` (-inf before any row), and never goes back; an epoch classifies its
  new rows with the watermark ``W`` left by the epoch before, and fires and evicts
  under ``F``: the watermark after it (its own rows counted), except in the first
  epoch, which fires under ``W`` too (the loop learns there which variables are work).
- A new row's assignment to window ``w`` is late if ``w.end + lateness <= W``
  (nothing is late under -inf); a row without event time is late. Late assignments
  are dropped into the late rows, one per assignment; the others join the state.
- A window (per key and bounds) fires when ``w.end <= F`` and it holds rows it has
  not emitted: all its rows, with pane 0 the first time, then 1, 2... (accumulating).
- After the epoch the state keeps only the windows with ``w.end + lateness > F``.
- Sessions: windows of the same key that strictly overlap merge into one from the
  earliest start to the latest end (touching ones stay apart). A merge that changes
  a window's bounds makes a new window whose firings go on from the panes of the
  windows it merged (a fired session grown by a late row fires as an update); new
  rows inside a window's bounds are an update of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = Mapping[str, Any]
Bounds = tuple[int, int]


class Fixed:
    """``[offset + k*size, offset + (k+1)*size)``: the one window holding ``ts``."""

    merging = False

    def __init__(self, size: int, offset: int = 0) -> None:
        self.size, self.offset = size, offset

    def assign(self, ts: int, row: Row) -> list[Bounds]:
        k = (ts - self.offset) // self.size
        start = self.offset + k * self.size
        return [(start, start + self.size)]


class Sliding:
    """Every ``[s, s + size)`` with ``s = offset (mod every)`` that holds ``ts``."""

    merging = False

    def __init__(self, size: int, every: int, offset: int = 0) -> None:
        self.size, self.every, self.offset = size, every, offset

    def assign(self, ts: int, row: Row) -> list[Bounds]:
        # The earliest candidate start is the first s = offset (mod every) above ts - size.
        first = ts - self.size + 1
        first += (self.offset - first) % self.every
        return [(s, s + self.size) for s in range(first, ts + 1, self.every)]


class Session:
    """``[ts, ts + gap)``, merged with the overlapping windows of the same key."""

    merging = True

    def __init__(self, gap: int) -> None:
        self.gap = gap

    def assign(self, ts: int, row: Row) -> list[Bounds]:
        return [(ts, ts + self.gap)]


class Custom:
    """Whatever ``assign(ts, row)`` returns; never merged."""

    merging = False

    def __init__(self, assign: Callable[[int, Row], list[Bounds]]) -> None:
        self.assign = assign  # type: ignore[method-assign]


@dataclass
class Window:
    start: int
    end: int
    rows: list[Row] = field(default_factory=list)
    panes: int = 0  # firings so far: the next firing's pane
    unemitted: bool = False  # holds rows it has not emitted yet


@dataclass(frozen=True)
class Epoch:
    """One epoch: the watermark it worked with and what it emitted and dropped.

    ``fired`` holds ``(start, end, pane, row)``, ``late`` holds ``(start, end, row)``
    (``None`` bounds for a row without event time); ``watermark_after`` is the input's
    watermark once the epoch is over; ``state_rows`` the rows kept in windows."""

    watermark: float
    fired: tuple[tuple[int, int, int, Row], ...]
    late: tuple[tuple[int | None, int | None, Row], ...]
    watermark_after: float
    state_rows: int


class WindowStep:
    """The state of one window step: its windows by key."""

    def __init__(
        self,
        window: Any,
        lateness: int = 0,
        by: Callable[[Row], Hashable] | None = None,
        event_time: str = "ts",
    ) -> None:
        self.window = window
        self.lateness = lateness
        self.key = by or (lambda row: None)
        self.event_time = event_time
        self.windows: dict[Hashable, list[Window]] = {}

    def epoch(
        self, rows: Sequence[Row], watermark: float, firing: float | None = None
    ) -> tuple[list, list]:
        fire_at = watermark if firing is None else max(watermark, firing)
        late: list[tuple[int | None, int | None, Row]] = []
        added: dict[Hashable, list[Window]] = {}
        for row in rows:
            ts = row[self.event_time]
            if ts is None:
                late.append((None, None, row))
                continue
            for start, end in self.window.assign(ts, row):
                if end + self.lateness <= watermark:
                    late.append((start, end, row))
                else:
                    added.setdefault(self.key(row), []).append(Window(start, end, [row]))
        for key, news in added.items():
            self._add(key, news)
        fired: list[tuple[int, int, int, Row]] = []
        for windows in self.windows.values():
            for w in windows:
                if w.end <= fire_at and w.unemitted:
                    fired.extend((w.start, w.end, w.panes, row) for row in w.rows)
                    w.panes += 1
                    w.unemitted = False
        for key in list(self.windows):
            kept = [w for w in self.windows[key] if w.end + self.lateness > fire_at]
            if kept:
                self.windows[key] = kept
            else:
                del self.windows[key]
        return fired, late

    def _add(self, key: Hashable, news: list[Window]) -> None:
        windows = self.windows.setdefault(key, [])
        if not self.window.merging:
            by_bounds = {(w.start, w.end): w for w in windows}
            for new in news:
                w = by_bounds.get((new.start, new.end))
                if w is None:
                    w = by_bounds[(new.start, new.end)] = Window(new.start, new.end)
                    windows.append(w)
                w.rows.extend(new.rows)
                w.unemitted = True
            return
        # Sessions: group the old windows and the new ones into overlapping clusters.
        groups: list[tuple[list[Window], list[Window]]] = [([w], []) for w in windows]
        groups += [([], [new]) for new in news]
        merged = True
        while merged:
            merged = False
            for i in range(len(groups)):
                for j in range(i + 1, len(groups)):
                    if _overlap(_bounds(groups[i]), _bounds(groups[j])):
                        groups[i] = (groups[i][0] + groups[j][0], groups[i][1] + groups[j][1])
                        del groups[j]
                        merged = True
                        break
                if merged:
                    break
        result = []
        for old, new in groups:
            start, end = _bounds((old, new))
            if len(old) == 1 and (old[0].start, old[0].end) == (start, end):
                w = old[0]  # no new rows, or new rows inside its bounds: an update
            else:  # new bounds: a merged window; its firings go on from its parts'
                w = Window(start, end, [row for o in old for row in o.rows], unemitted=True)
                w.panes = max((o.panes for o in old), default=0)
            if new:
                w.rows.extend(row for n in new for row in n.rows)
                w.unemitted = True
            result.append(w)
        self.windows[key] = result

    def due(self, watermark: float) -> bool:
        return any(w.unemitted and w.end <= watermark for ws in self.windows.values() for w in ws)

    def state_rows(self) -> int:
        return sum(len(w.rows) for ws in self.windows.values() for w in ws)


def _bounds(group: tuple[list[Window], list[Window]]) -> Bounds:
    windows = group[0] + group[1]
    return min(w.start for w in windows), max(w.end for w in windows)


def _overlap(a: Bounds, b: Bounds) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def run(
    batches: Sequence[Sequence[Row]],
    window: Any,
    *,
    max_delay: int,
    lateness: int = 0,
    by: str | None = None,
    event_time: str = "ts",
) -> list[Epoch]:
    """The epochs of a run over ``batches`` (one micro-batch each) that then ends."""
    step = WindowStep(
        window, lateness, (lambda row: row[by]) if by is not None else None, event_time
    )
    epochs: list[Epoch] = []
    watermark: float = -math.inf
    latest: int | None = None

    def one(rows: Sequence[Row], after: Callable[[], float]) -> None:
        nonlocal watermark
        used = watermark
        firing = after() if rows and epochs else None  # with new rows, after the first
        fired, late = step.epoch(rows, used, firing)
        watermark = max(watermark, after())
        epochs.append(Epoch(used, tuple(fired), tuple(late), watermark, step.state_rows()))

    def source() -> float:
        return -math.inf if latest is None else latest - max_delay

    for batch in batches:
        times = [row[event_time] for row in batch if row[event_time] is not None]
        if times:
            latest = max(times) if latest is None else max(latest, *times)
        one(batch, source)
        while step.due(watermark):
            one((), source)
    # The input has ended: its watermark is +inf.
    watermark = math.inf
    while step.due(watermark):
        one((), lambda: math.inf)
    return epochs
