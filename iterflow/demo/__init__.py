"""Runnable demonstrations, written only against iterflow's public API."""
