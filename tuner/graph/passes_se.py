"""Squeeze-excite as one node (issue 55, item 2): ``fuse_squeeze_excite``, a pure pass ``Graph -> Graph``.

After ``fuse_epilogues`` a squeeze-excite block reads

    p = global_avg_pool(x)                     (or reduce_mean over (2, 3) with keepdims)
    h = conv2d(p, w1, b1)  +act1               (1x1, C -> S)
    s = conv2d(h, w2, b2)  +act2               (1x1, S -> C: Sigmoid, HardSigmoid)
    y = conv2d(x, ..., in_scale=s)             (``fuse_input_gates``: the gate read with the input)

three kernels (a ``spatial_reduce`` and two ``conv2d`` on 1x1 maps) between the producer of x and the
convolution that reads x times the gate. The pool and both convolutions become one ``se_gate`` node
``s = se_gate(x, w1, b1, w2, b2)`` (attrs ``act1``, ``activation``), which the ``se_gate`` template runs in one
launch (its space also holds two: a pool split along the pixels, then the gate). The gate's readers are
unchanged. A missing bias becomes zeros. Only where nothing else reads the pool or the squeeze, and the
convolutions are plain 1x1 ones (no residual, no input gate, no padding, one group, a 1x1 input map)."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node, add_param, drop_unused_params, fresh_name


def _pool_of(g: Graph, node: Node) -> str | None:
    """The pooled tensor x of a global average pool over (H, W) of a 4-D tensor with nothing fused, else None."""
    if node.op == "global_avg_pool":
        ok = not node.attrs
    elif node.op == "reduce_mean":
        ok = tuple(node.attrs.get("axes", ())) == (2, 3) and bool(node.attrs.get("keepdims", 1)) and \
            set(node.attrs) <= {"axes", "keepdims"}
    else:
        return None
    x = node.inputs[0]
    return x if ok and len(node.inputs) == 1 and len(g.shapes[x]) == 4 else None


def _pointwise(g: Graph, node: Node, src: str, cin: int) -> tuple | None:
    """``(weight, bias or None, activation)`` of a plain 1x1 conv2d of ``src`` (cin channels, a 1x1 map) whose
    weight and bias are params, else None."""
    a = node.attrs
    if node.op != "conv2d" or node.inputs[0] != src or src in node.inputs[1:] or \
            set(a) - {"stride", "padding", "dilation", "groups", "activation"} or a.get("activation") == "prelu":
        return None
    if tuple(a.get("stride", (1, 1))) != (1, 1) or any(a.get("padding", (0,) * 4)) or a.get("groups", 1) != 1:
        return None
    w = node.inputs[1]
    if w not in g.params or len(g.shapes[w]) != 4 or tuple(g.shapes[w][1:]) != (cin, 1, 1) or \
            tuple(g.shapes[src][2:]) != (1, 1) or len(node.inputs) > 3:
        return None
    b = node.inputs[2] if len(node.inputs) == 3 else None
    if b is not None and (b not in g.params or int(np.prod(g.shapes[b])) != g.shapes[w][0]):
        return None
    return w, b, a.get("activation", "none")


def _only(g: Graph, tensor: str) -> Node | None:
    """The single reader of ``tensor`` (not a model output), else None."""
    readers = g.consumers(tensor)
    return readers[0] if len(readers) == 1 and tensor not in g.outputs else None


def fuse_squeeze_excite(graph: Graph) -> Graph:
    if not any(n.op in ("global_avg_pool", "reduce_mean") for n in graph.nodes):
        return graph
    g = graph.copy()
    drop = set()
    for pool in list(g.nodes):
        x = _pool_of(g, pool)
        if x is None:
            continue
        n, c = g.shapes[x][:2]
        fc1 = _only(g, pool.outputs[0])
        first = _pointwise(g, fc1, pool.outputs[0], c) if fc1 is not None else None
        if first is None:
            continue
        s = g.shapes[first[0]][0]
        fc2 = _only(g, fc1.outputs[0])
        second = _pointwise(g, fc2, fc1.outputs[0], s) if fc2 is not None else None
        if second is None or g.shapes[second[0]][0] != c:
            continue
        (w1, b1, act1), (w2, b2, act2) = first, second
        b1 = b1 if b1 is not None else add_param(g, f"{fc1.name}.zero_bias", np.zeros(s, np.float32))
        b2 = b2 if b2 is not None else add_param(g, f"{fc2.name}.zero_bias", np.zeros(c, np.float32))
        # the gate where the excite convolution was: after everything it reads, before every reader of the gate
        fc2.op, fc2.name, fc2.inputs = "se_gate", pool.name, [x, w1, b1, w2, b2]
        fc2.attrs = {"act1": act1, "activation": act2}
        drop.update((id(pool), id(fc1)))
        for t in (pool.outputs[0], fc1.outputs[0]):
            g.shapes.pop(t, None)
    if not drop:
        return graph
    g.nodes = [nd for nd in g.nodes if id(nd) not in drop]
    return drop_unused_params(g).validate()


ROWS_MAX_WIDTH = 256  # a row a work-group: 64 work-items of 4 columns (the depthwise space allows up to 512)


def _depthwise_rows_ok(g: Graph, producer: Node | None, x: str) -> bool:
    """A depthwise convolution (one filter a channel) writing only ``x``, 4-D, with nothing fused that the
    depthwise template does not run, whose output rows it can sum in its epilogue."""
    if producer is None or producer.op != "conv2d" or producer.outputs != [x] or x in g.outputs:
        return False
    a, w = producer.attrs, producer.inputs[1]
    if set(a) - {"stride", "padding", "dilation", "groups", "activation", "residual", "pad_mode", "slope"} or \
            a.get("pad_mode", "zeros") != "zeros" or w not in g.params or len(g.shapes[w]) != 4:
        return False
    from tuner.templates.common import is_depthwise  # what depthwise_conv2d's lower takes (tuner.templates is
    # imported lazily by the graph passes, as passes_tokens does)
    return is_depthwise(g.shapes[producer.inputs[0]], g.shapes[w], a.get("groups", 1)) and len(g.shapes[x]) == 4 \
        and g.shapes[x][3] <= ROWS_MAX_WIDTH


def pool_rows_in_depthwise(graph: Graph) -> Graph:
    """Issue 55, item 2: a squeeze-excite block's pool accumulated in the epilogue of the convolution that produces
    its input. Where an ``se_gate`` reads x written by a depthwise convolution (EfficientNet's and MobileNetV3's
    blocks), that convolution also writes x's row sums ``<x>.rows`` (N, C, OH, 1; attr ``row_sums``, a second
    output), and the gate pools those (attr ``pixels``: OH x OW, the mean's divisor): the gate reads OH values a
    channel, not OH x OW, and needs no pool kernel of its own. Maps wider than ``ROWS_MAX_WIDTH`` keep their pool.
    Run last: the passes before it see one output a node."""
    if not any(n.op == "se_gate" for n in graph.nodes):
        return graph
    g = graph.copy()
    changed = False
    for n in g.nodes:
        if n.op != "se_gate" or "pixels" in n.attrs:
            continue
        x = n.inputs[0]
        p = g.producer(x)
        if not _depthwise_rows_ok(g, p, x):
            continue
        N, C, OH, OW = g.shapes[x]
        rows = fresh_name(g, f"{x}.rows")
        g.shapes[rows] = (N, C, OH, 1)
        p.outputs.append(rows)
        p.attrs["row_sums"] = True
        n.inputs[0] = rows
        n.attrs["pixels"] = OH * OW
        changed = True
    return g.validate() if changed else graph


def gates_in_depthwise(graph: Graph, names=None) -> Graph:
    """Issue 55, item 2, the launch left: where an ``se_gate`` pools the row sums of a depthwise convolution
    (``pool_rows_in_depthwise``), that convolution computes the gate itself, in the last of its work-groups of an
    image to finish (``DepthwiseWorkload.gate``): its second output is the gate, its inputs take the gate's four
    params too (attr ``gate``, their names; ``gate_acts``: act1 and the gate's activation; ``gate_node``: the
    gate node's name), and the ``se_gate`` node goes. A block then runs no launch of its own. What
    ``compiler.fastest_plan`` times beside the plan with the gates apart (``gates_apart`` is the inverse): a
    depthwise convolution whose last work-group squeezes and excites alone can be slower than a gate kernel on a
    large block. ``names``: only those gates (None: every one)."""
    def move(g: Graph, n: Node) -> bool:
        rows, params = n.inputs[0], n.inputs[1:]
        p = g.producer(rows)
        if (n.name in g.float32) != (p.name in g.float32):  # the precision guard kept one of them in float32
            return False
        p.outputs[p.outputs.index(rows)] = n.outputs[0]
        p.attrs.pop("row_sums", None)
        p.attrs["gate"], p.attrs["gate_node"], p.attrs["gate_acts"] = list(params), n.name, _gate_acts(n)
        p.inputs = p.inputs + list(params)
        g.shapes.pop(rows, None)
        return True
    return _move_row_gates(graph, names, move)


def _move_row_gates(graph: Graph, names, move) -> Graph:
    """``graph`` with each ``se_gate`` that pools row sums (``pool_rows_in_depthwise``; of ``names``, None: every
    one) handed to the nodes that compute it instead: ``move(g, gate)`` rewrites the copy ``g`` and says whether it
    did, and the gates it moved go. ``graph`` itself where none moved."""
    wanted = {n.name for n in graph.nodes if n.op == "se_gate" and "pixels" in n.attrs
              and (names is None or n.name in names)}
    if not wanted:
        return graph
    g = graph.copy()
    drop = {id(n) for n in list(g.nodes) if n.op == "se_gate" and n.name in wanted and move(g, n)}
    if not drop:
        return graph
    g.nodes = [nd for nd in g.nodes if id(nd) not in drop]
    return g.validate()


def _gate_acts(n: Node) -> list:
    """An ``se_gate`` node's activations, [act1, the gate's], as the node that computes the gate instead keeps them."""
    return [n.attrs.get("act1", "none"), n.attrs.get("activation", "none")]


def _gate_readers(g: Graph, n: Node) -> list | None:
    """The convolutions that read ``se_gate`` node ``n``'s gate as their input's ``in_scale`` and could compute it
    themselves (``Conv2dWorkload.in_gate``): every reader of the gate, each a convolution of one group (not
    depthwise) whose input is the map the gate pools the row sums of (the kernel pools its own input's rows) and
    that reads the gate once, a gate a channel (not a row), with no other gate or norm computed as it
    reads (``in_response``, ``in_norm``, ``in_group_norm``, ``in_layer_norm``, ``in_view``); None where any reader
    is not such a one, or the precision guard kept one of them in float32 and not the other."""
    s, x = n.outputs[0], g.producer(n.inputs[0]).outputs[0]  # the gate, and the map whose row sums it pools
    readers = [r for r in g.nodes if s in r.inputs]
    if not readers or s in g.outputs:
        return None
    for r in readers:
        a = r.attrs
        if r.op != "conv2d" or a.get("in_scale") != s or r.inputs.count(s) != 1 or a.get("groups", 1) != 1 \
                or r.inputs[0] != x \
                or any(a.get(k) for k in ("in_response", "in_norm", "in_group_norm", "in_layer_norm", "in_view",
                                          "in_gate")) \
                or g.shapes[s][2] != 1 or (r.name in g.float32) != (n.name in g.float32):
            return None
    return readers


def gates_in_readers(graph: Graph, names=None) -> Graph:
    """Issue 55, item 2, the launch left, the other way round from ``gates_in_depthwise``: where an ``se_gate``
    pools the row sums of a depthwise convolution (``pool_rows_in_depthwise``) and only convolutions read its gate
    as their input's scale (``in_scale``), each of those convolutions computes the gate itself, every work-group
    before its reduction loop (``Conv2dWorkload.in_gate``): its ``in_scale`` is the row sums, its inputs take the
    gate's four params last (attr ``in_gate``, their names; ``in_gate_acts``: act1 and the gate's activation;
    ``gate_node``: the gate node's name), and the ``se_gate`` node goes. No work-group waits for another, as the
    depthwise producer's last one does; each reads the weights (C x S twice), which costs more the larger the
    gate. ``compiler.fastest_plan`` times it beside the plan with the gates apart. ``names``: only those gates
    (None: every one)."""
    def move(g: Graph, n: Node) -> bool:
        readers = _gate_readers(g, n)
        if readers is None:
            return False
        rows, params, s = n.inputs[0], n.inputs[1:], n.outputs[0]
        for r in readers:
            r.inputs = [rows if t == s else t for t in r.inputs] + list(params)
            r.attrs["in_scale"], r.attrs["in_gate"], r.attrs["gate_node"] = rows, list(params), n.name
            r.attrs["in_gate_acts"] = _gate_acts(n)
        g.shapes.pop(s, None)
        return True
    return _move_row_gates(graph, names, move)


def gates_apart(graph: Graph) -> Graph:
    """The inverse of ``gates_in_depthwise``: each depthwise convolution that computes a gate writes its row sums
    again (``<x>.rows``), and an ``se_gate`` node (its name before, ``gate_node``) pools them."""
    if not any(n.attrs.get("gate") for n in graph.nodes):
        return graph
    g = graph.copy()
    nodes = []
    for p in g.nodes:
        nodes.append(p)
        if not p.attrs.get("gate"):
            continue
        x, gate = p.outputs
        params = list(p.attrs.pop("gate"))
        act1, act = p.attrs.pop("gate_acts")
        name = p.attrs.pop("gate_node")
        p.inputs = p.inputs[:len(p.inputs) - len(params)]
        N, C, OH, OW = g.shapes[x]
        rows = fresh_name(g, f"{x}.rows")
        g.shapes[rows] = (N, C, OH, 1)
        p.outputs = [x, rows]
        p.attrs["row_sums"] = True
        nodes.append(Node("se_gate", name, [rows, *params], [gate],
                          {"act1": act1, "activation": act, "pixels": OH * OW}))
    g.nodes = nodes
    return g.validate()


def _rows_back(g: Graph, n: Node) -> None:
    """An ``se_gate`` that reads a depthwise convolution's row sums (``pool_rows_in_depthwise``) pools that
    convolution's output again, and the row sums are dropped from it; any other gate is left as it is."""
    if "pixels" not in n.attrs:
        return
    rows = n.inputs[0]
    p = g.producer(rows)
    p.outputs.remove(rows)
    p.attrs.pop("row_sums", None)
    g.shapes.pop(rows, None)
    n.attrs.pop("pixels")
    n.inputs[0] = p.outputs[0]


def pool_maps_in_se_gates(graph: Graph) -> Graph:
    """The inverse of ``pool_rows_in_depthwise``: every ``se_gate`` pools its map again, and its depthwise
    producer writes one output -- the fused plan ``compiler.fastest_plan`` also times, so that the row sums stay
    only where they measure faster (a depthwise convolution whose work-groups span whole rows can be slower than
    its best config)."""
    if not any(n.op == "se_gate" and "pixels" in n.attrs for n in graph.nodes):
        return graph
    g = graph.copy()
    for n in g.nodes:
        if n.op == "se_gate":
            _rows_back(g, n)
    return g.validate()


def split_squeeze_excite(graph: Graph, names=None) -> Graph:
    """The inverse of ``fuse_squeeze_excite``: each ``se_gate`` node (those named in ``names``; None: every one)
    back as its pool (a ``global_avg_pool`` of the node's name), the squeeze 1x1 convolution with ``act1``
    (``<name>.squeeze``) and the excite 1x1 convolution with the gate's activation (``<name>.excite``), writing the
    gate. What ``compiler.fastest_plan`` times beside the fused plan, so that a block runs fused only where that
    measures faster on the device (issue 55, item 2: picked by measurement, per block where they differ)."""
    if not any(n.op == "se_gate" and (names is None or n.name in names) for n in graph.nodes):
        return graph
    g = graph.copy()
    for n in g.nodes:
        if n.op == "se_gate" and (names is None or n.name in names):
            _rows_back(g, n)
    nodes = []
    for n in g.nodes:
        if n.op != "se_gate" or (names is not None and n.name not in names):
            nodes.append(n)
            continue
        x, w1, b1, w2, b2 = n.inputs
        N, C = g.shapes[x][:2]
        S = g.shapes[w1][0]
        pooled, hidden = (fresh_name(g, f"{n.name}.{k}") for k in ("pooled", "squeezed"))
        g.shapes[pooled], g.shapes[hidden] = (N, C, 1, 1), (N, S, 1, 1)
        conv = {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1}
        nodes.append(Node("global_avg_pool", n.name, [x], [pooled]))
        nodes.append(Node("conv2d", f"{n.name}.squeeze", [pooled, w1, b1], [hidden],
                          {**conv, **({"activation": n.attrs["act1"]} if n.attrs["act1"] != "none" else {})}))
        act = n.attrs.get("activation", "none")
        nodes.append(Node("conv2d", f"{n.name}.excite", [hidden, w2, b2], list(n.outputs),
                          {**conv, **({"activation": act} if act != "none" else {})}))
    g.nodes = nodes
    return g.validate()
