"""Graph passes of the data-movement and layout operators (``Graph -> Graph``), run before BatchNorm folding and
epilogue fusion (so a BatchNorm / bias / ReLU after a ConvTranspose folds into its convolution):

- ``drop_identities``: a reshape to its input's own shape (EfficientViT's ``feat.view(B, -1, H, W)``), a Pad of
  zeros on every side and a Slice or channel gather that keeps every element in order (its windows padded by 0 and
  cropped back) run no kernel: their readers read their input.
- ``fuse_channel_shuffle``: ShuffleNet's ``Reshape(N, g, C/g, H, W) -> Transpose(0, 2, 1, 3, 4) -> Reshape(N, C,
  H, W)`` (any reshape / transpose / reshape that only permutes channels) becomes one ``slice`` (a channel
  gather): no 5-D tensor reaches the plan.
- ``nhwc_to_nchw``: a LayerNormalization over the last axis of a 4-D tensor and a MatMul (``dense``) on a 4-D
  tensor are wrapped in transposes to NCHW (``layer_norm`` over channels, a 1x1 ``conv2d``); then transposes
  sink through pointwise ops (activations, adds / muls of constants, whose constants are permuted) and
  cancel against their inverses: ConvNeXt's ``permute(0, 2, 3, 1) -> LayerNorm -> Linear -> GELU -> Linear ->
  scale -> permute(0, 3, 1, 2)`` runs in NCHW with no transpose left.
- ``copies_through_transposes`` (after it): a transpose that is left, of a strided copy's output that nothing else
  reads, is one strided copy with the shape and strides permuted (EdgeNeXt's token rows to NHWC, then to NCHW for
  a LayerNorm over the channels: one kernel, not two).
- ``compose_gathers``: a channel gather of a channel gather reads the first one's input (ShuffleNet's shuffle,
  then split: one gather per half, and the shuffle runs no kernel).
- ``pad_concat_parts`` then ``fold_gathers_into_convs`` (run last, by ``passes.optimize``): a concat read only by
  channel gathers gets parts of whole RGBA pixels (zero filters in the producing convolution, or a gather
  continued; the readers skip the padding), so that every part can be written in place (``plan.views``). A
  channel gather read by a depthwise convolution moves after it (the filters to the channels they read); one read
  only by convolutions (groups 1) becomes their weights' column order -- they read the gather's input, with zero
  weights on the channels it leaves out, when that at most doubles the RGBA pixels they read (ShuffleNet's split
  halves).
- ``compose_gathers_into_copies`` (run last too): a contiguous channel slice read only by strided copies (the
  heads of an attention split, then reshaped into tokens) runs no kernel: each copy reads the slice's input at
  the slice's channel offset, its strides rescaled per image.
- ``slices_read_in_place`` (run last too): a channel slice starting an RGBA pixel and read only by elementwise
  kernels (an add of two activations, ReLU, clip) runs no kernel: they read its input at the slice's channel
  offset (attr ``channel_offsets``; EfficientViT's heads add the input's next channel chunk to their output).
- ``fuse_concat_activations`` (run last too): an activation read only from a channel concat whose parts other
  kernels read too (so ``plan.views`` cannot write it in place) runs in the concat kernel (step ``concat_act``):
  EfficientViT's heads' outputs, concatenated, then ReLU.
- ``lower_conv_transpose`` and ``hoist_channelwise`` (``passes_conv_transpose``): ``conv_transpose`` -> its
  phases, one stacked ``conv2d`` and a ``depth_to_space``, with the per-channel ops after it moved into the
  convolution's reach; or zero insertion and a stride-1 ``conv2d``.
"""
from __future__ import annotations

import math

import numpy as np

from tuner.graph.graph import Graph, Node, run_passes
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params, fresh_name as _fresh
from tuner.graph.passes_conv_transpose import hoist_channelwise, lower_conv_transpose
from tuner.graph.passes_tokens import optimize_tokens

# graph ops computed element by element on one activation (their other inputs constants): a transpose commutes
UNARY_POINTWISE = {"relu", "clip", "gelu", "sigmoid", "tanh", "hard_sigmoid", "hard_swish", "silu", "swish",
                   "leaky_relu", "elu", "erf", "exp", "neg", "abs", "sqrt", "reciprocal", "softplus", "mish",
                   "activation", "unary"}
BINARY_POINTWISE = {"add", "mul", "sub", "div", "max", "min", "pow"}



# reductions over H and W that the spatial_reduce template runs: they take an activation after themselves
SPATIAL_REDUCTIONS = ("global_avg_pool", "global_max_pool", "reduce_mean", "reduce_max", "reduce_sum", "reduce_l2")


