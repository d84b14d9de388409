"""NumPy reference of the data-movement and layout operators: ``OPS`` (op -> fn(node, *inputs)) and ``ATTRS``
(op -> attribute names), merged into ``reference.OPS`` / ``reference.ATTRS``. ``PASS_OPS`` / ``PASS_ATTRS``: ops
that only ``passes_movement`` creates (not emitted by the frontend, so kept out of ``reference.OPS``)."""
from __future__ import annotations

import numpy as np

import tuner.ops.kernels_movement as KM
from tuner.ops.token_views import from_view, strided_reference, to_view


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


def matmul(node, a, b):
    """``alpha * a @ b`` over the last two axes; after ``passes_tokens.tokens_to_nchw`` (attribute ``tokens``)
    every operand is in its token view."""
    if node.attrs.get("tokens"):
        lo = lambda v: v[:, :, 0, :].transpose(0, 2, 1)  # noqa: E731 - (B, C, 1, T) -> (B, T, C)
        y = node.attrs.get("alpha", 1.0) * np.matmul(lo(a), lo(b))
        return np.ascontiguousarray(y.transpose(0, 2, 1)[:, :, None, :])
    return node.attrs.get("alpha", 1.0) * np.matmul(a, b)


def slice_nd(node, x):
    a = node.attrs
    return x[tuple(slice(s, s + k * st if s + k * st >= 0 else None, st)
                   for s, st, k in zip(a["starts"], a["steps"], a["counts"]))]


def strided_copy(node, x):
    a = node.attrs
    y = strided_reference(from_view(x, a["src_shape"]), a["offset"], a["shape"], a["strides"])
    return to_view(y.reshape(a.get("out_shape", a["shape"])))


def concat_view(node, *xs):
    a = node.attrs
    return to_view(np.concatenate([from_view(x, s) for x, s in zip(xs, a["shapes"])], axis=a["axis"]))


OPS: dict = {"transpose": transpose, "matmul": matmul, "slice_nd": slice_nd,
             "expand_nd": lambda node, x: np.broadcast_to(x, node.attrs["shape"]).copy(), "slice": slice_, "pad": pad, "resize": resize,
             "conv_transpose": conv_transpose, "layer_norm": layer_norm, "depth_to_space": depth_to_space}
ATTRS: dict = {"transpose": {"perm"}, "matmul": {"alpha", "tokens"}, "slice_nd": {"starts", "steps", "counts"},
               "expand_nd": {"shape"}, "slice": {"channels", "rows", "cols"}, "pad": {"pads", "mode", "value"},
               "resize": {"mode", "coord", "nearest", "scales", "size"},
               "conv_transpose": {"stride", "padding", "dilation", "output_padding", "groups"},
               "layer_norm": {"axis", "epsilon"}, "depth_to_space": {"block", "mode", "crop", "size"}}
PASS_OPS: dict = {"upsample_zeros": upsample_zeros, "strided_copy": strided_copy, "concat_view": concat_view}
PASS_ATTRS: dict = {"upsample_zeros": {"size", "stride", "shift"},
                    "strided_copy": {"src_shape", "offset", "strides", "shape", "out_shape"},
                    "concat_view": {"axis", "shapes"}}
