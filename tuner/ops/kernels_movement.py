"""Glue kernels of the data-movement and layout operators, in the style of ``kernels.py`` (logical tensors packed
by 4 along axis 1: ``nchw4c`` / ``row4`` textures or their ``_buffer`` forms; one work-item per output pixel on a
1-D range; computed in float32 whatever the storage type):

- ``slice_kernel``: channel gather (Split / Slice on channels, the ShuffleNet channel shuffle) combined with a
  strided window on H and W (Slice on H/W). The channel map must be ``src = (c % m) * a + (c // m) * b + off``
  (``channel_map`` fits one to an index list; slices and shuffles always fit).
- ``permute_kernel``: any permutation of a 4-D tensor's axes (or (1, 0) of a 2-D one): Transpose left over.
- ``pad_kernel``: constant / reflect / edge padding of H and W.
- ``resize_kernel``: nearest and (bi)linear resize of H and W with onnxruntime's coordinate transforms.
- ``upsample_zeros_kernel``: zero insertion (and cropping) for a ConvTranspose with dilation lowered onto conv2d.
- ``depth_to_space_kernel``: DepthToSpace (DCR / CRD, any block, a window): PixelShuffle, and the interleave of
  a strided ConvTranspose's phases.

Padding lanes (channels past C) of inputs are never read into a valid output lane; every kernel writes zeros
into its own output padding lanes.
"""
from __future__ import annotations

import numpy as np

from tuner.ir.builder import Builder
from tuner.ir.dtype import float32, int32
from tuner.ir.expr import Cast, as_expr, call, max_, min_, select

from tuner.ir.gather import channel_map, gather_pixel, lane as _lane, zero_padding_lanes as _zero_padding_lanes
from tuner.ir.layouts import check_out_view
from tuner.ops.token_views import token_view
from tuner.ops.kernels import (_check_dtype, _grid, _packed, _packed_shape, _pixel, _ravel, _scopes, _unravel, _vector,
                               _work_items)

PAD_MODES = ("constant", "reflect", "edge")
RESIZE_MODES = ("nearest", "linear")
COORD_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# -- helpers ----------------------------------------------------------------------------------------------
def _view_of(logical, idx: list) -> list:
    """Stored (view) indices of logical indices ``idx`` of a tensor of ``logical`` shape (token_views'
    token layout: (a, b, c) is stored as (a, c, 1, b))."""
    return [idx[0], idx[2], as_expr(0), idx[1]] if len(logical) == 3 else list(idx)


def _logical_of(logical, view_idx: list) -> list:
    return [view_idx[0], view_idx[3], view_idx[1]] if len(logical) == 3 else list(view_idx)


