"""RoundContext.columnar: a data input written once as Arrow files that kernels read in place.

These tests pin the per-round-job path (``spark.iterflow.resident=off``); test_resident.py
runs the same kernels on resident data."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import iterflow as itf
from iterflow.runtime.datacache.columnar import DIRECTORY_CONF, _open
from iterflow.runtime.datacache.resident_policy import RESIDENT_CONF


@pytest.fixture(autouse=True)
def files_path(spark):
    """Kernels read Arrow files, one Spark job per map."""
    spark.conf.set(RESIDENT_CONF, "off")
    yield
    spark.conf.unset(RESIDENT_CONF)


def test_kernels_read_the_files_written_once_for_the_whole_iteration(spark, tmp_path):
    values = np.arange(1, 1001, dtype=np.float64)
    points = spark.createDataFrame(pa.table({"x": values})).repartition(3)
    seen = []

    def doubled(table: pa.Table) -> pa.Table:  # the prepare step runs once per partition
        return pa.table({"x2": pc.multiply(table["x"], 2.0)})

    def total(table: pa.Table, scale: float) -> pa.Table:
        return pa.table({"total": [float(np.sum(table["x2"].to_numpy())) * scale]})

    @itf.body
    def step(acc, points, ctx):
        files = ctx.columnar(points, doubled)
        seen.append(files)
        assert all(os.path.exists(location) for location in files.locations)
        partial = files.map(total, "total DOUBLE", ctx.epoch + 1.0)
        new_acc = partial.groupBy().sum("total").withColumnRenamed("sum(total)", "acc")
        return itf.Declaration(feedback={"acc": new_acc}, outputs={"acc": new_acc})

    spark.conf.set(DIRECTORY_CONF, str(tmp_path))
    try:
        result = (
            itf.BoundedIteration(step)
            .bind("acc", spark.createDataFrame([(0.0,)], "acc double"))
            .bind("points", points)
            .until(itf.max_rounds(3))
            .run(progress=False)
        )
    finally:
        spark.conf.unset(DIRECTORY_CONF)
    # Round k sums 2x scaled by k + 1: the last round (k = 2) gives 3 * 2 * sum(x).
    assert result.outputs["acc"].first()["acc"] == pytest.approx(3 * 2 * values.sum())
    assert seen[0] is seen[1] is seen[2]  # written at the first call only
    assert seen[0].rows == 1000 and seen[0].partitions == 3
    assert all(loc.startswith(str(tmp_path)) for loc in seen[0].locations)
    assert not any(os.path.exists(location) for location in seen[0].locations)  # released


def test_a_missing_file_names_the_setting_to_fix(tmp_path):
    with pytest.raises(itf.IterflowError, match=DIRECTORY_CONF):
        _open(str(tmp_path / "part-gone.arrow"))


def test_combine_sees_the_kernels_outputs_in_file_order_on_spark_and_on_the_driver(spark):
    from iterflow.runtime.datacache.columnar import ColumnarData, combined_on_driver

    values = np.arange(1, 2001, dtype=np.float64)
    files = ColumnarData.write(spark.createDataFrame(pa.table({"x": values})).repartition(5))
    try:

        def total(index: int, table: pa.Table) -> pa.Table:
            return pa.table({"file": [index], "total": [float(np.sum(table["x"].to_numpy()))]})

        def combine(batches):
            table = pa.Table.from_batches(list(batches))
            yield from pa.table(
                {"order": [table["file"].to_pylist()], "sum": [float(np.sum(table["total"]))]}
            ).to_batches()

        combined = files.map(
            total,
            "file LONG, total DOUBLE",
            indexed=True,
            combine=combine,
            combine_schema="order ARRAY<LONG>, sum DOUBLE",
        )
        on_spark = combined.collect()
        on_driver = combined_on_driver(combined).to_pylist()
        assert [(r["order"], r["sum"]) for r in on_spark] == [(list(range(5)), values.sum())]
        assert on_driver == [{"order": list(range(5)), "sum": values.sum()}]
        assert combined_on_driver(spark.range(1)) is None  # not a combined result
        with pytest.raises(itf.IterflowError, match="combine_schema"):
            files.map(total, "file LONG, total DOUBLE", indexed=True, combine=combine)
    finally:
        files.release()
