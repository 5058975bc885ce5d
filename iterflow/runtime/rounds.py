"""What both loops do with one round's Declaration: check it, and report failures by epoch."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn

import attrs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from iterflow.body import Declaration, IterationBody, RoundContext
from iterflow.errors import (
    IterflowError,
    IterflowTypeError,
    IterflowValueError,
    IterflowWarning,
    RoundError,
)
from iterflow.progress.listeners import Emitter, RoundEnd
from iterflow.progress.round import RoundProgress
from iterflow.runtime.materialize import Materialized, materialize
from iterflow.runtime.schema import is_numeric, schema_differences
from iterflow.termination import Condition, Converged, Empty, flatten

#: A variable that had at most this many rows in the previous round is collected rather
#: than checkpointed: the next body (and a commit) reads it without a Spark job...
DRIVER_ROWS = 1_000
#: ... (the Spark setting that changes it; 0 checkpoints every variable) ...
DRIVER_ROWS_CONF = "spark.iterflow.driverRows"
#: ... unless it took more than this many bytes on the driver (one row can be a long vector).
DRIVER_BYTES = 64 << 20


def driver_rows(spark: SparkSession) -> int:
    """The largest variable (in rows) held on the driver between rounds: ``DRIVER_ROWS_CONF``."""
    setting = spark.conf.get(DRIVER_ROWS_CONF, None)
    if setting is None:
        return DRIVER_ROWS
    try:
        limit = int(setting)
    except ValueError:
        limit = -1
    if limit < 0:
        raise IterflowValueError(
            f"{DRIVER_ROWS_CONF}={setting!r}: use a row count (0 keeps every variable in Spark)"
        )
    return limit


def local_rows(inputs: Mapping[str, DataFrame], limit: int) -> dict[str, int]:
    """Rows of the ``inputs`` that are rows on the driver already (local relations, such
    as a model made with ``createDataFrame``), counted without a Spark job, up to
    ``limit + 1``: what round 0 goes by to hold its feedback on the driver."""
    if limit <= 0:
        return {}
    return {name: len(df.limit(limit + 1).collect()) for name, df in inputs.items() if df.isLocal()}


def small_variables(
    names: Collection[str], rows: Mapping[str, int], tables: Mapping[str, Any], limit: int
) -> list[str]:
    """The variables among ``names`` held on the driver this round: those whose previous
    round had at most ``limit`` rows (unknown counts, as at round 0, do not) and, when
    held on the driver (``tables``), at most ``DRIVER_BYTES`` bytes."""
    return [
        name
        for name in names
        if rows.get(name, limit + 1) <= limit
        and (name not in tables or tables[name].nbytes <= DRIVER_BYTES)
    ]


def fail(epoch: int, stage: str, exc: BaseException) -> NoReturn:
    """Re-raise ``exc`` from round ``epoch``; iterflow's own errors pass unchanged."""
    if isinstance(exc, IterflowError):
        raise exc
    raise RoundError(epoch, stage, exc) from exc


@attrs.frozen
class RoundPlan:
    """One checked round: its Declaration and the termination leaves that apply."""

    declaration: Declaration
    conditions: tuple[Condition, ...]

    @property
    def criteria(self) -> list[Empty]:
        return [c for c in self.conditions if isinstance(c, Empty)]

    @property
    def convergence(self) -> list[Converged]:
        return [c for c in self.conditions if isinstance(c, Converged)]


