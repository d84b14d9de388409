"""The operators timm's hybrid mobile models need (issue #27): Cast, Unsqueeze / Squeeze / Flatten on any axis,
Sqrt / Pow / Reciprocal / Neg / Exp / Abs, ReduceL2 / ReduceSum / ReduceMean / ReduceMax over any axes,
InstanceNormalization / GroupNormalization (and torch's decomposed GroupNorm), BatchNormalization on (N, C),
Expand read by a broadcasting op, constants folded through shape code, and (N, T, C) tokens with constant
operands. Each small hand-built model is checked against onnxruntime through the NumPy reference (every kept
tensor) and, where a kernel is involved, compiled and run in texture and buffer scopes with float32 and
float16 storage."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.compile.compiler import compile_model
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes import optimize
from tuner.graph.reference import random_inputs, run_graph_numpy

RNG = np.random.default_rng(7)


def model(nodes, inits=(), shape=(1, 8, 6, 5), opset=17, outputs=None):
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in (outputs or [nodes[-1].output[0]])]
    graph = helper.make_graph(nodes, "g", [x], outs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], name=output, **attrs)


def ort_run(m, feeds):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def rel_err(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(float(np.abs(b).max()), 1e-30))


def check_reference(m, tol=1e-5):
    """The frontend's graph run by the NumPy reference matches onnxruntime on every output."""
    graph = from_onnx(m)
    feeds = random_inputs(graph, seed=3)
    ours, theirs = run_graph_numpy(graph, feeds), ort_run(m, feeds)
    for t in graph.outputs:
        assert rel_err(ours[t], theirs[t]) < tol, t
    return graph


def check_compiled(dev, m, variants=(("texture", "float32"), ("buffer", "float32"), ("texture", "float16"),
                                     ("buffer", "float16")), positive=False):
    """Compiled and run on the device in each (scope, dtype), against onnxruntime."""
    feeds = {"input": RNG.standard_normal(tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim))
             .astype(np.float32)}
    if positive:
        feeds["input"] = np.abs(feeds["input"]) + 0.5
    refs = list(ort_run(m, feeds).values())
    for scope, dtype in variants:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = compile_model(m, device=dev, scope=scope, dtype=dtype)
        outs = mod.run(feeds)
        for o, r in zip(outs, refs):
            assert rel_err(o, r) < (1e-4 if dtype == "float32" else 2e-2), (scope, dtype)


@pytest.fixture(scope="module")
def dev(device):
    return device


# -- Cast, shape code, Unsqueeze / Squeeze / Flatten -----------------------------------------------------------

def _casts():
    c = ("c", np.array([8], np.int64))
    nodes = [
        node("Cast", ["input"], "to_double", to=TensorProto.DOUBLE),
        node("Cast", ["to_double"], "x", to=TensorProto.FLOAT),
        node("Shape", ["x"], "shape"),
        node("Gather", ["shape", "one"], "channels", axis=0),  # 8
        node("Cast", ["channels"], "channels_f", to=TensorProto.FLOAT),
        node("Pow", ["channels_f", "two"], "c_sq"),  # 64.0
        node("Sqrt", ["c_sq"], "c_again"),  # 8.0
        node("Cast", ["c_again"], "c_int", to=TensorProto.INT64),
        node("Equal", ["c_int", "c"], "same"),
        node("Range", ["zero", "c_int", "one"], "range"),  # 0..7
        node("CumSum", ["range", "zero"], "cumsum"),  # 0, 1, 3, 6, ...
        node("Mod", ["cumsum", "three"], "mod"),
        node("Where", ["same", "mod", "range"], "picked"),
        node("Cast", ["picked"], "picked_f", to=TensorProto.FLOAT),
        node("ConstantOfShape", ["c"], "ones", value=numpy_helper.from_array(np.ones(1, np.float32))),
        node("Unsqueeze", ["picked_f", "axes12"], "col"),  # (8, 1, 1)
        node("Expand", ["col", "col_shape"], "col_e"),
        node("Squeeze", ["col_e", "axes12"], "flat"),
        node("Add", ["flat", "ones"], "per_channel"),
        node("Unsqueeze", ["per_channel", "axes12"], "per_channel_3d"),
        node("Add", ["x", "per_channel_3d"], "y"),
        node("Unsqueeze", ["channels", "zero1"], "c1"),
        node("Concat", ["minus_one", "c1"], "target", axis=0),
        node("Reshape", ["y", "target"], "z"),
    ]
    inits = [c, ("one", np.array(1, np.int64)), ("zero", np.array(0, np.int64)), ("two", np.array(2.0, np.float32)),
             ("three", np.array(3, np.int64)), ("axes12", np.array([1, 2], np.int64)),
             ("col_shape", np.array([8, 1, 1], np.int64)), ("zero1", np.array([0], np.int64)),
             ("minus_one", np.array([-1], np.int64))]
    return model(nodes, inits)


