"""Connected components kept up to date while friendships come and go.

Three files of new edges and three of deleted ones arrive one micro-batch each (two
parquet streams read in step). After every micro-batch, the output "vertices" holds
every person's component (the least id in it) and "changed" only the people whose
component moved; both go to file sinks, each epoch exactly once.

    python examples/streaming_graph.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pandas as pd

import iterflow as itf
from iterflow.graph import streaming

ADDED = [
    [(1, 2), (2, 3), (4, 5)],  # {1, 2, 3} and {4, 5}
    [(3, 4), (6, 7)],  # 3 - 4 joins them: {1..5}; {6, 7}
    [(5, 6)],  # {1..7}
]
DELETED = [
    [],
    [],
    [(3, 4)],  # 3 - 4 goes as 5 - 6 comes: {1, 2, 3} and {4..7}
]


def write_files(folder: Path, batches: list[list[tuple[int, int]]]) -> None:
    folder.mkdir(parents=True)
    start = time.time() - 100
    for index, pairs in enumerate(batches):
        path = folder / f"edges-{index}.parquet"
        pd.DataFrame(pairs, columns=["src", "dst"], dtype="int64").to_parquet(path)
        os.utime(path, (start + index, start + index))  # the order the stream reads them


spark = itf.session()
work = Path(tempfile.mkdtemp(prefix="iterflow-streaming-graph-"))
write_files(work / "added", ADDED)
write_files(work / "deleted", DELETED)


def edge_stream(name: str):
    reader = spark.readStream.schema("src long, dst long").option("maxFilesPerTrigger", 1)
    return reader.parquet(str(work / name))


vertices, changed = itf.FileSink(str(work / "vertices")), itf.FileSink(str(work / "changed"))
query = (
    streaming.builder(
        "connected_components", edge_stream("added"), deletions=edge_stream("deleted")
    )
    .sink("vertices", vertices)
    .sink("changed", changed)
    .start(checkpoint_location=str(work / "checkpoint"), available_now=True, progress=False)
)
query.awaitTermination()

components = vertices.read(spark).orderBy("epoch", "id")
moves = changed.read(spark).orderBy("epoch", "id")
if __name__ == "__main__":
    components.show(30)
    moves.show(30)
    for epoch in query.history:
        print(f"epoch {epoch.epoch}: {epoch.metrics['changed']} vertices changed")
