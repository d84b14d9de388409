"""conv2d over NCHW4c activations and OIHW4o weights, written once; scopes and layouts are declarations.

Each work-item computes a tile of ``tile_oc`` output-channel blocks (4 channels each, one RGBA pixel) by
``tile_oh`` rows by ``tile_ow`` columns. The reduction walks input-channel blocks, then the filter window,
then the 4 lanes of a block unrolled: one input lane (a single-lane read, broadcast) times one weight
pixel (4 output channels) -- the outer product of the texture RFC's Adreno schedules.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np

from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Ramp, as_expr, max_, min_, select
from tuner.ir.kernel import Kernel

ACTIVATIONS = ("none", "relu", "relu6")


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
        if self.groups != 1 or self.kernel[1] != self.data[1]:
            raise ValueError(f"conv2d_nchw4c is for groups=1 with kernel C == data C ({self.kernel[1]} vs "
                             f"{self.data[1]}); use depthwise_conv2d for depthwise")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} not in {ACTIVATIONS}")
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
        return 2 * N * O * OH * OW * self.data[1] * self.kernel[2] * self.kernel[3]

    def key(self) -> dict:
        return {"op": "conv2d", **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class Conv2dConfig:
    tile_oc: int = 1  # output-channel blocks of 4 per work-item
    tile_oh: int = 1
    tile_ow: int = 2
    wg_w: int = 8  # work-group size along output columns
    wg_h: int = 1
    unroll_rs: bool = True  # unroll the filter window
    input_scope: str = "texture"
    weight_scope: str = "texture"
    output_scope: str = "texture"
    act_layout: str = "nchw4c"  # or mace_channel_major
    weight_layout: str = "oihw4o"  # or mace_conv2d_filter (texture only)
    extra: dict = field(default_factory=dict, compare=False)


def _scope_layout(scope: str, texture_layout: str, buffer_layout: str, weight=False):
    if scope == "texture":
        return ("texture:weight" if weight else "texture"), texture_layout
    if scope == "buffer":
        return "global", buffer_layout
    raise ValueError(f"scope {scope!r}: texture or buffer")


def conv2d_nchw4c(wl: Conv2dWorkload, cfg: Conv2dConfig) -> Kernel:
    (N, C, H, W), (O, _, R, S) = wl.data, wl.kernel
    _, _, OH, OW = wl.out_shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = wl.stride, wl.dilation, wl.padding
    C4, OB = -(-C // 4), -(-O // 4)
    in_scope, in_layout = _scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer")
    w_scope, w_layout = _scope_layout(cfg.weight_scope, cfg.weight_layout, "oihw4o_buffer", weight=True)
    out_scope, out_layout = _scope_layout(cfg.output_scope, cfg.act_layout, "nchw4c_buffer")
    X = buffer("X", wl.data, wl.dtype, in_scope, in_layout)
    Wt = buffer("Wt", wl.kernel, wl.dtype, w_scope, w_layout)
    Y = buffer("Y", wl.out_shape, wl.dtype, out_scope, out_layout)
    params = [X, Wt]
    if wl.bias:
        B = buffer("B", (O,), wl.dtype, *(("texture:weight", "mace_argument") if cfg.weight_scope == "texture"
                                           else ("global", "bias4_buffer")))
        params.append(B)
    if wl.residual:
        Res = buffer("Res", wl.out_shape, wl.dtype, out_scope, out_layout)
        params.append(Res)
    params.append(Y)

    t_oc, t_oh, t_ow = cfg.tile_oc, cfg.tile_oh, cfg.tile_ow
    n_ob, n_oh, n_ow = -(-OB // t_oc), -(-OH // t_oh), -(-OW // t_ow)
    g_w, g_h = -(-n_ow // cfg.wg_w), -(-n_oh // cfg.wg_h)
    b = Builder()
    with b.loop("nb", N * n_ob, "group.2") as nb, b.loop("gh", g_h, "group.1") as gh, \
            b.loop("th", cfg.wg_h, "local.1") as th, b.loop("gw", g_w, "group.0") as gw, \
            b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, obb = nb // n_ob, nb % n_ob
        oh0, ow0 = (gh * cfg.wg_h + th) * t_oh, (gw * cfg.wg_w + tw) * t_ow
        acc = b.allocate("acc", (t_oc * t_oh * t_ow,), "float32x4", "private")
        for i in range(t_oc * t_oh * t_ow):
            b.store(acc, i, 0.0)
        window = "unrolled" if cfg.unroll_rs else "serial"
        with b.loop("cb", C4) as cb, b.loop("r", R, window) as r, b.loop("s", S, window) as s, \
                b.loop("ci", 4, "unrolled") as ci:
            c = cb * 4 + ci
            with b.if_(c < C) if C % 4 else nullcontext():
                xs = {}
                for y in range(t_oh):
                    for x in range(t_ow):
                        ih = (oh0 + y) * sh - pt + r * dh
                        iw = (ow0 + x) * sw - pl + s * dw
                        inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                        xs[y, x] = b.let(f"x{y}_{x}", select(inside, X[n, c, _clamp(ih, H), _clamp(iw, W)], 0.0))
                for k in range(t_oc):
                    ob = min_(obb * t_oc + k, OB - 1)  # a partial last tile re-reads the last block
                    wpix = b.let(f"w{k}", Wt[Ramp(ob * 4, as_expr(1), 4), c, r, s])
                    for y in range(t_oh):
                        for x in range(t_ow):
                            i = (k * t_oh + y) * t_ow + x
                            b.store(acc, i, acc[i] + xs[y, x] * wpix)
        for k in range(t_oc):
            ob = obb * t_oc + k
            for y in range(t_oh):
                for x in range(t_ow):
                    oh, ow = oh0 + y, ow0 + x
                    with b.if_((ob < OB) & (oh < OH) & (ow < OW)):
                        lanes = Ramp(ob * 4, as_expr(1), 4)
                        v = acc[(k * t_oh + y) * t_ow + x]
                        if wl.bias:
                            v = v + B[lanes]
                        if wl.activation in ("relu", "relu6"):
                            v = max_(v, 0.0)
                        if wl.activation == "relu6":
                            v = min_(v, 6.0)
                        if wl.residual:
                            v = v + Res[n, lanes, oh, ow]
                        b.store(Y, (n, lanes, oh, ow), v)
    return b.kernel("conv2d_nchw4c", params)


def _clamp(i, n):
    return max_(min_(i, n - 1), 0)


def reference(wl: Conv2dWorkload, x, w, bias=None, residual=None) -> np.ndarray:
    """NumPy conv2d in float64 (the check for every tuned config)."""
    (N, C, H, W), (O, _, R, S) = wl.data, wl.kernel
    _, _, OH, OW = wl.out_shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = wl.stride, wl.dilation, wl.padding
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    out = np.zeros((N, O, OH, OW))
    for r in range(R):
        for s in range(S):
            patch = xp[:, :, r * dh: r * dh + sh * (OH - 1) + 1: sh, s * dw: s * dw + sw * (OW - 1) + 1: sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, r, s].astype(np.float64))
    if bias is not None:
        out += bias.astype(np.float64)[None, :, None, None]
    if wl.activation in ("relu", "relu6"):
        out = np.maximum(out, 0)
    if wl.activation == "relu6":
        out = np.minimum(out, 6)
    if residual is not None:
        out += residual
    return out
