"""Models built in code with ``onnx.helper`` (no downloads), with deterministic random weights.

- ``mobilenet_v3_small`` (opset 14: HardSwish, squeeze-excitation with HardSigmoid, Dropout in the classifier).
- ``mobilenet_v2`` and ``resnet18``: torchvision's architectures (opset 13, ReLU6 as Clip with initializer
  bounds, convs without bias as BatchNorm follows, dropout omitted), input ``input`` (1, 3, S, S), output
  ``output``. ``ZOO`` maps their names to the constructors; ``write_model`` saves one.
- ``test_models()``: small graphs, one per operator family plus a ``mixed`` one, covering every operator and
  attribute variant the frontend supports; the frontend and the compiled model are checked against
  onnxruntime on them. ``TEST_INPUT_SHAPES[name]`` is the ``input_shapes`` a model needs (symbolic dims).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tuner.errors import TunerError

from tuner.zoo.builder import MOBILENET_V2_SETTINGS, _Builder, _make_divisible  # noqa: F401 (zoo._Builder: tests)


def mobilenet_v2(num_classes: int = 1000, input_size: int = 224, width: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.input("input", (1, 3, input_size, input_size))
    cin = _make_divisible(32 * width)
    last = _make_divisible(1280 * max(1.0, width))
    x = b.relu6(b.bn(b.conv(x, 3, cin, 3, stride=2), cin))
    for t, c, n, s in MOBILENET_V2_SETTINGS:
        cout = _make_divisible(c * width)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = int(round(cin * t))
            y = x
            if t != 1:
                y = b.relu6(b.bn(b.conv(y, cin, hidden, 1), hidden))
            y = b.relu6(b.bn(b.conv(y, hidden, hidden, 3, stride=stride, groups=hidden), hidden))
            y = b.bn(b.conv(y, hidden, cout, 1), cout)
            x = b.node("Add", [x, y], "add") if stride == 1 and cin == cout else y
            cin = cout
    x = b.relu6(b.bn(b.conv(x, cin, last, 1), last))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "gap")], "flatten", axis=1)
    b.fc(x, last, num_classes, output="output")
    return b.model({"output": [1, num_classes]}, "mobilenet_v2")


def resnet18(num_classes: int = 1000, input_size: int = 224, seed: int = 0) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.input("input", (1, 3, input_size, input_size))
    x = b.node("Relu", [b.bn(b.conv(x, 3, 64, 7, stride=2), 64)], "relu")
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            identity = x
            if stride != 1 or cin != cout:  # torchvision's downsample: 1x1 conv (stride) + BN on the identity
                identity = b.bn(b.conv(x, cin, cout, 1, stride=stride), cout)
            y = b.node("Relu", [b.bn(b.conv(x, cin, cout, 3, stride=stride), cout)], "relu")
            y = b.bn(b.conv(y, cout, cout, 3), cout)
            x = b.node("Relu", [b.node("Add", [y, identity], "add")], "relu")
            cin = cout
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "gap")], "flatten", axis=1)
    b.fc(x, 512, num_classes, output="output")
    return b.model({"output": [1, num_classes]}, "resnet18")


# input_c, kernel, expanded_c, out_c, use_se, activation (RE: ReLU, HS: hardswish), stride
MOBILENET_V3_SMALL_SETTINGS = ((16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
                               (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
                               (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
                               (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
                               (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
                               (96, 5, 576, 96, True, "HS", 1))


def mobilenet_v3_small(num_classes: int = 1000, input_size: int = 224, width: float = 1.0,
                       seed: int = 0) -> onnx.ModelProto:
    """torchvision's MobileNetV3-Small as its exporter writes it (opset 14): HardSwish and ReLU activations,
    squeeze-excitation (global average pool -> 1x1 conv -> ReLU -> 1x1 conv -> HardSigmoid(1/6, 1/2) -> Mul
    of the gate and the block's activation), classifier Linear -> HardSwish -> Dropout -> Linear."""
    b = _Builder(seed, opset=14)

    def act(x: str, kind: str) -> str:
        return b.node("HardSwish", [x], "hswish") if kind == "HS" else b.node("Relu", [x], "relu")

    def adjust(c: int) -> int:
        return _make_divisible(c * width, 8)

    x = b.input("input", (1, 3, input_size, input_size))
    cin = adjust(16)
    x = act(b.bn(b.conv(x, 3, cin, 3, stride=2), cin), "HS")
    for _, k, exp, out, use_se, kind, stride in MOBILENET_V3_SMALL_SETTINGS:
        exp, out = adjust(exp), adjust(out)
        y = x
        if exp != cin:
            y = act(b.bn(b.conv(y, cin, exp, 1), exp), kind)
        y = act(b.bn(b.conv(y, exp, exp, k, stride=stride, groups=exp), exp), kind)
        if use_se:
            squeeze = _make_divisible(exp // 4, 8)
            s = b.node("GlobalAveragePool", [y], "se_pool")
            s = b.node("Relu", [b.conv(s, exp, squeeze, 1, bias=True)], "relu")
            s = b.node("HardSigmoid", [b.conv(s, squeeze, exp, 1, bias=True)], "hsigmoid", alpha=1 / 6, beta=0.5)
            y = b.node("Mul", [s, y], "se_scale")
        y = b.bn(b.conv(y, exp, out, 1), out)
        x = b.node("Add", [y, x], "add") if stride == 1 and cin == out else y
        cin = out
    last_conv, last = 6 * cin, _make_divisible(1024 * width, 8)
    x = act(b.bn(b.conv(x, cin, last_conv, 1), last_conv), "HS")
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x], "gap")], "flatten", axis=1)
    x = b.node("HardSwish", [b.fc(x, last_conv, last)], "hswish")
    x = b.node("Dropout", [x], "dropout")
    b.fc(x, last, num_classes, output="output")
    return b.model({"output": [1, num_classes]}, "mobilenet_v3_small")


