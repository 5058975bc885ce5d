"""The fitted regressions, as ``pyspark.ml`` Models with MLlib's Params, setters,
summaries and saved format: what ``linear_regression()``/``logistic_regression()`` return
and what the ``LinearRegression``/``LogisticRegression`` Estimators fit.

``transform`` adds MLlib's columns: ``predictionCol`` (and, for logistic regression,
``rawPredictionCol`` and ``probabilityCol`` as Vectors), computed by Spark SQL
expressions (no Python worker). ``save`` writes MLlib's format
(``iterflow.ml.persistence``): MLlib's ``LinearRegressionModel.load`` and
``LogisticRegressionModel.load`` read it, and these classes read MLlib's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from pyspark.ml import Model
from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import DenseMatrix, DenseVector, MatrixUDT, Vectors, VectorUDT
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
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    StructField,
    StructType,
)

import iterflow as itf
from iterflow.ml.features import linear_score
from iterflow.ml.params import MLParams, TrainingSummary, choice, param, weight_column
from iterflow.ml.persistence import SavedModel
from iterflow.ml.training import Fitted, MLError

#: ``solver`` values: ``"lbfgs"`` (MLlib spells it ``"l-bfgs"``; ``"auto"`` picks it)
#: and ``"gd"`` (gradient descent, with ``learningRate``).
SOLVERS = ("auto", "lbfgs", "l-bfgs", "gd")


@attrs.frozen
class RegressionFit:
    """What a regression's run learned: ``coefficients`` (d,), ``intercept``, the run, and
    as MLlib's training summary ``objective_history`` (the objective at every iterate, the
    first included; for L-BFGS in its standardized space for a linear model, as MLlib's),
    ``total_iterations`` and ``stop_reason`` (L-BFGS's; None for gradient descent)."""

    kind: str
    coefficients: np.ndarray
    intercept: float
    features: Sequence[str] | str
    result: itf.IterationResult = attrs.field(repr=False)
    objective_history: np.ndarray = attrs.field(factory=lambda: np.zeros(0), repr=False)
    total_iterations: int = 0
    stop_reason: str | None = None


class RegressionParams(
    MLParams,
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

    def fit_options(self) -> dict[str, Any]:
        """The short form's options from these Params."""
        gd = self.getOrDefault(self.solver) == "gd"
        return {
            "features": self.getFeaturesCol(),
            "label": self.getLabelCol(),
            "weight": weight_column(self),
            "solver": "gd" if gd else "lbfgs",
            "learning_rate": float(self.getOrDefault(self.learningRate)),
            "reg": self.getRegParam(),
            "elastic_net": self.getElasticNetParam(),
            # Gradient descent refuses standardization, but it is MLlib's default here.
            "standardization": (
                self.getStandardization() if not gd or self.isSet(self.standardization) else None
            ),
            "fit_intercept": self.getFitIntercept(),
            "max_rounds": self.getMaxIter(),
            "tol": self.getTol(),
        }


def short_form_params(options: Mapping[str, Any]) -> dict[str, Any]:
    """The Params of a model fitted by a short form with ``options`` (its keywords)."""
    values = {
        "labelCol": options["label"],
        "weightCol": options["weight"],
        "maxIter": options["max_rounds"],
        "tol": options["tol"],
        "regParam": options["reg"],
        "elasticNetParam": options["elastic_net"],
        "fitIntercept": options["fit_intercept"],
        "standardization": options["standardization"],
        "solver": options["solver"],
        "learningRate": options["learning_rate"],
    }
    if isinstance(options["features"], str):
        values["featuresCol"] = options["features"]
    return {name: value for name, value in values.items() if value is not None}


class LogisticParams(RegressionParams, HasProbabilityCol, HasRawPredictionCol, HasThreshold):
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


class FittedRegression(Model, SavedModel, Fitted):
    """What both fitted regressions hold: ``coefficients`` (a DenseVector, as MLlib's),
    ``intercept``, ``numFeatures``, and the run (``summary``, ``rounds``, ``termination``,
    ``history``) when fitted here; MLlib's setters and format."""

    def __init__(self, fitted: RegressionFit | None = None) -> None:
        super().__init__()
        self.result = None if fitted is None else fitted.result
        self._fitted = fitted
        self.coefficients = DenseVector([] if fitted is None else fitted.coefficients.tolist())
        self.intercept = 0.0 if fitted is None else float(fitted.intercept)
        self._columns: list[str] | None = None
        if fitted is not None and not isinstance(fitted.features, str):
            self._columns = list(fitted.features)

    @property
    def numFeatures(self) -> int:
        return len(self.coefficients)

    @property
    def features(self) -> Sequence[str] | str:
        """The feature columns: the list of numeric columns it was fitted on, or
        ``featuresCol``."""
        return self._columns if self._columns is not None else self.getOrDefault("featuresCol")

    @property
    def summary(self) -> TrainingSummary:
        """MLlib's ``objectiveHistory`` and ``totalIterations``, and iterflow's run."""
        result = self.fitted_result
        return TrainingSummary(self.objective_history.tolist(), self.total_iterations, result)

    @property
    def objective_history(self) -> np.ndarray:
        """The objective at every iterate (``summary.objectiveHistory``, as an array)."""
        self.fitted_result  # noqa: B018 (a loaded model has none: MLError)
        return np.asarray(self._fit_run().objective_history, dtype=np.float64)

    @property
    def total_iterations(self) -> int:
        """The optimizer's iterations (``summary.totalIterations``)."""
        self.fitted_result  # noqa: B018
        return int(self._fit_run().total_iterations)

    @property
    def stop_reason(self) -> str | None:
        """Why L-BFGS stopped (MLlib's reasons); None for gradient descent."""
        self.fitted_result  # noqa: B018
        return self._fit_run().stop_reason

    def _fit_run(self) -> RegressionFit:
        assert self._fitted is not None
        return self._fitted

    def _margin(self, df: DataFrame) -> Column:
        """``features . coefficients + intercept``, as a Spark SQL expression."""
        coefficients = self.coefficients.toArray().tolist()
        return linear_score(df, self.features, coefficients, self.intercept, type(self).__name__)

    def _point_margin(self, value: Any) -> float:
        point = np.asarray(value.toArray() if hasattr(value, "toArray") else value, float)
        if point.shape != (self.numFeatures,):
            raise MLError(f"a point of {self.numFeatures} features was expected, got {point.shape}")
        return float(point @ self.coefficients.toArray() + self.intercept)

    def _extra(self) -> dict[str, Any]:
        return {"columns": self._columns}

    def _restore_extra(self, extra: Mapping[str, Any]) -> None:
        self._columns = extra.get("columns")

    def _restore(self, learned: Mapping[str, Any]) -> None:
        self.coefficients = DenseVector(learned["coefficients"])
        self.intercept = float(learned["intercept"])

    def _restore_data(self, rows: list[Row]) -> None:
        """MLlib's one row of ``coefficients`` (a Vector) and ``intercept`` (the linear
        regression's and the linear SVM's data)."""
        self.intercept = float(rows[0]["intercept"])
        self.coefficients = DenseVector(rows[0]["coefficients"].toArray())

    def predictRaw(self, value: Any) -> DenseVector:
        """``[-m, m]`` of the margin ``m`` of one point, as MLlib's classifiers."""
        margin = self._point_margin(value)
        return Vectors.dense([-margin, margin])


class LinearRegressionModel(FittedRegression, RegressionParams):
    """A fitted ``LinearRegression``: ``transform`` adds ``predictionCol``. Saved, it
    loads with MLlib's ``pyspark.ml.regression.LinearRegressionModel``."""

    mllib_class = "pyspark.ml.regression.LinearRegressionModel"

    @property
    def scale(self) -> float:
        """MLlib's Huber scale: 1.0 for squared error, the only loss here."""
        return 1.0

    def predict(self, value: Any) -> Any:
        """One point (a Vector or a sequence of numbers): its prediction, as MLlib's. A
        DataFrame: ``transform(value)``."""
        if isinstance(value, DataFrame):
            return self.transform(value)
        return self._point_margin(value)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return dataset.withColumn(self.getPredictionCol(), self._margin(dataset))

    def _mllib_value(self, name: str, value: Any) -> Any:
        if name == "solver":  # MLlib's solvers: auto, normal, l-bfgs
            return {"lbfgs": "l-bfgs", "gd": None}.get(value, value)
        return value

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        schema = StructType(
            [
                StructField("intercept", DoubleType()),
                StructField("coefficients", VectorUDT()),
                StructField("scale", DoubleType()),
            ]
        )
        return spark.createDataFrame(
            [(float(self.intercept), self.coefficients, self.scale)], schema
        )


class LogisticRegressionModel(FittedRegression, LogisticParams):
    """A fitted ``LogisticRegression``: ``transform`` adds ``rawPredictionCol`` (Vector
    ``[-m, m]`` of the margin ``m``), ``probabilityCol`` (Vector ``[1 - p, p]``) and
    ``predictionCol`` (1.0 when ``p > threshold``, else 0.0), as MLlib's. Saved, it loads
    with MLlib's ``pyspark.ml.classification.LogisticRegressionModel``."""

    mllib_class = "pyspark.ml.classification.LogisticRegressionModel"

    @property
    def numClasses(self) -> int:
        return 2

    @property
    def coefficientMatrix(self) -> DenseMatrix:
        """The coefficients as MLlib's ``1 x numFeatures`` matrix (binomial)."""
        values = self.coefficients.toArray().tolist()
        return DenseMatrix(1, len(values), values, isTransposed=True)

    @property
    def interceptVector(self) -> DenseVector:
        """The intercept as MLlib's one-element vector (binomial)."""
        return Vectors.dense([self.intercept])

    def predictProbability(self, value: Any) -> DenseVector:
        """``[1 - p, p]`` for one point, as MLlib's."""
        p = 1.0 / (1.0 + np.exp(-self._point_margin(value)))
        return Vectors.dense([1.0 - p, p])

    def predict(self, value: Any) -> Any:
        """One point: its label (0.0 or 1.0), as MLlib's. A DataFrame: ``transform``."""
        if isinstance(value, DataFrame):
            return self.transform(value)
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

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        schema = StructType(
            [
                StructField("numClasses", IntegerType()),
                StructField("numFeatures", IntegerType()),
                StructField("interceptVector", VectorUDT()),
                StructField("coefficientMatrix", MatrixUDT()),
                StructField("isMultinomial", BooleanType()),
            ]
        )
        row = (2, self.numFeatures, self.interceptVector, self.coefficientMatrix, False)
        return spark.createDataFrame([row], schema)

    def _restore_data(self, rows: list[Row]) -> None:
        row = rows[0]
        if row["isMultinomial"] or row["numClasses"] > 2:
            raise MLError(
                f"a multinomial LogisticRegressionModel ({row['numClasses']} classes): "
                "iterflow's LogisticRegression is binary"
            )
        self.coefficients = DenseVector(row["coefficientMatrix"].toArray()[0])
        self.intercept = float(row["interceptVector"][0])
