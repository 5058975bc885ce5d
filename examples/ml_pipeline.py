"""iterflow.ml in a pyspark.ml Pipeline: VectorAssembler, StandardScaler, iterflow's
LogisticRegression (L-BFGS), tuned by CrossValidator, saved and loaded.

Run: python examples/ml_pipeline.py [rows]
"""

import sys
import tempfile

import numpy as np
import pyarrow as pa
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import BinaryClassificationEvaluator
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

import iterflow as itf
from iterflow.ml import LogisticRegression

count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
spark = itf.session()
rng = np.random.default_rng(3)
x = rng.normal(size=(count, 3)) * np.array([1.0, 100.0, 0.01])  # very different scales
chance = 1.0 / (1.0 + np.exp(-(x @ np.array([1.5, -0.02, 50.0]) - 0.5)))
label = (rng.random(count) < chance).astype(float)
df = spark.createDataFrame(
    pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": label})
).cache()

lr = LogisticRegression(maxIter=100, tol=1e-6).setIterationOptions(progress=False)
pipeline = Pipeline(
    stages=[
        VectorAssembler(inputCols=["a", "b", "c"], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features"),
        lr,
    ]
)
grid = ParamGridBuilder().addGrid(lr.regParam, [0.1, 0.01, 0.0]).build()
cv = CrossValidator(
    estimator=pipeline,
    estimatorParamMaps=grid,
    evaluator=BinaryClassificationEvaluator(),
    numFolds=3,
    seed=7,
)
tuned = cv.fit(df)
best = tuned.bestModel
fitted = best.stages[-1]
print("areaUnderROC per regParam", [round(m, 4) for m in tuned.avgMetrics])
print(f"best regParam {fitted.getRegParam()}: {fitted.summary.totalIterations} L-BFGS iterations")
print("coefficients (on standardized features)", np.round(fitted.coefficients.toArray(), 3))

path = tempfile.mkdtemp() + "/model"
best.write().save(path)
# Saved in MLlib's format: PipelineModel.load reads the last stage as MLlib's own
# LogisticRegressionModel, which scores as iterflow's did (to rounding).
loaded = PipelineModel.load(path)
theirs = [r[0].toArray() for r in loaded.transform(df).select("probability").collect()]
ours = [r[0].toArray() for r in best.transform(df).select("probability").collect()]
same = bool(np.allclose(theirs, ours, rtol=1e-12, atol=1e-15))
print(f"saved, loaded by MLlib as {type(loaded.stages[-1]).__module__}: same probabilities:", same)
