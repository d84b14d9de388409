"""Group normalization, InstanceNormalization included: ``Y = (X - mean) / sqrt(var + epsilon) * S[c] + B[c]``
over NCHW ``X``, the statistics per (image, group of C / groups channels) over those channels and H x W
(InstanceNorm: groups = C; GroupNorm(1): the whole image).

A unit is one group of one image -- or, with groups = C, one block of 4 channels, whose lanes are 4
independent groups. Its texels: every (channel block of the group, h, w); with groups = 1 the last block's
padding lanes are left out. Any group count that divides C: groups whose channels share a block of 4
(GroupNorm(32) of 64 channels) take ``_group_norm_mixed``'s three kernels.

Statistics in one read, numerically shifted: each work-item sums ``d = x - K`` and ``d * d``, with ``K`` the
unit's first element, so the variance ``sum(d^2)/n - (sum(d)/n)^2`` does not cancel the way raw sums do when
the mean is large. Schedule (``templates/reduction.py``): L work-items per unit meet in a local-memory tree and
then normalize their own texels in the same kernel (a second read of X); with a split into T chunks the first
kernel writes each chunk's two sums and a second kernel, over the same chunks, combines the T partials of its
unit and normalizes its chunk."""
from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, apply_prelu_ir, apply_prelu_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Broadcast, ExtractLane, Ramp, as_expr, call, max_, min_, select
from tuner.ir.kernel import Program
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, bias_length, split_prelu, texture_scopes
from tuner.templates.reduction import (ReduceConfig, SameShapeWorkload, Schedule, ceil_div, chunk_statistics,
                                       each_index, fallback_config, features, hsum, packed, sum_partials, unravel)


@dataclass(frozen=True)
class GroupNormWorkload(SameShapeWorkload):
    """Canonical key: the NCHW input, the group count and epsilon."""
    OP, FLOPS = "group_norm", 4
    data: tuple
    groups: int
    epsilon: float = 1e-5
    dtype: str = "float32"
    activation: str = "none"  # fused after the affine (InstanceNorm -> ReLU, GroupNorm -> SiLU)
    residual: bool = False  # an add of another activation of the shape (``Res``) after the affine, before the
    # activation: a residual block's y = norm(conv(x)) + x (issue 55); in the key only when set
    stats: int = 0  # > 0: the statistics only, for the convolutions that normalize as they read
    # (``passes_layer_norm``; ``Conv2dWorkload.norm_partials`` and ``in_group_norm``): each unit's ``stats`` chunks'
    # shifted sums of d and d^2 (float4 each) written to Y, a float32 buffer of (N * units * stats * 2, 4) --
    # ``reduction.chunk_statistics``: a unit an image (GroupNorm(1)), a group of whole blocks, or a block of 4
    # channels whose lanes are 4 InstanceNorm channels. The split is the chunk count. Not for groups that share a
    # block; no scale, bias, residual or activation; in the key only when set

    def key(self) -> dict:
        key = super().key()
        for k in ("residual", "stats"):
            if not key[k]:
                del key[k]
        return key

    @property
    def out_shape(self) -> tuple:
        if not self.stats:
            return self.data
        return (int(np.prod(_units(self)[0])) * self.stats * 2, 4)

    def __post_init__(self):
        object.__setattr__(self, "data", tuple(int(x) for x in self.data))
        object.__setattr__(self, "activation", canonical(self.activation))
        object.__setattr__(self, "groups", int(self.groups))
        object.__setattr__(self, "epsilon", float(self.epsilon))
        if len(self.data) != 4 or min(self.data) < 1:
            raise ValueError(f"group_norm data {list(self.data)}: want a positive 4-D NCHW shape")
        C = self.data[1]
        if self.groups < 1 or C % self.groups:
            raise ValueError(f"group_norm groups={self.groups} must divide the {C} channels")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")
        object.__setattr__(self, "stats", int(self.stats))
        if self.stats and (_mixed(self) or self.residual or self.activation != "none"
                           or self.stats < 0 or 2 * self.stats > _units(self)[1][0] * self.data[2] * self.data[3]):
            raise ValueError(f"group_norm stats={self.stats}: the statistics only of groups of whole blocks of 4 "
                             f"channels, of one channel each or of one group (no residual or activation), at most "
                             f"half as many chunks as a unit's texels")


