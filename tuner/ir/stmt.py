"""Statements of the tensor IR: enough to write convolution loop nests."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .expr import Expr, Var

if TYPE_CHECKING:
    from .buffer import Buffer

# Loop kinds. "thread" loops are bound to an OpenCL work-group or work-item axis given by ``thread``.
LOOP_KINDS = ("serial", "unrolled", "vectorized", "thread")
THREAD_TAGS = tuple(f"{k}.{d}" for k in ("group", "local") for d in range(3))


class Stmt:
    def __str__(self) -> str:
        from .printer import stmt_str
        return stmt_str(self)


@dataclass(frozen=True, repr=False)
class For(Stmt):
    var: Var
    extent: int
    kind: str
    body: Stmt
    thread: Optional[str] = None

    def __post_init__(self):
        if self.kind not in LOOP_KINDS:
            raise ValueError(f"loop kind {self.kind!r} not in {LOOP_KINDS}")
        if (self.kind == "thread") != (self.thread is not None):
            raise ValueError("a thread loop needs a thread tag and only thread loops have one")
        if self.thread is not None and self.thread not in THREAD_TAGS:
            raise ValueError(f"thread tag {self.thread!r} not in {THREAD_TAGS}")
        if not isinstance(self.extent, int) or self.extent < 1:
            raise ValueError(f"loop {self.var.name}: extent must be a positive int, got {self.extent!r}")

    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class BufferStore(Stmt):
    buffer: "Buffer"
    value: Expr
    indices: tuple
    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class Allocate(Stmt):
    """A kernel-scoped array: ``private`` (registers, e.g. accumulators) or ``local`` (work-group shared)."""
    buffer: "Buffer"
    body: Stmt
    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class Seq(Stmt):
    stmts: tuple
    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class If(Stmt):
    cond: Expr
    then: Stmt
    otherwise: Optional[Stmt] = None
    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class Let(Stmt):
    var: Var
    value: Expr
    body: Stmt
    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class Evaluate(Stmt):
    """An expression run for its effect: ``texture2d_store(...)``."""
    value: Expr
    __repr__ = Stmt.__str__


@dataclass(frozen=True, repr=False)
class Barrier(Stmt):
    """``barrier(CLK_LOCAL_MEM_FENCE)``: needed when work-items share ``local`` arrays. ``fence="global"`` orders
    the work-group's global memory too (``| CLK_GLOBAL_MEM_FENCE``): what one work-item stored before it, the
    others read after it (``reduction.last_group_statistics``' slots)."""
    fence: str = "local"
    __repr__ = Stmt.__str__


def seq(*stmts: Stmt) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
