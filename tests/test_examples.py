"""The source documents' examples, run as real kernels on PoCL."""
import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.ir import layouts
from tuner.ir.buffer import buffer
from tuner.ir.builder import Builder
from tuner.ir.examples import addone, nhwc_to_nchwc
from tuner.ir.kernel import Program
from tuner.ir.schedule import cache_read
from tuner.runtime.opencl import download
from tuner.runtime.opencl.launch import build
from tuner.codegen.packing import pack


def test_addone_lowers_to_shuffle_and_compute_kernels(device, rng):
    trace = []
    exe = build(addone(), device, trace=trace)
    shuffle, compute = exe.program.kernels
    assert shuffle.access == {"X_texture": "write_only"} and compute.access == {"X_texture": "read_only"}
    assert [w.name for w in exe.program.workspaces] == ["X_texture"]
    assert exe.program.workspaces[0].shape == (32, 32, 4)  # C0: [A, B, 4] -> [A, B, 4]
    src = exe.source
    assert "__write_only image2d_t X_texture" in src and "__read_only image2d_t X_texture" in src
    assert "write_imagef(X_texture" in src and "read_imagef(X_texture, sampler" in src
    # the RFC's shuffle: one pixel per (blockIdx.x, threadIdx.x), a float4 read of X
    assert "vload4(ax0 * 32 + ax1, X)" in src
    assert shuffle.launch() == ((32 * 32, 1, 1), (32, 1, 1)) and compute.launch() == ((64, 1, 1), (8, 1, 1))
    x = rng.standard_normal((32, 32, 4)).astype(np.float32)
    np.testing.assert_array_equal(exe(X=x)["Y"], x + 1)
    passes = [name for name, _ in trace]
    assert passes.count("input") == 2 and "lower_texture_access" in passes


def test_addone_half_storage(device, rng):
    exe = build(addone(dtype="float16"), device)
    assert "vload_half4" in exe.source and "vstore_half4" in exe.source
    x = rng.standard_normal((32, 32, 4)).astype(np.float16)
    y = exe(X=x)["Y"]
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), (x.astype(np.float32) + 1).astype(np.float16), rtol=1e-3)


@pytest.mark.parametrize("separator", [False, True])
def test_rfc0039_nhwc_to_nchwc_physical_layout(device, rng, separator):
    N, H, W, C = 2, 6, 5, 8
    exe = build(nhwc_to_nchwc((N, H, W, C), separator), device)
    B = exe.program.params[1]
    expected_shape = (N * C // 4 * H, W, 4) if separator else (N * C // 4 * H * W * 4,)
    assert B.shape == expected_shape
    a = rng.standard_normal((N, H, W, C)).astype(np.float32)
    arrays = {b.name: exe.allocate(b) for b in exe.program.params}
    from tuner.runtime.opencl import upload
    upload(device, arrays["A"], pack(exe.program.params[0], a))
    exe.launch(arrays)
    physical = download(device, arrays["B"])
    nchwc = a.reshape(N, H, W, C // 4, 4).transpose(0, 3, 1, 2, 4)  # [n, c//4, h, w, c%4]
    np.testing.assert_array_equal(physical.reshape(-1), nchwc.reshape(-1))
    np.testing.assert_array_equal(exe(A=a)["B"], a)  # and back to the logical NHWC view


ACTIVATION = ["nchw4c", "mace_channel_major", "mace_height_major", "mace_width_major"]
WEIGHT = ["oihw4o", "mace_conv2d_filter", "mace_depthwise_filter"]


@pytest.mark.parametrize("name", ACTIVATION + WEIGHT + ["mace_argument"])
def test_round_trip_through_image_is_exact(device, rng, name):
    """NCHW -> image (a data-shuffle kernel writing pixels, padding zero) -> NCHW (a kernel reading single
    lanes), for every mapping, with sizes that are not multiples of 4."""
    shape = {"mace_argument": (7,), "mace_depthwise_filter": (5, 1, 3, 3)}.get(name, (2, 5, 6, 7))
    scope = "texture" if name in ACTIVATION else "texture:weight"
    X, Y = buffer("X", shape), buffer("Y", shape)
    b = Builder()
    loops = [b.loop(f"i{k}", s, ("group.0", "group.1", "local.0")[k] if k < 3 else "serial")
             for k, s in enumerate(shape)]
    idx = [cm.__enter__() for cm in loops]
    b.store(Y, tuple(idx), X[tuple(idx)])
    for cm in reversed(loops):
        cm.__exit__(None, None, None)
    prog = cache_read(b.kernel("copy", [X, Y]), X, scope, layout=layouts.get_layout(name))
    T = prog.workspaces[0]
    prog = Program(prog.name, prog.kernels, (X, T, Y))  # expose the image to read it back
    exe = build(prog, device)
    x = (rng.standard_normal(shape) + 3).astype(np.float32)
    arrays = {b.name: exe.allocate(b) for b in exe.program.params}
    from tuner.runtime.opencl import upload
    upload(device, arrays["X"], pack(exe.program.params[0], x))
    exe.launch(arrays)
    image = download(device, arrays[T.name])
    np.testing.assert_array_equal(image, pack(exe.program.params[1], x))  # the mapping's pixels, zero padding
    assert image.size > x.size and np.count_nonzero(image) == x.size
    np.testing.assert_array_equal(download(device, arrays["Y"]).reshape(shape), x)


def test_image_larger_than_device_is_a_clear_error(device):
    width = device.info.image2d_max_width + 1
    X = buffer("X", (1, 4, 1, width), scope="texture")
    Y = buffer("Y", (1, 4, 1, width))
    b = Builder()
    with b.loop("w", width, "group.0") as w, b.loop("c", 4, "vectorized") as c:
        b.store(Y, (0, c, 0, w), X[0, c, 0, w])
    exe = build(b.kernel("wide", [X, Y]), device)
    with pytest.raises(TunerError, match="image2d max width"):
        exe(X=np.ones((1, 4, 1, width), np.float32))