ZOO = {"mobilenet_v2": mobilenet_v2, "mobilenet_v3_small": mobilenet_v3_small, "resnet18": resnet18}


def write_model(name: str, path, **kwargs) -> str:
    """Build zoo model ``name`` with ``kwargs`` and save it to ``path``; returns the path."""
    if name not in ZOO:
        raise TunerError(f"unknown model {name!r}; the zoo has {', '.join(sorted(ZOO))}")
    from tuner.files import write_file
    model = ZOO[name](**kwargs)
    write_file(path, lambda f: f.write(model.SerializeToString()), "-o")  # a link refused, /dev/null written through
    return os.fspath(path)


# -- small graphs covering every operator and attribute variant the frontend supports ---------------------------

def _conv_pads(b: _Builder) -> dict:
    """Explicit asymmetric pads, stride and dilation, a non-square kernel, a bias, odd channel counts."""
    x = b.input("input", (1, 3, 11, 13))
    x = b.conv(x, 3, 5, 3, bias=True, strides=[2, 1], dilations=[2, 2], pads=[1, 0, 2, 1])
    x = b.conv(x, 5, 6, (3, 2), bias=True, strides=[1, 2], pads=[0, 1, 1, 0])
    return {b.conv(x, 6, 7, 1): None}


def _conv_auto_pad(b: _Builder) -> dict:
    """SAME_UPPER / SAME_LOWER with strides or even kernels that make the padding asymmetric, VALID."""
    x = b.input("input", (1, 4, 10, 9))
    x = b.conv(x, 4, 6, 3, stride=2, auto_pad="SAME_UPPER")
    x = b.conv(x, 6, 5, 4, stride=2, auto_pad="SAME_LOWER")
    x = b.conv(x, 5, 8, 2, auto_pad="SAME_UPPER", bias=True)
    x = b.conv(x, 8, 3, 2, auto_pad="SAME_LOWER")
    return {b.conv(x, 3, 4, 2, auto_pad="VALID"): None}


def _depthwise(b: _Builder) -> dict:
    x = b.input("input", (1, 6, 9, 9))
    x = b.conv(x, 6, 6, 3, stride=2, groups=6, bias=True)
    x = b.conv(x, 6, 6, 5, groups=6, pads=[2, 1, 2, 3])
    return {b.node("Relu", [x]): None}


def _grouped(b: _Builder) -> dict:
    """Grouped convolutions as ResNeXt (groups of 4 channels) and RegNet (groups of 8) use them, with a stride,
    a bias, a residual add and a ReLU fused."""
    x = b.input("input", (1, 16, 9, 9))
    y = b.conv(x, 16, 16, 3, groups=4, bias=True, pads=[1, 1, 1, 1])
    y = b.node("Relu", [b.node("Add", [y, x])])
    y = b.conv(y, 16, 32, 3, stride=2, groups=2, pads=[1, 1, 1, 1])
    return {b.conv(y, 32, 24, 1, groups=4, bias=True): None}