def _reduction_lowers(g: Graph, node: Node) -> bool:
    """A reduction the spatial_reduce template lowers (its ``lower``'s conditions: NCHW, over (H, W), H or W,
    keeping the rank unless over both)."""
    if node.op not in SPATIAL_REDUCTIONS or len(g.shapes[node.inputs[0]]) != 4:
        return False
    if node.op.startswith("global_"):
        return True
    axes = tuple(sorted(int(x) for x in node.attrs.get("axes", (2, 3))))
    keep = bool(node.attrs.get("keepdims", 1))
    return axes in ((2, 3), (2,), (3,)) and (keep or axes == (2, 3))

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


def _keeps_all(g: Graph, n: Node) -> bool:
    """Whether ``n`` (a reshape, pad, slice or expand) makes its input's elements in their order, unchanged."""
    shape, a = tuple(g.shapes[n.inputs[0]]), n.attrs
    if n.op in ("reshape", "flatten", "expand_nd"):
        return True
    if n.op == "pad":
        return not any(a["pads"])
    if n.op == "slice_nd":
        return not any(a["starts"]) and set(a["steps"]) <= {1} and tuple(a["counts"]) == shape
    if n.op == "slice" and len(shape) == 4:
        return tuple(a["channels"]) == tuple(range(shape[1])) and all(
            tuple(a.get(k, (0, 1, None)))[:2] == (0, 1) and a.get(k, (0, 1, None))[2] in (None, shape[i])
            for k, i in (("rows", 2), ("cols", 3)))
    return False


def drop_identities(graph: Graph) -> Graph:
    g = graph.copy()
    for n in list(g.nodes):
        if n.inputs and n.inputs[0] not in g.params and n.outputs[0] not in g.outputs \
                and tuple(g.shapes[n.inputs[0]]) == tuple(g.shapes[n.outputs[0]]) and _keeps_all(g, n):
            _rename_input(g, n.outputs[0], n.inputs[0])
            g.nodes = [m for m in g.nodes if m is not n]
    return _drop_unused(g).validate()


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
    return sink_transposes(_reductions_to_nchw(sink_transposes(_wrap_nchw(graph)))).validate()


NHWC_AXIS = {0: 0, 1: 2, 2: 3, 3: 1}  # an NHWC axis -> the NCHW one
REDUCTIONS_KEPT = ("reduce_l2", "reduce_mean", "reduce_sum", "reduce_max")


def _nhwc_region(g: Graph, y: str):
    """The nodes that read NHWC tensor ``y`` (a transpose's output) and what they compute from it, when every one is
    a pointwise op of region tensors and constants or a reduction that keeps its rank, and the region leaves only
    through transposes back to NCHW; else None. The region must hold such a reduction (the rest sinks already)."""
    region, tensors, todo = [], {y}, [y]
    while todo:
        for u in g.consumers(todo.pop()):
            if any(u is r for r in region) or (u.op == "transpose" and tuple(u.attrs["perm"]) == TO_NCHW):
                continue
            ins = [t for t in u.inputs if t not in g.params]
            if any(len(g.shapes[t]) != 4 for t in ins) or len(u.outputs) != 1 or u.outputs[0] in g.outputs \
                    or any(t in g.params and np.ndim(g.params[t]) > 4 for t in u.inputs):
                return None
            if u.op in REDUCTIONS_KEPT:
                from tuner.ops.kernels import REDUCE_AXES  # the graph passes import the kernels lazily
                if not u.attrs.get("keepdims", 1) or set(u.attrs) - {"axes", "keepdims"} or "axes" not in u.attrs \
                        or (4, _nchw_axes(u.attrs["axes"])) not in REDUCE_AXES:  # one a kernel runs, once in NCHW
                    return None
            elif not ((u.op in BINARY_POINTWISE and not u.attrs and len(u.inputs) == 2)
                      or (u.op in UNARY_POINTWISE and len(ins) == 1)):
                return None
            region.append(u)
            tensors.add(u.outputs[0])
            todo.append(u.outputs[0])
    if any(t not in tensors and t not in g.params for u in region for t in u.inputs):
        return None  # a tensor from outside the region (in another layout)
    return region if any(u.op in REDUCTIONS_KEPT for u in region) else None


def _nchw_axes(axes) -> tuple:
    """NHWC reduction axes (negative ones too) as the NCHW ones, sorted."""
    return tuple(sorted(NHWC_AXIS[int(a) % 4] for a in axes))


