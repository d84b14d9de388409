"""RFC 0012 in a pass: a stride-1 ``ramp(base, 1, n)`` index into a scalar buffer becomes a scalar index into
a view of the buffer with ``n``-lane elements when ``base`` is provably a multiple of ``n`` (so codegen only
prints ``vloadn(base/n, p)``; an unaligned ramp stays and is printed ``vloadn(0, p + base)``)."""
from __future__ import annotations

from functools import lru_cache

from ..ir.arith import Simplifier, divides
from ..ir.expr import BufferLoad, Const, Ramp
from ..ir.kernel import Kernel
from ..ir.stmt import BufferStore


@lru_cache(maxsize=None)
def vector_view(buf, lanes: int):
    """The same memory seen as ``lanes``-wide elements (RFC 0012: N-lane elements, scalar indices)."""
    return buf.replace(dtype=buf.dtype.with_lanes(lanes), shape=(buf.shape[0] // lanes,))


class _Vectorize(Simplifier):
    def _view(self, buf, indices):
        (idx,) = indices if len(indices) == 1 else (None,)
        if (isinstance(idx, Ramp) and isinstance(idx.stride, Const) and idx.stride.value == 1
                and buf.dtype.lanes == 1 and not buf.is_texture and buf.shape[0] % idx.n == 0
                and divides(idx.n, idx.base)):
            return vector_view(buf, idx.n), (self.visit(idx.base // idx.n),)
        return buf, indices

    def visit_BufferLoad(self, e: BufferLoad):
        buf, indices = self._view(e.buffer, tuple(self.visit(i) for i in e.indices))
        return BufferLoad(buf, indices)

    def visit_BufferStore(self, s: BufferStore):
        buf, indices = self._view(s.buffer, tuple(self.visit(i) for i in s.indices))
        return BufferStore(buf, self.visit(s.value), indices)


def vectorize_buffer_access(kernel: Kernel) -> Kernel:
    return kernel.replace(body=_Vectorize().visit(kernel.body))
