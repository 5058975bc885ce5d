"""The lease of a checkpoint directory: a second live run is refused by name, a lease left
by a run that is gone is taken over, and a run whose lease was taken over stops before it
deletes anything."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from test_checkpoints import committed_epochs, expected, run, values
from test_unbounded import numbers_stream, running_sum, write_numbers

import iterflow as itf
from iterflow.errors import CheckpointInUseError
from iterflow.runtime.checkpoint.lease import LEASE, TIMEOUT_CONF, Lease, _pid_namespace
from iterflow.runtime.spark.files import LocalFiles


def lease_of(directory: Path, timeout_s: float = 60.0) -> Lease:
    return Lease(LocalFiles(), f"file:{directory}", timeout_s=timeout_s, option="checkpoint_dir")


def held_by(directory: Path, **fields: Any) -> dict[str, Any]:
    """Write the lease of another run under ``directory``: by default a process on this
    host (this pid namespace) that renewed it just now."""
    record = {
        "token": "f" * 32,
        "host": socket.gethostname(),
        "pid": 1,
        "pid_namespace": _pid_namespace(),
        "started": "2030-01-02T03:04:05+00:00",
        "timeout_s": 60.0,
        "renewed": time.time(),
        **fields,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LEASE).write_text(json.dumps(record))
    return record


def on_file(directory: Path) -> dict[str, Any]:
    return json.loads((directory / LEASE).read_text())  # type: ignore[no-any-return]


@pytest.fixture
def live_process() -> Any:
    """Another process on this host, running until the test ends."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield child
    child.kill()
    child.wait()


def test_a_lease_held_by_a_live_process_on_this_host_is_refused_naming_it(
    tmp_path: Path, live_process: subprocess.Popen[bytes]
) -> None:
    held_by(tmp_path, pid=live_process.pid)
    with pytest.raises(CheckpointInUseError) as refused:
        lease_of(tmp_path).acquire()
    message = str(refused.value)
    assert f"checkpoint_dir 'file:{tmp_path}' is in use by another live run" in message
    assert f"host '{socket.gethostname()}', pid {live_process.pid}" in message
    assert "started 2030-01-02T03:04:05+00:00" in message
    assert isinstance(refused.value, itf.IterflowError)
    assert on_file(tmp_path)["pid"] == live_process.pid  # left alone


def test_a_lease_renewed_lately_on_another_host_is_refused(tmp_path: Path) -> None:
    held_by(tmp_path, host="elsewhere.example", pid=os.getpid(), renewed=time.time() - 5)
    with pytest.raises(CheckpointInUseError, match=r"host 'elsewhere.example'.*renewed 5 s ago"):
        lease_of(tmp_path).acquire()


@pytest.mark.parametrize(
    "left",
    [
        pytest.param({"host": "elsewhere.example", "renewed": time.time() - 61}, id="timed-out"),
        pytest.param({"pid": "dead"}, id="dead-process-on-this-host"),
        pytest.param({"pid": "this", "token": "0" * 32}, id="ended-run-of-this-process"),
    ],
)
def test_a_lease_left_by_a_run_that_is_gone_is_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, left: dict[str, Any]
) -> None:
    if left.get("pid") == "dead":
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        left = {**left, "pid": gone.pid}
    elif left.get("pid") == "this":
        left = {**left, "pid": os.getpid()}
    held_by(tmp_path, **left)
    lease = lease_of(tmp_path)
    with caplog.at_level(logging.WARNING, logger="iterflow.checkpoint"):
        lease.acquire()
    try:
        assert on_file(tmp_path)["token"] == lease.token
        assert on_file(tmp_path)["pid"] == os.getpid()
        assert "taking over the lease of a run that is gone" in caplog.text
    finally:
        lease.release()
    assert not (tmp_path / LEASE).exists()


def test_a_held_lease_is_renewed_and_a_lost_one_is_noticed(tmp_path: Path) -> None:
    lease = lease_of(tmp_path, timeout_s=0.4)  # renewed every 0.1 s
    lease.acquire()
    try:
        first = on_file(tmp_path)["renewed"]
        deadline = time.monotonic() + 30
        while on_file(tmp_path)["renewed"] == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert on_file(tmp_path)["renewed"] > first
        lease.check()  # still its own
        other = held_by(tmp_path, host="elsewhere.example")  # another run took it over
        with pytest.raises(CheckpointInUseError, match=r"was taken over by another run \(host"):
            lease.check()
    finally:
        lease.release()
    assert on_file(tmp_path) == other  # the other run's lease stays


