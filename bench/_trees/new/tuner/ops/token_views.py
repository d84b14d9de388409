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
