"""The model exchange of resident rounds, along a tree of the staying tasks.

Sent from the driver to every staying task and received from every one, a kernel
call's arguments and partial results would cross the driver once per task: its bytes
per round would grow with the cluster. Along the tree they cross it once:

- **Broadcast.** The driver sends a call's payload (the kernel and its arguments,
  pickled once) to the first staying task only, the root, and a note of a few bytes to
  the others. Every task fetches the payload from its parent in a binary tree of the
  tasks (in task order), then serves it to its own children, while its kernels run.
- **Reduce.** An ``itf.combine`` over resident data merges its partitions'
  accumulators among the tasks, along the CombineFn's own merge tree (``MergeTree``):
  each group of a level is merged by the task that holds the group's first member, the
  others send it their members; the task holding partition 0 merges what is left and
  extracts the rows, which are all the driver receives. The same accumulators meet in
  the same order as on every other path, so the result is the same to the bit for any
  number of tasks::

      driver --payload--> task 0 --> task 1 --> task 3      (broadcast, fan-out 2)
                                 \\-> task 2 --> ...
      task 2: acc 4, 5 --> task 0 (holds 3, merges group 3-5)  (reduce, by MergeTree)
      task 0: merge what is left, extract --rows--> driver

Each staying task serves its peers with a small Flight server (``Relay``) under the
data plane's trust model: the run's secret on every call and, where Spark's security is
on, TLS with the run's certificate pinned on both ends. Executors must reach each other
on ephemeral ports, as Spark's own block transfers do; where a task cannot reach its
parent when the tree is set up, the run keeps the driver-centred exchange, with a
WARNING on ``iterflow.resident``.
"""

from __future__ import annotations

import pickle
import socket
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs
import pyarrow as pa
import pyarrow.flight as flight

from iterflow.runtime.datacache.dataplane import (
    PING,
    Credentials,
    SecretCheck,
    host_in_uri,
    tls_options,
)

#: Children of a task in the broadcast tree.
FANOUT = 2
#: How long a task tries to reach its parent when the tree is set up.
REACH_TIMEOUT_S = 10.0


