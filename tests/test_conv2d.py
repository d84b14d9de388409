"""conv2d_nchw4c: one template, texture and buffer scopes, float32 and float16 storage, fused epilogues,
checked against NumPy on PoCL with random data."""
import numpy as np
import pytest

from tuner.runtime.opencl.launch import build
from tuner.templates.common import Conv2dWorkload, reference
from tuner.templates.conv2d_nchw4c import Conv2dConfig, conv2d_nchw4c

BUFFERS = dict(input_scope="buffer", weight_scope="buffer", output_scope="buffer")
CASES = [
    ("odd channels, 3x3, bias+relu6, texture", Conv2dWorkload((1, 5, 9, 11), (6, 5, 3, 3), 1, 1, bias=True,
                                                                activation="relu6"), Conv2dConfig()),
    ("1x1, batch 2, buffer, 2x4 tile", Conv2dWorkload((2, 8, 8, 8), (8, 8, 1, 1)),
     Conv2dConfig(tile_oc=2, tile_ow=4, wg_w=2, **BUFFERS)),
    ("5x5 stride 2 asymmetric pad, residual, half, MACE layouts",
     Conv2dWorkload((1, 3, 10, 10), (9, 3, 5, 5), 2, (2, 1, 1, 2), residual=True, dtype="float16"),
     Conv2dConfig(tile_oh=2, tile_oc=2, act_layout="mace_channel_major", weight_layout="mace_conv2d_filter")),
    ("dilation 2, buffer input, serial window", Conv2dWorkload((1, 4, 12, 12), (4, 4, 3, 3), 1, 2, dilation=2),
     Conv2dConfig(input_scope="buffer", unroll_rs=False, wg_h=2)),
    ("7x7 stride 2, relu, texture in / buffer out", Conv2dWorkload((1, 3, 17, 15), (7, 3, 7, 7), 2, 3,
                                                                     bias=True, activation="relu"),
     Conv2dConfig(output_scope="buffer", tile_ow=1, wg_w=4)),
]


@pytest.mark.parametrize("name,wl,cfg", CASES, ids=[c[0] for c in CASES])
def test_conv2d_matches_numpy(device, rng, name, wl, cfg):
    exe = build(conv2d_nchw4c(wl, cfg), device)
    x = rng.standard_normal(wl.data).astype(wl.dtype)
    w = rng.standard_normal(wl.kernel).astype(wl.dtype)
    inputs = {"X": x, "Wt": w}
    bias = inputs.setdefault("B", rng.standard_normal(wl.kernel[0]).astype(wl.dtype)) if wl.bias else None
    res = inputs.setdefault("Res", rng.standard_normal(wl.out_shape).astype(wl.dtype)) if wl.residual else None
    y = exe(**inputs)["Y"].astype(np.float64)
    ref = reference(wl, x, w, bias, res)
    tol = 1e-2 if wl.dtype == "float16" else 1e-4
    assert y.shape == wl.out_shape
    assert np.abs(y - ref).max() / np.abs(ref).max() < tol
    src = exe.source
    assert ("read_imagef(X" in src) == (cfg.input_scope == "texture")
    assert ("write_imagef(Y" in src) == (cfg.output_scope == "texture")


def test_workload_key_and_flops():
    wl = Conv2dWorkload((1, 64, 56, 56), (64, 64, 3, 3), 1, 1)
    assert wl.out_shape == (1, 64, 56, 56) and wl.flops == 2 * 64 * 56 * 56 * 64 * 9
    assert wl.key()["padding"] == [1, 1, 1, 1] and wl.key()["op"] == "conv2d"
    with pytest.raises(ValueError, match="groups=1"):
        Conv2dWorkload((1, 8, 4, 4), (8, 1, 3, 3))


def test_one_template_body_yields_texture_and_buffer_source():
    """The same conv2d_nchw4c definition: texture scopes give image parameters and image reads/writes,
    buffer scopes vector loads and stores."""
    from tuner.codegen.opencl import program_source
    from tuner.lower import lower
    wl = Conv2dWorkload((1, 8, 6, 6), (8, 8, 3, 3), 1, 1, bias=True)
    tex = program_source(lower(conv2d_nchw4c(wl, Conv2dConfig())))
    buf = program_source(lower(conv2d_nchw4c(wl, Conv2dConfig(**BUFFERS))))
    for name in ("X", "Wt", "B"):
        assert f"__read_only image2d_t {name}" in tex and f"read_imagef({name}, sampler" in tex
    assert "__write_only image2d_t Y" in tex and "write_imagef(Y, (int2)(" in tex
    assert "vload4(" not in tex and "image2d_t" not in buf
    assert "__global const float* restrict X" in buf or "__global const float* X" in buf
    assert "vload4(" in buf and "vstore4(" in buf and "read_imagef" not in buf


