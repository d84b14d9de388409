"""Batched matrix product of two activations: ``Y[b] = act(alpha * A[b] @ B[b] (+ bias)) (+ Res[b])`` with
``A`` (batch, M, K) and ``B`` (batch, K, N), or (batch, N, K) with ``trans_b`` -- attention's ``Q @ K^T`` and
``P @ V`` (issue #27).

Storage: a 3-D tensor ``(b, r, c)`` is stored exactly like the NCHW4c storage of the 4-D tensor ``(b, c, 1,
r)``, packed by 4 along its last axis (``nchw4c`` texture, ``nchw4c_buffer`` buffer). The kernel's parameters
are declared as those 4-D views (``storage_shape``; ``to_storage`` / ``from_storage`` convert arrays), so:

- ``A`` (B, M, K): view (B, K, 1, M) -- one pixel holds 4 reduction values of one row m;
- ``Bm`` (B, K, N): view (B, N, 1, K) -- one pixel holds 4 outputs n of one k (outer products, like dense's
  ``4o``); with ``trans_b``, (B, N, K): view (B, K, 1, N) -- 4 reduction values of one n (dot products
  summed across lanes at the end, like dense's ``4i``);
- ``Y`` and ``Res`` (B, M, N): view (B, N, 1, M); ``B`` (bias, N): the conv2d/dense bias buffer, beside ``Bm``.

Padding lanes of the inputs (a last axis not a multiple of 4) may hold anything: the reduction never uses an
``A`` or ``Bm`` lane past K (skipped, or zeroed by a select before the products), and the output's padding
lanes are written as zero whatever the bias, residual or ``Bm`` padding holds.

Each work-item computes ``tile_m`` rows by ``tile_n`` blocks of 4 outputs, rows and blocks interleaved with
its work-group's neighbours (neighbouring work-items read and write neighbouring pixels). ``split_k``
work-items share each tile's reduction (partial sums combined in local memory); ``local_a`` / ``local_b``
stage the work-group's tile of A / B for each ``unroll_k * split_k`` reduction blocks in local memory.

Scope knobs: ``input_scope`` is A's, ``weight_scope`` is B's (and the bias's), ``output_scope`` is Y's and the
residual's (the task, log and plan machinery names a template's operands input/weight/output;
``MatmulConfig.a_scope`` / ``b_scope`` read the first two under their own names)."""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import numpy as np

from tuner.ir.activations import apply_ir, apply_numpy, canonical
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.dtype import DType
from tuner.ir.expr import Cast, ExtractLane, Ramp, as_expr, call, min_, select
from tuner.templates.common import EPILOGUE_ARGS, Template, WorkloadArg, epilogue_text, shape_text
from tuner.templates.common import (Arithmetic, bias_buffer, fit_work_group, scope_layout, split_sums,
                                           texture_scopes)


def storage_shape(shape) -> tuple:
    """The 4-D NCHW view ``(b, c, 1, r)`` a 3-D tensor ``(b, r, c)`` is stored as (packed by 4 along ``c``)."""
    b, r, c = shape
    return b, c, 1, r


def to_storage(x: np.ndarray) -> np.ndarray:
    """A 3-D array ``(b, r, c)`` as its storage view ``(b, c, 1, r)`` (what the kernel's parameters take)."""
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 1)[:, :, None, :])


def from_storage(v: np.ndarray) -> np.ndarray:
    """The 3-D array ``(b, r, c)`` of a storage view ``(b, c, 1, r)``."""
    return np.ascontiguousarray(np.asarray(v)[:, :, 0, :].transpose(0, 2, 1))


