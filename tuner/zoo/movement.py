"""Small ONNX test graphs of the data-movement and layout operators, merged into ``zoo.test_models()``:
``TEST_MODELS`` (name -> build(b) like zoo's), ``OPSETS`` and ``INPUT_SHAPES`` (name -> input_shapes).

Every Split output is read or is a model output (the frontend tests compare every node's first output with
onnxruntime, so a second Split output that only feeds other nodes is declared an output too)."""
from __future__ import annotations

import numpy as np
from onnx import helper


def _shuffle(b, x: str, n: int, c: int, groups: int, h: int, w: int) -> str:
    """ShuffleNet's channel shuffle as torchvision exports it: Reshape -> Transpose -> Reshape."""
    x = b.node("Reshape", [x, b.const("shape", np.array([n, groups, c // groups, h, w], np.int64))])
    x = b.node("Transpose", [x], perm=[0, 2, 1, 3, 4])
    return b.node("Reshape", [x, b.const("shape", np.array([n, -1, h, w], np.int64))])


def _shufflenet(b) -> dict:
    """Two ShuffleNetV2 units on odd half-widths: a stride-2 unit (both branches, concat, shuffle of 14 channels
    in 2 groups), then a stride-1 unit (Split into 7 + 7, branch, concat, shuffle)."""
    x = b.input("input", (1, 6, 10, 10))
    b1 = b.node("Relu", [b.bn(b.conv(b.bn(b.conv(x, 6, 6, 3, stride=2, groups=6), 6), 6, 7, 1), 7)])
    b2 = b.node("Relu", [b.bn(b.conv(x, 6, 7, 1), 7)])
    b2 = b.node("Relu", [b.bn(b.conv(b.bn(b.conv(b2, 7, 7, 3, stride=2, groups=7), 7), 7, 7, 1), 7)])
    x = _shuffle(b, b.node("Concat", [b1, b2], axis=1), 1, 14, 2, 5, 5)
    first, second = b.name("split_a"), b.name("split_b")
    b.nodes.append(helper.make_node("Split", [x, b.const("split", np.array([7, 7], np.int64))], [first, second],
                                    name=b.name("split"), axis=1))
    y = b.node("Relu", [b.bn(b.conv(second, 7, 7, 1), 7)])
    y = b.node("Relu", [b.bn(b.conv(b.bn(b.conv(y, 7, 7, 3, groups=7), 7), 7, 7, 1), 7)])
    out = _shuffle(b, b.node("Concat", [first, y], axis=1), 1, 14, 2, 5, 5)
    return {out: None, second: None}


def _unit(b, x: str, c: int, h: int, w: int) -> str:
    """A stride-1 ShuffleNetV2 unit on c channels: halves (two Slices: a Split's second output would have to be a
    model output, see above), the branch on the second (1x1, depthwise
    3x3, 1x1 with BatchNorms and ReLUs), Concat with the first half, channel shuffle of 2 groups."""
    half = c // 2
    first, second = (b.node("Slice", [x, b.const("starts", np.array([lo], np.int64)),
                                      b.const("ends", np.array([lo + half], np.int64)),
                                      b.const("axes", np.array([1], np.int64))]) for lo in (0, half))
    y = b.node("Relu", [b.bn(b.conv(second, half, half, 1), half)])
    y = b.node("Relu", [b.bn(b.conv(b.bn(b.conv(y, half, half, 3, groups=half), half), half, half, 1), half)])
    return _shuffle(b, b.node("Concat", [first, y], axis=1), 1, c, 2, h, w)


def _down_unit(b, x: str, c: int, half: int, h: int, w: int) -> str:
    """A stride-2 ShuffleNetV2 unit: both branches read the whole input (depthwise 3x3 s2 then 1x1; 1x1, depthwise
    3x3 s2, 1x1), Concat, channel shuffle of 2 groups."""
    a = b.node("Relu", [b.bn(b.conv(b.bn(b.conv(x, c, c, 3, stride=2, groups=c), c), c, half, 1), half)])
    y = b.node("Relu", [b.bn(b.conv(x, c, half, 1), half)])
    y = b.node("Relu", [b.bn(b.conv(b.bn(b.conv(y, half, half, 3, stride=2, groups=half), half), half, half, 1),
                             half)])
    return _shuffle(b, b.node("Concat", [a, y], axis=1), 1, 2 * half, 2, (h + 1) // 2, (w + 1) // 2)


def _shufflenet_units(b) -> dict:
    """ShuffleNetV2's units with splits read only inside the model: two stride-1 units on 12 channels (halves of
    6, not whole RGBA pixels), a stride-2 unit to 16 (its shuffled input read by a depthwise and a 1x1
    convolution), two stride-1 units on 16 (halves of 8)."""
    x = b.input("input", (1, 12, 6, 5))
    x = _down_unit(b, _unit(b, _unit(b, x, 12, 6, 5), 12, 6, 5), 12, 8, 6, 5)
    return {_unit(b, _unit(b, x, 16, 3, 3), 16, 3, 3): None}


def _slice_split(b) -> dict:
    """Slice on channels (step 2, negative start), on H/W (negative ends, step 2), on 2-D features; Split
    into 3 uneven parts by attribute on H (opset 11: split is an attribute) and an even Split on channels."""
    x = b.input("input", (1, 9, 8, 7))
    a = b.node("Slice", [x, b.const("starts", np.array([-8], np.int64)), b.const("ends", np.array([9], np.int64)),
                         b.const("axes", np.array([1], np.int64)), b.const("steps", np.array([2], np.int64))])
    s = b.node("Slice", [x, b.const("starts", np.array([1, 0], np.int64)), b.const("ends", np.array([-1, 7], np.int64)),
                         b.const("axes", np.array([2, 3], np.int64)), b.const("steps", np.array([2, 3], np.int64))])
    outs = {a: None, s: None}
    names = [b.name("hsplit") for _ in range(3)]
    b.nodes.append(helper.make_node("Split", [x], names, name=b.name("split"), axis=2, split=[3, 4, 1]))
    outs.update({n: None for n in names})
    c = b.conv(x, 9, 6, 1)
    halves = [b.name("csplit") for _ in range(2)]
    b.nodes.append(helper.make_node("Split", [c], halves, name=b.name("split"), axis=-3))
    outs[b.node("Add", [halves[0], b.node("Relu", [halves[1]])])] = None
    outs[halves[1]] = None
    f = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    outs[b.node("Slice", [f, b.const("starts", np.array([2], np.int64)), b.const("ends", np.array([100], np.int64)),
                          b.const("axes", np.array([-1], np.int64))])] = None
    return outs


def _pad(b) -> dict:
    """Pad-13: constant (pads and value as inputs), reflect, edge; asymmetric pads on odd channel counts."""
    x = b.input("input", (1, 5, 6, 7))
    p = b.node("Pad", [x, b.const("pads", np.array([0, 0, 1, 2, 0, 0, 2, 0], np.int64)),
                       b.const("value", np.float32(-0.5))])
    p = b.node("Pad", [b.conv(p, 5, 3, 3), b.const("pads", np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64))],
               mode="reflect")
    return {b.node("Pad", [p, b.const("pads", np.array([0, 0, 0, 1, 0, 0, 3, 2], np.int64))], mode="edge"): None}


def _pads_into_convs(b) -> dict:
    """Pads read by convolutions (``passes.fold_pads``): a reflection Pad before a 3x3 convolution (the style
    net's), another read by two convolutions (one strided), an edge Pad, a zero Pad added to a convolution's own
    padding; kept as kernels: a reflection before a depthwise layer, a non-zero constant, a reflection before a
    convolution that pads too."""
    x = b.input("input", (1, 6, 9, 10))
    t = b.relu6(b.conv(b.node("Pad", [x, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))],
                              mode="reflect"), 6, 8, 3, pads=[0, 0, 0, 0], bias=True))
    p = b.node("Pad", [t, b.const("pads", np.array([0, 0, 2, 1, 0, 0, 1, 2], np.int64))], mode="reflect")
    a, s2 = b.conv(p, 8, 8, 3, pads=[0, 0, 0, 0]), b.conv(p, 8, 8, (2, 3), stride=2, pads=[0, 0, 0, 0])
    e = b.conv(b.node("Pad", [a, b.const("pads", np.array([0, 0, 0, 2, 0, 0, 1, 0], np.int64))], mode="edge"),
               8, 4, 3, pads=[0, 0, 0, 0])
    z = b.conv(b.node("Pad", [e, b.const("pads", np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64))]), 4, 4, 3)
    dw = b.conv(b.node("Pad", [z, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], mode="reflect"),
                4, 4, 3, groups=4, pads=[0, 0, 0, 0])
    v = b.conv(b.node("Pad", [dw, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                              b.const("value", np.float32(0.25))]), 4, 4, 3, pads=[0, 0, 0, 0])
    own = b.conv(b.node("Pad", [v, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], mode="reflect"),
                 4, 4, 3)
    return {own: None, s2: None}


def _heads_to_tokens(b) -> dict:
    """EfficientViT's attention heads: a convolution's channels sliced into q and k, each reshaped into tokens and
    multiplied (``passes_movement.compose_gathers_into_copies``: the slices run no kernel, the copies read the
    convolution's output); a slice whose reshape merges the batch with the channels keeps its kernel."""
    x = b.input("input", (2, 6, 3, 4))
    c = b.conv(x, 6, 16, 1, bias=True)
    part = lambda lo, hi: b.node("Slice", [c, b.const("starts", np.array([lo], np.int64)),  # noqa: E731
                                         b.const("ends", np.array([hi], np.int64)),
                                         b.const("axes", np.array([1], np.int64))])
    tokens = lambda t, shape: b.node("Reshape", [t, b.const("shape", np.array(shape, np.int64))])  # noqa: E731
    q = b.node("Transpose", [tokens(part(0, 4), [2, 4, 12])], perm=[0, 2, 1])
    k = tokens(part(4, 8), [2, 4, 12])
    merged = tokens(part(8, 16), [4, 4, 12])  # images and channels mixed: no strides over the whole output
    return {tokens(b.node("MatMul", [q, k]), [2, 144]): None,
            tokens(b.node("MatMul", [merged, b.const("w", b.rng.standard_normal((12, 5)))]), [16, 5]): None}


def _movement_attrs(b) -> dict:
    """Opset 9: Pad-2 (pads attribute), Slice-1 (attributes), Upsample (scales input)."""
    x = b.input("input", (1, 3, 6, 6))
    x = b.node("Pad", [x], mode="reflect", pads=[0, 0, 1, 1, 0, 0, 2, 0])
    x = b.node("Slice", [x], starts=[1, 0], ends=[3, 100], axes=[1, 3])
    x = b.node("Pad", [x], pads=[0, 0, 1, 0, 0, 0, 0, 1], value=1.5)
    return {b.node("Upsample", [x, b.const("scales", np.array([1, 1, 2, 3], np.float32))]): None}


def _resize(b) -> dict:
    """Resize-13 as PyTorch exports it: nearest asymmetric/floor by scales (F.interpolate(scale_factor=2)),
    bilinear align_corners / half_pixel / pytorch_half_pixel by sizes and scales, nearest round_prefer_floor
    half_pixel, downsampling."""
    x = b.input("input", (1, 5, 4, 6))
    empty = b.const("roi", np.zeros(0, np.float32))
    outs = {}
    up = b.node("Resize", [x, empty, b.const("scales", np.array([1, 1, 2, 2], np.float32))], mode="nearest",
                coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    outs[b.node("Resize", [b.conv(up, 5, 3, 3), "", "", b.const("sizes", np.array([1, 3, 13, 9], np.int64))],
                mode="linear", coordinate_transformation_mode="align_corners")] = None
    outs[b.node("Resize", [x, "", b.const("scales", np.array([1, 1, 1.5, 0.5], np.float32))], mode="linear",
                coordinate_transformation_mode="pytorch_half_pixel")] = None
    outs[b.node("Resize", [x, "", "", b.const("sizes", np.array([1, 5, 7, 11], np.int64))], mode="linear",
                coordinate_transformation_mode="half_pixel")] = None
    outs[b.node("Resize", [x, "", "", b.const("sizes", np.array([1, 5, 9, 4], np.int64))], mode="nearest",
                coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")] = None
    outs[b.node("Resize", [x, "", b.const("scales", np.array([1, 1, 3, 2], np.float32))], mode="nearest")] = None
    return outs


def _conv_transpose(b) -> dict:
    """ConvTranspose: stride 2 / pads 1 / output_padding 1 with a bias then BatchNorm + ReLU (folded into the
    convolution), a 4x4 stride-2 upsampler, a grouped one, dilation 2, and pads larger than the kernel span."""
    r = b.rng
    x = b.input("input", (1, 5, 4, 5))

    def ct(x, cin, cout, k, groups=1, bias=False, **attrs):
        kh, kw = (k, k) if isinstance(k, int) else k
        ins = [x, b.const("wt", r.standard_normal((cin, cout // groups, kh, kw)) / np.sqrt(cin * kh * kw))]
        if bias:
            ins.append(b.const("bt", r.normal(0, 0.1, cout)))
        return b.node("ConvTranspose", ins, "convt", group=groups, **attrs)
    y = b.node("Relu", [b.bn(ct(x, 5, 6, 3, bias=True, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                             6)])
    y = ct(y, 6, 7, 4, strides=[2, 2], pads=[1, 1, 1, 1])
    z = ct(x, 5, 10, (3, 2), groups=5, bias=True, strides=[1, 2], dilations=[2, 1])
    w = ct(x, 5, 3, 3, strides=[3, 2], pads=[3, 2, 2, 3], output_padding=[2, 1])
    return {y: None, z: None, w: None}


def _space_to_depth(b) -> dict:
    """SpaceToDepth (a Focus-style stem: the image's 2x2 blocks as channels), a 1x1 convolution, then DepthToSpace
    back in DCR and CRD modes; 3 channels, so no block of 4 is whole."""
    x = b.input("input", (1, 3, 8, 6))
    y = b.conv(b.node("SpaceToDepth", [x], blocksize=2), 12, 12, 1)
    return {b.node("DepthToSpace", [y], blocksize=2, mode="DCR"): None,
            b.node("Relu", [b.node("DepthToSpace", [y], blocksize=2, mode="CRD")]): None}


def _layer_norm(b) -> dict:
    """LayerNormalization over channels written the NHWC way (permute, LayerNorm over the last axis, a ReLU
    between, permute back) and over the features of a flattened (N, K) tensor; a transpose that stays."""
    r = b.rng
    x = b.input("input", (1, 7, 5, 6))
    t = b.node("Transpose", [x], perm=[0, 2, 3, 1])
    t = b.node("LayerNormalization", [t, b.const("ln_scale", r.uniform(0.5, 1.5, 7)),
                                      b.const("ln_bias", r.normal(0, 0.2, 7))], axis=-1, epsilon=1e-6)
    t = b.node("Transpose", [b.node("Relu", [t])], perm=[0, 3, 1, 2])
    y = b.conv(t, 7, 5, 3)
    f = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    f = b.node("LayerNormalization", [f, b.const("ln_scale", r.uniform(0.5, 1.5, 5))])
    hw = b.node("Transpose", [y], perm=[0, 1, 3, 2])
    return {f: None, b.node("Transpose", [hw], perm=[0, 2, 3, 1]): None}


def _convnext_block(b) -> dict:
    """ConvNeXt's block as torchvision exports it: depthwise 7x7, permute to NHWC, LayerNorm over the last axis,
    Linear (MatMul + a bias Add along the last axis), GELU (the erf pattern), Linear, layer scale (Mul along the
    last axis), permute back, residual add; 10 channels (not a multiple of 4)."""
    r = b.rng
    c = 10
    x = b.input("input", (1, c, 6, 6))
    y = b.conv(x, c, c, 7, groups=c, bias=True, pads=[3, 3, 3, 3])
    t = b.node("Transpose", [y], perm=[0, 2, 3, 1])
    t = b.node("LayerNormalization", [t, b.const("ln_scale", r.uniform(0.5, 1.5, c)),
                                      b.const("ln_bias", r.normal(0, 0.2, c))], axis=-1, epsilon=1e-6)
    t = b.node("Add", [b.node("MatMul", [t, b.const("w1", r.normal(0, 0.3, (c, 4 * c)))]),
                       b.const("b1", r.normal(0, 0.1, 4 * c))])
    half = b.node("Mul", [t, b.const("half", np.float32(0.5))])
    erf = b.node("Erf", [b.node("Div", [t, b.const("sqrt2", np.float32(np.sqrt(2)))])])
    t = b.node("Mul", [half, b.node("Add", [erf, b.const("one", np.float32(1.0))])])
    t = b.node("Add", [b.node("MatMul", [t, b.const("w2", r.normal(0, 0.3, (4 * c, c)))]),
                       b.const("b2", r.normal(0, 0.1, c))])
    t = b.node("Mul", [t, b.const("gamma", r.uniform(0.5, 1.5, c))])
    t = b.node("Transpose", [t], perm=[0, 3, 1, 2])
    return {b.node("Add", [t, x]): None}


TEST_MODELS: dict = {"shufflenet": _shufflenet, "shufflenet_units": _shufflenet_units, "convnext_block": _convnext_block, "slice_split": _slice_split, "pad": _pad,
                     "pads_into_convs": _pads_into_convs,
                     "heads_to_tokens": _heads_to_tokens,
                     "movement_attrs": _movement_attrs, "resize": _resize, "conv_transpose": _conv_transpose,
                     "layer_norm": _layer_norm, "space_to_depth": _space_to_depth}
OPSETS: dict = {"movement_attrs": 9, "slice_split": 11, "layer_norm": 17, "convnext_block": 17}
INPUT_SHAPES: dict = {}
