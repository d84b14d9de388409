"""A GroupNorm(1)'s statistics computed in the epilogue of the kernel that writes its input (issue 55): the
convolution's (``Conv2dWorkload.out_stats``) and the windowed pool's (``pool_kernel(out_stats=True)``), each
work-group's (count, mean, M2) merged by the last one to finish (``reduction.last_group_statistics``), so that
no statistics launch is left (``passes_layer_norm.norm_statistics_into_producers``)."""
from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from artifact_corpus import _copy, _edit_graph
from test_glue_heldout import _compiled, _rel, _tuner_run
from tuner.codegen.generate import generate
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template
from tuner.zoo.builder import _Builder


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fields", [
    dict(data=(1, 16, 9, 7), kernel=(8, 16, 3, 3), padding=1, bias=True),
    dict(data=(2, 8, 12, 12), kernel=(16, 8, 1, 1), bias=True, residual=True, activation="relu"),
    dict(data=(3, 12, 5, 5), kernel=(4, 12, 3, 3), stride=2, padding=1, bias=True),
    dict(data=(1, 32, 20, 20), kernel=(64, 32, 1, 1)),
], ids=["3x3", "residual-n2", "stride2-n3", "1x1-400px"])
def test_a_convolution_writes_its_output_statistics(device, fields, seed):
    """Random configs of each scope (split_k, tiles past the edges, several work-groups an image, several
    images): the output and its statistics (``unit_statistics``: the sums of x - K and of its square, K the
    image's first element, in lane 0) match NumPy."""
    from test_templates import check_random_config
    scope = ("texture", "buffer")[seed % 2]
    assert check_random_config(device, "conv2d", {**fields, "out_stats": True}, "float32", seed,
                               output_scope=scope) is not None


def test_out_stats_leaves_the_conv2d_key_and_refuses_what_it_cannot_sum():
    """The tuned records of the convolution apply (the loop nest is the same); a workload whose output is not
    written whole, or not in whole blocks of 4 channels, is refused with the reason."""
    t = get_template("conv2d")
    plain = t.workload(data=(1, 8, 6, 6), kernel=(8, 8, 1, 1))
    assert t.workload(data=(1, 8, 6, 6), kernel=(8, 8, 1, 1), out_stats=True).key() == plain.key()
    for bad in (dict(kernel=(6, 8, 1, 1)), dict(out_view=(8, 16))):
        with pytest.raises(ValueError, match="out_stats"):
            t.workload(**{"data": (1, 8, 6, 6), "kernel": (8, 8, 1, 1), "out_stats": True, **bad})


@pytest.mark.parametrize("shape,max_wg", [((1, 8, 64, 80), 16), ((2, 12, 9, 7), 256), ((1, 4, 1, 3), 64)])
def test_a_pool_writes_its_output_statistics_and_leaves_the_counter_at_zero(device, shape, max_wg):
    """The windowed pool's epilogue, in work-groups of each image, the last partial: its statistics match
    NumPy's; a work-group limit of 16 makes 40 slots a work-item for the last one to merge (past the unrolled
    32). Launched three times over one counter workspace, each launch's statistics are the same and the counter
    is zero after each."""
    from tuner.ops import kernels as K
    from tuner.runtime.opencl.memory import download
    from tuner.templates.reduction import unit_statistics
    prog = K.pool_kernel(shape, "avg", 3, 1, 1, False, "float32", "buffer", "buffer", max_wg, out_stats=True)
    exe = build(prog, device)
    x = np.random.default_rng(0).normal(2.0, 1.0, shape).astype(np.float32)
    arrays = exe.upload_inputs(X=x)
    want = unit_statistics(K.pool_reference(x.astype(np.float64), "avg", 3, 1, 1), 1)
    counters = {}

    def keep_counter(calls):  # the launch with the workspaces it was given, read back after it
        import pyopencl as cl
        fn, g, l_, args = calls[0]
        fn(device.queue, g, l_, *args)
        out = np.empty(shape[0], np.int32)
        cl.enqueue_copy(device.queue, out, args[-1], is_blocking=True)
        counters.setdefault("seen", []).append(out)
    for _ in range(3):
        exe._with_scratch(arrays, keep_counter)
        got = download(device, arrays["St"]).reshape(want.shape)
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (got, want)
    assert all(not c.any() for c in counters["seen"]), counters


