"""The model's glue kernels (tuner/ops/kernels.py) on the test device against NumPy: texture, buffer and mixed
scopes, float32 and float16 storage, odd channel counts and batch 2. Inputs are uploaded with NaN in their
padding lanes (so no output may depend on them) and outputs start as NaN (so every element must be written)."""
from __future__ import annotations

import numpy as np
import pytest

from tuner.ops.kernels import (GLUE, binary_kernel, binary_reference, concat_kernel, concat_reference,
                                 elementwise_kernel, elementwise_reference, global_avg_pool_kernel, pool_kernel,
                                 pool_out_shape, pool_reference, reduce_kernel, reduce_reference, relayout_kernel,
                                 relayout_reference, unary_kernel,
                                 unary_reference)
from tuner.ir.layouts import default_layout
from tuner.runtime.opencl.launch import build
from tuner.codegen.packing import physical_shape
from tuner.runtime.opencl.memory import download, upload

TOL = {"float32": 1e-5, "float16": 1e-2}
# (input scopes, output scope): all texture, all buffer, texture in / buffer out, buffer in / texture out
SCOPES = [("texture", "texture"), ("buffer", "buffer"), ("texture", "buffer"), ("buffer", "texture")]
# (input scopes, output scope, dtype) for multi-input kernels; "mixed" alternates texture and buffer inputs
COMBOS = [("texture", "texture", "float32"), ("texture", "texture", "float16"), ("buffer", "buffer", "float32"),
          ("buffer", "buffer", "float16"), ("texture", "buffer", "float16"), ("mixed", "texture", "float32")]


def in_scopes(pattern: str, n: int) -> tuple:
    return tuple(("texture", "buffer")[i % 2] for i in range(n)) if pattern == "mixed" else (pattern,) * n


