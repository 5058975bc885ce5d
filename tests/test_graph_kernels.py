"""Vertex programs written as Column expressions, compiled to numpy and run on the kernel
engine: the evaluator against Spark's own evaluation of the same expressions (nulls, NaN,
infinities, integer and double mixes), and whole programs (iterflow's ``pregel`` and
GraphFrames' builder) against the DataFrame path and networkx, with the fallback for what
does not compile named in the event log."""

from __future__ import annotations

import json
import math
import random

import networkx as nx
import pytest
from pyspark.sql import functions as F

from iterflow.graph import Graph, GraphFrame, Pregel, pregel
from iterflow.graph.expressions import Scope, Unsupported, evaluate, from_arrow, parse

ROWS = [
    (1, 2, 1.5, 2.0, True, 7),
    (0, -3, float("nan"), 0.0, False, None),
    (None, 4, -2.0, float("nan"), None, 3),
    (5, None, float("inf"), None, True, -1),
    (-2, 0, None, -0.5, False, 0),
    (3, 3, 0.0, float("-inf"), None, None),
]
SCHEMA = "i int, j int, x double, y double, b boolean, k bigint"

EXPRESSIONS = {
    "add": lambda: F.col("i") + F.col("j"),
    "mixed": lambda: F.col("i") * F.col("x") - F.col("k"),
    "divide": lambda: F.col("x") / F.col("y"),
    "int_divide": lambda: F.col("i") / F.col("j"),
    "remainder": lambda: F.col("k") % F.col("i"),
    "lt": lambda: F.col("x") < F.col("y"),
    "ge": lambda: F.col("i") >= F.col("j"),
    "eq_nan": lambda: F.col("x") == F.col("y"),
    "ne": lambda: F.col("x") != F.lit(0.0),
    "null_safe": lambda: F.col("x").eqNullSafe(F.col("y")),
    "and": lambda: F.col("b") & (F.col("x") > 0),
    "or": lambda: F.col("b") | (F.col("y") > 0),
    "not": lambda: ~F.col("b"),
    "when": lambda: (
        F.when(F.col("x") > 1, F.col("x")).when(F.col("b"), F.lit(-1)).otherwise(F.col("j"))
    ),
    "when_no_else": lambda: F.when(F.col("b"), F.col("k")),
    "coalesce": lambda: F.coalesce(F.col("x"), F.col("y"), F.lit(9.0)),
    "least": lambda: F.least(F.col("x"), F.col("y"), F.col("i")),
    "greatest": lambda: F.greatest(F.col("x"), F.col("y")),
    "abs": lambda: F.abs(F.col("j")),
    "negative": lambda: -F.col("k"),
    "sqrt": lambda: F.sqrt(F.col("x")),
    "exp": lambda: F.exp(F.col("y")),
    "ln": lambda: F.log(F.col("x")),
    "log_base": lambda: F.log(2.0, F.col("y")),
    "log10": lambda: F.log10(F.col("k")),
    "isnan": lambda: F.isnan(F.col("x")),
    "nanvl": lambda: F.nanvl(F.col("x"), F.col("y")),
    "is_null": lambda: F.col("i").isNull() | F.col("k").isNotNull(),
    "cast_int": lambda: F.col("y").cast("int"),
    "cast_double": lambda: F.col("k").cast("double") + 0.5,
    "pow": lambda: F.pow(F.col("i"), F.lit(2)),
    "nested": lambda: (
        F.coalesce(F.least(F.col("x") + 1, F.col("y") * 2), F.lit(0.0)) * 0.85 + 0.15 / 7
    ),
    "literal_null": lambda: F.when(F.col("i") > 0, None).otherwise(F.col("x")),
}


