"""The model pipeline's glue kernels, which are not tuned: elementwise add / bias add / ReLU / clip, unary
activations (any spec of ``tuner.ir.activations``) and math (erf, sqrt, exp, neg, abs, reciprocal, square,
pow(p)), binary add / sub / mul / div / prelu with broadcasting (per-channel constants, squeeze-excitation's
(N, C, 1, 1) gate over H, W, a value per image), mean / max / sum / L2 over H, W, over the channels
or over all three (a model's reductions over H, W run the ``spatial_reduce`` template, its group norms the
``group_norm`` template, its softmax and layer norms ``channel_reduce``'s), max and average pooling (global
average pooling and ceil mode included), channel concat, and relayout (model-boundary packing,
Flatten/Reshape, texture <-> buffer copies).

Each builder returns an IR ``Kernel`` over LOGICAL tensors, like the templates: 4-D activations are NCHW
stored as a ``texture`` with layout ``nchw4c`` or a ``global`` buffer with ``nchw4c_buffer``; 2-D (N, K)
tensors are ``row4`` / ``row4_buffer``. Both pack axis 1 by 4, so one RGBA pixel holds 4 channels (or
features) and every kernel here works on rank 2 and rank 4 alike. Operand scopes are the user-facing
``texture`` or ``buffer``; ``dtype`` is the storage type (``float32`` or ``float16``), computed in float32.

Work mapping: one work-item per output pixel (or per input pixel for a scatter into a plain buffer), the
pixels numbered row-major (W fastest, so neighbouring work-items read neighbouring texels) on one 1-D range,
work-groups of a power of two no larger than 64 or the device's ``max_work_group``; a partial last group is
guarded. Padding lanes (channels past C) of inputs are never assumed to be anything: no output lane of
concat or relayout depends on them, and those two write zeros into their own padding lanes.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from math import prod

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Broadcast, Cast, ExtractLane, Ramp, as_expr, call, max_, min_, select
from tuner.ir.dtype import float32
from tuner.ir.kernel import Program
from tuner.ir.gather import make_vector as _vector, pixel_index as _pixel, shifted_pixel, zero_padding_lanes
from tuner.templates.common import bias_buffer
from tuner.templates.reduction import (as_stored, last_group_statistics, norm_units, stats_workspaces, unit_factors,
                                       unit_first_block, unit_normed)

DTYPES = ("float32", "float16")
SCOPES = ("texture", "buffer")
ACTIVATIONS = ("none", "relu", "relu6", "clip")
UNARY = ("relu", "relu6", "clip")
ELEMENTWISE_OPS = ("add", "bias_add") + UNARY
# packed layouts by rank: (texture layout, buffer layout); both pack axis 1 by 4
PACKED = {4: ("nchw4c", "nchw4c_buffer"), 2: ("row4", "row4_buffer")}
LOWEST = -3.4028234663852886e38  # -FLT_MAX: the max-pool identity (every window holds a pixel)


# -- operands ---------------------------------------------------------------------------------------------
def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: storage must be one of {', '.join(DTYPES)}")


def _check_scope(scope: str, what: str) -> None:
    if scope not in SCOPES:
        raise ValueError(f"{what} scope {scope!r}: use 'texture' or 'buffer'")


def _packed_shape(shape, what: str) -> tuple:
    shape = tuple(int(s) for s in shape)
    if len(shape) not in PACKED or min(shape) < 1:
        raise ValueError(f"{what} shape {list(shape)}: want a positive 4-D NCHW or 2-D (N, K) shape")
    return shape


def _per_channel(name: str, channels: int, dtype: str, scope: str):
    """A constant with one value per channel, beside an operand in ``scope``: a 1-D texture (MACE argument image)
    or a packed float4 buffer."""
    return buffer(name, (channels,), dtype, *(("texture:weight", "mace_argument") if scope == "texture"
                                              else ("global", "bias4_buffer")))


def _epilogue(v, pix, S=None, R=None, RS=None):
    """A fused glue epilogue on the value of output pixel ``pix``: times the per-channel ``S``, plus ``R`` (times
    the per-channel ``RS``)."""
    if S is not None:
        v = v * S[pix[1]]
    if R is None:
        return v
    return v + (R[pix] * RS[pix[1]] if RS is not None else R[pix])


def _packed(name: str, shape: tuple, dtype: str, scope: str):
    """An activation operand packed by 4 along axis 1: nchw4c / row4 texture or their packed buffers."""
    _check_scope(scope, name)
    tex, buf = PACKED[len(shape)]
    return buffer(name, shape, dtype, *(("texture", tex) if scope == "texture" else ("global", buf)))


def _scopes(in_scopes, n: int, what: str) -> tuple:
    scopes = (in_scopes,) * n if isinstance(in_scopes, str) else tuple(in_scopes)
    if len(scopes) != n:
        raise ValueError(f"{what} takes {n} inputs, got {len(scopes)} in_scopes {list(scopes)}: give one "
                         f"scope per input, or one string for all")
    for s in scopes:
        _check_scope(s, what + " input")
    return scopes


def _grid(shape: tuple) -> tuple:
    """The pixel grid of a packed tensor: axis 1 counted in blocks of 4."""
    return (shape[0], -(-shape[1] // 4), *shape[2:])


def _local_size(total: int, max_work_group: int, most: int = 64) -> int:
    if isinstance(max_work_group, bool) or not isinstance(max_work_group, int) or max_work_group < 1:
        raise ValueError(f"max_work_group {max_work_group!r}: the device's work-group limit, a positive int")
    cap = 1 << (min(most, max_work_group).bit_length() - 1)  # the largest power of two within both
    return min(cap, 1 << max(0, (total - 1).bit_length()))


def _unravel(p, shape: tuple) -> list:
    """Row-major indices of flat index ``p`` (an int expression >= 0) in ``shape``."""
    out, stride = [], prod(shape)
    for extent in shape:
        stride //= extent
        out.append(as_expr(0) if extent == 1 else (p // stride) % extent if stride * extent < prod(shape)
                   else p // stride)
    return out


def _ravel(idx, shape: tuple):
    flat, stride = as_expr(0), 1
    for i, extent in zip(reversed(idx), reversed(shape)):
        if extent > 1:
            flat = flat + i * stride
        stride *= extent
    return flat


@contextmanager
def _work_items(b: Builder, grid: tuple, max_work_group: int):
    """One work-item per point of ``grid`` on a 1-D range; yields the point's indices (named lets)."""
    total = prod(grid)
    local = _local_size(total, max_work_group)
    groups = -(-total // local)
    with b.loop("g", groups, "group.0") as g, b.loop("l", local, "local.0") as lid:
        p = b.let("p", g * local + lid)
        with b.if_(p < total) if groups * local != total else nullcontext():
            yield [b.let(f"i{k}", e) if extent > 1 else e
                   for k, (e, extent) in enumerate(zip(_unravel(p, grid), grid))]


def _check_activation(activation: str) -> None:
    if activation in ACTIVATIONS:
        return
    try:
        canonical(activation)
    except ValueError as e:
        raise ValueError(f"activation {activation!r}: none, clip (with ``clip``) or a spec of "
                         f"tuner.ir.activations ({e})") from None


def _activate(v, activation: str, clip: tuple):
    if activation not in ACTIVATIONS:  # any spec of tuner.ir.activations: hardswish, sigmoid, leaky_relu(0.1), ...
        return apply_ir(activation, v)
    if activation in ("relu", "relu6"):
        v = max_(v, 0.0)
    if activation == "relu6":
        v = min_(v, 6.0)
    if activation == "clip":  # an infinite bound (ONNX Clip with only min or max) is no clamp
        lo, hi = float(clip[0]), float(clip[1])
        v = max_(v, lo) if lo > -np.inf else v
        v = min_(v, hi) if hi < np.inf else v
    return v


def _np_activate(v: np.ndarray, activation: str, clip: tuple) -> np.ndarray:
    if activation not in ACTIVATIONS:
        return apply_numpy(activation, v)
    if activation in ("relu", "relu6"):
        v = np.maximum(v, 0)
    if activation == "relu6":
        v = np.minimum(v, 6)
    if activation == "clip":
        v = np.clip(v, clip[0], clip[1])
    return v


# -- elementwise ------------------------------------------------------------------------------------------
def _channel_views(views, n: int, shape: tuple) -> tuple:
    """Per activation input ``()`` or ``(channels, offset)``: the input is channels ``offset``..``offset + C`` of a
    tensor of ``channels`` channels (same N, H, W), read in place (``shifted_pixel``: any offset)."""
    views = tuple(tuple(int(x) for x in v) for v in views) if views else ((),) * n
    if len(views) != n:
        raise ValueError(f"in_views {list(views)}: one per activation input ({n})")
    for v in views:
        if v and (len(v) != 2 or v[1] < 0 or v[1] + shape[1] > v[0] or len(shape) != 4):
            raise ValueError(f"in_view {list(v)}: (channels, offset) of a 4-D input, offset + {shape[1]} within "
                             f"the channels")
    return views


def elementwise_kernel(shape, op: str, dtype: str = "float32", in_scopes="texture", out_scope: str = "texture",
                       activation: str = "none", clip: tuple = (0.0, 6.0), max_work_group: int = 64, in_views=()):
    """One pixel (4 channels) per work-item over a 4-D NCHW or 2-D (N, K) ``shape``.

    ``op`` and params (``in_scopes``: one scope per input, or one string for all):
    - ``add``: ``X0``, ``X1`` (both ``shape``) -> ``Y = act(X0 + X1)``
    - ``bias_add``: ``X`` (``shape``), ``B`` (``(shape[1],)``: ``bias4_buffer`` buffer or ``mace_argument``
      texture) -> ``Y = act(X + B[c])``
    - ``relu``, ``relu6``, ``clip``: ``X`` -> ``Y = op(X)``; ``clip`` clamps to ``clip = (lo, hi)``
    ``activation`` (none, relu, relu6, clip) follows ``add`` / ``bias_add``. ``in_views`` (``_channel_views``):
    an activation input read in place as a channel slice of a larger tensor (EfficientViT's channel chunks; at an
    offset inside a pixel, EdgeNeXt's split of 88 channels into 30, 30 and 28: two loads a pixel); with a view, the
    output's padding lanes are written zero."""
    shape = _packed_shape(shape, "elementwise")
    _check_dtype(dtype)
    if op not in ELEMENTWISE_OPS:
        raise ValueError(f"elementwise op {op!r}: one of {', '.join(ELEMENTWISE_OPS)}")
    _check_activation(activation)
    if op in UNARY and activation != "none":
        raise ValueError(f"elementwise op {op!r} is itself the activation; leave activation='none'")
    if (op == "clip" or activation == "clip") and not float(clip[0]) <= float(clip[1]):
        raise ValueError(f"clip {tuple(clip)}: want (lo, hi) with lo <= hi (either may be infinite)")
    scopes = _scopes(in_scopes, 1 if op in UNARY else 2, f"elementwise {op}")
    views = _channel_views(in_views, 2 if op == "add" else 1, shape)
    full = [(shape[0], v[0], *shape[2:]) if v else shape for v in views]  # what each activation input binds
    if op == "add":
        inputs = [_packed("X0", full[0], dtype, scopes[0]), _packed("X1", full[1], dtype, scopes[1])]
    elif op == "bias_add":
        inputs = [_packed("X", full[0], dtype, scopes[0]), bias_buffer(shape[1], dtype, scopes[1])]
    else:
        inputs = [_packed("X", full[0], dtype, scopes[0])]
    Y = _packed("Y", shape, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(shape), max_work_group) as idx:
        pix = _pixel(idx)
        at = [shifted_pixel(b, x, idx[0], idx[1], idx[2:], -v[1], v[0], f"x{k}") if v else x[pix]
              for k, (x, v) in enumerate(zip(inputs, views))]
        if op == "add":
            v = at[0] + at[1]
        elif op == "bias_add":
            v = at[0] + inputs[1][pix[1]]
        else:
            v = at[0]
        v = _activate(v, op if op in UNARY else activation, clip)
        if any(views):  # the lanes past C read the source's channels after the slice
            v = zero_padding_lanes(b, v, idx[1], shape[1], "y")
        b.store(Y, pix, v)
    return b.kernel(f"{op}_{_kernel_suffix(activation)}" if op not in UNARY else op, [*inputs, Y])


def elementwise_reference(op: str, *inputs, activation: str = "none", clip: tuple = (0.0, 6.0)) -> np.ndarray:
    """NumPy in float64; ``inputs`` as the kernel's params (X0, X1 / X, B / X)."""
    xs = [np.asarray(x, np.float64) for x in inputs]
    if op == "add":
        return _np_activate(xs[0] + xs[1], activation, clip)
    if op == "bias_add":
        return _np_activate(xs[0] + xs[1].reshape((1, -1) + (1,) * (xs[0].ndim - 2)), activation, clip)
    return _np_activate(xs[0], op, clip)


# -- pooling ----------------------------------------------------------------------------------------------
def _pair(v, what: str) -> tuple:
    v = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(v) != 2 or min(v) < 1:
        raise ValueError(f"pool {what} {list(v)}: want a positive int or a pair (h, w)")
    return int(v[0]), int(v[1])


def _padding(p) -> tuple:
    p = (p,) * 4 if isinstance(p, (int, np.integer)) else tuple(int(x) for x in p)
    if len(p) == 2:
        p = (p[0], p[1], p[0], p[1])
    if len(p) != 4 or min(p) < 0:
        raise ValueError(f"pool padding {list(p)}: want P, (ph, pw) or (top, left, bottom, right), all >= 0")
    return p


def _pool_size(n: int, k: int, s: int, begin: int, end: int, ceil_mode: bool) -> int:
    span = n + begin + end - k
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= n + begin else out  # the last window starts inside (ONNX, PyTorch)


def pool_out_shape(shape, kernel, stride=1, padding=0, ceil_mode: bool = False) -> tuple:
    """Output NCHW shape of a pool (floor mode, ONNX's default, or ``ceil_mode``: a last partial window is kept
    when it starts inside the input or its leading padding)."""
    (N, C, H, W), (R, S), (sh, sw), (pt, pl, pb, pr) = shape, _pair(kernel, "kernel"), _pair(stride, "stride"), \
        _padding(padding)
    return N, C, _pool_size(H, R, sh, pt, pb, ceil_mode), _pool_size(W, S, sw, pl, pr, ceil_mode)


def pool_ceil_extra(shape, kernel, stride=1, padding=0, ceil_mode: bool = False) -> tuple:
    """(rows, cols) that ceil mode's last windows reach past the padded input (counted by no average)."""
    (R, S), (sh, sw), (pt, pl, pb, pr) = _pair(kernel, "kernel"), _pair(stride, "stride"), _padding(padding)
    _, _, OH, OW = pool_out_shape(shape, (R, S), (sh, sw), (pt, pl, pb, pr), ceil_mode)
    return (max(0, (OH - 1) * sh + R - (shape[2] + pt + pb)), max(0, (OW - 1) * sw + S - (shape[3] + pl + pr)))


def pool_kernel(shape, kind: str, kernel, stride=1, padding=0, count_include_pad: bool = False,
                dtype: str = "float32", in_scope: str = "texture", out_scope: str = "texture",
                max_work_group: int = 64, ceil_mode: bool = False, post=None, scale: bool = False,
                residual_scope: str | None = None, in_norm=None, post_normed: bool = False,
                residual_scale: bool = False, out_stats: bool = False):
    """Max or average pooling of NCHW ``X`` into ``Y`` (ONNX semantics, floor mode), one output pixel per
    work-item and a loop over the window (serial past 3x3, so 7x7 global pools stay small). Pixels in the
    padding are skipped: max ignores them (as -inf); avg divides by the pixels inside the window, or by the
    whole window with ``count_include_pad``. Global average pooling: ``kind="avg", kernel=(H, W)``.
    ``padding``: P, (ph, pw) or (top, left, bottom, right); each side must be smaller than the window.
    ``ceil_mode``: ONNX's ceil_mode=1 output size; the part of a last window past the padded input counts as
    neither pixel nor padding. The fused epilogue, in order: ``post`` ``(op, scope)``, the pooled value ``op``
    (add, sub, mul, div) ``P``, a tensor of the output's shape; ``scale``, times ``S`` per channel; ``residual_scope``,
    plus ``R`` (``residual_scale``: times ``RS`` per channel, PoolFormerV2's ``res_scale``): PoolFormer's token
    mixer ``x + ls * (pool(y) - y)`` in one kernel. ``in_norm`` ``(groups, chunks,
    epsilon, activation)``: ``X`` is read normalized by a GroupNorm or InstanceNorm and its activation
    (``passes_layer_norm.norms_read_by_pools``), its statistics ``group_norm``'s chunk partials in ``Q`` and its
    affine in ``A`` (``reduction.unit_factors``), every value inside the window normalized as it is read (the padding
    stays out of the window's sum or max); ``post_normed``: ``P`` is read normalized too (PoolFormer's
    ``pool(n(y)) - n(y)``, both operands of ``y``). ``out_stats``: the output's GroupNorm(1) statistics too, in
    ``St`` (float32 (N * 2, 4), ``Conv2dWorkload.out_stats``' format), from the work-groups of each image, the last
    to finish merging them (``reduction.last_group_statistics``): the next norm needs no launch."""
    shape = _packed_shape(shape, "pool")
    _check_dtype(dtype)
    if len(shape) != 4:
        raise ValueError(f"pool shape {list(shape)}: want 4-D NCHW")
    if kind not in ("max", "avg"):
        raise ValueError(f"pool kind {kind!r}: 'max' or 'avg'")
    (N, C, H, W), (R, S), (sh, sw), (pt, pl, pb, pr) = shape, _pair(kernel, "kernel"), _pair(stride, "stride"), \
        _padding(padding)
    if max(pt, pb) >= R or max(pl, pr) >= S:
        raise ValueError(f"pool padding {[pt, pl, pb, pr]} must be smaller than the window {R}x{S} on each side")
    out = pool_out_shape(shape, (R, S), (sh, sw), (pt, pl, pb, pr), ceil_mode)
    extra = pool_ceil_extra(shape, (R, S), (sh, sw), (pt, pl, pb, pr), ceil_mode)
    if min(out) < 1:
        raise ValueError(f"pool window {R}x{S} is larger than the padded input {H + pt + pb}x{W + pl + pr}")
    X, Y = _packed("X", shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    if post is not None and post[0] not in ("add", "sub", "mul", "div"):
        raise ValueError(f"pool post op {post[0]!r}: add, sub, mul or div")
    P = _packed("P", out, dtype, post[1]) if post is not None else None
    Sc = _per_channel("S", C, dtype, in_scope) if scale else None
    Res = _packed("R", out, dtype, residual_scope) if residual_scope else None
    if residual_scale and Res is None:
        raise ValueError("pool residual_scale scales the residual R: give residual_scope")
    RS = _per_channel("RS", C, dtype, in_scope) if residual_scale else None
    if post_normed and (in_norm is None or post is None or out != shape):
        raise ValueError("pool post_normed: P is read normalized as X is (in_norm), a P of X's shape")
    if in_norm is not None:
        groups, chunks = int(in_norm[0]), int(in_norm[1])
        if groups < 1 or C % groups or not (groups in (1, C) or (C // groups) % 4 == 0):
            raise ValueError(f"pool in_norm groups {groups} of {C} channels: one group, one a channel, or groups "
                             "of whole blocks of 4 channels")
        Q = buffer("Q", (N * norm_units(C, groups) * chunks * 2, 4), "float32", "global")
        A = buffer("A", (2 * (-(-C // 4)), 4), "float32", "global")
    padded = max(pt, pl, pb, pr, *extra) > 0
    b = Builder()

    def pooled(n, cb, oh, ow):
        """The output pixel at (n, cb, oh, ow) with its epilogue, and its index."""
        factors = None
        if in_norm is not None:
            first = X[n, Ramp(unit_first_block(C, groups, cb) * 4, as_expr(1), 4), 0, 0]
            factors = unit_factors(b, Q, A, first, n, cb, shape, groups, chunks, float(in_norm[2]))
        h0, w0 = b.let("h0", oh * sh - pt), b.let("w0", ow * sw - pl)
        acc = b.allocate("acc", (1,), "float32x4", "private")
        b.store(acc, 0, LOWEST if kind == "max" else 0.0)
        window = "unrolled" if R * S <= 9 else "serial"
        with b.loop("r", R, window) as r, b.loop("s", S, window) as s:
            ih, iw = h0 + r, w0 + s
            with b.if_((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)) if padded else nullcontext():
                v = X[n, Ramp(cb * 4, as_expr(1), 4), ih, iw]
                if factors is not None:
                    v = unit_normed(v, factors, in_norm[3])
                b.store(acc, 0, max_(acc[0], v) if kind == "max" else acc[0] + v)
        v = acc[0]
        if kind == "avg" and count_include_pad and max(extra) > 0:  # ceil mode: clip to the padded input
            rows = min_(h0 + R, H + pb) - h0
            cols = min_(w0 + S, W + pr) - w0
            v = v / Cast(float32, rows * cols)
        elif kind == "avg" and (count_include_pad or not padded):
            v = v * (1.0 / (R * S))  # floor mode: every window lies inside the padded input
        elif kind == "avg":
            rows = min_(h0 + R, H) - max_(h0, 0)
            cols = min_(w0 + S, W) - max_(w0, 0)
            v = v / Cast(float32, rows * cols)
        pix = (n, Ramp(cb * 4, as_expr(1), 4), oh, ow)
        if P is not None:
            p = unit_normed(P[pix], factors, in_norm[3]) if post_normed else P[pix]
            v = v + p if post[0] == "add" else v - p if post[0] == "sub" else v * p if post[0] == "mul" else v / p
        return _epilogue(v, pix, Sc, Res, RS), pix

    St = work = None
    if not out_stats:
        with _work_items(b, _grid(out), max_work_group) as (n, cb, oh, ow):
            v, pix = pooled(n, cb, oh, ow)
            b.store(Y, pix, v)
    else:  # a GroupNorm(1)'s statistics of the output too: work-groups within an image, every work-item to the end
        if C % 4:
            raise ValueError(f"pool out_stats: the statistics of whole blocks of 4 channels, got {C} channels")
        per_image = prod(_grid(out)[1:])
        local = _local_size(per_image, max_work_group, 256)  # larger groups than 64: fewer slots to merge
        slots = -(-per_image // local)
        St = buffer("St", (N * 2, 4), "float32", "global")
        work = stats_workspaces(N, slots)
        with b.loop("gn", N, "group.1") as n, b.loop("g", slots, "group.0") as g, \
                b.loop("l", local, "local.0") as lid:
            p = b.let("p", g * local + lid)
            inside = p < per_image
            cb, oh, ow = (b.let(f"i{k}", e) for k, e in
                          enumerate(_unravel(min_(p, per_image - 1) if slots * local != per_image else p,
                                             _grid(out)[1:]), 1))
            v, pix = pooled(n, cb, oh, ow)
            v = b.let("pv", v)
            with b.if_(inside) if slots * local != per_image else nullcontext():
                b.store(Y, pix, v)
            mask = Broadcast(select(inside, as_expr(1.0), as_expr(0.0)), 4) if slots * local != per_image \
                else Broadcast(as_expr(1.0), 4)
            last_group_statistics(b, [(v, mask)], (p.equal(0), as_stored(v, dtype)), lid, local, n, g, slots, *work,
                                  St)
    norm = (Q, A) if in_norm is not None else ()
    operands = [X, *(q for q in (P, Sc, Res, RS) if q is not None), *norm, Y]
    if St is None:
        return b.kernel(f"{kind}_pool", operands)
    kernel = b.kernel(f"{kind}_pool", [*operands, St, *work])  # the statistics' slots and counters: workspaces
    return Program(kernel.name, (kernel,), (*operands, St), tuple(work))


def global_avg_pool_kernel(shape, dtype: str = "float32", in_scope: str = "texture", out_scope: str = "texture",
                           max_work_group: int = 64):
    """``X`` (N, C, H, W) -> ``Y`` (N, C, 1, 1): the mean over each channel's H x W pixels."""
    shape = _packed_shape(shape, "global_avg_pool")
    return pool_kernel(shape, "avg", shape[2:], 1, 0, False, dtype, in_scope, out_scope, max_work_group)


def pool_reference(x, kind: str, kernel, stride=1, padding=0, count_include_pad: bool = False,
                   ceil_mode: bool = False) -> np.ndarray:
    """NumPy in float64: padding is NaN, skipped by nanmax; avg counts the pixels inside (or the window clipped
    to the padded input)."""
    (R, S), (sh, sw), (pt, pl, pb, pr) = _pair(kernel, "kernel"), _pair(stride, "stride"), _padding(padding)
    N, C, OH, OW = pool_out_shape(x.shape, (R, S), (sh, sw), (pt, pl, pb, pr), ceil_mode)
    eh, ew = pool_ceil_extra(x.shape, (R, S), (sh, sw), (pt, pl, pb, pr), ceil_mode)
    H, W = x.shape[2:]
    xp = np.full((N, C, H + pt + pb + eh, W + pl + pr + ew), np.nan)
    xp[:, :, pt:pt + H, pl:pl + W] = x
    win = np.lib.stride_tricks.sliding_window_view(xp, (R, S), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :OH, :OW]
    if kind == "max":
        return np.nanmax(win, axis=(4, 5))
    total = np.nansum(win, axis=(4, 5))
    if not count_include_pad:
        return total / np.sum(~np.isnan(win), axis=(4, 5))
    inside = np.zeros(xp.shape[2:])
    inside[:H + pt + pb, :W + pl + pr] = 1
    count = np.lib.stride_tricks.sliding_window_view(inside, (R, S))[::sh, ::sw][:OH, :OW].sum(axis=(2, 3))
    return total / count


# -- concat -----------------------------------------------------------------------------------------------
def concat_out_shape(shapes) -> tuple:
    shapes = [_packed_shape(s, f"concat input {k}") for k, s in enumerate(shapes)]
    if not shapes:
        raise ValueError("concat needs at least one input")
    rest = {(s[0], *s[2:]) for s in shapes}
    if len(rest) != 1 or len({len(s) for s in shapes}) != 1:
        raise ValueError(f"concat along channels: inputs {[list(s) for s in shapes]} must agree on every axis but 1")
    return (shapes[0][0], sum(s[1] for s in shapes), *shapes[0][2:])


def concat_kernel(shapes, dtype: str = "float32", in_scopes="texture", out_scope: str = "texture",
                  max_work_group: int = 64, activation: str = "none", clip: tuple = (0.0, 6.0), in_views=(),
                  flat: bool = False, addend: bool = False):
    """``X0``, ``X1``, ... (4-D NCHW or 2-D, any channel counts) -> ``Y``, concatenated along axis 1, then
    ``activation`` (an activation read by nothing else but the concat, whose parts other kernels read too).

    ``in_views`` (``_channel_views``): a part read in place as channels ``offset``.. of a larger tensor of
    ``channels`` (a slice of a tensor, at any offset). ``flat``: ``Y`` is 4-D (N, C, 1, H * W), the concat of 4-D
    parts flattened over H, W -- a token tensor, its pixels the parts' in row-major order (EdgeNeXt's
    ``cat(...).reshape(B, C, H * W)``). ``addend``: ``R``, a tensor of Y's shape (a constant: a positional
    embedding), added before the activation.

    One output pixel per work-item. Input k starts at output channel ``o = 4q + s``, so output lane j of block
    cb reads input block ``cb - q`` (lanes j >= s) or ``cb - q - 1`` (j < s) at the constant lane ``(j - s) % 4``
    (``shifted_pixel``): at most two whole-pixel loads per input, done only when the input overlaps the block, with
    block indices clamped so that loads stay in bounds. Each lane keeps its own input's value; padding lanes are
    zero."""
    out = concat_out_shape(shapes)
    shapes = [tuple(int(x) for x in s) for s in shapes]
    _check_dtype(dtype)
    _check_activation(activation)
    scopes = _scopes(in_scopes, len(shapes), "concat")
    if in_views and len(in_views) != len(shapes):
        raise ValueError(f"concat in_views {list(in_views)}: one per input ({len(shapes)})")
    views = [_channel_views((v,), 1, s)[0] for v, s in zip(in_views, shapes)] if in_views else [()] * len(shapes)
    if flat and len(out) != 4:
        raise ValueError(f"concat flat: the parts {[list(s) for s in shapes]} are not 4-D")
    full = [(s[0], v[0], *s[2:]) if v else s for s, v in zip(shapes, views)]
    X = [_packed(f"X{k}", s, dtype, sc) for k, (s, sc) in enumerate(zip(full, scopes))]
    y_shape = (out[0], out[1], 1, out[2] * out[3]) if flat else out
    Y = _packed("Y", y_shape, dtype, out_scope)
    R = [_packed("R", y_shape, dtype, out_scope)] if addend else []
    b = Builder()
    with _work_items(b, _grid(y_shape), max_work_group) as idx:
        cb = idx[1]
        src = [idx[0], cb, b.let("h", idx[3] // out[3]), b.let("w", idx[3] % out[3])] if flat else idx
        lanes = b.allocate("lanes", (4,), "float32", "private")
        for j in range(4):
            b.store(lanes, j, 0.0)
        offset = 0
        for k, (x, shape, view, bound) in enumerate(zip(X, shapes, views, full)):
            C, shift = shape[1], offset - (view[1] if view else 0)
            with b.if_((cb * 4 < offset + C) & (cb * 4 + 4 > offset)):
                v = shifted_pixel(b, x, src[0], cb, src[2:], shift, bound[1], f"x{k}")
                v = v if shift % 4 == 0 else b.let(f"x{k}", v)  # two loads' lanes: bound once
                for j in range(4):
                    c = cb * 4 + j
                    b.store(lanes, j, select((c >= offset) & (c < offset + C), ExtractLane(v, j), lanes[j]))
            offset += C
        v = _vector([lanes[j] for j in range(4)])
        if R:
            v = zero_padding_lanes(b, v + R[0][_pixel(idx)], cb, out[1], "sum")
        if activation != "none":  # and the padding lanes zero again (sigmoid(0) is not)
            v = zero_padding_lanes(b, _activate(v, activation, clip), cb, out[1], "act")
        b.store(Y, _pixel(idx), v)
    return b.kernel("concat" if activation == "none" else f"concat_{_kernel_suffix(activation)}", [*X, *R, Y])


def _kernel_suffix(activation: str) -> str:
    """An activation spec as a C identifier part (``leaky_relu(0.1)`` -> ``leaky_relu_0_1``)."""
    return "".join(ch if ch.isalnum() else "_" for ch in activation).strip("_")


def concat_reference(*inputs, activation: str = "none", clip: tuple = (0.0, 6.0)) -> np.ndarray:
    return _np_activate(np.concatenate([np.asarray(x, np.float64) for x in inputs], axis=1), activation, clip)


# -- relayout ---------------------------------------------------------------------------------------------
def _relayout_operand(name: str, shape, dtype: str, scope: str, layout):
    """(Buffer, packed?) of a relayout operand; ``layout`` None is a plain row-major buffer."""
    shape = tuple(int(s) for s in shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"relayout {name} shape {list(shape)}: want a non-empty positive shape")
    _check_scope(scope, f"relayout {name}")
    if layout is None and scope == "buffer":
        return buffer(name, shape, dtype, "global"), False
    want = PACKED.get(len(shape))
    if want is None or layout != want[scope == "buffer"]:
        fix = (f"layout {want[scope == 'buffer']!r}" if want else "a 4-D (nchw4c) or 2-D (row4) shape") + \
            (" or None (row-major)" if scope == "buffer" else "")
        raise ValueError(f"relayout {name}: a {len(shape)}-D {scope} cannot have layout {layout!r}; use {fix}")
    return _packed(name, shape, dtype, scope), True


def _as_nchw(shape: tuple) -> tuple:
    return shape if len(shape) == 4 else (*shape, 1, 1)


def relayout_kernel(in_shape, out_shape, dtype: str = "float32", in_scope: str = "buffer", in_layout=None,
                    out_scope: str = "texture", out_layout="nchw4c", max_work_group: int = 64,
                    out_dtype: str | None = None):
    """``Y`` (out_shape) gets ``X`` (in_shape) element by element in row-major logical order (a reshape), each
    side in its own scope and layout: ``None`` (plain row-major buffer, any rank), ``nchw4c`` / ``nchw4c_buffer``
    (4-D) or ``row4`` / ``row4_buffer`` (2-D). Covers the model-boundary conversions, Flatten/Reshape between
    nchw4c and row4, and texture <-> buffer copies.

    - packed -> packed with the same pixels (same shape, or (N, C, 1, 1) <-> (N, C)): a whole-pixel copy;
    - packed output otherwise: one output pixel per work-item, each lane gathered from its source element
      (padding lanes written zero);
    - packed input -> plain buffer: one input pixel per work-item, its valid lanes scattered;
    - plain -> plain: 4 elements per work-item.

    ``out_dtype`` (default ``dtype``): Y's storage type, when it differs a conversion (a mixed plan's cast
    between float32 and float16, ``tuner.plan.precision``): values pass through float."""
    _check_dtype(dtype)
    out_dtype = out_dtype or dtype
    _check_dtype(out_dtype)
    in_shape, out_shape = tuple(int(s) for s in in_shape), tuple(int(s) for s in out_shape)
    if prod(in_shape) != prod(out_shape):
        raise ValueError(f"relayout {list(in_shape)} -> {list(out_shape)}: element counts differ "
                         f"({prod(in_shape)} vs {prod(out_shape)})")
    X, x_packed = _relayout_operand("X", in_shape, dtype, in_scope, in_layout)
    Y, y_packed = _relayout_operand("Y", out_shape, out_dtype, out_scope, out_layout)
    b = Builder()

    def source(out_idx, j):  # the input element at the output element's row-major position
        idx = out_idx if in_shape == out_shape else _unravel(_ravel(out_idx, out_shape), in_shape)
        if not x_packed:
            return X[tuple(idx)]
        # a packed input's pixel is read once and the element's lane picked from it
        n, c, *rest = [b.let(f"s{j}_{k}", e) for k, e in enumerate(idx)]
        pix = b.let(f"x{j}", X[_pixel([n, c // 4, *rest])])
        lane = c % 4
        return select(lane.equal(0), ExtractLane(pix, 0), select(lane.equal(1), ExtractLane(pix, 1),
                      select(lane.equal(2), ExtractLane(pix, 2), ExtractLane(pix, 3))))

    if x_packed and y_packed and _as_nchw(in_shape) == _as_nchw(out_shape):
        C = out_shape[1]
        with _work_items(b, _grid(_as_nchw(out_shape)), max_work_group) as idx:
            v = X[_pixel(idx[:len(in_shape)])]
            if C % 4:  # the input's padding lanes hold anything; the output's are zero
                pix = b.let("x", v)
                v = _vector([ExtractLane(pix, j) if j < C % 4 else select(idx[1] * 4 + j < C, ExtractLane(pix, j), 0.0)
                             for j in range(4)])
            b.store(Y, _pixel(idx[:len(out_shape)]), v)
    elif y_packed:
        C = out_shape[1]
        with _work_items(b, _grid(out_shape), max_work_group) as idx:
            lanes = []
            for j in range(4):
                c = idx[1] * 4 + j
                v = source([idx[0], min_(c, C - 1), *idx[2:]], j)  # padding lanes read a real element
                lanes.append(select(c < C, v, 0.0) if C % 4 else v)
            b.store(Y, _pixel(idx), _vector(lanes))
    elif x_packed:
        C = in_shape[1]
        with _work_items(b, _grid(in_shape), max_work_group) as idx:
            pix = b.let("x", X[_pixel(idx)])
            for j in range(4):
                c = idx[1] * 4 + j
                with b.if_(c < C) if C % 4 else nullcontext():
                    elem = [idx[0], c, *idx[2:]]
                    dst = elem if in_shape == out_shape else _unravel(_ravel(elem, in_shape), out_shape)
                    b.store(Y, tuple(dst), ExtractLane(pix, j))
    else:
        total = prod(out_shape)
        with _work_items(b, (-(-total // 4),), max_work_group) as (i,):
            for j in range(4):
                f = i * 4 + j
                with b.if_(f < total) if total % 4 else nullcontext():
                    b.store(Y, tuple(_unravel(f, out_shape)), X[tuple(_unravel(f, in_shape))])
    return b.kernel("relayout", [X, Y])


def relayout_reference(x, out_shape) -> np.ndarray:
    return np.asarray(x, np.float64).reshape(tuple(out_shape))


# -- unary activations and math functions ---------------------------------------------------------------
# math functions of ``unary`` besides the activation specs; ``pow(p)`` (a constant exponent) too
UNARY_FNS = ("erf", "sqrt", "exp", "neg", "abs", "reciprocal", "square")


def unary_pow_fn(p: float) -> str:
    """The ``unary`` fn of x to the constant power ``p``."""
    return f"pow({float(p)!r})"


def _math_fn(fn: str):
    """(name, exponent or None) of a math ``unary`` fn, or None for an activation spec."""
    if fn in UNARY_FNS:
        return fn, None
    if fn.startswith("pow(") and fn.endswith(")"):
        try:
            return "pow", float(fn[4:-1])
        except ValueError:
            pass
        raise ValueError(f"unary fn {fn!r}: pow takes one number, e.g. pow(3.0)")
    return None


def _unary_ir(fn: str, v):
    m = _math_fn(fn)
    if m is None:
        return apply_ir(fn, v)
    name, p = m
    if name == "pow":  # OpenCL pow(gentype, gentype): the exponent broadcast to the vector
        return call("pow", [v, Broadcast(as_expr(p), v.dtype.lanes) if v.dtype.lanes > 1 else as_expr(p)], v.dtype)
    if name in ("erf", "sqrt", "exp"):
        return call(name, [v], v.dtype)
    return {"neg": lambda: 0.0 - v, "abs": lambda: call("fabs", [v], v.dtype), "reciprocal": lambda: 1.0 / v,
            "square": lambda: v * v}[name]()


def unary_kernel(shape, fn: str, dtype: str = "float32", in_scope: str = "texture", out_scope: str = "texture",
                 max_work_group: int = 64):
    """``Y = fn(X)`` per pixel over a 4-D NCHW or 2-D (N, K) ``shape``; ``fn``: any activation spec of
    ``tuner.ir.activations`` (``sigmoid``, ``hardswish``, ``leaky_relu(0.1)``, ...), a math function of
    ``UNARY_FNS`` (erf, sqrt, exp, neg, abs, reciprocal, square: x * x) or ``pow(p)`` (a constant exponent;
    OpenCL's pow, NaN for a negative base and a non-integer exponent, as ONNX)."""
    shape = _packed_shape(shape, "unary")
    _check_dtype(dtype)
    m = _math_fn(fn)
    if m is None:
        try:
            canonical(fn)
        except ValueError as e:
            raise ValueError(f"unary fn {fn!r}: one of {', '.join(UNARY_FNS)}, pow(p) or an activation ({e})") \
                from None
    X, Y = _packed("X", shape, dtype, in_scope), _packed("Y", shape, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(shape), max_work_group) as idx:
        pix = _pixel(idx)
        b.store(Y, pix, _unary_ir(fn, X[pix]))
    return b.kernel("unary_" + (m[0] if m else canonical(fn).split("(")[0]), [X, Y])


def unary_reference(fn: str, x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = _math_fn(fn)
    if m is None:
        return apply_numpy(fn, x)
    name, p = m
    if name == "erf":
        from math import erf
        return np.vectorize(erf, otypes=[np.float64])(x)
    with np.errstate(all="ignore"):  # NaN / inf as ONNX gives them
        return {"sqrt": np.sqrt, "exp": np.exp, "neg": np.negative, "abs": np.abs,
                "reciprocal": lambda v: 1.0 / v, "square": lambda v: v * v,
                "pow": lambda v: np.power(v, p)}[name](x)


# -- binary with broadcasting -------------------------------------------------------------------------------
BINARY_OPS = ("add", "sub", "mul", "div", "prelu")


def _operand_kind(shape: tuple, operand: tuple, k: int) -> str:
    """How operand ``k`` broadcasts to the output ``shape``: ``full`` (same shape), ``channel`` (a (C,) constant,
    one value per channel), ``gate`` ((N or 1, C, 1, 1): one value per image and channel, over H and W),
    or ``scalar`` ((N or 1, 1, ...): one value per image)."""
    operand = tuple(int(d) for d in operand)
    if operand == shape:
        return "full"
    if operand == (shape[1],):
        return "channel"
    if len(shape) == 4 and len(operand) == 4 and operand[1:] == (shape[1], 1, 1) and operand[0] in (1, shape[0]):
        return "gate"
    if len(operand) == len(shape) and all(d == 1 for d in operand[1:]) and operand[0] in (1, shape[0]):
        return "scalar"
    if len(shape) == 4 and len(operand) == 4 and operand[0] in (1, shape[0]):
        if operand[1:] == (shape[1], shape[2], 1):
            return "row"
        if operand[1:] == (1, shape[2], shape[3]):
            return "plane"
    raise ValueError(f"binary operand X{k} of shape {list(operand)} does not broadcast to {list(shape)}: want the "
                     f"same shape, ({shape[1]},) per channel, (N or 1, {shape[1]}, 1, 1) over H and W, "
                     f"(N or 1, {', '.join(['1'] * (len(shape) - 1))}) per image"
                     + (f", (N or 1, {shape[1]}, {shape[2]}, 1) over W or (N or 1, 1, {shape[2]}, {shape[3]}) over "
                        f"channels" if len(shape) == 4 else ""))


def binary_kernel(shape, op: str, operands, dtype: str = "float32", in_scopes="texture", out_scope: str = "texture",
                  activation: str = "none", max_work_group: int = 64, scale: bool = False,
                  residual_scope: str | None = None):
    """``Y = act(X0 op X1)`` over a 4-D NCHW or 2-D (N, K) ``shape`` with ONNX broadcasting of the forms models
    use: each of ``operands`` (the shapes of ``X0``, ``X1``) is ``shape`` itself, ``(C,)`` (a constant per
    channel: ``bias4_buffer`` buffer or ``mace_argument`` texture), ``(N or 1, C, 1, 1)`` (a gate read once
    per pixel and broadcast over H, W: squeeze-excitation's channel scale), ``(N or 1, 1, 1, 1)`` / ``(N or 1,
    1)`` (one value per image broadcast over everything: ConvNeXt-V2's GRN), ``(N or 1, C, H, 1)`` (over W: a
    linear attention's normalizer) or ``(N or 1, 1, H, W)`` (over the channels: MobileViT-v2's context scores).
    ``op``: add, sub, mul, div, or prelu
    (``X0`` if positive else ``X0 * X1``). One output pixel per work-item. The fused epilogue, in this order:
    ``scale`` (times ``S``, a constant per channel: a layer scale), ``residual_scope`` (plus ``R``, a tensor of
    ``shape`` stored in that scope), then the activation: PoolFormer's ``x + ls * (pool(y) - y)`` is one kernel."""
    shape = _packed_shape(shape, "binary")
    _check_dtype(dtype)
    if op not in BINARY_OPS:
        raise ValueError(f"binary op {op!r}: one of {', '.join(BINARY_OPS)}")
    _check_activation(activation)
    operands = [tuple(int(d) for d in o) for o in operands]
    if len(operands) != 2:
        raise ValueError(f"binary {op} takes 2 operands, got {len(operands)}")
    kinds = [_operand_kind(shape, o, k) for k, o in enumerate(operands)]
    if "full" not in kinds:
        raise ValueError(f"binary {op}: operands {operands} broadcast to {list(shape)} but neither has that shape")
    scopes = _scopes(in_scopes, 2, f"binary {op}")
    xs = []
    for k, (kind, o, sc) in enumerate(zip(kinds, operands, scopes)):
        xs.append(_per_channel(f"X{k}", o[0], dtype, sc) if kind == "channel" else _packed(f"X{k}", o, dtype, sc))
    S = _per_channel("S", shape[1], dtype, scopes[0]) if scale else None
    R = _packed("R", shape, dtype, residual_scope) if residual_scope else None
    Y = _packed("Y", shape, dtype, out_scope)
    b = Builder()
    with _work_items(b, _grid(shape), max_work_group) as idx:
        pix = _pixel(idx)
        vals = []
        for x, kind, o in zip(xs, kinds, operands):
            if kind == "full":
                vals.append(x[pix])
            elif kind == "channel":
                vals.append(x[pix[1]])
            elif kind == "gate":
                vals.append(b.let(f"{x.name}_gate", x[(idx[0] if o[0] > 1 else 0, pix[1], 0, 0)]))
            elif kind == "row":  # one pixel per (n, channel block, h), over W
                vals.append(b.let(f"{x.name}_row", x[(idx[0] if o[0] > 1 else 0, pix[1], idx[2], 0)]))
            elif kind == "plane":  # lane 0 of the one channel at (n, h, w), over the channels
                at = (idx[0] if o[0] > 1 else 0, Ramp(as_expr(0), as_expr(1), 4), idx[2], idx[3])
                vals.append(b.let(f"{x.name}_plane", ExtractLane(x[at], 0)))
            else:  # lane 0 of the operand's only pixel (per image), broadcast to the 4 lanes
                at = (idx[0] if o[0] > 1 else 0, Ramp(as_expr(0), as_expr(1), 4), *((0,) * (len(o) - 2)))
                vals.append(b.let(f"{x.name}_{kind}", ExtractLane(x[at], 0)))
        a, c = vals
        v = (a + c if op == "add" else a - c if op == "sub" else a * c if op == "mul" else a / c if op == "div"
             else max_(a, 0.0) + min_(a, 0.0) * c)
        b.store(Y, pix, _activate(_epilogue(v, pix, S, R), activation, (0.0, 6.0)))
    return b.kernel(f"{op}_{kinds[0]}_{kinds[1]}", [*xs, *(p for p in (S, R) if p is not None), Y])


def binary_reference(op: str, x0, x1, activation: str = "none", scale=None, residual=None) -> np.ndarray:
    a, c = (np.asarray(x, np.float64) for x in (x0, x1))
    if c.ndim == 1 and a.ndim > 1 and c.shape[0] == a.shape[1]:
        c = c.reshape((1, -1) + (1,) * (a.ndim - 2))
    if a.ndim == 1 and c.ndim > 1 and a.shape[0] == c.shape[1]:
        a = a.reshape((1, -1) + (1,) * (c.ndim - 2))
    v = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
         "prelu": lambda p, q: np.where(p > 0, p, p * q)}[op](a, c)
    if scale is not None:
        v = v * np.asarray(scale, np.float64).reshape((1, -1) + (1,) * (v.ndim - 2))
    if residual is not None:
        v = v + residual
    return _np_activate(v, activation, (0.0, 6.0))


# -- reductions ------------------------------------------------------------------------------------------
REDUCE_KINDS = ("mean", "max", "l2")  # a sum is the mean times the count (``scale``)
# (rank, axes) -> how the kernel maps it: per-lane over H, W, or across the channels (lanes mixed)
REDUCE_AXES = {(4, (2, 3)): "spatial", (4, (2,)): "spatial", (4, (3,)): "spatial", (4, (1,)): "channels",
               (4, (1, 2, 3)): "channels", (2, (1,)): "channels"}


def reduce_out_shape(shape, axes, keepdims: bool) -> tuple:
    return (tuple(1 if a in axes else d for a, d in enumerate(shape)) if keepdims
            else tuple(d for a, d in enumerate(shape) if a not in axes))


def _hcombine(v, kind: str, lanes: int = 4):
    """The first ``lanes`` lanes of ``v`` combined into one value (max, or a sum)."""
    out = ExtractLane(v, 0)
    for j in range(1, lanes):
        out = max_(out, ExtractLane(v, j)) if kind == "max" else out + ExtractLane(v, j)
    return out


def reduce_kernel(shape, kind: str, keepdims: bool = True, dtype: str = "float32", in_scope: str = "texture",
                  out_scope: str = "texture", max_work_group: int = 64, axes=(2, 3), scale: float = 1.0):
    """``scale`` times the ``kind`` (mean, max, l2: the square root of the sum of squares) of ``X`` over ``axes``
    (ReduceSum: the mean with ``scale`` = the element count, one multiply by scale / count):

    - NCHW over (2, 3) -> (N, C, 1, 1), or (N, C) without ``keepdims``: one output pixel (4 channels) per
      work-item and a serial loop over H x W. Lanes never mix, so the input's padding lanes reach only the
      output's.
    - NCHW over (1,) -> (N, 1, H, W), over (1, 2, 3) -> (N, 1, 1, 1), (N, K) over (1,) -> (N, 1) (``keepdims``
      only: the output keeps its rank): one work-item per output element, a serial loop over the channel
      blocks (and H, W), the last block's padding lanes left out; the output pixel is (value, 0, 0, 0)."""
    shape = _packed_shape(shape, "reduce")
    _check_dtype(dtype)
    if kind not in REDUCE_KINDS:
        raise ValueError(f"reduce kind {kind!r}: 'mean' or 'max', or 'l2' (a sum: 'mean' with scale = the count)")
    axes = tuple(sorted(int(a) for a in axes))
    mode = REDUCE_AXES.get((len(shape), axes))
    if mode is None or (mode == "channels" and not keepdims) or (len(axes) == 1 and mode == "spatial" and not keepdims):
        raise ValueError(f"reduce over axes {list(axes)} of a {len(shape)}-D shape {list(shape)} "
                         f"(keepdims={int(bool(keepdims))}): want 4-D NCHW over [2, 3] (keepdims 0 or 1), over [2] "
                         f"or [3] (keepdims=1), NCHW over [1] or [1, 2, 3], or (N, K) over [1] (keepdims=1)")
    out = reduce_out_shape(shape, axes, keepdims)
    count = prod(shape[a] for a in axes)
    X, Y = _packed("X", shape, dtype, in_scope), _packed("Y", out, dtype, out_scope)
    ident = LOWEST if kind == "max" else 0.0

    def term(v):
        return v * v if kind == "l2" else v

    def acc_add(acc, v):
        return max_(acc, v) if kind == "max" else acc + v

    def finish(v):
        v = v * (float(scale) / count) if kind == "mean" else call("sqrt", [v], v.dtype) if kind == "l2" else v
        return v * float(scale) if kind != "mean" and scale != 1.0 else v

    b = Builder()
    if mode == "spatial":  # over H and W, H alone or W alone: the kept spatial axis is part of the grid
        N, C, H, W = shape
        kept = [(a, d) for a, d in ((2, H), (3, W)) if a not in axes]
        with _work_items(b, (N, -(-C // 4), *(d for _, d in kept)), max_work_group) as (n, cb, *rest):
            acc = b.allocate("acc", (1,), "float32x4", "private")
            b.store(acc, 0, ident)
            loops = {a: (rest[0] if (a, d) in kept else None) for a, d in ((2, H), (3, W))}
            with b.loop("h", H, "serial") if 2 in axes else nullcontext(loops[2]) as h, \
                    b.loop("w", W, "serial") if 3 in axes else nullcontext(loops[3]) as w:
                b.store(acc, 0, acc_add(acc[0], term(X[n, Ramp(cb * 4, as_expr(1), 4), h, w])))
            spatial = [0 if a in axes else loops[a] for a in (2, 3)] if keepdims else \
                [loops[a] for a in (2, 3) if a not in axes]
            b.store(Y, (n, Ramp(cb * 4, as_expr(1), 4), *spatial), finish(acc[0]))
        return b.kernel(f"reduce_{kind}", [X, Y])
    C = shape[1]
    full, rem = divmod(C, 4)
    spatial = 1 in axes and len(shape) == 4 and axes == (1, 2, 3)
    grid = (shape[0],) if spatial or len(shape) == 2 else (shape[0], *shape[2:])
    with _work_items(b, grid, max_work_group) as idx:
        n = idx[0]
        acc = b.allocate("acc", (1,), "float32x4", "private")
        b.store(acc, 0, ident)

        def add_pixel(rest):
            if full:
                with b.loop("cb", full, "serial") as cb:
                    b.store(acc, 0, acc_add(acc[0], term(X[(n, Ramp(cb * 4, as_expr(1), 4), *rest)])))
            if rem:  # the last block: its padding lanes hold anything, so they add the identity
                last = b.let("last", term(X[(n, Ramp(as_expr(full * 4), as_expr(1), 4), *rest)]))
                b.store(acc, 0, acc_add(acc[0], _vector([ExtractLane(last, j) if j < rem else as_expr(ident)
                                                         for j in range(4)])))

        if spatial:
            with b.loop("h", shape[2], "serial") as h, b.loop("w", shape[3], "serial") as w:
                add_pixel((h, w))
        else:
            add_pixel(tuple(idx[1:]))
        v = b.let("v", finish(_hcombine(acc[0], kind)))
        at = (n, Ramp(as_expr(0), as_expr(1), 4), *((0, 0) if spatial else tuple(idx[1:])))
        b.store(Y, at, _vector([v, as_expr(0.0), as_expr(0.0), as_expr(0.0)]))
    return b.kernel(f"reduce_{kind}_channels", [X, Y])


def reduce_reference(x, kind: str, keepdims: bool = True, axes=(2, 3), scale: float = 1.0) -> np.ndarray:
    x, axes = np.asarray(x, np.float64), tuple(axes)
    if kind == "l2":
        return scale * np.sqrt((x * x).sum(axis=axes, keepdims=keepdims))
    return scale * {"mean": np.mean, "max": np.max}[kind](x, axis=axes, keepdims=keepdims)


GLUE = {
    "elementwise": (elementwise_kernel, elementwise_reference),
    "pool": (pool_kernel, pool_reference),
    "concat": (concat_kernel, concat_reference),
    "relayout": (relayout_kernel, relayout_reference),
    "unary": (unary_kernel, unary_reference),
    "binary": (binary_kernel, binary_reference),
    "reduce": (reduce_kernel, reduce_reference),
}
