"""A NumPy interpreter for :class:`Graph`: the reference the frontend (and the compiled model) is checked against.

It evaluates the NCHW operators the frontend emits (``graph.py`` lists them) in float64 and returns float32.
``OPS`` maps an op name to ``fn(node, *input_arrays) -> array``; graph passes that add ops or attributes (fused
epilogues) register theirs in ``OPS`` and ``ATTRS``: a node with an attribute its reference does not know is an
error rather than a silently wrong answer.

A graph after the passes (``passes.optimize``) evaluates too, as its kernels compute it: the ops only passes make
(``reference_movement.PASS_OPS``: strided copies, view concats), the token ``matmul`` with everything
``passes.fuse_epilogues`` and ``passes_tokens.matmul_views`` give it (the template's own reference), and the fused
epilogues of the other ops (``EPILOGUE_ATTRS``, in the kernels' order: ``in_scale`` on the input, the op, ``post``,
``scale``, ``residual``, ``activation``), elementwise inputs read at a channel offset (``channel_offsets``) and a
concat's ``activation``.
"""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node
from tuner.ops.kernels import pool_ceil_extra, unary_reference
from tuner.ir.layouts import apply_patch_view
from tuner.ir.activations import apply_numpy, apply_prelu_numpy
import tuner.graph.reference_movement as reference_movement


def run_graph_numpy(graph: Graph, inputs: dict, all_tensors: bool = False) -> dict:
    """Run ``graph`` on ``inputs`` (name -> array of the input's shape); return ``{output name: float32 array}``,
    or every tensor (inputs, params and intermediates too) when ``all_tensors``."""
    missing = [t for t in graph.inputs if t not in inputs]
    if missing:
        raise ValueError(f"missing inputs {missing}")
    env = {name: np.asarray(v, dtype=np.float64) for name, v in graph.params.items()}
    for name in graph.inputs:
        value = np.asarray(inputs[name], dtype=np.float64)
        if value.shape != tuple(graph.shapes[name]):
            raise ValueError(f"input {name!r} has shape {value.shape}, the graph expects {graph.shapes[name]}")
        env[name] = value
    for node in graph.nodes:
        fn = OPS.get(node.op) or reference_movement.PASS_OPS.get(node.op)
        if fn is None:
            raise ValueError(f"run_graph_numpy: no reference for op {node.op!r} (node {node.name!r})")
        if node.op in ATTRS or node.op in reference_movement.PASS_ATTRS:
            known = ATTRS.get(node.op, set()) | reference_movement.PASS_ATTRS.get(node.op, set()) \
                | EPILOGUE_ATTRS.get(node.op, set())
            unknown = set(node.attrs) - known
            if unknown:
                raise ValueError(f"run_graph_numpy: node {node.name!r} ({node.op}) has attributes {sorted(unknown)} "
                                 "its reference does not implement")
        out = _evaluate(graph, node, fn, env)
        if out.shape != tuple(graph.shapes[node.outputs[0]]):
            raise ValueError(f"node {node.name!r} ({node.op}) computed shape {out.shape}, the graph says "
                             f"{graph.shapes[node.outputs[0]]}")
        env[node.outputs[0]] = out
        env.update(side_outputs(node, out, env))
    names = env if all_tensors else graph.outputs
    return {t: env[t].astype(np.float32) for t in names}


def side_outputs(node: Node, out: np.ndarray, env: dict) -> dict:
    """``{tensor: array}`` of a node's further outputs, from its first one ``out`` (``env``: the tensors computed
    so far, params included): a depthwise convolution's row sums (``passes_se.pool_rows_in_depthwise``) or the
    gate it computes from them (``passes_se.gates_in_depthwise``), or a producer's GroupNorm(1) statistics as its
    epilogue writes them, one chunk a unit (``passes_layer_norm.norm_statistics_into_producers``)."""
    if node.attrs.get("row_sums"):
        return {node.outputs[1]: out.sum(axis=3, keepdims=True)}
    if node.attrs.get("gate"):
        return {node.outputs[1]: _computed_gate(node, node.attrs["gate_acts"], out,
                                                [env[t] for t in node.attrs["gate"]])}
    if node.attrs.get("out_stats"):
        from tuner.templates.reduction import unit_statistics  # (tuner.templates imports tuner.graph)
        return {node.outputs[1]: unit_statistics(out, int(node.attrs["out_stats"])).reshape(out.shape[0], -1)}
    return {}


