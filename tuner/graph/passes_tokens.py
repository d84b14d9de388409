"""Graph passes that bring attention blocks -- token tensors, 5-D head reshapes, activation-by-activation
MatMuls -- onto the 4-D kernels (``Graph -> Graph``), run first by ``passes_movement.optimize_movement``:

- ``batch_norm_over_rows``: a BatchNorm of the rows (M, C) a token tensor (..., C) is flattened into (LeViT's
  ``bn(x.flatten(0, 1)).reshape_as(x)``) becomes a multiply and add of per-feature constants on the token
  tensor itself, then the reshape: the reshapes compose away in ``movement_views`` and the constants fold into
  the Linear before them (``passes.fuse_epilogues``).
- ``fold_matmul_scales``: a multiply by a scalar constant whose only reader is a ``matmul`` (the ``q * scale``
  and ``k * scale`` of attention), also through reshapes and transposes (EfficientViT's ``q * scale`` before
  ``q.transpose``), becomes the matmul's ``alpha``.
- ``attention_ranks``: a 4-D ``matmul`` (batch, heads, M, K) @ (batch, heads, K, N) and a softmax over the
  last axis of a 4-D tensor run on 3-D tensors (batch * heads, M, K): reshapes around them, which
  ``movement_views`` folds away.
- ``movement_views``: chains of ``reshape`` / ``transpose`` / ``slice_nd`` that touch a tensor of rank other
  than 2 or 4 (tokens, the 5-D ``(B, T, 3, heads, d)`` of a qkv projection), and evenly stepped gathers of such a
  view (LeViT splits its 4-D (B, T, heads, 2d + dv)), are composed into strided views of
  the tensor they start from (numpy's rules: a reshape that no strides express materializes first); a view is
  materialized by one ``strided_copy`` where a computing node reads it, and not at all when it is the whole
  tensor in order. The qkv reshape, transpose, split and squeeze of attention become one copy per q, k, v.
- ``activations_before_copies`` (after ``tokens_to_nchw``): an activation that alone reads a strided copy of a
  product that only the copy reads runs before the copy (pointwise, it commutes), so that it fuses into the
  product (LeViT's heads: ``hardswish`` of the heads back to tokens).
- ``tokens_to_nchw``: every 3-D activation (N, T, C) becomes the 4-D tensor (N, C, 1, T) -- its storage is
  NCHW4c's, packed by 4 along C -- and the 3-D nodes become their 4-D forms: a MatMul by a constant a 1x1
  ``conv2d`` (tuned), LayerNormalization and Softmax over the last axis ones over channels, biases and scales
  per-channel params. ``matmul`` and ``strided_copy`` keep their logical shapes in attributes.

The token layout: a 3-D tensor X (a, b, c) is stored as the 4-D V (a, c, 1, b) with V[n, k, 0, t] = X[n, t, k]
(``token_view``); a 2-D tensor keeps its packed-rows layout and a 4-D one is NCHW.
"""
from __future__ import annotations

import math

import numpy as np

from tuner.errors import TunerError
from tuner.ops.token_views import (affine_form, fit_view, strided_reference, to_view, token_logical,
                                     token_view)

from tuner.graph.graph import Graph, Node, run_passes
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused_params, fresh_name as _fresh

MOVEMENT = ("reshape", "transpose", "slice_nd", "expand_nd")
ELEMENTWISE = {"relu", "clip", "activation", "erf", "unary", "add", "sub", "mul", "div", "prelu"}


# -- strided views -------------------------------------------------------------------------------------------

def _row_major(shape) -> tuple:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


