"""Squeeze-excite gate (issue 55, item 2): ``G = act2(W2 @ act1(W1 @ mean_hw(X) + B1) + B2)`` per image, the
whole SE block between the activation it reads and the convolution that multiplies its input by the gate (that
convolution's ``in_scale``) -- the global average pool and both 1x1 convolutions with their activations, which
ran as three launches (a ``spatial_reduce`` and two ``conv2d``), in one.

X is NCHW4c (N, C, H, W); the squeeze has S channels. Weights go as global buffers in every scope (read once per
work-group): ``W1`` (S, C) and ``W2`` (S, C) -- the second convolution's weights transposed, so that both are
rows of S packed by 4 along C (``row4_buffer``): the first is read as dot products of 4 channels, the second as
a float4 of 4 output channels a squeeze channel. ``B1`` (S,) and ``B2`` (C,) are padded to blocks of 4.

One work-group of ``wg_c x wg_p`` work-items per image:

1. the pool: ``wg_c`` channel blocks side by side (local axis 1), ``wg_p`` work-items over each block's pixels
   (local axis 0, W fastest), their sums met in a local-memory tree; the means of all C / 4 blocks are kept in
   local memory;
2. the squeeze: S dot products over the C / 4 blocks, ``fc_split`` work-items sharing each (a tree), then
   ``act1``;
3. the excite: ``excite_split`` work-items take each block of 4 output channels, each a float4 sum over its
   share of the S squeeze channels (every ``excite_split``-th), met in a local-memory tree, then ``act2``
   (Sigmoid, HardSigmoid), stored as the (N, C, 1, 1) gate. One work-item alone summed all S: a chain of S
   dependent loads and adds, which on the H200 took about 0.2 us a squeeze channel (EfficientNet-B0's last
   gates, S = 48, 15-18 us against 7 us at S = 6).

With ``unroll`` the squeeze's and the excite's loops over the weights are unrolled, so that their loads are in
flight together: each work-item of the squeeze reads S x C / (4 L) blocks of W1 whatever ``fc_split`` is, 27
at EfficientNet-B0's last gates, one after the other in a loop.

With ``split`` = T > 1 the pool takes a first kernel of its own -- N x ceil(C/4 / wg_c) x T work-groups, each
over a chunk of ceil(HW / T) pixels, writing its sums to a workspace -- and the gate kernel adds the T partials
of each block before step 2: two launches, every compute unit of a GPU busy on a large map (EfficientNet-B0's
112x112 and 56x56 blocks), where one work-group would read the whole map alone. The search space holds both;
the tuner measures which is faster per workload, and the fallback picks by the device and the map's size.

With ``partial_squeeze`` the squeeze is split too (two launches, ``split`` = 1 or more): each pool work-group
also computes its ``wg_c`` blocks' share of every squeeze channel's dot product (the squeeze is linear up to its
bias), stored as S partial dots, and the gate kernel adds its image's partials before ``act1``. No work-group
then reads all of W1: at EfficientNet-B0's last gates (C = 1152, S = 48) each of the one-launch kernel's
work-groups reads W1's 221 KB alone, pooling and squeezing before it can excite.

With ``last_group`` as well the gate takes no launch of its own: each pool work-group stores its partial dots,
fences them and counts itself in its image's arrival counter, and the last of the image's work-groups to arrive
adds the partials and excites every block, then returns the counter to zero for the next launch (CUDA's
threadFenceReduction, as a depthwise convolution computes its gate: ``depthwise_conv2d_nchw4c.gate_in_last_group``).
On the H200 the two launches of the partial squeeze took 13.2 us at EfficientNet-B0's last gates, about two
launches' worth, and the one-launch kernel whose work-groups each squeeze alone 15.4 us."""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.expr import Broadcast, Ramp, as_expr, call, min_, select
from tuner.ir.kernel import Program
from tuner.templates.common import Template, WorkloadArg, texture_scopes
from tuner.templates.reduction import (MAX_TEXELS_PER_ITEM, SLOT_ALIGN, ceil_div, last_to_arrive, packed,
                                      pow2_ceil, pow2_floor, unravel)


@dataclass(frozen=True)
class SEGateWorkload:
    """Canonical key: the NCHW input the pool reads, the squeeze channels, both activations."""
    data: tuple
    squeeze: int
    act1: str = "relu"  # after the squeeze (first) 1x1 convolution: ReLU (MobileNetV3), SiLU (EfficientNet)
    activation: str = "sigmoid"  # the gate's: Sigmoid, HardSigmoid
    dtype: str = "float32"
    pixels: int = 0  # 0: X is the map, pooled by its mean; P: X holds sums (a depthwise convolution's row sums,
    # ``passes_se.pool_rows_in_depthwise``), pooled by their sum over P pixels

    def __post_init__(self):
        object.__setattr__(self, "data", tuple(int(x) for x in self.data))
        object.__setattr__(self, "squeeze", int(self.squeeze))
        object.__setattr__(self, "act1", canonical(self.act1))
        object.__setattr__(self, "activation", canonical(self.activation))
        if len(self.data) != 4 or min(self.data) < 1:
            raise ValueError(f"se_gate data {list(self.data)}: want a positive 4-D NCHW shape")
        if self.squeeze < 1:
            raise ValueError(f"se_gate squeeze {self.squeeze}: at least one channel")
        if "prelu" in (self.act1, self.activation):
            raise ValueError("se_gate activations: a per-channel PReLU has no slopes here")
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")
        object.__setattr__(self, "pixels", int(self.pixels))
        if self.pixels < 0:
            raise ValueError(f"se_gate pixels {self.pixels}: 0 (X is the map) or the pixels X's sums cover")

    @property
    def divisor(self) -> int:
        """What the pool's sums are divided by: the pixels of X, or those its row sums cover."""
        return self.pixels or self.data[2] * self.data[3]

    @property
    def out_shape(self) -> tuple:
        return (self.data[0], self.data[1], 1, 1)

    @property
    def flops(self) -> int:
        N, C, H, W = self.data
        return N * C * H * W + 4 * N * C * self.squeeze

    def key(self) -> dict:
        key = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        if not self.pixels:  # the keys logged before the field stay the same
            del key["pixels"]
        return {"op": "se_gate", **key}


