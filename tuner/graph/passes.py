"""Graph passes over the frontend's NCHW graph, each a pure function ``Graph -> Graph``:

- ``fold_batch_norm``: a BatchNorm after a convolution (or a dense layer, on (N, C)) scales its weights and
  shifts its bias; one with no convolution before it becomes a 1x1 depthwise convolution (a per-channel scale
  and shift) on NCHW, a per-channel ``mul`` and ``add`` on other ranks.
- ``fuse_epilogues``: a convolution or dense layer absorbs what follows it when nothing else reads the
  intermediate tensor: a constant per-channel multiply (a layer scale: its filters and bias scaled) or add (bias),
  an add of another activation (residual), then any
  activation (relu, clip, and every ``activation`` node's spec: hardswish, sigmoid, silu, gelu, ...) -- the
  kernels' epilogue order; a PReLU with one slope per channel is a convolution's or a group_norm's activation
  too (``prelu``, its slopes the ``slope`` param). Binary glue ops (add, sub, mul, div, prelu) that stay on their own absorb a
  following per-channel constant multiply (``scale``), an add of another activation (``residual``) and an
  activation, in that order; a windowed pool that keeps its size takes a binary op with another activation first
  (``post``): PoolFormer's ``x + ls * (pool(y) - y)`` is one kernel. A ``matmul`` of token tensors absorbs, in its
  template's order, a scalar multiply (``alpha``), adds of constants -- one per output column (a bias) or a whole
  one (``addend``: an attention bias before the softmax) --, an activation and an add of another activation
  (``residual``).
- ``fuse_input_gates``: squeeze-excite's ``x * s`` -- a ``mul`` of an (N, C, H, W) activation by an (N, C, 1, 1)
  one whose only reader is a (not depthwise) convolution -- becomes that convolution's ``in_scale``: it reads x
  times s as it loads its input, and the product is never stored.
- ``fuse_group_norm``: torch's GroupNorm export (Reshape, InstanceNormalization, Reshape) -> one NCHW
  ``group_norm``; a per-channel affine after it folds into its scale and bias.
- ``split_whole_reductions``: a ReduceMean / Max / Sum / L2 over (C, H, W) of an image runs over (H, W), then the
  channels: no work-item loops over a whole image.
- ``fuse_patterns``: x * sigmoid(x) -> silu, x * hardsigmoid(x) -> hardswish, the erf GELU -> gelu, StarReLU's
  relu(x)^2 * s + b -> starrelu(s, b).
- ``fold_pads``: a Pad read only by convolutions runs no kernel: zeros add to each convolution's padding; a
  reflection or edge Pad becomes the padding of convolutions that pad nothing themselves (``pad_mode``: the
  conv2d and Winograd templates read the reflected or edge pixel in place; a depthwise layer keeps its Pad).
"""
from __future__ import annotations

import math

import numpy as np

from tuner.graph.graph import Graph, Node, run_passes
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params, fresh_name as _fresh
from tuner.graph.graph import channel_constant as _channel_constant, only_reader as _only_reader
from tuner.ir.activations import canonical, parse, spec
from tuner.graph.passes_movement import fold_gathers_into_convs, pad_concat_parts  # last: gathers read by convolutions
from tuner.graph.passes_movement import (adds_into_depthwise, compose_gathers_into_copies, concats_written_as_tokens,
                                         fuse_concat_activations, slices_read_in_place)
from tuner.graph.passes_tokens import matmul_views  # last: copies around matmuls read and written in place
from tuner.graph.passes_io import model_io_ranks, pointwise_ranks  # first: tensors of any rank
from tuner.graph.passes_movement import SPATIAL_REDUCTIONS, _channel_gather, _reduction_lowers  # noqa: F401 - the template's reductions
from tuner.graph.passes_movement import optimize_movement  # layout rewrites first: ConvTranspose -> conv2d, NHWC blocks
from tuner.graph.passes_conv_transpose import crd_to_dcr  # after epilogue fusion: a PixelShuffle's conv2d in DCR order
from tuner.graph.passes_se import fuse_squeeze_excite  # after epilogue fusion: a squeeze-excite block as one node
from tuner.graph.passes_se import pool_rows_in_depthwise  # last: a block's pool from its depthwise producer
from tuner.graph.passes_attention import slice_activations_into_producers, softmax_into_reductions  # attention
from tuner.graph.passes_attention import divisions_into_copies, norms_read_in_place  # EdgeNeXt's normalized q, k
from tuner.graph.passes_layer_norm import (group_norm_into_convs, group_norm_past_permutations,  # norms inside
                                           group_norm_past_pooled_dense,  # their 1x1 readers, a head's dense, pools
                                           layer_norm_into_convs, norms_read_by_pools)
from tuner.graph.passes_patches import convolutions_write_patches  # noqa: E402 - MobileViT's unfold and fold
from tuner.graph.passes_reparam import merge_dense_heads, merge_depthwise_branches  # noqa: E402 - linear branches
from tuner.graph.passes_response_norm import (response_gates_in_convs,  # noqa: E402 - ConvNeXtV2's GRN as a gate,
                                              response_norm_as_gate)  # then computed by the convolution

ACTIVATION_OF_CLIP = {(0.0, 6.0): "relu6", (0.0, float("inf")): "relu"}
BINARY_OPS = ("add", "sub", "mul", "div", "prelu")  # glue kernels that apply an activation after themselves


def fold_batch_norm(graph: Graph) -> Graph:
    g = graph.copy()
    nodes = []
    for node in g.nodes:
        if node.op != "batch_norm":
            nodes.append(node)
            continue
        x, gamma, beta, mean, var = node.inputs
        scale = g.params[gamma] / np.sqrt(g.params[var].astype(np.float64) + node.attrs.get("epsilon", 1e-5))
        shift = g.params[beta] - g.params[mean] * scale
        conv = next((n for n in nodes if x in n.outputs), None)
        if conv is not None and conv.op == "conv2d" and _only_reader(g, x, node):
            w = g.params[conv.inputs[1]] * scale.reshape(-1, 1, 1, 1)
            b = (g.params[conv.inputs[2]] * scale if len(conv.inputs) > 2 else 0.0) + shift
            conv.inputs = [conv.inputs[0], _add_param(g, f"{conv.name}.w_bn", w),
                           _add_param(g, f"{conv.name}.b_bn", np.asarray(b))]
            conv.outputs = list(node.outputs)
            continue
        if conv is not None and conv.op == "dense" and _only_reader(g, x, node) and len(g.shapes[x]) == 2:
            w = g.params[conv.inputs[1]] * scale.reshape(-1, 1)  # (M, K): one row per output feature
            b = (g.params[conv.inputs[2]] * scale if len(conv.inputs) > 2 else 0.0) + shift
            conv.inputs = [conv.inputs[0], _add_param(g, f"{conv.name}.w_bn", w),
                           _add_param(g, f"{conv.name}.b_bn", np.asarray(b))]
            conv.outputs = list(node.outputs)
            continue
        rank = len(g.shapes[x])
        c = g.shapes[x][1]
        if rank != 4:  # (N, C) or (N, C, L): a per-channel multiply-add
            form = (1, c) + (1,) * (rank - 2)
            mid = _fresh(g, f"{node.name}.scaled")
            g.shapes[mid] = g.shapes[x]
            nodes.append(Node("mul", f"{node.name}.scale", [x, _add_param(g, f"{node.name}.scale",
                                                                           scale.reshape(form))], [mid]))
            nodes.append(Node("add", node.name, [mid, _add_param(g, f"{node.name}.shift", shift.reshape(form))],
                              list(node.outputs)))
            continue
        nodes.append(Node("conv2d", node.name, [x, _add_param(g, f"{node.name}.scale", scale.reshape(c, 1, 1, 1)),
                                                 _add_param(g, f"{node.name}.shift", shift)],
                          list(node.outputs), {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1),
                                               "groups": c}))
    g.nodes = nodes
    return _drop_unused_params(g).validate()