class _View:
    """``shape`` / ``strides`` / ``offset`` over the row-major elements of ``base`` (of ``base_shape``), read
    out in row-major order as ``out_shape``: a reshape no strides express. Where ``out_shape`` merges consecutive
    axes of ``shape`` (a window partition's (B * nh * nw, wh, ww, C)), the view composes on over those groups of
    axes (``groups``); otherwise it composes no further and is copied out first."""

    def __init__(self, base: str, base_shape, offset: int, shape, strides, out_shape=None):
        self.base, self.base_shape = base, tuple(base_shape)
        self.offset, self.shape, self.strides = int(offset), tuple(shape), tuple(strides)
        self.out_shape = tuple(out_shape) if out_shape is not None else self.shape

    @property
    def composes(self) -> bool:
        return self.groups() is not None

    def groups(self) -> list | None:
        """Per axis of ``out_shape``, its fine axes ``(extent, stride)`` (consecutive axes of ``shape``, those of
        extent 1 left out); None when ``out_shape`` does not merge consecutive axes of ``shape``."""
        fine = [(d, s) for d, s in zip(self.shape, self.strides) if d != 1]
        out, j = [], 0
        for d in self.out_shape:
            group, p = [], 1
            while p < d and j < len(fine):
                group.append(fine[j])
                p *= fine[j][0]
                j += 1
            if p != d:
                return None
            out.append(group)
        return out if j == len(fine) else None

    def _grouped(self, groups, out_shape, offset=None) -> "_View":
        """The view of these groups read out as ``out_shape``: a plain strided view where no group merges axes."""
        offset = self.offset if offset is None else offset
        if all(len(gr) <= 1 for gr in groups):
            return _View(self.base, self.base_shape, offset, out_shape, [gr[0][1] if gr else 0 for gr in groups])
        fine = [ax for gr in groups for ax in gr]
        return _View(self.base, self.base_shape, offset, [d for d, _ in fine], [s for _, s in fine], out_shape)

    def attrs(self) -> dict:
        """A ``strided_copy``'s attributes."""
        return {"src_shape": self.base_shape, "offset": self.offset, "strides": self.strides, "shape": self.shape,
                "out_shape": self.out_shape}

    @classmethod
    def whole(cls, base: str, shape):
        return cls(base, shape, 0, shape, _row_major(shape))

    def is_whole(self) -> bool:
        return (self.offset == 0 and self.shape == self.base_shape == self.out_shape
                and all(s == r for d, s, r in zip(self.shape, self.strides, _row_major(self.shape)) if d > 1))

    def transpose(self, perm):
        groups = self.groups()
        return self._grouped([groups[p] for p in perm], [self.out_shape[p] for p in perm])

    def expand(self, shape):
        """Axes of extent 1 broadcast to ``shape`` (stride 0)."""
        groups = self.groups()
        return self._grouped([gr if d == n else [(n, 0)] for gr, d, n in zip(groups, self.out_shape, shape)], shape)

    def slice(self, starts, steps, counts):
        """A window of ``out_shape``'s axes; None where it cuts an axis that merges several (copied out first)."""
        groups, offset, out = self.groups(), self.offset, []
        for gr, d, a, k, c in zip(groups, self.out_shape, starts, steps, counts):
            if (a, k, c) == (0, 1, d):
                out.append(gr)
            elif len(gr) == 1:
                offset += a * gr[0][1]
                out.append([(c, gr[0][1] * k)] if c != 1 else [])
            elif not gr and (a, c) == (0, 1):
                out.append(gr)
            else:
                return None
        return self._grouped(out, counts, offset)

    def reshape(self, new):
        """The view reshaped without a copy: by strides (numpy's rule) or, where no strides express it, read out
        in order as ``new`` (composing on only where ``new`` merges consecutive axes: ``groups``)."""
        new = tuple(int(d) for d in new)
        fine = self._grouped([[ax] for ax in zip(self.shape, self.strides) if ax[0] != 1],
                             [d for d in self.shape if d != 1])
        old = [(d, s) for d, s in zip(fine.shape, fine.strides) if d != 1]
        dims = [d for d in new if d != 1]
        strides = [0] * len(dims)
        oi = ni = 0
        while ni < len(dims) and oi < len(old):
            oj, nj = oi + 1, ni + 1
            np_, op = dims[ni], old[oi][0]
            while np_ != op:
                if np_ < op:
                    np_ *= dims[nj]
                    nj += 1
                else:
                    op *= old[oj][0]
                    oj += 1
            if any(old[k][1] != old[k + 1][0] * old[k + 1][1] for k in range(oi, oj - 1)):
                return _View(self.base, self.base_shape, self.offset, fine.shape, fine.strides, out_shape=new)
            strides[nj - 1] = old[oj - 1][1]
            for k in range(nj - 1, ni, -1):
                strides[k - 1] = strides[k] * dims[k]
            ni, oi = nj, oj
        it = iter(strides)
        return _View(self.base, self.base_shape, self.offset, new, [0 if d == 1 else next(it) for d in new])


# -- passes --------------------------------------------------------------------------------------------------

def _scalar(g: Graph, t: str) -> bool:
    return t in g.params and np.ptp(np.asarray(g.params[t])) == 0  # one value, however broadcast


def _through_movement(g: Graph, t: str):
    """``(matmul, tensor)``: the matmul that alone reads ``t`` through a chain of single-reader reshapes /
    transposes / slices (a scale commutes with them), and the tensor it reads; None when there is none."""
    while t not in g.outputs:
        readers = g.consumers(t)
        if len(readers) != 1 or readers[0].inputs.count(t) != 1:
            return None
        r = readers[0]
        if r.op == "matmul":
            return (r, t) if r.inputs[:2].count(t) == 1 and t in r.inputs[:2] else None
        if r.op not in MOVEMENT or r.inputs[0] != t:
            return None
        t = r.outputs[0]
    return None


def batch_norm_over_rows(graph: Graph) -> Graph:
    g = graph.copy()
    nodes = []
    for n in g.nodes:
        r = g.producer(n.inputs[0]) if n.op == "batch_norm" and len(g.shapes[n.inputs[0]]) == 2 else None
        x = r.inputs[0] if r is not None and r.op in ("reshape", "flatten") else None
        c = g.shapes[n.inputs[0]][1] if x is not None else None
        if x is None or x in g.params or len(g.shapes[x]) < 3 or g.shapes[x][-1] != c or n.inputs[0] in g.outputs \
                or g.consumers(n.inputs[0]) != [n] or not all(t in g.params for t in n.inputs[1:5]):
            nodes.append(n)
            continue
        gamma, beta, mean, var = (np.asarray(g.params[t], np.float64) for t in n.inputs[1:5])
        k = gamma / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
        shape = tuple(g.shapes[x])
        scaled, shifted = _fresh(g, f"{n.name}.scaled"), _fresh(g, f"{n.name}.shifted")
        g.shapes[scaled] = g.shapes[shifted] = shape
        nodes += [Node("mul", f"{n.name}.scale", [x, _add_param(g, f"{n.name}.k", k.astype(np.float32))], [scaled]),
                  Node("add", f"{n.name}.shift", [scaled, _add_param(g, f"{n.name}.b", (beta - mean * k)
                                                                     .astype(np.float32))], [shifted]),
                  _reshape_node(g, f"{n.name}.rows", shifted, g.shapes[n.outputs[0]], out=n.outputs[0])]
    g.nodes = nodes
    return _drop_unused_params(g).validate()


