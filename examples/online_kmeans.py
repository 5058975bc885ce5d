"""Online k-means over a stream of files with iterflow: a state variable, a streaming input,
a listener and a sink.

Run: python examples/online_kmeans.py [files]

The body is ``iterflow.demo.online_kmeans_demo.online_kmeans_step`` (each new point goes
to its nearest center, and every center moves as in Spark MLlib's
``StreamingKMeans``). This script writes a few files of points, runs the body
over them as an unbounded iteration that reads what the folder holds and then
ends (``available_now=True``), and compares the centers found with the true
ones. ``iterflow demo online-kmeans`` runs the same body while files keep
arriving.
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

import iterflow as itf
from iterflow.demo.online_kmeans_demo import (
    POINTS_SCHEMA,
    blobs,
    centers_of,
    initial_model,
    nearest_distances,
    online_kmeans_step,
    write_points,
)

files = int(sys.argv[1]) if len(sys.argv) > 1 else 5
spark = itf.session()
rng = np.random.default_rng(7)
true_centers = rng.uniform(-10.0, 10.0, size=(4, 3))
guess = true_centers + rng.normal(0.0, 2.0, size=true_centers.shape)  # a rough start


def report(end):
    print(
        f"epoch {end.epoch}: {end.progress.input_rows['points']} new points, "
        f"{end.progress.duration_s:.2f} s"
    )


with tempfile.TemporaryDirectory() as work:
    folder = Path(work, "points")
    folder.mkdir()
    for i in range(files):  # each file becomes one micro-batch, hence one epoch
        write_points(folder, f"part-{i:03d}.json", blobs(rng, 500, true_centers))

    points = (
        spark.readStream.schema(POINTS_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
    )
    models = itf.FileSink(f"{work}/models")  # every epoch's model, under models/epoch=<n>
    query = (
        itf.UnboundedIteration(online_kmeans_step(decay=0.9))
        .bind("model", initial_model(spark, guess), state=True)
        .bind("points", points)
        .listen(report)
        .sink("model", models)
        .start(checkpoint_location=f"{work}/checkpoint", available_now=True, progress=False)
    )
    query.await_termination()
    last = query.progress[-1].epoch
    centers = centers_of(models.read(spark).where(f"epoch = {last}"))

print(f"{query.termination.reason} after {last + 1} epochs")
for true, error in zip(true_centers, nearest_distances(centers, true_centers), strict=True):
    print(f"true center {np.round(true, 2)}: found within {error:.3f}")
