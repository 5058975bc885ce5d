"""The storage layer: one path type (a local path or a Hadoop-compatible URI) for the event
log, checkpoints and columnar files. No Spark here; test_storage_hadoop.py goes through
Hadoop's FileSystem in Spark's JVM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from iterflow.errors import IterflowValueError
from iterflow.progress.event_log import EventLog, read_events


def _one_run(log: EventLog, run_id: str = "r1") -> None:
    log.iteration_started(run_id=run_id, iteration="it", inputs={}, conditions=[])


@pytest.mark.parametrize("spelling", ["file://{}", "file:{}", "file://localhost{}"])
def test_an_event_log_on_a_file_uri_is_the_local_file(tmp_path: Path, spelling: str) -> None:
    plain = tmp_path / "logs" / "run.jsonl"
    uri = spelling.format(plain)
    with EventLog(uri) as log:
        _one_run(log)
    # The URI and the plain path name one file; no folder named "file:" appears.
    assert [json.loads(line)["event"] for line in plain.read_text().splitlines()] == [
        "iteration_started"
    ]
    assert [e["run_id"] for e in read_events(uri)] == ["r1"]
    assert [e["run_id"] for e in read_events(plain)] == ["r1"]
    assert not any("file:" in str(p) for p in tmp_path.rglob("*"))


def test_an_event_log_on_a_plain_relative_path_stays_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with EventLog("logs/run.jsonl") as log:
        _one_run(log)
    with EventLog(Path("logs/run.jsonl")) as log:
        _one_run(log, "r2")
    assert [e["run_id"] for e in read_events("logs/run.jsonl", "r1")] == ["r1"]
    assert len((tmp_path / "logs" / "run.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("uri", ["s3a://bucket/logs/run.jsonl", "nosuch://bucket/run.jsonl"])
def test_a_scheme_nothing_here_opens_fails_naming_it_and_makes_no_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str
) -> None:
    monkeypatch.chdir(tmp_path)
    scheme = uri.partition(":")[0]
    with pytest.raises(IterflowValueError) as raised:
        EventLog(uri)
    message = str(raised.value)
    assert f"'{uri}'" in message and f"scheme '{scheme}'" in message
    assert "file:" in message and "hdfs://" in message  # what is supported
    with pytest.raises(IterflowValueError, match=f"scheme '{scheme}'"):
        read_events(uri)
    assert list(tmp_path.iterdir()) == []


def test_locations_parse_plain_paths_and_uris() -> None:
    from iterflow.storage import location

    assert location("logs/x", "x").local == "logs/x"
    assert location(Path("/a/b"), "x").local == "/a/b"
    assert location("file:/a/b", "x").local == "/a/b"
    assert location("file:///a/b", "x").local == "/a/b"
    assert location("FILE://localhost/a/b", "x").local == "/a/b"
    hdfs = location("hdfs://nn:8020/logs/x", "x")
    assert (hdfs.scheme, hdfs.local) == ("hdfs", None)
    assert location("abfss://c@acct.dfs.core.windows.net/x", "x").scheme == "abfss"
    assert location("s3a://b/k", "x").join("part-0").uri == "s3a://b/k/part-0"
    with pytest.raises(IterflowValueError, match="event_log=3"):
        location(3, "event_log")  # type: ignore[arg-type]


def test_where_storage_cannot_append_each_line_rewrites_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object store (here pyarrow's file system under a sub-tree, which the layer does
    not append to) gets the whole file again on each line: every line that returned is
    there, and a later log on the same file keeps what was there."""
    import pyarrow.fs as pafs

    from iterflow import storage

    store = storage.ArrowFiles(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    monkeypatch.setattr(storage, "files_at", lambda place, what: store)
    log = EventLog("logs/run.jsonl")
    assert log._file.rewrites
    _one_run(log)
    assert len((tmp_path / "logs" / "run.jsonl").read_text().splitlines()) == 1
    log.iteration_started(run_id="r1", iteration="again", inputs={}, conditions=[])
    assert len((tmp_path / "logs" / "run.jsonl").read_text().splitlines()) == 2
    log.close()
    with EventLog("logs/run.jsonl") as later:
        _one_run(later, "r2")
    assert [e["run_id"] for e in read_events("logs/run.jsonl", "r1")] == ["r1", "r1"]
    assert [e["run_id"] for e in read_events("logs/run.jsonl")] == ["r2"]


def test_the_pyarrow_files_list_rename_and_delete(tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    from iterflow.storage import ArrowFiles, LocalFiles

    arrow = ArrowFiles(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    local = LocalFiles()
    for files, root in ((arrow, "a"), (local, f"file:{tmp_path}/b")):
        files.write_bytes(f"{root}/x/one", b"1")
        assert files.create(f"{root}/x/two", b"22") and not files.create(f"{root}/x/two", b"")
        files.rename(f"{root}/x/one", f"{root}/x/three")
        assert sorted(files.children(f"{root}/x")) == ["three", "two"]
        assert files.file_sizes(root) == {"x/three": 1, "x/two": 2}
        assert files.read_bytes(f"{root}/x/three") == b"1"
        files.delete(f"{root}/x")
        assert not files.exists(f"{root}/x") and files.children(root) == []


def test_columnar_files_take_local_uris_and_refuse_schemes_pyarrow_does_not_open() -> None:
    from iterflow.runtime.datacache.columnar import DIRECTORY_CONF, _filesystem

    assert _filesystem("file:/data/part-0.arrow") == (None, "/data/part-0.arrow")
    assert _filesystem("file:///data/part-0.arrow") == (None, "/data/part-0.arrow")
    assert _filesystem("/data/part-0.arrow") == (None, "/data/part-0.arrow")
    with pytest.raises(IterflowValueError) as raised:
        _filesystem("s3a://bucket/columnar/part-0.arrow")
    assert "scheme 's3a'" in str(raised.value) and DIRECTORY_CONF in str(raised.value)


def test_an_unreadable_log_names_the_path(tmp_path: Path) -> None:
    missing = os.fspath(tmp_path / "none.jsonl")
    with pytest.raises(IterflowValueError, match=f"cannot read event log 'file:{missing}'"):
        read_events(f"file:{missing}")
