"""Column expressions evaluated by numpy: how a vertex program written with GraphFrames'
Column expressions runs on the kernel engine instead of joins over DataFrame rows.

``parse`` reads a Column's expression tree (a classic Column's JVM node, or a Spark
Connect Column's own tree) into ``Expr``; ``evaluate`` computes one over numpy arrays
with Spark's semantics: each value is a ``Value`` (data, validity, Spark type), null in
is null out, ``and``/``or`` are three-valued, NaN equals NaN and is larger than any
number, ``/`` is a division of doubles, ``ln`` of a number <= 0 is null, a ``when``
whose condition is null takes the next branch, and a division by zero is null, or an
error when ``spark.sql.ansi.enabled`` (as in Spark). Evaluating over empty arrays gives
an expression's type, which is how a program is checked before it runs.

What compiles: column references, literals, ``+ - * / %``, comparisons, ``<=>``,
``and/or/not``, ``isNull/isNotNull``, ``isnan``, ``nanvl``, ``when/otherwise``,
``coalesce``, ``least``, ``greatest``, ``abs``, ``negative``, ``sqrt``, ``exp``,
``ln``/``log``, ``log10``, ``log2``, ``log1p``, ``pow``, ``signum``, casts between
numbers and booleans; aggregates ``sum``, ``min``, ``max``, ``count``, ``first``. Any
other form raises ``Unsupported``, naming it, and the program runs on the DataFrame
path instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from pyspark.sql import Column

from iterflow.graph.graphs import GraphError

#: numpy dtype of each Spark type a value may have ("void": an untyped null).
DTYPES: dict[str, Any] = {
    "tinyint": np.int8,
    "smallint": np.int16,
    "int": np.int32,
    "bigint": np.int64,
    "float": np.float32,
    "double": np.float64,
    "boolean": np.bool_,
    "void": np.float64,
}
_NUMBERS = ("tinyint", "smallint", "int", "bigint", "float", "double")
_CAST_NAMES = {"integer": "int", "long": "bigint", "short": "smallint", "byte": "tinyint"}
AGGREGATES = ("sum", "min", "max", "count", "first")


class Unsupported(Exception):
    """An expression the numpy engine does not evaluate; the message says which form."""


@attrs.frozen
class Expr:
    """A node of an expression: ``ref`` (``name``), ``lit`` (``value``, ``type``), ``call``
    (``name``, ``args``), ``case`` (``args``: condition, value, ..., otherwise), ``cast``
    (``args``: the child, ``type``), or ``star``."""

    kind: str
    name: str = ""
    args: tuple[Expr, ...] = ()
    value: Any = None
    type: str | None = None


@attrs.frozen
class Value:
    """An evaluated expression: ``data``, ``valid`` (None: every entry is valid) and the
    Spark type."""

    data: np.ndarray
    valid: np.ndarray | None
    type: str

    def validity(self) -> np.ndarray:
        return np.ones(len(self.data), dtype=bool) if self.valid is None else self.valid


# --- parsing -------------------------------------------------------------------------


def parse(column: Column) -> Expr:
    """The expression of ``column`` (classic or Spark Connect); ``Unsupported`` for a form
    outside the compiled set."""
    if type(column).__module__.startswith("pyspark.sql.connect"):
        return _from_connect(getattr(column, "_expr"))  # noqa: B009 -- a private attribute
    try:
        node = getattr(column, "_jc").node()  # noqa: B009 -- a private attribute
    except Exception as exc:  # an older or unknown Column
        raise Unsupported(f"cannot read the expression of {column!r} ({exc})") from None
    return _from_jvm(node)


def _literal(value: Any, spark_type: str | None) -> Expr:
    if spark_type is not None:
        return Expr("lit", value=value, type=_CAST_NAMES.get(spark_type, spark_type))
    if value is None:
        return Expr("lit", value=None, type="void")
    if isinstance(value, bool | np.bool_):
        return Expr("lit", value=bool(value), type="boolean")
    if isinstance(value, int | np.integer):
        small = -(2**31) <= int(value) < 2**31
        return Expr("lit", value=int(value), type="int" if small else "bigint")
    if isinstance(value, float | np.floating):
        return Expr("lit", value=float(value), type="double")
    if isinstance(value, str):
        return Expr("lit", value=value, type="string")
    raise Unsupported(f"the literal {value!r} ({type(value).__name__})")


def _extracted(child: Expr, extraction: Expr) -> Expr:
    """``src["rank"]``: a reference to ``src.rank``."""
    if child.kind != "ref" or extraction.kind != "lit" or not isinstance(extraction.value, str):
        raise Unsupported("a field extraction other than struct['name']")
    return Expr("ref", name=f"{child.name}.{extraction.value}")


def _seq(scala: Any) -> list[Any]:
    return [scala.apply(i) for i in range(scala.size())]


def _from_jvm(node: Any) -> Expr:
    """A classic Column's ``ColumnNode`` (read through py4j) as an ``Expr``."""
    kind = node.getClass().getSimpleName()
    if kind == "UnresolvedAttribute":
        return Expr("ref", name=".".join(str(p) for p in _seq(node.nameParts())))
    if kind == "Literal":
        given = node.dataType()
        spark_type = given.get().simpleString() if given.isDefined() else None
        value = node.value()
        if value is not None and not isinstance(value, bool | int | float | str):
            raise Unsupported(f"the literal {value} ({spark_type or 'of a JVM type'})")
        return _literal(value, spark_type)
    if kind == "UnresolvedFunction":
        if node.isDistinct():
            raise Unsupported(f"{node.functionName()}(DISTINCT ...)")
        return Expr("call", name=node.functionName(), args=_all(_seq(node.arguments())))
    if kind == "CaseWhenOtherwise":
        args: list[Expr] = []
        for branch in _seq(node.branches()):
            args += [_from_jvm(branch._1()), _from_jvm(branch._2())]
        otherwise = node.otherwise()
        args.append(_from_jvm(otherwise.get()) if otherwise.isDefined() else _literal(None, None))
        return Expr("case", args=tuple(args))
    if kind == "Alias":
        return _from_jvm(node.child())
    if kind == "Cast":
        return _cast(_from_jvm(node.child()), node.dataType().simpleString())
    if kind == "UnresolvedExtractValue":
        return _extracted(_from_jvm(node.child()), _from_jvm(node.extraction()))
    if kind == "UnresolvedStar":
        return Expr("star")
    raise Unsupported(f"the expression {node.sql() if hasattr(node, 'sql') else kind} ({kind})")


