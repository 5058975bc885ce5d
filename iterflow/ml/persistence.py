"""Saving and loading in Spark MLlib's own format, both ways.

A fitted iterflow model saves as MLlib saves the model of the same type: ``metadata/``
(one JSON line: MLlib's class name, the Params MLlib's class has, with values it accepts)
and ``data/`` (a Parquet file with MLlib's columns, Vectors and Matrices as MLlib's UDTs).
So ``pyspark.ml.classification.LogisticRegressionModel.load(path)`` (or a Scala scoring
job) reads a model iterflow trained, and predicts the same. What MLlib has no place for
(iterflow's Params such as ``solver="gd"``, a model fitted on a list of numeric columns)
rides in the metadata's ``"iterflow"`` entry, which MLlib's reader ignores and
iterflow's reads back.

The other way, ``iterflow.ml.<Model>.load(path)`` reads a model saved by MLlib (its
Params that iterflow has, and its data), and still reads what earlier iterflow versions
saved (their learned values as JSON in the metadata).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)
from pyspark.sql import DataFrame, Row, SparkSession

from iterflow.ml.params import MLParams
from iterflow.ml.training import MLError

M = TypeVar("M", bound="SavedModel")

#: The metadata entry that carries what MLlib's format has no place for.
ITERFLOW = "iterflow"


class SavedModel(MLParams, MLWritable, MLReadable[Any]):
    """A fitted model that saves and loads in MLlib's format.

    A subclass names MLlib's model class (``mllib_class``, its pyspark name, as
    ``"pyspark.ml.clustering.KMeansModel"``) and turns its learned values into MLlib's data
    rows (``_saved_data``) and back (``_restore_data``); ``_extra`` and ``_restore_extra``
    carry what MLlib has no column for; ``_mllib_value`` maps a Param value that MLlib
    spells differently (or returns ``None`` when MLlib has no such value)."""

    #: MLlib's model class of the same type (its pyspark name); None: iterflow's own
    #: (the metadata names this class, and the data is whatever ``_saved_data`` gives).
    mllib_class: ClassVar[str | None] = None

    def _saved_data(self, spark: SparkSession) -> DataFrame:
        """The learned values as the rows of ``data/`` (MLlib's columns for its types)."""
        raise NotImplementedError

    def _restore_data(self, rows: list[Row]) -> None:
        raise NotImplementedError

    def _saved_parts(self, spark: SparkSession) -> dict[str, DataFrame]:
        """The directories of learned values beside ``metadata/``: ``data/`` by default
        (MLlib's ALS writes ``userFactors/`` and ``itemFactors/``)."""
        return {"data": self._saved_data(spark)}

    def _restore_parts(self, read: Callable[[str], list[Row]]) -> None:
        """The learned values from the directories ``_saved_parts`` wrote (``read(name)``
        gives one's rows)."""
        self._restore_data(read("data"))

    def _mllib_metadata(self) -> dict[str, Any]:
        """Top-level metadata entries MLlib's reader of this type wants (ALS: ``rank``)."""
        return {}

    def _extra(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, extra: Mapping[str, Any]) -> None:
        """Values saved by ``_extra``."""

    def _restore(self, learned: Mapping[str, Any]) -> None:
        """The learned values of a model saved by an earlier iterflow (JSON)."""
        raise NotImplementedError

    def _mllib_value(self, name: str, value: Any) -> Any:
        return value

    def write(self) -> MLWriter:
        return ModelWriter(self)

    @classmethod
    def read(cls) -> ModelReader[Any]:
        return ModelReader(cls)


def python_class(model: Any) -> str:
    return f"{type(model).__module__}.{type(model).__name__}"


def class_name(model: Any) -> str:
    """The class a saved model's metadata names: MLlib's (JVM) class of its type, or, for a
    model MLlib has not, its own Python class (which pyspark.ml's readers import)."""
    mllib = getattr(model, "mllib_class", None)
    return java_class(mllib) if mllib else python_class(model)


def java_class(pyspark_class: str) -> str:
    """MLlib's JVM class name of a pyspark.ml class name."""
    return "org.apache.spark" + pyspark_class[len("pyspark") :]


def mllib_param_names(pyspark_class: str) -> set[str]:
    """The Params of MLlib's model class (read from its pyspark class, made without a JVM)."""
    module, name = pyspark_class.rsplit(".", 1)
    return {p.name for p in getattr(importlib.import_module(module), name)().params}


class ModelWriter(MLWriter):
    """Writes a ``SavedModel`` as MLlib writes its model type (see the module docstring)."""

    def __init__(self, instance: SavedModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        spark = self.sparkSession
        metadata = json.dumps(metadata_of(self.instance, spark.version), separators=(",", ":"))
        spark.createDataFrame([(metadata,)], schema=["value"]).coalesce(1).write.text(
            os.path.join(path, "metadata")
        )
        for name, frame in self.instance._saved_parts(spark).items():
            frame.coalesce(1).write.parquet(os.path.join(path, name))


def metadata_of(model: SavedModel, spark_version: str) -> dict[str, Any]:
    """MLlib's metadata of ``model``: the Params MLlib's class has (values MLlib takes),
    and iterflow's own in ``"iterflow"``."""
    known = mllib_param_names(model.mllib_class) if model.mllib_class else set()

    def for_mllib(values: Mapping[Any, Any]) -> dict[str, Any]:
        chosen = {}
        for p, value in values.items():
            if p.name in known and value is not None:
                mapped = model._mllib_value(p.name, value)
                if mapped is not None:
                    chosen[p.name] = mapped
        return chosen

    own = {p.name: v for p, v in model._paramMap.items() if v is not None}
    return {
        "class": class_name(model),
        "timestamp": round(time.time() * 1000),
        "sparkVersion": spark_version,
        "uid": model.uid,
        "paramMap": for_mllib(model._paramMap) if model.mllib_class else own,
        "defaultParamMap": for_mllib(model._defaultParamMap) if model.mllib_class else {},
        **model._mllib_metadata(),
        ITERFLOW: {
            "class": python_class(model),
            "paramMap": own,
            "extra": model._extra(),
        },
    }


class ModelReader(MLReader[M], Generic[M]):
    """Reads into a new ``cls`` a model saved in MLlib's format (by MLlib or by iterflow),
    or by an earlier iterflow (JSON in the metadata)."""

    def __init__(self, cls: type[M]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> M:
        spark = self.sparkSession
        metadata = DefaultParamsReader.loadMetadata(path, spark)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        if "learned" in metadata:  # saved by iterflow before it wrote MLlib's format
            DefaultParamsReader.getAndSetParams(instance, metadata)
            instance._restore(metadata["learned"])
            return instance
        expected = class_name(instance)
        if metadata["class"] != expected:
            raise MLError(
                f"{path} holds a {metadata['class']}, not a model that "
                f"{self.cls.__name__} reads ({expected})"
            )
        restore_params(instance, metadata)
        instance._restore_extra(metadata.get(ITERFLOW, {}).get("extra", {}))
        instance._restore_parts(lambda name: _rows(spark, os.path.join(path, name)))
        return instance


def restore_params(instance: SavedModel, metadata: Mapping[str, Any]) -> None:
    """The Params saved in ``metadata``: iterflow's own when it wrote them, else MLlib's
    (those iterflow's class has; MLlib's defaults that differ from iterflow's are set)."""
    own = metadata.get(ITERFLOW, {}).get("paramMap")
    if own is not None:
        values = dict(own)
    else:
        values = {**metadata.get("defaultParamMap", {}), **metadata.get("paramMap", {})}
    kept = {name: v for name, v in values.items() if instance.hasParam(name)}
    instance._set_checked(kept)


def _rows(spark: SparkSession, path: str) -> list[Row]:
    return spark.read.parquet(path).collect()


class SavedEstimator(MLWritable, MLReadable[Any]):
    """An Estimator saved with its Params (``DefaultParamsWriter``'s metadata); an
    ``initialModel`` that is a model, not a path, is saved beside it (``initialModel/``)
    and loads as the path of that copy."""

    def write(self) -> MLWriter:
        return EstimatorWriter(self)

    @classmethod
    def read(cls) -> EstimatorReader[Any]:
        return EstimatorReader(cls)


class EstimatorWriter(MLWriter):
    """Writes a ``SavedEstimator``."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        values = {p.name: v for p, v in self.instance._paramMap.items()}
        extra = {}
        start = values.get("initialModel")
        if start is not None and not isinstance(start, str):
            start.write().save(os.path.join(path, "initialModel"))
            del values["initialModel"]
            extra["initialModelSaved"] = "initialModel"
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, extraMetadata=extra, paramMap=values
        )


class EstimatorReader(MLReader[M], Generic[M]):
    """Reads what ``EstimatorWriter`` wrote (or ``DefaultParamsWriter``)."""

    def __init__(self, cls: type[Any]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> M:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        module, name = metadata["class"].rsplit(".", 1)
        instance = getattr(importlib.import_module(module), name)()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        if "initialModelSaved" in metadata:
            instance._set(initialModel=os.path.join(path, metadata["initialModelSaved"]))
        return instance
