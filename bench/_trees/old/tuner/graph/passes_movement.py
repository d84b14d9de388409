"""Graph passes of the data-movement and layout operators (``Graph -> Graph``), run before BatchNorm folding and
epilogue fusion (so a BatchNorm / bias / ReLU after a ConvTranspose folds into its convolution):

- ``fuse_channel_shuffle``: ShuffleNet's ``Reshape(N, g, C/g, H, W) -> Transpose(0, 2, 1, 3, 4) -> Reshape(N, C,
  H, W)`` (any reshape / transpose / reshape that only permutes channels) becomes one ``slice`` (a channel
  gather): no 5-D tensor reaches the plan.
- ``nhwc_to_nchw``: a LayerNormalization over the last axis of a 4-D tensor and a MatMul (``dense``) on a 4-D
  tensor are wrapped in transposes to NCHW (``layer_norm`` over channels, a 1x1 ``conv2d``); then transposes
  sink through pointwise ops (activations, adds / muls of constants, whose constants are permuted) and
  cancel against their inverses: ConvNeXt's ``permute(0, 2, 3, 1) -> LayerNorm -> Linear -> GELU -> Linear ->
  scale -> permute(0, 3, 1, 2)`` runs in NCHW with no transpose left.
- ``lower_conv_transpose``: ``conv_transpose`` -> zero insertion (``upsample_zeros``, only when the stride is
  > 1 or the pads crop) + a stride-1 ``conv2d`` with the flipped, transposed weights (tunable).
"""
from __future__ import annotations

import math

import numpy as np

from tuner.graph.graph import Graph, Node, run_passes
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params, fresh_name as _fresh
from tuner.graph.passes_tokens import optimize_tokens

# graph ops computed element by element on one activation (their other inputs constants): a transpose commutes
UNARY_POINTWISE = {"relu", "clip", "gelu", "sigmoid", "tanh", "hard_sigmoid", "hard_swish", "silu", "swish",
                   "leaky_relu", "elu", "erf", "exp", "neg", "abs", "sqrt", "reciprocal", "softplus", "mish",
                   "activation", "unary"}
BINARY_POINTWISE = {"add", "mul", "sub", "div", "max", "min", "pow"}


def _drop_unused(g: Graph) -> Graph:
    """``graph.drop_unused_params``, then the shapes of tensors no node produces any more."""
    _drop_unused_params(g)
    produced = {t for n in g.nodes for t in n.outputs} | set(g.inputs) | set(g.params)
    for name in [t for t in g.shapes if t not in produced]:
        del g.shapes[name]
    return g


def _sole_reader(g: Graph, tensor: str):
    """The single node reading ``tensor`` (once), if the tensor is not a model output; else None."""
    if tensor in g.outputs:
        return None
    readers = g.consumers(tensor)
    return readers[0] if len(readers) == 1 and readers[0].inputs.count(tensor) == 1 else None


# -- channel shuffle --------------------------------------------------------------------------------------
def _shuffle_index(g: Graph, r1: Node, t: Node, r2: Node):
    """The channel gather index of reshape -> transpose -> reshape, or None if it is not a channel permutation
    of a 4-D tensor."""
    src, mid = tuple(g.shapes[r1.inputs[0]]), tuple(g.shapes[r1.outputs[0]])
    out = tuple(g.shapes[r2.outputs[0]])
    if len(src) != 4 or src != out or len(mid) < 4:
        return None
    perm = tuple(t.attrs["perm"])
    k = len(mid)
    # batch first and H, W last, unchanged; the middle axes split C
    if mid[0] != src[0] or mid[-2:] != src[2:] or perm[0] != 0 or perm[-2:] != (k - 2, k - 1):
        return None
    if math.prod(mid[1:-2]) != src[1]:
        return None
    inner = [p - 1 for p in perm[1:-2]]
    return tuple(int(i) for i in np.arange(src[1]).reshape(mid[1:-2]).transpose(inner).reshape(-1))


