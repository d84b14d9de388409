"""ConvNeXtV2's global response normalization read by the convolution after it (``response_norm_as_gate``,
``Graph -> Graph``).

GRN (Woo et al. 2023) is ``y = gamma * (x * N) + beta + x`` with ``N = G / (mean_c(G) + eps)`` and ``G`` the L2
norm of each channel's map. Exported, the part over the whole map is four elementwise kernels -- ``x * N``, two
per-channel multiplies, the add of beta, the add of x -- each reading and writing every element, before the MLP's
second 1x1 convolution reads ``y``. Per channel it is ``y = x * (1 + gamma * N) + beta``: here the gate
``a = 1 + gamma * N`` is computed on the (N, C, 1, 1) statistics (two small kernels), ``x * a`` is a squeeze-excite
style gate that ``fuse_input_gates`` has the convolution apply as it loads its input, and where that convolution
is 1x1 with no padding (ConvNeXtV2's ``fc2``) ``beta`` goes into its bias as ``W @ beta``. No kernel is left over
the whole map.

Taken where every intermediate tensor has one reader, the multiplies and the add are by per-channel constants, and
``N`` is an (N, C, 1, 1) tensor.

``response_gates_in_convs`` then has that convolution compute the gate too, from G (``Conv2dWorkload.in_response``):
the mean over the channels, the add of eps, the division and the add of 1 -- four small kernels a block -- are gone,
and only the L2 reduction is left."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params
from tuner.graph.graph import channel_constant, fresh_name as _fresh, only_reader


def _match(g: Graph, y: Node):
    """``(x, N, scale, shift, chain)`` when ``y`` is ``x + (x * N) * scale + shift`` (module doc), else None."""
    if y.op != "add" or len(y.inputs) != 2 or y.attrs or len(g.shapes.get(y.outputs[0], ())) != 4:
        return None
    C = g.shapes[y.outputs[0]][1]
    for x, t in (y.inputs, y.inputs[::-1]):
        chain = []
        node = g.producer(t)
        while node is not None and node.op in ("mul", "add") and not node.attrs and len(node.inputs) == 2 and \
                only_reader(g, node.outputs[0], chain[-1] if chain else y):
            consts = [(i, v) for i, v in enumerate(node.inputs) if channel_constant(g, v, C, 4) is not None]
            if len(consts) != 1:
                break
            chain.append(node)
            node = g.producer(node.inputs[1 - consts[0][0]])
        if node is None or node.op != "mul" or node.attrs or x not in node.inputs or \
                not only_reader(g, node.outputs[0], chain[-1] if chain else y):
            continue
        n_t = node.inputs[1] if node.inputs[0] == x else node.inputs[0]
        if n_t in g.params or tuple(g.shapes.get(n_t, ())) != (g.shapes[x][0], C, 1, 1) or n_t == x:
            continue
        scale, shift = np.ones(C), np.zeros(C)  # the chain's multiplies and adds, in the order they run
        for n in reversed(chain):
            v = channel_constant(g, next(i for i in n.inputs if i in g.params), C, 4)
            scale, shift = (scale * v, shift * v) if n.op == "mul" else (scale, shift + v)
        return x, n_t, scale, shift, chain + [node]
    return None


def response_norm_as_gate(graph: Graph) -> Graph:
    """Each GRN's part over the whole map as a gate and a bias of the convolution after it (module doc)."""
    if not any(n.op == "reduce_l2" for n in graph.nodes):
        return graph
    g = graph.copy()
    done = 0
    for y in list(g.nodes):
        if not any(n is y for n in g.nodes):
            continue
        found = _match(g, y)
        if found is None:
            continue
        x, n_t, scale, shift, chain = found
        C = len(scale)
        name = y.name
        s = _add_param(g, f"{name}.gamma", scale.astype(np.float32).reshape(1, C, 1, 1))
        one = _add_param(g, f"{name}.one", np.ones((1, C, 1, 1), np.float32))
        scaled, gate, gated = (_fresh(g, f"{name}.{k}") for k in ("scaled", "gate", "gated"))
        for t in (scaled, gate):
            g.shapes[t] = (g.shapes[n_t][0], C, 1, 1)
        g.shapes[gated] = g.shapes[y.outputs[0]]
        new = [Node("mul", f"{name}.scale", [n_t, s], [scaled]), Node("add", f"{name}.plus_one", [scaled, one], [gate])]
        readers = g.consumers(y.outputs[0])
        conv = readers[0] if len(readers) == 1 and y.outputs[0] not in g.outputs else None
        w = g.params.get(conv.inputs[1]) if conv is not None and conv.op == "conv2d" and len(conv.inputs) >= 2 else None
        pointwise = (w is not None and conv.inputs[0] == y.outputs[0] and np.ndim(w) == 4 and np.shape(w)[2:] == (1, 1)
                     and conv.attrs.get("groups", 1) == 1 and tuple(conv.attrs.get("padding", (0,) * 4)) == (0,) * 4
                     and set(conv.attrs) <= {"stride", "padding", "dilation", "groups"} and len(conv.inputs) <= 3)
        if pointwise or not np.any(shift):
            new.append(Node("mul", f"{name}.gated", [x, gate], list(y.outputs)))
            if pointwise and np.any(shift):  # beta through the 1x1 convolution: W @ beta into its bias
                W = np.asarray(w, np.float64)[:, :, 0, 0]
                b = np.asarray(g.params[conv.inputs[2]], np.float64) if len(conv.inputs) == 3 else np.zeros(W.shape[0])
                conv.inputs = [conv.inputs[0], conv.inputs[1],
                               _add_param(g, f"{conv.name}.b_grn", (b + W @ shift).astype(np.float32))]
        else:
            new += [Node("mul", f"{name}.gated", [x, gate], [gated]),
                    Node("add", name, [gated, _add_param(g, f"{name}.beta", shift.astype(np.float32).reshape(1, C, 1, 1))],
                         list(y.outputs))]
        at = g.nodes.index(y)
        dead = chain
        g.nodes = g.nodes[:at] + new + g.nodes[at + 1:]
        g.nodes = [n for n in g.nodes if all(n is not d for d in dead)]
        done += 1
    return _drop_unused_params(g).validate() if done else graph