def _padded(buf, x: np.ndarray, fill: float) -> np.ndarray:
    """``x`` grown to whole pixels along its packed axis (1, or 0 for a 1-D bias), the new lanes ``fill``."""
    logical = buf.declared
    if logical.layout is None and not logical.is_texture:
        return x
    axis = 1 if x.ndim > 1 else 0
    shape = list(x.shape)
    shape[axis] = -(-shape[axis] // 4) * 4
    out = np.full(shape, fill, x.dtype)
    out[tuple(slice(0, s) for s in x.shape)] = x
    return out


def _physical(buf, x: np.ndarray, fill: float) -> np.ndarray:
    logical = buf.declared
    layout = logical.layout or default_layout(logical)
    padded = _padded(buf, x, fill)
    flat = layout.pack(padded) if layout is not None else padded
    return flat.reshape(physical_shape(buf))


def run(exe, device, inputs: dict, padded_outputs: bool = False) -> dict:
    """Run ``exe`` with NaN padding lanes in the inputs and NaN-filled outputs; returns the logical outputs
    (or, with ``padded_outputs``, outputs grown to whole pixels so their padding lanes can be checked)."""
    arrays = exe.upload_inputs()
    for b in exe.program.params:
        dtype = b.dtype.numpy
        if b.name in inputs:
            upload(device, arrays[b.name], _physical(b, np.asarray(inputs[b.name], dtype), np.nan))
        else:
            upload(device, arrays[b.name], np.full(physical_shape(b), np.nan, dtype))
    exe.launch(arrays)
    if not padded_outputs:
        return exe.outputs_of(arrays)
    out = {}
    for b in exe.outputs:
        logical = b.declared
        shape = _padded(b, np.zeros(logical.shape), 0).shape
        out[b.name] = logical.layout.unpack(download(device, arrays[b.name]), shape)
    return out


def rel_error(got, ref) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def draw(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


# -- elementwise ------------------------------------------------------------------------------------------
ELEMENTWISE = [("add", "none"), ("add", "relu"), ("add", "relu6"), ("add", "clip"), ("bias_add", "none"),
               ("bias_add", "relu6"), ("relu", "none"), ("relu6", "none"), ("clip", "none")]


@pytest.mark.parametrize("pattern,out_scope,dtype", COMBOS)
@pytest.mark.parametrize("op,activation", ELEMENTWISE)
def test_elementwise_matches_numpy(device, rng, op, activation, pattern, out_scope, dtype):
    shape, clip = (2, 7, 3, 5), (-0.5, 0.75)
    n_in = 1 if op in ("relu", "relu6", "clip") else 2
    k = elementwise_kernel(shape, op, dtype, in_scopes(pattern, n_in), out_scope, activation, clip,
                           max_work_group=device.info.max_work_group_size)
    names = [b.name for b in k.params[:-1]]
    xs = [draw(rng, shape if name != "B" else shape[1:2], dtype) * 3 for name in names]
    got = run(build(k, device), device, dict(zip(names, xs)))["Y"]
    ref = elementwise_reference(op, *xs, activation=activation, clip=clip)
    assert rel_error(got, ref) <= TOL[dtype]
    if op in ("relu6", "clip") or activation in ("relu6", "clip"):  # the clamp bites on this data
        lo, hi = (0, 6) if "relu6" in (op, activation) else clip
        assert got.min() >= lo and got.max() <= hi and (ref == hi).any()


@pytest.mark.parametrize("op", ["add", "bias_add"])
def test_elementwise_on_2d_rows_with_mixed_operand_scopes(device, rng, op):
    shape = (2, 13)
    k = elementwise_kernel(shape, op, "float32", ("texture", "buffer"), "buffer", "relu", max_work_group=8)
    assert k.params[1].scope == "global"
    names = [b.name for b in k.params[:-1]]
    xs = [draw(rng, shape if name != "B" else (13,), "float32") for name in names]
    got = run(build(k, device), device, dict(zip(names, xs)))["Y"]
    assert rel_error(got, elementwise_reference(op, *xs, activation="relu")) <= 1e-6


@pytest.mark.parametrize("clip", [(0.0, np.inf), (-np.inf, 0.5), (-np.inf, np.inf)])
def test_clip_with_an_open_side(device, rng, clip):
    """ONNX Clip with only min or only max: the infinite side is no clamp (and no ``inf`` literal in C)."""
    shape = (1, 5, 2, 3)
    x = draw(rng, shape, "float32")
    got = run(build(elementwise_kernel(shape, "clip", clip=clip, in_scopes="buffer", out_scope="buffer"), device),
              device, {"X": x})["Y"]
    np.testing.assert_array_equal(got, np.clip(x, *clip))


TOL_NEW = {"float32": 1e-5, "float16": 2e-2}
UNARY_FNS = ["sigmoid", "hardsigmoid(0.1666666716337204)", "hardswish", "tanh", "leaky_relu(0.1)", "elu(0.7)",
             "silu", "gelu", "erf"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("fn", UNARY_FNS)
def test_unary_activation_matches_numpy(device, rng, fn, scopes, dtype):
    shape = (2, 7, 3, 5) if fn != "gelu" else (3, 10)
    x = draw(rng, shape, dtype) * 3
    got = run(build(unary_kernel(shape, fn, dtype, *scopes, max_work_group=device.info.max_work_group_size),
                    device), device, {"X": x})["Y"]
    assert rel_error(got, unary_reference(fn, x)) <= TOL_NEW[dtype]


BINARY = [  # op, operand shapes (output (2, 7, 3, 5) unless 2-D), activation
    ("mul", [(2, 7, 3, 5), (2, 7, 1, 1)], "none"),  # squeeze-excitation's channel scale
    ("mul", [(2, 7, 3, 5), (1, 7, 1, 1)], "hardswish"),
    ("add", [(2, 7, 1, 1), (2, 7, 3, 5)], "relu"),
    ("sub", [(7,), (2, 7, 3, 5)], "none"),  # constant - activation
    ("div", [(2, 7, 3, 5), (2, 7, 1, 1)], "sigmoid"),
    ("mul", [(2, 7, 3, 5), (2, 7, 3, 5)], "none"),
    ("prelu", [(2, 7, 3, 5), (7,)], "none"),
    ("mul", [(2, 13), (13,)], "silu"),
    ("div", [(2, 7, 3, 5), (2, 7, 3, 1)], "none"),  # over W: a linear attention's normalizer
    ("mul", [(2, 7, 3, 5), (1, 1, 3, 5)], "none"),  # over the channels: MobileViT-v2's context scores
]


@pytest.mark.parametrize("pattern,out_scope,dtype", COMBOS)
@pytest.mark.parametrize("case", BINARY, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1][0]))}-{'x'.join(map(str, c[1][1]))}-{c[2]}")
def test_binary_broadcast_matches_numpy(device, rng, case, pattern, out_scope, dtype):
    op, operands, activation = case
    shape = next(o for o in operands if len(o) > 1 and o[-1] > 1)
    k = binary_kernel(shape, op, operands, dtype, in_scopes(pattern, 2), out_scope, activation,
                      max_work_group=device.info.max_work_group_size)
    xs = [draw(rng, o, dtype) + (3 if op == "div" and k_ == 1 else 0) for k_, o in enumerate(operands)]
    got = run(build(k, device), device, {"X0": xs[0], "X1": xs[1]})["Y"]
    assert rel_error(got, binary_reference(op, *xs, activation=activation)) <= TOL_NEW[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES)
