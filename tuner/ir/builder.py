"""A small builder for loop nests (in the style of TVM's ir_builder):

    b = Builder()
    with b.loop("i", 32, "group.0") as i:
        with b.loop("c", 4, "vectorized") as c:
            b.store(Y, (i, c), X[i, c] + 1.0)
    kernel = b.kernel("addone", [X, Y])
"""
from __future__ import annotations

from contextlib import contextmanager

from .buffer import Buffer, buffer
from .expr import Expr, Var, as_expr
from .kernel import Kernel
from .stmt import THREAD_TAGS, Allocate, Barrier, BufferStore, Evaluate, For, If, Let, seq


class Builder:
    def __init__(self):
        self._scopes: list[list] = [[]]

    def _emit(self, item):
        self._scopes[-1].append(item)

    def _close(self):
        """Fold a scope's items; an allocation or let wraps everything emitted after it."""
        items = self._scopes.pop()
        body = None
        tail: list = []
        for item in reversed(items):
            if isinstance(item, tuple):
                kind, *args = item
                inner = seq(*reversed(tail)) if tail else seq()
                inner = Allocate(args[0], inner) if kind == "alloc" else Let(args[0], args[1], inner)
                tail = [inner]
            else:
                tail.append(item)
        body = seq(*reversed(tail))
        return body

    @contextmanager
    def loop(self, name: str, extent: int, kind: str = "serial"):
        """``kind``: serial, unrolled, vectorized, or a thread tag ``group.0``..``local.2``."""
        var = Var(name)
        self._scopes.append([])
        yield var
        body = self._close()
        if kind in THREAD_TAGS:
            self._emit(For(var, int(extent), "thread", body, kind))
        else:
            self._emit(For(var, int(extent), kind, body))

    @contextmanager
    def block(self):
        """A statement group whose lets and allocations end with it (it emits no C braces: their names must
        stay unique). Long straight-line code keeps its let nesting, and so the IR's depth, bounded."""
        self._scopes.append([])
        yield
        self._emit(self._close())

    @contextmanager
    def if_(self, cond: Expr):
        self._scopes.append([])
        yield
        self._emit(If(cond, self._close()))

    def store(self, buf: Buffer, indices, value) -> None:
        if not isinstance(indices, (tuple, list)):
            indices = (indices,)
        self._emit(BufferStore(buf, as_expr(value) if not isinstance(value, Expr) else value,
                               tuple(as_expr(i) for i in indices)))

    def allocate(self, name: str, shape, dtype="float32", scope: str = "private") -> Buffer:
        buf = buffer(name, shape, dtype, scope)
        self._emit(("alloc", buf))
        return buf

    def let(self, name: str, value) -> Var:
        value = as_expr(value)
        var = Var(name, value.dtype)
        self._emit(("let", var, value))
        return var

    def barrier(self, fence: str = "local") -> None:
        if fence not in ("local", "global"):
            raise ValueError(f"barrier fence {fence!r}: local or global")
        self._emit(Barrier(fence))

    def evaluate(self, value: Expr) -> None:
        """A call for its effect (``mem_fence``)."""
        self._emit(Evaluate(value))

    def get(self):
        if len(self._scopes) != 1:
            raise RuntimeError("Builder.get() inside an open loop or if")
        return self._close()

    def kernel(self, name: str, params) -> Kernel:
        return Kernel(name, tuple(params), self.get())
