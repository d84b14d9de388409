"""conv2d over NCHW4c activations and OIHW4o weights, written once; scopes and layouts are declarations.

Each work-item computes a tile of ``tile_oc`` output-channel blocks (4 channels each, one RGBA pixel) by
``tile_oh`` rows by ``tile_ow`` columns. The reduction walks input-channel blocks, then the filter window,
then the 4 lanes of a block unrolled: one input lane (a single-lane read, broadcast) times one weight
pixel (4 output channels) -- the outer product of the texture RFC's Adreno schedules.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import ExtractLane, Ramp, as_expr, max_, min_, select
from tuner.ir.activations import NAMES as ACTIVATIONS  # noqa: F401  (importers use the name)
from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.schedule import cache_read
from tuner.templates import Template



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
    vector_input = cfg.vec_load == 4 or X.scope != "global" or cfg.cache_input
    b = Builder()
    with b.loop("nb", N * n_ob, "group.2") as nb, b.loop("gh", g_h, "group.1") as gh, \
            b.loop("th", cfg.wg_h, "local.1") as th, b.loop("gw", g_w, "group.0") as gw, \
            b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, obb = nb // n_ob, nb % n_ob
        grp = (obb * t_oc) // OBG if G > 1 else 0  # a tile's output blocks are all in one group
        oh0, ow0 = (gh * cfg.wg_h + th) * t_oh, (gw * cfg.wg_w + tw) * t_ow
        acc = b.allocate("acc", (t_oc * t_oh * t_ow,), "float32x4", "private")
        for i in range(t_oc * t_oh * t_ow):
            b.store(acc, i, 0.0)
        window = "unrolled" if cfg.unroll_rs else "serial"
        with b.loop("cbo", CG4 // cfg.split_c) as cbo, b.loop("cbi", cfg.split_c, "unrolled") as cbi, \
                b.loop("r", R, window) as r, b.loop("s", S, window) as s:
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
            if vector_input:  # one RGBA pixel (4 input channels) per tap; lanes extracted below
                for (y, x), (inside, ih, iw) in taps.items():
                    xs[y, x] = b.let(f"x{y}_{x}", select(inside, X[n, Ramp(cb * 4, as_expr(1), 4), ih, iw], 0.0))
            for ci in range(4):
                c = cb * 4 + ci
                # lanes past C exist only in the last block; their weights do not (OIHW4o pads O, not C)
                with b.if_(cb < C4 - 1) if ci >= C % 4 > 0 else nullcontext():
                    if vector_input:
                        lane = {yx: ExtractLane(v, ci) for yx, v in xs.items()}
                    else:
                        lane = {yx: b.let(f"x{yx[0]}_{yx[1]}_{ci}", select(inside, X[n, c, ih, iw], 0.0))
                                for yx, (inside, ih, iw) in taps.items()}
                    for k in range(t_oc):
                        ob = min_(obb * t_oc + k, OB - 1)  # a partial last tile re-reads the last block
                        wpix = b.let(f"w{k}_{ci}", Wt[Ramp(ob * 4, as_expr(1), 4), cbl * 4 + ci, r, s])
                        for y in range(t_oh):
                            for x in range(t_ow):
                                i = (k * t_oh + y) * t_ow + x
                                b.store(acc, i, acc[i] + lane[y, x] * wpix)
        store_tile(b, acc, Y, n, obb, oh0, ow0, (t_oc, t_oh, t_ow), (OB, OH, OW), wl, B, Res)
    kernel = b.kernel("conv2d_nchw4c", [p for p in operands if p is not None])
    return cache_read(kernel, X, "texture", cfg.act_layout) if cfg.cache_input else kernel


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


def store_tile(b, acc, Y, n, obb, oh0, ow0, tile, bounds, wl, B=None, Res=None):
    """The fused epilogue (bias, residual add, then ReLU/ReLU6: ResNet's ``relu(conv + bn + identity)``) and a
    guarded store of every tile pixel."""
    (t_oc, t_oh, t_ow), (OB, OH, OW) = tile, bounds
    for k in range(t_oc):
        ob = obb * t_oc + k
        for y in range(t_oh):
            for x in range(t_ow):
                oh, ow = oh0 + y, ow0 + x
                with b.if_((ob < OB) & (oh < OH) & (ow < OW)):
                    lanes = Ramp(ob * 4, as_expr(1), 4)
                    v = acc[(k * t_oh + y) * t_ow + x]
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
                data=wl.data, kernel=wl.kernel, out=wl.out_shape, bias=wl.bias, residual=wl.residual)


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


def fallback(wl: Conv2dWorkload, info) -> Conv2dConfig:
    """A config that is good without tuning: 2 output-channel blocks by 4 columns per work-item where the
    output is that large, a 16x4 work-group trimmed to the output, textures on GPUs that can hold them."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", wl.data), ("nchw4c", wl.out_shape), ("oihw4o", wl.kernel)])
    tile_oc = 2 if v["OBG"] >= 2 and (v["G"] == 1 or v["OBG"] % 2 == 0) else 1
    tile_ow = 4 if v["OW"] >= 8 else 2 if v["OW"] >= 2 else 1
    wg_w, wg_h = fit_work_group(-(-v["OW"] // tile_ow), v["OH"], info)
    return Conv2dConfig(tile_oc=tile_oc, tile_oh=1, tile_ow=tile_ow, wg_w=wg_w, wg_h=wg_h, split_c=1,
                        unroll_rs=v["R"] * v["S"] <= 9, vec_load=4, input_scope=scope, weight_scope=scope,
                        output_scope=scope)


def _reference(wl: Conv2dWorkload, inputs: dict) -> np.ndarray:
    return reference(wl, inputs["X"], inputs["Wt"], inputs.get("B"), inputs.get("Res"))


VARIABLES = dict(N="batch", C="input channels", H="input height", W="input width", O="output channels",
                 R="kernel height", S="kernel width", OH="output height", OW="output width",
                 C4="input-channel blocks of 4", OB="output-channel blocks of 4", G="groups",
                 CG4="input-channel blocks per group", OBG="output-channel blocks per group", data="data shape NCHW",
                 kernel="kernel shape OIHW", out="output shape NCHW", bias="fused bias",
                 residual="fused residual add")
TEMPLATE = Template("conv2d", Conv2dWorkload, Conv2dConfig, conv2d_nchw4c, _reference, random_inputs,
                    fallback, space_vars, VARIABLES)
