"""k-means, linear and logistic regression as ``pyspark.ml`` Estimators, with MLlib's Params.

They run the short forms ``kmeans`` (``iterflow.ml.kmeans``), ``linear_regression`` and
``logistic_regression`` (``iterflow.ml.regression``) and fit in a ``Pipeline`` after
``VectorAssembler`` or ``StandardScaler``, tune with ``CrossValidator``, and save and load
(a ``PipelineModel`` holding them too)::

    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    from iterflow.ml import LogisticRegression

    lr = LogisticRegression(maxIter=100, regParam=0.01).setIterationOptions(progress=True)
    model = Pipeline(stages=[VectorAssembler(inputCols=names, outputCol="features"), lr]).fit(df)
    model.transform(df).select("rawPrediction", "probability", "prediction")

The fitted regressions' ``transform`` adds MLlib's columns: ``predictionCol`` (and, for
logistic regression, ``rawPredictionCol`` and ``probabilityCol`` as Vectors), computed
by Spark SQL expressions (no Python worker). ``KMeans`` fits a ``KMeansModel``, the class
that ``kmeans()`` returns too (``iterflow.ml.kmeans``). ``summary`` has MLlib's
``objectiveHistory`` and ``totalIterations``, and iterflow's run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import DenseVector, Vectors
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasElasticNetParam,
    HasFeaturesCol,
    HasFitIntercept,
    HasLabelCol,
    HasMaxIter,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasRegParam,
    HasStandardization,
    HasThreshold,
    HasTol,
    HasWeightCol,
)
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iterflow.ml.features import linear_score
from iterflow.ml.kmeans import KMeansModel, KMeansParams, kmeans
from iterflow.ml.params import (
    IterationOptions,
    SavedModel,
    TrainingSummary,
    choice,
    param,
    weight_column,
)
from iterflow.ml.regression import RegressionModel, linear_regression, logistic_regression
from iterflow.ml.training import Fitted, MLError

#: ``solver`` values: ``"lbfgs"`` (MLlib spells it ``"l-bfgs"``; ``"auto"`` picks it)
#: and ``"gd"`` (gradient descent, with ``learningRate``).
SOLVERS = ("auto", "lbfgs", "l-bfgs", "gd")


class _RegressionParams(
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasMaxIter,
    HasTol,
    HasRegParam,
    HasElasticNetParam,
    HasFitIntercept,
    HasStandardization,
    HasWeightCol,
):
    """The Params both regressions share, as MLlib names them, and iterflow's two."""

    solver: Param[str] = param(
        Params._dummy(),
        "solver",
        f"the optimizer: one of {list(SOLVERS)} ('auto' and 'l-bfgs' mean 'lbfgs')",
        choice("solver", SOLVERS),
    )
    learningRate: Param[float] = param(
        Params._dummy(),
        "learningRate",
        "the step size of solver='gd' (> 0)",
        TypeConverters.toFloat,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            maxIter=100,
            tol=1e-6,
            regParam=0.0,
            elasticNetParam=0.0,
            fitIntercept=True,
            standardization=True,
            solver="auto",
            learningRate=0.1,
        )

    def getSolver(self) -> str:
        return str(self.getOrDefault(self.solver))

    def getLearningRate(self) -> float:
        return float(self.getOrDefault(self.learningRate))

    def _fit_options(self) -> dict[str, Any]:
        """The short form's options from these Params."""
        gd = self.getSolver() == "gd"
        return {
            "features": self.getFeaturesCol(),
            "label": self.getLabelCol(),
            "weight": weight_column(self),
            "solver": "gd" if gd else "lbfgs",
            **({"learning_rate": self.getLearningRate()} if gd else {}),
            "reg": self.getRegParam(),
            "elastic_net": self.getElasticNetParam(),
            # Gradient descent minimizes the objective on the features as they are:
            # standardization is L-BFGS's (scale the features first, e.g. StandardScaler).
            "standardization": self.getStandardization() and not gd,
            "fit_intercept": self.getFitIntercept(),
            "max_rounds": self.getMaxIter(),
            "tol": self.getTol(),
        }


