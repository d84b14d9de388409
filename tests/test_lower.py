"""Unit tests for ``tuner.lower``: each pass alone on small hand-built kernels, the RFC 0039 worked examples,
lowering errors, the pipeline trace, and end-to-end checks that run lowered kernels in a small NumPy
interpreter against packed images (so a wrong coordinate or lane fails on values, not on the text)."""

import math

import numpy as np
import pytest

from tuner.errors import LoweringError, TunerError
from tuner.ir import layouts
from tuner.ir.buffer import Buffer, buffer
from tuner.ir.builder import Builder
from tuner.ir.dtype import DType, float32, float32x4
from tuner.ir.evaluate import evaluate
from tuner.ir.expr import (Binary, Broadcast, BufferLoad, Call, Cast, Const, ExtractLane, Ramp, Select, Var,
                           const)
from tuner.ir.functor import Mutator, visit
from tuner.ir.index_map import AXIS_SEPARATOR as SEP
from tuner.ir.kernel import Kernel, Program
from tuner.ir.schedule import cache_read
from tuner.ir.stmt import (Allocate, Barrier, BufferStore, Evaluate, For, If, Let, Seq)
from tuner.lower import PASSES, lower
from tuner.lower.apply_layout_transforms import apply_layout_transforms
from tuner.lower.flatten_buffers import flatten_buffers
from tuner.lower.infer_image_access import infer_image_access
from tuner.lower.lower_texture_access import lower_texture_access
from tuner.lower.simplify import simplify
from tuner.lower.unroll_loops import MAX_UNROLL, unroll_loops
from tuner.lower.vectorize_buffer_access import vectorize_buffer_access
from tuner.lower.vectorize_loops import vectorize_loops

PIXEL = Ramp(const(0), const(1), 4)
PASS_NAMES = [p.__name__ for p in PASSES]
# the passes these tests rely on, in their order (other passes may stand between them)
CORE_PASSES = ["apply_layout_transforms", "vectorize_loops", "simplify", "flatten_buffers", "simplify",
               "lower_texture_access", "vectorize_buffer_access", "infer_image_access"]


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def nodes(node, cls):
    out = []
    visit(node, lambda n: out.append(n) if isinstance(n, cls) else None)
    return out


def loads(k, name=None):
    return [n for n in nodes(k.body, BufferLoad) if name is None or n.buffer.name == name]


def stores(k, name=None):
    return [n for n in nodes(k.body, BufferStore) if name is None or n.buffer.name == name]


def _run_until(k, last, after):
    """The pipeline's passes in order, up to the first ``last`` that comes after ``after``."""
    start = PASS_NAMES.index(after)
    stop = PASS_NAMES.index(last, start)
    for p in PASSES[:stop + 1]:
        k = p(k)
    return k


def until_flatten(k):
    """The pipeline up to and including the simplify after flatten_buffers."""
    return _run_until(k, "simplify", after="flatten_buffers")


def until_texture(k):
    return _run_until(k, "lower_texture_access", after="flatten_buffers")


def kernel_of(body, *params, name="k"):
    return Kernel(name, tuple(params), body)


def ival(e, env=None):
    """An integer index expression's value (all of its variables bound in ``env``)."""
    assert not isinstance(e, (Ramp, Broadcast)), e
    return int(evaluate(e, env or {}))


# ------------------------------------------------------------------------------------------------
# a small interpreter for lowered kernels
# ------------------------------------------------------------------------------------------------
class Machine:
    """Runs a lowered kernel on NumPy memory. Global, local and private buffers are flat arrays of scalars
    keyed by the declared buffer (vector views share them); images are ``[height, width, 4]`` arrays.
    Every value is a 1-D array of its lanes."""

    def __init__(self, memory):
        self.memory = memory  # declared Buffer -> ndarray

    def mem(self, buf):
        return self.memory[buf.declared]

    def ev(self, e, env):
        if isinstance(e, Const):
            return np.array([e.value], dtype=e.dtype.numpy)
        if isinstance(e, Var):
            return np.array([env[e]])
        if isinstance(e, Binary):
            from tuner.ir.evaluate import _OPS
            return np.atleast_1d(_OPS[e.op](self.ev(e.a, env), self.ev(e.b, env)))
        if isinstance(e, Select):
            return np.where(self.ev(e.cond, env), self.ev(e.true_value, env), self.ev(e.false_value, env))
        if isinstance(e, Cast):
            return self.ev(e.value, env).astype(e.dtype.numpy)
        if isinstance(e, Ramp):
            return self.ev(e.base, env) + self.ev(e.stride, env) * np.arange(e.n)
        if isinstance(e, Broadcast):
            v = self.ev(e.value, env)
            assert v.size == 1
            return np.repeat(v, e.n)
        if isinstance(e, ExtractLane):
            return self.ev(e.value, env)[e.lane:e.lane + 1]
        if isinstance(e, BufferLoad):
            assert len(e.indices) == 1 and not e.buffer.is_texture, f"unlowered access {e}"
            m, mem = e.buffer.dtype.lanes, self.mem(e.buffer)
            idx = self.ev(e.indices[0], env)
            assert ((idx >= 0) & (idx < e.buffer.shape[0])).all(), f"{e}: index {idx} out of {e.buffer.shape}"
            return np.concatenate([mem[i * m:(i + 1) * m] for i in idx]).astype(np.float32)
        if isinstance(e, Call) and e.name == "texture2d_load":
            img, x, y = e.args
            x, y = int(self.ev(x, env)[0]), int(self.ev(y, env)[0])
            data = self.mem(img)
            assert 0 <= y < data.shape[0] and 0 <= x < data.shape[1], f"{e}: pixel ({x}, {y}) outside image"
            return data[y, x].astype(np.float32)
        raise TypeError(f"interpreter: {type(e).__name__}")

    def run(self, s, env):
        if isinstance(s, Seq):
            for x in s.stmts:
                self.run(x, env)
        elif isinstance(s, For):
            assert s.kind != "vectorized"
            for v in range(s.extent):
                self.run(s.body, {**env, s.var: v})
        elif isinstance(s, Let):
            self.run(s.body, {**env, s.var: self.ev(s.value, env)[0]})
        elif isinstance(s, If):
            if self.ev(s.cond, env)[0]:
                self.run(s.then, env)
            elif s.otherwise is not None:
                self.run(s.otherwise, env)
        elif isinstance(s, Allocate):
            self.memory[s.buffer.declared] = np.zeros(math.prod(s.buffer.shape) * s.buffer.dtype.lanes, np.float32)
            self.run(s.body, env)
        elif isinstance(s, BufferStore):
            assert len(s.indices) == 1 and not s.buffer.is_texture, f"unlowered store {s}"
            m, mem = s.buffer.dtype.lanes, self.mem(s.buffer)
            idx = self.ev(s.indices[0], env)
            assert ((idx >= 0) & (idx < s.buffer.shape[0])).all(), f"{s}: index {idx} out of {s.buffer.shape}"
            val = np.broadcast_to(self.ev(s.value, env), (idx.size * m,))
            for k, i in enumerate(idx):
                mem[i * m:(i + 1) * m] = val[k * m:(k + 1) * m]
        elif isinstance(s, Evaluate):
            c = s.value
            assert isinstance(c, Call) and c.name == "texture2d_store"
            img, x, y, v = c.args
            x, y = int(self.ev(x, env)[0]), int(self.ev(y, env)[0])
            data = self.mem(img)
            assert 0 <= y < data.shape[0] and 0 <= x < data.shape[1], f"{c}: pixel ({x}, {y}) outside image"
            data[y, x] = self.ev(v, env)
        elif isinstance(s, Barrier):
            pass
        else:
            raise TypeError(f"interpreter: {type(s).__name__}")