@pytest.mark.parametrize("knobs", [dict(vec_load=1, **BUFFERS), dict(split_c=2, tile_oh=2, wg_h=2),
                                   dict(input_scope="buffer", cache_input=True, act_layout="mace_channel_major")],
                         ids=["scalar input loads", "reduction split", "A0 input copy into a texture"])
def test_conv2d_knobs_change_the_kernel_not_the_result(device, rng, knobs):
    wl = Conv2dWorkload((2, 8, 7, 6), (6, 8, 3, 3), 1, 1, bias=True, activation="relu")
    exe = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)
    if knobs.get("cache_input"):
        assert len(exe.program.kernels) == 2 and "write_imagef" in exe.source  # the A0 shuffle kernel
    if knobs.get("vec_load") == 1:
        assert ", X)" not in exe.source and " X[" in exe.source  # scalar loads of X, no vload4(i, X)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in (wl.data, wl.kernel, (6,)))
    y = exe(X=x, Wt=w, B=bias)["Y"]
    ref = reference(wl, x, w, bias)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4


GATED = Conv2dWorkload((2, 7, 6, 5), (8, 7, 1, 1), bias=True, activation="relu", in_scale=True)


@pytest.mark.parametrize("knobs", [
    dict(), dict(**BUFFERS), dict(**BUFFERS, vec_load=1), dict(local_input=True, wg_w=2, wg_h=2),
    dict(split_k=2, wg_w=2), dict(input_scope="buffer", cache_input=True), dict(tile_oc=2, tile_ow=3, **BUFFERS)],
    ids=["texture", "buffer", "scalar loads", "local tile", "split_k", "cached input", "tiles"])
def test_gated_input_is_read_times_its_channel_gate(device, rng, knobs):
    """``in_scale``: squeeze-excite's x * s[n, c] applied as the input is read, by every input path (vector and
    scalar loads, the __local tile, the texture cache), odd channels and a batch of 2 (a gate per image)."""
    from tuner.templates.common import random_inputs
    inputs = random_inputs(GATED, rng)
    assert inputs["S"].shape == (2, 7, 1, 1)
    y = build(conv2d_nchw4c(GATED, Conv2dConfig(**knobs)), device)(**inputs)["Y"].astype(np.float64)
    ref = reference(GATED, inputs["X"], inputs["Wt"], inputs["B"], None, inputs["S"])
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4
    plain = reference(GATED, inputs["X"], inputs["Wt"], inputs["B"])
    assert np.abs(plain - ref).max() / np.abs(ref).max() > 0.1  # the gate changes the answer


ROW_GATED = Conv2dWorkload((2, 7, 6, 5), (8, 7, 3, 3), 1, 1, bias=True, in_scale=True, scale_rows=True)


@pytest.mark.parametrize("knobs", [
    dict(), dict(**BUFFERS, vec_load=1), dict(local_input=True, wg_w=2, wg_h=2), dict(tile_oh=2, **BUFFERS)],
    ids=["texture", "scalar loads", "local tile", "tiles"])
def test_row_gate_multiplies_each_input_row_by_its_own_gate(device, rng, knobs):
    """``scale_rows``: the gate S is (N, C, H, 1), one value a channel and input row (timm's MobileViTv2 context per
    patch position), read at each tap's row -- a padded 3x3 window, so that the padding rows read in bounds and stay
    zero -- by the vector, scalar and __local tile paths, against NumPy."""
    from tuner.templates.common import random_inputs
    inputs = random_inputs(ROW_GATED, rng)
    assert inputs["S"].shape == (2, 7, 6, 1)
    y = build(conv2d_nchw4c(ROW_GATED, Conv2dConfig(**knobs)), device)(**inputs)["Y"].astype(np.float64)
    ref = reference(ROW_GATED, inputs["X"], inputs["Wt"], inputs["B"], None, inputs["S"])
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4
    one = reference(ROW_GATED, inputs["X"], inputs["Wt"], inputs["B"], None, inputs["S"][:, :, :1])
    assert np.abs(one - ref).max() / np.abs(ref).max() > 0.1  # each row's own gate changes the answer
    assert ROW_GATED.key()["scale_rows"] is True and "scale_rows" not in GATED.key()
    with pytest.raises(ValueError, match="scale_rows"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), scale_rows=True)


NORMED = Conv2dWorkload((2, 10, 3, 7), (12, 10, 1, 1), bias=True, activation="relu", in_norm=1e-5)


@pytest.mark.parametrize("knobs", [
    dict(), dict(**BUFFERS, vec_load=1), dict(local_input=True, wg_w=2, wg_h=2), dict(tile_oc=2, tile_ow=3, **BUFFERS)],
    ids=["texture", "scalar loads", "local tile", "tiles"])
