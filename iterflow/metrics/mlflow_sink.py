"""Sends every round of a run to an MLflow run: one point per metric per round, ``step`` = epoch.

Pure Python: no Spark import. ``mlflow`` is imported only when a sink is built, so
the other sinks work without the ``mlflow`` extra.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from iterflow.errors import IterflowError
from iterflow.metrics.sinks import MetricsSink, redacted_url, without_secrets
from iterflow.metrics.values import MetricsSnapshot, number_fields
from iterflow.reports import RoundProgress

if TYPE_CHECKING:
    from mlflow.entities import Metric, Param

#: Prefix of the figures iterflow measures itself, apart from the user's metrics.
BUILT_IN = "iterflow."
#: What MLflow accepts in one ``log_batch`` request, and in one key or parameter value.
#: 500 characters is what every tracking server takes (newer ones take more).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 500
#: Where MLflow keeps the experiment runs go to: ``mlflow.set_experiment`` sets the id
#: (MLflow 2.18 and later), users may set either.
EXPERIMENT_ID_ENV = "MLFLOW_EXPERIMENT_ID"
EXPERIMENT_NAME_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "0"


class MlflowSink(MetricsSink):
    """Logs each round of a run to MLflow with ``step`` = the round's epoch.

    Pushed like any sink (``it.push_metrics(itf.metrics.MlflowSink())``), for
    bounded and unbounded runs: every push sends the rounds that ended since the
    previous one, so each round becomes exactly one point per key, time-stamped
    when the round ended. Keys, each after ``prefix``:

    - every user metric of the round under its name: a counter's point is what the
      round added, a gauge's its value (none before the first ``set``), a
      distribution's five points ``<name>.count``, ``.sum``, ``.min``, ``.max`` and
      ``.mean`` (the last three none while the round received nothing);
    - ``iterflow.converged_value`` when the run has a convergence condition,
      ``iterflow.duration_s``, and ``iterflow.rows.<name>``, the rows of each
      feedback and output.

    With ``log_params``, the run's set-up is logged once as parameters:
    ``iterflow.iteration`` (the body's name), ``iterflow.run_id``,
    ``iterflow.inputs.<name>`` (schema and replay), ``iterflow.conditions`` and
    ``iterflow.resumed_from``, and the run's notes (``IterationBuilder.note``) under
    their names (a mapping's entries as ``<note>.<key>``: an ``iterflow.ml`` Estimator's
    Params as ``params.<name>``); values longer than 500 characters are cut. Characters
    MLflow refuses in keys become ``_``.

    The MLflow run is ``run_id`` when given, else the run active
    (``mlflow.active_run()``) when the sink is made. With neither, the sink
    creates one MLflow run for each iterflow run it serves, named after the body,
    in MLflow's current experiment (``mlflow.set_experiment``'s, else
    ``MLFLOW_EXPERIMENT_ID``'s or ``MLFLOW_EXPERIMENT_NAME``'s, else ``"0"``), and
    ends it with the run's final push
    (``sink.runs`` maps iterflow run ids to them). ``tracking_uri`` defaults to
    MLflow's own (``mlflow.set_tracking_uri`` or ``MLFLOW_TRACKING_URI``).

    Requests go out on a thread of the sink, in order; a push waits for its own at
    most ``timeout_s`` seconds, then fails (the pusher warns, naming the sink) while
    the request goes on in the background (MLflow retries a server that does not
    answer, see ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``). A push that fails is not sent
    again. Several iterflow runs into one MLflow run: give each sink its own
    ``prefix``, or their points share keys and steps.

    >>> with mlflow.start_run():  # doctest: +SKIP
    ...     it.push_metrics(itf.metrics.MlflowSink()).run()
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        tracking_uri: str | None = None,
        prefix: str = "",
        log_params: bool = True,
        timeout_s: float = 5.0,
    ) -> None:
        mlflow = _import_mlflow()
        from mlflow.tracking import MlflowClient

        if run_id is None:
            active = mlflow.active_run()
            run_id = None if active is None else active.info.run_id
        self.run_id = run_id
        self.tracking_uri = tracking_uri if tracking_uri is not None else mlflow.get_tracking_uri()
        self.prefix = prefix
        self.log_params = log_params
        self.timeout_s = timeout_s
        # Credentials in the URI stay out of warnings (and ``redact`` takes them out of
        # MLflow's errors, which quote the URI).
        self.name = f"mlflow {redacted_url(self.tracking_uri)}"
        #: iterflow run id -> the MLflow run its points went to.
        self.runs: dict[str, str] = {}
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self._parameters_logged: set[str] = set()  # iterflow run ids
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()  # runs at the same time push from their own threads

    def push(self, snapshot: MetricsSnapshot) -> None:
        request = _Request(snapshot)
        with self._thread_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._send_requests, name="iterflow-mlflow", daemon=True
                )
                self._thread.start()
            self._requests.put(request)
        if not request.done.wait(self.timeout_s):
            raise TimeoutError(
                f"no answer within {self.timeout_s:g} s; the request goes on in the background"
            )
        if request.error is not None:
            raise request.error

    def redact(self, text: str) -> str:
        return without_secrets(text, self.tracking_uri)

    def close(self) -> None:
        """Stop the sink's thread once the requests before it are sent (waits ``timeout_s``)."""
        with self._thread_lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._requests.put(None)
        if thread is not None:
            thread.join(self.timeout_s)

    def _send_requests(self) -> None:
        while (request := self._requests.get()) is not None:
            try:
                self._send(request.snapshot)
            except Exception as error:
                request.error = error
            finally:
                request.done.set()

    def _send(self, snapshot: MetricsSnapshot) -> None:
        """Log ``snapshot``'s parameters (the first time they come) and its rounds."""
        params = []
        if (
            self.log_params
            and snapshot.parameters
            and snapshot.run_id not in self._parameters_logged
        ):
            params = [self._param(key, value) for key, value in run_parameters(snapshot)]
        metrics = [
            self._metric(key, value, progress)
            for progress in snapshot.rounds
            for key, value in round_points(progress)
        ]
        # A run the sink created ends with its final push.
        ending = self.run_id is None and snapshot.final and snapshot.run_id in self.runs
        if not (params or metrics or ending):
            return
        run_id = self._run_of(snapshot)
        failure: Exception | None = None
        if params:
            self._parameters_logged.add(snapshot.run_id)
            try:
                # Apart from the metrics: a refused parameter (logged before with another
                # value) must not lose the points.
                for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
                    chunk = params[start : start + MAX_PARAMS_PER_BATCH]
                    self._client.log_batch(run_id, params=chunk)
            except Exception as error:
                failure = error
        for start in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self._client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS_PER_BATCH])
        if self.run_id is None and snapshot.final:
            self._client.set_terminated(run_id)
        if failure is not None:
            raise failure

    def _run_of(self, snapshot: MetricsSnapshot) -> str:
        """The MLflow run of ``snapshot``'s iterflow run, created on its first push if need be."""
        run_id = self.run_id or self.runs.get(snapshot.run_id)
        if run_id is None:
            created = self._client.create_run(self._experiment_id(), run_name=snapshot.iteration)
            run_id = created.info.run_id
        self.runs[snapshot.run_id] = run_id
        return run_id

    def _experiment_id(self) -> str:
        """The experiment a run the sink creates goes to, found with public API only:
        ``MLFLOW_EXPERIMENT_ID`` (which ``mlflow.set_experiment`` sets, and which wins over
        the name as the experiment set in code wins in MLflow), else the experiment named
        ``MLFLOW_EXPERIMENT_NAME`` (created if need be, as MLflow does), else the default
        experiment, ``"0"``."""
        experiment_id = os.environ.get(EXPERIMENT_ID_ENV)
        if experiment_id:
            return experiment_id
        name = os.environ.get(EXPERIMENT_NAME_ENV)
        if not name:
            return DEFAULT_EXPERIMENT
        experiment = self._client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        return str(self._client.create_experiment(name))

    def _metric(self, key: str, value: float, progress: RoundProgress) -> Metric:
        from mlflow.entities import Metric

        ended = progress.started_at + timedelta(seconds=progress.duration_s)
        return Metric(
            key=mlflow_key(self.prefix + key),
            value=value,
            timestamp=int(ended.timestamp() * 1000),
            step=progress.epoch,
        )

    def _param(self, key: str, value: str) -> Param:
        from mlflow.entities import Param

        if len(value) > MAX_PARAM_VALUE_LENGTH:
            value = value[: MAX_PARAM_VALUE_LENGTH - 3] + "..."
        return Param(mlflow_key(self.prefix + key), value)


