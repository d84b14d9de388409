"""The NumPy graph reference on attention graphs after the whole pass pipeline (``passes.optimize``): the token
``matmul`` with the views, addend, residual and transposed form ``passes.fuse_epilogues`` and
``passes_tokens.matmul_views`` give it (evaluated by the matmul template's own reference), strided copies of
merged window axes, elementwise inputs read at a channel offset and a concat's activation -- against onnxruntime
on the original model. Each case asserts that the passes did produce what it is there to check. No device."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, compose, helper as h, numpy_helper as nh

import attention_models as AM
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes import optimize
from tuner.graph.reference import run_graph_numpy
from tuner.graph.reference_movement import MATMUL_ATTRS


def _model(nodes, inits, name, in_shape, out_shape):
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("input", TP.FLOAT, list(in_shape))],
                     [h.make_tensor_value_info("output", TP.FLOAT, list(out_shape))], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _windows(c, nh_, nw, wh, ww, reverse=False):
    """EfficientViT's window partition ``x.permute(0, 2, 3, 1).view(B, nh, wh, nw, ww, C).transpose(2, 3)
    .reshape(B * nh * nw, wh, ww, C).permute(0, 3, 1, 2)`` (or its reverse): NCHW (1, c, nh * wh, nw * ww) <->
    NCHW windows (nh * nw, c, wh, ww)."""
    big, small = [1, c, nh_ * wh, nw * ww], [nh_ * nw, c, wh, ww]
    s6, s4 = ([1, nh_, nw, wh, ww, c], [1, nh_ * wh, nw * ww, c]) if reverse else \
        ([1, nh_, wh, nw, ww, c], [nh_ * nw, wh, ww, c])
    nodes = [h.make_node("Transpose", ["input"], ["nhwc"], perm=[0, 2, 3, 1]),
             h.make_node("Reshape", ["nhwc", "s6"], ["w6"]),
             h.make_node("Transpose", ["w6"], ["w6t"], perm=[0, 1, 3, 2, 4, 5]),
             h.make_node("Reshape", ["w6t", "s4"], ["w4"]),
             h.make_node("Transpose", ["w4"], ["output"], perm=[0, 3, 1, 2])]
    inits = [nh.from_array(np.array(s6, np.int64), "s6"), nh.from_array(np.array(s4, np.int64), "s4")]
    return _model(nodes, inits, "windows", small if reverse else big, big if reverse else small)


def windowed_cascaded_model(nh_=2, nw=2, hw=(3, 4), heads=2, kd=4):
    """EfficientViT-M's local window attention: the window partition, the cascaded heads on every window (a batch
    of windows), the windows back."""
    c = heads * 8
    att = AM.cascaded_attention_model(n=nh_ * nw, heads=heads, kd=kd, hw=hw)
    m = compose.merge_models(_windows(c, nh_, nw, *hw), att, io_map=[("output", "input")], prefix1="part_",
                             prefix2="attn_")
    m = compose.merge_models(m, _windows(c, nh_, nw, *hw, reverse=True), io_map=[("attn_output", "input")],
                             prefix2="back_")
    m.graph.input[0].name, m.graph.output[0].name = "input", "output"
    for n in m.graph.node:
        n.input[:] = ["input" if t == "part_input" else t for t in n.input]
        n.output[:] = ["output" if t == "back_output" else t for t in n.output]
    return m


def swapped_epilogue_model(n=2, kd=4, d=8, hw=(3, 4), seed=0, addend="whole"):
    """``v @ attn^T`` plus a constant -- a whole (1, d, T) one, or one per column of the product (T,) -- viewed
    back as NCHW: the product runs as ``attn @ v^T`` writing the NCHW tensor, its constant transposed into the
    addend of Y^T (``passes_tokens._swapped_epilogue``)."""
    rng = np.random.default_rng(seed)
    H, W = hw
    T, c = H * W, 2 * kd + d
    inits, nodes, init, node = AM.graph_builder()
    qkv = node("Conv", ["input", init("wqkv", (rng.standard_normal((c, d, 1, 1)) / 3).astype(np.float32)),
                        init("bqkv", rng.standard_normal(c).astype(np.float32))], ["qkv"])
    nodes.append(h.make_node("Split", [qkv, init("sp", np.array([kd, kd, d], np.int64))], ["q", "k", "v"], axis=1,
                             name="split"))
    q, k, v = (node("Reshape", [t, init(f"{t}_s", np.array([n, ch, T], np.int64))], [f"{t}_flat"])
               for t, ch in (("q", kd), ("k", kd), ("v", d)))
    p = node("Softmax", [node("MatMul", [node("Transpose", [q], ["qt"], perm=[0, 2, 1]), k], ["s"])], ["p"], axis=-1)
    o = node("MatMul", [v, node("Transpose", [p], ["pt"], perm=[0, 2, 1])], ["o"])  # (n, d, T)
    const = rng.standard_normal((1, d, T) if addend == "whole" else (T,)).astype(np.float32)
    o = node("Add", [o, init("o_const", const)], ["o_plus"])
    node("Relu", [node("Reshape", [o, init("back", np.array([n, d, H, W], np.int64))], ["o_nchw"])], ["output"])
    return _model(nodes, inits, "swapped", (n, d, H, W), (n, d, H, W))


def _mm(g, name):
    return next(n for n in g.nodes if n.op == "matmul" and n.name.endswith(name))


def _ops(g):
    return [n.op for n in g.nodes]


# each case: (model, check of the optimized graph) -- the check asserts the patterns the case is there for
CASES = {
    "attention": (lambda: AM.attention_model(), lambda g: (
        {"a_view", "b_view"} <= set(_mm(g, "scores").attrs) and _mm(g, "scores").attrs["trans_b"]
        and {"b_view", "y_view"} <= set(_mm(g, "attn").attrs))),
    "attention-bias-pos": (lambda: AM.attention_model(scale_after=True, bias=True, pos=True), lambda g: (
        "addend" in _mm(g, "scores").attrs and _mm(g, "scores").attrs["alpha"] != 1.0)),
    "attention-1head": (lambda: AM.attention_model(n=2, c=8, hw=(3, 3), heads=1, bias=True, pos=True), lambda g: (
        "addend" in _mm(g, "scores").attrs and "b_view" in _mm(g, "attn").attrs)),
    "cascaded": (lambda: AM.cascaded_attention_model(), lambda g: (
        not {"strided_copy", "slice", "relu"} & set(_ops(g))
        and _mm(g, "s0").attrs["a_view"][2:] == (0, 0, 0) and "addend" in _mm(g, "s0").attrs
        and _mm(g, "o0").inputs[0] == "p0" and _mm(g, "o0").attrs["y_view"][0] == (2, 8, 3, 4)  # attn @ v^T
        and next(n for n in g.nodes if n.op == "add").attrs["channel_offsets"] == (None, 8)
        and next(n for n in g.nodes if n.op == "concat").attrs["activation"] == "relu")),
    "cascaded-k-at-channel-6": (lambda: AM.cascaded_attention_model(n=1, heads=3, kd=6), lambda g: (
        _ops(g).count("strided_copy") == 3 and all("y_view" in _mm(g, f"o{i}").attrs for i in range(3)))),
    "levit": (lambda: AM.levit_attention_model(), lambda g: (
        _mm(g, "qk").attrs["a_view"][1] == 2 and "addend" in _mm(g, "qk").attrs  # heads as channel groups
        and _mm(g, "o").attrs["activation"] == "hardswish" and "y_view" in _mm(g, "o").attrs)),
    "levit-odd-widths": (lambda: AM.levit_attention_model(n=2, c=12, heads=3, kd=3, dv=5), lambda g: (
        "addend" in _mm(g, "qk").attrs and _mm(g, "o").attrs["activation"] == "hardswish")),
    "attention4d": (lambda: AM.nchw_attention_model(), lambda g: (
        "strided_copy" not in _ops(g) and _mm(g, "o").attrs["residual"] == "v_local"
        and "y_view" in _mm(g, "o").attrs and _mm(g, "qk").attrs["b_view"][1] == 2)),
    "attention4d-odd-widths": (lambda: AM.nchw_attention_model(n=2, heads=3, d=3, dv=5), lambda g: (
        "addend" in _mm(g, "qk").attrs)),
    "matmul-epilogues": (lambda: AM.matmul_epilogue_model(), lambda g: (
        len(_mm(g, "s").inputs) == 3 and _mm(g, "s").attrs["activation"] == "relu"  # a bias, then ReLU
        and _mm(g, "r").attrs["residual"] == _mm(g, "s").outputs[0] and "y_view" not in _mm(g, "r").attrs)),
    "windows": (windowed_cascaded_model, lambda g: (
        [len(n.attrs["shape"]) for n in g.nodes if n.op == "strided_copy"] == [5, 5]  # one copy each way
        and all("y_view" in _mm(g, f"attn_o{i}").attrs for i in range(2)))),
    "swapped-addend": (lambda: swapped_epilogue_model(), lambda g: (
        _mm(g, "o").inputs[0] == "p" and _mm(g, "o").attrs["addend"].endswith("addend_t")
        and not _mm(g, "o").attrs["trans_b"] and "y_view" in _mm(g, "o").attrs)),
    "swapped-bias": (lambda: swapped_epilogue_model(addend="column"), lambda g: (
        _mm(g, "o").inputs[0] == "p" and _mm(g, "o").attrs["addend"].endswith("addend_t")
        and len(_mm(g, "o").inputs) == 3)),
}


def _graph_and_ort(name, seed=1):
    m = CASES[name][0]()
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    return optimize(from_onnx(m)), x, want


def _rel(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_optimized_attention_graph_matches_onnxruntime(name):
    g, x, want = _graph_and_ort(name)
    assert CASES[name][1](g), [(n.op, n.name, n.attrs) for n in g.nodes]  # the passes made what the case checks
    got = run_graph_numpy(g, {"input": x})["output"]
    assert got.shape == want.shape and _rel(got, want) <= 1e-4


def test_the_cases_exercise_every_attribute_the_reference_takes():
    """Every matmul attribute the reference evaluates (but ``residual`` given as true: no pass makes that) occurs in
    some case, and so do the glue's in-place reads and fused activation."""
    graphs = [optimize(from_onnx(CASES[name][0]())) for name in CASES]
    seen = {k for g in graphs for n in g.nodes if n.op == "matmul" for k in n.attrs}
    assert seen == MATMUL_ATTRS
    glue = {(n.op, k) for g in graphs for n in g.nodes if n.op != "matmul" for k in n.attrs}
    assert {("add", "channel_offsets"), ("concat", "activation"), ("conv2d", "residual")} <= glue