def _read_view(b: Builder, X, logical, idx: list, name: str):
    """The element at logical indices ``idx`` of ``X`` (a tensor of ``logical`` shape stored in its view): its
    pixel read once, the lane picked."""
    src = _view_of(logical, idx)
    sc = b.let(f"c{name}", src[1])
    return _lane(b.let(f"x{name}", X[_pixel([src[0], sc // 4, *src[2:]])]), sc % 4)


def _gather_view(b: Builder, Y, out_logical, max_work_group: int, value) -> None:
    """One pixel of ``Y`` (logical ``out_logical``, stored in its view) per work-item, each lane
    ``value(j, logical indices)`` -- padding lanes read a real element and are written zero."""
    yv = token_view(out_logical)
    C = yv[1]
    with _work_items(b, _grid(yv), max_work_group) as idx:
        lanes = []
        for j in range(4):
            e = list(idx)
            e[1] = min_(idx[1] * 4 + j, C - 1) if C % 4 else idx[1] * 4 + j
            v = value(j, _logical_of(out_logical, e))
            lanes.append(select(idx[1] * 4 + j < C, v, 0.0) if C % 4 and j >= C % 4 else v)
        b.store(Y, _pixel(idx), _vector(lanes))


# -- slice / channel gather -------------------------------------------------------------------------------
def slice_out_shape(in_shape, channels, rows=(0, 1, None), cols=(0, 1, None)) -> tuple:
    in_shape = _packed_shape(in_shape, "slice")
    if len(in_shape) == 2:
        return (in_shape[0], len(channels))
    return (in_shape[0], len(channels), rows[2] if rows[2] is not None else in_shape[2],
            cols[2] if cols[2] is not None else in_shape[3])


def slice_kernel(in_shape, channels, rows=(0, 1, None), cols=(0, 1, None), dtype: str = "float32",
                 in_scope: str = "texture", out_scope: str = "texture", max_work_group: int = 64, out_view=()):
    """``Y[n, k, h, w] = X[n, channels[k], r0 + h * rs, c0 + w * cs]`` with ``rows = (r0, rs, OH)`` and
    ``cols = (c0, cs, OW)`` (None: the input's extent; 2-D inputs: channels only). Contiguous channels
    (``channels[k] = off + k``) read at most two whole pixels per output pixel; other maps read one pixel per
    lane. ``out_view`` ``(offset, total)``: Y is a tensor of ``total`` channels, written from channel ``offset``
    (a multiple of 4; a concat's part, ``tuner.plan.views``)."""
    in_shape = _packed_shape(in_shape, "slice")
    _check_dtype(dtype)
    out = slice_out_shape(in_shape, channels, rows, cols)
    C, Cout = in_shape[1], out[1]
    if min(channels) < 0 or max(channels) >= C:
        raise ValueError(f"slice channels {list(channels)[:8]}...: out of range for {C} channels")
    if channel_map(channels) is None:
        raise ValueError(f"slice channels {list(channels)}: not of the form (c % m) * a + (c // m) * b + off")
    rank = len(in_shape)
    if rank == 4:
        for (start, step, count), extent, what in ((rows, in_shape[2], "rows"), (cols, in_shape[3], "cols")):
            count = extent if count is None else count
            if not (0 <= start < extent and 0 <= start + (count - 1) * step < extent and step != 0):
                raise ValueError(f"slice {what} {(start, step, count)} outside an extent of {extent}")
    view = check_out_view(out_view, Cout)
    if view and rank != 4:
        raise ValueError("slice out_view: a 4-D output only")
    stored = (out[0], view[1], *out[2:]) if view else out
    X, Y = _packed("X", in_shape, dtype, in_scope), _packed("Y", stored, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(out), max_work_group) as idx:
        n, cb = idx[0], idx[1]
        at = _pixel([n, cb + view[0] // 4, *idx[2:]]) if view else _pixel(idx)  # where the pixel is stored
        rest = []
        if rank == 4:
            rest = [rows[0] + idx[2] * rows[1] if rows[:2] != (0, 1) else idx[2],
                    cols[0] + idx[3] * cols[1] if cols[:2] != (0, 1) else idx[3]]
        b.store(Y, at, gather_pixel(b, X, C, n, cb, rest, channels))
    return b.kernel("slice", [X, Y])


def slice_reference(x, channels, rows=(0, 1, None), cols=(0, 1, None)) -> np.ndarray:
    x = np.asarray(x, np.float64)[:, list(channels)]
    if x.ndim == 4:
        for axis, (start, step, count) in ((2, rows), (3, cols)):
            count = x.shape[axis] if count is None else count
            x = np.take(x, [start + k * step for k in range(count)], axis=axis)
    return x


# -- permute ----------------------------------------------------------------------------------------------
def permute_kernel(in_shape, perm, dtype: str = "float32", in_scope: str = "texture", out_scope: str = "texture",
                   max_work_group: int = 64):
    """``Y = transpose(X, perm)`` for a 4-D ``X`` (any perm) or a 2-D one; one output pixel per work-item, each
    lane gathered from its source element (one pixel load per lane unless axis 1 stays axis 1)."""
    in_shape = _packed_shape(in_shape, "permute")
    _check_dtype(dtype)
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(len(in_shape))):
        raise ValueError(f"permute perm {list(perm)} for a {len(in_shape)}-D input")
    out = tuple(in_shape[p] for p in perm)
    X, Y = _packed("X", in_shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    b = Builder()

    def source(e):
        src = [None] * len(perm)
        for k, p in enumerate(perm):
            src[p] = e[k]
        return src

    if perm[1] == 1:  # channels stay: whole pixels
        with _work_items(b, _grid(out), max_work_group) as idx:
            b.store(Y, _pixel(idx), _zero_padding_lanes(b, X[_pixel(source(idx))], idx[1], out[1]))
    else:
        _gather_view(b, Y, out, max_work_group, lambda j, e: _read_view(b, X, in_shape, source(e), str(j)))
    return b.kernel("permute", [X, Y])


def permute_reference(x, perm) -> np.ndarray:
    return np.transpose(np.asarray(x, np.float64), perm)


# -- pad --------------------------------------------------------------------------------------------------
def pad_out_shape(shape, pads) -> tuple:
    N, C, H, W = shape
    t, l, bt, r = pads
    return N, C, H + t + bt, W + l + r


def pad_kernel(shape, pads, mode: str = "constant", value: float = 0.0, dtype: str = "float32",
               in_scope: str = "texture", out_scope: str = "texture", max_work_group: int = 64):
    """Pad H and W of NCHW ``X`` by ``pads = (top, left, bottom, right)`` (>= 0): ``constant`` (``value``),
    ``reflect`` (mirror without repeating the edge; pads < the extent) or ``edge`` (repeat the edge)."""
    shape = _packed_shape(shape, "pad")
    _check_dtype(dtype)
    if len(shape) != 4:
        raise ValueError(f"pad shape {list(shape)}: want 4-D NCHW")
    if mode not in PAD_MODES:
        raise ValueError(f"pad mode {mode!r}: one of {', '.join(PAD_MODES)}")
    pads = tuple(int(p) for p in pads)
    if len(pads) != 4 or min(pads) < 0:
        raise ValueError(f"pads {list(pads)}: want (top, left, bottom, right), all >= 0")
    N, C, H, W = shape
    t, l, bt, r = pads
    if mode == "reflect" and (max(t, bt) >= H or max(l, r) >= W):
        raise ValueError(f"reflect pads {list(pads)} must be smaller than the input's {H}x{W}")
    out = pad_out_shape(shape, pads)
    X, Y = _packed("X", shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(out), max_work_group) as (n, cb, oh, ow):
        ih, iw = oh - t, ow - l
        if mode == "constant":
            inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            hh, ww = b.let("ih", min_(max_(ih, 0), H - 1)), b.let("iw", min_(max_(iw, 0), W - 1))
            v = X[_pixel([n, cb, hh, ww])]
            v = select(inside, v, float(value)) if max(pads) > 0 else v
        else:
            if mode == "reflect":
                hh = b.let("ih", select(ih < 0, 0 - ih, select(ih >= H, 2 * (H - 1) - ih, ih)))
                ww = b.let("iw", select(iw < 0, 0 - iw, select(iw >= W, 2 * (W - 1) - iw, iw)))
            else:
                hh, ww = b.let("ih", min_(max_(ih, 0), H - 1)), b.let("iw", min_(max_(iw, 0), W - 1))
            v = X[_pixel([n, cb, hh, ww])]
        b.store(Y, _pixel([n, cb, oh, ow]), _zero_padding_lanes(b, v, cb, C))
    return b.kernel(f"pad_{mode}", [X, Y])


def pad_reference(x, pads, mode: str = "constant", value: float = 0.0) -> np.ndarray:
    t, l, bt, r = pads
    width = ((0, 0), (0, 0), (t, bt), (l, r))
    x = np.asarray(x, np.float64)
    return np.pad(x, width, mode="constant", constant_values=value) if mode == "constant" else np.pad(x, width,
                                                                                                     mode=mode)


# -- resize -----------------------------------------------------------------------------------------------
def _floor(v):
    return call("floor", [v], "float32")


def _source_coord(o, in_len: int, out_len: int, scale: float, coord: str):
    """onnxruntime's source coordinate (float32) of output index ``o`` along one axis."""
    of = Cast(float32, o)
    if coord == "asymmetric":
        return of / float(scale)
    if coord == "align_corners":
        return of * float(in_len - 1) / float(out_len - 1) if out_len > 1 else as_expr(0.0)
    if coord == "pytorch_half_pixel" and out_len <= 1:
        return as_expr(0.0)
    return (of + 0.5) / float(scale) - 0.5


def _np_source_coord(o: np.ndarray, in_len: int, out_len: int, scale: float, coord: str) -> np.ndarray:
    o = o.astype(np.float32)
    s = np.float32(scale)
    if coord == "asymmetric":
        return o / s
    if coord == "align_corners":
        return o * np.float32(in_len - 1) / np.float32(out_len - 1) if out_len > 1 else np.zeros_like(o)
    if coord == "pytorch_half_pixel" and out_len <= 1:
        return np.zeros_like(o)
    return (o + np.float32(0.5)) / s - np.float32(0.5)


def resize_kernel(shape, out_hw, mode: str = "nearest", coord: str = "half_pixel",
                  nearest: str = "round_prefer_floor", scales=None, dtype: str = "float32",
                  in_scope: str = "texture", out_scope: str = "texture", max_work_group: int = 64):
    """Resize H and W of NCHW ``X`` to ``out_hw`` (ONNX Resize as onnxruntime computes it): ``scales`` (sh, sw)
    are the float scales (default out / in); ``coord`` the coordinate_transformation_mode; ``nearest`` the
    nearest_mode; ``linear`` interpolates the 2x2 neighbourhood of the clamped source point."""
    shape = _packed_shape(shape, "resize")
    _check_dtype(dtype)
    if len(shape) != 4:
        raise ValueError(f"resize shape {list(shape)}: want 4-D NCHW")
    if mode not in RESIZE_MODES or coord not in COORD_MODES or nearest not in NEAREST_MODES:
        raise ValueError(f"resize mode {mode!r} / coordinate mode {coord!r} / nearest mode {nearest!r}: "
                         f"modes {RESIZE_MODES}, coordinate modes {COORD_MODES}, nearest modes {NEAREST_MODES}")
    N, C, H, W = shape
    OH, OW = (int(v) for v in out_hw)
    scales = tuple(float(np.float32(s)) for s in (scales or (np.float32(OH) / np.float32(H),
                                                              np.float32(OW) / np.float32(W))))
    out = (N, C, OH, OW)
    X, Y = _packed("X", shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(out), max_work_group) as (n, cb, oh, ow):
        coords = []
        for o, i_len, o_len, s, name in ((oh, H, OH, scales[0], "h"), (ow, W, OW, scales[1], "w")):
            x = b.let(f"s{name}", _source_coord(o, i_len, o_len, s, coord))
            if mode == "nearest":
                r = {"floor": _floor(x), "ceil": call("ceil", [x], "float32"),
                     "round_prefer_floor": call("ceil", [x - 0.5], "float32"),
                     "round_prefer_ceil": _floor(x + 0.5)}[nearest]
                coords.append(b.let(f"i{name}", min_(max_(Cast(int32, r), 0), i_len - 1)))
            else:
                xc = b.let(f"c{name}", min_(max_(x, 0.0), float(i_len - 1)))
                i0 = b.let(f"i{name}0", min_(Cast(int32, xc), i_len - 1))
                i1 = b.let(f"i{name}1", min_(i0 + 1, i_len - 1))
                coords.append((i0, i1, b.let(f"f{name}", xc - Cast(float32, i0))))
        if mode == "nearest":
            v = X[_pixel([n, cb, *coords])]
        else:
            (h0, h1, fh), (w0, w1, fw) = coords
            top = b.let("top", X[_pixel([n, cb, h0, w0])] * (1.0 - fw) + X[_pixel([n, cb, h0, w1])] * fw)
            bot = b.let("bot", X[_pixel([n, cb, h1, w0])] * (1.0 - fw) + X[_pixel([n, cb, h1, w1])] * fw)
            v = top * (1.0 - fh) + bot * fh
        b.store(Y, _pixel([n, cb, oh, ow]), _zero_padding_lanes(b, v, cb, C))
    return b.kernel(f"resize_{mode}", [X, Y])


def resize_reference(x, out_hw, mode: str = "nearest", coord: str = "half_pixel",
                     nearest: str = "round_prefer_floor", scales=None) -> np.ndarray:
    x = np.asarray(x, np.float64)
    H, W = x.shape[2:]
    OH, OW = out_hw
    scales = scales or (np.float32(OH) / np.float32(H), np.float32(OW) / np.float32(W))
    maps = []
    for i_len, o_len, s in ((H, OH, scales[0]), (W, OW, scales[1])):
        src = _np_source_coord(np.arange(o_len), i_len, o_len, s, coord)
        if mode == "nearest":
            r = {"floor": np.floor(src), "ceil": np.ceil(src), "round_prefer_floor": np.ceil(src - np.float32(0.5)),
                 "round_prefer_ceil": np.floor(src + np.float32(0.5))}[nearest]
            maps.append(np.clip(r.astype(np.int64), 0, i_len - 1))
        else:
            xc = np.clip(src, 0, i_len - 1)
            i0 = np.minimum(xc.astype(np.int64), i_len - 1)
            maps.append((i0, np.minimum(i0 + 1, i_len - 1), (xc - i0).astype(np.float64)))
    if mode == "nearest":
        return x[:, :, maps[0]][:, :, :, maps[1]]
    (h0, h1, fh), (w0, w1, fw) = maps
    rows = x[:, :, h0] * (1 - fh)[:, None] + x[:, :, h1] * fh[:, None]
    return rows[..., w0] * (1 - fw) + rows[..., w1] * fw


# -- zero insertion (ConvTranspose) -----------------------------------------------------------------------
def upsample_zeros_kernel(shape, out_hw, stride, shift=(0, 0), dtype: str = "float32", in_scope: str = "texture",
                          out_scope: str = "texture", max_work_group: int = 64):
    """``Y[n, c, h, w] = X[n, c, (h + shift_h) / s_h, (w + shift_w) / s_w]`` where both divide exactly and land
    inside ``X``, else 0: the input with ``stride - 1`` zeros between pixels, its first ``shift`` rows/cols
    dropped."""
    shape = _packed_shape(shape, "upsample_zeros")
    _check_dtype(dtype)
    N, C, H, W = shape
    out = (N, C, int(out_hw[0]), int(out_hw[1]))
    (sh, sw), (th, tw) = (int(s) for s in stride), (int(s) for s in shift)
    X, Y = _packed("X", shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(out), max_work_group) as (n, cb, oh, ow):
        ph, pw = b.let("ph", oh + th), b.let("pw", ow + tw)
        qh, qw = b.let("qh", ph // sh), b.let("qw", pw // sw)
        ok = (ph % sh).equal(0) & (pw % sw).equal(0) & (qh < H) & (qw < W)
        v = X[_pixel([n, cb, min_(qh, H - 1), min_(qw, W - 1)])]
        b.store(Y, _pixel([n, cb, oh, ow]), _zero_padding_lanes(b, select(ok, v, 0.0), cb, C))
    return b.kernel("upsample_zeros", [X, Y])


def upsample_zeros_reference(x, out_hw, stride, shift=(0, 0)) -> np.ndarray:
    x = np.asarray(x, np.float64)
    N, C, H, W = x.shape
    (sh, sw), (th, tw) = stride, shift
    full = np.zeros((N, C, max(th + out_hw[0], (H - 1) * sh + 1), max(tw + out_hw[1], (W - 1) * sw + 1)))
    full[:, :, :(H - 1) * sh + 1:sh, :(W - 1) * sw + 1:sw] = x
    return full[:, :, th:th + out_hw[0], tw:tw + out_hw[1]]


# -- depth to space (PixelShuffle, ConvTranspose's phases) --------------------------------------------------
D2S_MODES = ("DCR", "CRD")


def _d2s_channel(mode: str, c, phase, C: int, blocks: int):
    """The input channel that holds output channel ``c`` at block position ``phase`` (= py * bw + px)."""
    return phase * C + c if mode == "DCR" else c * blocks + phase


def depth_to_space_kernel(in_shape, block, mode: str = "DCR", crop=(0, 0), size=None, dtype: str = "float32",
                          in_scope: str = "texture", out_scope: str = "texture", max_work_group: int = 64):
    """ONNX DepthToSpace with a block of ``(bh, bw)`` and a window: ``Y[n, c, y, x] = Z[n, c, y + top, x + left]``
    where ``Z`` (N, C, H * bh, W * bw) is the rearranged input, ``Z[n, c, qy * bh + py, qx * bw + px] =
    X[n, k, qy, qx]`` with ``k = (py * bw + px) * C + c`` (``DCR``) or ``c * bh * bw + py * bw + px`` (``CRD``).
    ``size`` (OH, OW): the window (default: all of Z). One output pixel per work-item; in DCR with C a multiple of
    4 it is one whole input pixel, otherwise each lane is gathered."""
    in_shape = _packed_shape(in_shape, "depth_to_space")
    _check_dtype(dtype)
    if mode not in D2S_MODES:
        raise ValueError(f"depth_to_space mode {mode!r}: one of {D2S_MODES}")
    N, K, H, W = in_shape
    bh, bw = (int(v) for v in block)
    blocks = bh * bw
    if bh < 1 or bw < 1 or K % blocks:
        raise ValueError(f"depth_to_space of {K} channels in blocks of {bh}x{bw}: the channels must divide")
    C = K // blocks
    top, left = (int(v) for v in crop)
    oh, ow = (H * bh - top, W * bw - left) if size is None else (int(v) for v in size)
    if top < 0 or left < 0 or oh < 1 or ow < 1 or top + oh > H * bh or left + ow > W * bw:
        raise ValueError(f"depth_to_space window {(top, left)} + {(oh, ow)} outside {(H * bh, W * bw)}")
    out = (N, C, oh, ow)
    X, Y = _packed("X", in_shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(out), max_work_group) as (n, cb, y, x):
        zy, zx = b.let("zy", y + top), b.let("zx", x + left)
        qy, qx = b.let("qy", zy // bh), b.let("qx", zx // bw)
        phase = b.let("phase", (zy % bh) * bw + zx % bw)
        if mode == "DCR" and C % 4 == 0:  # the pixel's 4 channels are one pixel of the input
            b.store(Y, _pixel([n, cb, y, x]), X[_pixel([n, phase * (C // 4) + cb, qy, qx])])
        else:
            lanes = []
            for j in range(4):
                c = min_(cb * 4 + j, C - 1) if C % 4 else cb * 4 + j
                src = b.let(f"k{j}", _d2s_channel(mode, c, phase, C, blocks))
                v = _lane(b.let(f"x{j}", X[_pixel([n, src // 4, qy, qx])]), src % 4)
                lanes.append(select(cb * 4 + j < C, v, 0.0) if C % 4 and j >= C % 4 else v)
            b.store(Y, _pixel([n, cb, y, x]), _vector(lanes))
    return b.kernel("depth_to_space", [X, Y])


def depth_to_space_reference(x, block, mode: str = "DCR", crop=(0, 0), size=None) -> np.ndarray:
    x = np.asarray(x, np.float64)
    N, K, H, W = x.shape
    bh, bw = block
    C = K // (bh * bw)
    if mode == "DCR":
        z = x.reshape(N, bh, bw, C, H, W).transpose(0, 3, 4, 1, 5, 2)
    else:
        z = x.reshape(N, C, bh, bw, H, W).transpose(0, 1, 4, 2, 5, 3)
    z = z.reshape(N, C, H * bh, W * bw)
    top, left = crop
    oh, ow = (H * bh - top, W * bw - left) if size is None else size
    return z[:, :, top:top + oh, left:left + ow]


GLUE = {
    "slice": (slice_kernel, slice_reference),
    "permute": (permute_kernel, permute_reference),
    "pad": (pad_kernel, pad_reference),
    "resize": (resize_kernel, resize_reference),
    "upsample_zeros": (upsample_zeros_kernel, upsample_zeros_reference),
    "depth_to_space": (depth_to_space_kernel, depth_to_space_reference),
}


# -- strided copy (attention's reshapes and transposes, passes_tokens) ---------------------------------------
def strided_copy_kernel(src_shape, offset: int, shape, strides, dtype: str = "float32", in_scope: str = "texture",
                        out_scope: str = "texture", max_work_group: int = 64, out_shape=None,
                        divisor_scope: str | None = None, divisor_index: tuple | None = None):
    """``Y`` = the strided view (``shape``, element ``i`` at ``offset + sum(i_k * strides[k])``) of ``X``'s
    row-major elements (logical ``src_shape``), read out in row-major order as ``out_shape`` (default
    ``shape``); each side stored in its view (``token_views.token_view``: 3-D tensors as (a, c, 1, b), 4-D
    NCHW4c, 2-D rows packed by 4). One output pixel per work-item, each lane gathered. ``divisor_scope``: each
    element is divided by ``D``'s element of its source row (D: ``src_shape`` with a last axis of 1, stored in
    that scope) -- a row normalization read with the copy (``passes_attention.divisions_into_copies``).
    ``divisor_index`` ``(d_shape, d_offset, d_strides)``: ``D`` has logical shape ``d_shape`` instead, and a source
    element at coordinates ``s`` is divided by ``D``'s row-major element ``d_offset + sum(s_k * d_strides[k])``
    (clamped into ``D``: elements no view reads may point outside it) -- the norms of a copy's rows read off the
    channels of its source (``passes_attention.norms_read_in_place``)."""
    from math import prod

    _check_dtype(dtype)
    src_shape, shape = tuple(int(d) for d in src_shape), tuple(int(d) for d in shape)
    out_shape = shape if out_shape is None else tuple(int(d) for d in out_shape)
    if prod(out_shape) != prod(shape) or len(out_shape) not in (2, 3, 4):
        raise ValueError(f"strided_copy: out_shape {list(out_shape)} for a view of shape {list(shape)}")
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(shape) or len(src_shape) not in (2, 3, 4):
        raise ValueError(f"strided_copy of {list(src_shape)} to {list(shape)} with strides {list(strides)}: "
                         f"2-D to 4-D tensors, one stride per output axis")
    last = int(offset) + sum((d - 1) * s for d, s in zip(shape, strides))
    if min(offset, last) < 0 or max(offset, last) >= prod(src_shape):
        raise ValueError(f"strided_copy: the view (offset {offset}, strides {list(strides)}, shape {list(shape)}) "
                         f"leaves the source's {prod(src_shape)} elements")
    X, Y = _packed("X", token_view(src_shape), dtype, in_scope), _packed("Y", token_view(out_shape), dtype, out_scope)
    d_shape = (*src_shape[:-1], 1)
    if divisor_index is not None:
        d_shape, d_offset, d_strides = tuple(int(d) for d in divisor_index[0]), int(divisor_index[1]), \
            tuple(int(x) for x in divisor_index[2])
        if len(d_strides) != len(src_shape) or len(d_shape) not in (2, 3, 4):
            raise ValueError(f"strided_copy: divisor_index {divisor_index} for a source of shape {list(src_shape)}: "
                             f"one stride per source axis, a 2-D to 4-D divisor")
    D = _packed("D", token_view(d_shape), dtype, divisor_scope) if divisor_scope else None
    b = Builder()

    def value(j, lo):
        if out_shape != shape:
            lo = _unravel(b.let(f"o{j}", _ravel(lo, out_shape)), shape)
        flat = as_expr(int(offset))
        for i, s in zip(lo, strides):
            if s:
                flat = flat + i * s
        f = b.let(f"f{j}", flat)
        src = [b.let(f"s{j}_{k}", v) for k, v in enumerate(_unravel(f, src_shape))]
        v = _read_view(b, X, src_shape, src, str(j))
        if D is None:
            return v
        if divisor_index is None:
            return v / _read_view(b, D, d_shape, [*src[:-1], as_expr(0)], f"d{j}")
        flat_d = as_expr(d_offset)
        for i, s in zip(src, d_strides):
            if s:
                flat_d = flat_d + i * s
        fd = b.let(f"fd{j}", min_(max_(flat_d, 0), prod(d_shape) - 1))
        return v / _read_view(b, D, d_shape, [b.let(f"e{j}_{k}", e) for k, e in enumerate(_unravel(fd, d_shape))],
                              f"d{j}")

    _gather_view(b, Y, out_shape, max_work_group, value)
    return b.kernel("strided_copy", [X, Y] if D is None else [X, D, Y])


def concat_view_kernel(shapes, axis: int, dtype: str = "float32", in_scopes="texture", out_scope: str = "texture",
                       max_work_group: int = 64):
    """``Y = concat(X0, X1, ..., axis)`` of 2-D to 4-D tensors of logical ``shapes``, each stored in its view
    (``token_views.token_view``): a ViT's class token joined to its patch tokens along the token axis. One
    output pixel per work-item, each lane taken from the input whose range along ``axis`` holds it."""
    _check_dtype(dtype)
    shapes = [tuple(int(d) for d in s) for s in shapes]
    rank = len(shapes[0])
    if rank not in (2, 3, 4) or not 0 <= axis < rank or any(
            len(s) != rank or s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:] for s in shapes):
        raise ValueError(f"concat_view of {[list(s) for s in shapes]} along axis {axis}: 2-D to 4-D tensors that "
                         f"differ only along it")
    out = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
    scopes = _scopes(in_scopes, len(shapes), "concat_view")
    xs = [_packed(f"X{k}", token_view(s), dtype, sc) for k, (s, sc) in enumerate(zip(shapes, scopes))]
    Y = _packed("Y", token_view(out), dtype, out_scope)
    b = Builder()

    def value(j, lo):
        lo = [b.let(f"l{j}_{k}", v) for k, v in enumerate(lo)]
        v, start = None, 0
        for k, (x, s) in enumerate(zip(xs, shapes)):
            src = list(lo)
            src[axis] = min_(max_(lo[axis] - start, 0), s[axis] - 1)
            got = _read_view(b, x, s, src, f"{j}_{k}")
            v = got if v is None else select(lo[axis] < start, v, got)
            start += s[axis]
        return v

    _gather_view(b, Y, out, max_work_group, value)
    return b.kernel("concat_view", [*xs, Y])