def _all(nodes: list[Any]) -> tuple[Expr, ...]:
    return tuple(_from_jvm(n) for n in nodes)


def _cast(child: Expr, spark_type: str) -> Expr:
    target = _CAST_NAMES.get(spark_type, spark_type)
    if target not in DTYPES or target == "void":
        raise Unsupported(f"a cast to {spark_type}")
    return Expr("cast", args=(child,), type=target)


def _from_connect(tree: Any) -> Expr:
    """A Spark Connect Column's expression tree as an ``Expr``."""
    kind = type(tree).__name__
    if kind == "ColumnReference":
        return Expr("ref", name=str(tree._unparsed_identifier).replace("`", ""))
    if kind == "LiteralExpression":
        spark_type = tree._dataType.simpleString() if tree._value is not None else None
        return _literal(tree._value, spark_type)
    if kind == "UnresolvedFunction":
        if tree._is_distinct:
            raise Unsupported(f"{tree._name}(DISTINCT ...)")
        return Expr("call", name=tree._name, args=tuple(_from_connect(a) for a in tree._args))
    if kind == "CaseWhen":
        args: list[Expr] = []
        for condition, value in tree._branches:
            args += [_from_connect(condition), _from_connect(value)]
        otherwise = tree._else_value
        args.append(_literal(None, None) if otherwise is None else _from_connect(otherwise))
        return Expr("case", args=tuple(args))
    if kind == "ColumnAlias":
        return _from_connect(tree._child)
    if kind == "CastExpression":
        target = tree._data_type
        name = target if isinstance(target, str) else target.simpleString()
        return _cast(_from_connect(tree._expr), name)
    if kind == "UnresolvedExtractValue":
        return _extracted(_from_connect(tree._child), _from_connect(tree._extraction))
    if kind == "UnresolvedStar":
        return Expr("star")
    raise Unsupported(f"the expression {tree} ({kind})")


# --- evaluation ----------------------------------------------------------------------


@attrs.frozen
class Scope:
    """What an expression is evaluated over: ``lookup`` (a reference's name to its value,
    ``Unsupported`` for an unknown name), the number of rows, and whether Spark's ANSI
    mode is on (a division by zero is an error)."""

    lookup: Callable[[str], Value]
    rows: int
    ansi: bool = True


def evaluate(expr: Expr, scope: Scope) -> Value:
    """``expr`` over ``scope``'s arrays, with Spark's semantics (see the module)."""
    with np.errstate(all="ignore"):  # invalid entries may hold anything
        return _eval(expr, scope)