@attrs.frozen
class Peers:
    """The staying tasks of one launch, as every task sees them."""

    tasks: tuple[int, ...]  # in order; the first is the root
    relays: Mapping[int, str]  # task -> the location of its relay
    holders: tuple[int, ...]  # partition -> the task that holds it

    def parent(self, task: int) -> int | None:
        """``task``'s parent in the broadcast tree; None for the root."""
        position = self.tasks.index(task)
        return None if position == 0 else self.tasks[(position - 1) // FANOUT]


class Merging(Protocol):
    """How the tasks merge one combine's accumulators (``combine.TreeMerge``)."""

    def shape(self, partials: int) -> tuple[int, tuple[int, ...]]: ...

    def merge(self, members: list[bytes]) -> bytes: ...

    def finish(self, members: list[bytes]) -> list[pa.RecordBatch]: ...

    def whole(self, partials: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]: ...


@attrs.frozen
class Failed:
    """An item that could not be made: why, passed up the tree in its place."""

    error: str
    trace: str = ""


Item = bytes | Failed


def reduce_here(
    task: int,
    peers: Peers,
    merging: Merging,
    items: dict[int, bytes],
    deliver: Callable[[int, int, int, Item], None],
    receive: Callable[[int, int], Item],
) -> list[pa.RecordBatch] | Failed | None:
    """``task``'s part in merging one combine's accumulators along its merge tree.

    ``items`` are the pickled accumulators of the partitions ``task`` holds;
    ``deliver(owner, level, index, item)`` sends one to the task that merges its group,
    ``receive(level, index)`` waits for one sent here. Each level sends first, then
    merges, so no task waits on one that waits on it. Returns the extracted rows (or
    why they failed) at the task that merges last, None at the others."""
    owners = list(peers.holders)
    if not owners:
        return merging.finish([]) if task == peers.tasks[0] else None
    scale, levels = merging.shape(len(owners))
    held: dict[int, Item] = dict(items)
    for level, size in enumerate([scale] * len(levels) + [len(owners)]):
        starts = range(0, len(owners), size)
        for start in starts:
            for index in range(start, min(start + size, len(owners))):
                if owners[index] == task and owners[start] != task:
                    deliver(owners[start], level, index, held.pop(index))
        merged: dict[int, Item] = {}
        for group, start in enumerate(starts):
            if owners[start] != task:
                continue
            members = [
                held.pop(index) if owners[index] == task else receive(level, index)
                for index in range(start, min(start + size, len(owners)))
            ]
            if level == len(levels):  # the last merge, and the rows
                return _attempt(merging.finish, members)
            merged[group] = _attempt(merging.merge, members)
        owners = [owners[start] for start in starts]
        held = merged
    return None


def _attempt(step: Callable[[list[bytes]], Any], members: list[Item]) -> Any:
    """``step(members)``, or the first failure among them or of the step itself."""
    failed = [member for member in members if isinstance(member, Failed)]
    if failed:
        return failed[0]
    try:
        return step([member for member in members if isinstance(member, bytes)])
    except Exception as error:
        return Failed(f"{type(error).__name__}: {error}", traceback.format_exc())


class RelayClosed(Exception):
    """The task's relay closed while the task waited on it."""


class Relay(flight.FlightServerBase):
    """A staying task's Flight server for its peers: the current call's payload, for its
    children to fetch, and the accumulators other tasks send it to merge."""

    def __init__(self, credentials: Credentials) -> None:
        host = reaching_address(credentials.location)
        scheme = "grpc+tls" if credentials.client is not None else "grpc+tcp"
        client = credentials.client  # with TLS, both ends present the run's client pair
        super().__init__(
            f"{scheme}://{host_in_uri(host)}:0",
            middleware={"secret": SecretCheck(credentials.secret)},
            **tls_options(client, client),
        )
        self.location = f"{scheme}://{host_in_uri(host)}:{self.port}"
        self._ready = threading.Condition()
        self._payload: tuple[int, Any] = (-1, b"")
        self._inbox: dict[tuple[int, int, int], Item] = {}
        self._closed = False

    def publish(self, call: int, payload: Any) -> None:
        """The payload of call ``call``, for the children to fetch."""
        with self._ready:
            self._payload = (call, payload)
            self._ready.notify_all()

    def take(self, call: int, level: int, index: int) -> Item:
        """The item ``index`` of ``level`` of call ``call``, once a peer has sent it."""
        key = (call, level, index)
        with self._ready:
            self._ready.wait_for(lambda: key in self._inbox or self._closed)
            if key not in self._inbox:
                raise RelayClosed("the relay closed")
            return self._inbox.pop(key)

    def close(self) -> None:
        """Stop serving: calls waiting for a payload end (with an error) first."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        self.shutdown()

    def do_action(self, context: Any, action: Any) -> list[Any]:
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == PING:
            return [b"ok"]
        if action.type == "payload":
            call = int(body)
            with self._ready:
                self._ready.wait_for(lambda: self._payload[0] >= call or self._closed)
                held, payload = self._payload
            if held != call:
                raise flight.FlightServerError(f"call {call} has passed (now {held})")
            return [flight.Result(pa.py_buffer(payload))]
        if action.type == "item":
            call, level, index, item = pickle.loads(body)
            with self._ready:
                self._inbox[(call, level, index)] = item
                self._ready.notify_all()
            return [b"ok"]
        raise flight.FlightServerError(f"iterflow relay: unknown action {action.type!r}")


class Links:
    """A task's clients of its peers' relays, one per peer, opened when first used."""

    def __init__(self, credentials: Credentials, peers: Peers) -> None:
        self._credentials = credentials
        self._peers = peers
        self._clients: dict[int, tuple[flight.FlightClient, Credentials]] = {}

    def _client(self, task: int) -> tuple[flight.FlightClient, Credentials]:
        if task not in self._clients:
            credentials = self._credentials.of_peer(self._peers.relays[task])
            self._clients[task] = (credentials.client_for(), credentials)
        return self._clients[task]

    def _action(self, task: int, kind: str, body: bytes, timeout: float | None = None) -> Any:
        client, credentials = self._client(task)
        results = client.do_action(flight.Action(kind, body), credentials.call_options(timeout))
        return next(iter(results)).body

    def reach(self, task: int) -> str | None:
        """Why ``task``'s relay cannot be reached, or None when it answers."""
        try:
            self._action(task, PING, b"", REACH_TIMEOUT_S)
        except (pa.ArrowException, OSError) as error:
            return f"{self._peers.relays[task]}: {str(error).splitlines()[0]}"
        return None

    def fetch(self, task: int, call: int) -> pa.Buffer:
        """The payload of call ``call`` from ``task``'s relay (waiting until it has it)."""
        return self._action(task, "payload", str(call).encode())

    def deliver(self, task: int, call: int, level: int, index: int, item: Item) -> None:
        """Send an accumulator to ``task``, which merges its group."""
        self._action(task, "item", pickle.dumps((call, level, index, item), protocol=5))

    def close(self) -> None:
        for client, _ in self._clients.values():
            client.close()
        self._clients = {}


def reaching_address(location: str) -> str:
    """The address of this host's interface that reaches the host of ``location`` (the
    driver's data plane): where the other executors can reach this task too."""
    parts = urllib.parse.urlsplit(location)
    family, kind, _proto, _name, address = socket.getaddrinfo(
        parts.hostname, parts.port, type=socket.SOCK_DGRAM
    )[0]
    with socket.socket(family, kind) as probe:
        probe.connect(address)  # a datagram socket sends nothing: it only picks the route
        return str(probe.getsockname()[0])


def holders_of(held: Mapping[int, Sequence[int]], partitions: int) -> tuple[int, ...]:
    """Partition -> the task that holds it, from each task's partitions."""
    owner = {part: task for task, parts in held.items() for part in parts}
    return tuple(owner[part] for part in range(partitions))