def test_input_layer_norm_is_computed_in_the_convolution(device, rng, knobs):
    """``in_norm``: each input pixel normalized over its 10 channels (the last block's padding lanes left out) by
    statistics the reduction loop sums itself, ``rstd * (W d - mean(d) * U) + bias`` in the epilogue (d the input
    less a shift, U the weights' sums) -- the convolution of the normalized input, against NumPy, on inputs with a
    mean far from their deviation (raw sums would cancel), by the vector, scalar and __local tile paths."""
    from tuner.templates.common import random_inputs
    inputs = random_inputs(NORMED, rng)
    assert inputs["B"].shape == (24,)
    np.testing.assert_allclose(inputs["B"][12:], inputs["Wt"].sum(axis=(1, 2, 3)), rtol=1e-5)
    inputs["X"] = (inputs["X"] * 0.1 + 30.0).astype(np.float32)  # mean 30, deviation 0.1
    y = build(conv2d_nchw4c(NORMED, Conv2dConfig(**knobs)), device)(**inputs)["Y"].astype(np.float64)
    ref = reference(NORMED, inputs["X"], inputs["Wt"], inputs["B"], None)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4
    x, w = inputs["X"].astype(np.float64), inputs["Wt"].astype(np.float64)
    normed = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)
    plain = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], normed) + inputs["B"][:12].reshape(1, -1, 1, 1), 0)
    assert np.abs(ref - plain).max() < 1e-9 * np.abs(plain).max()
    assert NORMED.key()["in_norm"] == 1e-5 and "in_norm" not in GATED.key()
    with pytest.raises(ValueError, match="in_norm"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 3, 3), 1, 1, bias=True, in_norm=1e-5)
    with pytest.raises(ValueError, match="split_k"):
        conv2d_nchw4c(NORMED, Conv2dConfig(split_k=2))


def test_gate_is_in_the_key_only_when_set():
    """Records logged before ``in_scale`` existed keep matching: the field is in the key only when set; a gated
    convolution borrows the config of the same shapes (an epilogue field: distance 0)."""
    from tuner.logs.best import workload_distance
    from tuner.templates.common import workload_label
    plain, gated = Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1)), Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_scale=True)
    assert "in_scale" not in plain.key() and gated.key()["in_scale"] is True
    assert workload_distance(plain.key(), gated.key()) == 0
    assert workload_label("conv2d", gated.key()).endswith("+scale")


@pytest.mark.parametrize("knobs", [dict(), dict(**BUFFERS, tile_oc=2)], ids=["texture", "buffer"])
def test_out_view_writes_its_channels_of_a_larger_tensor(device, rng, knobs):
    """``out_view`` (offset, total): the kernel's 6 outputs land at channels 8..14 of a 14-channel tensor (a
    concat's last part) and the key is the plain workload's, so its records apply."""
    wl = Conv2dWorkload((1, 5, 6, 7), (6, 5, 3, 3), 1, 1, bias=True, activation="relu", out_view=(8, 14))
    assert wl.stored_shape == (1, 14, 6, 7) and wl.key() == Conv2dWorkload((1, 5, 6, 7), (6, 5, 3, 3), 1, 1, bias=True,
                                                                          activation="relu").key()
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in (wl.data, wl.kernel, (6,)))
    y = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)(X=x, Wt=w, B=bias)["Y"]
    assert y.shape == (1, 14, 6, 7)
    ref = reference(wl, x, w, bias)
    assert np.abs(y[:, 8:] - ref).max() / np.abs(ref).max() < 1e-4
    with pytest.raises(ValueError, match="multiple of 4"):
        Conv2dWorkload((1, 5, 6, 7), (6, 5, 3, 3), out_view=(6, 12))


REFLECTED = Conv2dWorkload((1, 6, 7, 9), (8, 6, 3, 3), 1, (1, 2, 2, 1), bias=True, pad_mode="reflect")


@pytest.mark.parametrize("pad_mode", ["reflect", "edge"])
@pytest.mark.parametrize("knobs", [
    dict(), dict(**BUFFERS, vec_load=1), dict(local_input=True, wg_w=2, wg_h=2), dict(tile_oh=3, tile_ow=4, wg_w=2),
    dict(input_scope="buffer", cache_input=True), dict(split_k=2, wg_w=2)],
    ids=["texture", "scalar loads", "local tile", "partial tiles", "cached input", "split_k"])
def test_padding_reads_the_input_reflected_or_at_its_edge(device, rng, pad_mode, knobs):
    """``pad_mode``: a reflection (or edge) Pad before the convolution read in place: every input path (vector and
    scalar loads, the __local tile with its halo, the texture cache) reads the reflected pixel; tiles past the
    output (3 rows of 8, 4 columns of 10) read in bounds. Uneven pads (1, 2, 2, 1)."""
    from dataclasses import replace
    wl = replace(REFLECTED, pad_mode=pad_mode)
    x, w, bias = (rng.standard_normal(s).astype(np.float32) for s in (wl.data, wl.kernel, (8,)))
    y = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)(X=x, Wt=w, B=bias)["Y"].astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 2), (2, 1)), mode=pad_mode)
    ref = reference(Conv2dWorkload(xp.shape, wl.kernel, bias=True), xp, w, bias)  # the Pad, then no padding
    assert y.shape == ref.shape and np.abs(y - ref).max() / np.abs(ref).max() < 1e-4
    zeros = reference(replace(wl, pad_mode="zeros"), x, w, bias)
    assert np.abs(zeros - ref).max() / np.abs(ref).max() > 0.05  # the border differs from zero padding