@pytest.mark.parametrize("where", ["a_view", "b_view", "y_view", "addend"])
def test_the_reference_reads_what_the_attributes_say(where):
    """Not vacuous: the cascaded heads with one of the first head's attributes moved (a view's channel offset by
    a pixel, the addend's batch dropped; the queries' view, whose source is the depthwise convolution's output of
    exactly its channels, read as one group of images instead of two) no longer match onnxruntime."""
    g, x, want = _graph_and_ort("cascaded")
    a = _mm(g, "s0" if where in ("a_view", "b_view", "addend") else "o0").attrs
    if where == "addend":
        g.params[a["addend"]] = g.params[a["addend"]] * 0.5
    elif where == "a_view":
        src, groups, c_off, c_group, r_off = a[where]
        assert (groups, src[1]) == (1, 4)
        a[where] = (src, 2, c_off, c_group, r_off)
    else:
        src, groups, c_off, c_group, r_off = a[where]
        a[where] = (src, groups, c_off + 4 if where != "y_view" else c_off, c_group, r_off + (where == "y_view"))
        if where == "y_view":  # the rows shifted by one pixel cannot fill the tensor: refused, not ignored
            with pytest.raises(ValueError, match="y_view"):
                run_graph_numpy(g, {"input": x})
            return
    assert _rel(run_graph_numpy(g, {"input": x})["output"], want) > 1e-2