def _channel_affine(g: Graph, node: Node):
    """``(scale, shift)`` of a 1x1 depthwise convolution that only scales and shifts each channel (a BatchNorm no
    convolution before it could take: ``fold_batch_norm``'s), or None."""
    if node.op != "conv2d" or set(node.attrs) - {"stride", "padding", "dilation", "groups"} or len(node.inputs) > 3 \
            or not all(t in g.params for t in node.inputs[1:]) or len(g.shapes[node.inputs[0]]) != 4:
        return None
    c, w = g.shapes[node.inputs[0]][1], g.params[node.inputs[1]]
    if w.shape != (c, 1, 1, 1) or node.attrs.get("groups", 1) != c \
            or tuple(node.attrs.get("stride", (1, 1))) != (1, 1) or any(node.attrs.get("padding", (0, 0, 0, 0))):
        return None
    shift = g.params[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(c)
    return np.asarray(w, np.float64).reshape(c), np.asarray(shift, np.float64).reshape(c)


def channel_affines_into_convs(graph: Graph) -> Graph:
    """A per-channel scale and shift (``_channel_affine``) read only by convolutions of groups 1 without padding
    folds into their weights and biases -- ``W[o, c] * scale[c]``, ``bias[o] + sum(W[o, c] * shift[c])`` over c and
    the window, exact where no tap reads padding: InceptionNeXt's BatchNorm after the concat of its token mixer,
    before the MLP's 1x1 convolution (a launch a block)."""
    g = graph.copy()
    for node in list(g.nodes):
        affine = _channel_affine(g, node)
        out = node.outputs[0]
        readers = g.consumers(out)
        if affine is None or out in g.outputs or not readers or not all(
                r.op == "conv2d" and r.attrs.get("groups", 1) == 1 and r.inputs[0] == out
                and r.inputs.count(out) == 1 and not any(r.attrs.get("padding", (0, 0, 0, 0)))
                and set(r.attrs) <= {"stride", "padding", "dilation", "groups", "activation"}
                and all(t in g.params for t in r.inputs[1:3]) for r in readers):
            continue
        scale, shift = affine
        for r in readers:
            w = np.asarray(g.params[r.inputs[1]], np.float64)
            b = np.asarray(g.params[r.inputs[2]], np.float64) if len(r.inputs) > 2 else np.zeros(w.shape[0])
            bias = b + np.einsum("ocrs,c->o", w, shift)
            r.inputs = [node.inputs[0], _add_param(g, f"{r.name}.w_affine", (w * scale.reshape(1, -1, 1, 1))
                                                   .astype(np.float32)),
                        _add_param(g, f"{r.name}.b_affine", bias.astype(np.float32))] + r.inputs[3:]
        g.nodes = [m for m in g.nodes if m is not node]
    _drop_unused_params(g)
    return _drop_dead_shapes(g).validate()


REDUCTIONS = ("reduce_mean", "reduce_max", "reduce_sum", "reduce_l2")


def split_whole_reductions(graph: Graph) -> Graph:
    """A reduction of a 4-D tensor over (C, H, W) -- one value per image, which one work-item would loop over --
    in two: over (H, W) (the ``spatial_reduce`` template, a parallel schedule) then over the channels (C / 4 pixels
    a work-item). Mean, max, sum and L2 all compose so (an L2 of per-channel L2s is the L2 of the whole)."""
    if not any(n.op in REDUCTIONS for n in graph.nodes):
        return graph
    g = graph.copy()
    nodes = []
    for n in g.nodes:
        shape = g.shapes[n.inputs[0]] if n.op in REDUCTIONS else ()
        if n.op in REDUCTIONS and len(shape) == 4 and tuple(n.attrs.get("axes", ())) == (1, 2, 3) and \
                int(n.attrs.get("keepdims", 1)) and shape[2] * shape[3] > 1:
            mid = _fresh(g, f"{n.outputs[0]}.per_channel")
            g.shapes[mid] = (shape[0], shape[1], 1, 1)
            nodes.append(Node(n.op, f"{n.name}.spatial", [n.inputs[0]], [mid], {**n.attrs, "axes": (2, 3)}))
            n = Node(n.op, n.name, [mid], list(n.outputs), {**n.attrs, "axes": (1, 2, 3)})
        nodes.append(n)
    g.nodes = nodes
    return g.validate()


def fuse_group_norm(graph: Graph) -> Graph:
    """torch's GroupNorm export -- ``reshape`` (N, C, H, W) -> (N, G, C/G*H*W), ``group_norm`` (one group per
    row, the InstanceNormalization) and ``reshape`` back to (N, C, H, W) -- becomes one NCHW ``group_norm``
    with G groups (its per-group scale and bias repeated per channel); then a per-channel ``mul`` and ``add``
    of constants after any NCHW ``group_norm`` (GroupNorm's affine) fold into its scale and bias."""
    g = graph.copy()
    for node in list(g.nodes):
        if node.op != "group_norm" or len(g.shapes[node.inputs[0]]) != 3:
            continue
        r1, r2 = g.producer(node.inputs[0]), None
        readers = g.consumers(node.outputs[0])
        if len(readers) == 1 and node.outputs[0] not in g.outputs:
            r2 = readers[0]
        if r1 is None or r2 is None or r1.op != "reshape" or r2.op != "reshape":
            continue
        x = r1.inputs[0]
        shape = tuple(g.shapes[x])
        n, groups, _ = g.shapes[node.inputs[0]]
        if (len(shape) != 4 or tuple(g.shapes[r2.outputs[0]]) != shape or shape[0] != n or shape[1] % groups
                or not _only_reader(g, r1.outputs[0], node)):
            continue
        rep = shape[1] // groups
        ins = [x] + [_add_param(g, f"{t}.per_channel", np.repeat(np.asarray(g.params[t]).reshape(-1), rep))
                     for t in node.inputs[1:]]
        fused = Node("group_norm", node.name, ins, list(r2.outputs), dict(node.attrs, groups=groups))
        g.nodes = [fused if m is node else m for m in g.nodes if m is not r1 and m is not r2]
    for node in g.nodes:
        if node.op != "group_norm" or len(g.shapes[node.outputs[0]]) != 4:
            continue
        c = g.shapes[node.outputs[0]][1]
        while True:
            out = node.outputs[0]
            readers = g.consumers(out)
            if out in g.outputs or len(readers) != 1 or readers[0].op not in ("mul", "add"):
                break
            nxt = readers[0]
            const = _channel_constant(g, _other(nxt, out), c, 4) if nxt.inputs.count(out) == 1 else None
            if const is None:
                break
            scale, bias = (np.asarray(g.params[t], np.float64) for t in node.inputs[1:])
            if nxt.op == "mul":
                scale, bias = scale * const, bias * const
            else:
                bias = bias + const
            node.inputs = [node.inputs[0], _add_param(g, f"{node.name}.scale", scale),
                           _add_param(g, f"{node.name}.bias", bias)]
            node.outputs = list(nxt.outputs)
            g.nodes = [m for m in g.nodes if m is not nxt]
    return _drop_dead_shapes(_drop_unused_params(g)).validate()


def _drop_dead_shapes(g: Graph) -> Graph:
    produced = {t for n in g.nodes for t in n.outputs} | set(g.inputs) | set(g.params)
    for name in [t for t in g.shapes if t not in produced]:
        del g.shapes[name]
    return g


def _activation(node: Node) -> str | None:
    """The activation spec (tuner.ir.activations) a node applies, if it is a unary activation."""
    if node.op == "relu":
        return "relu"
    if node.op == "clip":
        lo, hi = float(node.attrs.get("min", -np.inf)), float(node.attrs.get("max", np.inf))
        return ACTIVATION_OF_CLIP.get((lo, hi)) or spec("clip", lo, hi)
    if node.op == "activation":
        return canonical(node.attrs["fn"])
    return None


def _scalar_param(g: Graph, name: str) -> float | None:
    """The value of a param whose elements are all equal, else None."""
    if name not in g.params:
        return None
    v = np.asarray(g.params[name]).reshape(-1)
    return float(v[0]) if v.size and np.all(v == v[0]) else None


def _other(node: Node, name: str) -> str:
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def fuse_patterns(graph: Graph) -> Graph:
    """Activations exporters spell as several nodes become one ``activation`` node (so that they fuse into the
    kernel before them): ``x * sigmoid(x)`` -> silu, ``x * hardsigmoid(x)`` (alpha 1/6, beta 0.5) -> hardswish,
    ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (either association of the 0.5) -> gelu, ``relu(x) ** 2`` then a multiply
    and an add of scalar constants (either or both) -> starrelu(scale, bias) (PoolFormerV2's StarReLU). Only when
    nothing else reads the intermediate tensors."""
    g = graph.copy()

    def sole(t: str):
        readers = g.consumers(t)
        return readers[0] if len(readers) == 1 and t not in g.outputs else None

    def replace(dead: list, last: Node, x: str, fn: str):
        last_index = g.nodes.index(last)
        g.nodes[last_index] = Node("activation", last.name, [x], list(last.outputs), {"fn": fn})
        g.nodes = [n for n in g.nodes if all(n is not d for d in dead)]

    for node in list(g.nodes):
        if not any(n is node for n in g.nodes):
            continue
        if _activation(node) == "relu" and (sq := sole(node.outputs[0])) is not None and sq.op == "unary" \
                and sq.attrs.get("fn") == "square":
            chain, scale, bias = [node, sq], 1.0, 0.0  # StarReLU: relu(x)^2, then a scalar multiply and add
            m = sole(sq.outputs[0])
            if m is not None and m.op == "mul" and len(m.inputs) == 2 and \
                    (v := _scalar_param(g, _other(m, sq.outputs[0]))) is not None and \
                    tuple(g.shapes[m.outputs[0]]) == tuple(g.shapes[sq.outputs[0]]):
                chain, scale = chain + [m], v
            a = sole(chain[-1].outputs[0])
            if a is not None and a.op == "add" and len(a.inputs) == 2 and \
                    (v := _scalar_param(g, _other(a, chain[-1].outputs[0]))) is not None and \
                    tuple(g.shapes[a.outputs[0]]) == tuple(g.shapes[sq.outputs[0]]):
                chain, bias = chain + [a], v
            if all(math.isfinite(v) for v in (scale, bias)):
                replace(chain[:-1], chain[-1], node.inputs[0], spec("starrelu", scale, bias))
        elif node.op == "activation" and parse(node.attrs["fn"])[0] in ("sigmoid", "hardsigmoid"):
            name, params = parse(node.attrs["fn"])
            fused = "silu" if name == "sigmoid" else (
                "hardswish" if abs(params[0] - 1 / 6) < 1e-6 and params[1] == 0.5 else None)
            x, m = node.inputs[0], sole(node.outputs[0])
            if fused and m is not None and m.op == "mul" and sorted(m.inputs) == sorted([x, node.outputs[0]]):
                replace([node], m, x, fused)
        elif node.op == "erf":
            div = g.producer(node.inputs[0])
            if div is None or div.op != "mul" or len(g.consumers(node.inputs[0])) != 1:
                continue
            x = div.inputs[0]
            if x in g.params or abs((_scalar_param(g, div.inputs[1]) or 0) - 2 ** -0.5) > 1e-6:
                continue
            add = sole(node.outputs[0])
            if add is None or add.op != "add" or _scalar_param(g, _other(add, node.outputs[0])) != 1.0:
                continue
            m = sole(add.outputs[0])
            if m is None or m.op != "mul":
                continue
            other = _other(m, add.outputs[0])
            if other == x:  # (x * (1 + erf)) * 0.5
                half = sole(m.outputs[0])
                if half is not None and half.op == "mul" and _scalar_param(g, _other(half, m.outputs[0])) == 0.5:
                    replace([div, node, add, m], half, x, "gelu")
            else:  # (x * 0.5) * (1 + erf)
                h = g.producer(other)
                if (h is not None and h.op == "mul" and x in h.inputs and len(g.consumers(other)) == 1
                        and _scalar_param(g, _other(h, x)) == 0.5):
                    replace([div, node, add, h], m, x, "gelu")
    return _drop_unused_params(g).validate()


def _conv_cost(g: Graph, node: Node) -> tuple:
    """(multiply-adds, kernel taps) of a conv2d: the order in which residual candidates are preferred."""
    w = g.shapes.get(node.inputs[1]) or np.shape(g.params.get(node.inputs[1]))
    out = g.shapes[node.outputs[0]]
    taps = int(np.prod(w[2:])) if len(w) > 2 else 1
    return int(np.prod(out)) * int(w[1]) * taps, taps


def canonical_residuals(graph: Graph) -> Graph:
    """Which convolution takes a residual Add must not depend on the order of the Add's operands, nor on the
    order the exporter listed the two branches in: torchvision lists a ResNet block's operands the other way
    round from the zoo, the residual then fused into the 1x1 downsample convolution instead of the 3x3 one,
    and the tasks no longer matched the log. The rule: where both operands of an Add are the only output of
    a conv2d read by nothing else, the Add fuses into the costlier convolution (more multiply-adds, then the
    larger kernel; the main branch of a residual block); that convolution is moved after the other (it reads
    neither's output, so the move is safe), and ``fuse_epilogues`` fuses the Add into it."""
    g = graph.copy()
    for add in [n for n in g.nodes if n.op == "add" and len(n.inputs) == 2 and n.inputs[0] != n.inputs[1]]:
        convs = [g.producer(x) for x in add.inputs]
        if any(c is None or c.op != "conv2d" or len(c.outputs) != 1 or "residual" in c.attrs
               or len(g.consumers(c.outputs[0])) != 1 or c.outputs[0] in g.outputs for c in convs):
            continue
        if g.shapes[add.inputs[0]] != g.shapes[add.inputs[1]]:
            continue
        first, second = sorted(convs, key=lambda c: g.nodes.index(c))
        target = max(convs, key=lambda c: _conv_cost(g, c) + (g.nodes.index(c),))  # a tie: keep the later one
        if target is first:
            g.nodes.remove(first)
            g.nodes.insert(g.nodes.index(second) + 1, first)
    return g


def _depthwise(g: Graph, conv: Node) -> bool:
    """Whether the conv2d node ``conv`` is one the depthwise template runs (its own epilogue, no residual scale)."""
    from tuner.templates.common import is_depthwise  # the graph passes import tuner.templates lazily
    return is_depthwise(g.shapes[conv.inputs[0]], g.shapes[conv.inputs[1]], conv.attrs.get("groups", 1))


FUSED_OPERANDS = ("post", "scale", "residual")  # a node's fused operands, in its attrs only until fuse_epilogues
# ends (then appended to its inputs)


def _scaled_residual(g: Graph, node: Node, nxt: Node, other: str, order: dict):
    """``(x, scale param)`` where the residual ``other`` that ``nxt`` adds is ``x`` times a per-channel constant,
    ``nxt`` the multiply's only reader (no other node's inputs or fused operands name it) and ``x`` ready before
    ``node`` (PoolFormerV2's ``res_scale``: ``x * r + ls * mixer(x)``), for ``node`` to scale ``x`` as it adds it
    (``residual_scale``); else None."""
    p = g.producer(other)
    if p is None or p.op != "mul" or p.attrs or len(p.inputs) != 2 or other in g.outputs \
            or g.consumers(other) != [nxt] or any(other in (n.attrs.get(k) for k in FUSED_OPERANDS)
                                                  for n in g.nodes):
        return None
    shape = g.shapes[other]
    for x, c in (p.inputs, p.inputs[::-1]):
        scale = _channel_constant(g, c, shape[1], len(shape))
        if scale is not None and x not in g.params and tuple(g.shapes[x]) == tuple(shape):
            q = g.producer(x)
            if q is None or order[q.name] < order[node.name]:
                return x, _add_param(g, f"{p.name}.residual_scale", scale)
    return None


def _take_residual(g: Graph, node: Node, nxt: Node, other: str, order: dict, scales: bool) -> bool:
    """``node`` takes ``other``, the activation ``nxt`` adds, as its ``residual`` -- read unscaled and scaled as it
    is added where it is a Mul by a per-channel constant and ``scales`` (``_scaled_residual``: the Mul dropped);
    False, taking nothing, where ``other`` is not ready when ``node`` runs."""
    p = g.producer(other)
    scaled = _scaled_residual(g, node, nxt, other, order) if scales else None
    if scaled is not None:  # the multiply's input is ready (the multiply itself may come later)
        other, node.attrs["residual_scale"] = scaled
        g.nodes = [n for n in g.nodes if n is not p]
    elif p is not None and order[p.name] > order[node.name]:
        return False
    node.attrs["residual"] = other
    return True


def _binary_epilogue(g: Graph, node: Node, nxt: Node, out: str, order: dict, scales_residual: bool = False) -> bool:
    """A binary glue op (no activation yet) absorbs a following multiply by a per-channel constant (``scale``, a
    layer scale), then an add of another activation of its shape (``residual``); True if it took ``nxt``.
    ``scales_residual`` (a pool's kernel): a residual that is an activation times a per-channel constant is read
    unscaled and scaled as it is added (``residual_scale``), its multiply dropped."""
    if nxt.op not in ("mul", "add") or len(nxt.inputs) != 2 or "activation" in node.attrs \
            or "residual" in node.attrs or nxt.inputs.count(out) != 1 \
            or len(g.shapes[out]) not in (2, 4) or node.op == "add" or any(t in g.params for t in node.inputs[:2]):
        return False  # an add, or an op with a constant operand, may lower to the elementwise kernel: no epilogue
    other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
    shape = g.shapes[out]
    if nxt.op == "mul" and "scale" not in node.attrs:
        scale = _channel_constant(g, other, shape[1], len(shape))
        if scale is None:
            return False
        node.attrs["scale"] = _add_param(g, f"{node.name}.scale", scale)
        return True
    if nxt.op == "add" and other not in g.params and tuple(g.shapes[other]) == tuple(shape):
        return _take_residual(g, node, nxt, other, order, scales_residual)
    return False


POOLS = ("avg_pool", "max_pool")  # windowed pools: glue kernels that take a binary op, a scale and a residual
def _reduction_takes_activation(g: Graph, node: Node) -> bool:
    """A reduction the spatial_reduce template lowers (``_reduction_lowers``) with no activation yet."""
    return _reduction_lowers(g, node) and "activation" not in node.attrs and len(node.inputs) == 1


def _pool_epilogue(g: Graph, node: Node, nxt: Node, out: str, order: dict) -> bool:
    """A pool that keeps its input's size (stride 1, padded: not one a reduction template runs) absorbs a
    following binary op with another activation of its shape (``post``), then ``_binary_epilogue``'s scale and
    residual; True if it took ``nxt``."""
    if "post" in node.attrs:
        return _binary_epilogue(g, node, nxt, out, order, scales_residual=True)
    shape = tuple(g.shapes[out])
    if (nxt.op not in ("add", "sub", "mul", "div") or len(nxt.inputs) != 2 or nxt.inputs.count(out) != 1
            or shape != tuple(g.shapes[node.inputs[0]]) or shape[2:] == (1, 1) or "activation" in nxt.attrs):
        return False
    other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
    if other in g.params or tuple(g.shapes[other]) != shape or (nxt.inputs[0] != out and nxt.op in ("sub", "div")):
        return False
    p = g.producer(other)
    if p is not None and order[p.name] > order[node.name]:
        return False
    node.attrs["post"], node.attrs["post_op"] = other, nxt.op
    return True


def _matmul_epilogue(g: Graph, node: Node, nxt: Node, out: str, order: dict) -> bool:
    """A token ``matmul`` (output (B, N, 1, M), its storage view) absorbs ``nxt`` where the template's epilogue
    order -- alpha, bias and addend, activation, residual -- allows; True if it took it."""
    a, shape = node.attrs, tuple(g.shapes[out])
    if not a.get("tokens") or len(nxt.inputs) > 2 or nxt.inputs.count(out) != 1 or "residual" in a:
        return False
    act = _activation(nxt)
    if act is not None:
        if "activation" in a:
            return False
        a["activation"] = act
        return True
    other = _other(nxt, out) if len(nxt.inputs) == 2 else None
    if nxt.op == "mul" and (scale := _scalar_param(g, other)) is not None and "activation" not in a \
            and len(node.inputs) == 2 and "addend" not in a:
        a["alpha"] = float(a.get("alpha", 1.0)) * scale
        return True
    if nxt.op != "add" or other is None:
        return False
    if other in g.params:
        if "activation" in a:
            return False
        per_column = _channel_constant(g, other, shape[1], 4)
        if per_column is not None:
            bias = [t for t in node.inputs[2:] if t != a.get("addend")]
            old = np.asarray(g.params[bias[0]], np.float32).reshape(-1) if bias else 0.0
            new = _add_param(g, f"{node.name}.bias", old + per_column)
            node.inputs = node.inputs[:2] + [new] + [t for t in node.inputs[2:] if t not in bias]
            return True
        try:
            full = np.broadcast_to(np.asarray(g.params[other], np.float32), shape)
        except ValueError:
            return False
        if np.array_equal(np.broadcast_to(full[:1], shape), full):
            full = full[:1]
        if "addend" in a:
            old = np.asarray(g.params[a["addend"]], np.float32)
            full = old + full if old.shape[0] >= full.shape[0] else full + old
            node.inputs = [t for t in node.inputs if t != a["addend"]]
        a["addend"] = _add_param(g, f"{node.name}.addend", full)
        node.inputs = node.inputs + [a["addend"]]
        return True
    if tuple(g.shapes[other]) != shape:
        return False
    p = g.producer(other)
    if p is not None and order[p.name] > order[node.name]:
        return False  # the other operand is not ready when the product runs
    a["residual"] = other
    return True


def _prelu_slope(g: Graph, node: Node, nxt: Node, out: str) -> np.ndarray | None:
    """The (C,) slopes of a PReLU ``nxt`` of ``out`` with one constant slope per channel (FSRCNN's after every
    convolution), which a convolution with no activation yet applies in its epilogue; else None."""
    if nxt.op != "prelu" or "activation" in node.attrs or nxt.inputs[0] != out or len(nxt.inputs) != 2 \
            or nxt.inputs[1] == out or len(g.shapes[out]) != 4 or set(nxt.attrs) - {"activation"}:
        return None
    return _channel_constant(g, nxt.inputs[1], g.shapes[out][1], 4)


def _norm_residual(g: Graph, node: Node, nxt: Node, out: str, order: dict) -> str | None:
    """The other operand of an ``add`` after a group_norm (no residual or activation yet) when it is an activation
    of the same NCHW shape computed before the norm: a residual block's ``norm(conv(x)) + x`` (the style-transfer
    net's InstanceNorm), the template's ``residual``; else None."""
    if nxt.op != "add" or len(nxt.inputs) != 2 or nxt.inputs.count(out) != 1 or len(g.shapes[out]) != 4 \
            or any(k in node.attrs for k in ("activation", "residual")):
        return None
    other = _other(nxt, out)
    if other in g.params or tuple(g.shapes[other]) != tuple(g.shapes[out]):
        return None
    p = g.producer(other)
    return None if p is not None and order[p.name] > order[node.name] else other


PURE_COPIES = ("strided_copy",)  # movement that only gathers elements (no fill value): an activation commutes with it
ACTIVATION_TAKERS = ("conv2d", "matmul", "dense")  # producers whose epilogue takes an activation (fuse_epilogues)


def activations_before_copies(graph: Graph) -> Graph:
    """An activation applied to a strided copy of a convolution's or matmul's output (PVTv2's ``GELU(reshape(dwconv(x)))``:
    the copy reshapes the map to tokens) is applied before the copy instead -- an elementwise function commutes
    with a gather -- so that ``fuse_epilogues`` folds it into the producer's epilogue; before, it was a kernel of its
    own after the copy. Only where the copy and the activation each have one reader and the producer no
    activation yet."""
    g = graph.copy()
    moved = 0
    for act in list(g.nodes):
        if _activation(act) is None or len(act.inputs) != 1:
            continue
        copy = g.producer(act.inputs[0])
        if copy is None or copy.op not in PURE_COPIES or len(copy.inputs) != 1 or \
                not _only_reader(g, act.inputs[0], act):
            continue
        src = g.producer(copy.inputs[0])
        if src is None or src.op not in ACTIVATION_TAKERS or "activation" in src.attrs or \
                not _only_reader(g, copy.inputs[0], copy):
            continue
        mid = _fresh(g, f"{copy.inputs[0]}.act")
        g.shapes[mid] = g.shapes[copy.inputs[0]]
        out = act.outputs[0]
        new_act = Node(act.op, act.name, [copy.inputs[0]], [mid], dict(act.attrs))
        new_copy = Node(copy.op, copy.name, [mid], [out], dict(copy.attrs))
        g.nodes = [new_act if n is copy else new_copy if n is act else n for n in g.nodes]
        moved += 1
    return g.validate() if moved else graph


def fuse_epilogues(graph: Graph) -> Graph:
    g = canonical_residuals(graph)
    order = {n.name: i for i, n in enumerate(g.nodes)}
    removed: set = set()
    for node in g.nodes:
        if node.name in removed or node.op not in ("conv2d", "dense", "group_norm", "layer_norm", "matmul") + \
                BINARY_OPS + POOLS + SPATIAL_REDUCTIONS:
            continue
        while True:
            out = node.outputs[0]
            readers = g.consumers(out)
            if out in g.outputs or len(readers) != 1:
                break
            nxt = readers[0]
            act = _activation(nxt)
            if node.op in SPATIAL_REDUCTIONS:
                if act is None or not _reduction_takes_activation(g, node):
                    break
                node.attrs["activation"] = act
            elif node.op == "matmul":
                if not _matmul_epilogue(g, node, nxt, out, order):
                    break
            elif node.op in POOLS:
                if not _pool_epilogue(g, node, nxt, out, order):
                    break
            elif act is not None and "activation" not in node.attrs:
                node.attrs["activation"] = act
            elif node.op == "group_norm" and (other := _norm_residual(g, node, nxt, out, order)) is not None:
                node.attrs["residual"] = other
            elif node.op in ("conv2d", "group_norm") and (slope := _prelu_slope(g, node, nxt, out)) is not None:
                node.attrs["activation"], node.attrs["slope"] = "prelu", _add_param(g, f"{node.name}.slope", slope)
            elif (nxt.op == "mul" and node.op in ("conv2d", "dense") and "activation" not in node.attrs
                  and "residual" not in node.attrs and node.inputs[1] in g.params
                  and (scale := _channel_constant(g, nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0],
                                                  g.shapes[out][1], len(g.shapes[out]))) is not None):
                w = g.params[node.inputs[1]]  # a layer scale: the filters and the bias scaled per output channel
                ins = [node.inputs[0],
                       _add_param(g, f"{node.name}.w_scaled", w * scale.reshape((-1,) + (1,) * (w.ndim - 1)))]
                if len(node.inputs) > 2:
                    ins.append(_add_param(g, f"{node.name}.b_scaled", g.params[node.inputs[2]] * scale))
                node.inputs = ins
            elif node.op in BINARY_OPS and _binary_epilogue(g, node, nxt, out, order):
                pass
            elif nxt.op == "add" and node.op in ("conv2d", "dense") and "activation" not in node.attrs:
                other = nxt.inputs[1] if nxt.inputs[0] == out else nxt.inputs[0]
                shape = g.shapes[out]
                const = _channel_constant(g, other, shape[1], len(shape))
                if const is not None:
                    bias = g.params[node.inputs[2]] if len(node.inputs) > 2 else 0.0
                    b = _add_param(g, f"{node.name}.b_add", np.asarray(bias + const, np.float32))
                    node.inputs = node.inputs[:2] + [b]
                elif (node.op == "conv2d" and "residual" not in node.attrs and other not in g.params
                      and g.shapes[other] == shape and nxt.inputs.count(out) == 1):
                    if not _take_residual(g, node, nxt, other, order, scales=not _depthwise(g, node)):
                        break  # the other operand is not ready when this convolution runs (the conv2d template
                        # scales a residual, the depthwise one does not)
                else:
                    break
            else:
                break
            node.outputs = list(nxt.outputs)
            removed.add(nxt.name)
            g.nodes = [n for n in g.nodes if n is not nxt]
    for node in g.nodes:  # the residual is an input like the others (the executor binds inputs by position)
        if "post" in node.attrs:
            node.inputs = node.inputs + [node.attrs["post"]]
        if "scale" in node.attrs:
            node.inputs = node.inputs + [node.attrs["scale"]]
        if "residual" in node.attrs:
            node.inputs = node.inputs + [node.attrs["residual"]]
        if "residual_scale" in node.attrs:
            node.inputs = node.inputs + [node.attrs["residual_scale"]]
        if "slope" in node.attrs:
            node.inputs = node.inputs + [node.attrs["slope"]]
    return _drop_unused_params(g).validate()