def test_pad_mode_is_in_the_key_only_when_not_zeros():
    from tuner.logs.best import workload_distance
    assert "pad_mode" not in Conv2dWorkload((1, 8, 4, 4), (8, 8, 3, 3), 1, 1).key()
    assert REFLECTED.key()["pad_mode"] == "reflect"
    assert workload_distance(REFLECTED.key(), {**REFLECTED.key(), "pad_mode": "zeros"}) == 0  # same loop nest
    with pytest.raises(ValueError, match="smaller than the input"):
        Conv2dWorkload((1, 4, 3, 8), (4, 4, 3, 3), 1, (3, 1, 3, 1), pad_mode="reflect")
    with pytest.raises(ValueError, match="pad_mode 'wrap'"):
        Conv2dWorkload((1, 4, 8, 8), (4, 4, 3, 3), 1, 1, pad_mode="wrap")


@pytest.mark.parametrize("knobs", [dict(), dict(**BUFFERS, tile_oc=2, tile_ow=3), dict(split_k=2, wg_w=2),
                                   dict(tile_oc=3, tile_oh=2)],
                         ids=["texture", "buffer tiles", "split_k", "more blocks than tiles"])
def test_side_copy_writes_a_gather_of_another_tensor_in_the_same_launch(device, rng, knobs):
    """``side_copy``: the convolution writes channels 12..20 of a 20-channel concat, and the same launch writes
    channels 0..10 from a ShuffleNet-style interleaved gather (0, 6, 1, 7, ...) of a 12-channel source: the concat's
    other part, no kernel of its own. Work-items of every output tile copy their share; a split's first only."""
    src = (1, 12, 5, 7)
    channels = tuple(c for k in range(5) for c in (k, 6 + k))
    wl = Conv2dWorkload((1, 6, 5, 7), (8, 6, 3, 3), 1, 1, bias=True, out_view=(12, 20),
                        side_copy=(src, channels, 0, "buffer" if knobs.get("input_scope") == "buffer" else "texture"))
    assert wl.key() == Conv2dWorkload((1, 6, 5, 7), (8, 6, 3, 3), 1, 1, bias=True).key()
    x, w, bias, xs = (rng.standard_normal(s).astype(np.float32) for s in (wl.data, wl.kernel, (8,), src))
    y = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)(X=x, Wt=w, B=bias, Xs=xs)["Y"]
    assert y.shape == (1, 20, 5, 7)
    assert np.array_equal(y[:, :10], xs[:, list(channels)])
    ref = reference(wl, x, w, bias)
    assert np.abs(y[:, 12:] - ref).max() / np.abs(ref).max() < 1e-4
    with pytest.raises(ValueError, match="outside this layer's own"):
        Conv2dWorkload((1, 6, 5, 7), (8, 6, 3, 3), 1, 1, out_view=(12, 20), side_copy=(src, channels, 8, "texture"))
    with pytest.raises(ValueError, match="\\(N, H, W\\)"):
        Conv2dWorkload((1, 6, 5, 7), (8, 6, 3, 3), 1, 1, out_view=(12, 20), side_copy=((1, 12, 5, 6), channels, 0,
                                                                                      "texture"))


GROUP_NORMED = Conv2dWorkload((2, 10, 3, 7), (12, 10, 1, 1), bias=True, activation="relu", in_norm=1e-5,
                              norm_partials=4)


@pytest.mark.parametrize("knobs", [dict(), dict(**BUFFERS, vec_load=1), dict(local_input=True, wg_w=2, wg_h=2)],
                         ids=["texture", "scalar loads", "local tile"])
def test_input_group_norm_reads_its_statistics(device, rng, knobs):
    """``norm_partials``: the input GroupNorm(1)-normalized over each whole image, the statistics added up from P's
    chunk partials (as ``group_norm``'s ``stats`` kernel writes them), against NumPy, on inputs with a mean far from
    their deviation; a P that is off by 1% moves the output."""
    from tuner.templates.common import random_inputs
    from tuner.templates.reduction import chunk_statistics
    inputs = random_inputs(GROUP_NORMED, rng)
    inputs["X"] = (inputs["X"] * 0.1 + 30.0).astype(np.float32)  # mean 30, deviation 0.1
    inputs["P"] = chunk_statistics(inputs["X"], 4).astype(np.float32)
    run = build(conv2d_nchw4c(GROUP_NORMED, Conv2dConfig(**knobs)), device)
    ref = reference(GROUP_NORMED, inputs["X"], inputs["Wt"], inputs["B"], None)
    x, w = inputs["X"].astype(np.float64), inputs["Wt"].astype(np.float64)
    normed = (x - x.mean(axis=(1, 2, 3), keepdims=True)) / np.sqrt(x.var(axis=(1, 2, 3), keepdims=True) + 1e-5)
    plain = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], normed) + inputs["B"][:12].reshape(1, -1, 1, 1), 0)
    assert np.abs(ref - plain).max() < 1e-9 * np.abs(plain).max()
    assert np.abs(run(**inputs)["Y"] - ref).max() / np.abs(ref).max() < 1e-4
    off = run(**{**inputs, "P": inputs["P"] * 1.01})["Y"]
    assert np.abs(off - ref).max() / np.abs(ref).max() > 1e-3
    assert GROUP_NORMED.key()["norm_partials"] == 4 and "norm_partials" not in NORMED.key()
    with pytest.raises(ValueError, match="norm_partials"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), bias=True, norm_partials=4)


