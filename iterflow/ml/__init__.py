"""Iterative ML algorithms on iterflow, written only against its public API.

Each is a short iteration body that users can read as a model for their own.
"""

from iterflow.ml.estimators import (
    LinearRegression,
    LinearRegressionModel,
    LogisticRegression,
    LogisticRegressionModel,
)
from iterflow.ml.kmeans import KMeans, KMeansModel, kmeans
from iterflow.ml.regression import RegressionModel, linear_regression, logistic_regression
from iterflow.ml.training import MLError

__all__ = [
    "KMeans",
    "KMeansModel",
    "LinearRegression",
    "LinearRegressionModel",
    "LogisticRegression",
    "LogisticRegressionModel",
    "MLError",
    "RegressionModel",
    "kmeans",
    "linear_regression",
    "logistic_regression",
]
