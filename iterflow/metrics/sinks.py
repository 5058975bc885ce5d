"""Where metrics snapshots go: a JSON-lines file, an HTTP endpoint, Graphite, Prometheus.

Pure Python: no Spark import. ``prometheus_client`` is imported only by
``PrometheusSink``, so the other sinks work without the ``prometheus`` extra.
"""

from __future__ import annotations

import abc
import json
import logging
import re
import socket
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iterflow.metrics.values import DistributionValue, MetricsSnapshot, number_fields

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

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
    """POSTs each snapshot as JSON to ``url``; a status other than 2xx raises.

    ``timeout_s`` bounds connecting and each wait for the server's answer; the pusher
    bounds the whole push by it too. Its ``name``, and the errors that warnings quote,
    show the URL with its user info and query values as ``***`` (``redacted_url``).

    >>> sink = HttpJsonSink("http://collector:8080/iterflow", timeout_s=2.0)  # doctest: +SKIP
    """

    def __init__(
        self, url: str, *, timeout_s: float = 5.0, headers: dict[str, str] | None = None
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.headers = {**(headers or {}), "Content-Type": "application/json"}
        self.name = f"http-json {redacted_url(url)}"

    def push(self, snapshot: MetricsSnapshot) -> None:
        request = urllib.request.Request(
            self.url,
            data=json.dumps(snapshot.to_dict()).encode("utf-8"),
            headers=self.headers,
            method="POST",
        )
        # Any final status other than 2xx raises HTTPError, redirects included.
        with _NO_REDIRECT_OPENER.open(request, timeout=self.timeout_s):
            pass

    def redact(self, text: str) -> str:
        return without_secrets(text, self.url)


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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses redirects: urllib would resend a redirected POST as a GET, without the body."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_REDIRECT_OPENER = urllib.request.build_opener(_NoRedirect)


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
    """Exposes the latest snapshot of each iteration for Prometheus to scrape.

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

    >>> sink = PrometheusSink(9464)  # doctest: +SKIP
    >>> sink.url  # doctest: +SKIP
    'http://127.0.0.1:9464/metrics'
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        addr: str = "127.0.0.1",
        registry: CollectorRegistry | None = None,
        prefix: str = "iterflow",
    ) -> None:
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
        # The registry calls collect() on each scrape.
        self.registry.register(self)

    def push(self, snapshot: MetricsSnapshot) -> None:
        with self._lock:
            self.latest[snapshot.iteration] = snapshot

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
