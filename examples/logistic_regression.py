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

model = logistic_regression(
    df, features=["a", "b", "c"], learning_rate=4.0, reg=0.001, max_rounds=200, tol=1e-6
)
losses = [p.metrics["loss"] for p in model.history]
print(
    f"{model.rounds} rounds ({model.termination.reason}); loss {losses[0]:.4f} -> {losses[-1]:.4f}"
)
print("coefficients", np.round(model.coefficients, 3), "intercept", round(model.intercept, 3))
scored = model.predict(df).selectExpr(
    "avg(CAST((prediction > 0.5) = (label = 1.0) AS INT)) AS accuracy"
)
print(f"training accuracy {scored.first()['accuracy']:.3f}")
