"""A checkpointed label propagation run in its own process, for the kill test.

Usage: checkpoint_kill_job.py CHECKPOINT_DIR EVENT_LOG OUT_JSON. Runs 15 rounds of
min-label propagation on a path graph with shuffled ids, ``checkpoint_every=2``, under
``local[2,4]`` (tasks may be retried) with a UDF whose first attempt on partition 0
fails; writes the labels and what was restored to OUT_JSON."""

from __future__ import annotations

import itertools
import json
import os
import random
import sys

from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

import iterflow as itf
from iterflow.runtime.spark.session import embedded_session

VERTICES, ROUNDS, EVERY, SEED = 60, 15, 2, 7


def path_ids() -> list[int]:
    """Vertex ids along the path, shuffled so that labels keep changing for many rounds."""
    ids = list(range(VERTICES))
    random.Random(SEED).shuffle(ids)
    return ids


class RoundCounter(itf.RoundListener):
    """Counts the rounds it saw; its state survives restarts through state_dict."""

    def __init__(self) -> None:
        self.rounds = 0

    def on_round_end(self, ctx: itf.RoundEnd) -> None:
        self.rounds += 1

    def state_dict(self) -> dict[str, int]:
        return {"rounds": self.rounds}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.rounds = state["rounds"]


@F.udf(LongType())  # a type object: importable before a session exists
def flaky(label):  # type: ignore[no-untyped-def]
    context = TaskContext.get()
    if context.partitionId() == 0 and context.attemptNumber() == 0:
        raise RuntimeError("the first attempt of partition 0 fails")
    return label


@itf.body
def propagate(labels, edges, ctx):  # type: ignore[no-untyped-def]
    ctx.state["rounds"] = ctx.state.get("rounds", 0) + 1
    messages = labels.join(edges, labels.id == edges.src).select(
        edges.dst.alias("id"), flaky(labels.label).alias("label")
    )
    new = labels.unionByName(messages).groupBy("id").agg(F.min("label").alias("label"))
    return itf.Declaration(feedback={"labels": new}, outputs={"labels": new})


def main(checkpoint_dir: str, event_log: str, out: str) -> None:
    spark = embedded_session(
        "local[2,4]",
        app_name="iterflow-checkpoint-kill",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    ids = path_ids()
    pairs = list(itertools.pairwise(ids))
    edges = spark.createDataFrame(pairs + [(b, a) for a, b in pairs], "src long, dst long")
    labels = spark.createDataFrame([(v, v) for v in ids], "id long, label long")
    counter = RoundCounter()
    state_rounds: list[int] = []
    result = (
        itf.BoundedIteration(propagate)
        .bind("labels", labels)
        .bind("edges", edges)
        .until(itf.max_rounds(ROUNDS))
        .listen(counter)
        .listen(lambda ctx: state_rounds.append(ctx.state["rounds"]))
        .run(checkpoint_dir=checkpoint_dir, checkpoint_every=EVERY, event_log=event_log)
    )
    found = sorted((r["id"], r["label"]) for r in result.outputs["labels"].collect())
    with open(out, "w") as handle:
        json.dump(
            {
                "labels": found,
                "rounds": result.rounds,
                "resumed_from": result.resumed_from,
                "listener_rounds": counter.rounds,
                "state_rounds": state_rounds[-1] if state_rounds else None,
                "history_epochs": [p.epoch for p in result.history],
            },
            handle,
        )
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    os._exit(0)
