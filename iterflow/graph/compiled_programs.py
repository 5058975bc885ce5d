"""The two Column-expression Pregels compiled to ``VertexProgram``s (see
``kernel_pregel``): ``compile_pregel`` for ``iterflow.graph.pregel(init=, update=...)``
(only the vertices that received a message update; the changed ones send next round)
and ``compile_builder`` for GraphFrames' builder (every vertex updates every round,
``Pregel.msg()`` null where no message came). ``run_compiled`` runs either and returns
the vertices with their state columns, as the DataFrame path does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
from pyspark.sql import Column, DataFrame

from iterflow.graph.expressions import DTYPES, Expr, Scope, Unsupported, Value, evaluate, parse
from iterflow.graph.kernel_pregel import (
    ACTIVE,
    MERGES,
    MESSAGE_NAMES,
    VALID,
    Arrays,
    Messages,
    Typing,
    changed,
    edge_frame,
    engine_note,
    initial,
    kept,
    parsed,
    refs,
    state_table,
    stored,
    vertex_arrays,
    with_state,
)
from iterflow.graph.pregel_columns import OLD, Pregel
from iterflow.graph.programs import VertexProgram, run_arrays


@attrs.frozen
class Compiled:
    """A compiled program: the ``VertexProgram``, its output state columns, the types of
    every column it carries, the edge columns it reads, its messages, and round 0's active
    vertices (None: all)."""

    program: VertexProgram
    state: list[str]
    types: Mapping[str, str]
    edge_columns: frozenset[str]
    messages: Messages
    first_active: Callable[[Arrays], np.ndarray] | None = None


def _own_scope(arrays: Arrays, types: Mapping[str, str], message: Value, typing: Typing) -> Scope:
    """A vertex's own columns by name and the message by ``Pregel.msg()``'s names."""

    def lookup(name: str) -> Value:
        if name in MESSAGE_NAMES:
            return message
        if name.startswith(OLD):  # the value before the update (in ``active``)
            return kept(arrays, name, types[name[len(OLD) :]])
        if name not in types:
            raise Unsupported(f"an update reads {name!r}, which is not a vertex column")
        return kept(arrays, name, types[name])

    return Scope(lookup, len(message.data), typing.ansi)


def _check_updates(
    typing: Typing, types: Mapping[str, str], updates: Mapping[str, Expr], messages: Messages
) -> None:
    """Every update keeps its column's type (else the DataFrame path would change it
    between rounds, which the arrays cannot follow)."""
    extra = {name: messages.merged_type for name in MESSAGE_NAMES}
    extra |= {OLD + c: t for c, t in types.items()}
    for name, update in updates.items():
        got = evaluate(update, typing.empty(types, "an update", extra)).type
        if name == ACTIVE:
            if got not in ("boolean", "void"):
                raise Unsupported(f"the active expression is {got}, not boolean")
        elif got != types[name] and got != "void":
            raise Unsupported(
                f"the update of {name!r} is {got} where its initial value is {types[name]}; "
                "cast one to the other"
            )


def _carried(typing: Typing, messages: Messages, exprs: list[Expr], state: list[str]) -> list[str]:
    """The vertex columns a program reads besides its state (they ride along as arrays)."""
    named = messages.columns("src") | messages.columns("dst")
    for expr in exprs:
        named |= {r[len(OLD) :] if r.startswith(OLD) else r for r in refs(expr)}
    named -= set(MESSAGE_NAMES) | set(state)
    return sorted(n for n in named if n in typing.vertex)


def _state_types(typing: Typing, init: Mapping[str, Expr]) -> dict[str, str]:
    types = dict(typing.vertex)
    for name, expr in init.items():
        got = evaluate(expr, typing.empty(typing.vertex, "init", {})).type
        if got == "void":
            raise Unsupported(f"the initial value of {name!r} is an untyped null; cast it")
        types[name] = got
    return types


def compile_pregel(
    typing: Typing,
    init: Mapping[str, Column],
    update: Mapping[str, Column],
    send: tuple[Column | None, Column | None],
    aggregate: Callable[[Column], Column],
    active: Column | None,
) -> Compiled:
    """``pregel(init=, update=, send_to_dst=, send_to_src=, aggregate=, active=)`` as a
    ``VertexProgram``; ``Unsupported`` names what does not compile."""
    inits = {k: v for k, v in parsed(dict(init)).items() if v is not None}
    updates = {k: v for k, v in parsed(dict(update)).items() if v is not None}
    to_dst, to_src = (None if s is None else parse(s) for s in send)
    woken = None if active is None else parse(active)
    types = _state_types(typing, inits)
    messages = Messages.of(typing, types, to_dst, to_src, parse(aggregate(Pregel.msg())))
    _check_updates(typing, types, {**updates, **({ACTIVE: woken} if woken else {})}, messages)
    state = list(inits)
    carried = _carried(typing, messages, [*updates.values(), *([woken] if woken else [])], state)

    def start(table: Any) -> Arrays:
        arrays = vertex_arrays(table, carried, typing)
        for name, expr in inits.items():
            stored(arrays, name, initial(table, expr, typing), types[name])
        return arrays

    def apply(old: Arrays, merged: np.ndarray, reached: np.ndarray) -> tuple[Arrays, np.ndarray]:
        message = messages.received(merged, reached)
        new = dict(old)
        for name, expr in updates.items():
            value = evaluate(expr, _own_scope(old, types, message, typing))
            stored(new, name, value, types[name])
            for key in (name, name + VALID):
                new[key] = np.where(reached, new[key], old[key])
        if woken is None:
            wake = changed(new, old, state, types)
        else:
            both = {**new, **{OLD + k: v for k, v in old.items()}}
            value = evaluate(woken, _own_scope(both, types, message, typing))
            wake = value.data.astype(bool) & value.validity()
        return new, reached & wake

    return _compiled(typing, types, messages, state, carried, start, apply, "source")


def _compiled(
    typing: Typing,
    types: Mapping[str, str],
    messages: Messages,
    state: list[str],
    carried: list[str],
    start: Callable[[Any], Arrays],
    apply: Callable[..., Any],
    senders: str,
    first_active: Callable[[Arrays], np.ndarray] | None = None,
) -> Compiled:
    """The ``Compiled`` of a program's parts (shared by both Pregels)."""
    kept = [*carried, *state]
    program = VertexProgram(
        state={k: d for c in kept for k, d in ((c, DTYPES[types[c]]), (c + VALID, np.bool_))},
        init=start,
        apply=apply,
        send_to_dst=None
        if messages.to_dst is None
        else messages.sender(messages.to_dst, types, typing),
        send_to_src=None
        if messages.to_src is None
        else messages.sender(messages.to_src, types, typing),
        merge=MERGES[messages.aggregate],
        senders=senders,
        nan_sends=True,
    )
    edge_columns = frozenset(messages.columns("edge") - {"id"})
    for column in edge_columns:
        typing.column(typing.edge, column, "a message")
    return Compiled(program, state, types, edge_columns, messages, first_active)


