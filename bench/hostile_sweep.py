"""The hostile-user sweep of issue #23, second round (bench/notes/hostile-sweep.md): each case runs one `tuner`
command (under `timeout 120`) on hostile input and is classed as

- clean: exit 2 with an ``error:`` line, no traceback;
- handled: exit 0, and the result checked right (ONNX models against onnxruntime);
- silent: exit 0 with a wrong result, or an invalid input accepted as valid;
- traceback: a Python traceback, or an exit status other than 0 and 2 without an ``error:`` line;
- hang: still running after 120 s;
- loss: records or files the user had are gone.

    .venv/bin/python bench/hostile_sweep.py [--only SUBSTRING] [--json OUT.json]

Runs in a temporary folder; the default device (PoCL here). Prints one line per case and the table by group.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
TIMEOUT = 120
CLASSES = ["clean", "handled", "silent", "traceback", "hang", "loss"]


class R:
    def __init__(self, rc, out, err, hung):
        self.rc, self.out, self.err, self.hung = rc, out, err, hung

    def kind(self, expect_error=False):
        """The generic class: hang / traceback / clean / handled (or silent when an error was expected)."""
        if self.hung:
            return "hang"
        errline = any(re.match(r"(tuner[\w -]*: )?error:", line) for line in self.err.splitlines())
        if "Traceback" in self.err or "Traceback" in self.out:
            return "traceback"
        if self.rc == 2 and errline:
            return "clean"
        if self.rc == 0:
            return "silent" if expect_error else "handled"
        return "traceback"  # another status, or 2 without an error line: not a clean refusal

    def tail(self):
        lines = [l for l in (self.err.strip() or self.out.strip()).splitlines() if l.strip()]
        return (lines[-1] if lines else "")[:160]


def tuner(*args, cwd, timeout=TIMEOUT, env=None):
    cmd = ["timeout", "-s", "KILL", str(timeout), PY, "-m", "tuner", *map(str, args)]
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=e)
    return R(p.returncode, p.stdout, p.stderr, p.returncode in (124, 137, -9))


# ---------------------------------------------------------------------------------------------- ONNX models
def onnx_model(path, nodes, inputs, outputs, inits=(), opset=17):
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    nodes, inits, outputs = list(nodes), list(inits), list(outputs)
    shape = [d.dim_value for d in outputs[0].type.tensor_type.shape.dim]
    if len(shape) not in (2, 4) and 0 not in shape:  # the tuner's outputs are 2-D or 4-D: flattened to (N, -1)
        name = outputs[0].name
        for n in nodes:
            n.output[:] = [f"{name}_pre" if o == name else o for o in n.output]
        nodes.append(h.make_node("Reshape", [f"{name}_pre", "flatten_shape"], [name], name="flatten_out"))
        inits.append(onnx.numpy_helper.from_array(np.array([shape[0], -1], np.int64), "flatten_shape"))
        outputs[0] = h.make_tensor_value_info(name, outputs[0].type.tensor_type.elem_type,
                                              [shape[0], int(np.prod(shape[1:]))])
    g = h.make_graph(nodes, "m", inputs, outputs, initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def ort_run(path, feeds):
    """onnxruntime's outputs, or None when onnxruntime refuses the model or the run."""
    import onnxruntime as ort
    ort.set_default_logger_severity(4)
    try:
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return s.run(None, feeds)
    except Exception:
        return None


