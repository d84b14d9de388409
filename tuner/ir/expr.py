"""Expressions of the tensor IR.

Nodes are frozen dataclasses; ``Var`` compares by identity so two loops may both call their variable ``i``.
Python operators build nodes (``i * 4 + j``); ``//`` and ``%`` are floor division and floor modulo, as in TIR.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, Union

from .dtype import DType, boolean, float32, int32

if TYPE_CHECKING:
    from .buffer import Buffer

ExprLike = Union["Expr", int, float]


class cached_property:
    """``functools.cached_property`` without its lock: computed on first access and kept in the instance's
    ``__dict__``, where later reads find it without calling this. Python 3.11's takes one lock per property,
    shared by all instances, on every first access (a million a compile); the values here are pure functions
    of a frozen node, so two threads that compute one at once store equal values."""

    def __init__(self, func):
        self.func, self.attrname, self.__doc__ = func, func.__name__, func.__doc__

    def __set_name__(self, owner, name):
        self.attrname = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.attrname] = self.func(instance)
        return value


class Expr:
    dtype: DType

    @cached_property
    def lanes(self) -> int:
        return self.dtype.lanes

    # arithmetic
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("floormod", self, o)
    def __rmod__(self, o): return binary("floormod", o, self)
    def __neg__(self): return binary("sub", const(0, self.dtype), self)
    # comparisons build IR; structural equality stays ``==`` (dataclass eq)
    def __lt__(self, o): return binary("lt", self, o)
    def __le__(self, o): return binary("le", self, o)
    def __gt__(self, o): return binary("gt", self, o)
    def __ge__(self, o): return binary("ge", self, o)
    def equal(self, o): return binary("eq", self, o)
    def not_equal(self, o): return binary("ne", self, o)
    def __and__(self, o): return binary("and", self, o)
    def __or__(self, o): return binary("or", self, o)

    def __bool__(self):
        raise TypeError("an IR expression has no truth value; use tuner.ir.select or an If statement")

    def __str__(self) -> str:
        from .printer import expr_str
        return expr_str(self)


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    name: str
    dtype: DType = int32

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Const(Expr):
    value: Union[int, float]
    dtype: DType = int32

    def __repr__(self) -> str:
        return repr(self.value)


ARITH = ("add", "sub", "mul", "div", "floordiv", "floormod", "min", "max")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC = ("and", "or")
_OPS = frozenset(ARITH + COMPARE + LOGIC)  # what Binary checks its op against, built once


@dataclass(frozen=True, repr=False)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    def __post_init__(self):
        if self.op not in _OPS:
            raise ValueError(f"unknown binary op {self.op!r}")

    @cached_property
    def dtype(self) -> DType:  # type: ignore[override]
        lanes = max(self.a.lanes, self.b.lanes)  # a scalar operand broadcasts, as in OpenCL C
        base = boolean if self.op in COMPARE + LOGIC else self.a.dtype
        return base.with_lanes(lanes)

    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Select(Expr):
    cond: Expr
    true_value: Expr
    false_value: Expr

    @cached_property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.true_value.dtype.with_lanes(max(self.true_value.lanes, self.false_value.lanes, self.cond.lanes))

    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Cast(Expr):
    dtype: DType
    value: Expr
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Ramp(Expr):
    """``[base, base+stride, ..., base+(lanes-1)*stride]``: the index of a vectorized loop."""
    base: Expr
    stride: Expr
    n: int

    @cached_property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.base.dtype.with_lanes(self.n)

    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Broadcast(Expr):
    value: Expr
    n: int

    @cached_property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.value.dtype.with_lanes(self.n)

    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class BufferLoad(Expr):
    """A read of ``buffer[indices]``. RFC 0012: an N-lane index into M-lane elements yields N*M lanes;
    half storage is read as float. Kernel-scoped arrays (``private``, ``local``) hold their dtype as declared
    (a ``float16x4`` accumulator or tile is ``half4`` arithmetic)."""
    buffer: "Buffer"
    indices: tuple

    @cached_property
    def dtype(self) -> DType:  # type: ignore[override]
        lanes = max((i.lanes for i in self.indices), default=1)
        held = self.buffer.dtype if self.buffer.scope in ("private", "local") else self.buffer.dtype.compute
        return held.with_lanes(lanes * self.buffer.dtype.lanes)

    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class Call(Expr):
    """An intrinsic: ``texture2d_load(buf, x, y)``, math functions (``exp``, ``fmax``...), ``vload``."""
    name: str
    args: tuple
    dtype: DType
    __repr__ = Expr.__str__


@dataclass(frozen=True, repr=False)
class ExtractLane(Expr):
    """One lane of a vector: ``v.x`` ... ``v.w`` (texture RFC T1: single-lane reads for broadcasting)."""
    value: Expr
    lane: int

    @cached_property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.value.dtype.element

    __repr__ = Expr.__str__


def const(value, dtype: "DType | str | None" = None) -> Const:
    if dtype is None:
        dtype = float32 if isinstance(value, float) else int32
    dtype = DType.parse(dtype).element
    return Const(float(value) if dtype.is_float else int(value), dtype)


def _promote(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    """Python numbers take the other side's type; an int operand of a float expression is cast."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        raise TypeError("at least one operand must be an IR expression")
    if not isinstance(a, Expr):
        a = const(a, b.dtype.element if not (isinstance(a, float) and not b.dtype.is_float) else float32)
    if not isinstance(b, Expr):
        b = const(b, a.dtype.element if not (isinstance(b, float) and not a.dtype.is_float) else float32)
    if a.dtype.is_float != b.dtype.is_float:
        if a.dtype.is_float:
            b = Cast(float32.with_lanes(b.lanes), b)
        else:
            a = Cast(float32.with_lanes(a.lanes), a)
    a, b = _match_lanes(a, b)
    return a, b


def _match_lanes(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    if a.lanes != b.lanes:
        if a.lanes == 1:
            a = Broadcast(a, b.lanes)
        elif b.lanes == 1:
            b = Broadcast(b, a.lanes)
        else:
            raise ValueError(f"lane mismatch: {a.dtype} vs {b.dtype}")
    return a, b


def binary(op: str, a: ExprLike, b: ExprLike) -> Binary:
    a, b = _promote(a, b)
    return Binary(op, a, b)


def select(cond: Expr, t: ExprLike, f: ExprLike) -> Select:
    t, f = _promote(t, f)
    return Select(cond, t, f)


def min_(a: ExprLike, b: ExprLike) -> Binary:
    return binary("min", a, b)


def max_(a: ExprLike, b: ExprLike) -> Binary:
    return binary("max", a, b)


def as_expr(x: ExprLike) -> Expr:
    return x if isinstance(x, Expr) else const(x)


def call(name: str, args: Sequence[ExprLike], dtype: "DType | str") -> Call:
    return Call(name, tuple(as_expr(a) for a in args), DType.parse(dtype))
