"""ONNX frontend: every supported operator and attribute variant checked against onnxruntime through the NumPy
reference interpreter (values and every intermediate shape), and every error path."""
from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.frontend.onnx import SUPPORTED_OPS, from_onnx
from tuner.graph.reference import OPS, random_inputs, run_graph_numpy
from tuner.zoo import models as zoo
from tuner.zoo.models import TEST_INPUT_SHAPES

MODELS = zoo.test_models()


def run_ort(model: onnx.ModelProto, inputs: dict, every_tensor: bool = False) -> dict:
    """onnxruntime's outputs, or (every_tensor) also every float output of every node (a Split's every part; not
    a Dropout mask or a shape subgraph's int64 tensors)."""
    if every_tensor:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        declared = {o.name for o in model.graph.output}
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        not_float = {vi.name for vi in inferred if vi.type.tensor_type.elem_type != TensorProto.FLOAT}
        for node in model.graph.node:
            for t in node.output if node.op_type != "Constant" else ():
                if t and t not in not_float and t not in declared:
                    declared.add(t)
                    model.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def assert_close(actual, expected, tol=1e-5):
    assert actual.shape == expected.shape
    scale = max(float(np.abs(expected).max()), 1e-6)
    assert float(np.abs(actual - expected).max()) <= tol * scale


@pytest.mark.parametrize("name", sorted(MODELS))
def test_matches_onnxruntime(name):
    model = MODELS[name]
    graph = from_onnx(model, TEST_INPUT_SHAPES.get(name))
    assert graph.outputs == [o.name for o in model.graph.output]
    inputs = random_inputs(graph, seed=1)
    ours = run_graph_numpy(graph, inputs, all_tensors=True)
    theirs = run_ort(model, inputs, every_tensor=True)
    for t in graph.outputs:
        assert_close(ours[t], theirs[t])
    # every intermediate tensor the graph keeps has onnxruntime's shape (and value)
    compared = [t for n in graph.nodes for t in n.outputs if t in theirs]
    # the rest: intermediates of a handler that emits several nodes (SpaceToDepth's 6-D reshape and transpose),
    # named after their ONNX node
    onnx_nodes = {n.name for n in model.graph.node}
    assert all(t.rsplit(".", 1)[0] in onnx_nodes for n in graph.nodes for t in n.outputs if t not in theirs)
    assert compared
    for t in compared:
        assert graph.shapes[t] == theirs[t].shape, t
        assert_close(ours[t], theirs[t])


# operators the test models use only inside shape subgraphs, which the frontend folds into constants
FOLDED_ONLY = {"Shape", "Gather", "Slice", "Squeeze", "Unsqueeze", "Cast", "Floor", "Ceil", "ConstantOfShape",
               "Range", "Where", "CumSum", "Equal", "Mod"}


def test_test_models_cover_every_operator_and_variant():
    from attention_models import class_token_model
    from test_frontend_ops import models as op_models  # the operators of issue #27, tested there
    from test_tokens import SHAPES_OF_ATTENTION  # attention's shapes of other architectures (Tile, 1-D pools)
    more = {**op_models(), "class_token": class_token_model(),
            **{name: m for name, (m, _) in SHAPES_OF_ATTENTION.items()}}
    ops = {n.op_type for m in [*MODELS.values(), *more.values()] for n in m.graph.node}
    assert ops - (FOLDED_ONLY - set(SUPPORTED_OPS)) == set(SUPPORTED_OPS)
    attrs = {(n.op_type, a.name, helper.get_attribute_value(a)) for m in MODELS.values() for n in m.graph.node
             for a in n.attribute if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.STRING)}
    for variant in [("Conv", "auto_pad", b"SAME_UPPER"), ("Conv", "auto_pad", b"SAME_LOWER"),
                    ("Conv", "auto_pad", b"VALID"), ("Conv", "group", 6), ("Gemm", "transB", 1),
                    ("AveragePool", "count_include_pad", 1), ("AveragePool", "count_include_pad", 0),
                    ("AveragePool", "auto_pad", b"SAME_UPPER"), ("Concat", "axis", -3), ("Flatten", "axis", -1),
                    ("MaxPool", "ceil_mode", 1), ("AveragePool", "ceil_mode", 1), ("ReduceMean", "keepdims", 0),
                    ("ReduceMax", "keepdims", 0), ("Softmax", "axis", 1)]:
        assert variant in attrs, variant
    clip6 = [n for n in MODELS["clip_attrs"].graph.node]
    assert [sorted(a.name for a in n.attribute) for n in clip6] == [["max", "min"], ["max"], ["min"]]
    assert [len(n.input) for n in MODELS["clip"].graph.node if n.op_type == "Clip"] == [3, 3, 2]
    emitted = {n.op for name, m in MODELS.items() for n in from_onnx(m, TEST_INPUT_SHAPES.get(name)).nodes}
    emitted |= {n.op for m in more.values() for n in from_onnx(m).nodes}
    from attention_models import attention_model  # attention's matmul and slice_nd (tests/test_tokens.py)
    emitted |= {n.op for n in from_onnx(attention_model(bias=True, pos=True)).nodes}
    # se_gate is made by a graph pass (tuner/graph/passes_se.py), never by the frontend itself
    assert emitted | {"se_gate"} == set(OPS)


