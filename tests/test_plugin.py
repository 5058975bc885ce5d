"""iterflow's pytest plugin in fresh projects, each run by a pytest of its own: it imports
neither iterflow nor PySpark until a test asks for a session, its markers answer to their
new and old names alike, and ``iterflow_spark`` (and its old name ``spark``) is a session.

The projects load the plugin as the entry point in pyproject.toml names it (``-p``; the
installed entry point, which may predate this checkout, is turned off by its name)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def entry_point() -> str:
    """The module that pyproject.toml's ``pytest11`` entry point ``iterflow`` names."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'\[project\.entry-points\.pytest11\][^\[]*?\niterflow = "([\w.]+)"', text)
    assert found, "pyproject.toml has no pytest11 entry point named iterflow"
    return found.group(1)


def run_pytest(
    project: Path, *args: str, files: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """pytest in ``project`` holding ``files``, with iterflow's plugin as installing this
    checkout registers it."""
    for name, text in files.items():
        (project / name).write_text(textwrap.dedent(text))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:iterflow",
            "-p",
            entry_point(),
            "--strict-markers",
            *args,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_project_without_spark_imports_neither_iterflow_nor_pyspark(tmp_path: Path) -> None:
    run = run_pytest(
        tmp_path,
        "-q",
        files={
            "test_plain.py": f"""
                import sys

                def test_nothing_heavy_was_imported():
                    assert "{entry_point()}" in sys.modules  # the plugin is loaded
                    heavy = sorted(
                        name for name in sys.modules
                        if name.split(".")[0] in ("iterflow", "pyspark", "py4j")
                    )
                    assert heavy == []
            """
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


MARKED = """
    import pytest

    @pytest.mark.slow_spark
    def test_old_slow():
        pass

    @pytest.mark.iterflow_slow
    def test_new_slow():
        pass

    @pytest.mark.spark_classic("reads the JVM")
    def test_old_classic():
        pass

    @pytest.mark.iterflow_classic(reason="reads the JVM")
    def test_new_classic():
        pass

    @pytest.mark.spark
    def test_old_spark():
        pass

    def test_plain():
        pass
"""


def selected(run: subprocess.CompletedProcess[str]) -> set[str]:
    """The tests a ``--collect-only -q`` run lists."""
    assert run.returncode == 0, run.stdout + run.stderr
    return {line.split("::")[1] for line in run.stdout.splitlines() if "::" in line}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("slow_spark", {"test_old_slow", "test_new_slow"}),
        ("iterflow_slow", {"test_old_slow", "test_new_slow"}),
        ("spark_classic", {"test_old_classic", "test_new_classic"}),
        ("iterflow_classic", {"test_old_classic", "test_new_classic"}),
        ("spark", {"test_old_spark"}),
        ("iterflow_spark", {"test_old_spark"}),
        (
            "not iterflow_slow",
            {"test_old_classic", "test_new_classic", "test_old_spark", "test_plain"},
        ),
    ],
)
def test_each_marker_selects_the_same_tests_by_either_name(
    tmp_path: Path, expression: str, expected: set[str]
) -> None:
    run = run_pytest(
        tmp_path, "--collect-only", "-q", "-m", expression, files={"test_m.py": MARKED}
    )
    assert selected(run) == expected


def test_classic_tests_by_either_name_are_skipped_over_connect(tmp_path: Path) -> None:
    # No test asks for a session, so none is made: the skip is decided at collection.
    run = run_pytest(
        tmp_path, "-rs", "--iterflow-remote", "sc://nowhere:1", files={"test_m.py": MARKED}
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed, 2 skipped" in run.stdout
    assert run.stdout.count("needs a classic session: reads the JVM") == 2


def test_the_markers_and_options_are_listed(tmp_path: Path) -> None:
    markers = run_pytest(tmp_path, "--markers", files={})
    assert markers.returncode == 0, markers.stderr
    listed = {line.split(":")[0].split("(")[0] for line in markers.stdout.splitlines()}
    names = {"iterflow_spark", "iterflow_slow", "iterflow_classic"}
    assert {f"@pytest.mark.{n}" for n in names | {"spark", "slow_spark", "spark_classic"}} <= listed
    helped = run_pytest(tmp_path, "--help", files={})
    assert "--iterflow-remote=URL" in helped.stdout and "iterflow_spark_conf" in helped.stdout


@pytest.mark.iterflow_spark
def test_a_project_using_the_fixture_by_either_name_gets_one_session(tmp_path: Path) -> None:
    run = run_pytest(
        tmp_path,
        "-q",
        files={
            "pytest.ini": "[pytest]\niterflow_shuffle_partitions = 3\n",
            "test_spark.py": """
                import sys

                import pytest

                def test_the_new_name(iterflow_spark, request):
                    assert iterflow_spark.range(5).count() == 5
                    assert iterflow_spark.conf.get("spark.sql.shuffle.partitions") == "3"
                    # a test that uses the fixture is marked as one that uses Spark
                    assert request.node.get_closest_marker("iterflow_spark") is not None
                    assert request.node.get_closest_marker("spark") is not None

                def test_the_old_name_is_the_same_session(spark, iterflow_spark):
                    assert spark is iterflow_spark
                    assert spark.range(3).count() == 3
            """,
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
