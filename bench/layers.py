"""The unique convolution and dense layers of ResNet-18 and MobileNetV2 (ImageNet, 224x224, batch 1).

Each layer is a dict::

    {"model": "resnet18", "name": "conv2_x.3x3", "template": "conv2d", "count": 2,
     "names": ["conv2_x.1.conv1", "conv2_x.2.conv1"],
     "workload": {"data": (1, 64, 56, 56), "kernel": (64, 64, 3, 3), "stride": 1, "padding": 1,
                  "bias": True, "activation": "relu"}}

``workload`` holds the keyword arguments of the template's workload class (``t.workload(**workload)``).
Batch norm is folded into the convolutions, so every convolution has a bias. Depthwise layers use the
``depthwise_conv2d`` template with kernel ``(C, 1, R, S)``; the classifiers use ``dense`` with
``{"data": (1, K), "weight": (N, K), "bias": True}``.

Fused epilogues follow the templates' order: bias, then the residual add, then the activation. A ResNet
basic block's second conv is ``relu(conv + bias + identity)``; MobileNetV2's linear bottleneck is a
projection + residual with no activation. (The exact kernels a compiled zoo model deploys are
``tuner.compile.compiler.model_tasks``, which bench/gpu.py uses; this hand-written list predates it.)

Identical workloads within a model are listed once; ``count`` says how often the model runs it and
``names`` lists the occurrences (``name`` is the short label of the first one). ``SMALL`` is a handful
of cheap but representative layers for quick runs.
"""
from __future__ import annotations

import json


