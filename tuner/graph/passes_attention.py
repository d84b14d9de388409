"""MobileViTv2's linear attention with fewer kernels: ``softmax_into_reductions`` (the scores computed inside the
reduction that reads them) and ``slice_activations_into_producers`` (the ReLU of the values folded into the qkv
convolution, the values read in place by the projection).

MobileViTv2's block takes one channel of a 1x1 convolution's output as the query, flattens it over the pixels,
softmaxes it, reshapes it back to a map and sums the keys weighted by it (the context vector). After the movement
passes that is ``strided_copy`` (channel q of the convolution's (1, C, H, W) as (1, H*W, 1, 1)) -> ``softmax`` over
axis 1 -> ``strided_copy`` back to (1, 1, H, W) -> a ``reduce_sum`` / ``reduce_mean`` over (H, W) with that map as its
``weight`` (``passes.fuse_reduction_weights``): three kernels, two of them copies, for 64 to a few thousand numbers.
The reduction can compute the softmax itself -- the max of channel q over the reduced positions, then the sums of
``x * exp(q - max)`` and ``exp(q - max)`` (the spatial_reduce template's ``softmax`` weights) -- so the three nodes
go and the reduction reads the convolution's output twice: its keys as X, its query channel as Q (``attrs
"softmax_of"``: the channel).

timm's MobileViTv2 unfolds the map into (C, patch, patches) first (a 2x2 patch: (C, 4, H*W/4)) and softmaxes the
query over the patches only, per patch position: its reduction is over W of that 4-D tensor, and the query goes
through a token view, (1, 4, patches) stored as (1, patches, 1, 4), on its way. The same rewrite holds with the
softmax over W (``softmax_of`` with ``axes`` (3,)).

Taken where each of the three nodes is read only by the next, and where, checked by running both copies' references
on index arrays (``_softmax_channel``), the first copy reads channel q of the tensor at the position the second puts
each value and the softmax normalizes exactly the positions that share their coordinates off the reduced axes."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node
from tuner.graph.graph import add_param as _add_param
from tuner.graph.reference_movement import copy_sources
from tuner.ops.token_views import affine_form, stored_coords, strided_reference


def _softmax_channel(g: Graph, flat, soft, back, axes: tuple) -> int | None:
    """The channel q when ``back(soft(flat(src)))`` is, at every position (n, 0, h, w) of ``back``'s (N, 1, H, W)
    output, the softmax over ``axes`` (the reduced positions: (2, 3) for MobileViTv2's H x W, (3,) for timm's
    unfolded (C, patch, patches) over the patches) of ``src``'s channel q, else None.

    Checked on index arrays: ``flat`` must read channel q at each position that ``back`` puts it (whatever token
    view lies between), and each group that ``soft`` normalizes together must be exactly the positions that share
    their coordinates off ``axes``."""
    src, w = flat.inputs[0], back.outputs[0]
    shape, out = tuple(g.shapes[src]), tuple(g.shapes[w])
    if flat.op != "strided_copy" or back.op != "strided_copy" or len(shape) != 4 or len(out) != 4 \
            or out[1] != 1 or out[0] != shape[0] or out[2:] != shape[2:]:
        return None
    soft_shape = tuple(g.shapes[soft.outputs[0]])
    try:
        m1 = copy_sources(flat, shape)  # flat's elements (stored order) -> src's
        m2 = copy_sources(back, soft_shape)  # back's elements (row-major) -> soft's (stored order)
    except (KeyError, ValueError):
        return None
    size = int(np.prod(out))
    if m2.size != size or m1.size != size or np.unique(m2).size != size or m2.max() >= m1.size:
        return None
    n, _, h, x = np.indices(out).reshape(4, -1)
    N, C, H, W = shape
    q = int(m1[m2[0]]) // (H * W) % C
    if not np.array_equal(m1[m2], ((n * C + q) * H + h) * W + x):
        return None
    axis = soft.attrs.get("axis", 1) % len(soft_shape)
    coords = np.indices(soft_shape).reshape(len(soft_shape), -1)
    group = np.ravel_multi_index(tuple(np.delete(coords, axis, 0)), tuple(np.delete(soft_shape, axis)))[m2]
    kept = [(n, h, x)[k] for k, a in enumerate((0, 2, 3)) if a not in axes]
    key = np.ravel_multi_index(tuple(kept), tuple(out[a] for a in (0, 2, 3) if a not in axes))
    pairs = np.unique(np.stack([group, key]), axis=1).shape[1]
    return q if pairs == np.unique(group).size == np.unique(key).size else None


def softmax_into_reductions(graph: Graph) -> Graph:
    """Each reduction over (H, W) -- or over W alone -- weighted by the softmaxed, reshaped channel of a tensor
    (module doc) computing the softmax itself: the two copies and the softmax dropped, the reduction reading the
    tensor as its weights Q."""
    g = graph.copy()
    for node in list(g.nodes):
        w = node.attrs.get("weight")
        axes = tuple(sorted(a % 4 for a in node.attrs.get("axes", ())))
        if node.op not in ("reduce_sum", "reduce_mean") or w is None or "softmax_of" in node.attrs \
                or axes not in ((2, 3), (3,)) or w in g.outputs:
            continue
        shape = tuple(g.shapes[node.inputs[0]])
        back = g.producer(w)
        if back is None or g.consumers(w) != [node]:
            continue
        soft = g.producer(back.inputs[0])
        if soft is None or soft.op != "softmax" or g.consumers(soft.outputs[0]) != [back] \
                or soft.outputs[0] in g.outputs:
            continue
        flat = g.producer(soft.inputs[0])
        if flat is None or g.consumers(soft.inputs[0]) != [soft] or soft.inputs[0] in g.outputs:
            continue
        q = _softmax_channel(g, flat, soft, back, axes)
        src = flat.inputs[0]
        if q is None or tuple(g.shapes[src])[2:] != shape[2:] or tuple(g.shapes[src])[0] != shape[0]:
            continue
        node.inputs = [node.inputs[0], src]
        node.attrs = {**node.attrs, "weight": src, "softmax_of": q}
        g.nodes = [m for m in g.nodes if m not in (back, soft, flat)]
    return g.validate()


def slice_activations_into_producers(graph: Graph) -> Graph:
    """A ReLU of a channel slice of a convolution's output (MobileViTv2's ReLU of the values: channels [o, o + c) of
    the qkv convolution, read in place: ``attrs["channel_offsets"]``) that only one convolution reads, as its input:

    - the producing convolution applies it in its epilogue as a per-channel PReLU -- slope 0 on the slice, 1 (the
      identity) on every other channel, which other kernels read raw -- so no kernel runs for it;
    - the reading convolution reads the slice of the producer's output in place (``attrs["in_view"]``: (o, c);
      ``Conv2dWorkload.in_read`` with the offset), its gate and epilogue as before.

    Taken where the producer is a convolution with no activation, residual or gate of its own, the slice starts at
    an RGBA pixel (o a multiple of 4), and the reader is a convolution of groups 1."""
    g = graph.copy()
    for node in list(g.nodes):
        offs = node.attrs.get("channel_offsets")
        if node.op != "relu" or set(node.attrs) != {"channel_offsets"} or not offs or offs[0] is None \
                or len(node.inputs) != 1 or node.outputs[0] in g.outputs:
            continue
        src, out, o = node.inputs[0], node.outputs[0], int(offs[0])
        prod, readers = g.producer(src), g.consumers(out)
        c = g.shapes[out][1]
        if prod is None or prod.op != "conv2d" or o % 4 or len(readers) != 1 or readers[0].op != "conv2d" \
                or readers[0].inputs.count(out) != 1 or readers[0].inputs[0] != out \
                or readers[0].attrs.get("groups", 1) != 1 or "in_view" in readers[0].attrs \
                or any(k in prod.attrs for k in ("activation", "residual", "in_scale", "slope", "in_view")):
            continue
        slope = np.ones(g.shapes[src][1], np.float32)
        slope[o:o + c] = 0.0
        prod.attrs["activation"], prod.attrs["slope"] = "prelu", _add_param(g, f"{prod.name}.slope", slope)
        prod.inputs = prod.inputs + [prod.attrs["slope"]]
        reader = readers[0]
        reader.inputs = [src] + reader.inputs[1:]
        reader.attrs["in_view"] = (o, c)
        g.nodes = [m for m in g.nodes if m is not node]
    return g.validate()


def divisions_into_copies(graph: Graph) -> Graph:
    """EdgeNeXt's transposed attention L2-normalizes its queries and keys along the tokens (``F.normalize``: a
    ``reduce_l2`` over the last axis, clipped, then ``x / norm``) and reads them through a ``strided_copy`` into the
    matmul's layout: the division is a kernel between a copy and a copy. Where a ``div`` of a 4-D activation by one
    value a row (its shape with a last axis of 1) has nothing fused and is read only by strided copies of all of it
    (the divided tensor's shape is each copy's source), each copy reads the dividend and divides as it reads (attr
    ``divisor``, a second input), and the ``div`` goes: one launch fewer a query or key."""
    g = graph.copy()
    drop = set()
    for n in g.nodes:
        if n.op != "div" or n.attrs or len(n.inputs) != 2 or n.outputs[0] in g.outputs:
            continue
        x, d = n.inputs
        if x in g.params or d in g.params or len(g.shapes[x]) != 4 or \
                tuple(g.shapes[d]) != (*g.shapes[x][:3], 1) or tuple(g.shapes[n.outputs[0]]) != tuple(g.shapes[x]):
            continue
        readers = g.consumers(n.outputs[0])
        if not readers or any(r.op != "strided_copy" or r.attrs.get("divisor") or r.inputs != [n.outputs[0]]
                              or tuple(r.attrs["src_shape"]) != tuple(g.shapes[x]) for r in readers):
            continue
        for r in readers:
            r.inputs = [x, d]
            r.attrs["divisor"] = True
        drop.add(id(n))
        g.shapes.pop(n.outputs[0], None)
    return _dropped(graph, g, drop)


def _dropped(graph: Graph, g: Graph, drop: set) -> Graph:
    """``g`` (a rewritten copy of ``graph``) without the nodes whose ids are in ``drop``; ``graph`` itself when
    nothing was dropped."""
    if not drop:
        return graph
    g.nodes = [n for n in g.nodes if id(n) not in drop]
    return g.validate()


def _view_index(copy: Node, index: np.ndarray) -> np.ndarray:
    """The elements of ``index`` (an array of the copy's logical source shape) the strided copy reads, in the
    logical order of its view."""
    a = copy.attrs
    return strided_reference(index, a["offset"], a["shape"], a["strides"])


def _channel_rows(copy: Node, through: np.ndarray) -> int | None:
    """The first channel c0 when the strided copy ``copy`` (no divisor, its shape's last axis T) reads, as each of its
    rows r (row-major over the other axes), every pixel of channel c0 + r of a batch-1 tensor of T pixels once:
    its reductions along the last axis are spatial reductions of those channels. None otherwise. ``through``: the
    source element each element of the copy reads (``_view_index`` of the source's indices)."""
    a = copy.attrs
    shape, src = tuple(a["shape"]), tuple(a["src_shape"])
    if a.get("divisor") or tuple(a["out_shape"]) != shape or len(shape) < 2 or len(src) not in (3, 4):
        return None
    (n, ch, h, w), stored = stored_coords(src, through.reshape(-1))
    rows, t = int(np.prod(shape[:-1])), shape[-1]
    if stored[0] != 1 or t != stored[2] * stored[3]:
        return None
    ch, pix = ch.reshape(rows, t), (h * stored[3] + w).reshape(rows, t)
    c0 = int(ch[0, 0])
    if c0 % 4 or not np.array_equal(ch, np.broadcast_to(c0 + np.arange(rows)[:, None], ch.shape)) or \
            not np.array_equal(np.sort(pix, axis=1), np.broadcast_to(np.arange(t), pix.shape)):
        return None
    return c0


def norms_read_in_place(graph: Graph) -> Graph:
    """EdgeNeXt's queries and keys after ``divisions_into_copies``: a strided copy S takes each head's channels out of
    the qkv projection's output as rows (1, heads, d, tokens); a ``reduce_l2`` along the tokens of S computes each
    row's norm, and the copies into the matmul's layout read S and divide by those norms. S was a kernel of its own.
    Where each row of S is one channel's whole map (``_channel_rows``: channels c0, c0 + 1, ... of the source) and S
    is read only by the reduction and by such dividing copies of it:

    - the reduction reads the source's channels in place instead (``channel_offsets`` c0, over (H, W)), its output
      one value a channel, (1, rows, 1, 1);
    - each dividing copy reads the source through its view composed with S's (``affine_form`` of the two index
      maps) and divides each element by the norm of its source channel (``divisor_index``: the channel less c0);
    - S goes: one launch fewer a query or key."""
    g = graph.copy()
    drop = set()
    for r in g.nodes:
        if r.op != "reduce_l2" or tuple(r.attrs.get("axes", ())) not in ((-1,), (len(g.shapes[r.inputs[0]]) - 1,)) \
                or not r.attrs.get("keepdims", 1) or r.attrs.get("channel_offsets") or r.outputs[0] in g.outputs:
            continue
        s = g.producer(r.inputs[0])
        if s is None or s.op != "strided_copy" or len(s.inputs) != 1 or r.inputs[0] in g.outputs:
            continue
        x, src = s.inputs[0], tuple(s.attrs["src_shape"])
        if x in g.params or len(g.shapes[x]) != 4:
            continue
        readers, divided = g.consumers(r.inputs[0]), g.consumers(r.outputs[0])
        if any(q is not r and (q.op != "strided_copy" or q.inputs != [r.inputs[0], r.outputs[0]]
                               or not q.attrs.get("divisor") or q.attrs.get("divisor_index")) for q in readers) \
                or sorted(map(id, divided)) != sorted(id(q) for q in readers if q is not r):
            continue
        through = _view_index(s, np.arange(int(np.prod(src))).reshape(src))  # S's elements as source indices
        c0 = _channel_rows(s, through)
        if c0 is None or not divided:
            continue
        views = [affine_form(_view_index(q, through)) if tuple(q.attrs["src_shape"]) == tuple(s.attrs["shape"])
                 else None for q in divided]
        if None in views:
            continue
        rows = int(np.prod(s.attrs["shape"][:-1]))
        d_shape = (1, rows, 1, 1)
        channel_axis = 2 if len(src) == 3 else 1  # where the source's logical coordinates keep its channel
        for q, (offset, strides) in zip(divided, views):
            q.inputs = [x, r.outputs[0]]
            q.attrs = {**q.attrs, "src_shape": src, "offset": offset, "strides": strides,
                       "divisor_index": (d_shape, -c0, tuple(int(k == channel_axis) for k in range(len(src))))}
        r.inputs = [x]
        r.attrs = {**r.attrs, "axes": (2, 3), "channel_offsets": (c0,)}
        g.shapes[r.outputs[0]] = d_shape
        drop.add(id(s))
        g.shapes.pop(s.outputs[0], None)
    return _dropped(graph, g, drop)
