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

Views (``a_view``, ``b_view``, ``y_view``; not in the key: the loop nest is the same, a record of the plain
workload applies): an operand read, or the output written, in place inside another tensor instead of its own
storage -- attention's q, k and v as channel slices of a projection's NCHW output, its heads' outputs written back
as NCHW (``passes_tokens.matmul_views``), so no strided copy runs before or after the product. A view is
``(src, groups, c_off, c_group, r_off)``: the operand's element (b, r, c) (its storage pixel (b, c // 4, 0, r)) is
element ``(b // groups, c_off + (b % groups) * c_group + c, p // W, p % W)`` of the 4-D tensor stored as ``src``
(N, C, H, W), with ``p = r_off + r``: the heads of a batch as channel groups, the rows as pixels of any H x W.
Channel offsets are multiples of 4, so a pixel of the operand is a pixel of the source. With ``y_view`` the
residual is a tensor of the output's (the view's) shape, read through the same view (a residual add after the
product written in place: EfficientFormerV2's ``attn + v_local``).

``addend`` (in the key when set): a constant of the output's shape added with the bias, before the activation
(an attention bias): ``shared`` one (M, N) for every batch, ``batched`` one per batch; stored as ``C`` (1 or B,
N, 1, M) in a global buffer.

Scope knobs: ``input_scope`` is A's, ``weight_scope`` is B's (and the bias's), ``output_scope`` is Y's and the
residual's (the task, log and plan machinery names a template's operands input/weight/output;
``MatmulConfig.a_scope`` / ``b_scope`` read the first two under their own names)."""
from __future__ import annotations

import dataclasses
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
    addend: str = "none"  # a constant (1 or B, M, N) added before the activation: none, shared or batched
    a_view: tuple = ()  # (src, groups, c_off, c_group, r_off): A read in place (module docstring); not in the key
    b_view: tuple = ()  # ... B (as given: B,K,N, or B,N,K with trans_b)
    y_view: tuple = ()  # ... Y written in place: the view fills its tensor (every element once)

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
        if self.addend not in ADDENDS:
            raise ValueError(f"matmul addend {self.addend!r}: one of {', '.join(ADDENDS)}")
        for name, shape in (("a_view", self.a), ("b_view", self.b), ("y_view", self.out_shape)):
            set_(name, check_view(getattr(self, name), shape, name, write=name == "y_view"))

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
        """The log's key: no views (a record of the plain workload applies), ``addend`` only when set (the keys
        of every other matmul stay as they were before the field existed)."""
        return {"op": "matmul", **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()
                                   if k not in VIEWS and (k != "addend" or v != "none")}}

    def plain(self) -> "MatmulWorkload":
        """The workload without its views: what a record of its key measured."""
        return dataclasses.replace(self, **{k: () for k in VIEWS})


ADDENDS = ("none", "shared", "batched")
VIEWS = ("a_view", "b_view", "y_view")


def check_view(view, shape, name: str = "view", write: bool = False) -> tuple:
    """``()`` or ``(src, groups, c_off, c_group, r_off)`` checked against the operand's 3-D ``shape``
    (b, r, c): every element it names lies in ``src``, channel offsets start pixels, and a written view fills its
    tensor with whole pixels of its own (no two work-items write one pixel)."""
    if not view:
        return ()
    try:
        src, groups, c_off, c_group, r_off = view
        src, (groups, c_off, c_group, r_off) = tuple(int(d) for d in src), (int(x) for x in view[1:])
    except (TypeError, ValueError):
        raise ValueError(f"matmul {name} {view!r}: (source shape N,C,H,W, groups, channel offset, channel step per "
                         f"group, row offset)") from None
    (nb, rows, cols), g = shape, max(groups, 1)
    last_c = c_off + (g - 1) * c_group + cols
    problems = []
    if len(src) != 4 or min(src) < 1 or groups < 1 or min(c_off, c_group, r_off) < 0:
        problems.append("a 4-D source, groups >= 1 and offsets >= 0")
    elif nb % groups or nb // groups > src[0]:
        problems.append(f"batch {nb} in {groups} groups over the source's {src[0]} images")
    elif c_off % 4 or c_group % 4:
        problems.append(f"channel offsets {c_off} + g * {c_group} that start pixels (multiples of 4)")
    elif last_c > src[1]:
        problems.append(f"channels up to {last_c} within the source's {src[1]}")
    elif r_off + rows > src[2] * src[3]:
        problems.append(f"rows {r_off}..{r_off + rows} within the source's {src[2]}x{src[3]} pixels")
    elif write and (nb * rows * cols != math.prod(src) or (groups > 1 and c_group < cols)
                    or (cols % 4 and (groups > 1 or last_c != src[1]))):
        problems.append(f"an output that fills its {list(src)} tensor once, with whole pixels of its own")
    if problems:
        raise ValueError(f"matmul {name} {list(view)} for a {list(shape)} operand: wants {problems[0]}")
    return src, groups, c_off, c_group, r_off


def view_index(view, n, c, r, lanes: int = 4) -> tuple:
    """The index of the operand's element (n, c, r) -- with ``lanes`` 4, the pixel of channels c..c+3 -- in its
    own storage (b, c, 1, r) or, through ``view``, in the source's."""
    h, w = 0, r
    if view:
        src, groups, c_off, c_group, r_off = view
        if groups > 1:
            n, c = n // groups, c + (n % groups) * c_group
        c = c + c_off if c_off else c
        p = r + r_off if r_off else r
        h, w = (p // src[3], p % src[3]) if src[2] > 1 else (0, p)
    return n, (Ramp(c, as_expr(1), 4) if lanes == 4 else c), h, w


def view_gather(view, src: np.ndarray, shape) -> np.ndarray:
    """The operand (b, r, c) of ``shape`` read through ``view`` from its source's 4-D array."""
    _, groups, c_off, c_group, r_off = view
    b, r, c = np.ix_(*(np.arange(d) for d in shape))
    p = r + r_off
    return np.asarray(src)[b // groups, c_off + (b % groups) * c_group + c, p // src.shape[3], p % src.shape[3]]


def view_scatter(view, y: np.ndarray) -> np.ndarray:
    """The source-shaped array that the operand ``y`` (b, r, c) written through ``view`` fills."""
    src, groups, c_off, c_group, r_off = view
    out = np.zeros(src, y.dtype)
    b, r, c = np.ix_(*(np.arange(d) for d in y.shape))
    p = r + r_off
    out[b // groups, c_off + (b % groups) * c_group + c, p // src[3], p % src[3]] = y
    return out


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
    """``(A, Bm, B, Res, C, Y)``: the 4-D storage views in the config's scopes (a view's source where the operand
    has one; bias ``B``, ``Res`` and the addend ``C`` None unless fused), in kernel argument order."""
    views = {"A": wl.a_view[0] if wl.a_view else storage_shape(wl.a),
             "Bm": wl.b_view[0] if wl.b_view else storage_shape(wl.b),
             "Y": wl.y_view[0] if wl.y_view else storage_shape(wl.out_shape)}
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
            buffer("C", addend_shape(wl), wl.dtype, "global", "nchw4c_buffer") if wl.addend != "none" else None,
            buffer("Y", views["Y"], wl.dtype, y_scope, y_layout))


def addend_shape(wl: MatmulWorkload) -> tuple:
    """The addend's storage view: (1 or B, N, 1, M)."""
    return (wl.batch if wl.addend == "batched" else 1, wl.N, 1, wl.M)


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
    A, Bm, Bias, Res, Cst, Y = operands = declare_operands(wl, cfg)
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
            v = arith.load(A[view_index(wl.a_view, n, kb * 4, m)])
            return _masked(b, v, kb, K, name) if trans else v  # outer products skip A's padding lanes instead

        def b_pixel(kb_or_k, nb_or_n, name):
            """trans_b: the pixel of block ``kb`` at column n; else the pixel of blocks ``nb`` at row k."""
            if trans:
                return _masked(b, arith.load(Bm[view_index(wl.b_view, n, kb_or_k * 4, nb_or_n)]), kb_or_k, K, name)
            return arith.load(Bm[view_index(wl.b_view, n, nb_or_n * 4, kb_or_k)])

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
                                    xs = {i: b.let(f"a{i}_{ki}", arith.load(
                                        A[view_index(wl.a_view, n, kb * 4 + ki, rows[i], lanes=1)]))
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
                if Cst is not None:
                    v = v + Cst[n if wl.addend == "batched" else 0, lanes, 0, m]
                v = apply_ir(wl.activation, v)
                if Res is not None:
                    v = v + Res[view_index(wl.y_view, n, nb * 4, m)]
                if N % 4:  # the output's padding lanes are zero, whatever B's, the bias's or Res's hold
                    y = b.let(f"y{i}_{j}", v)
                    v = call("make_vector", [ExtractLane(y, ln) if ln < N % 4 else
                                             select(nb * 4 + ln < N, ExtractLane(y, ln), 0.0) for ln in range(4)],
                             "float32x4")
                b.store(Y, view_index(wl.y_view, n, nb * 4, m), v)
    return b.kernel("matmul", [p for p in operands if p is not None])


def _stage(b, tile, pixels: int, items: int, lid, name: str, pixel) -> None:
    """The work-group's ``items`` work-items copy ``pixels`` pixels (``pixel(i)``) into ``tile``, strided."""
    with b.loop(f"{name}_j", -(-pixels // items)) as j:
        i = b.let(f"{name}_i", j * items + lid)
        with b.if_(i < pixels) if pixels % items else nullcontext():
            b.store(tile, i, pixel(i))


def reference(wl: MatmulWorkload, a, bm, bias=None, residual=None, addend=None) -> np.ndarray:
    """NumPy in float64 on the 3-D arrays: ``act(alpha * a @ b + bias + addend) + residual`` of shape (B, M, N)
    (``addend`` (1 or B, M, N))."""
    bm = np.asarray(bm, np.float64)
    out = np.asarray(a, np.float64) @ (bm.transpose(0, 2, 1) if wl.trans_b else bm) * wl.alpha
    if bias is not None:
        out = out + np.asarray(bias, np.float64).reshape(1, 1, -1)
    if addend is not None:
        out = out + np.asarray(addend, np.float64)
    out = apply_numpy(wl.activation, out)
    if residual is not None:
        out = out + np.asarray(residual, np.float64)
    return out


def _operand(view, arr, shape) -> np.ndarray:
    """A 3-D operand from its kernel parameter's array: its storage view, or its view's source."""
    return view_gather(view, arr, shape) if view else from_storage(arr)


def _reference(wl: MatmulWorkload, inputs: dict) -> np.ndarray:
    """The reference on the kernel's parameters (4-D storage views, or views' sources), as the output's view (or
    the tensor its view fills)."""
    res, cst = inputs.get("Res"), inputs.get("C")
    y = reference(wl, _operand(wl.a_view, inputs["A"], wl.a), _operand(wl.b_view, inputs["Bm"], wl.b),
                  inputs.get("B"), None if res is None else _operand(wl.y_view, res, wl.out_shape),
                  None if cst is None else from_storage(cst))
    return view_scatter(wl.y_view, y) if wl.y_view else to_storage(y)


def random_inputs(wl: MatmulWorkload, rng) -> dict:
    """Random normal operands keyed by kernel parameter, as the storage views the parameters take (a view's
    whole source where the operand has one)."""
    draw = lambda shape: rng.standard_normal(shape).astype(wl.dtype)  # noqa: E731
    inputs = {"A": draw(wl.a_view[0]) if wl.a_view else to_storage(draw(wl.a)),
              "Bm": draw(wl.b_view[0]) if wl.b_view else to_storage(draw(wl.b))}
    if wl.bias:
        inputs["B"] = draw((wl.N,))
    if wl.residual:
        inputs["Res"] = draw(wl.y_view[0]) if wl.y_view else to_storage(draw(wl.out_shape))
    if wl.addend != "none":
        inputs["C"] = draw(addend_shape(wl))
    return inputs


def space_vars(wl: MatmulWorkload) -> dict:
    return dict(batch=wl.batch, M=wl.M, K=wl.K, N=wl.N, KB=-(-wl.K // 4), NB=-(-wl.N // 4), trans_b=wl.trans_b,
                a_view=wl.a_view[0] if wl.a_view else storage_shape(wl.a),
                b_view=wl.b_view[0] if wl.b_view else storage_shape(wl.b),
                out_view=wl.y_view[0] if wl.y_view else storage_shape(wl.out_shape), bias=wl.bias,
                residual=wl.residual)


VARIABLES = dict(batch="batch B", M="rows of A and Y", K="reduction length", N="columns of Y",
                 KB="reduction blocks of 4", NB="output-column blocks of 4", trans_b="B given as B,N,K",
                 a_view="A's storage view (B, K, 1, M), NCHW, or the tensor its view reads",
                 b_view="B's storage view (B, N, 1, K), or (B, K, 1, N) with trans_b, or the tensor its view reads",
                 out_view="Y's storage view (B, N, 1, M), or the tensor its view writes", bias="fused bias",
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
    addend = f" +{wl.addend} addend" if wl.addend != "none" else ""
    return f"{shape_text(wl.a)} @ {shape_text(wl.b)}{'^T' if wl.trans_b else ''}{alpha}{addend}{epilogue_text(wl)}"


def lower(ctx, node, ins):
    """A matmul graph node: inputs [a, b, (bias), (residual)], attrs trans_b, alpha, activation and residual
    (true when the last input is the residual; a tensor name is taken too). The bias is a constant of N values
    (a (1, N)-like constant is reshaped to (N,)). Attr ``addend``: a constant input (1 or B, N, 1, M) added before
    the activation. Attrs ``a_view`` / ``b_view`` / ``y_view`` (``passes_tokens.matmul_views``): the operand is
    read (the output written) through that view of the input (output) tensor, whose 3-D shape is then attr
    ``a`` / ``b`` (the output's follows)."""
    a = node.attrs
    rest, res = list(node.inputs[2:]), a.get("residual", False)
    addend = a.get("addend")
    if addend is not None:
        rest = [x for x in rest if x != addend]
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
    shape_a = tuple(a["a"]) if a.get("a_view") else ctx.shape(node.inputs[0])
    shape_b = tuple(a["b"]) if a.get("b_view") else ctx.shape(node.inputs[1])
    kind = "none"
    if addend is not None:
        if not ctx.is_param(addend):
            raise ValueError(f"the addend {addend!r} must be a constant (it is a tensor computed by the graph)")
        kind = "shared" if tuple(ctx.shape(addend))[0] == 1 else "batched"
    wl = MatmulWorkload(a=shape_a, b=shape_b, trans_b=a.get("trans_b", False), dtype=ctx.dtype,
                        alpha=a.get("alpha", 1.0), bias=bool(rest), activation=a.get("activation", "none"),
                        residual=res_name is not None, addend=kind, a_view=a.get("a_view", ()),
                        b_view=a.get("b_view", ()), y_view=a.get("y_view", ()))
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
        shape, want = tuple(ctx.shape(res_name)), wl.y_view[0] if wl.y_view else wl.out_shape
        if shape != want and not (wl.y_view and tuple(ctx.graph.shapes[res_name]) == want):
            raise ValueError(f"the residual {res_name!r} has shape {list(shape)}; the output is {list(want)}")
        inputs["Res"] = ctx.packed(res_name)
    if addend is not None:
        shape = tuple(np.shape(ctx.graph.params[addend]))
        if shape != addend_shape(wl):
            raise ValueError(f"the addend {addend!r} has shape {list(shape)}; it must be the output's storage view "
                             f"{list(addend_shape(wl))} (1 or B, N, 1, M)")
        inputs["C"] = addend
    return wl, inputs, extra


WORKLOAD_ARGS = (WorkloadArg("a", "shape", "B,M,K", "A's shape (matmul)", required=True),
                 WorkloadArg("b", "shape", "B,K,N", "B's shape, B,N,K with --trans-b (matmul)", required=True),
                 WorkloadArg("trans_b", "flag", help="matmul: B is given as B,N,K (Q @ K^T)"),
                 WorkloadArg("alpha", "float", "X", "matmul: scale of the product (default 1)"),
                 *EPILOGUE_ARGS,
                 WorkloadArg("residual", "flag", help="fuse a residual add of a second NCHW4c tensor"),
                 WorkloadArg("addend", "str", "KIND", "matmul: add a constant of the output's shape before the "
                             "activation: shared (one for every batch) or batched (default none)", choices=ADDENDS))
TEMPLATE = Template("matmul", MatmulWorkload, MatmulConfig, matmul, _reference, random_inputs, fallback, space_vars,
                    VARIABLES, features=features, describe=describe, workload_args=WORKLOAD_ARGS,
                    graph_ops=("matmul",), lower=lower, scope_inputs={"input": "A", "weight": "Bm"},
                    reduction=lambda wl: wl.a[2])
