"""Activation functions, one owner for every kernel that applies one: the templates' fused epilogue
(bias -> residual -> activation), the glue kernels, the graph passes that fuse them and the NumPy references.

An activation is named by a spec string: a name, or a name with its float parameters in parentheses, e.g.
``relu``, ``relu6``, ``hardswish``, ``leaky_relu(0.1)``, ``hardsigmoid(0.166667,0.5)``, ``clip(0,6)``.
:func:`spec` writes the canonical string (parameters at their defaults are left out), which is what
workloads store, so equal activations give equal task keys.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .expr import call, max_, min_


@dataclass(frozen=True)
class Activation:
    name: str
    defaults: tuple  # parameter defaults (floats), in order
    ir: Callable  # (Expr, params) -> Expr
    numpy: Callable  # (ndarray float64, params) -> ndarray


def _exp(v):
    return call("exp", [v], v.dtype)


def _ir_clip(v, lo, hi):
    v = max_(v, lo) if lo > -math.inf else v
    return min_(v, hi) if hi < math.inf else v


def _hardsigmoid(v, alpha, beta):
    return min_(max_(v * alpha + beta, 0.0), 1.0)


def _per_channel(v, p):
    raise ValueError("prelu takes one slope per channel, which its kernel reads beside the bias: apply it with "
                     "apply_prelu_ir / apply_prelu_numpy (a convolution template's epilogue), not as a spec alone")


def _starrelu(v, scale, bias):
    r = max_(v, 0.0)
    r = r * r
    r = r * scale if scale != 1.0 else r
    return r + bias if bias != 0.0 else r


def _np_erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x)


_REGISTRY = [
    Activation("none", (), lambda v, p: v, lambda x, p: x),
    Activation("relu", (), lambda v, p: max_(v, 0.0), lambda x, p: np.maximum(x, 0)),
    Activation("relu6", (), lambda v, p: min_(max_(v, 0.0), 6.0), lambda x, p: np.clip(x, 0, 6)),
    Activation("clip", (-math.inf, math.inf), lambda v, p: _ir_clip(v, *p), lambda x, p: np.clip(x, p[0], p[1])),
    Activation("leaky_relu", (0.01,), lambda v, p: max_(v, 0.0) + min_(v, 0.0) * p[0],
               lambda x, p: np.where(x > 0, x, x * p[0])),
    Activation("elu", (1.0,), lambda v, p: max_(v, 0.0) + (_exp(min_(v, 0.0)) - 1.0) * p[0],
               lambda x, p: np.where(x > 0, x, p[0] * (np.exp(np.minimum(x, 0)) - 1))),
    Activation("hardsigmoid", (0.2, 0.5), lambda v, p: _hardsigmoid(v, *p),
               lambda x, p: np.clip(x * p[0] + p[1], 0, 1)),
    Activation("hardswish", (), lambda v, p: v * _hardsigmoid(v, 1 / 6, 0.5),
               lambda x, p: x * np.clip(x / 6 + 0.5, 0, 1)),
    Activation("sigmoid", (), lambda v, p: 1.0 / (_exp(0.0 - v) + 1.0), lambda x, p: 1 / (1 + np.exp(-x))),
    Activation("silu", (), lambda v, p: v / (_exp(0.0 - v) + 1.0), lambda x, p: x / (1 + np.exp(-x))),
    Activation("tanh", (), lambda v, p: call("tanh", [v], v.dtype), lambda x, p: np.tanh(x)),
    # PReLU with one slope per channel (ONNX PRelu, PyTorch nn.PReLU(C)): the convolution templates' epilogue
    # applies it, the slopes packed after the bias in ``B`` (templates.common.bias_length); one slope for every
    # channel is leaky_relu(a)
    Activation("prelu", (), _per_channel, _per_channel),
    Activation("gelu", (), lambda v, p: v * (call("erf", [v * (1 / math.sqrt(2))], v.dtype) + 1.0) * 0.5,
               lambda x, p: 0.5 * x * (1 + _np_erf(x / math.sqrt(2)))),
    # StarReLU (MetaFormer baselines: PoolFormerV2, CAFormer): scale * relu(x)^2 + bias, the two scalars learnt
    Activation("starrelu", (1.0, 0.0), lambda v, p: _starrelu(v, *p),
               lambda x, p: p[0] * np.maximum(x, 0) ** 2 + p[1]),
]
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in _REGISTRY}
NAMES = tuple(ACTIVATIONS)
_SPEC = re.compile(r"^\s*([a-z_0-9]+)\s*(?:\((.*)\))?\s*$")


def _fmt(x: float) -> str:
    return "inf" if x == math.inf else "-inf" if x == -math.inf else repr(float(x)).removesuffix(".0") \
        if float(x).is_integer() else repr(float(x))


def spec(name: str, *params: float) -> str:
    """The canonical spec of ``name`` with ``params`` (trailing defaults dropped); validates both."""
    act = ACTIVATIONS.get(name)
    if act is None:
        raise ValueError(f"activation {name!r}: one of {', '.join(NAMES)}")
    if len(params) > len(act.defaults):
        raise ValueError(f"activation {name} takes {len(act.defaults)} parameters, got {len(params)}")
    values = [float(p) for p in params] + list(act.defaults[len(params):])
    if any(math.isnan(v) for v in values):
        raise ValueError(f"activation {name}: NaN parameter")
    while values and values[-1] == act.defaults[len(values) - 1]:
        values.pop()
    if name == "clip":
        lo, hi = (list(values) + list(act.defaults[len(values):]))[:2]
        if lo > hi:
            raise ValueError(f"clip({lo}, {hi}): want lo <= hi")
        if (lo, hi) == (0.0, 6.0):
            return "relu6"
        if (lo, hi) == (0.0, math.inf):
            return "relu"
        values = [lo, hi]
    return name if not values else f"{name}({','.join(_fmt(v) for v in values)})"


def parse(text: str) -> tuple[str, tuple]:
    """``(name, params)`` of a spec, parameters filled in with their defaults. Raises ValueError naming the
    supported activations."""
    m = _SPEC.match(str(text))
    if not m or m.group(1) not in ACTIVATIONS:
        raise ValueError(f"activation {text!r}: one of {', '.join(NAMES)} (parameters in parentheses, e.g. "
                         "leaky_relu(0.1))")
    name, args = m.group(1), m.group(2)
    try:
        params = tuple(float(a) for a in args.split(",")) if args and args.strip() else ()
    except ValueError:
        raise ValueError(f"activation {text!r}: parameters must be numbers") from None
    act = ACTIVATIONS[name]
    if len(params) > len(act.defaults):
        raise ValueError(f"activation {text!r}: {name} takes {len(act.defaults)} parameters")
    return name, params + act.defaults[len(params):]


def canonical(text: str) -> str:
    """The canonical form of any valid spec (``clip(0,6)`` -> ``relu6``, ``leaky_relu(0.01)`` ->
    ``leaky_relu``)."""
    name, params = parse(text)
    return spec(name, *params)


def apply_ir(text: str, v):
    """The activation applied to the IR expression ``v`` (float32 arithmetic, any lanes)."""
    name, params = parse(text)
    return ACTIVATIONS[name].ir(v, params)


def apply_numpy(text: str, x: np.ndarray) -> np.ndarray:
    name, params = parse(text)
    return ACTIVATIONS[name].numpy(np.asarray(x, np.float64), params)


def apply_prelu_ir(v, slope):
    """PReLU of the IR expression ``v`` with the per-lane ``slope`` (an expression of ``v``'s lanes)."""
    return max_(v, 0.0) + min_(v, 0.0) * slope


def apply_prelu_numpy(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """PReLU of ``x`` (N, C, ...) with ``slope`` (C,) broadcast along axis 1."""
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x, x * np.asarray(slope, np.float64).reshape((1, -1) + (1,) * (x.ndim - 2)))


def tolerance_scale(text: str) -> float:
    """How much an activation may magnify float rounding (1 for all of these: every one is 1-Lipschitz
    or flatter, except elu/leaky_relu with parameters above 1)."""
    name, params = parse(text)
    return max([1.0, *[abs(p) for p in params if name in ("elu", "leaky_relu")]])
