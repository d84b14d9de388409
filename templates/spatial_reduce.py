"""Spatial reduction: global average / max pooling and ReduceMean / ReduceMax / ReduceSum / ReduceL2 of NCHW over
(H, W), H alone or W alone -- ``scale`` times the mean, the max or the L2 norm (the square root of the sum of
squares) of each channel. ReduceSum is the mean with ``scale`` = the element count.

A unit is one output pixel: 4 channels of one image (and of the kept spatial position when one axis is kept);
its texels are the reduced positions. Lanes never mix, so the input's padding lanes reach only the output's.
The schedule (``templates/reduction.py``): L work-items per unit meet in a local-memory tree, P units per
work-group, and a split into T chunks whose partial results a second kernel combines."""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Broadcast, ExtractLane, Ramp, as_expr, call, max_
from tuner.ir.kernel import Program
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, texture_scopes
from tuner.templates.reduction import (LOWEST, ReduceConfig, Schedule, ceil_div, each_index, fallback_config,
                                       features, packed, unravel)

KINDS = ("mean", "max", "l2")
WEIGHTS = ("none", "pixel", "same", "softmax")  # the prologue's weights Q (``SpatialReduceWorkload.weight``)
AXES = ((2, 3), (2,), (3,))


@dataclass(frozen=True)
class SpatialReduceWorkload:
    """Canonical key: the NCHW input, the reduction, its axes and whether the output keeps rank 4."""
    data: tuple
    kind: str = "mean"
    axes: tuple = (2, 3)
    keepdims: bool = True
    scale: float = 1.0
    dtype: str = "float32"
    activation: str = "none"  # fused after the reduction (a pool's HardSwish, issue 55); in the key only when set
    weight: str = "none"  # a prologue: X times a second input Q of shape "pixel" (N, 1, H, W: one weight a position,
    # MobileViTv2's context scores) or "same" (X's shape) as it is read -- a mean or sum of a product; the key
    # has it only when set
    in_view: tuple = ()  # (offset, channels): X is channels [offset, offset + C) of a larger tensor of ``channels``
    # (a channel slice read in place, ``passes_movement.slices_read_in_place``); not in the key: the same loop nest
    softmax_of: tuple = ()  # with weight "softmax": (channel, channels): the weights are the softmax over the reduced
    # positions of channel ``channel`` of Q, a tensor of ``channels`` channels (X's N, H, W) -- MobileViTv2's
    # context scores, computed in the reduction instead of their own kernels (``passes_attention``); in the key

    def __post_init__(self):
        object.__setattr__(self, "data", tuple(int(x) for x in self.data))
        object.__setattr__(self, "activation", canonical(self.activation))
        object.__setattr__(self, "axes", tuple(sorted(int(a) for a in self.axes)))
        object.__setattr__(self, "keepdims", bool(self.keepdims))
        object.__setattr__(self, "scale", float(self.scale))
        if len(self.data) != 4 or min(self.data) < 1:
            raise ValueError(f"spatial_reduce data {list(self.data)}: want a positive 4-D NCHW shape")
        if self.kind not in KINDS:
            raise ValueError(f"spatial_reduce kind {self.kind!r}: one of {', '.join(KINDS)} (a sum is the mean "
                             f"with scale = the count)")
        if self.axes not in AXES:
            raise ValueError(f"spatial_reduce axes {list(self.axes)}: [2, 3], [2] or [3] (H and W, H, or W)")
        if not self.keepdims and self.axes != (2, 3):
            raise ValueError("spatial_reduce over one spatial axis keeps the rank (keepdims=1)")
        if self.in_view and (len(self.in_view) != 2 or self.in_view[0] % 4 or
                             self.in_view[0] + self.data[1] > self.in_view[1]):
            raise ValueError(f"spatial_reduce in_view {self.in_view}: (offset, channels), the offset a multiple of 4 "
                             f"and the {self.data[1]} channels inside")
        if self.weight not in WEIGHTS or (self.weight != "none" and self.kind != "mean"):
            raise ValueError(f"spatial_reduce weight {self.weight!r}: none, or pixel / same / softmax for a mean or "
                             f"sum")
        object.__setattr__(self, "softmax_of", tuple(int(v) for v in self.softmax_of))
        if (self.weight == "softmax") != bool(self.softmax_of) or (self.softmax_of and (
                len(self.softmax_of) != 2 or not 0 <= self.softmax_of[0] < self.softmax_of[1])):
            raise ValueError(f"spatial_reduce softmax_of {list(self.softmax_of)}: (channel, channels) of Q, given with "
                             f"weight softmax only")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")

    @property
    def out_shape(self) -> tuple:
        N, C, H, W = self.data
        if not self.keepdims:
            return (N, C)
        return (N, C, 1 if 2 in self.axes else H, 1 if 3 in self.axes else W)

    @property
    def flops(self) -> int:
        return int(np.prod(self.data))

    def key(self) -> dict:
        return {"op": "spatial_reduce", **{k: list(v) if isinstance(v, tuple) else v
                                           for k, v in asdict(self).items()
                                           if (k not in ("activation", "weight") or v != "none") and k != "in_view"
                                           and (k != "softmax_of" or v)}}


