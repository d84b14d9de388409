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
        if isinstance(node, (Var, Const, Barrier)):
            return node
        if isinstance(node, Binary):
            return _rebuild(node, Binary, node.op, self.visit(node.a), self.visit(node.b))
        if isinstance(node, Select):
            return _rebuild(node, Select, self.visit(node.cond), self.visit(node.true_value), self.visit(node.false_value))
        if isinstance(node, Cast):
            return _rebuild(node, Cast, node.dtype, self.visit(node.value))
        if isinstance(node, Ramp):
            return _rebuild(node, Ramp, self.visit(node.base), self.visit(node.stride), node.n)
        if isinstance(node, Broadcast):
            return _rebuild(node, Broadcast, self.visit(node.value), node.n)
        if isinstance(node, BufferLoad):
            return _rebuild(node, BufferLoad, self.visit_buffer(node.buffer), tuple(self.visit(i) for i in node.indices))
        if isinstance(node, Call):
            return _rebuild(node, Call, node.name, tuple(self._arg(a) for a in node.args), node.dtype)
        if isinstance(node, ExtractLane):
            return _rebuild(node, ExtractLane, self.visit(node.value), node.lane)
        if isinstance(node, For):
            return _rebuild(node, For, node.var, node.extent, node.kind, self.visit(node.body), node.thread)
        if isinstance(node, BufferStore):
            return _rebuild(node, BufferStore, self.visit_buffer(node.buffer), self.visit(node.value),
                            tuple(self.visit(i) for i in node.indices))
        if isinstance(node, Allocate):
            return _rebuild(node, Allocate, self.visit_buffer(node.buffer), self.visit(node.body))
        if isinstance(node, Seq):
            return _rebuild(node, Seq, tuple(self.visit(s) for s in node.stmts))
        if isinstance(node, If):
            return _rebuild(node, If, self.visit(node.cond), self.visit(node.then),
                            None if node.otherwise is None else self.visit(node.otherwise))
        if isinstance(node, Evaluate):
            return _rebuild(node, Evaluate, self.visit(node.value))
        if isinstance(node, Let):
            return _rebuild(node, Let, node.var, self.visit(node.value), self.visit(node.body))
        raise TypeError(f"unknown IR node {type(node).__name__}")


_DISPATCH: dict = {}  # (Mutator subclass, node type) -> its visit_<NodeName>, else generic: what ``visit`` calls


def _visitor(mutator: type, node: type):
    """The function ``Mutator.visit`` calls for a ``node`` of this type: the class's ``visit_<NodeName>``, else
    ``generic`` (looked up on the class: no pass sets a visitor on an instance)."""
    return getattr(mutator, "visit_" + node.__name__, None) or mutator.generic


def _rebuild(old, cls, *args):
    try:
        names = _FIELDS[type(old), cls]
    except KeyError:
        names = _FIELDS[type(old), cls] = tuple(f for f in old.__dataclass_fields__ if f in _ARGS[cls])
    for a, f in zip(args, names):
        if not _same(a, getattr(old, f)):
            return cls(*args)
    return old


_FIELDS: dict = {}  # (node type, class rebuilt) -> the fields ``_rebuild`` compares, in constructor order


def _same(a, b) -> bool:
    """Identity, element by element for the tuples (indices, args, stmts) that ``generic`` rebuilds."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a is b


_ARGS = {
    Binary: ("op", "a", "b"), Select: ("cond", "true_value", "false_value"), Cast: ("dtype", "value"),
    Ramp: ("base", "stride", "n"), Broadcast: ("value", "n"), BufferLoad: ("buffer", "indices"),
    Call: ("name", "args", "dtype"), ExtractLane: ("value", "lane"),
    For: ("var", "extent", "kind", "body", "thread"), BufferStore: ("buffer", "value", "indices"),
    Allocate: ("buffer", "body"), Seq: ("stmts",), If: ("cond", "then", "otherwise"), Let: ("var", "value", "body"), Evaluate: ("value",),
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
