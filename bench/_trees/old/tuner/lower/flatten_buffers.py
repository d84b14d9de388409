"""Flatten each buffer to ``len(axis_separators) + 1`` physical dimensions, row-major within each axis
group (RFC 0039). Buffers without separators become 1-D; a C0 texture ``[A, B, C, SEP, D, SEP, 4]``
becomes ``[A*B*C, D, 4]``. Kernel-scoped arrays (private, local) are flattened too."""
from __future__ import annotations

from ..ir.expr import as_expr
from ..ir.functor import Mutator, ReplaceBuffers
from ..ir.index_map import group_shape
from ..ir.kernel import Kernel


def flat_buffer(buf):
    shape = group_shape(buf.shape, buf.axis_separators)
    return buf.replace(shape=shape, axis_separators=tuple(range(1, len(shape))))


def flat_indices(buf, indices):
    bounds = [0, *buf.axis_separators, len(buf.shape)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        idx = indices[a]
        for axis in range(a + 1, b):
            idx = idx * buf.shape[axis] + indices[axis]
        out.append(as_expr(idx))
    return out


class _CollectAllocations(Mutator):
    def __init__(self):
        self.found = []

    def visit_Allocate(self, s):
        self.found.append(s.buffer)
        return self.generic(s)


def flatten_buffers(kernel: Kernel) -> Kernel:
    collect = _CollectAllocations()
    collect.visit(kernel.body)
    buffers = [*kernel.params, *collect.found]
    mapping = {b: flat_buffer(b) for b in buffers if len(b.shape) != len(b.axis_separators) + 1
               or b.axis_separators != tuple(range(1, len(b.shape)))}
    if not mapping:
        return kernel
    body = ReplaceBuffers(mapping, flat_indices).visit(kernel.body)  # allocations included
    return kernel.replace(params=tuple(mapping.get(b, b) for b in kernel.params), body=body)