def test_float_casts_are_identities_and_shape_code_folds():
    """Cast between float types disappears; Shape / Gather / Cast / Unsqueeze / Squeeze / Equal / Where / Expand /
    ConstantOfShape / Mod / Sqrt / Pow / Range / CumSum / Concat on constants fold into a Reshape target and a
    per-channel constant."""
    graph = check_reference(_casts())
    assert [n.op for n in graph.nodes] == ["add", "reshape"]
    assert graph.nodes[0].inputs[0] == "input"  # the casts are gone
    np.testing.assert_array_equal(graph.params[graph.nodes[0].inputs[1]].reshape(-1), [1, 2, 1, 1, 2, 1, 1, 2])
    assert graph.nodes[1].attrs["shape"] == (30, 8)


def test_integer_cast_of_an_activation_is_refused():
    m = model([node("Cast", ["input"], "y", to=TensorProto.INT32)])
    with pytest.raises(TunerError, match=r"'y' \(#0, Cast\): a cast of activation 'input' to INT32; supported: "
                                         r"casts of activations to float types"):
        from_onnx(m)


def _reshapes():
    nodes = [node("GlobalAveragePool", ["input"], "gap"),                 # (1, 8, 1, 1)
             node("Squeeze", ["gap", "axes23"], "sq"),                     # (1, 8)
             node("Relu", ["sq"], "r"),
             node("Unsqueeze", ["r", "axes23"], "unsq"),                   # (1, 8, 1, 1)
             node("Mul", ["input", "unsq"], "gated"),
             node("Flatten", ["gated"], "fl2", axis=2),                    # (8, 30)
             node("Flatten", ["fl2"], "fl0", axis=0),                      # (1, 240)
             node("Relu", ["fl0"], "y")]
    return model(nodes, [("axes23", np.array([2, 3], np.int64))])


def _reshapes_opset11():
    """Axes as attributes; Squeeze without axes drops every 1."""
    return model([node("Squeeze", ["input"], "s"), node("Unsqueeze", ["s"], "y", axes=[-1, 1])], shape=(1, 8, 1, 1),
                 opset=11)


def test_unsqueeze_squeeze_flatten_become_reshapes(dev):
    m = _reshapes()
    graph = check_reference(m)
    assert [(n.op, graph.shapes[n.outputs[0]]) for n in graph.nodes if n.op == "reshape"] == [
        ("reshape", (1, 8)), ("reshape", (1, 8, 1, 1)), ("reshape", (8, 30)), ("reshape", (1, 240))]
    check_compiled(dev, m, variants=(("texture", "float32"), ("buffer", "float16")))
    graph = check_reference(_reshapes_opset11())
    assert [graph.shapes[n.outputs[0]] for n in graph.nodes] == [(8,), (8, 1, 1)]


# -- elementwise math -------------------------------------------------------------------------------------------

def _unary():
    nodes = [node("Abs", ["input"], "a"),
             node("Sqrt", ["a"], "s"),
             node("Pow", ["input", "two"], "sq"),
             node("Add", ["sq", "s"], "t"),
             node("Pow", ["t", "half"], "p05"),
             node("Pow", ["p05", "p15"], "p15o"),
             node("Reciprocal", ["p15o"], "rec"),
             node("Neg", ["rec"], "neg"),
             node("Exp", ["neg"], "y")]
    return model(nodes, [("two", np.array(2.0, np.float32)), ("half", np.array([0.5], np.float32)),
                         ("p15", np.array(1.5, np.float32))], shape=(1, 6, 5, 3))


def test_unary_math_and_pow(dev):
    m = _unary()
    graph = check_reference(m)
    assert [n.attrs.get("fn") for n in graph.nodes if n.op == "unary"] == [
        "abs", "sqrt", "square", "sqrt", "pow(1.5)", "reciprocal", "neg", "exp"]
    check_compiled(dev, m)


