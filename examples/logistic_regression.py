"""Logistic regression with iterflow.ml: gradient descent with a tolerance, the loss per round.

Run: python examples/logistic_regression.py [rows]
"""

import sys

import numpy as np
import pyarrow as pa

import iterflow as itf
from iterflow.ml import logistic_regression

count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
spark = itf.session()
rng = np.random.default_rng(3)
x = rng.normal(size=(count, 3))
chance = 1.0 / (1.0 + np.exp(-(x @ np.array([1.5, -2.0, 0.5]) - 0.5)))
label = (rng.random(count) < chance).astype(float)
df = spark.createDataFrame(
    pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": label})
).cache()

model = logistic_regression(df, features=["a", "b", "c"], reg=0.001)  # L-BFGS, as MLlib's
objective = model.summary.objectiveHistory
print(
    f"{model.summary.totalIterations} iterations ({model.stop_reason}); "
    f"objective {objective[0]:.4f} -> {objective[-1]:.4f}"
)
print(
    "coefficients",
    np.round(model.coefficients.toArray(), 3),
    "intercept",
    round(model.intercept, 3),
)
scored = model.transform(df).selectExpr(
    "avg(CAST(prediction = label AS INT)) AS accuracy"  # prediction: the 0/1 label
)
print(f"training accuracy {scored.first()['accuracy']:.3f}")
