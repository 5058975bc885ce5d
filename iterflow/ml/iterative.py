"""Your own iterative algorithm as a ``pyspark.ml`` Estimator: ``IterativeEstimator``.

An author declares Params (pyspark.ml's ``Param`` class attributes, in a Params class
that the Estimator and its Model share, as MLlib writes them) and the algorithm:

- ``start(dataset)``: the model's values at round 0, a mapping of names to numbers and
  numpy arrays of any shape (the learned values);
- ``round(learned)``: the ``itf.CombineFn`` of one round, whose accumulators read the
  rows (Arrow batches of what ``prepare`` made of them, held for the whole run where
  numpy reads them in place) and whose ``extract_output`` returns the next learned
  values (a mapping with the same names and shapes);
- optionally ``preparer(dataset)`` (a function making the rows what the rounds read,
  run once per run where the rows are),
  ``columns()`` (the columns the rounds read), ``converge_on`` (a learned number:
  the run stops when it is at most ``tol``), ``warm_start(model)`` and ``body()`` for a
  round that one ``CombineFn`` does not express.

``IterativeEstimator`` does the rest: Params with ``setX``/``getX`` and an ``MLError``
for an unknown one (``iterflow.ml.params``), ``maxIter`` and ``tol``, ``initialModel``
(warm start from a fitted model or its path), the iteration's options
(``setIterationOptions(progress=, listen=, event_log=, checkpoint_dir=, mlflow=...)``),
Pipelines and CrossValidator, and save/load of the Estimator and of its
``IterativeModel`` (the learned values as one Parquet row, the Params in the metadata).
Every scalar learned value is a gauge ``<Estimator class>.<name>`` in
``RoundProgress.metrics`` (so progress bars, event logs and metrics sinks show it), and
the Estimator's class and Params are the run's notes (``iteration_started``;
``params.<name>`` in MLflow).

The model is one row, so iterflow holds it on the driver between rounds: the body reads
it without a Spark job, and on resident data a round runs none (docs/guide.md).
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
from pyspark.ml import Estimator, Model
from pyspark.ml.param.shared import HasMaxIter, HasTol
from pyspark.sql import DataFrame, Row, SparkSession

import iterflow as itf
from iterflow.ml.params import HasInitialModel, IterationOptions, MLParams
from iterflow.ml.persistence import SavedEstimator, SavedModel
from iterflow.ml.training import Fitted, MLError, model_field, worker_errors

#: A model's learned values: names to numbers or numpy arrays.
Learned = Mapping[str, Any]


class Shapes:
    """The names, types and shapes of a model's learned values: how they become the one
    row of the model variable (arrays flattened to ``ARRAY<DOUBLE>`` or ``ARRAY<BIGINT>``)
    and back."""

    def __init__(self, learned: Learned) -> None:
        self.shapes: dict[str, tuple[int, ...] | None] = {}
        self.kinds: dict[str, str] = {}
        for name, value in learned.items():
            array = np.asarray(value)
            if array.dtype.kind not in "biuf":
                raise MLError(f"learned value '{name}' must be numbers, got {array.dtype}")
            kind = "f" if array.dtype.kind == "f" else "i"
            self.kinds[name] = "b" if array.dtype.kind == "b" else kind
            scalar = np.isscalar(value) or isinstance(value, (int, float, bool))
            self.shapes[name] = None if scalar else array.shape

    @classmethod
    def of_saved(cls, saved: Mapping[str, Any]) -> Shapes:
        shapes = cls({})
        shapes.shapes = {n: None if s is None else tuple(s) for n, s in saved["shapes"].items()}
        shapes.kinds = dict(saved["kinds"])
        return shapes

    def saved(self) -> dict[str, Any]:
        return {"shapes": self.shapes, "kinds": self.kinds}

    def ddl(self) -> str:
        """The model row's schema (Spark DDL)."""
        types = {"f": "DOUBLE", "i": "BIGINT", "b": "BOOLEAN"}
        fields = []
        for name, shape in self.shapes.items():
            kind = types[self.kinds[name]]
            fields.append(f"`{name}` {kind if shape is None else f'ARRAY<{kind}>'}")
        return ", ".join(fields)

    def table(self, learned: Learned, who: str = "the model") -> pa.Table:
        """``learned`` as the model's one row; a missing name or a changed shape is an
        ``MLError`` naming ``who`` made them."""
        missing = sorted(set(self.shapes) - set(learned))
        if missing:
            raise MLError(f"{who} lacks learned value(s) {missing}")
        types = {"f": pa.float64(), "i": pa.int64(), "b": pa.bool_()}
        columns = []
        for name, shape in self.shapes.items():
            array = np.asarray(learned[name])
            kind = types[self.kinds[name]]
            if shape is None:
                columns.append(pa.array([array.item()], kind))
                continue
            if array.shape != shape:
                raise MLError(f"{who}: learned value '{name}' has shape {array.shape}, not {shape}")
            columns.append(pa.array([array.ravel().tolist()], pa.list_(kind)))
        return pa.table(columns, names=list(self.shapes))

    def values(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The learned values of a model row (arrays reshaped)."""
        values: dict[str, Any] = {}
        for name, shape in self.shapes.items():
            cell = row[name]
            if shape is None:
                values[name] = cell
            else:
                dtype = {"f": np.float64, "i": np.int64, "b": np.bool_}[self.kinds[name]]
                values[name] = np.asarray(cell, dtype=dtype).reshape(shape)
        return values


class ModelRound(itf.CombineFn):
    """An author's round (``IterativeEstimator.round``) as the body's ``CombineFn``: its
    accumulators as they are, its output (learned values) as the model's row; every
    scalar output also set on its gauge."""

    def __init__(self, fn: itf.CombineFn, shapes: Shapes, gauges: Mapping[str, Any]) -> None:
        self.fn, self.shapes, self.gauges = fn, shapes, dict(gauges)

    def create_accumulator(self) -> Any:
        return self.fn.create_accumulator()

    def add_input(self, acc: Any, batch: pa.RecordBatch) -> Any:
        return self.fn.add_input(acc, batch)

    def merge_accumulators(self, accs: list[Any]) -> Any:
        return self.fn.merge_accumulators(accs)

    def extract_output(self, acc: Any) -> pa.Table:
        learned = self.fn.extract_output(acc)
        if not isinstance(learned, Mapping):
            raise MLError(
                f"{type(self.fn).__name__}.extract_output must return the learned values "
                f"(a mapping of names to numbers and arrays), got {type(learned).__name__}"
            )
        # A missing or reshaped value is named before the gauges read them.
        row = self.shapes.table(learned, f"{type(self.fn).__name__}.extract_output")
        for name, gauge in self.gauges.items():
            value = float(np.asarray(learned[name]).item())
            if np.isfinite(value):
                gauge.set(value)
        return row

    def __getstate__(self) -> dict[str, Any]:
        # As ModelStep: the gauges travel pickled, without Spark Connect's warning that a
        # task's metric updates are lost (only extract_output sets them).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", itf.IterflowWarning)
            gauges = pickle.dumps(self.gauges)
        return {**self.__dict__, "gauges": gauges}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, gauges=pickle.loads(state["gauges"]))


class IterativeModel(Model, SavedModel, Fitted):
    """What an ``IterativeEstimator`` fits: ``learned`` (the final learned values) and,
    when fitted here, the run (``result``, ``rounds``, ``termination``, ``history``) and
    the training rows (``training``). Subclass it with your Params and ``_transform``;
    it saves and loads as it is (its learned values as one Parquet row)."""

    def __init__(
        self,
        learned: Learned | None = None,
        result: itf.IterationResult | None = None,
        training: DataFrame | None = None,
    ) -> None:
        super().__init__()
        self.learned: dict[str, Any] = dict(learned or {})
        self.result = result
        self.training = training
        self._shapes = Shapes(self.learned)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        raise NotImplementedError(f"{type(self).__name__} defines no _transform")

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        table = self._shapes.table(self.learned)
        return spark.createDataFrame(table, self._shapes.ddl())

    def _extra(self) -> dict[str, Any]:
        return self._shapes.saved()

    def _restore_extra(self, extra: Mapping[str, Any]) -> None:
        self._shapes = Shapes.of_saved(extra)

    def _restore_data(self, rows: list[Row]) -> None:
        self.learned = self._shapes.values(rows[0].asDict())


class IterativeEstimator(
    Estimator[Any],
    MLParams,
    HasMaxIter,
    HasTol,
    HasInitialModel,
    IterationOptions,
    SavedEstimator,
):
    """The base of an iterative ``pyspark.ml`` Estimator: see the module docstring.

    Example (the whole of a Gaussian mixture is in docs/ml.md)::

        class MeanShift(IterativeEstimator):
            model_class = MeanShiftModel
            converge_on = "change"

            def start(self, dataset):
                return {"center": np.zeros(2), "change": np.inf}

            def round(self, learned):
                return CenterStep(learned["center"])  # an itf.CombineFn
    """

    #: The model class ``fit`` returns (an ``IterativeModel`` with the same Params).
    model_class: ClassVar[type[IterativeModel]] = IterativeModel
    #: A scalar learned value: the run stops once it is at most ``tol`` (None: maxIter).
    converge_on: ClassVar[str | None] = None
    #: The first part of the gauges' names (``<prefix>.<learned value>``; metric names
    #: are the process's, so two libraries' ``change`` must not meet): the class name
    #: by default.
    metrics_prefix: ClassVar[str | None] = None

    def __init__(self, **params: Any) -> None:
        """Params by name (``MyEstimator(k=3, maxIter=50)``): an unknown one is an
        ``MLError``. A subclass may declare its own keyword-only signature instead."""
        super().__init__()
        self._setDefault(maxIter=100, tol=1e-6)
        self._set_checked(params)

    # -- what an author writes -------------------------------------------------------

    def start(self, dataset: DataFrame) -> Learned:
        """The learned values of round 0."""
        raise NotImplementedError(f"{type(self).__name__} defines no start(dataset)")

    def round(self, learned: Learned) -> itf.CombineFn:
        """The ``CombineFn`` of a round from ``learned``: its ``extract_output`` returns
        the next learned values."""
        raise NotImplementedError(f"{type(self).__name__} defines no round(learned)")

    def preparer(self, dataset: DataFrame) -> Callable[[pa.Table], pa.Table]:
        """The function that makes the rows what the rounds read (``ctx.columnar``'s
        prepare step, run where the rows are: it must not hold this Estimator); by
        default the rows as they are."""
        return as_they_are

    def columns(self, dataset: DataFrame) -> Sequence[str] | None:
        """The columns of ``dataset`` the rounds read (None: all of them)."""
        return None

    def rows(self, dataset: DataFrame) -> DataFrame:
        """The rows the rounds read, as Spark gives them to ``preparer``: ``columns()`` of
        ``dataset`` by default (an override may also convert them in the JVM)."""
        wanted = self.columns(dataset)
        return dataset if wanted is None else dataset.select(*wanted)

    def rounds(self) -> int:
        """The most rounds a fit runs: ``maxIter`` by default (ALS: twice, a round per
        half of an iteration)."""
        return int(self.getMaxIter())

    def warm_start(self, model: Any, dataset: DataFrame) -> Learned:
        """The learned values of round 0 from ``initialModel`` (for a fit on ``dataset``):
        an ``IterativeModel``'s own by default."""
        if isinstance(model, IterativeModel):
            return model.learned
        raise MLError(
            f"{type(self).__name__}: initialModel must be a {self.model_class.__name__}, "
            f"got {type(model).__name__}"
        )

    def body(self, shapes: Shapes, prepare: Callable[[pa.Table], pa.Table]) -> itf.IterationBody:
        """The iteration body: ``model`` (the variable, one row) and ``data`` (the rows);
        by default one ``itf.combine`` of ``round()`` a round."""
        gauges = {
            name: itf.metrics.gauge(f"{self.metrics_prefix or type(self).__name__}.{name}")
            for name, shape in shapes.shapes.items()
            if shape is None and shapes.kinds[name] == "f"
        }
        estimator = self
        until = None
        if self.converge_on is not None:
            until = itf.converged(model_field(self.converge_on), self.getOrDefault(self.tol))

        def iterative_round(model: DataFrame, data: DataFrame, ctx: itf.RoundContext) -> Any:
            row = itf.to_arrow(model).slice(0, 1).to_pylist()[0]  # held on the driver
            fn = ModelRound(estimator.round(shapes.values(row)), shapes, gauges)
            new = itf.combine(ctx.columnar(data, prepare), fn, shapes.ddl(), depth=1)
            return itf.Declaration(feedback={"model": new}, outputs={"model": new}, until=until)

        iterative_round.__name__ = type(self).__name__  # the run's name
        return itf.body(iterative_round)

    # -- what IterativeEstimator does ------------------------------------------------

    def _fit(self, dataset: DataFrame) -> IterativeModel:
        start = self.initial_model(self.model_class)
        learned = self.start(dataset) if start is None else self.warm_start(start, dataset)
        shapes = Shapes(learned)
        spark = dataset.sparkSession
        model = spark.createDataFrame(shapes.table(learned), shapes.ddl())
        rows = self.rows(dataset)
        iteration = (
            itf.BoundedIteration(self.body(shapes, self.preparer(dataset)))
            .bind("model", model)
            .bind("data", rows)
            .until(itf.max_rounds(self.rounds()))
            .note(estimator=type(self).__name__, params=self._noted_params())
        )
        options = self.getIterationOptions()
        listen, sink = options.pop("listen", None), options.pop("mlflow", None)
        if listen is not None:
            iteration = iteration.listen(listen)
        if sink:
            iteration = iteration.push_metrics(itf.metrics.MlflowSink() if sink is True else sink)
        with worker_errors():
            result = iteration.run(**options)
        final = shapes.values(itf.to_arrow(result.outputs["model"]).to_pylist()[0])
        fitted: IterativeModel = self.model_class(final, result, dataset)
        return self._copyValues(fitted)

    def _noted_params(self) -> dict[str, Any]:
        """The Params set or defaulted, as JSON values (a model as its class name)."""
        noted: dict[str, Any] = {}
        for p, value in self.extractParamMap().items():
            plain = value is None or isinstance(value, (str, int, float, bool, list))
            noted[p.name] = value if plain else type(value).__name__
        return noted


def as_they_are(table: pa.Table) -> pa.Table:
    """The default prepare step: the rows unchanged."""
    return table
