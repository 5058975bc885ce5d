"""The values a run records, shared by the termination rules, progress reporting and
the loops: what one round did (``RoundProgress``) and why the run stopped
(``Termination``). A leaf: it imports nothing of iterflow and never Spark."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs


def _path(value: Any) -> tuple[int, ...]:
    return tuple(int(epoch) for epoch in value)


def _frozen_dict(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return dict(value or {})


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(value) for value in values)


@attrs.frozen(kw_only=True)
class Rollback:
    """A bounded run lost data Spark cannot recompute and went back to a durable checkpoint.

    Round ``failed_epoch`` failed because blocks of the previous round's local
    checkpoint were gone: ``lost_blocks`` names them (Spark's block ids, e.g.
    ``rdd_42_3``) and ``lost_executors`` the executors Spark removed since the run
    started (``"1 at 10.0.0.7:40123 (Command exited with code 137)"``: id, address
    and Spark's reason); either is empty when Spark did not say. The run went on from
    the durable checkpoint of ``to_epoch``:
    ``rounds_recomputed`` rounds that had completed (``to_epoch + 1`` to
    ``failed_epoch - 1``) ran again, then the failed one. ``at`` is when (aware UTC).
    """

    failed_epoch: int
    to_epoch: int
    lost_blocks: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    lost_executors: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    at: datetime

    @property
    def rounds_recomputed(self) -> int:
        return self.failed_epoch - self.to_epoch - 1

    @property
    def lost(self) -> str:
        """What was lost, in words: ``"blocks rdd_42_1, rdd_42_3 (executor 1 at
        10.0.0.7:40123 (...) was lost)"``."""
        return describe_loss(self.lost_blocks, self.lost_executors)


def describe_loss(blocks: Sequence[str], executors: Sequence[str]) -> str:
    """``blocks`` of a local checkpoint and the ``executors`` that left, in words."""
    what = f"block{'s' if len(blocks) > 1 else ''} {', '.join(blocks)}" if blocks else "a block"
    return f"{what} ({executors_lost(executors)})" if executors else what


def executors_lost(executors: Sequence[str]) -> str:
    """``"executor 1 at 10.0.0.7:40123 (...) was lost"``, for one or more ``executors``."""
    several = len(executors) > 1
    were = "were" if several else "was"
    return f"executor{'s' if several else ''} {'; '.join(executors)} {were} lost"


