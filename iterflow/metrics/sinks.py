"""Where metrics snapshots go: a JSON-lines file, an HTTP endpoint, Graphite, Prometheus.

Pure Python: no Spark import. ``prometheus_client`` is imported only by
``PrometheusSink``, so the other sinks work without the ``prometheus`` extra.
"""

from __future__ import annotations

import abc
import json
import logging
import math
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3

from iterflow.errors import IterflowValueError
from iterflow.metrics.values import DistributionValue, MetricsSnapshot, number_fields

if TYPE_CHECKING:
    from types import TracebackType

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from urllib3.connectionpool import ConnectionPool
    from urllib3.response import BaseHTTPResponse

logger = logging.getLogger("iterflow.metrics")

#: The two totals every metric has, in the order sinks report them.
STATES = ("committed", "attempted")


class MetricsSink(abc.ABC):
    """Receives the snapshots of a run, periodically and once more when it ends.

    ``push`` may raise (server down, timeout): the pusher logs a warning naming
    ``name`` and carries on. It runs on a thread of its own, and the pusher waits
    for it at most ``timeout_s`` seconds (then counts it as failed while it goes
    on). Subclass it to send metrics anywhere else.
    """

    #: Says which sink failed in warnings, e.g. ``"graphite metrics.local:2003"``.
    name: str
    #: Seconds the pusher waits for one push; a run's end waits at most twice that
    #: (a push under way, then the final one).
    timeout_s: float = 5.0

    @abc.abstractmethod
    def push(self, snapshot: MetricsSnapshot) -> None:
        """Send ``snapshot``; raise if it could not be delivered."""

    def redact(self, text: str) -> str:
        """``text`` (a failed push's error) without the secrets the sink holds, for the
        warnings that quote it; a sink whose address carries credentials overrides it."""
        return text

    def close(self) -> None:  # noqa: B027 (not abstract: most sinks hold nothing)
        """Release what the sink holds (a server, a connection).

        iterflow never calls it: sinks belong to their creator and may serve several runs.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class JsonLinesSink(MetricsSink):
    """Appends each snapshot to ``path`` as one JSON object per line.

    >>> sink = JsonLinesSink("out/metrics.jsonl")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"json-lines {self.path}"

    def push(self, snapshot: MetricsSnapshot) -> None:
        # Opening per push keeps no handle between pushes: the file can be rotated.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(snapshot.to_dict()) + "\n")


