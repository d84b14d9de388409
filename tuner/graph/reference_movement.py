"""NumPy reference of the data-movement and layout operators: ``OPS`` (op -> fn(node, *inputs)) and ``ATTRS``
(op -> attribute names), merged into ``reference.OPS`` / ``reference.ATTRS``. ``PASS_OPS`` / ``PASS_ATTRS``: ops
that only the passes create (not emitted by the frontend, so kept out of ``reference.OPS``; ``run_graph_numpy``
evaluates them all the same). ``matmul`` is also the token matmul the passes make: the matmul template's."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import tuner.ops.kernels_movement as KM
from tuner.ops.token_views import from_view, strided_reference, to_view, token_logical


def transpose(node, x):
    return np.transpose(x, node.attrs["perm"])


def slice_(node, x):
    a = node.attrs
    return KM.slice_reference(x, a["channels"], a.get("rows", (0, 1, None)), a.get("cols", (0, 1, None)))


def pad(node, x):
    a = node.attrs
    return KM.pad_reference(x, a["pads"], a["mode"], a.get("value", 0.0))


def resize(node, x):
    a = node.attrs
    return KM.resize_reference(x, a["size"], a["mode"], a["coord"], a["nearest"], tuple(a["scales"]))


def conv_transpose(node, x, w, b=None):
    a = node.attrs
    n, c, h, wd = x.shape
    g = a.get("groups", 1)
    _, og, r_n, s_n = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oph, opw) = a["stride"], a["dilation"], a["padding"], \
        a.get("output_padding", (0, 0))
    lh, lw = (h - 1) * sh + dh * (r_n - 1) + 1 + oph, (wd - 1) * sw + dw * (s_n - 1) + 1 + opw
    full = np.zeros((n, g, og, lh, lw))
    xg = x.reshape(n, g, c // g, h, wd)
    wg = w.reshape(g, c // g, og, r_n, s_n)
    for r in range(r_n):
        for s in range(s_n):
            term = np.einsum("ngchw,gco->ngohw", xg, wg[:, :, :, r, s])
            full[:, :, :, r * dh: r * dh + (h - 1) * sh + 1: sh, s * dw: s * dw + (wd - 1) * sw + 1: sw] += term
    out = full.reshape(n, g * og, lh, lw)[:, :, pt: lh - pb, pl: lw - pr]
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def depth_to_space(node, x):
    a = node.attrs
    return KM.depth_to_space_reference(x, a["block"], a["mode"], a.get("crop", (0, 0)), a.get("size"))


def layer_norm(node, x, g, bt):
    axis = node.attrs["axis"]
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    form = [1] * x.ndim
    form[axis] = -1
    return (x - mean) / np.sqrt(var + node.attrs["epsilon"]) * g.reshape(form) + bt.reshape(form)


def upsample_zeros(node, x):
    a = node.attrs
    return KM.upsample_zeros_reference(x, a["size"], a["stride"], a["shift"])


def matmul(node, a, b, *rest):
    """``alpha * a @ b`` over the last two axes (the frontend's MatMul). After ``passes_tokens.tokens_to_nchw``
    (attribute ``tokens``) every operand is in its token view and the node is what the matmul template computes:
    its attributes -- ``trans_b``, ``alpha``, a bias, ``addend``, ``activation``, ``residual``, the views ``a_view``
    / ``b_view`` / ``y_view`` with the operands' shapes ``a`` / ``b`` (``passes.fuse_epilogues``,
    ``passes_tokens.matmul_views``) -- read by the template's own ``lower`` and evaluated by its ``reference``: the
    output is the product's storage view, or the tensor its ``y_view`` fills."""
    if node.attrs.get("tokens"):
        return _template_matmul(node, (a, b) + rest)
    if rest or set(node.attrs) - {"alpha", "tokens"}:
        raise ValueError(f"run_graph_numpy: matmul {node.name!r} has inputs or attributes of the template "
                         f"({sorted(node.attrs)}) but no token views (attribute tokens)")
    return node.attrs.get("alpha", 1.0) * np.matmul(a, b)


