"""The model graph: a list of nodes in topological order over named tensors, with shapes known for every tensor
and constants (weights) held as NumPy arrays.

The frontend produces it with NCHW operators (``conv2d``, ``batch_norm``, ``relu``, ...); graph passes rewrite it
(fold BatchNorm, fuse epilogues) and annotate it (layouts, scopes) until every node is one deployed kernel.

Operators and their attributes as the frontend emits them (activations are NCHW, weights OIHW):

| op | inputs | attrs |
| --- | --- | --- |
| conv2d | x, w (O, I/groups, R, S), [b (O)] | stride (h, w), padding (top, left, bottom, right), dilation (h, w), groups |
| dense | x (N, K), w (M, K), [b (M)] | |
| batch_norm | x, scale, bias, mean, var | epsilon |
| relu | x | |
| clip | x | min, max |
| add, sub, mul, div | a, b: same shape; two activations of one rank broadcasting (an (N or 1, C, 1, 1) gate over H, W, an (N or 1, 1, 1, 1) value per image have kernels); or an activation and a constant param: per channel (1, C, 1, 1) / (1, C), of the activation's shape (1, ...), or on (N, T, C) tokens (1, 1, C) / (1, T, C) (either side for sub, div) | |
| prelu | x, slope (1, C, 1, 1) or (1, C) | |
| activation | x | fn: an activation spec of tuner.ir.activations (sigmoid, hardswish, hardsigmoid(a,b), tanh, leaky_relu(a), elu(a), silu, gelu) |
| erf | x | |
| unary | x | fn: sqrt, exp, neg, abs, reciprocal, square (x * x) or pow(p) (a constant exponent) |
| reduce_mean, reduce_max, reduce_sum, reduce_l2 | x (any rank) | axes (sorted, non-negative, in x's rank), keepdims (kernels: NCHW over (2, 3), (1,), (1, 2, 3); (N, K) over (1,)) |
| group_norm | x (N, C, ...), scale (C,), bias (C,); with stats x only | groups (statistics per (n, group of C/groups channels) over them and the other axes: InstanceNormalization is groups = C), epsilon; stats (``passes_layer_norm``: GroupNorm(1)'s statistics only, an (N, 8 * stats) tensor of chunk partials its reading convolutions take as ``norm_stats``) |
| softmax | x (N, C) or NCHW | axis (1: channels) |
| global_avg_pool, global_max_pool | x | |
| avg_pool, max_pool | x | kernel (r, s), stride, padding (top, left, bottom, right), count_include_pad (avg), ceil_mode |
| flatten | x (N, C, H, W) | (always to (N, C*H*W)) |
| reshape | x | shape (the resolved output shape; also Unsqueeze, Squeeze, Flatten on other axes) |
| concat | x0, x1, ... (constant params among them, e.g. a ViT's class token) | axis (kernel: 1, channels of NCHW) |
| depth_to_space | x (N, C*bh*bw, H, W) | block (bh, bw), mode (DCR, CRD), [crop (top, left), size (OH, OW)]: the output (N, C, OH, OW) is a window of the (H*bh, W*bw) rearrangement |

Passes add ``activation`` (a spec) and ``residual`` attributes to conv2d / dense (and ``activation`` to the binary
ops) when they fuse an epilogue, and ops of their own: ``se_gate`` (x, w1 (S, C, 1, 1), b1, w2 (C, S, 1, 1), b2; attrs
``act1``, ``activation``: a squeeze-excite block's pool and two 1x1 convolutions, ``passes_se``), among others.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Node:
    op: str
    name: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Node({self.op} {self.name}: {self.inputs} -> {self.outputs} {self.attrs})"


@dataclass
class Graph:
    """``shapes`` maps every tensor name (inputs, intermediates, outputs, params) to its logical shape."""
    nodes: list
    inputs: list
    outputs: list
    shapes: dict
    params: dict = field(default_factory=dict)
    dtype: str = "float32"
    # a model input or output whose rank the kernels do not take (not 2 or 4) -> the model's own shape; the graph
    # holds it in a 4-D or 2-D shape of the same row-major elements (``passes_io.model_io_ranks``)
    io_shapes: dict = field(default_factory=dict)
    # a float16 compile's precision guard (``tuner.plan.precision``): node (or input) name -> why it is stored in
    # float32; ``plan.lower_graph`` makes the mixed plan
    float32: dict = field(default_factory=dict)

    def producer(self, name: str) -> Node | None:
        for n in self.nodes:
            if name in n.outputs:
                return n
        return None

    def consumers(self, name: str) -> list:
        return [n for n in self.nodes if name in n.inputs]

    def is_param(self, name: str) -> bool:
        return name in self.params

    def copy(self) -> "Graph":
        return Graph([Node(n.op, n.name, list(n.inputs), list(n.outputs), dict(n.attrs)) for n in self.nodes],
                     list(self.inputs), list(self.outputs), dict(self.shapes), dict(self.params), self.dtype,
                     dict(self.io_shapes), dict(self.float32))

    def validate(self) -> "Graph":
        """Every input of a node is a graph input, a param or an earlier node's output; every tensor has a shape."""
        known = set(self.inputs) | set(self.params)
        for n in self.nodes:
            for t in n.inputs:
                if t not in known:
                    raise ValueError(f"node {n.name!r} ({n.op}) reads {t!r} before anything produces it")
            known.update(n.outputs)
        missing = [t for t in known | set(self.outputs) if t not in self.shapes]
        if missing:
            raise ValueError(f"tensors without a shape: {sorted(missing)}")
        for t in self.outputs:
            if t not in known:
                raise ValueError(f"graph output {t!r} is never produced")
        for name, value in self.params.items():
            if tuple(np.shape(value)) != tuple(self.shapes[name]):
                raise ValueError(f"param {name!r} has shape {np.shape(value)}, graph says {self.shapes[name]}")
        return self

    def summary(self) -> str:
        lines = [f"graph: {len(self.nodes)} nodes, inputs {[(i, self.shapes[i]) for i in self.inputs]}"]
        for n in self.nodes:
            lines.append(f"  {n.name:<24} {n.op:<16} {[self.shapes[o] for o in n.outputs]}")
        return "\n".join(lines)