@pytest.mark.parametrize("knobs,pad_mode,channels,groups", [
    (dict(), "reflect", 10, 10), (dict(), "zeros", 10, 10), (dict(**BUFFERS, vec_load=1), "zeros", 10, 10),
    (dict(local_input=True, wg_w=2, wg_h=2), "reflect", 10, 10), (dict(split_k=2, tile_oc=2, tile_ow=4), "zeros", 10, 10),
    (dict(**BUFFERS, compute="half"), "edge", 10, 10), (dict(), "zeros", 16, 2), (dict(**BUFFERS, vec_load=1), "reflect", 16, 4),
    (dict(tile_oh=2), "zeros", 10, 1),
    (dict(local_input=True, wg_w=4, wg_h=2, tile_oh=2), "zeros", 10, 10),
    (dict(**BUFFERS, local_input=True, wg_w=2, wg_h=4, split_c=2, tile_oc=2), "zeros", 16, 2),
    (dict(local_input=True, wg_w=4, wg_h=4, split_c=4, tile_ow=2), "zeros", 16, 4),
    (dict(**BUFFERS, local_input=True, wg_w=4, wg_h=2, compute="half"), "zeros", 12, 12)],
    ids=["instance texture reflect", "instance texture zeros", "instance scalar loads", "instance local tile",
         "instance split_k", "instance float16", "2 groups", "4 groups scalar loads", "1 group",
         "instance local tile zeros", "2 groups local tile split_c 2", "4 groups local tile split_c 4",
         "instance local tile float16"])
def test_input_group_norm_is_applied_as_read(device, rng, knobs, pad_mode, channels, groups):
    """``in_group_norm``: each (image, group of channels) of the input normalized over its channels and pixels
    (statistics from Q's chunk partials, as ``group_norm``'s stats kernel writes them; groups = C: an InstanceNorm,
    a lane each channel), its gamma and beta from A, then the ReLU, before the padding of zeros and under a
    reflection or edge pad; against NumPy on inputs whose channels have a mean far from their deviation. A Q off by
    1% moves the output. A staged tile (``local_input``) holds its pixels normalized, the padding's zeros after the
    norm (``staged_norm``): with split_c 2 and 4 its blocks' factors are chosen per block."""
    import dataclasses
    from tuner.templates import get_template
    from tuner.templates.common import random_inputs
    from tuner.templates.reduction import chunk_statistics
    half = knobs.get("compute") == "half"
    if half and not device.info.fp16:  # float16 storage, float32 arithmetic
        knobs = {k: v for k, v in knobs.items() if k != "compute"}
    wl = Conv2dWorkload((2, channels, 7, 9), (12, channels, 3, 3), bias=True, activation="relu", padding=1,
                        pad_mode=pad_mode, in_group_norm=(groups, 4, 1e-5, "relu"), dtype="float16" if half else "float32")
    inputs = random_inputs(wl, rng)
    x = inputs["X"].astype(np.float64) * 0.2 + rng.uniform(-30, 30, (1, channels, 1, 1))
    inputs["X"] = x.astype(wl.dtype)
    inputs["Q"] = chunk_statistics(inputs["X"], 4, groups).astype(np.float32)
    run = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)
    gamma, beta = inputs["A"].reshape(2, -1)[:, :channels]
    xg = inputs["X"].astype(np.float64).reshape(2, groups, -1)
    normed = ((xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + 1e-5)).reshape(x.shape)
    normed = np.maximum(normed * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1), 0)
    plain = reference(dataclasses.replace(wl, in_group_norm=()), normed, inputs["Wt"], inputs["B"])
    ref = reference(wl, inputs["X"], inputs["Wt"], inputs["B"], affine=inputs["A"])
    assert np.abs(ref - plain).max() < 1e-9 * np.abs(plain).max()
    tol = 5e-3 if half else 1e-4
    assert np.abs(run(**inputs)["Y"] - ref).max() / np.abs(ref).max() < tol
    off = run(**{**inputs, "Q": inputs["Q"] * 1.01})["Y"]
    assert np.abs(off - ref).max() / np.abs(ref).max() > 1e-3
    t = get_template("conv2d")
    tiled = t.config_values(wl, Conv2dConfig(local_input=True, wg_w=2, wg_h=2))
    assert not t.space(wl, device).violations(tiled)
    assert wl.key()["in_group_norm"] == [groups, 4, 1e-5, "relu"] and "in_group_norm" not in NORMED.key()
    with pytest.raises(ValueError, match="in_group_norm"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), bias=True, in_norm=1e-5, in_group_norm=(8, 2, 1e-5, "relu"))
    with pytest.raises(ValueError, match="in_group_norm"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_group_norm=(8, 0, 1e-5, "relu"))
    with pytest.raises(ValueError, match="whole blocks"):  # groups of 2 channels share a block
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_group_norm=(4, 2, 1e-5, "relu"))


