"""The parallel schedule the reduction templates share (``spatial_reduce``: global pools and ReduceMean / Max /
Sum / L2 over H, W; ``group_norm``: GroupNorm and InstanceNorm; ``channel_reduce``: layer_norm and softmax over
the channels), and the helpers they all use: packed operands, index unravelling, lane sums, and the one
work-item per index launch of their combining kernels.

A reduction template has ``U`` independent *units* (an output pixel of a pool: 4 channels of one image; a
group of a norm), each over ``E`` texels (RGBA pixels, 4 lanes) of its input. The schedule has three knobs,
the template space of ``search_space/spatial_reduce.toml``, ``group_norm.toml`` and ``channel_reduce.toml``:

- ``wg_reduce`` (L): work-items of a work-group that share one unit. Each reads every L-th texel of the unit's
  chunk (neighbouring work-items read neighbouring texels, W fastest); their partial results meet in a binary
  tree in local memory (a barrier per level). L = 1 is the serial loop of one work-item per unit.
- ``units_per_wg`` (P): units side by side in a work-group (local axis 1), so that short reductions (a 7x7
  squeeze-excite pool) still fill a work-group.
- ``split`` (T): work-groups sharing one unit, each over a chunk of ceil(E / T) texels, for units too few to
  fill the device (GroupNorm(1) of one image is one unit). Their partial results go to a workspace buffer and
  a second kernel combines them.

No work-item reads more than ``MAX_TEXELS_PER_ITEM`` texels of the unit: the spaces hold that as a constraint,
so neither a fallback nor a tuned config loops over a whole image in one work-item (the peers' schedules:
shared/notes/glue.md (a)). Accumulation is float32, as everywhere.
"""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.activations import apply_ir
from tuner.ir.expr import (Broadcast, Cast, ExtractLane, Ramp, Var, as_expr, binary, call, const, max_, min_,
                           select)
from tuner.ir.dtype import DType

MAX_TEXELS_PER_ITEM = 1024  # 4096 elements: no work-item of a reduction reads more of one unit
GPU_ITEMS_PER_TEXELS = 16  # a GPU fallback gives each work-item about this many texels before it splits
LOWEST = -3.4028234663852886e38  # -FLT_MAX: the max identity


@dataclass(frozen=True)
class ReduceConfig:
    """One value per knob of ``search_space/spatial_reduce.toml`` and ``group_norm.toml``."""
    wg_reduce: int = 64  # L: work-items sharing one unit (local-memory tree)
    units_per_wg: int = 1  # P: units side by side in a work-group
    split: int = 1  # T: work-groups sharing one unit (a second kernel combines their partials)
    input_scope: str = "texture"
    weight_scope: str = "texture"
    output_scope: str = "texture"


