"""Where a DataFrame's features are, and reading them as one float64 matrix.

Features come as a list of numeric columns, one array column, or one
``pyspark.ml.linalg`` Vector column (``VectorAssembler``'s output), dense or sparse.
They are read once, when the rows become columnar or resident: ``matrix`` turns an
Arrow table's features into a ``(rows, dims)`` float64 array, and a value that is not
a finite number is an ``MLError`` naming its column. A Vector column reaches Arrow as
its storage struct (``type`` 0 sparse / 1 dense, ``size``, ``indices``, ``values``),
which ``matrix`` unpacks with vectorized numpy (no per-row Python).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, NumericType

from iterflow.ml.training import MLError

KINDS = ("columns", "array", "vector")
#: Up to this many features, ``Features.dot`` of an array or Vector column is written out
#: term by term (code-generated); beyond, ``zip_with`` and ``aggregate``.
UNROLLED_DOT = 64
#: Up to this many features, a Vector column reaches Python as an array of doubles
#: (``vectors_as_arrays``).
ARRAY_LOAD_DIMS = 4096
#: The column a fit adds to number every row's partition (mini-batches are drawn per
#: partition); with the names starting ``__iterflow_`` (iterflow's columnar data), no
#: feature, label or weight column may take it.
PARTITION = "__partition"
RESERVED_PREFIX = "__iterflow_"


def named(name: str) -> Column:
    """The column named ``name``, taken whole: dots and backticks in it are literal."""
    return F.col("`" + name.replace("`", "``") + "`")


def used_rows(df: DataFrame, columns: Sequence[str | None], who: str) -> DataFrame:
    """``df`` with only ``columns`` (the features, label and weight; None skipped): the
    rows a fit holds. A column named as those iterflow adds is an ``MLError``."""
    names = list(dict.fromkeys(c for c in columns if c is not None))
    for name in names:
        if name == PARTITION or name.startswith(RESERVED_PREFIX):
            raise MLError(
                f"{who}: column '{name}' has the name of a column iterflow adds to the rows "
                f"it fits on ('{PARTITION}', names starting with '{RESERVED_PREFIX}'); "
                "rename it (withColumnRenamed)"
            )
    return df.select(*(named(name) for name in names))


def vectors_as_arrays(df: DataFrame, spec: Features) -> DataFrame:
    """``df`` with its Vector feature column (``spec``) as ``ARRAY<DOUBLE>`` under the same
    name, converted in the JVM: Arrow carries an array of doubles to Python several times
    faster than a Vector's struct (1,000,000 rows of 20: 0.6 s against 5 s on two cores),
    and ``matrix`` reads both. Vectors of more than ``ARRAY_LOAD_DIMS`` features stay
    structs (a sparse one travels by its nonzeros)."""
    if spec.kind != "vector" or spec.dims > ARRAY_LOAD_DIMS:
        return df
    return df.withColumn(spec.column, vector_to_array(named(spec.column)))


@attrs.frozen
class Features:
    """The feature columns of a DataFrame: ``kind`` is ``"columns"`` (numeric columns,
    one feature each), ``"array"`` (one array column) or ``"vector"`` (one Vector
    column); ``dims`` is the number of features."""

    columns: tuple[str, ...]
    kind: str = attrs.field(validator=attrs.validators.in_(KINDS))
    dims: int

    @property
    def column(self) -> str:
        """The one column of an ``"array"`` or ``"vector"`` kind."""
        return self.columns[0]

    def as_array(self) -> Column:
        """A Spark column holding each row's features as ``ARRAY<DOUBLE>``."""
        if self.kind == "vector":
            return vector_to_array(named(self.column))
        if self.kind == "array":
            return named(self.column).cast("array<double>")
        return F.array(*[named(c).cast("double") for c in self.columns])

    def dot(self, weights: Sequence[float]) -> Column:
        """A Spark column: each row's features dotted with ``weights`` (a SQL expression,
        so that it runs in the JVM, classic or Connect)."""
        if self.kind == "columns":
            terms = [
                named(c).cast("double") * F.lit(float(w))
                for c, w in zip(self.columns, weights, strict=True)
            ]
            total: Column = F.lit(0.0)
            for term in terms:
                total = total + term
            return total
        values = self.as_array()
        if len(weights) <= UNROLLED_DOT:
            # Element by element: Spark generates code for it (the higher-order functions
            # below are interpreted) and computes the array once per row.
            total = F.lit(0.0)
            for i, w in enumerate(weights):
                total = total + values[i] * F.lit(float(w))
            return total
        products = F.zip_with(
            values, F.array(*[F.lit(float(w)) for w in weights]), lambda x, w: x * w
        )
        return F.aggregate(products, F.lit(0.0), lambda acc, x: acc + x)


def features_of(
    df: DataFrame, features: Sequence[str] | str, who: str, dims: int | None = None
) -> Features:
    """Where ``features`` are in ``df``: checks that the columns exist and hold numbers,
    and, unless ``dims`` is given, finds the length of an array or Vector column from its
    first row (one small Spark job). ``who`` names the caller in errors, e.g.
    ``"kmeans()"``."""
    if isinstance(features, str):
        if features not in df.columns:
            raise MLError(f"{who}: no feature column '{features}'; the columns are {df.columns}")
        kind_of = df.schema[features].dataType
        if isinstance(kind_of, VectorUDT):
            kind = "vector"
        elif isinstance(kind_of, ArrayType) and isinstance(kind_of.elementType, NumericType):
            kind = "array"
        else:
            raise MLError(
                f"{who}: feature column '{features}' must be a Vector or an array of numbers, "
                f"got {kind_of.simpleString()}; or pass features=[...] numeric column names"
            )
        spec = Features((features,), kind, 0 if dims is None else dims)
        if dims is not None:
            return spec
        present = df.where(named(features).isNotNull())
        first = present.select(F.size(spec.as_array()).alias("d")).limit(1).collect()
        if not first:
            raise MLError(
                f"{who} needs at least one row with features, and feature column "
                f"'{features}' has none (the DataFrame is empty or every value is null)"
            )
        return attrs.evolve(spec, dims=int(first[0]["d"]))
    names = list(features)
    if not names:
        raise MLError(f"{who}: features=[] names no column")
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise MLError(
            f"{who}: no column(s) {missing} for the features; the columns are {df.columns}"
        )
    for name in names:
        kind_of = df.schema[name].dataType
        if not isinstance(kind_of, NumericType):
            raise MLError(
                f"{who}: feature column '{name}' must be numeric, got {kind_of.simpleString()}"
            )
    if dims is not None and dims != len(names):
        raise MLError(f"{who}: {len(names)} feature column(s) given, the model has {dims}")
    return Features(tuple(names), "columns", len(names))