def fold_matmul_scales(graph: Graph) -> Graph:
    g = graph.copy()
    for mul in list(g.nodes):
        if mul.op not in ("mul", "div") or mul.attrs.get("activation", "none") != "none":
            continue
        consts = [t for t in mul.inputs if _scalar(g, t)]
        acts = [t for t in mul.inputs if t not in g.params]
        if len(consts) != 1 or len(acts) != 1 or (mul.op == "div" and mul.inputs[1] != consts[0]):
            continue
        value = float(np.asarray(g.params[consts[0]]).reshape(-1)[0])
        scale = value if mul.op == "mul" else 1.0 / value
        producer = g.producer(acts[0])
        same = tuple(g.shapes[acts[0]]) == tuple(g.shapes[mul.outputs[0]])  # the constant broadcasts no axis
        reader = _through_movement(g, mul.outputs[0]) if same else None
        if reader is not None:  # q * scale, k * scale (then moved: its reader reads the unscaled tensor)
            mm = reader[0]
            for n in g.nodes:
                if mul.outputs[0] in n.inputs:
                    n.inputs = [acts[0] if t == mul.outputs[0] else t for t in n.inputs]
        elif (producer is not None and producer.op == "matmul" and acts[0] not in g.outputs
              and len(g.consumers(acts[0])) == 1):  # (q @ k) * scale
            mm = producer
            mm.outputs = list(mul.outputs)
        else:
            continue
        mm.attrs["alpha"] = float(mm.attrs.get("alpha", 1.0)) * scale
        g.nodes = [n for n in g.nodes if n is not mul]
    return _drop_unused_params(g)


def _reshape_node(g: Graph, name: str, x: str, shape, out: str | None = None) -> Node:
    out = out or _fresh(g, name)
    g.shapes[out] = tuple(shape)
    return Node("reshape", name, [x], [out], {"shape": tuple(shape)})


def _heads_const(g: Graph, t: str, shape4) -> str | None:
    """A constant operand of an op on the 4-D (B, heads, M, N) scores as the 3-D (B * heads, M, N) one (an
    attention bias (heads, M, N) or (1, heads, M, N) broadcast over B), or None when it is not one."""
    v = np.asarray(g.params[t])
    if v.size == 1:
        return t
    try:
        full = np.broadcast_to(v, shape4)
    except ValueError:
        return None
    return _add_param(g, f"{t}.3d", np.ascontiguousarray(full.reshape((-1,) + tuple(shape4[-2:])), np.float32))


def _softmax_last(g: Graph) -> Graph:
    """A softmax over an axis other than the last of a 3-D or 5-D+ tensor, or other than the last or channels
    of a 4-D one, between transposes that make it the last (CoaT's softmax over the tokens of K); in place."""
    nodes = []
    for n in g.nodes:
        rank = len(g.shapes[n.outputs[0]])
        axis = n.attrs.get("axis", -1) % rank if n.op == "softmax" else None
        if axis is None or rank < 3 or axis == rank - 1 or (rank == 4 and axis == 1):
            nodes.append(n)
            continue
        perm = tuple(a for a in range(rank) if a != axis) + (axis,)
        inverse = tuple(int(i) for i in np.argsort(perm))
        t_in = _fresh(g, f"{n.name}.last")
        g.shapes[t_in] = tuple(g.shapes[n.inputs[0]][p] for p in perm)
        mid = _fresh(g, f"{n.name}.out_last")
        g.shapes[mid] = g.shapes[t_in]
        nodes += [Node("transpose", f"{n.name}.to_last", [n.inputs[0]], [t_in], {"perm": perm}),
                  Node("softmax", n.name, [t_in], [mid], {**n.attrs, "axis": rank - 1}),
                  Node("transpose", f"{n.name}.back", [mid], list(n.outputs), {"perm": inverse})]
    g.nodes = nodes
    return g


