"""Runtime tests on the real default (or TUNER_TEST_DEVICE) device, no mocks."""

import os
import numpy as np
import pyopencl as cl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner import TunerError, choose_device, list_devices
from tuner.errors import CompileError
from tuner.runtime.opencl import (BufferPool, TexturePool, alloc, build_program, download, open_device,
                           upload)
from tuner.runtime.opencl.program import SAMPLER, SharedProgram, build_together, one_kernel, shared_program
from tuner.runtime.opencl.runtime import OpenCLRuntime


@pytest.fixture(scope="module")
def dev():
    return open_device(os.environ.get("TUNER_TEST_DEVICE") or None)


def test_lists_pocl_cpu_with_images():
    infos = list_devices()
    assert [d.index for d in infos] == list(range(len(infos)))
    pocl = [d for d in infos if d.platform_tag == "pocl" and d.type == "CPU"]
    assert pocl, infos
    d = pocl[0]
    assert d.image_support and d.image2d_max_width > 0 and d.image2d_max_height > 0
    assert d.max_work_group_size > 0 and all(s > 0 for s in d.max_work_item_sizes)
    assert d.local_mem_bytes > 0 and d.global_mem_bytes > 0 and d.compute_units > 0
    assert d.fingerprint.startswith("pocl-cpu-") and d.fingerprint == d.fingerprint.lower()
    assert set(d.fingerprint_fields()) == {"platform", "device", "driver_version"}
    assert d.fingerprint == list_devices()[d.index].fingerprint  # stable


def test_choose_device_by_index_and_substring():
    infos = list_devices()
    assert choose_device(0) == infos[0] and choose_device("0") == infos[0]
    assert choose_device("POCL", check=False).platform_tag == "pocl"  # listed even where it cannot build
    assert choose_device("portable computing", check=False).platform_tag == "pocl"
    assert choose_device("cpu").type == "CPU"
    default = choose_device()
    assert default.type == "GPU" or not any(d.type == "GPU" and not d.is_simulator for d in infos)
    assert not default.is_simulator  # Oclgrind (a checking simulator) is never the default


@pytest.mark.parametrize("spec", ["nosuch-device", 999])
def test_choose_device_unknown_lists_devices(spec):
    with pytest.raises(TunerError) as e:
        choose_device(spec)
    msg = str(e.value)
    assert str(spec) in msg and "[0]" in msg and "Portable Computing Language" in msg


def test_global_buffer_round_trip(dev):
    host = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32) + 0.5
    arr = alloc(dev, "global", host.shape, np.float32)
    assert arr.mem.size == host.nbytes and arr.scope == "global" and arr.physical_shape == (3, 5, 7)
    upload(dev, arr, host)
    np.testing.assert_array_equal(download(dev, arr), host)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("scope", ["texture", "texture:weight"])
def test_texture_round_trip(dev, dtype, scope):
    host = np.random.default_rng(1).uniform(-100, 100, (9, 13, 4))  # float64: upload casts
    arr = alloc(dev, scope, (9, 13, 4), dtype)
    assert isinstance(arr.mem, cl.Image) and arr.mem.width == 13 and arr.mem.height == 9
    assert arr.dtype == np.dtype(dtype)
    upload(dev, arr, host)
    out = download(dev, arr)
    assert out.shape == (9, 13, 4) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, host.astype(dtype))
    assert np.count_nonzero(out) == out.size


def test_texture_limits_and_bad_shapes(dev):
    limit = dev.info.image2d_max_width
    with pytest.raises(TunerError, match="image2d max width") as e:
        alloc(dev, "texture", (16, limit + 1, 4), np.float32)
    assert str(limit) in str(e.value) and dev.info.label in str(e.value)
    with pytest.raises(TunerError, match="image2d max height"):
        alloc(dev, "texture", (dev.info.image2d_max_height + 1, 4, 4), np.float32)
    with pytest.raises(TunerError, match="RGBA"):
        alloc(dev, "texture", (4, 4, 3), np.float32)
    with pytest.raises(TunerError, match="float32 or float16"):
        alloc(dev, "texture", (4, 4, 4), np.int32)
    for scope in ("local", "private"):
        with pytest.raises(TunerError, match="cannot be allocated"):
            alloc(dev, scope, (4,), np.float32)
    with pytest.raises(TunerError, match="unknown memory scope"):
        alloc(dev, "constant-ish", (4,), np.float32)
    arr = alloc(dev, "global", (4,), np.float32)
    with pytest.raises(TunerError, match="shapes differ"):
        upload(dev, arr, np.zeros(5, np.float32))


