"""Re-parameterized depthwise blocks as one depthwise convolution (``merge_depthwise_branches``, ``Graph -> Graph``),
and a distilled classifier's two heads as one dense layer (``merge_dense_heads``).

Mobile architectures train a depthwise layer as several branches over the same input and add them: RepViT's token
mixer is ``bn(dw3x3(x) + dw1x1(x) + x)``, FastViT's RepMixer ``x + s * (dw3x3(x) - dw3x3'(x))``, MobileOne and
RepVGG the same with dense kernels. Exported without their inference-time fusion (timm exports the training form),
each branch, add and norm is a kernel of its own: four launches and three extra passes over the tensor for what
is one depthwise convolution. Every step is linear in the input and per channel, so the branches sum into one
kernel exactly:

- an ``add`` or ``sub`` of two depthwise convolutions of the same input (same stride, odd kernels padded to keep
  their centre), or of one and the input itself (stride 1): one convolution whose kernel is the sum of the
  branches' kernels centred in the larger window (the identity a 1 at the centre), its bias the sum of theirs;
- a per-channel scale and shift after a depthwise convolution -- a 1x1 depthwise convolution (a BatchNorm that had
  no convolution right before it, ``fold_batch_norm``), or a ``mul`` / ``add`` by a per-channel constant -- folded
  into its kernel and bias.

Taken where each convolution has no activation, no residual and zero padding yet (before ``fuse_epilogues``) and is
read by the merging node only. The rules repeat until none applies, so a chain of them becomes one kernel."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params
from tuner.graph.graph import channel_constant, only_reader


def _depthwise(g: Graph, n: Node | None):
    """``(x, W (C, 1, kh, kw) float64, bias (C,) float64)`` of a plain depthwise convolution (multiplier 1, dilation
    1, zero padding, no activation or residual, constant weights), else None."""
    if n is None or n.op != "conv2d" or len(n.inputs) not in (2, 3) or set(n.attrs) - {"stride", "padding",
                                                                                         "dilation", "groups"}:
        return None
    x, w = n.inputs[0], n.inputs[1]
    if w not in g.params or (len(n.inputs) == 3 and n.inputs[2] not in g.params) or len(g.shapes.get(x, ())) != 4:
        return None
    W = np.asarray(g.params[w], np.float64)
    C = g.shapes[x][1]
    if W.ndim != 4 or W.shape[:2] != (C, 1) or n.attrs.get("groups") != C or \
            tuple(n.attrs.get("dilation", (1, 1))) != (1, 1) or tuple(g.shapes[n.outputs[0]])[1] != C:
        return None
    b = np.asarray(g.params[n.inputs[2]], np.float64).reshape(-1) if len(n.inputs) == 3 else np.zeros(C)
    return x, W, b


def _centred(n: Node, W: np.ndarray) -> bool:
    kh, kw = W.shape[2:]
    return kh % 2 == 1 and kw % 2 == 1 and tuple(n.attrs.get("padding", (0,) * 4)) == \
        ((kh - 1) // 2, (kw - 1) // 2, (kh - 1) // 2, (kw - 1) // 2)


def _embed(W: np.ndarray, kh: int, kw: int) -> np.ndarray:
    """``W`` centred in a (kh, kw) window of zeros."""
    out = np.zeros(W.shape[:2] + (kh, kw))
    oh, ow = (kh - W.shape[2]) // 2, (kw - W.shape[3]) // 2
    out[:, :, oh:oh + W.shape[2], ow:ow + W.shape[3]] = W
    return out


def _replace(g: Graph, dead: list, at: Node, x: str, W: np.ndarray, b: np.ndarray, stride) -> None:
    """``at`` (its outputs kept) becomes the depthwise convolution (x, W, b) with its centre padding; ``dead`` go."""
    kh, kw = W.shape[2:]
    dtype = np.float32
    conv = Node("conv2d", at.name, [x, _add_param(g, f"{at.name}.w_rep", W.astype(dtype)),
                                    _add_param(g, f"{at.name}.b_rep", b.astype(dtype))], list(at.outputs),
                {"stride": tuple(stride), "padding": ((kh - 1) // 2, (kw - 1) // 2, (kh - 1) // 2, (kw - 1) // 2),
                 "dilation": (1, 1), "groups": int(W.shape[0])})
    g.nodes = [conv if n is at else n for n in g.nodes if all(n is not d for d in dead)]


def _merge_branches(g: Graph, node: Node) -> bool:
    """An ``add`` / ``sub`` of two centred depthwise branches of one input, or of one and the input (module doc)."""
    if node.op not in ("add", "sub") or len(node.inputs) != 2 or node.attrs or \
            len({tuple(g.shapes[t]) for t in (*node.inputs, node.outputs[0])}) != 1:
        return False
    sides = []
    for t in node.inputs:
        p = g.producer(t)
        dw = _depthwise(g, p)
        sides.append((p, *dw) if dw is not None and _centred(p, dw[1]) and only_reader(g, t, node) else (None, t))
    convs = [s for s in sides if s[0] is not None]
    if not convs:
        return False
    x = convs[0][1]
    stride = tuple(convs[0][0].attrs.get("stride", (1, 1)))
    if any(s[1] != x for s in sides) or any(tuple(s[0].attrs.get("stride", (1, 1))) != stride for s in convs):
        return False  # another input, or another stride
    if len(convs) == 1 and stride != (1, 1):
        return False  # the identity branch only adds where the convolution keeps the size
    kh, kw = max(s[2].shape[2] for s in convs), max(s[2].shape[3] for s in convs)
    C = g.shapes[x][1]
    W, b = np.zeros((C, 1, kh, kw)), np.zeros(C)
    for sign, s in zip((1.0, 1.0 if node.op == "add" else -1.0), sides):
        if s[0] is None:  # the input itself: a 1 at the centre
            W[:, 0, kh // 2, kw // 2] += sign
        else:
            W += sign * _embed(s[2], kh, kw)
            b += sign * s[3]
    _replace(g, [s[0] for s in convs], node, x, W, b, stride)
    return True


def _fold_channel_affine(g: Graph, node: Node) -> bool:
    """A per-channel scale or shift after a depthwise convolution read only there, folded into it."""
    if node.op == "conv2d":
        dw = _depthwise(g, node)
        if dw is None or dw[1].shape[2:] != (1, 1) or tuple(node.attrs.get("stride", (1, 1))) != (1, 1) or \
                tuple(node.attrs.get("padding", (0,) * 4)) != (0, 0, 0, 0):
            return False
        t, scale, shift = node.inputs[0], dw[1].reshape(-1), dw[2]
    elif node.op in ("mul", "add") and len(node.inputs) == 2 and not node.attrs:
        t = next((i for i in node.inputs if i not in g.params), None)
        other = node.inputs[1] if t == node.inputs[0] else node.inputs[0]
        if t is None or len(g.shapes.get(t, ())) != 4 or tuple(g.shapes[t]) != tuple(g.shapes[node.outputs[0]]):
            return False
        v = channel_constant(g, other, g.shapes[t][1], 4)
        if v is None:
            return False
        C = g.shapes[t][1]
        scale, shift = (v, np.zeros(C)) if node.op == "mul" else (np.ones(C), v)
    else:
        return False
    p = g.producer(t)
    dw = _depthwise(g, p)
    if dw is None or not only_reader(g, t, node):
        return False
    x, W, b = dw
    conv = Node(p.op, p.name, list(p.inputs), list(node.outputs), dict(p.attrs))
    conv.inputs = [x, _add_param(g, f"{p.name}.w_affine", (W * scale.reshape(-1, 1, 1, 1)).astype(np.float32)),
                   _add_param(g, f"{p.name}.b_affine", (b * scale + shift).astype(np.float32))]
    g.nodes = [conv if n is node else n for n in g.nodes if n is not p]
    return True


def merge_depthwise_branches(graph: Graph) -> Graph:
    """Re-parameterized depthwise branches and the per-channel affines after them as one depthwise convolution
    (module doc)."""
    if not any(n.op == "conv2d" and n.attrs.get("groups", 1) > 1 for n in graph.nodes):
        return graph
    g = graph.copy()
    changed, merged = True, 0
    while changed:
        changed = False
        for node in list(g.nodes):
            if any(n is node for n in g.nodes) and (_merge_branches(g, node) or _fold_channel_affine(g, node)):
                changed, merged = True, merged + 1
    return _drop_unused_params(g).validate() if merged else graph


def _dense(g: Graph, n: Node | None):
    """``(x, W (M, K) float64, bias (M,) float64)`` of a plain dense layer (constant weights, no activation or
    residual), else None."""
    if n is None or n.op != "dense" or len(n.inputs) not in (2, 3) or n.attrs \
            or any(t not in g.params for t in n.inputs[1:]):
        return None
    W = np.asarray(g.params[n.inputs[1]], np.float64)
    b = np.asarray(g.params[n.inputs[2]], np.float64).reshape(-1) if len(n.inputs) == 3 else np.zeros(W.shape[0])
    return n.inputs[0], W, b


def merge_dense_heads(graph: Graph) -> Graph:
    """An ``add`` of two dense layers of the same input, each read only there -- a distilled classifier's ``head``
    and ``head_dist`` (DeiT, EfficientFormer, LeViT), averaged -- as one dense layer of the summed weights and
    biases: one launch where three ran (two products and the add); the averaging scale after it then folds into
    the weights too (``fuse_epilogues``)."""
    g = graph.copy()
    merged = 0
    for node in list(g.nodes):
        if node.op != "add" or len(node.inputs) != 2 or node.attrs or node.inputs[0] == node.inputs[1]:
            continue
        sides = [_dense(g, g.producer(t)) if only_reader(g, t, node) else None for t in node.inputs]
        if any(s is None for s in sides) or sides[0][0] != sides[1][0] or sides[0][1].shape != sides[1][1].shape:
            continue
        (x, w1, b1), (_, w2, b2) = sides
        dense = Node("dense", node.name, [x, _add_param(g, f"{node.name}.w_sum", (w1 + w2).astype(np.float32)),
                                          _add_param(g, f"{node.name}.b_sum", (b1 + b2).astype(np.float32))],
                     list(node.outputs))
        dead = [g.producer(t) for t in node.inputs]
        g.nodes = [dense if n is node else n for n in g.nodes if all(n is not d for d in dead)]
        merged += 1
    return _drop_unused_params(g).validate() if merged else graph