@pytest.mark.parametrize("kept", [True, False], ids=["factors kept by the work-group", "factors each block read"])
@pytest.mark.parametrize("knobs,groups", [
    (dict(wg_w=2, wg_h=2, split_k=2, tile_oc=2), 10), (dict(**BUFFERS, vec_load=1, wg_w=4, wg_h=1), 5),
    (dict(local_input=True, wg_w=2, wg_h=2, split_c=2), 5)], ids=["split_k", "scalar loads", "local tile split_c 2"])
def test_input_group_norm_factors_kept_or_each(device, rng, knobs, groups, kept):
    """``in_group_norm``'s factors (mean, rstd * gamma, beta of each input block): kept by the work-group in local
    memory (``keep_norm_factors``: 40 channels, 10 blocks over 4 or 8 work-items, the last pass guarded) or
    computed by each work-item for each block it reads -- both against NumPy, in split, scalar and staged reads;
    the space counts the local memory (``norm_local``) and keeps the knob to readers of a norm."""
    from tuner.codegen.generate import generate
    from tuner.templates import get_template
    from tuner.templates.common import random_inputs
    from tuner.templates.reduction import chunk_statistics
    wl = Conv2dWorkload((2, 40, 6, 7), (8, 40, 3, 3), padding=1, in_group_norm=(groups, 3, 1e-5, "relu"))
    inputs = random_inputs(wl, rng)
    inputs["X"] = (inputs["X"] * 0.3 + rng.uniform(-20, 20, (1, 40, 1, 1))).astype(np.float32)
    inputs["Q"] = chunk_statistics(inputs["X"], 3, groups).astype(np.float32)
    cfg = Conv2dConfig(**knobs, keep_norm_factors=kept)
    ref = reference(wl, inputs["X"], inputs["Wt"], None, affine=inputs["A"])
    y = build(conv2d_nchw4c(wl, cfg), device)(**inputs)["Y"]
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-4
    assert ("__local float4 gnf[30]" in generate(conv2d_nchw4c(wl, cfg))[1]) == kept
    t = get_template("conv2d")
    assert t.space_vars(wl)["norm_local"] == 480
    short = type(device.info)(**{**vars(device.info), "local_mem_bytes": 479})
    assert any("norm_factors_local" in v for v in t.space(wl, short).violations(t.config_values(wl, cfg))) == kept
    plain = Conv2dWorkload((2, 40, 6, 7), (8, 40, 3, 3), padding=1)
    misplaced = t.space(plain, device).violations(t.config_values(plain, Conv2dConfig(keep_norm_factors=True)))
    assert any("keep_norm_factors_needed" in v for v in misplaced)
    with pytest.raises(ValueError, match="keep_norm_factors"):
        conv2d_nchw4c(plain, Conv2dConfig(keep_norm_factors=True))


@pytest.mark.parametrize("kept", [True, False])
def test_kept_norm_factors_count_beside_a_staged_tile_and_a_split(device, kept):
    """The kept factors' local memory (``norm_local``: 48 bytes a block of the work-group's group) is counted
    beside a staged tile (``local_tile``) and a split's partial sums (``split_k_partials``): on a device with one
    byte less than both, each constraint refuses the config if and only if the factors are kept."""
    from tuner.templates import get_template
    from tuner.templates.common import LocalTile
    t = get_template("conv2d")
    wl = Conv2dWorkload((1, 40, 6, 7), (8, 40, 3, 3), padding=1, in_group_norm=(5, 1, 1e-5, "relu"))
    grouped = Conv2dWorkload((1, 64, 6, 6), (32, 16, 3, 3), groups=4, padding=1, in_group_norm=(16, 1, 1e-5, "none"))
    assert t.space_vars(grouped)["norm_local"] == 48 * 4  # the group's 4 blocks, not the 16 of the input
    staged = Conv2dConfig(local_input=True, wg_w=2, wg_h=2, split_c=2, keep_norm_factors=kept)
    split = Conv2dConfig(wg_w=2, wg_h=2, split_k=4, tile_oc=2, keep_norm_factors=kept)
    needs = {"local_tile": (staged, LocalTile.bytes(staged, (2, 1, 2), (1, 1), (1, 1), (3, 3))),
             "split_k_partials": (split, 4 * 2 * 2 * 2 * 2 * 16)}
    for constraint, (cfg, own) in needs.items():
        short = type(device.info)(**{**vars(device.info), "local_mem_bytes": own + 480 - 1})
        refused = [v for v in t.space(wl, short).violations(t.config_values(wl, cfg)) if constraint in v]
        assert bool(refused) == kept, (constraint, refused)


