"""The data plane of resident rounds: an Arrow Flight server on the driver.

Resident tasks (``iterflow.runtime.resident``) never talk to each other, only to
the driver: each opens one long-lived ``do_exchange`` stream to this server and
then trades messages over it, a kernel call from the driver and its outputs from
the task. A message is one pickled value carried as the Flight stream's
application metadata, so one stream serves any schema, round after round.

Every call must present the run's secret in the ``x-iterflow-secret`` header;
the secret travels to the tasks inside the resident job's own closure, and a
call without it (or with another) is refused before it reaches a handler. The
server binds to the driver's bind address (loopback for local masters) on the
port ``spark.iterflow.resident.port`` pins, or on any free one.
"""

from __future__ import annotations

import hmac
import pickle
import secrets
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from iterflow.errors import IterflowError

SECRET_HEADER = "x-iterflow-secret"
#: The action a task calls first, with a timeout, to learn that it reaches the driver.
PING = "ping"


def _dumps(value: Any) -> pa.Buffer:
    return pa.py_buffer(pickle.dumps(value, protocol=5))


class Channel:
    """One side of a resident task's exchange stream: ``send`` a value, ``receive`` one.

    ``receive`` returns None when the other side closed the stream.
    """

    def __init__(self, reader: Any, writer: Any) -> None:
        self._reader = reader
        self._writer = writer

    def send(self, value: Any, payload: bytes | None = None) -> None:
        """Send ``value``; ``payload`` (already pickled, e.g. a kernel call) is sent as is."""
        self._writer.write_metadata(pa.py_buffer(payload) if payload is not None else _dumps(value))

    def receive(self) -> Any:
        try:
            chunk = self._reader.read_chunk()
        except StopIteration:
            return None
        return pickle.loads(chunk.app_metadata)


class _SecretCheck(flight.ServerMiddlewareFactory):
    """Refuses every call that does not present the run's secret."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self._secret = secret
        self.refused = 0

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        presented = headers.get(SECRET_HEADER) or [""]
        token = presented[0].decode() if isinstance(presented[0], bytes) else str(presented[0])
        if not hmac.compare_digest(token.encode(), self._secret.encode()):
            self.refused += 1
            raise flight.FlightUnauthenticatedError(
                "iterflow data plane: the call did not present this run's secret"
            )


#: Handles one task's stream: its opening message (``hello``) and the channel.
StreamHandler = Callable[[dict[str, Any], Channel], None]


class DataPlane(flight.FlightServerBase):
    """The driver's Flight server for one run's resident tasks.

    ``register(job, handler)`` routes the streams that tasks of resident job
    ``job`` open to ``handler``, which serves each stream on a server thread for
    as long as the task lives.
    """

    def __init__(self, bind_host: str, advertised_host: str, port: int) -> None:
        self.secret = secrets.token_hex(32)
        self._check = _SecretCheck(self.secret)
        self._handlers: dict[str, StreamHandler] = {}
        self._lock = threading.Lock()
        try:
            super().__init__(f"grpc+tcp://{bind_host}:{port}", middleware={"secret": self._check})
        except (pa.ArrowException, OSError) as error:
            raise IterflowError(
                f"the resident data plane cannot listen on {bind_host}:{port} ({error}); "
                "free the port or set spark.iterflow.resident.port to another one (0: any)"
            ) from error
        self.location = f"grpc+tcp://{advertised_host}:{self.port}"

    @property
    def refused(self) -> int:
        """Calls refused for want of the secret."""
        return self._check.refused

    def register(self, job: str, handler: StreamHandler) -> None:
        with self._lock:
            self._handlers[job] = handler

    def unregister(self, job: str) -> None:
        with self._lock:
            self._handlers.pop(job, None)

    def do_action(self, context: Any, action: Any) -> list[bytes]:
        if action.type == PING:
            return [b"ok"]
        raise flight.FlightServerError(f"iterflow data plane: unknown action {action.type!r}")

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        hello = pickle.loads(descriptor.command)
        with self._lock:
            handler = self._handlers.get(hello.get("job"))
        if handler is None:
            raise flight.FlightServerError(
                f"iterflow data plane: resident job {hello.get('job')!r} has ended"
            )
        handler(hello, Channel(reader, writer))

    def close(self) -> None:
        with self._lock:
            self._handlers.clear()
        self.shutdown()


def call_options(secret: str, timeout: float | None = None) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(
        headers=[(SECRET_HEADER.encode(), secret.encode())], timeout=timeout
    )


def connect(location: str, secret: str, hello: dict[str, Any], timeout: float) -> Channel:
    """Open a task's stream to the data plane at ``location`` (executor side).

    Raises ``flight.FlightUnavailableError`` (or ``FlightTimedOutError``) when the
    driver cannot be reached within ``timeout`` seconds.
    """
    client = flight.FlightClient(location)
    list(client.do_action(flight.Action(PING, b""), call_options(secret, timeout)))
    descriptor = flight.FlightDescriptor.for_command(pickle.dumps(hello))
    writer, reader = client.do_exchange(descriptor, call_options(secret))
    channel = Channel(reader, writer)
    channel.client = client  # type: ignore[attr-defined]  # keeps the connection alive
    return channel
