"""Evaluate index expressions on NumPy integer arrays (host-side packing of layouts)."""
from __future__ import annotations

import numpy as np

from .expr import Binary, Cast, Const, Expr, Select, Var

_OPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide,
    "floormod": np.mod, "min": np.minimum, "max": np.maximum, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal,
    "and": np.logical_and, "or": np.logical_or, "div": np.true_divide,
}


def evaluate(e: Expr, env: dict):
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        if e not in env:
            raise KeyError(f"unbound variable {e.name}")
        return env[e]
    if isinstance(e, Binary):
        return _OPS[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Select):
        return np.where(evaluate(e.cond, env), evaluate(e.true_value, env), evaluate(e.false_value, env))
    if isinstance(e, Cast):
        return np.asarray(evaluate(e.value, env)).astype(e.dtype.numpy)
    raise TypeError(f"cannot evaluate {type(e).__name__} on the host")
