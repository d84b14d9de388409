"""The model zoo: torchvision's MobileNetV2 and ResNet-18 built in code. onnxruntime runs them, the frontend's
graph has the architecture's op counts and channel plan, and its shapes and values (through the NumPy reference)
match onnxruntime's at every node."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError
from tuner.zoo import models as zoo
from tuner.frontend.onnx import from_onnx
from tuner.graph.reference import random_inputs, run_graph_numpy


def ort_every_tensor(model: onnx.ModelProto, inputs: dict) -> dict:
    """onnxruntime's value of every node's first output (Constant nodes aside)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    declared = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None)
                              for n in model.graph.node if n.op_type != "Constant" and n.output[0] not in declared)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def check_against_onnxruntime(model: onnx.ModelProto, tol: float = 1e-4):
    graph = from_onnx(model)
    inputs = random_inputs(graph, seed=3)
    ours = run_graph_numpy(graph, inputs, all_tensors=True)
    theirs = ort_every_tensor(model, inputs)
    for n in graph.nodes:
        t = n.outputs[0]
        assert graph.shapes[t] == theirs[t].shape, (n, theirs[t].shape)
        scale = float(np.abs(theirs[t]).max())
        assert float(np.abs(ours[t] - theirs[t]).max()) <= tol * scale, n
    assert np.abs(theirs["output"]).max() > 0.1  # the random net does not vanish
    return graph


def test_resnet18_architecture_and_onnxruntime():
    model = zoo.resnet18(num_classes=10, input_size=64)
    graph = check_against_onnxruntime(model)
    ops = Counter(n.op for n in graph.nodes)
    assert ops == {"conv2d": 20, "batch_norm": 20, "relu": 17, "add": 8, "max_pool": 1, "global_avg_pool": 1,
                   "flatten": 1, "dense": 1}
    convs = [n for n in graph.nodes if n.op == "conv2d"]
    assert all(len(n.inputs) == 2 and n.attrs["groups"] == 1 for n in convs)  # no bias: BatchNorm follows
    stem = convs[0]
    assert graph.shapes[stem.inputs[1]] == (64, 3, 7, 7) and stem.attrs["stride"] == (2, 2)
    assert stem.attrs["padding"] == (3, 3, 3, 3)
    downsample = [n for n in convs if graph.shapes[n.inputs[1]][2:] == (1, 1)]
    assert [(graph.shapes[n.inputs[1]][:2], n.attrs["stride"]) for n in downsample] == \
        [((128, 64), (2, 2)), ((256, 128), (2, 2)), ((512, 256), (2, 2))]
    pool = next(n for n in graph.nodes if n.op == "max_pool")
    assert pool.attrs == {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1, 1, 1)}
    assert graph.shapes[pool.outputs[0]] == (1, 64, 16, 16)
    for add in (n for n in graph.nodes if n.op == "add"):  # relu(bn2(conv2(...)) + identity)
        assert graph.producer(add.inputs[0]).op == "batch_norm"
        assert graph.producer(add.inputs[1]).op in ("relu", "max_pool", "batch_norm")
        assert [c.op for c in graph.consumers(add.outputs[0])] == ["relu"]
    stages = [graph.shapes[n.outputs[0]] for n in graph.nodes if n.op == "add"]
    assert stages[1::2] == [(1, 64, 16, 16), (1, 128, 8, 8), (1, 256, 4, 4), (1, 512, 2, 2)]
    assert graph.shapes["output"] == (1, 10) and graph.shapes[graph.nodes[-1].inputs[1]] == (10, 512)


def mobilenet_block_channels(graph) -> list:
    """Output channels of each block's linear projection (a BatchNorm not followed by Clip)."""
    return [graph.shapes[n.outputs[0]][1] for n in graph.nodes
            if n.op == "batch_norm" and all(c.op != "clip" for c in graph.consumers(n.outputs[0]))]


def per_block(stage_channels: list) -> list:
    return [c for c, (_, _, n, _) in zip(stage_channels, zoo.MOBILENET_V2_SETTINGS) for _ in range(n)]


def test_mobilenet_v2_architecture_and_onnxruntime():
    model = zoo.mobilenet_v2(num_classes=10, input_size=64, width=0.5)
    graph = check_against_onnxruntime(model)
    ops = Counter(n.op for n in graph.nodes)
    assert ops == {"conv2d": 52, "batch_norm": 52, "clip": 35, "add": 10, "global_avg_pool": 1, "flatten": 1,
                   "dense": 1}
    assert all(n.attrs == {"min": 0.0, "max": 6.0} for n in graph.nodes if n.op == "clip")
    convs = [n for n in graph.nodes if n.op == "conv2d"]
    depthwise = [n for n in convs if n.attrs["groups"] > 1]
    assert len(depthwise) == 17
    for n in depthwise:
        c = graph.shapes[n.inputs[0]][1]
        assert n.attrs["groups"] == c and graph.shapes[n.inputs[1]] == (c, 1, 3, 3)
    assert [n.attrs["stride"][0] for n in depthwise] == [1, 2, 1, 2, 1, 1, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1]
    assert all(len(n.inputs) == 2 for n in convs)
    assert graph.shapes[convs[0].outputs[0]] == (1, 16, 32, 32)  # stem: 32 * 0.5, stride 2
    assert mobilenet_block_channels(graph) == per_block([8, 16, 16, 32, 48, 80, 160])
    assert graph.shapes[convs[-1].outputs[0]] == (1, 1280, 2, 2)
    # expansion 6: hidden = round(in * 6), e.g. the first t=6 block expands 8 -> 48
    assert graph.shapes[convs[3].inputs[1]] == (48, 8, 1, 1)
    for add in (n for n in graph.nodes if n.op == "add"):  # residuals only where stride 1 and in == out
        assert graph.shapes[add.inputs[0]] == graph.shapes[add.inputs[1]]
        assert graph.producer(add.inputs[1]).op == "batch_norm"