def test_pow_needs_a_constant_scalar_exponent():
    m = model([node("Pow", ["input", "e"], "y")], [("e", np.ones(8, np.float32))], shape=(1, 8))
    with pytest.raises(TunerError, match="exponent of shape .8,.*a constant scalar exponent"):
        from_onnx(m)


# -- reductions ---------------------------------------------------------------------------------------------

def _reductions(opset):
    """Every kernel form: NCHW over (2, 3) (both keepdims), over (1,), over (1, 2, 3); (N, K) over 1. Axes as
    attributes (opset 17; ReduceSum's an input from 13) or inputs (18)."""
    def red(op, x, out, axes, keepdims=1):
        if opset >= 18 or op == "ReduceSum":
            return [node(op, [x, f"{out}_axes"], out, keepdims=keepdims)], [(f"{out}_axes", np.array(axes, np.int64))]
        return [node(op, [x], out, axes=axes, keepdims=keepdims)], []
    parts = [red("ReduceL2", "input", "l2_hw", [2, 3]), red("ReduceSum", "input", "sum_c", [1]),
             red("ReduceMax", "input", "max_c", [-3]), red("ReduceMean", "input", "mean_chw", [1, 2, 3]),
             red("ReduceSum", "input", "sum_hw", [3, 2], 0), red("ReduceL2", "sum_hw", "l2_k", [1]),
             red("ReduceMean", "l2_hw", "mean_c11", [1])]
    nodes = [n for p in parts for n in p[0]] + [node("Div", ["input", "mean_c11"], "o")]  # a value per image
    inits = [i for p in parts for i in p[1]]
    return model(nodes, inits, shape=(2, 7, 5, 3), opset=opset, outputs=["o", "sum_c", "max_c", "mean_chw", "l2_k"])


@pytest.mark.parametrize("opset", [17, 18])
def test_reductions_over_any_axes_match_onnxruntime(opset):
    graph = check_reference(_reductions(opset))
    assert {(n.op, n.attrs["axes"], n.attrs["keepdims"]) for n in graph.nodes if n.op.startswith("reduce")} == {
        ("reduce_l2", (2, 3), 1), ("reduce_sum", (1,), 1), ("reduce_max", (1,), 1), ("reduce_mean", (1, 2, 3), 1),
        ("reduce_sum", (2, 3), 0), ("reduce_l2", (1,), 1), ("reduce_mean", (1,), 1)}


def test_reductions_compile(dev):
    check_compiled(dev, _reductions(18), variants=(("texture", "float32"), ("buffer", "float16")))


def test_reduction_without_a_kernel_is_refused_when_lowered(dev):
    m = model([node("ReduceMean", ["input"], "r", axes=[1], keepdims=0),
               node("Unsqueeze", ["r", "one"], "y")], [("one", np.array([1], np.int64))])
    assert from_onnx(m).nodes[0].attrs == {"axes": (1,), "keepdims": 0}  # the graph op exists
    with pytest.raises(TunerError, match=r"reduce_mean.*axes \[1\] of a 4-D tensor .*keepdims=0 has no kernel"):
        compile_model(m, device=dev)


# -- normalizations -----------------------------------------------------------------------------------------

def _norms():
    c = 8
    scale, bias = RNG.standard_normal(c).astype(np.float32), RNG.standard_normal(c).astype(np.float32)
    gscale, gbias = RNG.standard_normal(2).astype(np.float32), RNG.standard_normal(2).astype(np.float32)
    nodes = [node("InstanceNormalization", ["input", "scale", "bias"], "inorm", epsilon=1e-3),
             node("GroupNormalization", ["inorm", "gscale", "gbias"], "gnorm", num_groups=2, epsilon=1e-4),
             # torch's GroupNorm(1, C) export: Reshape (N, 1, -1), InstanceNorm, Reshape back, affine
             node("Reshape", ["gnorm", "to3"], "r1"),
             node("InstanceNormalization", ["r1", "one_s", "zero_b"], "in3", epsilon=1e-5),
             node("Shape", ["gnorm"], "shape"),
             node("Reshape", ["in3", "shape"], "r2"),
             node("Mul", ["r2", "affine_w"], "aw"),
             node("Add", ["aw", "affine_b"], "y")]
    inits = [("scale", scale), ("bias", bias), ("gscale", gscale), ("gbias", gbias),
             ("to3", np.array([0, 1, -1], np.int64)), ("one_s", np.ones(1, np.float32)),
             ("zero_b", np.zeros(1, np.float32)), ("affine_w", RNG.standard_normal((c, 1, 1)).astype(np.float32)),
             ("affine_b", RNG.standard_normal((c, 1, 1)).astype(np.float32))]
    return model(nodes, inits, shape=(2, c, 5, 3), opset=18)