@dataclass(frozen=True)
class SEGateConfig:
    """One value per knob of ``search_space/se_gate.toml``."""
    wg_c: int = 4  # channel blocks pooled side by side in a work-group (local axis 1)
    wg_p: int = 16  # work-items over one block's pixels (local axis 0), met in a local-memory tree
    split: int = 1  # 1: one launch; T > 1: a pool kernel of T work-groups along the pixels, then the gate
    fc_split: int = 1  # work-items sharing one squeeze channel's dot product (a local-memory tree)
    excite_groups: int = 1  # work-groups per image, each pooling and squeezing alone and exciting 1/G of the blocks
    excite_split: int = 1  # work-items sharing one output block's sum over the squeeze channels (a local tree)
    unroll: bool = False  # the squeeze's and the excite's loops over the weights unrolled: their loads in flight
    # together rather than one after the other
    partial_squeeze: bool = False  # two launches: the pool's work-groups (``wg_c`` blocks, a chunk of pixels each)
    # also take their blocks' share of every squeeze channel's dot product, and the gate adds those shares
    last_group: bool = False  # with partial_squeeze, one launch: the last of an image's pool work-groups to finish
    # adds the shares and excites every block (``excite_groups`` 1), where the gate took a second launch
    inner: str = "pixels"  # what local axis 0 (the work-items a GPU coalesces, a CPU vectorizes across) runs
    # along: a block's pixels, or the channel blocks (and, after the pool, the output channels of the excite)
    input_scope: str = "texture"
    weight_scope: str = "texture"  # no weights in textures: tied to the input's scope by the space
    output_scope: str = "texture"


GATE_INPUTS = ("W1", "B1", "W2", "B2")  # the squeeze's and the excite's weights, wherever a gate is computed


def gate_weights(S: int, C: int, dtype: str) -> tuple:
    """A gate's weights as its kernels take them, global buffers in every scope: W1 and W2 (S, C) packed by 4
    along C (W2 the excite's weights transposed), B1 (S,) and B2 (C,) padded to blocks of 4; in ``GATE_INPUTS``'
    order."""
    return (packed("W1", (S, C), dtype, "buffer"), buffer("B1", (S,), dtype, "global", "bias4_buffer"),
            packed("W2", (S, C), dtype, "buffer"), buffer("B2", (C,), dtype, "global", "bias4_buffer"))


def gate_weight_inputs(wl: SEGateWorkload, rng) -> dict:
    """``random_inputs``' weights of the gate ``wl`` (``GATE_INPUTS``), for a kernel that computes the gate of a
    tensor it writes or reads."""
    drawn = random_inputs(wl, rng)
    return {k: drawn[k] for k in GATE_INPUTS}


