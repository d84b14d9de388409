"""Dense (fully connected): ``Y[n, m] = sum_k X[n, k] * Wt[m, k] (+ bias, activation)``, the classifier of a
model. Inputs and outputs are packed by 4 along their last axis (``row4``: one RGBA pixel holds 4 features);
weights are packed by 4 along the output axis (``4o``: a pixel holds 4 outputs of one input feature, the
outer-product form of conv2d 1x1) or along the reduction axis (``4i``: a pixel holds 4 inputs of one output,
dot products summed across lanes at the end).

At batch 1 a classifier has little parallelism per output, so ``split_k`` work-items of a work-group share
each output's reduction and combine their partial sums through local memory."""
from __future__ import annotations

from contextlib import nullcontext
import math
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.dtype import DType
from tuner.ir.expr import Broadcast, Cast, ExtractLane, Ramp, as_expr, call, min_
from tuner.ir.activations import apply_ir, canonical
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, node_epilogue
from tuner.templates.reduction import (add_shifted, as_float as _as_float, hsum, shifted_moments, start_shifted,
                                       sum_partials)
from tuner.templates.common import (Arithmetic, bias_buffer, bias_length, gpu_fill_target, norm_sums_at,
                                    reference_epilogue, store_pixel, texture_scopes)


@dataclass(frozen=True)
class DenseWorkload:
    """Canonical key: data N,K and weight M,K (ONNX Gemm with transB=1), dtype and epilogue."""
    data: tuple
    weight: tuple
    dtype: str = "float32"
    bias: bool = False
    activation: str = "none"
    plain_output: bool = False  # Y is the model output's row-major (N, M) host buffer, written in place (no
    # relayout kernel after it: ``tuner.plan.io_views``); not in the key: the loop nest is the same
    in_pool: tuple = ()  # (H, W): X is an NCHW4c tensor (N, K, H, W) and each input feature the mean of its H x W
    # map, computed as it is read (a classifier's global average pool: no kernel of its own,
    # ``tuner.plan.input_views``); in the key when set
    in_norm: float = 0.0  # > 0: each row of X layer-normalized over its K features (this epsilon) as it is read -- a
    # classifier head's LayerNorm after its global pool (ConvNeXt, EdgeNeXt, MetaFormer), its affine folded into the
    # weights and bias (``passes_layer_norm.layer_norm_into_convs``). The row's sums of d = x - K0 and d^2 (K0 its
    # first feature) are taken in the reduction loop, the products use d, and the epilogue is
    # ``rstd * (acc - mean(d) * U[m]) + bias``, U the weights' sums over K stored in B after the padded biases
    # (``common.bias_length``); with a bias; in the key when set
    norm_partials: int = 0  # > 0, with in_norm: each row normalized with the GroupNorm(1) statistics of the
    # (N, K, H, W) image whose maps' means its features are -- a GroupNorm(1) before a classifier's global pool
    # (PoolFormer's), which commutes with the pool. The image's mean is the row's (its maps are one size); its
    # variance comes from ``P`` (float32, (N * norm_partials * 2, 4): chunk sums of d = x - K and d^2,
    # ``group_norm``'s ``stats`` or a producer's ``out_stats``), where the shift K cancels; in the key when set
    norm_hw: tuple = ()  # with norm_partials: (H, W) of that image; in the key when set

    def __post_init__(self):
        object.__setattr__(self, "data", tuple(int(x) for x in self.data))
        object.__setattr__(self, "weight", tuple(int(x) for x in self.weight))
        if len(self.data) != 2 or len(self.weight) != 2 or self.data[1] != self.weight[1]:
            raise ValueError(f"dense wants data N,K and weight M,K with the same K; got {list(self.data)} and "
                             f"{list(self.weight)}")
        if min(self.data + self.weight) < 1:
            raise ValueError(f"dense shapes must be positive: {list(self.data)}, {list(self.weight)}")
        object.__setattr__(self, "activation", canonical(self.activation))  # ValueError names the choices
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")
        object.__setattr__(self, "in_pool", tuple(int(v) for v in self.in_pool))
        if self.in_pool and (len(self.in_pool) != 2 or min(self.in_pool) < 1):
            raise ValueError(f"dense in_pool {list(self.in_pool)}: (H, W) of the map each input feature is the mean of")
        object.__setattr__(self, "in_norm", float(self.in_norm))
        if self.in_norm < 0 or (self.in_norm and not self.bias):
            raise ValueError(f"dense in_norm {self.in_norm}: a LayerNorm's epsilon (> 0) over each row's features, "
                             "with a bias (B holds the weights' sums after it)")
        object.__setattr__(self, "norm_hw", tuple(int(v) for v in self.norm_hw))
        if (self.norm_partials or self.norm_hw) and (not self.in_norm or int(self.norm_partials) < 1
                                                     or len(self.norm_hw) != 2 or min(self.norm_hw) < 1
                                                     or (self.in_pool and self.in_pool != self.norm_hw)):
            raise ValueError(f"dense norm_partials {self.norm_partials}, norm_hw {list(self.norm_hw)}: the chunk "
                             "count and (H, W) of the image whose GroupNorm(1) statistics normalize the rows (with "
                             "in_norm; with in_pool its maps)")

    @property
    def x_shape(self) -> tuple:
        """X's shape: (N, K), or (N, K, H, W) whose maps ``in_pool`` averages."""
        return (*self.data, *self.in_pool)

    @property
    def out_shape(self) -> tuple:
        return self.data[0], self.weight[0]

    @property
    def flops(self) -> int:
        return 2 * self.data[0] * self.weight[0] * self.data[1]

    def key(self) -> dict:
        return {"op": "dense", **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()
                                  if k != "plain_output"
                                  and (k not in ("in_pool", "in_norm", "norm_partials", "norm_hw") or v)}}