def _nchw_constant(v: np.ndarray, other: tuple) -> np.ndarray:
    """A constant broadcast against an NHWC operand of shape ``other``, for the same op in NCHW: left-padded to rank
    4 and transposed; a single value where all its values are equal (zeros of one sign) and it does not widen
    ``other``."""
    padded = v.reshape((1,) * (4 - v.ndim) + v.shape)
    flat = v.reshape(-1)
    if flat.size and np.all(flat == flat[0]) and np.all(np.signbit(flat) == np.signbit(flat[0])) \
            and np.broadcast_shapes(other, padded.shape) == tuple(other):
        return flat[:1]
    return np.transpose(padded, TO_NCHW)


def _reductions_to_nchw(graph: Graph) -> Graph:
    """An NHWC tensor (a transpose of an NCHW one) read by reductions that keep their rank and by pointwise ops --
    timm's channels-last global response norm (ConvNeXtV2-T and larger: the L2 norm over H and W, its mean over the
    channels, ``gamma * (x * N) + beta + x``) -- computed in NCHW: the reductions' axes and the constants permuted,
    the transpose gone, and the region left through transposes back to NCHW that become identities. Its several
    readers keep ``sink_transposes`` from moving the transpose past it one reader at a time."""
    g = graph.copy()
    changed = False
    for t in list(g.nodes):
        if t.op != "transpose" or tuple(t.attrs["perm"]) != TO_NHWC or len(g.shapes[t.inputs[0]]) != 4 \
                or not any(t is n for n in g.nodes):
            continue
        y, z = t.outputs[0], t.inputs[0]
        region = _nhwc_region(g, y) if y not in g.outputs else None
        if region is None:
            continue
        inside = {y} | {u.outputs[0] for u in region}
        nhwc = {x: tuple(g.shapes[x]) for x in inside}  # the region's shapes before it is permuted
        for u in region:
            other = next(nhwc[x] for x in u.inputs if x in nhwc)  # the operand a constant broadcasts against
            u.inputs = [z if x == y else x for x in u.inputs]
            for i, x in enumerate(u.inputs):
                if x in g.params:  # a constant: broadcast along the NHWC axes, so along the NCHW ones permuted
                    v = np.asarray(g.params[x])
                    u.inputs[i] = _add_param(g, f"{x}.nchw", _nchw_constant(v, other).astype(v.dtype))
            if u.op in REDUCTIONS_KEPT:
                u.attrs = {**u.attrs, "axes": _nchw_axes(u.attrs["axes"])}
            out = u.outputs[0]
            g.shapes[out] = tuple(g.shapes[out][p] for p in TO_NCHW)
        for n in g.nodes:  # the transposes back to NCHW: identities now
            if n.op == "transpose" and tuple(n.attrs["perm"]) == TO_NCHW and n.inputs[0] in inside:
                n.inputs = [z if n.inputs[0] == y else n.inputs[0]]
                n.attrs = {**n.attrs, "perm": (0, 1, 2, 3)}
        if not g.consumers(y):
            g.nodes = [n for n in g.nodes if n is not t]
        changed = True
    return _drop_unused(g) if changed else graph


def copies_through_transposes(graph: Graph) -> Graph:
    """A ``transpose`` whose input a ``strided_copy`` makes, read by nothing else, as one ``strided_copy``: the
    copy's shape and strides permuted, so one kernel moves the data instead of two -- EdgeNeXt's token rows
    reshaped to NHWC and transposed to NCHW before each LayerNorm over the channels. Taken where the copy does no
    reshape after its gather (``shape == out_shape``), checked by running both on an index array."""
    from tuner.graph.reference_movement import copy_sources
    g = graph.copy()
    for t in list(g.nodes):
        src = t.inputs[0] if t.op == "transpose" and len(t.inputs) == 1 else None
        c = g.producer(src) if src is not None else None
        if c is None or c.op != "strided_copy" or g.consumers(src) != [t] or src in g.outputs:
            continue
        a, perm = c.attrs, tuple(int(p) for p in t.attrs["perm"])
        shape = tuple(a["shape"])
        if tuple(a.get("out_shape", shape)) != shape or sorted(perm) != list(range(len(shape))) \
                or tuple(g.shapes[t.outputs[0]]) != tuple(shape[p] for p in perm):
            continue
        moved = {**a, "shape": tuple(shape[p] for p in perm), "strides": tuple(a["strides"][p] for p in perm),
                 "out_shape": tuple(shape[p] for p in perm)}
        src_shape = g.shapes[c.inputs[0]]
        want = np.transpose(copy_sources(c, src_shape).reshape(shape), perm).ravel()
        if not np.array_equal(copy_sources(Node("strided_copy", c.name, c.inputs, t.outputs, moved), src_shape), want):
            continue
        t.op, t.inputs, t.attrs = "strided_copy", list(c.inputs), moved
        g.nodes = [m for m in g.nodes if m is not c]
    return _drop_unused(g).validate()


