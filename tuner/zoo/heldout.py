"""Held-out models (issue 55): the zoo's blocks in combinations nobody hand-tuned the glue for, as PyTorch's
exporter writes them at opset 17 (GroupNorm as GroupNormalization at opset 21 where torch 2.4+ writes it,
LayerNorm over channels as permute / LayerNormalization / permute, SiLU as ``x * Sigmoid(x)``). Small sizes:
each compiles and runs in a few seconds on a CPU device, for the suite's generality check
(tests/test_glue_heldout.py) and bench/glue_heldout.py.

- ``mobilevit_like``: MobileNetV2 stem, then MobileViTv2's linear-attention block on the map: GroupNorm(1),
  a 1x1 conv to (1 + 2d) channels split into the query, keys and values, a softmax of the query over the
  pixels, the context vector (keys weighted by it, summed over the pixels), ReLU(values) times the context,
  a 1x1 projection and a residual; then GroupNorm(1) and a 1x1 SiLU FFN with a residual.
- ``edgenext_like``: a 4x4 stride-4 stem with LayerNorm over channels (permutes), a ConvNeXt block with a 5x5
  depthwise conv, and EdgeNeXt's SDTA split: channels chunked, cascaded depthwise 3x3s, concatenated, then
  LayerNorm over channels, a pointwise MLP (GELU), layer scale and a residual.
- ``prelu_net``: PReLU (one slope a channel) after plain, 1x1, depthwise and residual convolutions, a
  HardSwish, a Clip and a per-channel Mul / Add: the elementwise ops that fold into their producers.
- ``unet_gn``: a diffusion-style U-Net level: GroupNorm(4) + SiLU convolutions, MaxPool down, nearest Resize up,
  a skip Concat, and a 1x1 head.
- ``se_net``: EfficientNet's MBConv (1x1 expand, depthwise, squeeze-excite with SiLU / Sigmoid, 1x1 project,
  residual) and MobileNetV3's (ReLU squeeze, HardSigmoid gate, HardSwish).
"""
from __future__ import annotations

import numpy as np

from tuner.zoo.builder import _Builder

OPSET = 17
GN_OPSET = 21  # GroupNormalization (torch >= 2.4 exports it at opset 18+; 21 is the one with per-channel affine)


def _gn(b: _Builder, x: str, c: int, groups: int) -> str:
    r = b.rng
    return b.node("GroupNormalization", [x, b.const("gn_s", r.normal(1, 0.2, c)), b.const("gn_b", r.normal(0, 0.2, c))],
                  "gn", num_groups=groups, epsilon=1e-5)


def _ln_channels(b: _Builder, x: str, c: int) -> str:
    """timm's LayerNorm2d as exported: permute to NHWC, LayerNormalization over the last axis, permute back."""
    r = b.rng
    t = b.node("Transpose", [x], "to_nhwc", perm=[0, 2, 3, 1])
    t = b.node("LayerNormalization", [t, b.const("ln_s", r.uniform(0.5, 1.5, c)), b.const("ln_b", r.normal(0, 0.2, c))],
               "ln", axis=-1, epsilon=1e-6)
    return b.node("Transpose", [t], "to_nchw", perm=[0, 3, 1, 2])


def _silu(b: _Builder, x: str) -> str:
    return b.node("Mul", [x, b.node("Sigmoid", [x], "sigmoid")], "silu")


