"""The regressions with ``solver="lbfgs"``: Spark MLlib's objective, solved by
``iterflow.ml.lbfgs`` one evaluation per round.

One run fits one problem or several over the same rows (``candidates``: the ParamMaps of
a grid that differ in the penalty, the tolerance, the rounds or the start), each with its
own optimizer, on one load of the rows: the model has a row per candidate. Round 0 is one
``itf.combine`` of ``Statistics``: per feature (and the label) the weighted mean and
standard deviation (the weighted sample std, as MLlib's summarizer), the weight sum and
the weight of label 1. Its output starts every candidate's optimizer. Every later round is
one ``itf.combine`` of ``Evaluation``: numpy sums the rows' loss and gradient at every
running candidate's trial point at once (the kernel of gradient descent, a matrix product
for all of them), and ``extract_output``, on the driver, turns the sums into each
objective and its gradient and advances each optimizer. Everything lives in the model
rows (statistics, optimizer state, histories), so a run resumed from a checkpoint
continues exactly; a row's ``running`` turns 0 when its optimizer stops, NaN when its
objective stops being finite (a ``DivergenceError`` naming the round); the run ends when
no candidate runs.

The objective is MLlib's, in its standardized space: coefficients ``w_j = beta_j sigma_j``
(a feature with sigma 0 gets coefficient 0), the intercept not penalized, and::

    mean loss + reg * ((1 - elastic_net) / 2 * sum p_j w_j^2 + elastic_net * sum q_j |w_j|)

with ``p_j = q_j = 1`` under ``standardization=True`` and ``p_j = 1/sigma_j^2``,
``q_j = 1/sigma_j`` otherwise (the same penalty as on the raw coefficients). Logistic: the
mean log loss, features centered when there is an intercept (which starts at the log-odds of
the labels). Linear: half the mean squared error of the standardized label ``(y - mean) /
sd``, ``reg`` divided by the label's sd, the intercept found in closed form at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.ml import lbfgs
from iterflow.ml.features import PARTITION, prepared_matrix
from iterflow.ml.regression_problem import FitOptions, loss_sums, no_rows
from iterflow.ml.training import MLError, ModelStep

#: The model of an L-BFGS run, a row per candidate (its position in the problems fitted
#: together): the coefficients in the raw space (intercept last) and the objective at them,
#: whether the optimizer runs, the data's statistics, and the optimizer's state
#: (``lbfgs.OptimizerState``).
MODEL_SCHEMA = (
    "candidate INT, coefficients ARRAY<DOUBLE>, loss DOUBLE, running DOUBLE, "
    "statistics ARRAY<DOUBLE>, "
    "x ARRAY<DOUBLE>, value DOUBLE, gradient ARRAY<DOUBLE>, direction ARRAY<DOUBLE>, "
    "trial ARRAY<DOUBLE>, steps ARRAY<DOUBLE>, gradient_changes ARRAY<DOUBLE>, "
    "search ARRAY<DOUBLE>, iteration INT, failed_once BOOLEAN, initial DOUBLE, "
    "recent ARRAY<DOUBLE>, objective_history ARRAY<DOUBLE>, evaluations INT, status STRING"
)
NAMES = [column.strip().split(" ")[0] for column in MODEL_SCHEMA.split(", ")]
#: ``status`` before round 0 has measured the data; or when there was nothing to fit.
STATISTICS = "statistics"
CONSTANT_LABEL = "constant label"


def model_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The model rows from named values, one dict per candidate in order (arrays become
    list cells)."""
    tables = []
    for candidate, columns in enumerate(rows):
        columns = {**columns, "candidate": candidate}
        cells = [
            itf.vector_cell(np.asarray(columns[name], dtype=np.float64))
            if isinstance(columns[name], np.ndarray)
            else pa.array([columns[name]], pa.int32() if name == "candidate" else None)
            for name in NAMES
        ]
        tables.append(pa.table(cells, names=NAMES))
    return pa.concat_tables(tables)


def start_model(spark: SparkSession, features: int, candidates: int) -> DataFrame:
    """The round-0 model of ``candidates`` problems: nothing measured yet."""
    state = lbfgs.begin(np.zeros(0))
    state.status = STATISTICS
    columns = {
        "coefficients": np.zeros(features + 1),
        "loss": math.nan,
        "running": 1.0,
        "statistics": np.zeros(0),
        **state.columns(),
    }
    return spark.createDataFrame(model_table([columns] * candidates), MODEL_SCHEMA)