def test_a_frontend_matmul_with_template_attributes_is_refused():
    from tuner.graph.graph import Graph, Node
    g = Graph([Node("matmul", "mm", ["x", "y"], ["z"], {"trans_b": True})], ["x", "y"], ["z"],
              {"x": (2, 3, 4), "y": (2, 4, 5), "z": (2, 3, 5)}, {})
    with pytest.raises(ValueError, match="no token views"):
        run_graph_numpy(g, {"x": np.ones((2, 3, 4)), "y": np.ones((2, 4, 5))})


@pytest.mark.parametrize("name", ["mixed", "squeeze_excitation", "poolformer_block", "slice_split", "pads_into_convs"])
def test_fused_epilogues_evaluate_as_the_unfused_graph(name):
    """The other ops' fused epilogues (``reference.EPILOGUE_ATTRS``: a convolution's residual, activation, input gate
    and reflected padding, a binary op's scale and residual, a pool's ``post``, an add's channel offsets) on the
    optimized zoo graphs give what the frontend's graph gives."""
    from tuner.graph.reference import EPILOGUE_ATTRS, random_inputs
    from tuner.zoo import models as zoo
    g = from_onnx(zoo.test_models()[name])
    opt = optimize(g)
    assert any(set(n.attrs) & EPILOGUE_ATTRS.get(n.op, set()) for n in opt.nodes)
    x = random_inputs(g)
    want, got = run_graph_numpy(g, x), run_graph_numpy(opt, x)
    assert all(_rel(got[t].reshape(want[t].shape), want[t]) <= 1e-5 for t in g.outputs)
