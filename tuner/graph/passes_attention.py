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

Taken where each of the three nodes is read only by the next, the first copy is exactly channel q of a batch-1 NCHW
tensor in row-major order and the second exactly the reshape of the softmax's H*W values to (1, 1, H, W), checked by
running both copies' references on index arrays."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph
from tuner.graph.graph import add_param as _add_param


def _mapping(node, shape) -> np.ndarray:
    """The source element (row-major index) each output element of the copy ``node`` reads, input shape ``shape``."""
    from tuner.graph.reference_movement import strided_copy
    return np.asarray(strided_copy(node, np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape))).ravel()


def _query_channel(g: Graph, copy) -> int | None:
    """The channel q when ``copy`` reads channel q of its batch-1 NCHW input as its H*W values in order, else None."""
    src = tuple(g.shapes[copy.inputs[0]])
    if copy.op != "strided_copy" or len(src) != 4 or src[0] != 1:
        return None
    hw = src[2] * src[3]
    try:
        got = _mapping(copy, src)
    except (KeyError, ValueError):
        return None
    if got.size != hw or got[0] % hw or not np.array_equal(got, np.arange(got[0], got[0] + hw)):
        return None
    return int(got[0]) // hw


def _is_reshape_to(g: Graph, copy, shape: tuple) -> bool:
    """Whether ``copy`` is the row-major reshape of its input to ``shape`` (every element in order)."""
    if copy.op != "strided_copy" or tuple(g.shapes[copy.outputs[0]]) != shape:
        return False
    try:
        got = _mapping(copy, tuple(g.shapes[copy.inputs[0]]))
    except (KeyError, ValueError):
        return False
    return np.array_equal(got, np.arange(int(np.prod(shape))))


def softmax_into_reductions(graph: Graph) -> Graph:
    """Each reduction over (H, W) weighted by the softmaxed, reshaped channel of a tensor (module doc) computing the
    softmax itself: the two copies and the softmax dropped, the reduction reading the tensor as its weights Q."""
    g = graph.copy()
    for node in list(g.nodes):
        w = node.attrs.get("weight")
        if node.op not in ("reduce_sum", "reduce_mean") or w is None or "softmax_of" in node.attrs \
                or tuple(sorted(node.attrs.get("axes", ()))) != (2, 3) or w in g.outputs:
            continue
        shape = tuple(g.shapes[node.inputs[0]])
        back = g.producer(w)
        if back is None or g.consumers(w) != [node] or not _is_reshape_to(g, back, (shape[0], 1, *shape[2:])):
            continue
        soft = g.producer(back.inputs[0])
        if soft is None or soft.op != "softmax" or soft.attrs.get("axis", 1) not in (1, -3) \
                or g.consumers(soft.outputs[0]) != [back] or soft.outputs[0] in g.outputs:
            continue
        scores = tuple(g.shapes[soft.outputs[0]])
        if len(scores) != 4 or scores[1] != shape[2] * shape[3] or scores[2:] != (1, 1):
            continue
        flat = g.producer(soft.inputs[0])
        if flat is None or g.consumers(soft.inputs[0]) != [soft] or soft.inputs[0] in g.outputs:
            continue
        q = _query_channel(g, flat)
        src = flat.inputs[0] if q is not None else None
        if src is None or tuple(g.shapes[src])[2:] != shape[2:] or tuple(g.shapes[src])[0] != shape[0]:
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