def _grid(wl) -> tuple:
    """(unit grid, reduced extents): units over (N, C blocks, kept H, kept W), texels over (reduced H, W)."""
    N, C, H, W = wl.data
    kept = (N, ceil_div(C, 4), 1 if 2 in wl.axes else H, 1 if 3 in wl.axes else W)
    return kept, (H if 2 in wl.axes else 1, W if 3 in wl.axes else 1)


def spatial_reduce(wl: SpatialReduceWorkload, cfg: ReduceConfig):
    units, reduced = _grid(wl)
    U, E = int(np.prod(units)), int(np.prod(reduced))
    sched = Schedule(U, E, cfg)
    X = packed("X", input_shape(wl), wl.dtype, cfg.input_scope)
    Y = packed("Y", wl.out_shape, wl.dtype, cfg.output_scope)
    at = wl.in_view[0] // 4 if wl.in_view else 0  # the slice's first block in X
    Q = packed("Q", weight_shape(wl), wl.dtype, cfg.input_scope) if wl.weight != "none" else None
    mx = wl.kind == "max"
    ident = LOWEST if mx else 0.0
    combine = (lambda a, v: max_(a, v)) if mx else (lambda a, v: a + v)

    def finish(v):
        if wl.kind == "mean":
            return apply_ir(wl.activation, v * (wl.scale / E))
        v = call("sqrt", [v], "float32x4") if wl.kind == "l2" else v
        return apply_ir(wl.activation, v * wl.scale if wl.scale != 1.0 else v)

    def store(b, u, v):
        n, cb, hk, wk = unravel(b, u, units, "o")
        lanes = Ramp(cb * 4, as_expr(1), 4)
        b.store(Y, (n, lanes) if not wl.keepdims else (n, lanes, hk, wk), finish(v))

    T = cfg.split
    if wl.weight == "softmax":
        if T > 1:
            raise ValueError("weight softmax needs split 1: the softmax's max and sum are over every reduced position")
        return _softmax_weighted(wl, cfg, sched, units, reduced, X, Q, Y, at, store)
    part = buffer("part", (U * T, 4), "float32", "global") if T > 1 else None
    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        acc = b.allocate("acc", (1,), "float32x4", "private")
        b.store(acc, 0, ident)
        n, cb, hk, wk = unravel(b, u, units, "u")
        with sched.elements(b, c, lid) as e:
            hr, wr = unravel(b, e, reduced, "r")
            hw = (hr if 2 in wl.axes else hk, wr if 3 in wl.axes else wk)
            x = X[n, Ramp((cb + at) * 4 if at else cb * 4, as_expr(1), 4), *hw]
            if wl.weight == "pixel":  # channel 0 of Q's first block, the same for every lane
                x = x * Broadcast(ExtractLane(Q[n, Ramp(as_expr(0), as_expr(1), 4), *hw], 0), 4)
            elif wl.weight == "same":
                x = x * Q[n, Ramp(cb * 4, as_expr(1), 4), *hw]
            b.store(acc, 0, combine(acc[0], x * x if wl.kind == "l2" else x))
        total, = sched.tree(b, [acc[0]], combine, lid, p)
        cond = sched.is_writer(lid)
        with b.if_(cond) if cond is not None else nullcontext():
            if T > 1:
                b.store(part, (u * T + c, Ramp(as_expr(0), as_expr(1), 4)), total)
            else:
                store(b, u, total)
    ins = [X] if Q is None else [X, Q]
    first = b.kernel("spatial_reduce" if T == 1 else "spatial_reduce_partial", [*ins, part or Y])
    if T == 1:
        return first
    b = Builder()  # the chunks' partials of a unit combined by one work-item
    with each_index(b, U, "u") as u:
        acc = b.allocate("acc", (1,), "float32x4", "private")
        b.store(acc, 0, ident)
        with b.loop("t", T, "serial") as t:
            b.store(acc, 0, combine(acc[0], part[u * T + t, Ramp(as_expr(0), as_expr(1), 4)]))
        store(b, u, acc[0])
    second = b.kernel("spatial_reduce_combine", [part, Y])
    return Program("spatial_reduce", (first, second), (*ins, Y), (part,))