def test_group_and_instance_norm(dev):
    m = _norms()
    graph = check_reference(m)
    assert [n.op for n in graph.nodes] == ["group_norm", "group_norm", "reshape", "group_norm", "reshape", "mul",
                                           "add"]
    opt = optimize(graph)  # the decomposed GroupNorm and its affine become one NCHW group_norm
    assert [(n.op, n.attrs.get("groups")) for n in opt.nodes] == [("group_norm", 8), ("group_norm", 2),
                                                                   ("group_norm", 1)]
    x = random_inputs(graph)
    assert rel_err(run_graph_numpy(opt, x)["y"], run_graph_numpy(graph, x)["y"]) < 1e-6
    check_compiled(dev, m)


def _partial_group_norm():
    nodes = [node("Relu", ["input"], "r"),  # padding lanes of a computed tensor hold anything
             node("GroupNormalization", ["r", "s", "b"], "y", num_groups=1)]
    return model(nodes, [("s", np.full(1, 1.5, np.float32)), ("b", np.full(1, 0.25, np.float32))],
                 shape=(1, 6, 4, 4), opset=18)


def test_group_norm_with_a_partial_channel_block(dev):
    """GroupNorm(1) of 6 channels: the last block's padding lanes stay out of the statistics."""
    m = _partial_group_norm()
    check_reference(m)
    check_compiled(dev, m, variants=(("texture", "float32"), ("buffer", "float32")))


def _batch_norm_features():
    c = 6
    bn = [("s", RNG.uniform(0.5, 1.5, c).astype(np.float32)), ("b", RNG.standard_normal(c).astype(np.float32)),
          ("m", RNG.standard_normal(c).astype(np.float32)), ("v", RNG.uniform(0.5, 1.5, c).astype(np.float32))]
    nodes = [node("GlobalAveragePool", ["input"], "gap"), node("Flatten", ["gap"], "f"),
             node("BatchNormalization", ["f", "s", "b", "m", "v"], "bn0"),
             node("Gemm", ["bn0", "w"], "fc", transB=1),
             node("BatchNormalization", ["fc", "s", "b", "m", "v"], "y")]
    return model(nodes, bn + [("w", RNG.standard_normal((c, c)).astype(np.float32))], shape=(2, c, 4, 4))


def test_batch_norm_on_features(dev):
    """BatchNormalization on (N, C): folded into the dense layer before it, else a per-channel multiply-add."""
    m = _batch_norm_features()
    graph = check_reference(m)
    # the pool and Flatten: one reduction writing (N, C) rows (passes.flatten_into_reductions)
    assert [n.op for n in optimize(graph).nodes] == ["reduce_mean", "mul", "add", "dense"]
    check_compiled(dev, m, variants=(("texture", "float32"), ("buffer", "float16")))


# -- broadcasting: ConvNeXt-V2's GRN, Expand, tokens with constants ----------------------------------------------

def _grn():
    c = 10
    nodes = [node("ReduceL2", ["input"], "gx", axes=[2, 3], keepdims=1),
             node("ReduceMean", ["gx"], "mean", axes=[1], keepdims=1),      # (N, 1, 1, 1)
             node("Add", ["mean", "eps"], "den"),
             node("Div", ["gx", "den"], "nx"),                              # (N, C, 1, 1) / (N, 1, 1, 1)
             node("Mul", ["input", "nx"], "xn"),
             node("Mul", ["gamma", "xn"], "g"),
             node("Add", ["beta", "g"], "gb"),
             node("Add", ["input", "gb"], "y")]
    inits = [("eps", np.array(1e-6, np.float32)), ("gamma", RNG.standard_normal((1, c, 1, 1)).astype(np.float32)),
             ("beta", RNG.standard_normal((1, c, 1, 1)).astype(np.float32))]
    return model(nodes, inits, shape=(2, c, 4, 3))


