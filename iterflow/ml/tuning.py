"""``HalvingCrossValidator``: ``CrossValidator`` with successive halving over rounds.

Every ParamMap of the grid starts, on every fold, with a small budget of rounds (the
Estimator's ``maxIter``). After each rung, the best ``1/factor`` of the candidates by
their mean validation metric go on with ``factor`` times the budget, and the others stop
there; the last candidate standing (or the best of the rung that reached ``maxRounds``)
is the winner, fitted on the whole dataset with ``maxRounds`` rounds, as
``CrossValidator`` fits its best. An Estimator with ``initialModel`` (iterflow's) goes on
from where its previous rung's model stopped on the same fold, so a survivor pays only
for its extra rounds; others are fitted again with the larger budget. A fit that
converged before its budget (its run stopped by its own rule) is not fitted again: its
metric stands in the later rungs. A fold's candidates of a rung are fitted by the
Estimator's ``fitMultiple``: iterflow's regressions fit them together, in one run on one
load of the fold's rows.

With ``n`` ParamMaps, ``E = ceil(log(n) / log(factor))`` rungs eliminate candidates;
``minRounds`` defaults to ``maxRounds / factor**E`` (at least 1) and ``maxRounds`` to the
Estimator's own ``maxIter``. The fitted ``CrossValidatorModel`` has ``avgMetrics`` (and
``stdMetrics``) for the finalists, the ParamMaps of the last rung (NaN for those stopped
earlier), and ``rungs``: every rung's budget and each candidate's mean metric.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from multiprocessing.pool import ThreadPool
from typing import Any

import attrs
import numpy as np
from pyspark import inheritable_thread_target
from pyspark.ml import Estimator, Model, Pipeline
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.tuning import (
    CrossValidator,
    CrossValidatorModel,
    CrossValidatorReader,
    _ValidatorSharedReadWrite,
)
from pyspark.ml.util import DefaultParamsReader
from pyspark.sql import DataFrame

from iterflow.ml import lbfgs
from iterflow.ml.params import MLParams, keyword_params, param
from iterflow.ml.training import MLError


@attrs.frozen
class Rung:
    """One rung: the rounds each candidate had, and each one's mean validation metric
    (by its index in ``estimatorParamMaps``)."""

    rounds: int
    metrics: dict[int, float]


class HalvingParams(MLParams):
    """``factor``, ``minRounds`` and ``maxRounds``: see the module docstring."""

    factor: Param[int] = param(
        Params._dummy(),
        "factor",
        "each rung keeps 1/factor of the candidates and gives them factor times the rounds",
        TypeConverters.toInt,
    )
    minRounds: Param[int] = param(
        Params._dummy(),
        "minRounds",
        "the rounds of the first rung (default: maxRounds / factor**rungs)",
        TypeConverters.toInt,
    )
    maxRounds: Param[int] = param(
        Params._dummy(),
        "maxRounds",
        "the most rounds a candidate gets, and the winner's (default: the Estimator's maxIter)",
        TypeConverters.toInt,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(factor=3)


class HalvingCrossValidator(CrossValidator, HalvingParams):
    """K-fold cross validation with successive halving over rounds: see the module
    docstring. CrossValidator's Params (``estimator``, ``estimatorParamMaps``,
    ``evaluator``, ``numFolds``, ``seed``, ``parallelism``, ``foldCol``) plus ``factor=3``,
    ``minRounds`` and ``maxRounds``.

    Example::

        grid = ParamGridBuilder().addGrid(lr.regParam, [0.001, 0.01, 0.1]).build()
        cv = HalvingCrossValidator(estimator=lr, estimatorParamMaps=grid,
                                   evaluator=BinaryClassificationEvaluator(), numFolds=3)
        model = cv.fit(df)
        model.bestModel, model.avgMetrics, model.rungs
    """

    @keyword_params
    def __init__(
        self,
        *,
        estimator: Estimator[Any] | None = None,
        estimatorParamMaps: list[dict[Param[Any], Any]] | None = None,
        evaluator: Any = None,
        numFolds: int = 3,
        seed: int | None = None,
        parallelism: int = 1,
        collectSubModels: bool = False,
        foldCol: str = "",
        factor: int = 3,
        minRounds: int | None = None,
        maxRounds: int | None = None,
    ) -> None:
        super().__init__()

    def setParams(self, **kwargs: Any) -> HalvingCrossValidator:
        """Sets the Params given by name (an unknown one is an ``MLError``)."""
        return self._set_checked(kwargs)

    @classmethod
    def read(cls) -> CrossValidatorReader:
        return HalvingReader(cls)

    def _fit(self, dataset: DataFrame) -> CrossValidatorModel:
        estimator = self.getOrDefault(self.estimator)
        maps: list[dict[Param[Any], Any]] = list(self.getEstimatorParamMaps())
        evaluator = self.getOrDefault(self.evaluator)
        if self.getCollectSubModels():
            raise MLError("HalvingCrossValidator does not collect sub-models")
        rounds = rounds_param(estimator, maps)
        plan, most = self._plan(estimator, rounds, len(maps))
        folds = self._kFold(dataset)
        rungs, scores = self._rungs(estimator, rounds, maps, evaluator, folds, plan)
        last = rungs[-1].metrics
        pick = max if evaluator.isLargerBetter() else min
        best = pick(last, key=lambda j: last[j])
        winner = estimator.fit(dataset, {**maps[best], rounds: most})
        averages = [last.get(j, math.nan) for j in range(len(maps))]
        spreads = [float(np.std(scores[j])) if j in last else math.nan for j in range(len(maps))]
        model = self._copyValues(CrossValidatorModel(winner, averages, None, spreads))
        setattr(model, "rungs", rungs)  # noqa: B010 (CrossValidatorModel declares no such name)
        return model

    def _plan(self, estimator: Any, rounds: Param[Any], candidates: int) -> tuple[list[int], int]:
        """The rounds of every rung (``minRounds * factor**r`` up to ``maxRounds``), and
        ``maxRounds``."""
        factor = int(self.getOrDefault(self.factor))
        if factor < 2:
            raise MLError(f"HalvingCrossValidator(factor={factor}) needs factor >= 2")
        most = self.getOrDefault(self.maxRounds) if self.isDefined(self.maxRounds) else None
        if most is None:
            most = int(owner_of(estimator, rounds).getOrDefault(rounds))
        eliminations = max(1, math.ceil(math.log(max(candidates, 2)) / math.log(factor)))
        least = self.getOrDefault(self.minRounds) if self.isDefined(self.minRounds) else None
        if least is None:
            least = max(1, round(most / factor**eliminations))
        if not 1 <= least <= most:
            raise MLError(
                f"HalvingCrossValidator: need 1 <= minRounds ({least}) <= maxRounds ({most})"
            )
        plan = [least]
        while plan[-1] < most and len(plan) <= eliminations:
            plan.append(min(plan[-1] * factor, most))
        return plan, int(most)

    def _rungs(
        self,
        estimator: Any,
        rounds: Param[Any],
        maps: Sequence[dict[Param[Any], Any]],
        evaluator: Any,
        folds: list[tuple[DataFrame, DataFrame]],
        plan: list[int],
    ) -> tuple[list[Rung], dict[int, list[float]]]:
        factor = int(self.getOrDefault(self.factor))
        warm = estimator.hasParam("initialModel") and not isinstance(estimator, Pipeline)
        alive = list(range(len(maps)))
        previous: dict[tuple[int, int], Model] = {}
        settled: dict[tuple[int, int], float] = {}  # converged fits: their metric stands
        rungs: list[Rung] = []
        scores: dict[int, list[float]] = {}
        done = 0
        for budget in plan:
            if rungs and len(alive) == 1:
                break  # the last candidate standing: the winner
            results = []
            for f, (train, validation) in enumerate(folds):
                # One fold cached at a time, as CrossValidator does (all folds at once
                # hold numFolds copies of the rows).
                with cached(train) as rows, cached(validation) as held:
                    # A fit that converged before its budget: more rounds change nothing.
                    results += [
                        (j, f, previous[(j, f)], settled[(j, f)])
                        for j in alive
                        if (j, f) in settled
                    ]
                    fresh = [j for j in alive if (j, f) not in settled]
                    extras = []
                    for j in fresh:
                        extra = {**maps[j], rounds: budget}
                        if warm and (j, f) in previous:
                            initial = estimator.getParam("initialModel")
                            extra = {**extra, rounds: budget - done, initial: previous[(j, f)]}
                        extras.append(extra)
                    results += self._fold(estimator, extras, fresh, f, rows, held, evaluator, maps)
            scores = {j: [] for j in alive}
            for j, f, model, metric in results:
                scores[j].append(float(metric))
                if converged(model):
                    settled[(j, f)] = float(metric)
                previous[(j, f)] = released(model)
            means = {j: float(np.mean(scores[j])) for j in alive}
            rungs.append(Rung(budget, means))
            done = budget
            keep = max(1, math.ceil(len(alive) / factor))
            ranked = sorted(alive, key=lambda j: means[j], reverse=evaluator.isLargerBetter())
            alive = sorted(ranked[:keep])
        return rungs, scores

    def _fold(
        self,
        estimator: Any,
        extras: list[dict[Param[Any], Any]],
        candidates: list[int],
        fold: int,
        train: DataFrame,
        validation: DataFrame,
        evaluator: Any,
        maps: Sequence[dict[Param[Any], Any]],
    ) -> list[tuple[int, int, Model, float]]:
        """The ``candidates`` fitted on a fold's ``train`` (with their ``extras``) and
        evaluated on its ``validation``. ``fitMultiple``, as ``CrossValidator`` calls it:
        iterflow's regressions fit the candidates together, on one load of the rows; the
        evaluations run ``parallelism`` at a time."""
        models = estimator.fitMultiple(train, extras)

        def evaluated(_: int) -> tuple[int, int, Model, float]:
            index, model = next(models)
            j = candidates[index]
            return j, fold, model, evaluator.evaluate(model.transform(validation, maps[j]))

        workers = max(1, min(self.getParallelism(), len(candidates)))
        with ThreadPool(processes=workers) as pool:
            target = inheritable_thread_target(train.sparkSession)(evaluated)
            return list(pool.map(target, range(len(candidates))))


def released(model: Any) -> Any:
    """``model`` without its run (an iterflow model's ``result``): a rung keeps a model
    per candidate and fold to go on from, and their runs would hold their rows' data."""
    if getattr(model, "result", None) is not None:
        model.result = None
    return model


@contextlib.contextmanager
def cached(df: DataFrame) -> Iterator[DataFrame]:
    """``df`` cached while the block runs, then unpersisted."""
    df = df.cache()
    try:
        yield df
    finally:
        df.unpersist()


def converged(model: Any) -> bool:
    """Whether an iterflow model's run stopped by its convergence rule (not its rounds):
    a later rung would give it more rounds it does not use. A Pipeline's last stage
    counts; other models never are."""
    stages = getattr(model, "stages", None)
    model = stages[-1] if stages else model
    if not getattr(model, "hasSummary", False):
        return False
    if hasattr(model, "stop_reason"):  # L-BFGS: the optimizer's own reason
        return model.stop_reason in (lbfgs.FUNCTION_VALUES, lbfgs.GRADIENT)
    termination = getattr(model, "termination", None)
    return termination is not None and termination.reason == "converged"


def owner_of(estimator: Any, rounds: Param[Any]) -> Any:
    """The Estimator (a Pipeline's stage, or itself) that has ``rounds``."""
    if isinstance(estimator, Pipeline):
        for stage in estimator.getStages():
            if stage.hasParam(rounds.name) and stage.getParam(rounds.name) == rounds:
                return stage
    return estimator


def rounds_param(estimator: Any, maps: Sequence[dict[Param[Any], Any]]) -> Param[Any]:
    """The Param that counts rounds: ``maxIter`` of the Estimator, or of the last stage of
    a Pipeline that has one; the grid must not set it."""
    owners = estimator.getStages() if isinstance(estimator, Pipeline) else [estimator]
    found = [stage.getParam("maxIter") for stage in owners if stage.hasParam("maxIter")]
    if not found:
        raise MLError(
            f"HalvingCrossValidator needs an Estimator with maxIter (its rounds); "
            f"{type(estimator).__name__} has none"
        )
    rounds = found[-1]
    if any(rounds in grid for grid in maps):
        raise MLError(
            "HalvingCrossValidator gives the rounds (maxIter) itself: take maxIter out of "
            "the grid (set maxRounds instead)"
        )
    return rounds


class HalvingReader(CrossValidatorReader):
    """Reads a saved ``HalvingCrossValidator`` (CrossValidator's reader makes a plain
    ``CrossValidator``, and takes a metadata class outside ``pyspark.ml`` for the JVM's
    writer)."""

    def load(self, path: str) -> HalvingCrossValidator:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        # Written by pyspark.ml's Python writer: read it as such.
        as_python = {**metadata, "class": "pyspark.ml.tuning.CrossValidator"}
        _, estimator, evaluator, maps = _ValidatorSharedReadWrite.load(
            path, self.sparkSession, as_python
        )
        halving = HalvingCrossValidator(
            estimator=estimator, estimatorParamMaps=maps, evaluator=evaluator
        )
        halving._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(halving, metadata, skipParams=["estimatorParamMaps"])
        return halving
