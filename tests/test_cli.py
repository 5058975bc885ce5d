"""The ``iterflow`` command's contract: help on every option, an exit code per kind of
ending (0 done, 1 a check failed, 2 usage, 3 an error while running, 130 interrupted) with
one line on stderr, and ``iterflow report --format json``. No Spark: a session is never
started here."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import iterflow as itf
from iterflow.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def write_log(path: Path, lines: list[dict[str, Any]]) -> Path:
    """An event log of ``lines``, each given its ``time``, as a run writes them."""
    stamped = [{"time": f"2025-03-01T12:00:{i:02d}+00:00", **line} for i, line in enumerate(lines)]
    path.write_text("".join(json.dumps(line) + "\n" for line in stamped))
    return path


def started(run: str, iteration: str = "halve", **fields: Any) -> dict[str, Any]:
    return {
        "event": "iteration_started",
        "run_id": run,
        "iteration": iteration,
        "inputs": {},
        "conditions": [],
        "iterflow_version": "9.9.9",
        **fields,
    }


def round_end(run: str, epoch: int, value: float, **fields: Any) -> dict[str, Any]:
    return {
        "event": "round_end",
        "run_id": run,
        "epoch": epoch,
        "duration_s": 0.5 + epoch,
        "rows": {"x": 10 - epoch},
        "converged_value": value,
        "metrics": {"loss": {"kind": "distribution", "mean": value * 2}},
        **fields,
    }


def terminated(run: str, epoch: int) -> dict[str, Any]:
    return {
        "event": "iteration_terminated",
        "run_id": run,
        "termination": {"reason": "converged", "epoch": epoch, "reasons": ["converged"]},
        "rounds": epoch + 1,
        "duration_s": 4.25,
        "metrics": {},
    }


def leaf_parsers(
    parser: argparse.ArgumentParser,
) -> list[tuple[argparse.ArgumentParser, list[argparse.Action]]]:
    """Every parser of the command (itself and each command below it) with its actions."""
    found = [(parser, list(parser._actions))]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += leaf_parsers(sub)
    return found


def test_every_option_and_command_has_help() -> None:
    parsers = leaf_parsers(build_parser())
    assert {p.prog for p, _ in parsers} >= {
        "iterflow demo pagerank",
        "iterflow demo kmeans",
        "iterflow demo online-kmeans",
        "iterflow report",
        "iterflow plot",
        "iterflow converge",
    }
    missing = []
    for parser, actions in parsers:
        for action in actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                # The commands listed under it: each with its line.
                missing += [
                    f"{parser.prog} {choice.dest}"
                    for choice in action._choices_actions
                    if not choice.help
                ]
    assert missing == []


def test_the_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    epilog = out[out.index("exit codes:") :]
    codes = [line.split()[0] for line in epilog.splitlines()[1:] if line[:3].strip().isdigit()]
    assert codes == ["0", "1", "2", "3", "130"]


def test_a_report_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(
        tmp_path / "run.jsonl",
        [started("r1"), round_end("r1", 0, 0.5), round_end("r1", 1, 0.25), terminated("r1", 1)],
    )
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "iteration 'halve', run r1" in out and "ended: converged at epoch 1" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["report"],  # LOG missing
        ["report", "x.jsonl", "--format", "xml"],
        ["report", "x.jsonl", "--no-such-option"],
        ["no-such-command"],
        ["demo"],  # which demo?
        ["demo", "pagerank", "--max-rounds", "0"],
        ["converge", "--plot"],  # FILE missing
    ],
)
def test_a_wrong_command_line_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert "error:" in capsys.readouterr().err


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line the command printed on stderr, checked to be one line without a
    traceback."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_an_unreadable_event_log_exits_3_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 3
    assert one_line_error(capsys).startswith("iterflow report: error: cannot read event log")
    (tmp_path / "bad.jsonl").write_text("this is not json\n")
    assert main(["report", str(tmp_path / "bad.jsonl"), "--format", "json"]) == 3
    assert one_line_error(capsys).startswith("iterflow report: error:")


def test_an_unwritable_plot_path_exits_3_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    log = write_log(
        tmp_path / "run.jsonl",
        [started("r1"), round_end("r1", 0, 0.5), round_end("r1", 1, 0.25), terminated("r1", 1)],
    )
    (tmp_path / "file").write_text("")
    image = tmp_path / "file" / "curve.png"  # under a file: cannot be written
    assert main(["plot", str(log), "-o", str(image)]) == 3
    line = one_line_error(capsys)
    assert line.startswith(f"iterflow plot: error: cannot write '{image}'")
    assert not image.exists()


def test_an_unknown_case_or_case_module_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["converge", "--case", "nope", "--list"]) == 3
    assert one_line_error(capsys).startswith("iterflow converge: error: no case named ['nope']")
    assert main(["converge", "no_such_module_here", "--list"]) == 3
    assert "cannot import case module 'no_such_module_here'" in one_line_error(capsys)


CASES = """
from iterflow.testing import ConvergenceCase