def test_texture_pool_reuses_smallest_fit(dev):
    pool = TexturePool(dev)
    big = pool.request((8, 16, 4), np.float32)
    small = pool.request((4, 4, 4), np.float32)
    assert pool.stats.allocations == 2 and pool.stats.reuses == 0
    held = pool.stats.bytes_held
    assert held == (8 * 16 + 4 * 4) * 4 * 4
    pool.release(big)
    pool.release(small)
    # Both fit a 3x4 request; the smaller image is chosen.
    a = pool.request((3, 4, 4), np.float32)
    assert a.mem is small.mem and a.physical_shape == (3, 4, 4) and a.alloc_shape == (4, 4, 4)
    # Only the big one fits 6x10.
    b = pool.request((6, 10, 4), np.float32)
    assert b.mem is big.mem and pool.stats.reuses == 2 and pool.stats.allocations == 2
    assert pool.stats.bytes_held == held and pool.stats.bytes_free == 0
    # Nothing free fits a larger request, nor a float16 one: new allocations.
    c = pool.request((8, 32, 4), np.float32)
    pool.release(a)
    d = pool.request((2, 2, 4), np.float16)
    assert c.mem is not big.mem and d.mem is not small.mem and pool.stats.allocations == 4
    # A reused, larger image still round-trips its physical region.
    host = np.arange(6 * 10 * 4, dtype=np.float32).reshape(6, 10, 4) + 1
    upload(dev, b, host)
    np.testing.assert_array_equal(download(dev, b), host)
    with pytest.raises(TunerError, match="already released"):
        pool.release(a)
    with pytest.raises(TunerError, match="image2d max width"):
        pool.request((1, dev.info.image2d_max_width + 1, 4), np.float32)
    pool.clear()
    assert pool.stats.bytes_free == 0 and pool.in_use == 3


def test_buffer_pool(dev):
    pool = BufferPool(dev)
    a = pool.request((100,), np.float32)
    pool.release(a)
    b = pool.request((10, 5), np.float32)
    assert b.mem is a.mem and b.physical_shape == (10, 5)
    host = np.arange(50, dtype=np.float32).reshape(10, 5)
    upload(dev, b, host)
    np.testing.assert_array_equal(download(dev, b), host)
    c = pool.request((101,), np.float32)
    assert c.mem is not a.mem and pool.stats.allocations == 2 and pool.stats.reuses == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=12))
def test_texture_pool_invariants(dev, ops):
    pool, live, requests = TexturePool(dev), [], 0
    for release, h, w in ops:
        if release and live:
            pool.release(live.pop(0))
        else:
            requests += 1
            a = pool.request((h, w, 4), np.float32)
            assert a.alloc_shape[0] >= h and a.alloc_shape[1] >= w
            assert all(a.mem is not o.mem for o in live)  # never hand out an image twice
            live.append(a)
    s = pool.stats
    assert s.allocations + s.reuses == requests and pool.in_use == len(live)
    assert s.bytes_held == sum(b.alloc_nbytes for b in pool._free) + sum(b.alloc_nbytes for b in pool._in_use.values())
    pool.clear()


def test_program_cache_and_compile_error(dev):
    src = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"
    p1 = build_program(dev, src)
    assert build_program(dev, src) is p1
    assert build_program(dev, src, ["-cl-fast-relaxed-math"]) is not p1
    bad = "__kernel void k(__global float *x) {\n  x[0] = undefined_name;\n}"
    with pytest.raises(CompileError) as e:
        build_program(dev, bad)
    assert isinstance(e.value, TunerError)
    assert "undefined_name" in e.value.log and "undefined_name" in str(e.value)
    assert "   2|   x[0] = undefined_name;" in str(e.value)