def run_lowered(prog: Program, inputs: dict, outputs: dict, memory_out: dict | None = None):
    """``inputs``/``outputs``: declared Buffer -> logical ndarray (outputs give the shape). Packs images with
    their layout (the default one for a texture without a layout), runs every kernel, unpacks the outputs.
    Outputs and workspaces start as NaN, so anything read before it is written shows. ``memory_out`` receives
    the physical arrays."""
    memory = {}
    workspaces = {b.declared for b in prog.workspaces}

    def layout_of(buf):
        return buf.layout or layouts.default_layout(buf)

    for kern in prog.kernels:
        for phys in kern.params:
            decl = phys.declared
            if decl in memory:
                continue
            arr = inputs.get(decl, outputs.get(decl))
            if arr is None:
                assert decl in workspaces
                arr = np.zeros(decl.shape, np.float32)
            lay = layout_of(decl)
            packed = lay.pack(arr.astype(np.float32)) if lay is not None else arr.astype(np.float32).ravel()
            if decl in outputs or decl in workspaces:
                packed = np.full_like(packed, np.nan)  # an output must be written everywhere it is read back
            assert packed.shape == (phys.shape if phys.is_texture else (math.prod(phys.shape),))
            memory[decl] = packed.copy()
    m = Machine(memory)
    for kern in prog.kernels:
        m.run(kern.body, {})
    if memory_out is not None:
        memory_out.update(memory)
    result = {}
    for decl, arr in outputs.items():
        lay = layout_of(decl)
        result[decl] = lay.unpack(memory[decl], decl.shape) if lay is not None else memory[decl].reshape(decl.shape)
    return result