# -- editing helpers of the graph passes (passes*.py) ------------------------------------------------------

def fresh_name(g: Graph, base: str) -> str:
    """``base``, or ``base_<k>`` for the first k that names no tensor of ``g`` yet."""
    name, k = base, 0
    while name in g.shapes:
        k += 1
        name = f"{base}_{k}"
    return name


def add_param(g: Graph, base: str, value: np.ndarray) -> str:
    """A new float32 param of ``g`` holding ``value``, under a fresh name from ``base``; returns the name."""
    name = fresh_name(g, base)
    g.params[name] = np.ascontiguousarray(value, dtype=np.float32)
    g.shapes[name] = tuple(np.shape(value))
    return name


def only_reader(g: Graph, tensor: str, node: Node) -> bool:
    """``node`` is the single consumer of ``tensor`` and the tensor is not a model output."""
    return tensor not in g.outputs and g.consumers(tensor) == [node]


def channel_constant(g: Graph, name: str, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts as one value per channel (axis 1) -- shaped (C, 1, 1), (1, C, 1, 1), (C,) on
    2-D, or a scalar -- as a flat (C,) array, else None."""
    if name not in g.params:
        return None
    v = np.asarray(g.params[name], np.float32)
    if v.size == 1:
        return np.full(channels, float(v.reshape(-1)[0]), np.float32)
    per_channel = (channels,) + (1,) * (rank - 2)  # the trailing dims of (1, C, 1, 1) or (1, C)
    dims = tuple(d for d in v.shape)
    while dims and dims[0] == 1 and len(dims) > len(per_channel):
        dims = dims[1:]
    return v.reshape(-1) if dims == per_channel else None


def drop_unused_params(g: Graph) -> Graph:
    """``g`` without the params no node reads (in place)."""
    used = {t for n in g.nodes for t in n.inputs}
    for name in [p for p in g.params if p not in used]:
        del g.params[name]
        del g.shapes[name]
    return g


def run_passes(graph: "Graph", passes) -> "Graph":
    """``graph`` through each of ``passes`` (``Graph -> Graph`` functions) in order: a pipeline is a list."""
    for p in passes:
        graph = p(graph)
    return graph
