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

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Broadcast, ExtractLane, Ramp, as_expr, call, max_, min_, select
from tuner.ir.kernel import Program
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, texture_scopes
from tuner.templates.reduction import (ReduceConfig, SameShapeWorkload, Schedule, ceil_div, each_index, fallback_config,
                                       features, hsum, packed, unravel)


@dataclass(frozen=True)
class GroupNormWorkload(SameShapeWorkload):
    """Canonical key: the NCHW input, the group count and epsilon."""
    OP, FLOPS = "group_norm", 4
    data: tuple
    groups: int
    epsilon: float = 1e-5
    dtype: str = "float32"
    activation: str = "none"  # fused after the affine (InstanceNorm -> ReLU, GroupNorm -> SiLU)

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
    if _mixed(wl):  # the most blocks a group touches
        blocks = max(((g + 1) * cg - 1) // 4 - g * cg // 4 + 1 for g in range(G))
    else:
        blocks = ceil_div(C, 4) if G == 1 else cg // 4
    return (N, G), (blocks, H, W), False


def _sum_partials(b, part, u, T: int):
    """A private (sum d, sum d^2) pair of float4s: unit ``u``'s T chunk partials in the workspace ``part``."""
    vec = Ramp(as_expr(0), as_expr(1), 4)
    acc = b.allocate("acc", (2,), "float32x4", "private")
    b.store(acc, 0, 0.0)
    b.store(acc, 1, 0.0)
    with b.loop("t", T, "serial") as t:
        b.store(acc, 0, acc[0] + part[(u * T + t) * 2, vec])
        b.store(acc, 1, acc[1] + part[(u * T + t) * 2 + 1, vec])
    return acc


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
    X, S, B, Y = _operands(wl, cfg)
    part = buffer("part", (U * T * 2, 4), "float32", "global") if T > 1 else None
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
            b.store(Y, idx, apply_ir(wl.activation, (X[idx] - mean) * (rstd * S[idx[1]]) + B[idx[1]]))

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
        if T == 1:
            with b.if_(sched.valid) if sched.valid is not None else nullcontext():
                normalize(b, u, c, lid, K, s, q)
        else:
            cond = sched.is_writer(lid)
            with b.if_(cond) if cond is not None else nullcontext():
                b.store(part, ((u * T + c) * 2, vec), s)
                b.store(part, ((u * T + c) * 2 + 1, vec), q)
    name = "instance_norm" if per_lane else "group_norm"
    if T == 1:
        return b.kernel(name, [X, S, B, Y])
    first = b.kernel(f"{name}_stats", [X, part])
    b = Builder()  # every chunk again: its unit's T partials combined, its texels normalized
    with sched.items(b) as (u, c, lid, p):
        K = shift(b, u)
        acc = _sum_partials(b, part, u, T)
        with b.if_(sched.valid) if sched.valid is not None else nullcontext():
            normalize(b, u, c, lid, K, acc[0], acc[1])
    second = b.kernel(f"{name}_apply", [X, S, B, part, Y])
    return Program(name, (first, second), (X, S, B, Y), (part,))


def _operands(wl, cfg) -> tuple:
    C = wl.data[1]
    S, B = (buffer(name, (C,), wl.dtype, *(("texture:weight", "mace_argument") if cfg.weight_scope == "texture"
                                            else ("global", "bias4_buffer"))) for name in ("S", "B"))
    return packed("X", wl.data, wl.dtype, cfg.input_scope), S, B, packed("Y", wl.data, wl.dtype, cfg.output_scope)


def _group_norm_mixed(wl: GroupNormWorkload, cfg: ReduceConfig) -> Program:
    """Groups that share blocks: a unit (image, group) reads the blocks its channels touch, its lanes outside
    the group masked; its chunks' sums go to a workspace, a second kernel (one work-item per unit) turns them
    into the group's mean and 1/std, and a third, one work-item per pixel, normalizes each lane with its own
    group's statistics (a pixel may hold two groups, so no unit can write it alone)."""
    N, C, H, W = wl.data
    G, cg, CB = wl.groups, C // wl.groups, ceil_div(C, 4)
    units, texels, _ = _units(wl)
    U, E, T = N * G, int(np.prod(texels)), cfg.split
    sched = Schedule(U, E, cfg)
    X, S, B, Y = _operands(wl, cfg)
    part = buffer("part", (U * T * 2, 4), "float32", "global")
    stats = buffer("stats", (U, 4), "float32", "global")  # (mean, 1/std, 0, 0) per unit
    vec = Ramp(as_expr(0), as_expr(1), 4)

    def shift(b, u):
        """The unit's image, first channel, and the value of that channel at (0, 0): the sums' shift."""
        n, g = unravel(b, u, units, "u")
        c0 = b.let("c0", g * cg)
        first = b.let("first", X[n, Ramp((c0 // 4) * 4, as_expr(1), 4), 0, 0])
        j0 = b.let("j0", c0 % 4)
        K = select(j0 < 1, ExtractLane(first, 0), select(j0 < 2, ExtractLane(first, 1),
                                                          select(j0 < 3, ExtractLane(first, 2), ExtractLane(first, 3))))
        return n, c0, b.let("K", K)

    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        n, c0, K = shift(b, u)
        acc = b.allocate("acc", (2,), "float32x4", "private")
        b.store(acc, 0, 0.0)
        b.store(acc, 1, 0.0)
        with sched.elements(b, c, lid) as e:
            cbi, h, w = unravel(b, e, texels, "t")
            cb = b.let("cb", c0 // 4 + cbi)
            x = X[n, Ramp(min_(cb, CB - 1) * 4, as_expr(1), 4), h, w]
            keep = call("make_vector", [select((cb * 4 + j >= c0) & (cb * 4 + j < c0 + cg), as_expr(1.0), as_expr(0.0))
                                        for j in range(4)], "float32x4")
            d = b.let("d", (x - K) * keep)
            b.store(acc, 0, acc[0] + d)
            b.store(acc, 1, acc[1] + d * d)
        s, q = sched.tree(b, [acc[0], acc[1]], lambda x, y: x + y, lid, p)
        cond = sched.is_writer(lid)
        with b.if_(cond) if cond is not None else nullcontext():
            b.store(part, ((u * T + c) * 2, vec), s)
            b.store(part, ((u * T + c) * 2 + 1, vec), q)
    first = b.kernel("group_norm_stats", [X, part])

    count = cg * H * W
    b = Builder()
    with each_index(b, U, "u") as u:
        _, _, K = shift(b, u)
        acc = _sum_partials(b, part, u, T)
        m = b.let("m", hsum(acc[0]) * (1.0 / count))
        var = max_(hsum(acc[1]) * (1.0 / count) - m * m, 0.0)
        b.store(stats, (u, vec), call("make_vector", [K + m, call("rsqrt", [var + wl.epsilon], "float32"),
                                                      as_expr(0.0), as_expr(0.0)], "float32x4"))
    second = b.kernel("group_norm_finalize", [X, part, stats])

    b = Builder()
    pixels = N * CB * H * W
    with each_index(b, pixels, "i") as i:
        n, cb, h, w = unravel(b, i, (N, CB, H, W), "x")
        ch = Ramp(cb * 4, as_expr(1), 4)
        st = [b.let(f"st{j}", stats[n * G + min_(cb * 4 + j, C - 1) // cg, vec]) for j in range(4)]
        mean = call("make_vector", [ExtractLane(v, 0) for v in st], "float32x4")
        rstd = call("make_vector", [ExtractLane(v, 1) for v in st], "float32x4")
        b.store(Y, (n, ch, h, w), apply_ir(wl.activation, (X[n, ch, h, w] - mean) * (rstd * S[ch]) + B[ch]))
    third = b.kernel("group_norm_apply", [X, S, B, stats, Y])
    return Program("group_norm", (first, second, third), (X, S, B, Y), (part, stats))


def reference(wl: GroupNormWorkload, inputs: dict) -> np.ndarray:
    x = np.asarray(inputs["X"], np.float64)
    xg = x.reshape(x.shape[0], wl.groups, -1)
    mean = xg.mean(axis=2, keepdims=True)
    var = ((xg - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + wl.epsilon)).reshape(x.shape)
    return apply_numpy(wl.activation, y * np.asarray(inputs["S"], np.float64).reshape(1, -1, 1, 1) +
                       np.asarray(inputs["B"], np.float64).reshape(1, -1, 1, 1))


def random_inputs(wl: GroupNormWorkload, rng) -> dict:
    """X with a mean far from zero (what the shifted sums are for), S and B of both signs."""
    C = wl.data[1]
    return {"X": (rng.standard_normal(wl.data) * 2.0 + 3.0).astype(wl.dtype),
            "S": rng.standard_normal(C).astype(wl.dtype), "B": rng.standard_normal(C).astype(wl.dtype)}


def space_vars(wl: GroupNormWorkload) -> dict:
    units, texels, _ = _units(wl)
    return dict(U=int(np.prod(units)), E=int(np.prod(texels)), data=wl.data, C=wl.data[1], groups=wl.groups)


VARIABLES = dict(U="units: (image, group) pairs, or (image, block of 4 channels) when groups = C",
                 E="texels per unit", data="input shape N,C,H,W", C="channels", groups="groups")


def fallback(wl: GroupNormWorkload, info) -> ReduceConfig:
    return fallback_config(space_vars(wl), info, texture_scopes(wl, info, [("nchw4c", wl.data)]), fill_short=True)


def describe(wl: GroupNormWorkload) -> str:
    N, C, H, W = wl.data
    kind = "instance" if wl.groups == C else f"{wl.groups} groups"
    return f"{kind} {N}x{C}x{H}x{W}" + (f" +{wl.activation}" if wl.activation != "none" else "")


def lower(ctx, node, ins):
    """A group_norm node (``passes.fuse_group_norm`` turns torch's Reshape / InstanceNormalization / Reshape
    into one) of an NCHW tensor; scale and bias go to the kernel as (C,) params."""
    shape = ctx.shape(node.inputs[0])
    if len(shape) != 4:
        raise ValueError(f"group_norm on a {len(shape)}-D tensor {tuple(shape)}: only NCHW inputs have a kernel (a "
                         f"GroupNorm exported as Reshape(N, G, -1) -> InstanceNormalization -> Reshape back is fused "
                         f"into one when the reshapes are exactly that)")
    wl = GroupNormWorkload(shape, int(node.attrs["groups"]), float(node.attrs["epsilon"]), ctx.dtype,
                           node.attrs.get("activation", "none"))
    inputs, extra = {"X": ins[0]}, {}
    for key, t in zip(("S", "B"), node.inputs[1:]):
        inputs[key] = f"{node.name}.{key.lower()}"
        extra[inputs[key]] = np.ascontiguousarray(np.asarray(ctx.graph.params[t], np.float32).reshape(-1))
    return wl, inputs, extra


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("groups", "int", "G", "channel groups (C: InstanceNorm)", required=True),
                 *(a for a in EPILOGUE_ARGS if a.name in ("activation", "dtype")))
TEMPLATE = Template("group_norm", GroupNormWorkload, ReduceConfig, group_norm, reference, random_inputs, fallback,
                    space_vars, VARIABLES, features=features, describe=describe, workload_args=WORKLOAD_ARGS,
                    graph_ops=("group_norm",), lower=lower)
