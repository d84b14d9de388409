"""Channel gathers over tensors packed by 4 along axis 1 (NCHW4c): the form of a gather's index map
(``channel_map``) and one output pixel of a gather (``gather_pixel``), written over the IR. The slice glue kernel
(``tuner.ops.kernels_movement``) and a convolution that also copies a concat's other part
(``Conv2dWorkload.side_copy``) share them, so they live below both."""
from __future__ import annotations

import numpy as np

from tuner.ir.expr import ExtractLane, Ramp, as_expr, call, max_, min_, select


def make_vector(lanes: list):
    return call("make_vector", lanes, "float32x4")


def pixel_index(idx) -> tuple:
    """Logical indices of a whole pixel at grid point ``idx``: the 4 lanes of block ``idx[1]``."""
    return (idx[0], Ramp(idx[1] * 4, as_expr(1), 4), *idx[2:])


def pixel_block(x, n, cb, rest):
    """The whole pixel of channel block ``cb`` of ``x`` at batch ``n`` and spatial indices ``rest``."""
    return x[pixel_index([n, cb, *rest])]


def lane(pix, which):
    """Lane ``which`` (an int expression in 0..3) of the 4-lane value ``pix``."""
    return select(which.equal(0), ExtractLane(pix, 0), select(which.equal(1), ExtractLane(pix, 1),
                  select(which.equal(2), ExtractLane(pix, 2), ExtractLane(pix, 3))))


def shifted_pixel(b, x, n, cb, rest, shift: int, channels: int, name: str):
    """The 4 channels ``4 * cb - shift`` .. ``+ 3`` of ``x`` (``channels`` channels; its block indices clamped into
    it) at batch ``n`` and spatial indices ``rest``: one whole-pixel load where ``shift`` is a multiple of 4, else
    two, the lanes taken from each (``shift`` = 4q + s: lane j reads block ``cb - q`` at lane ``j - s`` when j >= s,
    else block ``cb - q - 1`` at lane ``j - s + 4``). A channel slice at any offset read in place: the concat and
    elementwise glue kernels' ``in_views``, a depthwise convolution's ``in_add``. Lanes past ``channels`` are
    whatever the clamped loads hold."""
    q, s = divmod(shift, 4)
    last = -(-channels // 4) - 1
    block = lambda d: min_(max_(cb - q - d, 0), last)  # noqa: E731 - clamped: stays in bounds
    hi = b.let(f"{name}_hi", x[pixel_index([n, block(0), *rest])])
    if not s:
        return hi
    lo = b.let(f"{name}_lo", x[pixel_index([n, block(1), *rest])])
    return make_vector([ExtractLane(hi, j - s) if j >= s else ExtractLane(lo, j - s + 4) for j in range(4)])


def zero_padding_lanes(b, v, cb, C: int, name: str = "v"):
    """``v`` (a whole pixel of block ``cb``) with the lanes past channel ``C`` set to zero."""
    if C % 4 == 0:
        return v
    pix = b.let(name, v)
    return make_vector([ExtractLane(pix, j) if j < C % 4 else select(cb * 4 + j < C, ExtractLane(pix, j), 0.0)
                        for j in range(4)])


def channel_map(index) -> tuple | None:
    """``(m, a, b, off)`` with ``index[c] == (c % m) * a + (c // m) * b + off`` for every c, or None."""
    idx = np.asarray(index, np.int64).reshape(-1)
    n = len(idx)
    c = np.arange(n)
    for m in [n] + [k for k in range(1, n) if n % k == 0] + [k for k in range(1, n) if n % k]:
        off = int(idx[0])
        a = int(idx[1] - idx[0]) if m > 1 and n > 1 else 0
        b = int(idx[m] - idx[0]) if n > m else 0
        if np.array_equal((c % m) * a + (c // m) * b + off, idx):
            return m, a, b, off
    return None


def gather_pixel(b, X, C: int, n, cb, rest: list, channels, name: str = ""):
    """Output pixel ``cb`` of the channel gather ``channels`` of ``X`` (``C`` channels) at batch ``n`` and spatial
    indices ``rest``: contiguous channels (``channels[k] = off + k``) read at most two whole pixels, other maps one
    pixel per lane; lanes past the gather's end are zero. ``name`` prefixes the lets (a kernel that gathers more
    than once)."""
    m, a, bb, off = channel_map(channels)
    Cout, last = len(channels), -(-C // 4) - 1
    if a == 1 and m >= Cout:  # contiguous channels: a lane shift of at most two whole pixels
        q, s = divmod(off, 4)
        hi = b.let(f"{name}hi", pixel_block(X, n, cb + q, rest))
        if s == 0:
            return zero_padding_lanes(b, hi, cb, Cout, f"{name}v")
        lo = b.let(f"{name}lo", pixel_block(X, n, min_(cb + q + 1, last), rest))
        v = make_vector([ExtractLane(hi, j + s) if j + s < 4 else ExtractLane(lo, j + s - 4) for j in range(4)])
        return zero_padding_lanes(b, v, cb, Cout, f"{name}v")
    lanes = []
    for j in range(4):
        c = min_(cb * 4 + j, Cout - 1) if Cout % 4 else cb * 4 + j
        src = b.let(f"{name}c{j}", c * a + off if m >= Cout else (c % m) * a + (c // m) * bb + off)
        v = lane(b.let(f"{name}x{j}", pixel_block(X, n, src // 4, rest)), src % 4)
        lanes.append(select(cb * 4 + j < Cout, v, 0.0) if Cout % 4 and j >= Cout % 4 else v)
    return make_vector(lanes)