class _Request:
    """One push waiting for the sink's thread: done once sent or failed."""

    def __init__(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot
        self.done = threading.Event()
        self.error: Exception | None = None


def _import_mlflow() -> Any:
    try:
        import mlflow
    except ImportError as error:
        raise IterflowError(
            "MlflowSink needs MLflow's tracking client, which is not installed: "
            "pip install 'iterflow[mlflow]'"
        ) from error
    return mlflow


def round_points(progress: RoundProgress) -> Iterator[tuple[str, float]]:
    """(key, number) of each point of round ``progress``, before the sink's prefix."""
    for name, value in sorted(progress.metrics.items()):
        for suffix, number in number_fields(value):
            if number is not None:
                yield name + suffix, float(number)
    if progress.converged_value is not None:
        yield f"{BUILT_IN}converged_value", float(progress.converged_value)
    yield f"{BUILT_IN}duration_s", float(progress.duration_s)
    for name, rows in sorted(progress.rows.items()):
        yield f"{BUILT_IN}rows.{name}", float(rows)


def run_parameters(snapshot: MetricsSnapshot) -> Iterator[tuple[str, str]]:
    """(key, text) of each parameter of ``snapshot``'s run, before the sink's prefix."""
    yield f"{BUILT_IN}iteration", snapshot.iteration
    yield f"{BUILT_IN}run_id", snapshot.run_id
    parameters: Mapping[str, Any] = snapshot.parameters
    for name, spec in sorted(parameters.get("inputs", {}).items()):
        yield f"{BUILT_IN}inputs.{name}", json.dumps(spec, sort_keys=True)
    yield f"{BUILT_IN}conditions", json.dumps(parameters.get("conditions", []), sort_keys=True)
    if parameters.get("resumed_from") is not None:
        yield f"{BUILT_IN}resumed_from", str(parameters["resumed_from"])
    # The run's notes (``IterationBuilder.note``) under their own names, a mapping's
    # entries as ``<note>.<key>``: an Estimator notes its Params this way.
    for name, value in sorted(parameters.get("notes", {}).items()):
        entries = value.items() if isinstance(value, Mapping) else [(None, value)]
        for key, item in entries:
            text = item if isinstance(item, str) else json.dumps(item, sort_keys=True)
            yield (name if key is None else f"{name}.{key}"), text


def mlflow_key(key: str) -> str:
    """``key`` as MLflow takes it: letters, digits, ``_``, ``-``, ``.`` and spaces, at most
    250 characters (slashes go too: MLflow refuses keys that are not normal paths)."""
    return re.sub(r"[^A-Za-z0-9_\-. ]", "_", key)[:MAX_KEY_LENGTH]
