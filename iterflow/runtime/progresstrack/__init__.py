"""Progress of a running round and of a run: Spark's status of a round's jobs
(``spark_status``), the in-round sampler (``sampler``), the tracker that materialization
and kernels report into (``tracker``), and a run's observers: progress bar, event log,
metrics sinks (``observers``).

Imports the ``spark`` package, ``progress``, ``metrics`` and iterflow's pure Python
leaves; never the data cache or the round, which report into it."""
