"""The data plane of resident rounds: an Arrow Flight server on the driver.

Each resident task (``iterflow.runtime.datacache.resident``) opens one long-lived
``do_exchange`` stream to this server and then trades messages over it, a kernel call
from the driver and its outputs from the task; the tasks also pass calls and partial
results among themselves along a tree (``resident_tree``), under the same trust
model. A message is one pickled value carried as the Flight stream's application
metadata, so one stream serves any schema, round after round. ``DataPlane.traffic``
counts the bytes of every message both ways.

Trust model. Everything a task needs to reach the server (``Credentials``) travels
inside the resident job's closure, as Spark ships any task, and is new for each run:

- Every call must present the run's secret (256 random bits) in the
  ``x-iterflow-secret`` header; a call without it (or with another) is refused by
  the server before any handler runs, so the driver unpickles nothing a task sent
  before the task proved it holds the secret.
- On a cluster with Spark's security on (``spark.authenticate``,
  ``spark.network.crypto.enabled``, ``spark.ssl.enabled``) the server speaks TLS
  with a certificate made for this run, and requires a client certificate made for
  this run too: each end trusts only the other's certificate (pinned, not checked
  against any authority), so the task knows it talks to this run's driver before it
  unpickles a message, the driver knows the task was shipped by this run, and
  nothing, the secret included, crosses the network in clear.
- Without those settings the stream is cleartext gRPC, as Spark's own RPC is then.

The server binds to the driver's bind address (loopback for local masters) on the
port ``spark.iterflow.resident.port`` pins, or on any free one; IPv6 addresses
work.
"""

from __future__ import annotations

import datetime
import hmac
import json
import pickle
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pyarrow as pa
import pyarrow.flight as flight

from iterflow.errors import IterflowError

SECRET_HEADER = "x-iterflow-secret"
#: The action a task calls first, with a timeout, to learn that it reaches the driver.
PING = "ping"
#: The name both certificates carry; tasks check the server's against it, whatever
#: address they reach the driver at.
TLS_NAME = "iterflow-data-plane"
#: Spark settings any of which, when true, makes the data plane speak TLS.
SECURITY_SETTINGS = (
    "spark.authenticate",
    "spark.network.crypto.enabled",
    "spark.ssl.enabled",
    "spark.ssl.rpc.enabled",
)


def secured(conf: Mapping[str, str]) -> bool:
    """Whether Spark settings ``conf`` turn on any of Spark's security
    (``SECURITY_SETTINGS``): then the data plane must be authenticated and encrypted."""
    return any(str(conf.get(key, "false")).strip().lower() == "true" for key in SECURITY_SETTINGS)


def host_in_uri(host: str) -> str:
    """``host`` as it stands in a URI: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@attrs.frozen
class KeyPair:
    """A PEM certificate made for one run, and its private key."""

    cert: bytes
    key: bytes

    @classmethod
    def make(cls) -> KeyPair:
        """A new EC key and a self-signed certificate for ``TLS_NAME``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_NAME)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


@attrs.frozen(repr=False)
class Credentials:
    """What a task needs to reach one run's data plane; shipped in the task closure.

    ``server_cert`` is the only certificate the task trusts for the server, and
    ``client`` the certificate and key it presents (both None without TLS).
    """

    location: str
    secret: str
    server_cert: bytes | None = None
    client: KeyPair | None = None

    def __repr__(self) -> str:  # never the secret or a key in a log line
        return f"Credentials({self.location})"

    def of_peer(self, location: str) -> Credentials:
        """What a task needs to reach another task's relay at ``location``
        (``resident_tree``): the same secret; with TLS, each end presents the run's
        client certificate and trusts only it."""
        cert = self.client.cert if self.client is not None else None
        return attrs.evolve(self, location=location, server_cert=cert)

    def client_for(self) -> flight.FlightClient:
        """A Flight client of this data plane (executor side)."""
        if self.server_cert is None or self.client is None:
            return flight.FlightClient(self.location)
        return flight.FlightClient(
            self.location,
            tls_root_certs=self.server_cert,
            cert_chain=self.client.cert,
            private_key=self.client.key,
            override_hostname=TLS_NAME,
        )

    def call_options(self, timeout: float | None = None) -> flight.FlightCallOptions:
        return flight.FlightCallOptions(
            headers=[(SECRET_HEADER.encode(), self.secret.encode())], timeout=timeout
        )