class _LogisticParams(_RegressionParams, HasProbabilityCol, HasRawPredictionCol, HasThreshold):
    """``LogisticRegression``'s Params: the shared ones, its two output columns, and
    ``threshold`` (label 1 when its probability is above it)."""

    family: Param[str] = param(
        Params._dummy(),
        "family",
        "the label distribution: 'auto' or 'binomial' (labels 0 and 1)",
        choice("family", ("auto", "binomial")),
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(threshold=0.5, family="auto", learningRate=0.5)


class _FittedRegression(Model, SavedModel, Fitted):
    """What both fitted regressions hold: ``coefficients`` (a DenseVector, as MLlib's),
    ``intercept``, ``numFeatures``, and the run (``summary``, ``rounds``, ``termination``,
    ``history``) when fitted here."""

    def __init__(self, fitted: RegressionModel | None = None) -> None:
        super().__init__()
        self.result = None if fitted is None else fitted.result
        self._fitted = fitted
        self.coefficients = DenseVector([] if fitted is None else fitted.coefficients.tolist())
        self.intercept = 0.0 if fitted is None else float(fitted.intercept)

    @property
    def numFeatures(self) -> int:
        return len(self.coefficients)

    @property
    def summary(self) -> TrainingSummary:
        """MLlib's ``objectiveHistory`` and ``totalIterations``, and iterflow's run."""
        result = self.fitted_result
        fitted = cast(RegressionModel, self._fitted)
        history = [float(v) for v in fitted.objective_history]
        return TrainingSummary(history, int(fitted.total_iterations), result)

    def _margin(self, df: DataFrame) -> Column:
        """``features . coefficients + intercept``, as a Spark SQL expression."""
        coefficients = self.coefficients.toArray().tolist()
        column = self.getOrDefault("featuresCol")
        return linear_score(df, column, coefficients, self.intercept, type(self).__name__)

    def _point_margin(self, value: Any) -> float:
        point = np.asarray(value.toArray() if hasattr(value, "toArray") else value, float)
        if point.shape != (self.numFeatures,):
            raise MLError(f"a point of {self.numFeatures} features was expected, got {point.shape}")
        return float(point @ self.coefficients.toArray() + self.intercept)

    def _learned(self) -> dict[str, Any]:
        return {"coefficients": self.coefficients.toArray().tolist(), "intercept": self.intercept}

    def _restore(self, learned: Mapping[str, Any]) -> None:
        self.coefficients = DenseVector(learned["coefficients"])
        self.intercept = float(learned["intercept"])


class LinearRegressionModel(_FittedRegression, _RegressionParams):
    """A fitted ``LinearRegression``: ``transform`` adds ``predictionCol``."""

    def predict(self, value: Any) -> float:
        """The prediction for one point (a Vector or a sequence of numbers), as MLlib's."""
        return self._point_margin(value)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return dataset.withColumn(self.getPredictionCol(), self._margin(dataset))


class LogisticRegressionModel(_FittedRegression, _LogisticParams):
    """A fitted ``LogisticRegression``: ``transform`` adds ``rawPredictionCol`` (Vector
    ``[-m, m]`` of the margin ``m``), ``probabilityCol`` (Vector ``[1 - p, p]``) and
    ``predictionCol`` (1.0 when ``p > threshold``, else 0.0), as MLlib's."""

    def predictProbability(self, value: Any) -> DenseVector:
        """``[1 - p, p]`` for one point, as MLlib's."""
        p = 1.0 / (1.0 + np.exp(-self._point_margin(value)))
        return Vectors.dense([1.0 - p, p])

    def predict(self, value: Any) -> float:
        """The label (0.0 or 1.0) predicted for one point, as MLlib's."""
        return 1.0 if self.predictProbability(value)[1] > self.getThreshold() else 0.0

    def _transform(self, dataset: DataFrame) -> DataFrame:
        margin = self._margin(dataset)
        probability = 1.0 / (1.0 + F.exp(-margin))
        out = dataset
        if self.getRawPredictionCol():
            out = out.withColumn(
                self.getRawPredictionCol(), array_to_vector(F.array(-margin, margin))
            )
        if self.getProbabilityCol():
            pair = F.array(1.0 - probability, probability)
            out = out.withColumn(self.getProbabilityCol(), array_to_vector(pair))
        if self.getPredictionCol():
            label = F.when(probability > F.lit(self.getThreshold()), 1.0).otherwise(0.0)
            out = out.withColumn(self.getPredictionCol(), label)
        return out


class _RegressionEstimator(IterationOptions, DefaultParamsReadable[Any], DefaultParamsWritable):
    """``setParams`` and the keyword constructor both Estimators share."""

    _input_kwargs: dict[str, Any]

    def _init(self, kwargs: dict[str, Any]) -> None:
        unknown = [name for name in kwargs if not self.hasParam(name)]  # type: ignore[attr-defined]
        if unknown:
            raise MLError(f"{type(self).__name__} has no Param(s) {unknown}")
        self._set(**kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, **kwargs: Any) -> Any:
        """Sets the Params given by name."""
        self._init(self._input_kwargs)
        return self


class LinearRegression(Estimator[LinearRegressionModel], _RegressionParams, _RegressionEstimator):
    """Least squares (ridge, lasso, elastic net) as a ``pyspark.ml`` Estimator.

    MLlib's Params and defaults (``maxIter=100``, ``tol=1e-6``, ``standardization=True``);
    ``solver`` ``"lbfgs"`` (the default; OWL-QN when ``elasticNetParam`` gives an L1 part)
    or ``"gd"``. Runs ``linear_regression``: see ``iterflow.ml.regression``.

    Example::

        model = LinearRegression(regParam=0.01).fit(df)  # "features" (a Vector), "label"
        model.coefficients, model.intercept
    """

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._init(self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> LinearRegressionModel:
        fitted = linear_regression(dataset, **self._fit_options(), **self.getIterationOptions())
        return self._copyValues(LinearRegressionModel(fitted))


class LogisticRegression(Estimator[LogisticRegressionModel], _LogisticParams, _RegressionEstimator):
    """Binary logistic regression (labels 0 and 1) as a ``pyspark.ml`` Estimator.

    MLlib's Params and defaults (``maxIter=100``, ``tol=1e-6``, ``standardization=True``,
    ``threshold=0.5``); ``solver`` ``"lbfgs"`` (the default; OWL-QN when
    ``elasticNetParam`` gives an L1 part) or ``"gd"``. Runs ``logistic_regression``: see
    ``iterflow.ml.regression``.

    Example::

        lr = LogisticRegression(maxIter=100, regParam=0.01)
        Pipeline(stages=[VectorAssembler(inputCols=["x1", "x2"], outputCol="features"), lr]).fit(df)
    """

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._init(self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> LogisticRegressionModel:
        fitted = logistic_regression(dataset, **self._fit_options(), **self.getIterationOptions())
        return self._copyValues(LogisticRegressionModel(fitted))


class KMeans(
    Estimator[KMeansModel],
    KMeansParams,
    IterationOptions,
    DefaultParamsReadable[Any],
    DefaultParamsWritable,
):
    """k-means (Lloyd's algorithm) as a ``pyspark.ml`` Estimator, with MLlib's Params::

        KMeans(k=3, maxIter=20, tol=1e-4, seed=1).setIterationOptions(progress=True).fit(df)

    ``featuresCol`` is a Vector column (``VectorAssembler``'s output) or an array of
    numbers; ``weightCol`` weighs each point. Runs ``kmeans()``: see its docstring.
    """

    @keyword_only
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        predictionCol: str = "prediction",
        k: int = 2,
        initMode: str = "k-means||",
        maxIter: int = 20,
        tol: float = 1e-4,
        seed: int = 0,
        weightCol: str | None = None,
    ) -> None:
        super().__init__()
        self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, **kwargs: Any) -> KMeans:
        """Sets the Params given by name."""
        return self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    def _fit(self, dataset: DataFrame) -> KMeansModel:
        mode = self.getInitMode()
        model = kmeans(
            dataset,
            self.getK(),
            features=self.getFeaturesCol(),
            weight=weight_column(self),
            max_rounds=self.getMaxIter(),
            tol=self.getTol(),
            init="k-means++" if mode == "k-means||" else mode,
            seed=self.getSeed(),
            **self.getIterationOptions(),
        )
        return self._copyValues(model)


__all__ = [
    "KMeans",
    "LinearRegression",
    "LinearRegressionModel",
    "LogisticRegression",
    "LogisticRegressionModel",
]