def _gemm(b: _Builder) -> dict:
    """alpha/beta folding, transB 0 and 1, C of shape (M,), (1, M), a scalar, and no C."""
    r = b.rng
    x = b.input("input", (2, 16))
    x = b.node("Gemm", [x, b.const("B", r.normal(0, 0.3, (16, 12))), b.const("C", r.normal(0, 1, 12))],
               alpha=0.5, beta=2.0)
    x = b.node("Gemm", [x, b.const("B", r.normal(0, 0.3, (7, 12))), b.const("C", r.normal(0, 1, (1, 7)))],
               alpha=1.5, transB=1)
    x = b.node("Gemm", [x, b.const("B", r.normal(0, 0.3, (7, 9)))])
    return {b.node("Gemm", [x, b.const("B", r.normal(0, 0.3, (5, 9))), b.const("C", np.float32(0.25))],
                   transB=1, beta=-1.0): None}


def _matmul(b: _Builder) -> dict:
    """MatMul with a constant right operand, plus the exporters' bias Add of a (M,) or (1, M) constant."""
    r = b.rng
    x = b.input("input", (3, 8))
    x = b.node("MatMul", [x, b.const("B", r.normal(0, 0.4, (8, 6)))])
    x = b.node("Add", [x, b.const("bias", r.normal(0, 1, 6))])
    x = b.node("MatMul", [b.node("Relu", [x]), b.const("B", r.normal(0, 0.4, (6, 4)))])
    return {b.node("Add", [b.const("bias", r.normal(0, 1, (1, 4))), x]): None}


def _batch_norm(b: _Builder) -> dict:
    x = b.input("input", (1, 5, 7, 7))
    x = b.node("Relu", [b.bn(x, 5, epsilon=1e-3)])
    return {b.bn(b.conv(x, 5, 7, 3), 7): None}


def _clip(b: _Builder) -> dict:
    """Clip-13: both bounds, max only (min given as an empty name), min only (max omitted)."""
    x = b.input("input", (1, 4, 6, 6))
    both = b.node("Clip", [x, b.const("lo", np.float32(-0.5)), b.const("hi", np.float32(0.7))])
    max_only = b.node("Clip", [x, "", b.const("hi", np.float32(0.3))])
    min_only = b.node("Clip", [x, b.const("lo", np.float32(-0.2))])
    return {b.node("Add", [b.node("Add", [both, max_only]), min_only]): None}


def _clip_attrs(b: _Builder) -> dict:
    """Clip-6 (bounds as attributes; opsets 6 to 10) in an opset-10 model: both / max only / min only."""
    x = b.input("input", (1, 4, 6, 6))
    x = b.node("Clip", [x], min=-0.5, max=0.5)
    x = b.node("Clip", [x], max=0.2)
    return {b.node("Clip", [x], min=-0.1): None}


def _add(b: _Builder) -> dict:
    """Two activations; activation + constants of shape (C, 1, 1), (1, C, 1, 1) (first operand), scalar, (1,)."""
    r = b.rng
    x = b.input("input", (1, 5, 6, 6))
    x = b.node("Add", [b.conv(x, 5, 5, 3), b.node("Relu", [x])])
    x = b.node("Add", [x, b.const("c", r.normal(0, 1, (5, 1, 1)))])
    x = b.node("Add", [b.const("c", r.normal(0, 1, (1, 5, 1, 1))), x])
    x = b.node("Add", [x, b.const("c", np.float32(0.5))])
    return {b.node("Add", [x, b.const("c", np.array([-1.5], np.float32))]): None}


def _global_avg_pool(b: _Builder) -> dict:
    """GlobalAveragePool, Flatten on NCHW, then Flatten on (N, C) (a no-op the frontend removes)."""
    x = b.input("input", (2, 7, 5, 6))
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return {b.node("Flatten", [x], axis=-1): None}


