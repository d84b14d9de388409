"""Per-task example models: the architectures phones run beyond classifiers, built in code with deterministic
random weights and written as PyTorch's exporter writes them at opset 17 (SiLU as ``x * Sigmoid(x)``,
``F.interpolate`` as Resize: nearest by scales with asymmetric coordinates, bilinear by sizes with half_pixel,
PixelShuffle as DepthToSpace mode CRD, ``ReflectionPad2d`` as Pad mode reflect, ``chunk`` as Split).

- ``segmentation``: DeepLabV3 (torchvision's, on a ResNet of basic blocks with dilated layer3 / layer4: output
  stride 8) with its ASPP head, bilinear Resize back to the input size.
- ``ssdlite``: SSDLite on MobileNetV2 (the MobileNetV2 paper's detector; heads as torchvision's SSDLiteHead):
  depthwise-separable box and class heads on 3 to 6 feature levels, two 3-D outputs ``boxes`` (1, A, 4) and
  ``scores`` (1, A, K).
- ``yolo``: YOLOv8 (ultralytics): Conv-BN-SiLU, C2f, SPPF, the FPN / PAN neck, the decoupled Detect head with its
  DFL box decoding; one 3-D output (1, 4 + K, A).
- ``sr_pixel_shuffle``: ESPCN super-resolution (convolutions, then PixelShuffle).
- ``sr_conv_transpose``: FSRCNN super-resolution (PReLU, a 9x9 ConvTranspose upsampler).
- ``pose``: SimpleBaseline (Xiao et al.'s pose_resnet on a ResNet-18): three 4x4 stride-2 ConvTransposes, heatmaps.
- ``unet``: U-Net (3 levels, ConvTranspose 2x2 upsampling, skip concatenations).
- ``style_transfer``: Johnson et al.'s fast style transfer (PyTorch examples' TransformerNet).

Each public builder takes the realistic size by default (``ZOO``, merged into ``models.ZOO``: ``tuner zoo NAME -o
FILE``); ``TEST_MODELS`` (name -> ``build(b)``) holds small versions of each, merged into ``models.test_models()``,
with ``OPSETS`` and ``INPUT_SHAPES`` as ``movement``'s. Models have one input ``input`` (1, C, H, W).
"""
from __future__ import annotations

import functools

import numpy as np

from tuner.zoo.builder import MOBILENET_V2_SETTINGS, _Builder, _make_divisible

OPSET = 17  # what PyTorch 2's exporter writes by default


def _hw(size) -> tuple:
    """``input_size`` as (H, W): an int is a square."""
    return (size, size) if isinstance(size, int) else tuple(size)


def _ch(c: float, width: float, minimum: int = 4) -> int:
    """A channel count scaled by ``width``, at least ``minimum``."""
    return max(minimum, int(round(c * width)))


def _build(name: str, body, seed: int, **kwargs):
    b = _Builder(seed, OPSET)
    return b.model(body(b, **kwargs), name)


# -- layers as PyTorch modules export them ---------------------------------------------------------------------

def _cbr(b, x: str, cin: int, cout: int, k, stride: int = 1, act: str = "relu", **attrs) -> str:
    """Conv (no bias) + BatchNorm + activation (relu, relu6, silu or none)."""
    return _act(b, b.bn(b.conv(x, cin, cout, k, stride=stride, **attrs), cout), act)


def _act(b, x: str, act: str) -> str:
    if act == "relu":
        return b.node("Relu", [x], "relu")
    if act == "relu6":
        return b.relu6(x)
    if act == "silu":  # nn.SiLU at opset 17: x * Sigmoid(x)
        return b.node("Mul", [x, b.node("Sigmoid", [x], "sigmoid")], "silu")
    assert act == "none", act
    return x


def _basic_block(b, x: str, cin: int, cout: int, stride: int = 1, dilation: int = 1) -> str:
    """torchvision's ResNet BasicBlock: 3x3 (stride, dilation) + BN + ReLU, 3x3 (dilation) + BN, the identity
    (1x1 stride conv + BN where the shape changes), add, ReLU."""
    identity = x
    if stride != 1 or cin != cout:
        identity = b.bn(b.conv(x, cin, cout, 1, stride=stride), cout)
    y = _cbr(b, x, cin, cout, 3, stride=stride, dilations=[dilation] * 2, pads=[dilation] * 4)
    y = b.bn(b.conv(y, cout, cout, 3, dilations=[dilation] * 2, pads=[dilation] * 4), cout)
    return b.node("Relu", [b.node("Add", [y, identity], "add")], "relu")