def fuse_channel_shuffle(graph: Graph) -> Graph:
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        for r1 in g.nodes:
            if r1.op != "reshape":
                continue
            t = _sole_reader(g, r1.outputs[0])
            if t is None or t.op != "transpose":
                continue
            r2 = _sole_reader(g, t.outputs[0])
            if r2 is None or r2.op not in ("reshape", "flatten"):
                continue
            index = _shuffle_index(g, r1, t, r2)
            if index is None:
                continue
            shape = g.shapes[r2.outputs[0]]
            new = Node("slice", r2.name, [r1.inputs[0]], list(r2.outputs),
                       {"channels": index, "rows": (0, 1, shape[2]), "cols": (0, 1, shape[3])})
            g.nodes = [new if n is r2 else n for n in g.nodes if n is not r1 and n is not t]
            changed = True
            break
    return _drop_unused(g).validate()


# -- NHWC blocks ------------------------------------------------------------------------------------------
def _transpose(g: Graph, name: str, x: str, perm: tuple, out: str | None = None) -> Node:
    shape = g.shapes[x]
    out = out or _fresh(g, f"{name}.out")
    g.shapes[out] = tuple(shape[p] for p in perm)
    return Node("transpose", name, [x], [out], {"perm": tuple(perm)})


TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def _wrap_nchw(graph: Graph) -> Graph:
    """LayerNorm over the last axis / dense on a 4-D tensor -> transpose to NCHW, the NCHW op, transpose back; a
    reduction over (H, W) of an NHWC tensor without keepdims -> transpose to NCHW, the reduction over (2, 3)."""
    g = graph.copy()
    nodes = []
    for n in g.nodes:
        x = n.inputs[0] if n.inputs else None
        shape = tuple(g.shapes[x]) if x is not None else ()
        if (len(shape) == 4 and n.op.startswith("reduce_") and tuple(n.attrs.get("axes", ())) == (1, 2)
                and not n.attrs.get("keepdims", 1)):  # a global pool of an NHWC tensor (Swin's head)
            t1 = _transpose(g, f"{n.name}.to_nchw", x, TO_NCHW)
            nodes += [t1, Node(n.op, n.name, [t1.outputs[0]], list(n.outputs), {**n.attrs, "axes": (2, 3)})]
        elif len(shape) == 4 and ((n.op == "layer_norm" and n.attrs.get("axis") == 3) or n.op == "dense"):
            t1 = _transpose(g, f"{n.name}.to_nchw", x, TO_NCHW)
            mid = _fresh(g, f"{n.name}.nchw")
            if n.op == "layer_norm":
                g.shapes[mid] = g.shapes[t1.outputs[0]]
                op = Node("layer_norm", n.name, [t1.outputs[0], *n.inputs[1:]], [mid], {**n.attrs, "axis": 1})
            else:
                w = g.params[n.inputs[1]]
                ins = [t1.outputs[0], _add_param(g, f"{n.inputs[1]}.1x1", w.reshape(w.shape + (1, 1)))]
                ins += n.inputs[2:]
                nn, _, h, wd = g.shapes[t1.outputs[0]]
                g.shapes[mid] = (nn, w.shape[0], h, wd)
                op = Node("conv2d", n.name, ins, [mid], {"stride": (1, 1), "padding": (0, 0, 0, 0),
                                                         "dilation": (1, 1), "groups": 1})
            back = Node("transpose", f"{n.name}.to_nhwc", [mid], list(n.outputs), {"perm": TO_NHWC})
            nodes += [t1, op, back]
        else:
            nodes.append(n)
    g.nodes = nodes
    return _drop_unused(g)


def _rename_input(g: Graph, old: str, new: str):
    for n in g.nodes:
        n.inputs = [new if t == old else t for t in n.inputs]
        if n.attrs.get("residual") == old:
            n.attrs["residual"] = new


def _pointwise_params(g: Graph, u: Node, act: str) -> bool:
    others = [t for t in u.inputs if t != act]
    if u.op in UNARY_POINTWISE:
        return all(t in g.params and np.size(g.params[t]) == 1 for t in others)
    if u.op in BINARY_POINTWISE:
        return len(u.inputs) == 2 and len(others) == 1 and others[0] in g.params
    return False