def test_mobilenet_v2_width_rounding_matches_torchvision():
    assert [zoo._make_divisible(c * 1.4) for c in (32, 16, 24, 32, 64, 96, 160, 320, 1280)] == \
        [48, 24, 32, 48, 88, 136, 224, 448, 1792]
    assert zoo._make_divisible(0.35 * 16) == 8 and zoo._make_divisible(10.0) == 16  # never below 90% of v
    for width, stages, last in ((1.0, [16, 24, 32, 64, 96, 160, 320], 1280),
                                (1.4, [24, 32, 48, 88, 136, 224, 448], 1792)):
        graph = from_onnx(zoo.mobilenet_v2(num_classes=7, input_size=32, width=width))
        assert mobilenet_block_channels(graph) == per_block(stages)
        assert graph.shapes[graph.nodes[-1].inputs[1]] == (7, last)


def test_full_size_models_convert_and_match_onnxruntime_output():
    for build, shape in ((zoo.resnet18, (1, 512, 7, 7)), (zoo.mobilenet_v2, (1, 1280, 7, 7))):
        model = build()
        graph = from_onnx(model)
        assert graph.shapes["input"] == (1, 3, 224, 224) and graph.shapes["output"] == (1, 1000)
        assert graph.shapes[graph.nodes[-3].inputs[0]] == shape  # what GlobalAveragePool reads
        inputs = random_inputs(graph)
        (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, inputs)
        actual = run_graph_numpy(graph, inputs)["output"]
        assert np.abs(actual - expected).max() <= 1e-4 * np.abs(expected).max()


CLASSIFIERS = ("mobilenet_v2", "mobilenet_v3_small", "resnet18")  # the task models: tests/test_task_models.py


def test_the_zoo_is_the_classifiers_and_the_task_models():
    from tuner.zoo import tasks
    assert sorted(zoo.ZOO) == sorted([*CLASSIFIERS, *tasks.ZOO])


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_models_are_valid_deterministic_and_torchvision_shaped(name):
    model = zoo.ZOO[name](num_classes=10, input_size=32)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == (14 if name == "mobilenet_v3_small" else 13)  # HardSwish: opset 14
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["output"]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 32, 32]
    assert model.SerializeToString() == zoo.ZOO[name](num_classes=10, input_size=32).SerializeToString()
    other = zoo.ZOO[name](num_classes=10, input_size=32, seed=1)
    assert model.SerializeToString() != other.SerializeToString()
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert all(v.dtype in (np.float32,) for v in inits.values())
    for node in model.graph.node:
        if node.op_type == "Conv":
            assert len(node.input) == 2 or name == "mobilenet_v3_small"  # its squeeze-excitation convs have biases
            w = inits[node.input[1]]
            fan_in = w[0].size
            assert abs(w.std() - np.sqrt(2 / fan_in)) < 0.5 * np.sqrt(2 / fan_in)  # He-normal scale
        if node.op_type == "BatchNormalization":
            scale, bias, mean, var = (inits[t] for t in node.input[1:])
            assert (var > 0).all() and var.std() > 0 and mean.std() > 0 and scale.std() > 0 and bias.std() > 0
        if node.op_type == "Clip":  # ReLU6 with initializer bounds (opset 13)
            assert [float(inits[t]) for t in node.input[1:]] == [0.0, 6.0]


def test_write_model(tmp_path):
    path = zoo.write_model("resnet18", tmp_path / "r.onnx", num_classes=4, input_size=32)
    assert path == str(tmp_path / "r.onnx")
    model = onnx.load(path)
    onnx.checker.check_model(model)
    assert from_onnx(path).shapes["output"] == (1, 4)
    with pytest.raises(TunerError, match="unknown model 'vgg16'; the zoo has mobilenet_v2, mobilenet_v3_small, pose, "
                       "resnet18, segmentation, sr_conv_transpose, sr_pixel_shuffle, ssdlite, style_transfer, unet, "
                       "yolo$"):
        zoo.write_model("vgg16", tmp_path / "v.onnx")


def test_test_models_are_small_valid_and_deterministic():
    models = zoo.test_models()
    again = zoo.test_models()
    for name, model in models.items():
        onnx.checker.check_model(model, full_check=True)
        assert [i.name for i in model.graph.input] == ["input"]
        assert model.SerializeToString() == again[name].SerializeToString()
        assert model.ByteSize() < 64 * 1024
    assert set(zoo.TEST_INPUT_SHAPES) <= set(models)