@attrs.frozen
class BuilderRules:
    """The GraphFrames builder's rules besides its expressions."""

    skip_inactive: bool
    early_stopping: bool
    stop_if_all_inactive: bool


def compile_builder(
    typing: Typing,
    columns: list[tuple[str, Column, Column]],
    sends: list[tuple[str, Column]],
    aggregate: Column,
    active: tuple[Column, Column],
    rules: BuilderRules,
) -> Compiled:
    """GraphFrames' builder (``withVertexColumn``s, ``sendMsgTo...``, ``aggMsgs``, the
    initial and updated active expressions) as a ``VertexProgram``."""
    directions = [to for to, _ in sends]
    if len(set(directions)) < len(directions):
        raise Unsupported("two messages to the same end (the kernel engine takes one each way)")
    sent = {to: parse(message) for to, message in sends}
    inits = {name: parse(first) for name, first, _ in columns}
    initial_active, update_active = parse(active[0]), parse(active[1])
    types = _state_types(typing, {**inits, ACTIVE: initial_active})
    updates = {name: parse(update) for name, _, update in columns}
    updates[ACTIVE] = update_active
    messages = Messages.of(typing, types, sent.get("dst"), sent.get("src"), parse(aggregate))
    _check_updates(typing, types, updates, messages)
    state = [*inits, ACTIVE]
    carried = _carried(typing, messages, list(updates.values()), state)

    def start(table: Any) -> Arrays:
        arrays = vertex_arrays(table, carried, typing)
        for name, expr in {**inits, ACTIVE: initial_active}.items():
            stored(arrays, name, initial(table, expr, typing), types[name])
        return arrays

    def senders(arrays: Arrays) -> np.ndarray:
        if rules.skip_inactive:
            return arrays[ACTIVE].astype(bool) & arrays[ACTIVE + VALID]
        return np.ones(len(arrays[ACTIVE]), dtype=bool)

    def apply(old: Arrays, merged: np.ndarray, reached: np.ndarray) -> tuple[Any, ...]:
        if rules.early_stopping and not reached.any():
            return old, senders(old), False  # GraphFrames does not run this round
        message = messages.received(merged, reached)
        new = dict(old)
        for name, expr in updates.items():  # all read the columns before the update
            stored(new, name, evaluate(expr, _own_scope(old, types, message, typing)), types[name])
        awake = new[ACTIVE].astype(bool) & new[ACTIVE + VALID]
        return new, senders(new), not (rules.stop_if_all_inactive and not awake.any())

    sending = "either" if rules.skip_inactive else "source"
    return _compiled(typing, types, messages, state, carried, start, apply, sending, senders)


def run_compiled(
    g: Any,
    compiled: Compiled,
    typing: Typing,
    *,
    max_rounds: int | None,
    listen: Any,
    run_options: Mapping[str, Any],
    function: str,
) -> DataFrame:
    """Run ``compiled`` on graph ``g``: its vertices with the state columns."""
    ids, final = run_arrays(
        g,
        compiled.program,
        max_rounds=max_rounds,
        listen=listen,
        run_options=run_options,
        edges=edge_frame(g.edges, compiled.edge_columns, typing),
        first_active=compiled.first_active,
        notes=engine_note(None, function),
    )
    table = state_table(ids, final, compiled.types, compiled.state)
    return with_state(g.vertices, table, compiled.state)
