"""The per-task example models (tuner/zoo/tasks.py): each small version (in the test set) has the structure of the
architecture it follows, its optimized graph takes the lowering the task needs (ConvTranspose as phase
convolutions and a depth_to_space, BatchNorm and activations in the convolutions' epilogues), and every output
matches onnxruntime in texture, buffer and auto scopes (test_model.py's test_every_operator_matches_onnxruntime);
the full sizes have the published shapes and parameter counts."""
from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tuner.compile.compiler import compile_model
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes import optimize
from tuner.zoo import models as zoo, tasks

MODELS = {name: m for name, m in zoo.test_models().items() if name in tasks.TEST_MODELS}


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def nodes(model, op: str) -> list:
    return [n for n in model.graph.node if n.op_type == op]


def attr(node, name: str, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def inits(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def io_shapes(model) -> dict:
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
            for v in [*model.graph.input, *model.graph.output]}


def producer(model, tensor: str):
    """The node that makes ``tensor``; None for an input or an initializer."""
    return next((n for n in model.graph.node if tensor in n.output), None)


def consumers(model, tensor: str) -> list:
    return [n for n in model.graph.node if tensor in n.input]


def optimized(name: str) -> Counter:
    return Counter(n.op for n in optimize(from_onnx(MODELS[name])).nodes)


def test_every_task_model_is_in_the_test_set_and_the_zoo():
    assert set(tasks.TEST_MODELS) == set(tasks.ZOO) == {"segmentation", "ssdlite", "yolo", "sr_pixel_shuffle",
                                                          "sr_conv_transpose", "pose", "unet", "style_transfer"}
    assert set(tasks.ZOO) <= set(zoo.ZOO) and set(MODELS) == set(tasks.TEST_MODELS)
    for m in MODELS.values():
        assert m.opset_import[0].version == 17 and m.ByteSize() < 64 * 1024


# -- structure -------------------------------------------------------------------------------------------------
def test_segmentation_is_deeplabv3_with_a_dilated_trunk_and_aspp():
    m = MODELS["segmentation"]
    assert io_shapes(m) == {"input": (1, 3, 48, 48), "output": (1, 5, 48, 48)}
    # 3x3 dilations in order: layer1, layer2 (stride 2), layer3 (its first block at the previous dilation),
    # layer4 (2 then 4), the ASPP's rates, DeepLabHead's 3x3
    d3 = [attr(n, "dilations", [1])[0] for n in nodes(m, "Conv") if attr(n, "kernel_shape") == [3, 3]]
    assert d3 == [1, 1, 1, 1, 1, 1, 2, 2, 4, 4, 2, 4, 6, 1]
    assert all(attr(n, "pads") == [attr(n, "dilations", [1])[0]] * 4 for n in nodes(m, "Conv")
               if attr(n, "kernel_shape") == [3, 3])
    (aspp,) = [n for n in nodes(m, "Concat") if len(n.input) == 5]  # 1x1, three rates, image pooling
    pool = producer(m, aspp.input[4])
    assert pool.op_type == "Resize" and producer(m, pool.input[0]).op_type == "Relu"
    assert ops(m)["GlobalAveragePool"] == 1
    resizes = nodes(m, "Resize")
    assert [n.output[0] for n in resizes] == [pool.output[0], "output"]
    assert all((attr(n, "mode"), attr(n, "coordinate_transformation_mode")) == (b"linear", b"half_pixel")
               and n.input[3] for n in resizes)
    # BatchNorms fold into the convolutions, the ReLUs into their epilogues; the sizes subgraphs fold away
    assert optimized("segmentation") == {"conv2d": 21, "max_pool": 1, "global_avg_pool": 1, "resize": 2,
                                         "concat": 1}


def test_ssdlite_has_depthwise_separable_heads_and_two_3d_outputs():
    m = MODELS["ssdlite"]
    anchors = 6 * (4 * 4 + 2 * 2 + 1 * 1)  # three levels: stride 16 (the expansion), 32, the extra block
    assert io_shapes(m) == {"input": (1, 3, 64, 64), "boxes": (1, anchors, 4), "scores": (1, anchors, 5)}
    transposes = nodes(m, "Transpose")
    assert len(transposes) == 6 and all(attr(n, "perm") == [0, 2, 3, 1] for n in transposes)
    w = inits(m)
    for t in transposes:  # each head: depthwise 3x3 + BN + ReLU6, then a 1x1 with a bias
        head = producer(m, t.input[0])
        assert head.op_type == "Conv" and attr(head, "kernel_shape") == [1, 1] and len(head.input) == 3
        dw = producer(m, producer(m, producer(m, head.input[0]).input[0]).input[0])
        assert dw.op_type == "Conv" and attr(dw, "group") == w[dw.input[1]].shape[0] > 1
        (reshape,) = consumers(m, t.output[0])
        assert reshape.op_type == "Reshape" and w[reshape.input[1]].tolist() in ([1, -1, 4], [1, -1, 5])
    concats = nodes(m, "Concat")
    assert len(concats) == 2 and all(attr(n, "axis") == 1 and len(n.input) == 3 for n in concats)
    (softmax,) = nodes(m, "Softmax")
    assert attr(softmax, "axis") == -1 and softmax.output[0] == "scores"
    assert ops(m)["Clip"] == 20  # every ReLU6
    assert optimized("ssdlite")["conv2d"] == 31 and "batch_norm" not in optimized("ssdlite")


def test_yolo_is_yolov8_with_c2f_sppf_fpn_and_the_dfl_decode():
    m = MODELS["yolo"]
    assert io_shapes(m) == {"input": (1, 3, 64, 64), "output": (1, 4 + 3, 8 * 8 + 4 * 4 + 2 * 2)}
    c = ops(m)
    # 8 C2f (4 in the backbone, 4 in the neck) split their cv1 in halves; the decode splits box / class and DFL
    assert c["Split"] == 10 and c["MaxPool"] == 3 and c["Resize"] == 2 and c["Concat"] == 19
    pools = nodes(m, "MaxPool")  # SPPF: three chained 5x5 stride 1 pad 2
    assert all((attr(p, "kernel_shape"), attr(p, "strides"), attr(p, "pads")) == ([5, 5], [1, 1], [2] * 4)
               for p in pools)
    assert [p.input[0] for p in pools[1:]] == [p.output[0] for p in pools[:2]]
    (sppf,) = consumers(m, pools[2].output[0])
    assert sppf.op_type == "Concat" and sppf.input[1:] == [p.output[0] for p in pools]
    w = inits(m)
    for r in nodes(m, "Resize"):  # the FPN: nearest 2x, then Concat with the backbone's level
        assert (attr(r, "mode"), attr(r, "coordinate_transformation_mode"), w[r.input[2]].tolist()) == \
            (b"nearest", b"asymmetric", [1, 1, 2, 2])
        assert [n.op_type for n in consumers(m, r.output[0])] == ["Concat"]
    sigmoid = {n.output[0]: n.input[0] for n in nodes(m, "Sigmoid")}
    silu = [n for n in nodes(m, "Mul") if sigmoid.get(n.input[1]) == n.input[0]]
    assert len(silu) == 57 and all(producer(m, n.input[0]).op_type == "BatchNormalization" for n in silu)
    (softmax,) = nodes(m, "Softmax")  # DFL over the (4, reg_max, A) box logits
    assert attr(softmax, "axis") == 1
    opt = optimize(from_onnx(m))
    assert sum(n.attrs.get("activation") == "silu" for n in opt.nodes if n.op == "conv2d") == 57
    assert "batch_norm" not in {n.op for n in opt.nodes}


def test_sr_pixel_shuffle_is_espcn():
    m = MODELS["sr_pixel_shuffle"]
    assert io_shapes(m) == {"input": (1, 3, 24, 24), "output": (1, 3, 72, 72)}
    assert [attr(n, "kernel_shape") for n in nodes(m, "Conv")] == [[5, 5], [3, 3], [3, 3]]
    assert ops(m)["Tanh"] == 2
    (d2s,) = nodes(m, "DepthToSpace")
    assert (attr(d2s, "mode"), attr(d2s, "blocksize")) == (b"CRD", 3)
    assert optimized("sr_pixel_shuffle") == {"conv2d": 3, "depth_to_space": 1}  # tanh in the epilogues


def test_sr_conv_transpose_is_fsrcnn():
    m = MODELS["sr_conv_transpose"]
    assert io_shapes(m) == {"input": (1, 1, 20, 20), "output": (1, 1, 40, 40)}
    assert [attr(n, "kernel_shape") for n in nodes(m, "Conv")] == [[5, 5], [1, 1], [3, 3], [3, 3], [1, 1]]
    w = inits(m)
    assert [w[n.input[1]].shape for n in nodes(m, "PRelu")] == [(12, 1, 1), (6, 1, 1), (6, 1, 1), (6, 1, 1),
                                                                (12, 1, 1)]
    (ct,) = nodes(m, "ConvTranspose")
    assert (attr(ct, "kernel_shape"), attr(ct, "strides"), attr(ct, "pads"), attr(ct, "output_padding")) == \
        ([9, 9], [2, 2], [4] * 4, [1, 1])
    opt = optimize(from_onnx(m))
    assert Counter(n.op for n in opt.nodes) == {"conv2d": 6, "depth_to_space": 1}  # each PReLU in its conv
    assert [n.attrs.get("activation") for n in opt.nodes if n.op == "conv2d"].count("prelu") == 5
    phases = next(n for n in opt.nodes if n.op == "conv2d" and opt.consumers(n.outputs[0])[0].op == "depth_to_space")
    assert opt.shapes[phases.inputs[1]] == (4, 12, 5, 5)  # 2x2 phases of ceil(9 / 2) taps an axis


def test_pose_is_simple_baseline():
    m = MODELS["pose"]
    assert io_shapes(m) == {"input": (1, 3, 96, 64), "output": (1, 5, 24, 16)}  # heatmaps at stride 4
    cts = nodes(m, "ConvTranspose")
    assert len(cts) == 3
    for ct in cts:  # 4x4 stride 2 pad 1, no bias, then BN + ReLU
        assert (attr(ct, "kernel_shape"), attr(ct, "strides"), attr(ct, "pads"), len(ct.input)) == \
            ([4, 4], [2, 2], [1] * 4, 2)
        (bn,) = consumers(m, ct.output[0])
        assert bn.op_type == "BatchNormalization" and [n.op_type for n in consumers(m, bn.output[0])] == ["Relu"]
    head = producer(m, "output")
    assert head.op_type == "Conv" and attr(head, "kernel_shape") == [1, 1] and len(head.input) == 3
    assert ops(m)["Add"] == 4  # a basic block a layer
    # each ConvTranspose: its phases as one conv2d (BN and ReLU moved into its epilogue) and a depth_to_space
    opt = optimize(from_onnx(m))
    assert Counter(n.op for n in opt.nodes) == {"conv2d": 16, "max_pool": 1, "depth_to_space": 3}
    for d2s in (n for n in opt.nodes if n.op == "depth_to_space"):
        phases = opt.producer(d2s.inputs[0])
        assert phases.op == "conv2d" and phases.attrs["activation"] == "relu"
        assert opt.shapes[phases.inputs[1]][2:] == (2, 2)  # ceil(4 / 2) taps: 4x fewer multiply-adds


def test_unet_has_three_levels_with_skips():
    m = MODELS["unet"]
    assert io_shapes(m) == {"input": (1, 3, 32, 32), "output": (1, 2, 32, 32)}
    assert all((attr(p, "kernel_shape"), attr(p, "strides")) == ([2, 2], [2, 2]) for p in nodes(m, "MaxPool"))
    assert ops(m)["MaxPool"] == 3
    cts = nodes(m, "ConvTranspose")
    assert [(attr(n, "kernel_shape"), attr(n, "strides"), len(n.input)) for n in cts] == [([2, 2], [2, 2], 3)] * 3
    skips = [p.input[0] for p in nodes(m, "MaxPool")][::-1]  # each level's DoubleConv, deepest first
    assert [n.input for n in nodes(m, "Concat")] == [[s, ct.output[0]] for s, ct in zip(skips, cts)]
    assert ops(m)["Conv"] == 2 * 7 + 1  # a DoubleConv a level (3 down, the bottleneck, 3 up), the 1x1 head
    assert optimized("unet") == {"conv2d": 18, "max_pool": 3, "depth_to_space": 3, "concat": 3}


def test_style_transfer_is_johnsons_transformer_net():
    m = MODELS["style_transfer"]
    assert io_shapes(m) == {"input": (1, 3, 32, 32), "output": (1, 3, 32, 32)}
    convs = nodes(m, "Conv")
    assert [attr(n, "kernel_shape")[0] for n in convs] == [9, 3, 3, 3, 3, 3, 3, 3, 3, 9]
    assert [attr(n, "strides")[0] for n in convs] == [1, 2, 2] + [1] * 7
    w = inits(m)
    for conv in convs:  # ReflectionPad2d(k // 2) before every conv, which pads nothing itself
        pad = producer(m, conv.input[0])
        k = attr(conv, "kernel_shape")[0]
        assert pad.op_type == "Pad" and attr(pad, "mode") == b"reflect" and attr(conv, "pads") == [0] * 4
        assert w[pad.input[1]].tolist() == [0, 0, k // 2, k // 2, 0, 0, k // 2, k // 2]
    assert ops(m)["InstanceNormalization"] == 9 and ops(m)["Add"] == 2  # two residual blocks
    ups = nodes(m, "Resize")
    assert len(ups) == 2 and all(attr(n, "mode") == b"nearest" and w[n.input[2]].tolist() == [1, 1, 2, 2]
                                 for n in ups)
    assert producer(m, "output").op_type == "Conv"


# -- the plan: phases, no zero insertion (every output against onnxruntime in texture, buffer and auto scopes:
# test_model.py's test_every_operator_matches_onnxruntime, which runs every test model) --------------------------
DEPTH_TO_SPACE = {"pose": 3, "unet": 3, "sr_conv_transpose": 1, "sr_pixel_shuffle": 1}


@pytest.mark.parametrize("name", sorted(tasks.TEST_MODELS))
def test_task_model_plans_interleave_phases_and_insert_no_zeros(name):
    from tuner.frontend.onnx import from_onnx
    from tuner.graph.passes import optimize
    g = optimize(from_onnx(MODELS[name]))
    steps = Counter(n.op for n in g.nodes)
    assert "upsample_zeros" not in steps and steps["depth_to_space"] == DEPTH_TO_SPACE.get(name, 0), steps
    assert g.outputs == [o.name for o in MODELS[name].graph.output]


def test_ssdlite_scores_are_a_softmax_over_the_classes(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(MODELS["ssdlite"], device=device, scope="auto")
    x = np.random.default_rng(1).standard_normal(mod.spec.entries["input"].shape).astype(np.float32)
    ours = dict(zip(mod.spec.outputs, mod.run([x])))
    assert ours["boxes"].ndim == ours["scores"].ndim == 3
    assert np.allclose(ours["scores"].sum(-1), 1, atol=1e-5)


# -- the full sizes ----------------------------------------------------------------------------------------
FULL = {  # shapes; conv (and ConvTranspose) weights plus biases, BatchNorm's scale and shift, IN's, PReLU's
    "segmentation": ({"input": (1, 3, 512, 512), "output": (1, 21, 512, 512)}, None),
    "ssdlite": ({"input": (1, 3, 320, 320), "boxes": (1, 3234, 4), "scores": (1, 3234, 91)}, None),
    "yolo": ({"input": (1, 3, 640, 640), "output": (1, 84, 8400)}, 3_157_200),  # ultralytics' YOLOv8n summary
    "sr_pixel_shuffle": ({"input": (1, 1, 224, 224), "output": (1, 1, 672, 672)}, 22_729),
    "sr_conv_transpose": ({"input": (1, 1, 224, 224), "output": (1, 1, 672, 672)}, 12_809),
    "pose": ({"input": (1, 3, 256, 192), "output": (1, 17, 64, 48)}, 15_376_721),
    "unet": ({"input": (1, 3, 256, 256), "output": (1, 2, 256, 256)}, None),
    "style_transfer": ({"input": (1, 3, 256, 256), "output": (1, 3, 256, 256)}, 1_679_235),  # TransformerNet's
}


def learned_parameters(model) -> int:
    """What PyTorch counts: conv weights and biases, BatchNorm's weight and bias (not its running statistics),
    InstanceNorm's affine pair, PReLU's slopes; YOLOv8's DFL conv (a frozen parameter) too."""
    w = inits(model)
    used = {t for n in model.graph.node for t in (n.input[1:3] if n.op_type in ("Conv", "ConvTranspose",
                                                                                "BatchNormalization",
                                                                                "InstanceNormalization")
                                                   else n.input[1:2] if n.op_type == "PRelu" else [])}
    return sum(w[t].size for t in used if t)


@pytest.mark.parametrize("name", sorted(FULL))
def test_full_size_models_have_the_published_shapes(name):
    model = tasks.ZOO[name]()
    shapes, params = FULL[name]
    assert io_shapes(model) == shapes and model.opset_import[0].version == 17
    if params:
        assert learned_parameters(model) == params
    if name == "sr_conv_transpose":  # and the paper's count, weights only: 25d + sd + 9ms^2 + ds + 81d
        assert sum(inits(model)[n.input[1]].size for n in model.graph.node if "Conv" in n.op_type) == 12_464
    assert model.SerializeToString() == tasks.ZOO[name]().SerializeToString()  # deterministic


def test_zoo_writes_every_task_model_at_a_given_size(tmp_path):
    for name in tasks.ZOO:
        path = zoo.write_model(name, tmp_path / f"{name}.onnx", input_size=64)
        model = onnx.load(path)
        onnx.checker.check_model(model)
        assert io_shapes(model)["input"][2:] == (64, 64)


@pytest.mark.slow
def test_fsrcnn_at_full_size_matches_onnxruntime(device):
    """FSRCNN x3 at 224x224: its 9x9 stride-3 ConvTranspose as 9 phases of 3x3 taps, 672x672 out."""
    model = tasks.sr_conv_transpose()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(model, device=device, scope="auto")
    x = np.random.default_rng(0).standard_normal((1, 1, 224, 224)).astype(np.float32)
    (ours,) = mod.run({"input": x})
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})
    assert ours.shape == theirs.shape == (1, 1, 672, 672)
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
