"""``model_io_ranks``: model inputs and outputs of any rank, on kernels that take 4-D (NCHW) and 2-D (N, K) tensors.

A model's input or output of rank other than 2 or 4 -- a detector's boxes-by-classes (N, anchors, classes), a
5-D YOLO grid, a 1-D vector -- keeps its name and its row-major elements, but the graph holds it in the 4-D or
2-D shape ``kernel_shape`` gives (the same elements in the same order), and a ``reshape`` node joins that form
to the model's tensor, which the movement passes then fold into views (``passes_tokens.movement_views``). The
model's own shape is kept in ``Graph.io_shapes``: the plan's host buffers have it (``plan.lower``), so both
runtimes take and return arrays in the model's shape. ``pointwise_ranks`` does the same for an activation on a
tensor of such a rank inside the model.
"""
from __future__ import annotations

import math

from tuner.errors import TunerError
from tuner.graph.graph import Graph, Node, fresh_name

MAX_RANK = 8  # both runtimes' limit on a tensor's dimensions (native/src/artifact.h TNR_DIMS)
POINTWISE = ("relu", "clip", "activation", "erf", "unary")  # one activation in, one out, element by element


def kernel_shape(shape) -> tuple:
    """The 4-D or 2-D shape that holds a tensor of ``shape`` with the same row-major elements: a scalar and a
    vector are one row (1, K); rank 3 and up (s0, s1, ..., sk) are (s0, s1, s2 * ... * s(k-1), sk), whose
    NCHW4c texture has s0 * s1/4 * (the middle) rows and sk columns."""
    shape = tuple(int(d) for d in shape)
    if len(shape) in (2, 4):
        return shape
    if len(shape) <= 1:
        return (1, math.prod(shape))
    return (shape[0], shape[1], math.prod(shape[2:-1]), shape[-1])


def model_io_ranks(graph: Graph) -> Graph:
    """Each model input and output of rank other than 2 or 4 in its ``kernel_shape``, joined to the graph by a
    reshape; its own shape in ``io_shapes``."""
    odd = [t for t in dict.fromkeys(graph.inputs + graph.outputs) if len(graph.shapes[t]) not in (2, 4)]
    for t in odd:
        if len(graph.shapes[t]) > MAX_RANK:
            raise TunerError(f"model {'input' if t in graph.inputs else 'output'} {t!r} has rank "
                             f"{len(graph.shapes[t])} {tuple(graph.shapes[t])}; the runtimes take tensors of at most "
                             f"{MAX_RANK} dimensions: reshape it in the model")
    if not odd:
        return graph
    g = graph.copy()
    head, tail = [], []
    for t in odd:
        model_shape = tuple(g.shapes[t])
        inner = fresh_name(g, f"{t}.nd")
        g.shapes[inner] = model_shape
        g.shapes[t] = kernel_shape(model_shape)
        g.io_shapes[t] = model_shape
        for n in g.nodes:  # every node of the model now reads and writes the model-rank tensor under its new name
            n.inputs = [inner if x == t else x for x in n.inputs]
            n.outputs = [inner if y == t else y for y in n.outputs]
        if t in g.inputs:  # (an input that is an output too: its kernel form is that output)
            head.append(Node("reshape", f"{t}.from_kernel_shape", [t], [inner], {"shape": model_shape}))
        else:
            tail.append(Node("reshape", f"{t}.to_kernel_shape", [inner], [t], {"shape": g.shapes[t]}))
    g.nodes = head + g.nodes + tail
    return g.validate()


def pointwise_ranks(graph: Graph) -> Graph:
    """An activation (or another one-input elementwise op) on a tensor of rank other than 2, 3 or 4 -- the sigmoid
    of a YOLOv5 head's 5-D grid -- runs on the ``kernel_shape`` of that tensor: a reshape in, the op, a reshape
    back, which the movement passes fold into the copies around it."""
    if not any(n.op in POINTWISE and len(graph.shapes[n.inputs[0]]) not in (2, 3, 4) for n in graph.nodes):
        return graph
    g = graph.copy()
    nodes = []
    for n in g.nodes:
        shape = tuple(g.shapes[n.inputs[0]])
        if n.op not in POINTWISE or len(shape) in (2, 3, 4):
            nodes.append(n)
            continue
        flat_in, flat_out = fresh_name(g, f"{n.inputs[0]}.flat"), fresh_name(g, f"{n.outputs[0]}.flat")
        g.shapes[flat_in] = g.shapes[flat_out] = kernel_shape(shape)
        nodes += [Node("reshape", f"{n.name}.flatten", [n.inputs[0]], [flat_in], {"shape": kernel_shape(shape)}),
                  Node(n.op, n.name, [flat_in] + n.inputs[1:], [flat_out], dict(n.attrs)),
                  Node("reshape", f"{n.name}.unflatten", [flat_out], list(n.outputs), {"shape": shape})]
    g.nodes = nodes
    return g.validate()