def test_auto_pad_resolves_to_asymmetric_padding():
    pads = [n.attrs["padding"] for n in from_onnx(MODELS["conv_auto_pad"]).nodes]
    # 10x9 input, k3 s2 SAME_UPPER: total pad 1 (h) and 2 (w) -> the odd one goes at the end
    assert pads[0] == (0, 1, 1, 1)
    assert pads[1] == (2, 2, 1, 1)  # k4 s2 SAME_LOWER on 5x5: total 3 -> 2 before, 1 after
    assert pads[2] == (0, 0, 1, 1) and pads[3] == (1, 1, 0, 0) and pads[4] == (0, 0, 0, 0)


def test_gemm_folds_alpha_beta_and_transposes():
    model = MODELS["gemm"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    graph = from_onnx(model)
    first, second, third, fourth = graph.nodes
    assert [n.op for n in graph.nodes] == ["dense"] * 4
    np.testing.assert_allclose(graph.params[first.inputs[1]], 0.5 * inits["B0"].T, rtol=1e-6)
    np.testing.assert_allclose(graph.params[first.inputs[2]], 2.0 * inits["C0"], rtol=1e-6)
    np.testing.assert_allclose(graph.params[second.inputs[1]], 1.5 * inits["B1"], rtol=1e-6)
    assert graph.params[second.inputs[2]].shape == (7,)
    assert len(third.inputs) == 2
    assert fourth.inputs[1] == "B3"  # transB=1, alpha=1: the initializer as is
    np.testing.assert_allclose(graph.params[fourth.inputs[2]], np.full(5, -0.25, np.float32))


def test_add_constant_becomes_channel_param_and_activation_comes_first():
    graph = from_onnx(MODELS["add"])
    adds = [n for n in graph.nodes if n.op == "add"]
    assert not graph.is_param(adds[0].inputs[1])  # two activations
    for n in adds[1:]:
        assert not graph.is_param(n.inputs[0]) and graph.shapes[n.inputs[1]] == (1, 5, 1, 1)
    np.testing.assert_array_equal(graph.params[adds[3].inputs[1]], np.full((1, 5, 1, 1), 0.5, np.float32))
    matmul = from_onnx(MODELS["matmul"])
    assert [graph_shape for n in matmul.nodes if n.op == "add" for graph_shape in [matmul.shapes[n.inputs[1]]]] == \
        [(1, 6), (1, 4)]


def test_identity_dropout_and_dead_nodes_are_removed():
    graph = from_onnx(MODELS["identity_dropout"])
    assert [n.op for n in graph.nodes] == ["relu", "conv2d", "clip"]
    # the output produced through an Identity keeps its ONNX name: the conv writes it
    assert graph.outputs == ["output", "clip0"] and graph.producer("output").op == "conv2d"
    assert graph.nodes[2].attrs == {"min": 0.0, "max": np.inf}
    reshape = from_onnx(MODELS["reshape"])
    assert [n.attrs.get("shape") for n in reshape.nodes if n.op == "reshape"] == [(2, 2, 6, 5), (2, 60, 1, 1)]
    assert not reshape.params  # the shapes (Constant node, initializer) became attrs
    gap = from_onnx(MODELS["global_avg_pool"])
    assert [n.op for n in gap.nodes] == ["global_avg_pool", "flatten"] and gap.outputs == ["flatten1"]


def test_symbolic_batch_with_input_shapes_and_any_input_size(tmp_path):
    graph = from_onnx(MODELS["symbolic_batch"], {"input": (3, 3, 8, 8)})
    assert graph.shapes["input"] == (3, 3, 8, 8) and graph.shapes[graph.outputs[0]] == (3, 5)
    with pytest.raises(TunerError) as e:
        from_onnx(MODELS["symbolic_batch"])
    msg = str(e.value)
    assert "'input'" in msg and "'N'" in msg and "axis 0" in msg and "input_shapes" in msg and "--input-shape" in msg
    # a static model converts at another size too; loading from a path
    path = tmp_path / "m.onnx"
    onnx.save(MODELS["mixed"], str(path))
    graph = from_onnx(path, {"input": (2, 3, 40, 24)})
    assert graph.shapes["conv0"] == (2, 8, 20, 12) and graph.shapes["output"] == (2, 10)
    assert run_graph_numpy(graph, random_inputs(graph))["output"].shape == (2, 10)


def test_input_shapes_and_load_errors(tmp_path):
    with pytest.raises(TunerError, match=r"'x'.*not inputs.*\['input'\]"):
        from_onnx(MODELS["mixed"], {"x": (1, 3, 8, 8)})
    with pytest.raises(TunerError, match="rank 3"):
        from_onnx(MODELS["mixed"], {"input": (1, 3, 8)})
    with pytest.raises(TunerError, match="positive ints"):
        from_onnx(MODELS["mixed"], {"input": (1, 0, 8, 8)})
    with pytest.raises(TunerError, match="does not exist"):
        from_onnx(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xff not a model")
    with pytest.raises(TunerError, match="cannot read ONNX model"):
        from_onnx(tmp_path / "junk.onnx")


def test_initializers_listed_as_inputs_are_params():
    """Old exporters (IR < 4) list every initializer among the graph inputs too."""
    model = onnx.ModelProto.FromString(MODELS["batch_norm"].SerializeToString())
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in model.graph.initializer)
    graph = from_onnx(model)
    assert graph.inputs == ["input"] and len(graph.params) == 9
    inputs = random_inputs(graph)
    assert_close(run_graph_numpy(graph, inputs)["bn1"], run_ort(MODELS["batch_norm"], inputs)["bn1"])


def test_non_float_input_is_rejected():
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT16, [1, 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 3, 4, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["input"], ["y"])], "g", [x], [y]))
    with pytest.raises(TunerError, match=r"'input' has element type FLOAT16; only FLOAT \(float32\)"):
        from_onnx(model)


