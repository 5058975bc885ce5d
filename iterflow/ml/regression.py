"""Linear and logistic regression by gradient descent, as iterflow bodies.

The variable is the model, one row: the coefficients (the intercept last), the
loss at the coefficients the round started from, and how far the round moved
them (L2 norm). The rows are a data input held for the whole run
(``RoundContext.columnar``): features as a float64 matrix, label and weight.
Every round is one ``itf.combine`` of ``GradientStep``: per partition, numpy adds
up the rows' loss and gradient (the accumulator: all rows, or a sample of
``batch_fraction`` of them drawn from a stream seeded by the seed, the epoch and
the partition: mini-batch); the accumulators are summed in partition order and
the step is taken::

    w' = w - learning_rate * (gradient / total weight + reg * w)   (no penalty on the intercept)

Losses, with weights ``v`` (row weight times class weight) and ``V = sum v``:

- linear: ``sum v (x.w + b - y)^2 / (2 V) + reg/2 |w|^2``
- logistic (labels 0/1): ``sum v log(1 + exp(-(2y-1)(x.w + b))) / V + reg/2 |w|^2``

It stops after ``max_rounds``, when the coefficients move at most ``tol``, or
(Flink ML's TerminateOnMaxIterOrTol) when the loss is at most ``loss_tol``:
termination ``converged``. A loss or step that becomes NaN or infinite raises
``itf.DivergenceError`` naming the round. The loss of each round is the gauge
``loss`` in ``RoundProgress.metrics``.

``solver="lbfgs"`` runs another body on the same rows and kernel: Spark MLlib's
objective and optimizer (L-BFGS, OWL-QN with an L1 part), one evaluation per round
(``iterflow.ml.lbfgs_regression``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import iterflow as itf
from iterflow.ml import lbfgs, lbfgs_regression
from iterflow.ml.features import (
    PARTITION,
    Features,
    features_of,
    prepared_matrix,
    used_rows,
    vectors_as_arrays,
)
from iterflow.ml.regression_models import (
    LinearRegressionModel,
    LogisticRegressionModel,
    RegressionFit,
    short_form_params,
)
from iterflow.ml.regression_problem import (
    FitOptions,
    binary_labels,
    design,
    initial_coefficients,
    loss_sums,
    no_rows,
)
from iterflow.ml.training import MLError, ModelStep, model_field, worker_errors

MODEL_SCHEMA = "coefficients ARRAY<DOUBLE>, loss DOUBLE, change DOUBLE"


class GradientStep(ModelStep):
    """One step of gradient descent from ``coefficients`` (intercept last): the accumulator
    is the summed gradient, loss and weight of the rows (of the round's mini-batch), and the
    rows seen; the output is the model row after the step (the loss goes to the ``loss``
    gauge)."""

    def __init__(
        self, kind: str, coefficients: np.ndarray, options: FitOptions, epoch: int, loss: Any
    ) -> None:
        super().__init__(loss)
        self.kind = kind
        self.coefficients = coefficients
        self.learning_rate, self.reg = options.learning_rate, options.reg
        self.fit_intercept = options.fit_intercept
        self.fraction, self.seed, self.epoch = options.batch_fraction, options.seed, epoch

    def create_accumulator(self) -> tuple[Any, ...]:
        return np.zeros(len(self.coefficients)), 0.0, 0.0, 0

    def add_input(self, acc: tuple[Any, ...], batch: pa.RecordBatch) -> tuple[Any, ...]:
        gradient, loss, weight, seen = acc
        coefficients = self.coefficients
        x = prepared_matrix(batch, "x", len(coefficients) - 1)
        y, v = batch.column("y").to_numpy(), batch.column("v").to_numpy()
        if self.fraction < 1.0:
            # The partition's stream continues from the rows of its earlier batches.
            stream = np.random.PCG64([self.seed, self.epoch, batch.column("part")[0].as_py()])
            stream.advance(seen)
            keep = np.random.Generator(stream).random(batch.num_rows) < self.fraction
            x, y, v = x[keep], y[keep], v[keep]
        part_gradient, part_loss = loss_sums(self.kind, x, y, v, coefficients)
        return (
            gradient + part_gradient,
            loss + part_loss,
            weight + float(v.sum()),
            seen + batch.num_rows,
        )

    def extract_output(self, acc: tuple[Any, ...]) -> pa.Table:
        gradient, loss, weight, _ = acc
        if not weight > 0:
            raise MLError(no_rows(self.kind, self.fraction))
        coefficients, reg = self.coefficients, self.reg
        penalty = np.append(coefficients[:-1], 0.0)  # no penalty on the intercept
        total = max(weight, 1e-300)
        # A diverging run overflows here; the NaN or infinite change it gives is reported
        # as a DivergenceError naming the round, so numpy's warning would only be noise.
        with np.errstate(over="ignore", invalid="ignore"):
            loss = loss / total + 0.5 * reg * float(penalty @ penalty)
            step = self.learning_rate * (gradient / total + reg * penalty)
            if not self.fit_intercept:
                step[-1] = 0.0  # the intercept stays 0
            change = float(np.linalg.norm(step))
        self.loss.set(loss)
        return pa.table(
            [itf.vector_cell(coefficients - step), pa.array([loss]), pa.array([change])],
            names=["coefficients", "loss", "change"],
        )


def coefficients_of(model: DataFrame) -> np.ndarray:
    """The coefficients (intercept last) in a one-row model DataFrame."""
    return itf.vector(model, "coefficients").astype(np.float64)


def regression_body(
    options: FitOptions, prepare: Callable[[pa.Table], pa.Table]
) -> itf.IterationBody:
    """The gradient-descent body: ``model`` (variable, one row) and ``rows`` (data)."""
    loss_gauge = itf.metrics.gauge("loss")
    # tol=None still checks the step: a NaN or infinite step is a DivergenceError.
    tol = options.tol if options.tol is not None else 0.0
    # The rows with their partition, made once per run: ctx.columnar loads a DataFrame at
    # its first call, and over Spark Connect it knows a DataFrame by the object alone.
    numbered: dict[int, DataFrame] = {}

    @itf.body
    def gradient_descent(
        model: DataFrame, rows: DataFrame, ctx: itf.RoundContext
    ) -> itf.Declaration:
        current = coefficients_of(model)  # held on the driver: no Spark job
        if id(rows) not in numbered:
            numbered[id(rows)] = rows.withColumn(PARTITION, F.spark_partition_id())
        step = GradientStep(options.kind, current, options, ctx.epoch, loss_gauge)
        # depth 1: the accumulators of columnar data meet in one place (the driver, or one
        # task), where a tree would only change the order of the sums.
        data = ctx.columnar(numbered[id(rows)], prepare)
        new_model = itf.combine(data, step, MODEL_SCHEMA, depth=1)
        stop: itf.Condition = itf.converged(model_field("change"), tol)
        if options.loss_tol is not None:
            stop = stop | itf.converged(model_field("loss"), options.loss_tol)
        return itf.Declaration(
            feedback={"model": new_model}, outputs={"model": new_model}, until=stop
        )

    return gradient_descent


@attrs.frozen
class Problem:
    """A problem checked against its DataFrame: the rows it reads, their features, the
    columnar ``prepare`` step, and its options (with the initial coefficients resolved)."""

    rows: DataFrame
    spec: Features
    features: Sequence[str] | str
    prepare: Callable[[pa.Table], pa.Table]
    options: FitOptions

    def joins(self, other: Problem) -> bool:
        """Whether ``other`` can be fitted in this one's run: L-BFGS on both, the same
        kind, rows (features, label, weight, class weights) and run options."""
        mine, theirs = self.options, other.options
        return (
            mine.solver == theirs.solver == "lbfgs"
            and (mine.kind, mine.features, mine.label, mine.weight)
            == (theirs.kind, theirs.features, theirs.label, theirs.weight)
            and mine.class_weight == theirs.class_weight
            and mine.listen is theirs.listen
            and dict(mine.run_options) == dict(theirs.run_options)
        )


def problem_of(df: DataFrame, options: FitOptions, specs: dict[Any, Features]) -> Problem:
    """``options`` checked against ``df``: its columns, features and initial model.
    ``specs`` holds the features already read from ``df`` (``features_of`` runs a small
    Spark job for an array or Vector column), by the columns named."""
    wanted = [options.label, *([options.weight] if options.weight else [])]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise MLError(f"no column(s) {missing}; the columns are {df.columns}")
    who = "linear_svc()" if options.kind == "hinge" else f"{options.kind}_regression()"
    named = options.features if isinstance(options.features, str) else tuple(options.features)
    if named not in specs:
        specs[named] = features_of(df, options.features, who)
    spec = specs[named]
    rows = used_rows(df, [*spec.columns, options.label, options.weight], who)
    rows = vectors_as_arrays(rows, spec)
    prepare = design(spec, options.label, options.weight, options.class_weight)
    if options.kind != "linear":
        prepare = binary_labels(prepare, options.label)
    features = options.features if isinstance(options.features, str) else list(options.features)
    initial = initial_coefficients(options.initial, spec.dims, who)
    return Problem(rows, spec, features, prepare, attrs.evolve(options, initial=initial))


def fit_problem(df: DataFrame, options: FitOptions) -> RegressionFit:
    """Fit the problem ``options`` describes (linear, logistic, hinge) on ``df``'s rows."""
    return fit_problems(df, [options])[0]


def fit_problems(df: DataFrame, problems: Sequence[FitOptions]) -> list[RegressionFit]:
    """Fit every problem on ``df``'s rows, in order. L-BFGS problems that read the same
    rows the same way (``Problem.joins``: a grid over the penalty, the tolerance, the
    rounds or the start) run together, one run on one load of the rows, each with its own
    optimizer; the others run alone."""
    specs: dict[Any, Features] = {}  # a grid's maps read the same features: read them once
    checked = [problem_of(df, options, specs) for options in problems]
    groups: list[list[int]] = []
    for i, problem in enumerate(checked):
        group = next((g for g in groups if checked[g[0]].joins(problem)), None)
        if group is None:
            groups.append([i])
        else:
            group.append(i)
    fits: dict[int, RegressionFit] = {}
    for group in groups:
        together = [checked[i] for i in group]
        if together[0].options.solver == "lbfgs":
            fits.update(zip(group, _fit_lbfgs(together), strict=True))
        else:
            fits[group[0]] = _fit_gd(together[0])
    return [fits[i] for i in range(len(checked))]


def _fit_gd(problem: Problem) -> RegressionFit:
    options, initial = problem.options, problem.options.initial
    start = problem.rows.sparkSession.createDataFrame(
        pa.table(
            [
                itf.vector_cell(np.zeros(problem.spec.dims + 1) if initial is None else initial),
                pa.array([float("nan")]),
                pa.array([float("inf")]),
            ],
            names=["coefficients", "loss", "change"],
        ),
        MODEL_SCHEMA,
    )
    iteration = (
        itf.BoundedIteration(regression_body(options, problem.prepare))
        .bind("model", start)
        .bind("rows", problem.rows)
        .until(itf.max_rounds(options.max_rounds))
    )
    if options.listen is not None:
        iteration = iteration.listen(options.listen)
    with worker_errors():
        result = iteration.run(**options.run_options)
    final = coefficients_of(result.outputs["model"])
    losses = np.array([float(p.metrics["loss"]) for p in result.history])
    return RegressionFit(
        options.kind, final[:-1], float(final[-1]), problem.features, result, losses, result.rounds
    )


def _fit_lbfgs(together: list[Problem]) -> list[RegressionFit]:
    """One L-BFGS run of problems that join (``Problem.joins``): a model row each."""
    first = together[0]
    problems = [problem.options for problem in together]
    start = lbfgs_regression.start_model(first.rows.sparkSession, first.spec.dims, len(problems))
    iteration = (
        itf.BoundedIteration(lbfgs_regression.lbfgs_body(problems, first.prepare, first.spec.dims))
        .bind("model", start)
        .bind("rows", first.rows)
    )
    if first.options.listen is not None:
        iteration = iteration.listen(first.options.listen)
    with worker_errors():
        result = iteration.run(**first.options.run_options)
    rows = lbfgs_regression.model_rows(itf.to_arrow(result.outputs["model"]))
    return [_lbfgs_fit(problem, row, result) for problem, row in zip(together, rows, strict=True)]


def _lbfgs_fit(problem: Problem, row: dict[str, Any], result: itf.IterationResult) -> RegressionFit:
    final = np.array(row["coefficients"], dtype=np.float64)
    history = np.array(row["objective_history"], dtype=np.float64)
    if row["status"] == lbfgs.SEARCH_FAILED:
        warnings.warn(
            f"L-BFGS stopped after {len(history) - 1} iterations: its line search failed "
            "twice in a row (the objective may be badly scaled); the coefficients are the "
            "last accepted ones",
            itf.IterflowWarning,
            stacklevel=4,
        )
    return RegressionFit(
        problem.options.kind,
        final[:-1],
        float(final[-1]),
        problem.features,
        result,
        history,
        max(len(history) - 1, 0),
        str(row["status"]),
    )


def linear_regression(
    df: DataFrame,
    *,
    features: Sequence[str] | str = "features",
    label: str = "label",
    weight: str | None = None,
    solver: str = "lbfgs",
    reg: float = 0.0,
    elastic_net: float = 0.0,
    standardization: bool | None = None,
    fit_intercept: bool = True,
    max_rounds: int = 100,
    tol: float | None = 1e-6,
    initial: Any = None,
    learning_rate: float = 0.1,
    loss_tol: float | None = None,
    batch_fraction: float = 1.0,
    seed: int = 0,
    memory: int = 10,
    listen: Any = None,
    **run_options: Any,
) -> LinearRegressionModel:
    """Least squares (ridge, lasso, elastic net) with MLlib's defaults: Spark MLlib's
    ``LinearRegression(solver="l-bfgs")`` objective (``reg``, ``elastic_net``,
    ``standardization``) minimized by L-BFGS, or OWL-QN with an L1 part; ``max_rounds``
    counts its iterations and ``tol`` is MLlib's (``iterflow.ml.lbfgs_regression``).
    ``solver="gd"`` runs gradient descent (``learning_rate``, ``batch_fraction``,
    ``loss_tol``; L2 only, on the features as they are; see the module docstring);
    ``standardization`` is MLlib's, True unless ``solver="gd"``.
    ``initial`` starts from a fitted model (iterflow's or MLlib's) or coefficients.

    Returns the ``LinearRegressionModel`` that the ``LinearRegression`` Estimator fits.

    Example::

        model = linear_regression(df, features=["x1", "x2"], label="y", reg=0.01)
        model.coefficients, model.intercept, model.summary.objectiveHistory
    """
    options = FitOptions(
        kind="linear",
        features=features,
        label=label,
        weight=weight,
        learning_rate=learning_rate,
        reg=reg,
        max_rounds=max_rounds,
        tol=tol,
        loss_tol=loss_tol,
        batch_fraction=batch_fraction,
        seed=seed,
        listen=listen,
        run_options=run_options,
        solver=solver,
        elastic_net=elastic_net,
        standardization=standardization,
        fit_intercept=fit_intercept,
        memory=memory,
        initial=initial,
    )
    model = LinearRegressionModel(fit_problem(df, options))
    return model._set_checked(short_form_params(attrs.asdict(options, recurse=False)))


def logistic_regression(
    df: DataFrame,
    *,
    features: Sequence[str] | str = "features",
    label: str = "label",
    weight: str | None = None,
    class_weight: Mapping[Any, float] | None = None,
    solver: str = "lbfgs",
    reg: float = 0.0,
    elastic_net: float = 0.0,
    standardization: bool | None = None,
    fit_intercept: bool = True,
    max_rounds: int = 100,
    tol: float | None = 1e-6,
    threshold: float = 0.5,
    initial: Any = None,
    learning_rate: float = 0.5,
    loss_tol: float | None = None,
    batch_fraction: float = 1.0,
    seed: int = 0,
    memory: int = 10,
    listen: Any = None,
    **run_options: Any,
) -> LogisticRegressionModel:
    """Binary logistic regression (labels 0 and 1) with MLlib's defaults: Spark MLlib's
    ``LogisticRegression`` objective (``reg``, ``elastic_net``, ``standardization``)
    minimized as MLlib does, by L-BFGS or OWL-QN; ``max_rounds`` counts its iterations and
    ``tol`` is MLlib's. ``class_weight`` maps a label to a factor on its rows' weights.
    ``solver="gd"`` runs gradient descent (see the module docstring). ``initial`` starts
    from a fitted model (iterflow's or MLlib's) or coefficients.

    Returns the ``LogisticRegressionModel`` that the ``LogisticRegression`` Estimator
    fits: ``transform`` adds MLlib's columns, ``prediction`` the label (0.0 or 1.0, by
    ``threshold``) and ``probability`` the Vector ``[1 - p, p]``.

    Example::

        model = logistic_regression(df, features=["x1", "x2"], label="clicked", reg=0.01)
        model.transform(df).select("probability", "prediction")
        model.summary.objectiveHistory, model.summary.totalIterations, model.stop_reason
    """
    options = FitOptions(
        kind="logistic",
        features=features,
        label=label,
        weight=weight,
        class_weight=class_weight,
        learning_rate=learning_rate,
        reg=reg,
        max_rounds=max_rounds,
        tol=tol,
        loss_tol=loss_tol,
        batch_fraction=batch_fraction,
        seed=seed,
        listen=listen,
        run_options=run_options,
        solver=solver,
        elastic_net=elastic_net,
        standardization=standardization,
        fit_intercept=fit_intercept,
        memory=memory,
        initial=initial,
    )
    model = LogisticRegressionModel(fit_problem(df, options))
    values = short_form_params(attrs.asdict(options, recurse=False))
    return model._set_checked({**values, "threshold": threshold})