@pytest.mark.parametrize("kind,keepdims", [("mean", True), ("mean", False), ("max", True), ("max", False)])
def test_reduce_over_spatial_axes(device, rng, kind, keepdims, scopes, dtype):
    shape = (2, 7, 4, 5)
    x = draw(rng, shape, dtype) - (5 if kind == "max" else 0)  # all negative: a zero start would win a max
    got = run(build(reduce_kernel(shape, kind, keepdims, dtype, *scopes), device), device, {"X": x})["Y"]
    assert rel_error(got, reduce_reference(x, kind, keepdims)) <= TOL_NEW[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("kind,axes", [("mean", (3,)), ("l2", (3,)), ("max", (2,))])
def test_reduce_over_one_spatial_axis(device, rng, kind, axes, scopes, dtype):
    """MobileViT-v2's ReduceSum over the last axis of its (N, C, P, T) patches: the kept axis joins the grid."""
    shape = (1, 6, 3, 7)
    x = draw(rng, shape, dtype) - (5 if kind == "max" else 0)
    got = run(build(reduce_kernel(shape, kind, True, dtype, *scopes, axes=axes), device), device, {"X": x})["Y"]
    assert got.shape == reduce_reference(x, kind, True, axes).shape
    assert rel_error(got, reduce_reference(x, kind, True, axes)) <= TOL_NEW[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (3, 10), (1, 8, 2, 2), (2, 3, 1, 1), (1, 1, 2, 3)])
def test_softmax_over_channels_ignores_padding_lanes(device, rng, shape, scopes, dtype):
    """The inputs' padding lanes are NaN (run() uploads them so): any leak into the max or sum shows. The
    softmax template (templates/channel_reduce.py), two work-items a row where the row has two blocks."""
    from tuner.templates import get_template
    t = get_template("softmax")
    wl = t.workload(data=shape, dtype=dtype)
    cfg = t.config(wg_reduce=2 if shape[1] > 4 else 1, units_per_wg=2, split=1, input_scope=scopes[0],
                   weight_scope=scopes[0], output_scope=scopes[1])
    x = draw(rng, shape, dtype) * 4
    got = run(build(t.build(wl, cfg), device), device, {"X": x}, padded_outputs=True)["Y"]
    softmax_reference = lambda x: t.reference(wl, {"X": x})  # noqa: E731
    assert rel_error(got[:, :shape[1]], softmax_reference(x)) <= TOL_NEW[dtype]
    assert (got[:, shape[1]:] == 0).all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", [((1, 5, 10, 9), "max", 3, 2, 0, False), ((1, 5, 6, 6), "avg", 3, 2, 1, True),
                                  ((2, 3, 7, 6), "avg", 2, 2, (0, 1, 0, 1), False)], ids=str)
def test_pool_ceil_mode(device, rng, case, dtype):
    shape, kind, kernel, stride, padding, include = case
    x = draw(rng, shape, dtype)
    k = pool_kernel(shape, kind, kernel, stride, padding, include, dtype, "buffer", "texture", ceil_mode=True)
    got = run(build(k, device), device, {"X": x})["Y"]
    assert got.shape == pool_out_shape(shape, kernel, stride, padding, ceil_mode=True) != \
        pool_out_shape(shape, kernel, stride, padding)
    assert rel_error(got, pool_reference(x, kind, kernel, stride, padding, include, ceil_mode=True)) <= TOL_NEW[dtype]


