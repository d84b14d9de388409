"""Reductions over the channels of each position: ``layer_norm`` (LayerNormalization over axis 1 of NCHW or of
(N, K): a transformer's tokens) and ``softmax`` (over axis 1: attention's rows, once the token passes put the
reduced axis there).

A unit is one position (n, h, w) -- or one row n of (N, K) -- and its texels are the channel blocks. The
schedule is ``templates/reduction.py``'s without the split (a row is at most a few thousand channels): L
work-items share a row through the local-memory tree, P rows sit side by side in a work-group (L = 1, P = 64 is
one work-item per row, the old glue kernel's shape). The padding lanes of the last block are left out of the
statistics and written as zero.

- layer_norm: one read of shifted sums (d = x - the row's first element), then each work-item writes its
  blocks ``(x - mean) / sqrt(var + epsilon) * G[c] + Bt[c]``.
- softmax: the row's max (tree), the sum of exp(x - max) (tree), then exp(x - max) / sum written.
"""
from __future__ import annotations

from contextlib import nullcontext
import dataclasses
from dataclasses import dataclass

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Broadcast, ExtractLane, Ramp, as_expr, call, max_, select
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, part_block, texture_scopes
from tuner.ir.kernel import Program
from tuner.templates.reduction import (LOWEST, ReduceConfig, SameShapeWorkload, Schedule, as_stored, ceil_div,
                                       fallback_config, features, hsum, merge_group_statistics, packed,
                                       shifted_moments, stats_workspaces, unit_statistics, unravel, welford_merge)


@dataclass(frozen=True)
class LayerNormWorkload(SameShapeWorkload):
    """Canonical key: the NCHW or (N, K) input (normalized over axis 1) and epsilon."""
    OP, FLOPS = "layer_norm", 4
    data: tuple
    epsilon: float = 1e-5
    dtype: str = "float32"
    activation: str = "none"  # fused after the affine
    in_read: tuple = ()  # an NCHW input read in channel parts (a concat of them, no kernel for it:
    # ``tuner.plan.input_views``): per part (channels, at, of) -- its channels are channels [at, at + channels) of
    # a tensor of ``of`` (a slice read in place; at a multiple of 4); X, X1, X2, X3; every part but the last a
    # multiple of 4 channels. In the key (as text) when set
    out_stats: bool = False  # the output's GroupNorm(1) statistics too, in ``St`` (float32 (N * 2, 4),
    # ``Conv2dWorkload.out_stats``' format: ``reduction.last_group_statistics``) -- the LayerNorm after a stem that a
    # block's GroupNorm(1) reads (PoolFormerV2's), so that no launch is left for that norm's statistics. NCHW;
    # not in the key (the record of the workload without it applies; the space keeps each work-group in one image)

    def __post_init__(self):
        _check(self, "layer_norm")
        if self.out_stats and len(self.data) != 4:
            raise ValueError(f"layer_norm out_stats: the GroupNorm(1) statistics of an NCHW output, not of "
                             f"{list(self.data)}")
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "activation", canonical(self.activation))
        if self.in_read:
            object.__setattr__(self, "in_read", _checked_parts(self))

    def key(self) -> dict:
        key = super().key()
        key.pop("out_stats", None)
        if self.in_read:
            key["in_read"] = ";".join(",".join(map(str, p)) for p in self.in_read)
        else:
            key.pop("in_read", None)
        return key


@dataclass(frozen=True)
class SoftmaxWorkload(SameShapeWorkload):
    """Canonical key: the NCHW or (N, K) input (softmax over axis 1)."""
    OP, FLOPS = "softmax", 3
    data: tuple
    dtype: str = "float32"

    def __post_init__(self):
        _check(self, "softmax")


def _check(wl, what: str) -> None:
    object.__setattr__(wl, "data", tuple(int(x) for x in wl.data))
    if len(wl.data) not in (2, 4) or min(wl.data) < 1:
        raise ValueError(f"{what} data {list(wl.data)}: want a positive 4-D NCHW or 2-D (N, K) shape (axis 1 reduced)")
    if wl.dtype not in ("float32", "float16"):
        raise ValueError(f"dtype {wl.dtype!r}: float32 or float16 storage")


