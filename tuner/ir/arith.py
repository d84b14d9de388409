"""Integer arithmetic: constant bounds of index expressions and a simplifier that uses loop bounds.

The simplifier puts integer index expressions in a linear form ``sum(coeff * atom) + const`` (a vector
``Ramp(b, s, n)`` is ``b + s*lane`` with ``lane`` in ``[0, n)``), which is what lets it prove
``(4*cb + lane) // 4 == cb`` and ``(4*cb + lane) % 4 == lane`` -- the step that turns a channel index through
an NCHW4c layout back into one RGBA pixel access.
"""
from __future__ import annotations

from .dtype import boolean, int32
from .expr import (Binary, Broadcast, BufferLoad, Call, Cast, Const, Expr, Ramp, Select, Var, const)
from .functor import Mutator, substitute
from .stmt import For, If, Let, Seq, Stmt

INF = 1 << 62
_LANE = Var("lane")  # the lane number of a vector expression, only inside linear forms


def const_int_bound(e: Expr, bounds: dict) -> tuple[int, int]:
    """Inclusive (lo, hi) over all lanes of an integer expression; ``bounds`` maps Var -> (lo, hi)."""
    if isinstance(e, Const):
        return (int(e.value), int(e.value)) if not e.dtype.is_float else (-INF, INF)
    if isinstance(e, Var):
        return bounds.get(e, (-INF, INF))
    if isinstance(e, Broadcast):
        return const_int_bound(e.value, bounds)
    if isinstance(e, Ramp):
        lo, hi = const_int_bound(e.base, bounds)
        slo, shi = const_int_bound(e.stride, bounds)
        ext = [slo * (e.n - 1), shi * (e.n - 1), 0]
        return _clamp(lo + min(ext), hi + max(ext))
    if isinstance(e, Select):
        a, b = const_int_bound(e.true_value, bounds), const_int_bound(e.false_value, bounds)
        return min(a[0], b[0]), max(a[1], b[1])
    if isinstance(e, Cast) and not e.dtype.is_float:
        return const_int_bound(e.value, bounds)
    if isinstance(e, Binary) and not e.dtype.is_float:
        if e.op in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or"):
            return 0, 1
        a, b = const_int_bound(e.a, bounds), const_int_bound(e.b, bounds)
        if e.op == "add":
            return _clamp(a[0] + b[0], a[1] + b[1])
        if e.op == "sub":
            return _clamp(a[0] - b[1], a[1] - b[0])
        if e.op == "mul":
            p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
            return _clamp(min(p), max(p))
        if e.op == "min":
            return min(a[0], b[0]), min(a[1], b[1])
        if e.op == "max":
            return max(a[0], b[0]), max(a[1], b[1])
        if e.op in ("floordiv", "floormod") and b[0] == b[1] and b[0] > 0:
            k = b[0]
            if e.op == "floordiv":
                return _clamp(a[0] // k if a[0] > -INF else -INF, a[1] // k if a[1] < INF else INF)
            if a[0] // k == a[1] // k and abs(a[0]) < INF and abs(a[1]) < INF:
                return a[0] % k, a[1] % k
            return 0, k - 1
    return -INF, INF


def _clamp(lo, hi):
    return max(lo, -INF), min(hi, INF)


# -- linear forms ------------------------------------------------------------------------------
class _NotLinear(Exception):
    pass


def linear_form(e: Expr) -> tuple[dict, int]:
    """``e`` as ({atom: coeff}, const). Atoms are scalar; a Ramp contributes ``stride * _LANE``."""
    if isinstance(e, Const):
        if e.dtype.is_float:
            raise _NotLinear
        return {}, int(e.value)
    if isinstance(e, Broadcast):
        return linear_form(e.value)
    if isinstance(e, Ramp):
        if not isinstance(e.stride, Const):
            raise _NotLinear
        terms, c = linear_form(e.base)
        return _add(terms, {_LANE: int(e.stride.value)}), c
    if isinstance(e, Binary) and e.op in ("add", "sub") and not e.dtype.is_float:
        (ta, ca), (tb, cb) = linear_form(e.a), linear_form(e.b)
        sign = 1 if e.op == "add" else -1
        return _add(ta, {k: sign * v for k, v in tb.items()}), ca + sign * cb
    if isinstance(e, Binary) and e.op == "mul" and not e.dtype.is_float:
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(_scalar(y), Const):
                k = int(_scalar(y).value)
                t, c = linear_form(x)
                return {a: v * k for a, v in t.items() if v * k}, c * k
    if e.dtype.is_float or e.lanes != 1:
        raise _NotLinear
    return {e: 1}, 0


def _scalar(e):
    return e.value if isinstance(e, Broadcast) else e


def _merge_divmod(terms: dict, c: int) -> tuple[dict, int]:
    """``m * k * (x // k) + m * (x % k)`` -> ``m * x`` in a linear form (floor division: exact for every x): the
    flattened index of a view that split ``x`` into rows of ``k`` and joins them again (a reshape (H, W) -> H * W
    of a token view), which otherwise reaches the kernel as ``x / 7 * 7 + x % 7`` and bounds as if it could pass
    ``x``."""
    merged = True
    while merged:
        merged = False
        for atom, m in list(terms.items()):
            if not (isinstance(atom, Binary) and atom.op == "floormod" and isinstance(_scalar(atom.b), Const)):
                continue
            k = int(_scalar(atom.b).value)
            div = Binary("floordiv", atom.a, atom.b)
            if k > 0 and terms.get(div) == m * k:
                tx, cx = linear_form(atom.a)
                rest = {a: v for a, v in terms.items() if a != atom and a != div}
                terms, c, merged = _add(rest, {a: v * m for a, v in tx.items()}), c + cx * m, True
                break
    return terms, c


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
        if out[k] == 0:
            del out[k]
    return out


def from_linear(terms: dict, c: int, lanes: int) -> Expr:
    # the nodes are built directly, not with Expr's operators: atoms are scalar integers, so the operators'
    # promotion would only turn each Python int into a constant of the other side's type
    lane = terms.get(_LANE, 0)
    out = None
    for atom, k in terms.items():
        if atom is _LANE:
            continue
        if out is None:
            out = atom if k == 1 else Binary("mul", atom, const(k, atom.dtype))
        elif k > 0:
            out = Binary("add", out, atom if k == 1 else Binary("mul", atom, const(k, atom.dtype)))
        else:
            out = Binary("sub", out, atom if k == -1 else Binary("mul", atom, const(-k, atom.dtype)))
    if out is None:
        out = const(c)
    elif c:
        out = Binary("add", out, const(c, out.dtype)) if c > 0 else Binary("sub", out, const(-c, out.dtype))
    if lanes == 1:
        return out
    return Ramp(out, const(lane), lanes) if lane else Broadcast(out, lanes)


def _bound_of_terms(terms: dict, bounds: dict, lanes: int) -> tuple[int, int]:
    lo = hi = 0
    for atom, k in terms.items():
        a = (0, lanes - 1) if atom is _LANE else const_int_bound(atom, bounds)
        lo += min(a[0] * k, a[1] * k)
        hi += max(a[0] * k, a[1] * k)
    return _clamp(lo, hi)


def divides(k: int, e: Expr) -> bool:
    """True when ``e`` is provably a multiple of ``k`` (all lanes' base: the lane term is ignored)."""
    try:
        terms, c = linear_form(e)
    except _NotLinear:
        return False
    return c % k == 0 and all(v % k == 0 for a, v in terms.items() if a is not _LANE)


# -- the simplifier ------------------------------------------------------------------------------
class Simplifier(Mutator):
    def __init__(self, bounds: dict | None = None):
        self.bounds = dict(bounds or {})

    def bound(self, e):
        return const_int_bound(e, self.bounds)

    def visit_For(self, s: For):
        self.bounds[s.var] = (0, s.extent - 1)
        if s.extent == 1 and s.kind != "thread":
            return self.visit(substitute(s.body, {s.var: const(0)}))
        body = self.visit(s.body)
        return s if body is s.body else For(s.var, s.extent, s.kind, body, s.thread)

    def visit_Let(self, s: Let):
        value = self.visit(s.value)
        if isinstance(value, (Const, Var)):
            return self.visit(substitute(s.body, {s.var: value}))
        self.bounds[s.var] = self.bound(value) if not value.dtype.is_float else (-INF, INF)
        return Let(s.var, value, self.visit(s.body))

    def visit_If(self, s: If):
        cond = self.visit(s.cond)
        if isinstance(cond, Const):
            branch = s.then if cond.value else s.otherwise
            return self.visit(branch) if branch is not None else Seq(())
        return If(cond, self.visit(s.then), None if s.otherwise is None else self.visit(s.otherwise))

    def visit_Seq(self, s: Seq):
        stmts = [self.visit(x) for x in s.stmts]
        flat = []
        for x in stmts:
            flat.extend(x.stmts if isinstance(x, Seq) else [x])
        return flat[0] if len(flat) == 1 else Seq(tuple(flat))

    def visit_Select(self, e: Select):
        cond = self.visit(e.cond)
        t, f = self.visit(e.true_value), self.visit(e.false_value)
        if isinstance(cond, Const):
            return t if cond.value else f
        return Select(cond, t, f)

    def visit_Binary(self, e: Binary):
        a, b = self.visit(e.a), self.visit(e.b)
        e = e if (a is e.a and b is e.b) else Binary(e.op, a, b)
        if isinstance(a, Const) and isinstance(b, Const):
            return _fold(e)
        if e.op in ("and", "or"):  # a decided operand: true && x -> x, false && x -> false
            for known, other in ((a, b), (b, a)):
                if isinstance(known, Const) and (other.lanes == 1 or bool(known.value) == (e.op == "and")):
                    return other if bool(known.value) == (e.op == "and") else known
            return e
        if e.dtype.is_float:
            return e
        if e.op in ("lt", "le", "gt", "ge", "eq", "ne"):
            return self._compare(e)
        if e.op in ("min", "max"):
            (alo, ahi), (blo, bhi) = self.bound(a), self.bound(b)
            if e.op == "min":
                return a if ahi <= blo else b if bhi <= alo else e
            return a if alo >= bhi else b if blo >= ahi else e
        if e.op in ("add", "sub", "mul"):
            return self._canonical(e)
        if e.op in ("floordiv", "floormod"):
            return self._divmod(e)
        return e

    def _canonical(self, e):
        try:
            terms, c = _merge_divmod(*linear_form(e))
        except _NotLinear:
            return e
        return from_linear(terms, c, e.lanes)

    def _divmod(self, e: Binary):
        k = _scalar(e.b)
        if not isinstance(k, Const) or k.value <= 0:
            return e
        k = int(k.value)
        if k == 1:
            return self._canonical(e.a) if e.op == "floordiv" else _zero_like(e)
        try:
            terms, c = linear_form(e.a)
        except _NotLinear:
            return e
        whole = {a: v // k for a, v in terms.items() if v % k == 0}
        rest = {a: v for a, v in terms.items() if v % k != 0}
        rlo, rhi = _bound_of_terms(rest, self.bounds, e.lanes)
        rlo, rhi = rlo + c % k, rhi + c % k
        q = rlo // k
        if rhi // k != q or abs(rlo) >= INF or abs(rhi) >= INF:
            return e  # the remainder part may cross a multiple of k
        if e.op == "floordiv":
            return from_linear(whole, c // k + q, e.lanes)
        return from_linear(rest, c % k - q * k, e.lanes)

    def _compare(self, e: Binary):
        try:
            terms, c = linear_form(Binary("sub", e.a, e.b))
            lo, hi = _bound_of_terms(terms, self.bounds, e.lanes)
            lo, hi = lo + c, hi + c
        except _NotLinear:
            return e
        truth = {"lt": (hi < 0, lo >= 0), "le": (hi <= 0, lo > 0), "gt": (lo > 0, hi <= 0),
                 "ge": (lo >= 0, hi < 0), "eq": (lo == hi == 0, lo > 0 or hi < 0),
                 "ne": (lo > 0 or hi < 0, lo == hi == 0)}[e.op]
        if truth[0] or truth[1]:
            v = const(1 if truth[0] else 0, boolean)
            return v if e.lanes == 1 else Broadcast(v, e.lanes)
        return e

    def visit_Cast(self, e: Cast):
        v = self.visit(e.value)
        if isinstance(v, Const) and e.lanes == 1:
            return const(v.value, e.dtype)
        return v if v.dtype == e.dtype else Cast(e.dtype, v)

    def visit_Broadcast(self, e: Broadcast):
        v = self.visit(e.value)
        return v if e.n == 1 else Broadcast(v, e.n) if v is not e.value else e

    def visit_Ramp(self, e: Ramp):
        base, stride = self.visit(e.base), self.visit(e.stride)
        if isinstance(stride, Const) and stride.value == 0:
            return Broadcast(base, e.n)
        return e if (base is e.base and stride is e.stride) else Ramp(base, stride, e.n)


def _zero_like(e):
    z = const(0, e.dtype.element)
    return z if e.lanes == 1 else Broadcast(z, e.lanes)


def _fold(e: Binary) -> Expr:
    import math
    a, b = e.a.value, e.b.value
    ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
           "div": lambda: a / b, "floordiv": lambda: math.floor(a / b) if e.dtype.is_float else a // b,
           "floormod": lambda: a - math.floor(a / b) * b if e.dtype.is_float else a % b,
           "min": lambda: min(a, b), "max": lambda: max(a, b), "lt": lambda: a < b, "le": lambda: a <= b,
           "gt": lambda: a > b, "ge": lambda: a >= b, "eq": lambda: a == b, "ne": lambda: a != b,
           "and": lambda: a and b, "or": lambda: a or b}
    if e.op in ("floordiv", "floormod", "div") and b == 0:
        return e
    return const(ops[e.op](), e.dtype)


def simplify(node, bounds: dict | None = None):
    """Simplify an expression or statement; loop variables get the bounds of their loops."""
    return Simplifier(bounds).visit(node)
