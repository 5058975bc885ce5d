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

Each is a drop-in for MLlib's class of the same name: keyword-only constructors with
MLlib's Params and defaults, a ``setX``/``getX`` pair per Param (``iterflow.ml.params``),
``initialModel`` to warm-start, and fitted models (``iterflow.ml.regression_models``,
``iterflow.ml.kmeans``) that the short forms return too, with MLlib's setters, summaries
and saved format (``iterflow.ml.persistence``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from pyspark.ml import Estimator
from pyspark.ml.param import Param, Params
from pyspark.sql import DataFrame

from iterflow.ml.kmeans import KMeansModel, KMeansParams, kmeans
from iterflow.ml.linear_svc import LinearSVCModel, LinearSVCParams
from iterflow.ml.params import HasInitialModel, IterationOptions, keyword_params, weight_column
from iterflow.ml.persistence import SavedEstimator
from iterflow.ml.regression import fit_problem, fit_problems
from iterflow.ml.regression_models import (
    FittedRegression,
    LinearRegressionModel,
    LogisticParams,
    LogisticRegressionModel,
    RegressionFit,
    RegressionParams,
)
from iterflow.ml.regression_problem import FitOptions


class FitsTogether(Params):
    """The regressions' ``fit`` and ``fitMultiple``: an Estimator says what it fits
    (``_problem``) and its model class. ``fitMultiple`` (which ``CrossValidator``,
    ``TrainValidationSplit`` and ``HalvingCrossValidator`` call for a fold's ParamMaps)
    fits the ParamMaps that read the same columns together, one run on one load of the
    rows (``iterflow.ml.regression.fit_problems``), where MLlib fits them one by one."""

    model_class: ClassVar[type[FittedRegression]]
    kind: ClassVar[str]  # FitOptions.kind: "linear", "logistic" or "hinge"

    def _problem(self) -> FitOptions:
        """What ``fit`` solves: the Params as the short form's options (``fit_options``),
        the start from ``initialModel``, the iteration options."""
        return FitOptions(
            kind=self.kind,
            **self.fit_options(),  # type: ignore[attr-defined]
            initial=self.initial_model(self.model_class),  # type: ignore[attr-defined]
            loss_tol=None,
            batch_fraction=1.0,
            seed=0,
            **self._run_settings(),
        )

    def _model(self, fit: RegressionFit) -> Any:
        return self._copyValues(self.model_class(fit))

    def _fit(self, dataset: DataFrame) -> Any:
        return self._model(fit_problem(dataset, self._problem()))

    def fitMultiple(
        self, dataset: DataFrame, paramMaps: Sequence[dict[Param[Any], Any]]
    ) -> Iterator[tuple[int, Any]]:
        """``(index, model)`` for every ParamMap, from a thread-safe iterator (as
        pyspark.ml's): the first ``next`` fits them all."""
        copies = [self.copy(extra) for extra in paramMaps]

        def fit_all() -> list[Any]:
            fits = fit_problems(dataset, [estimator._problem() for estimator in copies])
            return [estimator._model(fit) for estimator, fit in zip(copies, fits, strict=True)]

        return Together(fit_all)

    def _run_settings(self) -> dict[str, Any]:
        """``listen`` and the other iteration options, as ``FitOptions`` holds them."""
        options = self.getIterationOptions()  # type: ignore[attr-defined]
        return {"listen": options.pop("listen", None), "run_options": options}


class Together(Iterator[tuple[int, Any]]):
    """``fitMultiple``'s iterator, safe to share between threads: the first ``next`` runs
    ``fit_all`` (a failure is raised to every caller), each ``next`` hands out one model."""

    def __init__(self, fit_all: Callable[[], list[Any]]) -> None:
        self._fit_all = fit_all
        self._lock = threading.Lock()
        self._models: list[Any] | None = None
        self._failure: BaseException | None = None
        self._handed = 0

    def __next__(self) -> tuple[int, Any]:
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._models is None:
                try:
                    self._models = self._fit_all()
                except BaseException as failure:
                    self._failure = failure
                    raise
            if self._handed >= len(self._models):
                raise StopIteration
            index, self._handed = self._handed, self._handed + 1
            return index, self._models[index]


class LinearRegression(
    FitsTogether,
    Estimator[LinearRegressionModel],
    RegressionParams,
    HasInitialModel,
    IterationOptions,
    SavedEstimator,
):
    """Least squares (ridge, lasso, elastic net) as a ``pyspark.ml`` Estimator.

    MLlib's Params and defaults (``maxIter=100``, ``tol=1e-6``, ``standardization=True``);
    ``solver`` ``"lbfgs"`` (the default; OWL-QN when ``elasticNetParam`` gives an L1 part)
    or ``"gd"``; ``initialModel`` warm-starts. Runs ``linear_regression``: see
    ``iterflow.ml.regression``.

    Example::

        model = LinearRegression(regParam=0.01).fit(df)  # "features" (a Vector), "label"
        model.coefficients, model.intercept
    """

    @keyword_params
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxIter: int = 100,
        regParam: float = 0.0,
        elasticNetParam: float = 0.0,
        tol: float = 1e-6,
        fitIntercept: bool = True,
        standardization: bool = True,
        solver: str = "auto",
        weightCol: str | None = None,
        learningRate: float = 0.1,
        initialModel: Any = None,
    ) -> None:
        super().__init__()

    model_class = LinearRegressionModel
    kind = "linear"