def _eval(expr: Expr, scope: Scope) -> Value:
    if expr.kind == "ref":
        return scope.lookup(expr.name)
    if expr.kind == "lit":
        return _constant(expr, scope.rows)
    if expr.kind == "case":
        return _case([_eval(a, scope) for a in expr.args])
    if expr.kind == "cast":
        assert expr.type is not None
        return cast(_eval(expr.args[0], scope), expr.type, scope.ansi)
    if expr.kind == "call":
        function = _FUNCTIONS.get(expr.name)
        if function is None or expr.name in AGGREGATES:
            raise Unsupported(f"the function {expr.name}()")
        return function([_eval(a, scope) for a in expr.args], scope)
    raise Unsupported(f"{expr.kind} here")


def _constant(expr: Expr, rows: int) -> Value:
    if expr.type not in DTYPES:
        raise Unsupported(f"the {expr.type} literal {expr.value!r}")
    assert expr.type is not None
    if expr.value is None:
        return Value(np.zeros(rows, DTYPES[expr.type]), np.zeros(rows, dtype=bool), expr.type)
    return Value(np.full(rows, expr.value, dtype=DTYPES[expr.type]), None, expr.type)


def wider(*types: str) -> str:
    """Spark's common type of ``types`` (numbers widen; an untyped null takes the other)."""
    known = [t for t in types if t != "void"]
    if not known:
        return "void"
    if all(t == "boolean" for t in known):
        return "boolean"
    if "boolean" in known:
        raise Unsupported(f"mixing booleans and numbers ({', '.join(known)})")
    return max(known, key=_NUMBERS.index)


def _and_valid(*values: Value) -> np.ndarray | None:
    masks = [v.valid for v in values if v.valid is not None]
    if not masks:
        return None
    out = masks[0].copy()
    for mask in masks[1:]:
        out &= mask
    return out


def cast(value: Value, target: str, ansi: bool = True) -> Value:
    """``value`` as Spark type ``target`` (numbers and booleans)."""
    if value.type == target:
        return value
    data = value.data
    if target == "boolean":
        return Value(data != 0, value.valid, target)
    if np.issubdtype(data.dtype, np.floating) and target not in ("float", "double"):
        # Java's cast: NaN to 0, beyond the range to its end (ANSI mode: an error).
        limits = np.iinfo(DTYPES[target])
        outside = np.isnan(data) | (data < limits.min) | (data > limits.max)
        if ansi and np.any(outside & value.validity()):
            raise GraphError(f"a cast of NaN or an out-of-range number to {target} (ANSI mode)")
        data = np.where(np.isnan(data), 0, np.trunc(np.clip(data, limits.min, limits.max)))
    return Value(data.astype(DTYPES[target]), value.valid, target)


def _numeric(values: list[Value], name: str) -> str:
    for v in values:
        if v.type not in _NUMBERS and v.type != "void":
            raise Unsupported(f"{name}() of a {v.type}")
    out = wider(*(v.type for v in values))
    return "double" if out == "void" else out


def _arithmetic(op: Callable[..., np.ndarray], name: str) -> Callable[..., Value]:
    def apply(args: list[Value], scope: Scope) -> Value:
        a, b = args
        out = _numeric(args, name)
        dtype = DTYPES[out]
        return Value(op(a.data.astype(dtype), b.data.astype(dtype)), _and_valid(a, b), out)

    return apply


def _dividing(op: Callable[..., np.ndarray], name: str, double: bool) -> Callable[..., Value]:
    """``/`` (always of doubles) or ``%``: a zero divisor gives null, or fails under ANSI."""

    def apply(args: list[Value], scope: Scope) -> Value:
        a, b = args
        common = _numeric(args, name)  # checks both are numbers
        out = "double" if double else common
        dtype = DTYPES[out]
        valid = _and_valid(a, b)
        zero = b.data == 0
        both = np.ones(len(zero), dtype=bool) if valid is None else valid
        if np.any(zero & both):
            if scope.ansi:
                raise GraphError(
                    f"division by zero in {name} (Spark's ANSI mode; set "
                    "spark.sql.ansi.enabled=false for null, or guard it with when())"
                )
            valid = both & ~zero
        safe = np.where(zero, 1, b.data).astype(dtype)
        return Value(op(a.data.astype(dtype), safe), valid, out)

    return apply


def _float_order(a: Value, b: Value) -> tuple[np.ndarray, np.ndarray]:
    """(a < b, a == b) with NaN equal to NaN and larger than any number."""
    common = DTYPES[wider(a.type, b.type)]
    x, y = a.data.astype(common), b.data.astype(common)
    if not np.issubdtype(np.dtype(common), np.floating):
        return x < y, x == y
    nx, ny = np.isnan(x), np.isnan(y)
    return (x < y) | (~nx & ny), (x == y) | (nx & ny)