def _computed_gate(node: Node, acts, x, params, pixels: int = 0) -> np.ndarray:
    """The squeeze-excite gate a node computes (``passes_se``: a depthwise convolution its output's, from ``x`` its
    map; a reader its input's, from ``x`` the map's row sums over ``pixels``): ``se_gate`` with ``acts`` (act1, the
    gate's activation) and ``params`` (w1, b1, w2, b2)."""
    act1, act = acts
    attrs = {"act1": act1, **({"pixels": pixels} if pixels else {})}
    return apply_numpy(act, se_gate(Node("se_gate", node.name, [], [], attrs), x, *params))


# The fused epilogues (and in-place reads) the passes give each op, beyond its own attributes: what its kernel
# implements. ``matmul``'s are the template's (``reference_movement.MATMUL_ATTRS``).
_BINARY_EPILOGUE = {"activation", "scale", "residual"}  # passes._binary_epilogue, then an activation
EPILOGUE_ATTRS = {
    "conv2d": {"activation", "residual", "in_scale", "pad_mode", "slope", "in_view", "in_norm", "norm_stats",
               "in_layer_norm", "in_response", "response_affine",
               "patch_view", "row_sums", "in_group_norm", "norm_affine", "in_add", "in_add_at", "out_norm",
               "out_norm_affine", "residual_scale", "out_stats", "gate", "gate_acts", "gate_node", "in_gate",
               "in_gate_acts"},
    "dense": {"activation", "residual", "in_norm", "norm_stats", "norm_hw"},
    "group_norm": {"activation", "slope", "residual"}, "layer_norm": {"activation", "out_stats"},
    "add": {"activation", "channel_offsets"}, "relu": {"channel_offsets"}, "clip": {"channel_offsets"},
    "sub": _BINARY_EPILOGUE, "mul": _BINARY_EPILOGUE, "div": _BINARY_EPILOGUE, "prelu": _BINARY_EPILOGUE,
    **{op: {"post", "post_op", "scale", "residual", "residual_scale", "in_group_norm", "norm_affine", "norm_stats",
            "post_normed", "out_stats"}
       for op in ("avg_pool", "max_pool")},
    "concat": {"activation"}, "se_gate": {"activation"},
    # spatial_reduce's activation (passes.SPATIAL_REDUCTIONS)
    **{op: {"activation", "weight", "softmax_of", "channel_offsets"}
       for op in ("global_avg_pool", "global_max_pool", "reduce_mean", "reduce_max", "reduce_sum", "reduce_l2")},
}
FUSED_INPUTS = ("post", "scale", "residual", "residual_scale", "out_norm_affine", "slope", "in_scale",
                "response_affine", "weight", "norm_stats", "norm_affine", "in_add")
# appended to a node's inputs, in order


