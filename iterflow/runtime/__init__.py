"""Spark machinery shared by the bounded and unbounded loops. Internal: nothing here is
public API except what ``iterflow`` itself exports (``itf.to_arrow``, ``itf.vector``,
``itf.vector_cell``, ``itf.session``); names and modules may change without notice."""