def blocking_listener(at_epoch: int) -> tuple[Any, threading.Event, threading.Event]:
    """A listener that, after round ``at_epoch``, signals ``reached`` and waits for ``go``."""
    reached, go = threading.Event(), threading.Event()

    def wait_there(ctx: itf.RoundEnd) -> None:
        if ctx.epoch == at_epoch:
            reached.set()
            assert go.wait(300)

    return wait_there, reached, go


@pytest.mark.spark
def test_a_second_run_on_a_directory_a_live_run_holds_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    listener, reached, go = blocking_listener(3)
    first: dict[str, Any] = {}

    def run_first() -> None:
        try:
            first["result"] = run(
                spark,
                tmp_path,
                [],
                checkpoint_every=1,
                checkpoint_async=False,  # epochs 1 and 2 are committed when round 3 ends
                listeners=(listener,),
            )
        except BaseException as exc:  # reported by the assertions below
            first["error"] = exc

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert reached.wait(300), first
        calls: list[int] = []
        with pytest.raises(CheckpointInUseError) as refused:
            run(spark, tmp_path, calls, checkpoint_every=1, resume=False)
        assert f"checkpoint_dir 'file:{tmp_path}' is in use by another live run" in str(
            refused.value
        )
        assert f"pid {os.getpid()}" in str(refused.value)
        assert calls == []  # it ran nothing, and deleted nothing (resume=False would have)
        assert committed_epochs(tmp_path) == [1, 2]
    finally:
        go.set()
        thread.join()
    assert "error" not in first, first
    assert values(first["result"]) == expected(8)
    assert not (tmp_path / LEASE).exists()  # given back at the end
    again = run(spark, tmp_path, [], checkpoint_every=1)
    assert again.resumed_from == 7 and values(again) == expected(8)


@pytest.mark.spark
def test_a_run_whose_lease_was_taken_over_stops_before_deleting_anything(
    spark: SparkSession, tmp_path: Path
) -> None:
    def taken_over(ctx: itf.RoundEnd) -> None:
        if ctx.epoch == 3:
            held_by(tmp_path, host="elsewhere.example")

    with pytest.raises(itf.IterflowError, match="was taken over by another run") as failed:
        run(
            spark,
            tmp_path,
            [],
            checkpoint_every=1,
            checkpoint_async=False,
            listeners=(taken_over,),
        )
    assert isinstance(failed.value.__cause__, CheckpointInUseError)
    assert committed_epochs(tmp_path) == [1, 2]  # nothing pruned, epoch 3 not written
    assert on_file(tmp_path)["host"] == "elsewhere.example"  # and the lease is the other's


@pytest.mark.spark
def test_the_lease_timeout_is_a_setting(spark: SparkSession, tmp_path: Path) -> None:
    spark.conf.set(TIMEOUT_CONF, "2 min")
    try:
        listener, reached, go = blocking_listener(0)
        options = {"rounds": 2, "listeners": (listener,)}
        thread = threading.Thread(target=run, args=(spark, tmp_path, []), kwargs=options)
        thread.start()
        try:
            assert reached.wait(300)
            assert on_file(tmp_path)["timeout_s"] == 120.0
        finally:
            go.set()
            thread.join()
    finally:
        spark.conf.unset(TIMEOUT_CONF)


@pytest.mark.spark
def test_a_second_start_on_a_running_querys_location_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    write_numbers(tmp_path / "in", [[1], [2]])
    location = tmp_path / "ckpt"

    def start() -> itf.UnboundedQuery:
        return (
            itf.UnboundedIteration(running_sum)
            .bind("total", spark.createDataFrame([(0,)], "total long"), state=True)
            .bind("numbers", numbers_stream(spark, tmp_path / "in"))
            .start(
                checkpoint_location=str(location),
                processing_time="100 milliseconds",
                progress=False,
            )
        )

    running = start()
    try:
        running.process_all_available()
        with pytest.raises(CheckpointInUseError, match=r"checkpoint_location '.*/ckpt/epochs'"):
            start()
        assert running.status["state"] != "failed"
    finally:
        running.stop()
    assert not (location / "epochs" / LEASE).exists()
    again = start()  # the stopped query gave the location back
    try:
        assert again.resumed_from == 1
    finally:
        again.stop()
