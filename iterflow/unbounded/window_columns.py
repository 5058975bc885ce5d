"""The columns an event-time step adds to its rows while it works on them, and to its output.

Shared by the step's Spark plans (``event_steps``) and its driver-side twin
(``driver_windows``), which must produce rows and state of the same shape: a state
written by one is read by the other in a later epoch or after a restart.
"""

from __future__ import annotations

TS = "_iterflow_ts"  # event time, microseconds
WS = "_iterflow_window_start"
WE = "_iterflow_window_end"
PANE = "_iterflow_pane"  # firings of the row's window so far
DIRTY = "_iterflow_dirty"  # the row's window holds rows it has not emitted yet
NEW = "_iterflow_new"  # the row arrived in this epoch
LATE = "_iterflow_late"
SIDE = "_iterflow_side"

#: Columns a window step adds to its output (an input column of the same name is replaced:
#: its rows are windowed anew).
WINDOW, PANE_OUT = "window", "pane"
#: The event time of rows with no event-time column but a ``window`` (a window step's
#: aggregated output): the end of their window, less a microsecond (inside it).
WINDOW_END = "window.end"
