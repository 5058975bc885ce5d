"""Linear support vector machines as MLlib's ``LinearSVC`` fits them: the hinge loss with
an L2 penalty, minimized by OWL-QN (with no L1 part, as MLlib runs it) on the
standardized features, one evaluation of the objective per round.

It shares the L-BFGS body of the regressions (``iterflow.ml.lbfgs_regression``): round 0
measures the rows (weight, every feature's mean and sigma), every later round evaluates
``sum v max(0, 1 - (2y - 1)(x.w + b)) / sum v + reg/2 |w|^2`` (penalty on the
standardized coefficients, or with ``standardization=False`` on the raw ones as MLlib
does) and its subgradient over the resident rows, and the optimizer lives in the
one-row model, so a run resumes from its checkpoint. ``LinearSVCModel.transform`` adds
``rawPrediction`` ``[-m, m]`` and ``prediction`` (1.0 when the margin ``m`` is above
``threshold``, 0.0 by default), as MLlib's; it saves in MLlib's format both ways.
"""

from __future__ import annotations

from typing import Any

import attrs
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasFitIntercept,
    HasLabelCol,
    HasMaxIter,
    HasPredictionCol,
    HasRawPredictionCol,
    HasRegParam,
    HasStandardization,
    HasThreshold,
    HasTol,
    HasWeightCol,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StructField, StructType

from iterflow.ml.params import MLParams
from iterflow.ml.regression import fit_problem
from iterflow.ml.regression_models import FittedRegression, short_form_params
from iterflow.ml.regression_problem import FitOptions


class LinearSVCParams(
    MLParams,
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasRawPredictionCol,
    HasMaxIter,
    HasTol,
    HasRegParam,
    HasFitIntercept,
    HasStandardization,
    HasWeightCol,
    HasThreshold,
):
    """The Params of ``LinearSVC`` and its model, as MLlib names them, with its defaults."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            maxIter=100,
            tol=1e-6,
            regParam=0.0,
            fitIntercept=True,
            standardization=True,
            threshold=0.0,
        )


class LinearSVCModel(FittedRegression, LinearSVCParams):
    """A fitted ``LinearSVC``: ``coefficients``, ``intercept``, ``numFeatures``,
    ``numClasses``, ``predict``, ``predictRaw``, ``summary`` (``objectiveHistory``,
    ``totalIterations``) and iterflow's run. Saved, it loads with MLlib's
    ``pyspark.ml.classification.LinearSVCModel``."""

    mllib_class = "pyspark.ml.classification.LinearSVCModel"

    @property
    def numClasses(self) -> int:
        return 2

    def predict(self, value: Any) -> Any:
        """One point: 1.0 when its margin is above ``threshold``, else 0.0. A DataFrame:
        ``transform``."""
        if isinstance(value, DataFrame):
            return self.transform(value)
        return 1.0 if self._point_margin(value) > self.getThreshold() else 0.0

    def _transform(self, dataset: DataFrame) -> DataFrame:
        margin = self._margin(dataset)
        out = dataset
        if self.getRawPredictionCol():
            raw = array_to_vector(F.array(-margin, margin))
            out = out.withColumn(self.getRawPredictionCol(), raw)
        if self.getPredictionCol():
            label = F.when(margin > F.lit(self.getThreshold()), 1.0).otherwise(0.0)
            out = out.withColumn(self.getPredictionCol(), label)
        return out

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        schema = StructType(
            [StructField("coefficients", VectorUDT()), StructField("intercept", DoubleType())]
        )
        return spark.createDataFrame([(self.coefficients, float(self.intercept))], schema)


def linear_svc(
    df: DataFrame,
    *,
    features: Any = "features",
    label: str = "label",
    weight: str | None = None,
    reg: float = 0.0,
    standardization: bool = True,
    fit_intercept: bool = True,
    max_rounds: int = 100,
    tol: float | None = 1e-6,
    threshold: float = 0.0,
    initial: Any = None,
    memory: int = 10,
    listen: Any = None,
    **run_options: Any,
) -> LinearSVCModel:
    """A linear SVM (labels 0 and 1) with MLlib's defaults: see the module docstring.
    ``max_rounds`` counts the optimizer's iterations (MLlib's ``maxIter``) and ``tol`` is
    MLlib's; ``initial`` starts from a fitted model (iterflow's or MLlib's) or
    coefficients. Returns the ``LinearSVCModel`` that the ``LinearSVC`` Estimator fits.

    Example::

        model = linear_svc(df, reg=0.01)            # "features" (a Vector), "label"
        model.coefficients, model.intercept, model.summary.totalIterations
        model.transform(df).select("rawPrediction", "prediction")
    """
    options = FitOptions(
        kind="hinge",
        features=features,
        label=label,
        weight=weight,
        learning_rate=1.0,
        reg=reg,
        max_rounds=max_rounds,
        tol=tol,
        loss_tol=None,
        batch_fraction=1.0,
        seed=0,
        listen=listen,
        run_options=run_options,
        solver="lbfgs",
        standardization=standardization,
        fit_intercept=fit_intercept,
        memory=memory,
        initial=initial,
    )
    model = LinearSVCModel(fit_problem(df, options))
    values = short_form_params(attrs.asdict(options, recurse=False))
    kept = {name: value for name, value in values.items() if model.hasParam(name)}
    return model._set_checked({**kept, "threshold": threshold})