def _checked_parts(wl) -> tuple:
    """``in_read`` as (channels, at, of) int triples (from them or the key's text), or a ValueError naming what is
    wrong."""
    raw = wl.in_read
    if isinstance(raw, str):
        raw = [p.split(",") for p in raw.split(";")]
    try:
        parts = tuple((int(c), int(at), int(of)) for c, at, of in raw)
    except (TypeError, ValueError):
        raise ValueError(f"layer_norm in_read {wl.in_read!r}: parts (channels, at, of)") from None
    if len(wl.data) != 4 or not 1 <= len(parts) <= 4 or sum(p[0] for p in parts) != wl.data[1] \
            or any(c % 4 for c, _, _ in parts[:-1]) or any(c < 1 or at % 4 or at < 0 or at + c > of
                                                          for c, at, of in parts):
        raise ValueError(f"layer_norm in_read {list(parts)}: 1 to 4 parts (channels, at, of) of an NCHW input of "
                         f"{wl.data[1]} channels, every part but the last a multiple of 4, at a multiple of 4 with the "
                         f"part inside its tensor")
    return parts


def _rows(wl) -> tuple:
    """(unit grid: the positions, texels per unit: the channel blocks)."""
    return (wl.data[0], *wl.data[2:]), ceil_div(wl.data[1], 4)


def _hmax(v):
    return max_(max_(ExtractLane(v, 0), ExtractLane(v, 1)), max_(ExtractLane(v, 2), ExtractLane(v, 3)))


