"""Spark machinery shared by the bounded and unbounded loops, in five packages, each with
one job. Internal: nothing here is public API except what ``iterflow`` itself exports
(``itf.session``, ``itf.combine``, ``itf.CombineFn``, ``itf.to_arrow``, ``itf.vector``,
``itf.vector_cell``); names and modules may change without notice.

From the leaf up (each may import only the packages before it, plus iterflow's pure
Python leaves; ``tests/test_layout.py`` holds the same rules as a table):

- ``spark``: the bridge to Spark: the one module that reaches into the JVM, sessions,
  schemas, files on any Hadoop file system.
- ``checkpoint``: durable state: the checkpoint format, its store and background
  writer, the lease of a checkpoint directory, output sinks' exactly-once writes.
- ``progresstrack``: progress of a running round and of a run: Spark's status, the
  in-round sampler, the tracker that rounds and kernels report into, the run's
  observers (bar, event log, metrics).
- ``datacache``: data a round reads again and again: columnar files, resident data and
  its data plane, variables held on the driver, ``itf.combine``.
- ``round``: one round: the round cycle both loops share, the round's scope behind
  ``RoundContext``, checking a Declaration, materializing it.
"""