class _Arrays:
    """The ``ctx`` a template's ``lower`` sees (``plan.rules.LowerCtx`` through ``rules_movement._Logical``), over
    the node's input arrays: a 4-D (B, C, 1, T) activation by its logical (B, T, C) shape."""

    def __init__(self, node, arrays: dict):
        self.dtype, self.packed = "float32", (lambda name: name)
        self.graph = SimpleNamespace(params=arrays, shapes={t: np.shape(v) for t, v in arrays.items()})
        self._node = node

    def shape(self, name: str) -> tuple:
        s = self.graph.shapes[name]
        return token_logical(s) if len(s) == 4 and s[2] == 1 and name != self._node.attrs.get("addend") else s

    def is_param(self, name: str) -> bool:
        return True  # the graph's to enforce (the plan refuses a computed bias or addend); not the reference's


def _template_matmul(node, arrays: tuple) -> np.ndarray:
    from tuner.templates import matmul as T
    named = dict(zip(node.inputs, arrays))
    wl, inputs, extra = T.lower(_Arrays(node, named), node, list(node.inputs))
    return T._reference(wl, {k: np.asarray(extra[t] if t in extra else named[t], np.float64)
                             for k, t in inputs.items()})


def slice_nd(node, x):
    a = node.attrs
    return x[tuple(slice(s, s + k * st if s + k * st >= 0 else None, st)
                   for s, st, k in zip(a["starts"], a["steps"], a["counts"]))]


def strided_copy(node, x, divisor=None):
    """With attr ``divisor`` (``passes_attention.divisions_into_copies``) and its input, each source element divided by
    the divisor's element of its row (the source's shape with a last axis of 1) as it is read; with
    ``divisor_index`` ``(d_shape, d_offset, d_strides)`` (``passes_attention.norms_read_in_place``), by the divisor's
    row-major element ``d_offset + sum(s_k * d_strides[k])`` of the source coordinates s (clamped into it)."""
    a = node.attrs
    src = from_view(x, a["src_shape"])
    if divisor is not None and a.get("divisor_index"):  # passes_attention.norms_read_in_place: an affine index
        d_shape, d_offset, d_strides = a["divisor_index"]
        flat = d_offset + sum(g * s for g, s in zip(np.indices(src.shape), d_strides))
        src = src / from_view(divisor, d_shape).reshape(-1)[np.clip(flat, 0, int(np.prod(d_shape)) - 1)]
    elif divisor is not None:
        src = src / from_view(divisor, (*a["src_shape"][:-1], 1))
    y = strided_reference(src, a["offset"], a["shape"], a["strides"])
    return to_view(y.reshape(a.get("out_shape", a["shape"])))


def copy_sources(node, shape) -> np.ndarray:
    """The source element (row-major index into an input of ``shape``) that each output element of the strided copy
    ``node`` reads, in the output's stored order: the index array the passes check a copy's pattern on."""
    index = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    return np.asarray(strided_copy(node, index)).ravel().astype(np.int64)


def concat_view(node, *xs):
    a = node.attrs
    return to_view(np.concatenate([from_view(x, s) for x, s in zip(xs, a["shapes"])], axis=a["axis"]))


# the template's (``templates/matmul.py``'s ``lower``), on token matmuls only
MATMUL_ATTRS = {"alpha", "tokens", "trans_b", "activation", "residual", "addend", "a_view", "b_view", "y_view", "a",
                "b"}
OPS: dict = {"transpose": transpose, "matmul": matmul, "slice_nd": slice_nd,
             "expand_nd": lambda node, x: np.broadcast_to(x, node.attrs["shape"]).copy(), "slice": slice_, "pad": pad, "resize": resize,
             "conv_transpose": conv_transpose, "layer_norm": layer_norm, "depth_to_space": depth_to_space}
ATTRS: dict = {"transpose": {"perm"}, "matmul": MATMUL_ATTRS, "slice_nd": {"starts", "steps", "counts"},
               "expand_nd": {"shape"}, "slice": {"channels", "rows", "cols"}, "pad": {"pads", "mode", "value"},
               "resize": {"mode", "coord", "nearest", "scales", "size"},
               "conv_transpose": {"stride", "padding", "dilation", "output_padding", "groups"},
               "layer_norm": {"axis", "epsilon"}, "depth_to_space": {"block", "mode", "crop", "size"}}
PASS_OPS: dict = {"upsample_zeros": upsample_zeros, "strided_copy": strided_copy, "concat_view": concat_view}
PASS_ATTRS: dict = {"upsample_zeros": {"size", "stride", "shift"},
                    "strided_copy": {"src_shape", "offset", "strides", "shape", "out_shape", "divisor",
                                     "divisor_index"},
                    "concat_view": {"axis", "shapes"}}