def _norms_after_flatten(g: Graph) -> Graph:
    """A LayerNorm over the channels of (N, C, 1, 1) maps read only by a Flatten (or Reshape) to (N, C) runs after
    it, on the rows: EdgeNeXt's and ConvNeXt's head (pool, LayerNorm2d, Flatten), so that the pool writes the rows
    and no relayout is left between the layouts. In place; ``flatten_into_reductions`` then takes the pool."""
    for node in list(g.nodes):
        src = node.inputs[0] if node.op == "layer_norm" else None
        flat = g.consumers(node.outputs[0]) if src is not None else []
        if len(flat) != 1 or flat[0].op not in ("flatten", "reshape") or node.outputs[0] in g.outputs \
                or node.attrs.get("axis") not in (1, -3) or set(node.attrs) - {"axis", "epsilon", "activation"} \
                or len(g.shapes[src]) != 4 or tuple(g.shapes[src][2:]) != (1, 1) \
                or tuple(g.shapes[flat[0].outputs[0]]) != tuple(g.shapes[src][:2]):
            continue
        rows = _fresh(g, f"{src}.rows")
        g.shapes[rows] = tuple(g.shapes[src][:2])
        g.nodes.insert(g.nodes.index(node), Node("flatten", f"{node.name}.flatten", [src], [rows], {}))
        node.inputs = [rows] + node.inputs[1:]
        node.outputs, node.attrs = list(flat[0].outputs), {**node.attrs, "axis": 1}
        g.nodes = [m for m in g.nodes if m is not flat[0]]
    return _drop_dead_shapes(g)


