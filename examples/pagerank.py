"""PageRank with iterflow on a random graph: bind, stop, listen, read the result.

Run: python examples/pagerank.py [vertices] [tol]

The body itself is ``iterflow.demo.pagerank_demo.pagerank_body`` (one DataFrame step,
an L1 convergence value, and a ``ctx.observe`` on the contributions); this
script shows how a user wires such a body into a bounded iteration.
"""

import sys

from pyspark.sql import functions as F

import iterflow as itf
from iterflow.demo.pagerank_demo import initial_ranks, pagerank_body, random_graph

vertices_wanted = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
tol = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-9  # the L1 change that stops it
spark = itf.session()
vertices, edges = random_graph(spark, vertices_wanted, 10 * vertices_wanted, seed=42)
edges = edges.repartition(4, "src").cache()  # partitioned once, reused by every round
n = vertices.count()


class Trace(itf.RoundListener):
    def on_round_end(self, ctx):
        p = ctx.progress
        print(
            f"round {p.epoch}: L1 change {p.converged_value:.2e}, "
            f"{p.observed['contributions']} vertices received rank, {p.duration_s:.2f} s"
        )

    def on_iteration_terminated(self, ctx):
        print(f"stopped after {ctx.rounds} rounds: {ctx.termination.reason}")


result = (
    itf.BoundedIteration(pagerank_body(n, tol=tol))
    .bind("ranks", initial_ranks(vertices, edges))
    .bind("edges", edges)
    .until(itf.max_rounds(100))
    .listen(Trace())
    .run()
)
ranks = result.outputs["ranks"].orderBy(F.desc("rank")).toPandas()  # one row per vertex
result.release()  # the outputs are valid until then
print(ranks.head(5).to_string(index=False))
