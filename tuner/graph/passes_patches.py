"""MobileViT's unfold into patches and fold back written by the convolutions before them
(``convolutions_write_patches``, ``Graph -> Graph``): no copy kernel for either.

A MobileViT block runs its transformer on the (patch position, patch) layout of an image: an unfold after a 1x1
convolution (reshape, transpose, reshape: one strided copy), and after the transformer's last convolution the fold
back. Each copy only moves every pixel of a channel to another place; a 1x1 convolution that is the copy's only
source writes each output pixel at that place itself (``Conv2dWorkload.patch_view``, the positions of
``ir.layouts.patch_position``). timm's MobileViTv2 has three of each.

Taken where the copy is exactly the unfold or the fold of some ph x pw patches (checked on the index arrays), its
source is read by nothing else, and is a 1x1 convolution of groups 1 (the direct template's store) whose output no
other view moves. Run after the norms' passes, which move a GroupNorm(1) past the fold first."""
from __future__ import annotations

import numpy as np

from tuner.graph.graph import Graph, only_reader
from tuner.graph.reference_movement import copy_sources
from tuner.ir.layouts import apply_patch_view

_MOVED = ("shuffle_view", "patch_view", "out_view")  # a producer whose output a view moves already


def _view(g: Graph, copy) -> tuple | None:
    """The ``patch_view`` that the strided copy ``copy`` is, else None."""
    src, out = tuple(g.shapes[copy.inputs[0]]), tuple(g.shapes[copy.outputs[0]])
    if len(src) != 4 or len(out) != 4 or src[:2] != out[:2] or int(np.prod(src)) != int(np.prod(out)):
        return None
    try:
        moved = copy_sources(copy, src).reshape(out)
    except (KeyError, ValueError):
        return None
    index = np.arange(int(np.prod(src))).reshape(src)
    (h, w), (oh, ow) = src[2:], out[2:]
    for ph in range(1, max(h, oh) + 1):
        for kind, p, image in (("unfold", oh, (h, w)), ("fold", h, (oh, ow))):
            if p % ph or image[0] % ph or image[1] % (p // ph):
                continue
            pw = p // ph
            view = (kind, ph, pw, image[1] // pw)
            try:
                if np.array_equal(apply_patch_view(view, index), moved):
                    return view
            except ValueError:
                continue
    return None


def convolutions_write_patches(graph: Graph) -> Graph:
    g = graph.copy()
    moved = 0
    for copy in list(g.nodes):
        if copy.op != "strided_copy" or len(copy.inputs) != 1:
            continue
        conv = g.producer(copy.inputs[0])
        if conv is None or conv.op != "conv2d" or copy.inputs[0] in g.outputs \
                or not only_reader(g, copy.inputs[0], copy) or conv.attrs.get("groups", 1) != 1 \
                or tuple(g.shapes[conv.inputs[1]][2:]) != (1, 1) or any(k in conv.attrs for k in _MOVED):
            continue
        view = _view(g, copy)
        if view is None:
            continue
        conv.attrs = {**conv.attrs, "patch_view": view}
        conv.outputs = list(copy.outputs)
        g.nodes = [n for n in g.nodes if n is not copy]
        moved += 1
    return g.validate() if moved else graph