def _norm_block(b: _Builder) -> dict:
    """A convolution, a PoolFormer token mixer (``t + (pool(n(t)) - n(t))``), an MLP and a residual, each
    GroupNorm(1) read by what follows: one norm's input a convolution's output, one a pool's, one a
    convolution's with a residual."""
    c = 16
    x = b.input("input", (1, 8, 12, 10))

    def gn(t, k):
        return b.node("GroupNormalization", [t, b.const(f"s{k}", b.rng.normal(1, 0.2, c)),
                                             b.const(f"b{k}", b.rng.normal(0, 0.2, c))], num_groups=1, epsilon=1e-5)
    t = b.conv(x, 8, c, 3, bias=True)
    y = gn(t, 0)
    p = b.node("AveragePool", [y], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)
    u = b.node("Add", [t, b.node("Sub", [p, y])])
    h = b.node("Relu", [b.conv(gn(u, 1), c, 2 * c, 1, bias=True)])
    v = b.node("Add", [b.conv(h, 2 * c, c, 1, bias=True), u])
    b.conv(gn(v, 2), c, 4, 1, bias=True, output="output")
    return {"output": [1, 4, 12, 10]}


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_no_statistics_launch_is_left_and_both_runtimes_match_onnxruntime(native, cl_env, scope, tmp_path,
                                                                       monkeypatch):
    """With the pass (the candidate ``fastest_plan`` times), the three norms' statistics come from the two
    convolutions and the pool that write their inputs: five launches (the model's input and output read and
    written in place), no group_norm. The
    Python executor (twice: the counters return to zero) and tuner-run (its counters zeroed when it loads) match
    onnxruntime, on an input of mean far from zero; tuner-run's AddressSanitizer build too; and a float16 plan."""
    import tuner.compile.compiler as C
    from conftest import building_cpu
    from tuner.compile.compiler import compile_model
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers
    plain = C.load_graph
    monkeypatch.setattr(C, "load_graph", lambda m, shapes=None: norm_statistics_into_producers(plain(m, shapes)))
    b = _Builder(seed=9, opset=21)
    mod, x, want = _compiled(b.model(_norm_block(b), "m"), scope, tmp_path, shift=3.0)
    kernels = [c.kernel for n in mod.spec.nodes for c in n.calls]
    assert kernels == ["conv2d_nchw4c", "avg_pool", "conv2d_nchw4c", "conv2d_nchw4c", "conv2d_nchw4c"], kernels
    assert sum(w.dtype == "int32" for w in mod.spec.workspaces) == 3
    for _ in range(2):
        assert _rel(mod.run([x])[0], want[0]) < 1e-4
    art = mod.save(tmp_path / "art")
    np.save(tmp_path / "x.npy", x)
    for program in ("tuner_run", "tuner_run_asan") if scope == "buffer" else ("tuner_run",):
        r = subprocess.run([native[program], str(art), "--device", building_cpu(), "--input", str(tmp_path / "x.npy"),
                            "--output", str(tmp_path / "y.npy")], capture_output=True, text=True,
                           env={**cl_env, "ASAN_OPTIONS": "detect_leaks=0"}, timeout=300)  # (the driver's leaks)
        assert r.returncode == 0 and "Sanitizer" not in r.stderr, r.stderr
        assert _rel(np.load(tmp_path / "y.npy"), want[0]) < 1e-4, program
    if scope == "buffer":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            half = compile_model(str(tmp_path / "m.onnx"), device=building_cpu(), scope=scope, dtype="float16")
        assert "group_norm_stats" not in [c.kernel for n in half.spec.nodes for c in n.calls]
        assert _rel(half.run([x])[0], want[0]) < 5e-3


