"""OpenCL code generation: one loop nest, texture and buffer variants, run on PoCL against NumPy."""
import numpy as np
import pytest

from tuner.codegen.opencl import kernel_source, program_source
from tuner.errors import LoweringError
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.lower import lower
from tuner.runtime.opencl.launch import build


def conv1x1(N, C, O, H, W, scope="texture", dtype="float32"):
    """A 1x1 convolution over NCHW4c activations and OIHW4o weights: an outer product of one input lane
    (broadcast) and one weight pixel (4 output channels) per step. Scope and layout are declarations only."""
    tex = scope == "texture"
    X = buffer("X", (N, C, H, W), dtype, "texture" if tex else "global", "nchw4c" if tex else "nchw4c_buffer")
    Wt = buffer("Wt", (O, C, 1, 1), dtype, "texture:weight" if tex else "global", "oihw4o" if tex else "oihw4o_buffer")
    Y = buffer("Y", (N, O, H, W), dtype, "texture" if tex else "global", "nchw4c" if tex else "nchw4c_buffer")
    b = Builder()
    with b.loop("n", N, "group.2") as n, b.loop("ob", -(-O // 4), "group.1") as ob, \
            b.loop("h", H, "group.0") as h, b.loop("w", W, "local.0") as w:
        acc = b.allocate("acc", (4,), "float32", "private")
        with b.loop("l", 4, "vectorized") as l:
            b.store(acc, l, 0.0)
        with b.loop("cb", -(-C // 4)) as cb, b.loop("ci", 4, "unrolled") as ci:
            # padding input lanes are zero, but the weight row past C belongs to the next block: guard it
            with b.if_(cb * 4 + ci < C), b.loop("l", 4, "vectorized") as l:
                b.store(acc, l, acc[l] + X[n, cb * 4 + ci, h, w] * Wt[ob * 4 + l, cb * 4 + ci, 0, 0])
        with b.loop("l", 4, "vectorized") as l:
            b.store(Y, (n, ob * 4 + l, h, w), acc[l])
    return b.kernel(f"conv1x1_{scope}", [X, Wt, Y])


def reference(x, wt):
    return np.einsum("nchw,oc->nohw", x.astype(np.float64), wt[:, :, 0, 0].astype(np.float64))


@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 1e-2)])
def test_one_body_texture_and_buffer_variants_match_numpy(device, rng, scope, dtype, tol):
    N, C, O, H, W = 2, 7, 6, 3, 5  # channel counts not multiples of 4: padding lanes read as zero
    exe = build(conv1x1(N, C, O, H, W, scope, dtype), device)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    wt = rng.standard_normal((O, C, 1, 1)).astype(dtype)
    y = exe(X=x, Wt=wt)["Y"]
    ref = reference(x, wt)
    assert np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max() < tol
    src = exe.source
    if scope == "texture":
        assert "__read_only image2d_t X" in src and "__read_only image2d_t Wt" in src
        assert "__write_only image2d_t Y" in src and "write_imagef(Y" in src
        for lane in "xyzw":  # single-lane reads of the input pixel, broadcast against a weight pixel
            assert f").{lane} * read_imagef(Wt" in src
    else:
        assert "image2d_t" not in src
        assert ("vload_half4(" if dtype == "float16" else "vload4(") in src
        assert ("vstore_half4(" if dtype == "float16" else "vstore4(") in src


def test_source_is_readable(device):
    src = kernel_source(lower(conv1x1(1, 8, 8, 4, 4)).kernels[0])
    lines = src.splitlines()
    assert lines[0].startswith("__kernel __attribute__((reqd_work_group_size(4, 1, 1)))")
    assert "  const int n = get_group_id(2);" in lines and "  float acc[4];" in lines
    assert any(line.startswith("  for (int cb = 0; cb < 2; ++cb) {") for line in lines)
    assert all(line == line.rstrip() for line in lines)


def test_long_unrolled_loop_keeps_pragma_and_negative_floordiv_uses_helper(device, rng):
    X, Y = buffer("X", (64,)), buffer("Y", (64,))
    b = Builder()
    with b.loop("i", 64, "group.0") as i:
        acc = b.allocate("acc", (1,), "float32", "private")
        b.store(acc, 0, 0.0)
        with b.loop("k", 32, "unrolled") as k:
            # (i - 3) may be negative: floor division must not truncate toward zero
            b.store(acc, 0, acc[0] + X[((i - 3) // 8 + 1) * 8 % 64] * 1.0 + X[k] * 0.0)
        b.store(Y, i, acc[0])
    exe = build(b.kernel("neg", [X, Y]), device)
    assert "#pragma unroll" in exe.source and "floordiv_i(i - 3, 8)" in exe.source
    x = rng.standard_normal(64).astype(np.float32)
    i = np.arange(64)
    expected = 32 * x[(((i - 3) // 8 + 1) * 8) % 64]
    np.testing.assert_allclose(exe(X=x)["Y"], expected, rtol=1e-5)


def test_program_source_shares_sampler_and_helpers():
    from tuner.ir.examples import addone
    src = program_source(lower(addone()))
    assert src.count("__constant sampler_t sampler") == 1
    assert "CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST" in src
    assert src.count("__kernel") == 2


def test_multi_dimensional_global_buffer_is_rejected():
    from tuner.ir.index_map import AXIS_SEPARATOR as SEP
    A = buffer("A", (4, 8), layout=lambda i, j: [i, SEP, j])
    b = Builder()
    with b.loop("i", 4, "group.0") as i, b.loop("j", 8) as j:
        b.store(A, (i, j), 1.0)
    with pytest.raises(LoweringError, match="OpenCL buffers are 1-D"):
        kernel_source(lower(b.kernel("k", [A])).kernels[0])