def attention_ranks(graph: Graph) -> Graph:
    g = graph.copy()
    nodes = []
    three = {}  # a 4-D tensor -> the 3-D tensor holding it (reshapes fold away in movement_views)

    def as_3d(t: str, where: str) -> str:
        if t not in three:
            s = g.shapes[t]
            r = _reshape_node(g, where, t, (math.prod(s[:-2]), s[-2], s[-1]))
            nodes.append(r)
            three[t] = r.outputs[0]
        return three[t]

    def emit_3d(n: Node, ins: list, attrs: dict):
        shape = tuple(g.shapes[n.outputs[0]])
        mid = _fresh(g, f"{n.name}.3d")
        g.shapes[mid] = (math.prod(shape[:-2]), shape[-2], shape[-1])
        nodes.append(Node(n.op, n.name, ins, [mid], attrs))
        nodes.append(_reshape_node(g, f"{n.name}.4d", mid, shape, out=n.outputs[0]))
        three[n.outputs[0]] = mid

    for n in _softmax_last(g).nodes:
        shape = tuple(g.shapes[n.outputs[0]])
        if n.op == "matmul" and len(shape) == 4 and g.shapes[n.inputs[1]][1] == 1 < shape[1]:
            # one K, V for every head (multi-query attention): the heads join the rows of A
            a, b = (tuple(g.shapes[t]) for t in n.inputs[:2])
            ra = _reshape_node(g, f"{n.name}.in0_rows", n.inputs[0], (a[0], a[1] * a[2], a[3]))
            rb = _reshape_node(g, f"{n.name}.in1_3d", n.inputs[1], (b[0], b[2], b[3]))
            mid = _fresh(g, f"{n.name}.3d")
            g.shapes[mid] = (shape[0], shape[1] * shape[2], shape[3])
            nodes += [ra, rb, Node("matmul", n.name, [ra.outputs[0], rb.outputs[0]], [mid], dict(n.attrs)),
                      _reshape_node(g, f"{n.name}.4d", mid, shape, out=n.outputs[0])]
        elif n.op == "matmul" and len(shape) >= 4:  # (batch, heads[, windows], M, K): the leading axes merged
            emit_3d(n, [as_3d(t, f"{n.name}.in{k}_3d") for k, t in enumerate(n.inputs[:2])], dict(n.attrs))
        elif n.op == "softmax" and len(shape) >= 4 and n.attrs.get("axis") % len(shape) == len(shape) - 1:
            emit_3d(n, [as_3d(n.inputs[0], f"{n.name}.in_3d")], {**n.attrs, "axis": 2})
        elif (n.op in ("add", "mul", "sub", "div") and len(shape) >= 4 and n.attrs.get("activation", "none") == "none"
              and any(t in three for t in n.inputs)
              and all(t in three or t in g.params for t in n.inputs)
              and None not in (ins := [three.get(t) or _heads_const(g, t, shape) for t in n.inputs])):
            emit_3d(n, ins, dict(n.attrs))
        else:
            nodes.append(n)
    g.nodes = nodes
    return g


def _rows(shape) -> tuple:
    """A shape of at most 3 axes with the same row-major order: the leading axes merged."""
    shape = tuple(shape)
    return shape if len(shape) <= 3 else (math.prod(shape[:-2]), *shape[-2:])


def _gather_window(g: Graph, n: Node) -> tuple | None:
    """``(starts, steps, counts)`` of a 4-D ``slice`` whose channels step evenly (a Split along any axis of a
    4-D token view, LeViT's (B, T, heads, d) q / k / v), else None."""
    shape, a = g.shapes[n.inputs[0]], n.attrs
    ch = tuple(int(c) for c in a["channels"])
    step = ch[1] - ch[0] if len(ch) > 1 else 1
    if len(shape) != 4 or not ch or step == 0 or ch != tuple(ch[0] + k * step for k in range(len(ch))):
        return None
    window = []
    for key, extent in (("rows", shape[2]), ("cols", shape[3])):
        start, st, count = a.get(key, (0, 1, None))
        window.append((start, st, extent if count is None else count))
    return ((0, ch[0], window[0][0], window[1][0]), (1, step, window[0][1], window[1][1]),
            (shape[0], len(ch), window[0][2], window[1][2]))


def _matmul_chains(g: Graph) -> set:
    """Names of the reshapes / transposes of any rank through which only products read a tensor (EfficientFormerV2's
    ``conv(x).reshape(B, heads, d, N).transpose(-1, -2)``): views, so that the products read the tensor in place."""
    chain = set()
    for mm in [n for n in g.nodes if n.op == "matmul"]:
        for t in mm.inputs[:2]:
            p = g.producer(t)
            while p is not None and p.op in ("reshape", "transpose") and p.inputs[0] not in g.params \
                    and p.outputs[0] not in g.outputs and all(c.op in MOVEMENT + ("matmul",) for c in
                                                              g.consumers(p.outputs[0])):
                chain.add(p.name)
                p = g.producer(p.inputs[0])
    return chain


def _odd_rank(g: Graph, n: Node) -> bool:
    return any(len(g.shapes[t]) not in (2, 4) for t in (n.inputs[0], n.outputs[0]))


def _is_movement(g: Graph, n: Node, views: dict, chain: frozenset = frozenset()) -> bool:
    if n.name in chain:
        return True
    if n.op in ("reshape", "transpose") and n.inputs[0] not in g.params and n.outputs[0] not in g.outputs and (
            readers := g.consumers(n.outputs[0])) and all(r.op in MOVEMENT and _odd_rank(g, r) for r in readers):
        return True  # a 4-D permute that only views read (a window partition's NCHW -> NHWC): a view too
    if n.op == "slice" and n.inputs[0] in views:  # a gather of a view feeding more movement or a product: a view
        return _gather_window(g, n) is not None and n.outputs[0] not in g.outputs and all(
            r.op in MOVEMENT + ("matmul", "slice") for r in g.consumers(n.outputs[0]))
    if n.op not in MOVEMENT or n.inputs[0] in g.params:
        return False
    if n.op in ("slice_nd", "expand_nd") or n.inputs[0] in views:
        return True
    return _odd_rank(g, n)


def _moved(g: Graph, n: Node, v: _View) -> _View | None:
    """The view movement node ``n`` makes of ``v``, or None where it cuts an axis that merges several."""
    a = n.attrs
    if n.op == "transpose":
        return v.transpose(a["perm"])
    if n.op == "slice_nd":
        return v.slice(a["starts"], a["steps"], a["counts"])
    if n.op == "slice":
        return v.slice(*_gather_window(g, n))
    if n.op == "expand_nd":
        return v.expand(a["shape"])
    return v.reshape(g.shapes[n.outputs[0]])