class HttpJsonSink(MetricsSink):
    """POSTs each snapshot as JSON to ``url``; a final status other than 2xx raises.

    Sent with urllib3: a refused connection and the statuses of ``RETRY_STATUSES``
    (429 and the 5xx of a server overloaded or away) are tried again, at most
    ``retries`` times: at once, then after ``backoff_s``, twice that, and so on (or
    after the server's ``Retry-After``), as long as the next try starts within
    ``timeout_s`` of the push's start. A request whose answer did not come is not sent
    again: the server may have taken it. ``timeout_s`` also bounds connecting and each
    wait for the answer.
    Redirects are not followed. User info in ``url`` is sent as basic authentication;
    ``name``, and the errors that warnings quote, show the URL with its user info and
    query values as ``***`` (``redacted_url``).

    >>> sink = HttpJsonSink("http://collector:8080/iterflow", timeout_s=2.0)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        headers: dict[str, str] | None = None,
        retries: int = 3,
        backoff_s: float = 0.25,
    ) -> None:
        parts = urllib3.util.parse_url(url) if _is_http_url(url) else None
        if parts is None:
            raise IterflowValueError(
                f"HttpJsonSink url '{redacted_url(str(url))}' is not an http(s) URL; "
                "give one such as 'http://collector:8080/iterflow'"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise IterflowValueError(
                f"HttpJsonSink retries is {retries!r}; give a whole number, 0 or more"
            )
        if isinstance(backoff_s, bool) or not (
            isinstance(backoff_s, (int, float)) and 0 <= backoff_s < math.inf
        ):
            raise IterflowValueError(
                f"HttpJsonSink backoff_s is {backoff_s!r}; give a number of seconds, 0 or more"
            )
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.headers = {**(headers or {}), "Content-Type": "application/json"}
        if parts.auth:
            self.headers.update(urllib3.util.make_headers(basic_auth=parts.auth))
        self._target = parts._replace(auth=None).url
        self._pool = urllib3.PoolManager()
        self.name = f"http-json {redacted_url(url)}"

    def push(self, snapshot: MetricsSnapshot) -> None:
        retry = RetryWithin(
            time.monotonic() + self.timeout_s,
            total=self.retries,
            read=0,  # the request went out: the server may have taken it
            other=0,
            redirect=False,
            allowed_methods=None,  # POST too: what is retried never reached the server
            status_forcelist=RETRY_STATUSES,
            # urllib3 waits backoff_factor × 2^(n-1) before try n+1, none before the second.
            backoff_factor=self.backoff_s / 2,
            raise_on_status=False,
        )
        try:
            with HeldBackLogs("urllib3.connectionpool"):
                response = self._pool.request(
                    "POST",
                    self._target,
                    body=json.dumps(snapshot.to_dict()).encode("utf-8"),
                    headers=self.headers,
                    timeout=urllib3.Timeout(connect=self.timeout_s, read=self.timeout_s),
                    retries=retry,
                    redirect=False,
                )
        except urllib3.exceptions.MaxRetryError as error:
            tries = len(retry.failed)
            raise DeliveryError(f"no delivery after {_tries(tries)}: {error.reason}") from error
        if not 200 <= response.status < 300:
            tries = 1 + (len(response.retries.history) if response.retries is not None else 0)
            raise DeliveryError(
                f"the server answered {response.status} {response.reason or ''}".rstrip()
                + f" (after {_tries(tries)})"
            )

    def redact(self, text: str) -> str:
        return without_secrets(text, self.url)

    def close(self) -> None:
        """Close the connections kept for the next pushes."""
        self._pool.clear()


#: Statuses a push is tried again for: the server is overloaded or briefly away.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def _tries(n: int) -> str:
    return f"{n} tr{'y' if n == 1 else 'ies'}"


class DeliveryError(OSError):
    """A push that a server refused, or that did not reach it in the tries allowed."""


class RetryWithin(urllib3.util.Retry):
    """urllib3's ``Retry`` that also gives up when the next try would start after
    ``deadline`` (a ``time.monotonic()``), and counts the failed tries in ``failed``."""

    def __init__(self, deadline: float = math.inf, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deadline = deadline
        #: What each failed try met (a status or an error), shared by the copies urllib3 makes.
        self.failed: list[str] = []

    def new(self, **kwargs: Any) -> RetryWithin:
        retry = super().new(**kwargs)
        retry.deadline, retry.failed = self.deadline, self.failed
        return retry

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> RetryWithin:
        self.failed.append(str(response.status) if response is not None else type(error).__name__)
        retry = super().increment(method, url, response, error, _pool, _stacktrace)
        # What urllib3 waits before the next try: the server's Retry-After, else the backoff.
        retry_after = None
        if response is not None and retry.respect_retry_after_header:
            retry_after = retry.get_retry_after(response)
        wait = retry_after or retry.get_backoff_time()
        if time.monotonic() + wait >= self.deadline:
            reason = error or urllib3.exceptions.ResponseError(
                f"no time left to try again within the sink's timeout_s after {self.failed[-1]}"
            )
            raise urllib3.exceptions.MaxRetryError(_pool, url, reason) from reason  # type: ignore[arg-type]
        return retry


class HeldBackLogs(logging.Filter):
    """Holds back what the logger ``name`` logs on this thread while in use, keeping the
    messages in ``messages``: clients log their retries quoting the request's URL, where
    a token may be. The push's outcome, with the secrets taken out, is what the pusher
    reports."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.logger = logging.getLogger(name)
        self.thread = threading.get_ident()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        self.messages.append(record.getMessage())
        return False

    def __enter__(self) -> HeldBackLogs:
        self.logger.addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeFilter(self)


