"""The model exchange along a tree of resident tasks, without Spark: the tasks' merges
give ``merge_tree``'s result to the bit for any placement of partitions, task count and
depth; a failing merge reaches the root and nobody waits for ever; the relays serve
payloads and accumulators only to holders of the run's secret, in clear or over TLS."""

from __future__ import annotations

import pickle
import random
import threading
from collections.abc import Callable

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import iterflow as itf
from iterflow.runtime.datacache.combine import TreeMerge, _Combining, merge_tree
from iterflow.runtime.datacache.dataplane import Credentials, KeyPair
from iterflow.runtime.datacache.resident_tree import (
    Failed,
    Links,
    Peers,
    Relay,
    holders_of,
    reduce_here,
)


class Nesting(itf.CombineFn):
    """Accumulators are strings; a merge writes its members in brackets, so any other
    grouping or order of merges gives another string."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.fail_on = fail_on

    def create_accumulator(self):
        return "."

    def add_input(self, acc, batch):
        return acc

    def merge_accumulators(self, accs):
        merged = "(" + ",".join(accs) + ")"
        if self.fail_on is not None and self.fail_on in merged:
            raise ValueError(f"cannot merge {merged}")
        return merged

    def extract_output(self, acc):
        return [(acc,)]


def merging(fn: itf.CombineFn, depth: int) -> TreeMerge:
    return TreeMerge(_Combining(fn, None, pa.schema([("s", pa.string())]), "s string"), depth)


def on_threads(peers: Peers, merge: TreeMerge) -> dict[int, object]:
    """Every task's ``reduce_here`` on its own thread, items passed through memory."""
    inbox: dict[tuple[int, int, int], object] = {}
    ready = threading.Condition()

    def deliver(owner: int, level: int, index: int, item: object) -> None:
        with ready:
            inbox[(owner, level, index)] = item
            ready.notify_all()

    def receiver(task: int) -> Callable[[int, int], object]:
        def receive(level: int, index: int) -> object:
            with ready:
                assert ready.wait_for(lambda: (task, level, index) in inbox, timeout=10)
                return inbox.pop((task, level, index))

        return receive

    results: dict[int, object] = {}

    def run(task: int) -> None:
        items = {p: pickle.dumps(f"p{p}") for p, t in enumerate(peers.holders) if t == task}
        results[task] = reduce_here(task, peers, merge, items, deliver, receiver(task))

    threads = [threading.Thread(target=run, args=(task,)) for task in peers.tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
        assert not thread.is_alive(), "a task waits for ever"
    assert inbox == {}  # every item sent was merged
    return results


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("partitions", [1, 2, 5, 9, 17, 40])
@pytest.mark.parametrize("tasks", [1, 3, 6])
def test_the_tasks_merge_as_merge_tree_for_any_placement(depth, partitions, tasks) -> None:
    fn = Nesting()
    expected = merge_tree(fn, [f"p{p}" for p in range(partitions)], depth, None)
    for seed in range(4):
        rng = random.Random(seed)
        ids = (2, 5, 7, 11, 12, 20)[:tasks]
        holders = tuple(rng.choice(ids) for _ in range(partitions))
        if seed == 0:  # contiguous, as coalesce tends to place them
            holders = tuple(sorted(holders))
        peers = Peers(tuple(sorted(ids)), {}, holders)
        results = on_threads(peers, merging(fn, depth))
        root = holders[0]
        rows = results.pop(root)
        assert isinstance(rows, list)
        assert pa.Table.from_batches(rows)["s"].to_pylist() == [expected]
        assert all(result is None for result in results.values())  # only the root has rows


def test_with_no_partitions_the_root_extracts_a_fresh_accumulator() -> None:
    results = on_threads(Peers((3, 4), {}, ()), merging(Nesting(), 2))
    assert pa.Table.from_batches(results[3])["s"].to_pylist() == ["."]
    assert results[4] is None


def test_a_failing_merge_reaches_the_root_and_no_task_waits() -> None:
    holders = (1, 2, 2, 1, 3, 3, 3, 2, 1)
    results = on_threads(Peers((1, 2, 3), {}, holders), merging(Nesting(fail_on="p4"), 2))
    failed = results[1]
    assert isinstance(failed, Failed) and "cannot merge (p3,p4,p5)" in failed.error
    assert "ValueError" in failed.error and "merge_accumulators" in failed.error


def test_the_broadcast_tree_has_two_children_per_task() -> None:
    peers = Peers((4, 8, 9, 10, 15, 16, 23), {}, ())
    assert [peers.parent(t) for t in peers.tasks] == [None, 4, 4, 8, 8, 9, 9]
    assert holders_of({4: [2, 0], 8: [1]}, 3) == (4, 8, 4)


@pytest.mark.parametrize("tls", [False, True])
def test_relays_pass_payloads_and_accumulators_to_holders_of_the_secret(tls) -> None:
    client = KeyPair.make() if tls else None
    scheme = "grpc+tls" if tls else "grpc+tcp"
    driver = Credentials(f"{scheme}://127.0.0.1:9", "s" * 64, None, client)
    relays = [Relay(driver), Relay(driver)]
    try:
        peers = Peers((0, 1), {0: relays[0].location, 1: relays[1].location}, (0, 1))
        assert relays[0].location.startswith(f"{scheme}://127.0.0.1:")
        links = Links(driver, peers)
        assert links.reach(1) is None
        payload = b"K" + bytes(range(256)) * 40_000  # 10 MB
        relays[0].publish(7, memoryview(payload))
        assert links.fetch(0, 7).to_pybytes() == payload
        links.deliver(1, 7, 0, 3, b"acc")
        links.deliver(1, 7, 1, 0, Failed("ValueError: x"))
        assert relays[1].take(7, 0, 3) == b"acc"
        assert relays[1].take(7, 1, 0) == Failed("ValueError: x")
        links.close()
        intruder = Links(Credentials(driver.location, "t" * 64, None, client), peers)
        with pytest.raises(flight.FlightUnauthenticatedError):
            intruder.fetch(0, 7)
        intruder.close()
    finally:
        for relay in relays:
            relay.close()


def test_a_closed_relay_ends_the_calls_that_wait_on_it() -> None:
    driver = Credentials("grpc+tcp://127.0.0.1:9", "s" * 64)
    relay = Relay(driver)
    links = Links(driver, Peers((0,), {0: relay.location}, (0,)))
    errors: list[Exception] = []

    def fetch() -> None:
        try:
            links.fetch(0, 3)  # never published
        except pa.ArrowException as error:
            errors.append(error)

    waiting = threading.Thread(target=fetch)
    waiting.start()
    threading.Event().wait(0.3)
    relay.close()
    waiting.join(timeout=10)
    assert not waiting.is_alive() and errors
    links.close()