def _conv(cin, cout, hw, k, stride=1, padding=None, activation="none", residual=False):
    wl = {"data": (1, cin, hw, hw), "kernel": (cout, cin, k, k), "stride": stride,
          "padding": k // 2 if padding is None else padding, "bias": True, "activation": activation}
    if residual:
        wl["residual"] = True
    return "conv2d", wl


def _dw(c, hw, k=3, stride=1, activation="relu6"):
    return "depthwise_conv2d", {"data": (1, c, hw, hw), "kernel": (c, 1, k, k), "stride": stride,
                                      "padding": k // 2, "bias": True, "activation": activation}


def _dense(k, n):
    return "dense", {"data": (1, k), "weight": (n, k), "bias": True}


def _out(hw, k, stride, pad):
    return (hw + 2 * pad - k) // stride + 1


def resnet18_ops() -> list:
    """Every conv/dense of ResNet-18 in execution order: (occurrence name, short name, template, workload)."""
    ops = [("conv1", "conv1.7x7") + _conv(3, 64, 224, 7, 2, 3, "relu")]
    hw = _out(_out(224, 7, 2, 3), 3, 2, 1)  # 112 after the stem, 56 after the 3x3/2 max pool
    cin = 64
    for stage, cout in zip((2, 3, 4, 5), (64, 128, 256, 512)):
        for blk in (1, 2):
            stride = 2 if (blk == 1 and stage > 2) else 1
            out = _out(hw, 3, stride, 1)
            tag, pre = f"conv{stage}_x", f"conv{stage}_x.{blk}"
            s2 = "s2" if stride == 2 else ""
            ops.append((f"{pre}.conv1", f"{tag}.3x3{s2}") + _conv(cin, cout, hw, 3, stride, 1, "relu"))
            if stride != 1 or cin != cout:
                ops.append((f"{pre}.downsample", f"{tag}.downsample") + _conv(cin, cout, hw, 1, stride, 0))
            ops.append((f"{pre}.conv2", f"{tag}.3x3.res") + _conv(cout, cout, out, 3, 1, 1, "relu", residual=True))
            cin, hw = cout, out
    ops.append(("fc", "fc") + _dense(512, 1000))
    return ops


# torchvision's MobileNetV2 inverted residual settings: expansion t, output channels c, repeats n, stride s
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                         (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2_ops() -> list:
    ops = [("features.0", "stem.3x3s2") + _conv(3, 32, 224, 3, 2, 1, "relu6")]
    hw, cin, idx = 112, 32, 1
    for t, c, n, s in MOBILENET_V2_SETTINGS:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            out = _out(hw, 3, stride, 1)
            residual = stride == 1 and cin == c
            pre = f"features.{idx}"
            s2 = "s2" if stride == 2 else ""
            if t != 1:
                ops.append((f"{pre}.expand", f"expand.{cin}-{hidden}@{hw}")
                           + _conv(cin, hidden, hw, 1, 1, 0, "relu6"))
            ops.append((f"{pre}.dw", f"dw.{hidden}@{hw}{s2}") + _dw(hidden, hw, 3, stride))
            ops.append((f"{pre}.project", f"project.{hidden}-{c}@{out}" + (".res" if residual else ""))
                       + _conv(hidden, c, out, 1, 1, 0, "none", residual))
            cin, hw, idx = c, out, idx + 1
    ops.append((f"features.{idx}", f"conv.{cin}-1280@{hw}") + _conv(cin, 1280, hw, 1, 1, 0, "relu6"))
    ops.append(("classifier.1", "fc") + _dense(1280, 1000))
    return ops


def workload_id(template: str, wl: dict) -> str:
    """A canonical string of (template, workload dict) for deduplication."""
    norm = {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(wl.items())}
    return template + ":" + json.dumps(norm, sort_keys=True)


def unique_layers(model: str, ops: list) -> list:
    layers: dict = {}
    for occ, short, template, wl in ops:
        key = workload_id(template, wl)
        if key in layers:
            layers[key]["count"] += 1
            layers[key]["names"].append(occ)
        else:
            layers[key] = {"model": model, "name": short, "template": template, "workload": wl,
                           "count": 1, "names": [occ]}
    return list(layers.values())


RESNET18 = unique_layers("resnet18", resnet18_ops())
MOBILENET_V2 = unique_layers("mobilenet_v2", mobilenet_v2_ops())
FULL = RESNET18 + MOBILENET_V2


def _pick(model: str, name: str) -> dict:
    return next(layer for layer in FULL if layer["model"] == model and layer["name"] == name)


# One of each kind: a 3x3 conv with ReLU, a strided 1x1 downsample, an expand 1x1 with ReLU6, a depthwise
# 3x3 (stride 1 and 2), a linear projection with a residual add, and both classifiers' dense layer.
SMALL = [
    _pick("resnet18", "conv4_x.3x3.res"),
    _pick("resnet18", "conv3_x.downsample"),
    _pick("resnet18", "fc"),
    _pick("mobilenet_v2", "expand.32-192@28"),
    _pick("mobilenet_v2", "dw.192@28"),
    _pick("mobilenet_v2", "dw.144@56s2"),
    _pick("mobilenet_v2", "project.192-32@28.res"),
]

SUITES = {"small": SMALL, "full": FULL}


def conv_flops(layer: dict) -> int:
    """Multiply-adds x 2 of one occurrence (for listing; the benchmark uses the workload's own ``flops``)."""
    wl = layer["workload"]
    if layer["template"] == "dense":
        return 2 * wl["weight"][0] * wl["weight"][1] * wl["data"][0]
    (n, c, h, w), (o, ci, r, s) = wl["data"], wl["kernel"]
    st, p = wl["stride"], wl["padding"]
    oh, ow = _out(h, r, st, p), _out(w, s, st, p)
    return 2 * n * o * oh * ow * ci * r * s


if __name__ == "__main__":
    for suite, layers in SUITES.items():
        print(f"# {suite}: {len(layers)} unique layers")
    for model, layers in (("resnet18", RESNET18), ("mobilenet_v2", MOBILENET_V2)):
        total = sum(conv_flops(layer) * layer["count"] for layer in layers)
        print(f"\n{model}: {len(layers)} unique, {sum(la['count'] for la in layers)} layers, "
              f"{total / 1e9:.3f} GFLOP")
        for layer in layers:
            print(f"  {layer['name']:28s} x{layer['count']}  {layer['template']:16s} "
                  f"{conv_flops(layer) / 1e6:8.1f} MFLOP  {layer['workload']}")
