"""What a run's rounds report about themselves while they run: one object per run.

Three parts of the runtime learn how a round is going before Spark's status can say:
materialization knows which row-count observation stands for which named step and
the exact rows of steps already counted; resident kernel calls know how many
partitions each resident task has served; the resident policy knows, during the first
round, whether the run's kernels run resident. They report here, explicitly (each is
handed the run's tracker), and the in-round sampler and the run's observers read it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs

from iterflow.progress.sampling import Reading


@attrs.frozen
class Residency:
    """How a run executes its kernels: ``mode`` is ``"resident"`` or ``"jobs"``, and
    ``reason`` says why a run that could have been resident was not."""

    mode: str
    reason: str | None = None

    def describe(self) -> dict[str, str | None]:
        return {"mode": self.mode, "reason": self.reason}


#: The residency of a run until its resident policy says otherwise.
UNDECIDED = Residency("jobs", "no resident policy decided how the run's kernels run")


@attrs.define
class RoundSteps:
    """The named steps of the round running now: which row-count observation stands for
    which step, and the exact rows of those already counted."""

    observations: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    counted: dict[str, int] = attrs.Factory(dict)
    #: ``ctx.observe`` steps not counted yet: their Observation, by step name.
    pending: dict[str, Any] = attrs.Factory(dict)


@attrs.define
class _KernelCalls:
    """The resident kernel calls of the round running now: partitions called, and done."""

    called: int = 0
    done: int = 0
    #: The call in flight: each task's partitions, and how many it has done.
    tasks: dict[int, tuple[int, int]] = attrs.Factory(dict)


class RoundTracker:
    """The progress reports of one run (see the module's docstring).

    ``begin(epoch)`` starts a round afresh. ``on_decided`` is called once, when the run's
    residency is decided (its ``iteration_started`` event can then be written).
    """

    def __init__(self, on_decided: Callable[[], None] | None = None) -> None:
        self.epoch = -1
        self.steps = RoundSteps()
        self._calls = _KernelCalls()
        self._lock = threading.Lock()
        self._on_decided = on_decided
        #: The run's residency: the decided one, or what it is until something decides.
        self.residency = UNDECIDED
        self.decided = False

    def begin(self, epoch: int) -> RoundSteps:
        """Round ``epoch`` starts (or starts again): nothing reported of it yet."""
        with self._lock:
            self.epoch = epoch
            self.steps = RoundSteps()
            self._calls = _KernelCalls()
            return self.steps

    # -- materialization ---------------------------------------------------------------

    def step(self, observation: str, names: Iterable[str], handle: Any = None) -> None:
        """The rows observed by ``observation`` are those of the steps ``names``; ``handle``,
        the Observation itself, when nothing else tells when it is counted."""
        self.steps.observations[observation] = tuple(names)
        if handle is not None:
            self.steps.pending.update(dict.fromkeys(names, handle))

    def rows(self, names: Iterable[str], rows: int) -> None:
        """The steps ``names`` are done: ``rows`` rows, exactly."""
        for name in names:
            self.steps.counted[name] = rows

    # -- resident kernel calls -----------------------------------------------------------

    @contextmanager
    def kernel_call(
        self, partitions: int, held: Mapping[int, int]
    ) -> Iterator[Callable[[int, int], None]]:
        """Inside, a kernel call over ``partitions`` partitions runs, ``held[task]`` of them
        in each resident task; it yields ``progressed(task, done)`` for the tasks' reports."""
        with self._lock:
            calls = self._calls
            calls.called += partitions
            calls.tasks = {task: (parts, 0) for task, parts in held.items()}

        def progressed(task: int, done: int) -> None:
            with self._lock:
                if task in calls.tasks:
                    calls.tasks[task] = (calls.tasks[task][0], done)

        try:
            yield progressed
        finally:
            with self._lock:
                calls.done += sum(parts for parts, _done in calls.tasks.values())
                calls.tasks = {}

    def kernel_reading(self) -> Reading | None:
        """The partitions this round's resident kernel calls were called on and have
        served so far (as tasks), or None when it made none."""
        with self._lock:
            calls = self._calls
            if not calls.called:
                return None
            working = [done for parts, done in calls.tasks.values() if done < parts]
            return Reading(
                tasks_total=calls.called,
                tasks_done=calls.done + sum(done for _parts, done in calls.tasks.values()),
                tasks_active=len(working),
            )

    # -- residency -------------------------------------------------------------------------

    def expect(self, residency: Residency) -> None:
        """The run's residency unless something decides otherwise in its first round."""
        if not self.decided:
            self.residency = residency

    def decide(self, residency: Residency) -> None:
        """The run's residency is decided (the first decision stands)."""
        if self.decided:
            return
        self.residency, self.decided = residency, True
        if self._on_decided is not None:
            self._on_decided()
