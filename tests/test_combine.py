"""itf.combine: Beam's CombineFn on DataFrames, against numpy, on every path.

The paths: a DataFrame whose partitions Spark's plan gives without a job (the tree's
levels are shuffles), one whose partitions only running it gives (the last task makes
the tree), ``ctx.columnar`` data (resident, and Arrow files with a Spark job per
round), and a one-row variable computed on the driver. A CombineFn that returns the
shape of its merges pins that every path merges the same accumulators in the same
order.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import functions as F
from test_resident import settings

import iterflow as itf
from iterflow.runtime.datacache.combine import MergeTree
from iterflow.runtime.datacache.resident_policy import RESIDENT_CONF
from iterflow.runtime.spark.jvm import planned_partitions

pytestmark = pytest.mark.spark

# Spark's Python workers cannot import this module: its CombineFns travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Total(itf.CombineFn):
    """The sum and the number of the values of column ``x``."""

    def create_accumulator(self):
        return np.zeros(2)

    def add_input(self, acc, batch):
        x = batch.column("x").to_numpy(zero_copy_only=False)
        return acc + np.array([x.sum(), len(x)])

    def merge_accumulators(self, accs):
        merged = np.zeros(2)
        for acc in accs:
            merged = merged + acc
        return merged

    def extract_output(self, acc):
        return [(float(acc[0]), int(acc[1]), float(acc[0] / max(acc[1], 1)))]


TOTAL_SCHEMA = "total DOUBLE, n LONG, mean DOUBLE"


class Tree(itf.CombineFn):
    """The shape of the merges: a leaf is the sorted ``x`` of a partition, a merge the
    list of what it merged, in order."""

    def create_accumulator(self):
        return []

    def add_input(self, acc, batch):
        return sorted([*acc, *batch.column("x").to_pylist()])

    def merge_accumulators(self, accs):
        return list(accs)

    def extract_output(self, acc):
        return [(repr(acc),)]


class TopK(itf.CombineFn):
    """The k largest values of ``x``, largest first, one row each."""

    def __init__(self, k):
        self.k = k

    def create_accumulator(self):
        return np.empty(0)

    def add_input(self, acc, batch):
        x = batch.column("x").to_numpy(zero_copy_only=False)
        return np.sort(np.concatenate([acc, x]))[-self.k :]

    def merge_accumulators(self, accs):
        return np.sort(np.concatenate(accs))[-self.k :]

    def extract_output(self, acc):
        return pa.table({"rank": np.arange(len(acc), dtype=np.int32), "x": acc[::-1]})


class GaussianStats(itf.CombineFn):
    """A Gaussian mixture's E-step sufficient statistics for given weights, means and
    covariances: per component the responsibility-weighted count, sum and sum of outer
    products of the points (column ``p``, an array)."""

    def __init__(self, weights, means, covs):
        self.weights, self.means, self.covs = weights, means, covs

    def create_accumulator(self):
        k, d = self.means.shape
        return {"n": np.zeros(k), "s": np.zeros((k, d)), "ss": np.zeros((k, d, d))}

    def add_input(self, acc, batch):
        d = self.means.shape[1]
        x = batch.column("p").flatten().to_numpy().reshape(-1, d)
        r = responsibilities(x, self.weights, self.means, self.covs)
        acc["n"] += r.sum(axis=0)
        acc["s"] += r.T @ x
        acc["ss"] += np.einsum("nk,ni,nj->kij", r, x, x)
        return acc

    def merge_accumulators(self, accs):
        return {key: sum(acc[key] for acc in accs) for key in ("n", "s", "ss")}

    def extract_output(self, acc):
        k = len(acc["n"])
        return [
            {"k": c, "n": acc["n"][c], "s": acc["s"][c], "ss": acc["ss"][c].ravel()}
            for c in range(k)
        ]


GAUSSIAN_SCHEMA = "k INT, n DOUBLE, s ARRAY<DOUBLE>, ss ARRAY<DOUBLE>"


class FlatStats(GaussianStats):
    """The same statistics as one row: a model variable."""

    def extract_output(self, acc):
        return [tuple(acc[key].ravel() for key in ("n", "s", "ss"))]


FLAT_SCHEMA = "n ARRAY<DOUBLE>, s ARRAY<DOUBLE>, ss ARRAY<DOUBLE>"


class Rows(itf.CombineFn):
    """The number of rows."""

    def create_accumulator(self):
        return 0

    def add_input(self, acc, batch):
        return acc + batch.num_rows

    def merge_accumulators(self, accs):
        return sum(accs)

    def extract_output(self, acc):
        return [(acc,)]


def responsibilities(x, weights, means, covs):
    """p(component | point) for every point (rows) and component (columns)."""
    d = x.shape[1]
    densities = []
    for w, mu, cov in zip(weights, means, covs, strict=True):
        gap = x - mu
        mahalanobis = np.einsum("ni,ij,nj->n", gap, np.linalg.inv(cov), gap)
        norm = np.sqrt((2 * np.pi) ** d * np.linalg.det(cov))
        densities.append(w * np.exp(-0.5 * mahalanobis) / norm)
    joint = np.column_stack(densities)
    return joint / joint.sum(axis=1, keepdims=True)


def values_frame(spark, values, partitions):
    """A DataFrame of ``x`` over ``values`` in ``partitions`` ranges (Spark's plan knows them)."""
    array = F.array(*[F.lit(float(v)) for v in values])
    rows = spark.range(0, len(values), 1, partitions)
    return rows.select(F.element_at(array, (F.col("id") + 1).cast("int")).alias("x"))


def test_merge_tree_is_tree_aggregates_shape():
    assert MergeTree(10, 2).scale == 4 and MergeTree(10, 2).levels == (3,)
    assert MergeTree(1000, 3).scale == 10 and MergeTree(1000, 3).levels == (100, 10)
    assert MergeTree(4, 1).levels == () and MergeTree(1, 2).levels == ()
    assert MergeTree(5, 2).scale == 3 and MergeTree(5, 2).levels == (2,)
    assert MergeTree(0, 2).levels == ()


@pytest.mark.parametrize(("rows", "partitions"), [(100, 1), (100, 7), (8, 12)])
def test_sums_and_means_equal_numpy(spark, rows, partitions):
    values = np.arange(rows, dtype=float) * 3 - 40
    for df in (
        values_frame(spark, values, partitions),  # the plan knows its partitions
        values_frame(spark, values, 2).repartition(partitions),  # only running it does
    ):
        [row] = itf.combine(df, Total(), TOTAL_SCHEMA).collect()
        assert (row["total"], row["n"]) == (values.sum(), rows)
        assert row["mean"] == pytest.approx(values.mean(), rel=1e-15)


def test_an_empty_partition_gives_a_fresh_accumulator(spark):
    df = values_frame(spark, [5.0, 7.0], 6)  # four partitions without rows
    [row] = itf.combine(df, Tree(), "tree STRING", depth=1).collect()
    assert row["tree"] == repr([[], [], [5.0], [], [], [7.0]])
    empty = spark.createDataFrame([], "x DOUBLE")
    [row] = itf.combine(empty, Total(), TOTAL_SCHEMA).collect()
    assert (row["total"], row["n"]) == (0.0, 0)


def test_the_tree_is_tree_aggregates_whether_or_not_the_plan_knows_the_partitions(spark):
    leaves = [[float(i)] for i in range(7)]
    expected = {
        1: leaves,
        2: [leaves[0:3], leaves[3:6], leaves[6:7]],  # scale 3: 7 -> 3 -> 1
        3: [[leaves[0:2], leaves[2:4]], [leaves[4:6], leaves[6:7]]],  # scale 2: 7 -> 4 -> 2 -> 1
    }
    known = values_frame(spark, range(7), 7)
    # A range shuffle: the same placement, but only running the plan tells the partitions.
    unknown = values_frame(spark, range(7), 2).repartitionByRange(7, "x")
    for depth, tree in expected.items():
        for df in (known, unknown):
            [row] = itf.combine(df, Tree(), "tree STRING", depth=depth).collect()
            assert row["tree"] == repr(tree), depth


@pytest.mark.spark_classic("reads the physical plan through py4j")
def test_the_partitions_are_read_from_a_plan_that_runs_no_job(spark):
    known = values_frame(spark, range(7), 7)
    assert planned_partitions(known) == 7
    assert planned_partitions(known.repartitionByRange(3, "x")) is None  # a sampling job
    cached = known.where("x > 2").cache()
    assert planned_partitions(cached) is None  # filling the cache is a job
    cached.count()
    assert planned_partitions(cached) == 7
    cached.unpersist()


@pytest.mark.parametrize("partitions", [1, 9])
def test_depths_1_2_3_agree_to_the_bit_on_integer_valued_data(spark, partitions):
    rng = np.random.default_rng(partitions)
    values = rng.integers(-1000, 1000, 200).astype(float)
    df = values_frame(spark, values, partitions)
    results = {
        depth: itf.combine(df, Total(), TOTAL_SCHEMA, depth=depth).collect()[0]
        for depth in (1, 2, 3)
    }
    assert results[1] == results[2] == results[3]
    assert results[1]["total"] == values.sum()


def test_top_k_equals_numpy(spark):
    rng = np.random.default_rng(3)
    values = rng.normal(size=500)
    rows = itf.combine(values_frame(spark, values, 9), TopK(7), "rank INT, x DOUBLE").collect()
    got = [r["x"] for r in sorted(rows, key=lambda r: r["rank"])]
    assert got == sorted(values)[::-1][:7]


@pytest.fixture(scope="module")
def mixture():
    rng = np.random.default_rng(5)
    means = np.array([[0.0, 0.0], [4.0, 1.0], [-3.0, 5.0]])
    x = np.concatenate([rng.normal(m, 1.0, (120, 2)) for m in means])
    weights = np.array([0.2, 0.5, 0.3])
    covs = np.array([np.eye(2), [[2.0, 0.3], [0.3, 1.0]], [[1.0, -0.2], [-0.2, 0.5]]])
    r = responsibilities(x, weights, means + 0.5, covs)
    expected = {
        "n": r.sum(axis=0),
        "s": r.T @ x,
        "ss": np.einsum("nk,ni,nj->kij", r, x, x).reshape(3, -1),
    }
    return x, GaussianStats(weights, means + 0.5, covs), expected


def gaussian_rows(rows):
    ordered = sorted(rows, key=lambda r: r["k"])
    return {
        "n": np.array([r["n"] for r in ordered]),
        "s": np.array([r["s"] for r in ordered]),
        "ss": np.array([r["ss"] for r in ordered]),
    }


def assert_gaussian(rows, expected):
    got = gaussian_rows(rows)
    for key, want in expected.items():
        np.testing.assert_allclose(got[key], want, rtol=1e-12, atol=1e-9)


def points_frame(spark, x, partitions):
    table = pa.table({"p": [list(map(float, row)) for row in x]})
    return spark.createDataFrame(table).repartition(partitions)


def test_gaussian_mixture_statistics_equal_numpy_outside_a_body(spark, mixture):
    x, stats, expected = mixture
    for partitions in (1, 13):
        assert_gaussian(
            itf.combine(points_frame(spark, x, partitions), stats, GAUSSIAN_SCHEMA).collect(),
            expected,
        )


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_in_a_body_every_path_gives_the_same_statistics(spark, mixture, mode):
    """On the data input itself, on ``ctx.columnar`` data (resident under ``auto``, Arrow
    files under ``off``), and as a one-row variable (computed on the driver)."""
    x, stats, expected = mixture
    points = points_frame(spark, x, 6)
    schema = FLAT_SCHEMA

    flat = FlatStats(stats.weights, stats.means, stats.covs)

    @itf.body
    def step(model, points, values, ctx):
        columnar = ctx.columnar(points)
        new_model = itf.combine(columnar, flat, schema)  # the variable: on the driver
        return itf.Declaration(
            feedback={"model": new_model},
            outputs={
                "model": new_model,
                "data": itf.combine(points, stats, GAUSSIAN_SCHEMA),
                "columnar": itf.combine(columnar, stats, GAUSSIAN_SCHEMA),
                "tree": itf.combine(ctx.columnar(values), Tree(), "tree STRING"),
                "model rows": itf.combine(model, Rows(), "n LONG"),  # over the variable
            },
        )

    start = spark.createDataFrame([([0.0] * 3, [0.0] * 6, [0.0] * 12)], FLAT_SCHEMA)
    with settings(spark, **{RESIDENT_CONF: mode}):
        result = (
            itf.BoundedIteration(step)
            .bind("model", start)
            .bind("points", points)
            .bind("values", values_frame(spark, range(5), 5))
            .until(itf.max_rounds(2))
            .run(progress=False)
        )
    try:
        assert [p.resident for p in result.history] == [mode == "auto"] * 2
        assert_gaussian(result.outputs["data"].collect(), expected)
        assert_gaussian(result.outputs["columnar"].collect(), expected)
        [model] = result.outputs["model"].collect()
        np.testing.assert_allclose(model["n"], expected["n"], rtol=1e-12)
        np.testing.assert_allclose(np.reshape(model["ss"], (3, -1)), expected["ss"], rtol=1e-12)
        [tree] = result.outputs["tree"].collect()
        assert tree["tree"] == repr([[[0.0], [1.0], [2.0]], [[3.0], [4.0]]])  # scale 3
        assert result.outputs["model rows"].collect()[0]["n"] == 1
    finally:
        result.release()


def test_a_one_row_variable_alone_in_its_round_is_combined_on_the_driver(
    spark, mixture, monkeypatch
):
    from iterflow.runtime.round import materialize

    x, stats, expected = mixture
    combined: list[bool] = []

    def spy(df):
        table = combine_on_driver(df)
        combined.append(table is not None)
        return table

    combine_on_driver = materialize.combined_on_driver
    monkeypatch.setattr(materialize, "combined_on_driver", spy)

    @itf.body
    def step(model, points):
        new_model = itf.combine(
            points, FlatStats(stats.weights, stats.means, stats.covs), FLAT_SCHEMA
        )
        return itf.Declaration(feedback={"model": new_model}, outputs={"model": new_model})

    start = spark.createDataFrame([([0.0] * 3, [0.0] * 6, [0.0] * 12)], FLAT_SCHEMA)
    result = (
        itf.BoundedIteration(step)
        .bind("model", start)
        .bind("points", points_frame(spark, x, 5))
        .until(itf.max_rounds(2))
        .run(progress=False)
    )
    [model] = itf.to_arrow(result.outputs["model"]).to_pylist()
    result.release()
    assert combined and all(combined)  # from round 1 on, when its rows are known
    np.testing.assert_allclose(model["n"], expected["n"], rtol=1e-12)
    np.testing.assert_allclose(np.reshape(model["s"], (3, -1)), expected["s"], rtol=1e-12)
    np.testing.assert_allclose(np.reshape(model["ss"], (3, -1)), expected["ss"], rtol=1e-12)


# -- errors ---------------------------------------------------------------------------


class Holder(Total):
    def add_input(self, acc, batch):
        return threading.Lock()


class LockedStart(Total):
    def create_accumulator(self):
        return {"lock": threading.Lock()}


class Incomplete(itf.CombineFn):
    def create_accumulator(self):
        return 0


class Shaped(Total):
    def __init__(self, output):
        self.output = output

    def extract_output(self, acc):
        return self.output


class Failing(Total):
    def __init__(self, epoch):
        self.epoch = epoch

    def add_input(self, acc, batch):
        if self.epoch == 1:
            raise ValueError("no points today")
        return super().add_input(acc, batch)


def test_misuse_names_the_combine_fn(spark):
    df = values_frame(spark, [1.0, 2.0], 2)
    with pytest.raises(itf.IterflowError, match="takes a CombineFn, got a function"):
        itf.combine(df, lambda acc, batch: acc, TOTAL_SCHEMA)
    with pytest.raises(itf.IterflowError, match="'Incomplete' does not define add_input"):
        itf.combine(df, Incomplete(), TOTAL_SCHEMA)
    for depth in (0, "2", True):
        with pytest.raises(itf.IterflowError, match=r"depth.*CombineFn 'Total'.*int >= 1"):
            itf.combine(df, Total(), TOTAL_SCHEMA, depth=depth)
    with pytest.raises(itf.IterflowError, match=r"takes a DataFrame or what ctx\.columnar"):
        itf.combine([1, 2], Total(), TOTAL_SCHEMA)
    with pytest.raises(TypeError, match=r"'LockedStart': its accumulator .* after create_acc"):
        itf.combine(df, LockedStart(), TOTAL_SCHEMA)


def test_an_accumulator_that_cannot_be_pickled_after_add_input_fails_its_task(spark):
    combined = itf.combine(values_frame(spark, [1.0], 1), Holder(), TOTAL_SCHEMA)
    with pytest.raises(Exception, match=r"'Holder': its accumulator \(a lock\) .* after add_input"):
        combined.collect()


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ("one row", r"a str; return rows"),
        ([(1.0, 2)], r"a row of 2 value\(s\) where 3 columns"),
        (pa.table({"a": [1.0], "b": [2]}), r"2 column\(s\) \['a', 'b'\] where 3"),
        ([("many", 2, 3.0)], r"values for column 'total' that are not double"),
        ([{"total": 1.0, "n": 2}], r"a row with keys \['total', 'n'\]"),
    ],
)
def test_a_wrong_extract_output_names_the_combine_fn_and_the_schema(spark, output, says):
    combined = itf.combine(values_frame(spark, [1.0], 1), Shaped(output), TOTAL_SCHEMA)
    says = f"CombineFn 'Shaped'.extract_output returned {says}"
    with pytest.raises(Exception, match=says) as raised:
        combined.collect()
    assert f"the declared schema is '{TOTAL_SCHEMA}'" in str(raised.value)