# -- channel gathers ------------------------------------------------------------------------------------------
def _channel_gather(g: Graph, n: Node) -> tuple | None:
    """The channel index of a ``slice`` that gathers channels of a 4-D tensor and keeps every row and column."""
    if n.op != "slice" or len(g.shapes[n.inputs[0]]) != 4:
        return None
    shape = g.shapes[n.inputs[0]]
    for key, extent in (("rows", shape[2]), ("cols", shape[3])):
        start, step, count = n.attrs.get(key, (0, 1, None))
        if (start, step) != (0, 1) or count not in (None, extent):
            return None
    return tuple(int(c) for c in n.attrs["channels"])


def compose_gathers(graph: Graph) -> Graph:
    from tuner.ir.gather import channel_map  # the forms the gather kernel reads
    g = graph.copy()
    for n in g.nodes:
        index = _channel_gather(g, n)
        src = g.producer(n.inputs[0]) if index is not None else None
        first = _channel_gather(g, src) if src is not None else None
        if first is None:
            continue
        composed = tuple(first[c] for c in index)
        if channel_map(composed) is not None:
            n.inputs, n.attrs = [src.inputs[0]], {**n.attrs, "channels": composed}
    read = {t for n in g.nodes for t in n.inputs} | set(g.outputs)
    while True:  # gathers nobody reads any more (a shuffle whose readers all read through it)
        dead = [n for n in g.nodes if n.op == "slice" and not read & set(n.outputs)]
        if not dead:
            break
        g.nodes = [n for n in g.nodes if n not in dead]
        read = {t for n in g.nodes for t in n.inputs} | set(g.outputs)
    return _drop_unused(g).validate()