# in_pool: a dense of at most this many output blocks of 4 has each work-item pool the blocks it reads; a wider one
# (a classifier of many classes) pools its maps into local memory once a work-group by default (``pool_stage``)
POOL_ITEM_BLOCKS = 4


@dataclass(frozen=True)
class DenseConfig:
    """One value per knob of ``search_space/dense.toml``."""
    tile_m: int = 1  # output blocks of 4 per work-item
    tile_n: int = 1  # rows (batch) per work-item
    wg_m: int = 32  # work-group size along output blocks
    split_k: int = 1  # work-items sharing one reduction (partial sums combined in local memory)
    unroll_k: int = 1  # reduction steps unrolled
    vec_load: int = 4  # buffer input loads: float4 per 4 features, or one scalar per feature (4o only)
    weight_pack: str = "4o"  # weights packed by 4 along outputs (4o) or the reduction (4i)
    compute: str = "float32"  # float32; half: half4 loads and products, float32 sums; half_acc: half sums too
    pool_stage: bool = False  # with in_pool: the work-group pools its rows' maps into local memory once, before the
    # reduction loop, and the work-items read the means there -- a classifier of many outputs (ImageNet's 1000),
    # whose work-items would each pool every block they read again
    input_scope: str = "texture"
    weight_scope: str = "texture"
    output_scope: str = "texture"


def _declare(name, shape, dtype, scope, texture_layout, buffer_layout, weight=False):
    if scope == "texture":
        return buffer(name, shape, dtype, "texture:weight" if weight else "texture", texture_layout)
    if scope == "buffer":
        return buffer(name, shape, dtype, "global", buffer_layout)
    raise ValueError(f"scope {scope!r}: texture or buffer")