def test_extract_output_may_return_dicts_pandas_and_castable_values(spark):
    import pandas as pd

    df = values_frame(spark, [1.0], 1)
    for output in (
        [{"n": np.int64(2), "mean": 1, "total": np.float32(1.5)}],
        pd.DataFrame({"t": [1.5], "n": [2], "m": [1.0]}),
        pa.record_batch(
            [pa.array([1.5]), pa.array([2], pa.int32()), pa.array([1])], ["t", "n", "m"]
        ),
    ):
        assert [tuple(r) for r in itf.combine(df, Shaped(output), TOTAL_SCHEMA).collect()] == [
            (1.5, 2, 1.0)
        ]


def test_a_failing_add_input_names_the_combine_fn_and_the_epoch(spark):
    @itf.body
    def step(model, points, ctx):
        new_model = itf.combine(points, Failing(ctx.epoch), TOTAL_SCHEMA)
        return itf.Declaration(feedback={"model": new_model})

    start = spark.createDataFrame([(0.0, 0, 0.0)], TOTAL_SCHEMA)
    iteration = (
        itf.BoundedIteration(step)
        .bind("model", start)
        .bind("points", values_frame(spark, [1.0, 2.0, 3.0], 3))
        .until(itf.max_rounds(3))
    )
    with pytest.raises(itf.RoundError) as raised:
        iteration.run(progress=False)
    message = str(raised.value)
    assert raised.value.epoch == 1
    assert "CombineFn 'Failing'.add_input failed in epoch 1: ValueError: no points today" in message