# -- error paths: one model per unsupported construct --------------------------------------------------------

def _model(nodes, inits=(), shape=(1, 8, 8, 8), opset=13, extra_inputs=()):
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x, *extra_inputs], [y],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


W8 = ("w", np.ones((8, 8, 3, 3), np.float32))
W_G2 = ("w", np.ones((8, 4, 3, 3), np.float32))
CASES = {
    "hardmax": (_model([helper.make_node("Hardmax", ["input"], ["y"], name="probs")]),
                ["'probs'", "Hardmax", "not supported", "Conv", "Softmax", "HardSwish"]),
    "softmax_batch": (_model([helper.make_node("Softmax", ["input"], ["y"], name="probs", axis=0)]),
                      ["'probs'", "Softmax", "axis=0", "channel axis"]),
    "softmax_opset11_flattens": (_model([helper.make_node("Softmax", ["input"], ["y"], name="probs", axis=1)],
                                        opset=11), ["'probs'", "Softmax", "opset 11", "H = W = 1"]),
    "hardsigmoid_unknown_attr": (_model([helper.make_node("HardSigmoid", ["input"], ["y"], name="gate", gamma=2.0)]),
                                 ["'gate'", "HardSigmoid", "attribute 'gamma'", "alpha, beta"]),
    "reduce_bad_axes": (_model([helper.make_node("ReduceMean", ["input"], ["y"], name="rm", axes=[1, 4])]),
                        ["'rm'", "ReduceMean", "axes [1, 4] on a 4-D input", "distinct axes in [-4, 3]"]),
    "prelu_spatial_slope": (_model([helper.make_node("PRelu", ["input", "s"], ["y"], name="pr")],
                                   [("s", np.ones((8, 8), np.float32))]), ["'pr'", "PRelu", "slope of shape (8, 8)"]),
    "mul_spatial_activations": (_model([helper.make_node("ReduceMean", ["input"], ["m"], name="rm", axes=[2, 3],
                                                         keepdims=0),
                                        helper.make_node("Mul", ["input", "m"], ["y"], name="scale")]),
                                ["'scale'", "Mul", "(1, 8, 8, 8) and (1, 8)", "(N, C, 1, 1)"]),
    "lstm_unnamed": (_model([helper.make_node("Relu", ["input"], ["r"], name="relu"),
                             helper.make_node("LSTM", ["r", "w", "w"], ["y"])], [W8]),
                     ["#1", "LSTM", "not supported"]),
    "conv_group3": (_model([helper.make_node("Conv", ["input", "w"], ["y"], name="gconv", group=3)], [W_G2]),
                    ["'gconv'", "Conv", "group=3", "8 input channels", "groups dividing"]),
    "maxpool_ceil2": (_model([helper.make_node("MaxPool", ["input"], ["y"], name="pool", kernel_shape=[2, 2],
                                               ceil_mode=2)]), ["'pool'", "MaxPool", "ceil_mode=2", "0 or 1"]),
    "maxpool_dilations": (_model([helper.make_node("MaxPool", ["input"], ["y"], name="pool", kernel_shape=[2, 2],
                                                   dilations=[2, 2])]), ["'pool'", "MaxPool", "dilations"]),
    "maxpool_storage_order": (_model([helper.make_node("MaxPool", ["input"], ["y"], name="pool", kernel_shape=[2, 2],
                                                       storage_order=1)]), ["MaxPool", "storage_order=1"]),
    "maxpool_indices": (_model([helper.make_node("MaxPool", ["input"], ["y", "idx"], name="pool",
                                                 kernel_shape=[2, 2])]), ["MaxPool", "'idx'", "first output"]),
    "gemm_transA": (_model([helper.make_node("Gemm", ["input", "b"], ["y"], name="fc", transA=1)],
                           [("b", np.ones((8, 4), np.float32))], shape=(8, 2)), ["'fc'", "Gemm", "transA=1"]),
    "gemm_row_bias": (_model([helper.make_node("Gemm", ["input", "b", "c"], ["y"], name="fc")],
                             [("b", np.ones((8, 4), np.float32)), ("c", np.ones((2, 4), np.float32))], shape=(2, 8)),
                      ["'fc'", "Gemm", "C of shape (2, 4)", "(4,)"]),
    "matmul_activation_rhs": (_model([helper.make_node("MatMul", ["input", "input"], ["y"], name="mm")],
                                     shape=(4, 4)), ["'mm'", "MatMul", "computed by the graph", "initializer"]),
    "conv_weight_input": (_model([helper.make_node("Conv", ["input", "w"], ["y"], name="c")],
                                 extra_inputs=[helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8, 3, 3])]),
                          ["'c'", "Conv", "weight W 'w' is computed", "initializer or Constant"]),
    "conv_same_dilated": (_model([helper.make_node("Conv", ["input", "w"], ["y"], name="c", auto_pad="SAME_UPPER",
                                                   dilations=[2, 2])], [W8]),
                          ["'c'", "Conv", "auto_pad=SAME_UPPER with dilations=[2, 2]"]),
    "conv_1d": (_model([helper.make_node("Conv", ["input", "w"], ["y"], name="c")],
                       [("w", np.ones((4, 8, 3), np.float32))], shape=(1, 8, 8)), ["'c'", "Conv", "(1, 8, 8)", "4-D"]),
    "conv_unknown_attr": (_model([helper.make_node("Conv", ["input", "w"], ["y"], name="c", foo=1)], [W8]),
                          ["'c'", "Conv", "attribute 'foo'", "auto_pad"]),
    "concat_mismatch": (_model([helper.make_node("GlobalAveragePool", ["input"], ["g"], name="gap"),
                                helper.make_node("Concat", ["input", "g"], ["y"], name="cat", axis=1)]),
                        ["'cat'", "Concat", "(1, 8, 8, 8), (1, 8, 1, 1)", "differ only along axis 1"]),
    "add_broadcast": (_model([helper.make_node("GlobalAveragePool", ["input"], ["g"], name="gap"),
                              helper.make_node("Flatten", ["g"], ["f"], name="flat"),
                              helper.make_node("Add", ["input", "f"], ["y"], name="sum")]),
                      ["'sum'", "Add", "(1, 8, 8, 8) and (1, 8)"]),
    "add_spatial_const": (_model([helper.make_node("Add", ["input", "c"], ["y"], name="sum")],
                                 [("c", np.ones((8, 8), np.float32))]),
                          ["'sum'", "Add", "shape (8, 8)", "(1, 8, 1, 1)"]),
    "reshape_allowzero": (_model([helper.make_node("Reshape", ["input", "s"], ["y"], name="rs", allowzero=1)],
                                 [("s", np.array([0, -1], np.int64))], opset=14), ["'rs'", "Reshape", "allowzero=1"]),
    "reshape_bad_count": (_model([helper.make_node("Reshape", ["input", "s"], ["y"], name="rs")],
                                 [("s", np.array([3, -1], np.int64))]), ["'rs'", "Reshape", "[3, -1]"]),
    "flatten_axis5": (_model([helper.make_node("Flatten", ["input"], ["y"], name="fl", axis=5)]),
                      ["'fl'", "Flatten", "axis=5 on a 4-D input", "an axis in [-4, 4]"]),
    "clip_nonconst_bound": (_model([helper.make_node("Clip", ["input", "lo"], ["y"], name="clip")],
                                   extra_inputs=[helper.make_tensor_value_info("lo", TensorProto.FLOAT, [])]),
                            ["'clip'", "Clip", "Clip min 'lo' is computed"]),
    "bn_training": (_model([helper.make_node("BatchNormalization", ["input", "s", "s", "s", "s"], ["y"], name="bn",
                                             training_mode=1)], [("s", np.ones(8, np.float32))], opset=15),
                    ["'bn'", "BatchNormalization", "training_mode=1"]),
    "dropout_training": (_model([helper.make_node("Dropout", ["input", "r", "t"], ["d"], name="drop"),
                                 helper.make_node("Relu", ["d"], ["y"], name="relu")],
                                [("r", np.float32(0.5)), ("t", np.array(True))]),
                         ["'drop'", "Dropout", "training_mode"]),
    "custom_domain": (_model([helper.make_node("FusedConv", ["input"], ["y"], name="fc", domain="com.microsoft")]),
                      ["'fc'", "com.microsoft.FusedConv", "custom domain"]),
    "fold_fails": (_model([helper.make_node("Reshape", ["c", "s"], ["r"], name="bad_fold"),
                           helper.make_node("Add", ["input", "r"], ["y"], name="sum")],
                          [("c", np.ones(6, np.float32)), ("s", np.array([4, -1], np.int64))]),
                   ["'bad_fold'", "Reshape", "evaluating it on constant inputs failed"]),
    "not_topological": (_model([helper.make_node("Relu", ["r"], ["y0"], name="late"),
                                helper.make_node("Relu", ["input"], ["r"], name="early"),
                                helper.make_node("Add", ["y0", "r"], ["y"], name="sum")]),
                        ["'late'", "Relu", "'r' is not produced", "topological order"]),
    "pool_too_big": (_model([helper.make_node("MaxPool", ["input"], ["y"], name="mp", kernel_shape=[9, 9])]),
                     ["'mp'", "MaxPool", "window of 9 over an input of 8"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_errors_name_node_operator_and_value(case):
    model, expected = CASES[case]
    with pytest.raises(TunerError) as e:
        from_onnx(model)
    msg = str(e.value)
    assert msg.startswith("ONNX node ") and "supported" in msg
    for part in expected:
        assert part in msg, (part, msg)


def test_pass_through_output_of_an_input_is_rejected():
    model = _model([helper.make_node("Identity", ["input"], ["y"], name="copy")])
    with pytest.raises(TunerError, match="output 'y' is a copy .* of 'input'"):
        from_onnx(model)


def test_reference_interpreter_checks_its_inputs():
    graph = from_onnx(MODELS["max_pool"])
    with pytest.raises(ValueError, match="missing inputs"):
        run_graph_numpy(graph, {})
    with pytest.raises(ValueError, match="has shape"):
        run_graph_numpy(graph, {"input": np.zeros((1, 4, 9, 9), np.float32)})
    graph.nodes[0].attrs["activation"] = "relu"  # e.g. a fused epilogue: refused, not ignored
    with pytest.raises(ValueError, match=r"attributes \['activation'\] its reference does not implement"):
        run_graph_numpy(graph, random_inputs(graph))
    graph.nodes[0].op = "lrn"
    with pytest.raises(ValueError, match="no reference for op 'lrn'"):
        run_graph_numpy(graph, random_inputs(graph))


def test_reference_max_pool_ignores_padding_and_avg_pool_counts():
    """Hand-checked values, independent of onnxruntime."""
    x = -np.arange(1, 5, dtype=np.float32).reshape(1, 1, 2, 2)  # all negative: a zero pad would win a max
    model = _model([helper.make_node("MaxPool", ["input"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0])],
                   shape=(1, 1, 2, 2))
    out = run_graph_numpy(from_onnx(model), {"input": x})["y"]
    np.testing.assert_array_equal(out[0, 0], [[-1, -1], [-1, -1]])
    for cip, corner in ((0, -1.0), (1, -0.25)):
        model = _model([helper.make_node("AveragePool", ["input"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0],
                                         count_include_pad=cip)], shape=(1, 1, 2, 2))
        out = run_graph_numpy(from_onnx(model), {"input": x})["y"]
        assert out[0, 0, 0, 0] == corner and out[0, 0, 1, 1] == -2.5


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter announces its retirement
def test_pytorch_export_converts_and_matches_pytorch():
    """Real exporter output (TorchScript exporter: Constant-node Clip bounds, node names like '/Conv', opset 17,
    a symbolic batch dim): converts and matches PyTorch."""
    torch = pytest.importorskip("torch")

    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.act = nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6()
            self.dw = nn.Conv2d(8, 8, 3, 1, 1, groups=8)
            self.max, self.avg = nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(2)
            self.fc, self.drop = nn.Linear(256, 10), nn.Dropout(0.2)

        def forward(self, x):
            y = self.act(self.bn(self.conv(x)))
            y = y + self.dw(y)
            y = torch.cat([self.max(y), self.avg(y)], 1)
            return self.fc(self.drop(torch.flatten(y, 1)))

    torch.manual_seed(0)
    net = Net().eval()
    net.bn.running_mean.uniform_(-0.5, 0.5)
    net.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 16, 16)
    buf = io.BytesIO()
    torch.onnx.export(net, (x,), buf, dynamo=False, do_constant_folding=False, opset_version=17,
                      input_names=["input"], output_names=["logits"], dynamic_axes={"input": {0: "N"}})
    graph = from_onnx(onnx.load_from_string(buf.getvalue()), {"input": (2, 3, 16, 16)})
    assert [n.op for n in graph.nodes] == ["conv2d", "batch_norm", "clip", "conv2d", "add", "max_pool", "avg_pool",
                                           "concat", "flatten", "dense"]
    with torch.no_grad():
        expected = net(x).numpy()
    assert_close(run_graph_numpy(graph, {"input": x.numpy()})["logits"], expected)
