"""The bridge to Spark: ``jvm`` (the only module that reaches into Spark's JVM; ask it
``is_classic(session)`` for Spark Connect), ``session`` (finding or starting a session),
``schema`` (column names and types) and ``files`` (files on any Hadoop file system).

A leaf of the runtime: imports iterflow's errors and its storage layer (``files`` hands
Hadoop's FileSystem to ``iterflow.storage``) only."""