def movement_views(graph: Graph) -> Graph:
    g = graph.copy()
    views: dict = {}  # tensor -> _View of a materialized tensor
    made: dict = {}  # view tensor -> the tensor that holds it once materialized
    nodes = []

    def materialize(t: str, as_name: str | None = None) -> str:
        if t in made:
            return made[t]
        v = views[t]
        if v.is_whole() and as_name is None:
            made[t] = v.base
            return v.base
        out = as_name or t
        nodes.append(Node("strided_copy", f"{t}.copy", [v.base], [out], v.attrs()))
        made[t] = out
        return out

    def rows_of(t: str) -> str:
        """The view copied out in order into a tensor of at most 3 axes (its own shape may have 6: Twins'
        windows), which any reshape of it then views without a copy."""
        v = views[t]
        key = f"{t}.rows"
        if key not in made:
            g.shapes[key] = _rows(v.out_shape)
            attrs = {**v.attrs(), "out_shape": g.shapes[key]}
            nodes.append(Node("strided_copy", f"{t}.copy", [v.base], [key], attrs))
            made[key] = key
        return made[key]

    chain = _matmul_chains(g)
    for n in g.nodes:
        if _is_movement(g, n, views, chain):
            x, out = n.inputs[0], n.outputs[0]
            v = views[x] if x in views and views[x].composes else None
            new = _moved(g, n, v or _View.whole(x, g.shapes[x])) if x not in views or v else None
            if new is None:  # a view that composes no further (or not this way) is copied out first
                new = _moved(g, n, _View.whole(rows_of(x), _rows(g.shapes[x])).reshape(g.shapes[x]))
            views[out] = new
            continue
        n.inputs = [materialize(t) if t in views else t for t in n.inputs]
        nodes.append(n)
    for t in g.outputs:  # a model output that is a view of another tensor: copied out under its own name
        if t in views and made.get(t) != t:
            made.pop(t, None)
            materialize(t, as_name=t)
    g.nodes = nodes
    return _drop_unused_params(g).validate()


def _token_const(g: Graph, node: Node, p: str, shape) -> str:
    """A constant operand of a binary op on a 3-D tensor (N, T, C) in the token view: one broadcast over N and
    T as a per-channel (1, C, 1, 1); one that varies along T (a position embedding, an attention bias) as the
    whole (N or 1, C, 1, T)."""
    v = np.asarray(g.params[p], np.float32)
    if v.size == 1:
        return p
    try:
        full = np.broadcast_to(v, shape)
    except ValueError:
        raise TunerError(f"node {node.name!r} ({node.op}): a constant of shape {v.shape} does not broadcast to "
                         f"the token tensor's {tuple(shape)}") from None
    if np.array_equal(np.broadcast_to(full[:1, :1, :], shape), full):
        return _add_param(g, f"{p}.c1", np.ascontiguousarray(full[0, 0].reshape(1, -1, 1, 1)))
    rows = full[:1] if np.array_equal(np.broadcast_to(full[:1], shape), full) else full
    return _add_param(g, f"{p}.view", to_view(np.ascontiguousarray(rows)))


REDUCE = ("reduce_mean", "reduce_max", "reduce_sum", "reduce_l2")


def _token_reduce(g: Graph, n: Node, shape, nodes: list) -> Node:
    """A reduction of a token tensor (N, T, C) in its view (N, C, 1, T): over T (global pooling of tokens) one
    over H, W; over C one over channels (then a reshape when the result is 2-D)."""
    axes, keep = tuple(n.attrs["axes"]), int(n.attrs.get("keepdims", 1))
    if axes == (1,):
        return Node(n.op, n.name, n.inputs, n.outputs, {**n.attrs, "axes": (2, 3)})
    if axes == (2,):
        if keep:
            return Node(n.op, n.name, n.inputs, n.outputs, {**n.attrs, "axes": (1,)})
        mid = _fresh(g, f"{n.name}.kept")
        g.shapes[mid] = (shape[0], 1, 1, shape[1])
        nodes.append(Node(n.op, n.name, n.inputs, [mid], {**n.attrs, "axes": (1,), "keepdims": 1}))
        return Node("reshape", f"{n.name}.2d", [mid], n.outputs, {"shape": tuple(g.shapes[n.outputs[0]])})
    raise TunerError(f"node {n.name!r}: {n.op} over axes {list(axes)} of a token tensor {tuple(shape)}; "
                     f"over the tokens (1) or the features (2) only")