def linear_score(
    df: DataFrame,
    features: Sequence[str] | str,
    coefficients: Sequence[float],
    intercept: float,
    who: str,
) -> Column:
    """``features . coefficients + intercept`` for every row of ``df``, as a Spark SQL
    expression; ``who`` names the caller in errors."""
    spec = features_of(df, features, who, dims=len(coefficients))
    return spec.dot(coefficients) + F.lit(float(intercept))


def numbers(table: pa.Table, name: str, what: str) -> np.ndarray:
    """Column ``name`` of ``table`` as float64; a null, NaN or infinite value is an
    ``MLError`` naming the column (``what`` says what it holds: "label", "weight")."""
    values = np.asarray(table[name].to_numpy(zero_copy_only=False), dtype=np.float64)
    if not np.isfinite(values).all():
        raise MLError(f"{what} column '{name}' has a null, NaN or infinite value")
    return values


def weights(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` of ``table`` as row weights: finite numbers, none negative (an
    ``MLError`` naming the column otherwise)."""
    values = numbers(table, name, "weight")
    if (values < 0).any():
        raise MLError(f"weight column '{name}' has a negative value")
    return values


def matrix(table: pa.Table, spec: Features) -> np.ndarray:
    """The features of ``table`` as a C-contiguous ``(rows, dims)`` float64 matrix."""
    if spec.kind == "columns":
        # One copy per value: each column goes straight into its place in the matrix.
        out = np.empty((table.num_rows, spec.dims))
        for j, name in enumerate(spec.columns):
            out[:, j] = table[name].to_numpy(zero_copy_only=False)
        if not np.isfinite(out).all():
            for name in spec.columns:  # which column: only when one is bad
                numbers(table, name, "feature")
        return out
    column = table[spec.column].combine_chunks()
    if column.null_count:
        raise MLError(f"feature column '{spec.column}' has a null row")
    if spec.kind == "array" or not pa.types.is_struct(column.type):  # or vectors_as_arrays'
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if (lengths != spec.dims).any():
            what = f"vector must have size {spec.dims}"
            if spec.kind == "array":
                what = f"row must have {spec.dims} values"
            raise MLError(f"feature column '{spec.column}': every {what}")
        flat = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.float64)
        if not np.isfinite(flat).all():
            bad = "NaN or infinite" if spec.kind == "vector" else "null, NaN or infinite"
            raise MLError(f"feature column '{spec.column}' has a {bad} value")
        return flat.reshape(len(column), spec.dims)
    return _vectors(column, spec)


#: About how many bytes of rows one block of a kernel takes: small enough to stay in a
#: core's cache between the block's matrix product and the passes over its results, large
#: enough that the product runs at BLAS speed (benchmarks/bench_kernels.py).
BLOCK_BYTES = 1 << 21


def block_rows(width: int) -> int:
    """Rows per block of a kernel over ``width`` float64 values per row: a multiple of 64, so
    that BLAS splits a block's rows as it splits those of the whole matrix."""
    return max(64, BLOCK_BYTES // (8 * max(width, 1)) // 64 * 64)


def prepared_matrix(data: pa.Table | pa.RecordBatch, name: str, dims: int) -> np.ndarray:
    """Column ``name`` of a prepared table or batch (fixed-size lists of ``dims`` float64,
    no nulls) as a read-only ``(rows, dims)`` view of its buffer: kernels read it every
    round, so it is no copy when the column is one chunk (a resident table, an Arrow file)."""
    column = data.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column.flatten().to_numpy().reshape(-1, dims)


def _vectors(column: pa.StructArray, spec: Features) -> np.ndarray:
    """Vector structs (``type`` 0 sparse, 1 dense) scattered into a dense matrix."""
    rows = len(column)
    dense = column.field("type").to_numpy(zero_copy_only=False) == 1
    values = column.field("values")
    counts = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(values).to_numpy(zero_copy_only=False).astype(np.float64)
    sizes = np.where(dense, counts, pc.fill_null(column.field("size"), 0).to_numpy(False))
    if (sizes != spec.dims).any():
        raise MLError(f"feature column '{spec.column}': every vector must have size {spec.dims}")
    if not np.isfinite(flat).all():
        raise MLError(f"feature column '{spec.column}' has a NaN or infinite value")
    owner = np.repeat(np.arange(rows), counts)
    starts = np.cumsum(counts) - counts  # where each row's values begin in ``flat``
    places = np.arange(len(flat)) - starts[owner]  # a dense row's value i is feature i
    sparse_values = ~dense[owner]
    if sparse_values.any():
        indices = pc.list_flatten(column.field("indices")).to_numpy(zero_copy_only=False)
        places[sparse_values] = indices
    out = np.zeros((rows, spec.dims))
    out[owner, places] = flat
    return out