def _resnet(b, x: str, cin: int, channels, blocks, dilate=(False, False, False)) -> tuple:
    """torchvision's ResNet trunk of basic blocks (stem 7x7 s2 + BN + ReLU + MaxPool 3x3 s2, then 4 layers; the
    later three stride 2 or, where ``dilate`` says, dilation x2 instead, the first block of a dilated layer at
    the previous dilation). Returns (output, channels)."""
    stem, *widths = channels
    x = _cbr(b, x, cin, stem, 7, stride=2)
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c, dilation = stem, 1
    for i, (cout, n) in enumerate(zip(widths, blocks)):
        stride, previous = (1 if i == 0 else 2), dilation
        if i > 0 and dilate[i - 1]:
            dilation, stride = dilation * stride, 1
        for j in range(n):
            x = _basic_block(b, x, c, cout, stride if j == 0 else 1, previous if j == 0 else dilation)
            c = cout
    return x, c


def _shape_sizes(b, like: str, hw_of: str) -> str:
    """The ``sizes`` of ``F.interpolate(like, size=hw_of.shape[-2:])`` as the exporter traces it:
    Concat(Shape(like)[0:2], Shape(hw_of)[2:4]) (the frontend folds it into a constant)."""
    def part(t, lo, hi):
        return b.node("Slice", [b.node("Shape", [t], "shape"), b.const("starts", np.array([lo], np.int64)),
                                b.const("ends", np.array([hi], np.int64)), b.const("axes", np.array([0], np.int64))],
                      "slice")
    return b.node("Concat", [part(like, 0, 2), part(hw_of, 2, 4)], "sizes", axis=0)


def _bilinear_to(b, x: str, hw_of: str) -> str:
    """``F.interpolate(x, size=hw_of.shape[-2:], mode="bilinear", align_corners=False)``."""
    return b.node("Resize", [x, "", "", _shape_sizes(b, x, hw_of)], "resize", mode="linear",
                  coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, nearest_mode="floor")


def _nearest2x(b, x: str) -> str:
    """``nn.Upsample(scale_factor=2)`` / ``F.interpolate(x, scale_factor=2, mode="nearest")``."""
    return b.node("Resize", [x, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], "upsample",
                  mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor",
                  cubic_coeff_a=-0.75)


def _conv_transpose(b, x: str, cin: int, cout: int, k: int, stride: int, pad: int, output_padding: int = 0,
                    bias: bool = False, output: str | None = None) -> str:
    """ConvTranspose2d with He-normal weights (C, O, k, k) over its fan-in per output (cin * k^2 / stride^2)."""
    w = b.rng.standard_normal((cin, cout, k, k)) * np.sqrt(2 * stride * stride / (cin * k * k))
    ins = [x, b.const("wt", w)] + ([b.const("bt", b.rng.normal(0, 0.1, cout))] if bias else [])
    attrs = {"output_padding": [output_padding] * 2} if output_padding else {}
    return b.node("ConvTranspose", ins, "convt", output=output, kernel_shape=[k, k], strides=[stride, stride],
                  pads=[pad] * 4, **attrs)


def _split(b, x: str, sizes, axis: int = 1) -> list:
    """``torch.split`` / ``chunk`` at opset 13+: Split with the sizes as an input."""
    from onnx import helper
    outs = [b.name("split_out") for _ in sizes]
    b.nodes.append(helper.make_node("Split", [x, b.const("split", np.array(sizes, np.int64))], outs,
                                    name=b.name("split"), axis=axis))
    return outs


# -- segmentation: DeepLabV3 --------------------------------------------------------------------------------

