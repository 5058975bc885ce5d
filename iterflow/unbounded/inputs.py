"""Streaming inputs: one query over all of them, split again per micro-batch, and chunked.

Structured Streaming runs one ``foreachBatch`` function per query, so several
streaming inputs are read as one: each input's rows are packed into a struct
column of their own and tagged with the input's index, the tagged streams are
unioned, and every micro-batch is split back by tag. One input needs none of it.

``max_rows_per_epoch`` cuts a micro-batch into chunks of at most that many rows,
one epoch each. Rows are numbered by ``monotonically_increasing_id`` (partition
index in the upper bits) on the persisted batch, and a chunk is a range of
global row numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iterflow.runtime.spark.schema import quoted

TAG = "_iterflow_input"
_ROW = "_iterflow_row"
_PARTITION_BITS = 33  # monotonically_increasing_id: partition index << 33 | row in partition


def _packed(index: int) -> str:
    return f"_iterflow_{index}"


def combined(streams: Mapping[str, DataFrame]) -> DataFrame:
    """One streaming DataFrame carrying the rows of every input in ``streams``."""
    frames = list(streams.values())
    if len(frames) == 1:
        return frames[0]
    tagged = [
        df.select(F.lit(index).alias(TAG), F.struct(*map(quoted, df.columns)).alias(_packed(index)))
        for index, df in enumerate(frames)
    ]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), tagged)


def split(batch: DataFrame, names: Sequence[str]) -> dict[str, DataFrame]:
    """The rows of each input in a micro-batch of ``combined(...)`` (same order of names)."""
    if len(names) == 1:
        return {names[0]: batch}
    return {
        name: batch.where(F.col(TAG) == index).select(f"{_packed(index)}.*")
        for index, name in enumerate(names)
    }


class Chunks:
    """A micro-batch cut into chunks of at most ``max_rows`` rows (persisted while in use)."""

    def __init__(self, batch: DataFrame, max_rows: int) -> None:
        self._numbered = batch.withColumn(_ROW, F.monotonically_increasing_id()).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        try:
            self._number(max_rows)
        except BaseException:
            self.release()
            raise

    def _number(self, max_rows: int) -> None:
        partition = F.shiftright(F.col(_ROW), _PARTITION_BITS)
        counts = sorted(
            (int(r["p"]), int(r["n"]))
            for r in self._numbered.groupBy(partition.alias("p"))
            .count()
            .withColumnRenamed("count", "n")
            .collect()
        )
        offsets, total = [], 0
        for p, n in counts:
            offsets.append((p, total))
            total += n
        self.rows = total
        self.max_rows = max_rows
        if offsets:
            first = F.create_map(*[F.lit(v) for pair in offsets for v in pair])
            local = F.col(_ROW).bitwiseAND(F.lit((1 << _PARTITION_BITS) - 1))
            self._global = F.element_at(first, partition) + local
        else:
            self._global = F.lit(0)

    def __len__(self) -> int:
        return -(-self.rows // self.max_rows)

    def chunk(self, index: int) -> DataFrame:
        low = index * self.max_rows
        return self._numbered.where(self._global.between(low, low + self.max_rows - 1)).drop(_ROW)

    def release(self) -> None:
        self._numbered.unpersist(blocking=False)
