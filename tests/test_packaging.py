"""The distribution: the wheel holds the package only, and a fresh virtual environment
that installs it runs `iterflow demo pagerank`."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel and an sdist built by `python -m build` (its isolated build downloads
    the build backend)."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def test_the_wheel_holds_the_package_and_its_entry_points_only(dist: Path) -> None:
    (wheel,) = dist.glob("iterflow-*.whl")
    (sdist,) = dist.glob("iterflow-*.tar.gz")
    assert sdist.stat().st_size > 0
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    # The pytest plugin is a module of its own, so that pytest starts without importing iterflow.
    info = next(t for t in top if t.endswith(".dist-info"))
    assert top == {"iterflow", "_iterflow_pytestplugin.py", info}
    assert "iterflow/py.typed" in names and "iterflow/testing/plugin.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "iterflow = iterflow.cli:main" in entry_points
    assert "[pytest11]" in entry_points and "iterflow = _iterflow_pytestplugin" in entry_points
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    for extra in ("connect", "converge", "docs", "graphframes", "mlflow", "plot", "prometheus"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "Provides-Extra: testing" in metadata  # the old name of `converge`, for one release
    import iterflow as itf

    assert f"Version: {itf.__version__}\n" in metadata  # written once, in iterflow/__init__.py
    assert "Classifier: Typing :: Typed" in metadata
    assert "Requires-Dist: pyspark<5,>=4.0" in metadata


@pytest.mark.slow_spark  # a virtualenv, a wheel and the demo: a minute; CI installs too
def test_a_fresh_virtualenv_installs_the_wheel_and_runs_the_demo(
    dist: Path, tmp_path: Path
) -> None:
    (wheel,) = dist.glob("iterflow-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The wheel itself, without network: its dependencies (pyspark, numpy...) are this
    # environment's, made visible to the new one through a .pth file.
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "parent-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    demo = subprocess.run(
        [str(venv / "bin" / "iterflow"), "demo", "pagerank", "--vertices", "300"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(python)},
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "termination: converged" in demo.stdout
    where = subprocess.run(
        [str(python), "-c", "import iterflow; print(iterflow.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(site)  # the installed wheel, not the source tree
