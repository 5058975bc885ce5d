"""Iterative ML algorithms on iterflow, written only against its public API.

Each is a short iteration body that users can read as a model for their own.
"""

import sys

from iterflow.ml.als import ALS, ALSModel, als
from iterflow.ml.estimators import (
    KMeans,
    LinearRegression,
    LinearRegressionModel,
    LinearSVC,
    LinearSVCModel,
    LogisticRegression,
    LogisticRegressionModel,
)
from iterflow.ml.gaussian_mixture import GaussianMixture, GaussianMixtureModel, gaussian_mixture
from iterflow.ml.iterative import IterativeEstimator, IterativeModel
from iterflow.ml.kmeans import KMeansModel, kmeans
from iterflow.ml.linear_svc import linear_svc
from iterflow.ml.regression import linear_regression, logistic_regression
from iterflow.ml.regression_models import FittedRegression
from iterflow.ml.training import MLError
from iterflow.ml.tuning import HalvingCrossValidator

#: What the short forms returned before they returned the Estimators' models: the base of
#: ``LinearRegressionModel`` and ``LogisticRegressionModel``.
RegressionModel = FittedRegression

# KMeans lived in iterflow.ml.kmeans before it joined the other Estimators. pyspark.ml loads
# a saved stage by the class path in its metadata, so a KMeans saved then (alone, in a
# Pipeline, in a CrossValidator) names "iterflow.ml.kmeans.KMeans": that path still names it.
# Set here, where both modules are imported and neither imports the other back (setattr:
# the module declares no such name).
setattr(sys.modules["iterflow.ml.kmeans"], "KMeans", KMeans)  # noqa: B010

__all__ = [
    "ALS",
    "ALSModel",
    "GaussianMixture",
    "GaussianMixtureModel",
    "HalvingCrossValidator",
    "IterativeEstimator",
    "IterativeModel",
    "KMeans",
    "KMeansModel",
    "LinearRegression",
    "LinearRegressionModel",
    "LinearSVC",
    "LinearSVCModel",
    "LogisticRegression",
    "LogisticRegressionModel",
    "MLError",
    "RegressionModel",
    "als",
    "gaussian_mixture",
    "kmeans",
    "linear_regression",
    "linear_svc",
    "logistic_regression",
]
