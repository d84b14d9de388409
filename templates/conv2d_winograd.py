"""Winograd convolution F(2x2,3x3) and F(4x4,3x3) over NCHW4c activations, one fused kernel per layer.

Registered as two templates from this file, ``winograd2`` and ``winograd4`` (``m``, the output tile, is a
property of the workload class, not a knob: the weight transform is fixed when the model is compiled). They
take the conv2d nodes with a 3x3 kernel, stride 1, dilation 1 and groups 1; a model plans them as
alternatives of the direct ``conv2d`` and deploys, per node, the one the tuning log measured fastest.

The algorithm (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016, arXiv:1509.09308),
with alpha = m + 2::

    Y = A^T [ sum_c (G g_c G^T) (.) (B^T d_c B) ] A

for every m x m output tile, d_c the alpha x alpha input patch of channel c (zero outside the image), g_c the
3x3 filter. ``U = G g G^T`` is computed once, in NumPy (float64, then cast to the storage type): by the
template's ``lower`` for a model (a new param ``<weight>.winograd<m>``, logically ``[O, I, alpha, alpha]`` and
stored through the same weight layouts and scopes as the direct conv's OIHW weights, alpha x alpha in place of
R x S) and by ``random_inputs`` for measuring, so the NumPy ``reference`` stays the direct convolution of the
3x3 weights. F(2x2) uses the points 0, 1, -1 (B and A hold only 0/+-1: the input transform is additions
only); F(4x4) the points 0, +-1, +-2 (the matrices of the paper's section 4.2, also NNPACK's and MNN's).

Schedule: a work-item computes ``tile_cb`` output-channel blocks of 4 by ``tile_t`` horizontally adjacent
tiles. For each input-channel block (one RGBA pixel = 4 channels) it loads the alpha x (tile_t*m + 2) input
pixels its tiles cover, transforms each tile (V = B^T d B, unrolled sums with constant coefficients, per
pixel: the 4 lanes are 4 input channels), then, lane by lane, multiplies every V element with the 4-output
weight pixel U[ob, c, u, v] (the direct template's outer product, alpha^2 of them instead of 9) into alpha^2
accumulators per tile and channel block. At the end Y = A^T M A and the direct template's fused epilogue
(bias, residual add, activation: ``store_tile``) stores the m x m outputs of each tile, guarded at the edges.
With ``split_k`` > 1, that many work-items of a work-group share a tile's channel loop (interleaved blocks),
each transforms its partial sums to Y, and the partial outputs (m^2 of them, not alpha^2: the transform is
linear) are summed in ``__local`` memory as the direct template's split does: more work-items for layers
whose tiles alone cannot fill a desktop GPU (256 x 14 x 14 in F(4x4) has 1,024 tile-and-block pairs).

Accuracy (max error relative to the largest magnitude of the float64 direct convolution of the same 3x3
weights; random normal inputs, 2-3 seeds, C = 8 to 512, PoCL and Intel's CPU runtime alike):

* float32 storage: F(2x2) 1.5e-7 to 8.5e-7, F(4x4) 2e-6 to 7.5e-6 (the direct conv: ~3e-7). Tolerance 1e-4.
* float16 storage, float32 arithmetic: F(2x2) 4.4e-4 to 5.6e-4 (as the direct conv: the output's rounding),
  F(4x4) 4.3e-3 to 7.3e-3 -- the half rounding of U and of the inputs is amplified by B's coefficients (up to
  5) and A's (up to 8). Tolerance: 1e-2 for F(2x2), 2e-2 for F(4x4).
* ``compute=half`` (half input transform and products, float32 sums): F(2x2) 7.8e-4 to 1e-3; F(4x4) 9e-3 to
  2.1e-2, so the search space allows half arithmetic for F(2x2) only. ``half_acc`` (half sums too): F(2x2)
  1.2e-3 at C = 8, 3.9e-3 at 64, 7.2e-3 at 256 (allowed up to C = 256); F(4x4) 1.6e-2 to 0.125.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import ClassVar

import numpy as np

from tuner.ir.builder import Builder
from tuner.ir.dtype import DType
from tuner.ir.expr import Cast, ExtractLane, Ramp, as_expr, min_
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, bias_length, node_epilogue
from tuner.templates.common import (MODEL_KNOBS, PAD_MODE_ARG, Arithmetic, Conv2dWorkload, declare_operands,
                                           fit_work_group, input_pixel, is_depthwise, split_sums, store_tile,
                                           texture_scopes)
from tuner.templates.common import reference as direct_reference

# Lavin & Gray (arXiv:1509.09308), section 4.1 (F(2x2,3x3)) and 4.2 (F(4x4,3x3)).
MATRICES = {
    2: dict(BT=[[1, 0, -1, 0],
                [0, 1, 1, 0],
                [0, -1, 1, 0],
                [0, 1, 0, -1]],
            G=[[1, 0, 0],
               [1 / 2, 1 / 2, 1 / 2],
               [1 / 2, -1 / 2, 1 / 2],
               [0, 0, 1]],
            AT=[[1, 1, 1, 0],
                [0, 1, -1, -1]]),
    4: dict(BT=[[4, 0, -5, 0, 1, 0],
                [0, -4, -4, 1, 1, 0],
                [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0],
                [0, 4, 0, -5, 0, 1]],
            G=[[1 / 4, 0, 0],
               [-1 / 6, -1 / 6, -1 / 6],
               [-1 / 6, 1 / 6, -1 / 6],
               [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6],
               [0, 0, 1]],
            AT=[[1, 1, 1, 1, 1, 0],
                [0, 1, -1, 2, -2, 0],
                [0, 1, 1, 4, 4, 0],
                [0, 1, -1, 8, -8, 1]]),
}


def transform_weights(w: np.ndarray, m: int, dtype="float32") -> np.ndarray:
    """``U = G g G^T`` per (output, input) channel: ``[O, I, 3, 3]`` -> ``[O, I, m+2, m+2]``, computed in
    float64 and cast to ``dtype``."""
    G = np.asarray(MATRICES[m]["G"], np.float64)
    return np.einsum("ur,oirs,vs->oiuv", G, np.asarray(w, np.float64), G).astype(dtype)


def untransform_weights(u: np.ndarray, m: int) -> np.ndarray:
    """The 3x3 weights whose transform is closest to ``u`` (least squares through G's pseudo-inverse; exact
    for a float64 transform)."""
    P = np.linalg.pinv(np.asarray(MATRICES[m]["G"], np.float64))
    return np.einsum("ru,oiuv,sv->oirs", P, np.asarray(u, np.float64), P)


def computes(kernel, stride, dilation, groups) -> bool:
    """Whether F(m x m, 3x3) computes a convolution with this window: a 3x3 kernel, stride 1, dilation 1,
    ungrouped."""
    return tuple(kernel[2:]) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1


@dataclass(frozen=True)
class WinogradWorkload:
    """A 3x3, stride 1, dilation 1, ungrouped convolution computed by F(m x m, 3x3) (``m`` is the class's:
    ``Winograd2Workload`` or ``Winograd4Workload``). ``kernel``: the logical 3x3 weights O,C,3,3."""
    m: ClassVar[int] = 0
    data: tuple  # N, C, H, W
    kernel: tuple  # O, C, 3, 3
    padding: tuple = (0, 0, 0, 0)
    dtype: str = "float32"
    bias: bool = False
    activation: str = "none"
    residual: bool = False
    pad_mode: str = "zeros"  # as Conv2dWorkload's: a reflection or edge Pad read in place

    def __post_init__(self):
        if self.m not in MATRICES:
            raise ValueError("use Winograd2Workload or Winograd4Workload")
        direct = Conv2dWorkload(self.data, self.kernel, padding=self.padding, dtype=self.dtype, bias=self.bias,
                                activation=self.activation, residual=self.residual,
                                pad_mode=self.pad_mode)  # shared checks
        if direct.kernel[2:] != (3, 3):
            raise ValueError(f"winograd{self.m} computes 3x3 convolutions; got kernel {list(direct.kernel)}")
        for name in ("data", "kernel", "padding", "activation"):
            object.__setattr__(self, name, getattr(direct, name))

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def direct(self) -> Conv2dWorkload:
        """The same convolution as the direct template's workload (its reference, its output shape)."""
        return Conv2dWorkload(self.data, self.kernel, padding=self.padding, dtype=self.dtype, bias=self.bias,
                              activation=self.activation, residual=self.residual, pad_mode=self.pad_mode)

    @classmethod
    def of(cls, direct: Conv2dWorkload):
        """The workload of this tile size that computes the direct template's workload ``direct``, or None
        where Winograd cannot (see ``computes``)."""
        if not computes(direct.kernel, direct.stride, direct.dilation, direct.groups):
            return None
        return cls(data=direct.data, kernel=direct.kernel, padding=direct.padding, dtype=direct.dtype,
                   bias=direct.bias, activation=direct.activation, residual=direct.residual, pad_mode=direct.pad_mode)

    @property
    def transformed_kernel(self) -> tuple:
        """Shape of the transformed weights the kernel reads: O, C, alpha, alpha."""
        return self.kernel[0], self.kernel[1], self.alpha, self.alpha

    @property
    def out_shape(self) -> tuple:
        return self.direct.out_shape

    @property
    def flops(self) -> int:
        """The direct convolution's FLOPs (so GFLOP/s compare with conv2d's for the same layer)."""
        return self.direct.flops

    def key(self) -> dict:
        """The log's key; ``pad_mode`` only when not zeros (the keys of every other layer as before it)."""
        return {"op": f"winograd{self.m}", **{k: list(v) if isinstance(v, tuple) else v
                                              for k, v in asdict(self).items() if k != "pad_mode" or v != "zeros"}}


