"""Hostile and odd input: every case gives a correct result (checked against plain
Python, numpy or networkx) or an IterflowError naming the input and the column; never a
raw Spark error, a hang (every run is bounded) or a silently wrong answer.

Property-based with Hypothesis (strategies in tests/hostile_strategies.py): few
examples by default, more under ``-m slow_spark``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hostile_strategies import FAST, INT64_MAX, INT64_MIN, SLOW, column_names, graphs, keyed_rows
from hostile_strategies import regression_data as regression_data_strategy
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.ml.linalg import Vectors, VectorUDT
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DoubleType, LongType, StructField, StructType

import iterflow as itf
from iterflow.graph import (
    Graph,
    GraphError,
    connected_components,
    label_propagation,
    pagerank,
    shortest_paths,
    strongly_connected_components,
)
from iterflow.ml import MLError, kmeans, linear_regression, logistic_regression

pytestmark = pytest.mark.spark

ROUNDS = 3


def quoted(name: str) -> Any:
    return F.col("`" + name.replace("`", "``") + "`")


def frame(spark: SparkSession, rows: list[Any], schema: StructType, partitions: int) -> DataFrame:
    """``rows`` in ``partitions`` partitions; no row and 0 partitions: an empty RDD."""
    if partitions == 0:
        assert not rows
        return spark.createDataFrame(spark.sparkContext.emptyRDD(), schema)
    return spark.createDataFrame(rows, schema).repartition(partitions)


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


# -- generic bodies ---------------------------------------------------------------------


def grow(name: str) -> itf.IterationBody:
    """Every round: value <- 2 * value + the row's step (a data input joined on id)."""

    @itf.body
    def step(state: DataFrame, steps: DataFrame) -> itf.Declaration:
        value = quoted(name)
        new = state.join(steps, "id", "left").select(
            "id", (value * 2 + F.coalesce(F.col("inc"), F.lit(0.0))).alias(name)
        )
        return itf.Declaration(feedback={"state": new}, outputs={"state": new})

    return step


def check_generic_body(spark: SparkSession, rows: Any, name: str, partitions: int) -> None:
    schema = StructType([StructField("id", LongType()), StructField(name, DoubleType())])
    state = frame(spark, rows, schema, partitions if rows else 0)
    steps = spark.createDataFrame(
        [(k, float(i)) for i, (k, _) in enumerate(rows)], "id long, inc double"
    )
    result = (
        itf.BoundedIteration(grow(name))
        .bind("state", state)
        .bind("steps", steps)
        .until(itf.max_rounds(ROUNDS))
        .run(progress=False)
    )
    got = {r["id"]: r[name] for r in result.outputs["state"].collect()}
    expected = {}
    for i, (k, v) in enumerate(rows):
        for _ in range(ROUNDS):
            v = None if v is None else v * 2 + float(i)
        expected[k] = v
    assert got.keys() == expected.keys()
    assert all(same(got[k], expected[k]) for k in expected), (got, expected)
    # Empty feedback ends the run after round 0: nothing was left inside the iteration.
    assert result.rounds == (ROUNDS if rows else 1)


@settings(FAST, max_examples=2)
@given(rows=keyed_rows(), name=column_names, partitions=st.sampled_from([1, 3, 7]))
def test_generic_body_matches_python(spark, rows, name, partitions):
    check_generic_body(spark, rows, name, partitions)


@pytest.mark.slow_spark
@SLOW
@given(rows=keyed_rows(), name=column_names, partitions=st.sampled_from([1, 3, 7, 64]))
def test_generic_body_matches_python_many(spark, rows, name, partitions):
    check_generic_body(spark, rows, name, partitions)


@pytest.mark.parametrize("partitions", [0, 1, 500])
def test_zero_and_many_partitions(spark, partitions):
    rows = [] if partitions == 0 else [(INT64_MAX, 1.0), (INT64_MIN, math.nan), (3, None)]
    check_generic_body(spark, rows, "v", partitions)