def onnx_case(work, name, nodes, inputs, outputs, inits=(), feeds=None, opset=17, tol=1e-4):
    """Compile with tuner, run on ``feeds``, compare its first output with onnxruntime's."""
    from onnx import TensorProto as TP
    d = work / name
    d.mkdir(exist_ok=True)
    path = onnx_model(d / "m.onnx", nodes, inputs, outputs, inits, opset)
    if feeds is None:
        rng = np.random.default_rng(0)
        feeds = {}
        for vi in inputs:
            shape = [x.dim_value for x in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    ref = ort_run(path, feeds)
    r = tuner("compile", path, "-o", d / "art", "--no-progress", cwd=d)
    k = r.kind(expect_error=ref is None)
    if k != "handled":
        if ref is None and k == "silent":
            return "silent", "compiled a model onnxruntime refuses"
        return k, r.tail()
    args = []
    for n, x in feeds.items():
        np.save(d / f"{n}.npy", x)
        args += ["--input", f"{n}={d / (n + '.npy')}" if len(feeds) > 1 else d / f"{n}.npy"]
    r = tuner("run", d / "art", *args, "--output", d / "y.npy", "--repeat", "1", cwd=d)
    k = r.kind()
    if k != "handled":
        return k, "run: " + r.tail()
    y = np.load(d / "y.npy")
    want = ref[0]
    if y.shape != want.shape:
        return "silent", f"shape {y.shape} != onnxruntime {want.shape}"
    want, y = want.astype(np.float64), y.astype(np.float64)
    fin = np.isfinite(want)
    if not np.array_equal(fin, np.isfinite(y)) or not np.array_equal(want[~fin], y[~fin], equal_nan=True):
        return "silent", "NaN/infinity where onnxruntime has none, or the other way"
    err = float(np.max(np.abs(y[fin] - want[fin])) / max(np.max(np.abs(want[fin])), 1e-30)) if fin.any() else 0.0
    if not np.isfinite(err) or err > tol:
        return "silent", f"max rel. error {err:.3g} against onnxruntime"
    return "handled", f"matches onnxruntime (rel. error {err:.1e})"


def _onnx_cases():
    """(name, builder) pairs; a builder returns onnx_case's arguments after ``work, name``."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(1)
    C, H, W = 8, 2, 3
    T = H * W

    def vi(name, shape, t=TP.FLOAT):
        return h.make_tensor_value_info(name, t, shape)

    def c(name, arr):
        return nh.from_array(np.asarray(arr), name)

    def i64(name, vals):
        return c(name, np.array(vals, np.int64))

    def tokens(extra_nodes, out_shape, extra_inits=(), out="y", opset=17, in_shape=(1, C, H, W), out_type=TP.FLOAT):
        """input (1,C,H,W) -> tokens 'tok' (1,T,C) -> extra_nodes -> out."""
        nodes = [h.make_node("Reshape", ["x", "s_tok"], ["flat"], name="flat"),
                 h.make_node("Transpose", ["flat"], ["tok"], perm=[0, 2, 1], name="tok"), *extra_nodes]
        inits = [i64("s_tok", [in_shape[0], in_shape[1], in_shape[2] * in_shape[3]]), *extra_inits]
        return dict(nodes=nodes, inputs=[vi("x", list(in_shape))], outputs=[vi(out, out_shape, out_type)],
                    inits=inits, opset=opset)

    def heads(extra_nodes, out_shape, extra_inits=(), opset=17, **kw):
        """tokens -> q (1,2,T,4), k (1,2,T,4), v (1,2,T,4) (a reshape and transpose of the tokens) -> extra."""
        nodes = [h.make_node("Reshape", ["tok", "s_h"], ["th"], name="th"),
                 h.make_node("Transpose", ["th"], ["q"], perm=[0, 2, 1, 3], name="q"),
                 h.make_node("Mul", ["tok", "two"], ["tok2"], name="tok2"),
                 h.make_node("Reshape", ["tok2", "s_h"], ["th2"], name="th2"),
                 h.make_node("Transpose", ["th2"], ["k"], perm=[0, 2, 1, 3], name="k"), *extra_nodes]
        inits = [i64("s_h", [1, T, 2, C // 2]), c("two", np.array(2.0, np.float32)), *extra_inits]
        return tokens(nodes, out_shape, inits, opset=opset, **kw)

    kt = h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="kt")
    cases = {
        # MatMul of activations
        "matmul_qkT_ok": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["y"], name="mm")], [1, 2, T, T]),
        "matmul_mismatched_K": lambda: heads([h.make_node("MatMul", ["q", "k"], ["y"], name="mm")], [1, 2, T, T]),
        "matmul_batch_broadcast": lambda: heads([
            kt, h.make_node("Slice", ["kt", "z1", "o1", "a1"], ["kt1"], name="kt1"),
            h.make_node("MatMul", ["q", "kt1"], ["y"], name="mm")], [1, 2, T, T],
            [i64("z1", [0]), i64("o1", [1]), i64("a1", [1])]),
        "matmul_3d_by_4d": lambda: heads([kt, h.make_node("MatMul", ["tok", "kt"], ["y"], name="mm")], [1, 2, T, T]),
        "matmul_act_by_1d_const": lambda: tokens([h.make_node("MatMul", ["tok", "w1"], ["y"], name="mm")], [1, T],
                                                 [c("w1", rng.standard_normal(C).astype(np.float32))]),
        # Softmax
        "softmax_axis0": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["s"], name="mm"),
                                        h.make_node("Softmax", ["s"], ["y"], axis=0, name="sm")], [1, 2, T, T]),
        "softmax_axis1_heads": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["s"], name="mm"),
                                              h.make_node("Softmax", ["s"], ["y"], axis=1, name="sm")], [1, 2, T, T]),
        "softmax_axis_neg4": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["s"], name="mm"),
                                            h.make_node("Softmax", ["s"], ["y"], axis=-4, name="sm")], [1, 2, T, T]),
        "softmax_axis_out_of_range": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["s"], name="mm"),
                                                    h.make_node("Softmax", ["s"], ["y"], axis=4, name="sm")],
                                                   [1, 2, T, T]),
        "softmax_tokens_axis0": lambda: tokens([h.make_node("Softmax", ["tok"], ["y"], axis=0, name="sm")], [1, T, C]),
        "softmax_tokens_axis1": lambda: tokens([h.make_node("Softmax", ["tok"], ["y"], axis=1, name="sm")], [1, T, C]),
        "logsoftmax_tokens": lambda: tokens([h.make_node("LogSoftmax", ["tok"], ["y"], axis=-1, name="sm")],
                                            [1, T, C]),
        "softmax_opset11_axis1": lambda: tokens([h.make_node("Softmax", ["tok"], ["y"], axis=1, name="sm")],
                                                [1, T, C], opset=11),
        # Gather
        "gather_token0": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")], [1, C],
                                        [i64("g", 0)]),
        "gather_negative": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")], [1, C],
                                          [i64("g", -1)]),
        "gather_negative_vec": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")],
                                              [1, 2, C], [i64("g", [-1, 0])]),
        "gather_out_of_range": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")], [1, C],
                                              [i64("g", T)]),
        "gather_out_of_range_neg": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")],
                                                  [1, C], [i64("g", -T - 1)]),
        "gather_axis2_vec": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=2, name="g")],
                                           [1, T, 2], [i64("g", [3, 1])]),
        "gather_axis_neg1_scalar": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=-1, name="g")],
                                                  [1, T], [i64("g", 2)]),
        "gather_int32_idx": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")], [1, C],
                                           [c("g", np.array(1, np.int32))]),
        "gather_axis0": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=0, name="g")], [T, C],
                                       [i64("g", 0)]),
        "gather_2d_idx": lambda: tokens([h.make_node("Gather", ["tok", "g"], ["y"], axis=1, name="g")],
                                        [1, 2, 2, C], [i64("g", [[0, 1], [2, 3]])]),
        # Reshape
        "reshape_0_-1": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")], [1, T * C],
                                       [i64("r", [0, -1])]),
        "reshape_-1_0": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")], [1, T, C],
                                       [i64("r", [-1, 0, C])]),
        "reshape_0_0_-1_2": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")],
                                           [1, T, C // 2, 2], [i64("r", [0, 0, -1, 2])]),
        "reshape_two_-1": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")], [1, T, C],
                                         [i64("r", [-1, -1, C])]),
        "reshape_bad_count": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")], [1, 5, C],
                                            [i64("r", [1, 5, -1])]),
        "reshape_0_past_rank": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")],
                                              [1, T, C, 1], [i64("r", [0, 0, 0, 0])]),
        "reshape_allowzero": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], allowzero=1, name="r")],
                                            [1, T, C], [i64("r", [0, T, C])], opset=14),
        "reshape_-2": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")], [1, T, C],
                                     [i64("r", [1, -2, -4])]),
        "reshape_swap_TC": lambda: tokens([h.make_node("Reshape", ["tok", "r"], ["y"], name="r")], [1, C, T],
                                          [i64("r", [0, C, -1])]),
        # Tile
        "tile_zero": lambda: tokens([h.make_node("Tile", ["tok", "rep"], ["y"], name="t")], [1, 0, C],
                                    [i64("rep", [1, 0, 1])]),
        "tile_ones": lambda: tokens([h.make_node("Tile", ["tok", "rep"], ["y"], name="t")], [1, T, C],
                                    [i64("rep", [1, 1, 1])]),
        "tile_twice_tokens": lambda: tokens([h.make_node("Tile", ["tok", "rep"], ["y"], name="t")], [1, 2 * T, C],
                                            [i64("rep", [1, 2, 1])]),
        "tile_negative": lambda: tokens([h.make_node("Tile", ["tok", "rep"], ["y"], name="t")], [1, T, C],
                                        [i64("rep", [1, -1, 1])]),
        "tile_wrong_len": lambda: tokens([h.make_node("Tile", ["tok", "rep"], ["y"], name="t")], [1, T, C],
                                         [i64("rep", [1, 1])]),
        "tile_nchw_zero": lambda: dict(nodes=[h.make_node("Tile", ["x", "rep"], ["y"], name="t")],
                                       inputs=[vi("x", [1, C, H, W])], outputs=[vi("y", [1, C, 0, W])],
                                       inits=[i64("rep", [1, 1, 0, 1])]),
        # Concat
        "concat_ranks": lambda: tokens([h.make_node("Concat", ["tok", "x"], ["y"], axis=1, name="cc")], [1, T + C, C]),
        "concat_mismatched_dims": lambda: tokens([h.make_node("Concat", ["tok", "cst"], ["y"], axis=1, name="cc")],
                                                 [1, T + 1, C],
                                                 [c("cst", np.ones((1, 1, C + 1), np.float32))]),
        "concat_const_front": lambda: tokens([h.make_node("Concat", ["cst", "tok"], ["y"], axis=1, name="cc")],
                                             [1, T + 1, C], [c("cst", rng.standard_normal((1, 1, C)).astype(np.float32))]),
        "concat_axis_out_of_range": lambda: tokens([h.make_node("Concat", ["tok", "tok"], ["y"], axis=3, name="cc")],
                                                   [1, T, C]),
        "concat_axis_neg": lambda: tokens([h.make_node("Concat", ["tok", "tok"], ["y"], axis=-1, name="cc")],
                                          [1, T, 2 * C]),
        "concat_int_const": lambda: tokens([h.make_node("Concat", ["tok", "cst"], ["y"], axis=1, name="cc")],
                                           [1, T + 1, C], [c("cst", np.ones((1, 1, C), np.int64))]),
        # ReduceMean
        "reducemean_noop_empty": lambda: tokens([h.make_node("ReduceMean", ["tok"], ["y"], noop_with_empty_axes=1,
                                                             name="rm")], [1, T, C], opset=18),
        "reducemean_empty_axes_input_noop": lambda: tokens([h.make_node("ReduceMean", ["tok", "ax"], ["y"],
                                                                        noop_with_empty_axes=1, name="rm")],
                                                           [1, T, C], [i64("ax", [])], opset=18),
        "reducemean_no_axes": lambda: tokens([h.make_node("ReduceMean", ["tok"], ["y"], name="rm")], [1, 1, 1],
                                             opset=18),
        "reducemean_axis0_keep": lambda: tokens([h.make_node("ReduceMean", ["tok", "ax"], ["y"], name="rm")],
                                                [1, T, C], [i64("ax", [0])], opset=18),
        "reducemean_tokens_axis1": lambda: tokens([h.make_node("ReduceMean", ["tok", "ax"], ["y"], keepdims=0,
                                                              name="rm")], [1, C], [i64("ax", [1])], opset=18),
        "reducemean_dup_axes": lambda: tokens([h.make_node("ReduceMean", ["tok", "ax"], ["y"], name="rm")],
                                              [1, T, 1], [i64("ax", [2, -1])], opset=18),
        "reducemean_axis_out_of_range": lambda: tokens([h.make_node("ReduceMean", ["tok", "ax"], ["y"], name="rm")],
                                                       [1, T, 1], [i64("ax", [5])], opset=18),
        "reducemean_nchw_noop": lambda: dict(nodes=[h.make_node("ReduceMean", ["x"], ["y"], noop_with_empty_axes=1,
                                                                name="rm")],
                                             inputs=[vi("x", [1, C, H, W])], outputs=[vi("y", [1, C, H, W])],
                                             opset=18),
        "reducemean_opset13_attr": lambda: dict(nodes=[h.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3],
                                                                   name="rm")],
                                                inputs=[vi("x", [1, C, H, W])], outputs=[vi("y", [1, C, 1, 1])],
                                                opset=13),
        # Cast
        "cast_int32": lambda: tokens([h.make_node("Cast", ["tok"], ["y"], to=TP.INT32, name="c")], [1, T, C],
                                     out_type=TP.INT32),
        "cast_int64_then_float": lambda: tokens([h.make_node("Cast", ["tok"], ["ci"], to=TP.INT64, name="c"),
                                                 h.make_node("Cast", ["ci"], ["y"], to=TP.FLOAT, name="c2")],
                                                [1, T, C]),
        "cast_bool_then_float": lambda: tokens([h.make_node("Cast", ["tok"], ["cb"], to=TP.BOOL, name="c"),
                                                h.make_node("Cast", ["cb"], ["y"], to=TP.FLOAT, name="c2")],
                                               [1, T, C]),
        "cast_string": lambda: tokens([h.make_node("Cast", ["tok"], ["y"], to=TP.STRING, name="c")], [1, T, C],
                                      out_type=TP.STRING),
        # documented: float casts of activations are identities (no rounding to float16): within 1e-3
        "cast_float16": lambda: dict(tokens([h.make_node("Cast", ["tok"], ["ch"], to=TP.FLOAT16, name="c"),
                                             h.make_node("Cast", ["ch"], ["y"], to=TP.FLOAT, name="c2")], [1, T, C]),
                                     tol=1e-3),
        "cast_double": lambda: tokens([h.make_node("Cast", ["tok"], ["cd"], to=TP.DOUBLE, name="c"),
                                       h.make_node("Cast", ["cd"], ["y"], to=TP.FLOAT, name="c2")], [1, T, C]),
        "cast_uint8_then_float": lambda: tokens([h.make_node("Cast", ["tok"], ["cu"], to=TP.UINT8, name="c"),
                                                 h.make_node("Cast", ["cu"], ["y"], to=TP.FLOAT, name="c2")],
                                                [1, T, C]),
        "cast_const_int_weight": lambda: tokens([h.make_node("Cast", ["wi"], ["wf"], to=TP.FLOAT, name="c"),
                                                 h.make_node("Add", ["tok", "wf"], ["y"], name="a")], [1, T, C],
                                                [c("wi", np.arange(C, dtype=np.int64) - 3)]),
        "cast_const_float_to_int_weight": lambda: tokens([
            h.make_node("Cast", ["wf0"], ["wi"], to=TP.INT32, name="c"),
            h.make_node("Cast", ["wi"], ["wf"], to=TP.FLOAT, name="c1"),
            h.make_node("Add", ["tok", "wf"], ["y"], name="a")], [1, T, C],
            [c("wf0", (rng.standard_normal(C) * 3).astype(np.float32))]),
        # Expand
        "expand_smaller": lambda: tokens([h.make_node("Expand", ["cls", "es"], ["clsn"], name="e"),
                                          h.make_node("Add", ["tok", "clsn"], ["y"], name="a")], [1, T, C],
                                         [c("cls", rng.standard_normal((1, T, C)).astype(np.float32)),
                                          i64("es", [1, 1, 1])]),
        "expand_incompatible": lambda: tokens([h.make_node("Expand", ["cls", "es"], ["clsn"], name="e"),
                                               h.make_node("Add", ["tok", "clsn"], ["y"], name="a")], [1, T, C],
                                              [c("cls", rng.standard_normal((1, 1, C)).astype(np.float32)),
                                               i64("es", [1, 1, 3])]),
        "expand_activation_smaller": lambda: tokens([h.make_node("Expand", ["tok", "es"], ["y"], name="e")],
                                                    [1, T, C], [i64("es", [1])]),
        "expand_activation_bigger": lambda: tokens([h.make_node("Expand", ["tok", "es"], ["y"], name="e")],
                                                   [2, T, C], [i64("es", [2, 1, 1])]),
        "expand_activation_rank_up": lambda: tokens([h.make_node("Expand", ["tok", "es"], ["e1"], name="e"),
                                                     h.make_node("Add", ["e1", "one"], ["y"], name="a")],
                                                    [2, 1, T, C], [i64("es", [2, 1, 1, 1]),
                                                                   c("one", np.array(1.0, np.float32))]),
        "expand_nchw_zero": lambda: dict(nodes=[h.make_node("Expand", ["x", "es"], ["y"], name="e")],
                                         inputs=[vi("x", [1, C, 1, W])], outputs=[vi("y", [1, C, 0, W])],
                                         inits=[i64("es", [1, 1, 0, 1])]),
        # more attention-shaped constructs
        "softmax_heads_axis2": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["s"], name="mm"),
                                              h.make_node("Softmax", ["s"], ["y"], axis=2, name="sm")], [1, 2, T, T]),
        "softmax_heads_axis_neg5": lambda: heads([kt, h.make_node("MatMul", ["q", "kt"], ["s"], name="mm"),
                                                  h.make_node("Softmax", ["s"], ["y"], axis=-5, name="sm")],
                                                 [1, 2, T, T]),
        "gather_heads_axis1": lambda: heads([h.make_node("Gather", ["q", "g"], ["y"], axis=1, name="g")],
                                            [1, T, C // 2], [i64("g", 1)]),
        "gather_heads_axis3_neg": lambda: heads([h.make_node("Gather", ["q", "g"], ["y"], axis=3, name="g")],
                                                [1, 2, T], [i64("g", -2)]),
        "matmul_k_by_q_T": lambda: heads([h.make_node("Transpose", ["q"], ["qt"], perm=[0, 1, 3, 2], name="qt"),
                                          h.make_node("MatMul", ["qt", "k"], ["y"], name="mm")], [1, 2, C // 2, C // 2]),
        "matmul_self": lambda: heads([kt, h.make_node("MatMul", ["kt", "q"], ["y"], name="mm")],
                                     [1, 2, C // 2, C // 2]),
        "transpose_dup_perm": lambda: tokens([h.make_node("Transpose", ["tok"], ["y"], perm=[0, 1, 1], name="t")],
                                             [1, T, T]),
        "transpose_short_perm": lambda: tokens([h.make_node("Transpose", ["tok"], ["y"], perm=[1, 0], name="t")],
                                               [T, 1]),
        "reducemean_keep0_middle": lambda: heads([h.make_node("ReduceMean", ["q", "ax"], ["y"], keepdims=0,
                                                              name="rm")], [1, 2, C // 2], [i64("ax", [2])],
                                                 opset=18),
        "reducemax_heads_axis1": lambda: heads([h.make_node("ReduceMax", ["q", "ax"], ["y"], name="rm")],
                                               [1, 1, T, C // 2], [i64("ax", [1])], opset=18),
        "concat_features_const": lambda: tokens([h.make_node("Concat", ["tok", "cst"], ["y"], axis=2, name="cc")],
                                                [1, T, C + 2],
                                                [c("cst", rng.standard_normal((1, T, 2)).astype(np.float32))]),
        "split_uneven": lambda: tokens([h.make_node("Split", ["tok", "sp"], ["a", "b"], axis=2, name="sp"),
                                        h.make_node("Mul", ["a", "b2"], ["y"], name="m")], [1, T, 3],
                                       [i64("sp", [3, 5]), c("b2", np.array(2.0, np.float32))]),
        "split_bad_sizes": lambda: tokens([h.make_node("Split", ["tok", "sp"], ["a", "b"], axis=2, name="sp"),
                                           h.make_node("Mul", ["a", "b2"], ["y"], name="m")], [1, T, 3],
                                          [i64("sp", [3, 6]), c("b2", np.array(2.0, np.float32))]),
        "slice_step2_tokens": lambda: tokens([h.make_node("Slice", ["tok", "st", "en", "ax", "sp"], ["y"], name="s")],
                                             [1, T // 2, C], [i64("st", [0]), i64("en", [T]), i64("ax", [1]),
                                                              i64("sp", [2])]),
        "slice_negative_step": lambda: tokens([h.make_node("Slice", ["tok", "st", "en", "ax", "sp"], ["y"],
                                                           name="s")], [1, T, C],
                                              [i64("st", [-1]), i64("en", [-T - 1]), i64("ax", [1]), i64("sp", [-1])]),
        "slice_empty": lambda: tokens([h.make_node("Slice", ["tok", "st", "en", "ax"], ["y"], name="s")],
                                      [1, 0, C], [i64("st", [3]), i64("en", [3]), i64("ax", [1])]),
        "layernorm_axis1": lambda: tokens([h.make_node("LayerNormalization", ["tok", "g", "b"], ["y"], axis=1,
                                                       name="ln")], [1, T, C],
                                          [c("g", rng.standard_normal((T, C)).astype(np.float32)),
                                           c("b", rng.standard_normal((T, C)).astype(np.float32))]),
        "layernorm_bad_scale": lambda: tokens([h.make_node("LayerNormalization", ["tok", "g", "b"], ["y"], axis=-1,
                                                           name="ln")], [1, T, C],
                                              [c("g", rng.standard_normal(C + 1).astype(np.float32)),
                                               c("b", rng.standard_normal(C + 1).astype(np.float32))]),
        "where_mask": lambda: tokens([h.make_node("Where", ["msk", "tok", "zero"], ["y"], name="w")], [1, T, C],
                                     [c("msk", rng.random((1, T, C)) > 0.5), c("zero", np.array(0.0, np.float32))]),
        "add_int_const": lambda: tokens([h.make_node("Add", ["tok", "ci"], ["y"], name="a")], [1, T, C],
                                        [c("ci", np.arange(C, dtype=np.int64))]),
        "add_nan_const": lambda: tokens([h.make_node("Add", ["tok", "cn"], ["y"], name="a")], [1, T, C],
                                        [c("cn", np.full((1, 1, C), np.nan, np.float32))]),
        "div_by_zero_const": lambda: tokens([h.make_node("Div", ["tok", "cz"], ["y"], name="a")], [1, T, C],
                                            [c("cz", np.zeros((1, 1, C), np.float32))]),
        "pow_const_half": lambda: tokens([h.make_node("Pow", ["tok", "ph"], ["y"], name="p")], [1, T, C],
                                         [c("ph", np.array(0.5, np.float32))]),
        "pow_int_exponent": lambda: tokens([h.make_node("Pow", ["tok", "p3"], ["y"], name="p")], [1, T, C],
                                           [c("p3", np.array(3, np.int64))]),
    }
    return cases


# ------------------------------------------------------------------------------------------ shared fixtures
_BASE: dict = {}
SIB = "pocl-cpu-0badc0de"  # a made-up sibling of this PoCL device (same family: 'pthread-amd epyc')


def base(work) -> dict:
    """Built once per sweep under the sweep's folder: a conv model and its onnxruntime output, its artifact, a
    two-input model's artifact, a log of the conv tuned here, and that log rewritten as a sibling's."""
    if _BASE:
        return _BASE
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    b = work.parent / "base"
    b.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    conv = onnx_model(b / "conv.onnx", [h.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4)],
                      [h.make_tensor_value_info("x", TP.FLOAT, [1, 8, 16, 16])],
                      [h.make_tensor_value_info("y", TP.FLOAT, [1, 8, 16, 16])], [w])
    x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.save(b / "x.npy", x)
    np.save(b / "ref.npy", ort_run(conv, {"x": x})[0])
    two = onnx_model(b / "two.onnx", [h.make_node("Sub", ["a", "b"], ["y"], name="sub")],
                     [h.make_tensor_value_info("a", TP.FLOAT, [1, 4, 3, 5]),
                      h.make_tensor_value_info("b", TP.FLOAT, [1, 4, 3, 5])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 3, 5])])
    for name, model in (("conv_art", conv), ("two_art", two)):
        r = tuner("compile", model, "-o", b / name, "--no-progress", cwd=b)
        assert r.rc == 0, r.err
    r = tuner("tune-op", "conv2d", "--data", "1,8,16,16", "--kernel", "8,8,3,3", "--padding", "1", "--scope",
              "buffer", "--trials", "4", "--log", b / "own.jsonl", "--storage", f"sqlite:///{b / 's.db'}",
              "--no-progress", cwd=b)
    assert r.rc == 0, r.err
    recs = [json.loads(l) for l in (b / "own.jsonl").read_text().splitlines()]
    for r in recs:
        r.update(device=SIB, device_name="pthread-AMD EPYC 9999")
    _BASE.update(dir=b, conv=conv, two=two, x=b / "x.npy", ref=b / "ref.npy", art=b / "conv_art",
                 two_art=b / "two_art", own=b / "own.jsonl", sib_records=recs)
    return _BASE


def sibling_log(work, edit=None, lines=()):
    """logs/SIB.jsonl in ``work``: the sibling's records, each passed through ``edit`` (may return None to
    drop it), then ``lines`` appended as they are."""
    bs = base(work)
    (work / "logs").mkdir(exist_ok=True)
    out = []
    for r in bs["sib_records"]:
        r = json.loads(json.dumps(r))
        r = edit(r) if edit else r
        if r is not None:
            out.append(json.dumps(r))
    (work / "logs" / f"{SIB}.jsonl").write_text("\n".join(out + list(lines)) + "\n")


def transfer_case(name, edit=None, lines=(), spec=SIB, extra=(), applied=False):
    """compile the conv with --transfer-from against a hostile sibling log; run it; compare with onnxruntime;
    ``applied``: the sibling's records are valid here, and the compile must say it took them."""
    def fn(work):
        bs = base(work)
        sibling_log(work, edit, lines)
        r = tuner("compile", bs["conv"], "-o", work / "art", "--no-progress", "--transfer-from", spec,
                  "--scope", "buffer", *extra, cwd=work)
        k = r.kind()
        if k != "handled":
            return k, r.tail()
        r2 = tuner("run", work / "art", "--input", bs["x"], "--output", work / "y.npy", "--repeat", "1", cwd=work)
        if r2.kind() != "handled":
            return r2.kind(), "run: " + r2.tail()
        err = float(np.max(np.abs(np.load(work / "y.npy") - np.load(bs["ref"]))))
        if not err < 1e-3:
            return "silent", f"max abs. error {err:.3g} against onnxruntime"
        if applied and f"from the records of sibling {SIB}" not in r.out:
            return "silent", "the sibling's valid records were not applied, and nothing said so"
        return "handled", r.tail()
    CASES.append(("transfer", name, fn))


