"""The few places iterflow reaches into Spark's JVM objects (classic sessions only).

Kept in one module so that a change of Spark internals, or a session kind that
has no JVM handle (Spark Connect), touches one file.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession


def release_local_checkpoint(df: DataFrame) -> None:
    """Drop the blocks of a DataFrame made by ``localCheckpoint``.

    ``df.unpersist()`` does not release them: only JVM garbage collection
    would, at an unpredictable time. The blocks belong to the checkpointed RDD
    under the ``LogicalRDD`` at the root of the plan; unpersisting that RDD
    frees them now. Any other plan is left alone.
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return
    plan = jdf.logicalPlan()
    if plan.getClass().getSimpleName() == "LogicalRDD":
        plan.rdd().unpersist(False)


def observation_ready(observation: Observation) -> bool:
    """Whether Spark has delivered ``observation`` (``get`` would not block)."""
    handle: Any = getattr(observation, "_jo", None)
    return handle is not None and bool(handle.future().isCompleted())


def persistent_rdd_ids(spark: SparkSession) -> list[int]:
    """Ids of the RDDs the session's SparkContext holds persisted (cached or checkpointed)."""
    return sorted(int(i) for i in spark.sparkContext._jsc.getPersistentRDDs().keySet().toArray())
