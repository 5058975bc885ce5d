"""Where iterflow 0.1 kept its pytest plugin, kept for one release.

The plugin is now the top-level module ``_iterflow_pytestplugin``, outside this package,
so that pytest starts without importing iterflow or PySpark (see docs/testing.md). An
environment installed from iterflow 0.1, whose ``pytest11`` entry point still names this
module, loads the plugin through it until it is installed again.
"""

from _iterflow_pytestplugin import (
    connect_session,
    iterflow_spark,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    spark,
    spark_remote,
    spark_settings,
)

__all__ = [
    "connect_session",
    "iterflow_spark",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "spark",
    "spark_remote",
    "spark_settings",
]