def _comparison(pick: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., Value]:
    def apply(args: list[Value], scope: Scope) -> Value:
        a, b = args
        less, equal = _float_order(a, b)
        return Value(pick(less, equal), _and_valid(a, b), "boolean")

    return apply


def null_safe_equal(args: list[Value], scope: Scope | None = None) -> Value:
    """``a <=> b``: true when both are null or both equal (NaN equals NaN)."""
    a, b = args
    _, equal = _float_order(a, b)
    va, vb = a.validity(), b.validity()
    return Value((va & vb & equal) | (~va & ~vb), None, "boolean")


def _logical(is_and: bool) -> Callable[..., Value]:
    """Three-valued ``and``/``or``: false and null is false; true or null is true."""

    def apply(args: list[Value], scope: Scope) -> Value:
        a, b = args
        va, vb = a.validity(), b.validity()
        x, y = a.data.astype(bool), b.data.astype(bool)
        decided = (va & ~x) | (vb & ~y) if is_and else (va & x) | (vb & y)
        data = (x & y) if is_and else (x | y)
        data = ~decided & data if is_and else decided | data
        return Value(data, decided | (va & vb), "boolean")

    return apply


def _case(values: list[Value]) -> Value:
    """``CASE WHEN c1 THEN v1 ... ELSE e``: the first branch whose condition is true."""
    conditions, results = values[0:-1:2], [*values[1:-1:2], values[-1]]
    out_type = wider(*(v.type for v in results))
    if out_type == "void":
        out_type = "double"
    last = cast(results[-1], out_type) if results[-1].type != "void" else results[-1]
    data, valid = last.data.astype(DTYPES[out_type]), last.validity().copy()
    for condition, result in zip(reversed(conditions), reversed(results[:-1]), strict=True):
        taken = condition.data.astype(bool) & condition.validity()
        data = np.where(taken, result.data.astype(DTYPES[out_type]), data)
        valid = np.where(taken, result.validity(), valid)
    return Value(data, valid, out_type)


def _coalesce(args: list[Value], scope: Scope) -> Value:
    out_type = wider(*(v.type for v in args))
    dtype = DTYPES[out_type]
    data = np.zeros(scope.rows, dtype=dtype)
    valid = np.zeros(scope.rows, dtype=bool)
    for v in reversed(args):
        here = v.validity()
        data = np.where(here, v.data.astype(dtype), data)
        valid |= here
    return Value(data, valid, out_type)


def _extreme(pair: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., Value]:
    """``least``/``greatest``: nulls are skipped (null only when all are)."""

    def apply(args: list[Value], scope: Scope) -> Value:
        out_type = _numeric(args, "least/greatest")
        dtype = DTYPES[out_type]
        data = np.zeros(scope.rows, dtype=dtype)
        valid = np.zeros(scope.rows, dtype=bool)
        for v in args:
            here, x = v.validity(), v.data.astype(dtype)
            data = np.where(here & valid, pair(data, x), np.where(here, x, data))
            valid |= here
        return Value(data, valid, out_type)

    return apply


def _unary(op: Callable[[np.ndarray], np.ndarray], to_double: bool = True) -> Callable[..., Value]:
    def apply(args: list[Value], scope: Scope) -> Value:
        (a,) = args
        out = "double" if to_double else _numeric(args, "a numeric function")
        return Value(op(a.data.astype(DTYPES[out])), a.valid, out)

    return apply


def _binary_double(op: Callable[..., np.ndarray]) -> Callable[..., Value]:
    """A function of two numbers computed in doubles (``pow``)."""

    def apply(args: list[Value], scope: Scope) -> Value:
        a, b = (cast(v, "double") for v in args)
        return Value(op(a.data, b.data), _and_valid(a, b), "double")

    return apply


def _log_of(op: Callable[[np.ndarray], np.ndarray], floor: float = 0.0) -> Callable[..., Value]:
    """A logarithm: null at or below ``floor``, as Spark's."""

    def apply(args: list[Value], scope: Scope) -> Value:
        if len(args) == 2:  # log(base, x)
            base, x = args
            ln_x, ln_base = np.log(x.data.astype(float)), np.log(base.data.astype(float))
            valid = _and_valid(base, x)
            ok = ~(x.data <= 0) & ~(base.data <= 0)  # NaN is not null: log(NaN) is NaN
            return Value(ln_x / ln_base, ok if valid is None else valid & ok, "double")
        (a,) = args
        data = a.data.astype(float)
        ok = ~(data <= floor)
        return Value(op(data), ok if a.valid is None else a.valid & ok, "double")

    return apply