def _mixed(wl) -> bool:
    """Groups that share a block of 4 channels (GroupNorm(32) of 64 channels: 2 a group)."""
    C, G = wl.data[1], wl.groups
    return G not in (1, C) and (C // G) % 4 != 0


def _units(wl) -> tuple:
    """(unit grid, texel grid of a unit, per_lane)."""
    N, C, H, W = wl.data
    G = wl.groups
    if G == C:
        return (N, ceil_div(C, 4)), (1, H, W), True
    cg = C // G
    if _mixed(wl):  # super-units of whole groups in whole blocks (``_super_unit``)
        k, kb, _ = _super_unit(wl)
        return (N, ceil_div(C, k)), (kb, H, W), False
    else:
        blocks = ceil_div(C, 4) if G == 1 else cg // 4
    return (N, G), (blocks, H, W), False


def group_norm(wl: GroupNormWorkload, cfg: ReduceConfig):
    if _mixed(wl):
        return _group_norm_mixed(wl, cfg)
    N, C, H, W = wl.data
    units, texels, per_lane = _units(wl)
    U, E = int(np.prod(units)), int(np.prod(texels))
    count = E if per_lane else (C // wl.groups) * H * W  # elements of a group
    rem = C % 4 if wl.groups == 1 else 0  # the last block's real lanes, groups = 1 only
    sched = Schedule(U, E, cfg)
    T = cfg.split
    if wl.stats and T != wl.stats:
        raise ValueError(f"group_norm stats={wl.stats}: the split is the chunk count, got split={T}")
    X, S, B, Y = _operands(wl, cfg)
    Res = _residual_operand(wl, cfg)
    part = buffer("Y" if wl.stats else "part", (U * T * 2, 4), "float32", "global") if T > 1 or wl.stats else None
    vec = Ramp(as_expr(0), as_expr(1), 4)

    def at(b, u, e):
        """The unit's texel ``e``: (n, channel lanes, h, w) and the block index."""
        n, ub = unravel(b, u, units, sched.tag("u"))
        cbi, h, w = unravel(b, e, texels, sched.tag("t"))
        cb = ub if per_lane else (ub * texels[0] + cbi if wl.groups > 1 else cbi)
        return (n, Ramp(cb * 4, as_expr(1), 4), h, w), cb

    def shift(b, u):
        n, ub = unravel(b, u, units, "s")
        first = X[n, Ramp((ub if per_lane else ub * texels[0] if wl.groups > 1 else as_expr(0)) * 4,
                          as_expr(1), 4), 0, 0]
        return b.let("K", first if per_lane else Broadcast(ExtractLane(first, 0), 4))

    def deviation(b, u, e, K):
        idx, cb = at(b, u, e)
        d = b.let("d", X[idx] - K)
        if rem:  # the padding lanes of the last block add nothing
            keep = select(cb < ceil_div(C, 4) - 1, as_expr(1.0), as_expr(0.0))
            d = b.let("dm", d * call("make_vector", [as_expr(1.0) if j < rem else keep for j in range(4)],
                                     "float32x4"))
        return d

    def normalize(b, u, c, lid, K, s, q):
        """The statistics from the sums ``s``, ``q`` of d and d^2, then this work-item's texels written."""
        if not per_lane:
            s, q = Broadcast(hsum(s), 4), Broadcast(hsum(q), 4)
        m = b.let("m", s * (1.0 / count))
        mean = b.let("mean", K + m)
        rstd = b.let("rstd", call("rsqrt", [max_(q * (1.0 / count) - m * m, 0.0) + wl.epsilon], "float32x4"))
        with sched.elements(b, c, lid) as e:
            idx, _ = at(b, u, e)
            b.store(Y, idx, _activate(wl, _residual((X[idx] - mean) * (rstd * S[idx[1]]) + B[idx[1]], Res, idx), B,
                                      idx[1]))

    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        K = shift(b, u)
        acc = b.allocate("acc", (2,), "float32x4", "private")
        b.store(acc, 0, 0.0)
        b.store(acc, 1, 0.0)
        with sched.elements(b, c, lid) as e:
            d = deviation(b, u, e, K)
            b.store(acc, 0, acc[0] + d)
            b.store(acc, 1, acc[1] + d * d)
        s, q = sched.tree(b, [acc[0], acc[1]], lambda x, y: x + y, lid, p)
        if part is None:
            with b.if_(sched.valid) if sched.valid is not None else nullcontext():
                normalize(b, u, c, lid, K, s, q)
        else:
            cond = sched.is_writer(lid)
            with b.if_(cond) if cond is not None else nullcontext():
                b.store(part, ((u * T + c) * 2, vec), s)
                b.store(part, ((u * T + c) * 2 + 1, vec), q)
    name = "instance_norm" if per_lane else "group_norm"
    res = [Res] if Res is not None else []
    if wl.stats:
        return b.kernel(f"{name}_stats", [X, part])
    if T == 1:
        return b.kernel(name, [X, S, B, *res, Y])
    first = b.kernel(f"{name}_stats", [X, part])
    b = Builder()  # every chunk again: its unit's T partials combined, its texels normalized
    with sched.items(b) as (u, c, lid, p):
        K = shift(b, u)
        acc = sum_partials(b, part, u, T)
        with b.if_(sched.valid) if sched.valid is not None else nullcontext():
            normalize(b, u, c, lid, K, acc[0], acc[1])
    second = b.kernel(f"{name}_apply", [X, S, B, *res, part, Y])
    return Program(name, (first, second), (X, S, B, *res, Y), (part,))


def _residual(v, Res, idx):
    return v if Res is None else v + Res[idx]


def _activate(wl, v, B, ch):
    """The fused activation of the normalized ``v`` of channels ``ch`` (a Ramp of 4): a per-channel PReLU reads
    its slopes after the padded biases in ``B`` (``common.bias_length``)."""
    if wl.activation == "prelu":
        return apply_prelu_ir(v, B[Ramp(ch.base + B.shape[0] // 2, as_expr(1), 4)])
    return apply_ir(wl.activation, v)


def _operands(wl, cfg) -> tuple:
    C = wl.data[1]
    S, B = (buffer(name, (C if name == "S" else bias_length(wl, C),), wl.dtype,
                   *(("texture:weight", "mace_argument") if cfg.weight_scope == "texture" else ("global", "bias4_buffer")))
            for name in ("S", "B"))
    return packed("X", wl.data, wl.dtype, cfg.input_scope), S, B, packed("Y", wl.data, wl.dtype, cfg.output_scope)


def _residual_operand(wl, cfg):
    """``Res``, the residual added after the affine, in the output's scope; None without ``residual``."""
    return packed("Res", wl.data, wl.dtype, cfg.output_scope) if wl.residual else None


def _super_unit(wl) -> tuple:
    """Mixed groups: ``(k, kb, kg)``, the channels of the smallest run of whole groups that is also whole blocks of
    4 (lcm(C / groups, 4)), its blocks and its groups. GroupNorm(32) of 64 channels: 4 channels, 1 block, 2 groups."""
    cg = wl.data[1] // wl.groups
    k = cg * 4 // math.gcd(cg, 4)
    return k, k // 4, k // cg


def _group_norm_mixed(wl: GroupNormWorkload, cfg: ReduceConfig) -> Program:
    """Groups that share blocks, in one launch (two with a split): a unit is a *super-unit* of one image, the
    ``kg`` whole groups whose channels fill ``kb`` whole blocks (``_super_unit``), so that no pixel holds a group
    of another unit. Each work-item reads its pixels' ``kb`` blocks and keeps per-lane shifted sums (the shift:
    each lane's value at (0, 0)); after the work-group tree each lane's mean and sum of squared deviations
    combine into its group's (Chan et al.'s pairwise update: the groups' lanes have equal counts), and the
    work-items normalize their own pixels, each lane with its group's statistics. With a split into T chunks the
    first kernel writes each chunk's per-lane sums and a second one, over the same chunks, adds the T partials of
    its unit and normalizes its chunk. Lanes past the channels (a last, partial super-unit) are masked."""
    N, C, H, W = wl.data
    G, cg, CB = wl.groups, C // wl.groups, ceil_div(C, 4)
    k, kb, kg = _super_unit(wl)
    units = (N, ceil_div(C, k))
    U, T = int(np.prod(units)), cfg.split
    sched = Schedule(U, H * W, cfg)  # the texels of a unit are its pixels' kb blocks: kb texels a pixel
    X, S, B, Y = _operands(wl, cfg)
    Res = _residual_operand(wl, cfg)
    res = [Res] if Res is not None else []
    part = buffer("part", (U * T * 2 * kb, 4), "float32", "global") if T > 1 else None
    vec = Ramp(as_expr(0), as_expr(1), 4)
    count = H * W  # elements of one lane

    def blocks(b, u):
        """The unit's image, its blocks (clamped to the last real one) and each block's lane mask."""
        n, su = unravel(b, u, units, "u")
        cbs, keeps = [], []
        for bi in range(kb):
            cb = b.let(f"cb{bi}", su * kb + bi)
            cbs.append(cb)
            keeps.append(call("make_vector", [select(cb * 4 + j < C, as_expr(1.0), as_expr(0.0)) for j in range(4)],
                              "float32x4") if C % k else None)
        return n, cbs, keeps

    def read(n, cb, h, w):
        return X[n, Ramp(min_(cb, CB - 1) * 4 if C % k else cb * 4, as_expr(1), 4), h, w]

    def shifts(b, n, cbs):
        return [b.let(f"K{bi}", read(n, cb, 0, 0)) for bi, cb in enumerate(cbs)]

    def normalize(b, u, c, lid, n, cbs, K, sums):
        """Each lane's mean and M2 from its shifted sums, combined per group, then this work-item's pixels."""
        means, m2 = [], []
        for bi in range(kb):
            s, q = sums[2 * bi], sums[2 * bi + 1]
            m = b.let(f"m{bi}", s * (1.0 / count))
            means.append(b.let(f"mu{bi}", K[bi] + m))
            m2.append(b.let(f"M{bi}", max_(q - s * m, 0.0)))
        lanes = [(bi, j) for bi in range(kb) for j in range(4)]
        mean_of, rstd_of = {}, {}
        for lg in range(kg):  # the group's cg lanes, in order: static positions in the super-unit
            mine = [(bi, j) for bi, j in lanes if (bi * 4 + j) // cg == lg]
            mu = b.let(f"gm{lg}", sum((ExtractLane(means[bi], j) for bi, j in mine[1:]),
                                      ExtractLane(means[mine[0][0]], mine[0][1])) * (1.0 / cg))
            dev = [ExtractLane(means[bi], j) - mu for bi, j in mine]
            ss = sum((ExtractLane(m2[bi], j) for bi, j in mine[1:]), ExtractLane(m2[mine[0][0]], mine[0][1]))
            ss = ss + sum((d * d for d in dev[1:]), dev[0] * dev[0]) * float(count)
            mean_of[lg] = mu
            rstd_of[lg] = b.let(f"gr{lg}", call("rsqrt", [max_(ss * (1.0 / (count * cg)), 0.0) + wl.epsilon],
                                                "float32"))
        mean_v = [b.let(f"mv{bi}", call("make_vector", [mean_of[(bi * 4 + j) // cg] for j in range(4)], "float32x4"))
                  for bi in range(kb)]
        rstd_v = [b.let(f"rv{bi}", call("make_vector", [rstd_of[(bi * 4 + j) // cg] for j in range(4)], "float32x4"))
                  for bi in range(kb)]
        with sched.elements(b, c, lid) as e:
            h, w = unravel(b, e, (H, W), sched.tag("p"))
            for bi, cb in enumerate(cbs):
                ch = Ramp(cb * 4, as_expr(1), 4)
                with b.if_(cb < CB) if C % k else nullcontext():
                    v = (X[n, ch, h, w] - mean_v[bi]) * (rstd_v[bi] * S[ch]) + B[ch]
                    b.store(Y, (n, ch, h, w), _activate(wl, _residual(v, Res, (n, ch, h, w)), B, ch))

    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        n, cbs, keeps = blocks(b, u)
        K = shifts(b, n, cbs)
        acc = b.allocate("acc", (2 * kb,), "float32x4", "private")
        for i in range(2 * kb):
            b.store(acc, i, 0.0)
        with sched.elements(b, c, lid) as e:
            h, w = unravel(b, e, (H, W), sched.tag("p"))
            for bi, cb in enumerate(cbs):
                d = read(n, cb, h, w) - K[bi]
                d = b.let(f"d{bi}", d * keeps[bi] if keeps[bi] is not None else d)
                b.store(acc, 2 * bi, acc[2 * bi] + d)
                b.store(acc, 2 * bi + 1, acc[2 * bi + 1] + d * d)
        sums = sched.tree(b, [acc[i] for i in range(2 * kb)], lambda x, y: x + y, lid, p)
        if T == 1:
            with b.if_(sched.valid) if sched.valid is not None else nullcontext():
                normalize(b, u, c, lid, n, cbs, K, sums)
        else:
            cond = sched.is_writer(lid)
            with b.if_(cond) if cond is not None else nullcontext():
                for i, v in enumerate(sums):
                    b.store(part, ((u * T + c) * 2 * kb + i, vec), v)
    if T == 1:
        return b.kernel("group_norm", [X, S, B, *res, Y])
    first = b.kernel("group_norm_stats", [X, part])
    b = Builder()  # every chunk again: its unit's T partials added, its pixels normalized
    with sched.items(b) as (u, c, lid, p):
        n, cbs, _ = blocks(b, u)
        K = shifts(b, n, cbs)
        acc = b.allocate("acc", (2 * kb,), "float32x4", "private")
        for i in range(2 * kb):
            b.store(acc, i, 0.0)
        with b.loop("t", T, "serial") as t:
            for i in range(2 * kb):
                b.store(acc, i, acc[i] + part[(u * T + t) * 2 * kb + i, vec])
        with b.if_(sched.valid) if sched.valid is not None else nullcontext():
            normalize(b, u, c, lid, n, cbs, K, [acc[i] for i in range(2 * kb)])
    second = b.kernel("group_norm_apply", [X, S, B, *res, part, Y])
    return Program("group_norm", (first, second), (X, S, B, *res, Y), (part,))


def reference(wl: GroupNormWorkload, inputs: dict) -> np.ndarray:
    if wl.stats:
        return chunk_statistics(inputs["X"], wl.stats, wl.groups)
    x = np.asarray(inputs["X"], np.float64)
    xg = x.reshape(x.shape[0], wl.groups, -1)
    mean = xg.mean(axis=2, keepdims=True)
    var = ((xg - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + wl.epsilon)).reshape(x.shape)
    bias, slope = split_prelu(wl, inputs["B"])
    C = x.shape[1]
    y = y * np.asarray(inputs["S"], np.float64).reshape(1, -1, 1, 1) + \
        np.asarray(bias, np.float64)[:C].reshape(1, -1, 1, 1)
    if wl.residual:
        y = y + np.asarray(inputs["Res"], np.float64)
    return apply_prelu_numpy(y, slope[:C]) if slope is not None else apply_numpy(wl.activation, y)


def random_inputs(wl: GroupNormWorkload, rng) -> dict:
    """X with a mean far from zero (what the shifted sums are for), S and B of both signs."""
    C = wl.data[1]
    B = rng.standard_normal(bias_length(wl, C)).astype(wl.dtype)
    if wl.activation == "prelu":  # slopes as trained PReLUs have them
        B[B.size // 2:] = rng.uniform(0.05, 0.5, B.size // 2)
    out = {"X": (rng.standard_normal(wl.data) * 2.0 + 3.0).astype(wl.dtype),
           "S": rng.standard_normal(C).astype(wl.dtype), "B": B}
    if wl.stats:
        return {"X": out["X"]}
    if wl.residual:
        out["Res"] = rng.standard_normal(wl.data).astype(wl.dtype)
    return out


def space_vars(wl: GroupNormWorkload) -> dict:
    units, texels, _ = _units(wl)
    return dict(U=int(np.prod(units)), E=int(np.prod(texels)), data=wl.data, C=wl.data[1], groups=wl.groups,
                stats=wl.stats)


VARIABLES = dict(U="units: (image, group) pairs, or (image, block of 4 channels) when groups = C",
                 E="texels per unit", data="input shape N,C,H,W", C="channels", groups="groups",
                 stats="chunk partials per unit written (the statistics only, for the convolutions that normalize as they "
                 "read), 0 when the norm is whole")


def fallback(wl: GroupNormWorkload, info) -> ReduceConfig:
    """The schedule's fallback. On a GPU ``reduction.norm_schedule``: one launch of large work-groups unless the
    unit is long; on a CPU, whose few compute units one work-group a unit already fills, one launch unless a
    work-item would read more than MAX_TEXELS_PER_ITEM texels (issue 55)."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", wl.data)])
    if wl.stats:  # the split is the chunk count; the schedule of one chunk; the partials in a buffer
        one = fallback_config({**v, "E": ceil_div(v["E"], wl.stats)}, info, scope, max_split=1)
        return dataclasses.replace(one, split=wl.stats, output_scope="buffer")
    return fallback_config(v, info, scope, norm=True)


def describe(wl: GroupNormWorkload) -> str:
    N, C, H, W = wl.data
    kind = "instance" if wl.groups == C else f"{wl.groups} groups"
    return f"{kind} {N}x{C}x{H}x{W}" + (" +res" if wl.residual else "") + \
        (f" stats/{wl.stats}" if wl.stats else "") + (f" +{wl.activation}" if wl.activation != "none" else "")


def lower(ctx, node, ins):
    """A group_norm node (``passes.fuse_group_norm`` turns torch's Reshape / InstanceNormalization / Reshape
    into one) of an NCHW tensor; scale and bias go to the kernel as (C,) params."""
    shape = ctx.shape(node.inputs[0])
    if len(shape) != 4:
        raise ValueError(f"group_norm on a {len(shape)}-D tensor {tuple(shape)}: only NCHW inputs have a kernel (a "
                         f"GroupNorm exported as Reshape(N, G, -1) -> InstanceNormalization -> Reshape back is fused "
                         f"into one when the reshapes are exactly that)")
    wl = GroupNormWorkload(shape, int(node.attrs["groups"]), float(node.attrs["epsilon"]), ctx.dtype,
                           node.attrs.get("activation", "none"), residual=node.attrs.get("residual") is not None,
                           stats=int(node.attrs.get("stats", 0)))
    inputs, extra = {"X": ins[0]}, {}
    if wl.stats:  # passes_layer_norm: the statistics only, the readers normalize
        return wl, inputs, extra
    if wl.residual:  # passes.fuse_epilogues: y = norm(x) + another activation
        inputs["Res"] = ctx.packed(node.attrs["residual"])
    for key, t in zip(("S", "B"), node.inputs[1:]):
        inputs[key] = f"{node.name}.{key.lower()}"
        extra[inputs[key]] = np.ascontiguousarray(np.asarray(ctx.graph.params[t], np.float32).reshape(-1))
    if wl.activation == "prelu":  # the slopes after the biases padded to whole blocks (common.bias_length)
        c = shape[1]
        packed = np.zeros(bias_length(wl, c), np.float32)
        packed[:c] = extra[inputs["B"]]
        packed[packed.size // 2:packed.size // 2 + c] = np.asarray(ctx.graph.params[node.attrs["slope"]]).reshape(-1)
        extra[inputs["B"]] = packed
    return wl, inputs, extra


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("groups", "int", "G", "channel groups (C: InstanceNorm)", required=True),
                 *(a for a in EPILOGUE_ARGS if a.name in ("activation", "dtype")))
TEMPLATE = Template("group_norm", GroupNormWorkload, ReduceConfig, group_norm, reference, random_inputs, fallback,
                    space_vars, VARIABLES, features=features, describe=describe, workload_args=WORKLOAD_ARGS,
                    graph_ops=("group_norm",), lower=lower)