@pytest.mark.slow_spark
def test_ten_thousand_partitions(spark):
    check_generic_body(spark, [(INT64_MAX, 1.0), (INT64_MIN, math.inf)], "v", 10_000)


def drifting(change: str, at: int) -> itf.IterationBody:
    """A body whose feedback changes its schema in round ``at``."""

    @itf.body
    def step(state: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        new = state.select("id", (F.col("v") + 1).alias("v"))
        if ctx.epoch == at:
            if change == "extra":
                new = new.withColumn("extra", F.lit(1))
            elif change == "missing":
                new = new.select("id")
            elif change == "retyped":
                new = new.withColumn("v", F.col("v").cast("string"))
            elif change == "renamed":
                new = new.withColumnRenamed("v", "V2")
        return itf.Declaration(feedback={"state": new})

    return step


@FAST
@given(change=st.sampled_from(["extra", "missing", "retyped", "renamed"]), at=st.integers(0, 2))
def test_feedback_schema_change_names_variable_and_column(spark, change, at):
    state = spark.createDataFrame([(1, 1.0)], "id long, v double")
    column = {"extra": "extra", "missing": "v", "retyped": "v", "renamed": "V2"}[change]
    with pytest.raises(itf.IterflowError, match=rf"epoch {at}\b.*feedback 'state'.*'{column}'"):
        (
            itf.BoundedIteration(drifting(change, at))
            .bind("state", state)
            .until(itf.max_rounds(5))
            .run(progress=False)
        )


def test_feedback_may_reorder_columns_and_widen_nullability(spark):
    @itf.body
    def step(state: DataFrame) -> itf.Declaration:
        new = state.select((F.coalesce("v", F.lit(0.0)) + 1).alias("v"), "id")
        return itf.Declaration(feedback={"state": new}, outputs={"state": new})

    state = spark.createDataFrame([(1, None)], "id long, v double")
    result = (
        itf.BoundedIteration(step).bind("state", state).until(itf.max_rounds(2)).run(progress=False)
    )
    assert [tuple(r) for r in result.outputs["state"].collect()] == [(2.0, 1)]


@pytest.mark.parametrize(("second", "shown"), [("v", "v"), ("V", "V")])
def test_repeated_column_names_are_named_at_run(spark, second, shown):
    @itf.body
    def step(state: DataFrame) -> itf.Declaration:
        return itf.Declaration(feedback={"state": state})

    state = spark.createDataFrame([(1, 1.0, 2.0)], ["id", "v", second])
    with pytest.raises(itf.IterflowError, match=rf"input 'state' has more than one .*'{shown}'"):
        itf.BoundedIteration(step).bind("state", state).until(itf.max_rounds(2)).run(progress=False)


def test_columnar_input_with_an_internal_column_name_is_named(spark):
    @itf.body
    def step(model: DataFrame, rows: DataFrame, ctx: itf.RoundContext) -> itf.Declaration:
        ctx.columnar(rows, None)
        return itf.Declaration(feedback={"model": model})

    rows = spark.createDataFrame([(1, 2.0)], "`__iterflow_partition` long, x double")
    model = spark.createDataFrame([(0.0,)], "m double")
    with pytest.raises(itf.IterflowError, match=r"column '__iterflow_partition'.*clashes"):
        (
            itf.BoundedIteration(step)
            .bind("model", model)
            .bind("rows", rows)
            .until(itf.max_rounds(2))
            .run(progress=False)
        )


# -- graphs -----------------------------------------------------------------------------


def graph_of(spark: SparkSession, vertices: list[Any], edges: list[Any]) -> Graph:
    return Graph(
        spark.createDataFrame([(v, f"v{v}") for v in vertices], "id long, name string"),
        spark.createDataFrame(edges, "src long, dst long"),
    )


def check_graph_algorithms(
    spark: SparkSession, vertices: list[int], edges: list[Any], method: str
) -> None:
    g = graph_of(spark, vertices, edges)
    reference = nx.DiGraph()
    reference.add_nodes_from(vertices)
    reference.add_edges_from(edges)
    components = {
        r["id"]: r["component"]
        for r in connected_components(g, method=method, progress=False).collect()
    }
    assert components == {v: min(c) for c in nx.weakly_connected_components(reference) for v in c}
    if vertices:
        ranks = {
            r["id"]: r["pagerank"]
            for r in pagerank(g, method=method, alpha=0.3, tol=1e-10, progress=False).collect()
        }
        expected = nx.pagerank(reference, alpha=0.3, tol=1e-12, max_iter=1000)
        assert ranks.keys() == expected.keys()
        assert all(abs(ranks[v] - expected[v]) < 1e-6 for v in expected)
    else:
        with pytest.raises(GraphError, match="at least one vertex"):
            pagerank(g, method=method, progress=False)
    landmarks = vertices[:2] or [0]
    distances = {
        r["id"]: dict(r["distances"])
        for r in shortest_paths(g, landmarks, progress=False).collect()
    }
    lengths = {
        v: nx.single_target_shortest_path_length(reference, v) for v in landmarks if v in reference
    }
    assert distances == {
        v: {m: dict(lengths[m])[v] for m in lengths if v in dict(lengths[m])} for v in vertices
    }


@settings(FAST, max_examples=2)
@given(graph=graphs(), method=st.just("arrow"))
def test_graph_algorithms_match_networkx(spark, graph, method):
    check_graph_algorithms(spark, *graph, method)


@pytest.mark.slow_spark
@SLOW
@given(graph=graphs(max_vertices=12, max_edges=25), method=st.sampled_from(["arrow", "dataframe"]))
def test_graph_algorithms_match_networkx_many(spark, graph, method):
    check_graph_algorithms(spark, *graph, method)


ALGORITHMS = {
    "pagerank arrow": lambda g: pagerank(g, method="arrow", progress=False, max_rounds=5),
    "pagerank dataframe": lambda g: pagerank(g, method="dataframe", progress=False, max_rounds=5),
    "components arrow": lambda g: connected_components(g, method="arrow", progress=False),
    "components dataframe": lambda g: connected_components(g, method="dataframe", progress=False),
    "shortest_paths": lambda g: shortest_paths(g, [1], progress=False),
    "label_propagation": lambda g: label_propagation(g, max_rounds=3, progress=False),
    "strongly_connected": lambda g: strongly_connected_components(g, max_splits=3, progress=False),
}
BAD_GRAPHS = {
    "null id": ([1, None, 2], [(1, 2)], r"null 'id'"),
    "repeated id": ([1, 2, 2], [(1, 2)], r"'id' column holds \[2\] more than once"),
    "null edge end": ([1, 2], [(1, 2), (1, None)], r"not a vertex 'id' \('dst' None\)"),
    "edge to a missing vertex": ([1, 2], [(1, 2), (3, 1)], r"not a vertex 'id' \('src' 3\)"),
}


#: The default run tries every bad graph on these; the rest run under slow_spark.
QUICK_ALGORITHMS = ("pagerank arrow", "shortest_paths")


@pytest.mark.parametrize(
    "algorithm",
    [
        a if a in QUICK_ALGORITHMS else pytest.param(a, marks=pytest.mark.slow_spark)
        for a in ALGORITHMS
    ],
)
@pytest.mark.parametrize("case", BAD_GRAPHS)
def test_invalid_graphs_are_named(spark, algorithm, case):
    vertices, edges, message = BAD_GRAPHS[case]
    g = Graph(
        spark.createDataFrame([(v,) for v in vertices], "id long"),
        spark.createDataFrame(edges, "src long, dst long"),
    )
    with pytest.raises(GraphError, match=message):
        ALGORITHMS[algorithm](g).collect()


def test_a_result_column_already_in_the_vertices_is_replaced(spark):
    g = graph_of(spark, [1, 2, 3], [(1, 2)])
    once = Graph(connected_components(g, progress=False), g.edges)
    twice = connected_components(once, progress=False)
    assert twice.columns == ["id", "name", "component"]
    assert sorted((r["id"], r["component"]) for r in twice.collect()) == [(1, 1), (2, 1), (3, 3)]
    ranked = pagerank(Graph(pagerank(g, progress=False), g.edges), progress=False)
    assert ranked.columns == ["id", "name", "pagerank"]


# -- ml ---------------------------------------------------------------------------------

FEATURE_KINDS = ("columns", "array", "vector")


def ml_frame(
    spark: SparkSession, x: Any, y: Any, w: Any, kind: str, names: tuple[str, str, str, str]
) -> tuple[DataFrame, Any]:
    """``x`` as features of ``kind`` under odd column ``names`` (two features, label,
    weight): the DataFrame and its ``features=`` argument."""
    f1, f2, label, weight = names
    if kind == "columns":
        fields = [StructField(f1, DoubleType()), StructField(f2, DoubleType())]
        rows = [(*xi, yi, wi) for xi, yi, wi in zip(x, y, w, strict=True)]
        features: Any = [f1, f2]
    else:
        kind_type = VectorUDT() if kind == "vector" else ArrayType(DoubleType())
        fields = [StructField(f1, kind_type)]
        make = Vectors.dense if kind == "vector" else list
        rows = [
            (make(xi) if xi is not None else None, yi, wi)
            for xi, yi, wi in zip(x, y, w, strict=True)
        ]
        features = f1
    schema = StructType(
        [*fields, StructField(label, DoubleType()), StructField(weight, DoubleType())]
    )
    return spark.createDataFrame(rows, schema), features


ML_NAMES = ("x.1", "é 2", "y.label", "w`eight")


@FAST
@given(
    kind=st.sampled_from(FEATURE_KINDS),
    where=st.sampled_from(["feature", "label", "weight"]),
    bad=st.sampled_from([math.nan, math.inf, -math.inf, None, -1.0]),
    row=st.integers(0, 5),
    fit=st.sampled_from(["kmeans", "linear", "logistic lbfgs"]),
)
def test_bad_values_are_named(spark, kind, where, bad, row, fit):
    x = [[float(i), float(i % 3)] for i in range(6)]
    y = [float(i % 2) for i in range(6)]
    w = [1.0] * 6
    if where == "feature":
        x[row][1] = bad
    elif where == "label":
        y[row] = bad
    else:
        w[row] = bad
    df, features = ml_frame(spark, x, y, w, kind, ML_NAMES)
    column = {
        "feature": features if kind != "columns" else "é 2",
        "label": "y.label",
        "weight": "w`eight",
    }[where]
    valid = (bad == -1.0 and where != "weight") or (where == "label" and fit == "kmeans")
    options: dict[str, Any] = {"progress": False, "max_rounds": 3, "weight": "w`eight"}

    def run() -> Any:
        if fit == "kmeans":
            return kmeans(df, 2, features=features, init=[[0.0, 0.0], [5.0, 1.0]], **options)
        if fit == "linear":
            return linear_regression(df, features=features, label="y.label", **options)
        return logistic_regression(
            df, features=features, label="y.label", solver="lbfgs", **options
        )

    if fit == "logistic lbfgs" and where == "label" and bad == -1.0:
        valid = False  # a logistic label is 0 or 1
    if valid:
        run()
        return
    named = re.escape(column)
    with pytest.raises(MLError, match=rf"column '{named}'"):
        run()


@pytest.mark.parametrize(
    "kind",
    ["vector", *(pytest.param(k, marks=pytest.mark.slow_spark) for k in ("columns", "array"))],
)
@pytest.mark.parametrize("fit", ["kmeans", "linear", "logistic", "linear lbfgs"])
def test_empty_input_is_named(spark, kind, fit):
    df, features = ml_frame(spark, [], [], [], kind, ("f1", "f2", "label", "w"))
    with pytest.raises(MLError, match=r"empty|no row"):
        if fit == "kmeans":
            kmeans(df, 2, features=features, progress=False)
        else:
            fitter = logistic_regression if fit == "logistic" else linear_regression
            solver = "lbfgs" if fit.endswith("lbfgs") else "gd"
            fitter(
                df, features=features, label="label", solver=solver, progress=False, max_rounds=3
            )


def test_every_weight_zero_is_named(spark):
    df, features = ml_frame(
        spark, [[1.0, 2.0], [3.0, 1.0]], [1.0, 2.0], [0.0, 0.0], "columns", ("a", "b", "y", "w")
    )
    with pytest.raises(MLError, match="every row's weight is 0"):
        linear_regression(df, features=features, label="y", weight="w", progress=False)


def weighted_least_squares(x: Any, y: Any, w: Any) -> np.ndarray:
    design = np.column_stack([np.asarray(x), np.ones(len(x))])
    root = np.sqrt(np.asarray(w))
    return np.linalg.lstsq(design * root[:, None], np.asarray(y) * root, rcond=None)[0]


def check_linear_fit(
    spark: SparkSession, data: Any, kind: str, names: tuple[str, str, str, str]
) -> None:
    x, y, w = data
    design = np.column_stack([np.asarray(x), np.ones(len(x))])
    if np.linalg.matrix_rank(design) < 3 or np.ptp(y) == 0:
        return  # no unique least-squares solution to compare with
    df, features = ml_frame(spark, x, y, w, kind, names)
    # A column named as iterflow's own, not used by the fit, changes nothing.
    df = df.withColumn("__partition", F.lit(7)).withColumn("__iterflow_partition", F.lit("x"))
    fit = linear_regression(
        df,
        features=features,
        label=names[2],
        weight=names[3],
        solver="lbfgs",
        max_rounds=200,
        tol=1e-12,
        progress=False,
    )
    expected = weighted_least_squares(x, y, w)
    np.testing.assert_allclose([*fit.coefficients, fit.intercept], expected, atol=1e-4)


@FAST
@given(data=regression_data_strategy(), kind=st.sampled_from(FEATURE_KINDS), label=column_names)
def test_weighted_least_squares_with_odd_names(spark, data, kind, label):
    check_odd_names_fit(spark, data, kind, label)


def check_odd_names_fit(spark, data, kind, label) -> None:
    """Weighted least squares whose feature, label and weight columns have odd names."""
    names = ("x.1", "é 2", label, "w`eight")
    if len({n.lower() for n in names}) < 4 or label.startswith("__"):
        return
    check_linear_fit(spark, data, kind, names)


@pytest.mark.slow_spark
@SLOW
@given(data=regression_data_strategy(), kind=st.sampled_from(FEATURE_KINDS), label=column_names)
def test_weighted_least_squares_with_odd_names_many(spark, data, kind, label):
    check_odd_names_fit(spark, data, kind, label)


@pytest.mark.parametrize("name", ["__partition", "__iterflow_partition"])
def test_a_feature_named_as_an_internal_column_is_named(spark, name):
    df, features = ml_frame(
        spark, [[1.0, 2.0], [3.0, 1.0]], [1.0, 2.0], [1.0, 1.0], "columns", (name, "b", "y", "w")
    )
    with pytest.raises(MLError, match=rf"column '{name}' has the name of a column iterflow adds"):
        linear_regression(df, features=features, label="y", progress=False)
    with pytest.raises(MLError, match=rf"column '{name}' has the name of a column iterflow adds"):
        kmeans(df, 1, features=features, progress=False)


def test_kmeans_on_odd_names_matches_lloyd(spark):
    x = [[0.0, 0.0], [0.0, 0.3], [0.3, 0.0], [9.0, 0.0], [9.0, 0.6], [9.6, 0.0]]
    for kind in FEATURE_KINDS:
        df, features = ml_frame(spark, x, [0.0] * 6, [1.0] * 6, kind, ("a.b", "é", "y", "w"))
        model = kmeans(
            df, 2, features=features, init=[[0.0, 0.0], [9.0, 0.0]], max_rounds=2, progress=False
        )
        np.testing.assert_allclose(model.centroids, [[0.1, 0.1], [9.2, 0.2]], atol=1e-12)