def test_global_response_norm(dev):
    """ConvNeXt-V2's GRN in NCHW: ReduceL2 over H, W, a mean over channels, a per-image divisor."""
    m = _grn()
    check_reference(m)
    check_compiled(dev, m)


def _expand():
    nodes = [node("ReduceL2", ["input"], "n", axes=[-1], keepdims=1),
             node("Shape", ["input"], "shape"),
             node("Expand", ["n", "shape"], "e"),
             node("Div", ["input", "e"], "y")]
    return model(nodes)


def test_expand_read_by_a_broadcasting_op():
    graph = check_reference(_expand())
    assert [n.op for n in graph.nodes] == ["reduce_l2", "div"]
    bad = model([node("Expand", ["input", "s"], "e"), node("Relu", ["e"], "y")],
                [("s", np.array([2, 8, 6, 5], np.int64))])
    with pytest.raises(TunerError, match=r"Expand.*read by \['Relu'\].*read only by Add, Sub, Mul or Div"):
        from_onnx(bad)


T, C = 5, 6


def _tokens():
    t, c = T, C
    nodes = [node("Add", ["input", "bias"], "a"),
             node("Mul", ["scale", "a"], "m"),
             node("Sub", ["m", "pos"], "s"),
             node("Div", ["s", "two"], "d"),
             node("Shape", ["input"], "shape"),
             node("Gather", ["shape", "zero"], "n"),
             node("Unsqueeze", ["n", "zero1"], "n1"),
             node("Concat", ["n1", "ones2"], "cls_shape", axis=0),
             node("Expand", ["cls", "cls_shape"], "cls_e"),
             node("Concat", ["cls_e", "d"], "y", axis=1)]
    inits = [("bias", RNG.standard_normal(c).astype(np.float32)),
             ("scale", RNG.standard_normal((1, 1, c)).astype(np.float32)),
             ("pos", RNG.standard_normal((1, t, c)).astype(np.float32)), ("two", np.array(2.0, np.float32)),
             ("zero", np.array(0, np.int64)), ("zero1", np.array([0], np.int64)),
             ("ones2", np.array([1, 1], np.int64)), ("cls", RNG.standard_normal((1, 1, c)).astype(np.float32))]
    return model(nodes, inits, shape=(1, t, c))


def test_token_binary_ops_and_class_token_concat():
    """(N, T, C) with a bias (C,), a scale (1, 1, C), a position embedding (1, T, C) and an Expanded class token
    concatenated along T: graph binary ops and concat with params in ONNX's orientation."""
    t, c = T, C
    graph = check_reference(_tokens())
    assert [(n.op, [graph.shapes[i] for i in n.inputs if graph.is_param(i)]) for n in graph.nodes] == [
        ("add", [(1, 1, c)]), ("mul", [(1, 1, c)]), ("add", [(1, t, c)]), ("mul", [(1, 1, c)]),
        ("concat", [(1, 1, c)])]
    assert graph.nodes[-1].attrs["axis"] == 1 and graph.shapes["y"] == (1, t + 1, c)


def models() -> dict:
    """Every model above by name: ``test_frontend`` counts their operators and emitted graph ops as covered."""
    return {"casts": _casts(), "reshapes": _reshapes(), "reshapes_opset11": _reshapes_opset11(), "unary": _unary(),
            "reductions17": _reductions(17), "reductions18": _reductions(18), "norms": _norms(),
            "partial_group_norm": _partial_group_norm(), "batch_norm_features": _batch_norm_features(),
            "grn": _grn(), "expand": _expand(), "tokens": _tokens()}


def test_a_whole_image_reduction_runs_in_two_parallel_steps():
    """ReduceMean over (C, H, W): over (H, W) by the spatial_reduce template, then over the channels of (N, C, 1, 1);
    no work-item loops over the image."""
    g = optimize(from_onnx(_reductions(17)))
    chw = [(n.op, n.attrs["axes"], g.shapes[n.inputs[0]]) for n in g.nodes if n.name.startswith("mean_chw")]
    assert chw == [("reduce_mean", (2, 3), (2, 7, 5, 3)), ("reduce_mean", (1, 2, 3), (2, 7, 1, 1))]
