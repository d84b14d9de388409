"""Apply each buffer's layout (RFC 0039): the buffer takes the transformed shape and axis separators,
every access the transformed indices. Texture buffers without a layout get the texture RFC's convention
(C0 for ``texture``, C1 for ``texture:weight``)."""
from __future__ import annotations

from ..errors import LoweringError
from ..ir.functor import ReplaceBuffers
from ..ir.kernel import Kernel
from ..ir.layouts import default_layout


def transformed_buffer(buf):
    layout = buf.layout or default_layout(buf)
    if layout is None:
        if buf.is_texture:
            raise LoweringError(
                f"texture buffer {buf.name!r} with shape {list(buf.shape)} has no layout: give it one whose "
                f"innermost axis is the RGBA lane of 4 (e.g. layout='nchw4c' for NCHW)")
        return buf
    shape = layout.map_shape(buf.shape)
    if buf.is_texture:
        if shape[-1] != 4:
            raise LoweringError(
                f"texture buffer {buf.name!r}: layout {layout} gives an innermost axis of {shape[-1]} lanes, "
                f"but an RGBA texture pixel holds 4; end the layout with an axis of extent 4 (e.g. c % 4)")
        if len(layout.axis_separators) not in (1, 2):
            raise LoweringError(
                f"texture buffer {buf.name!r}: layout {layout} has {len(layout.axis_separators)} axis "
                f"separators; a 2-D image needs [rows, AXIS_SEPARATOR, columns, AXIS_SEPARATOR, lane]")
        if len(layout.axis_separators) == 1 and layout.axis_separators[0] == len(shape) - 1:
            raise LoweringError(
                f"texture buffer {buf.name!r}: layout {layout} puts only the lane axis after its separator; "
                f"the image needs columns too")
    return buf.replace(shape=shape, axis_separators=layout.axis_separators, layout=None)


def apply_layout_transforms(kernel: Kernel) -> Kernel:
    mapping = {b: transformed_buffer(b) for b in kernel.params if b.layout is not None or b.is_texture}
    if not mapping:
        return kernel
    layouts = {b: (b.layout or default_layout(b)) for b in mapping}
    body = ReplaceBuffers(mapping, lambda b, idx: layouts[b].map_indices(idx)).visit(kernel.body)
    return kernel.replace(params=tuple(mapping.get(b, b) for b in kernel.params), body=body)
