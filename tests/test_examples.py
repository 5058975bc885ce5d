"""The README's example runs and gives the right components."""

from __future__ import annotations

import runpy
from pathlib import Path

import networkx as nx
import pytest
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_connected_components_example_matches_networkx(spark: SparkSession) -> None:
    scope = runpy.run_path(str(EXAMPLES / "connected_components.py"), run_name="example")
    result = scope["result"]
    got = {r["id"]: r["label"] for r in result.outputs["labels"].collect()}
    graph = nx.Graph([(1, 2), (2, 3), (4, 5)])
    expected = {
        v: min(component) for component in nx.connected_components(graph) for v in component
    }
    assert got == expected
    assert result.termination.reason == "criteria_empty"
    assert result.rounds == 3  # labels settle in round 1, round 2 changes nothing
    result.release()
