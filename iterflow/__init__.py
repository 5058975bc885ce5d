"""iterflow: bounded and unbounded iterations on Apache Spark.

Declare an iteration body with named inputs; iterflow runs it round by round,
cuts lineage so plans never grow, tracks progress, calls listeners and stops on
termination conditions::

    import iterflow as itf

    @itf.body
    def step(x, ctx):
        nxt = x.selectExpr("v + 1 AS v").where("v < 5")
        return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})

    result = itf.BoundedIteration(step).bind("x", df).until(itf.max_rounds(10)).run()
"""

import logging

from iterflow import metrics, progress
from iterflow.body import Declaration, IterationBody, RoundContext, body
from iterflow.bounded import BoundedIteration, IterationResult
from iterflow.errors import (
    DivergenceError,
    IterflowError,
    IterflowTypeError,
    IterflowValueError,
    IterflowWarning,
    RoundError,
    worker_errors,
)
from iterflow.progress import IterationEnd, RoundEnd, RoundListener, RoundProgress, RoundSample
from iterflow.reports import Rollback, Termination
from iterflow.runtime.datacache.combine import CombineFn, combine
from iterflow.runtime.datacache.driver_variables import (
    from_arrow,
    to_arrow,
    vector,
    vector_cell,
)
from iterflow.runtime.spark.jvm import take_sample
from iterflow.runtime.spark.session import session
from iterflow.termination import Condition, converged, empty, max_rounds, until
from iterflow.unbounded import FileSink, UnboundedIteration, UnboundedQuery
from iterflow.windows import FixedWindows, SessionWindows, SlidingWindows, WindowFn

# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.1.0"

# A library leaves logging to the application: records of the ``iterflow`` loggers go
# nowhere until it configures logging (Python's last-resort handler stays out of it).
logging.getLogger("iterflow").addHandler(logging.NullHandler())

__all__ = [
    "BoundedIteration",
    "CombineFn",
    "Condition",
    "Declaration",
    "DivergenceError",
    "FileSink",
    "FixedWindows",
    "IterationBody",
    "IterationEnd",
    "IterationResult",
    "IterflowError",
    "IterflowTypeError",
    "IterflowValueError",
    "IterflowWarning",
    "Rollback",
    "RoundContext",
    "RoundEnd",
    "RoundError",
    "RoundListener",
    "RoundProgress",
    "RoundSample",
    "SessionWindows",
    "SlidingWindows",
    "Termination",
    "UnboundedIteration",
    "UnboundedQuery",
    "WindowFn",
    "__version__",
    "body",
    "combine",
    "converged",
    "empty",
    "from_arrow",
    "max_rounds",
    "metrics",
    "progress",
    "session",
    "take_sample",
    "to_arrow",
    "until",
    "vector",
    "vector_cell",
    "worker_errors",
]
