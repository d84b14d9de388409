"""Named layouts: the texture lowering conventions C0/C1 (texture RFC), the MACE image mappings and packed
buffer layouts (and, last, the pixel moves of a convolution's ``patch_view``). Each is an ``IndexMap`` over the
logical axes a template declares (NCHW activations, OIHW weights, a 1-D bias). Texture layouts end with
``AXIS_SEPARATOR, <lane>``: the last physical axis is the RGBA lane of 4, the one before it the image x (width), the
first the image y (height)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .buffer import Buffer
from .index_map import AXIS_SEPARATOR as SEP
from .index_map import IndexMap


def _named(name: str, fn: Callable, ndim: int | None = None) -> IndexMap:
    return IndexMap.from_func(fn, ndim=ndim, name=name)


# -- texture RFC conventions --------------------------------------------------------------------
def C0(ndim: int) -> IndexMap:
    """``texture``: ``[A, B, C, D, 4] -> [A*B*C, D, 4]`` for an already packed tensor."""
    return _named("C0", lambda *a: [*a[:-2], SEP, a[-2], SEP, a[-1]], ndim)


def C1(ndim: int) -> IndexMap:
    """``texture:weight``: ``[A, B, C, D, 4] -> [A, B*C*D, 4]`` for an already packed tensor."""
    return _named("C1", lambda *a: [a[0], SEP, *a[1:-1], SEP, a[-1]], ndim)


def nchw4c() -> IndexMap:
    """C0 on logical NCHW: packs channels by 4 (NCHW4c), image rows ``N*C/4*H``, columns ``W``."""
    return _named("nchw4c", lambda n, c, h, w: [n, c // 4, h, SEP, w, SEP, c % 4])


def oihw4o() -> IndexMap:
    """C1 on logical OIHW: packs output channels by 4 (OIHW4o), image rows ``O/4``, columns ``I*H*W``."""
    return _named("oihw4o", lambda o, i, h, w: [o // 4, SEP, i, h, w, SEP, o % 4])


# -- MACE memory-layout mappings (image [width, height] as MACE writes them) ------------------------
def mace_channel_major() -> IndexMap:
    """Activations ``[W * (C+3)/4, N * H]``: x = (c/4)*W + w, y = n*H + h, lane c%4."""
    return _named("mace_channel_major", lambda n, c, h, w: [n, h, SEP, c // 4, w, SEP, c % 4])


def mace_height_major() -> IndexMap:
    """Activations ``[W * C, N * (H+3)/4]``: x = c*W + w, y = n*H/4 + h/4, lane h%4."""
    return _named("mace_height_major", lambda n, c, h, w: [n, h // 4, SEP, c, w, SEP, h % 4])


def mace_width_major() -> IndexMap:
    """Activations ``[(W+3)/4 * C, N * H]``: x = c*W/4 + w/4, y = n*H + h, lane w%4."""
    return _named("mace_width_major", lambda n, c, h, w: [n, h, SEP, c, w // 4, SEP, w % 4])


def mace_conv2d_filter() -> IndexMap:
    """OIHW filter ``[I, (O+3)/4 * H * W]``: x = i, y = (o/4)*H*W + h*W + w, lane o%4."""
    return _named("mace_conv2d_filter", lambda o, i, h, w: [o // 4, h, w, SEP, i, SEP, o % 4])


def mace_depthwise_filter() -> IndexMap:
    """Depthwise filter, logical ``[C, M, H, W]`` (ONNX; MIHW with M=1 has the same order):
    ``[H * W * M, (C+3)/4]``: x = m*H*W + h*W + w, y = c/4, lane c%4."""
    return _named("mace_depthwise_filter", lambda c, m, h, w: [c // 4, SEP, m, h, w, SEP, c % 4])


def mace_argument() -> IndexMap:
    """1-D argument (bias) ``[(W+3)/4, 1]``: x = w/4, y = 0, lane w%4."""
    return _named("mace_argument", lambda w: [0, SEP, w // 4, SEP, w % 4])


# -- 2-D (dense) operands: rows by columns, packed by 4 along one axis --------------------------------
def row4() -> IndexMap:
    """``[A, B]`` packed by 4 along B (the last axis): image rows ``A``, columns ``B/4``."""
    return _named("row4", lambda a, b: [a, SEP, b // 4, SEP, b % 4])


def col4() -> IndexMap:
    """``[A, B]`` packed by 4 along A: image rows ``A/4``, columns ``B``."""
    return _named("col4", lambda a, b: [a // 4, SEP, b, SEP, a % 4])


# -- packed buffer layouts (1-D after flattening) -------------------------------------------------
def nchw4c_buffer() -> IndexMap:
    return _named("nchw4c_buffer", lambda n, c, h, w: [n, c // 4, h, w, c % 4])


def oihw4o_buffer() -> IndexMap:
    return _named("oihw4o_buffer", lambda o, i, h, w: [o // 4, i, h, w, o % 4])


def row4_buffer() -> IndexMap:
    return _named("row4_buffer", lambda a, b: [a, b // 4, b % 4])


def col4_buffer() -> IndexMap:
    return _named("col4_buffer", lambda a, b: [a // 4, b, a % 4])


def bias4_buffer() -> IndexMap:
    return _named("bias4_buffer", lambda w: [w // 4, w % 4])


LAYOUTS: dict[str, Callable[[], IndexMap]] = {
    f.__name__: f for f in (nchw4c, oihw4o, mace_channel_major, mace_height_major, mace_width_major,
                            mace_conv2d_filter, mace_depthwise_filter, mace_argument, row4, col4,
                            nchw4c_buffer, oihw4o_buffer, row4_buffer, col4_buffer, bias4_buffer)
}


def get_layout(name: str) -> IndexMap:
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r}; known layouts: {', '.join(LAYOUTS)}")
    return LAYOUTS[name]()


def default_layout(buf: Buffer) -> IndexMap | None:
    """The texture RFC defaults: C0 for ``texture``, C1 for ``texture:weight``; logical NCHW/OIHW are packed
    by 4 first. Buffers default to row-major (no map)."""
    if not buf.is_texture:
        return None
    rank, last = len(buf.shape), buf.shape[-1]
    if last == 4 and rank >= 3:
        return C0(rank) if buf.scope == "texture" else C1(rank)
    if rank == 4:
        return nchw4c() if buf.scope == "texture" else oihw4o()
    if rank == 1:
        return mace_argument()
    return None


def check_out_view(view, channels: int) -> tuple:
    """``()`` or ``(offset, total)``: a kernel's ``channels`` outputs written at channel ``offset`` of a tensor of
    ``total`` channels. The offset starts an RGBA pixel, so the kernel writes only whole pixels of its own."""
    view = tuple(int(v) for v in view or ())
    if view and (len(view) != 2 or view[0] % 4 or view[0] < 0 or view[0] + channels > view[1]):
        raise ValueError(f"out_view {list(view)}: (offset, total) with the offset a multiple of 4 and "
                         f"offset + {channels} channels within the total")
    return view


# -- MobileViT's patches: a convolution's output stored unfolded or folded (``Conv2dWorkload.patch_view``) ------

PATCH_VIEWS = ("unfold", "fold")


def patch_position(view: tuple, h, w) -> tuple:
    """Where a convolution's ``patch_view`` stores its output pixel (h, w) (ints, arrays or IR expressions alike):
    ``("unfold", ph, pw, nw)`` takes an image of ``nw`` patches a row to (patch position, patch) -- MobileViT's
    unfold of ph x pw patches -- and ``("fold", ph, pw, nw)`` takes (patch position h, patch w) back to the image."""
    kind, ph, pw, nw = view
    if kind == "unfold":
        return (h % ph) * pw + w % pw, (h // ph) * nw + w // pw
    return (w // nw) * ph + h // pw, (w % nw) * pw + h % pw


def patch_stored_shape(view: tuple, shape: tuple) -> tuple:
    """The (N, C, H, W) tensor a ``patch_view`` writes for an output of ``shape``; a ValueError where the view does
    not tile it."""
    kind, ph, pw, nw = (view[0], *(int(v) for v in view[1:]))
    n, c, h, w = shape
    if kind not in PATCH_VIEWS or min(ph, pw, nw) < 1:
        raise ValueError(f"patch_view {list(view)}: (unfold or fold, ph, pw, patches a row)")
    if kind == "unfold":
        if h % ph or w % pw or w // pw != nw:
            raise ValueError(f"patch_view unfold {ph}x{pw}: a {h}x{w} image of {nw} patches a row does not tile")
        return n, c, ph * pw, (h // ph) * nw
    if h != ph * pw or w % nw:
        raise ValueError(f"patch_view fold {ph}x{pw}: {h} patch positions and {w} patches, not {ph * pw} and "
                         f"rows of {nw}")
    return n, c, (w // nw) * ph, nw * pw


def apply_patch_view(view: tuple, x: np.ndarray) -> np.ndarray:
    """``x`` (N, C, H, W) as its ``patch_view`` stores it (``patch_position``)."""
    out = np.empty(patch_stored_shape(view, x.shape), x.dtype)
    h, w = np.indices(x.shape[2:])
    sh, sw = patch_position(view, h, w)
    out[:, :, sh, sw] = x[:, :, h, w]
    return out