def _cbs(b: _Builder, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> str:
    return _silu(b, b.bn(b.conv(x, cin, cout, k, stride=stride, groups=groups), cout))


def _gelu(b: _Builder, x: str) -> str:
    e = b.node("Erf", [b.node("Div", [x, b.const("sqrt2", np.float32(np.sqrt(2)))], "div")], "erf")
    return b.node("Mul", [b.node("Mul", [x, b.const("half", np.float32(0.5))], "mul"),
                          b.node("Add", [e, b.const("one", np.float32(1))], "add")], "gelu")


def _mobilevit_like(b: _Builder) -> dict:
    d = 16
    x = b.input("input", (1, 3, 32, 32))
    x = _cbs(b, x, 3, 8, 3, stride=2)
    x = _cbs(b, _cbs(b, x, 8, 32, 1), 32, 32, 3, stride=2, groups=32)
    x = b.bn(b.conv(x, 32, d, 1), d)  # 8x8 map, d channels
    for _ in range(2):  # two linear-attention blocks
        y = b.conv(_gn(b, x, d, 1), d, 1 + 2 * d, 1, bias=True)
        q, k, v = (b.node("Slice", [y, b.const("st", np.array([lo], np.int64)), b.const("en", np.array([hi], np.int64)),
                                    b.const("ax", np.array([1], np.int64))], "slice")
                   for lo, hi in ((0, 1), (1, 1 + d), (1 + d, 1 + 2 * d)))
        score = b.node("Softmax", [b.node("Reshape", [q, b.const("shape", np.array([1, 1, 64], np.int64))])],
                       "softmax", axis=-1)
        score = b.node("Reshape", [score, b.const("shape", np.array([1, 1, 8, 8], np.int64))])
        ctx = b.node("ReduceSum", [b.node("Mul", [k, score], "mul"), b.const("axes", np.array([2, 3], np.int64))],
                     "reducesum", keepdims=1)
        att = b.node("Mul", [b.node("Relu", [v], "relu"), ctx], "mul")
        x = b.node("Add", [x, b.conv(att, d, d, 1, bias=True)], "add")
        h = _silu(b, b.conv(_gn(b, x, d, 1), d, 2 * d, 1, bias=True))
        x = b.node("Add", [x, b.conv(h, 2 * d, d, 1, bias=True)], "add")
    x = b.node("GlobalAveragePool", [x])
    b.fc(b.node("Flatten", [x], axis=1), d, 10, output="output")
    return {"output": [1, 10]}


def _edgenext_like(b: _Builder) -> dict:
    r, c = b.rng, 16
    x = b.input("input", (1, 3, 32, 32))
    x = _ln_channels(b, b.conv(x, 3, c, 4, stride=4, bias=True, pads=[0, 0, 0, 0]), c)  # 8x8
    # ConvNeXt-style encoder: dw 5x5, LayerNorm over channels, pointwise MLP (Linear as MatMul on NHWC), scale
    y = b.conv(x, c, c, 5, groups=c, bias=True)
    t = b.node("Transpose", [y], perm=[0, 2, 3, 1])
    t = b.node("LayerNormalization", [t, b.const("ln_s", r.uniform(0.5, 1.5, c)), b.const("ln_b", r.normal(0, 0.2, c))],
               "ln", axis=-1, epsilon=1e-6)
    t = b.node("Add", [b.node("MatMul", [t, b.const("w1", r.normal(0, 0.3, (c, 4 * c)))]),
                       b.const("b1", r.normal(0, 0.1, 4 * c))])
    t = b.node("Add", [b.node("MatMul", [_gelu(b, t), b.const("w2", r.normal(0, 0.3, (4 * c, c)))]),
                       b.const("b2", r.normal(0, 0.1, c))])
    t = b.node("Mul", [t, b.const("gamma", r.uniform(0.5, 1.5, c))])
    x = b.node("Add", [x, b.node("Transpose", [t], perm=[0, 3, 1, 2])])
    # SDTA's Res2Net-like split: 4 chunks, each chunk after the first adds the previous one's output, dw 3x3
    parts = b.node("Split", [x, b.const("split", np.array([4] * 4, np.int64))], "split", axis=1)
    b.nodes[-1].output[:] = [f"{parts}_{i}" for i in range(4)]
    chunks = [f"{parts}_{i}" for i in range(4)]
    outs, prev = [], None
    for i, ch in enumerate(chunks):
        if i == 0:
            outs.append(ch)
            continue
        inp = ch if prev is None else b.node("Add", [ch, prev], "add")
        prev = b.conv(inp, 4, 4, 3, groups=4, bias=True)
        outs.append(prev)
    y = _ln_channels(b, b.node("Concat", outs, "concat", axis=1), c)
    y = b.conv(_gelu(b, b.conv(y, c, 2 * c, 1, bias=True)), 2 * c, c, 1, bias=True)
    y = b.node("Mul", [y, b.const("gamma", r.uniform(0.5, 1.5, (c, 1, 1)))])
    x = b.node("Add", [x, y])
    x = b.node("GlobalAveragePool", [x])
    b.fc(b.node("Flatten", [x], axis=1), c, 10, output="output")
    return {"output": [1, 10]}


def _prelu_net(b: _Builder) -> dict:
    r = b.rng
    x = b.input("input", (1, 3, 24, 24))

    def prelu(t, c):
        return b.node("PRelu", [t, b.const("slope", r.uniform(0.1, 0.3, (c, 1, 1)))], "prelu")
    x = prelu(b.conv(x, 3, 16, 5, bias=True), 16)
    y = prelu(b.conv(x, 16, 8, 1, bias=True), 8)
    y = prelu(b.conv(y, 8, 8, 3, groups=8, bias=True), 8)
    y = b.conv(y, 8, 16, 1, bias=True)
    x = prelu(b.node("Add", [x, y], "add"), 16)
    x = b.node("HardSwish", [b.conv(x, 16, 16, 3, stride=2, bias=True)], "hardswish")
    x = b.node("Add", [b.node("Mul", [b.conv(x, 16, 12, 3), b.const("scale", r.uniform(0.5, 1.5, (12, 1, 1)))]),
                       b.const("shift", r.normal(0, 0.2, (12, 1, 1)))])
    x = b.relu6(x)
    x = prelu(b.conv(x, 12, 12, 3, bias=True), 12)
    b.node("Identity", [x], output="output")
    return {"output": [1, 12, 12, 12]}


def _unet_gn(b: _Builder) -> dict:
    x = b.input("input", (1, 3, 24, 24))

    def block(t, cin, cout):
        t = _silu(b, _gn(b, b.conv(t, cin, cout, 3, bias=True), cout, 4))
        return _silu(b, _gn(b, b.conv(t, cout, cout, 3, bias=True), cout, 4))
    s1 = block(x, 3, 8)
    s2 = block(b.node("MaxPool", [s1], kernel_shape=[2, 2], strides=[2, 2]), 8, 16)
    m = block(b.node("MaxPool", [s2], kernel_shape=[2, 2], strides=[2, 2]), 16, 16)

    def up(t):
        return b.node("Resize", [t, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], "upsample",
                      mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    y = block(b.node("Concat", [s2, up(m)], axis=1), 32, 16)
    y = block(b.node("Concat", [s1, up(y)], axis=1), 24, 8)
    b.conv(y, 8, 2, 1, bias=True, output="output")
    return {"output": [1, 2, 24, 24]}


def _se(b: _Builder, x: str, c: int, s: int, squeeze: str, gate: str) -> str:
    p = b.node("GlobalAveragePool", [x])
    q = b.conv(p, c, s, 1, bias=True)
    q = _silu(b, q) if squeeze == "silu" else b.node("Relu", [q])
    g = b.conv(q, s, c, 1, bias=True)
    g = b.node("Sigmoid", [g]) if gate == "sigmoid" else b.node("HardSigmoid", [g], alpha=1 / 6, beta=0.5)
    return b.node("Mul", [x, g])


def _se_net(b: _Builder) -> dict:
    x = b.input("input", (1, 3, 32, 32))
    x = _cbs(b, x, 3, 16, 3, stride=2)  # 16x16
    for cin, cout, stride in ((16, 16, 1), (16, 24, 2)):  # EfficientNet MBConv6
        y = _cbs(b, x, cin, 6 * cin, 1)
        y = _cbs(b, y, 6 * cin, 6 * cin, 3, stride=stride, groups=6 * cin)
        y = b.bn(b.conv(_se(b, y, 6 * cin, cin // 4, "silu", "sigmoid"), 6 * cin, cout, 1), cout)
        x = b.node("Add", [x, y]) if stride == 1 and cin == cout else y
    # MobileNetV3: ReLU squeeze, HardSigmoid gate, HardSwish
    y = b.node("HardSwish", [b.bn(b.conv(x, 24, 72, 1), 72)])
    y = b.node("HardSwish", [b.bn(b.conv(y, 72, 72, 5, groups=72), 72)])
    y = b.bn(b.conv(_se(b, y, 72, 24, "relu", "hardsigmoid"), 72, 24, 1), 24)
    x = b.node("Add", [x, y])
    x = b.node("GlobalAveragePool", [x])
    b.fc(b.node("Flatten", [x], axis=1), 24, 10, output="output")
    return {"output": [1, 10]}


def _convnextv2_block(b: _Builder, x: str, c: int) -> str:
    """timm's ConvNeXtV2 block with its MLP as 1x1 convolutions (Atto to Nano: ``conv_mlp``) as exported: a
    depthwise 7x7, a LayerNorm over channels, a 1x1 convolution to 4c, GELU, the global response norm (the L2 norm
    of each channel's map, divided by its mean over the channels; ``gamma * (x * N) + beta + x``), a 1x1
    convolution back, and the residual."""
    r = b.rng
    y = _gelu(b, b.conv(_ln_channels(b, b.conv(x, c, c, 7, groups=c, bias=True), c), c, 4 * c, 1, bias=True))
    g = b.node("ReduceL2", [y], axes=[2, 3], keepdims=1)
    n = b.node("Div", [g, b.node("Add", [b.node("ReduceMean", [g], axes=[1], keepdims=1),
                                         b.const("eps", np.float32(1e-6))])])
    y = b.node("Add", [b.node("Add", [b.const("grn_b", r.normal(0, 0.2, (1, 4 * c, 1, 1))),
                                      b.node("Mul", [b.const("grn_g", r.normal(0, 0.5, (1, 4 * c, 1, 1))),
                                                     b.node("Mul", [y, n])])]), y])
    return b.node("Add", [x, b.conv(y, 4 * c, c, 1, bias=True)])


def _convnextv2_like(b: _Builder) -> dict:
    """ConvNeXtV2's stages at test size: a 4x4 stem of stride 4 and a LayerNorm over channels, a block, the
    downsampling LayerNorm then 2x2 convolution of stride 2, a block, and timm's head (pool, LayerNorm over the
    pooled channels, Flatten, Linear)."""
    x = b.input("input", (1, 3, 32, 32))
    x = _ln_channels(b, b.conv(x, 3, 16, 4, stride=4, bias=True, pads=[0, 0, 0, 0]), 16)  # 8x8
    x = _convnextv2_block(b, x, 16)
    x = b.conv(_ln_channels(b, x, 16), 16, 32, 2, stride=2, bias=True, pads=[0, 0, 0, 0])  # 4x4
    x = _convnextv2_block(b, x, 32)
    x = _ln_channels(b, b.node("GlobalAveragePool", [x]), 32)
    b.fc(b.node("Flatten", [x], axis=1), 32, 10, output="output")
    return {"output": [1, 10]}


# torchvision's EfficientNet-B0: (expand ratio, kernel, stride, input channels, output channels, layers)
EFFICIENTNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                   (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


def efficientnet_b0(input_size: int = 224, num_classes: int = 1000, seed: int = 0) -> "onnx.ModelProto":
    """torchvision's EfficientNet-B0 as its exporter writes it at opset 17 (SiLU as x * Sigmoid(x)): a 3x3 stem,
    16 MBConv blocks, each with squeeze-excite (pool, 1x1 to a quarter of the block's input channels, SiLU, 1x1
    back, Sigmoid, the gate multiplied in), the 1x1 head to 1280 channels, pool, Flatten and the classifier.
    Random weights; not one of the held-out set (``BUILDERS``): bench/glue_heldout.py measures it at small sizes
    (issue 55, item 2)."""
    b = _Builder(seed, OPSET)
    x = b.input("input", (1, 3, input_size, input_size))
    x = _cbs(b, x, 3, 32, 3, stride=2)
    for ratio, k, stride, cin, cout, layers in EFFICIENTNET_B0:
        for i in range(layers):
            c_in, s = (cin, stride) if i == 0 else (cout, 1)
            exp = c_in * ratio
            y = _cbs(b, x, c_in, exp, 1) if ratio != 1 else x
            y = _cbs(b, y, exp, exp, k, stride=s, groups=exp)
            y = b.bn(b.conv(_se(b, y, exp, max(1, c_in // 4), "silu", "sigmoid"), exp, cout, 1), cout)
            x = b.node("Add", [y, x]) if s == 1 and c_in == cout else y
    x = _cbs(b, x, 320, 1280, 1)
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    b.fc(x, 1280, num_classes, output="output")
    return b.model({"output": [1, num_classes]}, "efficientnet_b0")


BUILDERS = {"mobilevit_like": (_mobilevit_like, GN_OPSET), "edgenext_like": (_edgenext_like, OPSET),
            "prelu_net": (_prelu_net, OPSET), "unet_gn": (_unet_gn, GN_OPSET), "se_net": (_se_net, OPSET),
            "convnextv2_like": (_convnextv2_like, OPSET)}


def heldout_model(name: str, seed: int = 0) -> "onnx.ModelProto":
    """The held-out model ``name`` (a key of ``BUILDERS``)."""
    body, opset = BUILDERS[name]
    b = _Builder(seed, opset)
    return b.model(body(b), name)


def heldout_models(seed: int = 0) -> dict:
    """name -> onnx.ModelProto of every held-out model."""
    return {name: heldout_model(name, seed) for name in BUILDERS}