@dataclass(frozen=True)
class MatmulWorkload:
    """Canonical key: ``a`` (B, M, K), ``b`` (B, K, N) or with ``trans_b`` (B, N, K); output (B, M, N) =
    ``act(alpha * a @ b + bias) + residual``; storage dtype."""
    a: tuple
    b: tuple
    trans_b: bool = False
    dtype: str = "float32"
    alpha: float = 1.0
    bias: bool = False
    activation: str = "none"
    residual: bool = False

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        try:
            set_("a", tuple(int(x) for x in self.a))
            set_("b", tuple(int(x) for x in self.b))
        except (TypeError, ValueError):
            raise ValueError(f"matmul shapes a and b are 3 integers each (batch, rows, columns); got a={self.a!r}, "
                             f"b={self.b!r}") from None
        for name in ("trans_b", "bias", "residual"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"matmul {name} is true or false, got {getattr(self, name)!r}")
            set_(name, bool(getattr(self, name)))
        want_b = "B,N,K" if self.trans_b else "B,K,N"
        if len(self.a) != 3 or len(self.b) != 3:
            raise ValueError(f"matmul wants a B,M,K and b {want_b} (3 axes each); got a {list(self.a)}, "
                             f"b {list(self.b)}")
        if min(self.a + self.b) < 1:
            raise ValueError(f"matmul shapes must be positive: a {list(self.a)}, b {list(self.b)}")
        if self.a[0] != self.b[0]:
            raise ValueError(f"matmul batch of a ({self.a[0]}) and b ({self.b[0]}) must be equal (no broadcasting); "
                             f"got a {list(self.a)}, b {list(self.b)}")
        k_b = self.b[2] if self.trans_b else self.b[1]
        if self.a[2] != k_b:
            raise ValueError(f"matmul reduction mismatch: a {list(self.a)} has K={self.a[2]} but b {list(self.b)} "
                             f"({want_b}{', trans_b' if self.trans_b else ''}) has K={k_b}"
                             + ("" if self.trans_b or self.b[2] != self.a[2] else "; set trans_b for b as B,N,K"))
        if isinstance(self.alpha, (bool, np.bool_)):
            raise ValueError(f"matmul alpha is a number, got {self.alpha!r}")
        try:
            alpha = float(self.alpha)
        except (TypeError, ValueError):
            raise ValueError(f"matmul alpha must be a number (the scale of the product), got {self.alpha!r}") from None
        if not math.isfinite(alpha):
            raise ValueError(f"matmul alpha must be finite, got {self.alpha!r}")
        if abs(alpha) > float(np.finfo(np.float32).max):  # the kernel's float literal would be infinite
            raise ValueError(f"matmul alpha must be a float32 (at most {float(np.finfo(np.float32).max):.4g} in "
                             f"magnitude), got {self.alpha!r}")
        set_("alpha", alpha)
        set_("activation", canonical(self.activation))  # ValueError names the choices
        if self.dtype not in ("float32", "float16"):
            raise ValueError(f"dtype {self.dtype!r}: float32 or float16 storage")

    @property
    def batch(self) -> int:
        return self.a[0]

    @property
    def M(self) -> int:
        return self.a[1]

    @property
    def K(self) -> int:
        return self.a[2]

    @property
    def N(self) -> int:
        return self.b[1] if self.trans_b else self.b[2]

    @property
    def out_shape(self) -> tuple:
        return self.batch, self.M, self.N

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.M * self.N * self.K

    def key(self) -> dict:
        return {"op": "matmul", **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}}


@dataclass(frozen=True)
class MatmulConfig:
    """One value per knob of ``search_space/matmul.toml``."""
    tile_m: int = 1  # rows of M per work-item
    tile_n: int = 1  # blocks of 4 outputs (N) per work-item
    wg_m: int = 16  # work-group size along rows
    wg_n: int = 1  # work-group size along output blocks
    split_k: int = 1  # work-items sharing one reduction (partial sums combined in local memory)
    unroll_k: int = 1  # reduction blocks (of 4) unrolled
    vec_load: int = 4  # A loads: a float4 pixel per 4 reduction values, or one scalar each (buffer A, not trans_b)
    local_a: bool = False  # the work-group stages its tile of A in local memory per reduction step
    local_b: bool = False  # ... and/or its tile of B
    compute: str = "float32"  # float32; half: half4 loads and products, float32 sums; half_acc: half sums too
    input_scope: str = "texture"  # A
    weight_scope: str = "texture"  # B (and the bias)
    output_scope: str = "texture"  # Y (and the residual)

    @property
    def a_scope(self) -> str:
        return self.input_scope

    @property
    def b_scope(self) -> str:
        return self.weight_scope