def tokens_to_nchw(graph: Graph) -> Graph:
    g = graph.copy()
    rank3 = {t for t, s in g.shapes.items() if len(s) == 3 and t not in g.params}
    if not rank3:
        return g
    for t in g.inputs + g.outputs:
        if t in rank3:
            raise TunerError(f"model {'input' if t in g.inputs else 'output'} {t!r} has the 3-D shape "
                             f"{g.shapes[t]}; model inputs and outputs must be 4-D (N, C, H, W) or 2-D (N, K)")
    logical = {t: tuple(g.shapes[t]) for t in g.shapes}
    nodes = []
    for n in g.nodes:
        touched = [t for t in n.inputs + n.outputs if t in rank3]
        if not touched:
            nodes.append(n)
            continue
        shape = logical[touched[0]]
        if n.op == "dense":
            w = np.asarray(g.params[n.inputs[1]])
            n = Node("conv2d", n.name, [n.inputs[0], _add_param(g, f"{n.inputs[1]}.1x1", w.reshape(w.shape + (1, 1))),
                                        *n.inputs[2:]], n.outputs,
                     {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 1})
        elif n.op in ("layer_norm", "softmax"):
            if n.attrs.get("axis") not in (2, -1):
                raise TunerError(f"node {n.name!r}: {n.op} over axis {n.attrs.get('axis')} of a token tensor "
                                 f"{shape}; only the last axis (the features) is supported")
            n.attrs = {**n.attrs, "axis": 1}
        elif n.op in ELEMENTWISE:
            n.inputs = [_token_const(g, n, t, shape) if t in g.params else t for t in n.inputs]
            for t in n.inputs:
                if t not in g.params and t not in rank3:
                    raise TunerError(f"node {n.name!r} ({n.op}): a token tensor {shape} with {t!r} of shape "
                                     f"{g.shapes[t]}")
        elif n.op == "matmul":
            n.attrs = {**n.attrs, "tokens": True}  # operands and output in their token views
        elif n.op == "batch_norm":  # over axis 1 of an (N, C, L) tensor (Next-ViT): a scale and shift along T
            scale, bias, mean, var = (np.asarray(g.params[t], np.float64) for t in n.inputs[1:5])
            k = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
            mid = _fresh(g, f"{n.name}.scaled")
            logical[mid] = shape
            rank3.add(mid)
            s_p = _add_param(g, f"{n.name}.k", k.reshape(1, -1, 1).astype(np.float32))
            b_p = _add_param(g, f"{n.name}.b", (bias - mean * k).reshape(1, -1, 1).astype(np.float32))
            nodes.append(Node("mul", f"{n.name}.mul", [n.inputs[0], _token_const(g, n, s_p, shape)], [mid]))
            n = Node("add", n.name, [mid, _token_const(g, n, b_p, shape)], n.outputs)
        elif n.op in REDUCE and n.inputs[0] in rank3:
            n = _token_reduce(g, n, shape, nodes)
        elif n.op == "concat":  # along the tokens (a class token) or the features: the view concat kernel
            ins = []
            for t in n.inputs:
                if t in g.params:
                    v = np.asarray(g.params[t], np.float32)
                    t = _add_param(g, f"{t}.view", to_view(np.ascontiguousarray(v)))
                ins.append(t)
            n = Node("concat_view", n.name, ins, n.outputs,
                     {"axis": int(n.attrs["axis"]) % 3, "shapes": tuple(logical[t] for t in n.inputs)})
        # strided_copy: its attributes name the logical shapes on both sides
        if n.op not in ("conv2d", "layer_norm", "softmax", "matmul", "strided_copy", "reshape", "concat_view") \
                and n.op not in ELEMENTWISE and n.op not in REDUCE:
            raise TunerError(f"node {n.name!r}: operator {n.op} on the token tensor {touched[0]!r} of shape "
                             f"{shape} has no kernel; token tensors take MatMul, LayerNormalization, Softmax over "
                             f"the last axis, elementwise ops and reshapes / transposes")
        nodes.append(n)
    for t in rank3:
        g.shapes[t] = token_view(logical[t])
    g.nodes = nodes
    return _drop_unused_params(g).validate()


ACTIVATIONS = ("relu", "clip", "activation")  # the nodes passes.fuse_epilogues fuses into a product


def activations_before_copies(graph: Graph) -> Graph:
    g = graph.copy()
    for act in [n for n in g.nodes if n.op in ACTIVATIONS]:
        copy = g.producer(act.inputs[0])
        mm = g.producer(copy.inputs[0]) if copy is not None and copy.op == "strided_copy" else None
        y = copy.inputs[0] if mm is not None else None
        if mm is None or mm.op != "matmul" or y in g.outputs or g.consumers(y) != [copy] \
                or copy.outputs[0] in g.outputs or g.consumers(copy.outputs[0]) != [act] or len(act.inputs) != 1:
            continue
        mid = _fresh(g, f"{act.outputs[0]}.before_copy")
        g.shapes[mid] = g.shapes[y]
        out = act.outputs[0]
        act.inputs, act.outputs = [y], [mid]
        copy.inputs, copy.outputs = [mid], [out]
        g.nodes.remove(act)
        g.nodes.insert(g.nodes.index(copy), act)
    return _drop_unused_params(g).validate()


def optimize_tokens(graph: Graph) -> Graph:
    """All of the above, in order."""
    if not any(n.op in ("matmul", "slice_nd", "expand_nd") or (n.op == "softmax" and n.attrs.get("axis") != 1)
               or any(len(graph.shapes[t]) not in (2, 4) for t in n.outputs) for n in graph.nodes):
        return graph  # nothing of attention's: a convolution network passes untouched
    return run_passes(graph, TOKEN_PASSES)


TOKEN_PASSES = (batch_norm_over_rows, fold_matmul_scales, attention_ranks, movement_views, tokens_to_nchw,
                activations_before_copies)  # in this order


# -- matmuls reading and writing in place (run last, by ``passes.optimize``) ------------------------------------

