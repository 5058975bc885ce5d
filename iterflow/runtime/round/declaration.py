"""A round's Declaration checked against the body's inputs: the round plan."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import attrs
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from iterflow.body import Declaration
from iterflow.errors import IterflowTypeError, IterflowValueError, warn
from iterflow.runtime.spark.schema import is_numeric, schema_differences
from iterflow.termination import Condition, Converged, Empty, flatten


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
            warn(
                f"body '{self.body_name}' has no max_rounds, criteria, convergence or "
                "predicate condition; it stops only when its feedback is empty"
            )

    def check_unbounded(
        self, epoch: int, state_names: Collection[str], sinks: Collection[str], declaration: Any
    ) -> RoundPlan:
        """``check`` for an unbounded iteration, which ends with its inputs (no ``until``),
        needs feedback for every state variable, and an output for every sink."""
        plan = self.check(epoch, declaration)
        where = f"epoch {epoch}: body '{self.body_name}'"
        if plan.conditions:
            raise IterflowValueError(
                f"{where} declared until=...; an unbounded iteration ends when its inputs "
                "end and no work feedback is in flight, or on stop(). Drop until=, or run "
                "the body as a BoundedIteration"
            )
        variables = set(plan.declaration.feedback)
        for name in sorted(set(state_names) - variables):
            raise IterflowValueError(
                f"{where}: input '{name}' is bound with state=True but the body declares no "
                f"feedback for it; return feedback={{'{name}': ...}} or drop state=True"
            )
        return self.check_sinks(epoch, sinks, plan)

    def check_sinks(self, epoch: int, sinks: Collection[str], plan: RoundPlan) -> RoundPlan:
        """``plan``, when the round declared an output for every sink."""
        outputs = plan.declaration.outputs
        for name in sorted(set(sinks) - set(outputs)):
            raise IterflowValueError(
                f"epoch {epoch}: body '{self.body_name}': sink '{name}' has no output "
                f"'{name}'; the body's outputs are {sorted(outputs)}. Declare it in outputs= "
                "or sink one of those"
            )
        return plan