def test_a_counter_workspace_is_checked_like_the_rest(native, cl_env, tmp_path, monkeypatch):
    """An int32 workspace is a counter the kernel's atomic_inc addresses: both runtimes load the artifact (both
    bounds analyses read ``atomic_inc(Sn + i)``), and refuse an int32 blob as a param or in a texture, or listed
    among a float16 artifact's float32 tensors."""
    import tuner.compile.compiler as C
    from conftest import building_cpu
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers
    from tuner.artifact import ArtifactError
    from tuner.compile.compiler import compile_model
    from tuner.runtime.module import load_module
    plain = C.load_graph
    monkeypatch.setattr(C, "load_graph", lambda m, shapes=None: norm_statistics_into_producers(plain(m, shapes)))
    b = _Builder(seed=9, opset=21)
    mod, x, _ = _compiled(b.model(_norm_block(b), "m"), "buffer", tmp_path)
    good = Path(mod.save(tmp_path / "art"))
    np.save(tmp_path / "x.npy", x)
    graph = json.loads((good / "graph.json").read_text())
    counter = next(i for i, w in enumerate(graph["workspaces"]) if w["dtype"] == "int32")

    def refused(name, edit, python_says, c_says):
        art = _copy(good, tmp_path / name)
        _edit_graph(art, edit)
        with pytest.raises(ArtifactError, match=python_says):
            load_module(art, device=building_cpu())
        r = subprocess.run([native["tuner_run"], str(art), "--device", building_cpu(), "--input",
                            str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")], capture_output=True,
                           text=True, env=cl_env, timeout=300)
        assert r.returncode == 2 and c_says in r.stderr, r.stderr

    refused("texture", lambda g: g["workspaces"][counter].update(scope="texture", physical_shape=[1, 1, 4]),
            "int32: a workspace in a buffer only", "int32: a workspace in a buffer only")

    def as_param(g):  # the counter moved to the params (params.bin has no bytes for it: refused before that)
        w = g["workspaces"].pop(counter)
        g["params"].append({**w, "offset": 0, "nbytes": 4 * int(np.prod(w["physical_shape"]))})
        for n in g["nodes"]:
            for c in n["calls"]:
                c["args"] = [f"p:{w['key']}" if a == f"w:{w['key']}" else a for a in c["args"]]
    refused("param", as_param, "int32: a workspace in a buffer only", "int32: a workspace in a buffer only")
    assert load_module(good, device=building_cpu()) is not None
    with warnings.catch_warnings():  # a float16 artifact's float32 list: a counter has no precision to record
        warnings.simplefilter("ignore")
        good = Path(compile_model(str(tmp_path / "m.onnx"), device=building_cpu(), scope="buffer",
                                  dtype="float16").save(tmp_path / "half"))
    graph = json.loads((good / "graph.json").read_text())
    key = next(w["key"] for w in graph["workspaces"] if w["dtype"] == "int32")
    refused("listed", lambda g: g["float32"].append(f"w:{key}"), "names no entry", "names no entry")


def test_the_norms_step_offers_statistics_in_their_producers(tmp_path, monkeypatch):
    """``_refine_norms`` times ``auto+stats-in-producers`` (and its plan in buffer scope) where a GroupNorm(1)'s
    statistics kernel reads a convolution's or a pool's output, and the readers then take one chunk."""
    import tuner.compile.compiler as C
    monkeypatch.setattr(C, "_same_plan", lambda a, b: False)  # (the stand-in compile returns no modules)
    b = _Builder(seed=9, opset=21)
    onnx.save(b.model(_norm_block(b), "m"), str(tmp_path / "m.onnx"))
    graph = C.load_graph(str(tmp_path / "m.onnx"))
    assert sum(n.op == "group_norm" and bool(n.attrs.get("stats")) for n in graph.nodes) == 3
    others = C._refine_norms("auto", graph, lambda scope, graph: (scope, graph))
    assert "auto+stats-in-producers" in others
    g = others["auto+stats-in-producers"][1]
    assert not any(n.op == "group_norm" for n in g.nodes)
    assert sorted(n.op for n in g.nodes if n.attrs.get("out_stats")) == ["avg_pool", "conv2d", "conv2d"]
    assert others["buffer+stats-in-producers"][0] == ("buffer", g)
    assert all(g.shapes[n.outputs[1]][1] == 8 for n in g.nodes if n.attrs.get("out_stats"))


def test_the_bounds_analysis_reads_atomic_inc_as_a_read_and_a_write():
    """``atomic_inc(P + i)`` addresses element i of the int buffer P (and writes it); any other form, or a float
    buffer, is refused, as a parameter passed to a function is."""
    from tuner.artifact.bounds import BoundsError, parse_source
    head = "__kernel void k(__global int* restrict Sn, __global float* restrict Y) {\n"
    src = parse_source(head + "  const int n = get_group_id(0);\n  Y[n] = (float)atomic_inc(Sn + (n * 2 + 1));\n}\n")
    ranges, _, writes = src.analyse_writes("k", (4, 1, 1), (1, 1, 1))
    assert ranges[0] == (1, 7) and writes[0] >= 1
    for body in ("atomic_inc(Sn);", "atomic_inc(&Sn[0]);", "atomic_inc(Y + 0);"):
        src = parse_source(head + f"  {body}\n}}\n")
        with pytest.raises(BoundsError):
            if isinstance(src, BoundsError):
                raise src
            src.analyse("k", (1, 1, 1), (1, 1, 1))


def test_a_runtime_measurement_starts_the_counters_at_zero(device):
    """Through a Runtime (the device agent's path, ``measure.runtime_runner.stage``) the int32 workspace is
    allocated with whatever the memory held: it is zeroed before the launch, so the statistics are written. The
    memory is made dirty first: the allocator is handed a buffer of -7s."""
    from tuner.op import run_op
    from tuner.runtime.opencl import OpenCLRuntime

    class Dirty(OpenCLRuntime):
        def alloc(self, scope, physical_shape, dtype):
            arr = super().alloc(scope, physical_shape, dtype)
            if np.dtype(dtype) == np.int32:
                self.upload(arr, np.full(physical_shape, -7, np.int32))
            return arr
    t = get_template("conv2d")
    wl = t.workload(data=(2, 8, 10, 9), kernel=(8, 8, 3, 3), padding=1, bias=True, out_stats=True)
    r = run_op(t, wl, device=Dirty(device), check=True)
    assert r.max_rel_error <= t.tolerance(wl)


def test_a_depthwise_convolution_keeps_its_statistics_kernel():
    """A depthwise convolution (here reading a channel view of a wider tensor, which only its viewed channels make
    depthwise) writes no statistics: its template's second output is its row sums."""
    from tuner.graph.graph import Graph, Node
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers
    rng = np.random.default_rng(0)
    g = Graph(inputs=["x"], outputs=["y"], shapes={"x": (1, 16, 6, 6), "d": (1, 8, 6, 6), "s": (1, 16), "y": (1, 8, 6, 6),
                                                 "w": (8, 1, 3, 3)},
              params={"w": rng.normal(size=(8, 1, 3, 3)).astype(np.float32)},
              nodes=[Node("conv2d", "dw", ["x", "w"], ["d"], {"groups": 8, "padding": (1, 1, 1, 1), "in_view": (8, 8)}),
                     Node("group_norm", "gn", ["d"], ["s"], {"groups": 1, "epsilon": 1e-5, "stats": 2}),
                     Node("relu", "r", ["d"], ["y"], {})])
    assert norm_statistics_into_producers(g) is g


def test_the_statistics_tree_counts_in_the_local_memory_a_config_may_use(device):
    """A config whose staged input tile fits a 4 KiB local memory alone, but not with the statistics' tree beside
    it, is valid for the convolution and not for the same one with ``out_stats`` (the compiler then takes the
    log's next record or the fallback, not a kernel that fails to build)."""
    import dataclasses
    t = get_template("conv2d")
    small = dataclasses.replace(device.info, local_mem_bytes=4096)
    wl = t.workload(data=(1, 16, 20, 20), kernel=(16, 16, 3, 3), padding=1, out_stats=True)
    plain = dataclasses.replace(wl, out_stats=False)
    cfg = t.config(tile_oc=1, tile_oh=1, tile_ow=1, wg_w=16, wg_h=8, local_input=True, input_scope="buffer",
                   weight_scope="buffer", output_scope="buffer")  # a 2,880-byte tile, a 2,048-byte tree
    assert t.space(plain, small).violations(t.config_values(plain, cfg)) == []
    assert [v.split(":")[0] for v in t.space(wl, small).violations(t.config_values(wl, cfg))] == ["out_stats_local"]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fields", [
    dict(data=(1, 8, 9, 7), kernel=(16, 8, 3, 3), padding=1, bias=True, out_stats=16),
    dict(data=(3, 12, 5, 5), kernel=(12, 12, 3, 3), stride=2, padding=1, out_stats=12),
    dict(data=(2, 8, 12, 12), kernel=(32, 8, 1, 1), bias=True, activation="relu", out_stats=4),
    dict(data=(1, 16, 20, 20), kernel=(64, 16, 1, 1), out_stats=2),
], ids=["instance", "instance-n3-stride2", "groups-of-2-blocks", "groups-of-8-blocks"])
def test_a_convolution_writes_its_instance_and_group_norm_statistics(device, fields, seed):
    """An InstanceNorm's (a block of 4 channels a unit, a lane a channel) and a GroupNorm's (groups of 2 and 8
    blocks: a tile holds groups, or a group spans tiles and its work-groups share a counter) statistics from the
    epilogue, in random configs of each scope, several images: they match ``unit_statistics``."""
    from test_templates import check_random_config
    scope = ("texture", "buffer")[seed % 2]
    assert check_random_config(device, "conv2d", fields, ("float32", "float16")[seed == 3], seed,
                               output_scope=scope) is not None


