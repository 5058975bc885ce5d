"""Motif finding, GraphFrames' ``find``: structural patterns as joins of edges and vertices.

A pattern is terms separated by ``;``. A term is an edge ``(a)-[e]->(b)`` or a lone
vertex ``(a)``; a name may be left out (``()-[]->(b)``, ``(a)-[]->()``) to match without a
column in the result; a name used twice is the same vertex (``(a)-[]->(b); (b)-[]->(a)``).
A term with ``!`` in front (``!(a)-[]->(b)``) keeps only rows with no such edge; its
vertices must be named in positive terms. The result has a column per named element, in
order of appearance: vertices as structs of the vertex columns, edges of the edge columns.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from iterflow.graph.graphs import GraphError, as_graph, nested

_VERTEX = r"\(\s*(\w*)\s*\)"
_EDGE_TERM = re.compile(rf"^(!?)\s*{_VERTEX}\s*-\s*\[\s*(\w*)\s*\]\s*->\s*{_VERTEX}$")
_VERTEX_TERM = re.compile(rf"^{_VERTEX}$")


@attrs.frozen
class Term:
    """One term of a pattern: ``src`` -[``edge``]-> ``dst`` (``edge`` None for a lone
    vertex ``src``); empty names are anonymous."""

    src: str
    edge: str | None
    dst: str
    negated: bool


def parse(pattern: str) -> list[Term]:
    """The terms of ``pattern``, or a ``GraphError`` naming the term that is not one."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise GraphError(f"find() takes a motif such as '(a)-[e]->(b)', got {pattern!r}")
    terms = []
    for text in (t.strip() for t in pattern.split(";")):
        if not text:
            continue
        edge = _EDGE_TERM.match(text)
        vertex = _VERTEX_TERM.match(text)
        if edge:
            terms.append(Term(edge[2], edge[3], edge[4], edge[1] == "!"))
        elif vertex and vertex[1]:
            terms.append(Term(vertex[1], None, vertex[1], False))
        else:
            raise GraphError(
                f"find({pattern!r}): {text!r} is not a term; terms are '(a)-[e]->(b)', "
                "'(a)' or '!(a)-[]->(b)', names optional on edges, separated by ';'"
            )
    _check_names(pattern, terms)
    return terms


def _check_names(pattern: str, terms: list[Term]) -> None:
    """Edge names are used once and differ from vertex names; negated terms only refer to
    vertices that positive terms name."""
    edges = [t.edge for t in terms if t.edge]
    vertices = {n for t in terms if not t.negated for n in (t.src, t.dst) if n}
    repeated = {e for e in edges if edges.count(e) > 1} | (set(edges) & vertices)
    if repeated:
        raise GraphError(f"find({pattern!r}): the name(s) {sorted(repeated)} are used twice")
    for term in terms:
        if term.negated and (not term.src or not term.dst or {term.src, term.dst} - vertices):
            raise GraphError(
                f"find({pattern!r}): a negated term's vertices must be named in a positive term"
            )
        if term.negated and term.edge:
            raise GraphError(f"find({pattern!r}): a negated term's edge has no name ('[]')")


@attrs.define
class _Matches:
    """The rows found so far, and which vertex names they bind."""

    vertices: DataFrame
    edges: DataFrame
    rows: DataFrame | None = None
    bound: set[str] = attrs.Factory(set)

    def add(self, part: DataFrame, condition: Column | None) -> None:
        if self.rows is None:
            self.rows = part
        elif condition is None:
            self.rows = self.rows.crossJoin(part)
        else:
            self.rows = self.rows.join(part, condition)

    def bind(self, name: str, end: Column) -> None:
        """Vertex ``name`` is the one with id ``end``: joined in, or checked if bound."""
        assert self.rows is not None
        if name in self.bound:
            self.rows = self.rows.where(F.col(f"`{name}`.id") == end)
            return
        self.rows = self.rows.join(
            self.vertices.select(nested(self.vertices, name)), F.col(f"`{name}`.id") == end
        )
        self.bound.add(name)

    def edge_term(self, term: Term, column: str) -> None:
        part = self.edges.select(nested(self.edges, column))
        on = [
            F.col(f"`{name}`.id") == F.col(f"`{column}`.{end}")
            for name, end in ((term.src, "src"), (term.dst, "dst"))
            if name in self.bound
        ]
        condition = None
        for c in on:
            condition = c if condition is None else condition & c
        self.add(part, condition)
        for name, end in ((term.src, "src"), (term.dst, "dst")):
            if name:
                self.bind(name, F.col(f"`{column}`.{end}"))

    def vertex_term(self, name: str) -> None:
        if name not in self.bound:
            self.add(self.vertices.select(nested(self.vertices, name)), None)
            self.bound.add(name)

    def without(self, term: Term) -> None:
        """Rows with no edge from ``term.src`` to ``term.dst``."""
        assert self.rows is not None
        ends = self.edges.select(F.col("src").alias("_no_src"), F.col("dst").alias("_no_dst"))
        self.rows = self.rows.join(
            ends,
            (F.col(f"`{term.src}`.id") == F.col("_no_src"))
            & (F.col(f"`{term.dst}`.id") == F.col("_no_dst")),
            "left_anti",
        )


def find(graph: Any, pattern: str) -> DataFrame:
    """Every match of ``pattern`` in ``graph``: a row per match, a column per named vertex
    and edge (see the module's description)."""
    g = as_graph(graph)
    terms = parse(pattern)
    if all(t.negated for t in terms):
        raise GraphError(f"find({pattern!r}) needs at least one positive term")
    matches = _Matches(g.vertices, g.edges)
    names: list[str] = []
    for i, term in enumerate(t for t in terms if not t.negated):
        if term.edge is None:
            matches.vertex_term(term.src)
        else:
            matches.edge_term(term, term.edge or f"_edge{i}")
        names += [n for n in (term.src, term.edge, term.dst) if n and n not in names]
    for term in terms:
        if term.negated:
            matches.without(term)
    assert matches.rows is not None
    return matches.rows.select(*(F.col(f"`{n}`") for n in names))