def dense(wl: DenseWorkload, cfg: DenseConfig):
    (N, K), (M, _) = wl.data, wl.weight
    KB, MB = -(-K // 4), -(-M // 4)
    w_layout = "col4" if cfg.weight_pack == "4o" else "row4"
    X = _declare("X", wl.x_shape, wl.dtype, cfg.input_scope, *(("nchw4c", "nchw4c_buffer") if wl.in_pool
                                                              else ("row4", "row4_buffer")))
    if wl.in_pool and cfg.vec_load != 4:
        raise ValueError("in_pool reads whole pixels of X's maps: vec_load 4")
    if cfg.pool_stage and not wl.in_pool:
        raise ValueError("pool_stage pools X's maps into local memory: it needs in_pool")
    if wl.in_norm and cfg.vec_load != 4:
        raise ValueError("in_norm sums each row's features from whole pixels: vec_load 4")
    Wt = _declare("Wt", wl.weight, wl.dtype, cfg.weight_scope, w_layout, f"{w_layout}_buffer", weight=True)
    Y = buffer("Y", wl.out_shape, wl.dtype, "global") if wl.plain_output else \
        _declare("Y", wl.out_shape, wl.dtype, cfg.output_scope, "row4", "row4_buffer")
    B = bias_buffer(bias_length(wl, M), wl.dtype, cfg.weight_scope) if wl.bias else None
    P = buffer("P", (N * wl.norm_partials * 2, 4), "float32", "global") if wl.norm_partials else None
    params = [p for p in (X, Wt, B, Y, P) if p is not None]

    t_m, t_n, sk, uk = cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.unroll_k
    n_mt, n_nt = -(-MB // t_m), -(-N // t_n)
    steps = -(-KB // sk)  # reduction steps of one work-item
    ragged = steps * sk != KB or steps % uk != 0
    tiles = [(t, y) for t in range(t_m) for y in range(t_n)]
    arith = Arithmetic(cfg.compute, wl.dtype)
    b = Builder()
    with b.loop("gn", n_nt, "group.1") as gn, b.loop("tk", sk, "local.1") as tk, \
            b.loop("gm", -(-n_mt // cfg.wg_m), "group.0") as gm, b.loop("tm", cfg.wg_m, "local.0") as tm:
        mt, n0 = gm * cfg.wg_m + tm, gn * t_n
        lanes_acc = 4 if cfg.weight_pack == "4i" else 1  # 4i: one float4 of products per output
        acc = arith.accumulators(b, len(tiles) * lanes_acc)
        pooled = b.allocate("pooled", (t_n,), "float32x4", "private") if wl.in_pool and not cfg.pool_stage else None
        st = b.allocate("st", (3 * t_n,), "float32", "private") if wl.in_norm else None
        means = stage_pools(b, X, wl, cfg, n0, tk * cfg.wg_m + tm if sk > 1 else tm) if cfg.pool_stage else None

        def row_block(y, n, kb):
            """Row ``n``'s features 4kb..4kb+3: X's pixel, or with ``in_pool`` the mean of X's maps there (with
            ``pool_stage`` from the work-group's local means)."""
            if means is not None:
                return means[y * KB + kb]
            if pooled is None:
                return X[n, Ramp(kb * 4, as_expr(1), 4)]
            H, W = wl.in_pool
            b.store(pooled, y, 0.0)
            with b.loop(f"ph{y}", H, "serial") as h, b.loop(f"pw{y}", W, "serial") as w:
                b.store(pooled, y, pooled[y] + X[n, Ramp(kb * 4, as_expr(1), 4), h, w])
            return pooled[y] * (1.0 / (H * W))
        if st is not None:  # in_norm: each row's shift K0 (its first feature), then its sums of d and d^2
            for y in range(t_n):
                start_shifted(b, st, 3 * y, b.let(f"k0_{y}", row_block(y, min_(n0 + y, N - 1), as_expr(0))))
        with b.loop("jo", -(-steps // uk)) as jo, b.loop("ji", uk, "unrolled") as ji:
            kb = (jo * uk + ji) * sk + tk  # interleaved: neighbouring work-items read neighbouring blocks
            with b.if_(kb < KB) if ragged else nullcontext():
                rows = {y: min_(n0 + y, N - 1) for y in range(t_n)}
                vector_x = cfg.vec_load == 4 or cfg.input_scope == "texture" or cfg.weight_pack == "4i"
                xv = {y: b.let(f"x{y}", arith.load(row_block(y, rows[y], kb))) for y in range(t_n)} \
                    if vector_x else {}
                if st is not None:  # d = x - K0: into the row's sums (its squares unless the image's statistics
                    # give the variance: norm_partials) and the products
                    for y in range(t_n):
                        d = b.let(f"d{y}", _as_float(xv[y]) - Broadcast(st[3 * y], 4))
                        add_shifted(b, st, 3 * y, d, kb, KB, K, squares=P is None)
                        xv[y] = d if d.dtype == xv[y].dtype else b.let(f"dc{y}", Cast(xv[y].dtype, d))
                if cfg.weight_pack == "4o":
                    for ki in range(4):
                        k = kb * 4 + ki
                        # lanes past K exist only in the last block; the 4o weights do not pad K
                        with b.if_(kb < KB - 1) if ki >= K % 4 > 0 else nullcontext():
                            xs = {y: ExtractLane(xv[y], ki) if vector_x else b.let(f"x{y}_{ki}", arith.load(X[rows[y], k]))
                                  for y in range(t_n)}
                            for t in range(t_m):
                                mb = min_(mt * t_m + t, MB - 1)
                                w = b.let(f"w{t}_{ki}", arith.load(Wt[Ramp(mb * 4, as_expr(1), 4), k]))
                                for i, (tt, y) in enumerate(tiles):
                                    if tt == t:
                                        b.store(acc, i, arith.mac(acc[i], xs[y] * w))
                else:
                    for t in range(t_m):
                        for mi in range(4):
                            m = min_((mt * t_m + t) * 4 + mi, M - 1)  # rows past M are padding lanes
                            w = b.let(f"w{t}_{mi}", arith.load(Wt[m, Ramp(kb * 4, as_expr(1), 4)]))
                            for i, (tt, y) in enumerate(tiles):
                                if tt == t:
                                    j = i * 4 + mi
                                    b.store(acc, j, arith.mac(acc[j], xv[y] * w))
        total = (lambda i: Cast(DType("float32", 4), acc[i])) if arith.acc != "float32x4" else (lambda i: acc[i])
        if cfg.weight_pack == "4i":  # lane sums: one float4 of 4 outputs per tile entry
            sums = [call("make_vector", [_hsum(total(i * 4 + mi)) for mi in range(4)], "float32x4")
                    for i in range(len(tiles))]
        else:
            sums = [total(i) for i in range(len(tiles))]
        if sk > 1:
            part = b.allocate("part", (sk * cfg.wg_m * len(tiles),), "float32x4", "local")
            for i, v in enumerate(sums):
                b.store(part, (tk * cfg.wg_m + tm) * len(tiles) + i, v)
            if st is not None:  # each work-item's sums of its rows' blocks
                pst = b.allocate("pst", (sk * cfg.wg_m * 2 * t_n,), "float32", "local")
                for j in range(2 * t_n):
                    b.store(pst, (tk * cfg.wg_m + tm) * 2 * t_n + j, st[3 * (j // 2) + 1 + j % 2])
            b.barrier()
        with b.if_(tk < 1) if sk > 1 else nullcontext():  # one work-item per output stores it
            norm = {}
            for y in range(t_n if st is not None else 0):  # each row's (mean of d, rstd)
                s1, s2 = st[3 * y + 1], st[3 * y + 2]
                for j in range(1, sk):
                    s1 = s1 + pst[(j * cfg.wg_m + tm) * 2 * t_n + 2 * y]
                    s2 = s2 + pst[(j * cfg.wg_m + tm) * 2 * t_n + 2 * y + 1]
                if P is None:
                    norm[y] = shifted_moments(b, s1, s2, K, wl.in_norm, (f"nm{y}", f"nr{y}"))
                    continue
                # norm_partials: the row's mean of d is its image's mean less K0 (the maps are one size); the
                # image's variance comes from its chunk partials, whose own shift cancels in it
                parts = sum_partials(b, P, min_(n0 + y, N - 1), wl.norm_partials, f"pt{y}", f"pacc{y}")
                _, rstd = shifted_moments(b, hsum(parts[0]), hsum(parts[1]), K * wl.norm_hw[0] * wl.norm_hw[1],
                                          wl.in_norm, (f"im{y}", f"nr{y}"))
                norm[y] = b.let(f"nm{y}", s1 * (1.0 / K)), rstd
            for i, (t, y) in enumerate(tiles):
                v = sums[i]
                if sk > 1:
                    v = part[tm * len(tiles) + i]
                    for j in range(1, sk):
                        v = v + part[(j * cfg.wg_m + tm) * len(tiles) + i]
                mb, n = mt * t_m + t, n0 + y
                with b.if_((mb < MB) & (n < N)):
                    lanes = Ramp(mb * 4, as_expr(1), 4)
                    if norm:  # rstd * (acc - mean * U), U after the padded biases
                        mean, rstd = norm[y]
                        u = B[Ramp(mb * 4 + norm_sums_at(wl, MB * 4), as_expr(1), 4)]
                        v = (v - Broadcast(mean, 4) * u) * Broadcast(rstd, 4)
                    if B is not None:
                        v = v + B[lanes]
                    store_pixel(b, Y, n, mb, None, None, apply_ir(wl.activation, v), f"pv{i}")
    return b.kernel("dense", params)


def stage_pools(b: Builder, X, wl: DenseWorkload, cfg: DenseConfig, n0, i):
    """``pool_stage``: the means of the work-group's ``tile_n`` rows' maps (rows from ``n0``, clamped to N), every
    block of 4 features, in a local array (row-major: y * KB + kb), the ``wg_m x split_k`` work-items (flat id
    ``i``) taking every L-th entry and the H x W pixels of its maps; then the barrier."""
    (N, K), (H, W) = wl.data, wl.in_pool
    KB, L, entries = -(-K // 4), cfg.wg_m * cfg.split_k, cfg.tile_n * -(-K // 4)
    means = b.allocate("means", (entries,), "float32x4", "local")
    rounds = -(-entries // L)
    with b.loop("pr", rounds, "serial") if rounds > 1 else nullcontext(as_expr(0)) as r:
        j = b.let("pj", r * L + i if rounds > 1 else i)
        with b.if_(j < entries) if rounds * L != entries else nullcontext():
            y, kb = (b.let("py", j // KB), b.let("pkb", j % KB)) if cfg.tile_n > 1 else (as_expr(0), j)
            n = min_(n0 + y, N - 1) if cfg.tile_n > 1 or N > 1 else n0
            acc = b.allocate("pacc", (1,), "float32x4", "private")
            b.store(acc, 0, 0.0)
            with b.loop("sph", H, "serial") as h, b.loop("spw", W, "serial") as w:
                b.store(acc, 0, acc[0] + X[n, Ramp(kb * 4, as_expr(1), 4), h, w])
            b.store(means, j, acc[0] * (1.0 / (H * W)))
    b.barrier()
    return means


def _hsum(v):
    return ExtractLane(v, 0) + ExtractLane(v, 1) + ExtractLane(v, 2) + ExtractLane(v, 3)


def reference(wl: DenseWorkload, x, w, bias=None, partials=None) -> np.ndarray:
    x = x.astype(np.float64)
    if wl.in_pool:  # each feature the mean of its map
        x = x.mean(axis=(2, 3))
    if wl.in_norm:  # each row normalized over its features, or with its image's statistics (norm_partials: the
        # image's mean the row's, its variance from the chunk partials); B's weight sums are the kernel's
        var = x.var(axis=1, keepdims=True) if partials is None else image_variance(partials, x.shape, wl.norm_hw)
        x = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(var + wl.in_norm)
        bias = None if bias is None else bias[:norm_sums_at(wl, wl.weight[0])]
    return reference_epilogue(wl, x @ w.astype(np.float64).T, bias)


def image_variance(partials, rows: tuple, hw: tuple) -> np.ndarray:
    """(N, 1) variances of the images whose chunk partials ``partials`` holds (``reduction.chunk_statistics``:
    per image, per chunk, the float4 sums of d = x - K and d^2), each of ``rows[1]`` maps of ``hw``."""
    p = np.asarray(partials, np.float64).reshape(rows[0], -1, 2, 4).sum(axis=(1, 3))
    count = rows[1] * hw[0] * hw[1]
    return (p[:, 1] / count - (p[:, 0] / count) ** 2).reshape(-1, 1)


def random_inputs(wl: DenseWorkload, rng) -> dict:
    draw = lambda shape: rng.standard_normal(shape).astype(wl.dtype)  # noqa: E731
    inputs = {"X": draw(wl.x_shape), "Wt": draw(wl.weight)}
    if wl.bias:
        inputs["B"] = draw((bias_length(wl, wl.weight[0]),))
    if wl.in_norm:  # the weights' sums over the features, as the lowering packs them
        at = norm_sums_at(wl, wl.weight[0])
        inputs["B"][at:at + wl.weight[0]] = inputs["Wt"].astype(np.float64).sum(axis=1)
    if wl.norm_partials:  # an image, its maps' means the rows (as a pool writes them), its statistics as a
        # statistics kernel writes them
        from tuner.templates.reduction import chunk_statistics
        img = (rng.standard_normal((wl.data[0], wl.data[1], *wl.norm_hw)) * 2.0 + 3.0).astype(wl.dtype)
        inputs["X"] = img if wl.in_pool else img.astype(np.float64).mean(axis=(2, 3)).astype(wl.dtype)
        inputs["P"] = chunk_statistics(img, wl.norm_partials).astype(np.float32)
    return inputs


def space_vars(wl: DenseWorkload) -> dict:
    (N, K), (M, _) = wl.data, wl.weight
    return dict(N=N, K=K, M=M, KB=-(-K // 4), MB=-(-M // 4), data=wl.data, weight=wl.weight,
                out=wl.out_shape, bias=wl.bias, plain_output=wl.plain_output, in_pool=wl.in_pool, in_norm=wl.in_norm,
                norm_partials=wl.norm_partials,
                x_shape=wl.x_shape, x_layout="nchw4c" if wl.in_pool else "row4")


VARIABLES = dict(N="rows (batch)", K="input features (reduction)", M="output features",
                 KB="input-feature blocks of 4", MB="output-feature blocks of 4", data="data shape N,K",
                 weight="weight shape M,K", out="output shape N,M", bias="fused bias",
                 plain_output="Y is the model output's row-major N,M buffer (written in place, no relayout)",
                 in_pool="(H, W) of X's maps each feature is the mean of (a global pool read in place), or ()",
                 in_norm="the LayerNorm epsilon of each row of X over its features (normalized as read), 0 when none",
                 norm_partials="with in_norm: the chunk partials of the image statistics the rows are normalized with "
                 "(a GroupNorm(1) before the pool), 0 for a LayerNorm of the rows",
                 x_shape="X's shape: data, or N,K,H,W with in_pool", x_layout="X's texture layout")


def fallback(wl: DenseWorkload, info) -> DenseConfig:
    """4o weights, one output block per work-item; at batch 1 the reduction is split over up to 8 work-items
    (16 on a GPU the 8 would not fill, ``gpu_fill_target``) so that a classifier fills the device, and the
    work-group along the outputs is as wide as 64 while a GPU still gets a work-group per compute unit --
    every best dense config in the H100's and H200's logs splits 16 ways in work-groups of one output block;
    textures on GPUs that can hold the tensors."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c" if wl.in_pool else "row4", wl.x_shape), ("row4", wl.out_shape),
                                      ("col4", wl.weight)])
    target = gpu_fill_target(info)
    split_k = 1
    while v["N"] == 1 and split_k * 2 <= v["KB"] // 8 and split_k * 2 <= info.max_work_item_sizes[1] and \
            (split_k < 8 or (split_k < 16 and v["MB"] * split_k < target)):
        split_k *= 2
    partials = 16 + (8 if wl.in_norm else 0)  # local bytes a work-item's partial sums take with a split

    def widest(stage: bool) -> int:
        """The work-group along the outputs: as wide as 64 while a GPU still gets a work-group per compute unit,
        or with ``stage`` (each work-group pools the maps) as wide as fits beside the means."""
        means, wg_m = (v["KB"] * 16 if stage else 0), 1
        while wg_m < 64 and wg_m < v["MB"] and wg_m * 2 * split_k <= info.max_work_group_size \
                and means + wg_m * 2 * split_k * partials <= info.local_mem_bytes \
                and (stage or not target or -(-v["MB"] // (wg_m * 2)) >= info.compute_units):
            wg_m *= 2
        return wg_m

    stage = bool(wl.in_pool) and v["MB"] > POOL_ITEM_BLOCKS  # each work-group pools the maps: few, wide groups
    wg_m = widest(stage)
    if stage and (v["KB"] * 16 + (wg_m * split_k * partials if split_k > 1 else 0) > info.local_mem_bytes
                  or -(-v["KB"] // (wg_m * split_k)) * wl.in_pool[0] * wl.in_pool[1] > 1280):
        stage, wg_m = False, widest(False)
    return DenseConfig(tile_m=1, tile_n=1, wg_m=wg_m, split_k=split_k, unroll_k=1, vec_load=4, weight_pack="4o",
                       pool_stage=stage, input_scope=scope, weight_scope=scope, output_scope=scope)


def _reference(wl, inputs):
    return reference(wl, inputs["X"], inputs["Wt"], inputs.get("B"), inputs.get("P"))


def features(v: dict, k: dict) -> dict:
    """What a config implies for the cost model (see ``conv2d_nchw4c.window_features``)."""
    log2 = lambda x: math.log2(max(float(x), 1.0))  # noqa: E731
    tile = k["tile_m"] * k["tile_n"]
    items = math.ceil(v["MB"] / k["tile_m"]) * math.ceil(v["N"] / k["tile_n"]) * k["split_k"]
    wg = k["wg_m"] * k["split_k"]
    reads = k["tile_n"] + k["tile_m"] * 4
    return {"work_per_item": log2(tile), "wg_size": log2(wg), "items": log2(items), "groups": log2(items / wg),
            "bytes_per_mac": 16 * reads / (16 * tile),
            "registers": 4 * tile * (4 if k["weight_pack"] == "4i" else 1) + 4 * reads,
            "half": float(k.get("compute", "float32") != "float32"),
            "pool_stage": float(bool(k.get("pool_stage")))}




def lower(ctx, node, ins):
    """A dense graph node: data N,K by weights M,K."""
    normed = bool(node.attrs.get("in_norm"))  # passes_layer_norm: B holds the weights' sums too (bias_length)
    sums = np.asarray(ctx.graph.params[node.inputs[1]], np.float64).sum(axis=1) if normed else None
    fields, inputs = node_epilogue(ctx, node, sums)
    if normed:
        fields["in_norm"] = float(node.attrs["in_norm"])
    if normed and node.attrs.get("norm_stats") is not None:  # passes_layer_norm.group_norm_past_pooled_dense: the
        # image's GroupNorm(1) statistics (N, 8 * chunks)
        fields["norm_partials"] = ctx.shape(node.attrs["norm_stats"])[1] // 8
        fields["norm_hw"] = tuple(node.attrs["norm_hw"])
        inputs["P"] = ctx.packed(node.attrs["norm_stats"])
    wl = DenseWorkload(data=ctx.shape(node.inputs[0]), weight=ctx.shape(node.inputs[1]), **fields)
    return wl, {"X": ins[0], "Wt": node.inputs[1], **inputs}, {}


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,K", "input shape", required=True),
                 WorkloadArg("weight", "shape", "M,K", "weight shape", required=True), *EPILOGUE_ARGS,
                 WorkloadArg("plain_output", "flag", help="write Y as a row-major N,M buffer (a model output, in "
                             "place)"))
TEMPLATE = Template("dense", DenseWorkload, DenseConfig, dense, _reference, random_inputs, fallback, space_vars,
                    VARIABLES, features=features, workload_args=WORKLOAD_ARGS,
                    graph_ops=("dense",), lower=lower, reduction=lambda wl: wl.data[1])