class _Row:
    """What both templates do with one row: its operands, texel addresses and the padding-lane mask."""

    def __init__(self, wl, cfg):
        self.wl, self.C = wl, wl.data[1]
        self.units, self.E = _rows(wl)
        self.sched = Schedule(int(np.prod(self.units)), self.E, cfg)
        self.parts = getattr(wl, "in_read", ()) or ((wl.data[1], 0, wl.data[1]),)
        self.Xs = [packed("X" if i == 0 else f"X{i}", (wl.data[0], of, *wl.data[2:]), wl.dtype, cfg.input_scope)
                   for i, (_, _, of) in enumerate(self.parts)]
        self.X = self.Xs[0]
        self.Y = packed("Y", wl.data, wl.dtype, cfg.output_scope)

    def at(self, b, u, e):
        n, *rest = unravel(b, u, self.units, self.sched.tag("u"))
        return (n, Ramp(e * 4, as_expr(1), 4), *rest)

    def load(self, idx, e):
        """The input's pixel of channel block ``e`` at ``idx`` (``at``'s): X's, or with ``in_read`` that of the part
        holding the block, at its offset in its tensor."""
        if len(self.parts) == 1 and self.parts[0][1] == 0:
            return self.X[idx]
        cases, first = [], 0
        for (c, at, _), X in zip(self.parts, self.Xs):
            blocks = -(-c // 4)
            local = part_block(e, first, blocks, at)
            cases.append((first + blocks, X[(idx[0], Ramp(local * 4, as_expr(1), 4), *idx[2:])]))
            first += blocks
        out = cases[-1][1]
        for bound, v in reversed(cases[:-1]):
            out = select(e < bound, v, out)
        return out

    def mask(self, e, v, fill: float):
        """``v`` (block ``e``'s pixel) with the lanes past C set to ``fill``."""
        rem = self.C % 4
        if not rem:
            return v
        last = e < self.E - 1
        return call("make_vector", [ExtractLane(v, j) if j < rem else select(last, ExtractLane(v, j), as_expr(fill))
                                    for j in range(4)], "float32x4")


def layer_norm(wl: LayerNormWorkload, cfg: ReduceConfig):
    r = _Row(wl, cfg)
    G, Bt = (buffer(name, (r.C,), wl.dtype, *(("texture:weight", "mace_argument") if cfg.weight_scope == "texture"
                                               else ("global", "bias4_buffer"))) for name in ("G", "Bt"))
    sched, X = r.sched, r.X
    N, HW = wl.data[0], int(np.prod(wl.data[2:]))
    slots = ceil_div(HW, sched.P)  # work-groups an image (out_stats: the space keeps each in one image)
    if wl.out_stats and N > 1 and HW % sched.P:
        raise ValueError(f"layer_norm out_stats: units_per_wg={sched.P} does not divide the {HW} positions of an "
                         "image, so a work-group would hold two images")
    St = buffer("St", (N * 2, 4), "float32", "global") if wl.out_stats else None
    work = stats_workspaces(N, slots) if St is not None else []
    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        K = b.let("K", Broadcast(ExtractLane(r.load(r.at(b, u, as_expr(0)), as_expr(0)), 0), 4))
        acc = b.allocate("acc", (2,), "float32x4", "private")
        b.store(acc, 0, 0.0)
        b.store(acc, 1, 0.0)
        with sched.elements(b, c, lid) as e:
            d = b.let("d", r.mask(e, r.load(r.at(b, u, e), e) - K, 0.0))
            b.store(acc, 0, acc[0] + d)
            b.store(acc, 1, acc[1] + d * d)
        s, q = sched.tree(b, [acc[0], acc[1]], lambda x, y: x + y, lid, p)
        m, rstd = shifted_moments(b, hsum(s), hsum(q), r.C, wl.epsilon)
        mean = b.let("mean", K + m)
        def normed(idx, e):
            return r.mask(e, apply_ir(wl.activation, (r.load(idx, e) - mean) * (rstd * G[idx[1]]) + Bt[idx[1]]), 0.0)
        run = b.allocate("srun", (1,), "float32x4", "private") if St is not None else None
        if run is not None:  # this work-item's (count, mean, M2) of what it writes
            b.store(run, 0, Broadcast(as_expr(0.0), 4))
        with b.if_(sched.valid) if sched.valid is not None else nullcontext():
            with sched.elements(b, c, lid) as e:
                idx = r.at(b, u, e)
                y = b.let("y", normed(idx, e))
                b.store(r.Y, idx, y)
                if run is not None:  # a texel's (count, mean, M2), merged into the work-item's
                    m = b.let("ym", r.mask(e, Broadcast(as_expr(1.0), 4), 0.0))
                    cnt = b.let("yc", hsum(m))
                    mu = b.let("yu", hsum(y * m) / max_(cnt, 1.0))
                    dv = b.let("yd", (y - Broadcast(mu, 4)) * m)
                    texel = b.let("yt", call("make_vector", [cnt, mu, hsum(dv * dv), as_expr(0.0)], "float32x4"))
                    b.store(run, 0, welford_merge(b.let("yr", run[0]), texel))
        if St is not None:  # the image's statistics from its work-groups, the last to finish merging them
            sched.pass_no += 1  # the unit's indices again, under lets of their own (``Schedule.tag``)
            first = as_stored(normed(r.at(b, u, as_expr(0)), as_expr(0)), wl.dtype)  # K: block 0 of the first unit
            slot = sched.group % slots if N > 1 else sched.group
            merge_group_statistics(b, run[0], (slot.equal(0), first), p * sched.L + lid, sched.L * sched.P,
                                   sched.group // slots if N > 1 else as_expr(0), slot, slots, *work, St)
    if St is None:
        return b.kernel("layer_norm", [*r.Xs, G, Bt, r.Y])
    kernel = b.kernel("layer_norm", [*r.Xs, G, Bt, r.Y, St, *work])  # the statistics' slots and counters: workspaces
    return Program(kernel.name, (kernel,), (*r.Xs, G, Bt, r.Y, St), tuple(work))


def softmax(wl: SoftmaxWorkload, cfg: ReduceConfig):
    r = _Row(wl, cfg)
    sched, X = r.sched, r.X
    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        acc = b.allocate("acc", (1,), "float32x4", "private")
        b.store(acc, 0, LOWEST)
        with sched.elements(b, c, lid) as e:
            b.store(acc, 0, max_(acc[0], r.mask(e, X[r.at(b, u, e)], LOWEST)))
        vmax, = sched.tree(b, [acc[0]], max_, lid, p, name="mx")
        m = b.let("rowmax", _hmax(vmax))
        b.store(acc, 0, 0.0)
        with sched.elements(b, c, lid) as e:
            b.store(acc, 0, acc[0] + r.mask(e, call("exp", [X[r.at(b, u, e)] - m], "float32x4"), 0.0))
        vsum, = sched.tree(b, [acc[0]], lambda x, y: x + y, lid, p, name="sm")
        inv = b.let("inv", 1.0 / hsum(vsum))
        with b.if_(sched.valid) if sched.valid is not None else nullcontext():
            with sched.elements(b, c, lid) as e:
                idx = r.at(b, u, e)
                b.store(r.Y, idx, r.mask(e, call("exp", [X[idx] - m], "float32x4") * inv, 0.0))
    return b.kernel("softmax", [X, r.Y])


def _ln_reference(wl, inputs: dict) -> np.ndarray:
    x = np.asarray(inputs["X"], np.float64)
    if wl.in_read:  # the parts' channels, concatenated
        x = np.concatenate([np.asarray(inputs["X" if i == 0 else f"X{i}"], np.float64)[:, at:at + c]
                            for i, (c, at, _) in enumerate(wl.in_read)], axis=1)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    form = (1, -1) + (1,) * (x.ndim - 2)
    y = apply_numpy(wl.activation, (x - mean) / np.sqrt(var + wl.epsilon) * np.reshape(inputs["G"], form) +
                    np.reshape(inputs["Bt"], form))
    return {"Y": y, "St": unit_statistics(y, 1)} if wl.out_stats else y


def _softmax_reference(wl, inputs: dict) -> np.ndarray:
    x = np.asarray(inputs["X"], np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _ln_inputs(wl, rng) -> dict:
    C = wl.data[1]
    out = {"X": (rng.standard_normal(wl.data) * 2.0 + 3.0).astype(wl.dtype),
           "G": rng.standard_normal(C).astype(wl.dtype), "Bt": rng.standard_normal(C).astype(wl.dtype)}
    for i, (_, _, of) in enumerate(wl.in_read):  # the parts' tensors
        shape = (wl.data[0], of, *wl.data[2:])
        out["X" if i == 0 else f"X{i}"] = (rng.standard_normal(shape) * 2.0 + 3.0).astype(wl.dtype)
    return out


def _softmax_inputs(wl, rng) -> dict:
    return {"X": (rng.standard_normal(wl.data) * 3.0).astype(wl.dtype)}


def space_vars(wl) -> dict:
    units, E = _rows(wl)
    return dict(U=int(np.prod(units)), E=E, data=wl.data, C=wl.data[1], N=wl.data[0],
                layout="nchw4c" if len(wl.data) == 4 else "row4", out_stats=bool(getattr(wl, "out_stats", False)))


VARIABLES = dict(U="rows: positions (n, h, w), or rows n of (N, K)", E="channel blocks of 4 per row", N="batch",
                 out_stats="layer_norm: the output's GroupNorm(1) statistics written too (a work-group in one image)",
                 data="input shape", C="channels (the reduced axis)", layout="the texture layout of X and Y")


def fallback(wl, info) -> ReduceConfig:
    v = space_vars(wl)
    cfg = fallback_config(v, info, texture_scopes(wl, info, [(v["layout"], wl.data)]), max_split=1)
    P = cfg.units_per_wg
    while v["out_stats"] and v["N"] > 1 and (v["U"] // v["N"]) % P:  # a work-group in one image
        P //= 2
    return dataclasses.replace(cfg, units_per_wg=P)


def _describe(what):
    return lambda wl: (f"{what} over {wl.data[1]} of {'x'.join(map(str, wl.data))}"
                       + (f" +{wl.activation}" if getattr(wl, "activation", "none") != "none" else ""))


def _lower(make):
    def lower(ctx, node, ins):
        """The node over axis 1 of an NCHW or (N, K) tensor (the token and NHWC passes put it there)."""
        shape = ctx.shape(node.inputs[0])
        if node.attrs.get("axis", 1) != 1 or len(shape) not in (2, 4):
            raise ValueError(f"{node.op} over axis {node.attrs.get('axis')} of a {len(shape)}-D tensor; only axis 1 of "
                             f"NCHW or (N, K) tensors has a kernel (the token passes move the axis there)")
        return make(ctx, node, ins, shape)
    return lower


def _lower_ln(ctx, node, ins, shape):
    g = ctx.graph
    extra = {f"{node.name}.gamma": np.asarray(g.params[node.inputs[1]], np.float32).reshape(-1),
             f"{node.name}.beta": np.asarray(g.params[node.inputs[2]], np.float32).reshape(-1)}
    wl = LayerNormWorkload(shape, float(node.attrs.get("epsilon", 1e-5)), ctx.dtype,
                           node.attrs.get("activation", "none"), out_stats=bool(node.attrs.get("out_stats")))
    return wl, {"X": ins[0], "G": f"{node.name}.gamma", "Bt": f"{node.name}.beta"}, extra


def _lower_softmax(ctx, node, ins, shape):
    return SoftmaxWorkload(shape, ctx.dtype), {"X": ins[0]}, {}


ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape (axis 1 reduced; or N,K)", required=True),
        WorkloadArg("dtype", "dtype", help="storage dtype (accumulation is float32)"))
LN_ARGS = ARGS + tuple(a for a in EPILOGUE_ARGS if a.name == "activation")
LAYER_NORM = Template("layer_norm", LayerNormWorkload, ReduceConfig, layer_norm, _ln_reference, _ln_inputs, fallback,
                      space_vars, VARIABLES, space_file="channel_reduce", features=features,
                      describe=_describe("layer norm"), workload_args=LN_ARGS, graph_ops=("layer_norm",),
                      lower=_lower(_lower_ln), side_outputs=("St",))
SOFTMAX = Template("softmax", SoftmaxWorkload, ReduceConfig, softmax, _softmax_reference, _softmax_inputs, fallback,
                   space_vars, VARIABLES, space_file="channel_reduce", features=features,
                   describe=_describe("softmax"), workload_args=ARGS, graph_ops=("softmax",),
                   lower=_lower(_lower_softmax))
