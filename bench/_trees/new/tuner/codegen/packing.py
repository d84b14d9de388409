"""Host-side layout packing, with no device: a lowered buffer's allocation shape (``physical_shape``), and a
logical host array (NCHW, ...) to the physical array its layout stores and back (``pack``, ``unpack``). The
compiler packs weights with them; every runtime packs inputs and unpacks outputs the same way."""
from __future__ import annotations

import numpy as np

from tuner.errors import TunerError
from tuner.ir.layouts import default_layout


def physical_shape(buf) -> tuple:
    """The allocation shape of a lowered buffer: ``(height, width, 4)`` for a texture."""
    shape = tuple(buf.shape)
    if buf.is_texture and len(shape) == 2:
        return shape[0], shape[1] // 4, 4
    return shape


def pack(buf, array: np.ndarray) -> np.ndarray:
    """A logical host array -> the physical array of the lowered ``buf`` (padding zero)."""
    logical = buf.declared
    if tuple(array.shape) != tuple(logical.shape):
        raise TunerError(f"array for {logical.name!r} has shape {list(array.shape)}, expected {list(logical.shape)}")
    layout = logical.layout or default_layout(logical)
    flat = layout.pack(array) if layout is not None else np.ascontiguousarray(array)
    return flat.reshape(physical_shape(buf))


def unpack(buf, physical: np.ndarray) -> np.ndarray:
    logical = buf.declared
    layout = logical.layout or default_layout(logical)
    if layout is None:
        return physical.reshape(logical.shape)
    return layout.unpack(physical, logical.shape)