def _softmax_weighted(wl, cfg, sched, units, reduced, X, Q, Y, at, store):
    """The reduction of X times the softmax over the reduced positions of Q's channel ``softmax_of[0]``: one pass for
    its max, one for the sums of ``x * exp(q - max)`` and of ``exp(q - max)`` (each through the unit's tree), their
    quotient stored (MobileViTv2's context vector: the keys weighted by the softmaxed query)."""
    qc = wl.softmax_of[0]
    b = Builder()
    with sched.items(b) as (u, c, lid, p):
        n, cb, hk, wk = unravel(b, u, units, "u")

        def positions(e):
            hr, wr = unravel(b, e, reduced, sched.tag("r"))
            return (hr if 2 in wl.axes else hk, wr if 3 in wl.axes else wk)

        def q(hw):
            return Broadcast(ExtractLane(Q[n, Ramp(as_expr(qc // 4 * 4), as_expr(1), 4), *hw], qc % 4), 4)
        acc = b.allocate("acc", (2,), "float32x4", "private")
        b.store(acc, 0, LOWEST)
        with sched.elements(b, c, lid) as e:
            b.store(acc, 0, max_(acc[0], q(positions(e))))
        top, = sched.tree(b, [acc[0]], max_, lid, p, name="mx")
        m = b.let("qmax", top)
        b.store(acc, 0, 0.0)
        b.store(acc, 1, 0.0)
        with sched.elements(b, c, lid) as e:
            hw = positions(e)
            w = b.let(f"{sched.tag('w')}e", call("exp", [q(hw) - m], "float32x4"))
            b.store(acc, 0, acc[0] + X[n, Ramp((cb + at) * 4 if at else cb * 4, as_expr(1), 4), *hw] * w)
            b.store(acc, 1, acc[1] + w)
        num, den = sched.tree(b, [acc[0], acc[1]], lambda x, y: x + y, lid, p)
        cond = sched.is_writer(lid)
        with b.if_(cond) if cond is not None else nullcontext():
            store(b, u, num / den)  # the sum of x * softmax(q); ``finish`` scales it as a mean's or a sum's
    return b.kernel("spatial_reduce", [X, Q, Y])


def input_shape(wl) -> tuple:
    """X's shape: the workload's, or the larger tensor an ``in_view`` reads a channel slice of."""
    return (wl.data[0], wl.in_view[1], *wl.data[2:]) if wl.in_view else wl.data


def weight_shape(wl) -> tuple:
    """The shape of the prologue's weights ``Q``: (N, 1, H, W) for ``pixel``, X's for ``same``."""
    N, C, H, W = wl.data
    if wl.weight == "softmax":
        return (N, wl.softmax_of[1], H, W)
    return (N, 1, H, W) if wl.weight == "pixel" else wl.data


def reference(wl: SpatialReduceWorkload, inputs: dict) -> np.ndarray:
    x = np.asarray(inputs["X"], np.float64)
    if wl.in_view:
        x = x[:, wl.in_view[0]:wl.in_view[0] + wl.data[1]]
    if wl.weight == "softmax":  # the softmax of Q's channel over the reduced positions
        q = np.asarray(inputs["Q"], np.float64)[:, wl.softmax_of[0]:wl.softmax_of[0] + 1]
        e = np.exp(q - q.max(axis=wl.axes, keepdims=True))
        x = x * (e / e.sum(axis=wl.axes, keepdims=True))
    elif wl.weight != "none":
        x = x * np.asarray(inputs["Q"], np.float64)
    if wl.kind == "l2":
        return apply_numpy(wl.activation, wl.scale * np.sqrt((x * x).sum(axis=wl.axes, keepdims=wl.keepdims)))
    return apply_numpy(wl.activation, wl.scale * {"mean": np.mean, "max": np.max}[wl.kind](x, axis=wl.axes,
                                                                                           keepdims=wl.keepdims))


def random_inputs(wl: SpatialReduceWorkload, rng) -> dict:
    out = {"X": rng.standard_normal(input_shape(wl)).astype(wl.dtype)}
    if wl.weight != "none":
        out["Q"] = rng.standard_normal(weight_shape(wl)).astype(wl.dtype)
    return out


def space_vars(wl: SpatialReduceWorkload) -> dict:
    units, reduced = _grid(wl)
    return dict(U=int(np.prod(units)), E=int(np.prod(reduced)), data=input_shape(wl), out=wl.out_shape,
                out_layout="nchw4c" if len(wl.out_shape) == 4 else "row4", weight=wl.weight)


VARIABLES = dict(U="units: output pixels (4 channels each)", E="texels reduced per unit",
                 data="input shape N,C,H,W", out="output shape", out_layout="the output's texture layout",
                 weight="the prologue's weights: none, pixel, same or softmax")


def fallback(wl: SpatialReduceWorkload, info) -> ReduceConfig:
    v = space_vars(wl)
    return fallback_config(v, info, texture_scopes(wl, info, [("nchw4c", wl.data), (v["out_layout"], wl.out_shape)]),
                           max_split=1 if wl.weight == "softmax" else 64)


def describe(wl: SpatialReduceWorkload) -> str:
    N, C, H, W = wl.data
    axes = {(2, 3): "HW", (2,): "H", (3,): "W"}[wl.axes]
    scale = f" x{wl.scale:g}" if wl.scale != 1.0 else ""
    return f"{wl.kind}{scale} over {axes} {N}x{C}x{H}x{W}" + ("" if wl.keepdims else " -> 2-D") + \
        (f" *{wl.weight} weights" if wl.weight != "none" else "") + \
        (f" +{wl.activation}" if wl.activation != "none" else "")


def one_window(attrs: dict, shape) -> bool:
    """Whether a windowed pool (avg_pool, max_pool; its ``attrs``) has one window over its whole unpadded NCHW
    input of ``shape``: a global pool, which this template runs (``lower``)."""
    return tuple(attrs["kernel"]) == tuple(shape[2:]) and not any(attrs["padding"]) and not attrs.get("ceil_mode", 0)


def lower(ctx, node, ins):
    """Global pools, pools whose one window covers the whole unpadded input, and ReduceMean / Max / Sum / L2
    over (2, 3), (2,) or (3,) of an NCHW tensor; None for every other pool or reduction (they stay glue)."""
    shape, a = ctx.shape(node.inputs[0]), node.attrs
    if len(shape) != 4:
        return None
    view = ()
    if (a.get("channel_offsets") or (None,))[0] is not None:  # a channel slice of input 0, read in place
        c = ctx.shape(node.outputs[0])[1]
        view, shape = (int(a["channel_offsets"][0]), shape[1]), (shape[0], c, *shape[2:])
    if node.op in ("global_avg_pool", "global_max_pool"):
        wl = SpatialReduceWorkload(shape, "mean" if "avg" in node.op else "max", (2, 3), True, dtype=ctx.dtype)
    elif node.op in ("avg_pool", "max_pool"):
        if not one_window(a, shape) or a.get("in_group_norm"):  # normalizing what it reads: the pool kernel's
            return None
        wl = SpatialReduceWorkload(shape, "mean" if node.op == "avg_pool" else "max", (2, 3), True, dtype=ctx.dtype)
    else:  # reduce_mean / reduce_max / reduce_sum / reduce_l2
        axes = tuple(sorted(int(x) for x in a.get("axes", (2, 3))))
        keep = bool(a.get("keepdims", 1))
        if axes not in AXES or (not keep and axes != (2, 3)):
            return None
        kind = node.op[len("reduce_"):]
        count = int(np.prod([shape[x] for x in axes]))
        wl = SpatialReduceWorkload(shape, "mean" if kind == "sum" else kind, axes, keep,
                                   float(count) if kind == "sum" else 1.0, ctx.dtype)
    if a.get("activation", "none") != "none":  # passes.fuse_epilogues: an activation after the reduction
        wl = dataclasses.replace(wl, activation=a["activation"])
    if view:
        wl = dataclasses.replace(wl, in_view=view)
    inputs = {"X": ins[0]}
    if a.get("softmax_of") is not None:  # passes_attention: the softmax of a channel of Q as the weights
        q = ctx.shape(a["weight"])
        wl = dataclasses.replace(wl, weight="softmax", softmax_of=(int(a["softmax_of"]), q[1]))
        inputs["Q"] = ctx.packed(a["weight"])
    elif a.get("weight") is not None:  # passes.fuse_reduction_weights: the product read as the reduction's input
        q = ctx.shape(a["weight"])
        wl = dataclasses.replace(wl, weight="same" if tuple(q) == tuple(shape) else "pixel")
        inputs["Q"] = ctx.packed(a["weight"])
    return wl, inputs, {}


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("kind", "choice", "KIND", "mean, max or l2 (default mean)"),
                 WorkloadArg("dtype", "dtype", help="storage dtype (accumulation is float32)"),
                 *(a for a in EPILOGUE_ARGS if a.name == "activation"))
TEMPLATE = Template("spatial_reduce", SpatialReduceWorkload, ReduceConfig, spatial_reduce, reference,
                    random_inputs, fallback, space_vars, VARIABLES, features=features, describe=describe,
                    workload_args=WORKLOAD_ARGS,
                    graph_ops=("global_avg_pool", "global_max_pool", "avg_pool", "max_pool", "reduce_mean",
                               "reduce_max", "reduce_sum", "reduce_l2"), lower=lower)
