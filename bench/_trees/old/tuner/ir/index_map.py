"""``IndexMap`` and ``AXIS_SEPARATOR`` (RFC 0039): a layout is a function from logical to physical indices.

``IndexMap.from_func(lambda n, c, h, w: [n, c//4, h, AXIS_SEPARATOR, w, AXIS_SEPARATOR, c%4])`` maps NCHW to
the texture layout C0: rows ``n, c//4, h``, columns ``w``, RGBA lane ``c%4``. Extents come from the bounds of
each output expression; ``x % k`` always spans ``k`` so channel counts that are not a multiple of 4 are
padded (the padding holds zeros).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from math import prod
from typing import Callable, Optional, Sequence

import numpy as np

from .expr import Binary, Const, Expr, Var, as_expr


class _AxisSeparator:
    def __repr__(self) -> str:
        return "AXIS_SEPARATOR"


AXIS_SEPARATOR = _AxisSeparator()


@dataclass(frozen=True, eq=False)
class IndexMap:
    initial: tuple  # Vars, one per logical axis
    final: tuple  # Exprs, one per transformed axis
    axis_separators: tuple  # positions in ``final`` where a new physical axis starts
    name: str = "index_map"

    @staticmethod
    def from_func(fn: Callable, ndim: Optional[int] = None, name: Optional[str] = None) -> "IndexMap":
        """Accepts ``lambda n, c, h, w: ...`` or ``lambda *idx: ...`` (then ``ndim`` is required)."""
        params = inspect.signature(fn).parameters.values()
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            if ndim is None:
                raise ValueError("a layout function taking *indices needs ndim")
            names = [f"i{k}" for k in range(ndim)]
        else:
            names = [p.name for p in params]
            if ndim is not None and ndim != len(names):
                raise ValueError(f"layout function takes {len(names)} indices but the buffer has {ndim} axes")
        initial = tuple(Var(n) for n in names)
        final, seps = [], []
        for item in fn(*initial):
            if item is AXIS_SEPARATOR:
                seps.append(len(final))
            else:
                final.append(as_expr(item))
        if any(s in (0, len(final)) for s in seps) or len(set(seps)) != len(seps):
            raise ValueError("AXIS_SEPARATOR must stand between two axes, once per place")
        fname = getattr(fn, "__name__", "")
        return IndexMap(initial, tuple(final), tuple(seps), name or (fname if fname != "<lambda>" else "index_map"))

    @property
    def ndim(self) -> int:
        return len(self.initial)

    def map_indices(self, indices: Sequence[Expr]) -> list[Expr]:
        from .functor import substitute
        if len(indices) != self.ndim:
            raise ValueError(f"layout {self.name} takes {self.ndim} indices, got {len(indices)}")
        env = dict(zip(self.initial, (as_expr(i) for i in indices)))
        return [substitute(e, env) for e in self.final]

    def map_shape(self, shape: Sequence[int]) -> tuple:
        from .arith import const_int_bound
        if len(shape) != self.ndim:
            raise ValueError(f"layout {self.name} takes {self.ndim} axes, the buffer has {len(shape)}")
        bounds = {v: (0, int(s) - 1) for v, s in zip(self.initial, shape)}
        out = []
        for e in self.final:
            if isinstance(e, Binary) and e.op == "floormod" and isinstance(e.b, Const):
                out.append(int(e.b.value))  # padded to the full modulus
                continue
            lo, hi = const_int_bound(e, bounds)
            if lo < 0:
                raise ValueError(f"layout {self.name}: axis {e} can be negative")
            out.append(hi + 1)
        return tuple(out)

    def physical_shape(self, shape: Sequence[int]) -> tuple:
        """The shape after flattening each axis group: ``len(axis_separators) + 1`` dimensions."""
        return group_shape(self.map_shape(shape), self.axis_separators)

    def pack(self, array: np.ndarray) -> np.ndarray:
        """Host-side: a logical array to its physical array (padding zero)."""
        from .evaluate import evaluate
        shape = self.map_shape(array.shape)
        out = np.zeros(shape, dtype=array.dtype)
        env = dict(zip(self.initial, np.indices(array.shape)))
        idx = tuple(np.broadcast_to(evaluate(e, env), array.shape) for e in self.final)
        out[idx] = array
        return out.reshape(group_shape(shape, self.axis_separators))

    def unpack(self, physical: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        from .evaluate import evaluate
        full = physical.reshape(self.map_shape(shape))
        env = dict(zip(self.initial, np.indices(tuple(shape))))
        idx = tuple(np.broadcast_to(evaluate(e, env), tuple(shape)) for e in self.final)
        return full[idx]

    def __str__(self) -> str:
        items = [str(e) for e in self.final]
        for pos in reversed(self.axis_separators):
            items.insert(pos, "AXIS_SEPARATOR")
        return f"lambda {', '.join(v.name for v in self.initial)}: [{', '.join(items)}]"


def group_shape(shape: Sequence[int], axis_separators: Sequence[int]) -> tuple:
    bounds = [0, *axis_separators, len(shape)]
    return tuple(prod(shape[a:b]) for a, b in zip(bounds, bounds[1:]))
