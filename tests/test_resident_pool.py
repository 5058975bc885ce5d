"""A resident task's kernel processes and its shared-memory partitions, without Spark:
the same outputs as the task alone, every process used, a dead process named, files
removed, shared memory that fills up falling back to the temporary directory."""

from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle

from iterflow.runtime.datacache import resident_share, resident_task
from iterflow.runtime.datacache.columnar import KernelCall
from iterflow.runtime.datacache.resident_pool import Pool, PoolLost, shares


def _call(kernel, *args) -> bytes:
    declared = pa.schema([("part", pa.int64()), ("pid", pa.int64()), ("total", pa.float64())])
    call = KernelCall(kernel, args, True, declared, numbered=True)
    return cloudpickle.dumps({"kernel": call, "run_id": "run", "epoch": 0})


def _total(index: int, table: pa.Table, scale: float) -> pa.Table:
    x = table["x"].to_numpy()
    return pa.table({"part": [index], "pid": [os.getpid()], "total": [float(x.sum()) * scale]})


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(7)
    tables = {part: pa.table({"x": rng.normal(size=1000 + 100 * part)}) for part in range(6)}
    paths = {part: resident_share.write(str(tmp_path), part, t) for part, t in tables.items()}
    return tables, paths


def _rows(reply) -> list[tuple[int, float]]:
    table = pa.Table.from_batches(reply["outputs"]).sort_by("part")
    return list(zip(table["part"].to_pylist(), table["total"].to_pylist(), strict=True))


def test_two_processes_give_the_outputs_of_the_task_alone_and_both_work(files):
    tables, paths = files
    sizes = {part: t.nbytes for part, t in tables.items()}
    alone, pool = Pool(1), Pool(2)
    try:
        assert alone.pids == [] and len(set(pool.pids)) == 2
        expected = {part: t.num_rows for part, t in tables.items()}
        assert alone.open(paths, sizes) == expected == pool.open(paths, sizes)
        resident_share.remove(list(paths.values()))  # mapped: still readable
        raw = _call(_total, 2.0)
        by_task, by_pool = alone.call(raw), pool.call(raw)
        assert _rows(by_task) == _rows(by_pool)
        assert _rows(by_pool) == [
            (p, float(t["x"].to_numpy().sum()) * 2.0) for p, t in tables.items()
        ]
        pids = set(pa.Table.from_batches(by_pool["outputs"])["pid"].to_pylist())
        assert pids == set(pool.pids)  # both processes ran kernels, the task none
    finally:
        alone.close()
        pool.close()


def test_a_dead_kernel_process_is_named_and_close_reaps_every_process(files):
    tables, paths = files
    pool = Pool(2)
    pids = list(pool.pids)
    try:
        pool.open(paths, {part: t.nbytes for part, t in tables.items()})
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(PoolLost, match=str(pids[0])):
            pool.call(_call(_total, 1.0))
    finally:
        pool.close()
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left


def test_a_kernel_error_comes_back_as_the_reply_not_a_lost_process(files):
    tables, paths = files

    def failing(index, table, scale):
        raise ValueError(f"partition {index} refused")

    pool = Pool(2)
    try:
        pool.open(paths, {part: t.nbytes for part, t in tables.items()})
        reply = pool.call(_call(failing, 1.0))
        assert "ValueError: partition" in reply["error"]
        assert _rows(pool.call(_call(_total, 1.0)))  # the processes still serve calls
    finally:
        pool.close()


def test_partitions_are_dealt_by_bytes_largest_first():
    dealt = shares({0: 100, 1: 10, 2: 60, 3: 50, 4: 5}, 2)
    assert dealt == [[0, 1, 4], [2, 3]]  # 115 and 110 bytes
    assert sorted(p for share in shares({p: 1 for p in range(7)}, 3) for p in share) == list(
        range(7)
    )


def test_full_shared_memory_falls_back_to_the_temporary_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(resident_share, "SHARED_MEMORY", str(tmp_path / "shm"))
    os.mkdir(tmp_path / "shm")
    monkeypatch.setattr(resident_share.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    os.mkdir(tmp_path / "tmp")
    real = resident_share.write

    def full(directory, part, table):
        if directory.startswith(str(tmp_path / "shm")):
            raise OSError(28, "No space left on device")
        return real(directory, part, table)

    monkeypatch.setattr(resident_task, "write", full)
    tables = {0: pa.table({"x": [1.0, 2.0]}), 1: pa.table({"x": [3.0]})}
    files = resident_task._shared("job1", 1, tables)
    assert all(path.startswith(str(tmp_path / "tmp")) for path in files.values())
    assert resident_share.open_shared(files[1])["x"].to_pylist() == [3.0]
    resident_share.forget("job1", 1)
    assert os.listdir(tmp_path / "tmp") == []