def sink_transposes(graph: Graph) -> Graph:
    """Move 4-D transposes below pointwise ops, merge consecutive ones and drop identities."""
    g = graph.copy()
    for _ in range(10 * len(g.nodes) + 10):
        changed = False
        for t in g.nodes:
            if t.op != "transpose" or len(g.shapes[t.inputs[0]]) != 4:
                continue
            perm = tuple(t.attrs["perm"])
            if perm == (0, 1, 2, 3) and t.outputs[0] not in g.outputs:
                _rename_input(g, t.outputs[0], t.inputs[0])
                g.nodes = [n for n in g.nodes if n is not t]
                changed = True
                break
            u = _sole_reader(g, t.outputs[0])
            if u is None:
                continue
            if u.op == "transpose":
                u.attrs["perm"] = tuple(perm[p] for p in u.attrs["perm"])
                u.inputs = [t.inputs[0]]
                g.nodes = [n for n in g.nodes if n is not t]
                changed = True
                break
            if _pointwise_params(g, u, t.outputs[0]):
                inv = tuple(int(i) for i in np.argsort(perm))
                ins = []
                for x in u.inputs:
                    if x == t.outputs[0]:
                        ins.append(t.inputs[0])
                    elif np.size(g.params[x]) == 1:
                        ins.append(x)
                    else:
                        v = np.asarray(g.params[x])
                        v = v.reshape((1,) * (4 - v.ndim) + v.shape).transpose(inv)
                        ins.append(_add_param(g, f"{x}.nchw", v))
                mid = _fresh(g, f"{u.outputs[0]}.nchw")
                g.shapes[mid] = tuple(g.shapes[u.outputs[0]][i] for i in inv)
                new_u = Node(u.op, u.name, ins, [mid], dict(u.attrs))
                new_t = Node("transpose", t.name, [mid], list(u.outputs), {"perm": perm})
                g.nodes = [x for n in g.nodes if n is not t for x in ((new_u, new_t) if n is u else (n,))]
                changed = True
                break
        if not changed:
            break
    return _drop_unused(g)


def nhwc_to_nchw(graph: Graph) -> Graph:
    return sink_transposes(_wrap_nchw(graph)).validate()


# -- ConvTranspose ----------------------------------------------------------------------------------------
def lower_conv_transpose(graph: Graph) -> Graph:
    g = graph.copy()
    nodes = []
    for n in g.nodes:
        if n.op != "conv_transpose":
            nodes.append(n)
            continue
        a = n.attrs
        x, w_name = n.inputs[:2]
        w = np.asarray(g.params[w_name])
        c, og, r, s = w.shape
        groups = a.get("groups", 1)
        # conv weight (O, C/groups, R, S): per group transposed, spatially flipped
        wc = w.reshape(groups, c // groups, og, r, s).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
        wc = wc.reshape(groups * og, c // groups, r, s)
        (sh, sw), (dh, dw), (pt, pl, pb, pr), (oph, opw) = a["stride"], a["dilation"], a["padding"], \
            a.get("output_padding", (0, 0))
        _, _, h, wd = g.shapes[x]
        begin = (dh * (r - 1) - pt, dw * (s - 1) - pl)
        end = (dh * (r - 1) - pb + oph, dw * (s - 1) - pr + opw)
        shift = tuple(max(-v, 0) for v in begin)
        crop = tuple(max(-v, 0) for v in end)
        size = ((h - 1) * sh + 1 - shift[0] - crop[0], (wd - 1) * sw + 1 - shift[1] - crop[1])
        src = x
        if (sh, sw) != (1, 1) or any(shift) or any(crop):
            src = _fresh(g, f"{n.name}.upsampled")
            g.shapes[src] = (g.shapes[x][0], c, *size)
            nodes.append(Node("upsample_zeros", f"{n.name}.upsample", [x], [src],
                              {"size": size, "stride": (sh, sw), "shift": shift}))
        pads = (max(begin[0], 0), max(begin[1], 0), max(end[0], 0), max(end[1], 0))
        nodes.append(Node("conv2d", n.name, [src, _add_param(g, f"{w_name}.conv", wc), *n.inputs[2:]],
                          list(n.outputs), {"stride": (1, 1), "padding": pads, "dilation": (dh, dw),
                                            "groups": groups}))
    g.nodes = nodes
    return _drop_unused(g).validate()


def optimize_movement(graph: Graph) -> Graph:
    """All of the above, in order (attention's token tensors made 4-D by ``passes_tokens`` once channel
    shuffles are single gathers); ``passes.optimize`` runs it first."""
    return run_passes(graph, MOVEMENT_PASSES)


MOVEMENT_PASSES = (fuse_channel_shuffle, optimize_tokens, nhwc_to_nchw, lower_conv_transpose)  # in this order
