"""Data that rounds read again and again: Arrow files read by a Spark job per round
(``columnar``), the same data kept in long-running tasks (``resident_policy``,
``resident``, ``resident_task``, ``resident_pool``, ``resident_share``, ``ledger``)
and the driver's data plane they talk to (``dataplane``), small variables held on the
driver (``driver_variables``), and ``itf.combine`` over any of them (``combine``).

Imports ``spark``, ``progresstrack`` (to report kernel calls) and iterflow's leaves."""