class DeclarationCheck:
    """Checks each round's Declaration against the body's inputs, before any Spark job runs.

    Round 0's feedback names fix the iteration's variables (``variable_names``);
    later rounds must declare the same ones. ``fixed`` inputs may not receive
    feedback (bounded: inputs bound with ``replay=True``).
    """

    def __init__(
        self,
        body_name: str,
        schemas: Mapping[str, StructType],
        conditions: tuple[Condition, ...] = (),
        fixed: Collection[str] = (),
        fixed_reason: str = "",
    ) -> None:
        self.body_name = body_name
        self.schemas = dict(schemas)
        self.conditions = conditions
        self.fixed = set(fixed)
        self.fixed_reason = fixed_reason
        self.variable_names: tuple[str, ...] | None = None

    def aligned(self, name: str, df: DataFrame) -> DataFrame:
        """``df`` with the columns in the order of input ``name``."""
        order = self.schemas[name].fieldNames()
        return df if df.columns == order else df.select(*order)

    def check(self, epoch: int, declaration: Any) -> RoundPlan:
        where = f"epoch {epoch}: body '{self.body_name}'"
        if not isinstance(declaration, Declaration):
            raise IterflowTypeError(
                f"{where} returned {type(declaration).__name__}; "
                "return itf.Declaration(feedback=..., outputs=..., until=...)"
            )
        for name in declaration.feedback:
            if name not in self.schemas:
                raise IterflowValueError(
                    f"{where}: feedback '{name}' is not an input; feedback names must be "
                    f"input names {list(self.schemas)} (use outputs= for results)"
                )
        names = tuple(declaration.feedback)
        if self.variable_names is None:
            fixed = sorted(set(names) & self.fixed)
            if fixed:
                raise IterflowValueError(f"{where}: input '{fixed[0]}' {self.fixed_reason}")
            self.variable_names = names
        elif set(names) != set(self.variable_names):
            raise IterflowValueError(
                f"{where}: declared feedback for {sorted(names)} but round 0 declared "
                f"{sorted(self.variable_names)}; declare the same feedback names every round"
            )
        for name, df in declaration.feedback.items():
            problems = schema_differences(self.schemas[name], df.schema)
            if problems:
                raise IterflowValueError(
                    f"{where}: feedback '{name}' does not match the schema of input "
                    f"'{name}': " + "; ".join(problems)
                )
        conditions = (*self.conditions, *flatten([declaration.until]))
        for condition in conditions:
            if isinstance(condition, Converged) and not callable(condition.value):
                fields = condition.value.schema.fields
                if len(fields) != 1 or not is_numeric(fields[0].dataType):
                    described = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in fields)
                    raise IterflowValueError(
                        f"{where}: the convergence value must have one numeric column, "
                        f"it has ({described})"
                    )
        return RoundPlan(declaration, conditions)

    def warn_unbounded(self, epoch: int, plan: RoundPlan) -> None:
        """A bounded iteration with nothing but empty feedback to stop it gets a warning."""
        if epoch == 0 and not plan.conditions and plan.declaration.feedback:
            warnings.warn(
                f"body '{self.body_name}' has no max_rounds, criteria, convergence or "
                "predicate condition; it stops only when its feedback is empty",
                IterflowWarning,
                stacklevel=7,  # the user's run() call
            )


@attrs.frozen
class EvaluatedRound:
    """A round's body called, its Declaration checked and materialized."""

    plan: RoundPlan
    done: Materialized
    variables: dict[str, DataFrame]  # feedback, materialized, columns in input order
    outputs: dict[str, DataFrame]  # materialized
    rows: dict[str, int]  # of each feedback and output
    produced: list[DataFrame]  # what the round holds until the next one completes
    tables: dict[str, Any]  # the variables materialized on the driver, as pyarrow Tables

    def round_end(
        self,
        ctx: RoundContext,
        inputs: Mapping[str, DataFrame],
        progress: RoundProgress,
        emitter: Emitter,
    ) -> RoundEnd:
        """What listeners (and convergence callables) receive about this round."""
        return RoundEnd(
            epoch=ctx.epoch,
            epoch_watermark=ctx.epoch,
            inputs=inputs,
            variables=self.variables,
            outputs=self.outputs,
            progress=progress,
            state=ctx.state,
            emitter=emitter,
        )


def evaluate_round(
    body: IterationBody,
    inputs: Mapping[str, DataFrame],
    ctx: RoundContext,
    check: DeclarationCheck,
    plan_of: Callable[[Any], RoundPlan],
    on_driver: Collection[str] = (),
) -> EvaluatedRound:
    """Call ``body`` for round ``ctx.epoch``, check its Declaration with ``plan_of``, and
    materialize its feedback, outputs, criteria and convergence values (the feedback of
    the variables named in ``on_driver`` as rows on the driver)."""
    epoch = ctx.epoch
    try:
        declaration = body(inputs, ctx)
    except Exception as exc:
        fail(epoch, f"body '{body.name}'", exc)
    plan = plan_of(declaration)
    feedback, outputs = plan.declaration.feedback, plan.declaration.outputs
    try:
        done = materialize(
            targets=[*feedback.values(), *outputs.values()],
            criteria=[c.criteria for c in plan.criteria],
            values=[c.value for c in plan.convergence if not callable(c.value)],
            epoch=epoch,
            on_driver={id(df) for name, df in feedback.items() if name in on_driver},
        )
    except Exception as exc:
        fail(epoch, "materialization", exc)
    return EvaluatedRound(
        plan=plan,
        done=done,
        variables={name: check.aligned(name, done.frames[id(df)]) for name, df in feedback.items()},
        outputs={name: done.frames[id(df)] for name, df in outputs.items()},
        rows={name: done.rows[id(df)] for name, df in [*feedback.items(), *outputs.items()]},
        produced=list({id(df): df for df in done.frames.values()}.values()),
        tables={  # in the input's column order, like ``variables``
            name: done.tables[id(df)].select(check.schemas[name].fieldNames())
            for name, df in feedback.items()
            if id(df) in done.tables
        },
    )