def _set(key, value):
    def edit(r):
        r["config"][key] = value
        return r
    return edit


def _register_cli():
    def conv(w):
        return base(w)["conv"]

    # --transfer-from on compile / tune / tune-op
    transfer_case("sibling_valid", applied=True)
    transfer_case("sibling_auto", spec="auto")  # auto: the family's devices in the logs given (none here)
    transfer_case("sibling_wg_too_big", _set("wg_w", 4096))
    transfer_case("sibling_tile_string", _set("tile_oc", "huge"))
    transfer_case("sibling_tile_float", _set("tile_oc", 4.0))
    transfer_case("sibling_tile_bool", _set("tile_oc", True))
    transfer_case("sibling_missing_knob", lambda r: (r["config"].pop("tile_oc", None), r)[1])
    transfer_case("sibling_unknown_knob", _set("warp_magic", 7))
    transfer_case("sibling_scope_mismatch", _set("input_scope", "texture"))
    transfer_case("sibling_nan_costs", lines=['{"version":1,"costs":[NaN]}'], applied=True)
    transfer_case("sibling_zero_cost", lambda r: dict(r, costs=[0.0] * len(r["costs"])))
    transfer_case("sibling_negative_cost", lambda r: dict(r, costs=[-1.0] * len(r["costs"])))
    transfer_case("sibling_template_nosuch", lambda r: dict(r, template="nosuch"))
    transfer_case("sibling_workload_garbage", lambda r: dict(r, workload={"data": "abc"}))
    transfer_case("sibling_nested", lines=["[" * 100000 + "]" * 100000], applied=True)
    transfer_case("sibling_garbage_lines", lines=["not json", "{", "\x00\x01", '{"a":1}', "1e999999"], applied=True)
    transfer_case("sibling_huge_line", lines=['{"x":"' + "a" * 20_000_000 + '"}'])
    transfer_case("sibling_device_is_self", lambda r: dict(r, device="pocl-cpu-e66d8a71"))
    transfer_case("sibling_other_workload_only",
                  lambda r: dict(r, workload=dict(r["workload"], data=[1, 8, 32, 32])))
    transfer_case("sibling_empty_log", lambda r: None)
    transfer_case("self_fingerprint", spec="pocl-cpu-e66d8a71")
    for n, spec in [("empty", ""), ("comma", ","), ("path", "../../etc/passwd"), ("space", "pocl cpu"),
                    ("long", "a-b-" + "c" * 5000), ("upper", SIB.upper()), ("auto_and_fp", f"auto,{SIB}"),
                    ("unknown_fp", "nvidia-gpu-00000000"), ("glob", "pocl-*"), ("newline", f"{SIB}\nx")]:
        cli_case("transfer", f"compile_spec_{n}", "compile", conv, "-o", "art", "--no-progress",
                 "--transfer-from", spec, expect_error=n not in ("upper", "auto_and_fp", "empty", "comma"),
                 setup=lambda w: sibling_log(w))

    def fifo(w):
        (w / "logs").mkdir(exist_ok=True)
        os.mkfifo(w / "logs" / f"{SIB}.jsonl")
    cli_case("transfer", "sibling_log_fifo", "compile", conv, "-o", "art", "--no-progress", "--transfer-from", SIB,
             setup=fifo)
    cli_case("transfer", "sibling_log_dir", "compile", conv, "-o", "art", "--no-progress", "--transfer-from", SIB,
             setup=lambda w: (w / "logs" / f"{SIB}.jsonl").mkdir(parents=True))
    cli_case("transfer", "sibling_log_devzero", "compile", conv, "-o", "art", "--no-progress", "--transfer-from",
             SIB, setup=lambda w: ((w / "logs").mkdir(), os.symlink("/dev/zero", w / "logs" / f"{SIB}.jsonl")))
    cli_case("transfer", "tune_op_sibling_hostile", "tune-op", "conv2d", "--data", "1,8,16,16", "--kernel",
             "8,8,3,3", "--padding", "1", "--scope", "buffer", "--trials", "2", "--transfer-from", SIB,
             "--no-progress", "--storage", "sqlite:///s.db", expect_error=False,
             setup=lambda w: sibling_log(w, _set("wg_w", 4096), ['{"version":1}', "[" * 50000]))
    cli_case("transfer", "tune_op_bad_fp", "tune-op", "conv2d", "--data", "1,8,16,16", "--kernel", "8,8,3,3",
             "--trials", "2", "--transfer-from", "x;rm -rf", "--no-progress")
    cli_case("transfer", "tune_sibling_hostile", "tune", conv, "--trials", "2", "--min-trials", "1",
             "--transfer-from", SIB,
             "--no-progress", "--scope", "buffer", "--storage", "sqlite:///s.db", expect_error=False,
             setup=lambda w: sibling_log(w, _set("tile_oc", -4), ['{"version":1,"template":"conv2d"}']))
    cli_case("transfer", "tune_missing_sibling", "tune", conv, "--trials", "2", "--transfer-from",
             "nvidia-gpu-12345678", "--no-progress")

    # tuner op matmul
    mm = ["op", "matmul", "--a", "2,8,12", "--b", "2,12,16", "--scope", "buffer"]
    for n, extra, err in [
            ("ok_check", [], False), ("alpha_nan", ["--alpha", "nan"], True), ("alpha_inf", ["--alpha", "inf"], True),
            ("alpha_neg_inf", ["--alpha=-inf"], True), ("alpha_1e39", ["--alpha", "1e39"], True),
            ("alpha_text", ["--alpha", "two"], True), ("alpha_zero", ["--alpha", "0"], False),
            ("alpha_neg", ["--alpha", "-0.5"], False), ("alpha_tiny", ["--alpha", "1e-45"], False),
            ("trans_b_mismatch", ["--trans-b"], True), ("half", ["--dtype", "float16"], False),
            ("bias_relu_residual", ["--bias", "--activation", "relu", "--residual"], False),
            ("data_given", ["--data", "1,4,6,6"], True), ("kernel_given", ["--kernel", "4,4,3,3"], True),
            ("weight_given", ["--weight", "4,4"], True), ("stride_given", ["--stride", "2"], True),
            ("config_bad_knob", ["--config", '{"tile_m": 3}'], True),
            ("config_unknown_knob", ["--config", '{"warp": 3}'], True),
            ("config_split_k_huge", ["--config", '{"split_k": 4096}'], True),
            ("activation_nosuch", ["--activation", "gelu2"], True)]:
        cli_case("matmul", f"op_{n}", *mm, *extra, "--check", expect_error=err)
    for n, a, b, err in [("mismatched_K", "2,8,12", "2,13,16", True), ("batch_mismatch", "2,8,12", "3,12,16", True),
                         ("rank2", "8,12", "12,16", True), ("rank4", "1,2,8,12", "1,2,12,16", True),
                         ("zero_M", "2,0,12", "2,12,16", True), ("negative", "2,-8,12", "2,12,16", True),
                         ("huge", "1,1000000,1000000", "1,1000000,1000000", True),
                         ("huge_batch", "100000000,1,1", "100000000,1,1", False),
                         ("odd_sizes", "3,7,5", "3,5,9", False), ("one_by_one", "1,1,1", "1,1,1", False),
                         ("texts", "a,b,c", "1,2,3", True), ("floats", "1.5,2,3", "1,3,2", True)]:
        cli_case("matmul", f"op_shape_{n}", "op", "matmul", "--a", a, "--b", b, "--check", expect_error=err)
    # tuner run --input
    def arr(name, make):
        def setup(w):
            x = make()
            if isinstance(x, bytes):
                (w / name).write_bytes(x)
            else:
                np.save(w / name, x, allow_pickle=True)
        return setup

    def same_as_ref(w, r):
        y = np.load(w / "y.npy")
        ref = np.load(base(w)["ref"])
        if y.shape != ref.shape or not np.allclose(y, ref, atol=1e-3):
            return "silent", "output differs from onnxruntime on the same values"
    xs = lambda: np.load(base(HERE[0])["x"])  # noqa: E731
    HERE = [None]

    def run_in(name, make, expect_error, check=None):
        def setup(w):
            HERE[0] = w
            arr(name, make)(w)
        for group, extra in (("run_input", []), ("native_input", ["--runtime", "native"])):
            cli_case(group, name.replace(".npy", ""), "run", lambda w: base(w)["art"], "--input", name,
                     "--output", "y.npy", "--repeat", "1", *extra, setup=setup, expect_error=expect_error,
                     check=check)
    run_in("ok.npy", lambda: xs(), False, same_as_ref)
    run_in("float64.npy", lambda: xs().astype(np.float64), False, same_as_ref)
    run_in("float16.npy", lambda: xs().astype(np.float16), False,
           lambda w, r: None if np.allclose(np.load(w / "y.npy"), np.load(base(w)["ref"]), atol=0.1) else
           ("silent", "differs"))
    run_in("int32.npy", lambda: (xs() * 10).astype(np.int32), False)
    run_in("bool.npy", lambda: xs() > 0, False)  # by design: numbers (kinds f, i, u, b) are converted
    run_in("complex.npy", lambda: xs().astype(np.complex64), True)
    run_in("fortran.npy", lambda: np.asfortranarray(xs()), False, same_as_ref)
    run_in("bigendian.npy", lambda: xs().astype(">f4"), False, same_as_ref)
    run_in("noncontig_T.npy", lambda: np.ascontiguousarray(xs().transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2), False,
           same_as_ref)
    run_in("wrong_shape.npy", lambda: xs().reshape(1, 8, 256), True)
    run_in("transposed_shape.npy", lambda: xs().reshape(1, 16, 8, 16), True)
    run_in("zero_d.npy", lambda: np.array(1.0, np.float32), True)
    run_in("empty.npy", lambda: np.zeros((0,), np.float32), True)
    run_in("object.npy", lambda: np.array([object()] * 4, dtype=object), True)
    run_in("object_floats.npy", lambda: xs().astype(object), True)
    run_in("structured.npy", lambda: np.zeros((1, 8, 16, 16), dtype=[("a", "f4")]), True)
    run_in("nan.npy", lambda: np.full((1, 8, 16, 16), np.nan, np.float32), False)
    run_in("truncated.npy", lambda: open(base(HERE[0])["x"], "rb").read()[:300], True)
    run_in("header_only.npy", lambda: open(base(HERE[0])["x"], "rb").read()[:128], True)
    run_in("zero_bytes.npy", lambda: b"", True)
    run_in("garbage.npy", lambda: b"\x93NUMPY\x01\x00" + b"\xff" * 200, True)
    run_in("huge_header.npy", lambda: b"\x93NUMPY\x02\x00" + (10**9).to_bytes(4, "little") + b"{", True)
    run_in("npz.npy", lambda: (np.savez(HERE[0] / "t.npz", x=xs()), (HERE[0] / "t.npz").read_bytes())[1], True)
    run_in("pickle.npy", lambda: __import__("pickle").dumps(xs()), True)
    run_in("float32_extra_bytes.npy", lambda: open(base(HERE[0])["x"], "rb").read() + b"\0" * 64, True)
    for n, args, err in [
            ("missing_file", ["--input", "nope.npy"], True), ("dir", ["--input", "."], True),
            ("devzero", ["--input", "/dev/zero"], True), ("wrong_name", ["--input", "q=x.npy"], True),
            ("empty_name", ["--input", "=x.npy"], True), ("empty_path", ["--input", "x="], True),
            ("twice", ["--input", "x=x.npy", "--input", "x=x.npy"], True)]:
        cli_case("run_input", f"conv_{n}", "run", lambda w: base(w)["art"], *args, "--repeat", "1",
                 setup=lambda w: np.save(w / "x.npy", np.load(base(w)["x"])), expect_error=err)

    def two_setup(w):
        np.save(w / "a.npy", np.ones((1, 4, 3, 5), np.float32))
        np.save(w / "b.npy", np.full((1, 4, 3, 5), 3.0, np.float32))

    def two_check(w, r):
        y = np.load(w / "y.npy")
        return None if np.allclose(y, -2.0) else ("silent", f"a - b gave {y.ravel()[:3]}, not -2")
    for n, args, err, chk in [
            ("named", ["--input", "a=a.npy", "--input", "b=b.npy"], False, two_check),
            ("reversed_order", ["--input", "b=b.npy", "--input", "a=a.npy"], False, two_check),
            ("missing_b", ["--input", "a=a.npy"], True, None),
            ("duplicate_a", ["--input", "a=a.npy", "--input", "a=b.npy"], True, None),
            ("unnamed", ["--input", "a.npy", "--input", "b.npy"], True, None),
            ("third", ["--input", "a=a.npy", "--input", "b=b.npy", "--input", "c=a.npy"], True, None),
            ("file_named_like_spec", ["--input", "a=a.npy", "--input", "b=b.npy"], False, two_check)]:
        cli_case("run_input", f"two_{n}", "run", lambda w: base(w)["two_art"], *args, "--output", "y.npy",
                 "--repeat", "1", setup=two_setup, expect_error=err, check=chk)

    # tuner run --runtime native with damaged artifacts (beyond tests/artifact_corpus.py)
    def damaged(name, damage, expect_error=True):
        def setup(w):
            shutil.copytree(base(w)["art"], w / "art", ignore=shutil.ignore_patterns("binaries", "profile.json"))
            damage(w / "art")
        for group, extra in (("artifact_python", []), ("artifact_native", ["--runtime", "native"])):
            cli_case(group, name, "run", "art", "--repeat", "1", *extra, setup=setup, expect_error=expect_error)

    def reseal(d):
        import hashlib
        m = json.loads((d / "manifest.json").read_text())
        for f in m["files"]:
            data = (d / f["path"]).read_bytes()
            f["size"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
        (d / "manifest.json").write_text(json.dumps(m))

    def graph_text(edit):
        def damage(d):
            (d / "graph.json").write_text(edit((d / "graph.json").read_text()))
            reseal(d)
        return damage

    def graph_json(edit):
        def damage(d):
            g = json.loads((d / "graph.json").read_text())
            edit(g)
            (d / "graph.json").write_text(json.dumps(g))
            reseal(d)
        return damage

    def first_call(g):
        return g["nodes"][[bool(n.get("calls")) for n in g["nodes"]].index(True)]["calls"][0]
    damaged("graph_nested", graph_text(lambda t: "[" * 100000 + "]" * 100000))
    from tuner.artifact.format import VERSION  # the format's version now: the case replaces that number
    damaged("graph_1e400", graph_text(lambda t: t.replace(f'"version": {VERSION}', '"version": 1e400', 1)
                                      .replace(f'"version":{VERSION}', '"version":1e400', 1)))
    damaged("graph_dup_keys", graph_text(lambda t: t.replace("{", '{"nodes": [], ', 1)))
    damaged("graph_nan", graph_json(lambda g: g.__setitem__("pools", [dict(p, shape=[float("nan")]) for p in g["pools"]])))
    damaged("graph_bom", graph_text(lambda t: "\ufeff" + t))
    damaged("graph_utf16", lambda d: ((d / "graph.json").write_bytes((d / "graph.json").read_text().encode("utf-16")),
                                      reseal(d)))
    damaged("graph_negative_shape", graph_json(lambda g: [e.__setitem__("shape", [-1] + e["shape"][1:])
                                                          for e in g["entries"].values()]))
    damaged("graph_huge_shape", graph_json(lambda g: [e.__setitem__("physical_shape", [2**62] + e["physical_shape"][1:])
                                                      for e in g["entries"].values()]))
    damaged("graph_local_zero", graph_json(lambda g: first_call(g).__setitem__("local_size", [0, 0, 0])))
    damaged("graph_global_negative", graph_json(lambda g: first_call(g).__setitem__("global_size", [-4, 1, 1])))
    damaged("graph_global_float", graph_json(lambda g: first_call(g).__setitem__("global_size", [4.5, 1, 1])))
    damaged("graph_args_string", graph_json(lambda g: first_call(g).__setitem__("args", "t:x")))
    damaged("graph_scalar_arg_huge", graph_json(lambda g: first_call(g)["args"].append(10**30)))
    damaged("graph_inputs_unknown", graph_json(lambda g: g.__setitem__("inputs", ["nosuch"])))
    damaged("graph_inputs_twice", graph_json(lambda g: g.__setitem__("inputs", g["inputs"] * 2)))
    damaged("graph_outputs_twice", graph_json(lambda g: g.__setitem__("outputs", g["outputs"] * 2)), False)
    damaged("graph_output_is_input", graph_json(lambda g: g.__setitem__("outputs", g["inputs"])), False)  # as written
    damaged("graph_dtype_unknown", graph_json(lambda g: [e.__setitem__("dtype", "float64") for e in g["entries"].values()]))
    damaged("graph_not_object", graph_text(lambda t: "[1, 2, 3]"))
    damaged("manifest_nested", lambda d: (d / "manifest.json").write_text("[" * 100000 + "]" * 100000))
    damaged("manifest_path_escape", lambda d: (d / "manifest.json").write_text(json.dumps(
        dict(json.loads((d / "manifest.json").read_text()), files=[{"path": "../../etc/passwd", "size": 1, "sha256": "0" * 64}]))))
    damaged("manifest_absolute_path", lambda d: (d / "manifest.json").write_text(json.dumps(
        dict(json.loads((d / "manifest.json").read_text()), files=json.loads((d / "manifest.json").read_text())["files"]
             + [{"path": "/etc/passwd", "size": 1, "sha256": "0" * 64}]))))
    damaged("manifest_devzero", lambda d: ((d / "manifest.json").unlink(), os.symlink("/dev/zero", d / "manifest.json")))
    damaged("manifest_fifo", lambda d: ((d / "manifest.json").unlink(), os.mkfifo(d / "manifest.json")))
    damaged("params_symlink_devzero", lambda d: ((d / "params.bin").unlink(), os.symlink("/dev/zero", d / "params.bin")))
    damaged("kernels_is_file", lambda d: (shutil.rmtree(d / "kernels"), (d / "kernels").write_text("x")))
    damaged("kernel_symlink_other", lambda d: [((d / "kernels" / k).unlink(), os.symlink("/etc/hostname", d / "kernels" / k))
                                              for k in sorted(os.listdir(d / "kernels"))[:1]])
    damaged("artifact_is_file", lambda d: (shutil.rmtree(d), d.write_text("x")))
    damaged("artifact_missing", lambda d: shutil.rmtree(d))
    damaged("artifact_empty_dir", lambda d: [p.unlink() if p.is_file() else shutil.rmtree(p) for p in d.iterdir()])
    damaged("extra_file", lambda d: (d / "evil.cl").write_text("x"), False)

    # tuner logs --merge
    def own_log(w, name="L.jsonl"):
        shutil.copy(base(w)["own"], w / name)
        return (w / name).read_text()

    def lines_of(p):
        return [l for l in Path(p).read_text().splitlines() if l.strip()]

    def kept(n):  # the log still holds n valid lines (none lost)
        def check(w, r):
            got = len(lines_of(w / "L.jsonl"))
            return None if got == n else ("loss", f"L.jsonl has {got} lines, {n} expected")
        return check

    def both_logs(w):
        own_log(w)
        recs = [json.loads(l) for l in lines_of(w / "L.jsonl")]
        for r in recs:
            r["trial"] = (r.get("trial") or 0) + 1000
            r["timestamp"] = "2026-11-25T00:00:00+00:00"
        (w / "L.jsonl.rescued-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    cli_case("merge", "glob_matches_nothing", "logs", "--merge", "nothing-*.jsonl", "-o", "L.jsonl",
             setup=lambda w: own_log(w), expect_error=False, check=kept(4))  # says "matches no log", exit 0
    cli_case("merge", "log_itself_as_source", "logs", "--merge", "L.jsonl", "-o", "L.jsonl",
             setup=lambda w: own_log(w), expect_error=False, check=kept(4))
    cli_case("merge", "log_itself_by_glob", "logs", "--merge", "*.jsonl", "-o", "L.jsonl",
             setup=lambda w: own_log(w), expect_error=False, check=kept(4))
    cli_case("merge", "log_itself_via_symlink", "logs", "--merge", "link.jsonl", "-o", "L.jsonl",
             setup=lambda w: (own_log(w), os.symlink("L.jsonl", w / "link.jsonl")), expect_error=False, check=kept(4))
    cli_case("merge", "rescued_ok", "logs", "--merge", "L.jsonl.rescued-*.jsonl", "-o", "L.jsonl",
             setup=both_logs, expect_error=False, check=kept(8))
    cli_case("merge", "rescued_twice_no_dupes", "logs", "--merge", "L.jsonl.rescued-1.jsonl",
             "L.jsonl.rescued-1.jsonl", "-o", "L.jsonl", setup=both_logs, expect_error=False, check=kept(8))

    def torn_source(w):
        both_logs(w)
        t = (w / "L.jsonl.rescued-1.jsonl").read_text()
        (w / "L.jsonl.rescued-1.jsonl").write_text(t[: len(t) - 40])
    cli_case("merge", "torn_source", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "L.jsonl",
             setup=torn_source, expect_error=False, check=kept(7))

    def torn_log(w):
        both_logs(w)
        t = (w / "L.jsonl").read_text()
        (w / "L.jsonl").write_text(t[: len(t) - 40])

    def torn_check(w, r):
        ls = lines_of(w / "L.jsonl")
        good = sum(1 for l in ls if l.startswith("{") and l.endswith("}"))
        return None if good >= 7 else ("loss", f"{good} whole records of 7 expected")
    cli_case("merge", "torn_log", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "L.jsonl",
             setup=torn_log, expect_error=False, check=torn_check)
    cli_case("merge", "no_output", "logs", "--merge", "L.jsonl.rescued-1.jsonl", setup=both_logs)
    cli_case("merge", "output_dir", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", ".", setup=both_logs)
    cli_case("merge", "output_devnull", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "/dev/null",
             setup=both_logs)
    cli_case("merge", "output_onnx", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "m.onnx",
             setup=lambda w: (both_logs(w), shutil.copy(base(w)["conv"], w / "m.onnx")),
             check=lambda w, r: None if (w / "m.onnx").read_bytes() == Path(base(w)["conv"]).read_bytes()
             else ("loss", "m.onnx changed"))
    cli_case("merge", "source_fifo", "logs", "--merge", "f.jsonl", "-o", "L.jsonl",
             setup=lambda w: (own_log(w), os.mkfifo(w / "f.jsonl")), check=kept(4))
    cli_case("merge", "source_dir", "logs", "--merge", "d", "-o", "L.jsonl",
             setup=lambda w: (own_log(w), (w / "d").mkdir()), check=kept(4))
    cli_case("merge", "source_binary", "logs", "--merge", "m.onnx", "-o", "L.jsonl",
             setup=lambda w: (own_log(w), shutil.copy(base(w)["conv"], w / "m.onnx")), check=kept(4))
    cli_case("merge", "with_format", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "L.jsonl", "--format",
             "csv", setup=both_logs, check=kept(4))
    cli_case("merge", "with_best", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "L.jsonl", "--best",
             setup=both_logs, check=kept(4))
    cli_case("merge", "readonly_log", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "L.jsonl",
             setup=lambda w: (both_logs(w), os.chmod(w / "L.jsonl", 0o444)), expect_error=os.geteuid() != 0,
             check=kept(8 if os.geteuid() == 0 else 4))  # root writes it anyway
    cli_case("merge", "new_log", "logs", "--merge", "L.jsonl.rescued-1.jsonl", "-o", "new.jsonl",
             setup=both_logs, expect_error=False,
             check=lambda w, r: None if len(lines_of(w / "new.jsonl")) == 4 else ("loss", "not 4 records"))

    # tuner logs / report / compare on odd logs
    def odd(name, text):
        return lambda w: (w / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    one = lambda w: lines_of(base(w)["own"])[0]  # noqa: E731
    for n, text, err in [("empty", "", False), ("only_blank", "\n\n\n", False), ("crlf", None, False),
                         ("nul_bytes", "\0" * 1000, False), ("utf16", None, False),
                         ("binary", bytes(range(256)) * 10, False), ("one_huge_number", '{"version":' + "9" * 5000 + "}", False)]:
        for cmd in ("logs", "report", "compare"):
            def setup(w, n=n, text=text):
                if n == "crlf":
                    text = "\r\n".join(lines_of(base(w)["own"])) + "\r\n"
                elif n == "utf16":
                    text = Path(base(w)["own"]).read_text().encode("utf-16")
                odd("L.jsonl", text)(w)
            cli_case("odd_logs", f"{cmd}_{n}", cmd, "L.jsonl", *(["-o", "r.html"] if cmd == "report" else []),
                     setup=setup, expect_error=err)
    cli_case("odd_logs", "report_artifact_missing", "report", "L.jsonl", "--artifact", "nope", "-o", "r.html",
             setup=lambda w: own_log(w))
    cli_case("odd_logs", "report_artifact_profile_garbage", "report", "L.jsonl", "--artifact", "art", "-o", "r.html",
             setup=lambda w: (own_log(w), shutil.copytree(base(w)["art"], w / "art"),
                              (w / "art" / "profile.json").write_text('{"layers": [[[[')))
    cli_case("odd_logs", "report_artifact_profile_wrongtypes", "report", "L.jsonl", "--artifact", "art", "-o",
             "r.html", setup=lambda w: (own_log(w), shutil.copytree(base(w)["art"], w / "art"),
                                        (w / "art" / "profile.json").write_text('{"layers": 5, "total_s": "x"}')))
    cli_case("odd_logs", "report_output_dir", "report", "L.jsonl", "-o", ".", setup=lambda w: own_log(w))
    cli_case("odd_logs", "report_min_trials_0", "report", "L.jsonl", "--min-trials", "0", "-o", "r.html",
             setup=lambda w: own_log(w))
    cli_case("odd_logs", "compare_min_trials_neg", "compare", "L.jsonl", "--min-trials", "-3",
             setup=lambda w: own_log(w))
    cli_case("odd_logs", "report_title_html", "report", "L.jsonl", "--title", "<script>alert(1)</script>", "-o",
             "r.html", setup=lambda w: own_log(w), expect_error=False,
             check=lambda w, r: ("silent", "title not escaped") if "<script>alert" in (w / "r.html").read_text()
             else None)
    cli_case("odd_logs", "logs_device_nomatch", "logs", "L.jsonl", "--device", "nvidia", setup=lambda w: own_log(w))
    cli_case("odd_logs", "logs_parquet_stdout", "logs", "L.jsonl", "--format", "parquet",
             setup=lambda w: own_log(w))
    cli_case("odd_logs", "logs_output_unwritable", "logs", "L.jsonl", "-o", "/proc/x.csv", setup=lambda w: own_log(w))
    cli_case("odd_logs", "logs_study_without_storage", "logs", "L.jsonl", "--study", "x", setup=lambda w: own_log(w))
    cli_case("odd_logs", "logs_storage_bad_url", "logs", "L.jsonl", "--storage", "mysql://nope", "--study", "x",
             setup=lambda w: own_log(w))

    # --device specs
    for n, spec in [("exec_missing", "exec:///nonexistent/agent"), ("exec_cat", "exec:///bin/cat"),
                    ("exec_true", "exec:///bin/true"), ("exec_not_exec", "exec:///etc/hostname"),
                    ("exec_dir", "exec:///tmp"), ("exec_empty", "exec://"), ("exec_yes", "exec:///usr/bin/yes"),
                    ("exec_timeout0", "exec:///bin/cat?timeout=0"), ("exec_timeout_nan", "exec:///bin/cat?timeout=nan"),
                    ("exec_timeout_neg", "exec:///bin/cat?timeout=-1"), ("exec_bad_option", "exec:///bin/cat?foo=1"),
                    ("exec_quote", "exec://'/bin/cat"), ("tcp_closed", "tcp://127.0.0.1:1"),
                    ("tcp_port_huge", "tcp://127.0.0.1:99999"), ("tcp_no_port", "tcp://127.0.0.1"),
                    ("tcp_empty", "tcp://"), ("tcp_ipv6_open", "tcp://[::1"), ("tcp_name", "tcp://no.such.host.invalid:7390"),
                    ("adb_none", "adb://nosuchserial"), ("unknown_scheme", "ftp://x"), ("index_big", "99"),
                    ("index_neg", "-1"), ("empty", ""), ("nosuch_name", "nosuchgpu"), ("spaces", "   "),
                    ("device_opt_bad", "exec:///bin/cat?device=zz")]:
        cli_case("device", f"devices_{n}", "devices", "--json", f"--device={spec}", timeout=60)
    cli_case("device", "op_exec_cat", "op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3", "--check",
             "--device=exec:///bin/cat", timeout=60)
    cli_case("device", "op_exec_true", "op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3", "--check",
             "--device=exec:///bin/true", timeout=60)
    cli_case("device", "run_tcp_closed", "run", lambda w: base(w)["art"], "--device=tcp://127.0.0.1:1", timeout=60)
    cli_case("device", "compile_exec_missing", "compile", lambda w: base(w)["conv"], "-o", "art",
             "--device=exec:///nonexistent", timeout=60)
    cli_case("device", "run_native_exec", "run", lambda w: base(w)["art"], "--runtime", "native",
             "--device=exec:///bin/cat", timeout=60)
    cli_case("device", "devices_json", "devices", "--json", expect_error=False,
             check=lambda w, r: None if isinstance(json.loads(r.out), list) else ("silent", "not a list"))
    # a listing: every device, and "no default device: $TUNER_DEVICE: no OpenCL device matches" on stderr
    cli_case("device", "env_bad_tuner_device", "devices", expect_error=False, env={"TUNER_DEVICE": "nosuchgpu"},
             check=lambda w, r: None if "no default device" in r.err else ("silent", "no word on $TUNER_DEVICE"))
    cli_case("device", "env_bad_tuner_device_op", "op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3",
             env={"TUNER_DEVICE": "nosuchgpu"})
    cli_case("device", "env_exec_cat_op", "op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3",
             env={"TUNER_DEVICE": "exec:///bin/cat"}, timeout=60)

    # tuner worker options
    for n, args in [("no_storage", []), ("bad_storage", ["--storage", "nosuch://x"]),
                    ("heartbeat_0", ["--storage", "sqlite:///w.db", "--heartbeat", "0"]),
                    ("heartbeat_nan", ["--storage", "sqlite:///w.db", "--heartbeat", "nan"]),
                    ("grace_neg", ["--storage", "sqlite:///w.db", "--grace", "-1"]),
                    ("grace_below_heartbeat", ["--storage", "sqlite:///w.db", "--grace", "1", "--heartbeat", "10"]),
                    ("max_trials_0", ["--storage", "sqlite:///w.db", "--max-trials", "0"]),
                    ("tasks_garbage", ["--storage", "sqlite:///w.db", "--tasks", "[[[["]),
                    ("tasks_not_list", ["--storage", "sqlite:///w.db", "--tasks", '{"a":1}']),
                    ("tasks_bad_template", ["--storage", "sqlite:///w.db", "--tasks", '[{"template":"nosuch"}]']),
                    ("tasks_bad_workload", ["--storage", "sqlite:///w.db", "--tasks",
                                            '[{"template":"conv2d","workload":{"data":"x"}}]']),
                    ("tasks_and_model", ["--storage", "sqlite:///w.db", "--tasks", "[]", "--model", "m.onnx"]),
                    ("tasks_empty", ["--storage", "sqlite:///w.db", "--tasks", "[]"]),
                    ("prefix_unknown", ["--storage", "sqlite:///w.db", "--study-prefix", "nosuch"]),
                    ("model_missing", ["--storage", "sqlite:///w.db", "--model", "nope.onnx"]),
                    ("seed_huge", ["--storage", "sqlite:///w.db", "--seed", str(2**40)]),
                    ("storage_proc", ["--storage", "sqlite:////proc/x.db", "--study-prefix", "p"]),
                    ("storage_journal_dir", ["--storage", "journal:.", "--study-prefix", "p"]),
                    ("trials_0_model", ["--storage", "sqlite:///w.db", "--model", "m.onnx", "--trials", "0"])]:
        cli_case("worker", n, "worker", *args, "--no-progress", timeout=90,
                 setup=lambda w: shutil.copy(base(w)["conv"], w / "m.onnx"))
    for n, text in [("garbage", "[[[["), ("not_list", '{"a":1}'), ("bad_template", '[{"template":"nosuch"}]'),
                    ("bad_workload", '[{"template":"conv2d","workload":{"data":"x"}}]'), ("empty", "[]"),
                    ("nested", "[" * 100000 + "]" * 100000), ("trials_neg", '[{"template":"conv2d","workload":'
                     '{"op":"conv2d","data":[1,4,6,6],"kernel":[4,4,3,3]},"trials":-5}]'),
                    ("weight_nan", '[{"template":"conv2d","workload":{"op":"conv2d","data":[1,4,6,6],'
                     '"kernel":[4,4,3,3]},"trials":1,"weight":NaN}]'),
                    ("scopes_bad", '[{"template":"conv2d","workload":{"op":"conv2d","data":[1,4,6,6],'
                     '"kernel":[4,4,3,3]},"trials":1,"scopes":{"input":"disk"}}]'),
                    ("fixed_bad", '[{"template":"conv2d","workload":{"op":"conv2d","data":[1,4,6,6],'
                     '"kernel":[4,4,3,3]},"trials":1,"fixed":{"tile_oc":"x"}}]')]:
        cli_case("worker", f"tasks_file_{n}", "worker", "--storage", "sqlite:///w.db", "--tasks", "t.json",
                 "--no-progress", "--max-trials", "1", timeout=90,
                 setup=lambda w, text=text: (w / "t.json").write_text(text))

    # tuner native build
    cli_case("native", "build_target_nosuch", "native", "build", "--target", "nosuch")
    cli_case("native", "build_target_empty", "native", "build", "--target", "")
    cli_case("native", "build_target_path", "native", "build", "--target", "../../etc")
    cli_case("native", "env_extra", "native", "env", "--bogus")

    # issue #23's listed cases, re-checked (a sample of each bullet)
    CONV = ["conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3"]

    def profile(**edits):
        def setup(w):
            r = tuner("devices", "--json", "--device", "pocl", cwd=w)
            p = json.loads(r.out)
            p.update(edits)
            (w / "p.json").write_text(json.dumps(p))
        return setup
    cli_case("issue23", "tune_seed_neg", "tune", conv, "--seed", "-1")
    cli_case("issue23", "tune_op_build_timeout_neg", "tune-op", *CONV, "--build-timeout", "-1")
    cli_case("issue23", "tune_parallel_0", "tune", conv, "--parallel", "0")
    cli_case("issue23", "worker_parallel_0", "worker", "--storage", "sqlite:///w.db", "--parallel", "0")
    cli_case("issue23", "profile_wg_0", "compile", conv, "-o", "art", "--target", "p.json",
             setup=profile(max_work_group_size=0))
    cli_case("issue23", "profile_item_sizes_empty", "compile", conv, "-o", "art", "--target", "p.json",
             setup=profile(max_work_item_sizes=[]))
    cli_case("issue23", "profile_local_mem_neg", "compile", conv, "-o", "art", "--target", "p.json",
             setup=profile(local_mem_bytes=-1))
    cli_case("issue23", "profile_image_1e12", "compile", conv, "-o", "art", "--target", "p.json",
             setup=profile(image2d_max_width=10**12))
    cli_case("issue23", "profile_alloc_16", "compile", conv, "-o", "art", "--target", "p.json",
             setup=profile(max_mem_alloc_bytes=16))
    cli_case("issue23", "target_devzero", "compile", conv, "-o", "art", "--target", "/dev/zero", timeout=60)
    cli_case("issue23", "tune_op_log_fifo", "tune-op", *CONV, "--trials", "1", "--log", "f.jsonl", "--no-progress",
             setup=lambda w: os.mkfifo(w / "f.jsonl"), timeout=60)
    cli_case("issue23", "logs_nested_line", "logs", "L.jsonl", expect_error=False,
             setup=lambda w: (own_log(w), open(w / "L.jsonl", "a").write("[" * 100000 + "\n")),
             check=lambda w, r: None if "nested" in r.err else ("silent", "no warning"))
    cli_case("issue23", "logs_trial_1e30", "logs", "L.jsonl", expect_error=False,
             setup=lambda w: (own_log(w), open(w / "L.jsonl", "a").write(json.dumps(dict(
                 json.loads(lines_of(w / "L.jsonl")[0]), trial=10**30)) + "\n")),
             check=lambda w, r: None if "skipped" in r.err else ("silent", "trial 10**30 listed"))
    cli_case("issue23", "logs_forged_gflops_zero_cost", "logs", "L.jsonl", expect_error=False,
             setup=lambda w: (own_log(w), open(w / "L.jsonl", "a").write(json.dumps(dict(
                 json.loads(lines_of(w / "L.jsonl")[0]), costs=[0.0])) + "\n")),
             check=lambda w, r: None if "skipped" in r.err else ("silent", "a 0 s record listed"))
    cli_case("issue23", "op_config_missing_file", "op", *CONV, "--config", "nope.json")
    cli_case("issue23", "space_constraint_power", "space", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3",
             "--file", "s.toml", timeout=60,
             setup=lambda w: (w / "s.toml").write_text(
                 (ROOT / "search_space" / "conv2d.toml").read_text().replace(
                     "[constraints]\n", '[constraints]\nhuge = "10 ** 10 ** 10 > 0"\n')))
    cli_case("issue23", "space_file_wrong_template", "space", "dense", "--data", "1,8", "--weight", "4,8",
             "--file", str(ROOT / "search_space" / "conv2d.toml"))

    def two_y(w):
        from onnx import TensorProto as TP
        from onnx import helper as h
        onnx_model(w / "m.onnx", [h.make_node("Relu", ["x"], ["y"], name="a"), h.make_node("Sigmoid", ["x"], ["y"], name="b")],
                   [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 3, 3])], [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 3, 3])])
    cli_case("issue23", "onnx_two_nodes_define_y", "compile", "m.onnx", "-o", "art", setup=two_y)
    cli_case("issue23", "onnx_empty_file", "compile", "m.onnx", "-o", "art",
             setup=lambda w: (w / "m.onnx").write_bytes(b""),
             check=None)
    cli_case("issue23", "onnx_zero_dim", "compile", "m.onnx", "-o", "art", setup=lambda w: onnx_model(
        w / "m.onnx", [__import__("onnx").helper.make_node("Relu", ["x"], ["y"], name="r")],
        [__import__("onnx").helper.make_tensor_value_info("x", 1, [1, 0, 3, 3])],
        [__import__("onnx").helper.make_tensor_value_info("y", 1, [1, 0, 3, 3])]))

    def long_name(w):
        from onnx import TensorProto as TP
        from onnx import helper as h
        from onnx import numpy_helper as nh
        onnx_model(w / "m.onnx", [h.make_node("Conv", ["x", "w"], ["y"], name="n" * 300, pads=[1] * 4)],
                   [h.make_tensor_value_info("x", TP.FLOAT, [1, 4, 6, 6])],
                   [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 6, 6])],
                   [nh.from_array(np.ones((4, 4, 3, 3), np.float32), "w")])
    cli_case("issue23", "onnx_300_char_node_name", "compile", "m.onnx", "-o", "art", setup=long_name,
             expect_error=False)
    cli_case("issue23", "compile_over_old_artifact", "compile", conv, "-o", "art", expect_error=False,
             setup=lambda w: (shutil.copytree(base(w)["two_art"], w / "art"), (w / "art" / "profile.json").write_text("{}"),
                              (w / "art" / "kernels" / "k999.cl").write_text("stale")),
             check=lambda w, r: ("silent", "stale files kept") if (w / "art" / "profile.json").exists()
             or (w / "art" / "kernels" / "k999.cl").exists() else None)
    cli_case("issue23", "failed_compile_leaves_nothing", "compile", "m.onnx", "-o", "art",
             setup=lambda w: (w / "m.onnx").write_bytes(b"garbage"),
             check=lambda w, r: ("loss", "left art/") if (w / "art").exists() else None)
    cli_case("issue23", "run_output_empty_outputs", "run", "art", "--output", "y.npy", "--repeat", "1",
             setup=lambda w: (shutil.copytree(base(w)["art"], w / "art"),
                              graph_json(lambda g: g.__setitem__("outputs", []))(w / "art")),
             check=lambda w, r: ("loss", "left an empty y.npy") if (w / "y.npy").exists() else None)

    cli_case("matmul", "op_missing_b", "op", "matmul", "--a", "2,8,12", "--check")
    cli_case("matmul", "op_missing_both", "op", "matmul", "--check")
    cli_case("matmul", "tune_op_alpha_nan", "tune-op", "matmul", "--a", "2,8,12", "--b", "2,12,16", "--alpha", "nan",
             "--trials", "2", "--no-progress")
    cli_case("matmul", "tune_op_mismatched", "tune-op", "matmul", "--a", "2,8,12", "--b", "2,9,16", "--trials", "2",
             "--no-progress")
    cli_case("matmul", "tune_op_ok", "tune-op", "matmul", "--a", "1,8,8", "--b", "1,8,8", "--trials", "2",
             "--no-progress", "--storage", "sqlite:///s.db", expect_error=False)


