"""L-BFGS and OWL-QN as a state machine over numpy: one function evaluation per step.

An iteration body cannot wait for a Spark job inside a round, so the optimizer is turned
inside out: ``OptimizerState`` holds everything (the accepted point, its value and
gradient, the memory of (s, y) pairs, the line search's registers, the counters and the
histories), the round evaluates the objective at ``state.trial``, and :func:`advance` takes
that evaluation and either picks the next trial step of the line search or accepts it,
updates the memory and starts the next line search. The state is plain numbers and arrays,
so it fits in a one-row model and a run resumed from a checkpoint continues exactly.

The rules are those of Spark MLlib's optimizers (breeze's ``LBFGS`` and ``OWLQN`` with
their default convergence check), so that iterations and stopping points compare:

- L-BFGS (no L1 part): the two-loop recursion over the last ``memory`` pairs, scaled by
  ``s.y / y.y`` of the newest pair; a strong Wolfe line search (c1 = 1e-4, c2 = 0.9,
  cubic interpolation, at most 10 bracketing and 10 zoom steps), first step
  ``1 / |direction|`` in iteration 0 and 1 after.
- OWL-QN (an L1 weight > 0 on some coordinate): the direction from the pseudo-gradient,
  kept in its orthant; steps projected on the orthant of the point; a backtracking line
  search (Armijo 1e-4, Wolfe 0.9, shrink 0.1 in iteration 0 and 0.5 after, grow 2.1, at
  most 20 further steps), first step ``0.5 / |gradient|`` in iteration 0 and 1 after. As in
  breeze, the search judges its first step by the smooth value at the current point (the
  step's own objective is used from the second step on).
- It stops after ``max_iterations`` iterations; when the objective changed by at most
  ``tol * |initial objective|`` over the last 20 iterations (so never before iteration
  20); when the (pseudo-)gradient's norm is at most ``max(tol * |objective|, 1e-8)``; or
  when a line search fails twice in a row (after the first failure the memory is cleared
  and the iteration starts again from steepest descent, and the objective history repeats
  that point, as MLlib's does).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

#: How many objective values the function-values test looks back over.
VALUE_MEMORY = 20
#: Strong Wolfe line search (L-BFGS).
SUFFICIENT_DECREASE, CURVATURE = 1e-4, 0.9
MAX_BRACKET_STEPS, MAX_ZOOM_STEPS = 10, 10
#: Backtracking line search (OWL-QN).
ARMIJO, WOLFE, GROW = 1e-4, 0.9, 2.1
MAX_BACKTRACK_STEPS = 20
MIN_STEP, MAX_STEP = 1e-10, 1e10

#: ``OptimizerState.status`` while it runs.
STARTING, SEARCHING = "starting", "searching"
#: Why it stopped (MLlib's reasons, plus a non-finite objective).
MAX_ITERATIONS = "max iterations reached"
FUNCTION_VALUES = "function values converged"
GRADIENT = "gradient converged"
SEARCH_FAILED = "line search failed"
DIVERGED = "diverged"
RUNNING = (STARTING, SEARCHING)

#: The line search's registers, by position in ``OptimizerState.search``.
(PHASE, COUNT, STEP, F0, DD0, LOW_T, LOW_DD, LOW_F, HIGH_T, HIGH_DD, HIGH_F, SHRINK) = range(12)
BRACKET, ZOOM, BACKTRACK = 0.0, 1.0, 2.0


@attrs.frozen
class Settings:
    """What the optimizer was asked for: the memory size, MLlib's ``maxIter`` and ``tol``,
    and the L1 weight of every coordinate (all 0: L-BFGS; some > 0: OWL-QN)."""

    memory: int
    max_iterations: int
    tol: float
    l1: np.ndarray
    #: OWL-QN even with no L1 part (its backtracking search and orthants), as MLlib's
    #: LinearSVC runs it.
    owlqn: bool = False

    @property
    def orthant_wise(self) -> bool:
        return self.owlqn or bool((self.l1 > 0).any())


@attrs.define
class OptimizerState:
    """Everything the optimizer knows, between two evaluations. ``x``, ``value`` and
    ``gradient`` are the accepted point and the smooth part of the objective there (without
    the L1 part); ``trial`` is the point the next round evaluates."""

    x: np.ndarray
    value: float
    gradient: np.ndarray
    direction: np.ndarray
    trial: np.ndarray
    #: The (s, y) pairs, newest first: (pairs, n) each.
    steps: np.ndarray
    gradient_changes: np.ndarray
    search: np.ndarray
    iteration: int
    failed_once: bool
    initial: float
    #: The objective (L1 part included) of the last ``VALUE_MEMORY`` iterates, for the
    #: function-values test; starts with +inf, as breeze's.
    recent: list[float]
    #: The objective at every accepted iterate, the first included: MLlib's objectiveHistory.
    history: list[float]
    evaluations: int
    status: str

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    def columns(self) -> dict[str, Any]:
        """The state as model columns (arrays flattened)."""
        return {
            "x": self.x,
            "value": self.value,
            "gradient": self.gradient,
            "direction": self.direction,
            "trial": self.trial,
            "steps": self.steps.ravel(),
            "gradient_changes": self.gradient_changes.ravel(),
            "search": self.search,
            "iteration": self.iteration,
            "failed_once": self.failed_once,
            "initial": self.initial,
            "recent": np.array(self.recent),
            "objective_history": np.array(self.history),
            "evaluations": self.evaluations,
            "status": self.status,
        }

    @classmethod
    def from_columns(cls, row: dict[str, Any]) -> OptimizerState:
        """The state read back from a model row (as ``columns`` wrote it)."""
        x = np.array(row["x"], dtype=np.float64)
        n = len(x)
        return cls(
            x=x,
            value=float(row["value"]),
            gradient=np.array(row["gradient"], dtype=np.float64),
            direction=np.array(row["direction"], dtype=np.float64),
            trial=np.array(row["trial"], dtype=np.float64),
            steps=np.array(row["steps"], dtype=np.float64).reshape(-1, n),
            gradient_changes=np.array(row["gradient_changes"], dtype=np.float64).reshape(-1, n),
            search=np.array(row["search"], dtype=np.float64),
            iteration=int(row["iteration"]),
            failed_once=bool(row["failed_once"]),
            initial=float(row["initial"]),
            recent=[float(v) for v in row["recent"]],
            history=[float(v) for v in row["objective_history"]],
            evaluations=int(row["evaluations"]),
            status=str(row["status"]),
        )


def begin(x0: np.ndarray) -> OptimizerState:
    """A state whose next evaluation is at ``x0``, the starting point."""
    x0 = np.asarray(x0, dtype=np.float64)
    n = len(x0)
    nothing = np.zeros(n)
    return OptimizerState(
        x=x0,
        value=math.nan,
        gradient=nothing,
        direction=nothing,
        trial=x0,
        steps=np.zeros((0, n)),
        gradient_changes=np.zeros((0, n)),
        search=np.zeros(12),
        iteration=0,
        failed_once=False,
        initial=math.nan,
        recent=[math.inf],
        history=[],
        evaluations=0,
        status=STARTING,
    )


def stopped(x: np.ndarray, status: str) -> OptimizerState:
    """A state that stopped before any evaluation (nothing to fit), at ``x``."""
    state = begin(x)
    state.status = status
    return state


def adjusted(settings: Settings, x: np.ndarray, value: float) -> float:
    """The objective with its L1 part."""
    return value + float(np.abs(settings.l1 * x).sum()) if settings.orthant_wise else value


def pseudo_gradient(settings: Settings, x: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """The gradient with the L1 part: OWL-QN's pseudo-gradient (the one-sided derivative
    that descends, 0 where neither side does, at coordinates that are 0)."""
    if not settings.orthant_wise:
        return gradient
    l1 = settings.l1
    at_zero = np.where(
        gradient - l1 > 0, gradient - l1, np.where(gradient + l1 < 0, gradient + l1, 0.0)
    )
    moved = gradient + np.sign(x) * l1
    return np.where(l1 == 0, gradient, np.where(x == 0, at_zero, moved))


def advance(
    settings: Settings, state: OptimizerState, value: float, gradient: np.ndarray
) -> OptimizerState:
    """Take the evaluation at ``state.trial`` (the smooth objective and its gradient) and
    move on: the next trial point, or a stop. Changes ``state`` in place and returns it."""
    state.evaluations += 1
    if state.status == STARTING:
        state.x, state.value, state.gradient = state.trial, value, gradient
        objective = adjusted(settings, state.x, value)
        state.initial = objective
        state.history.append(objective)
        if not (math.isfinite(objective) and np.isfinite(gradient).all()):
            state.status = DIVERGED
            return state
        _check_and_continue(settings, state)
        return state
    outcome, step = _search_step(settings, state, value, gradient)
    if outcome == "accept":
        _accept(settings, state, step, value, gradient)
    elif outcome == "try":
        _try(settings, state, step)
    else:
        _fail(settings, state)
    return state


# -- one iteration: direction, line search, update ---------------------------------------


def _direction(settings: Settings, state: OptimizerState) -> np.ndarray | None:
    """The two-loop recursion: minus the inverse-Hessian estimate times the (pseudo-)
    gradient; None when the memory holds a pair with negative curvature or NaN."""
    gradient = pseudo_gradient(settings, state.x, state.gradient)
    steps, changes = state.steps, state.gradient_changes
    direction = gradient.copy()
    pairs = len(steps)
    with np.errstate(all="ignore"):
        if pairs:
            sy = float(steps[0] @ changes[0])
            if sy < 0 or math.isnan(sy):
                return None
            # numpy's division: a gradient that did not change (a piecewise-linear loss
            # such as the hinge) gives NaN here, as in breeze, not a Python exception.
            scale = float(np.float64(sy) / np.float64(changes[0] @ changes[0]))
        else:
            scale = 1.0
        rho = np.einsum("ij,ij->i", steps, changes)
        alphas = np.zeros(pairs)
        for i in range(pairs):
            alphas[i] = float(steps[i] @ direction) / rho[i]
            if math.isnan(alphas[i]):
                return None
            direction -= alphas[i] * changes[i]
        direction *= scale
        for i in reversed(range(pairs)):
            beta = float(changes[i] @ direction) / rho[i]
            direction += (alphas[i] - beta) * steps[i]
    direction = -direction
    if settings.orthant_wise:
        # Kept in the orthant of the pseudo-gradient's descent (Andrew and Gao).
        direction = np.where(direction * gradient < 0, direction, 0.0)
    return direction


def _start_search(settings: Settings, state: OptimizerState) -> None:
    direction = _direction(settings, state)
    if direction is None:
        _fail(settings, state)
        return
    state.direction = direction
    search = np.zeros(12)
    first = state.iteration == 0
    if settings.orthant_wise:
        pseudo = pseudo_gradient(settings, state.x, state.gradient)
        search[PHASE] = BACKTRACK
        search[F0] = adjusted(settings, state.x, state.value)
        search[DD0] = float(pseudo @ direction)
        search[SHRINK] = 0.1 if first else 0.5
        with np.errstate(divide="ignore"):
            step = 0.5 / float(np.linalg.norm(state.gradient)) if first else 1.0
    else:
        slope = float(state.gradient @ direction)
        if slope > 0:  # not a descent direction
            _fail(settings, state)
            return
        search[PHASE] = BRACKET
        search[F0], search[DD0] = state.value, slope
        search[LOW_T], search[LOW_DD], search[LOW_F] = 0.0, slope, state.value
        with np.errstate(divide="ignore"):
            step = 1.0 / float(np.linalg.norm(direction)) if first else 1.0
    state.search = search
    state.status = SEARCHING
    _try(settings, state, step)


def _point(settings: Settings, state: OptimizerState, step: float) -> np.ndarray:
    """``x + step * direction``; for OWL-QN projected on the orthant of ``x`` (of the
    pseudo-gradient's descent where ``x`` is 0)."""
    stepped = state.x + state.direction * step
    if not settings.orthant_wise:
        return stepped
    pseudo = pseudo_gradient(settings, state.x, state.gradient)
    orthant = np.where(state.x != 0, np.sign(state.x), np.sign(-pseudo))
    return np.where(np.sign(stepped) == orthant, stepped, 0.0)


def _try(settings: Settings, state: OptimizerState, step: float) -> None:
    state.search[STEP] = step
    state.trial = _point(settings, state, step)


def _accept(
    settings: Settings, state: OptimizerState, step: float, value: float, gradient: np.ndarray
) -> None:
    if not settings.orthant_wise and step * float(np.linalg.norm(state.gradient)) < 1e-10:
        _fail(settings, state)  # breeze's StepSizeUnderflow
        return
    x = state.trial
    state.steps = np.vstack([x - state.x, state.steps])[: settings.memory]
    state.gradient_changes = np.vstack([gradient - state.gradient, state.gradient_changes])[
        : settings.memory
    ]
    state.x, state.value, state.gradient = x, value, gradient
    state.iteration += 1
    state.failed_once = False
    objective = adjusted(settings, x, value)
    state.recent = [*state.recent, objective][-VALUE_MEMORY:]
    state.history.append(objective)
    if not (math.isfinite(objective) and np.isfinite(gradient).all()):
        state.status = DIVERGED
        return
    _check_and_continue(settings, state)


def _fail(settings: Settings, state: OptimizerState) -> None:
    """A line search failed: the first time, forget the memory and search again from the
    same point (steepest descent); the second time in a row, stop. Either way the point
    is handed back once more, so MLlib's objective history repeats it."""
    state.history.append(adjusted(settings, state.x, state.value))
    if state.failed_once:
        state.status = SEARCH_FAILED
        return
    state.failed_once = True
    n = len(state.x)
    state.steps, state.gradient_changes = np.zeros((0, n)), np.zeros((0, n))
    _start_search(settings, state)


def _check_and_continue(settings: Settings, state: OptimizerState) -> None:
    """MLlib's convergence check on the accepted point, in its order; else the next
    iteration's line search."""
    objective = adjusted(settings, state.x, state.value)
    pseudo = pseudo_gradient(settings, state.x, state.gradient)
    if 0 <= settings.max_iterations <= state.iteration:
        state.status = MAX_ITERATIONS
    elif len(state.recent) >= 2 and abs(objective - max(state.recent)) <= settings.tol * abs(
        state.initial
    ):
        state.status = FUNCTION_VALUES
    elif float(np.linalg.norm(pseudo)) <= max(settings.tol * abs(objective), 1e-8):
        state.status = GRADIENT
    else:
        _start_search(settings, state)


# -- the line searches: one evaluation in, a decision out --------------------------------


def _search_step(
    settings: Settings, state: OptimizerState, value: float, gradient: np.ndarray
) -> tuple[str, float]:
    """``("accept", step)``, ``("try", next step)`` or ``("fail", nan)`` for the evaluation
    at the current trial step."""
    search = state.search
    step = float(search[STEP])
    if settings.orthant_wise:
        objective = adjusted(settings, state.trial, value)
        if search[COUNT] == 0:
            # As breeze's backtracking search (MLlib's), the first step is judged by the
            # smooth value at the current point, in place of its own objective (its slope
            # is its own): so the steps, and the iteration counts, are MLlib's.
            objective = state.value
        slope = float(pseudo_gradient(settings, state.trial, gradient) @ state.direction)
        return _backtrack(search, step, objective, slope)
    slope = float(gradient @ state.direction)
    if search[PHASE] == BRACKET:
        return _bracket(search, step, value, slope)
    return _zoom(search, step, value, slope)


def _bracket(search: np.ndarray, t: float, f: float, dd: float) -> tuple[str, float]:
    """Strong Wolfe, first phase: grow the step until it brackets a good one."""
    f0, dd0 = search[F0], search[DD0]
    count = int(search[COUNT])
    search[COUNT] = count + 1
    if not math.isfinite(f):  # too far: try half the step
        return ("fail", math.nan) if count + 1 >= MAX_BRACKET_STEPS else ("try", t / 2.0)
    low = (search[LOW_T], search[LOW_DD], search[LOW_F])
    if f > f0 + SUFFICIENT_DECREASE * t * dd0 or (f >= low[2] and count > 0):
        return _start_zoom(search, low, (t, dd, f))
    if abs(dd) <= CURVATURE * abs(dd0):
        return "accept", t
    if dd >= 0:
        return _start_zoom(search, (t, dd, f), low)
    search[LOW_T], search[LOW_DD], search[LOW_F] = t, dd, f
    if count + 1 >= MAX_BRACKET_STEPS:
        return "fail", math.nan
    return "try", t * 1.5


def _start_zoom(
    search: np.ndarray, low: tuple[float, float, float], high: tuple[float, float, float]
) -> tuple[str, float]:
    search[PHASE], search[COUNT] = ZOOM, 0
    search[LOW_T], search[LOW_DD], search[LOW_F] = low
    search[HIGH_T], search[HIGH_DD], search[HIGH_F] = high
    return "try", _interpolate(search)


def _zoom(search: np.ndarray, t: float, f: float, dd: float) -> tuple[str, float]:
    """Strong Wolfe, second phase: shrink the bracket around a step that meets both
    conditions."""
    f0, dd0 = search[F0], search[DD0]
    if f > f0 + SUFFICIENT_DECREASE * t * dd0 or f >= search[LOW_F]:
        search[HIGH_T], search[HIGH_DD], search[HIGH_F] = t, dd, f
    else:
        if abs(dd) <= CURVATURE * abs(dd0):
            return "accept", t
        if dd * (search[HIGH_T] - search[LOW_T]) >= 0:
            search[HIGH_T], search[HIGH_DD], search[HIGH_F] = (
                search[LOW_T],
                search[LOW_DD],
                search[LOW_F],
            )
        search[LOW_T], search[LOW_DD], search[LOW_F] = t, dd, f
    search[COUNT] += 1
    if search[COUNT] >= MAX_ZOOM_STEPS:
        return "fail", math.nan
    return "try", _interpolate(search)


def _interpolate(search: np.ndarray) -> float:
    """The minimum of the cubic through both ends of the bracket (values and slopes), kept
    within its middle 80 %."""
    low = (search[LOW_T], search[LOW_DD], search[LOW_F])
    high = (search[HIGH_T], search[HIGH_DD], search[HIGH_F])
    (lt, ld, lf), (rt, rd, rf) = (high, low) if low[0] > high[0] else (low, high)
    with np.errstate(all="ignore"):
        d1 = ld + rd - 3 * (lf - rf) / (lt - rt)
        d2 = float(np.sqrt(np.float64(d1 * d1 - ld * rd)))
        t = rt - (rt - lt) * (rd + d2 - d1) / (rd - ld + 2 * d2)
    lower, upper = lt + 0.1 * (rt - lt), lt + 0.9 * (rt - lt)
    if t < lower:
        return float(lower)
    if t > upper:
        return float(upper)
    return float(t)


def _backtrack(search: np.ndarray, t: float, f: float, dd: float) -> tuple[str, float]:
    """OWL-QN's line search: shrink while the decrease is too small or the slope still too
    steep upward, grow while it is still steep downward."""
    f0, dd0 = search[F0], search[DD0]
    if f > f0 + t * dd0 * ARMIJO:
        factor = search[SHRINK]
    elif dd < WOLFE * dd0:
        factor = GROW
    elif dd > -WOLFE * dd0:
        factor = search[SHRINK]
    else:
        return "accept", t
    following = t * factor
    if following < MIN_STEP or following > MAX_STEP:
        return "fail", math.nan
    search[COUNT] += 1
    if search[COUNT] >= MAX_BACKTRACK_STEPS:
        # breeze stops here and keeps this step (after evaluating the next one, which it
        # drops, and this one again): the same step, two evaluations sooner.
        return "accept", t
    return "try", float(following)
