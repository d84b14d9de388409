"""How token tensors (3-D, attention's (batch, tokens, channels)) are stored on the 4-D kernels: the view
(a, c, 1, b) of a logical (a, b, c) and back, for arrays and shapes, and a strided read for the reference. The
glue kernels (``kernels_movement``), the lowering rules and the graph passes (``graph.passes_tokens``) all use
them; they import nothing of the tuner."""
from __future__ import annotations

import numpy as np


# -- the token layout ----------------------------------------------------------------------------------------

def token_view(shape) -> tuple:
    """The 4-D shape a tensor of logical ``shape`` is stored as: (a, c, 1, b) for (a, b, c); others as they are."""
    shape = tuple(int(d) for d in shape)
    return (shape[0], shape[2], 1, shape[1]) if len(shape) == 3 else shape


def token_logical(view) -> tuple:
    """The logical (a, b, c) of a token tensor stored as the view (a, c, 1, b): ``token_view``'s inverse."""
    a, c, _, b = (int(d) for d in view)
    return a, b, c


def to_view(x: np.ndarray) -> np.ndarray:
    """A logical array in its stored (view) form (``token_view``)."""
    return np.ascontiguousarray(x.transpose(0, 2, 1)[:, :, None, :]) if x.ndim == 3 else x


def from_view(v: np.ndarray, logical) -> np.ndarray:
    """The logical array of ``logical`` shape from its stored (view) form."""
    return np.ascontiguousarray(v[:, :, 0, :].transpose(0, 2, 1)) if len(logical) == 3 else v.reshape(logical)


def strided_reference(x_logical: np.ndarray, offset: int, shape, strides) -> np.ndarray:
    """The strided view (in elements of ``x_logical``'s row-major order) as a new array."""
    flat = np.ascontiguousarray(x_logical).reshape(-1)
    idx = np.full(tuple(shape), offset, dtype=np.int64)
    for axis, (d, s) in enumerate(zip(shape, strides)):
        form = [1] * len(shape)
        form[axis] = d
        idx = idx + (np.arange(d, dtype=np.int64) * s).reshape(form)
    return flat[idx]


# -- a 3-D operand as a view of another tensor (the matmul template's ``a_view`` / ``b_view`` / ``y_view``) -------

def stored_coords(logical, flat) -> tuple | None:
    """``((n, c, h, w), stored shape)``: where the elements ``flat`` (row-major indices into a tensor of ``logical``
    shape, 3-D tokens or 4-D NCHW) lie in its storage; None for other ranks (2-D rows)."""
    logical = tuple(int(d) for d in logical)
    if len(logical) == 3:
        n, t, c = np.unravel_index(flat, logical)
        return (n, c, np.zeros_like(n), t), token_view(logical)
    if len(logical) == 4:
        return np.unravel_index(flat, logical), logical
    return None


def affine_form(idx: np.ndarray) -> tuple | None:
    """``(offset, strides)`` with ``idx[i] == offset + sum(i_k * strides[k])`` for every index i, else None."""
    idx = np.asarray(idx, np.int64)
    offset = int(idx.flat[0])
    strides = tuple(int(idx[tuple(1 if k == j else 0 for k in range(idx.ndim))]) - offset if d > 1 else 0
                    for j, d in enumerate(idx.shape))
    grid = np.indices(idx.shape)
    form = offset + sum(g * s for g, s in zip(grid, strides)) if idx.ndim else np.int64(offset)
    return (offset, strides) if np.array_equal(form, idx) else None


def fit_view(idx: np.ndarray, logical) -> tuple | None:
    """The view ``(src, groups, c_off, c_group, r_off)`` through which element (b, r, c) of a 3-D operand is
    element ``idx[b, r, c]`` (row-major) of a tensor of ``logical`` shape stored as ``src``: (b // groups,
    c_off + (b % groups) * c_group + c, p // W, p % W) with p = r_off + r. ``()`` when the operand is that
    tensor's own storage; None when no such view expresses it (channel offsets must start pixels)."""
    found = stored_coords(logical, np.asarray(idx, np.int64))
    if found is None:
        return None
    (n, ch, h, w), src = found
    nb, rows, cols = idx.shape
    b, r, c = np.ix_(np.arange(nb), np.arange(rows), np.arange(cols))
    groups = next((g for g in range(1, nb + 1) if nb % g == 0 and np.array_equal(n, np.broadcast_to(b // g, n.shape))),
                  None)
    d = ch - c
    if groups is None or not np.array_equal(d, np.broadcast_to(d[:, :1, :1], d.shape)):
        return None
    d = d[:, 0, 0]
    c_off, c_group = int(d[0]), int(d[1] - d[0]) if groups > 1 else 0
    p = h * src[3] + w
    r_off = int(p.flat[0])
    if not np.array_equal(d, c_off + (np.arange(nb) % groups) * c_group) or c_off % 4 or c_group % 4 \
            or min(c_off, c_group) < 0 or not np.array_equal(p, np.broadcast_to(r + r_off, p.shape)):
        return None
    if src == (nb, cols, 1, rows) and (groups, c_off, r_off) == (1, 0, 0):
        return ()
    return tuple(int(x) for x in src), groups, c_off, c_group, r_off

