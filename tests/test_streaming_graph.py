"""Graphs that update as edges arrive (``iterflow.graph.streaming``), against networkx
computed from scratch on the edges so far after every epoch: connected components,
PageRank and shortest paths over random streams of insertions and deletions; the
incremental updates alone (no Spark) on many more random streams; bad input; and a
stream killed with SIGKILL and restarted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from child_jobs import epoch_committed, job_command, kill_when, run_to_end

import iterflow as itf
from iterflow.graph import streaming
from iterflow.graph.graphs import GraphError
from iterflow.graph.stream_graph import StreamGraph
from iterflow.graph.stream_updates import Components, Paths, Ranks

EDGES = "src long, dst long, w double"
KINDS = {"long": "int64", "int": "int32", "double": "float64"}  # pandas dtypes of Spark types

# -- the references --------------------------------------------------------------------


def edge_sets(batches, deletions=None):
    """The edges after every batch: ``{(src, dst): weight}``; a later insertion sets the
    weight, a pair inserted twice in one batch keeps the smaller; a deletion in the same
    batch wins."""
    edges: dict = {}
    after = []
    for index, batch in enumerate(batches):
        gone = set() if deletions is None else set(deletions[index])
        new: dict = {}
        for s, d, w in batch:
            new[(s, d)] = min(w, new.get((s, d), np.inf))
        edges.update({k: w for k, w in new.items() if k not in gone})
        for key in gone:
            edges.pop(key, None)
        after.append(dict(edges))
    return after


def digraph(edges, vertices=()):
    g = nx.DiGraph()
    g.add_nodes_from(vertices)
    for (s, d), w in edges.items():
        g.add_edge(s, d, weight=w)
    return g


def components_of(g):
    return {v: min(c) for c in nx.weakly_connected_components(g) for v in c}


def distances_of(g, source):
    return nx.single_source_dijkstra_path_length(g, source) if source in g else {}


def random_stream(rng, steps, n, *, deleting, weighted):
    batches, deletions, edges = [], [], set()
    for step in range(steps):
        m = int(rng.integers(1, 12))
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        w = rng.integers(1, 5, m).astype(float) if weighted else np.ones(m)
        batch = [(int(a), int(b), float(c)) for a, b, c in zip(src, dst, w, strict=True)]
        gone = []
        if deleting and edges and step % 2:
            pool = sorted(edges)
            gone = [pool[i] for i in rng.choice(len(pool), min(3, len(pool)), replace=False)]
            gone.append((n + 5, 0))  # an edge the graph never held
        edges |= {(a, b) for a, b, _ in batch}
        edges -= set(gone)
        batches.append(batch)
        deletions.append(gone)
    return batches, deletions


# -- the updates alone -------------------------------------------------------------------


def run_updates(update, batches, deletions):
    graph = StreamGraph.empty()
    for batch, gone in zip(batches, deletions, strict=True):
        ends = graph.indices(np.array([e[0] for e in batch] + [e[1] for e in batch]))
        known = graph.known(np.array([a for a, _ in gone] + [b for _, b in gone], np.int64))
        half = len(gone)
        seen = (known[:half] >= 0) & (known[half:] >= 0)
        change = graph.update(
            (ends[: len(batch)], ends[len(batch) :], np.array([e[2] for e in batch])),
            (known[:half][seen], known[half:][seen]),
            0,
        )
        update.step(graph, change)
        yield graph


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("deleting", [False, True])
def test_components_follow_insertions_and_deletions(seed, deleting):
    rng = np.random.default_rng(seed)
    batches, deletions = random_stream(rng, 25, 40, deleting=deleting, weighted=False)
    update = Components(labels=np.zeros(0, np.int64))
    after = edge_sets(batches, deletions)
    for graph, edges in zip(run_updates(update, batches, deletions), after, strict=True):
        got = dict(zip(graph.ids.tolist(), graph.ids[update.labels].tolist(), strict=True))
        assert got == components_of(digraph(edges, graph.ids.tolist()))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("deleting", [False, True])
def test_pagerank_stays_within_its_tolerance(seed, deleting):
    rng = np.random.default_rng(seed)
    batches, deletions = random_stream(rng, 25, 40, deleting=deleting, weighted=False)
    update = Ranks(alpha=0.85, tol=1e-7, scores=np.zeros(0), residuals=np.zeros(0))
    after = edge_sets(batches, deletions)
    for graph, edges in zip(run_updates(update, batches, deletions), after, strict=True):
        exact = nx.pagerank(digraph(edges, graph.ids.tolist()), tol=1e-14, max_iter=10_000)
        ranks = update.scores / update.scores.sum()
        gap = sum(abs(ranks[i] - exact[v]) for i, v in enumerate(graph.ids.tolist()))
        assert gap <= 1e-7


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("deleting", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_shortest_paths_follow_insertions_deletions_and_new_weights(seed, deleting, weighted):
    rng = np.random.default_rng(seed)
    batches, deletions = random_stream(rng, 25, 30, deleting=deleting, weighted=weighted)
    update = Paths(source=3, distances=np.zeros(0))
    after = edge_sets(batches, deletions)
    for graph, edges in zip(run_updates(update, batches, deletions), after, strict=True):
        exact = distances_of(digraph(edges, graph.ids.tolist()), 3)
        got = {
            v: update.distances[i]
            for i, v in enumerate(graph.ids.tolist())
            if np.isfinite(update.distances[i])
        }
        assert got == pytest.approx(exact, abs=1e-9)


def test_a_lost_edge_above_one_made_lighter_resets_what_it_carried():
    # d(2) = 0 through 3 -> 2 (weight 0), d(9) = 2 through 2 -> 9. One batch deletes
    # 3 -> 2 and makes 2 -> 9 lighter: 9 and what it reaches become unreachable.
    batches = [[(3, 2, 0.0), (2, 9, 2.0), (9, 4, 1.0)], [(2, 9, 1.0)]]
    deletions = [[], [(3, 2)]]
    update = Paths(source=3, distances=np.zeros(0))
    after = edge_sets(batches, deletions)
    for graph, edges in zip(run_updates(update, batches, deletions), after, strict=True):
        exact = distances_of(digraph(edges, graph.ids.tolist()), 3)
        finite = np.isfinite(update.distances)
        got = zip(graph.ids[finite].tolist(), update.distances[finite], strict=True)
        assert dict(got) == exact
    assert exact == {3: 0}


def test_an_edge_inserted_and_deleted_at_once_is_no_missing_deletion():
    graph = StreamGraph.empty()
    ends = graph.indices(np.array([1, 5, 2, 6]))
    change = graph.update(
        (ends[:2], ends[2:], np.ones(2)), (ends[[0, 1]], ends[[3, 2]]), 4
    )  # 1 -> 2 and 5 -> 6 inserted; 1 -> 6 (never there) and 5 -> 2... deleted
    assert change.missing == 2 and len(graph.keys) == 2
    change = graph.update((ends[:1], ends[2:3], np.ones(1)), (ends[:1], ends[2:3]), 0)
    assert change.missing == 0 and len(graph.keys) == 1  # 1 -> 2 inserted again and deleted


# -- on Spark ----------------------------------------------------------------------------


def write_stream(folder: Path, batches, schema=EDGES) -> None:
    """One parquet file per micro-batch (an empty one for an empty batch)."""
    folder.mkdir(parents=True)
    fields = [field.split() for field in schema.split(", ")]
    kinds = {name: KINDS.get(t, "object") for name, t in fields}
    for index, batch in enumerate(batches):
        frame = pd.DataFrame([row[: len(kinds)] for row in batch], columns=list(kinds))
        frame.astype(kinds).to_parquet(folder / f"part-{index:04d}.parquet")


def stream(spark, folder: Path, schema=EDGES):
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(folder))


def to_the_end(tmp_path: Path) -> dict:
    """The options of a run over every file there is, "vertices" to a FileSink at "out"."""
    return {
        "sink": itf.FileSink(str(tmp_path / "out")),
        "checkpoint_location": str(tmp_path / "ckpt"),
        "available_now": True,
        "progress": False,
    }


def epochs_written(spark, path: Path, column: str) -> dict[int, dict]:
    rows = spark.read.parquet(str(path)).select("epoch", "id", column).toPandas()
    by_epoch: dict[int, dict] = {}
    for epoch, id_, value in rows.itertuples(index=False):
        values = by_epoch.setdefault(int(epoch), {})
        assert id_ not in values, f"vertex {id_} written twice in epoch {epoch}"
        values[id_] = None if pd.isna(value) else value
    return by_epoch


@pytest.mark.spark
def test_components_over_a_stream_of_insertions_and_deletions(spark, tmp_path):
    rng = np.random.default_rng(11)
    batches, deletions = random_stream(rng, 6, 30, deleting=True, weighted=False)
    write_stream(tmp_path / "edges", batches)
    write_stream(tmp_path / "deletions", deletions, "src long, dst long")
    query = (
        streaming.builder(
            "connected_components",
            stream(spark, tmp_path / "edges"),
            deletions=stream(spark, tmp_path / "deletions", "src long, dst long"),
        )
        .sink("vertices", itf.FileSink(str(tmp_path / "out")))
        .sink("changed", itf.FileSink(str(tmp_path / "changed")))
        .start(checkpoint_location=str(tmp_path / "ckpt"), available_now=True, progress=False)
    )
    query.awaitTermination()
    assert [p.input_rows for p in query.history] == [
        {"edges": len(b), "deletions": len(d)} for b, d in zip(batches, deletions, strict=True)
    ]
    written = epochs_written(spark, tmp_path / "out", "component")
    changed = epochs_written(spark, tmp_path / "changed", "component")
    previous: dict = {}
    ids: set = set()
    for epoch, edges in enumerate(edge_sets(batches, deletions)):
        ids |= {v for b in batches[: epoch + 1] for s, d, _ in b for v in (s, d)}
        expected = components_of(digraph(edges, ids))
        assert written[epoch] == expected
        moved = {v: c for v, c in expected.items() if previous.get(v) != c}
        assert changed.get(epoch, {}) == moved
        previous = expected
    metrics = query.history[-1].metrics
    assert metrics["edges"] == len(edge_sets(batches, deletions)[-1])
    assert sum(p.metrics["missing_deletions"] for p in query.history) == sum(
        1 for d in deletions if d
    )


@pytest.mark.spark
def test_pagerank_over_a_stream_is_networkx_after_every_epoch(spark, tmp_path):
    rng = np.random.default_rng(5)
    batches, deletions = random_stream(rng, 5, 25, deleting=True, weighted=False)
    write_stream(tmp_path / "edges", batches)
    write_stream(tmp_path / "deletions", deletions, "src long, dst long")
    query = streaming.pagerank(
        stream(spark, tmp_path / "edges"),
        deletions=stream(spark, tmp_path / "deletions", "src long, dst long"),
        tol=1e-7,
        **to_the_end(tmp_path),
    )
    query.awaitTermination()
    written = epochs_written(spark, tmp_path / "out", "pagerank")
    ids: set = set()
    for epoch, edges in enumerate(edge_sets(batches, deletions)):
        ids |= {v for b in batches[: epoch + 1] for s, d, _ in b for v in (s, d)}
        exact = nx.pagerank(digraph(edges, ids), tol=1e-14, max_iter=10_000)
        assert set(written[epoch]) == set(exact)
        assert sum(abs(written[epoch][v] - exact[v]) for v in exact) <= 1e-7
    assert all(p.metrics["rounds"] >= 1 for p in query.history)


@pytest.mark.spark
def test_weighted_shortest_paths_with_string_ids_and_isolated_vertices(spark, tmp_path):
    rng = np.random.default_rng(3)
    numbered, deletions = random_stream(rng, 5, 12, deleting=True, weighted=True)
    name = "v{}".format
    batches = [[(name(s), name(d), w) for s, d, w in b] for b in numbered]
    gone = [[(name(s), name(d)) for s, d in b] for b in deletions]
    write_stream(tmp_path / "edges", batches, "src string, dst string, w double")
    write_stream(tmp_path / "deletions", gone, "src string, dst string")
    lonely = spark.createDataFrame([("lonely",), ("v3",)], "id string")
    query = streaming.shortest_paths(
        stream(spark, tmp_path / "edges", "src string, dst string, w double"),
        "v3",
        weight="w",
        vertices=lonely,
        deletions=stream(spark, tmp_path / "deletions", "src string, dst string"),
        **to_the_end(tmp_path),
    )
    query.awaitTermination()
    written = epochs_written(spark, tmp_path / "out", "distance")
    ids = {"lonely", "v3"}
    for epoch, edges in enumerate(edge_sets(batches, gone)):
        ids |= {v for b in batches[: epoch + 1] for s, d, _ in b for v in (s, d)}
        exact = distances_of(digraph(edges, ids), "v3")
        assert set(written[epoch]) == ids
        reached = {v: x for v, x in written[epoch].items() if x is not None}
        assert reached == pytest.approx(exact, abs=1e-9)


@pytest.mark.spark
def test_bad_streams_are_refused_with_the_name_of_what_is_wrong(spark, tmp_path):
    write_stream(tmp_path / "edges", [[(1, 2, 1.0)]])
    edges = stream(spark, tmp_path / "edges")
    batch = spark.createDataFrame([(1, 2)], "src long, dst long")
    with pytest.raises(GraphError, match="'edges' must be a streaming DataFrame"):
        streaming.connected_components(batch, checkpoint_location=str(tmp_path / "c"))
    with pytest.raises(GraphError, match="no column"):
        streaming.pagerank(edges.select("src"), checkpoint_location=str(tmp_path / "c"))
    with pytest.raises(GraphError, match=r"vertices\.id is string"):
        streaming.builder(
            "connected_components", edges, vertices=spark.createDataFrame([("a",)], "id string")
        )
    with pytest.raises(GraphError, match="the algorithms are"):
        streaming.builder("triangles", edges)
    with pytest.raises(GraphError, match="weight='km'"):
        streaming.shortest_paths(edges, 1, weight="km")
    with pytest.raises(GraphError, match="alpha"):
        streaming.pagerank(edges, alpha=1.5)
    with pytest.raises(GraphError, match="the vertex ids are integers"):
        streaming.shortest_paths(edges, "1")


@pytest.mark.spark
def test_narrow_integer_ids_and_a_restart_with_other_settings(spark, tmp_path):
    narrow = "src int, dst int, w double"
    write_stream(tmp_path / "edges", [[(1, 2, 1.0), (2, 3, 1.0)], [(3, 4, 1.0)]], narrow)
    edges = stream(spark, tmp_path / "edges", narrow)
    query = streaming.shortest_paths(edges, 1, **to_the_end(tmp_path))
    query.awaitTermination()
    written = spark.read.parquet(str(tmp_path / "out"))
    assert written.schema["id"].dataType.simpleString() == "int"
    last = {r["id"]: r["distance"] for r in written.where("epoch = 1").collect()}
    assert last == {1: 0.0, 2: 1.0, 3: 2.0, 4: 3.0}
    # The checkpoint was made from source 1: another source is refused, not mixed in.
    write_stream(tmp_path / "more", [[(4, 5, 1.0)]], narrow)
    (tmp_path / "more" / "part-0000.parquet").rename(tmp_path / "edges" / "part-0002.parquet")
    again = streaming.shortest_paths(edges, 2, **to_the_end(tmp_path))
    with pytest.raises(itf.IterflowError, match="made with"):
        again.awaitTermination()


@pytest.mark.spark
def test_a_negative_weight_or_a_null_end_fails_the_query_with_its_reason(spark, tmp_path):
    write_stream(tmp_path / "edges", [[(1, 2, 1.0)], [(2, 3, -4.0)]])
    query = streaming.shortest_paths(
        stream(spark, tmp_path / "edges"),
        1,
        weight="w",
        checkpoint_location=str(tmp_path / "ckpt"),
        available_now=True,
        progress=False,
    )
    with pytest.raises(itf.IterflowError, match="non-negative weights"):
        query.awaitTermination()
    # The epoch before stays committed, the failed one is not.
    assert epoch_committed(tmp_path / "ckpt", 0)()
    assert not epoch_committed(tmp_path / "ckpt", 1)()
    nulls = tmp_path / "nulls"
    nulls.mkdir()
    pd.DataFrame({"src": [1, None], "dst": [2, 3]}, dtype="Int64").to_parquet(nulls / "a.parquet")
    query = streaming.connected_components(
        spark.readStream.schema("src long, dst long").parquet(str(nulls)),
        checkpoint_location=str(tmp_path / "ckpt2"),
        available_now=True,
        progress=False,
    )
    with pytest.raises(itf.IterflowError, match="null 'src' or 'dst'"):
        query.awaitTermination()


@pytest.mark.spark
def test_a_killed_stream_restarts_and_every_epoch_is_written_once(spark, tmp_path):
    rng = np.random.default_rng(8)
    batches, deletions = random_stream(rng, 10, 30, deleting=True, weighted=False)
    write_stream(tmp_path / "in" / "edges", batches)
    write_stream(tmp_path / "in" / "deletions", deletions, "src long, dst long")
    command = job_command(Path(__file__).with_name("streaming_graph_kill_job.py"), tmp_path)
    kill_when(command, epoch_committed(tmp_path / "ckpt", 3), after_s=0.1)
    assert not (tmp_path / "out.json").exists()
    run_to_end(command)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["resumed_from"] >= 3 and out["termination"] == "inputs_ended"
    written = epochs_written(spark, tmp_path / "sinks" / "vertices", "component")
    # One epoch per micro-batch; the micro-batch Spark planned again after the kill may
    # take two files of a stream (its offset log says which files each one read).
    read = files_read(tmp_path / "ckpt" / "stream")
    assert sorted(written) == list(range(len(read)))
    assert read[-1] == {"edges": len(batches) - 1, "deletions": len(deletions) - 1}
    edges: set = set()
    ids: set = set()
    before = {"edges": -1, "deletions": -1}
    for epoch, last in enumerate(read):
        added = {(s, d) for b in batches[before["edges"] + 1 : last["edges"] + 1] for s, d, _ in b}
        gone = {e for b in deletions[before["deletions"] + 1 : last["deletions"] + 1] for e in b}
        edges = (edges | added) - gone  # in one micro-batch, a deletion wins
        ids |= {v for e in added for v in e}
        assert written[epoch] == components_of(digraph(dict.fromkeys(edges, 1.0), ids)), epoch
        before = last


def files_read(stream: Path) -> list[dict[str, int]]:
    """For each micro-batch of a query over the file streams "edges" and "deletions", the
    index of the last file of each that it had read (from Spark's offset and source logs:
    a micro-batch reads a source up to a log entry, an entry lists one file or more)."""
    names, entries = {}, {}
    for source in (stream / "sources").iterdir():
        logged = {
            int(entry.name.removesuffix(".compact")): [
                int(n) for n in re.findall(r"part-(\d+)", entry.read_text())
            ]
            for entry in source.iterdir()
            if entry.name.removesuffix(".compact").isdigit()
        }
        text = " ".join(
            entry.read_text()
            for entry in source.iterdir()
            if entry.name.removesuffix(".compact").isdigit()
        )
        names[int(source.name)] = "deletions" if "/deletions/" in text else "edges"
        entries[int(source.name)] = logged
    read = []
    offsets = stream / "offsets"
    for batch in sorted(int(p.name) for p in offsets.iterdir() if p.name.isdigit()):
        lines = (offsets / str(batch)).read_text().splitlines()[-len(names) :]
        last = {}
        for i, line in enumerate(lines):
            upto = json.loads(line)["logOffset"]
            last[names[i]] = max(f for k, files in entries[i].items() if k <= upto for f in files)
        read.append(last)
    return read