def flatten_into_reductions(graph: Graph) -> Graph:
    """A reduction over (H, W) of an NCHW tensor that keeps its rank (a global pool, ReduceMean / Max / Sum / L2
    with keepdims) read only by a Flatten or a Reshape to (N, C) -- a classifier head's GAP then Flatten --
    becomes one reduction with keepdims=0: the spatial_reduce template writes the (N, C) rows itself and the
    relayout between the two layouts runs no kernel (issue 55). First a LayerNorm between the pool and the
    Flatten moves after the Flatten (``_norms_after_flatten``)."""
    g = _norms_after_flatten(graph.copy())
    kinds = {"global_avg_pool": "reduce_mean", "global_max_pool": "reduce_max", "reduce_mean": "reduce_mean",
             "reduce_max": "reduce_max", "reduce_sum": "reduce_sum", "reduce_l2": "reduce_l2"}
    for node in list(g.nodes):
        out = node.outputs[0]
        if node.op not in kinds or len(g.shapes[node.inputs[0]]) != 4 or out in g.outputs or len(node.inputs) != 1:
            continue
        if not node.op.startswith("global_") and (tuple(sorted(int(a) for a in node.attrs.get("axes", ()))) != (2, 3)
                                                  or not node.attrs.get("keepdims", 1)):
            continue
        readers = g.consumers(out)
        n, c = g.shapes[out][:2]
        if len(readers) != 1 or readers[0].op not in ("flatten", "reshape") or \
                tuple(g.shapes[readers[0].outputs[0]]) != (n, c):
            continue
        flat = readers[0]
        attrs = {k: v for k, v in node.attrs.items() if k == "activation"}
        node.op, node.attrs = kinds[node.op], {**attrs, "axes": (2, 3), "keepdims": 0}
        node.outputs = list(flat.outputs)
        g.nodes = [m for m in g.nodes if m is not flat]
    return g.validate()