def test_out_stats_takes_the_groups_of_whole_blocks_and_a_tile_that_holds_or_divides_them(device):
    """``out_stats`` is the norm's groups: a group of 6 channels (not whole blocks) is refused by the workload,
    and a tile of 2 blocks over groups of 3 blocks (neither holds the other) by the space's ``out_stats_units``,
    which the fallback config keeps."""
    t = get_template("conv2d")
    with pytest.raises(ValueError, match="out_stats=4: the groups"):
        t.workload(data=(1, 8, 6, 6), kernel=(24, 8, 1, 1), out_stats=4)
    wl = t.workload(data=(1, 8, 6, 6), kernel=(24, 8, 1, 1), out_stats=2)  # 3 blocks a group
    cfg = t.config(tile_oc=2, tile_oh=1, tile_ow=1, wg_w=4, wg_h=4, input_scope="buffer", weight_scope="buffer",
                   output_scope="buffer")
    assert "out_stats_units" in [v.split(":")[0] for v in t.space(wl, device.info).violations(t.config_values(wl, cfg))]
    assert t.space(wl, device.info).violations(t.config_values(wl, t.fallback(wl, device.info))) == []
    assert "out_stats_units" not in [v.split(":")[0] for v in t.space(wl, device.info).violations(
        t.config_values(wl, t.config(tile_oc=1, tile_oh=1, tile_ow=1, wg_w=4, wg_h=4, input_scope="buffer",
                                     weight_scope="buffer", output_scope="buffer")))]


def _instance_block(b: _Builder) -> dict:
    """The style-transfer net's conv -> InstanceNorm -> ReLU -> 3x3 conv, then a GroupNorm ResNet's GroupNorm of
    2 blocks a group -> ReLU -> 3x3 conv: both norms read only by convolutions."""
    c = 16
    x = b.input("input", (2, 8, 12, 10))
    t = b.conv(x, 8, c, 3, bias=True)
    n = b.node("Relu", [b.node("InstanceNormalization", [t, b.const("s0", b.rng.normal(1, 0.2, c)),
                                                         b.const("b0", b.rng.normal(0, 0.2, c))], epsilon=1e-5)])
    u = b.conv(n, c, 2 * c, 3, bias=True)
    g = b.node("Relu", [b.node("GroupNormalization", [u, b.const("s1", b.rng.normal(1, 0.2, 2 * c)),
                                                      b.const("b1", b.rng.normal(0, 0.2, 2 * c))],
                               num_groups=4, epsilon=1e-5)])
    b.conv(g, 2 * c, 4, 3, bias=True, output="output")
    return {"output": [2, 4, 12, 10]}


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_instance_and_group_norms_leave_no_launch_and_both_runtimes_match_onnxruntime(native, cl_env, scope,
                                                                                    tmp_path, monkeypatch):
    """The norms applied as read (``norms_applied_as_read``) with their statistics in the producers: three
    convolution launches and nothing else. The Python executor (twice: the counters return to zero) and tuner-run
    match onnxruntime on an input of mean far from zero."""
    import tuner.compile.compiler as C
    from conftest import building_cpu
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers, norms_applied_as_read
    plain = C.load_graph
    monkeypatch.setattr(C, "load_graph", lambda m, shapes=None: norm_statistics_into_producers(
        norms_applied_as_read(plain(m, shapes))))
    b = _Builder(seed=5, opset=21)
    mod, x, want = _compiled(b.model(_instance_block(b), "m"), scope, tmp_path, shift=3.0)
    kernels = [c.kernel for n in mod.spec.nodes for c in n.calls]
    assert kernels == ["conv2d_nchw4c"] * 3, kernels
    assert sum(w.dtype == "int32" for w in mod.spec.workspaces) == 2
    for _ in range(2):
        assert _rel(mod.run([x])[0], want[0]) < 1e-4
    assert _rel(_tuner_run(mod, x, building_cpu(), native, cl_env, tmp_path), want[0]) < 1e-4