def _segmentation(b, num_classes: int, input_size, channels, rates, blocks, aspp: int) -> dict:
    """torchvision's ``deeplabv3`` with ``replace_stride_with_dilation=[False, True, True]`` (output stride 8:
    layer3 at dilation 2, layer4 at dilation 4, each layer's first block at the previous dilation) on basic
    blocks, its ASPP (1x1 conv, three 3x3 convs at ``rates``, and the image pooling branch: GlobalAveragePool ->
    1x1 conv -> BN -> ReLU -> bilinear Resize to the map; each conv + BN + ReLU), Concat, the 1x1 projection
    (Dropout omitted, as in eval), DeepLabHead's 3x3 conv + BN + ReLU and 1x1 classifier, and the bilinear
    Resize to the input size."""
    h, w = _hw(input_size)
    image = x = b.input("input", (1, 3, h, w))
    x, c = _resnet(b, x, 3, channels, blocks, dilate=(False, True, True))
    a = aspp  # the ASPP's and the head's channels
    branches = [_cbr(b, x, c, a, 1)]
    branches += [_cbr(b, x, c, a, 3, dilations=[r, r], pads=[r] * 4) for r in rates]
    pool = _cbr(b, b.node("GlobalAveragePool", [x], "gap"), c, a, 1)
    branches.append(_bilinear_to(b, pool, x))
    x = _cbr(b, b.node("Concat", branches, "concat", axis=1), a * len(branches), a, 1)
    x = _cbr(b, x, a, a, 3)
    x = b.conv(x, a, num_classes, 1, bias=True)
    return {b.node("Resize", [x, "", "", _shape_sizes(b, x, image)], "resize", output="output", mode="linear",
                   coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
                   nearest_mode="floor"): [1, num_classes, h, w]}


def segmentation(num_classes: int = 21, input_size=512, width: float = 0.5, rates=(12, 24, 36),
                 blocks=(2, 2, 2, 2), aspp: int = 256, seed: int = 0):
    """DeepLabV3 on a dilated ResNet-18 trunk (``width`` scales its channels and the ASPP's; 0.5 by default, a
    mobile size), 21 classes (Pascal VOC), input 512x512."""
    return _build("segmentation", _segmentation, seed, num_classes=num_classes, input_size=input_size,
                  channels=tuple(_ch(c, width) for c in (64, 64, 128, 256, 512)), rates=tuple(rates),
                  blocks=tuple(blocks), aspp=_ch(aspp, width))


# -- ssdlite: SSDLite on MobileNetV2 ------------------------------------------------------------------------

def _inverted_residual(b, x: str, cin: int, cout: int, t: int, stride: int) -> tuple:
    """MobileNetV2's block; returns (output, the expansion's output or None)."""
    hidden = cin * t
    expansion = _cbr(b, x, cin, hidden, 1, act="relu6") if t != 1 else None
    y = _cbr(b, expansion or x, hidden, hidden, 3, stride=stride, groups=hidden, act="relu6")
    y = b.bn(b.conv(y, hidden, cout, 1), cout)
    return (b.node("Add", [x, y], "add") if stride == 1 and cin == cout else y), expansion


def _head_3d(b, x: str, cin: int, per_anchor: int, anchors: int) -> str:
    """One SSDLite head of one level: depthwise 3x3 + BN + ReLU6, 1x1 (bias) to anchors * per_anchor, then
    permute(0, 2, 3, 1) and reshape(N, -1, per_anchor)."""
    y = _cbr(b, x, cin, cin, 3, groups=cin, act="relu6")
    y = b.conv(y, cin, anchors * per_anchor, 1, bias=True)
    y = b.node("Transpose", [y], "transpose", perm=[0, 2, 3, 1])
    return b.node("Reshape", [y, b.const("shape", np.array([1, -1, per_anchor], np.int64))], "reshape")