def fuse_reduction_weights(graph: Graph) -> Graph:
    """A sum or mean over (H, W) (or one of them) of ``x * w`` -- two activations, ``w`` of x's shape or one value
    a position (N, 1, H, W): MobileViTv2's context vector, the keys weighted by the softmaxed query -- reads the
    product as it reduces (the spatial_reduce template's ``weight`` prologue, ``attrs["weight"]`` its input
    after x); the product is never stored (issue 55: a binary op of two activations into its consumer)."""
    g = graph.copy()
    for node in list(g.nodes):
        if node.op not in ("reduce_mean", "reduce_sum", "global_avg_pool") or "weight" in node.attrs \
                or len(node.inputs) != 1 or len(g.shapes[node.inputs[0]]) != 4:
            continue
        if node.op != "global_avg_pool":
            axes = tuple(sorted(int(a) for a in node.attrs.get("axes", ())))
            if axes not in ((2, 3), (2,), (3,)) or (not node.attrs.get("keepdims", 1) and axes != (2, 3)):
                continue
        mul = g.producer(node.inputs[0])
        if mul is None or mul.op != "mul" or len(mul.inputs) != 2 or mul.attrs or mul.outputs[0] in g.outputs \
                or g.consumers(mul.outputs[0]) != [node] or any(t in g.params or t in g.inputs for t in mul.inputs):
            continue
        shape = tuple(g.shapes[mul.outputs[0]])
        for x, w in (mul.inputs, mul.inputs[::-1]):
            ws = tuple(g.shapes[w])
            if tuple(g.shapes[x]) == shape and (ws == shape or ws == (shape[0], 1, *shape[2:])) and x != w:
                node.inputs, node.attrs = [x, w], {**node.attrs, "weight": w}
                g.nodes = [m for m in g.nodes if m is not mul]
                break
    return g.validate()


