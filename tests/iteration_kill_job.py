"""Checkpointed bounded runs in their own process, for the kill tests of output sinks and
nested iterations.

Usage: iteration_kill_job.py sink|nested WORK_DIR. ``sink`` runs 20 rounds writing every
round's output to a FileSink under WORK_DIR/out, checkpointing only epoch 12 (and the
last); ``nested`` runs the line-search example (an iteration inside every round of
another) with checkpoints every 2 outer rounds. Rounds are slowed down so that a kill
lands inside them. Writes the result to WORK_DIR/result.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from child_jobs import job_master

import iterflow as itf
from iterflow.runtime.spark.session import embedded_session

SINK_ROUNDS, SINK_EVERY = 20, 13
NESTED_ROUNDS, NESTED_EVERY, NESTED_ROWS = 6, 2, 200
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "line_search.py"


@itf.body
def shift(x):  # type: ignore[no-untyped-def]
    nxt = x.selectExpr("id", "v * 2 + id AS v")
    return itf.Declaration(feedback={"x": nxt}, outputs={"x": nxt})


def sink_rows(rounds: int) -> list[tuple[int, int, int]]:
    """(epoch, id, v) of every round of ``shift`` from v = id."""
    rows = []
    values = {i: i for i in range(8)}
    for epoch in range(rounds):
        values = {i: v * 2 + i for i, v in values.items()}
        rows += [(epoch, i, v) for i, v in values.items()]
    return sorted(rows)


def line_search() -> Any:
    spec = importlib.util.spec_from_file_location("line_search_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_sink(spark: Any, work: Path) -> dict[str, Any]:
    result = (
        itf.BoundedIteration(shift)
        .bind("x", spark.createDataFrame([(i, i) for i in range(8)], "id INT, v LONG"))
        .until(itf.max_rounds(SINK_ROUNDS))
        .sink("x", itf.FileSink(str(work / "out")))
        .listen(lambda ctx: time.sleep(0.4))
        .run(
            checkpoint_dir=str(work / "ckpt"),
            checkpoint_every=SINK_EVERY,
            event_log=str(work / "events.jsonl"),
        )
    )
    return {"rounds": result.rounds, "resumed_from": result.resumed_from}


def run_nested(spark: Any, work: Path) -> dict[str, Any]:
    example = line_search()
    iterate = example.LineSearch.iterate

    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return iterate(self, *args, **kwargs)

    example.LineSearch.iterate = slow
    x, label = example.data(NESTED_ROWS)
    rows = [(list(map(float, xi)), float(yi)) for xi, yi in zip(x, label, strict=True)]
    points = spark.createDataFrame(rows, "x ARRAY<DOUBLE>, label DOUBLE")
    result = example.fit(
        points,
        dims=3,
        rounds=NESTED_ROUNDS,
        checkpoint_dir=str(work / "ckpt"),
        checkpoint_every=NESTED_EVERY,
        event_log=str(work / "events.jsonl"),
    )
    return {
        "w": itf.vector(result.outputs["model"], "w").tolist(),
        "reference": example.reference(x, label, NESTED_ROUNDS).tolist(),
        "rounds": result.rounds,
        "resumed_from": result.resumed_from,
        "trials": result.metrics["line_search_trials"].committed,
        "history_paths": [list(p.epoch_path) for p in result.history],
    }


def main(mode: str, work_dir: str) -> None:
    work = Path(work_dir)
    spark = embedded_session(
        job_master("local[2]"),
        app_name="iterflow-iteration-kill",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    out = run_sink(spark, work) if mode == "sink" else run_nested(spark, work)
    (work / "result.json").write_text(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    os._exit(0)