def _norms(b: _Builder) -> dict:
    """InstanceNormalization and GroupNormalization (1 group, groups of 4 channels, groups of 2 that share
    blocks) over 48x48 maps, long enough that the reduction templates' fallbacks split them (a statistics and
    an apply kernel), then a global average pool."""
    r = b.rng
    x = b.input("input", (1, 3, 48, 48))
    x = b.conv(x, 3, 8, 3)
    x = b.node("InstanceNormalization", [x, b.const("s", r.normal(1, 0.2, 8)), b.const("b", r.normal(0, 0.2, 8))],
               epsilon=1e-5)
    x = b.node("Relu", [x])
    x = b.node("GroupNormalization", [x, b.const("s", r.normal(1, 0.2, 8)), b.const("b", r.normal(0, 0.2, 8))],
               num_groups=1, epsilon=1e-5)
    x = b.conv(x, 8, 16, 1)
    x = b.node("GroupNormalization", [x, b.const("s", r.normal(1, 0.2, 16)), b.const("b", r.normal(0, 0.2, 16))],
               num_groups=4, epsilon=1e-5)
    x = b.node("GroupNormalization", [x, b.const("s", r.normal(1, 0.2, 16)), b.const("b", r.normal(0, 0.2, 16))],
               num_groups=8, epsilon=1e-5)  # 2 channels a group: groups share blocks
    return {b.node("GlobalAveragePool", [x]): (1, 16, 1, 1)}  # ONNX infers no shape through GroupNormalization


def _poolformer_block(b: _Builder) -> dict:
    """PoolFormer's block (timm): GroupNorm(1), the pooling token mixer x + ls1 * (pool(y) - y), GroupNorm(1), the
    1x1 MLP, x + ls2 * mlp(z); 6 channels (not whole RGBA pixels)."""
    r = b.rng
    c = 6
    x = b.input("input", (1, c, 7, 6))
    gn = lambda t: b.node("GroupNormalization", [t, b.const("s", r.normal(1, 0.2, c)),  # noqa: E731
                                                  b.const("b", r.normal(0, 0.2, c))], num_groups=1, epsilon=1e-5)
    ls = lambda: b.const("ls", r.uniform(0.5, 1.5, (c, 1, 1)))  # noqa: E731
    y = gn(x)
    p = b.node("AveragePool", [y], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)
    x = b.node("Add", [x, b.node("Mul", [ls(), b.node("Sub", [p, y])])])
    h = b.node("Relu", [b.conv(gn(x), c, 4 * c, 1, bias=True)])
    return {b.node("Add", [x, b.node("Mul", [b.conv(h, 4 * c, c, 1, bias=True), ls()])]): (1, c, 7, 6)}


def _avg_pool(b: _Builder) -> dict:
    """count_include_pad 1 and 0 with asymmetric pads, strides, SAME_UPPER, a non-square window."""
    x = b.input("input", (1, 3, 9, 8))
    x = b.node("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 0, 0, 1], count_include_pad=1)
    x = b.node("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 1, 1, 0])
    x = b.node("AveragePool", [x], kernel_shape=[3, 2], strides=[1, 2], pads=[1, 1, 1, 1], count_include_pad=0)
    return {b.node("AveragePool", [x], kernel_shape=[2, 2], auto_pad="SAME_UPPER"): None}


def _max_pool(b: _Builder) -> dict:
    """Pads (which never win, even over negative inputs), asymmetric pads, strides, a non-square window."""
    x = b.input("input", (1, 4, 10, 10))
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], pads=[0, 0, 1, 1])
    return {b.node("MaxPool", [x], kernel_shape=[3, 2], strides=[1, 2]): None}


def _reshape(b: _Builder) -> dict:
    """Reshape with 0 and -1 from a Constant node and from an initializer, and Flatten."""
    x = b.input("input", (2, 4, 3, 5))
    shape = b.node("Constant", [], value=numpy_helper.from_array(np.array([0, 2, -1, 5], np.int64)))
    x = b.node("Relu", [b.node("Reshape", [x, shape])])
    x = b.node("Flatten", [x], axis=1)
    return {b.node("Reshape", [x, b.const("shape", np.array([0, -1, 1, 1], np.int64))]): None}


def _concat(b: _Builder) -> dict:
    """Concat of 3 inputs with odd channel counts (one the graph input), then axis=-3."""
    x = b.input("input", (1, 3, 8, 8))
    a, c = b.conv(x, 3, 5, 3), b.conv(x, 3, 7, 1)
    y = b.node("Concat", [x, a, c], axis=1)
    y = b.conv(y, 15, 9, 3, bias=True)
    return {b.node("Concat", [y, a], axis=-3): None}


