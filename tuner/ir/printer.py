"""A TIR-like text form of the IR, for ``--show-passes`` and test failures."""
from __future__ import annotations

from .expr import Binary, Broadcast, BufferLoad, Call, Cast, Const, ExtractLane, Ramp, Select, Var

_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%", "lt": "<",
        "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&", "or": "||"}


def expr_str(e) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return repr(e.value) if e.dtype.is_float or e.dtype.base != "bool" else str(bool(e.value)).lower()
    if isinstance(e, Binary):
        if e.op in ("min", "max"):
            return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})"
        return f"({expr_str(e.a)} {_SYM[e.op]} {expr_str(e.b)})"
    if isinstance(e, Select):
        return f"select({expr_str(e.cond)}, {expr_str(e.true_value)}, {expr_str(e.false_value)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.value)})"
    if isinstance(e, Ramp):
        return f"ramp({expr_str(e.base)}, {expr_str(e.stride)}, {e.n})"
    if isinstance(e, Broadcast):
        return f"broadcast({expr_str(e.value)}, {e.n})"
    if isinstance(e, BufferLoad):
        return f"{e.buffer.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, Call):
        args = [a.name if hasattr(a, "scope") else expr_str(a) for a in e.args]
        return f"{e.name}({', '.join(args)})"
    if isinstance(e, ExtractLane):
        return f"{expr_str(e.value)}.{'xyzw'[e.lane] if e.lane < 4 else f's{e.lane:x}'}"
    return repr(e)


def stmt_str(s, indent: int = 0) -> str:
    from .stmt import Allocate, Barrier, BufferStore, Evaluate, For, If, Let, Seq
    pad = "  " * indent
    if isinstance(s, Seq):
        return "\n".join(stmt_str(x, indent) for x in s.stmts)
    if isinstance(s, For):
        kind = f"thread({s.thread})" if s.kind == "thread" else s.kind
        return f"{pad}for {s.var.name} in {kind}(0, {s.extent}):\n{stmt_str(s.body, indent + 1)}"
    if isinstance(s, BufferStore):
        return f"{pad}{s.buffer.name}[{', '.join(expr_str(i) for i in s.indices)}] = {expr_str(s.value)}"
    if isinstance(s, Allocate):
        b = s.buffer
        return f"{pad}{b.name} = allocate({list(b.shape)}, {b.dtype}, {b.scope!r})\n{stmt_str(s.body, indent)}"
    if isinstance(s, If):
        out = f"{pad}if {expr_str(s.cond)}:\n{stmt_str(s.then, indent + 1)}"
        if s.otherwise is not None:
            out += f"\n{pad}else:\n{stmt_str(s.otherwise, indent + 1)}"
        return out
    if isinstance(s, Let):
        return f"{pad}{s.var.name} = {expr_str(s.value)}\n{stmt_str(s.body, indent)}"
    if isinstance(s, Barrier):
        return f"{pad}barrier({'global' if s.fence == 'global' else ''})"
    if isinstance(s, Evaluate):
        return pad + expr_str(s.value)
    return pad + repr(s)


def buffer_str(b) -> str:
    extra = f", layout={b.layout}" if b.layout is not None else ""
    seps = f", axis_separators={list(b.axis_separators)}" if b.axis_separators else ""
    return f"{b.name}: Buffer({list(b.shape)}, {b.dtype}, {b.scope!r}{seps}{extra})"


def kernel_str(k) -> str:
    params = "\n".join("    " + buffer_str(b) for b in k.params)
    access = f"  # access: {k.access}\n" if k.access else ""
    return f"kernel {k.name}(\n{params}\n):\n{access}{stmt_str(k.body, 1)}"
