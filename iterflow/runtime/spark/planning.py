"""How Spark plans a round's jobs: statically, once, unless the session asks otherwise.

A round's inputs are lineage-cut checkpoints whose optimizer statistics iterflow sets
from their real row counts (``set_checkpoint_statistics``), and its data inputs are
cached with measured sizes. Spark's static planner therefore already sees the sizes
that adaptive execution would learn at run time; what adaptive execution adds to such a
plan is a Spark job per shuffle stage and a re-optimization after each one (the PageRank
body: 7 jobs a round instead of 3). So a round's own jobs (materializing its feedback,
outputs, criteria and convergence values) run with ``spark.sql.adaptive.enabled=false``;
``spark.iterflow.adaptive=true`` keeps the session's setting. Jobs outside the
materialization (the body's own actions, listeners, checkpoint writes) are unaffected,
except a job another thread starts on the same session while a round materializes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from iterflow.runtime.spark.jvm import is_classic

#: ``true`` keeps the session's adaptive execution for a round's own jobs.
ADAPTIVE = "spark.iterflow.adaptive"
_AQE = "spark.sql.adaptive.enabled"

_lock = threading.Lock()
#: Per session (by ``id``): rounds materializing now, and the setting to put back.
_active: dict[int, tuple[int, str | None]] = {}


def keeps_adaptive(spark: SparkSession) -> bool:
    """True when the session's adaptive execution stays on for rounds (a Connect session,
    whose settings other clients share, or ``spark.iterflow.adaptive=true``)."""
    if not is_classic(spark):
        return True
    return str(spark.conf.get(ADAPTIVE, "false")).strip().lower() in ("true", "on", "1")


@contextmanager
def static_planning(spark: SparkSession) -> Iterator[None]:
    """Run the block's jobs with adaptive execution off (see the module's docstring);
    nested and concurrent rounds on one session share one change, undone by the last."""
    if keeps_adaptive(spark):
        yield
        return
    key = id(spark)
    with _lock:
        depth, saved = _active.get(key, (0, None))
        if depth == 0:
            saved = spark.conf.get(_AQE, None)
            spark.conf.set(_AQE, "false")
        _active[key] = (depth + 1, saved)
    try:
        yield
    finally:
        with _lock:
            depth, saved = _active.pop(key)
            if depth > 1:
                _active[key] = (depth - 1, saved)
            elif saved is None:
                spark.conf.unset(_AQE)
            else:
                spark.conf.set(_AQE, saved)