def _symbolic_batch(b: _Builder) -> dict:
    """A batch dim "N": needs input_shapes (TEST_INPUT_SHAPES)."""
    b.inputs.append(helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8]))
    x = b.node("Relu", [b.conv("input", 3, 4, 3)])
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return {b.fc(x, 4, 5): None}


def _identity_dropout(b: _Builder) -> dict:
    """Identity and Dropout (with an unused mask) pass through; two outputs, one produced through an Identity."""
    x = b.input("input", (1, 4, 5, 5))
    x = b.node("Relu", [b.node("Identity", [x])])
    mask = b.name("mask")
    y = b.name("dropout")
    b.nodes.append(helper.make_node("Dropout", [x], [y, mask], name=y))
    z = b.conv(y, 4, 3, 3, bias=True)
    return {b.node("Identity", [z], output="output"): None, b.node("Clip", [y, b.const("zero", np.float32(0))]): None}


def _mixed(b: _Builder) -> dict:
    """A MobileNet-like block with a residual, parallel max/avg pools concatenated, and a classifier."""
    x = b.input("input", (1, 3, 16, 16))
    x = b.relu6(b.bn(b.conv(x, 3, 8, 3, stride=2), 8))
    y = b.relu6(b.bn(b.conv(x, 8, 8, 3, groups=8), 8))
    x = b.node("Add", [x, b.bn(b.conv(y, 8, 8, 1), 8)])
    pools = [b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    x = b.node("Relu", [b.node("Concat", pools, axis=1)])
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return {b.fc(x, 16, 10, output="output"): [1, 10]}


def _activations(b: _Builder) -> dict:
    """Every unary activation (opset 14 for HardSwish), after convolutions (fused) and on their own, odd channels;
    PRelu per channel and with one slope; Erf on its own; Sigmoid on a 2-D (N, K) tensor."""
    r = b.rng
    x = b.input("input", (1, 5, 6, 6))
    x = b.node("HardSwish", [b.conv(x, 5, 7, 3, bias=True)])
    x = b.node("HardSigmoid", [x], alpha=0.3, beta=0.4)
    x = b.node("LeakyRelu", [b.conv(x, 7, 5, 1)], alpha=0.2)
    x = b.node("Elu", [x], alpha=0.7)
    x = b.node("Tanh", [b.conv(x, 5, 6, 3)])
    x = b.node("PRelu", [b.conv(x, 6, 6, 1), b.const("slope", r.uniform(0.05, 0.5, (6, 1, 1)))])
    x = b.node("PRelu", [x, b.const("slope", np.array([0.25], np.float32))])
    x = b.node("Sigmoid", [b.node("Erf", [x])])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [b.node("Relu", [x])])], axis=1)
    return {x: None, b.node("Sigmoid", [b.fc(y, 6, 5)]): None}


def _binary(b: _Builder) -> dict:
    """Sub / Mul / Div with constants on either side (scalar, per channel), two activations, and an (N, C, 1, 1)
    activation broadcast over H, W on either side (Add, Sub, Div); batch 2, odd channels."""
    r = b.rng
    x = b.input("input", (2, 5, 4, 6))
    x = b.node("Sub", [x, b.const("c", r.normal(0, 1, (5, 1, 1)))])
    x = b.node("Div", [b.node("Mul", [b.const("c", np.float32(1.5)), x]), b.const("c", np.float32(-2.0))])
    x = b.node("Sub", [b.const("c", r.normal(0, 1, (1, 5, 1, 1))), x])
    x = b.node("Div", [b.const("c", np.float32(1.0)), b.node("Add", [b.node("Relu", [x]), b.const("c", 1.0)])])
    g = b.node("GlobalAveragePool", [x])
    y = b.node("Mul", [b.conv(x, 5, 5, 3), x])
    y = b.node("Sub", [y, b.node("Div", [y, b.node("Add", [g, b.const("c", np.float32(2.0))])])])
    y = b.node("Add", [g, b.node("Sub", [g, y])])
    return {b.node("Relu", [y]): None}