def _gate_chain(g: Graph, conv: Node):
    """``(G, gamma, c, eps, nodes)`` when ``conv``'s gate (``in_scale``) is ``c + gamma * G / (mean_c(G) + eps)``
    -- what ``response_norm_as_gate`` leaves once the epilogues are fused: a reduce_mean of G over its channels, an
    add of eps, a division of G by that with gamma as its scale, an add of c -- each step read only by the next and
    G only by the mean and the division; else None."""
    s = conv.attrs.get("in_scale")
    plus = g.producer(s) if s is not None else None
    if plus is None or plus.op != "add" or plus.attrs or len(plus.inputs) != 2 or not only_reader(g, s, conv):
        return None
    C = g.shapes[s][1]
    t, c = (plus.inputs[0], plus.inputs[1]) if plus.inputs[1] in g.params else (plus.inputs[1], plus.inputs[0])
    c = channel_constant(g, c, C, 4)
    div = g.producer(t)
    if c is None or div is None or div.op != "div" or set(div.attrs) - {"scale"} or not only_reader(g, t, plus):
        return None
    G, d = div.inputs[0], div.inputs[1]
    gamma = np.ones(C, np.float32) if "scale" not in div.attrs else \
        channel_constant(g, div.attrs["scale"], C, 2)  # a fused scale is kept flat (C,)
    add = g.producer(d)
    if gamma is None or tuple(g.shapes.get(G, ())) != (g.shapes[s][0], C, 1, 1) or add is None \
            or add.op != "add" or add.attrs or len(add.inputs) != 2 or not only_reader(g, d, div):
        return None
    m, eps = (add.inputs[0], add.inputs[1]) if add.inputs[1] in g.params else (add.inputs[1], add.inputs[0])
    mean = g.producer(m)
    if eps not in g.params or np.size(g.params[eps]) != 1 or mean is None or mean.op != "reduce_mean" \
            or mean.inputs != [G] or tuple(mean.attrs.get("axes", ())) not in ((1,), (-3,)) \
            or not mean.attrs.get("keepdims", 1) or set(mean.attrs) - {"axes", "keepdims"} \
            or not only_reader(g, m, add) or G in g.outputs or sorted(map(id, g.consumers(G))) != \
            sorted(map(id, (mean, div))):
        return None
    return G, gamma, c, float(np.asarray(g.params[eps]).reshape(-1)[0]), [mean, add, div, plus]


def response_gates_in_convs(graph: Graph) -> Graph:
    """A GRN gate (``response_norm_as_gate``'s, once ``fuse_input_gates`` gave it to the convolution after it)
    computed by that convolution as it reads its input (``Conv2dWorkload.in_response``): the convolution takes G,
    each channel's L2 norm, as its gate tensor and computes ``c + gamma * G / (mean_c(G) + eps)`` itself, each
    work-item summing G's channels first -- the four small kernels over (N, C, 1, 1) before it (the mean over the
    channels, the add of eps, the division, the add of 1) are gone, one launch a block left for G (ConvNeXtV2: 4
    launches a block to 1). Taken where eps is positive; run after ``fuse_input_gates``."""
    g = graph.copy()
    changed = False
    for conv in list(g.nodes):
        if conv.op != "conv2d" or "in_response" in conv.attrs:
            continue
        found = _gate_chain(g, conv)
        if found is None or found[3] <= 0:
            continue
        G, gamma, c, eps, dead = found
        s = conv.attrs["in_scale"]
        param = _add_param(g, f"{conv.name}.response", np.stack([gamma, c]).astype(np.float32))
        at = conv.inputs.index(s)
        conv.inputs = conv.inputs[:at] + [G, param] + conv.inputs[at + 1:]  # reference.FUSED_INPUTS: the gate's
        # statistics where the gate was, its affine right after
        conv.attrs = {**conv.attrs, "in_scale": G, "in_response": eps, "response_affine": param}
        g.nodes = [n for n in g.nodes if all(n is not d for d in dead)]
        for d in dead:
            g.shapes.pop(d.outputs[0], None)
        changed = True
    return _drop_unused_params(g).validate() if changed else graph
