"""Schedule primitives that change the kernel set. ``cache_read`` is texture RFC A0: texture as a
schedulable scratch memory -- copy a buffer into a texture with a data-shuffle kernel, then let the compute
kernel read the texture."""
from __future__ import annotations

from .buffer import Buffer
from .builder import Builder
from .expr import min_, select
from .functor import ReplaceBuffers
from .kernel import Kernel, Program, as_program
from .layouts import default_layout


def cache_read(k: "Kernel | Program", buf: Buffer, scope: str = "texture", layout=None) -> Program:
    """Copy ``buf`` into a new workspace of ``scope`` before the kernels that read it.

    The shuffle kernel binds the first axis to ``group.0``, the second to ``local.0`` and vectorizes the
    RGBA lane axis, as in the RFC's ``addone`` example."""
    prog = as_program(k)
    if isinstance(layout, str):
        from .layouts import get_layout
        layout = get_layout(layout)
    cached = Buffer(f"{buf.name}_{scope.replace(':', '_')}", buf.shape, buf.dtype, scope, layout)
    layout = cached.layout or default_layout(cached)
    lane_axis = _lane_axis(layout, len(buf.shape)) if layout is not None else None
    b = Builder()
    _copy_nest(b, buf, cached, lane_axis, axis=0, indices=[], bound=0, guard=None)
    shuffle = b.kernel(f"{prog.name}_shuffle_{buf.name}", [buf, cached])
    swap = ReplaceBuffers({buf: cached})
    kernels = tuple(kern.replace(params=tuple(cached if p is buf else p for p in kern.params),
                                 body=swap.visit(kern.body)) for kern in prog.kernels)
    return prog.replace(kernels=(shuffle, *kernels), workspaces=(*prog.workspaces, cached))


def _lane_axis(layout, ndim: int):
    """The logical axis the layout's innermost (lane) expression reads, if it is a single axis."""
    from .functor import visit
    from .expr import Var
    used = []
    visit(layout.final[-1], lambda n: used.append(n) if isinstance(n, Var) else None)
    return layout.initial.index(used[0]) if len(set(used)) == 1 else None


def _copy_nest(b, src, dst, lane_axis, axis, indices, bound, guard):
    """Loops over the logical axes in order; the lane axis splits into an outer loop in place and a
    vectorized loop of 4 innermost, as a pixel store needs."""
    if axis == len(src.shape):
        if lane_axis is None:
            return _copy_store(b, src, dst, indices, None)
        extent = src.shape[lane_axis]
        with b.loop("c_i", 4, "vectorized") as ci:
            full = list(indices)
            full[lane_axis] = indices[lane_axis] * 4 + ci
            _copy_store(b, src, dst, full, None if extent % 4 == 0 else (lane_axis, extent))
        return
    extent = src.shape[axis] if axis != lane_axis else -(-src.shape[axis] // 4)
    kind = ("group.0", "local.0")[bound] if bound < 2 else "serial"
    with b.loop(f"ax{axis}" if axis != lane_axis else "c_o", extent, kind) as v:
        _copy_nest(b, src, dst, lane_axis, axis + 1, [*indices, v], bound + (kind != "serial"), guard)


def _copy_store(b, src, dst, indices, guard):
    value = src[tuple(indices)]
    if guard is not None:  # padding lanes past the tensor's extent are written as zero
        pos, extent = guard
        clamped = list(indices)
        clamped[pos] = min_(indices[pos], extent - 1)
        value = select(indices[pos] < extent, src[tuple(clamped)], 0.0)
    b.store(dst, tuple(indices), value)