def _same(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == pytest.approx(b, rel=1e-12, abs=0.0)
    return a == b


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_each_expression_evaluates_as_spark_does(spark, name):
    spark.conf.set("spark.sql.ansi.enabled", "false")  # x / 0 is null, not an error
    try:
        df = spark.createDataFrame(ROWS, SCHEMA)
        expr = EXPRESSIONS[name]()
        spark_rows = [r[0] for r in df.select(expr.alias("v")).collect()]
        spark_type = df.select(expr.alias("v")).schema["v"].dataType.simpleString()
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")
    table = df.toArrow()
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    scope = Scope(lambda c: from_arrow(table.column(c), types[c]), len(ROWS), ansi=False)
    value = evaluate(parse(expr), scope)
    ours = [value.data[i].item() if value.validity()[i] else None for i in range(len(ROWS))]
    assert value.type == spark_type
    assert all(_same(a, b) for a, b in zip(ours, spark_rows, strict=True)), (ours, spark_rows)


def test_outside_the_compiled_set_is_unsupported_and_named():
    with pytest.raises(Unsupported, match="concat"):
        scope = Scope(lambda c: None, 0)
        evaluate(parse(F.concat(F.col("a"), F.col("b"))), scope)


def graph(spark, n=50, m=160, seed=11):
    """A directed graph with a self-loop, repeated edges, a dangling and an isolated vertex."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(n - 2), rng.randrange(n - 2)) for _ in range(m)]
    pairs += [(0, 0), (1, 2), (1, 2), (3, n - 2)]  # n - 2 dangling, n - 1 isolated
    w = [round(rng.uniform(0.5, 5.0), 3) for _ in pairs]
    g = Graph(
        spark.createDataFrame(
            [(i, f"v{i}", i % 3) for i in range(n)], "id long, name string, c int"
        ),
        spark.createDataFrame(
            [(a, b, x) for (a, b), x in zip(pairs, w, strict=True)], "src long, dst long, w double"
        ),
    )
    return g, pairs, w


def _started(path):
    with open(path) as f:
        return [e for e in map(json.loads, f) if e["event"] == "iteration_started"]


def _rows(df, *columns):
    return {r["id"]: tuple(r[c] for c in columns) for r in df.collect()}


def _sssp(g, method, **options):
    return pregel(
        g,
        init={"dist": F.when(F.col("id") == 1, 0.0).otherwise(F.lit(None).cast("double"))},
        update={"dist": F.least(F.col("dist"), Pregel.msg())},
        send_to_dst=Pregel.src("dist") + Pregel.edge("w"),
        aggregate=F.min,
        method=method,
        **options,
    )


def test_shortest_paths_with_nulls_on_kernels_equal_the_dataframe_path_and_networkx(
    spark, tmp_path
):
    g, pairs, w = graph(spark)
    log = tmp_path / "events.jsonl"
    kernel = _rows(_sssp(g, "auto", event_log=str(log)), "dist", "name")
    frame = _rows(_sssp(g, "dataframe"), "dist", "name")
    assert _started(log)[-1]["notes"] == {"engine": "kernel"}
    h = nx.DiGraph()
    for (a, b), x in zip(pairs, w, strict=True):
        if not h.has_edge(a, b) or h[a][b]["w"] > x:
            h.add_edge(a, b, w=x)
    reference = nx.single_source_dijkstra_path_length(h, 1, weight="w")
    assert set(kernel) == set(frame) == set(range(50))
    for v, (dist, name) in kernel.items():
        assert name == f"v{v}"
        assert _same(dist, frame[v][0])
        assert (dist is None) == (v not in reference)
        if dist is not None:
            assert dist == pytest.approx(reference[v], abs=1e-9)


def test_components_and_an_active_rule_equal_the_dataframe_path(spark):
    g, pairs, _ = graph(spark, seed=5)

    def run(method):
        return pregel(
            g,
            init={"label": F.col("id"), "seen": F.lit(0)},
            update={"label": F.least(F.col("label"), Pregel.msg()), "seen": F.col("seen") + 1},
            send_to_dst=Pregel.src("label"),
            send_to_src=Pregel.dst("label"),
            aggregate=F.min,
            active=F.col("label") < Pregel.old("label"),
            method=method,
        )

    kernel, frame = _rows(run("arrow"), "label", "seen"), _rows(run("dataframe"), "label", "seen")
    assert kernel == frame
    h = nx.Graph()
    h.add_nodes_from(range(50))
    h.add_edges_from(pairs)
    for component in nx.connected_components(h):
        assert {kernel[v][0] for v in component} == {min(component)}


def _builder_pagerank(g, n):
    degrees = GraphFrame(g.vertices, g.edges).outDegrees
    with_degrees = GraphFrame(g.vertices.join(degrees, "id", "left"), g.edges)
    return (
        with_degrees.pregel.setMaxIter(8)
        .withVertexColumn(
            "rank", F.lit(1.0 / n), F.coalesce(Pregel.msg(), F.lit(0.0)) * 0.85 + 0.15 / n
        )
        .sendMsgToDst(Pregel.src("rank") / Pregel.src("outDegree"))
        .aggMsgs(F.sum(Pregel.msg()))
    )


def _on_dataframes(spark, run):
    spark.conf.set("spark.iterflow.graph.vectorLimit", "0")
    try:
        return run()
    finally:
        spark.conf.unset("spark.iterflow.graph.vectorLimit")


def test_graphframes_builder_pagerank_on_kernels_equals_the_dataframe_path_and_networkx(
    spark, tmp_path
):
    g, pairs, _ = graph(spark, seed=7)
    log = tmp_path / "events.jsonl"
    kernel = _rows(_builder_pagerank(g, 50).run(event_log=str(log)), "rank")
    frame = _rows(_on_dataframes(spark, lambda: _builder_pagerank(g, 50).run()), "rank")
    assert _started(log)[-1]["notes"] == {"engine": "kernel"}
    assert set(kernel) == set(frame) == set(range(50))
    for v in kernel:
        assert kernel[v][0] == pytest.approx(frame[v][0], rel=1e-12)
    # The same 8 rounds by hand on networkx's multigraph (no dangling redistribution).
    h = nx.MultiDiGraph()
    h.add_nodes_from(range(50))
    h.add_edges_from(pairs)
    rank = dict.fromkeys(range(50), 1 / 50)
    for _ in range(8):
        got = dict.fromkeys(range(50), 0.0)
        for a, b in h.edges():
            got[b] += rank[a] / h.out_degree(a)
        rank = {v: got[v] * 0.85 + 0.15 / 50 for v in range(50)}
    assert all(kernel[v][0] == pytest.approx(rank[v], rel=1e-9) for v in range(50))


def test_builder_rules_skip_early_stop_and_all_inactive_equal_the_dataframe_path(spark):
    g, _, _ = graph(spark, seed=9)
    for skip, early, inactive in [(True, False, True), (False, True, False), (True, True, False)]:

        def build(skip=skip, early=early, inactive=inactive):
            return (
                GraphFrame(g.vertices, g.edges)
                .pregel.setMaxIter(12)
                .withVertexColumn(
                    "d",
                    F.when(F.col("id") == 1, 0.0).otherwise(float("inf")),
                    F.least(F.col("d"), F.coalesce(Pregel.msg(), F.lit(float("inf")))),
                )
                .withVertexColumn("hops", F.lit(0), F.col("hops") + F.col("c"))
                .setInitialActiveVertexExpression(F.col("id") == 1)
                .setUpdateActiveVertexExpression(
                    F.col("d") > F.coalesce(Pregel.msg(), F.lit(float("inf")))
                )
                .setSkipMessagesFromNonActiveVertices(skip)
                .setEarlyStopping(early)
                .setStopIfAllNonActiveVertices(inactive)
                .sendMsgToDst(
                    F.when(Pregel.src("d") < float("inf"), Pregel.src("d") + Pregel.edge("w"))
                )
                .aggMsgs(F.min(Pregel.msg()))
                .run()
            )

        kernel = _rows(build(), "d", "hops")
        frame = _rows(_on_dataframes(spark, build), "d", "hops")
        assert kernel == frame, (skip, early, inactive)


def test_an_expression_outside_the_set_falls_back_and_says_why(spark, tmp_path):
    g, _, _ = graph(spark, n=12, m=30)
    log = tmp_path / "events.jsonl"
    rows = pregel(
        g,
        init={"tag": F.concat(F.col("name"), F.lit("!"))},
        update={"tag": F.greatest(F.col("tag"), Pregel.msg())},
        send_to_dst=Pregel.src("tag"),
        aggregate=F.max,
        max_rounds=3,
        event_log=str(log),
    ).collect()
    notes = _started(log)[-1]["notes"]
    assert notes["engine"] == "dataframe" and "concat" in notes["reason"]
    assert all(r.tag.endswith("!") for r in rows)


def test_listeners_see_messages_and_active_on_kernels(spark):
    g, _, _ = graph(spark)
    seen = []
    _sssp(g, "arrow", listen=lambda end: seen.append(end.progress.observed))
    frame = []
    _sssp(g, "dataframe", listen=lambda end: frame.append(end.progress.observed))
    assert [o["messages"] for o in seen] == [o["messages"] for o in frame]
    assert [o["active"] for o in seen] == [o["active"] for o in frame]


def test_aggregate_messages_on_kernels_equals_the_dataframe_path(spark):
    from iterflow.graph import AggregateMessages as AM
    from iterflow.graph import aggregate_messages

    g, pairs, w = graph(spark, seed=13)
    v = g.vertices.withColumn("x", F.when(F.col("id") % 4 == 0, None).otherwise(F.col("id") * 0.5))
    h = Graph(v, g.edges)

    def run(method="arrow"):
        return aggregate_messages(
            h,
            [
                F.sum(AM.msg).alias("total"),
                F.min(AM.msg).alias("low"),
                F.max(AM.msg).alias("high"),
                F.count(AM.msg).alias("n"),
            ],
            send_to_dst=AM.src["x"] + AM.edge["w"],
            send_to_src=F.col("dst.x") * 2,
            method=method,
        )

    kernel = run()
    frame = run("dataframe")
    assert [(f.name, f.dataType) for f in kernel.schema.fields] == [
        (f.name, f.dataType) for f in frame.schema.fields
    ]
    got, want = (
        _rows(kernel, "total", "low", "high", "n"),
        _rows(frame, "total", "low", "high", "n"),
    )
    assert set(got) == set(want)
    for vertex, row in want.items():
        assert all(_same(a, b) for a, b in zip(got[vertex], row, strict=True)), (vertex, row)
    # networkx: the in-neighbours' x plus the edge's w, summed, where x is not null.
    x = {i: None if i % 4 == 0 else i * 0.5 for i in range(50)}
    into = {}
    for (a, b), weight in zip(pairs, w, strict=True):
        if x[a] is not None:
            into[b] = into.get(b, 0.0) + x[a] + weight
        if x[b] is not None:
            into[a] = into.get(a, 0.0) + 2 * x[b]
    assert {k: r[0] for k, r in got.items() if r[0] is not None} == pytest.approx(into)


@pytest.mark.parametrize("early", [False, True])
def test_builder_pagerank_gives_the_values_graphframes_publishes(spark, early):
    # GraphFrames' own Python test of its Pregel builder: 5 rounds on this graph.
    edges = spark.createDataFrame(
        [(0, 1), (1, 2), (2, 4), (2, 0), (3, 4), (4, 0), (4, 2)], "src long, dst long"
    )
    vertices = GraphFrame(spark.createDataFrame([(i,) for i in range(5)], "id long"), edges)
    graph = GraphFrame(vertices.outDegrees, edges)
    ranks = (
        graph.pregel.setMaxIter(5)
        .setEarlyStopping(early)
        .withVertexColumn(
            "rank",
            F.lit(1.0 / 5),
            F.coalesce(graph.pregel.msg(), F.lit(0.0)) * F.lit(0.85) + F.lit(0.15 / 5),
        )
        .sendMsgToDst(graph.pregel.src("rank") / graph.pregel.src("outDegree"))
        .aggMsgs(F.sum(graph.pregel.msg()))
        .run()
    )
    got = [r.rank for r in ranks.sort("id").collect()]
    assert got == pytest.approx([0.245, 0.224, 0.303, 0.03, 0.197], abs=1e-3)


@pytest.mark.parametrize("blocks", [1, 3])
def test_compiled_programs_on_the_block_path_equal_the_dataframe_path(spark, tmp_path, blocks):
    g, pairs, _ = graph(spark, seed=17)
    log = tmp_path / "events.jsonl"
    on_blocks = _rows(_sssp(g, "blocks", blocks=blocks, event_log=str(log)), "dist", "name")
    assert _started(log)[-1]["notes"] == {"engine": "kernel", "path": "blocks"}
    frame = _rows(_sssp(g, "dataframe"), "dist", "name")
    assert set(on_blocks) == set(frame)
    assert all(_same(on_blocks[v][0], frame[v][0]) for v in frame)
    assert all(on_blocks[v][1] == f"v{v}" for v in frame)

    def components(method):
        return pregel(
            g,
            init={"label": F.col("id")},
            update={"label": F.least(F.col("label"), Pregel.msg())},
            send_to_dst=Pregel.src("label"),
            send_to_src=Pregel.dst("label"),
            aggregate=F.min,
            method=method,
            blocks=blocks,
        )

    labels = _rows(components("blocks"), "label")
    assert labels == _rows(components("dataframe"), "label")
    h = nx.Graph()
    h.add_nodes_from(range(50))
    h.add_edges_from(pairs)
    for component in nx.connected_components(h):
        assert {labels[v][0] for v in component} == {min(component)}


def test_a_message_reading_the_receiver_keeps_the_block_joins_and_says_why(spark, tmp_path):
    g, _, _ = graph(spark, n=20, m=60, seed=19)
    log = tmp_path / "events.jsonl"
    rows = _rows(
        pregel(
            g,
            init={"d": F.when(F.col("id") == 1, 0.0).otherwise(float("inf"))},
            update={"d": F.least(F.col("d"), Pregel.msg())},
            send_to_dst=F.when(
                Pregel.src("d") + Pregel.edge("w") < Pregel.dst("d"),
                Pregel.src("d") + Pregel.edge("w"),
            ),
            aggregate=F.min,
            method="blocks",
            blocks=2,
            event_log=str(log),
        ),
        "d",
    )
    notes = _started(log)[-1]["notes"]
    assert notes["engine"] == "dataframe" and "reads the destination" in notes["reason"]
    expected = _rows(
        pregel(
            g,
            init={"d": F.when(F.col("id") == 1, 0.0).otherwise(float("inf"))},
            update={"d": F.least(F.col("d"), Pregel.msg())},
            send_to_dst=Pregel.src("d") + Pregel.edge("w"),
            aggregate=F.min,
            method="arrow",
        ),
        "d",
    )
    assert all(rows[v][0] == pytest.approx(expected[v][0]) for v in expected)


def test_aggregate_messages_first_on_kernels(spark):
    from iterflow.graph import AggregateMessages as AM
    from iterflow.graph import aggregate_messages

    g, _, _ = graph(spark, seed=29)
    v = g.vertices.withColumn("x", F.col("id") * 2)

    def run(method):
        # Every message to a vertex is its own x: first() has one answer.
        return aggregate_messages(
            Graph(v, g.edges),
            [F.first(AM.msg).alias("mine"), F.count(AM.msg).alias("n")],
            send_to_dst=AM.dst["x"],
            method=method,
        )

    kernel = _rows(run("arrow"), "mine", "n")
    assert kernel == _rows(run("dataframe"), "mine", "n")
    assert all(mine == 2 * vertex for vertex, (mine, _) in kernel.items())
