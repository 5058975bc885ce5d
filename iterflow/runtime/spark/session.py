"""Finding or starting the SparkSession an iteration runs on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowValueError
from iterflow.runtime.spark.jvm import configured_settings

#: Settings of the embedded session: few shuffle partitions for a small local
#: machine, no console progress bar (it garbles iterflow's own output).
EMBEDDED_DEFAULTS: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 2))),
    "spark.sql.session.timeZone": "UTC",
}
#: The driver's memory when nothing configures it and iterflow starts the JVM.
EMBEDDED_DRIVER_MEMORY = "2g"
#: Settings that only count when the driver's JVM starts, never on a running one.
_LAUNCH_SETTINGS = ("spark.driver.memory",)


def session(
    master: str | None = None,
    *,
    app_name: str = "iterflow",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active SparkSession, or a new one: on the master configured for this process
    (spark-submit's ``--master``, ``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``) with
    every configured setting, or, when no master is configured at all, an embedded local
    one (``local[*]``) with iterflow's defaults.

    For a new session only: ``master`` is an explicit choice that wins over a configured
    one (a command's ``--master``); ``app_name`` and ``conf`` fill in what is not
    configured.

    Example::

        spark = itf.session()  # in a notebook or under spark-submit: the session there
        spark = itf.session("local[2]", conf={"spark.sql.shuffle.partitions": "4"})
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    return embedded_session(master, app_name=app_name, conf=conf)


def embedded_session(
    master: str | None = None,
    *,
    app_name: str = "iterflow",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or get) a classic session that honours what this process was configured with.

    ``master`` is an explicit choice (a ``--master`` option, a test's master) and wins;
    otherwise the configured master is used, or ``local[*]`` when none is. The configured
    app name and settings win over ``app_name`` and ``conf``, which fill in only what is
    not configured, as do iterflow's ``EMBEDDED_DEFAULTS`` when no master is configured.
    Under ``SPARK_REMOTE`` (Spark Connect) the session is PySpark's own.

    Python workers run this interpreter (``PYSPARK_PYTHON``), so they see the
    same installed packages as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if os.environ.get("SPARK_REMOTE"):
        return SparkSession.builder.getOrCreate()
    wanted = dict(conf or {})
    configured = configured_settings(wanted.get("spark.driver.memory", EMBEDDED_DRIVER_MEMORY))
    builder = SparkSession.builder
    if master is not None or "spark.master" not in configured:
        builder = builder.master(master or "local[*]")
    if "spark.app.name" not in configured:
        builder = builder.appName(app_name)
    defaults = {} if "spark.master" in configured else EMBEDDED_DEFAULTS
    for key, value in {**defaults, **wanted}.items():
        if key not in configured and key not in _LAUNCH_SETTINGS:
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
