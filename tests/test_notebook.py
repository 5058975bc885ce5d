"""tests/notebooks/quickstart.ipynb, executed headlessly in a Jupyter kernel of this
interpreter: the bar is a widget, the result renders as HTML, the history frame has a
row per round, and the plot is an image."""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

NOTEBOOK = Path(__file__).parent / "notebooks" / "quickstart.ipynb"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent

#: The notebook halves values 0..7 until the largest is at most 0.05: round k leaves
#: 7 / 2**(k + 1), so the first round at or below the tolerance is the last.
LAST_EPOCH = math.ceil(math.log2(7 / 0.05)) - 1
WIDGET = "application/vnd.jupyter.widget-view+json"


def outputs(cell: Any) -> list[dict[str, Any]]:
    """The display and result outputs of ``cell`` (their data by MIME type)."""
    return [o for o in cell["outputs"] if o["output_type"] in ("display_data", "execute_result")]


def cell_with(nb: Any, source: str) -> Any:
    """The code cell whose source is ``source``, or, for a longer cell, ends with it."""
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.strip().endswith(source)]
    return cell


def executed(tmp_path: Path) -> Any:
    """The notebook, run top to bottom in a python3 kernel of this interpreter."""
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel")
    pytest.importorskip("ipywidgets", reason="the progress widget needs ipywidgets")
    pytest.importorskip("matplotlib", reason="result.plot() needs matplotlib")
    from jupyter_client.manager import KernelManager

    # jupyter_client runs a kernel spec's "python" as this interpreter; another kernel
    # named python3 installed for another Python would not see this iterflow.
    command = KernelManager(kernel_name="python3").format_kernel_cmd()
    if os.path.realpath(command[0]) != os.path.realpath(sys.executable):
        pytest.skip(f"the python3 kernel runs {command[0]}, not this interpreter")
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(
            [str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)
    return nb


def test_the_quickstart_notebook_shows_bar_result_history_and_plot(tmp_path: Path) -> None:
    nb = executed(tmp_path)

    run = outputs(cell_with(nb, ".run(progress=True)"))
    assert any(WIDGET in o["data"] for o in run), "no progress widget in the run's output"

    (shown,) = outputs(cell_with(nb, "result"))
    assert f"converged at epoch {LAST_EPOCH}" in shown["data"]["text/html"]

    (frame,) = outputs(cell_with(nb, "result.history_frame()"))
    body = frame["data"]["text/html"].split("<tbody>")[1].split("</tbody>")[0]
    assert len(re.findall(r"<tr\b", body)) == LAST_EPOCH + 1

    (plot,) = outputs(cell_with(nb, "result.plot(log_y=True)"))
    assert plot["data"]["image/png"]