def declare_operands(wl: MatmulWorkload, cfg: MatmulConfig) -> tuple:
    """``(A, Bm, B, Res, Y)``: the 4-D storage views in the config's scopes (bias ``B`` and ``Res`` None unless
    fused), in kernel argument order."""
    views = {"A": storage_shape(wl.a), "Bm": storage_shape(wl.b), "Y": storage_shape(wl.out_shape)}
    for knob in ("input_scope", "weight_scope", "output_scope"):
        if getattr(cfg, knob) not in ("texture", "buffer"):
            raise ValueError(f"matmul {knob}={getattr(cfg, knob)!r}: texture or buffer")
    a_scope, a_layout = scope_layout(cfg.input_scope, "nchw4c", "nchw4c_buffer")
    b_scope, b_layout = scope_layout(cfg.weight_scope, "nchw4c", "nchw4c_buffer")  # an activation: C0
    y_scope, y_layout = scope_layout(cfg.output_scope, "nchw4c", "nchw4c_buffer")
    return (buffer("A", views["A"], wl.dtype, a_scope, a_layout),
            buffer("Bm", views["Bm"], wl.dtype, b_scope, b_layout),
            bias_buffer(wl.N, wl.dtype, cfg.weight_scope) if wl.bias else None,
            buffer("Res", views["Y"], wl.dtype, y_scope, y_layout) if wl.residual else None,
            buffer("Y", views["Y"], wl.dtype, y_scope, y_layout))


def _check_config(wl: MatmulWorkload, cfg: MatmulConfig) -> None:
    """What the kernel itself cannot build (the search space's constraints say the rest)."""
    for knob, choices in (("tile_m", None), ("tile_n", None), ("wg_m", None), ("wg_n", None),
                          ("split_k", None), ("unroll_k", None), ("vec_load", (1, 4))):
        v = getattr(cfg, knob)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1 or (choices and v not in choices):
            want = " or ".join(map(str, choices)) if choices else "a positive integer"
            raise ValueError(f"matmul {knob}={v!r}: {want}")
    if cfg.vec_load == 1 and (cfg.input_scope != "buffer" or wl.trans_b or cfg.local_a):
        raise ValueError("matmul vec_load=1 (scalar A loads) needs input_scope=buffer, no trans_b and no local_a; "
                         "use vec_load=4")


def _masked(b, v, kb, K: int, name: str):
    """Pixel ``v`` of reduction block ``kb`` with its lanes past K zeroed (inputs' padding lanes hold anything);
    the pixel is read once, into ``name``."""
    if K % 4 == 0:
        return v
    v = b.let(name, v)
    lanes = [ExtractLane(v, j) if j < K % 4 else select(kb * 4 + j < K, ExtractLane(v, j), 0.0) for j in range(4)]
    return call("make_vector", lanes, v.dtype)


def _hsum(v):
    return ExtractLane(v, 0) + ExtractLane(v, 1) + ExtractLane(v, 2) + ExtractLane(v, 3)


