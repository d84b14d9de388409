"""Depthwise conv2d (channel multiplier 1) over NCHW4c activations: each channel block of 4 (one RGBA pixel)
is filtered by its own 4-lane weight pixels, elementwise. Weights are logical ``[C, 1, R, S]`` packed by 4
along C, by the MACE depthwise-filter mapping or OIHW4o's (the same pixels when the multiplier is 1).

With the window unrolled, each work-item loads every input pixel of a filter row once and reuses it for
all the taps and output columns of its tile that read it (MACE's depthwise schedule)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.activations import canonical
from tuner.ir.expr import Ramp, as_expr, min_
from tuner.ir.kernel import Program
from tuner.ir.schedule import cache_read
from tuner.templates.common import EPILOGUE_ARGS, WINDOW_ARGS, Template, WorkloadArg, node_epilogue
from tuner.ir.gather import shifted_pixel
from tuner.templates.common import (MODEL_KNOBS, Arithmetic, Conv2dWorkload, LocalTile,
                                           declare_operands, fit_work_group, gpu_fill_target,
                                           padded, padded_tap, pixel as pixel_at,
                                           is_depthwise,
                                           window_fields,
                                           padded_windows, random_inputs, reference_epilogue, scope_layout,
                                           store_tile, texture_scopes, window_features)
from tuner.templates.reduction import SLOT_ALIGN, last_to_arrive
from tuner.templates.se_gate import (GATE_INPUTS, GateSteps, SEGateWorkload, gate_params, gate_weight_inputs,
                                     gate_weights, shared_gate_rule)
from tuner.templates.se_gate import reference as gate_reference


@dataclass(frozen=True)
class DepthwiseWorkload:
    """Canonical key of a depthwise convolution: data N,C,H,W and kernel C,1,R,S."""
    data: tuple
    kernel: tuple
    stride: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)
    dilation: tuple = (1, 1)
    dtype: str = "float32"
    bias: bool = False
    activation: str = "none"
    residual: bool = False
    row_sums: bool = False  # also write each output row's sum, (N, C, OH, 1) as ``Q``: a squeeze-excite pool's
    # partials from the epilogue (``passes_se.pool_rows_in_depthwise``); the work-group spans whole rows
    in_view: tuple = ()  # (offset, channels): X is channels offset..offset + C of a tensor of ``channels``
    # channels (same N, H, W), the offset a multiple of 4, read in place: a chunk of a channel split
    # (``passes_movement.fold_gathers_into_convs``; before, the convolution ran on every channel of the source)
    in_add: tuple = ()  # (channels, offset): the input read is X + channels offset..offset + C of ``A``, a tensor
    # of ``channels`` channels and X's N, H, W, at any offset (two loads a pixel inside one): EdgeNeXt's SDTA
    # cascade, each chunk plus the previous depthwise output (``passes_movement.adds_into_depthwise``)
    gate: int = 0  # S > 0: the squeeze-excite gate of the output, ``se_gate``'s with S squeeze channels and the
    # activations below, computed by the last work-group of each image to finish (``passes_se.gates_in_depthwise``):
    # Q is then the gate (N, C, 1, 1), from the row sums the work-groups leave in a workspace, and the squeeze's and
    # the excite's weights are inputs (W1, B1, W2, B2 as ``se_gate`` takes them); the work-group spans whole rows
    gate_act1: str = "none"  # with ``gate``: the squeeze's activation (``se_gate``'s act1)
    gate_activation: str = "none"  # with ``gate``: the gate's activation (Sigmoid, HardSigmoid)

    def __post_init__(self):
        # share conv2d's normalisation and checks through an equivalent grouped description
        if len(tuple(self.data)) != 4 or len(tuple(self.kernel)) != 4:
            raise ValueError(f"depthwise_conv2d wants data N,C,H,W and kernel C,1,R,S; got {self.data} "
                             f"and {self.kernel}")
        data, kernel = tuple(int(x) for x in self.data), tuple(int(x) for x in self.kernel)
        if min(data + kernel) < 1:
            raise ValueError(f"depthwise_conv2d shapes must be positive: data {list(data)}, kernel {list(kernel)}")
        if kernel[0] != data[1] or kernel[1] != 1:
            raise ValueError(f"depthwise_conv2d (multiplier 1) wants kernel {data[1]},1,R,S for {data[1]} "
                             f"channels; got {list(kernel)}")
        probe = Conv2dWorkload((data[0], 1, *data[2:]), (1, 1, *kernel[2:]), self.stride, self.padding,
                               self.dilation, dtype=self.dtype, activation=self.activation)
        for name in ("stride", "padding", "dilation", "activation"):
            object.__setattr__(self, name, getattr(probe, name))
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "in_add", tuple(int(x) for x in self.in_add))
        object.__setattr__(self, "in_view", tuple(int(x) for x in self.in_view))
        object.__setattr__(self, "gate", int(self.gate))
        if self.gate < 0 or (self.gate and self.row_sums):
            raise ValueError(f"depthwise_conv2d gate={self.gate}: the squeeze channels of the output's gate (0: none), "
                             f"not with row_sums (Q is either the row sums or the gate)")
        for name in ("gate_act1", "gate_activation"):
            object.__setattr__(self, name, canonical(getattr(self, name)))
        if "prelu" in (self.gate_act1, self.gate_activation):
            raise ValueError("depthwise_conv2d gate activations: a per-channel PReLU has no slopes here")
        if self.in_view and (len(self.in_view) != 2 or self.in_view[0] < 0 or self.in_view[0] % 4
                             or self.in_view[0] + data[1] > self.in_view[1]):
            raise ValueError(f"depthwise_conv2d in_view {list(self.in_view)}: (offset, channels) of the tensor X "
                             f"reads, the offset a multiple of 4 and offset + {data[1]} within its channels")
        if self.in_add and (len(self.in_add) != 2 or self.in_add[1] < 0 or self.in_add[1] + data[1] > self.in_add[0]):
            raise ValueError(f"depthwise_conv2d in_add {list(self.in_add)}: (channels, offset) of the addend A, "
                             f"offset + {data[1]} within its channels")

    @property
    def out_shape(self) -> tuple:
        N, C, H, W = self.data
        _, _, R, S = self.kernel
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = self.stride, self.dilation, self.padding
        return N, C, (H + pt + pb - dh * (R - 1) - 1) // sh + 1, (W + pl + pr - dw * (S - 1) - 1) // sw + 1

    @property
    def flops(self) -> int:
        N, C, OH, OW = self.out_shape
        return 2 * N * C * OH * OW * self.kernel[2] * self.kernel[3]

    @property
    def rows_shape(self) -> tuple:
        """``Q``'s shape with ``row_sums`` (the workspace's with ``gate``): every output row summed over its
        columns, (N, C, OH, 1)."""
        N, C, OH, _ = self.out_shape
        return N, C, OH, 1

    @property
    def whole_rows(self) -> bool:
        """Whether a work-group spans whole output rows: with ``row_sums`` or ``gate``."""
        return self.row_sums or bool(self.gate)

    def key(self) -> dict:
        key = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        for k in ("row_sums", "in_add", "in_view", "gate"):  # the keys logged before these fields stay the same
            if not key[k]:
                del key[k]
        if not self.gate:
            del key["gate_act1"], key["gate_activation"]
        return {"op": "depthwise_conv2d", **key}


@dataclass(frozen=True)
class DepthwiseConfig:
    """One value per knob of ``search_space/depthwise_conv2d.toml``."""
    tile_cb: int = 1  # channel blocks of 4 per work-item
    tile_oh: int = 1
    tile_ow: int = 2
    wg_w: int = 8
    wg_h: int = 1
    unroll_rs: bool = True  # unrolled window: each input pixel of a filter row is loaded once per tile
    input_scope: str = "texture"
    weight_scope: str = "texture"
    output_scope: str = "texture"
    act_layout: str = "nchw4c"
    weight_layout: str = "mace_depthwise_filter"  # or oihw4o
    cache_input: bool = False
    local_input: bool = False  # a work-group stages its input tile (window halo included) in __local memory
    compute: str = "float32"  # float32; half: half4 loads and products, float32 sums; half_acc: half sums too


def depthwise_conv2d_nchw4c(wl: DepthwiseWorkload, cfg: DepthwiseConfig):
    (N, C, H, W), (_, _, R, S) = wl.data, wl.kernel
    _, _, OH, OW = wl.out_shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = wl.stride, wl.dilation, wl.padding
    CB = -(-C // 4)
    X, Wt, B, Res, Y = declare_operands(wl, cfg, C)
    at = 0  # the first block X reads
    if wl.in_view:
        at, X = wl.in_view[0] // 4, buffer("X", (N, wl.in_view[1], H, W), wl.dtype,
                                           *scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer"))
    Q = buffer("Q", wl.rows_shape if wl.row_sums else (N, C, 1, 1), wl.dtype,
               *scope_layout(cfg.output_scope, cfg.act_layout, "nchw4c_buffer")) if wl.whole_rows else None
    Qr = buffer("Qr", gate_rows_shape(wl), "float32", "global", "nchw4c_buffer") if wl.gate else Q  # row sums
    gate_in = list(gate_weights(wl.gate, C, wl.dtype)) if wl.gate else []
    A = buffer("A", (N, wl.in_add[0], H, W), wl.dtype,
               *scope_layout(cfg.input_scope, cfg.act_layout, "nchw4c_buffer")) if wl.in_add else None
    operands = (X, Wt, B, Res, Y, Q, A, *gate_in)

    t_cb, t_oh, t_ow = cfg.tile_cb, cfg.tile_oh, cfg.tile_ow
    n_cb, n_oh, n_ow = -(-CB // t_cb), -(-OH // t_oh), -(-OW // t_ow)
    if Q is not None and cfg.wg_w < n_ow:
        raise ValueError(f"{'gate' if wl.gate else 'row_sums'}: a work-group spans whole output rows "
                         f"(wg_w * tile_ow >= {OW}); "
                         f"wg_w={cfg.wg_w}, tile_ow={t_ow}")
    arith = Arithmetic(cfg.compute, wl.dtype)
    b = Builder()
    with b.loop("nb", N * n_cb, "group.2") as nb, b.loop("gh", -(-n_oh // cfg.wg_h), "group.1") as gh, \
            b.loop("th", cfg.wg_h, "local.1") as th, b.loop("gw", -(-n_ow // cfg.wg_w), "group.0") as gw, \
            b.loop("tw", cfg.wg_w, "local.0") as tw:
        n, cbb = nb // n_cb, nb % n_cb
        oh0, ow0 = (gh * cfg.wg_h + th) * t_oh, (gw * cfg.wg_w + tw) * t_ow
        acc = arith.accumulators(b, t_cb * t_oh * t_ow)
        tile = None

        def read(cb, ih, iw, name):
            """The input pixel (block ``cb``) at a tap, zero in the padding: X's, plus A's channels with
            ``in_add`` (``input_pixel``'s read, with the addend)."""
            inside, ih, iw = padded_tap(ih, iw, H, W)
            v = arith.load(pixel_at(X, n, cb + at, ih, iw))
            if A is not None:
                v = v + arith.load(shifted_pixel(b, A, n, cb, (ih, iw), -wl.in_add[1], wl.in_add[0], f"{name}_a"))
            return padded(inside, v)

        if cfg.local_input:  # the work-group's t_cb channel blocks, halo included, staged once (one step)
            tile = LocalTile(b, cfg, (t_cb, t_oh, t_ow), (sh, sw), (dh, dw), (R, S), arith)
            tile.load(lambda k, ih, iw: read(min_(cbb * t_cb + k, CB - 1), ih, iw, "ld"),
                      (gh * cfg.wg_h * t_oh * sh - pt, gw * cfg.wg_w * t_ow * sw - pl), th * cfg.wg_w + tw)

        def pixel(name, cb, ih, iw):
            return b.let(name, read(cb, ih, iw, name))

        def tap(name, k, y, x, r, s, cb, ih, iw):
            """Input pixel of tile entry (k, y, x) at window tap (r, s): from the local tile or the input."""
            if tile is not None:
                return b.let(name, tile.read(k, th, tw, y, x, r, s))
            return pixel(name, cb, ih, iw)

        with b.loop("r", R, "unrolled" if cfg.unroll_rs else "serial") as r:
            for k in range(t_cb):
                cb = min_(cbb * t_cb + k, CB - 1)  # a partial last tile recomputes the last block
                lanes = Ramp(cb * 4, as_expr(1), 4)
                for y in range(t_oh):
                    ih = (oh0 + y) * sh - pt + r * dh
                    if cfg.unroll_rs:  # the distinct input columns of this row, each loaded once
                        cols = sorted({x * sw + s * dw for x in range(t_ow) for s in range(S)})
                        pix = {d: b.let(f"x{k}_{y}_{d}", tile.read(k, th, tw, y, 0, r, 0, extra_col=d))
                               if tile is not None else pixel(f"x{k}_{y}_{d}", cb, ih, ow0 * sw - pl + d)
                               for d in cols}
                        for s in range(S):
                            w = b.let(f"w{k}_{y}_{s}", arith.load(Wt[lanes, 0, r, s]))
                            for x in range(t_ow):
                                i = (k * t_oh + y) * t_ow + x
                                b.store(acc, i, arith.mac(acc[i], pix[x * sw + s * dw] * w))
                    else:
                        with b.loop("s", S) as s:
                            w = b.let(f"w{k}_{y}", arith.load(Wt[lanes, 0, r, s]))
                            for x in range(t_ow):
                                i = (k * t_oh + y) * t_ow + x
                                v = tap(f"x{k}_{y}_{x}", k, y, x, r, s, cb, ih, (ow0 + x) * sw - pl + s * dw)
                                b.store(acc, i, arith.mac(acc[i], v * w))
        rows = None
        if Q is not None:
            rows = b.allocate("rows", (t_cb * t_oh,), "float32x4", "private")
            for i in range(t_cb * t_oh):
                b.store(rows, i, 0.0)
        store_tile(b, acc, Y, n, cbb, oh0, ow0, (t_cb, t_oh, t_ow), (CB, OH, OW), wl, B, Res, rows=rows)
        if Q is not None:
            store_row_sums(b, rows, Qr, n, cbb, oh0, th, tw, cfg, (CB, OH))
        if wl.gate:
            work = gate_in_last_group(b, wl, cfg, gate_in, Qr, Q, n, th * cfg.wg_w + tw if cfg.wg_h > 1 else tw,
                                      n_cb * -(-n_oh // cfg.wg_h))
    kernel = b.kernel("depthwise_conv2d_nchw4c", [p for p in operands if p is not None] + (work if wl.gate else []))
    if wl.gate:  # the row sums and the arrival counters: workspaces of the launch
        kernel = Program(kernel.name, (kernel,), tuple(p for p in operands if p is not None), tuple(work))
    return cache_read(kernel, X, "texture", cfg.act_layout) if cfg.cache_input else kernel


def gate_rows_shape(wl: DepthwiseWorkload) -> tuple:
    """``gate``'s workspace of row sums, (N, C', OH, 1): C' >= C channels, so that each image's rows fill whole
    128-byte lines (``reduction.SLOT_ALIGN`` float4s). The last work-group of an image reads its rows only after
    every one was written; a line shared with another image could be in its cache from that image's, half
    written."""
    N, C, OH, _ = wl.rows_shape
    cb = -(-C // 4)
    while cb * OH % SLOT_ALIGN:
        cb += 1
    return N, 4 * cb, OH, 1


def gate_rule(wl: DepthwiseWorkload, cfg: DepthwiseConfig) -> tuple:
    """``gate``'s squeeze and excite as the work-group runs them: ``(K, E, loop)`` -- the work-items sharing a
    squeeze dot (``se_gate``'s ``fc_split``) and an output block's sum over the squeeze channels
    (``excite_split``), as many as the work-group has to spare, up to 16 (powers of two that divide the
    work-group's size: the space's sizes are powers of two); the weights' loops unrolled where they are short
    (their loads in flight together)."""
    return shared_gate_rule(cfg.wg_w * cfg.wg_h, wl.gate, -(-wl.data[1] // 4))


def gate_in_last_group(b, wl, cfg, weights, Qr, Q, n, lid, groups: int) -> list:
    """``gate``: the work-group that is the last of image ``n``'s ``groups`` to store its row sums in ``Qr``
    computes the image's gate into ``Q`` -- the means from the row sums, then ``se_gate``'s squeeze and excite
    (``GateSteps``) -- and returns the image's arrival counter to zero for the next launch (CUDA's
    threadFenceReduction; ``reduction.last_group_statistics`` is the same for a norm's statistics). The
    workspaces: ``[Qr, Sn]``."""
    (N, C, _, _), (_, _, OH, OW) = wl.data, wl.out_shape
    CB, S, L = -(-C // 4), wl.gate, cfg.wg_w * cfg.wg_h
    K, E, loop = gate_rule(wl, cfg)
    Sn = buffer("Sn", (N,), "int32", "global")
    steps = GateSteps(S, CB, wl.gate_act1, wl.gate_activation, L, K, 1, E, loop, tuple(weights), Q)
    last = b.allocate("glast", (1,), "int32", "local")
    pooled = b.allocate("gpooled", (CB,), "float32x4", "local")
    hidden = b.allocate("ghidden", (S,), "float32", "local")
    red1 = b.allocate("gred1", (L,), "float32", "local") if K > 1 else None
    red2 = b.allocate("gred2", (L,), "float32x4", "local") if E > 1 else None
    with last_to_arrive(b, last, Sn, n, groups, lid, L):  # the image's row sums all stored
        steps.pool_rows(b, n, lid, Qr, OH * OW, pooled)
        steps.squeeze(b, lid, red1, hidden, CB, steps.dot_w1(pooled))
        steps.excite(b, n, as_expr(0), lid, hidden, red2)
    return [Qr, Sn]


def store_row_sums(b, rows, Q, n, cbb, oh0, th, tw, cfg, bounds):
    """``row_sums``: the ``wg_w`` work-items of a work-group row add their tiles' row sums (``rows``: t_cb x t_oh
    float4, the stored values only) in local memory -- a tree of log2(wg_w) steps, or, for a width that is no
    power of two, the first work-item's loop -- and the first stores each output row's total in ``Q``."""
    (CB, OH), n_rows, L, wg_w = bounds, cfg.tile_cb * cfg.tile_oh, cfg.wg_w * cfg.wg_h, cfg.wg_w
    part = b.allocate("rowpart", (L * n_rows,), "float32x4", "local")
    lid = th * wg_w + tw if cfg.wg_h > 1 else tw
    first = th * wg_w if cfg.wg_h > 1 else as_expr(0)
    for i in range(n_rows):
        b.store(part, lid * n_rows + i, rows[i])
    tree = wg_w & (wg_w - 1) == 0
    step = wg_w // 2 if tree else 0
    while step >= 1:  # each step halves the work-items holding partial sums
        b.barrier()
        with b.if_(tw < step):
            for i in range(n_rows):
                b.store(part, lid * n_rows + i, part[lid * n_rows + i] + part[(lid + step) * n_rows + i])
        step //= 2
    b.barrier()
    with b.if_(tw < 1):
        for k in range(cfg.tile_cb):
            for y in range(cfg.tile_oh):
                i = k * cfg.tile_oh + y
                if tree:
                    value = part[first * n_rows + i]
                else:
                    total = b.allocate(f"rt{i}", (1,), "float32x4", "private")
                    b.store(total, 0, 0.0)
                    with b.loop(f"j{i}", wg_w, "serial") as j:
                        b.store(total, 0, total[0] + part[(first + j) * n_rows + i])
                    value = total[0]
                ob, oh = cbb * cfg.tile_cb + k, oh0 + y
                with b.if_((ob < CB) & (oh < OH)):
                    b.store(Q, (n, Ramp(ob * 4, as_expr(1), 4), oh, 0), value)


def reference(wl: DepthwiseWorkload, x, w, bias=None, residual=None, addend=None, gate=None):
    """NumPy depthwise conv2d in float64; with ``row_sums`` ``{"Y": output, "Q": its row sums}``, with ``gate``
    ``{"Y": output, "Q": its gate}`` (``gate``: the inputs W1, B1, W2, B2); with ``in_view`` the input is its
    channels of ``x``; with ``in_add`` plus its channels of ``addend``."""
    if wl.in_view:
        x = x[:, wl.in_view[0]:wl.in_view[0] + wl.data[1]]
    if wl.in_add:
        x = np.asarray(x, np.float64) + np.asarray(addend, np.float64)[:, wl.in_add[1]:wl.in_add[1] + wl.data[1]]
    out = np.zeros(wl.out_shape)
    for r, s, patch in padded_windows(wl, x):
        out += patch * w[:, 0, r, s].astype(np.float64)[None, :, None, None]
    y = reference_epilogue(wl, out, bias, residual)
    if wl.gate:
        return {"Y": y, "Q": gate_reference(SEGateWorkload(y.shape, wl.gate, wl.gate_act1, wl.gate_activation),
                                            {"X": y, **gate})}
    return {"Y": y, "Q": y.sum(axis=3, keepdims=True)} if wl.row_sums else y


def space_vars(wl: DepthwiseWorkload) -> dict:
    N, C, H, W = wl.data
    _, _, OH, OW = wl.out_shape
    return dict(N=N, C=C, H=H, W=W, R=wl.kernel[2], S=wl.kernel[3], OH=OH, OW=OW, CB=-(-C // 4),
                data=wl.data, kernel=wl.kernel, out=wl.out_shape, bias=wl.bias, residual=wl.residual,
                stride=wl.stride, dilation=wl.dilation, row_sums=wl.whole_rows,
                rows=wl.rows_shape if wl.row_sums else (N, wl.data[1], 1, 1), gate=bool(wl.gate),
                GS=wl.gate,
                x_data=(N, wl.in_view[1], H, W) if wl.in_view else wl.data,
                a_data=(N, wl.in_add[0], H, W) if wl.in_add else wl.data)


VARIABLES = dict(N="batch", C="channels", H="input height", W="input width", R="kernel height",
                 S="kernel width", OH="output height", OW="output width", CB="channel blocks of 4",
                 data="data shape NCHW", kernel="kernel shape C,1,R,S", out="output shape NCHW",
                 bias="fused bias", residual="fused residual add", stride="stride (h, w)",
                 dilation="dilation (h, w)", row_sums="a work-group spans whole output rows: it also writes their "
                 "sums (Q), or the gate from them (gate)", rows="Q's shape: (N, C, OH, 1), or (N, C, 1, 1) with gate",
                 gate="also computes the output's squeeze-excite gate (Q)", GS="the gate's squeeze channels (0: none)",
                 x_data="the shape of the tensor X binds (data, or with in_view the "
                 "tensor it is a chunk of)", a_data="the addend A's shape with in_add (else data)")


def fallback(wl: DepthwiseWorkload, info) -> DepthwiseConfig:
    """One channel block by up to 4 output columns per work-item, window unrolled, a 16x4 work-group
    trimmed to the output; textures on GPUs that can hold the tensors. On a GPU the work must also fill the
    device (``gpu_fill_target``): a layer with fewer output tiles than that takes narrower tiles, down to one
    column per work-item -- the shape of nearly every best depthwise config in the H100's and H200's logs."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", v["x_data"]), ("nchw4c", v["a_data"]), ("nchw4c", wl.out_shape),
                                      ("mace_depthwise_filter", wl.kernel)])
    tile_ow = 4 if v["OW"] >= 8 else 2 if v["OW"] >= 2 else 1
    target = gpu_fill_target(info)
    while tile_ow > 1 and v["N"] * v["CB"] * v["OH"] * -(-v["OW"] // tile_ow) < target:
        tile_ow //= 2
    if wl.whole_rows:  # a work-group across each output row: up to 64 work-items, tiles widened to fit
        while -(-v["OW"] // tile_ow) > min(64, info.max_work_item_sizes[0], info.max_work_group_size) \
                and tile_ow < 8:
            tile_ow *= 2
    wg_w, wg_h = fit_work_group(-(-v["OW"] // tile_ow), v["OH"], info)
    if wl.whole_rows:
        wg_w = 1 << (-(-v["OW"] // tile_ow) - 1).bit_length()
        wg_h = max(1, min(wg_h, info.max_work_group_size // wg_w))
    (sh, sw), (dh, dw) = wl.stride, wl.dilation  # a GPU stages the work-group's input tile in __local memory
    tile_px = ((wg_h - 1) * sh + (v["R"] - 1) * dh + 1) * ((wg_w * tile_ow - 1) * sw + (v["S"] - 1) * dw + 1)
    local = bool(target) and wl.stride == (1, 1) and wg_w * wg_h > 1 and tile_px * 16 <= info.local_mem_bytes
    return DepthwiseConfig(tile_cb=1, tile_oh=1, tile_ow=tile_ow, wg_w=wg_w, wg_h=wg_h,
                           unroll_rs=v["R"] * v["S"] <= 25, input_scope=scope, weight_scope=scope,
                           output_scope=scope, local_input=local)


def _reference(wl, inputs):
    return reference(wl, inputs["X"], inputs["Wt"], inputs.get("B"), inputs.get("Res"), inputs.get("A"),
                     {k: inputs[k] for k in GATE_INPUTS} if wl.gate else None)




def _random_inputs(wl, rng) -> dict:
    """``common.random_inputs``, and with ``gate`` the squeeze's and the excite's weights as ``se_gate``'s tests
    draw them."""
    inputs = random_inputs(wl, rng)
    if wl.gate:
        inputs.update(gate_weight_inputs(SEGateWorkload(wl.out_shape, wl.gate, wl.gate_act1, wl.gate_activation,
                                                        wl.dtype), rng))
    return inputs


def features(v: dict, k: dict) -> dict:
    return window_features(v, k, k["tile_cb"], v["CB"], 4)


def lower(ctx, node, ins):
    """A conv2d graph node with one filter per channel (groups == C == O)."""
    data, w_name = ctx.shape(node.inputs[0]), node.inputs[1]
    view = node.attrs.get("in_view")  # (at, c): channels at..at + c of the input tensor, read in place
    fields_view = {}
    if view is not None:
        fields_view, data = {"in_view": (int(view[0]), data[1])}, (data[0], int(view[1]), *data[2:])
    if not is_depthwise(data, ctx.shape(w_name), node.attrs.get("groups", 1)) or "in_scale" in node.attrs \
            or node.attrs.get("out_stats") or any(k in node.attrs for k in ("in_norm", "in_group_norm",
                                                                             "in_layer_norm", "out_norm")):
        return None  # (a second output of statistics: Q is the row sums'; a norm as read: the direct conv2d's)
    if node.attrs.get("pad_mode", "zeros") != "zeros":  # passes.fold_pads leaves a depthwise layer's Pad a kernel
        raise ValueError(f"pad_mode {node.attrs['pad_mode']!r}: the depthwise template pads with zeros only")
    fields, inputs = node_epilogue(ctx, node)
    if node.attrs.get("in_add") is not None:  # passes_movement.adds_into_depthwise: X + A's channels at in_add_at
        inputs["A"] = ctx.packed(node.attrs["in_add"])
        fields["in_add"] = (ctx.shape(node.attrs["in_add"])[1], int(node.attrs.get("in_add_at", 0)))
    extra = {}
    if node.attrs.get("gate"):  # passes_se.gates_in_depthwise: the squeeze-excite gate of the output too, as Q
        extra, gate_inputs, S = gate_params(ctx.graph, node.name, node.attrs["gate"])
        inputs.update(gate_inputs)
        fields["gate"], (fields["gate_act1"], fields["gate_activation"]) = S, node.attrs["gate_acts"]
    wl = DepthwiseWorkload(data=data, kernel=ctx.shape(w_name), residual="Res" in inputs, **window_fields(node),
                           row_sums=bool(node.attrs.get("row_sums")), **fields_view, **fields)
    return wl, {"X": ins[0], "Wt": w_name, **inputs}, extra


WORKLOAD_ARGS = (WorkloadArg("data", "shape", "N,C,H,W", "input shape", required=True),
                 WorkloadArg("kernel", "shape", "C,1,R,S", "weight shape", required=True), *WINDOW_ARGS,
                 *EPILOGUE_ARGS, WorkloadArg("residual", "flag", help="fuse a residual add of a second NCHW4c tensor"),
                 WorkloadArg("row_sums", "flag", help="also write each output row's sum (Q: N,C,OH,1)"),
                 WorkloadArg("in_view", "shape", "OFFSET,CHANNELS", "X is channels OFFSET.. of a tensor of "
                             "CHANNELS channels, read in place"),
                 WorkloadArg("in_add", "shape", "CHANNELS,OFFSET", "add channels OFFSET.. of a second tensor A "
                             "(CHANNELS channels) to the input as it is read"))
TEMPLATE = Template("depthwise_conv2d", DepthwiseWorkload, DepthwiseConfig, depthwise_conv2d_nchw4c, _reference,
                    _random_inputs, fallback, space_vars, VARIABLES, features=features,
                    model_knobs=MODEL_KNOBS, workload_args=WORKLOAD_ARGS, graph_ops=("conv2d",), lower=lower,
                    reduction=lambda wl: wl.kernel[2] * wl.kernel[3], side_outputs=("Q",))
