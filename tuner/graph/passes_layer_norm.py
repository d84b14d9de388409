"""A LayerNorm over channels read only by 1x1 convolutions, computed inside them (``layer_norm_into_convs``,
``Graph -> Graph``): no kernel is left for the norm.

A 1x1 convolution of a per-pixel LayerNorm over the C channels is

    y_o = sum_c W_oc (gamma_c (x_c - mean) * rstd + beta_c) + b_o
        = rstd * (sum_c W'_oc x_c - mean * U_o) + b'_o,   W' = W diag(gamma), U_o = sum_c W'_oc, b' = b + W beta,

with mean and rstd the pixel's statistics over its channels. The convolution reads every channel of its output
pixel's input pixel anyway, so it sums ``x`` and ``x^2`` in the same loop (``Conv2dWorkload.in_norm``) and applies
``rstd`` and ``mean * U`` in its epilogue, before the bias, residual and activation it already fuses. Transformer
blocks (EdgeNeXt, MobileViT, PoolFormer-style hybrids, DeiT, PVT, ConvNeXt) run a LayerNorm before each MLP or qkv
projection: one launch and one pass over the tensor fewer each.

Taken where the norm is over the channels of a 4-D tensor (``axis`` 1, after ``passes_movement.nhwc_to_nchw``),
fuses nothing itself, and every reader is a convolution that takes it as its only input (1x1, stride 1, no padding,
groups 1, no gate or input view; a per-channel PReLU's slopes stay in B before the weights' sums). A LayerNorm over
the features of (N, K) rows read only by ``dense`` layers is the same fold (``DenseWorkload.in_norm``): a classifier
head's norm between its global pool and its last layer (ConvNeXt, EdgeNeXt, PoolFormerV2 and the other MetaFormers)
leaves no kernel, and where the pool is read in place too (``plan.input_views``) the head is one kernel. Each reader
gets its own folded weights and bias. Run late, so that no later pass gives those convolutions a gate or an input
view. Not where the norm reads a concat: the norm kernel reads its parts in place (EdgeNeXt's SDTA split,
``plan.input_views``), which a normed convolution does not.

``group_norm_into_convs``: a GroupNorm(1) (MobileViTv2's, PoolFormer's) read only by such convolutions is the same
fold with one mean and rstd per image instead of per pixel. Those statistics need the whole image, which no
work-item of a convolution reads, so one kernel is left for them: ``group_norm`` with ``stats`` (a power of two of
chunks, up to ``MAX_CHUNKS``) writes each chunk's shifted sums, (N, 8 * chunks) float32, and every reader adds the
partials of its image up (``Conv2dWorkload.norm_partials``) before its epilogue -- one launch and one pass over the
tensor where the split norm took two launches and two passes, and no normalized tensor is stored.

``norms_applied_as_read`` (a candidate ``compiler.fastest_plan`` times, not a pipeline step): an InstanceNorm or a
GroupNorm whose groups are whole blocks of 4 channels (or one group) with its activation, read only by convolutions
of any kernel, cannot fold into their weights (the statistics are per channel or group, the activation follows the
affine), but each reader applies it to every value it reads (``Conv2dWorkload.in_group_norm``), its statistics from
the same kind of kernel."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params, fresh_name
from tuner.graph.reference_movement import copy_sources

MAX_CHUNKS = 16  # GroupNorm(1)'s statistics: chunk partials per image, each reader adds them up (32 float4 reads)

_EXCLUDED = ("in_scale", "in_view", "in_norm", "pad_mode")  # what a reader must not fuse already


def _takes_norm(g: Graph, conv: Node, tensor: str) -> bool:
    """Whether ``conv`` can compute the LayerNorm of ``tensor`` it reads (module doc): a 1x1 convolution of a 4-D
    tensor, or a dense of an (N, K) one (a classifier head's norm after its global pool)."""
    a = conv.attrs
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    if conv.op == "dense":
        return conv.inputs[0] == tensor and conv.inputs.count(tensor) == 1 and w in g.params \
            and len(g.shapes[tensor]) == 2 and not set(a) - {"activation", "residual"}
    return conv.op == "conv2d" and conv.inputs[0] == tensor and conv.inputs.count(tensor) == 1 \
        and w in g.params and tuple(g.shapes[w][2:]) == (1, 1) and a.get("groups", 1) == 1 \
        and tuple(a.get("stride", (1, 1))) == (1, 1) and not any(a.get("padding", ())) \
        and not any(k in a for k in _EXCLUDED)


def _fold(g: Graph, conv: Node, x: str, gamma: np.ndarray, beta: np.ndarray, epsilon: float, stats=None) -> None:
    """``conv`` reads ``x`` and normalizes it itself: W' = W diag(gamma), b' = b + W beta; ``stats``: the tensor of
    the image statistics (a GroupNorm(1)'s), appended to its inputs."""
    shape = g.shapes[conv.inputs[1]]
    w = np.asarray(g.params[conv.inputs[1]], np.float64).reshape(shape[0], shape[1], -1)  # (O, C, taps), a dense's
    # (M, K, 1)
    bias_at = next((i for i, t in enumerate(conv.inputs[2:], 2) if t in g.params
                    and t not in (conv.attrs.get("slope"), conv.attrs.get("residual_scale"))), None)
    b = np.asarray(g.params[conv.inputs[bias_at]], np.float64).reshape(-1) if bias_at is not None \
        else np.zeros(w.shape[0])
    folded_w = _add_param(g, f"{conv.name}.norm_w", (w * gamma.reshape(1, -1, 1)).reshape(shape))
    folded_b = _add_param(g, f"{conv.name}.norm_b", b + w[:, :, 0] @ beta)
    inputs = [x, folded_w] + conv.inputs[2:]
    if bias_at is None:
        inputs.insert(2, folded_b)  # the bias before the fused operands (residual ...), as fuse_epilogues puts it
    else:
        inputs[bias_at] = folded_b
    conv.inputs = inputs + ([stats] if stats is not None else [])
    conv.attrs = {**conv.attrs, "in_norm": float(epsilon), **({"norm_stats": stats} if stats is not None else {})}


def _affine(g: Graph, node: Node, C: int):
    """The norm's (gamma, beta) as float64 (C,) arrays, or None where they are not constants of C values (a fused
    residual, the last input, is not one of them)."""
    ins = node.inputs[:len(node.inputs) - 1] if node.attrs.get("residual") is not None else node.inputs
    if any(t not in g.params for t in ins[1:]):
        return None
    gamma = np.asarray(g.params[ins[1]], np.float64).reshape(-1) if len(ins) > 1 else np.ones(C)
    beta = np.asarray(g.params[ins[2]], np.float64).reshape(-1) if len(ins) > 2 else np.zeros(C)
    return (gamma, beta) if gamma.size == C and beta.size == C else None


def _plain_layer_norm(g: Graph, node: Node) -> bool:
    """A LayerNorm over axis 1 (the channels of a 4-D tensor, the features of 2-D rows) that fuses nothing and does
    not read a concat's parts in place (``LayerNormWorkload.in_read``: EdgeNeXt's SDTA split), which no reader that
    computes the norm itself does."""
    rank = len(g.shapes[node.inputs[0]])
    if node.attrs.get("axis") not in ((1, -3) if rank == 4 else (1, -1)) or set(node.attrs) - {"axis", "epsilon"}:
        return False
    producer = g.producer(node.inputs[0])
    return producer is None or producer.op != "concat" or bool(producer.attrs.get("channel_offsets"))


def _readers(g: Graph, node: Node):
    """The convolutions that read the norm's output when every reader can normalize it itself, else None."""
    x, out = node.inputs[0], node.outputs[0]
    readers = g.consumers(out)
    if len(g.shapes[x]) not in (2, 4) or out in g.outputs or not readers \
            or any(not _takes_norm(g, r, out) for r in readers):
        return None
    return readers


def layer_norm_into_convs(graph: Graph) -> Graph:
    g = graph.copy()
    for node in list(g.nodes):
        if node.op != "layer_norm" or not _plain_layer_norm(g, node):
            continue
        readers = _readers(g, node)
        affine = _affine(g, node, g.shapes[node.inputs[0]][1]) if readers else None
        if affine is None:
            continue
        for r in readers:
            _fold(g, r, node.inputs[0], *affine, node.attrs.get("epsilon", 1e-5))
        g.nodes = [m for m in g.nodes if m is not node]
    _drop_unused_params(g)
    return g.validate()


def chunks(shape) -> int:
    """The chunk partials of a GroupNorm(1)'s statistics over an NCHW ``shape``: a power of two up to MAX_CHUNKS,
    at least two texels (packed pixels) a chunk."""
    texels = -(-shape[1] // 4) * shape[2] * shape[3]
    t = 1
    while t * 2 <= MAX_CHUNKS and t * 4 <= texels:
        t *= 2
    return t


def group_norm_into_convs(graph: Graph) -> Graph:
    g = graph.copy()
    for node in list(g.nodes):
        if node.op != "group_norm" or node.attrs.get("groups") != 1 or set(node.attrs) - {"groups", "epsilon"} \
                or len(g.shapes[node.inputs[0]]) != 4:
            continue
        readers = _readers(g, node)
        affine = _affine(g, node, g.shapes[node.inputs[0]][1]) if readers else None
        if affine is None:
            continue
        x, shape, epsilon = node.inputs[0], g.shapes[node.inputs[0]], node.attrs.get("epsilon", 1e-5)
        t = chunks(shape)
        stats = fresh_name(g, f"{node.outputs[0]}.stats")
        g.shapes[stats] = (shape[0], 8 * t)
        for r in readers:
            _fold(g, r, x, *affine, epsilon, stats)
        g.nodes[g.nodes.index(node)] = Node("group_norm", node.name, [x], [stats],
                                            {"groups": 1, "epsilon": epsilon, "stats": t})
    _drop_unused_params(g)
    return g.validate()


def group_norm_past_pooled_dense(graph: Graph) -> Graph:
    """A GroupNorm(1) read only by a global average pool to (N, C) rows that only a dense layer reads (the original
    PoolFormer's head: norm, mean over H and W, classifier) commutes with the pool -- the mean of ``gamma_c (x -
    mean) * rstd + beta_c`` over a map is ``gamma_c (mean_hw(x_c) - mean) * rstd + beta_c``, the statistics the
    image's. So the pool reads the norm's input, the dense normalizes its rows with the image's statistics as it
    reads them, the affine folded into its weights and bias (``DenseWorkload.in_norm`` with ``norm_partials``: the
    image's mean is the row's, its variance from the statistics kernel's chunk partials), and one kernel is left for
    the norm: ``group_norm`` with ``stats``, which ``norm_statistics_into_producers`` can move into the norm's
    producer."""
    g = graph.copy()
    changed = False
    for node in list(g.nodes):
        if node.op != "group_norm" or node.attrs.get("groups") != 1 or set(node.attrs) - {"groups", "epsilon"} \
                or len(g.shapes[node.inputs[0]]) != 4:
            continue
        x, out = node.inputs[0], node.outputs[0]
        pools = g.consumers(out)
        if out in g.outputs or len(pools) != 1 or pools[0].op != "reduce_mean" or pools[0].inputs != [out] \
                or tuple(pools[0].attrs.get("axes", ())) not in ((2, 3), (-2, -1)) \
                or pools[0].attrs.get("keepdims", 1) or set(pools[0].attrs) - {"axes", "keepdims"}:
            continue
        rows = pools[0].outputs[0]
        readers = g.consumers(rows)
        if rows in g.outputs or len(readers) != 1 or not _takes_norm(g, readers[0], rows):
            continue
        shape, epsilon = g.shapes[x], node.attrs.get("epsilon", 1e-5)
        affine = _affine(g, node, shape[1])
        if affine is None:
            continue
        t = chunks(shape)
        stats = fresh_name(g, f"{out}.stats")
        g.shapes[stats] = (shape[0], 8 * t)
        dense = readers[0]
        _fold(g, dense, rows, *affine, epsilon, stats)
        dense.attrs = {**dense.attrs, "norm_hw": tuple(shape[2:])}  # the image's maps: the statistics' count
        pools[0].inputs = [x]
        g.nodes[g.nodes.index(node)] = Node("group_norm", node.name, [x], [stats],
                                            {"groups": 1, "epsilon": epsilon, "stats": t})
        del g.shapes[out]
        changed = True
    if not changed:
        return graph
    _drop_unused_params(g)
    return g.validate()


MAX_UNIT_CHUNKS = 256  # a norm read as its convolutions read: chunks over all its units


def _units(shape, groups: int) -> int:
    """A GroupNorm's statistics units (``group_norm`` with ``stats``): a group each, or for an InstanceNorm a block
    of 4 channels (4 channels a unit, one a lane)."""
    return shape[0] * (-(-shape[1] // 4) if groups == shape[1] else groups)


def unit_chunks(shape, groups: int) -> int:
    """The chunk partials a unit of a GroupNorm's statistics over an NCHW ``shape`` (``norms_applied_as_read``): a
    power of two up to MAX_CHUNKS, at least two texels a chunk and at most MAX_UNIT_CHUNKS chunks in all -- enough
    work-groups to fill a GPU where the units are few (an InstanceNorm of 32 channels at 128 x 128: 8 units of 16
    chunks), few partials for each reader to add up where they are many."""
    units = _units(shape, groups)
    texels = shape[2] * shape[3] * (1 if groups == shape[1] else -(-shape[1] // 4) // groups)  # a unit's
    t = 1
    while t * 2 <= MAX_CHUNKS and t * 4 <= texels and units * t * 2 <= MAX_UNIT_CHUNKS:
        t *= 2
    return t


POOLS = ("avg_pool", "max_pool")  # windowed pools (passes.POOLS), which read a norm's output normalized too


def _reads_normed(g: Graph, conv: Node, tensor: str) -> bool:
    """Whether ``conv`` can group-normalize ``tensor`` as it reads it (``Conv2dWorkload.in_group_norm``): a
    convolution of groups 1 that takes it as its only input, no gate, view or other norm on that read; or a pool
    that pools it (``pool_kernel``'s ``in_norm``), and may subtract it after (PoolFormer's ``pool(y) - y``), with
    no scale or residual of it."""
    a = conv.attrs
    if conv.op in POOLS:  # not one whose window is the whole input: the spatial_reduce template runs those
        from tuner.templates.spatial_reduce import one_window  # the graph passes import tuner.templates lazily
        return conv.inputs[0] == tensor and tensor not in (a.get("scale"), a.get("residual")) \
            and not one_window(a, g.shapes[tensor]) \
            and "in_group_norm" not in a and conv.inputs.count(tensor) == 1 + (a.get("post") == tensor)
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    return conv.op == "conv2d" and conv.inputs[0] == tensor and conv.inputs.count(tensor) == 1 \
        and w in g.params and a.get("groups", 1) == 1 \
        and not any(k in a for k in ("in_scale", "in_view", "in_norm", "in_group_norm", "in_layer_norm"))


def norms_read_by_pools(graph: Graph) -> Graph:
    """``norms_applied_as_read`` for the norms whose every reader is a pool (PoolFormer's token mixer
    ``pool(n(y)) - n(y)``): a pool reads each value once a window tap either way, and normalizing it there costs a
    multiply-add against the apply kernel's launch and its pass over the tensor, so it is a pipeline step, not a
    candidate."""
    return norms_applied_as_read(graph, pools_only=True)


def norms_applied_as_read(graph: Graph, pools_only: bool = False) -> Graph:
    """A GroupNorm or InstanceNorm (``group_norm``) and its activation, read only by convolutions, computed as they
    read (the style-transfer net's conv -> InstanceNorm -> ReLU -> reflection pad -> conv; a diffusion U-Net's or
    GroupNorm ResNet's GroupNorm(32) -> SiLU / ReLU -> 3x3 conv): its affine and activation are per element, so
    nothing folds into the weights (as ``group_norm_into_convs`` folds a GroupNorm(1) into 1x1 readers), but a
    convolution reads each input channel block anyway. One kernel is left, ``group_norm`` with ``stats`` (each
    unit's chunk partials, ``unit_chunks``), and each reader adds up a block's unit's partials before its window
    loop and normalizes every value it reads (``Conv2dWorkload.in_group_norm``) -- before its padding of zeros; a
    reflection pad reads normalized values the same way. One launch and one pass over the tensor where the split
    norm took two launches and two passes, and no normalized tensor is stored. Groups of whole blocks of 4
    channels, of one channel each, or one group; not a norm with a residual or a per-channel PReLU (a residual
    block's second norm, which its add reads).

    A LayerNorm over channels read only by convolutions of groups 1 (``_layer_norm_as_read``) is applied the same
    way with no kernel left: each reader sums the channels of the input pixels it reads itself
    (``Conv2dWorkload.in_layer_norm``).

    Not in ``passes.PIPELINE``: each reader normalizes every value it reads, once a window tap, and on the H200 that
    cost the style-transfer net and a GroupNorm ResNet more than the launches saved (5% and 9% slower whole runs).
    ``compiler.fastest_plan`` plans the optimized graph with this pass applied beside the one without and keeps the
    faster (step ``norms``); a compile that times no plans keeps the norms whole. Runs on a graph the pipeline has
    optimized."""
    g = graph.copy()
    for node in list(g.nodes):
        if node.op == "layer_norm" and not pools_only:
            _layer_norm_as_read(g, node)
            continue
        if node.op != "group_norm" or set(node.attrs) - {"groups", "epsilon", "activation"}:
            continue
        x, out = node.inputs[0], node.outputs[0]
        shape, groups = g.shapes[x], node.attrs.get("groups")
        if len(shape) != 4 or not groups or shape[1] % groups or node.attrs.get("activation") == "prelu" \
                or not (groups in (1, shape[1]) or (shape[1] // groups) % 4 == 0):
            continue
        readers = g.consumers(out)
        if out in g.outputs or not readers or any(not _reads_normed(g, r, out) for r in readers) \
                or (pools_only and any(r.op not in POOLS for r in readers)):
            continue
        affine = _affine(g, node, shape[1])
        if affine is None:
            continue
        epsilon, t = node.attrs.get("epsilon", 1e-5), unit_chunks(shape, groups)
        stats = fresh_name(g, f"{out}.stats")
        g.shapes[stats] = (shape[0], 8 * _units(shape, groups) // shape[0] * t)
        param = _add_param(g, f"{node.name}.affine", np.stack(affine).astype(np.float32))
        for r in readers:  # the statistics and the affine after every fused operand (reference.FUSED_INPUTS)
            r.inputs = [x if t == out else t for t in r.inputs] + [stats, param]
            r.attrs = {**r.attrs, "in_group_norm": (groups, float(epsilon), node.attrs.get("activation", "none")),
                       "norm_stats": stats, "norm_affine": param}
            if r.attrs.get("post") == out:  # a pool's second operand, read normalized too
                r.attrs.update(post=x, post_normed=True)
        g.nodes[g.nodes.index(node)] = Node("group_norm", node.name, [x], [stats],
                                            {"groups": groups, "epsilon": epsilon, "stats": t})
    _drop_unused_params(g)
    return g.validate()


def _layer_norm_as_read(g: Graph, node: Node) -> None:
    """``norms_applied_as_read`` for a LayerNorm over the channels of a 4-D tensor read only by convolutions of
    groups 1 (ConvNeXt's, EdgeNeXt's and PoolFormerV2's downsampling layers: LayerNorm -> a 2x2 or 3x3 convolution
    of stride 2, which ``layer_norm_into_convs`` cannot fold): each reader normalizes every pixel it reads
    (``Conv2dWorkload.in_layer_norm``), its statistics summed by the reader itself, so no kernel is left. Not where
    every reader is a 1x1 convolution (the pipeline folded those), nor a norm whose input a concat's parts are read
    in place for."""
    from tuner.templates.conv2d_nchw4c import MAX_NORM_PIXELS, window_span  # the graph passes import tuner.templates
    # lazily; the input pixels one output pixel's window spans, each one's channels summed by the reader
    x, out = node.inputs[0], node.outputs[0]
    shape = g.shapes[x]
    if len(shape) != 4 or not _plain_layer_norm(g, node):
        return
    readers = g.consumers(out)
    if out in g.outputs or not readers or any(r.op != "conv2d" or not _reads_normed(g, r, out)
                                              or r.attrs.get("pad_mode", "zeros") != "zeros"
                                              or np.prod(window_span(g.shapes[r.inputs[1]][2:], (1, 1),
                                                                     r.attrs.get("dilation", (1, 1))))
                                              > MAX_NORM_PIXELS for r in readers):
        return
    affine = _affine(g, node, shape[1])
    if affine is None:
        return
    param = _add_param(g, f"{node.name}.affine", np.stack(affine).astype(np.float32))
    for r in readers:  # the affine after every fused operand (reference.FUSED_INPUTS)
        r.inputs = [x if t == out else t for t in r.inputs] + [param]
        r.attrs = {**r.attrs, "in_layer_norm": float(node.attrs.get("epsilon", 1e-5)), "norm_affine": param}
    g.nodes.remove(node)


NORM_PLANE_MAX = 32  # rows and columns of a norm its producing convolution computes (``norms_into_convs``): a
# work-group of the conv2d space covers up to 8 x 4 rows, and 32 x 32 pixels at 4 a work-item fit 256 work-items
NORM_TILE_BLOCKS = 4  # blocks of 4 channels a group may span there: a work-item's tile_oc holds them all


def _norm_producer(g: Graph, node: Node) -> Node | None:
    """The convolution that writes the norm's input and nothing else fuses, when the norm is its only reader: a
    plain conv2d of the conv2d template (not depthwise) with its weight and bias params, else None."""
    x = node.inputs[0]
    p = g.producer(x)
    if p is None or p.op != "conv2d" or p.outputs != [x] or x in g.outputs or g.consumers(x) != [node] \
            or set(p.attrs) - {"stride", "padding", "dilation", "groups", "pad_mode"} or len(p.inputs) > 3 \
            or any(t not in g.params for t in p.inputs[1:]):
        return None
    from tuner.templates.common import is_depthwise  # the graph passes import tuner.templates lazily
    return None if is_depthwise(g.shapes[p.inputs[0]], g.shapes[p.inputs[1]], p.attrs.get("groups", 1)) else p


def norms_into_convs(graph: Graph) -> Graph:
    """A GroupNorm or InstanceNorm (``group_norm``, with its activation and residual add) of a convolution's output,
    computed in that convolution's epilogue (``Conv2dWorkload.out_norm``): each work-group holds its groups' whole
    planes, sums their values and then their squared deviations in local memory, and normalizes them before it
    stores them -- no launch and no pass over the tensor is left for the norm. The style-transfer net's residual
    blocks (InstanceNorm at 32 x 32) and a GroupNorm ResNet's late stages (GroupNorm(32) at 28 x 28 and below).
    Planes up to ``NORM_PLANE_MAX`` rows and columns; groups of one or two channels or of up to
    ``NORM_TILE_BLOCKS`` whole blocks of 4; the convolution fusing nothing else, read by nothing else.

    Not in ``passes.PIPELINE``: a work-group a plane gives a convolution fewer work-groups, which a GPU of many
    compute units may not fill. ``compiler.fastest_plan`` plans the optimized graph with this pass applied beside
    the one without and keeps the faster (step ``norms``). Runs on a graph the pipeline has optimized."""
    g = graph.copy()
    changed = False
    for node in list(g.nodes):
        if node.op != "group_norm" or set(node.attrs) - {"groups", "epsilon", "activation", "residual"} \
                or node.attrs.get("activation") == "prelu":
            continue
        x, out = node.inputs[0], node.outputs[0]
        shape, groups = g.shapes[x], node.attrs.get("groups")
        if len(shape) != 4 or not groups or shape[1] % groups or max(shape[2:]) > NORM_PLANE_MAX:
            continue
        cg = shape[1] // groups
        if not (cg in (1, 2) or (cg % 4 == 0 and cg <= 4 * NORM_TILE_BLOCKS)):
            continue
        conv, affine = _norm_producer(g, node), _affine(g, node, shape[1])
        if conv is None or affine is None:
            continue
        conv_groups = conv.attrs.get("groups", 1)
        if conv_groups > 1 and (shape[1] // conv_groups // 4) % max(1, cg // 4):
            continue  # a tile of output blocks stays in one of the convolution's groups
        residual = node.attrs.get("residual")
        param = _add_param(g, f"{node.name}.affine", np.stack(affine).astype(np.float32))
        act = node.attrs.get("activation", "none")
        conv.attrs = {**conv.attrs, "out_norm": (groups, float(node.attrs.get("epsilon", 1e-5))),
                      "out_norm_affine": param, **({"activation": act} if act != "none" else {}),
                      **({"residual": residual} if residual is not None else {})}
        conv.inputs = conv.inputs + ([residual] if residual is not None else []) + [param]
        conv.outputs = [out]
        g.shapes.pop(x, None)
        g.nodes.remove(conv)  # where the norm was: after whatever writes its residual
        g.nodes[g.nodes.index(node)] = conv
        changed = True
    if not changed:
        return graph
    _drop_unused_params(g)
    return g.validate()


# a convolution's fusions that leave its output whole
STATS_PRODUCER_ATTRS = {"stride", "padding", "dilation", "groups", "pad_mode", "activation", "residual",
                        "residual_scale", "in_norm", "norm_stats", "in_group_norm", "in_layer_norm", "norm_affine",
                        "in_scale", "in_response", "response_affine", "in_view", "slope", "patch_view"}


POOL_STATS_ATTRS = {"kernel", "stride", "padding", "count_include_pad", "ceil_mode", "post", "post_op", "scale",
                    "residual", "residual_scale", "in_group_norm", "norm_affine", "norm_stats", "post_normed"}


def _writes_stats(g: Graph, p: Node) -> bool:
    """Whether ``p`` can write its output's norm statistics in its epilogue: a convolution of the conv2d
    template with only the fusions above (not depthwise), a windowed pool (the glue kernel's, not a pool of one
    window, which ``spatial_reduce`` runs), or a LayerNorm over channels (``LayerNormWorkload.out_stats``:
    PoolFormerV2's stem norm, which its first block's GroupNorm(1) reads)."""
    from tuner.templates.common import is_depthwise  # the graph passes import tuner.templates lazily
    from tuner.templates.spatial_reduce import one_window
    if p.op == "conv2d":
        data = list(g.shapes[p.inputs[0]])
        if p.attrs.get("in_view"):  # the templates take a viewed input by its channels
            data[1] = int(p.attrs["in_view"][1])
        return not set(p.attrs) - STATS_PRODUCER_ATTRS and p.inputs[1] in g.params \
            and not is_depthwise(tuple(data), g.shapes[p.inputs[1]], p.attrs.get("groups", 1))
    if p.op == "layer_norm":  # over the channels of an NCHW tensor, with its activation (the template's)
        return p.attrs.get("axis", 1) in (1, -3) and len(g.shapes[p.inputs[0]]) == 4 \
            and not set(p.attrs) - {"axis", "epsilon", "activation"}
    return p.op in POOLS and not set(p.attrs) - POOL_STATS_ATTRS and not one_window(p.attrs, g.shapes[p.inputs[0]])


def norm_statistics_into_producers(graph: Graph) -> Graph:
    """A norm's statistics kernel (``group_norm`` with ``stats``: its readers normalize what they read) whose
    input a convolution or a windowed pool writes (``_writes_stats``): that kernel computes the statistics in its
    epilogue instead (``Conv2dWorkload.out_stats``, ``pool_kernel``'s: each work-group's (count, mean, M2), merged
    by the last to finish, ``reduction.last_group_statistics``), a second output of one chunk a unit, and no
    launch is left for them. A GroupNorm(1)'s (MobileViTv2's, PoolFormer's: ``group_norm_into_convs``,
    ``norms_read_by_pools``) from a convolution or a pool; an InstanceNorm's or a GroupNorm's of whole blocks of 4
    channels (``norms_applied_as_read``: the style-transfer net's, a GroupNorm ResNet's) from a convolution only
    (``reduction.last_group_unit_statistics``: a slot a block and work-group, a counter a tile or a group). A node
    with a second output takes only a template that writes it: the convolution runs the conv2d template (not
    Winograd); its output channels a multiple of 4, written whole.

    Not in ``passes.PIPELINE``: the epilogue adds a local tree, a fence and an atomic to every work-group of the
    producer, against a launch that reads the tensor once (on the H200 MobileViTv2-0.5 ran 4-21% faster with it,
    PoolFormer-S12 1-2% slower). ``compiler.fastest_plan`` times the plan with this pass applied beside the kept
    one (step ``norms``). Runs on a graph the pipeline has optimized."""
    g = graph.copy()
    changed = False
    for node in list(g.nodes):
        if node.op != "group_norm" or not node.attrs.get("groups") or not node.attrs.get("stats"):
            continue
        x, stats, groups = node.inputs[0], node.outputs[0], int(node.attrs["groups"])
        p, shape = g.producer(x), g.shapes[x]
        if p is None or p.outputs != [x] or len(shape) != 4 or shape[1] % 4 or not _writes_stats(g, p) \
                or (groups > 1 and p.op != "conv2d"):  # a pool or a LayerNorm writes a GroupNorm(1)'s only
            continue
        p.attrs = {**p.attrs, "out_stats": groups}
        p.outputs = [x, stats]
        g.shapes[stats] = (shape[0], 8 * _units(shape, groups) // shape[0])  # one chunk a unit: the readers'
        # workloads take the count from the shape
        g.nodes.remove(node)
        changed = True
    return g.validate() if changed else graph


def _permutes_within_channels(g: Graph, copy: Node) -> bool:
    """Whether the strided copy ``copy`` only moves each channel's elements within that channel of the same image:
    a bijection of the elements that keeps (n, c) (timm's MobileViTv2 folding patches back into an image)."""
    src, out = tuple(g.shapes[copy.inputs[0]]), tuple(g.shapes[copy.outputs[0]])
    if copy.op != "strided_copy" or set(copy.attrs) - {"src_shape", "offset", "strides", "shape", "out_shape"} \
            or len(src) != 4 or len(out) != 4 or src[:2] != out[:2]:
        return False
    size = int(np.prod(src))
    try:
        m = copy_sources(copy, src)
    except (KeyError, ValueError):
        return False
    return m.size == size == int(np.prod(out)) and np.unique(m).size == size \
        and np.array_equal(m // (src[2] * src[3]), np.arange(size) // (out[2] * out[3]))


def group_norm_past_permutations(graph: Graph) -> Graph:
    """A GroupNorm(1) read only by a copy that permutes each channel's elements within it runs after the copy: its
    statistics are the same over the permuted image and its affine is per channel, so the norm's readers become
    the copy's (MobileViTv2's last norm of each stage, before the fold back into an image and a 1x1 projection,
    which ``group_norm_into_convs`` then takes)."""
    g = graph.copy()
    for node in list(g.nodes):
        if node.op != "group_norm" or node.attrs.get("groups") != 1 or set(node.attrs) - {"groups", "epsilon"}:
            continue
        out = node.outputs[0]
        readers = g.consumers(out)
        if out in g.outputs or len(readers) != 1 or not _permutes_within_channels(g, readers[0]):
            continue
        copy = readers[0]
        moved = fresh_name(g, f"{copy.outputs[0]}.unnormed")
        g.shapes[moved] = g.shapes[copy.outputs[0]]
        node.outputs, copy.outputs = [copy.outputs[0]], [moved]
        copy.inputs = [node.inputs[0]] + copy.inputs[1:]
        node.inputs = [moved] + node.inputs[1:]
        g.nodes.remove(node)
        g.nodes.insert(g.nodes.index(copy) + 1, node)
        del g.shapes[out]
    return g.validate()
