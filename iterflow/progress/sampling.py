"""From readings of a running round to ``RoundSample`` values. Pure Python.

A status source (``iterflow.runtime.progresstrack.spark_status``) reports what the round's
Spark jobs have done so far: tasks total, done and active, rows read, rows out of
its named steps. A ``RoundGauge`` turns these readings into samples: the
fraction done weighs the tasks known so far against those of the round before
(the jobs of a round start one after another, so the first job alone would look
like the whole round), never goes back within a round and reaches 1.0 only in
the round's final sample; the remaining time follows from the fraction, or from
the previous round's duration while too little is done to tell.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from iterflow.reports import RoundSample

#: Below this fraction done, the previous round's duration estimates the time left better.
_EARLY = 0.05
#: The highest fraction a sample shows before the round's work is known to be done.
_UNFINISHED = 0.99


def _counts(value: Mapping[str, int] | None) -> Mapping[str, int]:
    return dict(value or {})


@attrs.frozen(kw_only=True)
class Reading:
    """What a status source read about a round's work so far."""

    tasks_total: int = 0
    tasks_done: int = 0
    tasks_active: int = 0
    rows_read: int | None = None
    bytes_read: int | None = None
    rows_by_step: Mapping[str, int] = attrs.field(factory=dict, converter=_counts)

    def plus(self, other: Reading) -> Reading:
        """Both readings together (e.g. Spark jobs and resident kernel calls)."""
        return Reading(
            tasks_total=self.tasks_total + other.tasks_total,
            tasks_done=self.tasks_done + other.tasks_done,
            tasks_active=self.tasks_active + other.tasks_active,
            rows_read=_sum(self.rows_read, other.rows_read),
            bytes_read=_sum(self.bytes_read, other.bytes_read),
            rows_by_step={**self.rows_by_step, **other.rows_by_step},
        )


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


class RoundGauge:
    """Samples of round ``epoch`` (at epoch path ``path``).

    ``expected_tasks`` and ``expected_s`` are what the round before took (tasks,
    seconds), None when unknown; ``counted`` holds the exact rows of the steps
    whose jobs finished, which take precedence over live readings.
    """

    def __init__(
        self,
        epoch: int,
        path: tuple[int, ...],
        *,
        expected_tasks: int | None = None,
        expected_s: float | None = None,
    ) -> None:
        self.epoch = epoch
        self.path = path
        self.expected_tasks = expected_tasks
        self.expected_s = expected_s
        self.counted: dict[str, int] = {}
        self.last: RoundSample | None = None

    def sample(self, reading: Reading, elapsed_s: float, *, final: bool = False) -> RoundSample:
        """The sample for ``reading``, taken ``elapsed_s`` into the round; ``final`` when the
        round's work is done."""
        known = max(reading.tasks_total, self.expected_tasks or 0)
        now = None if known == 0 else min(reading.tasks_done / known, _UNFINISHED)
        fraction = self._fraction(now, final)
        sample = RoundSample(
            epoch=self.epoch,
            elapsed_s=elapsed_s,
            fraction_done=fraction,
            tasks_total=reading.tasks_total,
            tasks_done=reading.tasks_done,
            tasks_active=0 if final else reading.tasks_active,
            rows_read=reading.rows_read,
            bytes_read=reading.bytes_read,
            rows_by_step=self._rows(reading.rows_by_step),
            eta_s=0.0 if final else self._eta(reading, now, elapsed_s),
            final=final,
            epoch_path=self.path,
        )
        self.last = sample
        return sample

    def _fraction(self, fraction: float | None, final: bool) -> float | None:
        """The fraction shown: ``fraction`` (done of the tasks known now), never less than
        the last sample showed."""
        if final:
            return 1.0
        before = None if self.last is None else self.last.fraction_done
        if before is not None and (fraction is None or fraction < before):
            return before  # a job that just started adds tasks: the round did not go back
        return fraction

    def _eta(self, reading: Reading, fraction: float | None, elapsed_s: float) -> float | None:
        """Seconds left, from the fraction done of the tasks known now (not the fraction
        shown, which holds while new jobs add tasks)."""
        prior = None if self.expected_s is None else max(self.expected_s - elapsed_s, 0.0)
        if fraction is None or fraction < _EARLY:
            return prior
        if reading.tasks_done >= max(reading.tasks_total, self.expected_tasks or 0):
            return prior  # every task known is done, yet the round goes on: jobs to come
        return elapsed_s * (1.0 - fraction) / fraction

    def _rows(self, live: Mapping[str, int]) -> dict[str, int]:
        """Rows so far by step: exact counts first, else live ones, never fewer than an
        earlier sample showed (a live metric of a re-planned stage may start again)."""
        rows = {**live, **self.counted}
        if self.last is not None:
            for step, before in self.last.rows_by_step.items():
                if step not in self.counted:
                    rows[step] = max(rows.get(step, 0), before)
        return rows