def shared_gate_rule(L: int, S: int, CB: int) -> tuple:
    """A gate's squeeze and excite run by a work-group of ``L`` work-items that another kernel sized (a depthwise
    convolution's last work-group, every work-group of a convolution reading the gate): ``(K, E, loop)`` -- the
    work-items sharing a squeeze dot (``fc_split``) and an output block's sum over the S squeeze channels
    (``excite_split``), as many as the work-group has to spare, up to 16 (powers of two that divide L), and the
    weights' loops unrolled where they are short (their loads in flight together)."""
    K = max(1, min(pow2_floor(L // S), pow2_floor(CB), 16, L & -L))
    E = max(1, min(pow2_floor(L // CB), pow2_floor(S), 16, L & -L))
    return K, E, "unrolled" if -(-CB // K) <= 32 and -(-S // E) <= 32 else "serial"


def row_spread(L: int, CB: int, OH: int) -> int:
    """``GateSteps.pool_rows``' work-items a block where the work-group spreads each block's rows: as many as a
    work-group of ``L`` has for each of the ``CB`` blocks (a power of two), at most ``OH``, the rows."""
    return max(1, min(pow2_floor(max(L // CB, 1)), pow2_floor(OH)))


def shared_gate_bytes(L: int, S: int, CB: int) -> int:
    """The local memory ``shared_gate_rule``'s steps hold beside the block means and the gate: the squeeze
    channels and the two trees."""
    K, E, _ = shared_gate_rule(L, S, CB)
    return 4 * S + (4 * L if K > 1 else 0) + (16 * L if E > 1 else 0)


def _tree(b: Builder, buf, slot, base, k, size: int, stride: int = 1):
    """``buf[base]`` = the sum of ``buf[base + m * stride]`` for m < size (``slot`` = base + k * stride this
    work-item's, written before); every work-item of the group reaches each barrier."""
    s = size // 2
    while s >= 1:
        b.barrier()
        with b.if_(k < s):
            b.store(buf, slot, buf[slot] + buf[slot + s * stride])
        s //= 2
    b.barrier()
    return buf[base]


@contextmanager
def _items(b: Builder, groups: int, Lc: int, Lp: int, inner: str):
    """The work-groups and their ``Lc x Lp`` work-items: yields ``(g, lc, lp, i)``, ``i`` the flat id, consecutive
    along local axis 0 (the pixels' ``lp`` or, with ``inner == "channels"``, the blocks' ``lc``)."""
    if inner == "channels":
        with b.loop("g", groups, "group.0") as g, b.loop("lp", Lp, "local.1") as lp, \
                b.loop("lc", Lc, "local.0") as lc:
            yield g, lc, lp, b.let("i", lp * Lc + lc if Lp > 1 else lc)
    else:
        with b.loop("g", groups, "group.0") as g, b.loop("lc", Lc, "local.1") as lc, \
                b.loop("lp", Lp, "local.0") as lp:
            yield g, lc, lp, b.let("i", lc * Lp + lp if Lc > 1 else lp)


class GateSteps:
    """The squeeze and the excite of a gate (steps 2 and 3), emitted into a kernel whose work-group of ``L``
    work-items (flat id ``i``) has the block means, or terms that add up to the squeeze: ``se_gate``'s kernels, and
    the depthwise convolution that computes its gate in the last of its work-groups to finish (``gate``)."""

    def __init__(self, S: int, CB: int, act1: str, activation: str, L: int, K: int, G: int, E: int, weights_loop: str,
                 weights: tuple, Y):
        self.S, self.CB, self.act1, self.activation = S, CB, act1, activation
        self.L, self.K, self.G, self.E = L, K, G, E
        self.weights_loop, (self.W1, self.B1, self.W2, self.B2), self.Y = weights_loop, weights, Y
        self.CBg = ceil_div(CB, G)  # output blocks of one work-group's excite

    def shared_sums(self, b, i, red1, M: int, term, finish):
        """S sums of M terms each by the L work-items (flat id ``i``), ``fc_split`` (K) of them sharing each sum
        (every K-th term, then a tree in ``red1``): ``term(s, j)`` is term j of sum s (s clamped below S, so that
        every work-item reaches the tree), and ``finish(s, total)`` is done by the first of sum s's work-items."""
        S, K, L, weights_loop = self.S, self.K, self.L, self.weights_loop
        rounds = ceil_div(S * K, L)
        with b.loop("q", rounds, "serial") if rounds > 1 else nullcontext(as_expr(0)) as q:
            idx = b.let("si", q * L + i if rounds > 1 else i)
            s = b.let("s", idx // K if K > 1 else idx)
            kk = idx % K if K > 1 else as_expr(0)
            sc = b.let("sc", min_(s, S - 1)) if rounds * L > S * K else s  # clamped: every item reaches the tree
            acc1 = b.allocate("acc1", (1,), "float32", "private")
            b.store(acc1, 0, 0.0)
            per = ceil_div(M, K)
            with b.loop("j", per, weights_loop) if per > 1 else nullcontext(as_expr(0)) as j:
                cb = b.let("cb1", j * K + kk if K > 1 else j)
                with b.if_(cb < M) if per * K != M else nullcontext():
                    b.store(acc1, 0, acc1[0] + term(sc, cb))
            total = acc1[0]
            if K > 1:
                b.store(red1, i, total)
                total = _tree(b, red1, i, i - kk, kk, K)
            cond = [kk < 1] if K > 1 else []
            cond += [s < S] if rounds * L > S * K else []
            c = cond[0] if len(cond) == 1 else (cond[0] & cond[1]) if cond else None
            with b.if_(c) if c is not None else nullcontext():
                finish(s, total)

    def squeeze(self, b, i, red1, hidden, M: int, term):
        """Step 2: the S squeeze channels, each the sum of M terms plus its bias, through ``act1`` into
        ``hidden``, read by every work-item after the barrier."""
        self.shared_sums(b, i, red1, M, term,
                         lambda s, total: b.store(hidden, s, apply_ir(self.act1, b.let("h", total + self.B1[s]))))
        b.barrier()

    def pool_rows(self, b, n, i, rows, divisor: int, pooled, part=None) -> None:
        """Step 1 from row sums: the means of image ``n``'s CB blocks into the local ``pooled`` -- each block's
        sum of ``rows`` (N, C, OH, 1: a depthwise convolution's ``row_sums``) over its OH rows, over ``divisor``
        pixels -- the L work-items taking every L-th block; then the barrier. With ``part`` (a local array of L
        float4s, where the work-group has at least two work-items a block: ``row_spread``) the ``row_spread``
        work-items of a block take every P-th row each, and a tree in ``part`` adds their sums: a 112-row map's
        blocks are then not 112 loads one after the other."""
        CB, L, OH = self.CB, self.L, rows.shape[2]
        P = row_spread(L, CB, OH) if part is not None else 1
        if P > 1:
            cb, k = b.let("gcb", i % CB), b.let("gk", i // CB)
            acc = b.allocate("gsum", (1,), "float32x4", "private")
            b.store(acc, 0, 0.0)
            per = -(-OH // P)
            with b.if_(k < P) if CB * P < L else nullcontext():
                with b.loop("goh", per, "serial") as j:
                    oh = b.let("goh1", j * P + k)
                    with b.if_(oh < OH) if per * P != OH else nullcontext():
                        b.store(acc, 0, acc[0] + rows[n, Ramp(cb * 4, as_expr(1), 4), oh, 0])
            b.store(part, i, acc[0])
            total = _tree(b, part, i, cb, k, P, stride=CB)
            with b.if_(k < 1):
                b.store(pooled, cb, total * (1.0 / divisor))
            b.barrier()
            return
        rounds = -(-CB // L)
        with b.loop("gc", rounds, "serial") as gc:
            cb = b.let("gcb", gc * L + i)
            with b.if_(cb < CB) if rounds * L != CB else nullcontext():
                acc = b.allocate("gsum", (1,), "float32x4", "private")
                b.store(acc, 0, 0.0)
                with b.loop("goh", OH, "serial") as oh:
                    b.store(acc, 0, acc[0] + rows[n, Ramp(cb * 4, as_expr(1), 4), oh, 0])
                b.store(pooled, cb, acc[0] * (1.0 / divisor))
        b.barrier()

    def store_gate(self, b, n, cb, value) -> None:
        """Block ``cb`` of image ``n``'s gate: into the (N, C, 1, 1) output, or a local array of the CB blocks (a
        convolution that computes the gate it reads, ``Conv2dWorkload.in_gate``)."""
        if self.Y.scope == "local":
            b.store(self.Y, cb, value)
        else:
            b.store(self.Y, (n, Ramp(cb * 4, as_expr(1), 4), 0, 0), value)

    def dot_w1(self, means, block=lambda j: j):
        """Term j of squeeze channel s: W1's row s at channel block ``block(j)`` with the mean ``means[j]``."""
        return lambda s, j: call("dot", [self.W1[s, Ramp(block(j) * 4, as_expr(1), 4)], means[j]], "float32")

    def excite(self, b, n, part, i, hidden, red2):
        """Step 3 for image ``n``: part ``part`` of the G parts of the excite's output blocks, from the squeeze
        channels in ``hidden``."""
        S, CB, CBg, L, G, E, weights_loop = self.S, self.CB, self.CBg, self.L, self.G, self.E, self.weights_loop
        B2, W2 = self.B2, self.W2
        J = L // E  # output blocks a round takes, E work-items each
        out_rounds = ceil_div(CBg, J)
        jj, e = (b.let("jb", i % J), b.let("ex", i // J)) if E > 1 else (i, None)
        with b.loop("r", out_rounds, "serial") if out_rounds > 1 else nullcontext(as_expr(0)) as r:
            j = b.let("j2", r * J + jj if out_rounds > 1 else jj)
            cb = b.let("cb2", part * CBg + j) if G > 1 else j
            # on the lets themselves: the block's indices derive from cb, which an analysis of the source (the
            # artifact's check 11) bounds by the guard
            conds = ([j < CBg] if out_rounds * J != CBg and G > 1 else []) + \
                ([cb < CB] if G > 1 or out_rounds * J != CB else [])
            cond = conds[0] if len(conds) == 1 else (conds[0] & conds[1]) if conds else None
            if E == 1:  # as the records from before the knob ran (``LATE_KNOBS``): one work-item a block
                with b.if_(cond) if cond is not None else nullcontext():
                    lanes = Ramp(cb * 4, as_expr(1), 4)
                    gacc = b.allocate("gacc", (1,), "float32x4", "private")
                    b.store(gacc, 0, B2[lanes])
                    with b.loop("sq", S, weights_loop) as sq:
                        b.store(gacc, 0, gacc[0] + Broadcast(hidden[sq], 4) * W2[sq, lanes])
                    self.store_gate(b, n, cb, apply_ir(self.activation, b.let("gv", gacc[0])))
            else:
                gacc = b.allocate("gacc", (1,), "float32x4", "private")
                b.store(gacc, 0, 0.0)
                per = ceil_div(S, E)
                with b.if_(cond) if cond is not None else nullcontext():
                    lanes = Ramp(cb * 4, as_expr(1), 4)
                    with b.loop("sk", per, weights_loop) if per > 1 else nullcontext(as_expr(0)) as k:
                        sq = b.let("sq", k * E + e)
                        with b.if_(sq < S) if per * E != S else nullcontext():
                            b.store(gacc, 0, gacc[0] + Broadcast(hidden[sq], 4) * W2[sq, lanes])
                b.store(red2, i, gacc[0])  # every work-item reaches the tree's barriers, its block valid or not
                total = _tree(b, red2, i, jj, e, E, stride=J)
                with b.if_((e < 1) & cond if cond is not None else e < 1):
                    lanes = Ramp(cb * 4, as_expr(1), 4)
                    self.store_gate(b, n, cb, apply_ir(self.activation, b.let("gv", total + B2[lanes])))
            if E > 1 and out_rounds > 1:
                b.barrier()  # the next round's tree writes red2 again


def se_gate(wl: SEGateWorkload, cfg: SEGateConfig):
    N, C, H, W = wl.data
    S, CB, HW = wl.squeeze, ceil_div(C, 4), H * W
    Lc, Lp, T, K, G, E = cfg.wg_c, cfg.wg_p, cfg.split, cfg.fc_split, cfg.excite_groups, cfg.excite_split
    L = Lc * Lp
    if L % E:
        raise ValueError(f"excite_split={E}: must divide the work-group's {L} work-items")
    weights_loop = "unrolled" if cfg.unroll else "serial"
    X = packed("X", wl.data, wl.dtype, cfg.input_scope)
    Y = packed("Y", wl.out_shape, wl.dtype, cfg.output_scope)
    W1, B1, W2, B2 = gate_weights(S, C, wl.dtype)
    vec = Ramp(as_expr(0), as_expr(1), 4)
    chunk = ceil_div(HW, T)  # pixels of one pool work-group
    sums = buffer("part", (N * T * CB, 4), "float32", "global") if T > 1 else None
    cgroups = ceil_div(CB, Lc)
    ragged = cgroups * Lc != CB  # the last group of ``wg_c`` blocks reaches past C

    def pool_sums(b, red, n, cb, lc, lp, t):
        """Work-item (lc, lp)'s sum of block ``cb`` over its pixels of chunk ``t``, then the tree over the ``Lp``
        work-items of the block in the local ``red``: readable at ``red[lc * Lp]`` by all of them. A block past C
        (``ragged``) reads the last block instead, and its caller keeps no sum of it (or a zero)."""
        cb = min_(cb, CB - 1) if ragged else cb
        acc = b.allocate("acc", (1,), "float32x4", "private")
        b.store(acc, 0, 0.0)
        steps = ceil_div(chunk, Lp)
        with b.loop("k", steps, "serial") if steps > 1 else nullcontext(as_expr(0)) as k:
            j = k * Lp + lp if Lp > 1 else k
            e = b.let("e", t * chunk + j if T > 1 else j)
            conds = ([j < chunk] if T > 1 and steps * Lp != chunk else []) + \
                ([e < HW] if steps * Lp != chunk or chunk * T != HW else [])
            cond = conds[0] if len(conds) == 1 else (conds[0] & conds[1]) if conds else None
            with b.if_(cond) if cond is not None else nullcontext():
                h, w = unravel(b, e, (H, W), "p")
                b.store(acc, 0, acc[0] + X[n, Ramp(cb * 4, as_expr(1), 4), h, w])
        if Lp == 1:
            return acc[0]
        slot = lc * Lp + lp if Lc > 1 else lp
        base = lc * Lp if Lc > 1 else as_expr(0)
        b.store(red, slot, acc[0])
        return _tree(b, red, slot, base, lp, Lp)

    def locals_(b, pool: bool, means: bool = True):
        """The work-group's local arrays, at kernel scope (OpenCL wants them there): the block means (unless
        ``means`` is false: the squeeze adds partial dots instead), the pool's tree (with ``pool``), the squeeze
        channels, the squeeze dots' tree and the excite's tree."""
        return (b.allocate("pooled", (CB,), "float32x4", "local") if means else None,
                b.allocate("red", (L,), "float32x4", "local") if pool and Lp > 1 else None,
                b.allocate("hidden", (S,), "float32", "local"),
                (b.allocate("red1", (L,), "float32", "local") if K > 1 else None,
                 b.allocate("red2", (L,), "float32x4", "local") if E > 1 else None))

    CBg = ceil_div(CB, G)  # output blocks of one work-group's excite

    def image(b, g):
        """``(n, part)``: the image of gate work-group ``g`` and which of its G parts of the excite it writes."""
        if G == 1:
            return g, as_expr(0)
        n, part = unravel(b, g, (N, G), "x")
        return n, part

    steps = GateSteps(S, CB, wl.act1, wl.activation, L, K, G, E, weights_loop, (W1, B1, W2, B2), Y)
    shared_sums, squeeze, dot_w1, excite = steps.shared_sums, steps.squeeze, steps.dot_w1, steps.excite

    def _partial_squeeze(b):
        """Two launches. The first: N x ceil(C/4 / wg_c) x T work-groups, each pooling its ``wg_c`` blocks over
        its chunk of the pixels, then computing their share of every squeeze channel's dot product (``wg_c``
        blocks of W1's rows), stored as S partial dots a work-group. The second: N x G work-groups, each adding
        its image's partial dots (the squeeze is linear until its bias), then exciting its part of the blocks.
        Neither work-group reads all of W1, and no work-group pools all of X. With ``last_group`` one launch: the
        first's last work-group of an image to arrive does the second's work (G = 1)."""
        P = cgroups * T  # partial dots a squeeze channel
        # with last_group each image's dots start a 128-byte line (a line shared with another image could be in the
        # cache of its last work-group, half written) and a counter an image counts its work-groups' arrivals
        stride = -(-P * S // (4 * SLOT_ALIGN)) * 4 * SLOT_ALIGN if cfg.last_group else P * S
        dots = buffer("dots", (N * stride,), "float32", "global")
        Sn = buffer("Sn", (N,), "int32", "global")
        with _items(b, N * P, Lc, Lp, cfg.inner) as (gi, lc, lp, i):
            n, cg, t = unravel(b, gi, (N, cgroups, T), "g")
            first_block = b.let("cb0", cg * Lc) if cgroups > 1 else as_expr(0)
            cb = b.let("cb", first_block + lc) if Lc > 1 else first_block
            means = b.allocate("means", (Lc,), "float32x4", "local")
            red = b.allocate("red", (L,), "float32x4", "local") if Lp > 1 else None
            red1 = b.allocate("red1", (L,), "float32", "local") if K > 1 else None
            total = pool_sums(b, red, n, cb, lc, lp, t)
            mean = total * (1.0 / wl.divisor)
            with b.if_(lp < 1) if Lp > 1 else nullcontext():  # a block past C adds nothing to the dots
                b.store(means, lc, select(cb < CB, mean, Broadcast(as_expr(0.0), 4)) if ragged else mean)
            b.barrier()
            # the blocks past C read W1's last block, times a zero mean
            term = dot_w1(means, lambda j: min_(first_block + j, CB - 1) if ragged else first_block + j)
            if cfg.last_group:  # the gate's arrays at the kernel's scope too
                last = b.allocate("glast", (1,), "int32", "local")
                hidden = b.allocate("hidden", (S,), "float32", "local")
                red2 = b.allocate("red2", (L,), "float32x4", "local") if E > 1 else None
            slot = n * stride + (cg * T + t if T > 1 else cg) * S if cfg.last_group else gi * S
            shared_sums(b, i, red1, Lc, term, lambda s, total: b.store(dots, slot + s, total))
            if cfg.last_group:
                with last_to_arrive(b, last, Sn, n, P, i, L):  # the image's dots all stored
                    squeeze(b, i, red1, hidden, P, lambda s, j: dots[n * stride + j * S + s])
                    excite(b, n, as_expr(0), i, hidden, red2)
        if cfg.last_group:
            kernel = b.kernel("se_gate", [X, W1, B1, W2, B2, Y, dots, Sn])
            return Program("se_gate", (kernel,), (X, W1, B1, W2, B2, Y), (dots, Sn))
        first = b.kernel("se_gate_squeeze", [X, W1, dots])
        b = Builder()
        with _items(b, N * G, Lc, Lp, cfg.inner) as (g, lc, lp, i):
            n, part = image(b, g)
            _, _, hidden, (red1, red2) = locals_(b, False, means=False)
            squeeze(b, i, red1, hidden, P, lambda s, j: dots[(n * P + j) * S + s])
            excite(b, n, part, i, hidden, red2)
        second = b.kernel("se_gate", [dots, B1, W2, B2, Y])
        return Program("se_gate", (first, second), (X, W1, B1, W2, B2, Y), (dots,))

    b = Builder()
    if cfg.last_group and (not cfg.partial_squeeze or G > 1):
        raise ValueError(f"last_group with partial_squeeze={cfg.partial_squeeze}, excite_groups={G}: the last pool "
                         f"work-group of an image excites every block alone (partial_squeeze, excite_groups 1)")
    if cfg.partial_squeeze:
        return _partial_squeeze(b)
    if T == 1:
        with _items(b, N * G, Lc, Lp, cfg.inner) as (g, lc, lp, i):
            n, part = image(b, g)
            pooled, red, hidden, reds = locals_(b, True)
            with b.loop("c", cgroups, "serial") if cgroups > 1 else nullcontext(as_expr(0)) as c:
                cb = b.let("cb", c * Lc + lc if Lc > 1 else c)
                total = pool_sums(b, red, n, cb, lc, lp, as_expr(0))
                cond = ([lp < 1] if Lp > 1 else []) + ([cb < CB] if ragged else [])
                w = cond[0] if len(cond) == 1 else (cond[0] & cond[1]) if cond else None
                with b.if_(w) if w is not None else nullcontext():
                    b.store(pooled, cb, total * (1.0 / wl.divisor))
            b.barrier()
            squeeze(b, i, reds[0], hidden, CB, dot_w1(pooled))
            excite(b, n, part, i, hidden, reds[1])
        return b.kernel("se_gate", [X, W1, B1, W2, B2, Y])
    with _items(b, N * cgroups * T, Lc, Lp, cfg.inner) as (gi, lc, lp, _):
        n, cg, t = unravel(b, gi, (N, cgroups, T), "g")
        cb = b.let("cb", cg * Lc + lc if Lc > 1 else cg)
        red = b.allocate("red", (L,), "float32x4", "local") if Lp > 1 else None
        total = pool_sums(b, red, n, cb, lc, lp, t)
        cond = ([lp < 1] if Lp > 1 else []) + ([cb < CB] if ragged else [])
        w = cond[0] if len(cond) == 1 else (cond[0] & cond[1]) if cond else None
        with b.if_(w) if w is not None else nullcontext():
            b.store(sums, ((n * T + t) * CB + cb, vec), total)
    first = b.kernel("se_gate_pool", [X, sums])
    b = Builder()
    with _items(b, N * G, Lc, Lp, cfg.inner) as (g, lc, lp, i):
        n, part = image(b, g)
        pooled, _, hidden, reds = locals_(b, False)
        rounds = ceil_div(CB, L)
        with b.loop("c", rounds, "serial") if rounds > 1 else nullcontext(as_expr(0)) as c:
            cb = b.let("cb", c * L + i if rounds > 1 else i)
            with b.if_(cb < CB) if rounds * L != CB else nullcontext():
                acc = b.allocate("acc", (1,), "float32x4", "private")
                b.store(acc, 0, 0.0)
                with b.loop("t", T, "serial") as t:
                    b.store(acc, 0, acc[0] + sums[(n * T + t) * CB + cb, vec])
                b.store(pooled, cb, acc[0] * (1.0 / wl.divisor))
        b.barrier()
        squeeze(b, i, reds[0], hidden, CB, dot_w1(pooled))
        excite(b, n, part, i, hidden, reds[1])
    second = b.kernel("se_gate", [sums, W1, B1, W2, B2, Y])
    return Program("se_gate", (first, second), (X, W1, B1, W2, B2, Y), (sums,))


def reference(wl: SEGateWorkload, inputs: dict) -> np.ndarray:
    """float64: the pool's means, the squeeze (W1, B1, act1), the excite (W2 is the transposed (S, C)) and the
    gate's activation, as (N, C, 1, 1)."""
    x = np.asarray(inputs["X"], np.float64)
    f = lambda k: np.asarray(inputs[k], np.float64)  # noqa: E731
    p = x.sum(axis=(2, 3)) / wl.divisor
    h = apply_numpy(wl.act1, p @ f("W1").T + f("B1"))
    g = apply_numpy(wl.activation, h @ f("W2") + f("B2"))
    return g.reshape(wl.out_shape)


def random_inputs(wl: SEGateWorkload, rng) -> dict:
    """X with a mean off zero (a pool of post-activation values); weights scaled so both sums stay O(1)."""
    N, C, H, W = wl.data
    S = wl.squeeze
    return {"X": (rng.standard_normal(wl.data) + 0.5).astype(wl.dtype),
            "W1": (rng.standard_normal((S, C)) / math.sqrt(C)).astype(wl.dtype),
            "B1": rng.standard_normal(S).astype(wl.dtype) * np.asarray(0.5, wl.dtype),
            "W2": (rng.standard_normal((S, C)) * (2 / math.sqrt(S))).astype(wl.dtype),
            "B2": rng.standard_normal(C).astype(wl.dtype) * np.asarray(0.5, wl.dtype)}


def space_vars(wl: SEGateWorkload) -> dict:
    N, C, H, W = wl.data
    return dict(N=N, C=C, CB=ceil_div(C, 4), HW=H * W, S=wl.squeeze, data=wl.data, out=wl.out_shape)


VARIABLES = dict(N="batch", C="channels", CB="channel blocks of 4", HW="pixels pooled per channel",
                 S="squeeze channels", data="input shape N,C,H,W", out="output shape (N, C, 1, 1)")


GPU_ONE_GROUP_TEXELS = 16384  # a GPU fallback's one-launch gate pools at most this many texels (one work-group)


def fallback(wl: SEGateWorkload, info) -> SEGateConfig:
    """On a CPU (Intel's runtime: one work-group a core, barriers costly): one launch, no tree -- each work-item
    pools its channel blocks over all the pixels, in small work-groups (4 to 16 blocks side by side; 16 where the
    two convolutions' weights dominate, C x S >= 16K) -- unless a work-item would pool more than 1,024 texels, when
    work-items share the pixels. On a GPU: 256 work-items, up to 64 along the pixels, and the pool split into its
    own kernel along the pixels when one work-group would read more than ``GPU_ONE_GROUP_TEXELS`` texels (256 KiB
    in float32: 14x14 at 480 channels, 28x28 at 144), then about 16 texels a work-item; the squeeze dots shared by
    up to 16 work-items; where the two convolutions' weights are large (C x S >= 16K), the excite's output blocks
    spread over up to 16 work-groups an image, each of which pools and squeezes again (from the cache), and each
    output block's sum over the squeeze channels shared by the work-items a work-group has to spare, up to 16."""
    v = space_vars(wl)
    CB, HW, S = v["CB"], v["HW"], v["S"]
    scope = texture_scopes(wl, info, [("nchw4c", wl.data), ("nchw4c", wl.out_shape)])

    def fit(lc: int, lp: int) -> tuple:
        return max(1, min(lc, info.max_work_item_sizes[1], info.max_work_group_size // lp)), lp

    if info.type != "GPU":
        Lc = min(pow2_ceil(CB), 16 if v["C"] * S >= 16384 else 8 if HW > 64 else 4)
        Lp = 1
        while ceil_div(CB, Lc) * ceil_div(HW, Lp) > MAX_TEXELS_PER_ITEM and Lp < min(HW, info.max_work_item_sizes[0]):
            Lp *= 2
        Lc, Lp = fit(Lc, Lp)
        T = 1
        while ceil_div(CB, Lc) * ceil_div(ceil_div(HW, T), Lp) > MAX_TEXELS_PER_ITEM and T < 64 and T * 4 <= HW:
            T *= 2  # a work-group too small for a huge map: the pool split along the pixels
        return SEGateConfig(wg_c=Lc, wg_p=Lp, split=T, fc_split=1, input_scope=scope, weight_scope=scope,
                            output_scope=scope)
    cap = min(256, info.max_work_group_size)
    Lp = min(pow2_floor(HW), 64, info.max_work_item_sizes[0], cap)
    Lc, Lp = fit(min(cap // Lp, pow2_ceil(CB)), Lp)
    T = 1
    while CB * HW > GPU_ONE_GROUP_TEXELS and T < 64 and T * 4 <= HW and ceil_div(ceil_div(HW, T), Lp) > 16:
        T *= 2
    while ceil_div(CB, Lc) * ceil_div(ceil_div(HW, T), Lp) > MAX_TEXELS_PER_ITEM and T < 64 and T * 4 <= HW:
        T *= 2
    K = max(1, min(pow2_floor(Lc * Lp // max(S, 1)), pow2_floor(CB), 16))
    G = max(1, min(pow2_floor(v["C"] * S // 8192), pow2_floor(CB // 2), 16))  # the excite's weights over SMs
    E = max(1, min(pow2_floor(Lc * Lp // ceil_div(CB, G)), pow2_floor(S), 16))
    if (CB + 2 * Lc * Lp) * 16 + (S + Lc * Lp) * 4 > info.local_mem_bytes:
        E = 1  # the excite's tree would not fit beside the block means (the space's local_memory)
    return SEGateConfig(wg_c=Lc, wg_p=Lp, split=T, fc_split=K, excite_groups=G, excite_split=E, input_scope=scope,
                        weight_scope=scope, output_scope=scope)


def features(v: dict, k: dict) -> dict:
    """Texels a work-item pools, work-group size, pool and gate work-groups, the split, the squeeze dots' and the
    excite sums' sharing, and the squeeze and excite products a work-item computes."""
    log2 = lambda x: math.log2(max(float(x), 1.0))  # noqa: E731
    L, T, G, E = k["wg_c"] * k["wg_p"], k["split"], k["excite_groups"], k.get("excite_split", 1)
    partial, last = bool(k.get("partial_squeeze")), bool(k.get("last_group"))
    own_kernel = T > 1 or partial  # the pool in a kernel of its own (or, with last_group, the gate in its last group)
    texels = ceil_div(ceil_div(v["HW"], T), k["wg_p"]) * (1 if own_kernel else ceil_div(v["CB"], k["wg_c"]))
    pool_groups = v["N"] * (ceil_div(v["CB"], k["wg_c"]) * T if own_kernel else G)
    K = k["fc_split"]  # the squeeze's terms a work-item adds: over all blocks, or over its group's and the partials
    terms = ceil_div(k["wg_c"], K) + ceil_div(ceil_div(v["CB"], k["wg_c"]) * T, K) if partial else ceil_div(v["CB"], K)
    return {"work_per_item": log2(texels), "wg_size": log2(L), "groups": log2(pool_groups),
            "gate_groups": log2(v["N"] * G), "split": log2(T), "launches": 2.0 if own_kernel and not last else 1.0,
            "partial_squeeze": float(partial), "last_group": float(last),
            "fc_split": log2(K), "excite_split": log2(E), "unroll": float(bool(k.get("unroll"))),
            "fc_per_item": log2(ceil_div(v["S"] * K, L) * terms
                                + ceil_div(ceil_div(v["CB"], G) * E, L) * ceil_div(v["S"], E))}


def describe(wl: SEGateWorkload) -> str:
    N, C, H, W = wl.data
    return f"{N}x{C}x{H}x{W}" + (f" rows of {wl.pixels}" if wl.pixels else "") + \
        f" ->{wl.squeeze} +{wl.act1} +{wl.activation}" + \
        (" f16" if wl.dtype == "float16" else "")


def lower(ctx, node, ins):
    """An ``se_gate`` node (``passes_se.fuse_squeeze_excite``): inputs x, w1 (S, C, 1, 1), b1 (S,), w2 (C, S, 1, 1),
    b2 (C,); the weights go to the kernel as (S, C) rows, the second transposed."""
    extra, inputs, S = gate_params(ctx.graph, node.name, node.inputs[1:])
    wl = SEGateWorkload(ctx.shape(node.inputs[0]), S, node.attrs.get("act1", "none"),
                        node.attrs.get("activation", "none"), ctx.dtype, node.attrs.get("pixels", 0))
    return wl, {"X": ins[0], **inputs}, extra


def gate_params(g, name: str, params) -> tuple:
    """``(extra, inputs, S)``: a gate's weights as its kernel takes them -- the params ``w1`` (S, C, 1, 1), ``b1``
    (S,), ``w2`` (C, S, 1, 1), ``b2`` (C,) of graph ``g`` as ``<name>.w1`` (S, C) ... , the second transposed --
    the kernel inputs W1, B1, W2, B2 that name them, and S; an ``se_gate`` node's, or a depthwise convolution's
    that computes its output's gate (``gate``)."""
    w1, b1, w2, b2 = params
    S, C = g.shapes[w1][:2]
    extra = {f"{name}.w1": np.ascontiguousarray(np.asarray(g.params[w1], np.float32).reshape(S, C)),
             f"{name}.w2": np.ascontiguousarray(np.asarray(g.params[w2], np.float32).reshape(C, S).T),
             f"{name}.b1": np.ascontiguousarray(np.asarray(g.params[b1], np.float32).reshape(S)),
             f"{name}.b2": np.ascontiguousarray(np.asarray(g.params[b2], np.float32).reshape(C))}
    return extra, {k.upper(): f"{name}.{k}" for k in ("w1", "b1", "w2", "b2")}, S


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("squeeze", "int", "S", "squeeze channels", required=True),
                 WorkloadArg("act1", "activation", "ACT", "the squeeze's activation (default relu)"),
                 WorkloadArg("activation", "activation", "ACT", "the gate's activation (default sigmoid)"),
                 WorkloadArg("dtype", "dtype", help="storage dtype (arithmetic is float32)"),
                 WorkloadArg("pixels", "int", "P", "X holds row sums of a map of P pixels (default 0: X is the map)"))
TEMPLATE = Template("se_gate", SEGateWorkload, SEGateConfig, se_gate, reference, random_inputs, fallback, space_vars,
                    VARIABLES, features=features, describe=describe, workload_args=WORKLOAD_ARGS,
                    graph_ops=("se_gate",), lower=lower)