def _not(args: list[Value], scope: Scope) -> Value:
    (a,) = args
    return Value(~a.data.astype(bool), a.valid, "boolean")


def _is_null(negate: bool) -> Callable[..., Value]:
    def apply(args: list[Value], scope: Scope) -> Value:
        valid = args[0].validity()
        return Value(valid if negate else ~valid, None, "boolean")

    return apply


def _isnan(args: list[Value], scope: Scope) -> Value:
    (a,) = args
    nan = np.isnan(a.data.astype(float)) if a.type in ("float", "double") else a.data != a.data
    return Value(nan & a.validity(), None, "boolean")


def _nanvl(args: list[Value], scope: Scope) -> Value:
    a, b = (cast(v, "double") for v in args)
    use_b = np.isnan(a.data) & a.validity()
    valid = np.where(use_b, b.validity(), a.validity())
    return Value(np.where(use_b, b.data, a.data), valid, "double")


def _signum(values: np.ndarray) -> np.ndarray:
    return np.sign(values)


_FUNCTIONS: dict[str, Callable[[list[Value], Scope], Value]] = {
    "+": _arithmetic(np.add, "+"),
    "-": _arithmetic(np.subtract, "-"),
    "*": _arithmetic(np.multiply, "*"),
    "/": _dividing(np.divide, "/", double=True),
    "%": _dividing(np.fmod, "%", double=False),
    "<": _comparison(lambda lt, eq: lt),
    "<=": _comparison(lambda lt, eq: lt | eq),
    ">": _comparison(lambda lt, eq: ~lt & ~eq),
    ">=": _comparison(lambda lt, eq: ~lt),
    "==": _comparison(lambda lt, eq: eq),
    "=": _comparison(lambda lt, eq: eq),
    "!=": _comparison(lambda lt, eq: ~eq),
    "<>": _comparison(lambda lt, eq: ~eq),
    "<=>": null_safe_equal,
    "and": _logical(True),
    "or": _logical(False),
    "not": _not,
    "!": _not,
    "isNull": _is_null(False),
    "isnull": _is_null(False),
    "isNotNull": _is_null(True),
    "isnotnull": _is_null(True),
    "isnan": _isnan,
    "isNaN": _isnan,
    "nanvl": _nanvl,
    "coalesce": _coalesce,
    "least": _extreme(np.fmin),
    "greatest": _extreme(np.maximum),
    "negative": _unary(np.negative, to_double=False),
    "abs": _unary(np.abs, to_double=False),
    "signum": _unary(_signum),
    "sqrt": _unary(np.sqrt),
    "exp": _unary(np.exp),
    "ln": _log_of(np.log),
    "log": _log_of(np.log),
    "log10": _log_of(np.log10),
    "log2": _log_of(np.log2),
    "log1p": _log_of(np.log1p, floor=-1.0),
    "pow": _binary_double(np.power),
    "power": _binary_double(np.power),
}


def aggregate_of(expr: Expr, message: Callable[[Expr], bool]) -> tuple[str, Expr | None]:
    """``expr`` as (aggregate, its argument) when it is one of ``AGGREGATES`` over the
    message (``message(arg)`` says whether an argument is it); ``Unsupported`` otherwise."""
    if expr.kind != "call" or expr.name not in AGGREGATES:
        raise Unsupported(f"the aggregate {expr.name or expr.kind} (compiled: {AGGREGATES})")
    argument = expr.args[0] if expr.args else None
    if expr.name == "count" and argument is not None and argument.kind == "star":
        return "count", None
    if argument is None or not message(argument):
        raise Unsupported(f"{expr.name}() of anything but the message")
    return expr.name, argument


def aggregated_type(aggregate: str, message_type: str) -> str:
    """The Spark type of ``aggregate`` over messages of ``message_type``."""
    if aggregate == "count":
        return "bigint"
    if aggregate == "sum":
        return "double" if message_type in ("float", "double") else "bigint"
    return message_type


def from_arrow(column: Any, spark_type: str) -> Value:
    """An Arrow column of ``spark_type`` as a ``Value``."""
    if spark_type not in DTYPES or spark_type == "void":
        raise Unsupported(f"a column of type {spark_type}")
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    valid = None
    if column.null_count:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        column = column.fill_null(False if spark_type == "boolean" else 0)
    data = np.asarray(column.to_numpy(zero_copy_only=False), dtype=DTYPES[spark_type])
    return Value(data, valid, spark_type)