def _evaluate(graph: Graph, node: Node, fn, env: dict) -> np.ndarray:
    """``fn`` on the node's inputs, with its fused epilogue: the tensors the epilogue reads are its last inputs
    (``passes.fuse_epilogues`` appends them, ``fuse_input_gates`` the gate after them)."""
    a, fused_ok = node.attrs, EPILOGUE_ATTRS.get(node.op, set())
    if node.op == "matmul" or not fused_ok & set(a):
        return fn(node, *(env[t] for t in node.inputs))
    fused = [k for k in FUSED_INPUTS if k in a and k in fused_ok]
    gate = a.get("gate", ()) or a.get("in_gate", ())  # a gate's params last (side_outputs' own, or the input's)
    own = len(node.inputs) - len(fused) - len(gate)
    extra = {k: env[t] for k, t in zip(fused, node.inputs[own:])}
    ins = [env[t] for t in node.inputs[:own]]
    if a.get("channel_offsets") and node.op != "concat":  # channels at..at + C of the tensor, C the output's (a
        # concat's parts: its own reference)
        c = graph.shapes[node.outputs[0]][1]
        ins = [x if at is None else x[:, at:at + c] for x, at in zip(ins, a["channel_offsets"])]
    if a.get("in_view") and "in_view" in fused_ok:  # a convolution's input: channels at..at + c of the tensor
        at, c = a["in_view"]
        ins[0] = ins[0][:, at:at + c]
    if "in_add" in extra:  # passes_movement.adds_into_depthwise: the input plus the addend's channels at in_add_at
        at, c = a.get("in_add_at", 0), ins[0].shape[1]
        ins[0] = ins[0] + extra["in_add"][:, at:at + c]
    if "in_scale" in extra and a.get("in_response"):  # passes_response_norm: the gate computed from G as read
        from tuner.templates.common import response_gate_numpy
        ins[0] = ins[0] * response_gate_numpy(extra["in_scale"], extra["response_affine"], a["in_response"])
    elif "in_scale" in extra and a.get("in_gate"):  # passes_se.gates_in_readers: the gate from the maps' row sums
        ins[0] = ins[0] * _computed_gate(node, a["in_gate_acts"], extra["in_scale"], [env[t] for t in gate],
                                         ins[0].shape[2] * ins[0].shape[3])
    elif "in_scale" in extra:
        ins[0] = ins[0] * extra["in_scale"]
    if a.get("in_norm") and "in_norm" in fused_ok:  # passes_layer_norm: the input normalized over its channels,
        # or over the whole image where a GroupNorm(1)'s statistics come with it (``norm_stats``)
        x = np.asarray(ins[0], np.float64)
        axes = (1, 2, 3) if "norm_stats" in extra and x.ndim == 4 else 1
        if "norm_stats" in extra and x.ndim == 2:  # a dense's rows, the maps' means of an image: its variance
            from tuner.templates.dense import image_variance  # (tuner.templates imports tuner.graph)
            var = image_variance(extra["norm_stats"], x.shape, a["norm_hw"])
        else:
            var = x.var(axis=axes, keepdims=True)
        ins[0] = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(var + a["in_norm"])
    if a.get("in_layer_norm") and "in_layer_norm" in fused_ok:  # passes_layer_norm: a LayerNorm over channels and
        # its affine as the convolution reads its input
        from tuner.templates.common import pixel_normed
        ins[0] = pixel_normed(ins[0], extra["norm_affine"], a["in_layer_norm"])
    if a.get("in_group_norm") and "in_group_norm" in fused_ok:  # passes_layer_norm: a GroupNorm or InstanceNorm,
        # its affine and activation as the convolution reads its input (its statistics' tensor is the kernel's)
        from tuner.templates.common import group_normed  # the template's own reference (tuner.templates imports
        # tuner.graph: not at module level)
        ins[0] = group_normed(ins[0], extra["norm_affine"], *a["in_group_norm"])
        if a.get("post_normed"):  # a pool's second operand, the same tensor read normalized
            extra["post"] = group_normed(extra["post"], extra["norm_affine"], *a["in_group_norm"])
    if "weight" in extra and "softmax_of" in a:  # passes_attention: the softmax over the reduced axes (H and W,
        # or W) of a channel of weight
        q = np.asarray(extra["weight"], np.float64)[:, a["softmax_of"]:a["softmax_of"] + 1]
        axes = tuple(int(k) % q.ndim for k in a["axes"])
        e = np.exp(q - q.max(axis=axes, keepdims=True))
        ins[0] = ins[0] * (e / e.sum(axis=axes, keepdims=True))
    elif "weight" in extra:  # a reduction's prologue (passes.fuse_reduction_weights): the product it reduces
        ins[0] = ins[0] * extra["weight"]
    out = fn(node, *ins)
    if a.get("out_norm") and "out_norm" in fused_ok:  # passes_layer_norm.norms_into_convs: a GroupNorm of the
        # convolution's output (its bias included), then the residual and activation below
        from tuner.templates.common import group_normed
        out = group_normed(out, extra["out_norm_affine"], *a["out_norm"], "none")
    if "post" in extra:
        out = OPS[a["post_op"]](node, out, extra["post"])
    if "scale" in extra:
        out = out * extra["scale"].reshape((1, -1) + (1,) * (out.ndim - 2))
    if "residual_scale" in extra:  # passes._scaled_residual: the residual times a per-channel constant
        out = out + extra["residual"] * extra["residual_scale"].reshape((1, -1) + (1,) * (out.ndim - 2))
    elif "residual" in extra:
        out = out + extra["residual"]
    if "slope" in extra:  # a per-channel PReLU (activation "prelu")
        out = apply_prelu_numpy(out, extra["slope"].reshape(-1))
    elif "activation" in a and "activation" in fused_ok:
        out = apply_numpy(a["activation"], out)
    if a.get("patch_view") and "patch_view" in fused_ok:  # passes_patches: stored unfolded or folded
        out = apply_patch_view(a["patch_view"], out)
    return out


def random_inputs(graph: Graph, seed: int = 0) -> dict:
    """Standard-normal float32 arrays for every graph input."""
    rng = np.random.default_rng(seed)
    return {t: rng.standard_normal(graph.shapes[t]).astype(np.float32) for t in graph.inputs}