def model_rows(model: pa.Table) -> list[dict[str, Any]]:
    """The candidates' model rows, in the order of the problems fitted together."""
    return sorted(model.to_pylist(), key=lambda row: int(row["candidate"]))


@attrs.frozen
class Objective:
    """MLlib's objective for one fit, from the data's statistics: the map between the
    optimizer's (standardized) coordinates and the raw coefficients, the loss and the
    penalties."""

    kind: str
    fit_intercept: bool
    mean: np.ndarray
    std: np.ndarray
    label_mean: float
    label_std: float
    l2: float
    l2_weights: np.ndarray
    l1: np.ndarray

    @classmethod
    def of(cls, options: FitOptions, statistics: np.ndarray) -> Objective:
        d = (len(statistics) - 4) // 2
        mean, std = statistics[4 : 4 + d], statistics[4 + d :]
        label_mean, label_std = float(statistics[2]), float(statistics[3])
        inverse = _inverse(std)
        reg = options.reg
        if options.kind == "linear":
            # MLlib fits the label divided by its sd, so it divides the penalty too.
            label_std = label_std if label_std > 0 else abs(label_mean)
            reg = reg / label_std
        l1_part = options.elastic_net * reg
        q = np.ones(d) if options.standardization else inverse
        l1 = q * l1_part
        if options.kind != "linear" and options.fit_intercept:
            l1 = np.append(l1, 0.0)  # the intercept is not penalized
        return cls(
            kind=options.kind,
            fit_intercept=options.fit_intercept,
            mean=mean,
            std=std,
            label_mean=label_mean,
            label_std=label_std,
            l2=(1.0 - options.elastic_net) * reg,
            l2_weights=np.ones(d) if options.standardization else inverse**2,
            l1=l1,
        )

    @property
    def features(self) -> int:
        return len(self.mean)

    def starting_point(self, positives: float, weight: float) -> np.ndarray:
        """MLlib's: 0, and for a logistic intercept the log-odds of the labels (a linear
        SVM's intercept starts at 0)."""
        if self.kind == "linear":
            return np.zeros(self.features)
        if not self.fit_intercept:
            return np.zeros(self.features)
        if self.kind == "hinge":
            return np.zeros(self.features + 1)
        return np.append(np.zeros(self.features), math.log(positives / (weight - positives)))

    def point(self, raw: np.ndarray) -> np.ndarray:
        """The optimizer's point of the raw coefficients ``raw`` (intercept last): the
        inverse of ``raw``, to warm-start from a model as MLlib's ``initialModel``."""
        d = self.features
        beta, intercept = raw[:d], float(raw[d])
        if self.kind == "linear":
            scale = self.label_std if self.label_std > 0 else 1.0
            return beta * self.std / scale
        if not self.fit_intercept:
            return beta * self.std
        return np.append(beta * self.std, intercept + float(beta @ self.mean))

    def raw(self, w: np.ndarray) -> np.ndarray:
        """The raw coefficients (intercept last) at the optimizer's point ``w``."""
        d, inverse = self.features, _inverse(self.std)
        if self.kind == "linear":
            beta = w * inverse * self.label_std
            intercept = self.label_mean - float(beta @ self.mean) if self.fit_intercept else 0.0
        else:
            beta = w[:d] * inverse
            # Centered features: the intercept absorbs the means.
            intercept = w[d] - float(beta @ self.mean) if self.fit_intercept else 0.0
        return np.append(beta, intercept)

    def value_and_gradient(
        self, w: np.ndarray, sums: np.ndarray, loss: float, weight: float
    ) -> tuple[float, np.ndarray]:
        """The smooth objective at ``w`` (the L1 part is the optimizer's) and its gradient,
        from the rows' sums at ``raw(w)`` (``loss_sums``: gradient, loss) and weight."""
        d, inverse = self.features, _inverse(self.std)
        with np.errstate(all="ignore"):
            if self.kind == "linear":
                value = loss / (self.label_std**2 * weight)
                gradient = sums[:d] * inverse / (self.label_std * weight)
            elif self.fit_intercept:
                value = loss / weight
                features = (sums[:d] - self.mean * sums[d]) * inverse / weight
                gradient = np.append(features, sums[d] / weight)
            else:
                value = loss / weight
                gradient = sums[:d] * inverse / weight
            coefficients = w[:d]
            value += 0.5 * self.l2 * float(self.l2_weights @ coefficients**2)
            gradient[:d] += self.l2 * self.l2_weights * coefficients
        return float(value), gradient


