"""``Buffer``: a tensor's name, logical shape, storage dtype, memory scope and layout."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import prod
from typing import Optional

from .dtype import DType
from .expr import BufferLoad, as_expr

# global: a 1-D OpenCL buffer; texture: an RGBA image2d for activations (convention C0);
# texture:weight: an RGBA image2d for weights (convention C1); local: work-group shared; private: registers.
SCOPES = ("global", "texture", "texture:weight", "local", "private")


@dataclass(frozen=True, eq=False, repr=False)
class Buffer:
    name: str
    shape: tuple
    dtype: DType
    scope: str = "global"
    layout: Optional["IndexMap"] = None  # noqa: F821 - logical -> physical index map (RFC 0039)
    axis_separators: tuple = ()  # positions in ``shape`` where a new physical axis starts
    logical: Optional["Buffer"] = None  # the buffer as declared, kept through lowering for host packing

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", DType.parse(self.dtype))
        if self.scope not in SCOPES:
            raise ValueError(f"buffer {self.name!r}: unknown scope {self.scope!r}; scopes are {', '.join(SCOPES)}")
        if any(s < 1 for s in self.shape):
            raise ValueError(f"buffer {self.name!r}: shape {self.shape} must be positive")

    @property
    def is_texture(self) -> bool:
        return self.scope.startswith("texture")

    @property
    def declared(self) -> "Buffer":
        return self.logical or self

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.bytes

    def replace(self, **changes) -> "Buffer":
        changes.setdefault("logical", self.declared)
        return dataclasses.replace(self, **changes)

    def __getitem__(self, indices) -> BufferLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return BufferLoad(self, tuple(as_expr(i) for i in indices))

    def __repr__(self) -> str:
        extra = f", layout={self.layout.name}" if self.layout is not None else ""
        return f"Buffer({self.name}, {list(self.shape)}, {self.dtype}, {self.scope!r}{extra})"


def buffer(name: str, shape, dtype="float32", scope: str = "global", layout=None) -> Buffer:
    """Declare a buffer. ``layout`` is an ``IndexMap``, a layout name from ``tuner.ir.layouts``, or a
    function ``lambda n, c, h, w: [...]`` (RFC 0039)."""
    from .index_map import IndexMap
    from .layouts import get_layout
    if isinstance(layout, str):
        layout = get_layout(layout)
    elif callable(layout) and not isinstance(layout, IndexMap):
        layout = IndexMap.from_func(layout, ndim=len(tuple(shape)))
    return Buffer(name, tuple(shape), DType.parse(dtype), scope, layout)