def _channel_range(g: Graph, n: Node) -> tuple | None:
    """``(start, count)`` of a ``slice`` node that takes a contiguous run of channels of a 4-D tensor, every row
    and column; else None."""
    ch = _channel_gather(g, n)
    if ch is None:
        return None
    return (ch[0], len(ch)) if ch and ch == tuple(range(ch[0], ch[0] + len(ch))) else None


def align_channel_slices(graph: Graph) -> Graph:
    """A convolution whose output only channel slices read (MobileViTv2's qkv projection split into a 1-channel
    query, d keys and d values: offsets 1 and 1 + d) writes its channels in another order -- the slices whose
    length is a multiple of 4 first, then the others -- so that as many slices as possible start at an RGBA pixel
    and can be read in place (``slices_read_in_place``) or composed into copies at whole pixels. The filters, the
    bias and a PReLU's slopes are permuted with the channels; the slices' indices follow (issue 55)."""
    g = graph.copy()
    for conv in [n for n in g.nodes if n.op == "conv2d"]:
        out = conv.outputs[0]
        readers = g.consumers(out)
        ranges = [_channel_range(g, r) for r in readers]
        if out in g.outputs or not readers or None in ranges or conv.inputs[1] not in g.params \
                or any(k in conv.attrs for k in ("residual", "in_scale")) \
                or all(start % 4 == 0 for start, _ in ranges):
            continue
        distinct = sorted(set(ranges))
        if any(a[0] + a[1] > b[0] for a, b in zip(distinct, distinct[1:])):
            continue  # overlapping slices
        o = g.shapes[out][1]
        order = [r for r in distinct if r[1] % 4 == 0] + [r for r in distinct if r[1] % 4]
        covered = {c for start, count in distinct for c in range(start, start + count)}
        perm = [c for start, count in order for c in range(start, start + count)] + \
            [c for c in range(o) if c not in covered]
        new_start, at = {}, 0
        for r in order:
            new_start[r], at = at, at + r[1]
        if all(new_start[r] == r[0] for r in distinct):
            continue
        idx = np.asarray(perm)
        renamed = {t: _add_param(g, f"{t}.aligned", np.asarray(g.params[t])[idx])  # filters, bias, slopes
                   for i, t in enumerate(conv.inputs) if i == 1 or (i >= 2 and t in g.params)}
        conv.inputs = [renamed.get(t, t) for t in conv.inputs]
        if conv.attrs.get("slope") is not None:
            conv.attrs["slope"] = renamed[conv.attrs["slope"]]
        for r, rng in zip(readers, ranges):
            start = new_start[rng]
            r.attrs = {**r.attrs, "channels": tuple(range(start, start + rng[1]))}
    return _drop_unused_params(g).validate()


