"""Template-free examples from the source documents, built with the IR: read them in order to see
IR -> passes -> OpenCL. ``tuner example NAME --show-passes`` prints each pass's output."""
from __future__ import annotations

from .buffer import buffer
from .builder import Builder
from .kernel import Program
from .schedule import cache_read


def addone(shape=(32, 32, 4), dtype="float32") -> Program:
    """Texture RFC A0: ``Y = X + 1`` with ``X`` cached into texture scope first. Lowers to a data-shuffle
    kernel (X -> texture, one pixel per work-item) and the compute kernel reading the texture."""
    X, Y = buffer("X", shape, dtype), buffer("Y", shape, dtype)
    b = Builder()
    with b.loop("xo", shape[0] // 4, "group.0") as xo, b.loop("yo", shape[1] // 4, "local.0") as yo:
        with b.loop("xi", 4) as xi, b.loop("yi", 4) as yi, b.loop("c", shape[2], "vectorized") as c:
            b.store(Y, (xo * 4 + xi, yo * 4 + yi, c), X[xo * 4 + xi, yo * 4 + yi, c] + 1.0)
    return cache_read(b.kernel("addone", [X, Y]), X, "texture")


def nhwc_to_nchwc(shape=(2, 6, 5, 8), separator=False) -> Program:
    """RFC 0039: one NHWC compute definition, stored as NCHWc through a layout transform (a 2-D texture
    when ``separator`` adds AXIS_SEPARATORs)."""
    from .index_map import AXIS_SEPARATOR as SEP
    n_, h_, w_, c_ = shape
    A = buffer("A", shape)
    if separator:
        B = buffer("B", shape, scope="texture", layout=lambda n, h, w, c: [n, c // 4, h, SEP, w, SEP, c % 4])
    else:
        B = buffer("B", shape, layout=lambda n, h, w, c: [n, c // 4, h, w, c % 4])
    b = Builder()
    with b.loop("n", n_, "group.1") as n, b.loop("h", h_, "group.0") as h, b.loop("w", w_, "local.0") as w:
        with b.loop("co", c_ // 4) as co, b.loop("ci", 4, "vectorized") as ci:
            b.store(B, (n, h, w, co * 4 + ci), A[n, h, w, co * 4 + ci])
    k = b.kernel("nhwc_to_nchwc", [A, B])
    return Program(k.name, (k,), k.params)


# name -> (program factory, reference: {input name: array} -> {output name: array})
EXAMPLES = {
    "addone": (addone, lambda inputs: {"Y": inputs["X"] + 1}),
    "nhwc_to_nchwc": (nhwc_to_nchwc, lambda inputs: {"B": inputs["A"]}),
}
