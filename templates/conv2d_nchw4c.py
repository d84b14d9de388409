"""conv2d over NCHW4c activations and OIHW4o weights, written once; scopes and layouts are declarations.

Each work-item computes a tile of ``tile_oc`` output-channel blocks (4 channels each, one RGBA pixel) by
``tile_oh`` rows by ``tile_ow`` columns. The reduction walks input-channel blocks, then the filter window,
then the 4 lanes of a block unrolled: one input lane (a single-lane read, broadcast) times one weight
pixel (4 output channels) -- the outer product of the texture RFC's Adreno schedules.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.dtype import DType
from tuner.ir.expr import Cast, ExtractLane, Ramp, as_expr, const, max_, min_, select
from tuner.ir.activations import NAMES as ACTIVATIONS  # noqa: F401  (importers use the name)
from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.schedule import cache_read
from tuner.templates import EPILOGUE_ARGS, WINDOW_ARGS, Template, WorkloadArg



def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@dataclass(frozen=True)
class Conv2dWorkload:
    """The canonical key of one convolution: shapes, stride, padding (top, left, bottom, right), dilation,
    groups, storage dtype and fused epilogue."""
    data: tuple  # N, C, H, W
    kernel: tuple  # O, C/groups, R, S
    stride: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    dtype: str = "float32"
    bias: bool = False
    activation: str = "none"
    residual: bool = False

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        set_("data", tuple(int(x) for x in self.data))
        set_("kernel", tuple(int(x) for x in self.kernel))
        set_("stride", _pair(self.stride))
        set_("dilation", _pair(self.dilation))
        p = self.padding
        p = (p, p, p, p) if isinstance(p, int) else tuple(p)
        set_("padding", p if len(p) == 4 else (p[0], p[1], p[0], p[1]))
        if len(self.data) != 4 or len(self.kernel) != 4:
            raise ValueError(f"conv2d wants data N,C,H,W and kernel O,C,R,S; got {self.data} and {self.kernel}")
        if min(self.data + self.kernel) < 1:
            raise ValueError(f"conv2d shapes must be positive: data {list(self.data)}, kernel {list(self.kernel)}")
        if len(self.stride) != 2 or min(self.stride) < 1:
            raise ValueError(f"stride must be at least 1, got {list(self.stride)}")
        if len(self.dilation) != 2 or min(self.dilation) < 1:
            raise ValueError(f"dilation must be at least 1, got {list(self.dilation)}")
        if len(self.padding) != 4 or min(self.padding) < 0:
            raise ValueError(f"padding must be non-negative, got {list(self.padding)}")
        set_("groups", int(self.groups))
        C, O, G = self.data[1], self.kernel[0], self.groups
        if G < 1 or C % G or O % G or self.kernel[1] != C // G:
            raise ValueError(f"conv2d with groups={G} wants C and O divisible by groups and a kernel of "
                             f"{C // max(G, 1)} input channels per group; got data C {C}, kernel {list(self.kernel)}")
        if G > 1 and G == C and self.kernel[1] == 1 and O == C:
            raise ValueError("a depthwise convolution (groups == C == O): use depthwise_conv2d")
        if G > 1 and ((C // G) % 4 or (O // G) % 4):
            raise ValueError(f"grouped conv2d packs each group into whole RGBA pixels: channels per group must be "
                             f"multiples of 4, got {C // G} in and {O // G} out (groups={G})")
        set_("activation", canonical(self.activation))  # a ValueError names the supported activations
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")
        if min(self.out_shape) < 1:
            raise ValueError(f"conv2d output {self.out_shape} is empty: kernel larger than padded input")

    @property
    def out_shape(self) -> tuple:
        (N, C, H, W), (O, _, R, S) = self.data, self.kernel
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.stride, self.dilation, self.padding
        return N, O, (H + pt + pb - dh * (R - 1) - 1) // sh + 1, (W + pl + pr - dw * (S - 1) - 1) // sw + 1

    @property
    def flops(self) -> int:
        N, O, OH, OW = self.out_shape
        return 2 * N * O * OH * OW * self.kernel[1] * self.kernel[2] * self.kernel[3]

    def key(self) -> dict:
        return {"op": "conv2d", **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class Conv2dConfig:
    """One value per knob of ``search_space/conv2d.toml`` (the storage dtype is the workload's)."""
    tile_oc: int = 1  # output-channel blocks of 4 per work-item
    tile_oh: int = 1  # output rows per work-item
    tile_ow: int = 2  # output columns per work-item
    wg_w: int = 8  # work-group size along output columns
    wg_h: int = 1  # work-group size along output rows
    split_c: int = 1  # reduction split: input-channel blocks per step of the channel loop, unrolled
    unroll_rs: bool = True  # unroll the filter window
    vec_load: int = 4  # input loads: 4 = one vector (pixel) per 4 channels, 1 = one load per channel
    input_scope: str = "texture"
    weight_scope: str = "texture"
    output_scope: str = "texture"
    act_layout: str = "nchw4c"  # texture convention of activations: nchw4c (C0) or mace_channel_major
    weight_layout: str = "oihw4o"  # texture convention of weights: oihw4o (C1) or mace_conv2d_filter
    cache_input: bool = False  # texture RFC A0: copy a buffer input into a texture scratch first
    local_input: bool = False  # a work-group stages its input tile (window halo included) in __local memory
    compute: str = "float32"  # float32; half: half4 loads and products, float32 sums; half_acc: half sums too
    split_k: int = 1  # work-items of a work-group sharing each tile's reduction, partial sums summed in __local


def scope_layout(scope: str, texture_layout: str, buffer_layout: str, weight=False):
    """(IR scope, layout name) of an operand declared with a user-facing scope ``texture`` or ``buffer``."""
    if scope == "texture":
        return ("texture:weight" if weight else "texture"), texture_layout
    if scope == "buffer":
        return "global", buffer_layout
    raise ValueError(f"scope {scope!r}: texture or buffer")


def conv2d_nchw4c(wl: Conv2dWorkload, cfg: Conv2dConfig):
    (N, C, H, W), (O, _, R, S) = wl.data, wl.kernel
    _, _, OH, OW = wl.out_shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = wl.stride, wl.dilation, wl.padding
    C4, OB = -(-C // 4), -(-O // 4)
    G = wl.groups
    CG4, OBG = (C // G // 4, O // G // 4) if G > 1 else (C4, OB)  # blocks per group (groups pack whole pixels)
    if CG4 % cfg.split_c:
        raise ValueError(f"split_c={cfg.split_c} does not divide the {CG4} input-channel blocks (per group)")
    if G > 1 and OBG % cfg.tile_oc:
        raise ValueError(f"tile_oc={cfg.tile_oc} does not divide the {OBG} output-channel blocks of a group")
    operands = X, Wt, B, Res, Y = declare_operands(wl, cfg, O)

    t_oc, t_oh, t_ow = cfg.tile_oc, cfg.tile_oh, cfg.tile_ow
    n_ob, n_oh, n_ow = -(-OB // t_oc), -(-OH // t_oh), -(-OW // t_ow)
    g_w, g_h = -(-n_ow // cfg.wg_w), -(-n_oh // cfg.wg_h)
    vector_input = cfg.vec_load == 4 or X.scope != "global" or cfg.cache_input or cfg.local_input
    arith = Arithmetic(cfg.compute, wl.dtype)
    steps, sk = CG4 // cfg.split_c, cfg.split_k
    if sk > 1 and cfg.local_input:
        raise ValueError("split_k > 1 and local_input: the work-items of a split stage different channel blocks")
    b = Builder()
    with b.loop("nb", N * n_ob, "group.2") as nb, b.loop("tk", sk, "local.2") as tk, \
            b.loop("gh", g_h, "group.1") as gh, b.loop("th", cfg.wg_h, "local.1") as th, \
            b.loop("gw", g_w, "group.0") as gw, b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, obb = nb // n_ob, nb % n_ob
        grp = (obb * t_oc) // OBG if G > 1 else 0  # a tile's output blocks are all in one group
        oh0, ow0 = (gh * cfg.wg_h + th) * t_oh, (gw * cfg.wg_w + tw) * t_ow
        acc = arith.accumulators(b, t_oc * t_oh * t_ow)
        window = "unrolled" if cfg.unroll_rs else "serial"
        tile = LocalTile(b, cfg, (cfg.split_c, t_oh, t_ow), (sh, sw), (dh, dw), (R, S), arith) \
            if cfg.local_input else None
        with b.loop("cbk", -(-steps // sk)) as cbk:
            cbo = cbk * sk + tk  # interleaved: the work-items of a split read neighbouring channel blocks
            with b.if_(cbo < steps) if steps % sk else nullcontext():
                if tile is not None:  # stage this step's split_c input blocks, halo included, for the work-group
                    if steps > 1:
                        b.barrier()  # every work-item is done reading the previous step's tile
                    base = grp * CG4 + cbo * cfg.split_c if G > 1 else cbo * cfg.split_c
                    tile.load(lambda k, ih, iw: input_pixel(X, n, base + k, ih, iw, H, W, arith),
                              (gh * cfg.wg_h * t_oh * sh - pt, gw * cfg.wg_w * t_ow * sw - pl), th * cfg.wg_w + tw)
                with b.loop("cbi", cfg.split_c, "unrolled") as cbi, b.loop("r", R, window) as r, \
                        b.loop("s", S, window) as s:
                    conv_step(b, cfg, wl, X, Wt, acc, arith, tile, vector_input, n, grp, obb, oh0, ow0, th, tw,
                              cbo, cbi, r, s, (C4, CG4, OB, G, H, W))
        owner = None
        if sk > 1:
            acc, owner = split_sums(b, acc, t_oc * t_oh * t_ow, sk, tk, cfg.wg_w * cfg.wg_h, th * cfg.wg_w + tw,
                                    arith.acc)
        store_tile(b, acc, Y, n, obb, oh0, ow0, (t_oc, t_oh, t_ow), (OB, OH, OW), wl, B, Res, owner)
    kernel = b.kernel("conv2d_nchw4c", [p for p in operands if p is not None])
    return cache_read(kernel, X, "texture", cfg.act_layout) if cfg.cache_input else kernel


class Arithmetic:
    """The ``compute`` knob: ``float32`` (half storage read as float), ``half`` (half loads and products,
    float32 accumulators) or ``half_acc`` (half accumulators too). Half modes need float16 storage and a
    device with cl_khr_fp16 (the search spaces' ``half_compute`` constraint)."""

    def __init__(self, compute: str, dtype: str):
        if compute not in ("float32", "half", "half_acc"):
            raise ValueError(f"compute {compute!r}: float32, half or half_acc")
        if compute != "float32" and dtype != "float16":
            raise ValueError(f"compute={compute} needs float16 storage, got {dtype}")
        self.half = compute != "float32"
        self.value = "float16x4" if self.half else "float32x4"  # loaded pixels, products, the local tile
        self.acc = "float16x4" if compute == "half_acc" else "float32x4"

    def load(self, v):
        """A load of storage (read as float32) in the compute type: half loads are read as half."""
        return Cast(DType.parse(self.value).with_lanes(v.lanes), v) if self.half else v

    def accumulators(self, b, n: int):
        acc = b.allocate("acc", (n,), self.acc, "private")
        for i in range(n):
            b.store(acc, i, const(0.0, self.acc))
        return acc

    def mac(self, acc_value, product):
        """``acc + product``: a half product joins float32 accumulators as float."""
        if self.half and self.acc == "float32x4":
            product = Cast(DType("float32", product.lanes), product)
        return acc_value + product


def input_pixel(X, n, cb, ih, iw, H, W, arith):
    """The RGBA pixel of channel block ``cb`` at input row ``ih``, column ``iw`` (zero in the padding)."""
    inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
    return select(inside, arith.load(X[n, Ramp(cb * 4, as_expr(1), 4), clamp(ih, H), clamp(iw, W)]), 0.0)


class LocalTile:
    """The input a work-group reads in one reduction step -- ``blocks`` channel blocks by the rows and columns
    its outputs' windows cover (the halo included) -- staged in ``__local`` memory: every work-item loads a
    strided share of the pixels, then a barrier, then all read their taps from the tile. ``tile``:
    (channel blocks, tile_oh, tile_ow) of one work-item."""

    def __init__(self, b, cfg, tile, stride, dilation, window, arith):
        (blocks, t_oh, t_ow), (sh, sw), (dh, dw), (R, S) = tile, stride, dilation, window
        self.b, self.stride, self.dilation = b, stride, dilation
        self.blocks, self.t_oh, self.t_ow = blocks, t_oh, t_ow
        self.rows = (cfg.wg_h * t_oh - 1) * sh + (R - 1) * dh + 1
        self.cols = (cfg.wg_w * t_ow - 1) * sw + (S - 1) * dw + 1
        self.pixels = blocks * self.rows * self.cols
        self.items = cfg.wg_w * cfg.wg_h
        self.buf = b.allocate("tile", (self.pixels,), arith.value, "local")

    @staticmethod
    def bytes(cfg, tile, stride, dilation, window, compute="float32") -> int:
        (blocks, t_oh, t_ow), (sh, sw), (dh, dw), (R, S) = tile, stride, dilation, window
        rows, cols = (cfg.wg_h * t_oh - 1) * sh + (R - 1) * dh + 1, (cfg.wg_w * t_ow - 1) * sw + (S - 1) * dw + 1
        return blocks * rows * cols * (16 if compute == "float32" else 8)

    def load(self, pixel, origin, lid):
        """``pixel(k, ih, iw)``: the value of block ``k`` (of this step) at input row/column; ``origin``: the
        input row/column of the tile's corner; ``lid``: the work-item's linear id in the work-group."""
        b, plane = self.b, self.rows * self.cols
        with b.loop("ld", -(-self.pixels // self.items)) as j:
            idx = b.let("li", j * self.items + lid)
            with b.if_(idx < self.pixels) if self.pixels % self.items else nullcontext():
                k, rem = idx // plane, idx % plane
                b.store(self.buf, idx, pixel(k, origin[0] + rem // self.cols, origin[1] + rem % self.cols))
        b.barrier()

    def read(self, k, th, tw, y, x, r, s, extra_col=0):
        """Block ``k``'s pixel for output (y, x) of work-item (th, tw)'s tile at window tap (r, s), ``extra_col``
        columns to the right."""
        (sh, sw), (dh, dw) = self.stride, self.dilation
        row = (th * self.t_oh + y) * sh + r * dh
        col = (tw * self.t_ow + x) * sw + s * dw + extra_col
        return self.buf[(k * self.rows + row) * self.cols + col]


def conv_step(b, cfg, wl, X, Wt, acc, arith, tile, vector_input, n, grp, obb, oh0, ow0, th, tw, cbo, cbi, r, s,
              sizes):
    """One input-channel block (``cbo * split_c + cbi``) and window tap (r, s) of a work-item's tile: 4 lanes
    of every input pixel times 4-output weight pixels, accumulated."""
    C4, CG4, OB, G, H, W = sizes
    C = wl.data[1]
    t_oc, t_oh, t_ow = cfg.tile_oc, cfg.tile_oh, cfg.tile_ow
    (sh, sw), (dh, dw), (pt, pl, _, _) = wl.stride, wl.dilation, wl.padding
    cbl = cbo * cfg.split_c + cbi  # input block within the group (the weight's channel block)
    cb = grp * CG4 + cbl if G > 1 else cbl
    taps = {}
    for y in range(t_oh):
        for x in range(t_ow):
            ih = (oh0 + y) * sh - pt + r * dh
            iw = (ow0 + x) * sw - pl + s * dw
            inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            taps[y, x] = (inside, clamp(ih, H), clamp(iw, W))
    xs = {}
    if tile is not None:
        for y in range(t_oh):
            for x in range(t_ow):
                xs[y, x] = b.let(f"x{y}_{x}", tile.read(cbi, th, tw, y, x, r, s))
    elif vector_input:  # one RGBA pixel (4 input channels) per tap; lanes extracted below
        for (y, x), (inside, ih, iw) in taps.items():
            xs[y, x] = b.let(f"x{y}_{x}", select(inside, arith.load(X[n, Ramp(cb * 4, as_expr(1), 4), ih, iw]),
                                                0.0))
    for ci in range(4):
        c = cb * 4 + ci
        # lanes past C exist only in the last block; their weights do not (OIHW4o pads O, not C)
        with b.if_(cb < C4 - 1) if ci >= C % 4 > 0 else nullcontext():
            if vector_input:
                lane = {yx: ExtractLane(v, ci) for yx, v in xs.items()}
            else:
                lane = {yx: b.let(f"x{yx[0]}_{yx[1]}_{ci}", select(inside, arith.load(X[n, c, ih, iw]), 0.0))
                        for yx, (inside, ih, iw) in taps.items()}
            for k in range(t_oc):
                ob = min_(obb * t_oc + k, OB - 1)  # a partial last tile re-reads the last block
                wpix = b.let(f"w{k}_{ci}", arith.load(Wt[Ramp(ob * 4, as_expr(1), 4), cbl * 4 + ci, r, s]))
                for y in range(t_oh):
                    for x in range(t_ow):
                        i = (k * t_oh + y) * t_ow + x
                        b.store(acc, i, arith.mac(acc[i], lane[y, x] * wpix))


def declare_operands(wl, cfg, channels: int) -> tuple:
    """``(X, Wt, B, Res, Y)`` of a convolution in the config's scopes and layouts: activations (``Res`` in the
    output's scope) by ``act_layout``, weights by ``weight_layout``, ``B`` (``channels`` outputs) and ``Res``
    None unless the workload fuses them; in kernel argument order."""
    in_scope, in_layout = scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer")
    w_scope, w_layout = scope_layout(cfg.weight_scope, cfg.weight_layout, "oihw4o_buffer", weight=True)
    out_scope, out_layout = scope_layout(cfg.output_scope, cfg.act_layout, "nchw4c_buffer")
    return (buffer("X", wl.data, wl.dtype, in_scope, in_layout),
            buffer("Wt", wl.kernel, wl.dtype, w_scope, w_layout),
            bias_buffer(channels, wl.dtype, cfg.weight_scope) if wl.bias else None,
            buffer("Res", wl.out_shape, wl.dtype, out_scope, out_layout) if wl.residual else None,
            buffer("Y", wl.out_shape, wl.dtype, out_scope, out_layout))


def bias_buffer(O: int, dtype: str, weight_scope: str):
    """Bias beside the weights: a 1-D texture (MACE argument image) or a packed float4 buffer."""
    return buffer("B", (O,), dtype, *(("texture:weight", "mace_argument") if weight_scope == "texture"
                                       else ("global", "bias4_buffer")))


def split_sums(b, acc, n: int, sk: int, tk, items: int, lid, dtype: str):
    """The ``sk`` work-items of a split (``tk``: which one) each hold partial sums of the same ``n`` outputs:
    they write them to ``__local`` memory and output ``i`` is summed and stored by work-item ``i % sk``.
    ``items``/``lid``: the work-items of one split and this one's id among them. Returns (sums, owner)
    for ``store_tile``: ``sums[i]`` reads the total, ``owner(i)`` says whether this work-item stores it."""
    part = b.allocate("part", (sk * items * n,), dtype, "local")
    for i in range(n):
        b.store(part, (tk * items + lid) * n + i, acc[i])
    b.barrier()
    sums = []
    for i in range(n):
        v = part[lid * n + i]
        for j in range(1, sk):
            v = v + part[(j * items + lid) * n + i]
        sums.append(v)
    return sums, lambda i: tk.equal(i % sk)


def store_tile(b, acc, Y, n, obb, oh0, ow0, tile, bounds, wl, B=None, Res=None, owner=None):
    """The fused epilogue (bias, residual add, then ReLU/ReLU6: ResNet's ``relu(conv + bn + identity)``) and a
    guarded store of every tile pixel; ``owner(i)``, if given, is the condition under which this work-item
    stores tile entry ``i`` (a split reduction's sums, see ``split_sums``)."""
    (t_oc, t_oh, t_ow), (OB, OH, OW) = tile, bounds
    for k in range(t_oc):
        ob = obb * t_oc + k
        for y in range(t_oh):
            for x in range(t_ow):
                oh, ow = oh0 + y, ow0 + x
                i = (k * t_oh + y) * t_ow + x
                inside = (ob < OB) & (oh < OH) & (ow < OW)
                with b.if_(inside & owner(i) if owner is not None else inside):
                    lanes = Ramp(ob * 4, as_expr(1), 4)
                    v = acc[i]
                    if v.dtype.base == "float16":  # half accumulators: the epilogue runs in float
                        v = Cast(DType("float32", v.lanes), v)
                    if B is not None:
                        v = v + B[lanes]
                    if Res is not None:
                        v = v + Res[n, lanes, oh, ow]
                    b.store(Y, (n, lanes, oh, ow), apply_ir(wl.activation, v))


def clamp(i, n):
    return max_(min_(i, n - 1), 0)


def padded_windows(wl, x):
    """``(r, s, patch)`` per filter tap: the float64 zero-padded input pixels that tap reads for every output
    pixel (shared by the conv2d and depthwise references)."""
    N, C, H, W = wl.data
    _, _, R, S = wl.kernel
    _, _, OH, OW = wl.out_shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = wl.stride, wl.dilation, wl.padding
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    for r in range(R):
        for s in range(S):
            yield r, s, xp[:, :, r * dh: r * dh + sh * (OH - 1) + 1: sh, s * dw: s * dw + sw * (OW - 1) + 1: sw]


def reference_epilogue(wl, out: np.ndarray, bias=None, residual=None) -> np.ndarray:
    """The fused epilogue in the kernels' order: bias (per channel, axis 1), residual add, activation."""
    if bias is not None:
        out = out + bias.astype(np.float64).reshape((1, -1) + (1,) * (out.ndim - 2))
    if residual is not None:
        out = out + residual
    return apply_numpy(wl.activation, out)


def reference(wl: Conv2dWorkload, x, w, bias=None, residual=None) -> np.ndarray:
    """NumPy conv2d in float64 (the check for every tuned config)."""
    out = np.zeros(wl.out_shape)
    G, (N, O, OH, OW) = wl.groups, wl.out_shape
    for r, s, patch in padded_windows(wl, x):  # grouped: (N, G, C/G, ...) . (G, O/G, C/G)
        out += np.einsum("ngchw,goc->ngohw", patch.reshape(N, G, -1, OH, OW),
                         w[:, :, r, s].astype(np.float64).reshape(G, O // G, -1)).reshape(out.shape)
    return reference_epilogue(wl, out, bias, residual)


def random_inputs(wl, rng) -> dict:
    """Random normal operands (never zeros) keyed by kernel parameter name; conv2d's and depthwise's."""
    draw = lambda shape: rng.standard_normal(shape).astype(wl.dtype)  # noqa: E731
    inputs = {"X": draw(wl.data), "Wt": draw(wl.kernel)}
    if wl.bias:
        inputs["B"] = draw(wl.kernel[:1])
    if wl.residual:
        inputs["Res"] = draw(wl.out_shape)
    return inputs


def space_vars(wl: Conv2dWorkload) -> dict:
    (N, C, H, W), (O, _, R, S) = wl.data, wl.kernel
    _, _, OH, OW = wl.out_shape
    G = wl.groups
    return dict(N=N, C=C, H=H, W=W, O=O, R=R, S=S, OH=OH, OW=OW, C4=-(-C // 4), OB=-(-O // 4), G=G,
                CG4=C // G // 4 if G > 1 else -(-C // 4), OBG=O // G // 4 if G > 1 else -(-O // 4),
                data=wl.data, kernel=wl.kernel, out=wl.out_shape, bias=wl.bias, residual=wl.residual,
                stride=wl.stride, dilation=wl.dilation)


def texture_scopes(wl, info, operands) -> str:
    """``texture`` when the device has images (and half images for float16 storage), every ``(layout,
    shape)`` operand fits its image2d limits, and it is a GPU (PoCL emulates image reads in software);
    otherwise ``buffer``."""
    from tuner.search_space import image_fits
    ok = (info.image_support and info.type == "GPU" and (wl.dtype == "float32" or info.half_images)
          and all(image_fits(layout, shape, info) for layout, shape in operands))
    return "texture" if ok else "buffer"


def fit_work_group(n_w: int, n_h: int, info, want_w: int = 16, want_h: int = 4) -> tuple:
    """A power-of-two work-group no wider than the work (rounded up) and within the device's maximum."""
    pow2 = lambda n, cap: min(cap, 1 << max(0, (n - 1).bit_length()))  # noqa: E731
    wg_w = pow2(n_w, min(want_w, info.max_work_item_sizes[0], info.max_work_group_size))
    wg_h = pow2(n_h, min(want_h, info.max_work_item_sizes[1], info.max_work_group_size // wg_w))
    return wg_w, wg_h


GPU_ITEMS_PER_UNIT = 1024  # work-items a GPU's compute unit keeps in flight, for the fallback's occupancy


def fallback(wl: Conv2dWorkload, info) -> Conv2dConfig:
    """A config that is good without tuning: 2 output-channel blocks by 4 columns per work-item where the
    output is that large, a 16x4 work-group trimmed to the output, textures on GPUs that can hold them. On a
    GPU the work must also fill the device (``GPU_ITEMS_PER_UNIT`` work-items per compute unit): a layer with
    too few output tiles takes smaller tiles, then splits each tile's reduction over up to 32 work-items
    (``split_k``) -- the shape of every best config the H200's log holds for small late layers."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", wl.data), ("nchw4c", wl.out_shape), ("oihw4o", wl.kernel)])
    tile_oc = 2 if v["OBG"] >= 2 and (v["G"] == 1 or v["OBG"] % 2 == 0) else 1
    tile_ow = 4 if v["OW"] >= 8 else 2 if v["OW"] >= 2 else 1
    items = lambda oc, ow: v["N"] * -(-v["OB"] // oc) * v["OH"] * -(-v["OW"] // ow)  # noqa: E731
    gpu = info.type == "GPU"
    target = info.compute_units * GPU_ITEMS_PER_UNIT
    while gpu and items(tile_oc, tile_ow) < target and (tile_ow > 1 or tile_oc > 1):
        tile_ow, tile_oc = (tile_ow // 2, tile_oc) if tile_ow > 1 else (tile_ow, 1)
    wg_w, wg_h = fit_work_group(-(-v["OW"] // tile_ow), v["OH"], info)
    split_k = 1
    while gpu and items(tile_oc, tile_ow) * split_k < target and split_k < 32:
        k = split_k * 2  # the space's limits: channel steps, work-group size, __local partial sums
        if k > v["CG4"] or k > info.max_work_item_sizes[2] or wg_w * wg_h * k > info.max_work_group_size \
                or k * wg_w * wg_h * tile_oc * tile_ow * 16 > info.local_mem_bytes:
            break
        split_k = k
    return Conv2dConfig(tile_oc=tile_oc, tile_oh=1, tile_ow=tile_ow, wg_w=wg_w, wg_h=wg_h, split_c=1,
                        unroll_rs=v["R"] * v["S"] <= 9, vec_load=4, input_scope=scope, weight_scope=scope,
                        output_scope=scope, split_k=split_k)


def _reference(wl: Conv2dWorkload, inputs: dict) -> np.ndarray:
    return reference(wl, inputs["X"], inputs["Wt"], inputs.get("B"), inputs.get("Res"))


def _log2(x) -> float:
    return math.log2(max(float(x), 1.0))


def window_features(v: dict, k: dict, oc: int, blocks: int, lanes: int) -> dict:
    """Cost-model features of a window template's config: a work-item computes ``oc`` channel blocks (of
    ``blocks``) by tile_oh x tile_ow outputs, ``lanes`` multiply-adds per channel block and tap (16 for a
    full conv: 4 input lanes x 4 output channels; 4 for depthwise)."""
    tile = oc * k["tile_oh"] * k["tile_ow"]
    items = v["N"] * math.ceil(blocks / oc) * math.ceil(v["OH"] / k["tile_oh"]) * math.ceil(v["OW"] / k["tile_ow"])
    wg = k["wg_w"] * k["wg_h"]
    reads = k["tile_oh"] * k["tile_ow"] + oc * lanes // 4  # input pixels per tap against the weights they meet
    return {"work_per_item": _log2(tile), "wg_size": _log2(wg), "items": _log2(items), "groups": _log2(items / wg),
            "bytes_per_mac": 16 * reads / (tile * lanes), "registers": 4 * tile + 4 * reads,
            "padding_waste": math.ceil(v["OW"] / k["tile_ow"]) * k["tile_ow"] / v["OW"],
            "local_input": float(k.get("local_input", False)), "half": float(k.get("compute", "float32") != "float32")}


def features(v: dict, k: dict) -> dict:
    f = window_features(v, k, k["tile_oc"], v["OB"], 16)
    split = _log2(k.get("split_k", 1))  # work-items per tile: more of them, each with a shorter reduction
    return {**f, "items": f["items"] + split, "wg_size": f["wg_size"] + split, "split_k": split,
            "steps_per_item": _log2(v["CG4"] * v["R"] * v["S"] / k.get("split_k", 1))}




def is_depthwise(data: tuple, kernel: tuple, groups: int) -> bool:
    """One filter per channel (groups == C == O, one input channel per group): depthwise_conv2d's node."""
    return groups == data[1] == kernel[0] and kernel[1] == 1


def window_fields(node) -> dict:
    """A conv2d graph node's window: stride, padding, dilation."""
    a = node.attrs
    return dict(stride=tuple(a["stride"]), padding=tuple(a["padding"]), dilation=tuple(a["dilation"]))


def lower(ctx, node, ins):
    """A conv2d graph node that is not depthwise: the grouped template when the groups pack into whole RGBA
    pixels (channels per group multiples of 4), else one convolution with block-diagonal weights (exact,
    groups times the FLOPs)."""
    from tuner.templates import node_epilogue
    data, w_name = ctx.shape(node.inputs[0]), node.inputs[1]
    w_shape, groups = ctx.shape(w_name), node.attrs.get("groups", 1)
    if is_depthwise(data, w_shape, groups):
        return None
    fields, inputs = node_epilogue(ctx, node)
    extra, c = {}, data[1]
    if groups > 1:
        cg, og = c // groups, w_shape[0] // groups
        if cg % 4 or og % 4:  # block-diagonal weights: one dense convolution
            w = ctx.graph.params[w_name]
            full = np.zeros((w_shape[0], c) + w_shape[2:], np.float32)
            for k in range(groups):
                full[k * og:(k + 1) * og, k * cg:(k + 1) * cg] = w[k * og:(k + 1) * og]
            w_name, w_shape, groups = f"{node.name}.block_diagonal_w", full.shape, 1
            extra[w_name] = full
    wl = Conv2dWorkload(data=data, kernel=w_shape, groups=groups, residual="Res" in inputs, **window_fields(node),
                        **fields)
    return wl, {"X": ins[0], "Wt": w_name, **inputs}, extra


# a model's kernels exchange NCHW4c activations: the layout is pinned, not tuned
MODEL_KNOBS = {"act_layout": "nchw4c"}
WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("kernel", "shape", "O,C,R,S", "weight shape", required=True),
                 *WINDOW_ARGS, WorkloadArg("groups", "int", "G", "grouped convolution (default 1)"),
                 *EPILOGUE_ARGS, WorkloadArg("residual", "flag", help="fuse a residual add of a second NCHW4c tensor"))

VARIABLES = dict(N="batch", C="input channels", H="input height", W="input width", O="output channels",
                 R="kernel height", S="kernel width", OH="output height", OW="output width",
                 C4="input-channel blocks of 4", OB="output-channel blocks of 4", G="groups",
                 CG4="input-channel blocks per group", OBG="output-channel blocks per group", data="data shape NCHW",
                 kernel="kernel shape OIHW", out="output shape NCHW", bias="fused bias",
                 residual="fused residual add", stride="stride (h, w)", dilation="dilation (h, w)")
TEMPLATE = Template("conv2d", Conv2dWorkload, Conv2dConfig, conv2d_nchw4c, _reference, random_inputs,
                    fallback, space_vars, VARIABLES, features=features, model_knobs=MODEL_KNOBS,
                    workload_args=WORKLOAD_ARGS, graph_ops=("conv2d",), lower=lower)