def _is_http_url(url: object) -> bool:
    if not isinstance(url, str):
        return False
    try:
        parts = urllib3.util.parse_url(url)
    except urllib3.exceptions.LocationParseError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.host)


#: Secrets shorter than this are hidden only as part of the URL they are in: replacing a
#: query value such as ``page=2`` everywhere would garble the message that quotes it.
MIN_SECRET = 4


def redacted_url(url: str) -> str:
    """``url`` fit for names and logs: scheme, host, port and path as given; the user info
    and every query value become ``***``, the fragment goes.

    >>> redacted_url("https://bob:pw@host:8443/ingest?token=abc&team=x#top")
    'https://***@host:8443/ingest?token=***&team=***'
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket: nothing of it is safe to show
        return "***"
    _, at, host = parts.netloc.rpartition("@")
    query = "&".join(
        f"{key}=***" for key, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    netloc = f"***@{host}" if at else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def without_secrets(text: str, url: str) -> str:
    """``text`` with what ``url`` holds in secret replaced: the whole URL by
    ``redacted_url(url)``, its user info, password and query (and each query value of
    ``MIN_SECRET`` characters or more, as given or decoded) by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
        values = [value for _, value in urllib.parse.parse_qsl(parts.query)]
        password = parts.password or ""
    except ValueError:
        parts, values, password = None, [], ""
    secrets = {url: redacted_url(url)}
    if parts is not None:
        user, at, _ = parts.netloc.rpartition("@")
        pieces = [f"{user}@" if at else "", parts.query, password, *values]
        pieces += [urllib.parse.quote(p, safe="") for p in (password, *values)]
        secrets.update({piece: "***" for piece in pieces if len(piece) >= MIN_SECRET})
    for secret in sorted(secrets, key=len, reverse=True):  # the whole before its parts
        text = text.replace(secret, secrets[secret])
    return text


class GraphiteSink(MetricsSink):
    """Sends each snapshot to Graphite (carbon) with the plaintext protocol over TCP.

    Paths are ``<prefix>.<iteration>.<metric>.<committed|attempted>``, with
    ``.count``, ``.sum``, ``.min``, ``.max``, ``.mean`` appended for distributions.
    Each push is one connection: the lines, then end of input, then the server's
    close of the connection, awaited at most a second (or half ``timeout_s``). The
    protocol has no acknowledgement, but a server that closes the connection before
    it read every line resets it, and the push raises instead of losing them silently.

    >>> sink = GraphiteSink("graphite.local", 2003, prefix="jobs.iterflow")  # doctest: +SKIP
    """

    def __init__(
        self, host: str, port: int = 2003, *, prefix: str = "iterflow", timeout_s: float = 5.0
    ) -> None:
        self.host = host
        self.port = port
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.name = f"graphite {host}:{port}"

    def push(self, snapshot: MetricsSnapshot) -> None:
        lines = list(graphite_lines(snapshot, self.prefix))
        with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as conn:
            sent = False
            try:
                conn.sendall("".join(lines).encode("utf-8"))
                sent = True
                # Carbon closes once it read the end of input; a server that closed
                # before reading every line has reset the connection by then.
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(min(self.timeout_s / 2, CLOSE_WAIT_S))
                while conn.recv(4096):
                    pass
            except TimeoutError:
                if not sent:
                    raise
                # The server keeps the connection open: the lines went out all the same.
            except OSError as error:
                raise ConnectionResetError(
                    f"the server closed the connection before reading all {len(lines)} "
                    f"lines ({error})"
                ) from error