# -- pooling ----------------------------------------------------------------------------------------------
POOLS = [  # shape, kind, kernel, stride, padding, count_include_pad
    ((1, 5, 14, 13), "max", 3, 2, 1, False),  # MobileNet/ResNet stem max pool, small
    ((2, 3, 8, 9), "max", 2, 2, 0, False),
    ((2, 3, 8, 9), "avg", 3, 2, (1, 0, 1, 1), False),
    ((2, 3, 8, 9), "avg", 3, 2, (1, 0, 1, 1), True),
    ((1, 7, 6, 7), "avg", 2, 1, (1, 1, 0, 0), False),
    ((2, 7, 7, 7), "avg", 7, 1, 0, False),  # global average pool, 7x7 window, 1x1 output
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("case", POOLS, ids=lambda c: f"{c[1]}{c[2]}s{c[3]}p{c[4]}{'i' if c[5] else ''}-{c[0][1]}")
def test_pool_matches_numpy(device, rng, case, scopes, dtype):
    shape, kind, kernel, stride, padding, include = case
    k = pool_kernel(shape, kind, kernel, stride, padding, include, dtype, *scopes,
                    max_work_group=device.info.max_work_group_size)
    x = draw(rng, shape, dtype)
    got = run(build(k, device), device, {"X": x})["Y"]
    ref = pool_reference(x, kind, kernel, stride, padding, include)
    assert got.shape == pool_out_shape(shape, kernel, stride, padding)
    assert rel_error(got, ref) <= TOL[dtype]


NORMED_POOLS = [  # shape, groups, chunks, kind, kernel, stride, padding, count_include_pad, activation
    ((2, 8, 6, 7), 1, 4, "avg", 3, 1, 1, False, "none"),  # PoolFormer's GroupNorm(1) before its pool
    ((1, 6, 5, 5), 6, 2, "avg", 3, 1, 1, True, "relu"),  # an InstanceNorm, zero padding counted
    ((2, 16, 5, 6), 2, 1, "max", 3, 2, 1, False, "relu"),  # groups of 8 channels (two blocks), then a max pool
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("case", NORMED_POOLS, ids=lambda c: f"g{c[1]}-{c[3]}{c[4]}s{c[5]}-{c[8]}")
def test_pool_reads_its_input_normalized(device, rng, case, scopes, dtype):
    """``in_norm``: the pool of a GroupNorm's output read from the norm's input, its statistics from the chunk
    partials of ``group_norm``'s ``stats`` (``reduction.chunk_statistics``) and the affine and activation applied
    to each value read; with an avg pool, ``post_normed`` and ``residual_scale``: PoolFormerV2's
    ``x * r + ls * (pool(n(y)) - n(y))`` from y."""
    from tuner.templates.common import group_normed
    from tuner.templates.reduction import chunk_statistics
    shape, groups, chunks, kind, kernel, stride, padding, include, act = case
    mixer = kind == "avg"
    k = pool_kernel(shape, kind, kernel, stride, padding, include, dtype, *scopes, device.info.max_work_group_size,
                    post=("sub", scopes[0]) if mixer else None, scale=mixer, residual_scope=scopes[0] if mixer else None,
                    in_norm=(groups, chunks, 1e-5, act), post_normed=mixer, residual_scale=mixer)
    y = (draw(rng, shape, dtype) * 2 + 3).astype(dtype)  # a mean far from zero: the partials' shift matters
    c4 = -(-shape[1] // 4)
    affine = np.zeros((2, c4 * 4), np.float32)
    affine[:, :shape[1]] = rng.standard_normal((2, shape[1]))
    q = chunk_statistics(y, chunks, groups).astype(np.float32)
    inputs = {"X": y, "Q": q, "A": affine.reshape(2 * c4, 4)}
    normed = group_normed(y, affine, groups, 1e-5, act)
    want = pool_reference(normed, kind, kernel, stride, padding, include)
    if mixer:
        s, res, rs = draw(rng, (shape[1],), dtype), draw(rng, shape, dtype), draw(rng, (shape[1],), dtype)
        inputs.update(P=y, S=s, R=res, RS=rs)
        want = (want - normed) * np.asarray(s, np.float64).reshape(1, -1, 1, 1) + res * np.asarray(
            rs, np.float64).reshape(1, -1, 1, 1)
    raw = pool_reference(y, kind, kernel, stride, padding, include)  # the pool of the input, not normalized
    if mixer:
        raw = (raw - y) * np.asarray(s, np.float64).reshape(1, -1, 1, 1) + res
    got = run(build(k, device), device, inputs)["Y"]
    assert rel_error(got, want) <= TOL_NEW[dtype]
    assert rel_error(got, raw) > 0.1


def test_avg_pool_padding_counts_differ(device, rng):
    """count_include_pad changes the border divisors (a kernel ignoring it would pass only one of the two)."""
    shape, x = (1, 4, 5, 5), np.abs(draw(rng, (1, 4, 5, 5), "float32")) + 1
    outs = [run(build(pool_kernel(shape, "avg", 3, 1, 1, inc, in_scope="buffer", out_scope="buffer"), device),
                device, {"X": x})["Y"] for inc in (False, True)]
    np.testing.assert_allclose(outs[0][..., 1:-1, 1:-1], outs[1][..., 1:-1, 1:-1], rtol=1e-6)
    np.testing.assert_allclose(outs[1][..., 0, 0], outs[0][..., 0, 0] * 4 / 9, rtol=1e-6)


@pytest.mark.parametrize("shape", [(2, 5, 7, 7), (1, 3, 1, 1), (1, 6, 3, 10)])
def test_global_avg_pool_is_the_channel_mean(device, rng, shape):
    x = draw(rng, shape, "float32")
    got = run(build(global_avg_pool_kernel(shape, in_scope="texture", out_scope="buffer"), device), device,
              {"X": x})["Y"]
    assert got.shape == (*shape[:2], 1, 1)
    np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


# -- concat -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,out_scope,dtype", COMBOS)
@pytest.mark.parametrize("channels", [(3, 5, 8), (1, 2, 7), (4, 8)])
def test_concat_matches_numpy(device, rng, channels, pattern, out_scope, dtype):
    shapes = [(2, c, 3, 4) for c in channels]
    k = concat_kernel(shapes, dtype, in_scopes(pattern, len(shapes)), out_scope,
                      max_work_group=device.info.max_work_group_size)
    xs = [draw(rng, s, dtype) for s in shapes]
    got = run(build(k, device), device, {f"X{i}": x for i, x in enumerate(xs)}, padded_outputs=True)["Y"]
    total = sum(channels)
    assert rel_error(got[:, :total], concat_reference(*xs)) <= TOL[dtype]
    assert (got[:, total:] == 0).all()  # padding lanes are written zero


@pytest.mark.parametrize("scopes,out_scope", [(("buffer", "texture", "buffer"), "buffer"), ("texture", "texture")])
@pytest.mark.parametrize("flat", [False, True])
def test_concat_reads_slices_in_place_and_writes_tokens(device, rng, scopes, out_scope, flat):
    """``in_views``: parts read as channels offset.. of larger tensors, at offsets inside a pixel too (EdgeNeXt's
    split of 88 channels into 30, 30 and 28, passed to its concat in place); ``flat``: the concat written as the
    token tensor (N, C, 1, H * W) its reshape reads. Padding lanes are written zero."""
    shapes, views = [(2, 6, 3, 5), (2, 5, 3, 5), (2, 3, 3, 5)], [(13, 7), (), (9, 6)]
    k = concat_kernel(shapes, "float32", scopes, out_scope, max_work_group=device.info.max_work_group_size,
                      in_views=views, flat=flat)
    full = [draw(rng, (2, v[0], 3, 5) if v else s, "float32") for s, v in zip(shapes, views)]
    got = run(build(k, device), device, {f"X{i}": x for i, x in enumerate(full)}, padded_outputs=True)["Y"]
    want = concat_reference(*[x[:, v[1]:v[1] + s[1]] if v else x for x, s, v in zip(full, shapes, views)])
    assert got.shape == ((2, 16, 1, 15) if flat else (2, 16, 3, 5))
    assert rel_error(got[:, :14], want.reshape(got[:, :14].shape)) <= 1e-6
    assert (got[:, 14:] == 0).all()
    with pytest.raises(ValueError, match="within the channels"):
        concat_kernel(shapes, in_views=[(13, 8), (), ()])


def test_concat_of_mixed_scopes_and_rows(device, rng):
    shapes = [(2, 3), (2, 6), (2, 1)]
    k = concat_kernel(shapes, "float32", ("buffer", "texture", "buffer"), "texture", max_work_group=3)
    assert k.launch()[1][0] == 2  # a power of two within the device's limit
    xs = [draw(rng, s, "float32") for s in shapes]
    got = run(build(k, device), device, {f"X{i}": x for i, x in enumerate(xs)})["Y"]
    assert rel_error(got, concat_reference(*xs)) == 0


# -- relayout ---------------------------------------------------------------------------------------------
PLAIN, TEX4, BUF4 = ("buffer", None), ("texture", "nchw4c"), ("buffer", "nchw4c_buffer")
TEXR, BUFR = ("texture", "row4"), ("buffer", "row4_buffer")
RELAYOUTS = [  # in shape, out shape, (in scope, in layout), (out scope, out layout)
    ((2, 5, 3, 4), (2, 5, 3, 4), PLAIN, TEX4),  # model input upload
    ((2, 5, 3, 4), (2, 5, 3, 4), PLAIN, BUF4),
    ((2, 7, 3, 2), (2, 7, 3, 2), TEX4, PLAIN),  # model output download
    ((2, 7, 3, 2), (2, 7, 3, 2), BUF4, PLAIN),
    ((2, 7), (2, 7), PLAIN, TEXR),  # classifier input / output
    ((2, 7), (2, 7), PLAIN, BUFR),
    ((2, 7), (2, 7), TEXR, PLAIN),
    ((2, 7), (2, 7), BUFR, PLAIN),
    ((2, 5, 3, 3), (2, 5, 3, 3), TEX4, BUF4),  # texture <-> buffer, whole pixels
    ((2, 5, 3, 3), (2, 5, 3, 3), BUF4, TEX4),
    ((2, 9), (2, 9), TEXR, BUFR),
    ((1, 1280, 1, 1), (1, 1280), TEX4, TEXR),  # Flatten after global pooling: whole pixels
    ((2, 5, 1, 1), (2, 5), TEX4, BUFR),
    ((2, 5, 1, 1), (2, 5), BUF4, PLAIN),
    ((2, 3, 3, 2), (2, 18), TEX4, TEXR),  # Flatten of a spatial tensor: lanes gathered
    ((2, 3, 3, 2), (2, 18), BUF4, BUFR),
    ((2, 18), (2, 3, 3, 2), TEXR, BUF4),  # Reshape back
    ((2, 18), (2, 2, 3, 3), BUFR, TEX4),
    ((2, 5, 3, 3), (2, 45), PLAIN, PLAIN),
    ((3, 7), (1, 3, 7, 1), PLAIN, TEX4),
]


def _rid(c):
    return f"{'x'.join(map(str, c[0]))}-{c[2][1] or 'plain'}{c[2][0][0]}-to-{'x'.join(map(str, c[1]))}-" \
           f"{c[3][1] or 'plain'}{c[3][0][0]}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", RELAYOUTS, ids=_rid)
def test_relayout_copies_elements_in_logical_order(device, rng, case, dtype):
    in_shape, out_shape, (in_scope, in_layout), (out_scope, out_layout) = case
    k = relayout_kernel(in_shape, out_shape, dtype, in_scope, in_layout, out_scope, out_layout,
                        max_work_group=device.info.max_work_group_size)
    x = draw(rng, in_shape, dtype)
    padded = out_layout is not None
    got = run(build(k, device), device, {"X": x}, padded_outputs=padded)["Y"]
    if padded:
        got, pad = got[:, :out_shape[1]], got[:, out_shape[1]:]
        assert (pad == 0).all()
    # a copy: exact in either storage type
    assert np.array_equal(got, relayout_reference(x, out_shape).astype(dtype))


def test_relayout_whole_pixel_copy_reads_one_pixel_per_work_item():
    k = relayout_kernel((1, 1280, 1, 1), (1, 1280), "float16", "texture", "nchw4c", "buffer", "row4_buffer", 256)
    src = build(k).source
    assert src.count("read_imagef") == 1 and "vstore_half4" in src
    assert k.launch() == ((320, 1, 1), (64, 1, 1))


# -- bad input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,match", [
    (lambda: elementwise_kernel((1, 4, 2, 2), "mul"), "elementwise op 'mul'"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "add", activation="swish"), "activation 'swish'"),
    (lambda: unary_kernel((1, 4, 2, 2), "softplus"), "activation 'softplus'"),
    (lambda: binary_kernel((1, 4, 2, 2), "pow", [(1, 4, 2, 2)] * 2), "binary op 'pow'"),
    (lambda: binary_kernel((1, 4, 2, 2), "mul", [(1, 4, 2, 2), (1, 2, 2, 2)]), "does not broadcast"),
    (lambda: binary_kernel((1, 4, 2, 2), "mul", [(4,), (1, 4, 1, 1)]), "neither has that shape"),
    (lambda: reduce_kernel((1, 4), "mean"), "want 4-D NCHW"),
    (lambda: reduce_kernel((1, 4, 2, 2), "sum"), "'mean' or 'max'"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "relu", activation="relu6"), "itself the activation"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "add", in_scopes=("texture",)), "takes 2 inputs"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "clip", clip=(1, 0)), "lo <= hi"),
    (lambda: elementwise_kernel((1, 4, 2), "relu"), "4-D NCHW or 2-D"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "relu", out_scope="image"), "use 'texture' or 'buffer'"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "relu", dtype="int8"), "float32, float16"),
    (lambda: elementwise_kernel((1, 4, 2, 2), "relu", max_work_group=0), "max_work_group"),
    (lambda: pool_kernel((1, 4, 5, 5), "min", 3), "'max' or 'avg'"),
    (lambda: pool_kernel((1, 4, 5, 5), "max", 3, 1, (3, 0, 0, 0)), "smaller than the window"),
    (lambda: pool_kernel((1, 4, 2, 2), "avg", 3), "larger than the padded input"),
    (lambda: concat_kernel([(1, 4, 2, 2), (1, 4, 3, 2)]), "must agree on every axis but 1"),
    (lambda: relayout_kernel((1, 4, 2, 2), (1, 15)), "element counts differ"),
    (lambda: relayout_kernel((1, 4, 2, 2), (1, 16), out_scope="texture", out_layout="nchw4c"), "use layout 'row4'"),
    (lambda: relayout_kernel((1, 4, 2, 2), (1, 16), in_scope="texture", in_layout=None), "use layout 'nchw4c'"),
    (lambda: relayout_kernel((2, 8), (1, 2, 8), out_scope="buffer", out_layout="row4_buffer"),
     "4-D .nchw4c. or 2-D .row4. shape or None"),
])
def test_bad_arguments_name_the_problem(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_registry_pairs_kernels_with_references():
    assert set(GLUE) == {"elementwise", "pool", "concat", "relayout", "unary", "binary", "reduce"}
    assert all(callable(k) and callable(r) for k, r in GLUE.values())


@pytest.mark.parametrize("pattern,out_scope,dtype", COMBOS)
def test_binary_epilogue_scale_then_residual(device, rng, pattern, out_scope, dtype):
    """``act((X0 op X1) * S + R)``: PoolFormer's token mixer ``x + ls * (pool(y) - y)`` as one kernel, the
    residual stored in its own scope."""
    shape = (2, 7, 3, 5)
    k = binary_kernel(shape, "sub", [shape, shape], dtype, in_scopes(pattern, 2), out_scope, "relu",
                      max_work_group=device.info.max_work_group_size, scale=True,
                      residual_scope=in_scopes(pattern, 2)[1])
    x0, x1, res = (draw(rng, shape, dtype) for _ in range(3))
    s = draw(rng, (7,), dtype)
    got = run(build(k, device), device, {"X0": x0, "X1": x1, "S": s, "R": res})["Y"]
    want = binary_reference("sub", x0, x1, "relu", scale=s, residual=res)
    assert rel_error(got, want) <= TOL_NEW[dtype]
    assert rel_error(got, binary_reference("sub", x0, x1, "relu")) > 0.1  # the epilogue changes the answer


@pytest.mark.parametrize("pattern,out_scope,dtype", COMBOS)
def test_pool_epilogue_is_poolformers_token_mixer(device, rng, pattern, out_scope, dtype):
    """``(pool(X) - P) * S + R`` in the pooling kernel: PoolFormer's ``x + ls * (pool(y) - y)`` with P = y."""
    shape = (2, 7, 5, 6)
    sc = in_scopes(pattern, 2)
    k = pool_kernel(shape, "avg", 3, 1, 1, False, dtype, sc[0], out_scope, device.info.max_work_group_size,
                    post=("sub", sc[0]), scale=True, residual_scope=sc[1])
    y, res = draw(rng, shape, dtype), draw(rng, shape, dtype)
    s = draw(rng, (7,), dtype)
    got = run(build(k, device), device, {"X": y, "P": y, "S": s, "R": res})["Y"]
    yy = np.asarray(y, np.float64)
    want = (pool_reference(yy, "avg", 3, 1, 1) - yy) * np.asarray(s, np.float64).reshape(1, -1, 1, 1) + res
    assert rel_error(got, want) <= TOL_NEW[dtype]