@dataclass(frozen=True)
class Winograd2Workload(WinogradWorkload):
    m: ClassVar[int] = 2


@dataclass(frozen=True)
class Winograd4Workload(WinogradWorkload):
    m: ClassVar[int] = 4


@dataclass(frozen=True)
class WinogradConfig:
    """One value per knob of ``search_space/conv2d_winograd.toml``."""
    tile_cb: int = 1  # output-channel blocks of 4 per work-item
    tile_t: int = 1  # horizontally adjacent m x m tiles per work-item (their input patches overlap)
    wg_w: int = 8  # work-group size along tile columns
    wg_h: int = 1  # work-group size along tile rows
    split_c: int = 1  # input-channel blocks per (unrolled) step of the channel loop
    split_k: int = 1  # work-items of a work-group sharing each tile's channel loop, outputs summed in __local
    input_scope: str = "texture"
    weight_scope: str = "texture"
    output_scope: str = "texture"
    act_layout: str = "nchw4c"
    weight_layout: str = "oihw4o"  # of the transformed [O, I, alpha, alpha] weights
    compute: str = "float32"  # float32; half: half transform and products, float32 sums; half_acc: half sums


def linear_combination(coefficients, values: list):
    """``sum_k coefficients[k] * values[k]`` with the zero terms left out and +-1 as additions."""
    expr = None
    for c, v in zip(coefficients, values):
        if c == 0:
            continue
        if expr is None:
            expr = v if c == 1 else -v if c == -1 else v * float(c)
        elif c == 1 or c == -1:
            expr = expr + v if c == 1 else expr - v
        else:
            expr = expr + v * float(c) if c > 0 else expr - v * float(-c)
    return expr