@attrs.frozen(kw_only=True)
class RoundProgress:
    """What round ``epoch`` did: the record listeners, predicates and logs receive.

    ``rows`` maps each feedback and output name to its row count, counted in
    the job that materialized it. ``observed`` maps each ``ctx.observe`` name to
    the rows Spark evaluated there, or None when Spark never evaluated it.
    ``criteria_empty`` is None when the round declared no ``itf.empty`` criteria.
    ``criteria_rows`` is the rows of those criteria (the fewest, with several),
    counted on the round's own jobs (None without criteria, or in a round that
    did not materialize them).

    Unbounded iterations fill in the rest: ``batch_id`` (the micro-batch whose
    call ran the epoch, None outside one), ``input_rows`` (new rows of each
    streaming input, None when Spark never evaluated it), ``feedback_rows_in``
    (rows each variable received from the previous epoch) and ``backlog``
    (``feedback_rows``: work feedback in flight after the epoch, plus what the
    sources report as waiting, e.g. ``source.0.avgOffsetsBehindLatest``).

    ``step_s`` maps each feedback and output name to the seconds of the job that
    materialized it (a round's first job also computes what later ones read from
    its cache); names held on the driver already (a resident kernel's result) have
    none.

    ``resident`` is True when the round's kernels ran on resident data (in tasks
    that keep their partitions across rounds) rather than as Spark jobs.

    ``epoch_path`` places the round among nested iterations, outermost first:
    ``(epoch,)`` for a run of its own, ``(3, 0)`` for round 0 of an iteration run
    inside round 3 of another (by its body or a listener).

    ``rollback`` is set on the first round a run ran after going back to a durable
    checkpoint (see ``Rollback``): what was lost, the epoch it went back to, and the
    rounds it ran again. None otherwise.

    Unbounded iterations in event time also fill in ``watermarks`` (aware UTC
    datetimes after the epoch: each input bound with ``event_time=``, each
    ``ctx.window``/``ctx.join`` step's output watermark, and ``"loop"``, below which
    the iteration emits nothing more; ``datetime.min``/``datetime.max`` in UTC stand
    for none yet / inputs ended), ``late_rows`` (rows each step dropped as too late in
    the epoch, see ``ctx.late``) and ``state_rows`` (rows each step keeps for later
    epochs).
    """

    epoch: int
    epoch_watermark: int
    started_at: datetime
    duration_s: float
    rows: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_dict)
    step_s: Mapping[str, float] = attrs.field(factory=dict, converter=_frozen_dict)
    criteria_empty: bool | None = None
    criteria_rows: int | None = None
    observed: Mapping[str, int | None] = attrs.field(factory=dict, converter=_frozen_dict)
    metrics: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    converged_value: float | None = None
    rounds_remaining_estimate: int | None = None
    eta_s: float | None = None
    batch_id: int | None = None
    input_rows: Mapping[str, int | None] = attrs.field(factory=dict, converter=_frozen_dict)
    feedback_rows_in: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_dict)
    backlog: Mapping[str, float] = attrs.field(factory=dict, converter=_frozen_dict)
    resident: bool = False
    epoch_path: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: (self.epoch,), takes_self=True), converter=_path
    )
    watermarks: Mapping[str, datetime] = attrs.field(factory=dict, converter=_frozen_dict)
    late_rows: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_dict)
    state_rows: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_dict)
    rollback: Rollback | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in attrs.fields(RoundProgress)}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        """Unpickle, giving fields a pickle from an older iterflow lacks their defaults (a
        checkpoint's history from before they existed)."""
        for field in attrs.fields(RoundProgress):
            if field.name in state:
                value = state[field.name]
            elif isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
                factory = field.default.factory  # type: ignore[union-attr]
                value = factory(self) if field.default.takes_self else factory()  # type: ignore[union-attr]
            else:
                value = field.default
            object.__setattr__(self, field.name, value)


@attrs.frozen(kw_only=True)
class RoundSample:
    """Progress of round ``epoch`` while it runs, sampled every ``progress_interval_s``.

    ``tasks_total``, ``tasks_done`` and ``tasks_active`` count the Spark tasks of the
    round's jobs so far (and the partitions of its resident kernel calls); a job the
    round has not started yet is not counted, so ``fraction_done`` also weighs the
    tasks the round's previous rounds ran, and never goes back within a round. It is
    None until anything is known, and 1.0 in the sample sent when the round's work is
    done. ``rows_read`` and ``bytes_read`` count what the round's stages read from
    sources and caches so far (None when unknown: over Spark Connect only bytes).
    ``rows_by_step`` maps each feedback, output, streaming input and ``ctx.observe``
    name to its rows so far, where known: exact once its job finished, from Spark's
    live SQL metrics while it runs. ``eta_s`` estimates the round's remaining
    seconds. ``final`` marks the round's last sample.
    """

    epoch: int
    elapsed_s: float
    fraction_done: float | None = None
    tasks_total: int = 0
    tasks_done: int = 0
    tasks_active: int = 0
    rows_read: int | None = None
    bytes_read: int | None = None
    rows_by_step: Mapping[str, int] = attrs.field(factory=dict, converter=_frozen_dict)
    eta_s: float | None = None
    final: bool = False
    epoch_path: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: (self.epoch,), takes_self=True), converter=_path
    )


@attrs.frozen
class Termination:
    """Why the iteration stopped: ``reason`` is the first of ``reasons`` in REASONS order."""

    reason: str
    epoch: int
    reasons: tuple[str, ...]