class _Operand:
    """A matmul operand as elements of a stored tensor: ``idx[b, r, c]`` is the row-major index into ``source``
    (of logical shape ``logical``) of element (b, r, c) of the operand as the math has it (A (B, M, K), B (B, K,
    N), Y (B, M, N)); ``copy`` is the strided copy that makes it now, which runs no more when the operand is read
    in place; ``origin`` the tensor the node reads now, which holds the operand unless ``flipped`` (transposed)."""

    def __init__(self, source: str, logical, idx: np.ndarray, copy: Node | None = None, origin: str | None = None,
                 flipped: bool = False):
        self.source, self.logical, self.idx, self.copy = source, tuple(logical), idx, copy
        self.origin, self.flipped = origin or source, flipped

    def t(self) -> "_Operand":
        return _Operand(self.source, self.logical, self.idx.transpose(0, 2, 1), self.copy, self.origin,
                        not self.flipped)


def _copy_index(copy: Node) -> np.ndarray:
    """Row-major indices into the copy's source of its output's elements, in the output's logical shape."""
    a = copy.attrs
    ar = np.arange(math.prod(a["src_shape"]), dtype=np.int64).reshape(a["src_shape"])
    return strided_reference(ar, a["offset"], a["shape"], a["strides"]).reshape(a["out_shape"])


def _operand(g: Graph, t: str, mm: Node) -> _Operand:
    """Input ``t`` of ``mm``: the copy's source where a strided copy read by ``mm`` alone makes it."""
    p = g.producer(t)
    logical = token_logical(g.shapes[t])
    if p is not None and p.op == "strided_copy" and t not in g.outputs and g.consumers(t) == [mm] \
            and mm.inputs.count(t) == 1 and len(p.attrs["src_shape"]) in (3, 4) \
            and tuple(p.attrs["out_shape"]) == logical:
        return _Operand(p.inputs[0], p.attrs["src_shape"], _copy_index(p), p, t)
    return _Operand(t, logical, np.arange(math.prod(logical), dtype=np.int64).reshape(logical))


def _destination(g: Graph, mm: Node, shape) -> _Operand | None:
    """Where the product Y (``shape``) is wanted: the tensor of the strided copy that alone reads it and holds
    every element once (``idx``: each element of Y's index into it), else None."""
    y = mm.outputs[0]
    readers = g.consumers(y)
    if y in g.outputs or len(readers) != 1 or readers[0].op != "strided_copy" or len(readers[0].attrs["out_shape"]) \
            not in (3, 4) or readers[0].outputs[0] in g.outputs:
        return None
    z = readers[0]
    idx = _copy_index(z).reshape(-1)
    if idx.size != math.prod(shape) or len(np.unique(idx)) != idx.size:
        return None
    where = np.empty(idx.size, np.int64)
    where[idx] = np.arange(idx.size)
    return _Operand(z.outputs[0], z.attrs["out_shape"], where.reshape(shape), z)


def _placed(op: _Operand, write: bool, shape) -> tuple | None:
    """The view that reads (writes) ``op`` in place, ``()`` for its source's own storage, or None."""
    from tuner.templates.matmul import check_view
    view = fit_view(op.idx, op.logical)
    if view:
        try:
            check_view(view, shape, write=write)
        except ValueError:
            return None
    return view


def _options(g: Graph, mm: Node, ops: dict, dest: _Operand | None) -> list:
    """Per (swap, trans_b) the kernel's operands and output (each ``(operand, view or None)``) and the copies
    that still run: Y = A @ B, or with ``swap`` Y^T = B^T @ A^T (the output's rows and columns exchanged)."""
    out = []
    res, tb0 = mm.attrs.get("residual"), bool(mm.attrs.get("trans_b", False))
    for swap in (False, True):
        if swap and (res or dest is None):
            continue  # a swapped product writes Y^T: only into a copy's tensor, with no residual to read as Y
        for tb in (tb0, not tb0):
            a_op, b_op = (ops["A"], ops["B"].t() if tb else ops["B"]) if not swap else \
                (ops["B"].t(), ops["A"] if tb else ops["A"].t())
            y_idx = np.arange(math.prod(ops["Y"]), dtype=np.int64).reshape(ops["Y"])
            y_idx = y_idx.transpose(0, 2, 1) if swap else y_idx
            kernel = []
            for op in (a_op, b_op):
                view = _placed(op, False, op.idx.shape)
                if view is None and op.flipped and affine_form(op.idx) is None:
                    break  # no view reads it and no strided copy makes it
                kernel.append((op, view))
            else:
                placed = _placed(_Operand(dest.source, dest.logical, dest.idx.reshape(-1)[y_idx]), True,
                                 y_idx.shape) if dest is not None and not res else None  # (a residual of Y's shape)
                if placed is None and swap:
                    continue
                copies = sum(v is None for _, v in kernel) + (dest is not None and placed is None)
                out.append((copies, swap, tb, kernel, placed))
    return out


def _new_copy(g: Graph, name: str, op: _Operand) -> str:
    """A strided copy making ``op`` (affine in its source) as a tensor of its own; returns the tensor."""
    offset, strides = affine_form(op.idx)
    t = _fresh(g, f"{name}.operand")
    g.shapes[t] = token_view(op.idx.shape)
    g.nodes.insert(g.nodes.index(g.producer(op.source)) + 1 if g.producer(op.source) else 0,
                   Node("strided_copy", f"{t}.copy", [op.source], [t],
                        {"src_shape": op.logical, "offset": offset, "strides": strides, "shape": op.idx.shape,
                         "out_shape": op.idx.shape}))
    return t