class SameShapeWorkload:
    """What a normalization's workload (a frozen dataclass whose output has its input's shape, ``data``) shares:
    ``out_shape``, ``flops`` (``FLOPS`` per element) and the log key (``OP``)."""
    OP = ""
    FLOPS = 1

    @property
    def out_shape(self) -> tuple:
        return self.data

    @property
    def flops(self) -> int:
        return self.FLOPS * int(np.prod(self.data))

    def key(self) -> dict:
        return {"op": self.OP, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def pow2_ceil(n: int) -> int:
    return 1 << (max(1, int(n)) - 1).bit_length()


def packed(name: str, shape: tuple, dtype: str, scope: str):
    """An activation operand packed by 4 along axis 1: an ``nchw4c`` / ``row4`` texture or its packed buffer."""
    layouts = {4: ("nchw4c", "nchw4c_buffer"), 2: ("row4", "row4_buffer")}[len(shape)]
    if scope not in ("texture", "buffer"):
        raise ValueError(f"{name} scope {scope!r}: texture or buffer")
    return buffer(name, shape, dtype, *(("texture", layouts[0]) if scope == "texture" else ("global", layouts[1])))


def unravel(b: Builder, i, shape: tuple, prefix: str) -> list:
    """Row-major indices of ``i`` over ``shape`` (lets named ``prefix<k>``; extent-1 axes are 0)."""
    out, stride = [], int(np.prod(shape))
    for k, extent in enumerate(shape):
        stride //= extent
        if extent == 1:
            out.append(as_expr(0))
            continue
        v = i // stride if stride > 1 else i
        out.append(b.let(f"{prefix}{k}", v % extent if stride * extent < np.prod(shape) else v))
    return out


def hsum(v):
    """The 4 lanes of ``v`` summed pairwise."""
    return (ExtractLane(v, 0) + ExtractLane(v, 1)) + (ExtractLane(v, 2) + ExtractLane(v, 3))


def start_shifted(b, st, at: int, first) -> None:
    """Private shifted sums at ``st[at:at + 3]``: the shift K (lane 0 of pixel ``first``, in float32), then the
    sums of d = x - K and of d^2, zero (``add_shifted``, ``shifted_moments``)."""
    b.store(st, at, as_float(ExtractLane(first, 0)))
    b.store(st, at + 1, const(0.0, "float32"))
    b.store(st, at + 2, const(0.0, "float32"))


def add_shifted(b, st, at: int, d, block, blocks: int, channels: int, squares: bool = True) -> None:
    """The lanes of float4 ``d`` (x - K over channel block ``block`` of ``blocks``) into the shifted sums at
    ``st[at + 1]`` and (``squares``) ``st[at + 2]``; lanes past ``channels`` skipped in the last block."""
    for ci in range(4):
        with b.if_(block < blocks - 1) if ci >= channels % 4 > 0 else nullcontext():
            lane = ExtractLane(d, ci)
            b.store(st, at + 1, st[at + 1] + lane)
            if squares:
                b.store(st, at + 2, st[at + 2] + lane * lane)


def shifted_moments(b, s1, s2, count: int, epsilon: float, names=("m", "rstd")) -> tuple:
    """``(mean of d, rstd)`` lets (named ``names``) from the sums of d = x - K and of d^2 over ``count`` values: the
    shifted form every norm here sums (no cancellation of raw sums where the mean is large against the spread); x's
    mean is K plus the first, the variance is floored at zero."""
    m = b.let(names[0], s1 * (1.0 / count))
    return m, b.let(names[1], call("rsqrt", [max_(s2 * (1.0 / count) - m * m, 0.0) + epsilon], "float32"))


def sum_partials(b, part, u, T: int, name: str = "t", acc: str = "acc"):
    """A private (sum d, sum d^2) pair of float4s: unit ``u``'s T chunk partials in ``part`` (a split's first
    kernel's workspace, or GroupNorm(1)'s statistics read by a convolution: ``Conv2dWorkload.norm_partials``)."""
    vec = Ramp(as_expr(0), as_expr(1), 4)
    acc = b.allocate(acc, (2,), "float32x4", "private")
    b.store(acc, 0, 0.0)
    b.store(acc, 1, 0.0)
    with b.loop(name, T, "serial") as t:
        b.store(acc, 0, acc[0] + part[(u * T + t) * 2, vec])
        b.store(acc, 1, acc[1] + part[(u * T + t) * 2 + 1, vec])
    return acc


def norm_units(C: int, groups: int) -> int:
    """A GroupNorm's or InstanceNorm's statistics units an image of C channels, as ``group_norm``'s ``stats`` writes
    them: its blocks of 4 channels for an InstanceNorm (a lane each channel), else its groups."""
    return -(-C // 4) if groups == C else groups


def unit_blocks(C: int, groups: int) -> int:
    """The blocks of 4 channels of a GroupNorm's or InstanceNorm's statistics unit (``norm_units``): one for an
    InstanceNorm (a lane a channel), else a group's."""
    return 1 if groups == C else -(-C // 4) // groups


def channel_blocks(values, channels: int) -> np.ndarray:
    """Per-channel vectors (rows of ``channels`` values: a norm's gamma then beta, or one scale) as a kernel's
    float32 (rows * C4, 4) operand: each row padded with zeros to whole blocks of 4, the rows one after another."""
    rows = np.asarray(values, np.float32).reshape(-1, channels)
    out = np.zeros((rows.shape[0], -(-channels // 4) * 4), np.float32)
    out[:, :channels] = rows
    return out.reshape(-1, 4)


def read_norm_operands(ctx, node, channels: int) -> tuple:
    """A node that normalizes its input as it reads it (``in_group_norm``, ``passes_layer_norm``), lowered:
    ``((groups, chunks, epsilon, activation), Q, A)`` -- the kernel's field, the statistics' plan tensor and the
    affine's (2 * C4, 4) array (``channel_blocks``); the chunk count from the statistics' shape."""
    groups, epsilon, act = node.attrs["in_group_norm"]
    stats = node.attrs["norm_stats"]
    chunks = ctx.shape(stats)[1] // (8 * norm_units(channels, groups))
    return ((int(groups), chunks, float(epsilon), act), ctx.packed(stats),
            channel_blocks(ctx.graph.params[node.attrs["norm_affine"]], channels))


def unit_first_block(C: int, groups: int, cb):
    """The channel block whose pixel (0, 0) is the shift K of block ``cb``'s unit's partials (``unit_factors``)."""
    return cb if groups == C else (cb // unit_blocks(C, groups)) * unit_blocks(C, groups)


def unit_factors(b, Q, A, first, n, cb, shape, groups: int, chunks: int, epsilon: float, tag: str = "") -> tuple:
    """A GroupNorm's or InstanceNorm's (mean, rstd * gamma, beta) of channel block ``cb`` of image ``n`` of an NCHW
    ``shape``, float4s, for a kernel that normalizes what it reads: its unit's ``chunks`` chunk partials in ``Q``
    (``group_norm``'s ``stats``) added up (``sum_partials``), ``first`` the pixel at (0, 0) of ``unit_first_block``
    (the partials' shift K) -- per lane for an InstanceNorm; else the group's lanes and blocks added up, K its first
    element. ``A``: (2 * C4, 4) float32, gamma's blocks then beta's. ``tag`` ends its names (several in a scope)."""
    _, C, H, W = shape
    C4, vec = -(-C // 4), Ramp(as_expr(0), as_expr(1), 4)
    per_lane, blocks = groups == C, C4 // groups  # blocks of a group (whole blocks, or one group of them all)
    unit = n * C4 + cb if per_lane else n * groups + cb // blocks
    acc = sum_partials(b, Q, unit, chunks, f"gt{tag}", f"gacc{tag}")
    s, q = acc[0], acc[1]
    count = H * W if per_lane else (C // groups) * H * W
    first = as_float(first)
    if not per_lane:  # the group's sums over its lanes, its shift the first lane's
        s, q, first = Broadcast(hsum(s), 4), Broadcast(hsum(q), 4), Broadcast(ExtractLane(first, 0), 4)
    m = b.let(f"gm{tag}", s * (1.0 / count))
    mean = b.let(f"gmean{tag}", first + m)
    rstd = call("rsqrt", [max_(q * (1.0 / count) - m * m, 0.0) + epsilon], "float32x4")
    return mean, b.let(f"gscale{tag}", rstd * A[cb, vec]), b.let(f"gshift{tag}", A[C4 + cb, vec])


def unit_normed(v, factors, activation: str, lane=None):
    """A value read (a pixel, or lane ``lane`` of one) normalized by ``unit_factors``, in float32:
    act((v - mean) * rstd * gamma + beta)."""
    mean, scale, shift = factors if lane is None else (ExtractLane(f, lane) for f in factors)
    return apply_ir(activation, (as_float(v) - mean) * scale + shift)


def as_float(v):
    """``v`` in float32 (a half value widened; lanes kept)."""
    return Cast(DType("float32", v.dtype.lanes), v) if v.dtype.base == "float16" else v


def chunk_statistics(x: np.ndarray, chunks: int, groups: int = 1) -> np.ndarray:
    """A norm's chunk partials as ``group_norm``'s ``stats`` writes them: per unit, per chunk of its texels in order
    (``ceil(texels / chunks)`` a chunk), the float4 sums of d = x - K and of d^2, padding lanes 0. GroupNorm(1): a
    unit is an image, its texels the packed (C/4, H, W) pixels, K its first element; groups of a multiple of 4
    channels: a unit is (image, group), its blocks' pixels, K the group's first element; groups = C (an
    InstanceNorm): a unit is (image, block of 4 channels), its H x W pixels, K the block's pixel (0, 0), each lane
    its own channel. An (N * units * chunks * 2, 4) array, units an image's."""
    x = np.asarray(x, np.float64)
    N, C, H, W = x.shape
    C4 = -(-C // 4)
    d = np.zeros((N, C4 * 4, H, W))
    if groups == C:
        d[:, :C] = x - x[:, :, :1, :1]
        tex = d.reshape(N * C4, 4, H * W).transpose(0, 2, 1)  # (units, pixels, 4)
    else:
        cg = C // groups
        d[:, :C] = x - np.repeat(x[:, ::cg, :1, :1], cg, axis=1)
        tex = d.reshape(N, C4, 4, H, W).transpose(0, 1, 3, 4, 2).reshape(N * groups, -1, 4)
    size = ceil_div(tex.shape[1], chunks)
    out = np.zeros((tex.shape[0], chunks, 2, 4))
    for t in range(chunks):
        part = tex[:, t * size:(t + 1) * size]
        out[:, t, 0], out[:, t, 1] = part.sum(axis=1), (part * part).sum(axis=1)
    return out.reshape(-1, 4)


@contextmanager
def each_index(b: Builder, n: int, name: str):
    """One work-item per index of [0, n) on a 1-D range in work-groups of up to 64 (a combining or applying
    kernel beside a schedule's): yields the index (a let named ``name``), guarded where the last group is partial."""
    local = min(64, 1 << max(0, (n - 1).bit_length()))
    with b.loop("gr", ceil_div(n, local), "group.0") as gr, b.loop("l", local, "local.0") as lid:
        i = b.let(name, gr * local + lid)
        with b.if_(i < n) if ceil_div(n, local) * local != n else nullcontext():
            yield i


def local_tree(b: Builder, values: list, combine, lid, size: int, groups: int = 1, p=None,
               name: str = "red") -> list:
    """Each value (a float4 per work-item) combined over ``size`` work-items (a power of two; ``lid``: this one's
    index among them) in a binary tree in local memory, one buffer a value, ``groups`` such sets side by side
    (``p``: this one's set); every work-item reaches each barrier and can read the results."""
    slot = p * size + lid if groups > 1 else lid
    base = p * size if groups > 1 else as_expr(0)
    bufs = [b.allocate(f"{name}{i}", (size * groups,), "float32x4", "local") for i in range(len(values))]
    for buf, v in zip(bufs, values):
        b.store(buf, slot, v)
    s = size // 2
    while s >= 1:
        b.barrier()
        with b.if_(lid < s):
            for buf in bufs:
                b.store(buf, slot, combine(buf[slot], buf[slot + s]))
        s //= 2
    b.barrier()
    return [buf[base] for buf in bufs]


class Schedule:
    """The launch of one reduction kernel: ``ceil(U / P) * T`` work-groups of ``L x P`` work-items."""

    def __init__(self, units: int, elements: int, cfg):
        self.U, self.E = int(units), int(elements)
        self.L, self.P, self.T = cfg.wg_reduce, cfg.units_per_wg, cfg.split
        self.chunk = ceil_div(self.E, self.T)  # texels of one work-group's chunk
        self.steps = ceil_div(self.chunk, self.L)  # texels one work-item reads

    @contextmanager
    def items(self, b: Builder):
        """The work-items: yields ``(u, c, lid, p)``: the unit (clamped to the last one, so that every work-item
        reaches every barrier; ``valid`` says whether it is a real one), the chunk, the index among the L
        sharing the unit, the unit's slot in the work-group."""
        groups = ceil_div(self.U, self.P) * self.T
        with b.loop("g", groups, "group.0") as g, b.loop("p", self.P, "local.1") as p, \
                b.loop("lid", self.L, "local.0") as lid:
            ug = g // self.T if self.T > 1 else g
            self.group = ug  # the work-group's first unit over P
            self.c = g % self.T if self.T > 1 else as_expr(0)
            raw = ug * self.P + p if self.P > 1 else ug
            self.valid = raw < self.U if ceil_div(self.U, self.P) * self.P != self.U else None
            u = b.let("u", min_(raw, self.U - 1) if self.valid is not None else raw)
            yield u, self.c, lid, p

    @contextmanager
    def elements(self, b: Builder, c, lid):
        """This work-item's texels of chunk ``c``: yields ``e`` in [0, E) (guarded where the chunk or the last
        step is ragged). ``pass_no`` counts the passes of a kernel: with one texel a work-item there is neither
        loop nor guard, so two passes' lets share a C scope and must take names of their own (``tag``)."""
        self.pass_no = getattr(self, "pass_no", 0) + 1
        with b.loop("k", self.steps, "serial") if self.steps > 1 else nullcontext(as_expr(0)) as k:
            j = k * self.L + lid if self.L > 1 else k
            e = b.let("e", c * self.chunk + j if self.T > 1 else j)
            ragged = self.steps * self.L != self.chunk
            conds = [j < self.chunk] if ragged and self.T > 1 else []
            if ragged or self.chunk * self.T != self.E:
                # on the let itself (with T = 1 the same test as j < chunk): the texel's indices derive from it,
                # so an analysis of the source (the artifact's check 11) bounds them by the guard
                conds.append(e < self.E)
            cond = conds[0] if len(conds) == 1 else (conds[0] & conds[1]) if conds else None
            with b.if_(cond) if cond is not None else nullcontext():
                yield e

    def tag(self, prefix: str) -> str:
        """A let-name prefix of this pass over the texels."""
        return f"{prefix}{getattr(self, 'pass_no', 0)}_"

    def tree(self, b: Builder, values: list, combine, lid, p, name: str = "red") -> list:
        """Each value (a float4 per work-item) combined over the L work-items of its unit (``local_tree``); the
        result is readable by all of them. With L = 1 the values themselves."""
        if self.L == 1:
            return list(values)
        return local_tree(b, values, combine, lid, self.L, self.P, p, name)

    def is_writer(self, lid):
        """The condition under which a work-item writes its unit's result: the first of the L, of a real unit."""
        cond = lid < 1 if self.L > 1 else None
        if self.valid is not None:
            cond = self.valid if cond is None else cond & self.valid
        return cond


def fallback_schedule(units: int, elements: int, info, max_split: int = 64, norm: bool = False) -> dict:
    """``wg_reduce``, ``units_per_wg`` and ``split`` that are good without tuning, from the device's
    capabilities: on a GPU, about ``GPU_ITEMS_PER_TEXELS`` texels per work-item in work-groups of up to 256
    (TFLite's Adreno size; the TVM Adreno rule gives 25-49 elements a thread), split while the units fill fewer
    than two work-groups per compute unit and a work-item keeps a quarter of that -- only units too long for one
    work-group of the largest size (a squeeze-excite pool of 7x7 to 56x56 is one launch, not two); on a CPU
    (whose compilers vectorize across work-items and pay for barriers) fewer, longer work-items. ``norm``
    (a norm on a GPU, which reads its unit twice and writes every element): ``norm_schedule``. Never more than
    ``MAX_TEXELS_PER_ITEM`` texels per work-item; never a split above ``max_split``."""
    gpu = info.type == "GPU"
    cap = min(256 if gpu else 64, info.max_work_group_size, info.max_work_item_sizes[0])
    if norm and gpu:
        L, T = norm_schedule(elements, info, max_split)
    else:
        per_item = GPU_ITEMS_PER_TEXELS if gpu else 64
        L = min(cap, pow2_floor(max(1, elements // per_item)))
        T = 1
        want_groups = 2 * info.compute_units
        # a unit that a work-group of the largest size covers at per_item..2 per_item texels a work-item is not
        # split to fill the device: a second launch costs more than the few work-groups it adds save
        while T < max_split and ((L == cap and units * T < want_groups and
                                  ceil_div(elements, 2 * T * L) >= per_item // 4)
                                 or ceil_div(ceil_div(elements, T), L) > MAX_TEXELS_PER_ITEM):
            T *= 2
    P = 1
    max_p = min(info.max_work_item_sizes[1], info.max_work_group_size // L)
    while P * 2 <= max_p and L * P * 2 <= (64 if L < 64 else L) and P * 2 <= units and \
            L * P * 2 * 32 <= info.local_mem_bytes:
        P *= 2
    return {"wg_reduce": L, "units_per_wg": P, "split": T}


NORM_WG = 512  # a GPU norm's work-group: the size of most of the H200's best group_norm configs
NORM_UNSPLIT_TEXELS = 8  # a unit up to this many texels a work-item of a NORM_WG work-group stays one launch
NORM_CHUNK_TEXELS = 4  # a split norm's chunk: this many texels a work-item


def norm_schedule(elements: int, info, max_split: int = 64) -> tuple:
    """A GPU norm's ``(wg_reduce, split)``: one launch, a work-group of ``NORM_WG`` work-items (fewer for a short
    unit) a unit, while the unit is at most ``NORM_UNSPLIT_TEXELS`` texels a work-item (4096 texels: an
    InstanceNorm of 64 x 64); a longer unit in chunks of about ``NORM_CHUNK_TEXELS`` texels a work-item. From the
    H200's tuning of the held-out models' norms (``logs/nvidia-gpu-fcae3850.jsonl``, the best config of each
    split): GroupNorm(32) of 128 x 28 x 28 10.2 us in one launch against 15.3-18.7 split; InstanceNorms of
    128 x 32 x 32 10.8 against 16.2 and of 64 x 64 x 64 14.2 against 16.4; 32 x 128 x 128 (16384 texels a unit)
    32.6 in one launch, 18.6 split 8 ways. The rule before split them all to fill the device, or gave a short
    unit a work-group of 32."""
    L = pow2_floor(min(NORM_WG, info.max_work_group_size, info.max_work_item_sizes[0], info.local_mem_bytes // 32))
    T = 1
    if elements > NORM_UNSPLIT_TEXELS * L:
        while T < max_split and (ceil_div(elements, T) > NORM_CHUNK_TEXELS * L
                                 or ceil_div(ceil_div(elements, T), L) > MAX_TEXELS_PER_ITEM):
            T *= 2
    return min(L, pow2_ceil(ceil_div(elements, T))), T


def fallback_config(v: dict, info, scope: str, max_split: int = 64, norm: bool = False) -> ReduceConfig:
    """A template's fallback: ``fallback_schedule`` of its space variables U and E, every operand in ``scope``."""
    return ReduceConfig(**fallback_schedule(v["U"], v["E"], info, max_split, norm), input_scope=scope,
                        weight_scope=scope, output_scope=scope)


def features(v: dict, k: dict) -> dict:
    """What a schedule implies, for the cost model (``v``: the space variables U and E; ``k``: the knobs):
    texels per work-item, work-group size, work-groups, launched work-items, tree depth and the split."""
    log2 = lambda x: math.log2(max(float(x), 1.0))  # noqa: E731
    units, elements = v["U"], v["E"]
    L, P, T = k["wg_reduce"], k["units_per_wg"], k["split"]
    per_item = ceil_div(ceil_div(elements, T), L)
    groups = ceil_div(units, P) * T
    return {"work_per_item": log2(per_item), "wg_size": log2(L * P), "groups": log2(groups),
            "items": log2(groups * L * P), "tree_depth": log2(L), "split": log2(T),
            "launch_waste": ceil_div(units, P) * P * T * L * per_item / max(units * elements, 1)}


def welford_merge(a, b):
    """Two (count, mean, M2, 0) float4s of disjoint sets of values merged into that of their union (Chan et al.:
    ``delta = mean_b - mean_a``, ``M2 = M2_a + M2_b + delta^2 * n_a * n_b / n``): no sums of squares, so no
    cancellation; an empty set (count 0) leaves the other as it is."""
    na, ma, qa = (ExtractLane(a, k) for k in range(3))
    nb, mb, qb = (ExtractLane(b, k) for k in range(3))
    n = na + nb
    f = nb / max_(n, 1.0)
    d = mb - ma
    return call("make_vector", [n, ma + d * f, qa + qb + d * d * na * f, as_expr(0.0)], "float32x4")


def any_size_tree(b: Builder, value, combine, lid, size: int, buf, items: int = 0):
    """``value`` (a float4 per work-item) combined over the ``size`` work-items of a work-group (any size: the
    upper half of each step folds into the lower where it exists) in ``buf``, a local float4 array of ``size``
    (allocated at the kernel's outermost scope); every work-item reaches each barrier, and the result is read
    after the last (``tree_of`` of one value; ``items``: as there)."""
    return tree_of(b, [value], lambda p, q: [combine(p[0], q[0])], lid, size, buf, items=items)[0]


def global_fence(b: Builder) -> None:
    """``mem_fence(CLK_GLOBAL_MEM_FENCE)``: this work-item's global stores before its later accesses (a slot before
    its count)."""
    b.evaluate(call("mem_fence", [Var("CLK_GLOBAL_MEM_FENCE", DType("int32"))], "int32"))


@contextmanager
def last_to_arrive(b: Builder, last, counters, n, groups: int, lid, size: int):
    """CUDA's threadFenceReduction, for a launch whose ``groups`` work-groups each store a part of image ``n``'s
    result in a workspace: every work-item fences its stores, work-item 0 of the ``size`` (flat id ``lid``) counts
    the work-group in ``counters[n]`` (int32, zero between launches) and notes in ``last`` (a local int32 array of
    one, allocated by the caller) whether it was the last to arrive. The body runs in that work-group only (the
    same for the whole work-group, so its barriers are reached by all), then returns the counter to zero for the
    next launch. ``merge_group_statistics`` counts the same way from work-item 0 alone, which stores the parts."""
    first = (lambda: b.if_(lid.equal(0))) if size > 1 else nullcontext
    global_fence(b)  # every work-item's part stored before the work-group counts
    b.barrier("global")
    with first():
        b.store(last, 0, select(call("atomic_inc", [counters[n]], "int32").equal(groups - 1), as_expr(1),
                                as_expr(0)))
    b.barrier("global")
    with b.if_(last[0].equal(1)):
        yield
        with first():
            b.store(counters, n, 0)


SLOT_ALIGN = 8  # float4 slots: an image's slots start on a 128-byte line, so that no cache line holds two images'


def image_slots(slots: int) -> int:
    """The float4 slots of one image in ``Sp``: its work-groups' and the shift K's, rounded up to SLOT_ALIGN (the
    last work-group of an image reads its slots only after every one was written; a line shared with another
    image could be in its cache from that image's, half written)."""
    return -(-(slots + 1) // SLOT_ALIGN) * SLOT_ALIGN


HALF_TINY, HALF_HUGE = 2.0 ** -14, 65520.0  # half's smallest normal; the least value that rounds to infinity


def as_stored(v, dtype: str):
    """A float32 value as a tensor of ``dtype`` stores it (``vstore_half``'s rounding, to nearest even), without
    half arithmetic, which a device without cl_khr_fp16 cannot build: in half's normal range the significand
    rounded to 11 bits in integer arithmetic on its bits; below it, to a multiple of 2^-24 (``rint``); from
    HALF_HUGE on, infinity."""
    if dtype == "float32":
        return v
    n = v.dtype.lanes
    f, i, suffix = DType("float32", n), DType("int32", n), str(n) if n > 1 else ""
    a = call("fabs", [v], f)
    bits = max_(call("as_int" + suffix, [a], i), 0)  # |v|'s: a positive int
    lsb = binary("floormod", binary("floordiv", bits, 8192), 2)  # the last kept bit: ties go to even
    normal = call("as_float" + suffix, [binary("floordiv", bits + 4095 + lsb, 8192) * 8192], f)
    tiny = call("rint", [a * 2.0 ** 24], f) * 2.0 ** -24
    inf = call("as_float" + suffix, [Broadcast(as_expr(0x7F800000), n) if n > 1 else as_expr(0x7F800000)], f)
    return call("copysign", [select(a < HALF_TINY, tiny, select(a < HALF_HUGE, normal, inf)), v], f)


TAIL_SLOTS_PER_ITEM = 4  # slots (of a block) a work-item of the last work-group merges
TAIL_BATCH = 8  # where a work-item merges more than 32 slots: loaded 8 at a time (a serial loop's round trip each
# cost the H200 45 us for 256 slots a work-item)


def few_items(n: int, per: int, share: int) -> int:
    """A power of two of work-items, about one per ``per`` of ``n`` values, at most ``share``: the work-items that
    reduce a block's values (``staged_items``) or merge its slots (``tail_items``) before a tree of only them."""
    return max(1, min(pow2_floor(share), pow2_ceil(ceil_div(n, per))))


def tail_items(spatial: int, merge: int, size: int) -> int:
    """The work-items of the last work-group a block's ``spatial`` slots are merged by."""
    return few_items(spatial, TAIL_SLOTS_PER_ITEM, size // merge)


@contextmanager
def slot_loop(b: Builder, count: int, items: int, sub, guard=None):
    """The slots ``j`` of ``count`` that work-item ``sub`` of ``items`` merges in the last work-group: every
    ``items``-th, unrolled up to 32 (the loads in flight together, not one round trip each), past that
    ``TAIL_BATCH`` at a time; ``guard``: only where it holds too."""
    trips = ceil_div(count, items)
    batch = trips if trips <= 32 else TAIL_BATCH
    with b.loop("so", ceil_div(trips, batch), "serial") as so, b.loop("sj", batch, "unrolled") as sj:
        j = (so * batch + sj) * items + sub
        inside = j < count if count % items or trips % batch or guard is not None else None
        cond = inside & guard if guard is not None else inside
        with b.if_(cond) if cond is not None else nullcontext():
            yield j


def stats_workspaces(N: int, slots: int) -> list:
    """``last_group_statistics``' workspaces: ``Sp``, a (count, mean, M2) slot per work-group of each image and its
    shift K (float32, ``image_slots`` an image), and ``Sn``, each image's arrival counter (int32, zero between
    launches)."""
    return [buffer("Sp", (N * image_slots(slots), 4), "float32", "global"), buffer("Sn", (N,), "int32", "global")]


def last_group_statistics(b: Builder, values: list, first, lid, size: int, n, slot, slots: int, Sp, Sc, St):
    """A GroupNorm(1)'s statistics of image ``n`` written by the launch that computes the image (a producer's
    epilogue: ``Conv2dWorkload.out_stats``, ``pool_kernel``'s), in ``group_norm``'s ``stats`` format with one
    chunk -- no launch is left for them. ``values``: this work-item's ``(float4, float4 mask of 1s and 0s)``
    outputs; ``first``: ``(condition, float4)`` -- whether work-item 0 holds the image's first element (lane 0),
    the format's shift K, and its pixel as stored (a float16 plan's rounded: the readers take K from the tensor).
    ``lid`` of ``size`` work-items; the work-group is ``slot`` of the ``slots`` that write image ``n``.

    Each work-item reduces its own values to (count, mean, M2) -- the mean, then the squared deviations from it,
    in registers -- and the work-group merges them in one local tree (``welford_merge``). Work-item 0 stores the
    result in ``Sp`` (float32 (N * (slots + 1), 4), a workspace; K in slot ``slots``), fences, and counts the
    work-group in ``Sc[n]`` (int32 (N,), a workspace that starts at zero). The work-group that counts last merges
    the slots in a fixed order (deterministic; a work-item about every ``TAIL_SLOTS_PER_ITEM`` of them, then a
    tree of those work-items), writes ``St[2n]`` = (count * (mean - K), 0, 0, 0) and ``St[2n +
    1]`` = (M2 + count * (mean - K)^2, 0, 0, 0) -- the shifted sums a reader adds up (``unit_factors``) -- and
    returns ``Sc[n]`` to zero for the next launch (CUDA's threadFenceReduction)."""
    merge_group_statistics(b, own_statistics(b, values), first, lid, size, n, slot, slots, Sp, Sc, St)


def own_statistics(b: Builder, values: list):
    """A work-item's (count, mean, M2, 0) of its ``(float4, float4 mask)`` values (``last_group_statistics``): the
    mean, then the squared deviations from it, in registers."""
    zero = Broadcast(as_expr(0.0), 4)
    acc = b.allocate("ssum", (2,), "float32x4", "private")
    b.store(acc, 0, zero)
    b.store(acc, 1, zero)
    for v, m in values:
        b.store(acc, 0, acc[0] + v * m)
        b.store(acc, 1, acc[1] + m)
    count = b.let("scount", hsum(acc[1]))
    mean = b.let("smean", hsum(acc[0]) / max_(count, 1.0))
    b.store(acc, 0, zero)
    for v, m in values:
        d = (v - Broadcast(mean, 4)) * m
        b.store(acc, 0, acc[0] + d * d)
    return call("make_vector", [count, mean, hsum(acc[0]), as_expr(0.0)], "float32x4")


def merge_group_statistics(b: Builder, own, first, lid, size: int, n, slot, slots: int, Sp, Sc, St):
    """``last_group_statistics`` from each work-item's (count, mean, M2, 0) float4 ``own``: the work-group's local
    merge, its slot, and the last work-group's merge of the image's slots into ``St``."""
    zero, vec = Broadcast(as_expr(0.0), 4), Ramp(as_expr(0), as_expr(1), 4)
    tree = b.allocate("stree", (size,), "float32x4", "local")  # the work-group's merge, then the last one's
    last = b.allocate("slast", (1,), "int32", "local")
    group = any_size_tree(b, own, welford_merge, lid, size, tree)
    base = n * image_slots(slots)
    cond, v0 = first
    with b.if_(lid.equal(0)):
        b.store(Sp, (base + slot, vec), group)
        with b.if_(cond):
            b.store(Sp, (base + slots, vec), v0)
        global_fence(b)  # stored before counted
        b.store(last, 0, select(call("atomic_inc", [Sc[n]], "int32").equal(slots - 1), as_expr(1), as_expr(0)))
    b.barrier("global")  # (this work-group's own slot, stored by work-item 0, read by the others if last)
    with b.if_(last[0].equal(1)):  # the same for the whole work-group
        part = b.allocate("spart", (1,), "float32x4", "private")
        b.store(part, 0, zero)
        merging = tail_items(slots, 1, size)  # a work-item about every 4 slots: a tree only as deep as that needs
        with slot_loop(b, slots, merging, lid, lid < merging if merging < size else None) as j:
            b.store(part, 0, welford_merge(part[0], Sp[base + j, vec]))
        whole = any_size_tree(b, part[0], welford_merge, lid, merging, tree, items=size)
        with b.if_(lid.equal(0)):
            c = ExtractLane(whole, 0)
            d = b.let("sdev", ExtractLane(whole, 1) - ExtractLane(Sp[base + slots, vec], 0))
            b.store(St, (2 * n, vec), call("make_vector", [c * d, 0.0, 0.0, 0.0], "float32x4"))
            b.store(St, (2 * n + 1, vec), call("make_vector", [ExtractLane(whole, 2) + c * d * d, 0.0, 0.0, 0.0],
                                                          "float32x4"))
            b.store(Sc, n, 0)


def unit_statistics(x: np.ndarray, groups: int) -> np.ndarray:
    """A GroupNorm's or InstanceNorm's statistics as a producer's epilogue writes them (``last_group_statistics``,
    ``last_group_unit_statistics``): one chunk of ``chunk_statistics`` a unit -- for an InstanceNorm (``groups`` =
    C) each lane its own channel, else the unit's lanes added up into lane 0. A (N * units * 2, 4) array."""
    lanes = chunk_statistics(x, 1, groups)
    if groups == x.shape[1]:
        return lanes
    out = np.zeros_like(lanes)
    out[:, 0] = lanes.sum(axis=1)
    return out


def lanewise_merge(a: list, b: list) -> list:
    """``welford_merge`` a lane at a time: ``a`` and ``b`` are (count, mean, M2) float4s of 4 channels over disjoint
    sets of pixels (the count the same in every lane)."""
    n = a[0] + b[0]
    f = b[0] / max_(n, Broadcast(as_expr(1.0), 4))
    d = b[1] - a[1]
    return [n, a[1] + d * f, a[2] + b[2] + d * d * a[0] * f]


def tree_of(b: Builder, values: list, combine, lid, size: int, buf, span: int = 0, items: int = 0) -> list:
    """Several float4s a work-item combined over a work-group (``combine`` takes and returns lists), in ``buf``, a local
    float4 array of ``size * len(values)``; ``span`` (a power of two up to ``size``): independent trees over
    each ``span`` neighbouring work-items instead, their results read from the span's first. ``items``: the
    work-group's work-items where more than ``size`` reach the barriers (only the first ``size`` take part)."""
    k = len(values)
    part = lid < size if items > size else None
    with b.if_(part) if part is not None else nullcontext():
        for j, v in enumerate(values):
            b.store(buf, lid * k + j, v)
    s = (pow2_ceil(size) if not span else span) // 2
    while s >= 1:
        b.barrier()
        guard = ((lid % span < s) & (lid + s < size) if size % span else lid % span < s) if span \
            else (lid < s) & (lid + s < size) if 2 * s > size else lid < s
        with b.if_(guard & part if span and part is not None else guard):
            tag = [f"_{j}" if k > 1 else "" for j in range(k)]
            mine = [b.let(f"{buf.name}_a{s}{tag[j]}", buf[lid * k + j]) for j in range(k)]
            other = [b.let(f"{buf.name}_b{s}{tag[j]}", buf[(lid + s) * k + j]) for j in range(k)]
            for j, v in enumerate(combine(mine, other)):
                b.store(buf, lid * k + j, v)
        s //= 2
    b.barrier()
    return [buf[j] for j in range(k)]


@dataclass(frozen=True)
class StagedTile:
    """A work-group's output tile as ``last_group_unit_statistics`` stages it in local memory: ``entries[k]``, this
    work-item's ``(value, pos, owned, inside)`` of the tile's block ``k`` -- the value as kept, its pixel's place
    among the work-group's ``pixels`` (rows, then columns, of the work-group's whole tile), whether this
    work-item holds it (a split's owner; None: always) and whether the pixel is inside the output."""
    entries: list
    pixels: int


STAGED_PER_ITEM = 8  # pixels of a block a work-item reduces from the staged tile: few work-items, a short tree


def staged_items(pixels: int, blocks: int, size: int) -> int:
    """The work-items a block's staged pixels are reduced by."""
    return few_items(pixels, STAGED_PER_ITEM, size // blocks)


def unit_statistics_layout(OB: int, groups: int, C: int, tile_oc: int, spatial: int) -> dict:
    """Where ``last_group_unit_statistics`` keeps a producer's partials of a GroupNorm(``groups``) or InstanceNorm
    (``groups`` = C) over an output of OB channel blocks, the producer's work-groups ``tile_oc`` blocks by
    ``spatial`` tiles of pixels each: ``merge`` -- the blocks one arrival counter covers (the work-group's tile, or
    a group spanning several tiles), ``tiles`` of them each; ``units`` -- the counters of an image; ``slots`` --
    the work-groups a counter counts; ``region`` -- float4s of ``Sp`` a counter's: 3 a slot and block (count, mean,
    M2), then each block's shift K, rounded up to SLOT_ALIGN. A ValueError where the tile and the groups cut each
    other."""
    bpg = unit_blocks(C, groups)  # (groups of whole blocks: Conv2dWorkload checks out_stats)
    if tile_oc % bpg and bpg % tile_oc:
        raise ValueError(f"out_stats: a tile of tile_oc={tile_oc} blocks cuts the norm's groups of {bpg} blocks")
    merge = max(tile_oc, bpg)
    tiles = merge // tile_oc
    n_ob = -(-OB // tile_oc)
    slots = tiles * spatial
    return dict(bpg=bpg, merge=merge, tiles=tiles, units=-(-n_ob // tiles), slots=slots,
                region=-(-(slots * tile_oc * 3 + merge) // SLOT_ALIGN) * SLOT_ALIGN)


def unit_stats_workspaces(N: int, layout: dict) -> list:
    """``last_group_unit_statistics``' workspaces: ``Sp`` (float32, ``layout['region']`` float4s a counter) and
    ``Sn`` (int32, a counter each (image, merge unit), zero between launches)."""
    units = N * layout["units"]
    return [buffer("Sp", (units * layout["region"], 4), "float32", "global"),
            buffer("Sn", (units,), "int32", "global")]


def last_group_unit_statistics(b: Builder, staged: StagedTile, firsts: list, lid, size: int, n, tile,
                               spatial_slot, layout: dict, dims: tuple, Sp, Sc, St):
    """``last_group_statistics`` for a GroupNorm whose groups are whole blocks of 4 channels, or an InstanceNorm
    (``dims``: (OB, groups, C)): the statistics of each unit -- (image, group), or (image, block) a lane a channel
    -- written by the launch that computes them, in ``group_norm``'s ``stats`` format with one chunk
    (``unit_statistics``). ``staged``: the work-group's ``tile_oc`` blocks of output pixels, this work-item's
    entries of them (``StagedTile``); ``firsts``: for each block, ``(condition, float4)`` -- whether this
    work-item holds the block's pixel (0, 0), and that pixel as stored (the shift K). The work-group computes
    output tile ``tile`` (its blocks ``tile * tile_oc`` on), pixel tile ``spatial_slot`` of its image's.

    Each work-item stages its values in local memory (a split's owner its sums), so that a few work-items a block
    (``staged_items``) reduce the block's pixels to (count, mean, M2) a lane -- the mean, then the squared
    deviations from it -- and merge them in a short tree (``lanewise_merge``); on the H200 the tree over every
    work-item's values it replaces (up to 512 of them, 6 float4s each) cost 2-6.5 us a convolution. Work-item 0
    stores them in its slot (``unit_statistics_layout``), fences and counts the work-group in the counter of its
    merge unit (the tile, or the group it is part of). The work-group that counts last merges each block's slots
    (a few work-items a block, ``tail_items``, each merging its slots, then a tree of them), then each unit's
    blocks and lanes (a GroupNorm), writes ``St`` and returns the counter to zero."""
    OB, groups, C = dims
    t_oc, P = len(staged.entries), staged.pixels
    k3 = 3 * t_oc
    bpg, merge, tiles, slots = layout["bpg"], layout["merge"], layout["tiles"], layout["slots"]
    if merge > size:
        raise ValueError(f"out_stats: a work-group of {size} work-items merges {merge} blocks' statistics")
    spatial = slots // tiles
    red, span = staged_items(P, t_oc, size), tail_items(spatial, merge, size)
    zero, one, vec = Broadcast(as_expr(0.0), 4), Broadcast(as_expr(1.0), 4), Ramp(as_expr(0), as_expr(1), 4)
    stage = b.allocate("sstage", (t_oc * P,), "float32x4", "local")
    mask = b.allocate("smask", (P,), "float32", "local")
    tree = b.allocate("stree", (max(t_oc * red, merge * span) * 3,), "float32x4", "local")
    last = b.allocate("slast", (1,), "int32", "local")
    fin = b.allocate("sblock", (merge * 3,), "float32x4", "local")  # the last work-group's blocks, merged
    state = b.allocate("sstate", (3,), "float32x4", "private")
    unit = n * layout["units"] + tile // tiles
    base = unit * layout["region"]
    kbase = base + slots * t_oc * 3  # the merge unit's blocks' shifts K
    for k, entries in enumerate(staged.entries):
        cond, v0 = firsts[k]
        with b.if_(cond):  # the block's pixel (0, 0): its shift K, stored and fenced before the global barrier
            b.store(Sp, (kbase + (tile % tiles) * t_oc + k, vec), v0)
            global_fence(b)
        for v, pos, owned, inside in entries:
            with b.if_(owned) if owned is not None else nullcontext():
                b.store(stage, k * P + pos, select(inside, v, zero))
                if k == 0:  # each pixel's mask once, by the owner of its first block's value
                    b.store(mask, pos, select(inside, as_expr(1.0), as_expr(0.0)))
    b.barrier("global")  # the staged tile, and the shifts K (stored by other work-items than 0) before counting
    for j in range(3):
        b.store(state, j, zero)
    blk, sub, per = lid // red, lid % red, ceil_div(P, red)
    with b.if_(lid < t_oc * red):  # the block's pixels sub, sub + red, ...: count and mean, then M2
        at = [(blk * P + (j * red + sub), j * red + sub) for j in range(per)]
        guard = [(j * red + sub < P) if (j + 1) * red > P else None for j in range(per)]
        for (i, q), g in zip(at, guard):
            with b.if_(g) if g is not None else nullcontext():
                b.store(state, 0, state[0] + Broadcast(mask[q], 4))
                b.store(state, 1, state[1] + stage[i])
        mean = b.let("smean", state[1] / max_(state[0], one))
        for j, ((i, q), g) in enumerate(zip(at, guard)):
            with b.if_(g) if g is not None else nullcontext():
                d = b.let(f"sd{j}", (stage[i] - mean) * Broadcast(mask[q], 4))
                b.store(state, 2, state[2] + d * d)
        b.store(state, 1, mean)
    tree_of(b, [state[0], state[1], state[2]], lanewise_merge, lid, t_oc * red, tree, span=red, items=size)
    slot = (tile % tiles) * spatial + spatial_slot
    with b.if_(lid.equal(0)):
        for j in range(k3):
            b.store(Sp, (base + slot * k3 + j, vec), tree[(j // 3) * red * 3 + j % 3])
        global_fence(b)  # stored before counted
        b.store(last, 0, select(call("atomic_inc", [Sc[unit]], "int32").equal(slots - 1), as_expr(1), as_expr(0)))
    b.barrier("global")
    with b.if_(last[0].equal(1)):  # the same for the whole work-group
        blk, sub = lid // span, lid % span
        for j in range(3):
            b.store(state, j, zero)
        with b.if_(blk < merge), slot_loop(b, spatial, span, sub) as j:
            at = base + (((blk // t_oc) * spatial + j) * t_oc + blk % t_oc) * 3
            slot_state = [b.let(f"sslot{i}", Sp[at + i, vec]) for i in range(3)]
            new = [b.let(f"snew{i}", v) for i, v in enumerate(lanewise_merge(
                [state[0], state[1], state[2]], slot_state))]
            for i, v in enumerate(new):  # (all three from the state before)
                b.store(state, i, v)
        whole = tree_of(b, [state[0], state[1], state[2]], lanewise_merge, lid, merge * span, tree, span=span,
                        items=size) if span > 1 else None
        first_block = (tile // tiles) * merge  # of the image's blocks
        with b.if_(sub.equal(0) & (blk < merge) if span > 1 else blk < merge):
            for i in range(3):
                b.store(fin, blk * 3 + i, tree[lid * 3 + i] if whole is not None else state[i])
        b.barrier()
        if groups == C:  # each block a unit, each lane a channel: the shifted sums a lane
            with b.if_((lid < merge) & (first_block + lid < OB)):
                c, mean, m2 = fin[lid * 3], fin[lid * 3 + 1], fin[lid * 3 + 2]
                d = b.let("sdev", mean - Sp[kbase + lid, vec])
                at = n * OB + first_block + lid
                b.store(St, (2 * at, vec), c * d)
                b.store(St, (2 * at + 1, vec), m2 + c * d * d)
        else:  # a group's blocks and lanes merged, its shift K the first lane of its first block
            with b.if_((lid < merge // bpg) & (first_block // bpg + lid < groups)):
                g = b.let("sgroup", call("make_vector", [0.0, 0.0, 0.0, 0.0], "float32x4"))
                for q in range(bpg):
                    at = (lid * bpg + q) * 3
                    for lane in range(4):
                        one = b.let(f"sl{q}_{lane}", call("make_vector", [  # a lane's (count, mean, M2)
                            ExtractLane(fin[at], lane), ExtractLane(fin[at + 1], lane),
                            ExtractLane(fin[at + 2], lane), 0.0], "float32x4"))
                        g = b.let(f"sg{q}_{lane}", welford_merge(g, one))
                c = ExtractLane(g, 0)
                d = b.let("sdev", ExtractLane(g, 1) - ExtractLane(Sp[kbase + lid * bpg, vec], 0))
                at = n * groups + first_block // bpg + lid
                b.store(St, (2 * at, vec), call("make_vector", [c * d, 0.0, 0.0, 0.0], "float32x4"))
                b.store(St, (2 * at + 1, vec), call("make_vector", [ExtractLane(g, 2) + c * d * d, 0.0, 0.0, 0.0],
                                                               "float32x4"))
        with b.if_(lid.equal(0)):
            b.store(Sc, unit, 0)