def _one(name, body, sampler=True):
    head = (f"__kernel __attribute__((reqd_work_group_size(1, 1, 1)))\nvoid {name}(\n"
            f"    __global float* restrict Y) {{\n")
    return (SAMPLER + "\n\n" if sampler else "") + head + body + "}\n"


def test_only_the_generators_one_kernel_sources_are_built_together():
    ok = _one("add", "  Y[get_global_id(0)] += 1.0f;\n")
    assert one_kernel(ok) == ("add", ok[len(SAMPLER):].lstrip())
    plain = _one("add", "  Y[0] = 1.0f;\n", sampler=False)
    assert one_kernel(plain)[0] == "add"
    assert one_kernel(_one("add", "  Y[0] = add_count;\n")) is not None  # the name as a whole word only
    for bad in (plain + "__kernel void other(__global float* Y) { }\n",  # a second kernel
                "float helper(float x) { return x; }\n" + plain,  # a function of its own
                _one("add", "  Y[0] = 1.0f;\n#define N 4\n", sampler=False),  # a macro reaches the sources after
                _one("add", "  Y[0] = 1.0f;\n%:define N 4\n", sampler=False),  # ... spelled as a digraph
                _one("add", "  Y[0] = 1.0f; \\\n  Y[1] = 1.0f;\n", sampler=False),  # a line splice
                _one("add", "  _Pragma(\"unroll\") Y[0] = 1.0f;\n", sampler=False),
                _one("add", "  Y[0] = 1.0f; /* one */\n", sampler=False),  # comments: not the generator's
                _one("add", "  Y[0] = 1.0f; // one\n", sampler=False),
                ok.replace(SAMPLER, SAMPLER.replace("CLAMP", "NONE")),  # another sampler
                _one("add", "  read_imagef(t, sampler, (int2)(0));\n", sampler=False),  # a sampler it lacks
                _one("add", "  Y[0] = 1.0f; }\n  {\n"),  # braces that close the kernel early
                _one("add", "  Y[0] = 1.0f;\n  add(Y);\n")):  # its name twice
        assert one_kernel(bad) is None, bad


def test_sources_built_together_run_as_built_alone_and_a_bad_one_builds_alone(dev, tmp_path):
    """Three sources of one kernel name, each with its own body, built as one program: each launch runs its own
    body; a batch with a source that does not compile builds nothing, and that source alone names its error."""
    srcs = [_one("k", f"  Y[get_global_id(0)] = {i}.5f;\n") for i in range(3)]
    assert build_together(dev, srcs) == 3
    assert build_together(dev, srcs) == 0  # built already
    rt = OpenCLRuntime(dev)
    stats: dict = {}
    out = alloc(dev, "global", (4,), np.float32)
    for i, src in enumerate(srcs):
        shared = rt.build(src, stats=stats)
        assert isinstance(shared, SharedProgram) and shared.program is shared_program(dev, srcs[0]).program
        rt.enqueue([rt.prepare(shared, "k", [out], (4,), (1,))])
        np.testing.assert_array_equal(rt.download(out), np.full(4, i + 0.5, np.float32))
    rt.build(srcs[0], stats=stats)
    assert stats == {"source": 3, "memory": 1}
    assert isinstance(rt.build(srcs[0], cache_dir=tmp_path), cl.Program)  # a binary cache: each program alone
    bad = [_one("k", "  Y[0] = 7.0f;\n"), _one("k", "  Y[0] = undefined_name;\n")]
    assert build_together(dev, bad) == 0 and shared_program(dev, bad[0]) is None
    assert isinstance(rt.build(bad[0]), cl.Program)
    with pytest.raises(CompileError, match="undefined_name"):
        rt.build(bad[1])
    # kernel names that fail alone (a macro, the sampler constant) would build renamed: never put together
    for name in ("CLK_ADDRESS_CLAMP", "sampler"):
        alone = [_one(name, "  Y[0] = 3.0f;\n"), _one("fine", "  Y[0] = 4.0f;\n")]
        assert one_kernel(alone[0]) is not None and build_together(dev, alone) == 0, name
        with pytest.raises(CompileError):
            rt.build(alone[0])