def _ssdlite(b, num_classes: int, input_size, width: float, settings, last: int, extras, anchors: int) -> dict:
    """SSDLite as the MobileNetV2 paper defines it (heads and extra layers as torchvision's ``ssdlite``): the
    first level is the expansion (1x1 + BN + ReLU6) of the first block of the last stride-2 stage (stride 16),
    the second the last 1x1 conv (stride 32), then ``extras`` blocks (1x1 to half + ReLU6, depthwise 3x3 s2 +
    ReLU6, 1x1 + ReLU6, each with BN); every level has a box and a class head (``_head_3d``), concatenated over
    the levels on axis 1; Softmax over the classes."""
    h, w = _hw(input_size)
    x = b.input("input", (1, 3, h, w))
    c = _make_divisible(32 * width)
    x = _cbr(b, x, 3, c, 3, stride=2, act="relu6")
    last_s2 = max(i for i, s in enumerate(settings) if s[3] == 2)
    levels = []
    for i, (t, cs, n, s) in enumerate(settings):
        cout = _make_divisible(cs * width)
        for j in range(n):
            x, expansion = _inverted_residual(b, x, c, cout, t, s if j == 0 else 1)
            if i == last_s2 and j == 0:
                levels.append((expansion, c * t))
            c = cout
    last = _make_divisible(last * width)
    x = _cbr(b, x, c, last, 1, act="relu6")
    levels.append((x, last))
    c = last
    for e in extras:
        e = _make_divisible(e * width)
        y = _cbr(b, x, c, e // 2, 1, act="relu6")
        y = _cbr(b, y, e // 2, e // 2, 3, stride=2, groups=e // 2, act="relu6")
        x, c = _cbr(b, y, e // 2, e, 1, act="relu6"), e
        levels.append((x, c))
    boxes = [_head_3d(b, t, ct, 4, anchors) for t, ct in levels]
    scores = [_head_3d(b, t, ct, num_classes, anchors) for t, ct in levels]
    b.node("Concat", boxes, "concat", output="boxes", axis=1)
    b.node("Softmax", [b.node("Concat", scores, "concat", axis=1)], "softmax", output="scores", axis=-1)
    return {"boxes": None, "scores": None}


def ssdlite(num_classes: int = 91, input_size=320, width: float = 1.0, seed: int = 0):
    """SSDLite320 on MobileNetV2 (torchvision's SSDLite sizes: 320x320, 91 COCO classes, 6 anchors a location,
    extra levels of 512, 256, 256 and 128 channels: 3,234 anchors)."""
    return _build("ssdlite", _ssdlite, seed, num_classes=num_classes, input_size=input_size, width=width,
                  settings=MOBILENET_V2_SETTINGS, last=1280, extras=(512, 256, 256, 128), anchors=6)


# -- yolo: YOLOv8 ---------------------------------------------------------------------------------------------

def _c2f(b, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
    """ultralytics' C2f: cv1 1x1 to 2c, chunk(2) (Split), n Bottlenecks (3x3, 3x3, + input if ``shortcut``)
    chained on the last chunk, Concat of every chunk, cv2 1x1."""
    c = cout // 2
    ys = _split(b, _cbr(b, x, cin, 2 * c, 1, act="silu"), [c, c])
    for _ in range(n):
        y = _cbr(b, _cbr(b, ys[-1], c, c, 3, act="silu"), c, c, 3, act="silu")
        ys.append(b.node("Add", [ys[-1], y], "add") if shortcut else y)
    return _cbr(b, b.node("Concat", ys, "concat", axis=1), (2 + n) * c, cout, 1, act="silu")


def _sppf(b, x: str, cin: int, cout: int) -> str:
    """ultralytics' SPPF: cv1 1x1 to cin/2, three chained MaxPool 5x5 stride 1 pad 2, Concat of the four, cv2."""
    c = cin // 2
    ys = [_cbr(b, x, cin, c, 1, act="silu")]
    for _ in range(3):
        ys.append(b.node("MaxPool", [ys[-1]], "maxpool", kernel_shape=[5, 5], strides=[1, 1], pads=[2] * 4))
    return _cbr(b, b.node("Concat", ys, "concat", axis=1), 4 * c, cout, 1, act="silu")


def _anchors(sizes, strides) -> tuple:
    """ultralytics' make_anchors, transposed as Detect uses them: anchor centres (2, A) (x, y) in grid units and
    the stride of each anchor (1, A)."""
    points, stride = [], []
    for (h, w), s in zip(sizes, strides):
        sy, sx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        points.append(np.stack([sx.ravel(), sy.ravel()]))
        stride.append(np.full(h * w, float(s)))
    return np.concatenate(points, 1)[None].astype(np.float32), np.concatenate(stride)[None].astype(np.float32)


def _yolo(b, num_classes: int, input_size, width: float, depth: float, reg_max: int, max_channels: int,
          head_min: int = 16) -> dict:
    """YOLOv8 (ultralytics' yolov8.yaml at ``width`` / ``depth``; n: 0.25 / 0.33): backbone Conv s2 x2, C2f,
    (Conv s2, C2f) x3, SPPF; the neck's nearest 2x Resize + Concat + C2f twice (FPN) and Conv s2 + Concat + C2f
    twice (PAN); Detect on P3 / P4 / P5 (per level a box branch 3x3, 3x3, 1x1 to 4 * ``reg_max`` and a class
    branch 3x3, 3x3, 1x1 to K; Concat, Reshape (1, 4 * reg_max + K, HW), Concat over the levels); then as the
    exported model: Split, DFL (Reshape (1, 4, reg_max, A), Transpose, Softmax, the 1x1 conv of weights
    0..reg_max-1, Reshape), dist2bbox (xywh) times the strides, Sigmoid of the classes, Concat: (1, 4 + K, A)."""
    h, w = _hw(input_size)
    x = b.input("input", (1, 3, h, w))
    # ultralytics rounds min(c, max_channels) * width up to a multiple of 8 (n and s are multiples already);
    # truncated here, so that a test version can be narrower
    c1, c2, c3, c4, c5 = (int(min(c, max_channels) * width) for c in (64, 128, 256, 512, 1024))
    reps = lambda n: max(round(n * depth), 1)  # noqa: E731
    x = _cbr(b, x, 3, c1, 3, stride=2, act="silu")
    x = _c2f(b, _cbr(b, x, c1, c2, 3, stride=2, act="silu"), c2, c2, reps(3), True)
    p3 = _c2f(b, _cbr(b, x, c2, c3, 3, stride=2, act="silu"), c3, c3, reps(6), True)
    p4 = _c2f(b, _cbr(b, p3, c3, c4, 3, stride=2, act="silu"), c4, c4, reps(6), True)
    p5 = _c2f(b, _cbr(b, p4, c4, c5, 3, stride=2, act="silu"), c5, c5, reps(3), True)
    p5 = _sppf(b, p5, c5, c5)
    n4 = _c2f(b, b.node("Concat", [_nearest2x(b, p5), p4], "concat", axis=1), c5 + c4, c4, reps(3), False)
    o3 = _c2f(b, b.node("Concat", [_nearest2x(b, n4), p3], "concat", axis=1), c4 + c3, c3, reps(3), False)
    o4 = _c2f(b, b.node("Concat", [_cbr(b, o3, c3, c3, 3, stride=2, act="silu"), n4], "concat", axis=1),
              c3 + c4, c4, reps(3), False)
    o5 = _c2f(b, b.node("Concat", [_cbr(b, o4, c4, c4, 3, stride=2, act="silu"), p5], "concat", axis=1),
              c4 + c5, c5, reps(3), False)
    box_c, cls_c = max(head_min, c3 // 4, reg_max * 4), max(c3, min(num_classes, 100))
    no = 4 * reg_max + num_classes
    outs, sizes = [], []
    for t, c, s in ((o3, c3, 8), (o4, c4, 16), (o5, c5, 32)):
        box = b.conv(_cbr(b, _cbr(b, t, c, box_c, 3, act="silu"), box_c, box_c, 3, act="silu"),
                     box_c, 4 * reg_max, 1, bias=True)
        cls = b.conv(_cbr(b, _cbr(b, t, c, cls_c, 3, act="silu"), cls_c, cls_c, 3, act="silu"),
                     cls_c, num_classes, 1, bias=True)
        y = b.node("Concat", [box, cls], "concat", axis=1)
        outs.append(b.node("Reshape", [y, b.const("shape", np.array([1, no, -1], np.int64))], "reshape"))
        sizes.append((-(-h // s), -(-w // s)))
    y = b.node("Concat", outs, "concat", axis=2)
    a = sum(hh * ww for hh, ww in sizes)
    box, cls = _split(b, y, [4 * reg_max, num_classes])
    # DFL: the expected distance of each side over reg_max bins
    d = b.node("Reshape", [box, b.const("shape", np.array([1, 4, reg_max, a], np.int64))], "reshape")
    d = b.node("Softmax", [b.node("Transpose", [d], "transpose", perm=[0, 2, 1, 3])], "softmax", axis=1)
    d = b.node("Conv", [d, b.const("dfl", np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1))],
               "conv", kernel_shape=[1, 1])
    d = b.node("Reshape", [d, b.const("shape", np.array([1, 4, a], np.int64))], "reshape")
    # dist2bbox(xywh): left-top and right-bottom distances around the anchor centres
    points, strides = _anchors(sizes, (8, 16, 32))
    lt, rb = _split(b, d, [2, 2])
    anchors = b.const("anchors", points)
    x1y1 = b.node("Sub", [anchors, lt], "sub")
    x2y2 = b.node("Add", [anchors, rb], "add")
    cxy = b.node("Div", [b.node("Add", [x1y1, x2y2], "add"), b.const("two", np.float32(2))], "div")
    wh = b.node("Sub", [x2y2, x1y1], "sub")
    dbox = b.node("Mul", [b.node("Concat", [cxy, wh], "concat", axis=1), b.const("strides", strides)], "mul")
    b.node("Concat", [dbox, b.node("Sigmoid", [cls], "sigmoid")], "concat", output="output", axis=1)
    return {"output": [1, 4 + num_classes, a]}


def yolo(num_classes: int = 80, input_size=640, width: float = 0.25, depth: float = 0.33, seed: int = 0):
    """YOLOv8n (width 0.25, depth 0.33; s: 0.5 / 0.33), 80 COCO classes, 640x640: (1, 84, 8400)."""
    return _build("yolo", _yolo, seed, num_classes=num_classes, input_size=input_size, width=width, depth=depth,
                  reg_max=16, max_channels=1024)


# -- super-resolution: ESPCN and FSRCNN -----------------------------------------------------------------------

def _sr_pixel_shuffle(b, input_size, channels: int, scale: int, features) -> dict:
    """ESPCN (Shi et al. 2016): conv 5x5 + tanh, conv 3x3 + tanh, conv 3x3 to channels * r^2 (convs with biases),
    PixelShuffle(r), which PyTorch exports as DepthToSpace mode CRD."""
    h, w = _hw(input_size)
    f1, f2 = features
    x = b.input("input", (1, channels, h, w))
    x = b.node("Tanh", [b.conv(x, channels, f1, 5, bias=True)], "tanh")
    x = b.node("Tanh", [b.conv(x, f1, f2, 3, bias=True)], "tanh")
    x = b.conv(x, f2, channels * scale * scale, 3, bias=True)
    b.node("DepthToSpace", [x], "d2s", output="output", blocksize=scale, mode="CRD")
    return {"output": [1, channels, h * scale, w * scale]}


def sr_pixel_shuffle(input_size=224, channels: int = 1, scale: int = 3, seed: int = 0):
    """ESPCN x3 on the luminance (1 channel), the paper's 64 and 32 features; 224x224 in, 672x672 out."""
    return _build("sr_pixel_shuffle", _sr_pixel_shuffle, seed, input_size=input_size, channels=channels,
                  scale=scale, features=(64, 32))


def _sr_conv_transpose(b, input_size, channels: int, scale: int, d: int, s: int, m: int) -> dict:
    """FSRCNN (Dong et al. 2016): feature extraction 5x5 to d, shrinking 1x1 to s, m mapping 3x3 layers,
    expanding 1x1 to d, each conv (bias) + PReLU of a slope a channel; deconvolution ConvTranspose 9x9 stride r,
    pads 4, output_padding r - 1 (bias): r times the input."""
    h, w = _hw(input_size)
    x = b.input("input", (1, channels, h, w))

    def prelu(t, c):
        return b.node("PRelu", [t, b.const("slope", b.rng.uniform(0.1, 0.3, (c, 1, 1)))], "prelu")
    x = prelu(b.conv(x, channels, d, 5, bias=True), d)
    x = prelu(b.conv(x, d, s, 1, bias=True), s)
    for _ in range(m):
        x = prelu(b.conv(x, s, s, 3, bias=True), s)
    x = prelu(b.conv(x, s, d, 1, bias=True), d)
    y = _conv_transpose(b, x, d, channels, 9, scale, 4, output_padding=scale - 1, bias=True, output="output")
    return {y: [1, channels, h * scale, w * scale]}


def sr_conv_transpose(input_size=224, channels: int = 1, scale: int = 3, seed: int = 0):
    """FSRCNN x3 (d 56, s 12, m 4) on the luminance; 224x224 in, 672x672 out."""
    return _build("sr_conv_transpose", _sr_conv_transpose, seed, input_size=input_size, channels=channels,
                  scale=scale, d=56, s=12, m=4)


# -- pose: SimpleBaseline ------------------------------------------------------------------------------------

def _pose(b, joints: int, input_size, channels, blocks, deconv: int) -> dict:
    """SimpleBaseline (Xiao et al. 2018, pose_resnet): a ResNet without its classifier, three ConvTranspose 4x4
    stride 2 pad 1 (no bias) + BN + ReLU, the final 1x1 conv (bias) to a heatmap a joint (stride 4)."""
    h, w = _hw(input_size)
    x = b.input("input", (1, 3, h, w))
    x, c = _resnet(b, x, 3, channels, blocks)
    d = deconv
    for _ in range(3):
        x = b.node("Relu", [b.bn(_conv_transpose(b, x, c, d, 4, 2, 1), d)], "relu")
        c = d
    return {b.conv(x, c, joints, 1, bias=True, output="output"): None}


def pose(joints: int = 17, input_size=(256, 192), width: float = 1.0, seed: int = 0):
    """pose_resnet_18 at 256x192 (COCO's 17 joints): heatmaps (1, 17, 64, 48)."""
    return _build("pose", _pose, seed, joints=joints, input_size=input_size,
                  channels=tuple(_ch(c, width) for c in (64, 64, 128, 256, 512)), blocks=(2, 2, 2, 2),
                  deconv=_ch(256, width))


# -- unet ----------------------------------------------------------------------------------------------------

def _unet(b, num_classes: int, input_size, channels, in_channels: int) -> dict:
    """U-Net (Ronneberger et al.; milesial's Pytorch-UNet with ConvTranspose upsampling, 3 levels): DoubleConv
    (3x3 + BN + ReLU twice) and MaxPool 2 down each level, a DoubleConv bottleneck, then up each level a
    ConvTranspose 2x2 stride 2 (bias) to half the channels, Concat [skip, up], DoubleConv; a 1x1 conv head."""
    h, w = _hw(input_size)
    x = b.input("input", (1, in_channels, h, w))

    def double(t, cin, cout):
        return _cbr(b, _cbr(b, t, cin, cout, 3), cout, cout, 3)
    skips, c = [], in_channels
    for cout in channels[:-1]:
        x = double(x, c, cout)
        skips.append((x, cout))
        x, c = b.node("MaxPool", [x], "maxpool", kernel_shape=[2, 2], strides=[2, 2]), cout
    x, c = double(x, c, channels[-1]), channels[-1]
    for skip, cs in reversed(skips):
        up = _conv_transpose(b, x, c, c // 2, 2, 2, 0, bias=True)
        x, c = double(b.node("Concat", [skip, up], "concat", axis=1), cs + c // 2, cs), cs
    return {b.conv(x, c, num_classes, 1, bias=True, output="output"): [1, num_classes, h, w]}


def unet(num_classes: int = 2, input_size=256, base: int = 32, seed: int = 0):
    """U-Net of 3 levels at 256x256, channels 32 to 256 (``base`` doubling a level), 2 classes."""
    return _build("unet", _unet, seed, num_classes=num_classes, input_size=input_size,
                  channels=tuple(base << i for i in range(4)), in_channels=3)


# -- style transfer: Johnson et al. ---------------------------------------------------------------------------

def _style_transfer(b, input_size, channels, residuals: int) -> dict:
    """PyTorch examples' fast_neural_style TransformerNet: ConvLayer (ReflectionPad k//2 + conv with bias) 9x9,
    3x3 s2, 3x3 s2, each + InstanceNorm (affine) + ReLU; residual blocks (conv, IN, ReLU, conv, IN, + x);
    two UpsampleConvLayers (nearest 2x Resize, reflection pad, 3x3 conv) + IN + ReLU; a 9x9 ConvLayer to RGB."""
    h, w = _hw(input_size)
    x = b.input("input", (1, 3, h, w))
    r = b.rng

    def conv_layer(t, cin, cout, k, stride=1, output=None):
        p = k // 2
        t = b.node("Pad", [t, b.const("pads", np.array([0, 0, p, p, 0, 0, p, p], np.int64))], "pad",
                   mode="reflect")
        return b.conv(t, cin, cout, k, stride=stride, bias=True, pads=[0, 0, 0, 0], output=output)

    def inorm(t, c):
        return b.node("InstanceNormalization", [t, b.const("in_scale", r.uniform(0.5, 1.5, c)),
                                                b.const("in_bias", r.normal(0, 0.2, c))], "inorm", epsilon=1e-5)
    c1, c2, c3 = channels
    x = b.node("Relu", [inorm(conv_layer(x, 3, c1, 9), c1)], "relu")
    x = b.node("Relu", [inorm(conv_layer(x, c1, c2, 3, 2), c2)], "relu")
    x = b.node("Relu", [inorm(conv_layer(x, c2, c3, 3, 2), c3)], "relu")
    for _ in range(residuals):
        y = b.node("Relu", [inorm(conv_layer(x, c3, c3, 3), c3)], "relu")
        x = b.node("Add", [inorm(conv_layer(y, c3, c3, 3), c3), x], "add")
    x = b.node("Relu", [inorm(conv_layer(_nearest2x(b, x), c3, c2, 3), c2)], "relu")
    x = b.node("Relu", [inorm(conv_layer(_nearest2x(b, x), c2, c1, 3), c1)], "relu")
    return {conv_layer(x, c1, 3, 9, output="output"): [1, 3, h, w]}


def style_transfer(input_size=256, seed: int = 0):
    """TransformerNet (32, 64, 128 channels, 5 residual blocks) at 256x256."""
    return _build("style_transfer", _style_transfer, seed, input_size=input_size, channels=(32, 64, 128),
                  residuals=5)


# -- registries ------------------------------------------------------------------------------------------------

ZOO: dict = {"segmentation": segmentation, "ssdlite": ssdlite, "yolo": yolo, "sr_pixel_shuffle": sr_pixel_shuffle,
             "sr_conv_transpose": sr_conv_transpose, "pose": pose, "unet": unet, "style_transfer": style_transfer}

# small versions (under 64 KiB of weights, a few seconds to compile and run): the test set's
TEST_MODELS: dict = {
    "segmentation": functools.partial(_segmentation, num_classes=5, input_size=48, channels=(4, 4, 8, 8, 12),
                                      rates=(2, 4, 6), blocks=(1, 1, 1, 2), aspp=8),
    "ssdlite": functools.partial(_ssdlite, num_classes=5, input_size=64, width=0.25,
                                 settings=((1, 16, 1, 1), (4, 16, 1, 2), (4, 24, 1, 2), (4, 32, 1, 2),
                                           (4, 48, 1, 2)), last=96, extras=(64,), anchors=6),
    "yolo": functools.partial(_yolo, num_classes=3, input_size=64, width=1 / 32, depth=0.33, reg_max=2,
                              max_channels=128, head_min=8),
    "sr_pixel_shuffle": functools.partial(_sr_pixel_shuffle, input_size=24, channels=3, scale=3, features=(16, 8)),
    "sr_conv_transpose": functools.partial(_sr_conv_transpose, input_size=20, channels=1, scale=2, d=12, s=6, m=2),
    "pose": functools.partial(_pose, joints=5, input_size=(96, 64), channels=(6, 6, 8, 12, 16), blocks=(1, 1, 1, 1),
                              deconv=8),
    "unet": functools.partial(_unet, num_classes=2, input_size=32, channels=(4, 6, 8, 12), in_channels=3),
    "style_transfer": functools.partial(_style_transfer, input_size=32, channels=(4, 8, 12), residuals=2),
}
OPSETS: dict = {name: OPSET for name in TEST_MODELS}
INPUT_SHAPES: dict = {}