def transform_2d(b, name: str, mat, patch: list, store) -> None:
    """``mat @ patch @ mat^T`` (``patch``: rows of expressions), unrolled: the rows' products as lets of one
    ``b.block``, then ``store(i, j, value)`` of every entry."""
    with b.block():
        rows = [[b.let(f"{name}_{i}_{j}", linear_combination(mat[i], [row[j] for row in patch]))
                 for j in range(len(patch[0]))] for i in range(len(mat))]
        for i in range(len(mat)):
            for j in range(len(mat)):
                store(i, j, linear_combination(mat[j], rows[i]))


def channel_step(b, wl, cfg, X, Wt, acc, d, V, arith, n, obb, oh0, ow0, cb_expr) -> None:
    """One input-channel block ``cb`` of a work-item's tiles: load the alpha x (tile_t*m + 2) input pixels, V =
    B^T d B per tile, then lane by lane (4 input channels) multiply every V element with the 4-output weight
    pixel U[ob, c, u, v] into the alpha^2 accumulators of each tile and output-channel block."""
    m, a = wl.m, wl.alpha
    BT = MATRICES[m]["BT"]
    (N, C, H, W), O = wl.data, wl.kernel[0]
    pt, pl = wl.padding[:2]
    C4, OB = -(-C // 4), -(-O // 4)
    t_cb, t_t = cfg.tile_cb, cfg.tile_t
    cols = t_t * m + 2
    cb = b.let("cb", cb_expr)
    ih0, iw0 = b.let("ih0", oh0 - pt), b.let("iw0", ow0 - pl)
    for i in range(a):
        for j in range(cols):
            b.store(d, i * cols + j, input_pixel(X, n, cb, ih0 + i, iw0 + j, H, W, arith, wl.pad_mode))
    for t in range(t_t):  # V = B^T d B
        patch = [[d[i * cols + t * m + j] for j in range(a)] for i in range(a)]
        transform_2d(b, f"r{t}", BT, patch, lambda u, v, x, t=t: b.store(V, (t * a + u) * a + v, x))
    for ci in range(4):
        # lanes past C exist only in the last block; their weights do not (OIHW4o pads O, not C)
        with b.if_(cb < C4 - 1) if ci >= C % 4 > 0 else nullcontext():
            for k in range(t_cb):
                ob = min_(obb * t_cb + k, OB - 1)  # a partial last tile re-reads the last block
                with b.block():
                    for u in range(a):
                        for v in range(a):
                            w = arith.load(Wt[Ramp(ob * 4, as_expr(1), 4), cb * 4 + ci, u, v])
                            w = b.let(f"w{k}_{ci}_{u}_{v}", w) if t_t > 1 else w
                            for t in range(t_t):
                                i = ((k * t_t + t) * a + u) * a + v
                                x = ExtractLane(V[(t * a + u) * a + v], ci)
                                b.store(acc, i, arith.mac(acc[i], x * w))


def conv2d_winograd(wl: WinogradWorkload, cfg: WinogradConfig):
    m, a = wl.m, wl.alpha
    AT = MATRICES[m]["AT"]
    (N, C, H, W), O = wl.data, wl.kernel[0]
    _, _, OH, OW = wl.out_shape
    C4, OB = -(-C // 4), -(-O // 4)
    TH, TW = -(-OH // m), -(-OW // m)  # tiles
    if C4 % cfg.split_c:
        raise ValueError(f"split_c={cfg.split_c} does not divide the {C4} input-channel blocks")
    if cfg.split_k > C4 // cfg.split_c:
        raise ValueError(f"split_k={cfg.split_k} is more than the {C4 // cfg.split_c} channel steps (C4 / split_c)")
    shapes = SimpleNamespace(data=wl.data, kernel=wl.transformed_kernel, out_shape=wl.out_shape, dtype=wl.dtype,
                             bias=wl.bias, residual=wl.residual, activation=wl.activation)
    operands = X, Wt, B, Res, Y = declare_operands(shapes, cfg, O)

    t_cb, t_t = cfg.tile_cb, cfg.tile_t
    n_ob, n_tw = -(-OB // t_cb), -(-TW // t_t)
    arith = Arithmetic(cfg.compute, wl.dtype)
    cols = t_t * m + 2  # input columns the tiles of a work-item cover
    steps, sk = C4 // cfg.split_c, cfg.split_k
    b = Builder()
    with b.loop("nb", N * n_ob, "group.2") as nb, b.loop("tk", sk, "local.2") as tk, \
            b.loop("gh", -(-TH // cfg.wg_h), "group.1") as gh, b.loop("th", cfg.wg_h, "local.1") as th, \
            b.loop("gw", -(-n_tw // cfg.wg_w), "group.0") as gw, b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, obb = nb // n_ob, nb % n_ob
        oh0, ow0 = (gh * cfg.wg_h + th) * m, (gw * cfg.wg_w + tw) * (t_t * m)
        # private arrays indexed by constants once unrolled (registers): accumulators M[k, t, u, v], the input
        # pixels of one channel block, their transforms V[t, u, v]
        acc = arith.accumulators(b, t_cb * t_t * a * a)
        d = b.allocate("d", (a * cols,), arith.value, "private")
        V = b.allocate("V", (t_t * a * a,), arith.value, "private")
        with b.loop("cbk", -(-steps // sk)) as cbk:
            cbo = cbk * sk + tk if sk > 1 else cbk  # interleaved: a split's work-items read neighbouring blocks
            with b.if_(cbo < steps) if steps % sk else nullcontext(), \
                    b.loop("cbi", cfg.split_c, "unrolled") as cbi:
                channel_step(b, wl, cfg, X, Wt, acc, d, V, arith, n, obb, oh0, ow0, cbo * cfg.split_c + cbi)
        # Y = A^T M A (in float: A's coefficients reach 8), then the direct conv's epilogue and guarded stores
        out = b.allocate("out", (t_cb * m * t_t * m,), "float32x4", "private")
        for k in range(t_cb):
            for t in range(t_t):
                M = [[acc[((k * t_t + t) * a + u) * a + v] for v in range(a)] for u in range(a)]
                if arith.acc != "float32x4":
                    M = [[Cast(DType("float32", 4), x) for x in row] for row in M]
                transform_2d(b, f"y{k}_{t}", AT, M,
                             lambda y, x, v, k=k, t=t: b.store(out, (k * m + y) * (t_t * m) + t * m + x, v))
        owner = None
        if sk > 1:  # the output transform is linear: the split's partial outputs are summed after it (m^2 < alpha^2)
            out, owner = split_sums(b, out, t_cb * m * t_t * m, sk, tk, cfg.wg_w * cfg.wg_h, th * cfg.wg_w + tw,
                                    "float32x4")
        store_tile(b, out, Y, n, obb, oh0, ow0, (t_cb, m, t_t * m), (OB, OH, OW), wl, B, Res, owner)
    return b.kernel(f"conv2d_winograd{m}", [p for p in operands if p is not None])


class WinogradInputs(dict):
    """Kernel inputs by parameter name (``Wt``: the transformed weights), carrying the logical 3x3 weights
    they came from for the reference (``weights``): not a kernel parameter."""
    weights: np.ndarray | None = None


def random_inputs(wl: WinogradWorkload, rng) -> dict:
    """Random normal operands, the direct conv's draws: X, the 3x3 weights (transformed here, in float64, as
    ``lower`` does for a model), then B and Res."""
    draw = lambda shape: rng.standard_normal(shape).astype(wl.dtype)  # noqa: E731
    x, g = draw(wl.data), draw(wl.kernel)
    inputs = WinogradInputs(X=x, Wt=transform_weights(g, wl.m, wl.dtype))
    inputs.weights = g
    if wl.bias:  # a PReLU's slopes after the biases (bias_length)
        inputs["B"] = draw((bias_length(wl, wl.kernel[0]),))
        if wl.activation == "prelu":
            half = inputs["B"].size // 2
            inputs["B"][half:] = rng.uniform(0.05, 0.5, half).astype(wl.dtype)
    if wl.residual:
        inputs["Res"] = draw(wl.out_shape)
    return inputs


def _reference(wl: WinogradWorkload, inputs: dict) -> np.ndarray:
    """The direct convolution (float64) of the 3x3 weights the inputs were made from; inputs without them
    (a plain dict of kernel inputs) use the least-squares 3x3 weights of their ``Wt``."""
    g = getattr(inputs, "weights", None)
    if g is None:
        g = untransform_weights(inputs["Wt"], wl.m)
    return direct_reference(wl.direct, inputs["X"], g, inputs.get("B"), inputs.get("Res"))


def space_vars(wl: WinogradWorkload) -> dict:
    (N, C, H, W), O = wl.data, wl.kernel[0]
    _, _, OH, OW = wl.out_shape
    m = wl.m
    return dict(N=N, C=C, H=H, W=W, O=O, OH=OH, OW=OW, C4=-(-C // 4), OB=-(-O // 4), m=m, alpha=m + 2,
                TH=-(-OH // m), TW=-(-OW // m), data=wl.data, kernel=wl.transformed_kernel, out=wl.out_shape,
                bias=wl.bias, residual=wl.residual)


VARIABLES = dict(N="batch", C="input channels", H="input height", W="input width", O="output channels",
                 OH="output height", OW="output width", C4="input-channel blocks of 4",
                 OB="output-channel blocks of 4", m="output tile (m x m)", alpha="input tile (alpha = m + 2)",
                 TH="tile rows", TW="tile columns", data="data shape NCHW",
                 kernel="transformed weight shape O,C,alpha,alpha", out="output shape NCHW", bias="fused bias",
                 residual="fused residual add")


def fallback(wl: WinogradWorkload, info) -> WinogradConfig:
    """F(2x2): 2 output-channel blocks by 2 tiles per work-item where there are that many; F(4x4): one by one
    (36 accumulators per tile and block). A 16x4 work-group trimmed to the tiles; textures on GPUs that hold
    the tensors."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", wl.data), ("nchw4c", wl.out_shape),
                                      ("oihw4o", wl.transformed_kernel)])
    small = wl.m == 2
    tile_cb = 2 if small and v["OB"] >= 2 else 1
    tile_t = 2 if small and v["TW"] >= 2 else 1
    wg_w, wg_h = fit_work_group(-(-v["TW"] // tile_t), v["TH"], info)
    return WinogradConfig(tile_cb=tile_cb, tile_t=tile_t, wg_w=wg_w, wg_h=wg_h, input_scope=scope,
                          weight_scope=scope, output_scope=scope)


def _log2(x) -> float:
    return math.log2(max(float(x), 1.0))


def features(v: dict, k: dict) -> dict:
    """Per input-channel block, a work-item loads alpha x (tile_t*m + 2) input pixels and 4*tile_cb*alpha^2
    weight pixels for 16*tile_cb*tile_t*alpha^2 multiply-adds; ``split_k`` work-items share a tile's C4
    blocks."""
    m, a = v["m"], v["alpha"]
    tiles, sk = k["tile_cb"] * k["tile_t"], k.get("split_k", 1)
    items = v["N"] * math.ceil(v["OB"] / k["tile_cb"]) * v["TH"] * math.ceil(v["TW"] / k["tile_t"]) * sk
    wg = k["wg_w"] * k["wg_h"] * sk
    inputs, weights = a * (k["tile_t"] * m + 2), 4 * k["tile_cb"] * a * a
    covered = math.ceil(v["TW"] / k["tile_t"]) * k["tile_t"] * m * v["TH"] * m
    return {"work_per_item": _log2(tiles * m * m), "wg_size": _log2(wg), "items": _log2(items),
            "groups": _log2(items / wg), "bytes_per_mac": 16 * (inputs + weights) / (16 * tiles * a * a),
            "registers": 4 * tiles * a * a + 4 * inputs, "padding_waste": covered / (v["OH"] * v["OW"]),
            "local_input": 0.0, "half": float(k.get("compute", "float32") != "float32"),
            "transform_per_mac": (inputs + tiles * m * m) / (tiles * a * a), "split_k": _log2(sk),
            "steps_per_item": _log2(v["C4"] / sk)}




def lowers(workload_class):
    """``lower`` of one tile size: a conv2d graph node with a 3x3 kernel, stride 1, dilation 1, groups 1 (not
    depthwise); its weights, transformed, become a new param ``<weight>.winograd<m>``."""
    def lower(ctx, node, ins):
        a = node.attrs
        data, w_name = ctx.shape(node.inputs[0]), node.inputs[1]
        w_shape, groups = ctx.shape(w_name), a.get("groups", 1)
        if (not computes(w_shape, a["stride"], a["dilation"], groups) or is_depthwise(data, w_shape, groups)
                or not ctx.is_param(w_name) or any(k in a for k in ("in_scale", "in_view", "in_norm", "in_add",
                                                                    "in_group_norm", "in_layer_norm", "out_norm",
                                                                    "residual_scale"))):
            # a gated input, a slice read in place (passes_attention), a LayerNorm computed on the input or a
            # GroupNorm applied as read or in the epilogue (passes_layer_norm): the direct conv2d only
            return None
        fields, inputs = node_epilogue(ctx, node)
        wl = workload_class(data=data, kernel=w_shape, padding=tuple(a["padding"]), residual="Res" in inputs,
                            pad_mode=a.get("pad_mode", "zeros"), **fields)
        u_name = f"{w_name}.winograd{wl.m}"
        extra = {u_name: transform_weights(ctx.graph.params[w_name], wl.m, np.float32)}
        return wl, {"X": ins[0], "Wt": u_name, **inputs}, extra
    return lower


class WinogradTemplate(Template):
    def storage_tolerance(self, workload) -> float:
        """float32 storage 1e-4; float16 storage 1e-2 for F(2x2), 2e-2 for F(4x4) (which reaches ~7e-3: the
        module docstring lists what each case measured). Half arithmetic: ``Template.tolerance``, over sums of
        C terms (each of the alpha x alpha accumulators sums one product per input channel)."""
        if workload.dtype != "float16":
            return 1e-4
        return 1e-2 if workload.m == 2 else 2e-2


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("kernel", "shape", "O,C,R,S", "weight shape", required=True),
                 WorkloadArg("padding", "ints", "P[,P[,P,P]]", "all, (h,w) or (top,left,bottom,right)",
                             lengths=(1, 2, 4)),
                 *EPILOGUE_ARGS, WorkloadArg("residual", "flag", help="fuse a residual add of a second NCHW4c tensor"),
                 PAD_MODE_ARG)


def _template(workload_class) -> WinogradTemplate:
    return WinogradTemplate(f"winograd{workload_class.m}", workload_class, WinogradConfig, conv2d_winograd,
                            _reference, random_inputs, fallback, space_vars, VARIABLES,
                            space_file="conv2d_winograd", features=features,
                            model_knobs=MODEL_KNOBS, workload_args=WORKLOAD_ARGS, graph_ops=("conv2d",),
                            lower=lowers(workload_class), reduction=lambda wl: wl.data[1])


TEMPLATE2 = _template(Winograd2Workload)
TEMPLATE4 = _template(Winograd4Workload)