def test_input_norm_with_a_per_channel_prelu(device, rng):
    """``in_norm`` beside a per-channel PReLU: B holds the biases, the slopes, then the weights' sums (three padded
    vectors, ``bias_length``), against NumPy; the slopes change the answer."""
    from tuner.templates.common import bias_length, packed_after_biases, random_inputs
    wl = Conv2dWorkload((1, 10, 3, 5), (6, 10, 1, 1), bias=True, activation="prelu", in_norm=1e-5)
    assert bias_length(wl, 6) == 24
    inputs = random_inputs(wl, rng)
    x, w = inputs["X"].astype(np.float64), inputs["Wt"].astype(np.float64)
    bias, slope = rng.standard_normal(6), rng.uniform(0.1, 0.3, 6)
    inputs["B"] = packed_after_biases(bias, slope, w.sum(axis=(1, 2, 3)))
    y = build(conv2d_nchw4c(wl, Conv2dConfig(**BUFFERS)), device)(**inputs)["Y"]
    normed = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)
    z = np.einsum("oc,nchw->nohw", w[:, :, 0, 0], normed) + bias.reshape(1, -1, 1, 1)
    want = np.where(z > 0, z, z * slope.reshape(1, -1, 1, 1))
    assert (z < 0).any() and np.abs(y - want).max() / np.abs(want).max() < 1e-4
    np.testing.assert_allclose(reference(wl, inputs["X"], inputs["Wt"], inputs["B"]), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channels,groups,size,knobs,dtype", [
    (12, 12, (7, 9), dict(tile_ow=4, wg_w=4, tile_oh=2, wg_h=4), "float32"),  # InstanceNorm, a partial last tile
    (16, 8, (5, 6), dict(tile_ow=2, wg_w=4, tile_oh=1, wg_h=8, split_k=2, tile_oc=2), "float32"),  # 2 a group
    (16, 2, (6, 6), dict(tile_ow=2, wg_w=4, tile_oh=2, wg_h=4, tile_oc=2), "float32"),  # groups of 2 blocks
    (8, 1, (3, 5), dict(tile_ow=1, wg_w=8, tile_oh=1, wg_h=4, tile_oc=2, **BUFFERS), "float32"),  # one group
    (12, 12, (8, 8), dict(tile_ow=2, wg_w=4, tile_oh=2, wg_h=4, compute="half"), "float16")],
    ids=["instance", "pairs split_k", "blocks", "one group buffers", "float16"])
def test_output_group_norm_in_the_epilogue(device, rng, channels, groups, size, knobs, dtype):
    """``out_norm``: the convolution's output (bias included) group-normalized per (image, group) over its channels
    and pixels in the work-group that holds them, gamma and beta from Na, then the residual and the ReLU -- against
    NumPy on channels whose mean is far from their deviation (the bias); a work-group short of a plane is outside
    the space and refused by the template."""
    import dataclasses
    from tuner.templates import get_template
    from tuner.templates.common import group_normed, random_inputs
    if knobs.get("compute") == "half" and not device.info.fp16:
        knobs = {k: v for k, v in knobs.items() if k != "compute"}
    wl = Conv2dWorkload((2, 6, *size), (channels, 6, 3, 3), bias=True, activation="relu", residual=True, padding=1,
                        out_norm=(groups, 1e-5), dtype=dtype)
    inputs = random_inputs(wl, rng)
    inputs["B"] = (inputs["B"].astype(np.float64) * 20).astype(dtype)  # means far from the deviations
    cfg = Conv2dConfig(**knobs)
    t = get_template("conv2d")
    assert not t.space(wl, device).violations(t.config_values(wl, cfg))
    run = build(conv2d_nchw4c(wl, cfg), device)
    plain = reference(dataclasses.replace(wl, out_norm=(), residual=False, activation="none"), inputs["X"],
                      inputs["Wt"], inputs["B"])
    want = np.maximum(group_normed(plain, inputs["Na"], groups, 1e-5, "none") + inputs["Res"], 0)
    ref = reference(wl, inputs["X"], inputs["Wt"], inputs["B"], inputs["Res"], norm_affine=inputs["Na"])
    np.testing.assert_allclose(ref, want, rtol=1e-9, atol=1e-9)
    tol = 2e-2 if dtype == "float16" else 1e-4
    assert np.abs(run(**inputs)["Y"] - ref).max() / np.abs(ref).max() < tol
    assert wl.key()["out_norm"] == [groups, 1e-5] and "out_norm" not in dataclasses.replace(wl, out_norm=()).key()
    short = dataclasses.replace(cfg, wg_h=1, tile_oh=1)
    assert t.space(wl, device).violations(t.config_values(wl, short))
    with pytest.raises(ValueError, match="out_norm"):
        conv2d_nchw4c(wl, short)