class LogisticRegression(
    FitsTogether,
    Estimator[LogisticRegressionModel],
    LogisticParams,
    HasInitialModel,
    IterationOptions,
    SavedEstimator,
):
    """Binary logistic regression (labels 0 and 1) as a ``pyspark.ml`` Estimator.

    MLlib's Params and defaults (``maxIter=100``, ``tol=1e-6``, ``standardization=True``,
    ``threshold=0.5``); ``solver`` ``"lbfgs"`` (the default; OWL-QN when
    ``elasticNetParam`` gives an L1 part) or ``"gd"``; ``initialModel`` warm-starts. Runs
    ``logistic_regression``: see ``iterflow.ml.regression``.

    Example::

        lr = LogisticRegression(maxIter=100, regParam=0.01)
        Pipeline(stages=[VectorAssembler(inputCols=["x1", "x2"], outputCol="features"), lr]).fit(df)
    """

    @keyword_params
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxIter: int = 100,
        regParam: float = 0.0,
        elasticNetParam: float = 0.0,
        tol: float = 1e-6,
        fitIntercept: bool = True,
        threshold: float = 0.5,
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        standardization: bool = True,
        weightCol: str | None = None,
        family: str = "auto",
        solver: str = "auto",
        learningRate: float = 0.5,
        initialModel: Any = None,
    ) -> None:
        super().__init__()

    model_class = LogisticRegressionModel
    kind = "logistic"


class LinearSVC(
    FitsTogether,
    Estimator[LinearSVCModel],
    LinearSVCParams,
    HasInitialModel,
    IterationOptions,
    SavedEstimator,
):
    """A linear SVM (labels 0 and 1) as a ``pyspark.ml`` Estimator, with MLlib's Params and
    defaults (``maxIter=100``, ``tol=1e-6``, ``regParam=0``, ``standardization=True``,
    ``threshold=0.0``): OWL-QN on the hinge loss, as MLlib; ``initialModel`` warm-starts.
    Runs ``linear_svc``: see ``iterflow.ml.linear_svc``.

    Example::

        model = LinearSVC(regParam=0.01).fit(df)   # "features" (a Vector), "label"
        model.coefficients, model.intercept
    """

    @keyword_params
    def __init__(
        self,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        maxIter: int = 100,
        regParam: float = 0.0,
        tol: float = 1e-6,
        rawPredictionCol: str = "rawPrediction",
        fitIntercept: bool = True,
        standardization: bool = True,
        threshold: float = 0.0,
        weightCol: str | None = None,
        initialModel: Any = None,
    ) -> None:
        super().__init__()

    model_class = LinearSVCModel
    kind = "hinge"

    def fit_options(self) -> dict[str, Any]:
        """The short form's options from these Params (``linear_svc``'s)."""
        return {
            "features": self.getFeaturesCol(),
            "label": self.getLabelCol(),
            "weight": weight_column(self),
            "learning_rate": 1.0,
            "reg": self.getRegParam(),
            "max_rounds": self.getMaxIter(),
            "tol": self.getTol(),
            "standardization": self.getStandardization(),
            "fit_intercept": self.getFitIntercept(),
        }


class KMeans(
    Estimator[KMeansModel],
    KMeansParams,
    HasInitialModel,
    IterationOptions,
    SavedEstimator,
):
    """k-means (Lloyd's algorithm) as a ``pyspark.ml`` Estimator, with MLlib's Params::

        KMeans(k=3, maxIter=20, tol=1e-4, seed=1).setIterationOptions(progress=True).fit(df)

    ``featuresCol`` is a Vector column (``VectorAssembler``'s output) or an array of
    numbers; ``weightCol`` weighs each point; ``initialModel`` (a ``KMeansModel``,
    iterflow's or MLlib's) gives the starting centroids. Runs ``kmeans()``: see its
    docstring.
    """

    @keyword_params
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
        initialModel: Any = None,
    ) -> None:
        super().__init__()

    def _fit(self, dataset: DataFrame) -> KMeansModel:
        mode = self.getInitMode()
        start = self.initial_model(KMeansModel)
        # A warm start's centroids give k unless k was set.
        k = self.getK() if start is None or self.isSet(self.k) else len(start.clusterCenters())
        model = kmeans(
            dataset,
            k,
            features=self.getFeaturesCol(),
            weight=weight_column(self),
            max_rounds=self.getMaxIter(),
            tol=self.getTol(),
            init=start if start is not None else "k-means++" if mode == "k-means||" else mode,
            seed=self.getSeed(),
            **self.getIterationOptions(),
        )
        return self._copyValues(model)


__all__ = [
    "KMeans",
    "LinearRegression",
    "LinearRegressionModel",
    "LinearSVC",
    "LinearSVCModel",
    "LogisticRegression",
    "LogisticRegressionModel",
]