def test_a_compiled_model_runs_on_programs_built_together_and_keep_builds_each_alone(dev, tmp_path):
    """``compile_model`` builds a model's kernels as shared programs, and its outputs match onnxruntime (as every
    model test checks); ``keep=True`` (``tuner compile``) builds each alone."""
    from conftest import with_reference
    from tuner.compile.compiler import compile_model
    from tuner.runtime.opencl.program import clear_program_cache
    from tuner.zoo.models import test_models
    model = test_models()["mixed"]
    for keep in (False, True):
        clear_program_cache(dev)
        mod = compile_model(model, device=dev, scope="texture", keep=keep)
        shared = [shared_program(dev, src) for src in mod.sources.values()]
        assert all(shared) if not keep else not any(shared), keep
        assert mod.load_stats["source"] == mod.load_stats["programs"] > 2
        x, want = with_reference(model, tmp_path / "m.onnx")
        np.testing.assert_allclose(mod.run([x])[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


IMAGE_KERNEL = """
__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;
__kernel void scale(__read_only image2d_t img, __global float4 *out, int width, float s) {
    int x = get_global_id(0), y = get_global_id(1);
    out[y * width + x] = read_imagef(img, smp, (int2)(x, y)) * s;
}
__kernel void border(__read_only image2d_t img, __global float4 *out) {
    out[0] = read_imagef(img, smp, (int2)(-1, 0));  /* outside: CLK_ADDRESS_CLAMP border = 0 */
}
"""


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kernel_reads_texture(dev, dtype):
    h, w = 5, 7
    host = np.random.default_rng(2).uniform(1, 2, (h, w, 4)).astype(dtype)
    img = alloc(dev, "texture", (h, w, 4), dtype)
    upload(dev, img, host)
    out = alloc(dev, "global", (h, w, 4), np.float32)
    prg = build_program(dev, IMAGE_KERNEL)
    cl.Kernel(prg, "scale")(dev.queue, (w, h), None, img.mem, out.mem, np.int32(w), np.float32(3.0))
    np.testing.assert_allclose(download(dev, out), host.astype(np.float32) * 3.0, rtol=1e-6)
    cl.Kernel(prg, "border")(dev.queue, (1,), None, img.mem, out.mem)
    assert np.all(download(dev, out)[0, 0] == 0)


@pytest.mark.parametrize("template", ["conv2d", "winograd2"])
def test_time_stream_runs_back_to_back_and_leaves_a_correct_output(dev, template):
    """``Executable.time_stream``: one seconds-per-run value per batch, the workspaces (Winograd's transformed
    tiles) handed back to their pool, and the output still the reference's after 3 x 4 runs of the batch."""
    from tuner.runtime.opencl.launch import build
    from tuner.templates import get_template
    conv = get_template("conv2d")
    wl = conv.workload(data=(1, 8, 10, 10), kernel=(8, 8, 3, 3), padding=(1, 1, 1, 1), bias=True, activation="relu")
    t = get_template(template)
    if template != "conv2d":
        wl = t.workload.of(wl)
    exe = build(t.build(wl, t.fallback_with(wl, dev)), dev)
    inputs = t.random_inputs(wl, np.random.default_rng(1))
    arrays = exe.upload_inputs(**inputs)
    costs = exe.time_stream(arrays, runs=4, repeats=3, warmup=1)
    assert len(costs) == 3 and all(np.isfinite(c) and c > 0 for c in costs), costs
    assert all(not p._in_use for p in exe.pools.values())  # every workspace released
    assert t.check(wl, exe.outputs_of(arrays), inputs) < t.tolerance(wl)


def test_gated_batch_releases_its_gate_when_an_enqueue_fails(dev):
    """A launch that cannot be enqueued (a work-group larger than the device allows) after one that was: the error reaches the caller, the gate is released, and the launch enqueued before it runs."""
    from tuner.runtime.opencl.stream import gated_batch
    knl = cl.Program(dev.context, "__kernel void one(__global float *o) { o[get_global_id(0)] = 1.0f; }").build().one
    out = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 16)
    cl.enqueue_fill_buffer(dev.queue, out, np.float32(0), 0, 16).wait()
    knl.set_args(out)
    wall, events = gated_batch(dev.context, dev.run_queue, [(knl, (4,), None)], runs=3)
    assert wall > 0 and len(events) == 3
    cl.enqueue_fill_buffer(dev.queue, out, np.float32(0), 0, 16).wait()
    with pytest.raises(cl.Error):
        too_big = 2 * dev.cl_device.max_work_group_size
        gated_batch(dev.context, dev.run_queue, [(knl, (2,), None), (knl, (too_big,), (too_big,))], runs=1)
    dev.run_queue.finish()  # returns: nothing is left waiting on the gate
    host = np.empty(4, np.float32)
    cl.enqueue_copy(dev.queue, host, out).wait()
    assert host.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_run_queue_has_no_profiling_and_the_profiling_queue_does(dev):
    props = cl.command_queue_properties
    assert dev.queue.properties & props.PROFILING_ENABLE
    assert not dev.run_queue.properties & props.PROFILING_ENABLE
    assert dev.run_queue is dev.run_queue and dev.run_queue.context == dev.context


def test_opencl_runtime_errors_are_device_errors_that_name_the_launch(dev, monkeypatch):
    """OpenCLRuntime turns pyopencl's errors into DeviceErrors (tuner.errors): a launch refused at enqueue
    carries its handle, and so does one that fails while the device runs it, found at the next wait by its
    event's error status (here user events stand for the driver's)."""
    from tuner.errors import DeviceError
    from tuner.runtime.opencl import OpenCLRuntime
    rt = OpenCLRuntime(dev)
    knl = rt.build("__kernel __attribute__((reqd_work_group_size(2, 1, 1))) void two(__global float *o) "
                   "{ o[get_global_id(0)] = 1.0f; }")
    out = rt.alloc("global", (4,), np.float32)
    good = rt.prepare(knl, "two", [out], (4, 1, 1), (2, 1, 1))
    refused = rt.prepare(knl, "two", [out], (4, 1, 1), (1, 1, 1))  # its reqd_work_group_size says (2, 1, 1)
    with pytest.raises(DeviceError, match="the launch was refused on .*INVALID_WORK_GROUP_SIZE") as e:
        rt.submit([good, refused])
    assert e.value.launch is refused
    rt.finish()
    assert rt.download(out).tolist() == [1.0] * 4  # the launch before the refused one ran
    with pytest.raises(DeviceError, match="setting up kernel 'three'"):
        rt.prepare(knl, "three", [out], (4, 1, 1), (2, 1, 1))

    done, failed = cl.UserEvent(dev.context), cl.UserEvent(dev.context)
    done.set_status(cl.command_execution_status.COMPLETE)
    failed.set_status(-5)  # CL_OUT_OF_RESOURCES, as a kernel that faulted reports it
    events = iter([done, failed])
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", lambda *a: next(events))
    rt.submit([good, refused])

    def finish():
        raise cl.RuntimeError("clFinish failed: OUT_OF_RESOURCES")
    monkeypatch.setattr(rt.device, "finish", finish)
    with pytest.raises(DeviceError, match="a launch failed while the device ran it") as e:
        rt.finish()
    assert e.value.launch is refused
    with pytest.raises(DeviceError) as e:  # nothing submitted since that wait: no launch to blame
        rt.finish()
    assert e.value.launch is None


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_model_inputs_and_outputs_staged_in_pinned_memory(conv3x3_onnx, scope, monkeypatch):
    """A model's inputs and outputs go through staging arrays in pinned host memory (one per pool and shape, reused
    by every run; the weights are not staged); a run right after another with other data gives that data's output, and
    the output is not the staging array itself (the next run would overwrite it). TUNER_RUN_PINNED=0 stages
    nothing and gives the same bytes."""
    import tuner
    x = np.random.default_rng(0).standard_normal((1, 8, 8, 8)).astype(np.float32)
    outs = {}
    for pinned in ("1", "0"):
        monkeypatch.setenv("TUNER_RUN_PINNED", pinned)
        m = tuner.compile_model(conv3x3_onnx(8), scope=scope)
        y1 = m.run([x])[0]
        y2 = m.run([2 * x])[0]
        assert np.allclose(y2, 2 * y1, rtol=1e-4, atol=1e-5)  # no bias: linear
        assert np.array_equal(m.run([x])[0], y1)
        staged = {(m.arrays[f"t:{n}"].mem.int_ptr, m.arrays[f"t:{n}"].physical_shape) for n in ("x", "y")}
        assert m.runtime.pinned_stages() == (len(staged) if pinned == "1" else 0)  # x and y may share a pool
        outs[pinned] = y1
    assert np.array_equal(outs["1"], outs["0"])


def test_binary_cache_folders_are_private_and_links_are_not_followed(dev, tmp_path):
    """The on-disk program cache (the user's, tuner.artifact.cache): folders 0700, files written as new files of our own
    (a link planted at the temporary name is left alone, its target untouched), and nothing read from a file or
    folder someone else can write."""
    import tuner.runtime.opencl.program as program
    cache = tmp_path / "bins"
    src = "__kernel void k%d(__global float *x) { x[get_global_id(0)] += %d.0f; }"
    build_program(dev, src % (1, 1), cache_dir=cache)
    path = program.binary_path(cache, dev.fingerprint, src % (1, 1))
    assert path.is_file() and path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
    victim = tmp_path / "victim"
    victim.write_text("precious")
    other = program.binary_path(cache, dev.fingerprint, src % (2, 2))
    planted = other.with_name(f".{other.name}.{os.getpid()}.tmp")
    planted.symlink_to(victim)
    build_program(dev, src % (2, 2), cache_dir=cache)
    assert victim.read_text() == "precious" and planted.is_symlink() and not other.exists()
    path.chmod(0o666)  # writable by anyone: proves nothing, so it is rebuilt from source
    program._CACHE.pop(dev, None)
    stats: dict = {}
    build_program(dev, src % (1, 1), cache_dir=cache, stats=stats)
    assert stats == {"source": 1}
    path.chmod(0o600)
    program._CACHE.pop(dev, None)
    stats = {}
    build_program(dev, src % (1, 1), cache_dir=cache, stats=stats)
    assert stats == {"binary": 1}


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_time_and_profile_run_from_the_inputs_set_not_from_what_the_last_run_left(scope):
    """The memory plan gives a model input's storage to a later tensor once the kernels reading it ran: a timed or
    profiled run right after another used to compute on what that run left there (the squeeze-excite net's output
    grew from 1.8 to 4e5 over 25 runs, and what some kernels cost with it). Module.time and Module.profile write the
    inputs last set again before every run (outside the timed span), as ``tuner-run --bench`` does: the output
    after them is the one run's output."""
    import tuner
    from tuner.zoo.models import test_models
    m = tuner.compile_model(test_models()["squeeze_excitation"], scope=scope)
    x = np.random.default_rng(0).standard_normal(m.spec.entries[m.spec.inputs[0]].shape).astype(np.float32)
    reused = {m.arrays[f"t:{n}"].mem.int_ptr for n in m.spec.inputs} & \
        {a.mem.int_ptr for k, a in m.arrays.items() if k.startswith("t:") and k[2:] not in m.spec.inputs}
    assert reused  # the premise: some later tensor lives in the input's storage
    y = m.run([x])[0]
    assert len(m.time(repeats=4, warmup=2)) == 4
    assert np.array_equal(m.get_outputs()[0], y)
    m.profile(repeats=3)
    assert np.array_equal(m.get_outputs()[0], y)