def test_output_group_norm_refuses_groups_across_blocks():
    with pytest.raises(ValueError, match="out_norm groups=4"):
        Conv2dWorkload((1, 8, 4, 4), (12, 8, 1, 1), out_norm=(4, 1e-5))  # 3 channels a group
    with pytest.raises(ValueError, match="out_norm groups=1"):
        Conv2dWorkload((1, 8, 4, 4), (6, 8, 1, 1), out_norm=(1, 1e-5))  # one group of 6: padding lanes
    with pytest.raises(ValueError, match="prelu"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), bias=True, activation="prelu", out_norm=(8, 1e-5))


@pytest.mark.parametrize("data,kernel,groups", [((1, 128, 32, 32), (128, 128, 3, 3), 128),
                                                ((1, 128, 28, 28), (128, 128, 3, 3), 32),
                                                ((1, 512, 7, 7), (512, 512, 3, 3), 32), ((1, 64, 3, 3), (8, 64, 1, 1), 1),
                                                ((1, 8, 30, 200), (8, 8, 3, 3), 4)])
def test_output_group_norm_fallback_is_in_the_space(data, kernel, groups):
    """The fallback of an ``out_norm`` convolution holds whole planes and groups on a large GPU, a phone's and a
    CPU's limits: a valid config of the space everywhere."""
    from conftest import profile
    from tuner.templates import get_template
    t = get_template("conv2d")
    wl = Conv2dWorkload(data, kernel, bias=True, padding=kernel[2] // 2, out_norm=(groups, 1e-5), activation="relu")
    for info in (profile(), profile(name="phone", compute_units=2, max_work_group_size=256,
                                    max_work_item_sizes=[256, 256, 256], local_mem_bytes=16384),
                 profile(name="cpu", type="CPU", image_support=False, half_images=False)):
        cfg = t.fallback(wl, info)
        t.space(wl, info).check(t.config_values(wl, cfg))
        assert cfg.wg_w * cfg.tile_ow >= data[3] and cfg.wg_h * cfg.tile_oh >= data[2]


def test_output_group_norm_fallback_refuses_groups_wider_than_a_tile():
    """A group of 8 or more blocks of 4 channels (GroupNorm(1) of 64) fits no tile_oc of the space: the fallback
    says so (``norms_into_convs`` leaves such norms whole)."""
    from conftest import profile
    from tuner.templates import get_template
    wl = Conv2dWorkload((1, 8, 8, 8), (64, 8, 3, 3), bias=True, padding=1, out_norm=(1, 1e-5))
    with pytest.raises(ValueError, match="blocks of 4 channels"):
        get_template("conv2d").fallback(wl, profile())


@pytest.mark.parametrize("dtype,bias,knobs", [
    ("float32", True, dict(tile_oc=2, tile_oh=2, wg_w=4, wg_h=4)),
    ("float32", False, dict(tile_ow=2, wg_w=4, wg_h=2, split_k=2, **BUFFERS)),
    ("float16", True, dict(tile_oc=1, tile_ow=2, wg_w=4, wg_h=4))], ids=["textures", "no bias split_k", "float16"])
def test_residual_scaled_per_channel(device, rng, dtype, bias, knobs):
    """``residual_scale``: the residual times a per-channel constant (``Rs``) as it is added -- PoolFormerV2's
    ``x * r + ls * mlp(x)`` -- then the ReLU, against NumPy; the field is in the key only when set, and needs a
    residual."""
    import dataclasses
    from tuner.templates.common import random_inputs
    wl = Conv2dWorkload((1, 8, 6, 7), (10, 8, 1, 1), bias=bias, activation="relu", residual=True,
                        residual_scale=True, dtype=dtype)
    inputs = random_inputs(wl, rng)
    got = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)(**inputs)["Y"]
    plain = dataclasses.replace(wl, residual=False, residual_scale=False, activation="none")
    y = reference(plain, inputs["X"], inputs["Wt"], inputs.get("B"))
    want = np.maximum(y + inputs["Res"] * inputs["Rs"].reshape(-1)[:10].reshape(1, 10, 1, 1), 0)
    tol = 2e-2 if dtype == "float16" else 1e-5
    assert np.abs(got - want).max() / np.abs(want).max() < tol
    unscaled = np.maximum(y + inputs["Res"], 0)
    assert np.abs(got - unscaled).max() / np.abs(want).max() > 0.05
    assert wl.key()["residual_scale"] is True and "residual_scale" not in dataclasses.replace(
        wl, residual_scale=False).key()
    with pytest.raises(ValueError, match="residual_scale"):
        dataclasses.replace(wl, residual=False)