def _dumps(value: Any) -> pa.Buffer:
    return pa.py_buffer(pickle.dumps(value, protocol=5))


class Traffic:
    """Bytes the driver's data plane sent and received, over all streams (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0
        self.received = 0

    def count(self, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.sent += sent
            self.received += received

    def total(self) -> int:
        """Bytes both ways so far."""
        with self._lock:
            return self.sent + self.received


class Channel:
    """One side of a resident task's exchange stream: ``send`` a value, ``receive`` one.

    ``receive`` returns None when the other side closed the stream. On the driver,
    ``traffic`` counts the bytes of every message both ways.
    """

    def __init__(self, reader: Any, writer: Any, traffic: Traffic | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self._traffic = traffic

    def send(self, value: Any, payload: bytes | None = None) -> None:
        """Send ``value``; ``payload`` (already pickled, e.g. a kernel call) is sent as is."""
        buffer = pa.py_buffer(payload) if payload is not None else _dumps(value)
        if self._traffic is not None:
            self._traffic.count(sent=buffer.size)
        self._writer.write_metadata(buffer)

    def receive(self) -> Any:
        raw = self.receive_bytes()
        return None if raw is None else pickle.loads(raw)

    def receive_bytes(self) -> pa.Buffer | None:
        """The next message still pickled, or None when the other side closed the stream."""
        try:
            chunk = self._reader.read_chunk()
        except StopIteration:
            return None
        if self._traffic is not None and chunk.app_metadata is not None:
            self._traffic.count(received=chunk.app_metadata.size)
        return chunk.app_metadata


def tls_options(server: KeyPair | None, client: KeyPair | None) -> dict[str, Any]:
    """A Flight server's TLS options: present ``server``, and require a client
    certificate that is ``client``'s (pinned); none without TLS."""
    if server is None or client is None:
        return {}
    return {
        "tls_certificates": [flight.CertKeyPair(server.cert, server.key)],
        "verify_client": True,
        "root_certificates": client.cert,
    }


class SecretCheck(flight.ServerMiddlewareFactory):
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
    as long as the task lives. With ``tls`` the server speaks TLS and requires the
    run's client certificate (see the module's trust model).
    """

    def __init__(self, bind_host: str, advertised_host: str, port: int, tls: bool = False) -> None:
        secret = secrets.token_hex(32)
        self._check = SecretCheck(secret)
        self._handlers: dict[str, StreamHandler] = {}
        self._lock = threading.Lock()
        self.traffic = Traffic()  # every byte of every stream, both ways
        scheme = "grpc+tls" if tls else "grpc+tcp"
        server = KeyPair.make() if tls else None
        client = KeyPair.make() if tls else None
        try:
            super().__init__(
                f"{scheme}://{host_in_uri(bind_host)}:{port}",
                middleware={"secret": self._check},
                **tls_options(server, client),
            )
        except (pa.ArrowException, OSError) as error:
            raise IterflowError(
                f"the resident data plane cannot listen on {bind_host}:{port} ({error}); "
                "free the port or set spark.iterflow.resident.port to another one (0: any)"
            ) from error
        location = f"{scheme}://{host_in_uri(advertised_host)}:{self.port}"
        self.credentials = Credentials(
            location, secret, server.cert if server is not None else None, client
        )

    @property
    def location(self) -> str:
        return self.credentials.location

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
        hello = json.loads(descriptor.command)
        with self._lock:
            handler = self._handlers.get(hello.get("job"))
        if handler is None:
            raise flight.FlightServerError(
                f"iterflow data plane: resident job {hello.get('job')!r} has ended"
            )
        handler(hello, Channel(reader, writer, self.traffic))

    def close(self) -> None:
        with self._lock:
            self._handlers.clear()
        self.shutdown()


def connect(credentials: Credentials, hello: dict[str, Any], timeout: float) -> Channel:
    """Open a task's stream to the data plane (executor side); ``hello`` is a JSON value.

    Raises ``flight.FlightUnavailableError`` (or ``FlightTimedOutError``) when the
    driver cannot be reached within ``timeout`` seconds.
    """
    client = credentials.client_for()
    list(client.do_action(flight.Action(PING, b""), credentials.call_options(timeout)))
    descriptor = flight.FlightDescriptor.for_command(json.dumps(hello).encode())
    writer, reader = client.do_exchange(descriptor, credentials.call_options())
    channel = Channel(reader, writer)
    channel.client = client  # type: ignore[attr-defined]  # keeps the connection alive
    return channel
