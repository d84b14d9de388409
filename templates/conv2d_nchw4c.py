"""conv2d over NCHW4c activations and OIHW4o weights, written once; scopes and layouts are declarations.

Each work-item computes a tile of ``tile_oc`` output-channel blocks (4 channels each, one RGBA pixel) by
``tile_oh`` rows by ``tile_ow`` columns. The reduction walks input-channel blocks, then the filter window,
then the 4 lanes of a block unrolled: one input lane (a single-lane read, broadcast) times one weight
pixel (4 output channels) -- the outer product of the texture RFC's Adreno schedules.
"""
from __future__ import annotations

from contextlib import nullcontext
import dataclasses
from dataclasses import dataclass

import numpy as np

from tuner.ir.activations import apply_ir
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.dtype import DType
from tuner.ir.expr import Broadcast, Cast, ExtractLane, Ramp, as_expr, call, min_, select
from tuner.ir.kernel import Program
from tuner.ir.gather import gather_pixel
from tuner.ir.schedule import cache_read
from tuner.templates.reduction import (StagedTile, add_shifted, as_float as _as_float, as_stored, channel_blocks,
                                       hsum, last_group_statistics, last_group_unit_statistics, local_tree,
                                       norm_units, pow2_ceil, read_norm_operands, shifted_moments, start_shifted,
                                       stats_workspaces, sum_partials, unit_factors, unit_blocks, unit_first_block,
                                       unit_normed, unit_statistics, unit_statistics_layout, unit_stats_workspaces)
from tuner.templates.se_gate import (GateSteps, SEGateWorkload, gate_params, gate_weight_inputs, gate_weights,
                                     row_spread, shared_gate_bytes, shared_gate_rule)