def _is_gate(xs: tuple, ss: tuple) -> bool:
    """Whether an activation of shape ``ss`` can gate an (N, C, H, W) one of ``xs`` as a convolution reads it:
    one value a channel (N, C, 1, 1), or one a channel and row (N, C, H, 1) -- timm's MobileViTv2 context over the
    patches, per patch position (``Conv2dWorkload.scale_rows``)."""
    return len(xs) == 4 and (ss == (xs[0], xs[1], 1, 1) or (ss == (xs[0], xs[1], xs[2], 1) and xs[3] > 1))


def _gate_operands(g: Graph, node: Node):
    """``(x, s)`` of a ``mul`` of an (N, C, H, W) activation by an (N, C, 1, 1) or (N, C, H, 1) activation
    (``_is_gate``), else None."""
    if node.op != "mul" or len(node.inputs) != 2 or "activation" in node.attrs \
            or any(t in g.params for t in node.inputs):
        return None
    order = {t: i for i, n in enumerate(g.nodes) for t in n.outputs}
    # where both are (N, C, 1, 1), the gate is the one computed later (from the other: a pool, then a squeeze)
    for x, s in sorted((node.inputs, node.inputs[::-1]), key=lambda xs: -order.get(xs[1], -1)):
        xs, ss = tuple(g.shapes[x]), tuple(g.shapes[s])
        # the planner gives the gate its input's storage, decided first: the gate must be computed after it
        if _is_gate(xs, ss) and order.get(x, -1) < order.get(s, -1):
            return x, s
    return None


