"""Lower texture-scope accesses to ``texture2d_load(img, x, y)`` / ``texture2d_store(img, x, y, v)`` (texture
RFC T0). A flattened texture is ``[height, width, 4]`` (or ``[height, width*4]`` when the lane was folded
into the columns by a single separator); the lane index must be the whole pixel ``ramp(0, 1, 4)`` or a
constant lane, which becomes a single-lane read ``.x``..``.w`` for broadcasting (T1)."""
from __future__ import annotations

from ..errors import LoweringError
from ..ir.arith import Simplifier
from ..ir.dtype import float32
from ..ir.expr import Broadcast, BufferLoad, Call, Const, Expr, ExtractLane, Ramp, select
from ..ir.kernel import Kernel
from ..ir.stmt import BufferStore, Evaluate


def _scalar(e: Expr, what: str, buf) -> Expr:
    if e.lanes == 1:
        return e
    if isinstance(e, Broadcast):
        return e.value
    raise LoweringError(f"texture {buf.name!r}: the {what} coordinate {e} differs between lanes; a vector "
                        f"access to a texture must read one RGBA pixel (vectorize the 4-lane axis only)")


def _is_pixel(lane: Expr) -> bool:
    return isinstance(lane, Ramp) and lane.n == 4 and lane.base == Const(0) and lane.stride == Const(1)


class _LowerTextures(Simplifier):
    """A Simplifier, so that splitting ``column -> (x, lane)`` can use the loop bounds in scope."""

    def coords(self, buf, indices):
        if len(buf.shape) == 3:
            y, x, lane = indices
        else:
            y, col = indices
            x, lane = self.visit(col // 4), self.visit(col % 4)
        return _scalar(x, "x", buf), _scalar(y, "y", buf), lane

    def visit_BufferLoad(self, e: BufferLoad):
        indices = tuple(self.visit(i) for i in e.indices)
        buf = e.buffer
        if not buf.is_texture:
            return BufferLoad(buf, indices)
        x, y, lane = self.coords(buf, indices)
        pixel = Call("texture2d_load", (buf, x, y), float32.with_lanes(4))
        if _is_pixel(lane):
            return pixel
        lane_value = lane.value if isinstance(lane, Broadcast) else lane
        if isinstance(lane_value, Const):
            v = ExtractLane(pixel, int(lane_value.value))
        elif lane_value.lanes == 1:  # one dynamic lane; a broadcast one is read once, then broadcast
            k = lane_value
            v = select(k.equal(0), ExtractLane(pixel, 0), select(k.equal(1), ExtractLane(pixel, 1),
                       select(k.equal(2), ExtractLane(pixel, 2), ExtractLane(pixel, 3))))
        else:
            raise LoweringError(f"texture {buf.name!r}: lane index {lane} is neither the whole pixel "
                                f"ramp(0, 1, 4) nor one lane")
        return Broadcast(v, lane.lanes) if lane.lanes > 1 else v

    def visit_BufferStore(self, s: BufferStore):
        indices = tuple(self.visit(i) for i in s.indices)
        value = self.visit(s.value)
        buf = s.buffer
        if not buf.is_texture:
            return BufferStore(buf, value, indices)
        x, y, lane = self.coords(buf, indices)
        if not _is_pixel(lane):
            raise LoweringError(f"texture {buf.name!r}: a store must write a whole RGBA pixel, got lanes {lane}; "
                                f"vectorize the 4-lane axis of the stored value")
        if value.lanes == 1:
            value = Broadcast(value, 4)
        return Evaluate(Call("texture2d_store", (buf, x, y, value), value.dtype))


def lower_texture_access(kernel: Kernel) -> Kernel:
    if not any(b.is_texture for b in kernel.params):
        return kernel
    return kernel.replace(body=_LowerTextures().visit(kernel.body))
