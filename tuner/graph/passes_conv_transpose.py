"""ConvTranspose as convolutions the tuner tunes (``Graph -> Graph`` passes, the last of ``MOVEMENT_PASSES``):

- ``lower_conv_transpose``: a strided ``conv_transpose`` (dilation 1) becomes its **phases**: output pixel
  ``o`` of a stride-s axis only meets the taps ``t`` with ``t = (o + pad) mod s`` (mod s), so the s_h * s_w
  phases are s_h * s_w small stride-1 convolutions over the input, of ceil(k / s) taps an axis. They are stacked
  as the output channels of one ``conv2d`` (tuned like any other), whose ``depth_to_space`` interleaves them and
  crops the pads -- ``k**2 / ceil(k / s)**2`` fewer multiply-adds than zero insertion (4x for the 4x4 stride-2
  layers of pose and super-resolution decoders). Channels are in DCR order (phase-major: a whole RGBA pixel
  per output pixel) with one group, CRD (channel-major: every group's channels together) with groups. Other
  layers (stride 1, dilation) are a stride-1 ``conv2d`` with the flipped, transposed weights, after zero
  insertion (``upsample_zeros``) where the stride is over 1 or the pads crop.
- ``hoist_channelwise``: a per-channel op after a ``depth_to_space`` (BatchNorm, an activation, a per-channel
  constant add / mul / sub / div, PReLU) runs before it instead, on the stacked channels (its constants
  repeated per phase), so that ``fold_batch_norm`` and ``fuse_epilogues`` put it in the convolution's epilogue.
- ``crd_to_dcr`` (run by ``passes.optimize`` after epilogue fusion): a CRD ``depth_to_space`` (PyTorch's
  PixelShuffle) of a groups=1 ``conv2d`` that nothing else reads becomes DCR, the convolution's output channels
  (weight rows, bias) permuted to phase-major order: the interleave then reads whole RGBA pixels, and the
  convolution can write it itself (``plan.views``).
"""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, Node
from tuner.graph.graph import add_param as _add_param, drop_unused_params as _drop_unused, fresh_name as _fresh