def _copy_through_slice(copy: Node, in_shape: tuple, first: int) -> dict | None:
    """The attributes of strided copy ``copy`` reading, instead of a slice of channels ``first``, ``first + 1``, ...
    of a 4-D tensor of ``in_shape``, that tensor itself; None where the copy's dimensions cross images in a way
    that no strides express."""
    a = copy.attrs
    src = tuple(a["src_shape"])
    if len(src) != 4 or src[0] != in_shape[0] or src[2:] != in_shape[2:]:
        return None
    image, image_in = math.prod(src[1:]), math.prod(in_shape[1:])
    strides, span = [], a["offset"] % image
    for st, e in zip(a["strides"], a["shape"]):
        if st % image == 0:  # across images
            strides.append(st // image * image_in)
        else:  # within one image: the slice's channels are contiguous there
            strides.append(st)
            span += (e - 1) * st
    if span >= image:
        return None
    offset = a["offset"] // image * image_in + a["offset"] % image + first * math.prod(in_shape[2:])
    return {**a, "src_shape": tuple(in_shape), "strides": tuple(strides), "offset": offset}


def compose_gathers_into_copies(graph: Graph) -> Graph:
    g = graph.copy()
    for n in list(g.nodes):
        index, out = _channel_gather(g, n), n.outputs[0]
        readers = g.consumers(out)
        if index is None or out in g.outputs or not readers or index != tuple(range(index[0], index[0] + len(index))) \
                or any(r.op != "strided_copy" for r in readers):
            continue
        attrs = [_copy_through_slice(r, tuple(g.shapes[n.inputs[0]]), index[0]) for r in readers]
        if any(x is None for x in attrs):
            continue
        for r, x in zip(readers, attrs):
            r.inputs, r.attrs = [n.inputs[0]], x
        g.nodes = [m for m in g.nodes if m is not n]
    return g.validate()


# reductions over H, W whose template reads its input at a channel offset (``SpatialReduceWorkload.in_view``)
READS_CHANNEL_OFFSET = ("global_avg_pool", "global_max_pool", "reduce_mean", "reduce_max", "reduce_sum", "reduce_l2")


def _contiguous(index: tuple | None) -> bool:
    return index is not None and index == tuple(range(index[0], index[0] + len(index)))


def _offset_writer(g: Graph, x: str) -> bool:
    """Whether ``x`` is made by a convolution that ``plan.views`` may have write at a channel offset of a concat
    (the conv2d template: not a depthwise one)."""
    p = g.producer(x)
    if p is None or p.op != "conv2d":
        return False
    w = g.shapes[p.inputs[1]]
    return not (w[1] == 1 and p.attrs.get("groups", 1) == w[0] > 1)


def _concat_reads_in_place(g: Graph, r: Node, t: str) -> bool:
    """Whether ``r`` is a channel concat (4-D, no activation) whose kernel may read its part ``t`` in place:
    where no kernel could write the concat in place anyway (a part starts inside an RGBA pixel: EdgeNeXt's 88
    channels split into 30, 30 and 28), or where no part is a convolution's that could write it in place (its
    parts are slices, each a copy kernel, or depthwise outputs: one concat kernel instead) and its one reader does
    not read the parts itself. ShuffleNetV2's concat of a slice and a 1x1 convolution's output stays written in
    place, the zoo's EdgeNeXt-like concat read by its LayerNorm in parts."""
    if r.op != "concat" or len(g.shapes[r.outputs[0]]) != 4 or r.attrs.get("axis", 1) not in (1, -3) \
            or "activation" in r.attrs or r.inputs.count(t) != 1 or any(x in g.params for x in r.inputs):
        return False  # (a constant part: the concat_view kernel, which reads no offset)
    sizes = r.attrs.get("parts") or tuple(g.shapes[x][1] for x in r.inputs)
    offsets = r.attrs.get("channel_offsets") or (None,) * len(r.inputs)
    if any(sum(sizes[:i]) % 4 for i in range(len(sizes))):
        return True
    readers = g.consumers(r.outputs[0])
    if len(readers) == 1 and (readers[0].op == "layer_norm" or readers[0].op == "conv2d"
                              and readers[0].attrs.get("groups", 1) == 1):
        return False  # it reads the parts itself (``plan.input_views``: a convolution's or a norm's ``in_read``)
    return not any(at is None and _offset_writer(g, x) for x, at in zip(r.inputs, offsets))


def _reads_slice_in_place(g: Graph, r: Node, t: str, at: int) -> bool:
    """Whether ``r`` lowers to a kernel that can read its input ``t`` (once) as channels ``at``.. of its source:
    a concat (``_concat_reads_in_place``) or the elementwise kernel at any offset, a reduction over H, W the
    spatial_reduce template runs (its first input) at an offset that starts a pixel."""
    if r.op == "concat":
        return _concat_reads_in_place(g, r, t)
    if r.inputs.count(t) != 1 or (r.attrs.get("channel_offsets") or {}) and \
            r.attrs["channel_offsets"][r.inputs.index(t)] is not None:
        return False
    if r.op in ("relu", "clip"):
        return r.inputs[0] == t
    if r.op in READS_CHANNEL_OFFSET:  # the spatial_reduce template's in_view: its first input only
        return r.inputs[0] == t and at % 4 == 0 and _reduction_lowers(g, r)
    out = tuple(g.shapes[r.outputs[0]])
    offsets = r.attrs.get("channel_offsets") or (None,) * len(r.inputs)
    return r.op == "add" and len(r.inputs) == 2 and not any(x in g.params for x in r.inputs) and all(
        tuple(g.shapes[x]) == out if at is None and x != t else
        len(out) == 4 and tuple(g.shapes[x])[::2] == out[::2] and g.shapes[x][3] == out[3]
        for x, at in zip(r.inputs, offsets))


def slices_read_in_place(graph: Graph) -> Graph:
    g = graph.copy()
    for n in list(g.nodes):
        index, out = _channel_gather(g, n), n.outputs[0]
        readers = g.consumers(out)
        if not _contiguous(index) or out in g.outputs or not readers \
                or not all(_reads_slice_in_place(g, r, out, index[0]) for r in readers):
            continue
        for r in readers:
            k = r.inputs.index(out)
            offsets = list(r.attrs.get("channel_offsets") or (None,) * len(r.inputs))
            offsets[k] = index[0]
            if r.op == "concat":  # each part's channels, no longer its tensor's
                r.attrs = {**r.attrs, "parts": r.attrs.get("parts") or tuple(g.shapes[x][1] for x in r.inputs)}
            r.inputs = [n.inputs[0] if t == out else t for t in r.inputs]
            r.attrs = {**r.attrs, "channel_offsets": tuple(offsets)}
        g.nodes = [m for m in g.nodes if m is not n]
    return _drop_unused(g).validate()


def adds_into_depthwise(graph: Graph) -> Graph:
    """An add of two activations (each whole, or a channel slice read in place) that only a depthwise convolution
    (zero padding) reads is done by that convolution as it reads its input (``in_add``: the addend and the channel
    ``in_add_at`` it is read from; ``DepthwiseWorkload.in_add``): EdgeNeXt's SDTA cascade, each chunk of the map
    plus the previous depthwise output, the sum read by the next depthwise convolution."""
    g = graph.copy()
    for n in list(g.nodes):
        out = n.outputs[0]
        conv = _sole_reader(g, out) if n.op == "add" else None
        if conv is None or "activation" in n.attrs or len(n.inputs) != 2 or len(g.shapes[out]) != 4 \
                or any(t in g.params for t in n.inputs) or conv.inputs[0] != out or not _is_depthwise(g, conv) \
                or conv.attrs.get("pad_mode", "zeros") != "zeros":
            continue
        shape, offsets = tuple(g.shapes[out]), n.attrs.get("channel_offsets") or (None, None)
        whole = [tuple(g.shapes[t]) == shape and at is None for t, at in zip(n.inputs, offsets)]
        if not any(whole) or not all(w or at is not None for w, at in zip(whole, offsets)):
            continue  # a broadcast add
        k = whole.index(True)
        x, addend = n.inputs[k], n.inputs[1 - k]
        conv.inputs = [x] + conv.inputs[1:] + [addend]
        conv.attrs = {**conv.attrs, "in_add": addend, "in_add_at": int(offsets[1 - k] or 0)}
        g.nodes = [m for m in g.nodes if m is not n]
    return _drop_unused(g).validate()


def _identity_flatten(g: Graph, copy: Node) -> bool:
    """Whether the strided copy stores its 4-D (N, C, H, W) source as (N, C, 1, H * W) element for element: a map
    flattened to tokens (``x.reshape(B, C, H * W).transpose(1, 2)``), the same pixels in the same order."""
    from tuner.graph.reference_movement import copy_sources
    src = tuple(g.shapes[copy.inputs[0]])
    if copy.op != "strided_copy" or len(copy.inputs) != 1 or len(src) != 4 or copy.attrs.get("divisor") \
            or tuple(g.shapes[copy.outputs[0]]) != (src[0], src[1], 1, src[2] * src[3]):
        return False
    return bool(np.array_equal(copy_sources(copy, src), np.arange(int(np.prod(src)))))


def concats_written_as_tokens(graph: Graph) -> Graph:
    """A channel concat read only by a strided copy that flattens it to tokens element for element
    (``_identity_flatten``) writes the tokens itself (attr ``flat``) and the copy goes: EdgeNeXt's split
    depthwise chain, concatenated and reshaped to tokens for its transposed attention. Only a concat that is a
    kernel anyway: one that reads a part in place (``slices_read_in_place``). A constant then added to the tokens
    alone is added by the concat too (``addend``, its last input: EdgeNeXt's positional encoding)."""
    g = graph.copy()
    for n in list(g.nodes):
        copy = _sole_reader(g, n.outputs[0]) if n.op == "concat" else None
        if copy is None or not n.attrs.get("channel_offsets") or "activation" in n.attrs or n.attrs.get("flat") \
                or n.outputs[0] in g.outputs or not _identity_flatten(g, copy):
            continue
        n.outputs, n.attrs = list(copy.outputs), {**n.attrs, "flat": True}
        g.nodes = [m for m in g.nodes if m is not copy]
        add = _sole_reader(g, n.outputs[0])  # a constant added to the tokens (EdgeNeXt's positional encoding)
        const = [x for x in add.inputs if x in g.params] if add is not None and add.op == "add" else []
        if len(const) == 1 and not add.attrs and len(add.inputs) == 2 \
                and np.broadcast_shapes(np.shape(g.params[const[0]]), g.shapes[n.outputs[0]]) \
                == tuple(g.shapes[n.outputs[0]]):
            n.inputs, n.outputs = n.inputs + const, list(add.outputs)
            n.attrs = {**n.attrs, "addend": True}
            g.nodes = [m for m in g.nodes if m is not add]
    return _drop_unused(g).validate()


def _activation_spec(n: Node) -> str | None:
    """The activation a ReLU, Clip or activation node applies, as a spec of ``tuner.ir.activations``."""
    from tuner.ir.activations import canonical, spec
    if n.op == "relu":
        return "relu"
    if n.op == "clip":
        return canonical(spec("clip", float(n.attrs.get("min", -np.inf)), float(n.attrs.get("max", np.inf))))
    return canonical(n.attrs["fn"]) if n.op == "activation" else None


def fuse_concat_activations(graph: Graph) -> Graph:
    g = graph.copy()
    for n in list(g.nodes):
        out = n.outputs[0]
        if n.op != "concat" or len(g.shapes[out]) != 4 or n.attrs.get("axis", 1) not in (1, -3) \
                or "activation" in n.attrs or n.attrs.get("channel_offsets") or n.attrs.get("flat") \
                or (act := _sole_reader(g, out)) is None or act.inputs != [out]:
            continue
        fn = _activation_spec(act)
        shared = len(set(n.inputs)) < len(n.inputs) or any(
            len(g.consumers(p)) > 1 or p in g.outputs or p in g.inputs or p in g.params for p in n.inputs)
        if fn is None or not shared:  # a concat plan.views may write in place: its parts' producers take the rest
            continue
        n.attrs = {**n.attrs, "activation": fn}
        n.outputs = list(act.outputs)
        g.nodes = [m for m in g.nodes if m is not act]
    return _drop_unused(g).validate()


def _is_depthwise(g: Graph, n: Node) -> bool:
    if n.op != "conv2d":
        return False
    w = g.shapes[n.inputs[1]]
    return (n.op == "conv2d" and n.attrs.get("groups", 1) == g.shapes[n.inputs[0]][1] == w[0] and w[1] == 1
            and all(t in g.params for t in n.inputs[1:]) and "in_scale" not in n.attrs and "residual" not in n.attrs)


def _through_depthwise(g: Graph, gather: Node, index: tuple, dw: Node) -> None:
    """``dw(gather(x))`` -> ``gather(dw'(x))``: the depthwise convolution runs on every channel of x, its filters
    moved to the channels they read (zero filters on the channels the gather leaves out), and the same gather
    after it, for the readers of its output to fold in turn."""
    src, c = gather.inputs[0], g.shapes[gather.inputs[0]][1]
    mid = _fresh(g, f"{dw.name}.source_order")
    n_, _, h, w = g.shapes[dw.outputs[0]]
    g.shapes[mid] = (n_, c, h, w)
    ins = [src]
    for p in dw.inputs[1:]:  # weights (C, 1, R, S), then the bias (C,)
        v = g.params[p]
        moved = np.zeros((c,) + v.shape[1:], np.float32)
        moved[list(index)] = v
        ins.append(_add_param(g, f"{p}.source_order", moved))
    after = Node("slice", f"{dw.name}.order", [mid], list(dw.outputs),
                 {"channels": index, "rows": (0, 1, h), "cols": (0, 1, w)})
    dw.inputs, dw.outputs, dw.attrs = ins, [mid], {**dw.attrs, "groups": c}
    g.nodes.insert(g.nodes.index(dw) + 1, after)


def fold_gathers_into_convs(graph: Graph) -> Graph:
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        for n in list(g.nodes):
            index, out = _channel_gather(g, n), n.outputs[0]
            if index is None or out in g.outputs or not g.consumers(out):
                continue
            src = n.inputs[0]
            if len(set(index)) == len(index):  # no channel twice: depthwise readers run on the source's order, or
                # read a chunk at a whole pixel in place (``in_view``)
                for r in g.consumers(out):
                    if not (_is_depthwise(g, r) and r.inputs[0] == out and r.inputs.count(out) == 1):
                        continue
                    if _contiguous(index) and index[0] % 4 == 0 and "in_view" not in r.attrs:
                        r.inputs = [src] + r.inputs[1:]
                        r.attrs = {**r.attrs, "in_view": (index[0], len(index))}
                    else:
                        _through_depthwise(g, n, index, r)
                    changed = True
            readers = g.consumers(out)
            if not readers:  # every reader was depthwise and now reads the source: the gather runs no kernel
                g.nodes = [m for m in g.nodes if m is not n]
                changed = True
                continue
            if -(-g.shapes[src][1] // 4) > 2 * -(-len(index) // 4) or not all(  # pixels read
                    r.op == "conv2d" and r.attrs.get("groups", 1) == 1 and "in_scale" not in r.attrs
                    and r.inputs[0] == out and out not in r.inputs[1:] and r.inputs[1] in g.params for r in readers):
                continue
            for r in readers:
                w = g.params[r.inputs[1]]
                full = np.zeros((w.shape[0], g.shapes[src][1]) + w.shape[2:], np.float32)
                np.add.at(full, (slice(None), list(index)), w)  # input channel k of the gather is channel index[k]
                r.inputs = [src, _add_param(g, f"{r.name}.w_gathered", full)] + r.inputs[2:]
            g.nodes = [m for m in g.nodes if m is not n]
            changed = True
    return _drop_unused(g).validate()


def _extended(index: tuple, count: int, limit: int) -> tuple | None:
    """``index`` continued to ``count`` entries by its own form ((c % m) * a + (c // m) * b + off), if every
    entry stays below ``limit``; else None."""
    from tuner.ir.gather import channel_map
    m, a, b, off = channel_map(index)
    more = tuple((c % m) * a + (c // m) * b + off for c in range(len(index), count))
    return index + more if all(0 <= v < limit for v in more) else None


def _pad_part(g: Graph, part: str, to: int) -> bool:
    """The producer of ``part`` (a groups-1 convolution or a channel gather, read only by the concat) makes
    ``to`` channels: zero filters, or its gather continued; False when it cannot."""
    p = g.producer(part)
    if p is None or part in g.outputs or len(g.consumers(part)) != 1:
        return False
    n_, c, h, w = g.shapes[part]
    index = _channel_gather(g, p)
    if index is not None:
        longer = _extended(index, to, g.shapes[p.inputs[0]][1])
        if longer is None:
            return False
        p.attrs = {**p.attrs, "channels": longer}
    elif (p.op == "conv2d" and p.attrs.get("groups", 1) == 1 and "residual" not in p.attrs
          and all(t in g.params for t in p.inputs[1:])):
        ins = [p.inputs[0]]
        for t in p.inputs[1:]:  # weights (O, C, R, S), then the bias (O,): zero rows for the new channels
            v = g.params[t]
            ins.append(_add_param(g, f"{t}.padded", np.concatenate([v, np.zeros((to - c,) + v.shape[1:])])))
        ins += [t for t in p.inputs[len(ins):]]
        p.inputs = ins
    else:
        return False
    g.shapes[part] = (n_, to, h, w)
    return True


def pad_concat_parts(graph: Graph) -> Graph:
    """A channel concat read only by channel gathers, whose parts but the last do not fill whole RGBA pixels:
    each such part is made a multiple of 4 channels by its producer (a groups-1 convolution's zero filters, a
    gather continued), and the gathers skip the padding -- so that ``plan.views`` can write every part in place.
    ShuffleNetV2 x1.0's first stage concatenates halves of 58 channels."""
    from tuner.ir.gather import channel_map
    g = graph.copy()
    for n in list(g.nodes):
        shape = g.shapes[n.outputs[0]]
        if n.op != "concat" or len(shape) != 4 or n.attrs.get("axis", 1) not in (1, -3) or n.outputs[0] in g.outputs:
            continue
        sizes = [g.shapes[t][1] for t in n.inputs]
        if all(c % 4 == 0 for c in sizes[:-1]) or len(set(n.inputs)) != len(n.inputs):
            continue
        readers = g.consumers(n.outputs[0])
        if not readers or not all(_channel_gather(g, r) is not None for r in readers):
            continue
        padded = [-(-c // 4) * 4 for c in sizes[:-1]] + sizes[-1:]
        new_at = [sum(padded[:i]) + k for i, c in enumerate(sizes) for k in range(c)]  # old channel -> new
        remapped = [tuple(new_at[k] for k in _channel_gather(g, r)) for r in readers]
        if any(channel_map(ix) is None for ix in remapped):
            continue
        saved = {t: (g.producer(t).attrs, g.producer(t).inputs, g.shapes[t]) for t in n.inputs if g.producer(t)}
        if not all(_pad_part(g, t, to) if to != c else True for t, c, to in zip(n.inputs, sizes, padded)):
            for t, (attrs, ins, shp) in saved.items():  # one part could not: leave the concat as it was
                g.producer(t).attrs, g.producer(t).inputs, g.shapes[t] = attrs, ins, shp
            continue
        g.shapes[n.outputs[0]] = (shape[0], sum(padded), shape[2], shape[3])
        for r, ix in zip(readers, remapped):
            r.attrs = {**r.attrs, "channels": ix}
    return _drop_unused(g).validate()


def optimize_movement(graph: Graph) -> Graph:
    """All of the above, in order (attention's token tensors made 4-D by ``passes_tokens`` once channel
    shuffles are single gathers); ``passes.optimize`` runs it first."""
    return run_passes(graph, MOVEMENT_PASSES)


MOVEMENT_PASSES = (drop_identities, fuse_channel_shuffle, compose_gathers, optimize_tokens, nhwc_to_nchw,  # in this order
                   copies_through_transposes, lower_conv_transpose, hoist_channelwise)