#: Seconds at most that ``GraphiteSink`` waits for the server to close the connection.
CLOSE_WAIT_S = 1.0


def graphite_lines(snapshot: MetricsSnapshot, prefix: str) -> Iterator[str]:
    """The plaintext lines ``<path> <value> <unix time>`` of ``snapshot``, skipping None values."""
    timestamp = int(snapshot.time.timestamp())
    # The iteration is one path component: dots would split it, so they go too.
    iteration = re.sub(r"[^A-Za-z0-9_-]", "_", snapshot.iteration)
    for name, result in sorted(snapshot.metrics.items()):
        # Dots in metric names are kept on purpose: they nest the metric in Graphite.
        base = ".".join((graphite_path(prefix), iteration, graphite_path(name)))
        for state in STATES:
            for suffix, value in number_fields(getattr(result, state)):
                if value is not None:
                    yield f"{base}.{state}{suffix} {value} {timestamp}\n"


def graphite_path(dotted: str) -> str:
    """``dotted`` with whitespace and characters Graphite mishandles replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", dotted)


class PrometheusSink(MetricsSink):
    """Exposes the latest snapshot of each iteration for Prometheus to scrape, or pushes
    it to a Pushgateway.

    Counters become ``<prefix>_<name>_total``, gauges ``<prefix>_<name>``,
    distributions a summary ``<prefix>_<name>`` (count and sum) plus gauges
    ``<prefix>_<name>_min`` and ``_max``; every sample has the labels
    ``iteration`` and ``state`` (committed or attempted). With ``port`` the sink
    serves ``registry`` on ``addr:port`` until closed (0 picks a free port, see
    ``sink.port``); without, mount ``sink.registry`` in a server of your own.

    ``addr`` is the loopback interface, ``127.0.0.1``, unless told otherwise: only
    processes on the same machine can scrape it. Give ``addr="0.0.0.0"`` (``"::"``
    for IPv6) to serve every interface, for a Prometheus server on another machine.
    ``sink.url`` (also in ``name`` and logged at INFO on ``iterflow.metrics``)
    says where the metrics are served.

    With ``push_gateway`` (``"host:9091"`` or a URL), each push also sends the whole
    registry to that Pushgateway, replacing what the group ``job`` + ``grouping_key``
    held (``prometheus_client.push_to_gateway``, an HTTP PUT bounded by ``timeout_s``):
    the way for batch runs, which end before a scrape would come.

    >>> sink = PrometheusSink(9464)  # doctest: +SKIP
    >>> sink.url  # doctest: +SKIP
    'http://127.0.0.1:9464/metrics'
    >>> PrometheusSink(push_gateway="pushgateway:9091", job="nightly-pagerank")  # doctest: +SKIP
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        addr: str = "127.0.0.1",
        registry: CollectorRegistry | None = None,
        prefix: str = "iterflow",
        push_gateway: str | None = None,
        job: str = "iterflow",
        grouping_key: dict[str, str] | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if push_gateway is not None and not (isinstance(job, str) and job):
            raise IterflowValueError(
                f"PrometheusSink job {job!r} is not a name; give the Pushgateway job a "
                "non-empty string, e.g. job='nightly-pagerank'"
            )
        try:
            import prometheus_client
        except ImportError as error:
            raise ImportError(
                "PrometheusSink needs prometheus_client: pip install 'iterflow[prometheus]'"
            ) from error
        self.registry = prometheus_client.CollectorRegistry() if registry is None else registry
        self.prefix = prefix
        self.latest: dict[str, MetricsSnapshot] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self.addr = addr
        self.port = port
        #: Where the metrics are served, None without ``port``.
        self.url: str | None = None
        if port is not None:
            self._server, self._server_thread = prometheus_client.start_http_server(
                port, addr=addr, registry=self.registry
            )
            self.addr, self.port = self._server.server_address[:2]
            host = f"[{self.addr}]" if ":" in self.addr else self.addr
            self.url = f"http://{host}:{self.port}/metrics"
            logger.info("PrometheusSink serves the metrics at %s", self.url)
        self.name = f"prometheus {self.addr}:{self.port}" if port is not None else "prometheus"
        self.push_gateway = push_gateway
        self.job = job
        self.grouping_key = dict(grouping_key or {})
        self.timeout_s = timeout_s
        if push_gateway is not None:
            self.name += f" push-gateway {redacted_url(push_gateway)} job={job}"
        # The registry calls collect() on each scrape, and on each push to the gateway.
        self.registry.register(self)

    def push(self, snapshot: MetricsSnapshot) -> None:
        with self._lock:
            self.latest[snapshot.iteration] = snapshot
        if self.push_gateway is not None:
            from prometheus_client import push_to_gateway

            push_to_gateway(
                self.push_gateway,
                job=self.job,
                registry=self.registry,
                grouping_key=self.grouping_key,
                timeout=self.timeout_s,
            )

    def redact(self, text: str) -> str:
        return text if self.push_gateway is None else without_secrets(text, self.push_gateway)

    def close(self) -> None:
        """Stop serving; the registry keeps the last values for servers of your own."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._server_thread is not None:
            self._server_thread.join()
            self._server_thread = None

    def collect(self) -> Iterator[Metric]:
        """The metric families of the latest snapshots; the registry calls it on each scrape."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        with self._lock:
            snapshots = sorted(self.latest.values(), key=lambda snapshot: snapshot.iteration)
        for name, (family_type, doc, rows) in prometheus_rows(snapshots, self.prefix).items():
            if family_type == "summary":
                summary = SummaryMetricFamily(name, doc, labels=PROMETHEUS_LABELS)
                for labels, (count, total) in rows:
                    summary.add_metric(labels, count_value=count, sum_value=total)
                yield summary
            else:
                family_class = (
                    CounterMetricFamily if family_type == "counter" else GaugeMetricFamily
                )
                family = family_class(name, doc, labels=PROMETHEUS_LABELS)
                for labels, value in rows:
                    family.add_metric(labels, value)
                yield family