def _squeeze_excitation(b: _Builder) -> dict:
    """MobileNetV3 / EfficientNet blocks: x * sigmoid(x) (SiLU), squeeze-excitation with a ReLU / SiLU squeeze and
    a Sigmoid / HardSigmoid gate multiplied in (gate first, as torchvision exports it), and the erf GELU both
    ways its 0.5 associates."""
    x = b.input("input", (1, 6, 7, 7))
    x = b.conv(x, 6, 12, 3, bias=True)
    x = b.node("Mul", [x, b.node("Sigmoid", [x])])
    s = b.node("Relu", [b.conv(b.node("GlobalAveragePool", [x]), 12, 4, 1, bias=True)])
    s = b.node("HardSigmoid", [b.conv(s, 4, 12, 1, bias=True)], alpha=1 / 6, beta=0.5)
    x = b.node("Mul", [s, x])
    x = b.conv(x, 12, 9, 1)
    s = b.conv(b.node("ReduceMean", [x], axes=[2, 3], keepdims=1), 9, 3, 1, bias=True)
    s = b.node("Mul", [b.node("Sigmoid", [s]), s])
    x = b.node("Mul", [x, b.node("Sigmoid", [b.conv(s, 3, 9, 1, bias=True)])])
    x = b.conv(x, 9, 5, 3)
    e = b.node("Erf", [b.node("Div", [x, b.const("c", np.float32(np.sqrt(2)))])])
    x = b.node("Mul", [b.node("Mul", [x, b.node("Add", [e, b.const("c", np.float32(1))])]),
                       b.const("c", np.float32(0.5))])
    x = b.conv(x, 5, 5, 1)
    e = b.node("Erf", [b.node("Div", [x, b.const("c", np.float32(np.sqrt(2)))])])
    return {b.node("Mul", [b.node("Mul", [x, b.const("c", np.float32(0.5))]),
                           b.node("Add", [b.const("c", np.float32(1)), e])]): None}


def _reduce(b: _Builder) -> dict:
    """ReduceMean / ReduceMax over H, W (axes as attribute, opset 13; negative axes) with keepdims 1 and 0,
    GlobalMaxPool."""
    x = b.input("input", (2, 7, 5, 6))
    m = b.node("ReduceMean", [x], axes=[2, 3], keepdims=0)
    k = b.node("ReduceMax", [x], axes=[-1, -2])
    g = b.node("Add", [b.node("GlobalMaxPool", [x]), k])
    return {m: None, b.node("ReduceMax", [g], axes=[2, 3], keepdims=0): None}


def _reduce_axes_input(b: _Builder) -> dict:
    """Opset 18: the axes of ReduceMean / ReduceMax are an input."""
    x = b.input("input", (1, 5, 4, 4))
    y = b.node("ReduceMean", [x, b.const("axes", np.array([2, 3], np.int64))], keepdims=0)
    return {y: None, b.node("ReduceMax", [x, b.const("axes", np.array([-2, -1], np.int64))]): None}


def _softmax(b: _Builder) -> dict:
    """Softmax over the channels of NCHW (axis 1, odd channels) and of (N, C) (default axis -1)."""
    x = b.input("input", (2, 7, 3, 4))
    y = b.node("Softmax", [b.conv(x, 7, 6, 1)], axis=1)
    z = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return {b.node("Softmax", [y], axis=1): None, b.node("Softmax", [b.fc(z, 7, 5)]): None}