def _swapped_epilogue(g: Graph, mm: Node, shape) -> list:
    """The bias (per column of Y) and addend of ``mm`` as one addend of Y^T's storage (1 or B, M, 1, N)."""
    a = mm.attrs
    rest = [t for t in mm.inputs[2:] if t != a.get("addend") and t != a.get("residual")]
    if not rest and "addend" not in a:
        return []
    nb, m, n = shape
    total = np.zeros((1, n, 1, m), np.float32)  # Y's storage view
    if rest:
        total = total + np.asarray(g.params[rest[0]], np.float32).reshape(1, n, 1, 1)
    if "addend" in a:
        total = total + np.asarray(g.params[a["addend"]], np.float32)
    a["addend"] = _add_param(g, f"{mm.name}.addend_t", np.ascontiguousarray(total.transpose(0, 3, 2, 1)))
    return [a["addend"]]


def _place_matmul(g: Graph, mm: Node) -> None:
    """``mm`` rewritten to read its operands and write its product in place where that leaves fewer strided
    copies running; in place."""
    a = mm.attrs
    shape_a, shape_in_b = token_logical(g.shapes[mm.inputs[0]]), token_logical(g.shapes[mm.inputs[1]])
    ops = {"A": _operand(g, mm.inputs[0], mm), "B": _operand(g, mm.inputs[1], mm)}
    if a.get("trans_b"):
        ops["B"] = ops["B"].t()
    nb, m, n = shape_a[0], shape_a[1], shape_in_b[1] if a.get("trans_b") else shape_in_b[2]
    ops["Y"] = (nb, m, n)
    dest = _destination(g, mm, (nb, m, n))
    now = (ops["A"].copy is not None) + (ops["B"].copy is not None) + (dest is not None)
    options = _options(g, mm, ops, dest)
    if not options:
        return
    copies, swap, tb, kernel, placed = min(options, key=lambda o: (o[0], o[1], o[2] != bool(a.get("trans_b"))))
    if copies >= now:
        return
    inputs = []
    for key, (op, view) in zip(("a", "b"), kernel):
        a.pop(f"{key}_view", None)
        if view is None:  # made by a copy: the one there, if it makes this orientation, else a new one
            inputs.append(_new_copy(g, mm.name, op) if op.flipped else op.origin)
        else:
            inputs.append(op.source)
            if view:
                a[f"{key}_view"], a[key] = view, tuple(op.idx.shape)
    epilogue = list(mm.inputs[2:])
    if swap:
        epilogue = _swapped_epilogue(g, mm, (nb, m, n))
    a["trans_b"] = tb
    if placed is not None:
        z = dest.copy
        mm.outputs = list(z.outputs)
        if placed:
            a["y_view"] = placed
        g.nodes = [x for x in g.nodes if x is not z]
    mm.inputs = inputs + epilogue


def _residual_after(g: Graph, mm: Node) -> None:
    """``mm`` takes the add of another activation of its output's shape that alone reads its output, as its
    residual (with ``y_view``, read through the same view): an add after a product that now writes in place. The
    product moves to where the add was (the other operand may be computed after it)."""
    z = mm.outputs[0]
    readers = g.consumers(z)
    if mm.attrs.get("residual") or z in g.outputs or len(readers) != 1:
        return
    add = readers[0]
    if add.op != "add" or len(add.inputs) != 2 or add.inputs.count(z) != 1 or add.attrs:
        return
    other = add.inputs[1] if add.inputs[0] == z else add.inputs[0]
    if other in g.params or tuple(g.shapes[other]) != tuple(g.shapes[z]):
        return
    mm.attrs["residual"] = other
    mm.inputs, mm.outputs = mm.inputs + [other], list(add.outputs)
    g.nodes.remove(mm)  # where the add was: the other operand is ready there, and only the add read the product
    g.nodes[g.nodes.index(add)] = mm


def matmul_views(graph: Graph) -> Graph:
    """Every token ``matmul`` reads its operands and writes its product in place where strided copies made or
    took them (the view the template reads through: channel groups and pixels of another tensor), computing Y^T =
    B^T @ A^T instead where that leaves fewer copies: EfficientViT's ``q^T @ k`` reads q and k as channel slices of
    its NCHW projections, and ``v @ attn^T`` runs as ``attn @ v^T``, writing the head's NCHW output. An add after
    a product written in place becomes its residual (read through the output's view)."""
    if not any(n.op == "matmul" for n in graph.nodes):
        return graph
    g = graph.copy()
    for mm in [n for n in g.nodes if n.op == "matmul" and n.attrs.get("tokens")]:
        _place_matmul(g, mm)
        _residual_after(g, mm)
    read = {t for n in g.nodes for t in n.inputs} | set(g.outputs)
    while dead := [n for n in g.nodes if n.op == "strided_copy" and not read & set(n.outputs)]:
        g.nodes = [n for n in g.nodes if n not in dead]  # copies whose operand is now read in place
        read = {t for n in g.nodes for t in n.inputs} | set(g.outputs)
    produced = {t for n in g.nodes for t in n.outputs} | set(g.inputs) | set(g.params)
    g.shapes = {t: s for t, s in g.shapes.items() if t in produced}
    return _drop_unused_params(g).validate()