from tuner.templates.se_gate import reference as gate_reference
from tuner.templates.common import (EPILOGUE_ARGS, MODEL_KNOBS, PAD_MODE_ARG, WINDOW_ARGS, Arithmetic,
                                    Conv2dWorkload, LocalTile, clamp, Template, WorkloadArg, _log2, declare_operands,
                                    fit_work_group, gpu_fill_target, input_pixel, is_depthwise, node_epilogue, pixel,
                                    input_parts, padded, padded_tap, params_of, random_inputs, read_parts_numpy,
                                    reference, response_gate_numpy, scale_operand, scale_shape, scope_layout,
                                    split_sums, store_tile, texture_scopes, value, window_features, window_fields)


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
    keep_norm_factors: bool = False  # in_group_norm: the work-group computes every input block's factors once into
    # __local memory, or each work-item those of each block it reads


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
    X, Wt, B, Res, Y = declare_operands(wl, cfg, O)
    X = input_parts(wl, cfg, X)  # with in_read: the parts (X, X1, ...) read through their views
    Sc = scale_operand(wl, cfg)  # squeeze-excite's gate, applied to every input pixel as it is read
    Rg = buffer("Rg", (2 * C4, 4), "float32", "global") if wl.in_response else None  # in_response's gamma, shift
    Xs = buffer("Xs", wl.side_copy[0], wl.dtype, *scope_layout(wl.side_copy[3], cfg.act_layout, "nchw4c_buffer")) \
        if wl.side_copy else None  # the source of the concat's other part this launch writes too
    P = buffer("P", (N * wl.norm_partials * 2, 4), "float32", "global") if wl.norm_partials else None
    Q, A = (buffer("Q", (N * norm_units(C, wl.in_group_norm[0]) * wl.in_group_norm[1] * 2, 4), "float32", "global"),
            buffer("A", (2 * C4, 4), "float32", "global")) if wl.in_group_norm else (None, None)
    if wl.in_layer_norm:  # gamma and beta of a LayerNorm applied as read (its statistics: pixel_norms)
        A = buffer("A", (2 * C4, 4), "float32", "global")
    Na = buffer("Na", (2 * OB, 4), "float32", "global") if wl.out_norm else None
    Rs = buffer("Rs", (OB, 4), "float32", "global") if wl.residual_scale else None
    St = buffer("St", (N * norm_units(O, int(wl.out_stats)) * 2, 4), "float32", "global") if wl.out_stats else None
    Gw = gate_weights(wl.in_gate, C, wl.dtype) if wl.in_gate else ()  # in_gate's squeeze and excite weights
    operands = (*params_of(X), Sc, Rg, Wt, B, Res, Y, Xs, P, Q, A, Na, Rs, St, *Gw)
    if wl.in_read and cfg.cache_input:
        raise ValueError("cache_input copies one input buffer; an input read in parts (in_read) has several")

    t_oc, t_oh, t_ow = cfg.tile_oc, cfg.tile_oh, cfg.tile_ow
    n_ob, n_oh, n_ow = -(-OB // t_oc), -(-OH // t_oh), -(-OW // t_ow)
    g_w, g_h = -(-n_ow // cfg.wg_w), -(-n_oh // cfg.wg_h)
    vector_input = cfg.vec_load == 4 or X.scope != "global" or cfg.cache_input or cfg.local_input
    arith = Arithmetic(cfg.compute, wl.dtype)
    steps, sk = CG4 // cfg.split_c, cfg.split_k
    if sk > 1 and cfg.local_input:
        raise ValueError("split_k > 1 and local_input: the work-items of a split stage different channel blocks")
    if sk > 1 and wl.in_norm:
        raise ValueError("split_k > 1 and in_norm: each work-item sums its pixels' statistics over every channel")
    if wl.out_norm:
        out_norm_fits(wl, cfg)
    if cfg.keep_norm_factors and not wl.in_group_norm:
        raise ValueError("keep_norm_factors keeps in_group_norm's factors in local memory: it needs in_group_norm")
    if cfg.local_input and wl.in_layer_norm:
        raise ValueError("local_input and in_layer_norm: the staged tile holds raw values and the padding's zeros; "
                         "the norm is applied to each pixel read")
    b = Builder()
    with b.loop("nb", N * n_ob, "group.2") as nb, b.loop("tk", sk, "local.2") as tk, \
            b.loop("gh", g_h, "group.1") as gh, b.loop("th", cfg.wg_h, "local.1") as th, \
            b.loop("gw", g_w, "group.0") as gw, b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, obb = nb // n_ob, nb % n_ob
        lid, items = (tk * cfg.wg_h + th) * cfg.wg_w + tw, cfg.wg_w * cfg.wg_h * sk  # flat id, work-group size
        gate = input_gate(b, wl, Sc, Gw, n, lid, items) \
            if wl.in_gate else Sc  # computed by the work-group first: its barriers before any guarded code
        grp = (obb * t_oc) // OBG if G > 1 else 0  # a tile's output blocks are all in one group
        norm_of = group_norm_source(b, wl, X, Q, A, n, lid, items, cfg.keep_norm_factors,
                                    (grp * CG4, CG4)) if Q else None  # (first: its barrier)
        oh0, ow0 = (gh * cfg.wg_h + th) * t_oh, (gw * cfg.wg_w + tw) * t_ow
        acc = arith.accumulators(b, t_oc * t_oh * t_ow)
        stats = norm_stats(b, X, n, oh0, ow0, (t_oh, t_ow), (H, W), P is not None) if wl.in_norm else None
        ln = pixel_norms(b, wl, X, n, oh0, ow0, (t_oh, t_ow), (sk, tk, cfg.wg_w * cfg.wg_h, th * cfg.wg_w + tw)) \
            if wl.in_layer_norm else None
        gate = response_gate(b, wl, Sc, Rg, n) if Rg is not None else gate  # the gate as read
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
                    staged = staged_norm(wl, norm_of, base, cfg.split_c, cfg.keep_norm_factors) if Q else None
                    tile.load(lambda k, ih, iw: gated(input_pixel(X, n, base + k, ih, iw, H, W, arith, wl.pad_mode,
                                                                  None if staged is None else staged(k)),
                                                      gate,
                                                      n, base + k, arith, clamp(ih, H)),
                              (gh * cfg.wg_h * t_oh * sh - pt, gw * cfg.wg_w * t_ow * sw - pl), th * cfg.wg_w + tw)
                with b.loop("cbi", cfg.split_c, "unrolled") as cbi:
                    cbl = cbo * cfg.split_c + cbi
                    cn = norm_of(grp * CG4 + cbl if G > 1 else cbl) if Q and tile is None else \
                        None if ln is None else (ln, b.let("lg", A[cbl, Ramp(as_expr(0), as_expr(1), 4)]),
                                               b.let("lb", A[C4 + cbl, Ramp(as_expr(0), as_expr(1), 4)]))
                    with b.loop("r", R, window) as r, b.loop("s", S, window) as s:
                        conv_step(b, cfg, wl, (X, gate), Wt, acc, arith, tile, vector_input, n, grp, obb, oh0, ow0,
                                  th, tw, cbo, cbi, r, s, (C4, CG4, OB, G, H, W), stats, cn)
        owner = None
        if sk > 1:
            acc, owner = split_sums(b, acc, t_oc * t_oh * t_ow, sk, tk, cfg.wg_w * cfg.wg_h, th * cfg.wg_w + tw,
                                    arith.acc)
        norm = None if stats is None else norm_factors(b, stats, C, wl.in_norm, t_oh * t_ow) if P is None \
            else image_norm_factors(b, P, n, wl) * (t_oh * t_ow)
        normed = out_norm_factors(b, wl, acc, B, Na, obb, oh0, ow0, (t_oc, t_oh, t_ow), owner,
                                  lid, items) if Na else None
        keep = b.allocate("kept", (t_oc * t_oh * t_ow,), "float32x4", "private") if St is not None else None
        if keep is not None:
            for i in range(t_oc * t_oh * t_ow):
                b.store(keep, i, Broadcast(as_expr(0.0), 4))
        store_tile(b, acc, Y, n, obb, oh0, ow0, (t_oc, t_oh, t_ow), (OB, OH, OW), wl, B, Res, owner, norm,
                   out_norm=normed, Rs=Rs, keep=keep)
        if St is not None and int(wl.out_stats) > 1:  # a GroupNorm's or InstanceNorm's units
            layout = unit_statistics_layout(OB, int(wl.out_stats), O, t_oc, g_h * g_w)
            work = [Sp, Sn] = unit_stats_workspaces(N, layout)
            firsts = [(holds_first(obb, oh0, ow0, owner, k * t_oh * t_ow) & (obb * t_oc + k < OB),
                       as_stored(keep[k * t_oh * t_ow], wl.dtype)) for k in range(t_oc)]
            last_group_unit_statistics(b, staged_tile(keep, owner, th, tw, oh0, ow0, cfg, (OH, OW)), firsts,
                                       lid, items, n, obb, gh * g_w + gw, layout,
                                       (OB, int(wl.out_stats), O), Sp, Sn, St)
        elif St is not None:
            work = [Sp, Sn] = stats_workspaces(N, n_ob * g_h * g_w)
            slot = (obb * g_h + gh) * g_w + gw  # of the work-groups writing image n
            last_group_statistics(b, kept_values(keep, owner, obb, oh0, ow0, (t_oc, t_oh, t_ow), (OB, OH, OW)),
                                  (holds_first(obb, oh0, ow0, owner), as_stored(keep[0], wl.dtype)), lid,
                                  items, n, slot, n_ob * g_h * g_w, Sp, Sn, St)
        if Xs is not None:
            side_copy(b, wl, Xs, Y, n, obb, n_ob, oh0, ow0, (t_oh, t_ow), tk if sk > 1 else None)
    kernel = b.kernel("conv2d_nchw4c", [p for p in operands if p is not None] + (work if St is not None else []))
    if St is not None:  # the statistics' slots and arrival counters: workspaces of the launch
        kernel = Program(kernel.name, (kernel,), tuple(p for p in operands if p is not None), tuple(work))
    return cache_read(kernel, X, "texture", cfg.act_layout) if cfg.cache_input else kernel


def holds_first(obb, oh0, ow0, owner, entry: int = None):
    """Whether this work-item stores the output's first pixel (tile entry 0 of the first block, row and column);
    with ``entry``, pixel (0, 0) of that tile entry's block (each block's, for a norm of blocks or channels)."""
    first = oh0.equal(0) & ow0.equal(0) if entry is not None else obb.equal(0) & oh0.equal(0) & ow0.equal(0)
    return first & owner(entry or 0) if owner is not None else first


def tile_entries(tile: tuple):
    """``(k, y, x, i)``: each entry of a work-item's tile of ``(t_oc, t_oh, t_ow)`` -- its block, row and column,
    and its index in the tile's accumulators (``keep``)."""
    t_oc, t_oh, t_ow = tile
    for k in range(t_oc):
        for y in range(t_oh):
            for x in range(t_ow):
                yield k, y, x, (k * t_oh + y) * t_ow + x


def staged_tile(keep, owner, th, tw, oh0, ow0, cfg, bounds) -> StagedTile:
    """``out_stats`` of a norm of blocks: this work-item's kept tile entries, each with its pixel's place in the
    work-group's tile (rows of ``wg_w * tile_ow`` pixels), whether it holds it (a split's owner) and whether the
    pixel is inside the output (``reduction.last_group_unit_statistics`` stages them)."""
    (t_oc, t_oh, t_ow), (OH, OW) = (cfg.tile_oc, cfg.tile_oh, cfg.tile_ow), bounds
    row = cfg.wg_w * t_ow
    entries = [[] for _ in range(t_oc)]
    for k, y, x, i in tile_entries((t_oc, t_oh, t_ow)):
        entries[k].append((keep[i], (th * t_oh + y) * row + tw * t_ow + x, owner(i) if owner is not None else None,
                           (oh0 + y < OH) & (ow0 + x < OW)))
    return StagedTile(entries, cfg.wg_h * t_oh * row)


def kept_values(keep, owner, obb, oh0, ow0, tile, bounds) -> list:
    """``out_stats``: each kept tile entry with its mask -- 1s where the pixel is inside the output and this
    work-item stores it (a split's owner), else 0s."""
    (OB, OH, OW), out = bounds, []
    for k, y, x, i in tile_entries(tile):
        inside = (obb * tile[0] + k < OB) & (oh0 + y < OH) & (ow0 + x < OW)
        if owner is not None:
            inside = inside & owner(i)
        out.append((keep[i], Broadcast(select(inside, as_expr(1.0), as_expr(0.0)), 4)))
    return out


def out_norm_blocks(wl) -> int:
    """``out_norm``: the output blocks of 4 channels a work-group's tile must hold together (``tile_oc`` a multiple
    of them): a group's blocks (all of them for one group), or 1 where a block holds whole groups."""
    groups, O = wl.out_norm[0], wl.kernel[0]
    return max(1, O // groups // 4)


def out_norm_fits(wl, cfg) -> None:
    """A ValueError unless each work-group holds whole groups of ``out_norm``: every output pixel (one work-group
    along rows and columns), the group's blocks in its tile, in a power of two of work-items (the space's knobs
    are), no staged input (``local_input``'s local memory)."""
    _, _, OH, OW = wl.out_shape
    items = cfg.wg_w * cfg.wg_h * cfg.split_k
    if -(-OW // cfg.tile_ow) > cfg.wg_w or -(-OH // cfg.tile_oh) > cfg.wg_h or cfg.tile_oc % out_norm_blocks(wl) \
            or cfg.local_input or items != pow2_ceil(items):
        raise ValueError(f"out_norm: a work-group must hold its groups' whole {OH}x{OW} planes (wg_w * tile_ow >= "
                         f"{OW}, wg_h * tile_oh >= {OH}) and blocks (tile_oc a multiple of {out_norm_blocks(wl)}), "
                         f"a power of two of work-items (their sums' tree), without local_input; got "
                         f"tile_ow={cfg.tile_ow} wg_w={cfg.wg_w} tile_oh={cfg.tile_oh} wg_h={cfg.wg_h} "
                         f"split_k={cfg.split_k} tile_oc={cfg.tile_oc} local_input={cfg.local_input}")


def _per_group(wl, sums: list, k: int, t_oc: int):
    """Tile block ``k``'s lanes' group totals from the tile's per-lane ``sums`` (float4 a block): each lane's own
    (an InstanceNorm), its pair's, its block's, or its group's blocks' (``out_norm_blocks`` of them)."""
    cg = wl.kernel[0] // wl.out_norm[0]
    v = sums[k]
    if cg == 1:
        return v
    if cg == 2:
        lo, hi = ExtractLane(v, 0) + ExtractLane(v, 1), ExtractLane(v, 2) + ExtractLane(v, 3)
        return call("make_vector", [lo, lo, hi, hi], "float32x4")
    bpg = out_norm_blocks(wl)
    first = k // bpg * bpg
    total = hsum(sums[first])
    for j in range(first + 1, first + bpg):
        total = total + hsum(sums[j])
    return Broadcast(total, 4)


def out_norm_factors(b, wl, acc, B, Na, obb, oh0, ow0, tile, owner, lid, size: int) -> list:
    """``out_norm``'s ``(mean, rstd * gamma, beta)`` (float4s) of each of the tile's ``t_oc`` output blocks, from
    the work-group's sums: the convolution's values plus bias, in two passes over the accumulators -- the mean,
    then the sum of squared deviations from it (no cancellation: the values stay in registers) -- each summed per
    lane over the work-item's own pixels (inside the output; a split's owner only), then over the work-group
    (``reduction.local_tree``), then over the lanes and blocks of each group (``_per_group``)."""
    (t_oc, t_oh, t_ow), (_, O, OH, OW) = tile, wl.out_shape
    OB = -(-O // 4)
    count = float(O // wl.out_norm[0] * OH * OW)
    vals, zero = {}, Broadcast(as_expr(0.0), 4)
    for k in range(t_oc):
        ob = min_(obb * t_oc + k, OB - 1)
        for y in range(t_oh):
            for x in range(t_ow):
                i = (k * t_oh + y) * t_ow + x
                v = _as_float(acc[i])
                if B is not None:
                    v = v + B[Ramp(ob * 4, as_expr(1), 4)]
                inside = (oh0 + y < OH) & (ow0 + x < OW)
                if owner is not None:
                    inside = inside & owner(i)
                vals[i] = (b.let(f"nv{i}", v), inside)

    def summed(f, name):
        part = b.allocate(f"{name}p", (t_oc,), "float32x4", "private")
        for k in range(t_oc):
            b.store(part, k, zero)
            for i in range(k * t_oh * t_ow, (k + 1) * t_oh * t_ow):
                v, inside = vals[i]
                with b.if_(inside):
                    b.store(part, k, part[k] + f(k, v))
        sums = local_tree(b, [part[k] for k in range(t_oc)], lambda x, y: x + y, lid, size, name=name)
        return [b.let(f"{name}s{k}", v) for k, v in enumerate(sums)]
    s = summed(lambda k, v: v, "nsum")
    means = [b.let(f"nmean{k}", _per_group(wl, s, k, t_oc) * (1.0 / count)) for k in range(t_oc)]
    q = summed(lambda k, v: (v - means[k]) * (v - means[k]), "nsq")
    out, vec = [], Ramp(as_expr(0), as_expr(1), 4)
    for k in range(t_oc):
        ob = min_(obb * t_oc + k, OB - 1)
        rstd = call("rsqrt", [_per_group(wl, q, k, t_oc) * (1.0 / count) + wl.out_norm[1]], "float32x4")
        out.append((means[k], b.let(f"nscale{k}", rstd * Na[ob, vec]), b.let(f"nshift{k}", Na[OB + ob, vec])))
    return out


def side_copy(b, wl, Xs, Y, n, obb, n_ob, oh0, ow0, tile, tk):
    """``side_copy``: the work-items of output-block tile ``obb`` (of ``n_ob``) also copy the source's gathered
    pixels ``obb``, ``obb + n_ob``, ... at their tile's positions (the first work-item of a split only): a concat's
    other part written by the same launch, not a kernel of its own."""
    src, channels, offset, _ = wl.side_copy
    _, _, OH, OW = wl.out_shape
    blocks = -(-len(channels) // 4)
    with b.loop("sc", -(-blocks // n_ob)) as sc:
        cb = obb + sc * n_ob
        mine = (cb < blocks) if blocks % n_ob else None
        if tk is not None:
            mine = tk.equal(0) if mine is None else mine & tk.equal(0)
        with b.if_(mine) if mine is not None else nullcontext():
            for y in range(tile[0]):
                for x in range(tile[1]):
                    oh, ow = oh0 + y, ow0 + x
                    with b.if_((oh < OH) & (ow < OW)):
                        b.store(Y, (n, Ramp(cb * 4 + offset, as_expr(1), 4), oh, ow),
                                gather_pixel(b, Xs, src[1], n, cb, [oh, ow], channels, f"s{y}_{x}"))


def gated(pixel, Sc, n, cb, arith, ih):
    """An input pixel of channel block ``cb`` (at input row ``ih``, in bounds) times its gate pixel ``Sc[n, cb]``, or
    ``Sc[n, cb, ih]`` for a gate a row (``scale_rows``), or ``Sc(cb)`` where the gate is computed from ``S``
    (``response_gate``); as is without ``Sc``."""
    if Sc is None:
        return pixel
    if callable(Sc):
        return pixel * arith.load(Sc(cb))
    return pixel * arith.load(Sc[n, Ramp(cb * 4, as_expr(1), 4), gate_row(Sc, ih), 0])


def input_gate(b, wl, rows, weights, n, lid, L: int):
    """``in_gate``: the work-group of ``L`` work-items (flat id ``lid``) computes image ``n``'s squeeze-excite gate
    into local memory before its reduction loop -- the means of the input's maps from their row sums ``rows``
    (``S``: N, C, H, 1), then ``se_gate``'s squeeze and excite (``GateSteps``, shared as the work-group's size
    allows: ``shared_gate_rule``) -- so that no launch runs for the gate. Every work-group computes the same gate
    (the weights read from the cache after the first). A function of the channel block, as ``response_gate``."""
    (_, C, H, W), S = wl.data, wl.in_gate
    C4 = -(-C // 4)
    K, E, loop = shared_gate_rule(L, S, C4)
    gate = b.allocate("igate", (C4,), "float32x4", "local")
    steps = GateSteps(S, C4, wl.gate_act1, wl.gate_activation, L, K, 1, E, loop, tuple(weights), gate)
    pooled = b.allocate("ipooled", (C4,), "float32x4", "local")
    hidden = b.allocate("ihidden", (S,), "float32", "local")
    red1 = b.allocate("ired1", (L,), "float32", "local") if K > 1 else None
    red2 = b.allocate("ired2", (L,), "float32x4", "local") if E > 1 else None
    part = b.allocate("ipart", (L,), "float32x4", "local") if row_spread(L, C4, H) > 1 else None
    steps.pool_rows(b, n, lid, rows, H * W, pooled, part)
    steps.squeeze(b, lid, red1, hidden, C4, steps.dot_w1(pooled))
    steps.excite(b, n, as_expr(0), lid, hidden, red2)
    b.barrier()  # every block's gate stored before any work-item reads one
    return lambda cb: gate[cb]


def gate_local_bytes(wl, L: int) -> int:
    """The local memory ``input_gate`` takes in a work-group of ``L`` work-items: the block means and the gate (a
    float4 a block each), the squeeze channels, the trees and the pool's row sums (a float4 a work-item where it
    spreads the rows); 0 without ``in_gate``."""
    if not wl.in_gate:
        return 0
    C4 = -(-wl.data[1] // 4)
    return 32 * C4 + shared_gate_bytes(L, wl.in_gate, C4) + (16 * L if row_spread(L, C4, wl.data[2]) > 1 else 0)


def gate_local_bound(wl, L: int) -> int:
    """The space's count of ``gate_local_bytes`` (``gate_local`` in conv2d.toml, which cannot call the sharing
    rule): the trees and the row sums at their most, a float and two float4s a work-item; 0 without ``in_gate``.
    The fallback sizes its work-group and split by it, so that its config lies in the space."""
    return 32 * -(-wl.data[1] // 4) + 4 * wl.in_gate + 36 * L if wl.in_gate else 0


def response_gate(b, wl, Sc, Rg, n):
    """``in_response``: the gate of channel block ``cb`` computed from the response norm's statistics ``S`` (G, each
    channel's L2 norm over its map) as it is read -- ``Rg[C4 + cb] + Rg[cb] * G / (mean_c(G) + eps)``, the mean over
    the image's C channels summed first (C4 float4 reads a work-item, lanes past C skipped). A function of ``cb``."""
    C = wl.data[1]
    C4, vec = -(-C // 4), Ramp(as_expr(0), as_expr(1), 4)
    acc = b.allocate("gsum", (1,), "float32x4", "private")
    b.store(acc, 0, Broadcast(as_expr(0.0), 4))
    with b.loop("gc", C4, "serial") as cb:
        g = _as_float(Sc[n, Ramp(cb * 4, as_expr(1), 4), 0, 0])
        if C % 4:  # lanes past C: left out of the last block
            g = call("make_vector", [ExtractLane(g, j) if j < C % 4 else select(cb < C4 - 1, ExtractLane(g, j),
                                                                                 as_expr(0.0)) for j in range(4)],
                     "float32x4")
        b.store(acc, 0, acc[0] + g)
    inv = b.let("ginv", 1.0 / (hsum(acc[0]) * (1.0 / C) + wl.in_response))
    return lambda cb: Rg[C4 + cb, vec] + Rg[cb, vec] * _as_float(Sc[n, Ramp(cb * 4, as_expr(1), 4), 0, 0]) * \
        Broadcast(inv, 4)


def group_norm_factors(b, wl, X, Q, A, n, cb, tag: str = "") -> tuple:
    """``in_group_norm``'s (mean, rstd * gamma, beta) of channel block ``cb`` of image ``n`` (``unit_factors``)."""
    G, T, epsilon, _ = wl.in_group_norm
    first = pixel(X, n, unit_first_block(wl.data[1], G, cb), 0, 0)
    return unit_factors(b, Q, A, first, n, cb, wl.data, G, T, epsilon, tag)


def group_norm_source(b, wl, X, Q, A, n, lid, L: int, keep: bool, blocks: tuple):
    """``in_group_norm``'s factors (``group_norm_factors``) as a function of a channel block, with a tag for its
    names. With ``keep`` (``keep_norm_factors``), the work-group's ``L`` work-items (flat id ``lid``) compute the
    factors of the input blocks it reads -- ``blocks``: (the first, how many: its group's) -- once into local memory
    before the reduction (a barrier: called before any guarded code), and a block's are three local loads; else
    each call computes them, each work-item for each block it reads. On the H100 (2026-12-05,
    ``bench/norm_readers.py``) keeping them was faster on 23 of 26 configs of gn32_resnet's readers (1.5 us at the
    median) and 3-10 us slower on two its plan runs (256-512 work-items waiting at the barrier): a knob. The space
    counts the local memory: ``norm_local``, 48 bytes a block of the work-group's group."""
    if not keep:
        return lambda cb, tag="": group_norm_factors(b, wl, X, Q, A, n, cb, tag)
    first, K = blocks
    F = b.allocate("gnf", (3 * K,), "float32x4", "local")
    with b.loop("gf", -(-K // L)) as j:
        k = b.let("gk", j * L + lid)
        with b.if_(k < K) if K % L else nullcontext():
            for i, f in enumerate(group_norm_factors(b, wl, X, Q, A, n, first + k)):
                b.store(F, i * K + k, f)
    b.barrier()
    return lambda cb, tag="": tuple(b.let(f"{name}{tag}", F[i * K + cb - first])
                                    for i, name in enumerate(("gmean", "gscale", "gshift")))


def staged_norm(wl, norm_of, base, blocks: int, kept: bool):
    """``in_group_norm`` for a staged tile (``local_input``): a function of the tile's block ``k`` (an expression)
    to the norm of a pixel of that block, for ``input_pixel`` to normalize each pixel once as it is staged -- the
    padding's zeros after the norm, as the convolution pads the normalized input -- where each work-item would
    normalize every tap it reads. ``norm_of``: ``group_norm_source``'s; the factors of the step's ``blocks`` blocks
    from ``base``, chosen by a select chain where they are not ``kept`` in local memory."""
    act = wl.in_group_norm[3]
    if kept:
        return lambda k: lambda v: unit_normed(v, norm_of(base + k, "_s"), act)
    factors = [norm_of(base + k, f"_{k}") for k in range(blocks)]

    def of(k):
        chosen = factors[-1]
        for j in range(blocks - 2, -1, -1):  # a select chain over the step's blocks (split_c: 1, 2 or 4)
            chosen = tuple(select(k.equal(j), a, c) for a, c in zip(factors[j], chosen))
        return lambda v: unit_normed(v, chosen, act)
    return of


def gate_row(Sc, ih):
    """The gate's row for input row ``ih``: ``ih`` for a gate a row (``scale_rows``: S is (N, C, H, 1)), else 0."""
    return ih if Sc.shape[2] > 1 else 0


def norm_stats(b, X, n, oh0, ow0, tile, bounds, image: bool = False):
    """``in_norm``'s private statistics of a work-item's ``tile`` (t_oh, t_ow) of pixels, three floats a pixel: the
    shift K (the pixel's first channel; the 1x1 convolution's input pixel is its output pixel, clamped for a partial
    tile), then the sums of ``d = x - K`` and of ``d^2``, zero. The products use ``d`` too: ``rstd * (W d - mean(d)
    * U)`` is the normalized convolution (U = W's sums) without the cancellation of ``W x - mean(x) * U`` when the
    mean is large against the deviation, and the variance of ``d`` without that of raw sums. ``image``
    (``norm_partials``): K is the image's first element, the statistics come from ``P`` and the sums stay zero."""
    (t_oh, t_ow), (H, W) = tile, bounds
    st = b.allocate("st", (3 * t_oh * t_ow,), "float32", "private")
    for y in range(t_oh):
        for x in range(t_ow):
            p = y * t_ow + x
            start_shifted(b, st, 3 * p, pixel(X, n, as_expr(0), *((0, 0) if image else (clamp(oh0 + y, H),
                                                                                        clamp(ow0 + x, W)))))
    return st


MAX_NORM_PIXELS = 64  # in_layer_norm: input pixels a work-item's windows span (the space's layer_norm_pixels)


def window_span(window, stride, dilation, tile=(1, 1)) -> tuple:
    """(rows, cols) of the input pixels the (R, S) windows of a (t_oh, t_ow) ``tile`` of outputs span."""
    (R, S), (sh, sw), (dh, dw) = window, stride, dilation
    return (tile[0] - 1) * sh + (R - 1) * dh + 1, (tile[1] - 1) * sw + (S - 1) * dw + 1


def norm_pixels(wl, tile) -> tuple:
    """``in_layer_norm``: (rows, cols) of the input pixels the windows of a (t_oh, t_ow) ``tile`` span."""
    return window_span(wl.kernel[2:], wl.stride, wl.dilation, tile)


def split_norm_bytes(wl, tile) -> int:
    """``in_layer_norm`` under a split: the local memory one work-item's pixel sums take (``pixel_norms``' two
    floats a pixel its windows span); 0 without it."""
    return 8 * int(np.prod(norm_pixels(wl, tile))) if wl.in_layer_norm else 0


def unrolled_window(wl) -> bool:
    """The fallbacks' ``unroll_rs``: windows up to 3x3, up to 5x5 where each tap's pixel statistics need a constant
    index (``in_layer_norm``; the space's ``layer_norm_unrolled``)."""
    R, S = wl.kernel[2:]
    return R * S <= (25 if wl.in_layer_norm else 9)


def pixel_index(wl, tile, yx, r, s):
    """``in_layer_norm``: the index among ``norm_pixels`` of the input pixel that output (y, x) of the tile reads
    at window tap (r, s)."""
    (sh, sw), (dh, dw) = wl.stride, wl.dilation
    return (yx[0] * sh + r * dh) * norm_pixels(wl, tile)[1] + yx[1] * sw + s * dw


def pixel_norms(b, wl, X, n, oh0, ow0, tile, split=(1, 0, 1, 0)):
    """``in_layer_norm``'s (mean, rstd) of every input pixel the work-item's windows read (``norm_pixels``; one
    outside the input reads its clamped neighbour, and the padding replaces what it normalizes), two floats a pixel:
    its channels' sums of d = x - K and d^2 (K its first channel, as ``norm_stats``), one pass over the channel
    blocks before the reduction loop; lanes past C skipped. ``split`` (split_k, tk, work-items a split, this one's
    index among them): the work-items of a split sum every split_k-th block (tk's share, as their reduction loop's
    steps are shared with split_c 1) and add each other's sums through local memory, so that none reads all the
    channels alone."""
    (N, C, H, W), (sh, sw), (pt, pl, _, _) = wl.data, wl.stride, wl.padding
    C4, (rows, cols) = -(-C // 4), norm_pixels(wl, tile)
    sk, tk, items, item = split
    at = [(clamp(oh0 * sh - pt + i, H), clamp(ow0 * sw - pl + j, W)) for i in range(rows) for j in range(cols)]
    st = b.allocate("lst", (3 * len(at),), "float32", "private")
    for p, (ih, iw) in enumerate(at):
        start_shifted(b, st, 3 * p, pixel(X, n, as_expr(0), ih, iw))
    with b.loop("lc", -(-C4 // sk), "serial") as lc:
        cb = lc * sk + tk if sk > 1 else lc
        with b.if_(cb < C4) if C4 % sk else nullcontext():
            for p, (ih, iw) in enumerate(at):
                add_shifted(b, st, 3 * p, b.let(f"ld{p}", _as_float(pixel(X, n, cb, ih, iw)) - Broadcast(st[3 * p], 4)),
                            cb, C4, C)
    if sk > 1:  # each work-item's sums, then every work-item adds its split's
        lsp = b.allocate("lsp", (sk * items * 2 * len(at),), "float32", "local")
        for j in range(2 * len(at)):
            b.store(lsp, (tk * items + item) * 2 * len(at) + j, st[3 * (j // 2) + 1 + j % 2])
        b.barrier()
        for j in range(2 * len(at)):
            b.store(st, 3 * (j // 2) + 1 + j % 2, sum((lsp[(k * items + item) * 2 * len(at) + j] for k in range(1, sk)),
                                                       lsp[item * 2 * len(at) + j]))
    ln = b.allocate("ln", (2 * len(at),), "float32", "private")
    for p in range(len(at)):
        m, rstd = shifted_moments(b, st[3 * p + 1], st[3 * p + 2], C, wl.in_layer_norm, (f"lm{p}", f"lr{p}"))
        b.store(ln, 2 * p, st[3 * p] + m)
        b.store(ln, 2 * p + 1, rstd)
    return ln


def norm_factors(b, st, C: int, epsilon: float, pixels: int) -> list:
    """``[(mean of d, rstd)]`` of each pixel of the tile from ``norm_stats``' sums over the C channels."""
    return [shifted_moments(b, st[3 * p + 1], st[3 * p + 2], C, epsilon, (f"nm{p}", f"nr{p}"))
            for p in range(pixels)]


def image_norm_factors(b, P, n, wl) -> list:
    """``[(mean of d, rstd)]`` of image ``n`` from its ``norm_partials`` chunk sums in ``P`` (GroupNorm(1): over
    its C x H x W elements), one pair for every pixel of a tile."""
    N, C, H, W = wl.data
    acc = sum_partials(b, P, n, wl.norm_partials, "pt", "pacc")
    return [shifted_moments(b, hsum(acc[0]), hsum(acc[1]), C * H * W, wl.in_norm, ("nm", "nr"))]


def conv_step(b, cfg, wl, inputs, Wt, acc, arith, tile, vector_input, n, grp, obb, oh0, ow0, th, tw, cbo, cbi, r,
              s, sizes, stats=None, cn=None):
    """One input-channel block (``cbo * split_c + cbi``) and window tap (r, s) of a work-item's tile: 4 lanes
    of every input pixel times 4-output weight pixels, accumulated. ``inputs``: (X, the gate Sc or None); ``cn``:
    the block's ``in_group_norm`` factors (``group_norm_factors``), applied to each value read before its
    padding of zeros (None with a staged tile: its pixels were normalized as staged, ``staged_norm``)."""
    def normed(v, lane=None, yx=None):  # a value read, in the compute type
        if cn is not None and wl.in_layer_norm:  # the tap's input pixel's (mean, rstd), then gamma and beta
            ln, g, bt = cn
            at = 2 * pixel_index(wl, (cfg.tile_oh, cfg.tile_ow), yx, r, s)
            m, rstd = (ln[at], ln[at + 1]) if lane is not None else (Broadcast(ln[at], 4), Broadcast(ln[at + 1], 4))
            g, bt = (g, bt) if lane is None else (ExtractLane(g, lane), ExtractLane(bt, lane))
            return arith.load((_as_float(v) - m) * rstd * g + bt)
        return arith.load(v if cn is None else unit_normed(v, cn, wl.in_group_norm[3], lane))
    (X, Sc), (C4, CG4, OB, G, H, W) = inputs, sizes
    C = wl.data[1]
    t_oc, t_oh, t_ow = cfg.tile_oc, cfg.tile_oh, cfg.tile_ow
    (sh, sw), (dh, dw), (pt, pl, _, _) = wl.stride, wl.dilation, wl.padding
    cbl = cbo * cfg.split_c + cbi  # input block within the group (the weight's channel block)
    cb = grp * CG4 + cbl if G > 1 else cbl
    if callable(Sc) and tile is None:  # in_response: this block's gate, once a step (a staged tile is gated)
        block_gate = b.let("rgate", Sc(cb))
        Sc = lambda _cb: block_gate  # noqa: E731
    taps = {}
    for y in range(t_oh):
        for x in range(t_ow):
            ih = (oh0 + y) * sh - pt + r * dh
            iw = (ow0 + x) * sw - pl + s * dw
            taps[y, x] = padded_tap(ih, iw, H, W, wl.pad_mode)  # inside None: the padding reads the input
    xs = {}
    if tile is not None:
        for y in range(t_oh):
            for x in range(t_ow):
                v = tile.read(cbi, th, tw, y, x, r, s)
                xs[y, x] = b.let(f"x{y}_{x}", v if cn is None else normed(v))
    elif vector_input:  # one RGBA pixel (4 input channels) per tap; lanes extracted below
        for (y, x), (inside, ih, iw) in taps.items():
            xs[y, x] = b.let(f"x{y}_{x}", gated(padded(inside, normed(pixel(X, n, cb, ih, iw), yx=(y, x))), Sc, n,
                                                cb, arith, ih))
    for ci in range(4):
        c = cb * 4 + ci
        # lanes past C exist only in the last block; their weights do not (OIHW4o pads O, not C)
        with b.if_(cb < C4 - 1) if ci >= C % 4 > 0 else nullcontext():
            if vector_input:
                lane = {yx: ExtractLane(v, ci) for yx, v in xs.items()}
            else:
                def gate(v, ih):
                    if callable(Sc):  # in_response: the block's computed gate, this lane
                        return v * arith.load(ExtractLane(Sc(cb), ci))
                    return v if Sc is None else v * arith.load(Sc[n, c, gate_row(Sc, ih), 0])
                lane = {yx: b.let(f"x{yx[0]}_{yx[1]}_{ci}",
                                  gate(padded(inside, normed(value(X, n, c, ih, iw), ci, yx)), ih))
                        for yx, (inside, ih, iw) in taps.items()}
            if stats is not None:  # in_norm: d = x - K into the sums and the products (padding lanes skipped)
                for (y, x), v in list(lane.items()):
                    p = y * t_ow + x
                    d = b.let(f"d{y}_{x}_{ci}", _as_float(v) - stats[3 * p])
                    if not wl.norm_partials:  # a LayerNorm's statistics: this pixel's channels
                        b.store(stats, 3 * p + 1, stats[3 * p + 1] + d)
                        b.store(stats, 3 * p + 2, stats[3 * p + 2] + d * d)
                    lane[y, x] = d if v.dtype == d.dtype else Cast(v.dtype, d)
            for k in range(t_oc):
                ob = min_(obb * t_oc + k, OB - 1)  # a partial last tile re-reads the last block
                wpix = b.let(f"w{k}_{ci}", arith.load(Wt[Ramp(ob * 4, as_expr(1), 4), cbl * 4 + ci, r, s]))
                for y in range(t_oh):
                    for x in range(t_ow):
                        i = (k * t_oh + y) * t_ow + x
                        b.store(acc, i, arith.mac(acc[i], lane[y, x] * wpix))


def space_vars(wl: Conv2dWorkload) -> dict:
    (N, C, H, W), (O, _, R, S) = wl.data, wl.kernel
    _, _, OH, OW = wl.out_shape
    G = wl.groups
    CG4 = C // G // 4 if G > 1 else -(-C // 4)
    return dict(N=N, C=C, H=H, W=W, O=O, R=R, S=S, OH=OH, OW=OW, C4=-(-C // 4), OB=-(-O // 4), G=G, CG4=CG4,
                OBG=O // G // 4 if G > 1 else -(-O // 4),
                data=wl.data, kernel=wl.kernel, out=wl.out_shape, bias=wl.bias, residual=wl.residual,
                stride=wl.stride, dilation=wl.dilation, plain_input=wl.plain_input, plain_output=wl.plain_output,
                in_read=wl.in_read, in_norm=wl.in_norm, norm_partials=wl.norm_partials,
                in_group_norm=bool(wl.in_group_norm), in_layer_norm=bool(wl.in_layer_norm),
                norm_local=48 * CG4 if wl.in_group_norm else 0,  # keep_norm_factors: group_norm_source
                out_norm=bool(wl.out_norm), norm_blocks=out_norm_blocks(wl) if wl.out_norm else 1,
                out_stats=bool(wl.out_stats), stats_blocks=stats_blocks(wl), in_gate=wl.in_gate)


def stats_blocks(wl: Conv2dWorkload) -> int:
    """``out_stats``: the blocks of 4 channels of the norm's unit -- 0 for a GroupNorm(1) (the image), 1 for an
    InstanceNorm (a block, a lane a channel), else a group's."""
    groups = int(wl.out_stats)
    return 0 if groups <= 1 else unit_blocks(wl.kernel[0], groups)


def fallback(wl: Conv2dWorkload, info) -> Conv2dConfig:
    """A config that is good without tuning: 2 output-channel blocks by 4 columns per work-item where the
    output is that large, a 16x4 work-group trimmed to the output, textures on GPUs that can hold them. On a
    GPU the work must also fill the device (``gpu_fill_target``: work-items per compute unit): a layer with
    too few output tiles takes smaller tiles, then splits each tile's reduction over up to 32 work-items
    (``split_k``) -- the shape of every best config the H200's log holds for small late layers. On a CPU, whose
    OpenCL compilers vectorize across the work-items of dimension 0, one column per work-item (4 channel blocks
    where the groups allow) in a work-group up to 32 columns wide: the region of every best config of the tuning
    benchmark's convolutions on Intel's CPU runtime, and 0.47x the kernel time of the 4-column fallback on
    ResNet-18 at 224 (``bench/fallbacks.py``, 2026-11-26). A row-major model input (``plain_input``) is read one
    channel at a time (``vec_load`` 1: a 4-lane gather from the planes ran 1.9x slower on that runtime, 173 against
    89 us for a 9x9 stem). A convolution that computes its input's gate (``in_gate``) takes a work-group and a
    split whose local memory holds the gate's arrays (``gate_local_bound``), or a ValueError where none does."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", wl.data), ("nchw4c", wl.out_shape), ("oihw4o", wl.kernel)])
    if wl.out_norm:
        return _out_norm_fallback(wl, v, info, scope)
    cpu = info.type == "CPU"  # CPU compilers vectorize across the work-items of dimension 0: one column each
    sb = v["stats_blocks"]  # out_stats of a norm of blocks: a tile and a group hold one another (out_stats_units)
    fits = lambda oc: v["OBG"] >= oc and (v["G"] == 1 or v["OBG"] % oc == 0) \
        and (not sb or oc % sb == 0 or sb % oc == 0)  # noqa: E731
    tile_oc = next(oc for oc in ((4, 2) if cpu else (2,)) + (1,) if oc == 1 or fits(oc))
    tile_ow = 1 if cpu else 4 if v["OW"] >= 8 else 2 if v["OW"] >= 2 else 1
    while wl.in_layer_norm and tile_ow > 1 and np.prod(norm_pixels(wl, (1, tile_ow))) > MAX_NORM_PIXELS:
        tile_ow //= 2
    if wl.in_layer_norm and np.prod(norm_pixels(wl, (1, 1))) > MAX_NORM_PIXELS:
        raise ValueError(f"in_layer_norm: a window spanning {np.prod(norm_pixels(wl, (1, 1)))} input pixels; at most "
                         f"{MAX_NORM_PIXELS} (each one's mean and rstd in registers)")
    items = lambda oc, ow: v["N"] * -(-v["OB"] // oc) * v["OH"] * -(-v["OW"] // ow)  # noqa: E731
    target = gpu_fill_target(info)
    while items(tile_oc, tile_ow) < target and (tile_ow > 1 or tile_oc > 1):
        tile_ow, tile_oc = (tile_ow // 2, tile_oc) if tile_ow > 1 else (tile_ow, 1)
    wg_w, wg_h = fit_work_group(-(-v["OW"] // tile_ow), v["OH"], info, *((32, 2) if cpu else ()))
    while gate_local_bound(wl, wg_w * wg_h) > info.local_mem_bytes and wg_w * wg_h > 1:  # in_gate: a smaller group
        wg_w, wg_h = (wg_w // 2, wg_h) if wg_w >= wg_h else (wg_w, wg_h // 2)
    if gate_local_bound(wl, wg_w * wg_h) > info.local_mem_bytes:
        raise ValueError(f"in_gate: the gate of {wl.data[1]} channels ({gate_local_bound(wl, 1)} bytes of local "
                         f"memory with one work-item) exceeds this device's {info.local_mem_bytes}")
    split_k = 1
    while items(tile_oc, tile_ow) * split_k < target and split_k < 32 and not wl.in_norm:
        k = split_k * 2  # the space's limits: channel steps, work-group size, __local partial sums
        if k > v["CG4"] or k > info.max_work_item_sizes[2] or wg_w * wg_h * k > info.max_work_group_size \
                or k * wg_w * wg_h * (tile_oc * tile_ow * 16 + split_norm_bytes(wl, (1, tile_ow))) \
                + gate_local_bound(wl, k * wg_w * wg_h) > info.local_mem_bytes:
            break
        split_k = k
    return Conv2dConfig(tile_oc=tile_oc, tile_oh=1, tile_ow=tile_ow, wg_w=wg_w, wg_h=wg_h, split_c=1,
                        unroll_rs=unrolled_window(wl), vec_load=1 if wl.plain_input else 4,
                        input_scope="buffer" if wl.plain_input else scope, weight_scope=scope,
                        output_scope="buffer" if wl.plain_output else scope, split_k=split_k)


def _out_norm_fallback(wl: Conv2dWorkload, v: dict, info, scope: str) -> Conv2dConfig:
    """``out_norm``'s fallback: a work-group over the whole output plane (the space's limits: up to 8 rows of up to
    4 pixels, up to 64 columns of up to 8), each work-item the fewest pixels that fit the device's work-group, a
    tile of one group's blocks; then the input channels split over more work-items (``split_k``) up to 512 a
    work-group where the blocks, the device and local memory allow. A ValueError where no tile fits."""
    if v["norm_blocks"] > 4:
        raise ValueError(f"out_norm: groups of {v['norm_blocks']} blocks of 4 channels; a tile holds up to 4 (tile_oc)")
    most = min(info.max_work_group_size, 512)
    pick = None
    for tile_oh, tile_ow in sorted(((h, w) for h in (1, 2, 4) for w in (1, 2, 4, 8)), key=lambda t: (t[0] * t[1], t)):
        rows, cols = -(-v["OH"] // tile_oh), -(-v["OW"] // tile_ow)
        wg_h, wg_w = pow2_ceil(rows), pow2_ceil(cols)
        if wg_h <= 8 and wg_w <= 64 and wg_h * wg_w <= most and wg_w <= info.max_work_item_sizes[0] \
                and wg_h <= info.max_work_item_sizes[1] and tile_oh * tile_ow * v["norm_blocks"] <= 32:
            pick = tile_oh, tile_ow, wg_h, wg_w
            break
    if pick is None:
        raise ValueError(f"out_norm: no work-group of this device holds a whole {v['OH']}x{v['OW']} output plane")
    tile_oh, tile_ow, wg_h, wg_w = pick
    cfg = Conv2dConfig(tile_oc=v["norm_blocks"], tile_oh=tile_oh, tile_ow=tile_ow, wg_w=wg_w, wg_h=wg_h,
                       unroll_rs=unrolled_window(wl), vec_load=1 if wl.plain_input else 4,
                       input_scope="buffer" if wl.plain_input else scope, weight_scope=scope,
                       output_scope="buffer" if wl.plain_output else scope)
    split_k, items = 1, wg_w * wg_h
    while True:
        k = split_k * 2
        local = items * k * (32 * cfg.tile_oc + cfg.tile_oc * tile_oh * tile_ow * 16
                             + split_norm_bytes(wl, (tile_oh, tile_ow)))
        if items * k > most or k > v["CG4"] or k > 32 or k > info.max_work_item_sizes[2] \
                or local > info.local_mem_bytes:
            break
        split_k = k
    if items * 32 * cfg.tile_oc > info.local_mem_bytes:
        raise ValueError(f"out_norm: the work-group's sums of a {v['OH']}x{v['OW']} plane exceed the local memory")
    return dataclasses.replace(cfg, split_k=split_k)


def _reference(wl: Conv2dWorkload, inputs: dict):
    scale = inputs.get("S") if not wl.in_response else response_gate_numpy(inputs["S"], inputs["Rg"], wl.in_response)
    if wl.in_gate:  # se_gate's reference of the maps' row sums
        scale = gate_reference(SEGateWorkload(scale_shape(wl), wl.in_gate, wl.gate_act1, wl.gate_activation,
                                              pixels=wl.data[2] * wl.data[3]), {**inputs, "X": inputs["S"]})
    y = reference(wl, read_parts_numpy(wl, inputs), inputs["Wt"], inputs.get("B"), inputs.get("Res"),
                  scale, inputs.get("A"), inputs.get("Na"), inputs.get("Rs"))
    return {"Y": y, "St": unit_statistics(y, int(wl.out_stats))} if wl.out_stats else y


def _random_inputs(wl: Conv2dWorkload, rng) -> dict:
    """``common.random_inputs``; with ``in_gate`` S the row sums of the maps of X (as a depthwise producer writes
    them) and the squeeze's and excite's weights as ``se_gate``'s tests draw them."""
    inputs = random_inputs(wl, rng)
    if wl.in_gate:
        x = inputs["X"].astype(np.float64) + 0.5  # a pool of post-activation values: a mean off zero
        inputs["X"] = x.astype(wl.dtype)
        inputs["S"] = x.sum(axis=3, keepdims=True).astype(wl.dtype)
        inputs.update(gate_weight_inputs(SEGateWorkload(scale_shape(wl), wl.in_gate, wl.gate_act1,
                                                        wl.gate_activation, wl.dtype), rng))
    return inputs


def features(v: dict, k: dict) -> dict:
    f = window_features(v, k, k["tile_oc"], v["OB"], 16)
    split = _log2(k.get("split_k", 1))  # work-items per tile: more of them, each with a shorter reduction
    return {**f, "items": f["items"] + split, "wg_size": f["wg_size"] + split, "split_k": split,
            "steps_per_item": _log2(v["CG4"] * v["R"] * v["S"] / k.get("split_k", 1))}


def lower(ctx, node, ins):
    """A conv2d graph node that is not depthwise: the grouped template when the groups pack into whole RGBA
    pixels (channels per group multiples of 4), else one convolution with block-diagonal weights (exact,
    groups times the FLOPs)."""
    data, w_name = ctx.shape(node.inputs[0]), node.inputs[1]
    w_shape, groups = ctx.shape(w_name), node.attrs.get("groups", 1)
    view = node.attrs.get("in_view")  # channels [at, at + c) of the input tensor, read in place (passes_attention)
    if view is not None:
        at, c = (int(v) for v in view)
        if is_depthwise((data[0], c, *data[2:]), w_shape, groups):
            return None  # the depthwise template's own in_view
        if groups != 1:
            raise ValueError(f"in_view {list(view)} of a convolution of groups {groups}: groups 1 only")
        view, data = ((c, data[2], data[3], "copy", 1, 1, 1, 1, at, data[1]),), (data[0], c, *data[2:])
    if is_depthwise(data, w_shape, groups):
        return None
    normed = bool(node.attrs.get("in_norm"))  # passes_layer_norm: B holds the weights' sums too (bias_length)
    sums = np.asarray(ctx.graph.params[w_name], np.float64).reshape(w_shape[0], -1).sum(axis=1) if normed else None
    fields, inputs = node_epilogue(ctx, node, sums)
    if view is not None:
        fields["in_read"] = view
    if node.attrs.get("patch_view"):  # passes_patches: MobileViT's unfold or fold written by this convolution
        fields["patch_view"] = tuple(node.attrs["patch_view"])
    extra, c = {}, data[1]
    if node.attrs.get("in_group_norm"):  # passes_layer_norm.norms_applied_as_read: a GroupNorm as read
        fields["in_group_norm"], inputs["Q"], affine = read_norm_operands(ctx, node, data[1])
        inputs["A"] = f"{node.name}.norm_affine"
        extra[inputs["A"]] = affine
    if node.attrs.get("in_response"):  # passes_response_norm.response_gates_in_convs: the gate computed from G
        fields["in_response"] = float(node.attrs["in_response"])
        inputs["Rg"] = f"{node.name}.response_gate"
        extra[inputs["Rg"]] = channel_blocks(ctx.graph.params[node.attrs["response_affine"]], data[1])
    if node.attrs.get("in_layer_norm"):  # passes_layer_norm.norms_applied_as_read: a LayerNorm over channels as read
        fields["in_layer_norm"] = float(node.attrs["in_layer_norm"])
        inputs["A"] = f"{node.name}.norm_affine"
        extra[inputs["A"]] = channel_blocks(ctx.graph.params[node.attrs["norm_affine"]], data[1])
    if node.attrs.get("out_norm"):  # passes_layer_norm.norms_into_convs: a GroupNorm of the output in the epilogue
        groups_, epsilon = node.attrs["out_norm"]
        fields["out_norm"] = (int(groups_), float(epsilon))
        inputs["Na"] = f"{node.name}.out_norm_affine"
        extra[inputs["Na"]] = channel_blocks(ctx.graph.params[node.attrs["out_norm_affine"]], w_shape[0])
    if node.attrs.get("residual_scale"):  # passes._scaled_residual: the residual times a per-channel constant
        fields["residual_scale"] = True
        inputs["Rs"] = f"{node.name}.residual_scale"
        extra[inputs["Rs"]] = channel_blocks(ctx.graph.params[node.attrs["residual_scale"]], w_shape[0])
    if node.attrs.get("out_stats"):  # passes_layer_norm.norm_statistics_into_producers: St, a second output
        fields["out_stats"] = int(node.attrs["out_stats"])  # the norm's groups: 1, C (an InstanceNorm), or G
    if normed:
        fields["in_norm"] = float(node.attrs["in_norm"])
        if node.attrs.get("norm_stats") is not None:  # GroupNorm(1): its statistics' chunk partials (N, 8 * chunks)
            inputs["P"] = ctx.packed(node.attrs["norm_stats"])
            fields["norm_partials"] = ctx.shape(node.attrs["norm_stats"])[1] // 8
    if groups > 1:
        cg, og = c // groups, w_shape[0] // groups
        if cg % 4 or og % 4:  # block-diagonal weights: one dense convolution
            w = ctx.graph.params[w_name]
            full = np.zeros((w_shape[0], c) + w_shape[2:], np.float32)
            for k in range(groups):
                full[k * og:(k + 1) * og, k * cg:(k + 1) * cg] = w[k * og:(k + 1) * og]
            w_name, w_shape, groups = f"{node.name}.block_diagonal_w", full.shape, 1
            extra[w_name] = full
    if node.attrs.get("in_gate"):  # passes_se.gates_in_readers: the gate computed from S, the maps' row sums
        gate_extra, gate_inputs, fields["in_gate"] = gate_params(ctx.graph, node.name, node.attrs["in_gate"])
        extra.update(gate_extra)
        inputs.update(gate_inputs)
        fields["gate_act1"], fields["gate_activation"] = node.attrs["in_gate_acts"]
    # a gate a channel and row (N, C, H, 1); in_gate's S is row sums, not a gate
    rows = "S" in inputs and ctx.shape(node.attrs["in_scale"])[2] > 1 and not node.attrs.get("in_gate")
    wl = Conv2dWorkload(data=data, kernel=w_shape, groups=groups, residual="Res" in inputs, in_scale="S" in inputs,
                        scale_rows=rows,
                        pad_mode=node.attrs.get("pad_mode", "zeros"), **window_fields(node), **fields)
    return wl, {"X": ins[0], "Wt": w_name, **inputs}, extra


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("kernel", "shape", "O,C,R,S", "weight shape", required=True),
                 *WINDOW_ARGS, WorkloadArg("groups", "int", "G", "grouped convolution (default 1)"),
                 *EPILOGUE_ARGS, WorkloadArg("residual", "flag", help="fuse a residual add of a second NCHW4c tensor"),
                 WorkloadArg("in_scale", "flag", help="multiply the input by a per-(n, channel) gate S of shape "
                             "N,C,1,1 as it is read (squeeze-excite)"),
                 WorkloadArg("scale_rows", "flag", help="with in_scale: the gate S is N,C,H,1, one a channel and input "
                             "row"),
                 PAD_MODE_ARG,
                 WorkloadArg("plain_input", "flag", help="read X as a row-major NCHW buffer (a model input, in place)"),
                 WorkloadArg("plain_output", "flag", help="write Y as a row-major NCHW buffer (a model output, in "
                             "place)"))

VARIABLES = dict(N="batch", C="input channels", H="input height", W="input width", O="output channels",
                 R="kernel height", S="kernel width", OH="output height", OW="output width",
                 C4="input-channel blocks of 4", OB="output-channel blocks of 4", G="groups",
                 CG4="input-channel blocks per group", OBG="output-channel blocks per group", data="data shape NCHW",
                 kernel="kernel shape OIHW", out="output shape NCHW", bias="fused bias",
                 residual="fused residual add", stride="stride (h, w)", dilation="dilation (h, w)",
                 plain_input="X is the model input's row-major NCHW buffer (read in place, no relayout)",
                 plain_output="Y is the model output's row-major NCHW buffer (written in place, no relayout)",
                 in_read="the input read in parts through views (concat, nearest upsample, pool): () when not",
                 in_norm="the input's LayerNorm epsilon (over channels, per pixel), 0 when none",
                 norm_partials="with in_norm: the input's GroupNorm(1) statistics as that many chunk partials in P "
                 "(over the image), 0 for a LayerNorm",
                 in_group_norm="the input group-normalized (and its affine and activation) as it is read",
                 in_layer_norm="the input layer-normalized over its channels at each pixel as it is read",
                 norm_local="bytes of local memory in_group_norm's factors take where kept (keep_norm_factors)",
                 out_norm="the output group-normalized in the epilogue (a work-group holds whole groups)",
                 norm_blocks="with out_norm: output blocks a tile holds together (a group's)",
                 out_stats="the output's norm statistics written too (a local tree a work-group)",
                 stats_blocks="with out_stats: the blocks of 4 channels of the norm's unit (0: the whole image)",
                 in_gate="the squeeze channels of a squeeze-excite gate each work-group computes from the input's row "
                 "sums (0: none)")
TEMPLATE = Template("conv2d", Conv2dWorkload, Conv2dConfig, conv2d_nchw4c, _reference, _random_inputs,
                    fallback, space_vars, VARIABLES, features=features, model_knobs=MODEL_KNOBS,
                    workload_args=WORKLOAD_ARGS, graph_ops=("conv2d",), lower=lower,
                    reduction=lambda wl: wl.data[1] // wl.groups * wl.kernel[2] * wl.kernel[3], side_outputs=("St",))