def _pool_ceil(b: _Builder) -> dict:
    """ceil_mode=1 as GoogLeNet / SqueezeNet use it: MaxPool 3x3 s2 with a last partial window, AveragePool
    with count_include_pad 1 and 0 and pads."""
    x = b.input("input", (1, 5, 10, 9))
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    a = b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
               count_include_pad=1)
    c = b.node("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 1, 0, 1], ceil_mode=1)
    return {a: None, c: None}


def _shape_subgraph(b: _Builder) -> dict:
    """A shape subgraph folded at conversion: Shape -> Gather / Slice / Squeeze / Unsqueeze / Cast / Div / Floor /
    Ceil / Mul / Sub / Concat -> a Reshape target; ConstantOfShape, Range and a Reshape of constants -> per-channel
    constants of a Mul and an Add."""
    x = b.input("input", (1, 4, 6, 6))
    s = b.node("Shape", [x])
    n = b.node("Gather", [s, b.const("i", np.array(0, np.int64))], axis=0)
    c = b.node("Gather", [s, b.const("i", np.array(1, np.int64))], axis=0)
    hw = b.node("Slice", [s, b.const("i", np.array([2], np.int64)), b.const("i", np.array([4], np.int64))])
    h = b.node("Squeeze", [b.node("Slice", [hw, b.const("i", np.array([0], np.int64)),
                                            b.const("i", np.array([1], np.int64))]),
                           b.const("i", np.array([0], np.int64))])
    half = b.node("Cast", [b.node("Floor", [b.node("Div", [b.node("Cast", [h], to=TensorProto.FLOAT),
                                                          b.const("f", np.float32(2))])])], to=TensorProto.INT64)
    twice = b.node("Mul", [c, b.const("i", np.array(2, np.int64))])
    w = b.node("Cast", [b.node("Ceil", [b.node("Cast", [b.node("Gather", [hw, b.const("i", np.array(1, np.int64))],
                                                                 axis=0)], to=TensorProto.FLOAT)])],
               to=TensorProto.INT64)
    w = b.node("Sub", [b.node("Add", [w, b.const("i", np.array(1, np.int64))]), b.const("i", np.array(1, np.int64))])
    unsq = [b.node("Unsqueeze", [t, b.const("axes", np.array([0], np.int64))]) for t in (n, twice, half, w)]
    y = b.node("Reshape", [b.node("Relu", [x]), b.node("Concat", unsq, axis=0)])
    c8 = b.node("Unsqueeze", [twice, b.const("axes", np.array([0], np.int64))])
    ones = b.node("ConstantOfShape", [c8], value=numpy_helper.from_array(np.array([1.5], np.float32)))
    scale = b.node("Reshape", [ones, b.const("shape", np.array([-1, 1, 1], np.int64))])
    ramp = b.node("Cast", [b.node("Range", [b.const("i", np.array(0, np.int64)), twice,
                                            b.const("i", np.array(1, np.int64))])], to=TensorProto.FLOAT)
    shift = b.node("Unsqueeze", [ramp, b.const("axes", np.array([1, 2], np.int64))])
    return {b.node("Add", [b.node("Mul", [y, scale]), shift]): [1, 8, 3, 6]}


_TEST_MODELS = {
    "conv_pads": _conv_pads, "conv_auto_pad": _conv_auto_pad, "depthwise": _depthwise, "grouped": _grouped,
    "gemm": _gemm,
    "matmul": _matmul, "batch_norm": _batch_norm, "clip": _clip, "clip_attrs": _clip_attrs, "add": _add,
    "global_avg_pool": _global_avg_pool, "avg_pool": _avg_pool, "max_pool": _max_pool, "reshape": _reshape,
    "concat": _concat, "symbolic_batch": _symbolic_batch, "identity_dropout": _identity_dropout, "mixed": _mixed,
    "activations": _activations, "binary": _binary, "squeeze_excitation": _squeeze_excitation, "reduce": _reduce,
    "reduce_axes_input": _reduce_axes_input, "softmax": _softmax, "pool_ceil": _pool_ceil,
    "shape_subgraph": _shape_subgraph, "norms": _norms, "poolformer_block": _poolformer_block,
}
_OPSETS = {"clip_attrs": 10, "activations": 14, "reduce_axes_input": 18, "norms": 21, "poolformer_block": 21}
TEST_INPUT_SHAPES = {"symbolic_batch": {"input": (2, 3, 8, 8)}}


def _merge_families() -> None:
    import tuner.zoo.movement as zoo_movement
    _TEST_MODELS.update(zoo_movement.TEST_MODELS)
    _OPSETS.update(zoo_movement.OPSETS)
    TEST_INPUT_SHAPES.update(zoo_movement.INPUT_SHAPES)
    import tuner.zoo.tasks as zoo_tasks  # the per-task models: small versions tested, full sizes in the zoo
    _TEST_MODELS.update(zoo_tasks.TEST_MODELS)
    _OPSETS.update(zoo_tasks.OPSETS)
    TEST_INPUT_SHAPES.update(zoo_tasks.INPUT_SHAPES)
    ZOO.update(zoo_tasks.ZOO)


_merge_families()


def test_models(seed: int = 0) -> dict:
    """``{name: onnx.ModelProto}``: small graphs, one per operator family plus ``mixed``; every model has one
    input ``input`` (``TEST_INPUT_SHAPES[name]`` gives the input_shapes those with symbolic dims need)."""
    models = {}
    for name, build in _TEST_MODELS.items():
        b = _Builder(seed, _OPSETS.get(name, 13))
        models[name] = b.model(build(b), name)
    return models