# -------------------------------------------------------------------------------------------------- runner
CASES: list = []  # (group, name, fn(work) -> (class, detail))


def case(group):
    def deco(fn):
        CASES.append((group, fn.__name__, fn))
        return fn
    return deco


def cli_case(group, name, *args, expect_error=True, check=None, setup=None, timeout=TIMEOUT, env=None):
    """A command whose hostile input should give a clean error (``expect_error``) or be handled; ``check(work,
    r)`` may return a class (e.g. 'silent' or 'loss') and a detail to override the generic one."""
    def fn(work):
        if setup:
            setup(work)
        r = tuner(*[a(work) if callable(a) else a for a in args], cwd=work, timeout=timeout, env=env)
        k = r.kind(expect_error)
        if check and k == ("silent" if expect_error else "handled"):
            got = check(work, r)
            if got:
                return got
        return k, r.tail()
    CASES.append((group, name, fn))


def _register_onnx():
    for name, build in _onnx_cases().items():
        def fn(work, name=name, build=build):
            return onnx_case(work, name, **build())
        CASES.append(("onnx", name, fn))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the cases whose group/name holds this")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args(argv)
    _register_onnx()
    _register_cli()
    work = Path(tempfile.mkdtemp(prefix="hostile-sweep-"))
    results = []
    try:
        for group, name, fn in CASES:
            if a.only and a.only not in f"{group}/{name}":
                continue
            t0 = time.time()
            d = work / f"{group}-{name}"
            d.mkdir(parents=True, exist_ok=True)
            try:
                k, detail = fn(d)
            except Exception as e:  # the harness's own failure: shown, never counted as the tuner's
                k, detail = "harness", f"{type(e).__name__}: {e}"
            results.append(dict(group=group, case=name, outcome=k, detail=detail, seconds=round(time.time() - t0, 1)))
            print(f"{k:10s} {group}/{name}: {detail}", flush=True)
    finally:
        if a.keep:
            print(f"work folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    groups = sorted({r["group"] for r in results})
    print("\n| group | cases | " + " | ".join(CLASSES) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in CLASSES) + " |")
    for g in groups + ["all"]:
        rs = [r for r in results if g in ("all", r["group"])]
        print(f"| {g} | {len(rs)} | " + " | ".join(str(sum(r['outcome'] == k for r in rs)) for k in CLASSES) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