# ================================================================================================
# apply_layout_transforms
# ================================================================================================
def test_apply_layout_transforms_rewrites_shape_and_indices():
    X = buffer("X", (2, 5, 3, 7), layout="nchw4c_buffer")
    Y = buffer("Y", (2, 5, 3, 7), scope="texture", layout="nchw4c")
    b = Builder()
    with b.loop("n", 2) as n, b.loop("c", 5) as c, b.loop("h", 3) as h, b.loop("w", 7) as w:
        b.store(Y, (n, c, h, w), X[n, c, h, w])
    k = apply_layout_transforms(b.kernel("k", [X, Y]))
    X2, Y2 = k.params
    assert X2.shape == (2, 2, 3, 7, 4) and X2.axis_separators == () and X2.layout is None
    assert Y2.shape == (2, 2, 3, 7, 4) and Y2.axis_separators == (3, 4) and Y2.layout is None
    assert X2.declared is X and Y2.declared is Y and Y2.scope == "texture" and Y2.dtype == X.dtype
    (ld,) = loads(k)
    (stv,) = stores(k)
    assert ld.buffer is X2 and stv.buffer is Y2
    grid = dict(zip((n, c, h, w), np.indices((2, 5, 3, 7))))
    for acc in (ld, stv):
        got = [np.broadcast_to(evaluate(i, grid), (2, 5, 3, 7)) for i in acc.indices]
        assert len(got) == 5
        assert (got[0] == grid[n]).all() and (got[1] == grid[c] // 4).all() and (got[2] == grid[h]).all()
        assert (got[3] == grid[w]).all() and (got[4] == grid[c] % 4).all()


def test_apply_layout_transforms_default_texture_layouts():
    A = buffer("A", (1, 6, 3, 5), scope="texture")  # -> nchw4c
    W = buffer("W", (6, 2, 3, 3), scope="texture:weight")  # -> oihw4o
    P = buffer("P", (2, 3, 5, 7, 4), scope="texture")  # packed: C0
    Q = buffer("Q", (2, 3, 5, 7, 4), scope="texture:weight")  # packed: C1
    B = buffer("B", (9,), scope="texture")  # 1-D: mace_argument
    G = buffer("G", (4, 4))  # global, no layout: untouched here
    Y = buffer("Y", (1,))
    b = Builder()
    b.store(Y, 0, A[0, 5, 1, 2] + W[5, 1, 2, 0] + P[1, 2, 3, 4, 3] + Q[1, 2, 3, 4, 3] + B[6] + G[1, 1])
    k = apply_layout_transforms(b.kernel("k", [A, W, P, Q, B, G, Y]))
    A2, W2, P2, Q2, B2, G2, Y2 = k.params
    assert (A2.shape, A2.axis_separators) == ((1, 2, 3, 5, 4), (3, 4))
    assert (W2.shape, W2.axis_separators) == ((2, 2, 3, 3, 4), (1, 4))
    assert (P2.shape, P2.axis_separators) == ((2, 3, 5, 7, 4), (3, 4))
    assert (Q2.shape, Q2.axis_separators) == ((2, 3, 5, 7, 4), (1, 4))
    assert (B2.shape, B2.axis_separators) == ((1, 3, 4), (1, 2))
    assert G2 is G and Y2 is Y
    by_name = {ld.buffer.name: [ival(i) for i in ld.indices] for ld in loads(k)}
    assert by_name["A"] == [0, 1, 1, 2, 1]
    assert by_name["W"] == [1, 1, 2, 0, 1]
    assert by_name["P"] == [1, 2, 3, 4, 3] and by_name["Q"] == [1, 2, 3, 4, 3]
    assert by_name["B"] == [0, 1, 2]
    assert by_name["G"] == [1, 1]


def test_apply_layout_transforms_without_layouts_is_identity():
    X, Y = buffer("X", (4, 4)), buffer("Y", (4, 4))
    b = Builder()
    with b.loop("i", 4) as i:
        b.store(Y, (i, 0), X[i, 0])
    k = b.kernel("k", [X, Y])
    assert apply_layout_transforms(k) is k


# ================================================================================================
# RFC 0039 worked examples (003_*, "Numeric values are shown unsimplified")
# ================================================================================================
def _rfc_kernel(shape, layout, load_idx, store_idx=None, alloc=False):
    out = buffer("out", (1,))
    b = Builder()
    if alloc:
        x = b.allocate("x", shape, "float32", "private")
    else:
        x = buffer("x", shape, layout=layout)
    if store_idx is not None:
        b.store(x, store_idx, 7.0)
    b.store(out, 0, x[load_idx])
    return b.kernel("rfc", [out] if alloc else [x, out]), x


def test_rfc0039_example_a_default_row_major():
    k, x = _rfc_kernel((64, 128), None, (10, 15), (20, 23))
    assert apply_layout_transforms(k) is k  # no layout, not a texture
    k = until_flatten(k)
    x2 = k.params[0]
    assert x2.shape == (64 * 128,) and x2.declared is x
    (ld,) = loads(k, "x")
    (stv,) = stores(k, "x")
    assert ld.indices == (Const(10 * 128 + 15),)
    assert stv.indices == (Const(20 * 128 + 23),)


def test_rfc0039_example_a_on_an_allocation():
    k, x = _rfc_kernel((64, 128), None, (10, 15), (20, 23), alloc=True)
    k = until_flatten(k)
    (alloc,) = nodes(k.body, Allocate)
    assert alloc.buffer.shape == (64 * 128,) and alloc.buffer.declared is x
    (ld,) = loads(k, "x")
    (stv,) = stores(k, "x")
    assert ld.buffer is alloc.buffer and stv.buffer is alloc.buffer
    assert ld.indices == (Const(1295),) and stv.indices == (Const(2583),)


def test_rfc0039_example_b_transpose():
    k, x = _rfc_kernel((64, 128), lambda i, j: [j, i], (10, 15), (20, 23))
    t = apply_layout_transforms(k)
    assert t.params[0].shape == (128, 64)
    assert loads(t, "x")[0].indices == (Const(15), Const(10))
    assert stores(t, "x")[0].indices == (Const(23), Const(20))
    f = until_flatten(k)
    assert f.params[0].shape == (128 * 64,)
    assert loads(f, "x")[0].indices == (Const(15 * 64 + 10),)
    assert stores(f, "x")[0].indices == (Const(23 * 64 + 20),)


def test_rfc0039_example_c_nhwc_to_nchwc():
    k, x = _rfc_kernel((16, 64, 64, 128), lambda n, h, w, c: [n, c // 4, h, w, c % 4], (11, 37, 23, 101))
    t = simplify(apply_layout_transforms(k))
    assert t.params[0].shape == (16, 128 // 4, 64, 64, 4) and t.params[0].axis_separators == ()
    assert [ival(i) for i in loads(t, "x")[0].indices] == [11, 25, 37, 23, 1]
    assert loads(t, "x")[0].indices == (Const(11), Const(25), Const(37), Const(23), Const(1))
    f = until_flatten(k)
    assert f.params[0].shape == (16 * 32 * 64 * 64 * 4,)
    (ld,) = loads(f, "x")
    assert ld.indices == (Const((128 // 4) * 64 * 64 * 4 * 11 + 64 * 64 * 4 * (101 // 4) + 64 * 4 * 37 + 4 * 23
                                + 101 % 4),)


def test_rfc0039_example_d_axis_separator_gives_2d():
    k, x = _rfc_kernel((16, 64, 64, 128), lambda n, h, w, c: [n, c // 4, h, SEP, w, c % 4], (11, 37, 23, 101))
    t = apply_layout_transforms(k)
    assert t.params[0].shape == (16, 32, 64, 64, 4) and t.params[0].axis_separators == (3,)
    f = until_flatten(k)
    x2 = f.params[0]
    assert x2.shape == (16 * (128 // 4) * 64, 64 * 4)
    assert x2.axis_separators == (1,)  # a flattened 2-d buffer, told apart from an unflattened one
    (ld,) = loads(f, "x")
    assert ld.indices == (Const((128 // 4) * 64 * 11 + 64 * (101 // 4) + 37), Const(4 * 23 + 101 % 4))
    # and as a texture: the column splits into pixel x and RGBA lane
    X = buffer("X", (16, 64, 64, 128), scope="texture", layout=lambda n, h, w, c: [n, c // 4, h, SEP, w, c % 4])
    out = buffer("out", (1,))
    b = Builder()
    b.store(out, 0, X[11, 37, 23, 101])
    lowered = until_texture(b.kernel("t", [X, out]))
    assert lowered.params[0].shape == (16 * 32 * 64, 64 * 4)
    (st,) = stores(lowered, "out")
    assert isinstance(st.value, ExtractLane) and st.value.lane == 1
    call = st.value.value
    assert call.name == "texture2d_load" and call.args[0] is lowered.params[0]
    assert call.args[1:] == (Const(23), Const(32 * 64 * 11 + 64 * 25 + 37))


# ================================================================================================
# vectorize_loops
# ================================================================================================
def test_vectorize_loops_replaces_var_with_ramp():
    X, Y = buffer("X", (32,)), buffer("Y", (32,))
    b = Builder()
    with b.loop("i", 8, "group.0") as i, b.loop("j", 4, "vectorized") as j:
        b.store(Y, i * 4 + j, X[i * 4 + j] * 2.0)
    k = vectorize_loops(b.kernel("k", [X, Y]))
    loop = k.body
    assert isinstance(loop, For) and loop.var is i and loop.thread == "group.0"
    assert not any(f.kind == "vectorized" for f in nodes(k.body, For))
    assert not any(v is j for v in nodes(k.body, Var))
    st = loop.body
    assert isinstance(st, BufferStore)
    assert st.indices == (Binary("add", i * 4, PIXEL),) and st.indices[0].lanes == 4
    assert st.value.lanes == 4 and st.value.dtype == float32x4
    assert st.value.a.indices == (Binary("add", i * 4, PIXEL),)


def test_vectorize_loops_extent_8_and_untouched_kernel():
    Y = buffer("Y", (8,))
    b = Builder()
    with b.loop("v", 8, "vectorized") as v:
        b.store(Y, v, 1.0)
    k = vectorize_loops(b.kernel("k", [Y]))
    assert k.body == BufferStore(Y, const(1.0), (Ramp(const(0), const(1), 8),))
    b = Builder()
    with b.loop("s", 8) as s:
        b.store(Y, s, 1.0)
    k = b.kernel("k", [Y])
    assert vectorize_loops(k).body is k.body


def test_vectorize_loops_rejects_non_innermost():
    Y = buffer("Y", (4, 4))
    b = Builder()
    with b.loop("ci", 4, "vectorized") as ci, b.loop("k", 4) as kk:
        b.store(Y, (ci, kk), 0.0)
    with pytest.raises(LoweringError, match="vectorized loop ci must be innermost; it contains loop k"):
        vectorize_loops(b.kernel("k", [Y]))
    b = Builder()
    with b.loop("a", 4, "vectorized") as a, b.loop("bb", 4, "vectorized") as bb:
        b.store(Y, (a, bb), 0.0)
    with pytest.raises(LoweringError, match="vectorized loop a must be innermost; it contains loop bb"):
        vectorize_loops(b.kernel("k", [Y]))


# ================================================================================================
# unroll_loops
# ================================================================================================
def test_unroll_loops_expands_short_loops_with_constants():
    X, Y = buffer("X", (64,)), buffer("Y", (64,))
    b = Builder()
    with b.loop("h", 8, "group.0") as h, b.loop("u", 3, "unrolled") as u:
        b.store(Y, h * 8 + u, X[h * 8 + u])
    k = unroll_loops(b.kernel("k", [X, Y]))
    assert isinstance(k.body, For) and k.body.var is h
    copies = k.body.body.stmts
    assert len(copies) == 3 and all(isinstance(c, BufferStore) for c in copies)
    for i, c in enumerate(copies):
        assert c.indices == (h * 8 + const(i),) and c.value.indices == (h * 8 + const(i),)
    assert not any(v is u for v in nodes(k.body, Var))


def test_unroll_loops_keeps_long_and_other_loops():
    Y = buffer("Y", (64,))
    b = Builder()
    with b.loop("u", MAX_UNROLL + 1, "unrolled") as u:
        b.store(Y, u, 1.0)
    with b.loop("s", 4) as s_:
        b.store(Y, s_, 1.0)
    k = b.kernel("k", [Y])
    out = unroll_loops(k)
    assert out.body is k.body  # nothing to do: the same tree
    b = Builder()
    with b.loop("u", MAX_UNROLL, "unrolled") as u:
        b.store(Y, u, 1.0)
    assert len(unroll_loops(b.kernel("k", [Y])).body.stmts) == MAX_UNROLL


def test_unroll_loops_renames_lets_and_allocations_per_copy():
    """The copies share one C scope: each needs its own ``const int t`` and ``float acc[1]``."""
    X, Y = buffer("X", (64,)), buffer("Y", (64,))
    b = Builder()
    with b.loop("h", 8, "group.0") as h, b.loop("u", 2, "unrolled") as u:
        t = b.let("t", h * 8 + u)
        acc = b.allocate("acc", (1,))
        b.store(acc, 0, X[t])
        b.store(Y, t, acc[0])
    kernel = b.kernel("k", [X, Y])
    k = unroll_loops(kernel)
    lets, allocs = nodes(k.body, Let), nodes(k.body, Allocate)
    assert len(lets) == 2 and len(allocs) == 2
    assert len({l.var.name for l in lets}) == 2 and len({a.buffer.name for a in allocs}) == 2
    assert lets[0].var is not lets[1].var and allocs[0].buffer is not allocs[1].buffer
    for let, alloc in zip(lets, allocs):
        # every use inside a copy refers to that copy's own let and allocation
        used_vars = {v for v in nodes(let.body, Var) if v.name.startswith("t")}
        assert used_vars == {let.var}
        acc_bufs = {n.buffer for n in nodes(alloc.body, (BufferLoad, BufferStore)) if n.buffer.name.startswith("acc")}
        assert acc_bufs == {alloc.buffer}
    # and the whole pipeline still computes Y = X
    prog = lower(kernel)
    assert len({a.buffer.name for a in nodes(prog.kernels[0].body, Allocate)}) == 2
    data = np.arange(64, dtype=np.float32)
    out = run_lowered(prog, {X: data}, {Y: np.zeros(64, np.float32)})[Y]
    written = (np.arange(64) % 8) < 2  # Y[h*8 + u] for u in 0, 1
    np.testing.assert_array_equal(out[written], data[written])
    assert np.isnan(out[~written]).all()


def test_mutator_returns_unchanged_trees_as_the_same_objects():
    X = _image()
    Y = buffer("Y", (8,))
    i = Var("i")
    body = For(i, 2, "serial", Seq((BufferStore(Y, X[i, 0, PIXEL] + 1.0, (Ramp(i * 4, const(1), 4),)),
                                    Evaluate(Call("texture2d_load", (X, i, const(0)), float32x4)))))
    assert Mutator().visit(body) is body
    k = kernel_of(body, X, Y)
    assert vectorize_loops(k).body is body
    assert unroll_loops(k).body is body


# ================================================================================================
# flatten_buffers
# ================================================================================================
def test_flatten_buffers_row_major_params():
    X = buffer("X", (2, 3, 5))
    Y = buffer("Y", (30,))
    b = Builder()
    with b.loop("i", 2) as i, b.loop("j", 3) as j, b.loop("kk", 5) as kk:
        b.store(Y, i * 15 + j * 5 + kk, X[i, j, kk])
    k = flatten_buffers(b.kernel("k", [X, Y]))
    X2, Y2 = k.params
    assert X2.shape == (30,) and X2.axis_separators == () and X2.declared is X
    assert Y2 is Y  # already 1-D
    (ld,) = loads(k, "X")
    assert ld.buffer is X2 and len(ld.indices) == 1
    grid = np.indices((2, 3, 5))
    flat = evaluate(ld.indices[0], dict(zip((i, j, kk), grid)))
    assert np.array_equal(flat, np.ravel_multi_index(tuple(grid), (2, 3, 5)))
    assert flatten_buffers(k) is k  # idempotent: flattened buffers are recognised


def test_flatten_buffers_private_and_local_allocations():
    Y = buffer("Y", (6,))
    b = Builder()
    acc = b.allocate("acc", (2, 3))
    sh = b.allocate("sh", (3, 2), scope="local")
    with b.loop("i", 2) as i, b.loop("j", 3) as j:
        b.store(acc, (i, j), 1.0)
        b.store(sh, (j, i), acc[i, j])
        b.store(Y, i * 3 + j, sh[j, i])
    k = flatten_buffers(b.kernel("k", [Y]))
    allocs = {a.buffer.name: a.buffer for a in nodes(k.body, Allocate)}
    assert allocs["acc"].shape == (6,) and allocs["acc"].declared is acc and allocs["acc"].scope == "private"
    assert allocs["sh"].shape == (6,) and allocs["sh"].scope == "local"
    for acc_node in [*loads(k, "acc"), *stores(k, "acc"), *loads(k, "sh"), *stores(k, "sh")]:
        assert acc_node.buffer is allocs[acc_node.buffer.name]  # accesses use the allocated buffer
        assert len(acc_node.indices) == 1
    grid = dict(zip((i, j), np.indices((2, 3))))
    assert np.array_equal(evaluate(stores(k, "acc")[0].indices[0], grid), grid[i] * 3 + grid[j])
    assert np.array_equal(evaluate(stores(k, "sh")[0].indices[0], grid), grid[j] * 2 + grid[i])


def test_flatten_buffers_texture_groups():
    X = Buffer("X", (1, 2, 3, 5, 4), float32, "texture", axis_separators=(3, 4))
    Y = buffer("Y", (1,))
    b = Builder()
    b.store(Y, 0, X[0, 1, 2, 3, 1])
    k = flatten_buffers(b.kernel("k", [X, Y]))
    X2 = k.params[0]
    assert X2.shape == (6, 5, 4) and X2.axis_separators == (1, 2)
    (ld,) = loads(k, "X")
    assert [ival(i) for i in ld.indices] == [(0 * 2 + 1) * 3 + 2, 3, 1]


# ================================================================================================
# lower_texture_access
# ================================================================================================
def _image(name="X", shape=(6, 5, 4), dtype="float32", scope="texture"):
    return Buffer(name, shape, DType.parse(dtype), scope, axis_separators=tuple(range(1, len(shape))))


def test_texture_whole_pixel_load():
    X = _image()
    Y = buffer("Y", (120,))
    y, x = Var("y"), Var("x")
    body = For(y, 6, "serial", For(x, 5, "serial",
               BufferStore(Y, X[y, x, PIXEL] + 1.0, (Ramp(y * 20 + x * 4, const(1), 4),))))
    k = lower_texture_access(kernel_of(body, X, Y))
    st = k.body.body.body
    pixel = Call("texture2d_load", (X, x, y), float32x4)
    assert st.value.a == pixel  # (x, y): column first
    # broadcast coordinates are fine too
    body = BufferStore(Y, X[Broadcast(y, 4), Broadcast(x, 4), PIXEL], (Ramp(const(0), const(1), 4),))
    k = lower_texture_access(kernel_of(For(y, 6, "serial", For(x, 5, "serial", body)), X, Y))
    assert k.body.body.body.value == pixel


def test_texture_half_image_reads_float():
    X = _image(dtype="float16")
    Y = buffer("Y", (4,))
    k = lower_texture_access(kernel_of(BufferStore(Y, X[1, 2, PIXEL], (PIXEL,)), X, Y))
    assert k.body.value == Call("texture2d_load", (X, Const(2), Const(1)), float32x4)


def test_texture_constant_lane_is_single_lane_read():
    X = _image()
    Y = buffer("Y", (4,))
    pixel = Call("texture2d_load", (X, Const(3), Const(2)), float32x4)
    k = lower_texture_access(kernel_of(BufferStore(Y, X[2, 3, 2], (Const(0),)), X, Y))
    assert k.body.value == ExtractLane(pixel, 2) and k.body.value.dtype == float32
    # broadcast of one lane across a vector (texture RFC T1): a single-lane read, broadcast
    k = lower_texture_access(kernel_of(BufferStore(Y, X[2, 3, Broadcast(const(3), 4)], (PIXEL,)), X, Y))
    assert k.body.value == Broadcast(ExtractLane(pixel, 3), 4)


def _pick_lane(e, env):
    """Follow a select chain for one binding of its variables; return the ExtractLane it ends at."""
    while isinstance(e, Select):
        e = e.true_value if evaluate(e.cond, env) else e.false_value
    return e


def test_texture_dynamic_scalar_lane_is_select_chain():
    X = _image()
    Y = buffer("Y", (6 * 5 * 4,))
    y, x, c = Var("y"), Var("x"), Var("c")
    body = For(y, 6, "serial", For(x, 5, "serial", For(c, 4, "serial",
               BufferStore(Y, X[y, x, c], (y * 20 + x * 4 + c,)))))
    k = lower_texture_access(kernel_of(body, X, Y))
    v = k.body.body.body.body.value
    assert isinstance(v, Select) and v.dtype == float32
    pixel = Call("texture2d_load", (X, x, y), float32x4)
    for lane in range(4):
        picked = _pick_lane(v, {c: lane})
        assert picked == ExtractLane(pixel, lane)
    assert len(nodes(v, Select)) == 3


def test_texture_dynamic_broadcast_lane():
    """A lane index that is the same dynamic value in every lane (a single-lane read, broadcast)."""
    X = _image()
    Y = buffer("Y", (4,))
    c = Var("c")
    body = For(c, 4, "serial", BufferStore(Y, X[1, 2, Broadcast(c, 4)], (PIXEL,)))
    k = lower_texture_access(kernel_of(body, X, Y))
    v = k.body.body.value
    assert isinstance(v, Broadcast) and v.n == 4 and v.lanes == 4
    pixel = Call("texture2d_load", (X, Const(2), Const(1)), float32x4)
    for lane in range(4):
        assert _pick_lane(v.value, {c: lane}) == ExtractLane(pixel, lane)


@pytest.mark.parametrize("lane", [Ramp(const(1), const(1), 4), Ramp(const(0), const(2), 4),
                                  Ramp(const(0), const(1), 2)])
def test_texture_load_with_partial_vector_lane_is_an_error(lane):
    X = _image()
    Y = buffer("Y", (4,))
    with pytest.raises(LoweringError, match=r"texture 'X': lane index .* is neither the whole pixel"):
        lower_texture_access(kernel_of(BufferStore(Y, X[1, 2, lane], (Ramp(const(0), const(1), lane.n),)), X, Y))


def test_texture_coordinates_differing_between_lanes_is_an_error():
    X = _image()
    Y = buffer("Y", (4,))
    with pytest.raises(LoweringError, match="the x coordinate .* differs between lanes"):
        lower_texture_access(kernel_of(BufferStore(Y, X[1, Ramp(const(0), const(1), 4), 0], (PIXEL,)), X, Y))
    with pytest.raises(LoweringError, match="the y coordinate .* differs between lanes"):
        lower_texture_access(kernel_of(BufferStore(Y, X[Ramp(const(0), const(1), 4), 1, 0], (PIXEL,)), X, Y))


def test_texture_store_whole_pixel():
    Y = _image("Y")
    X = buffer("X", (4,))
    y, x = Var("y"), Var("x")
    body = For(y, 6, "serial", For(x, 5, "serial", BufferStore(Y, X[PIXEL] * 2.0, (y, x, PIXEL))))
    k = lower_texture_access(kernel_of(body, X, Y))
    ev = k.body.body.body
    assert isinstance(ev, Evaluate)
    assert ev.value.name == "texture2d_store" and ev.value.args[:3] == (Y, x, y)
    assert ev.value.args[3] == X[PIXEL] * 2.0 and ev.value.args[3].lanes == 4
    # a scalar value is broadcast to the whole pixel
    k = lower_texture_access(kernel_of(BufferStore(Y, const(0.5), (Const(1), Const(2), PIXEL)), X, Y))
    assert k.body == Evaluate(Call("texture2d_store", (Y, Const(2), Const(1), Broadcast(const(0.5), 4)), float32x4))


@pytest.mark.parametrize("lane", [Const(1), Ramp(const(1), const(1), 4), Var("l")])
def test_texture_partial_pixel_store_is_an_error(lane):
    Y = _image("Y")
    with pytest.raises(LoweringError, match="texture 'Y': a store must write a whole RGBA pixel"):
        lower_texture_access(kernel_of(BufferStore(Y, const(0.5), (Const(1), Const(2), lane)), Y))


def test_texture_single_separator_column_split():
    X = _image(shape=(6, 5 * 4))
    assert X.axis_separators == (1,)
    Y = buffer("Y", (120,))
    y, x, col = Var("y"), Var("x"), Var("col")
    body = For(y, 6, "serial", For(x, 5, "serial", BufferStore(Y, X[y, Ramp(x * 4, const(1), 4)],
                                                                 (Ramp(y * 20 + x * 4, const(1), 4),))))
    k = lower_texture_access(kernel_of(body, X, Y))
    assert k.body.body.body.value == Call("texture2d_load", (X, x, y), float32x4)
    body = For(y, 6, "serial", For(x, 5, "serial", BufferStore(Y, X[y, x * 4 + 3], (Const(0),))))
    k = lower_texture_access(kernel_of(body, X, Y))
    assert k.body.body.body.value == ExtractLane(Call("texture2d_load", (X, x, y), float32x4), 3)
    # an unstructured column: x = col // 4 and a dynamic lane col % 4
    body = For(col, 20, "serial", BufferStore(Y, X[0, col], (col,)))
    k = lower_texture_access(kernel_of(body, X, Y))
    v = k.body.body.value
    for cv in range(20):
        e = _pick_lane(v, {col: cv})
        assert isinstance(e, ExtractLane) and e.lane == cv % 4
        assert ival(e.value.args[1], {col: cv}) == cv // 4 and ival(e.value.args[2]) == 0


def test_lower_texture_access_skips_kernels_without_images():
    X = buffer("X", (4,))
    k = kernel_of(BufferStore(X, const(0.0), (Const(0),)), X)
    assert lower_texture_access(k) is k


# ================================================================================================
# vectorize_buffer_access (RFC 0012)
# ================================================================================================
def _copy_ramp_kernel(base_fn, n=16, dtype="float32", stride=1):
    A, B = buffer("A", (n,), dtype), buffer("B", (n,), dtype)
    i = Var("i")
    idx = Ramp(base_fn(i), const(stride), 4)
    body = For(i, 3, "serial", BufferStore(B, A[idx], (idx,)))
    return kernel_of(body, A, B), A, B, i


def test_vectorize_buffer_access_aligned_ramp():
    k, A, B, i = _copy_ramp_kernel(lambda i: i * 4)
    out = vectorize_buffer_access(k)
    st = out.body.body
    ld = st.value
    assert ld.buffer.dtype == float32x4 and ld.buffer.shape == (4,) and ld.buffer.declared is A
    assert ld.indices == (i,) and ld.dtype == float32x4
    assert st.buffer.dtype == float32x4 and st.buffer.shape == (4,) and st.buffer.declared is B
    assert st.indices == (i,)
    assert out.params == (A, B)  # parameters stay scalar buffers; only accesses use the vector view
    # the same view object each time
    again = vectorize_buffer_access(k).body.body
    assert again.value.buffer is ld.buffer
    # base 8*i + 4 is still a multiple of 4
    k, A, B, i = _copy_ramp_kernel(lambda i: i * 8 + 4, n=32)
    ld = vectorize_buffer_access(k).body.body.value
    assert ld.buffer.dtype.lanes == 4 and ld.buffer.shape == (8,)
    xs = np.arange(3)
    assert np.array_equal(evaluate(ld.indices[0], {i: xs}), 2 * xs + 1)


def test_vectorize_buffer_access_half():
    k, A, B, i = _copy_ramp_kernel(lambda i: i * 4, dtype="float16")
    ld = vectorize_buffer_access(k).body.body.value
    assert ld.buffer.dtype == DType("float16", 4) and ld.dtype == float32x4


@pytest.mark.parametrize("base_fn, n, stride", [
    (lambda i: i * 4 + 1, 16, 1),  # unaligned
    (lambda i: i * 2, 16, 1),  # not provably aligned
    (lambda i: i * 4, 16, 2),  # not stride 1
    (lambda i: i * 4, 18, 1),  # the buffer is not a whole number of vectors
])
def test_vectorize_buffer_access_leaves_other_ramps(base_fn, n, stride):
    k, A, B, i = _copy_ramp_kernel(base_fn, n=n, stride=stride)
    st = vectorize_buffer_access(k).body.body
    assert st.buffer is B and st.value.buffer is A
    assert st.indices == (Ramp(base_fn(i), const(stride), 4),)
    assert st.value.indices == (Ramp(base_fn(i), const(stride), 4),)


def test_vectorize_buffer_access_ignores_images_and_vector_buffers():
    X = _image()
    V = Buffer("V", (4,), float32x4)
    Y = buffer("Y", (16,))
    body = Seq((BufferStore(Y, X[0, 0, PIXEL], (PIXEL,)), BufferStore(V, Y[PIXEL], (Const(0),))))
    out = vectorize_buffer_access(kernel_of(body, X, V, Y)).body
    first, second = out.stmts
    assert first.value.buffer is X and first.value.indices == (Const(0), Const(0), PIXEL)
    assert first.buffer.dtype == float32x4 and first.indices == (Const(0),)  # Y itself does get a view
    assert second.buffer is V


# ================================================================================================
# infer_image_access
# ================================================================================================
def _access_kernel(read, write, extra=()):
    body = []
    for X in read:
        body.append(Evaluate(Call("texture2d_load", (X, const(0), const(0)), float32x4)))
    for Y in write:
        body.append(Evaluate(Call("texture2d_store", (Y, const(0), const(0), Broadcast(const(1.0), 4)),
                                  float32x4)))
    return Kernel("k", (*read, *write, *extra), Seq(tuple(body)))


def test_infer_image_access():
    X, W, Y = _image("X"), _image("W", scope="texture:weight"), _image("Y")
    G = buffer("G", (4,))
    k = infer_image_access(_access_kernel([X, W], [Y], extra=(G, _image("U"))))
    assert k.access == {"X": "read_only", "W": "read_only", "Y": "write_only", "U": "read_only"}
    assert "G" not in k.access
    assert "# access: {'X': 'read_only', 'W': 'read_only', 'Y': 'write_only', 'U': 'read_only'}" in str(k)


def test_infer_image_access_read_and_write_is_an_error():
    X = _image("X")
    k = _access_kernel([X], [X])
    k = k.replace(params=(X,))
    with pytest.raises(LoweringError, match="kernel k: image 'X' is both read and written"):
        infer_image_access(k)


# ================================================================================================
# invalid texture layouts
# ================================================================================================
def _texture_kernel(X):
    Y = buffer("Y", (1,))
    b = Builder()
    b.store(Y, 0, X[tuple([0] * len(X.shape))])
    return b.kernel("k", [X, Y])


def test_texture_layout_with_8_lanes_is_an_error():
    X = buffer("X", (1, 16, 4, 4), scope="texture",
               layout=lambda n, c, h, w: [n, c // 8, h, SEP, w, SEP, c % 8])
    with pytest.raises(LoweringError) as info:
        apply_layout_transforms(_texture_kernel(X))
    msg = str(info.value)
    assert "texture buffer 'X'" in msg
    assert "innermost axis of 8 lanes" in msg and "holds 4" in msg
    assert isinstance(info.value, TunerError)
    with pytest.raises(LoweringError, match="innermost axis of 8 lanes"):
        lower(_texture_kernel(X))


def test_texture_without_usable_layout_is_an_error():
    X = buffer("X", (6, 5, 3), scope="texture")
    with pytest.raises(LoweringError, match=r"texture buffer 'X' with shape \[6, 5, 3\] has no layout"):
        apply_layout_transforms(_texture_kernel(X))
    X = buffer("X", (6, 4), scope="texture:weight")
    with pytest.raises(LoweringError, match="has no layout.*innermost axis is the RGBA lane of 4"):
        lower(_texture_kernel(X))


@pytest.mark.parametrize("fn, message", [
    (lambda n, c, h, w: [n, c // 4, h, w, c % 4], "has 0 axis separators"),
    (lambda n, c, h, w: [n, SEP, c // 4, SEP, h, SEP, w, c % 4], "has 3 axis separators"),
    (lambda n, c, h, w: [n, c // 4, h, w, SEP, c % 4], "puts only the lane axis after its separator"),
])
def test_texture_layout_without_2d_image_is_an_error(fn, message):
    X = buffer("X", (1, 8, 2, 2), scope="texture", layout=fn)
    with pytest.raises(LoweringError, match=message):
        apply_layout_transforms(_texture_kernel(X))


# ================================================================================================
# the pipeline
# ================================================================================================
def _addone(C=8, H=3, W=5, in_layout="nchw4c", out_scope="texture"):
    X = buffer("X", (1, C, H, W), scope="texture", layout=in_layout)
    Y = buffer("Y", (1, C, H, W), scope=out_scope, layout="nchw4c" if out_scope == "texture" else None)
    b = Builder()
    with b.loop("h", H, "group.0") as h, b.loop("w", W, "local.0") as w, \
            b.loop("cb", C // 4) as cb, b.loop("ci", 4, "vectorized") as ci:
        b.store(Y, (0, cb * 4 + ci, h, w), X[0, cb * 4 + ci, h, w] + 1.0)
    return b.kernel("addone", [X, Y]), X, Y


def test_lower_trace_records_every_pass_in_order():
    k, X, Y = _addone()
    trace = []
    prog = lower(k, trace=trace)
    assert [name for name, _ in trace] == ["input", *PASS_NAMES]
    it = iter(PASS_NAMES)
    assert all(name in it for name in CORE_PASSES), PASS_NAMES  # a subsequence, in this order
    assert PASS_NAMES[0] == "apply_layout_transforms" and PASS_NAMES[-1] == "infer_image_access"
    for (_, before), (name, after), p in zip(trace, trace[1:], PASSES):  # each entry is that pass's output
        assert name == p.__name__ and str(p(before)) == str(after)
    assert trace[0][1] is k
    assert trace[-1][1] is prog.kernels[0]
    assert all(isinstance(kern, Kernel) for _, kern in trace)
    assert lower(k).kernels[0].access == {"X": "read_only", "Y": "write_only"}
    # two kernels: the trace repeats per kernel
    k2, _, _ = _addone()
    trace = []
    lower(Program("p", (k, k2), (X, Y)), trace=trace)
    assert [n for n, _ in trace] == ["input", *PASS_NAMES] * 2


def test_lower_addone_texture_to_texture():
    k, X, Y = _addone()
    prog = lower(k)
    (kern,) = prog.kernels
    X2, Y2 = prog.params
    assert X2.shape == (2 * 3, 5, 4) and Y2.shape == (6, 5, 4) and X2.declared is X and Y2.declared is Y
    assert kern.params == (X2, Y2) and kern.launch() == ((15, 1, 1), (5, 1, 1))
    (ev,) = nodes(kern.body, Evaluate)
    assert ev.value.name == "texture2d_store" and ev.value.args[0] is Y2
    (ld,) = [c for c in nodes(kern.body, Call) if c.name == "texture2d_load"]
    assert ld.args[0] is X2
    assert not nodes(kern.body, BufferLoad) and not nodes(kern.body, BufferStore)
    data = np.random.default_rng(0).uniform(1, 2, (1, 8, 3, 5)).astype(np.float32)
    out = run_lowered(prog, {X: data}, {Y: np.zeros_like(data)})[Y]
    np.testing.assert_allclose(out, data + 1.0)


@pytest.mark.parametrize("layout", ["nchw4c", "mace_channel_major", "mace_height_major", "mace_width_major"])
@pytest.mark.parametrize("C, H, W", [(5, 3, 7), (3, 5, 2)])
def test_lower_scalar_copy_from_each_activation_layout(layout, C, H, W):
    """Scalar reads through a select chain: every element comes from its own pixel and lane."""
    N = 2
    X = buffer("X", (N, C, H, W), scope="texture", layout=layout)
    Y = buffer("Y", (N, C, H, W))
    b = Builder()
    with b.loop("n", N, "group.1") as n, b.loop("c", C) as c, b.loop("h", H, "group.0") as h, b.loop("w", W) as w:
        b.store(Y, (n, c, h, w), X[n, c, h, w] * 2.0)
    prog = lower(b.kernel("copy", [X, Y]))
    assert prog.params[0].shape == getattr(layouts, layout)().physical_shape((N, C, H, W))
    assert prog.params[1].shape == (N * C * H * W,)
    data = np.random.default_rng(C * H).uniform(1, 2, (N, C, H, W)).astype(np.float32)
    out = run_lowered(prog, {X: data}, {Y: np.zeros_like(data)})[Y]
    np.testing.assert_allclose(out, data * 2.0)


def _nest(b, shape, vec_axis, emit):
    """Loops over ``shape`` with ``vec_axis`` split by 4 and its inner part vectorized and innermost;
    ``emit(indices)`` writes the body."""
    order = [a for a in range(len(shape)) if a != vec_axis] + [vec_axis]
    idx = {}

    def go(pos):
        if pos == len(order):
            emit(tuple(idx[a] for a in range(len(shape))))
            return
        a = order[pos]
        if a == vec_axis:
            with b.loop(f"a{a}o", shape[a] // 4) as o, b.loop(f"a{a}i", 4, "vectorized") as i:
                idx[a] = o * 4 + i
                go(pos + 1)
        else:
            with b.loop(f"a{a}", shape[a]) as v:
                idx[a] = v
                go(pos + 1)
    go(0)


@pytest.mark.parametrize("layout, axis", [("nchw4c", 1), ("mace_channel_major", 1), ("mace_height_major", 2),
                                          ("mace_width_major", 3)])
def test_lower_vectorized_pixel_copy_both_ways(layout, axis):
    """Vectorizing the layout's lane axis gives whole-pixel loads and stores in both directions."""
    shape = [2, 8, 4, 8]
    X = buffer("X", shape, scope="texture", layout=layout)
    G = buffer("G", shape)
    Y = buffer("Y", shape, scope="texture", layout=layout)
    b = Builder()
    _nest(b, shape, axis, lambda idx: b.store(G, idx, X[idx] + 0.5))
    read = b.kernel("read", [X, G])
    b = Builder()
    _nest(b, shape, axis, lambda idx: b.store(Y, idx, G[idx] * 3.0))
    write = b.kernel("write", [G, Y])
    prog = lower(Program("p", (read, write), (X, Y), (G,)))
    r, w = prog.kernels
    # whole pixels only: no single-lane reads, no select chains
    assert [c.dtype for c in nodes(r.body, Call)] == [float32x4]
    assert not nodes(r.body, ExtractLane) and not nodes(r.body, Select)
    assert [c.name for c in nodes(w.body, Call)] == ["texture2d_store"]
    assert r.access == {"X": "read_only"} and w.access == {"Y": "write_only"}
    data = np.random.default_rng(axis).uniform(1, 2, shape).astype(np.float32)
    out = run_lowered(prog, {X: data}, {Y: np.zeros_like(data)})[Y]
    np.testing.assert_allclose(out, (data + 0.5) * 3.0)


def test_lower_conv2d_filter_and_bias_images():
    """A 1x1-conv-like kernel reading a MACE conv2d filter image, a 1-D bias image and a channel-major input."""
    N, C, O, H, W = 1, 5, 6, 2, 3
    X = buffer("X", (N, C, H, W), scope="texture", layout="mace_channel_major")
    F = buffer("F", (O, C, 1, 1), scope="texture:weight", layout="mace_conv2d_filter")
    Bi = buffer("Bi", (O,), scope="texture")  # default: mace_argument
    Y = buffer("Y", (N, O, H, W))
    b = Builder()
    with b.loop("o", O, "group.0") as o, b.loop("h", H) as h, b.loop("w", W, "local.0") as w:
        acc = b.allocate("acc", (1,))
        b.store(acc, 0, Bi[o])
        with b.loop("c", C) as c:
            b.store(acc, 0, acc[0] + X[0, c, h, w] * F[o, c, 0, 0])
        b.store(Y, (0, o, h, w), acc[0])
    prog = lower(b.kernel("conv1x1", [X, F, Bi, Y]))
    Xp, Fp, Bp, Yp = prog.params
    assert Fp.shape == (2 * 1 * 1, C, 4) and Bp.shape == (1, 2, 4) and Xp.shape == (N * H, W * 2, 4)
    assert prog.kernels[0].access == {"X": "read_only", "F": "read_only", "Bi": "read_only"}
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (N, C, H, W)).astype(np.float32)
    f = rng.uniform(-1, 1, (O, C, 1, 1)).astype(np.float32)
    bias = rng.uniform(-1, 1, (O,)).astype(np.float32)
    out = run_lowered(prog, {X: x, F: f, Bi: bias}, {Y: np.zeros((N, O, H, W), np.float32)})[Y]
    expect = np.einsum("nchw,oc->nohw", x, f[:, :, 0, 0]) + bias[None, :, None, None]
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


def test_lower_private_vector_accumulator():
    """A private [2, 4] accumulator accessed by whole rows: flattened, then read as float32x4 elements."""
    X = buffer("X", (16,))
    Y = buffer("Y", (8,))
    b = Builder()
    with b.loop("t", 1, "group.0"):
        acc = b.allocate("acc", (2, 4))
        with b.loop("r", 2) as r, b.loop("i", 4, "vectorized") as i:
            b.store(acc, (r, i), 0.0)
        with b.loop("k", 2) as kk, b.loop("r2", 2) as r2, b.loop("i2", 4, "vectorized") as i2:
            b.store(acc, (r2, i2), acc[r2, i2] + X[kk * 8 + r2 * 4 + i2])
        with b.loop("r3", 2) as r3, b.loop("i3", 4, "vectorized") as i3:
            b.store(Y, r3 * 4 + i3, acc[r3, i3])
    prog = lower(b.kernel("acc", [X, Y]))
    kern = prog.kernels[0]
    (alloc,) = nodes(kern.body, Allocate)
    assert alloc.buffer.shape == (8,) and alloc.buffer.dtype == float32
    acc_access = [*loads(kern, "acc"), *stores(kern, "acc")]
    assert acc_access and all(a.buffer.dtype == float32x4 and a.buffer.shape == (2,) for a in acc_access)
    assert all(a.buffer.dtype == float32x4 for a in [*loads(kern, "X"), *stores(kern, "Y")])
    data = np.arange(16, dtype=np.float32)
    out = run_lowered(prog, {X: data}, {Y: np.zeros(8, np.float32)})[Y]
    np.testing.assert_allclose(out, data[:8] + data[8:])


@pytest.mark.parametrize("C", [8, 5])
def test_lower_cache_read_into_texture(C):
    """texture RFC A0: copy a global buffer into a texture workspace with a shuffle kernel, then read it."""
    H, W = 3, 5
    X = buffer("X", (1, C, H, W))
    Y = buffer("Y", (1, C, H, W))
    b = Builder()
    with b.loop("h", H) as h, b.loop("w", W) as w, b.loop("c", C) as c:
        b.store(Y, (0, c, h, w), X[0, c, h, w] - 1.0)
    prog = cache_read(b.kernel("sub", [X, Y]), X, "texture")
    (ws,) = prog.workspaces
    assert ws.scope == "texture" and ws.shape == (1, C, H, W)
    lowered = lower(prog)
    shuffle, sub = lowered.kernels
    assert lowered.workspaces[0].shape == (2 * H, W, 4) and lowered.workspaces[0].declared is ws  # 5 -> 2 blocks
    assert shuffle.access == {ws.name: "write_only"} and sub.access == {ws.name: "read_only"}
    assert [c.name for c in nodes(shuffle.body, Call)] == ["texture2d_store"]
    data = np.random.default_rng(2).uniform(1, 2, (1, C, H, W)).astype(np.float32)
    memory = {}
    out = run_lowered(lowered, {X: data}, {Y: np.zeros_like(data)}, memory)[Y]
    np.testing.assert_allclose(out, data - 1.0)
    image = memory[ws]  # the shuffle wrote every pixel, the padding lanes as zero
    assert image.shape == (2 * H, W, 4) and not np.isnan(image).any()
    np.testing.assert_array_equal(image, layouts.nchw4c().pack(data))