PROMETHEUS_LABELS = ["iteration", "state"]

#: One family per name: its type (counter, gauge or summary), help text and
#: rows of (label values, value), a summary's value being (count, sum).
Families = dict[str, tuple[str, str, list[tuple[list[str], Any]]]]


def prometheus_rows(snapshots: list[MetricsSnapshot], prefix: str) -> Families:
    """The families to expose for ``snapshots``, skipping None values."""
    families: Families = {}

    def add(name: str, family_type: str, doc: str, labels: list[str], value: Any) -> None:
        found_type, _, rows = families.setdefault(name, (family_type, doc, []))
        # Sanitizing can give two metrics one name; the first type seen keeps it.
        if found_type == family_type and value is not None:
            rows.append((labels, value))

    for snapshot in snapshots:
        for metric_name, result in sorted(snapshot.metrics.items()):
            name = prometheus_name(f"{prefix}_{metric_name}")
            doc = f"iterflow {result.kind} '{metric_name}'"
            for state in STATES:
                labels = [snapshot.iteration, state]
                value = getattr(result, state)
                if isinstance(value, DistributionValue):
                    add(name, "summary", doc, labels, (value.count, value.sum))
                    add(f"{name}_min", "gauge", f"{doc}, smallest value", labels, value.min)
                    add(f"{name}_max", "gauge", f"{doc}, largest value", labels, value.max)
                else:
                    family_type = "counter" if result.kind == "counter" else "gauge"
                    add(name, family_type, doc, labels, value)
    return families


def prometheus_name(name: str) -> str:
    """``name`` following Prometheus rules: ``[a-zA-Z_:][a-zA-Z0-9_:]*``, dots become ``_``."""
    name = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name