def _axis_phases(k: int, s: int, pad: int, size: int, n_in: int):
    """One axis of a stride-``s`` transposed convolution of ``k`` taps as phases: ``(taps, conv_pad, crop,
    conv_out)``. Phase p's stride-1 convolution has ``taps`` = ceil(k / s) taps, tap u holding the transposed
    kernel's tap ``p + (taps - 1 - u) * s`` (zero past k); it is padded ``conv_pad`` = (before, after) and makes
    ``conv_out`` outputs; the interleaved phases, cropped from ``crop``, are the ``size`` outputs."""
    taps = -(-k // s)
    first = min(pad // s, taps - 1)  # the first phase row the output needs, as far as a padding can reach back
    before = taps - 1 - first
    crop = pad - first * s
    need = -(-(crop + size) // s)
    after = max(0, need - n_in - before + taps - 1)
    return taps, (before, after), crop, n_in + before + after - taps + 1


def _phase_weights(w: np.ndarray, groups: int, stride, taps, dcr: bool) -> np.ndarray:
    """The stacked conv2d weights (O * sh * sw, C / groups, taps_h, taps_w) of ConvTranspose weights ``w``
    (C, O / groups, kh, kw): output channel ``phase * O + o`` (DCR) or ``o * sh * sw + phase`` (CRD)."""
    c, og, kh, kw = w.shape
    (sh, sw), (th, tw) = stride, taps
    o = groups * og
    out = np.zeros((o, sh * sw, c // groups, th, tw), np.float64)
    wg = np.asarray(w, np.float64).reshape(groups, c // groups, og, kh, kw)
    for ph in range(sh):
        for pw in range(sw):
            for uh in range(th):
                for uw in range(tw):
                    r, t = ph + (th - 1 - uh) * sh, pw + (tw - 1 - uw) * sw
                    if r < kh and t < kw:  # (groups, C/g, O/g) -> output channel o = gi * O/g + oc reads C/g
                        out[:, ph * sw + pw, :, uh, uw] = wg[:, :, :, r, t].transpose(0, 2, 1).reshape(o, c // groups)
    if dcr:
        out = out.transpose(1, 0, 2, 3, 4)  # phase-major
    return out.reshape(o * sh * sw, c // groups, th, tw).astype(np.float32)


def _phases(g: Graph, n: Node, nodes: list) -> bool:
    """``n`` (a strided conv_transpose of dilation 1) as a stacked conv2d and a depth_to_space; False when it is
    not one."""
    a = n.attrs
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    if (sh, sw) == (1, 1) or (dh, dw) != (1, 1):
        return False
    x, w_name = n.inputs[:2]
    w = np.asarray(g.params[w_name])
    groups = a.get("groups", 1)
    (pt, pl, _, _) = a["padding"]
    batch, _, h, wd = g.shapes[x]
    out_shape = g.shapes[n.outputs[0]]
    th, (bt, at), top, zh = _axis_phases(w.shape[2], sh, pt, out_shape[2], h)
    tw, (bl, al), left, zw = _axis_phases(w.shape[3], sw, pl, out_shape[3], wd)
    dcr = groups == 1
    o = out_shape[1]
    inputs = [x, _add_param(g, f"{w_name}.phases", _phase_weights(w, groups, (sh, sw), (th, tw), dcr))]
    if len(n.inputs) > 2:
        bias = np.asarray(g.params[n.inputs[2]], np.float32).reshape(-1)
        inputs.append(_add_param(g, f"{n.inputs[2]}.phases", _per_phase(bias, sh * sw, "DCR" if dcr else "CRD")))
    stacked = _fresh(g, f"{n.name}.phases")
    g.shapes[stacked] = (batch, o * sh * sw, zh, zw)
    nodes.append(Node("conv2d", f"{n.name}.phases", inputs, [stacked],
                      {"stride": (1, 1), "padding": (bt, bl, at, al), "dilation": (1, 1), "groups": groups}))
    nodes.append(Node("depth_to_space", n.name, [stacked], list(n.outputs),
                      {"block": (sh, sw), "mode": "DCR" if dcr else "CRD", "crop": (top, left),
                       "size": tuple(out_shape[2:])}))
    return True


def lower_conv_transpose(graph: Graph) -> Graph:
    """Every ``conv_transpose`` as convolutions: phases (strided, dilation 1) or zero insertion."""
    if not any(n.op == "conv_transpose" for n in graph.nodes):
        return graph
    g = graph.copy()
    nodes = []
    for n in g.nodes:
        if n.op != "conv_transpose":
            nodes.append(n)
            continue
        if _phases(g, n, nodes):
            continue
        a = n.attrs
        x, w_name = n.inputs[:2]
        w = np.asarray(g.params[w_name])
        c, og, r, s = w.shape
        groups = a.get("groups", 1)
        # conv weight (O, C/groups, R, S): per group transposed, spatially flipped
        wc = w.reshape(groups, c // groups, og, r, s).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
        wc = wc.reshape(groups * og, c // groups, r, s)
        (sh, sw), (dh, dw), (pt, pl, pb, pr), (oph, opw) = a["stride"], a["dilation"], a["padding"], \
            a.get("output_padding", (0, 0))
        _, _, h, wd = g.shapes[x]
        begin = (dh * (r - 1) - pt, dw * (s - 1) - pl)
        end = (dh * (r - 1) - pb + oph, dw * (s - 1) - pr + opw)
        shift = tuple(max(-v, 0) for v in begin)
        crop = tuple(max(-v, 0) for v in end)
        size = ((h - 1) * sh + 1 - shift[0] - crop[0], (wd - 1) * sw + 1 - shift[1] - crop[1])
        src = x
        if (sh, sw) != (1, 1) or any(shift) or any(crop):
            src = _fresh(g, f"{n.name}.upsampled")
            g.shapes[src] = (g.shapes[x][0], c, *size)
            nodes.append(Node("upsample_zeros", f"{n.name}.upsample", [x], [src],
                              {"size": size, "stride": (sh, sw), "shift": shift}))
        pads = (max(begin[0], 0), max(begin[1], 0), max(end[0], 0), max(end[1], 0))
        nodes.append(Node("conv2d", n.name, [src, _add_param(g, f"{w_name}.conv", wc), *n.inputs[2:]],
                          list(n.outputs), {"stride": (1, 1), "padding": pads, "dilation": (dh, dw),
                                            "groups": groups}))
    g.nodes = nodes
    return _drop_unused(g).validate()


# -- per-channel ops before the interleave ------------------------------------------------------------------
CHANNELWISE_UNARY = ("relu", "clip", "activation")
CHANNELWISE_CONST = ("add", "mul", "sub", "div", "prelu")


def _per_phase(flat: np.ndarray, blocks: int, mode: str) -> np.ndarray:
    """A per-channel vector on the stacked channels of ``blocks`` phases, in ``mode``'s channel order: DCR
    (phase-major) repeats the whole vector, CRD (channel-major) each value."""
    return np.tile(flat, blocks) if mode == "DCR" else np.repeat(flat, blocks)


def _stacked(v: np.ndarray, c: int, blocks: int, mode: str):
    """A per-channel constant of ``c`` channels on the ``c * blocks`` stacked ones, in its own rank; None when
    it is not per channel."""
    v = np.asarray(v)
    if v.size == 1:
        return v
    if v.size != c or v.ndim not in (1, 3, 4) or v.shape[-3 if v.ndim >= 3 else 0] != c:
        return None
    out = _per_phase(v.reshape(-1), blocks, mode)
    return out.reshape(v.shape[:-3] + (c * blocks, 1, 1) if v.ndim >= 3 else (c * blocks,))


def _hoisted(g: Graph, d2s: Node, op: Node) -> Node | None:
    """``op`` (the single reader of ``d2s``'s output) rewritten to read ``d2s``'s input, or None."""
    src, mid = d2s.inputs[0], d2s.outputs[0]
    if op.inputs[0] != mid or mid in op.inputs[1:]:
        return None
    c, blocks = g.shapes[mid][1], g.shapes[src][1] // g.shapes[mid][1]
    if op.op in CHANNELWISE_UNARY and len(op.inputs) == 1:
        return Node(op.op, op.name, [src], [], dict(op.attrs))
    if op.op == "batch_norm" or op.op in CHANNELWISE_CONST:
        consts = op.inputs[1:]
        if not consts or any(t not in g.params for t in consts):
            return None
        ins = [src]
        for t in consts:
            v = _stacked(g.params[t], c, blocks, d2s.attrs["mode"])
            if v is None:
                return None
            ins.append(t if v.size == 1 else _add_param(g, f"{t}.phases", v))
        return Node(op.op, op.name, ins, [], dict(op.attrs))
    return None


def hoist_channelwise(graph: Graph) -> Graph:
    """Per-channel ops after a ``depth_to_space`` run before it (on its stacked channels), as long as they are the
    interleave's only reader."""
    if not any(n.op == "depth_to_space" for n in graph.nodes):
        return graph
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        for d2s in [n for n in g.nodes if n.op == "depth_to_space"]:
            mid = d2s.outputs[0]
            readers = g.consumers(mid)
            if mid in g.outputs or len(readers) != 1:
                continue
            op = readers[0]
            moved = _hoisted(g, d2s, op)
            if moved is None:
                continue
            inner = _fresh(g, f"{op.outputs[0]}.stacked")
            g.shapes[inner] = g.shapes[d2s.inputs[0]]
            moved.outputs = [inner]
            at = g.nodes.index(d2s)
            g.nodes = [n for n in g.nodes if n is not op and n is not d2s]
            g.nodes[at:at] = [moved, Node("depth_to_space", d2s.name, [inner], list(op.outputs), dict(d2s.attrs))]
            del g.shapes[mid]
            changed = True
            break
    return _drop_unused(g).validate()


# -- PixelShuffle's channel order ---------------------------------------------------------------------------------
def _dcr_order(c: int, blocks: int) -> np.ndarray:
    """The CRD channel (``c * blocks + phase``) at each DCR position (``phase * c + channel``)."""
    return np.arange(c * blocks).reshape(c, blocks).T.reshape(-1)


def _permutable(g: Graph, d2s: Node):
    """The convolution whose output channels can be put in DCR order for ``d2s`` (CRD), else None: a groups=1
    ``conv2d`` with constant weights (and bias), read only by ``d2s``, that adds no residual (another tensor's
    channels would need the same order)."""
    src = d2s.inputs[0]
    conv = g.producer(src)
    if d2s.attrs["mode"] != "CRD" or conv is None or conv.op != "conv2d" or src in g.outputs \
            or g.consumers(src) != [d2s] or conv.attrs.get("groups", 1) != 1 or conv.attrs.get("residual") \
            or conv.inputs[1] not in g.params:
        return None
    return conv


def crd_to_dcr(graph: Graph) -> Graph:
    """Every CRD ``depth_to_space`` whose convolution can be permuted (``_permutable``) as a DCR one."""
    if not any(n.op == "depth_to_space" and n.attrs["mode"] == "CRD" for n in graph.nodes):
        return graph
    g = graph.copy()
    for d2s in [n for n in g.nodes if n.op == "depth_to_space"]:
        conv = _permutable(g, d2s)
        if conv is None:
            continue
        bh, bw = d2s.attrs["block"]
        order = _dcr_order(g.shapes[d2s.outputs[0]][1], bh * bw)
        # the weights and the bias (the first param after them); an input gate reads input channels: as it is
        slope, old = conv.attrs.get("slope"), list(conv.inputs)  # a PReLU's slopes are per output channel too
        conv.inputs = [_add_param(g, f"{t}.dcr", np.asarray(g.params[t])[order])
                       if i == 1 or (i == 2 and t in g.params) or t == slope else t for i, t in enumerate(conv.inputs)]
        if slope is not None:
            conv.attrs["slope"] = conv.inputs[old.index(slope)]
        d2s.attrs = {**d2s.attrs, "mode": "DCR"}
    return _drop_unused(g).validate()