def _inverse(std: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(std > 0, 1.0 / std, 0.0)


def _settings(options: FitOptions, objective: Objective) -> lbfgs.Settings:
    return lbfgs.Settings(
        memory=options.memory,
        max_iterations=options.max_rounds,
        tol=options.tol if options.tol is not None else 0.0,
        l1=objective.l1,
        # MLlib's LinearSVC runs OWL-QN with no L1 part (its line search and orthants).
        owlqn=options.kind == "hinge",
    )


def _columns(
    objective: Objective, statistics: np.ndarray, state: lbfgs.OptimizerState
) -> dict[str, Any]:
    """The model row for ``state``: its accepted point as raw coefficients."""
    coefficients = state.x if state.status == CONSTANT_LABEL else objective.raw(state.x)
    running = 1.0 if state.running else 0.0
    if state.status == lbfgs.DIVERGED:
        running = math.nan
    return {
        "coefficients": coefficients,
        "loss": state.history[-1] if state.history else math.nan,
        "running": running,
        "statistics": statistics,
        **state.columns(),
    }


class Statistics(ModelStep):
    """Round 0: the weight sum, the weight of label 1, and the weighted mean and sample
    std of every feature and of the label (merged as Chan et al.: counts, means and sums
    of squared deviations). The output starts the optimizer."""

    def __init__(self, problems: list[FitOptions], features: int, loss: Any) -> None:
        super().__init__(loss)
        self.problems, self.features = problems, features

    def create_accumulator(self) -> tuple[Any, ...]:
        d = self.features + 1  # the features, then the label
        return 0.0, 0.0, 0.0, np.zeros(d), np.zeros(d)

    def add_input(self, acc: tuple[Any, ...], batch: pa.RecordBatch) -> tuple[Any, ...]:
        x = prepared_matrix(batch, "x", self.features)
        y, v = batch.column("y").to_numpy(), batch.column("v").to_numpy()
        weight = float(v.sum())
        if weight == 0:
            return acc
        mean = np.append(v @ x, v @ y) / weight
        squares = np.append(v @ (x - mean[:-1]) ** 2, v @ (y - mean[-1]) ** 2)
        part = weight, float(v @ v), float(v @ y), mean, squares
        return self.merge_accumulators([acc, part])

    def merge_accumulators(self, accs: list[tuple[Any, ...]]) -> tuple[Any, ...]:
        weight, squared, positives, mean, squares = self.create_accumulator()
        for w, w2, p, m, s in accs:
            if w == 0:
                continue
            total = weight + w
            delta = m - mean
            squares = squares + s + delta**2 * weight * w / total
            mean = mean + delta * (w / total)
            weight, squared, positives = total, squared + w2, positives + p
        return weight, squared, positives, mean, squares

    def extract_output(self, acc: tuple[Any, ...]) -> pa.Table:
        weight, squared, positives, mean, squares = acc
        if not weight > 0:
            raise MLError(no_rows(self.problems[0].kind))
        denominator = weight - squared / weight if weight > 0 else 0.0
        std = np.sqrt(np.maximum(squares / denominator, 0.0)) if denominator > 0 else mean * 0
        d = self.features
        statistics = np.concatenate([[weight, positives, mean[d], std[d]], mean[:d], std[:d]])
        rows = []
        for options in self.problems:
            objective = Objective.of(options, statistics)
            state = _first_state(options, objective, statistics)
            rows.append(_columns(objective, statistics, state))
        return model_table(rows)


def _first_state(
    options: FitOptions, objective: Objective, statistics: np.ndarray
) -> lbfgs.OptimizerState:
    """The optimizer at its starting point, or stopped where MLlib does not train: a
    constant label with an intercept (the model is then the intercept alone)."""
    weight, positives, label_mean, label_std = statistics[:4]
    d = objective.features
    if options.kind == "logistic" and options.fit_intercept and positives in (0.0, weight):
        # All labels equal: MLlib's intercept is +inf (all 1) or -inf (all 0).
        infinite = math.inf if positives > 0 else -math.inf
        return lbfgs.stopped(np.append(np.zeros(d), infinite), CONSTANT_LABEL)
    if options.kind == "linear" and label_std == 0 and (options.fit_intercept or label_mean == 0):
        return lbfgs.stopped(np.append(np.zeros(d), label_mean), CONSTANT_LABEL)
    if options.initial is not None:
        return lbfgs.begin(objective.point(options.initial))
    return lbfgs.begin(objective.starting_point(positives, weight))


class Evaluation(ModelStep):
    """One evaluation of every running candidate's objective at its optimizer's trial
    point: the accumulator is the rows' summed gradients and losses (``loss_sums``, a
    column per running candidate) and their weight; the output is the model rows after
    each optimizer took its evaluation (``lbfgs.advance``)."""

    def __init__(self, problems: list[FitOptions], rows: list[dict[str, Any]], loss: Any) -> None:
        super().__init__(loss)
        self.kind = problems[0].kind
        self.statistics = np.array(rows[0]["statistics"], dtype=np.float64)
        self.objectives = [Objective.of(options, self.statistics) for options in problems]
        self.settings = [
            _settings(options, objective)
            for options, objective in zip(problems, self.objectives, strict=True)
        ]
        self.states = [lbfgs.OptimizerState.from_columns(row) for row in rows]
        #: The running candidates, and their trial points as raw coefficients (a column each).
        self.active = [i for i, state in enumerate(self.states) if state.running]
        d = self.objectives[0].features
        self.trials = np.zeros((d + 1, len(self.active)))
        for column, i in enumerate(self.active):
            self.trials[:, column] = self.objectives[i].raw(self.states[i].trial)

    def create_accumulator(self) -> tuple[Any, ...]:
        return np.zeros(self.trials.shape), np.zeros(len(self.active)), 0.0

    def add_input(self, acc: tuple[Any, ...], batch: pa.RecordBatch) -> tuple[Any, ...]:
        gradient, loss, weight = acc
        x = prepared_matrix(batch, "x", self.trials.shape[0] - 1)
        y, v = batch.column("y").to_numpy(), batch.column("v").to_numpy()
        part_gradient, part_loss = loss_sums(self.kind, x, y, v, self.trials)
        return gradient + part_gradient, loss + part_loss, weight + float(v.sum())

    def extract_output(self, acc: tuple[Any, ...]) -> pa.Table:
        sums, losses, weight = acc
        for column, i in enumerate(self.active):
            state, objective = self.states[i], self.objectives[i]
            value, gradient = objective.value_and_gradient(
                state.trial, sums[:, column], float(losses[column]), weight
            )
            lbfgs.advance(self.settings[i], state, value, gradient)
        rows = [
            _columns(objective, self.statistics, state)
            for objective, state in zip(self.objectives, self.states, strict=True)
        ]
        finite = [row["loss"] for row in rows if math.isfinite(row["loss"])]
        if finite:
            self.loss.set(min(finite))  # one candidate: its loss; several: the least
        return model_table(rows)


def lbfgs_body(
    problems: list[FitOptions], prepare: Callable[[pa.Table], pa.Table], dims: int
) -> itf.IterationBody:
    """The L-BFGS body of ``problems`` (one kind, over the same rows): ``model`` (variable,
    a row per problem) and ``rows`` (data) with ``dims`` features; round 0 measures the
    data, every later round is one evaluation of every running problem's objective."""
    loss_gauge = itf.metrics.gauge("loss")
    features = dims
    numbered: dict[int, DataFrame] = {}  # as in the gradient-descent body

    @itf.body
    def quasi_newton(model: DataFrame, rows: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        held = model_rows(itf.to_arrow(model))  # held on the driver: no Spark job
        if id(rows) not in numbered:
            numbered[id(rows)] = rows.withColumn(PARTITION, F.spark_partition_id())
        step: ModelStep
        if held[0]["status"] == STATISTICS:
            step = Statistics(problems, features, loss_gauge)
        else:
            step = Evaluation(problems, held, loss_gauge)
        data = ctx.columnar(numbered[id(rows)], prepare)
        new_model = itf.combine(data, step, MODEL_SCHEMA, depth=1)
        return itf.Declaration(
            feedback={"model": new_model},
            outputs={"model": new_model},
            until=itf.converged(model_total("running"), 0.0),
        )

    return quasi_newton


def model_total(column: str) -> Callable[[itf.RoundEnd], float]:
    """The sum of ``column`` over this round's model rows (read on the driver): the
    candidates still running; NaN when one diverged."""

    def value(end: itf.RoundEnd) -> float:
        values = itf.to_arrow(end.variables["model"]).column(column).to_numpy()
        return float(np.sum(values))

    return value