def test_a_float16_plans_shift_is_rounded_as_half_storage_rounds_without_half_arithmetic(device):
    """``as_stored``: the shift K of a float16 plan's statistics, rounded as ``vstore_half`` rounds (to nearest,
    ties to even; values across 12 decades, half's subnormals and overflow included, and exact ties), without half
    arithmetic -- a device without cl_khr_fp16 builds it (PoCL on a Zen CPU does not know ``convert_half4``)."""
    from tuner.ir.buffer import buffer
    from tuner.ir.builder import Builder
    from tuner.ir.expr import Ramp, as_expr
    from tuner.templates.reduction import as_stored
    n = 4096
    X, Y = buffer("X", (n, 4), "float32", "global"), buffer("Y", (n, 4), "float32", "global")
    b = Builder()
    with b.loop("i", n, "group.0") as i:
        b.store(Y, (i, Ramp(as_expr(0), as_expr(1), 4)), as_stored(X[i, Ramp(as_expr(0), as_expr(1), 4)], "float16"))
    rng = np.random.default_rng(0)
    x = (rng.normal(0, 1, (n, 4)) * 10.0 ** rng.integers(-8, 6, (n, 4))).astype(np.float32)
    h = rng.normal(0, 100, (n // 4, 4)).astype(np.float16)
    x[:n // 4] = h.astype(np.float32) + np.spacing(h).astype(np.float32) / 2  # exact ties
    got = np.asarray(build(b.kernel("k", [X, Y]), device)(X=x)["Y"])
    with np.errstate(over="ignore"):
        assert np.array_equal(got, x.astype(np.float16).astype(np.float32))


def test_the_norms_step_offers_instance_and_group_norms_with_no_launch(tmp_path, monkeypatch):
    """``_refine_norms`` offers ``auto+norms-as-read+stats-in-producers`` where an InstanceNorm's and a GroupNorm's
    readers can normalize them: no group_norm is left, each producer writes its norm's units (a block of 4
    channels an InstanceNorm's, a group a GroupNorm's), one chunk each."""
    import tuner.compile.compiler as C
    b = _Builder(seed=5, opset=21)
    onnx.save(b.model(_instance_block(b), "m"), str(tmp_path / "m.onnx"))
    graph = C.load_graph(str(tmp_path / "m.onnx"))
    monkeypatch.setattr(C, "_same_plan", lambda a, b: False)  # (the stand-in compile returns no modules)
    others = C._refine_norms("auto", graph, lambda scope, graph: (scope, graph))
    assert "auto+norms-as-read" in others and "auto+norms-as-read+stats-in-producers" in others
    g = others["auto+norms-as-read+stats-in-producers"][1]
    # also planned in buffer scope: on the H200 the per-layer plan gave gn32_resnet's producers texture configs
    # without split_k (2.9 ms against 0.77 in buffer scope)
    assert others["buffer+norms-as-read+stats-in-producers"][0] == ("buffer", g)
    assert not any(n.op == "group_norm" for n in g.nodes)
    writers = [n for n in g.nodes if n.attrs.get("out_stats")]
    assert [(n.attrs["out_stats"], g.shapes[n.outputs[1]]) for n in writers] == [(16, (2, 32)), (4, (2, 32))]


# gn32_resnet's layer3.0 conv1 in the H200's plan: a block's 4 slots merged by 4 of the 256 work-groups' items
H200_GN32 = dict(tile_oc=1, tile_oh=2, tile_ow=1, wg_w=8, wg_h=4, split_c=1, split_k=8, unroll_rs=True, vec_load=1,
                 local_input=False)
# gn32_resnet's layer2 3x3 convolutions' config in the H200's log: a block's 14 slots merged by 4 of the 512
# work-items of the last work-group (reduction.tail_items), the others' block index past the blocks
H200_GN32_LAYER2 = dict(tile_oc=2, tile_oh=2, tile_ow=1, wg_w=32, wg_h=1, split_c=2, split_k=16, unroll_rs=True,
                        vec_load=1, local_input=False)


@pytest.mark.parametrize("fields,knobs", [
    (dict(data=(1, 128, 28, 28), kernel=(256, 128, 3, 3), stride=2, padding=1, out_stats=32), H200_GN32),
    (dict(data=(1, 128, 28, 28), kernel=(128, 128, 3, 3), padding=1, out_stats=32), H200_GN32_LAYER2),
    (dict(data=(1, 64, 32, 32), kernel=(64, 64, 3, 3), padding=1, bias=True, out_stats=64), None),
    (dict(data=(2, 16, 20, 20), kernel=(64, 16, 1, 1), out_stats=2), None),
    (dict(data=(1, 32, 14, 14), kernel=(64, 32, 3, 3), padding=1, out_stats=1), None),
], ids=["gn32-stride2", "gn32-few-slots", "instance", "groups-of-8-blocks", "gn1"])
def test_the_statistics_address_only_their_workspaces(device, fields, knobs):
    """The artifact's bounds analysis (``tuner.artifact.bounds``, both runtimes' check 11) proves every index of
    the statistics' slots, counters and output inside what the plan allocates, for an H200 config and random
    configs of a GPU with large work-groups, among them a last work-group that merges a block's few slots with a
    few of its work-items (an earlier cut of that was refused on the H200: gn32_resnet's Sp[0..7039] of 4,096
    floats, the analysis reading no guard on the quotient that names a work-item's block)."""
    import dataclasses

    import numpy as np

    from tuner.artifact.bounds import parse_source
    from tuner.codegen.generate import generate
    from tuner.logs.record import scope_knobs
    t = get_template("conv2d")
    info = dataclasses.replace(device.info, type="GPU", max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64),
                               local_mem_bytes=49152, image_support=False)
    wl = t.workload(**fields)
    scopes = scope_knobs({"input": "buffer", "weight": "buffer", "output": "buffer"})
    space = t.space(wl, info, **t.model_knobs, **scopes)
    rng = np.random.default_rng(0)
    configs = [t.make_config(space.sample(rng)) for _ in range(3)]
    if knobs:
        configs.insert(0, dataclasses.replace(t.fallback_with(wl, info, **scopes, **t.model_knobs), **knobs))
    checked = 0
    for cfg in configs:
        prog, src = generate(t.build(wl, cfg))
        kern = prog.kernels[0]
        ranges, _ = parse_source(src).analyse(kern.name, *kern.launch())
        sizes = {p.name: int(np.prod(p.shape)) for p in (*prog.params, *prog.workspaces)
                 if p.name in ("St", "Sp", "Sn")}
        for p, r in zip((p.name for p in kern.params), ranges):
            if p in sizes and r is not None:
                assert 0 <= r[0] and r[1] < sizes[p], (p, r, sizes[p], cfg)
                checked += 1
    assert checked >= 3 * len(configs)


@pytest.mark.parametrize("fields,knobs", [
    (dict(data=(1, 4, 24, 22), kernel=(8, 4, 3, 3), padding=1, out_stats=8), dict(tile_oc=2, wg_w=2, wg_h=2)),
    (dict(data=(2, 8, 17, 16), kernel=(16, 8, 1, 1), bias=True, out_stats=2),
     dict(tile_oc=1, wg_w=2, wg_h=1, split_k=2)),
    (dict(data=(1, 8, 25, 22), kernel=(8, 8, 3, 3), padding=1, out_stats=1), dict(tile_oc=1, wg_w=2, wg_h=1)),
], ids=["instance-66-slots-an-item", "groups-of-2-blocks-68-slots-an-item", "gn1-275-slots-an-item"])
def test_the_last_work_group_merges_many_slots_a_work_item_in_batches(device, fields, knobs):
    """Small work-groups over a large plane leave the last work-group more than 32 slots a work-item to merge
    (``reduction.TAIL_BATCH`` of them loaded together, the last batch cut short), for a norm of blocks and for a
    GroupNorm(1): the statistics still match ``unit_statistics``, in several images."""
    import dataclasses

    from tuner.templates.reduction import TAIL_BATCH, tail_items, unit_statistics_layout
    t = get_template("conv2d")
    wl = t.workload(**fields)
    base = t.fallback_with(wl, device.info, input_scope="buffer", weight_scope="buffer", output_scope="buffer")
    cfg = dataclasses.replace(base, tile_oh=1, tile_ow=1, local_input=False, split_c=1, **{"split_k": 1, **knobs})
    N, _, OH, OW = wl.out_shape
    size, tiles = cfg.wg_w * cfg.wg_h * cfg.split_k, -(-OH // cfg.wg_h) * -(-OW // cfg.wg_w)
    if wl.out_stats > 1:  # last_group_unit_statistics: a block's slots over tail_items work-items
        layout = unit_statistics_layout(wl.kernel[0] // 4, wl.out_stats, wl.kernel[0], cfg.tile_oc, tiles)
        count = layout["slots"] // layout["tiles"]
        trips = -(-count // tail_items(count, layout["merge"], size))
    else:  # last_group_statistics: every slot of the image
        count = wl.kernel[0] // 4 // cfg.tile_oc * tiles
        trips = -(-count // tail_items(count, 1, size))
    assert trips > 32 and trips % TAIL_BATCH  # batches of TAIL_BATCH, the last one cut short
    exe = build(t.build(wl, cfg), device)
    inputs = t.random_inputs(wl, np.random.default_rng(0))
    for _ in range(2):  # the counters back at zero after a launch
        assert t.check(wl, exe(**inputs), inputs) <= t.tolerance(wl, cfg)


@pytest.mark.parametrize("fields", [
    dict(data=(1, 128, 28, 28), kernel=(128, 128, 3, 3), padding=1, out_stats=32),
    dict(data=(1, 3, 64, 64), kernel=(32, 3, 9, 9), padding=4, bias=True, out_stats=32),
    dict(data=(2, 16, 20, 20), kernel=(64, 16, 1, 1), out_stats=2),
    dict(data=(1, 32, 14, 14), kernel=(64, 32, 3, 3), padding=1, out_stats=1),
], ids=["gn32", "instance-9x9", "groups-of-8-blocks", "gn1"])
def test_the_space_counts_the_statistics_local_memory_a_config_allocates(device, fields):
    """A norm of blocks' statistics epilogue stages the work-group's output tile and reduces it in short trees
    (``reduction.last_group_unit_statistics``), a GroupNorm(1)'s merges a value a work-item in one tree
    (``last_group_statistics``); the space's ``out_stats_local`` bounds what each allocates: on a device with one
    byte less local memory than a config's kernel declares, that constraint refuses the config."""
    for cfg, src, used, refused in _local_memory_refusals(device, "conv2d", fields, seed=1, samples=6):
        assert ("sstage" in src) == (fields["out_stats"] > 1) and used > 0
        assert "out_stats_local" in refused, (cfg, used)


def test_tuning_a_statistics_writing_convolution_starts_from_its_loop_nests_best(tmp_path, device):
    """A task with no record of its own (here the same convolution without the activation its logged twin has),
    which an untuned compile runs with that loop nest's configs: its tuning measures the fastest of those first
    (``loop.nest_seeds``, labelled ``start: nest <workload>``); none once the log holds the task."""
    import dataclasses

    from tuner.logs.record import Record
    from tuner.search.loop import nest_seeds
    from tuner.search.tune import tune
    from tuner.task import TuningTask
    t = get_template("conv2d")
    scopes = {"input": "buffer", "weight": "buffer", "output": "buffer"}
    knobs = {f"{k}_scope": "buffer" for k in ("input", "weight", "output")}
    plain = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1, activation="relu")
    stats = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1, out_stats=8)
    fast = t.config(tile_oc=1, tile_oh=1, tile_ow=2, wg_w=4, wg_h=2, **knobs)
    slow = dataclasses.replace(fast, wg_w=2)
    assert fast != t.fallback_with(stats, device, **knobs)
    log = tmp_path / "dev.jsonl"
    log.write_text("".join(Record.new("conv2d", plain, c, device.info, costs=[s]).to_json() + "\n"
                           for c, s in ((slow, 2e-3), (fast, 1e-3))))
    task = TuningTask("conv2d", stats, scopes=scopes).bind(device.info)
    seeds = nest_seeds(str(log), task, device.info, task.space(device.info), {})
    assert [p["wg_w"] for p, _ in seeds] == [4, 2] and seeds[0][1] == t.key_label(plain.key())
    res = tune("conv2d", stats, device, trials=1, log=str(log), scopes=scopes, progress=False)
    assert res.measured == 1 and res.records[0].config == dataclasses.asdict(fast)
    assert nest_seeds(str(log), task, device.info, task.space(device.info), {"x": None}) == []


@pytest.mark.parametrize("data", [(1, 64, 7, 9), (2, 16, 4, 8), (1, 12, 5, 5), (3, 8, 3, 4), (2, 10, 3, 4)])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_a_layer_norm_writes_its_output_statistics(device, data, scope):
    """``LayerNormWorkload.out_stats``: random configs of the layer_norm template writing the GroupNorm(1)
    statistics of what they write (each work-item's running (count, mean, M2), merged over the work-group and by the
    last work-group of each image) against NumPy's -- batches of 2 and 3 (work-groups in one image: the space),
    a partial last block of channels."""
    from test_templates import check_random_config, scopes
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    for seed in (1, 2):
        assert check_random_config(device, "layer_norm", dict(data=data, out_stats=True), "float32", seed,
                                   **scopes(scope)) is not None


def test_a_layer_norms_statistics_keep_each_work_group_in_one_image(device):
    """With more than one image a work-group of rows must not cross into the next: the space refuses a
    units_per_wg that does not divide an image's positions, the template too, and the fallback takes a smaller
    one; the key is the norm's without the statistics (its record applies)."""
    t = get_template("layer_norm")
    wl = t.workload(data=(2, 16, 3, 4), out_stats=True)
    assert wl.key() == t.workload(data=(2, 16, 3, 4)).key()
    space = t.space(wl, device)
    assert all(12 % c["units_per_wg"] == 0 for c in space.configs())
    assert 12 % t.fallback(wl, device.info).units_per_wg == 0
    from tuner.templates.reduction import ReduceConfig
    with pytest.raises(ValueError, match="units_per_wg=8 does not divide the 12 positions"):
        t.build(wl, ReduceConfig(wg_reduce=4, units_per_wg=8, input_scope="buffer", weight_scope="buffer",
                                 output_scope="buffer"))
    with pytest.raises(ValueError, match="NCHW output"):
        t.workload(data=(2, 16), out_stats=True)


def _stem_layer_norm_block(b: _Builder) -> dict:
    """PoolFormerV2's stem and first token mixer: a strided convolution, a LayerNorm over its channels
    (LayerNorm2d), then ``t + (pool(n(t)) - n(t))`` with n a GroupNorm(1) of the LayerNorm's output, then a 1x1
    convolution."""
    from tuner.zoo.heldout import _ln_channels
    c = 16
    t = _ln_channels(b, b.conv(b.input("input", (1, 3, 16, 12)), 3, c, 3, stride=2, bias=True), c)
    y = b.node("GroupNormalization", [t, b.const("s0", b.rng.normal(1, 0.2, c)),
                                      b.const("b0", b.rng.normal(0, 0.2, c))], num_groups=1, epsilon=1e-5)
    p = b.node("AveragePool", [y], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0)
    b.conv(b.node("Add", [t, b.node("Sub", [p, y])]), c, 4, 1, bias=True, output="output")
    return {"output": [1, 4, 8, 6]}


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_a_stem_layer_norm_writes_the_statistics_of_the_group_norm_after_it(native, cl_env, scope, tmp_path,
                                                                           monkeypatch):
    """With the pass, the GroupNorm(1) read by the pool has its statistics from the LayerNorm that writes its input
    (``LayerNormWorkload.out_stats``): conv, layer_norm, pool, conv -- no group_norm launch. The Python executor
    (twice: the counters return to zero) and tuner-run match onnxruntime on an input of mean far from zero."""
    import tuner.compile.compiler as C
    from conftest import building_cpu
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers
    plain = C.load_graph
    monkeypatch.setattr(C, "load_graph", lambda m, shapes=None: norm_statistics_into_producers(plain(m, shapes)))
    b = _Builder(seed=10, opset=21)
    mod, x, want = _compiled(b.model(_stem_layer_norm_block(b), "m"), scope, tmp_path, shift=3.0)
    kernels = [c.kernel for n in mod.spec.nodes for c in n.calls]
    assert kernels == ["conv2d_nchw4c", "layer_norm", "avg_pool", "conv2d_nchw4c"], kernels
    assert sum(w.dtype == "int32" for w in mod.spec.workspaces) == 1  # the layer_norm's arrival counter
    for _ in range(2):
        assert _rel(mod.run([x])[0], want[0]) < 1e-4
    assert _rel(_tuner_run(mod, x, building_cpu(), native, cl_env, tmp_path), want[0]) < 1e-4


@pytest.mark.parametrize("template,fields,constraint", [
    ("layer_norm", dict(data=(1, 64, 56, 56), out_stats=True), "stats_local"),
    ("layer_norm", dict(data=(2, 48, 8, 8), out_stats=True), "stats_local"),
    ("dense", dict(data=(1, 768), weight=(1000, 768), bias=True, in_norm=1e-6), "local_memory")])
def test_the_space_counts_the_local_memory_of_the_new_statistics(device, template, fields, constraint):
    """A LayerNorm that writes its output's statistics merges a float4 a work-item after its row trees
    (``merge_group_statistics``), and a dense that normalizes its rows combines a split's row sums beside its
    partial sums: on a device with one byte less local memory than a config's kernel declares, the space refuses
    that config (the PoolFormerV2 stem's 1024-work-item groups needed 49,156 bytes against 49,152)."""
    checked = 0
    for cfg, _, used, refused in _local_memory_refusals(device, template, fields, seed=2, samples=12):
        if used:
            assert constraint in refused, (cfg, used)
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("extra,split_k,constraint", [
    ({}, 2, "split_k_partials"), (dict(out_stats=1), 4, "out_stats_local"), (dict(out_stats=8), 2, "out_stats_local"),
    (dict(out_norm=(8, 1e-5)), 4, "out_norm_local")], ids=["plain", "gn1-stats", "group-stats", "out-norm"])
def test_the_space_counts_a_splits_layer_norm_sums(device, extra, split_k, constraint):
    """Under a split, a convolution applying a LayerNorm as read adds its work-items' pixel sums through local
    memory (``pixel_norms``) beside the split's partial sums, and beside a statistics or norm epilogue's: on a
    device with one byte less local memory than a config's kernel declares, the space refuses that config."""
    fields = dict(data=(1, 40, 14, 14), kernel=(64, 40, 3, 3), stride=(2, 2), padding=1, bias=True,
                  in_layer_norm=1e-6, **extra)
    for cfg, src, used, refused in _local_memory_refusals(device, "conv2d", fields, seed=split_k, samples=3,
                                                          split_k=split_k):
        assert "lsp[" in src and used > 0
        assert constraint in refused, (cfg, used, refused)


def _local_memory_refusals(device, name: str, fields: dict, seed: int, samples: int, **fixed):
    """Yield ``(config, source, local bytes it declares, the constraints that refuse it on a device with one byte
    less local memory)`` for ``samples`` random buffer-scope configs of template ``name`` on a large GPU-like
    device (``fixed``: knobs held)."""
    import dataclasses
    import re

    from tuner.logs.record import scope_knobs
    t = get_template(name)
    big = dataclasses.replace(device.info, type="GPU", max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64),
                              local_mem_bytes=1 << 20, image_support=False)
    wl = t.workload(**fields)
    scopes = {**scope_knobs({"input": "buffer", "weight": "buffer", "output": "buffer"}), **fixed}
    space = t.space(wl, big, **t.model_knobs, **scopes)
    rng = np.random.default_rng(seed)
    bytes_of = {"float4": 16, "float": 4, "int": 4, "half4": 8, "half": 2}
    for _ in range(samples):
        cfg = t.make_config(space.sample(rng))
        _, src = generate(t.build(wl, cfg))
        used = sum(bytes_of[ty] * int(n) for ty, n in re.findall(r"__local (\w+) \w+\[(\d+)\];", src))
        tight = dataclasses.replace(big, local_mem_bytes=max(used - 1, 0))
        yield cfg, src, used, [v.split(":")[0] for v in t.space(wl, tight, **t.model_knobs, **scopes).violations(
            t.config_values(wl, cfg))]
