"""Connected components by min-label propagation: the README's example, runnable.

Run: python examples/connected_components.py
"""

from pyspark.sql import functions as F

import iterflow as itf

spark = itf.session()  # the active session, or an embedded local one
pairs = spark.createDataFrame([(1, 2), (2, 3), (4, 5)], "src long, dst long")
edges = pairs.unionByName(pairs.select(F.col("dst").alias("src"), F.col("src").alias("dst")))
labels = spark.createDataFrame([(v, v) for v in range(1, 6)], "id long, label long")


@itf.body
def propagate(labels, edges):  # parameter names are the input names
    sent = edges.join(labels, edges.src == labels.id).select(F.col("dst").alias("id"), "label")
    best = labels.unionByName(sent).groupBy("id").agg(F.min("label").alias("label"))
    changed = best.join(labels, ["id", "label"], "left_anti")  # rows whose label moved
    return itf.Declaration(
        feedback={"labels": best}, outputs={"labels": best}, until=itf.empty(changed)
    )


result = itf.BoundedIteration(propagate).bind("labels", labels).bind("edges", edges).run()
result.outputs["labels"].orderBy("id").show()
print(result.rounds, result.termination.reason)  # 3 criteria_empty
