"""Clicks per page and minute, in event time, on a stream of JSON files.

Three files arrive one micro-batch each. A page's minute is counted once the
watermark (the latest click seen, less 30 seconds) passes the minute's end. The
second file holds a click for a minute counted already, but within the allowed
lateness (2 minutes): that page's minute is counted again (pane 1, an update).
The third holds a click far too late: it goes to the late output, which a sink
keeps.

    python examples/event_time_windows.py
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from pyspark.sql import functions as F

import iterflow as itf

FILES = [
    [("12:00:05", "home"), ("12:00:40", "shop"), ("12:01:10", "home"), ("12:02:00", "shop")],
    [("12:00:50", "home"), ("12:09:00", "home")],  # 12:00:50: late, within lateness
    [("12:00:20", "shop")],  # too late: the watermark is at 12:08:30
]


@itf.body
def clicks_per_minute(clicks, ctx):
    per_minute = ctx.window(
        clicks, itf.FixedWindows("1 minute"), "2 minutes", by="page", name="minutes"
    )
    counts = per_minute.groupBy("window", "page", "pane").count()
    return itf.Declaration(outputs={"counts": counts, "late": ctx.late("minutes")})


def write_files(folder: Path) -> None:
    folder.mkdir(parents=True)
    start = time.time() - 100
    for index, rows in enumerate(FILES):
        path = folder / f"clicks-{index}.json"
        lines = (json.dumps({"ts": f"2026-01-05T{t}Z", "page": p}) for t, p in rows)
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (start + index, start + index))  # the order the stream reads them


spark = itf.session()
work = Path(tempfile.mkdtemp(prefix="iterflow-event-time-"))
write_files(work / "clicks")
stream = (
    spark.readStream.schema("ts timestamp, page string")
    .option("maxFilesPerTrigger", 1)
    .json(str(work / "clicks"))
)
counts, late = itf.FileSink(str(work / "counts")), itf.FileSink(str(work / "late"))
query = (
    itf.UnboundedIteration(clicks_per_minute)
    .bind("clicks", stream, event_time="ts", max_delay="30 seconds")
    .sink("counts", counts)
    .sink("late", late)
    .start(checkpoint_location=str(work / "checkpoint"), available_now=True, progress=False)
)
query.await_termination()
minutes = counts.read(spark).select(
    F.date_format("window.start", "HH:mm").alias("minute"), "page", "pane", "count", "epoch"
)
if __name__ == "__main__":
    minutes.orderBy("epoch", "minute", "page").show()
    late.read(spark).select("ts", "page", "epoch").show(truncate=False)
    print({name: str(mark) for name, mark in query.history[-1].watermarks.items()})