def never_runs(spark, listen):
    raise ValueError("this case is broken on purpose")

CASES = [
    ConvergenceCase(
        name="broken", run=never_runs, reference=lambda: 0.0,
        error=lambda got, want: abs(got - want), tol=0.1,
    )
]
"""


def test_a_failed_case_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "failing_cli_cases.py").write_text(textwrap.dedent(CASES))
    monkeypatch.syspath_prepend(str(tmp_path))
    # The case fails before it touches Spark: no session is needed, so none is started.
    monkeypatch.setattr(itf, "session", lambda *args, **kwargs: object())
    assert main(["converge", "failing_cli_cases"]) == 1
    out = capsys.readouterr().out
    assert "broken" in out and "this case is broken on purpose" in out


def test_an_unexpected_error_is_one_line_with_a_hint_and_traceback_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(path: object, run_id: object = None) -> list[dict[str, Any]]:
        raise RuntimeError("the disk said no\n  at some.java.Frame(Frame.java:1)")

    monkeypatch.setattr(itf.progress, "read_events", broken)
    log = str(tmp_path / "run.jsonl")
    assert main(["report", log]) == 3
    assert one_line_error(capsys) == (
        "iterflow report: error: RuntimeError: the disk said no "
        "(run again with --traceback to see where it came from)"
    )
    for argv in (["report", log, "--traceback"], ["--traceback", "report", log]):
        assert main(argv) == 3
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):")
        assert "RuntimeError: the disk said no" in err and "some.java.Frame" in err


def test_an_iterflow_error_of_several_lines_shows_its_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(path: object, run_id: object = None) -> list[dict[str, Any]]:
        raise itf.IterflowValueError("the log is odd\n  line 3: not an event")

    monkeypatch.setattr(itf.progress, "read_events", broken)
    assert main(["report", str(tmp_path / "run.jsonl")]) == 3
    assert one_line_error(capsys) == (
        "iterflow report: error: the log is odd (--traceback shows all of it)"
    )


def test_an_interrupt_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(path: object, run_id: object = None) -> list[dict[str, Any]]:
        raise KeyboardInterrupt

    monkeypatch.setattr(itf.progress, "read_events", interrupted)
    assert main(["report", str(tmp_path / "run.jsonl")]) == 130
    assert one_line_error(capsys) == "iterflow report: interrupted"


def test_a_reader_that_stops_reading_ends_the_report_quietly(tmp_path: Path) -> None:
    """``iterflow report LOG --format json | head -1``: exit 0, nothing on stderr."""
    rounds = [round_end("r1", epoch, 0.5**epoch) for epoch in range(2000)]
    log = write_log(tmp_path / "run.jsonl", [started("r1"), *rounds, terminated("r1", 1999)])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    report = subprocess.Popen(
        [sys.executable, "-m", "iterflow.cli", "report", str(log), "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert report.stdout is not None and report.stderr is not None
    assert report.stdout.readline() == b"{\n"
    report.stdout.close()  # as `head -1` does
    assert report.wait(timeout=120) == 0
    assert report.stderr.read() == b""


def test_the_process_exits_with_the_code(tmp_path: Path) -> None:
    """Through ``python -m iterflow.cli``, as the ``iterflow`` script runs ``main``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    missing = subprocess.run(
        [sys.executable, "-m", "iterflow.cli", "report", str(tmp_path / "missing.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert missing.returncode == 3, missing.stderr
    assert missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "iterflow.cli", "report"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert usage.returncode == 2 and "usage: iterflow report" in usage.stderr


def test_report_json_is_the_run_as_one_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rollback = {
        "event": "rolled_back",
        "run_id": "r1",
        "failed_epoch": 1,
        "to_epoch": 0,
        "rounds_recomputed": 1,
        "lost_blocks": ["rdd_7_0"],
        "lost_executors": ["1"],
        "lost": "executor 1 was lost",
        "at": "2025-03-01T12:00:04+00:00",
    }
    log = write_log(
        tmp_path / "run.jsonl",
        [
            started("other", iteration="not this one"),
            round_end("other", 0, 9.0),
            started("r1"),
            round_end("r1", 0, 0.5),
            round_end("r1", 1, 0.3),  # rolled back: its second attempt is the round
            rollback,
            started("inner", iteration="nested", parent_run_id="r1", epoch_path=[1]),
            round_end("inner", 0, 7.0, epoch_path=[1, 0]),
            round_end("r1", 1, 0.25),
            round_end("r1", 2, 0.125),
            terminated("r1", 2),
        ],
    )
    assert main(["report", str(log), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["run_id"] == "r1" and document["iteration"] == "halve"
    assert document["iterflow_version"] == "9.9.9"
    assert document["termination"] == {"reason": "converged", "epoch": 2, "reasons": ["converged"]}
    assert document["failure"] is None and document["duration_s"] == 4.25
    rounds = document["rounds"]
    assert [(r["run_id"], r["epoch_path"]) for r in rounds] == [
        ("r1", [0]),
        ("r1", [1]),
        ("inner", [1, 0]),
        ("r1", [2]),
    ]
    assert [r["converged_value"] for r in rounds] == [0.5, 0.25, 7.0, 0.125]
    assert [r["duration_s"] for r in rounds] == [0.5, 1.5, 0.5, 2.5]
    assert [r["rows.x"] for r in rounds] == [10, 9, 10, 8]
    assert [r["loss"] for r in rounds] == [1.0, 0.5, 14.0, 0.25]  # a distribution: its mean
    assert rounds[1]["time"] == "2025-03-01T12:00:08+00:00"
    assert document["rollbacks"] == [
        {
            "time": "2025-03-01T12:00:05+00:00",
            **{k: rollback[k] for k in rollback if k not in ("event", "run_id")},
        }
    ]


def test_report_json_of_a_failed_run_names_the_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = {
        "event": "iteration_failed",
        "run_id": "r1",
        "epoch": 1,
        "error": "epoch 1 failed in body: ZeroDivisionError: float division by zero",
        "error_type": "RoundError",
        "duration_s": 1.5,
        "metrics": {"points": {"kind": "counter", "committed": 10, "attempted": 20}},
    }
    log = write_log(tmp_path / "run.jsonl", [started("r1"), round_end("r1", 0, 0.5), failed])
    assert main(["report", str(log), "--run", "r1", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["termination"] is None
    assert document["failure"] == {
        "epoch": 1,
        "error_type": "RoundError",
        "error": "epoch 1 failed in body: ZeroDivisionError: float division by zero",
    }
    assert document["metrics"] == failed["metrics"]
    assert [r["epoch"] for r in document["rounds"]] == [0]
