"""Spark machinery shared by the bounded and unbounded loops."""