def _windows(x: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple, padding: tuple, fill: float,
             pad_mode: str = "zeros"):
    """Yield ``((r, s), x_rs)`` for every kernel tap, where ``x_rs[n, c, oh, ow]`` is the padded input the tap
    reads for output (oh, ow) -- padded with ``fill``, or reflected or repeated at its edge (``pad_mode``)."""
    top, left, bottom, right = padding
    widths = ((0, 0), (0, 0), (top, bottom), (left, right))
    xp = np.pad(x, widths, constant_values=fill) if pad_mode == "zeros" else np.pad(x, widths, mode=pad_mode)
    (r_n, s_n), (sh, sw), (dh, dw) = kernel, stride, dilation
    oh = (xp.shape[2] - (r_n - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (s_n - 1) * dw - 1) // sw + 1
    taps = []
    for r in range(r_n):
        for s in range(s_n):
            taps.append(((r, s), xp[:, :, r * dh: r * dh + (oh - 1) * sh + 1: sh, s * dw: s * dw + (ow - 1) * sw + 1:
                                    sw]))
    return taps


def conv2d(node: Node, x, w, b=None):
    a = node.attrs
    g = a.get("groups", 1)
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    out = None
    for (r, s), xs in _windows(x, w.shape[2:], a["stride"], a["dilation"], a["padding"], 0.0,
                               a.get("pad_mode", "zeros")):
        # grouped: x (N, G, C/G, OH, OW) . w (G, O/G, C/G) -> (N, G, O/G, OH, OW)
        term = np.einsum("ngchw,goc->ngohw", xs.reshape(n, g, cg, *xs.shape[2:]),
                         w[:, :, r, s].reshape(g, o // g, cg))
        out = term if out is None else out + term
    out = out.reshape(n, o, *out.shape[3:])
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def dense(node: Node, x, w, b=None):
    out = x @ w.T
    return out if b is None else out + b


def _channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm(node: Node, x, scale, bias, mean, var):
    inv = scale / np.sqrt(var + node.attrs["epsilon"])
    return (x - _channel(mean, x.ndim)) * _channel(inv, x.ndim) + _channel(bias, x.ndim)


def _pool_padding(node: Node, x) -> tuple:
    """The padding with ceil mode's extra rows / columns (past the padded input) added at the end."""
    a = node.attrs
    if not a.get("ceil_mode", 0):
        return tuple(a["padding"])
    eh, ew = pool_ceil_extra(x.shape, a["kernel"], a["stride"], a["padding"], True)
    t, l, b, r = a["padding"]
    return (t, l, b + eh, r + ew)


def avg_pool(node: Node, x):
    a = node.attrs
    padding = _pool_padding(node, x)
    taps = _windows(x, a["kernel"], a["stride"], (1, 1), padding, 0.0)
    total = sum(xs for _, xs in taps)
    if a.get("count_include_pad", 0):  # the window clipped to the padded input (ceil mode's extra is not padding)
        t, l, b, r = a["padding"]
        inside = np.ones((1, 1, x.shape[2] + t + b, x.shape[3] + l + r))
        extra = (0, 0, padding[2] - b, padding[3] - r)
    else:
        inside, extra = np.ones((1, 1) + x.shape[2:]), padding
    count = sum(m for _, m in _windows(inside, a["kernel"], a["stride"], (1, 1), extra, 0.0))
    return total / count


def max_pool(node: Node, x):
    a = node.attrs
    taps = _windows(x, a["kernel"], a["stride"], (1, 1), _pool_padding(node, x), -np.inf)
    return np.max([xs for _, xs in taps], axis=0)


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x)


def _activation(node: Node, x):
    return apply_numpy(node.attrs["fn"], x)


def _reduce(kind: str):
    def run(node: Node, x):
        axes, keep = tuple(node.attrs.get("axes", (2, 3))), bool(node.attrs["keepdims"])
        if kind == "l2":
            return np.sqrt((x * x).sum(axis=axes, keepdims=keep))
        return {"mean": np.mean, "max": np.max, "sum": np.sum}[kind](x, axis=axes, keepdims=keep)
    return run


def _unary(node: Node, x):
    return unary_reference(node.attrs["fn"], x)


def group_norm(node: Node, x, scale=None, bias=None):
    """Statistics per (n, group of C / groups channels) over those channels and every further axis. With ``stats``
    (``passes_layer_norm``: the statistics only, for the convolutions that normalize as they read) each unit's chunk
    partials as the kernel writes them (``reduction.chunk_statistics``), (N, 8 * units * stats)."""
    if node.attrs.get("stats"):
        from tuner.templates.reduction import chunk_statistics  # (tuner.templates imports tuner.graph)
        return chunk_statistics(x, node.attrs["stats"], node.attrs["groups"]).reshape(x.shape[0], -1)
    g = node.attrs["groups"]
    xg = x.reshape(x.shape[0], g, -1)
    mean = xg.mean(axis=2, keepdims=True)
    var = ((xg - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + node.attrs["epsilon"])).reshape(x.shape)
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


def se_gate(node: Node, x, w1, b1, w2, b2):
    """A squeeze-excite block (``passes_se.fuse_squeeze_excite``): the pool, the squeeze 1x1 convolution and its
    activation ``act1``, the excite 1x1 convolution; the gate's ``activation`` is the epilogue (EPILOGUE_ATTRS).
    With ``pixels`` (``pool_rows_in_depthwise``) x holds row sums: the pool is their sum over ``pixels``."""
    s, c = w1.shape[0], w1.shape[1]
    pooled = x.sum(axis=(2, 3)) / node.attrs["pixels"] if "pixels" in node.attrs else x.mean(axis=(2, 3))
    h = apply_numpy(node.attrs["act1"], pooled @ w1.reshape(s, c).T + b1.reshape(-1))
    g = h @ w2.reshape(c, s).T + b2.reshape(-1)
    return g.reshape(*g.shape, 1, 1)


def _softmax(node: Node, x):
    e = np.exp(x - x.max(axis=node.attrs["axis"], keepdims=True))
    return e / e.sum(axis=node.attrs["axis"], keepdims=True)


def _concat(node, *xs):
    """With ``channel_offsets`` (``passes_movement.slices_read_in_place``), part k is channels ``at``..``at +
    parts[k]`` of its input; with ``flat`` (``concats_written_as_tokens``), the result is (N, C, 1, H * W); with
    ``addend``, plus the last input."""
    a = node.attrs
    xs, addend = (xs[:-1], xs[-1]) if a.get("addend") else (xs, 0.0)
    if a.get("channel_offsets"):
        xs = [x if at is None else x[:, at:at + c] for x, at, c in zip(xs, a["channel_offsets"], a["parts"])]
    y = np.concatenate(xs, axis=a.get("axis", 1))
    return (y.reshape(y.shape[0], y.shape[1], 1, -1) if a.get("flat") else y) + addend


OPS = {
    "conv2d": conv2d,
    "dense": dense,
    "batch_norm": batch_norm,
    "relu": lambda node, x: np.maximum(x, 0.0),
    "clip": lambda node, x: np.clip(x, node.attrs["min"], node.attrs["max"]),
    "add": lambda node, a, b: a + b,
    "global_avg_pool": lambda node, x: x.mean(axis=(2, 3), keepdims=True),
    "avg_pool": avg_pool,
    "max_pool": max_pool,
    "flatten": lambda node, x: x.reshape(x.shape[0], -1),
    "reshape": lambda node, x: x.reshape(node.attrs["shape"]),
    "concat": _concat,
    "sub": lambda node, a, b: a - b,
    "mul": lambda node, a, b: a * b,
    "div": lambda node, a, b: a / b,
    "prelu": lambda node, x, slope: np.where(x > 0, x, x * slope),
    "activation": _activation,
    "erf": lambda node, x: _erf(x),
    "reduce_mean": _reduce("mean"),
    "reduce_max": _reduce("max"),
    "reduce_sum": _reduce("sum"),
    "reduce_l2": _reduce("l2"),
    "unary": _unary,
    "group_norm": group_norm,
    "global_max_pool": lambda node, x: x.max(axis=(2, 3), keepdims=True),
    "softmax": _softmax,
    "se_gate": se_gate,
}

ATTRS = {
    "conv2d": {"stride", "padding", "dilation", "groups"},
    "dense": set(), "batch_norm": {"epsilon"}, "relu": set(), "clip": {"min", "max"}, "add": set(),
    "global_avg_pool": set(), "avg_pool": {"kernel", "stride", "padding", "count_include_pad", "ceil_mode"},
    "max_pool": {"kernel", "stride", "padding", "ceil_mode"}, "flatten": set(), "reshape": {"shape"},
    "concat": {"axis", "channel_offsets", "parts", "flat", "addend"}, "sub": set(), "mul": set(), "div": set(),
    "prelu": set(), "activation": {"fn"},
    "erf": set(), "reduce_mean": {"axes", "keepdims"}, "reduce_max": {"axes", "keepdims"},
    "reduce_sum": {"axes", "keepdims"}, "reduce_l2": {"axes", "keepdims"}, "unary": {"fn"},
    "group_norm": {"groups", "epsilon", "stats"}, "global_max_pool": set(),
    "softmax": {"axis"}, "se_gate": {"act1", "pixels"},
}


def _merge_families() -> None:
    OPS.update(reference_movement.OPS)
    ATTRS.update(reference_movement.ATTRS)


_merge_families()
