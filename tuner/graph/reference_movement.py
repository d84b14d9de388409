"""NumPy reference of the data-movement and layout operators: ``OPS`` (op -> fn(node, *inputs)) and ``ATTRS``
(op -> attribute names), merged into ``reference.OPS`` / ``reference.ATTRS``. ``PASS_OPS`` / ``PASS_ATTRS``: ops
that only ``passes_movement`` creates (not emitted by the frontend, so kept out of ``reference.OPS``)."""
from __future__ import annotations

import numpy as np

from . import kernels_movement as KM


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


OPS: dict = {"transpose": transpose, "slice": slice_, "pad": pad, "resize": resize,
             "conv_transpose": conv_transpose, "layer_norm": layer_norm}
ATTRS: dict = {"transpose": {"perm"}, "slice": {"channels", "rows", "cols"}, "pad": {"pads", "mode", "value"},
               "resize": {"mode", "coord", "nearest", "scales", "size"},
               "conv_transpose": {"stride", "padding", "dilation", "output_padding", "groups"},
               "layer_norm": {"axis", "epsilon"}}
PASS_OPS: dict = {"upsample_zeros": upsample_zeros}
PASS_ATTRS: dict = {"upsample_zeros": {"size", "stride", "shift"}}
