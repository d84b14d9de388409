"""Generic traversal: ``Mutator`` rebuilds a tree bottom-up, ``visit`` walks it. Passes subclass ``Mutator``
and override ``visit_<NodeName>``; unchanged subtrees are returned as the same objects."""
from __future__ import annotations

from typing import Callable

from .buffer import Buffer
from .expr import (Binary, Broadcast, BufferLoad, Call, Cast, Const, Expr, ExtractLane, Ramp, Select, Var)
from .stmt import Allocate, Barrier, BufferStore, Evaluate, For, If, Let, Seq, Stmt


class Mutator:
    def visit(self, node):
        try:
            fn = _DISPATCH[type(self), type(node)]
        except KeyError:  # first visit of this node type by this pass: look its visit_<NodeName> up once
            fn = _DISPATCH[type(self), type(node)] = _visitor(type(self), type(node))
        return fn(self, node)

    def visit_buffer(self, buf):
        return buf

    def _arg(self, a):
        return self.visit_buffer(a) if isinstance(a, Buffer) else self.visit(a)

    # children of each node, in constructor order; rebuild only when a child changed
    def generic(self, node):
        try:
            rebuild = _GENERIC[type(node)]
        except KeyError:
            raise TypeError(f"unknown IR node {type(node).__name__}") from None
        return rebuild(self, node)


def _leaf(m, n):
    return n


def _binary(m, n):
    a, b = m.visit(n.a), m.visit(n.b)
    return n if a is n.a and b is n.b else Binary(n.op, a, b)


def _select(m, n):
    c, t, f = m.visit(n.cond), m.visit(n.true_value), m.visit(n.false_value)
    return n if c is n.cond and t is n.true_value and f is n.false_value else Select(c, t, f)


def _cast(m, n):
    v = m.visit(n.value)
    return n if v is n.value else Cast(n.dtype, v)


def _ramp(m, n):
    base, stride = m.visit(n.base), m.visit(n.stride)
    return n if base is n.base and stride is n.stride else Ramp(base, stride, n.n)


def _broadcast(m, n):
    v = m.visit(n.value)
    return n if v is n.value else Broadcast(v, n.n)


def _buffer_load(m, n):
    buf, idx = m.visit_buffer(n.buffer), tuple(m.visit(i) for i in n.indices)
    return n if buf is n.buffer and _same(idx, n.indices) else BufferLoad(buf, idx)


def _call(m, n):
    args = tuple(m._arg(a) for a in n.args)
    return n if _same(args, n.args) else Call(n.name, args, n.dtype)


def _extract_lane(m, n):
    v = m.visit(n.value)
    return n if v is n.value else ExtractLane(v, n.lane)


def _for(m, n):
    body = m.visit(n.body)
    return n if body is n.body else For(n.var, n.extent, n.kind, body, n.thread)


def _buffer_store(m, n):
    buf, value, idx = m.visit_buffer(n.buffer), m.visit(n.value), tuple(m.visit(i) for i in n.indices)
    return n if buf is n.buffer and value is n.value and _same(idx, n.indices) else BufferStore(buf, value, idx)


def _allocate(m, n):
    buf, body = m.visit_buffer(n.buffer), m.visit(n.body)
    return n if buf is n.buffer and body is n.body else Allocate(buf, body)


def _seq(m, n):
    stmts = tuple(m.visit(s) for s in n.stmts)
    return n if _same(stmts, n.stmts) else Seq(stmts)


def _if(m, n):
    cond, then = m.visit(n.cond), m.visit(n.then)
    otherwise = None if n.otherwise is None else m.visit(n.otherwise)
    return n if cond is n.cond and then is n.then and otherwise is n.otherwise else If(cond, then, otherwise)


def _evaluate(m, n):
    v = m.visit(n.value)
    return n if v is n.value else Evaluate(v)


def _let(m, n):
    value, body = m.visit(n.value), m.visit(n.body)
    return n if value is n.value and body is n.body else Let(n.var, value, body)


# what ``Mutator.generic`` does with each node type: visit the children in constructor order and rebuild the
# node only when one changed (unchanged subtrees stay the same objects)
_GENERIC = {Var: _leaf, Const: _leaf, Barrier: _leaf, Binary: _binary, Select: _select, Cast: _cast, Ramp: _ramp,
            Broadcast: _broadcast, BufferLoad: _buffer_load, Call: _call, ExtractLane: _extract_lane, For: _for,
            BufferStore: _buffer_store, Allocate: _allocate, Seq: _seq, If: _if, Evaluate: _evaluate, Let: _let}


_DISPATCH: dict = {}  # (Mutator subclass, node type) -> its visit_<NodeName>, else generic: what ``visit`` calls


def _visitor(mutator: type, node: type):
    """The function ``Mutator.visit`` calls for a ``node`` of this type: the class's ``visit_<NodeName>``, else
    ``generic`` (looked up on the class: no pass sets a visitor on an instance)."""
    return getattr(mutator, "visit_" + node.__name__, None) or mutator.generic


def _same(a: tuple, b: tuple) -> bool:
    """The tuples (indices, args, stmts) that ``generic`` rebuilds hold the same objects, element by element."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


_ARGS = {
    Binary: ("op", "a", "b"), Select: ("cond", "true_value", "false_value"), Cast: ("dtype", "value"),
    Ramp: ("base", "stride", "n"), Broadcast: ("value", "n"), BufferLoad: ("buffer", "indices"),
    Call: ("name", "args", "dtype"), ExtractLane: ("value", "lane"),
    For: ("var", "extent", "kind", "body", "thread"), BufferStore: ("buffer", "value", "indices"),
    Allocate: ("buffer", "body"), Seq: ("stmts",), If: ("cond", "then", "otherwise"), Let: ("var", "value", "body"),
    Evaluate: ("value",),
}


def _children(node):
    if isinstance(node, (Var, Const, Barrier)):
        return ()
    if isinstance(node, (Seq,)):
        return node.stmts
    out = []
    for f in _ARGS[type(node)]:
        v = getattr(node, f)
        if isinstance(v, (Expr, Stmt)):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(x for x in v if isinstance(x, (Expr, Stmt)))
    return out


def visit(node, fn: Callable) -> None:
    """Call ``fn`` on every node, parents before children."""
    stack = [node]
    while stack:
        n = stack.pop()
        fn(n)
        stack.extend(reversed(list(_children(n))))


class _Substitute(Mutator):
    def __init__(self, env: dict):
        self.env = env

    def visit_Var(self, v):
        return self.env.get(v, v)


def substitute(node, env: dict):
    """Replace variables by expressions."""
    return _Substitute(env).visit(node) if env else node


class ReplaceBuffers(Mutator):
    """Swap buffers (old -> new) everywhere, rewriting indices with ``index_fn(old, indices)`` when given."""

    def __init__(self, mapping: dict, index_fn: Callable | None = None):
        self.mapping, self.index_fn = mapping, index_fn

    def visit_buffer(self, buf):
        return self.mapping.get(buf, buf)

    def _indices(self, buf, indices):
        indices = tuple(self.visit(i) for i in indices)
        if buf in self.mapping and self.index_fn is not None:
            indices = tuple(self.index_fn(buf, indices))
        return indices

    def visit_BufferLoad(self, e):
        return BufferLoad(self.visit_buffer(e.buffer), self._indices(e.buffer, e.indices))

    def visit_BufferStore(self, s):
        return BufferStore(self.visit_buffer(s.buffer), self.visit(s.value), self._indices(s.buffer, s.indices))
