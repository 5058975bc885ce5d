"""Finding or starting the SparkSession an iteration runs on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowValueError

#: Settings of the embedded session: few shuffle partitions for a small local
#: machine, no console progress bar (it garbles iterflow's own output).
EMBEDDED_DEFAULTS: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 2))),
    "spark.sql.session.timeZone": "UTC",
}


def session() -> SparkSession:
    """The active SparkSession, or a new embedded local one (``local[*]``)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    return embedded_session()


def embedded_session(
    master: str = "local[*]",
    *,
    app_name: str = "iterflow",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or get) a session on ``master`` with iterflow's defaults, overridable by ``conf``.

    Python workers run this interpreter (``PYSPARK_PYTHON``), so they see the
    same installed packages as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**EMBEDDED_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def session_of(frames: Mapping[str, DataFrame], spark: SparkSession | None) -> SparkSession:
    """The one session all ``frames`` belong to (or ``spark`` when given and consistent)."""
    sessions: dict[int, tuple[Any, list[str]]] = {}
    for name, df in frames.items():
        owner = df.sparkSession
        sessions.setdefault(id(owner), (owner, []))[1].append(name)
    if len(sessions) > 1:
        groups = "; ".join(f"{names}" for _, names in sessions.values())
        raise IterflowValueError(
            f"inputs come from {len(sessions)} different SparkSessions ({groups}); "
            "build every input with the same session"
        )
    if sessions:
        owner, names = next(iter(sessions.values()))
        if spark is not None and owner is not spark:
            raise IterflowValueError(
                f"inputs {names} belong to another SparkSession than run(spark=...); "
                "pass their session or leave spark unset"
            )
        return owner
    return spark if spark is not None else session()