def _hoist_gated_input(g: Graph, node: Node) -> None:
    """A ``mul`` of an (N, C, H, W) activation ``x`` by an (N, C, 1, 1) one ``s`` where x's producer runs after
    s's (MobileViTv2's ``relu(v) * context``: the ReLU written after the context): x's producer moves to just
    after the last producer of its own inputs, when that is before s's producer, so that the gate can be a
    convolution's ``in_scale`` (``_gate_operands`` wants x first). A move in topological order: same results."""
    if node.op != "mul" or len(node.inputs) != 2 or any(t in g.params for t in node.inputs):
        return
    out = node.outputs[0]
    readers = g.consumers(out)
    if out in g.outputs or len(readers) != 1 or readers[0].op != "conv2d" or readers[0].inputs[0] != out:
        return  # only where a convolution may take the gate
    index = {n.name: i for i, n in enumerate(g.nodes)}
    for x, s in (node.inputs, node.inputs[::-1]):
        xs, ss = tuple(g.shapes[x]), tuple(g.shapes[s])
        px, ps = g.producer(x), g.producer(s)
        if not _is_gate(xs, ss) or px is None or ps is None or index[px.name] < index[ps.name]:
            continue
        after = max((index[p.name] for t in px.inputs if (p := g.producer(t)) is not None), default=-1)
        if after < index[ps.name]:
            g.nodes.remove(px)
            g.nodes.insert(after + 1, px)
        return


def fuse_input_gates(graph: Graph) -> Graph:
    g = graph.copy()
    for node in list(g.nodes):
        _hoist_gated_input(g, node)
        operands = _gate_operands(g, node)
        out = node.outputs[0]
        if operands is None or out in g.outputs or len(g.consumers(out)) != 1:
            continue
        conv = g.consumers(out)[0]
        if conv.op != "conv2d" or conv.inputs[0] != out or out in conv.inputs[1:] or "in_scale" in conv.attrs:
            continue
        c, w = g.shapes[out][1], g.shapes[conv.inputs[1]]
        if conv.attrs.get("groups", 1) == c == w[0] and w[1] == 1:
            continue  # depthwise: its template reads no gate
        x, s = operands
        conv.inputs = [x] + conv.inputs[1:] + [s]  # after the residual: inputs bind by position, the gate last
        conv.attrs["in_scale"] = s
        g.nodes = [n for n in g.nodes if n is not node]
    return g.validate()


def _pad_readers(g: Graph, node: Node):
    """The convolutions that read a Pad's output as their input (every reader must), else None."""
    out = node.outputs[0]
    readers = g.consumers(out)
    if out in g.outputs or not readers or any(r.op != "conv2d" or r.inputs[0] != out or out in r.inputs[1:]
                                              or r.attrs.get("pad_mode", "zeros") != "zeros" for r in readers):
        return None
    return readers


def fold_pads(graph: Graph) -> Graph:
    g = graph.copy()
    for node in list(g.nodes):
        if node.op != "pad" or (readers := _pad_readers(g, node)) is None:
            continue
        mode, pads = node.attrs["mode"], tuple(node.attrs["pads"])
        if mode == "constant":
            if node.attrs.get("value", 0.0) != 0.0:
                continue
        else:
            c = g.shapes[node.inputs[0]][1]
            if any(any(r.attrs["padding"]) or r.attrs.get("groups", 1) == c == g.shapes[r.inputs[1]][0]
                   for r in readers):
                continue  # a padding of its own past the reflection; or depthwise: zeros only
        for r in readers:
            r.inputs = [node.inputs[0]] + r.inputs[1:]
            r.attrs["padding"] = tuple(p + q for p, q in zip(r.attrs["padding"], pads))
            if mode != "constant":
                r.attrs["pad_mode"] = mode
        g.nodes = [n for n in g.nodes if n is not node]
    return g.validate()


def optimize(graph: Graph) -> Graph:
    """The frontend graph as the kernels will run it: BatchNorm folded, multi-node activations recognized,
    epilogues fused."""
    return run_passes(graph, PIPELINE)


# The graph passes in the order they run, each ``Graph -> Graph``: model inputs and outputs of any rank in 4-D or
# 2-D forms; GroupNorm and multi-node activations recognized
# (a GELU's erf pattern reads its input twice, which would stop a transpose from sinking through it); the layout
# rewrites (channel shuffles, attention's token tensors, NHWC blocks, ConvTranspose -> conv2d:
# ``passes_movement``); whole-image reductions in two parallel steps; then BatchNorm folded into convolutions
# (before it, or where none can take it into the unpadded ones after it) and
# ConvNeXtV2's response norm read as a gate by the convolution after it (``passes_response_norm``),
# re-parameterized depthwise branches and a distilled classifier's two heads summed into one (``passes_reparam``), the
# activations the rewrites exposed recognized, epilogues fused, a PixelShuffle's convolution put in DCR order (its
# bias and epilogue folded in first: only its weights and bias permute), squeeze-excite gates read by the
# convolutions after them and each block's pool and two 1x1 convolutions as one ``se_gate``, Pads and channel
# gathers read by the convolutions after them, channel slices read in place by the elementwise kernels, reductions
# and concats after them (an add read only by a depthwise convolution done as it reads, a concat flattened to
# tokens then writing the tokens itself), and MobileViTv2's softmaxed query computed in the reduction that
# weights the keys by it and the ReLU of its values in the qkv convolution's epilogue (``passes_attention``); last, a
# LayerNorm over channels, then a GroupNorm(1) (its statistics left in a kernel; moved past a copy that permutes
# each channel first), read only by 1x1 convolutions computed inside them, and a GroupNorm read only by pools
# normalized as they read it (``passes_layer_norm``; its ``norms_applied_as_read`` for convolutions is a candidate
# ``compiler.fastest_plan`` times, not a step here); then MobileViT's
# unfold and fold written by the 1x1 convolutions before them (``passes_patches``); a division by one value a row
# read by the strided copies after it (EdgeNeXt's normalized queries and keys), and their norms taken off the
# channels of the projection they are copied from; last, a squeeze-excite block's
# pool summed by rows in the epilogue of the depthwise convolution it reads (a second output: ``passes_se``).
PIPELINE = (model_io_ranks, pointwise_ranks, fuse_group_norm, fuse_patterns, optimize_movement, split_whole_reductions,
            fold_batch_norm, channel_affines_into_convs, response_norm_as_gate, merge_depthwise_branches,
            merge_dense_heads, fuse_patterns,
            activations_before_copies, fuse_epilogues, flatten_into_reductions, fuse_reduction_weights, crd_to_dcr,
            fuse_input_gates, response_gates_in_convs, fuse_squeeze_excite, align_channel_slices,
            fold_pads, pad_concat_parts,
            fold_gathers_into_convs, compose_gathers_into_copies, matmul_views, slices_read_in_place,
            adds_into_depthwise, concats_written_as_tokens, fuse_concat_activations, softmax_into_reductions,
            slice_activations_into_producers, layer_norm_into_convs,
            group_norm_past_permutations, group_norm_into_convs, group_norm_past_pooled_dense, norms_read_by_pools,
            convolutions_write_patches,
            divisions_into_copies, norms_read_in_place, pool_rows_in_depthwise)