def matmul(wl: MatmulWorkload, cfg: MatmulConfig):
    _check_config(wl, cfg)
    BATCH, M, K, N = wl.batch, wl.M, wl.K, wl.N
    KB, NB = -(-K // 4), -(-N // 4)
    A, Bm, Bias, Res, Y = operands = declare_operands(wl, cfg)
    t_m, t_n, sk, uk, wg_m, wg_n = cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.unroll_k, cfg.wg_m, cfg.wg_n
    trans = wl.trans_b
    chunk = uk * sk  # reduction blocks a work-group covers per step of the outer loop
    outer = -(-KB // chunk)
    ragged = outer * chunk != KB
    rows_g, cols_g = wg_m * t_m, wg_n * t_n  # rows and output blocks of one work-group
    items, arith = wg_m * wg_n * sk, Arithmetic(cfg.compute, wl.dtype)
    lanes_acc = 4 if trans else 1  # trans_b: a float4 of products per output, summed across lanes at the end
    tiles = [(i, j) for i in range(t_m) for j in range(t_n)]
    b = Builder()
    with b.loop("gb", BATCH, "group.2") as n, b.loop("tk", sk, "local.2") as tk, \
            b.loop("gn", -(-NB // cols_g), "group.1") as gn, b.loop("tn", wg_n, "local.1") as tn, \
            b.loop("gm", -(-M // rows_g), "group.0") as gm, b.loop("tm", wg_m, "local.0") as tm:
        m0, nb0 = gm * rows_g, gn * cols_g
        lid = (tk * wg_n + tn) * wg_m + tm
        rows = [b.let(f"m{i}", min_(m0 + i * wg_m + tm, M - 1)) for i in range(t_m)]  # clamped for reads
        blocks = [b.let(f"nb{j}", min_(nb0 + j * wg_n + tn, NB - 1)) for j in range(t_n)]
        acc = arith.accumulators(b, len(tiles) * lanes_acc)
        a_tile = b.allocate("a_tile", (chunk * rows_g,), arith.value, "local") if cfg.local_a else None
        b_tile = b.allocate("b_tile", (chunk * 4 * cols_g,), arith.value, "local") if cfg.local_b else None

        def a_pixel(kb, m, name):
            v = arith.load(A[n, Ramp(kb * 4, as_expr(1), 4), 0, m])
            return _masked(b, v, kb, K, name) if trans else v  # outer products skip A's padding lanes instead

        def b_pixel(kb_or_k, nb_or_n, name):
            """trans_b: the pixel of block ``kb`` at column n; else the pixel of blocks ``nb`` at row k."""
            if trans:
                return _masked(b, arith.load(Bm[n, Ramp(kb_or_k * 4, as_expr(1), 4), 0, nb_or_n]), kb_or_k, K, name)
            return arith.load(Bm[n, Ramp(nb_or_n * 4, as_expr(1), 4), 0, kb_or_k])

        with b.loop("jo", outer) as jo:
            kb0 = jo * chunk
            if a_tile is not None or b_tile is not None:
                if outer > 1:
                    b.barrier()  # every work-item is done reading the previous step's tiles
                if a_tile is not None:  # rows_g rows by chunk blocks: A pixels
                    _stage(b, a_tile, chunk * rows_g, items, lid, "la", lambda i: a_pixel(
                        min_(kb0 + i // rows_g, KB - 1), min_(m0 + i % rows_g, M - 1), "la_px"))
                if b_tile is not None and trans:  # 4 * cols_g columns n by chunk blocks
                    _stage(b, b_tile, chunk * 4 * cols_g, items, lid, "lb", lambda i: b_pixel(
                        min_(kb0 + i // (4 * cols_g), KB - 1), min_(nb0 * 4 + i % (4 * cols_g), N - 1), "lb_px"))
                elif b_tile is not None:  # cols_g output blocks by chunk * 4 rows k
                    _stage(b, b_tile, chunk * 4 * cols_g, items, lid, "lb", lambda i: b_pixel(
                        min_(kb0 * 4 + i // cols_g, K - 1), min_(nb0 + i % cols_g, NB - 1), "lb_px"))
                b.barrier()
            with b.loop("ji", uk, "unrolled") as ji:
                kk = ji * sk + tk  # block within the step: neighbouring work-items of a split, neighbouring blocks
                kb = kb0 + kk
                with b.if_(kb < KB) if ragged else nullcontext():
                    vector_a = cfg.vec_load == 4
                    xa = {}
                    if vector_a:
                        for i in range(t_m):
                            src = a_tile[kk * rows_g + i * wg_m + tm] if a_tile is not None else \
                                a_pixel(kb, rows[i], f"a{i}_px")
                            xa[i] = b.let(f"a{i}", src)
                    if trans:
                        for j in range(t_n):
                            for ln in range(4):
                                col = (j * wg_n + tn) * 4 + ln
                                src = b_tile[kk * 4 * cols_g + col] if b_tile is not None else \
                                    b_pixel(kb, min_(blocks[j] * 4 + ln, N - 1), f"w{j}_{ln}_px")
                                w = b.let(f"w{j}_{ln}", src)
                                for idx, (i, jj) in enumerate(tiles):
                                    if jj == j:
                                        q = idx * 4 + ln
                                        b.store(acc, q, arith.mac(acc[q], xa[i] * w))
                    else:
                        for ki in range(4):
                            # lanes past K exist only in the last block: skipped (B has no row there)
                            with b.if_(kb < KB - 1) if ki >= K % 4 > 0 else nullcontext():
                                if vector_a:
                                    xs = {i: ExtractLane(xa[i], ki) for i in range(t_m)}
                                else:
                                    xs = {i: b.let(f"a{i}_{ki}", arith.load(A[n, kb * 4 + ki, 0, rows[i]]))
                                          for i in range(t_m)}
                                for j in range(t_n):
                                    src = b_tile[(kk * 4 + ki) * cols_g + j * wg_n + tn] if b_tile is not None else \
                                        b_pixel(kb * 4 + ki, blocks[j], f"w{j}_{ki}_px")
                                    w = b.let(f"w{j}_{ki}", src)
                                    for idx, (i, jj) in enumerate(tiles):
                                        if jj == j:
                                            b.store(acc, idx, arith.mac(acc[idx], xs[i] * w))
        total = (lambda q: Cast(DType("float32", 4), acc[q])) if arith.acc != "float32x4" else (lambda q: acc[q])
        if trans:
            sums = [call("make_vector", [_hsum(total(idx * 4 + ln)) for ln in range(4)], "float32x4")
                    for idx in range(len(tiles))]
        else:
            sums = [total(idx) for idx in range(len(tiles))]
        owner = None
        if sk > 1:
            sums, owner = split_sums(b, sums, len(tiles), sk, tk, wg_m * wg_n, tn * wg_m + tm, "float32x4")
        for idx, (i, j) in enumerate(tiles):
            m, nb = m0 + i * wg_m + tm, nb0 + j * wg_n + tn
            inside = (m < M) & (nb < NB)
            with b.if_(inside & owner(idx) if owner is not None else inside):
                lanes = Ramp(nb * 4, as_expr(1), 4)
                v = sums[idx]
                if wl.alpha != 1.0:
                    v = v * wl.alpha
                if Bias is not None:
                    v = v + Bias[lanes]
                v = apply_ir(wl.activation, v)
                if Res is not None:
                    v = v + Res[n, lanes, 0, m]
                if N % 4:  # the output's padding lanes are zero, whatever B's, the bias's or Res's hold
                    y = b.let(f"y{i}_{j}", v)
                    v = call("make_vector", [ExtractLane(y, ln) if ln < N % 4 else
                                             select(nb * 4 + ln < N, ExtractLane(y, ln), 0.0) for ln in range(4)],
                             "float32x4")
                b.store(Y, (n, lanes, 0, m), v)
    return b.kernel("matmul", [p for p in operands if p is not None])


def _stage(b, tile, pixels: int, items: int, lid, name: str, pixel) -> None:
    """The work-group's ``items`` work-items copy ``pixels`` pixels (``pixel(i)``) into ``tile``, strided."""
    with b.loop(f"{name}_j", -(-pixels // items)) as j:
        i = b.let(f"{name}_i", j * items + lid)
        with b.if_(i < pixels) if pixels % items else nullcontext():
            b.store(tile, i, pixel(i))


def reference(wl: MatmulWorkload, a, bm, bias=None, residual=None) -> np.ndarray:
    """NumPy in float64 on the 3-D arrays: ``act(alpha * a @ b + bias) + residual`` of shape (B, M, N)."""
    bm = np.asarray(bm, np.float64)
    out = np.asarray(a, np.float64) @ (bm.transpose(0, 2, 1) if wl.trans_b else bm) * wl.alpha
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(1, 1, -1)
    out = apply_numpy(wl.activation, out)
    if residual is not None:
        out = out + np.asarray(residual, np.float64)
    return out


def _reference(wl: MatmulWorkload, inputs: dict) -> np.ndarray:
    """The reference on the kernel's parameters (4-D storage views), as the output's view."""
    res = inputs.get("Res")
    return to_storage(reference(wl, from_storage(inputs["A"]), from_storage(inputs["Bm"]), inputs.get("B"),
                                None if res is None else from_storage(res)))


def random_inputs(wl: MatmulWorkload, rng) -> dict:
    """Random normal operands keyed by kernel parameter, as the storage views the parameters take."""
    draw = lambda shape: rng.standard_normal(shape).astype(wl.dtype)  # noqa: E731
    inputs = {"A": to_storage(draw(wl.a)), "Bm": to_storage(draw(wl.b))}
    if wl.bias:
        inputs["B"] = draw((wl.N,))
    if wl.residual:
        inputs["Res"] = to_storage(draw(wl.out_shape))
    return inputs


def space_vars(wl: MatmulWorkload) -> dict:
    return dict(batch=wl.batch, M=wl.M, K=wl.K, N=wl.N, KB=-(-wl.K // 4), NB=-(-wl.N // 4), trans_b=wl.trans_b,
                a_view=storage_shape(wl.a), b_view=storage_shape(wl.b), out_view=storage_shape(wl.out_shape),
                bias=wl.bias, residual=wl.residual)


VARIABLES = dict(batch="batch B", M="rows of A and Y", K="reduction length", N="columns of Y",
                 KB="reduction blocks of 4", NB="output-column blocks of 4", trans_b="B given as B,N,K",
                 a_view="A's storage view (B, K, 1, M), NCHW", b_view="B's storage view (B, N, 1, K), or (B, K, 1, N) "
                 "with trans_b", out_view="Y's storage view (B, N, 1, M)", bias="fused bias",
                 residual="fused residual add")


def fallback(wl: MatmulWorkload, info) -> MatmulConfig:
    """4 rows by 2 output blocks per work-item where the output is that large, a work-group of up to 16x4
    trimmed to the output; a split reduction (up to 8 work-items) when the output has few tiles and the
    reduction is long; textures on GPUs that can hold the tensors."""
    v = space_vars(wl)
    scope = texture_scopes(wl, info, [("nchw4c", v["a_view"]), ("nchw4c", v["b_view"]), ("nchw4c", v["out_view"])])
    t_m = 4 if v["M"] >= 16 else 2 if v["M"] >= 2 else 1
    t_n = 2 if v["NB"] >= 2 else 1
    wg_m, wg_n = fit_work_group(-(-v["M"] // t_m), -(-v["NB"] // t_n), info)
    tiles = v["batch"] * -(-v["M"] // t_m) * -(-v["NB"] // t_n)
    split_k = 1
    while (split_k < 8 and tiles * split_k < 256 and split_k * 2 <= v["KB"] // 4
           and wg_m * wg_n * split_k * 2 <= info.max_work_group_size and split_k * 2 <= info.max_work_item_sizes[2]
           and split_k * 2 * wg_m * wg_n * t_m * t_n * 16 <= info.local_mem_bytes):
        split_k *= 2
    return MatmulConfig(tile_m=t_m, tile_n=t_n, wg_m=wg_m, wg_n=wg_n, split_k=split_k, unroll_k=1, vec_load=4,
                        local_a=False, local_b=False, compute="float32", input_scope=scope, weight_scope=scope,
                        output_scope=scope)


def features(v: dict, k: dict) -> dict:
    """What a config implies for the cost model (see ``conv2d_nchw4c.window_features``)."""
    log2 = lambda x: math.log2(max(float(x), 1.0))  # noqa: E731
    tile = k["tile_m"] * k["tile_n"]
    sk = k.get("split_k", 1)
    items = v["batch"] * math.ceil(v["M"] / k["tile_m"]) * math.ceil(v["NB"] / k["tile_n"]) * sk
    wg = k["wg_m"] * k["wg_n"] * sk
    reads = k["tile_m"] + 4 * k["tile_n"]  # pixels per reduction block against the tile's 16 * tile products
    return {"work_per_item": log2(tile), "wg_size": log2(wg), "items": log2(items), "groups": log2(items / wg),
            "bytes_per_mac": 16 * reads / (16 * tile),
            "registers": 4 * tile * (4 if v["trans_b"] else 1) + 4 * reads,
            "split_k": log2(sk), "steps_per_item": log2(v["KB"] / sk),
            "padding_waste": math.ceil(v["M"] / (k["tile_m"] * k["wg_m"])) * k["tile_m"] * k["wg_m"] / v["M"],
            "local_a": float(k.get("local_a", False)), "local_b": float(k.get("local_b", False)),
            "half": float(k.get("compute", "float32") != "float32")}


def describe(wl: MatmulWorkload) -> str:
    """``2x64x32 @ 2x64x32^T *0.125 +bias``"""
    alpha = f" *{wl.alpha:g}" if wl.alpha != 1.0 else ""
    return f"{shape_text(wl.a)} @ {shape_text(wl.b)}{'^T' if wl.trans_b else ''}{alpha}{epilogue_text(wl)}"


def lower(ctx, node, ins):
    """A matmul graph node: inputs [a, b, (bias), (residual)], attrs trans_b, alpha, activation and residual
    (true when the last input is the residual; a tensor name is taken too). The bias is a constant of N values
    (a (1, N)-like constant is reshaped to (N,))."""
    a = node.attrs
    rest, res = list(node.inputs[2:]), a.get("residual", False)
    res_name = None
    if isinstance(res, str):
        res_name = res
        rest = [x for x in rest if x != res]
    elif res:
        if not rest:
            raise ValueError(f"residual is true but the node has no residual input: inputs {list(node.inputs)} "
                             f"(expected [a, b, (bias), residual])")
        res_name = rest.pop()
    if len(rest) > 1:
        raise ValueError(f"matmul takes inputs [a, b, (bias), (residual)]; got {len(node.inputs)}: {list(node.inputs)}")
    wl = MatmulWorkload(a=ctx.shape(node.inputs[0]), b=ctx.shape(node.inputs[1]), trans_b=a.get("trans_b", False),
                        dtype=ctx.dtype, alpha=a.get("alpha", 1.0), bias=bool(rest),
                        activation=a.get("activation", "none"), residual=res_name is not None)
    inputs, extra = {"A": ins[0], "Bm": ins[1]}, {}
    if rest:
        bias = rest[0]
        if not ctx.is_param(bias):
            raise ValueError(f"the bias {bias!r} must be a constant of {wl.N} values (it is a tensor computed by "
                             f"the graph); add it with a separate node")
        shape = tuple(ctx.shape(bias))
        if math.prod(shape) != wl.N or (len(shape) > 1 and max(shape) != wl.N):
            raise ValueError(f"the bias {bias!r} has shape {list(shape)}: it must hold N={wl.N} values, one per "
                             f"output column")
        if shape != (wl.N,):
            name = f"{node.name}.bias"
            extra[name] = np.asarray(ctx.graph.params[bias], np.float32).reshape(wl.N)
            bias = name
        inputs["B"] = bias
    if res_name is not None:
        shape = tuple(ctx.shape(res_name))
        if shape != wl.out_shape:
            raise ValueError(f"the residual {res_name!r} has shape {list(shape)}; the output is {list(wl.out_shape)}")
        inputs["Res"] = ctx.packed(res_name)
    return wl, inputs, extra


WORKLOAD_ARGS = (WorkloadArg("a", "shape", "B,M,K", "A's shape (matmul)", required=True),
                 WorkloadArg("b", "shape", "B,K,N", "B's shape, B,N,K with --trans-b (matmul)", required=True),
                 WorkloadArg("trans_b", "flag", help="matmul: B is given as B,N,K (Q @ K^T)"),
                 WorkloadArg("alpha", "float", "X", "matmul: scale of the product (default 1)"),
                 *EPILOGUE_ARGS,
                 WorkloadArg("residual", "flag", help="fuse a residual add of a second NCHW4c tensor"))
TEMPLATE = Template("matmul", MatmulWorkload, MatmulConfig, matmul, _reference, random_inputs, fallback, space_vars,
                    VARIABLES, features=features, describe=describe, workload_args=WORKLOAD_ARGS,
                    graph_ops=("matmul",), lower=lower, scope_inputs={"input": "A", "weight": "Bm"})
