"""A squeeze-excite gate computed by the convolution that reads it (issue 55, item 2: no launch for the gate):
``Conv2dWorkload.in_gate`` -- every work-group pools the row sums its depthwise producer wrote, squeezes and
excites into local memory, then reads its input times that gate -- and the pass that makes the graph,
``passes_se.gates_in_readers``, which ``--scope auto`` times beside the gates apart and in their producers."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import onnx
import pytest

from test_se_rows import matches_in_both_runtimes
from test_templates import scopes
from tuner.compile.compiler import compile_plan, load_graph, module_of, plan_graph
from tuner.graph.passes_se import gates_in_depthwise, gates_in_readers
from tuner.graph.reference import random_inputs, run_graph_numpy
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template
from tuner.templates.common import Conv2dWorkload
from tuner.templates.conv2d_nchw4c import Conv2dConfig, conv2d_nchw4c, gate_local_bound, gate_local_bytes

BUFFERS = scopes("buffer")
HSIGMOID = "hardsigmoid(0.1666666716337204)"
GATED = dict(in_scale=True, gate_act1="silu", gate_activation="sigmoid")
CASES = [
    ("1x1, 24 channels, texture", Conv2dWorkload((1, 24, 9, 7), (16, 24, 1, 1), bias=True, in_gate=6, **GATED),
     Conv2dConfig(wg_w=4, wg_h=2)),
    ("split_k 4, two images, 2 output blocks a work-item", Conv2dWorkload((2, 40, 6, 5), (12, 40, 1, 1), in_gate=10,
                                                                          **GATED),
     Conv2dConfig(wg_w=2, wg_h=2, split_k=4, tile_oc=2, **BUFFERS)),
    ("a lane a load, 10 channels (a ragged block), hard sigmoid", Conv2dWorkload(
        (1, 10, 6, 5), (8, 10, 1, 1), bias=True, residual=True, in_scale=True, in_gate=3, gate_act1="relu",
        gate_activation=HSIGMOID), Conv2dConfig(wg_w=8, wg_h=4, vec_load=1, **BUFFERS)),
    ("3x3 window, staged input tile", Conv2dWorkload((1, 16, 8, 8), (8, 16, 3, 3), padding=1, in_gate=4, **GATED),
     Conv2dConfig(wg_w=4, wg_h=4, local_input=True, **BUFFERS)),
    ("each block's 7 rows spread over 4 work-items, 64 in the work-group", Conv2dWorkload(
        (1, 16, 7, 5), (8, 16, 1, 1), bias=True, in_gate=4, **GATED), Conv2dConfig(wg_w=8, wg_h=8, tile_ow=1,
                                                                                   **BUFFERS)),
    ("more blocks than work-items, half storage", Conv2dWorkload((1, 96, 5, 5), (8, 96, 1, 1), dtype="float16",
                                                                  in_gate=8, **GATED),
     Conv2dConfig(wg_w=2, wg_h=2, **BUFFERS)),
]


@pytest.mark.parametrize("name,wl,cfg", CASES, ids=[c[0] for c in CASES])
def test_a_convolution_computes_the_gate_it_reads(device, rng, name, wl, cfg):
    """``in_gate``: S is the row sums of the input's maps; the kernel's output is the convolution of the input
    times ``se_gate``'s gate of those sums (the NumPy reference), on new inputs each launch. A gate off by a
    bias fails the check. (Where the work-group has work-items to spare, each block's rows are spread over
    several: ``se_gate.row_spread``.)"""
    if cfg.input_scope == "texture" and not device.info.image_support:
        pytest.skip(f"{device.info.name} has no image support: texture scope cannot run here (the others do)")
    t = get_template("conv2d")
    run = build(conv2d_nchw4c(wl, cfg), device)
    tol = 1e-2 if wl.dtype == "float16" else 1e-4
    for _ in range(3):
        inputs = t.random_inputs(wl, rng)
        assert inputs["S"].shape == (wl.data[0], wl.data[1], wl.data[2], 1)
        out = run(**inputs)
        assert t.check(wl, out, inputs) < tol
    bad = dict(inputs, B2=inputs["B2"] + np.asarray(1.0, inputs["B2"].dtype))
    assert t.check(wl, run(**bad), inputs) > 10 * tol  # the gate the kernel computes is the one checked


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_random_configs_with_a_gate_match_numpy(device, scope):
    """Random configs of the space for convolutions that compute their gate; the key has ``in_gate`` and its
    activations only when set, and the fallback is in the space."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip(f"{device.info.name} has no image support: texture scope cannot run here (the buffer case does)")
    from conftest import check_random_configs
    checks = []
    for seed, fields in enumerate([dict(data=(1, 24, 7, 7), kernel=(16, 24, 1, 1), bias=True, in_gate=6, **GATED),
                                   dict(data=(2, 20, 6, 9), kernel=(12, 20, 3, 3), padding=(1, 1, 1, 1),
                                        activation="relu", in_scale=True, in_gate=5, gate_act1="relu",
                                        gate_activation=HSIGMOID)]):
        checks += [("conv2d", fields, "float32", 10 * seed + k, scopes(scope)) for k in range(3)]
        t = get_template("conv2d")
        wl = t.workload(**fields)
        assert {"in_gate", "gate_act1", "gate_activation"} <= set(wl.key())
        plain = dataclasses.replace(wl, in_gate=0, gate_act1="none", gate_activation="none")
        assert not {"in_gate", "gate_act1", "gate_activation"} & set(plain.key())
        assert not t.space(wl, device).violations(t.config_values(wl, t.fallback(wl, device.info)))
    check_random_configs(device, checks)


def test_what_a_gate_needs_is_refused_otherwise():
    with pytest.raises(ValueError, match="in_gate"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_gate=2)  # no in_scale: no row sums to compute it from
    with pytest.raises(ValueError, match="in_gate"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_scale=True, scale_rows=True, in_gate=2)
    with pytest.raises(ValueError, match="in_gate"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_scale=True, in_gate=2, gate_act1="prelu")
    with pytest.raises(ValueError, match="in_gate"):  # their local memory is counted apart from the gate's
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_scale=True, in_gate=2, out_stats=1)
    with pytest.raises(ValueError, match="gate_act1"):
        Conv2dWorkload((1, 8, 4, 4), (8, 8, 1, 1), in_scale=True, gate_act1="relu")


@pytest.mark.parametrize("fields,fixed", [
    (dict(data=(1, 1152, 7, 7), kernel=(192, 1152, 1, 1), in_gate=48, **GATED), {}),
    (dict(data=(1, 96, 14, 14), kernel=(24, 96, 1, 1), in_gate=4, **GATED), {"split_k": 8}),
    (dict(data=(1, 64, 12, 12), kernel=(16, 64, 3, 3), padding=1, in_gate=16, **GATED), {"local_input": True}),
], ids=["1152-channels", "split", "staged-tile"])
def test_the_space_counts_the_gates_local_memory(device, fields, fixed):
    """Every sampled config declares no more local memory than ``gate_local`` counts: on a device with one byte
    less than it declares, the space refuses it. The gate's own arrays are ``gate_local_bytes``, at most the
    space's bound (``gate_local_bound``), by which the fallback sizes its work-group."""
    import re
    from test_norm_stats_in_producers import _local_memory_refusals
    wl = get_template("conv2d").workload(**fields)
    gate_arrays = {"igate", "ipooled", "ihidden", "ired1", "ired2", "ipart"}
    for cfg, src, used, refused in _local_memory_refusals(device, "conv2d", fields, 0, 6, **fixed):
        L = cfg.wg_w * cfg.wg_h * cfg.split_k
        gate = sum({"float4": 16, "float": 4}[ty] * int(n) for ty, name, n in
                   re.findall(r"__local (\w+) (\w+)\[(\d+)\];", src) if name in gate_arrays)
        assert gate == gate_local_bytes(wl, L) <= gate_local_bound(wl, L), cfg
        assert "gate_local" in refused, (cfg, used, refused)


@pytest.mark.parametrize("local_kib", [48, 32, 16])
def test_the_fallback_fits_the_gate_or_says_it_cannot(local_kib):
    """On GPU profiles of 48, 32 and 16 KiB of local memory, each gate's fallback lies in the space, its work-group
    shrunk or its split held where the gate's arrays take the room; where even one work-item's do not fit, a
    ValueError names in_gate."""
    from conftest import profile
    info = profile(name=f"gpu-{local_kib}k", local_mem_bytes=local_kib * 1024)
    t = get_template("conv2d")
    for C, S, HW, O in [(96, 4, 56, 24), (1152, 48, 7, 320), (2304, 96, 7, 384), (3840, 160, 7, 640)]:
        wl = t.workload(data=(1, C, HW, HW), kernel=(O, C, 1, 1), **GATED, in_gate=S)
        if gate_local_bound(wl, 1) > info.local_mem_bytes:
            with pytest.raises(ValueError, match="in_gate"):
                t.fallback(wl, info)
            continue
        cfg = t.fallback(wl, info)
        assert not t.space(wl, info).violations(t.config_values(wl, cfg)), (C, local_kib, cfg)


def _se_net_graph(tmp_path):
    from tuner.zoo.heldout import heldout_model
    path = tmp_path / "se_net.onnx"
    onnx.save(heldout_model("se_net"), path)
    return path, load_graph(str(path))


def test_the_pass_hands_each_gate_to_the_convolutions_that_read_it(tmp_path):
    """Every se_gate that pools a depthwise convolution's row sums goes; its reader reads the row sums and the
    gate's params (attr ``in_gate``) and names the gate; the graph computes what it did. ``names`` takes only
    those gates, and a gate the producer computes already is left there."""
    _, g = _se_net_graph(tmp_path)
    gates = [n.name for n in g.nodes if n.op == "se_gate"]
    assert len(gates) >= 2
    moved = gates_in_readers(g)
    assert not any(n.op == "se_gate" for n in moved.nodes)
    readers = [n for n in moved.nodes if n.attrs.get("in_gate")]
    assert sorted(n.attrs["gate_node"] for n in readers) == sorted(gates)
    for n in readers:
        p = moved.producer(n.attrs["in_scale"])
        assert p.attrs.get("row_sums") and n.inputs[-4:] == n.attrs["in_gate"]
    feeds = random_inputs(g)
    want = run_graph_numpy(g, feeds)["output"]
    for graph in (moved, gates_in_readers(g, {gates[0]}), gates_in_depthwise(gates_in_readers(g, {gates[0]}))):
        assert np.abs(run_graph_numpy(graph, feeds)["output"] - want).max() <= 1e-6 * np.abs(want).max()
    some = gates_in_readers(g, {gates[0]})
    assert [n.attrs["gate_node"] for n in some.nodes if n.attrs.get("in_gate")] == [gates[0]]
    assert [n.name for n in some.nodes if n.op == "se_gate"] == gates[1:]
    assert not any(n.attrs.get("in_gate") for n in gates_in_readers(gates_in_depthwise(g)).nodes)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_gates_in_their_readers_match_onnxruntime_in_both_runtimes(scope, native, cl_env, tmp_path):
    """Compiled on this device's fallbacks with every gate in its reader: no launch is left for a gate, and the
    model matches onnxruntime in the Python executor and in tuner-run (and its AddressSanitizer build)."""
    import onnxruntime as ort
    from conftest import building_cpu
    from tuner.runtime.opencl import open_device
    spec = building_cpu()
    device = open_device(spec)
    path, g = _se_net_graph(tmp_path)
    gates = sum(n.op == "se_gate" for n in g.nodes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = module_of(compile_plan(plan_graph(gates_in_readers(g), device.info, scope, None), device.info), device)
    assert not any(n.template == "se_gate" for n in mod.spec.nodes)
    assert sum(bool((n.workload or {}).get("in_gate")) for n in mod.spec.nodes) == gates
    x = np.random.default_rng(0).standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    sess = ort.InferenceSession(str(path))
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    matches_in_both_runtimes(mod, x, ref, spec, native, cl_env, tmp_path)


def test_each_gate_goes_where_its_kernels_measured_faster(tmp_path, monkeypatch):
    """``compiler._refine_squeeze_excite`` with kernel times given: gate A saves more in its reader than in its
    producer, gate B only in its producer. Besides all gates in their producers and all in their readers, the step
    plans A alone in its reader (``+some-gates-in-readers``) and each gate where it saves the more
    (``+gates-in-producers-and-readers``: A in its reader, B in its producer)."""
    from types import SimpleNamespace
    import tuner.compile.compiler as C
    _, g = _se_net_graph(tmp_path)
    a, b = [n.name for n in g.nodes if n.op == "se_gate"][:2]  # (B: and any other gate)

    def kernel_us(graph, n):  # apart: 5 us a node, 10 a gate; A: 6 us in its reader, 8 in its producer; B: 30, 6
        gate = n.attrs.get("gate_node")
        if n.op == "se_gate":
            return 10.0
        if n.attrs.get("in_gate"):
            return 6.0 if gate == a else 30.0
        if n.attrs.get("gate"):
            return 8.0 if gate == a else 6.0
        return 5.0

    def compile_(mode, graph):
        return SimpleNamespace(graph=graph, spec=SimpleNamespace(nodes=[SimpleNamespace(name=n.name, template=n.op)
                                                                        for n in graph.nodes]))
    monkeypatch.setattr(C, "_random_inputs", lambda m: SimpleNamespace(profile=lambda repeats: {"rows": [
        {"node": n.name, "median_s": kernel_us(m.graph, n) * 1e-6} for n in m.graph.nodes]}))
    monkeypatch.setattr(C, "GATES_IN_PRODUCERS_MISCOMPILED", ())
    out = {name: graph for name, _, graph in C._refine_squeeze_excite(compile_("auto", g), "auto", g, compile_, 1,
                                                                      SimpleNamespace(platform_tag="nvidia"))}
    assert {"auto+gates-in-producers", "auto+gates-in-readers", "auto+some-gates-in-readers",
            "auto+gates-in-producers-and-readers"} <= set(out), sorted(out)
    where = lambda graph, attr: {n.attrs["gate_node"] for n in graph.nodes if n.attrs.get(attr)}  # noqa: E731
    assert where(out["auto+some-gates-in-readers"], "in_gate") == {a}
    both = out["auto+gates-in-producers-and-readers"]
    assert where(both, "in_gate") == {a} and b in where(both, "gate") and a not in where(both, "gate")


def test_a_plan_this_device_cannot_run_is_left_out(tmp_path, monkeypatch):
    """Where the readers' plans cannot be compiled for the device (a gate its local memory cannot hold: the fallback's
    ValueError), the step leaves them out and times the others."""
    from types import SimpleNamespace
    import tuner.compile.compiler as C
    _, g = _se_net_graph(tmp_path)

    def compile_(mode, graph):
        if any(n.attrs.get("in_gate") for n in graph.nodes):
            raise ValueError("in_gate: the gate exceeds this device's local memory")
        return SimpleNamespace(graph=graph, spec=SimpleNamespace(nodes=[SimpleNamespace(name=n.name, template=n.op)
                                                                        for n in graph.nodes]))
    monkeypatch.setattr(C, "_random_inputs", lambda m: SimpleNamespace(profile=lambda repeats: {"rows": [
        {"node": n.name, "median_s": 1e-5} for n in m.graph.nodes]}))
    monkeypatch.setattr(C, "GATES_IN_PRODUCERS_MISCOMPILED", ())
    names = [name for name, _, _ in C._refine_squeeze_excite(compile_("auto", g), "auto", g, compile_, 1,
                                                              SimpleNamespace(platform_tag="nvidia"))]
    assert "auto+gates-in-producers" in names and not any("readers" in n for n in names), names


def test_a_gate_read_with_another_map_stays_apart():
    """A gate that pools the row sums of one depthwise output but multiplies another (a stride-2 branch): the reader
    would pool its own input's rows, so the pass leaves the gate where it is."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    C, S = 8, 2
    param = lambda name, *shape: numpy_helper.from_array(  # noqa: E731
        (0.5 * rng.standard_normal(shape)).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "wd"], ["d0"], group=C, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d0"], ["d"]),
             helper.make_node("Conv", ["x", "we"], ["e0"], group=C, pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["e0"], ["e"]),
             helper.make_node("GlobalAveragePool", ["d"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["q0"]), helper.make_node("Relu", ["q0"], ["q"]),
             helper.make_node("Conv", ["q", "w2", "b2"], ["g0"]), helper.make_node("Sigmoid", ["g0"], ["g"]),
             helper.make_node("Mul", ["e", "g"], ["m"]), helper.make_node("Conv", ["m", "wo"], ["y"])]
    graph = helper.make_graph(nodes, "gate_elsewhere", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      [1, C, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [param("wd", C, 1, 3, 3), param("we", C, 1, 3, 3), param("w1", S, C, 1, 1),
                               param("b1", S), param("w2", C, S, 1, 1), param("b2", C), param("wo", 8, C, 1, 1)])
    g = load_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    gate = next(n for n in g.nodes if n.op == "se_gate")
    assert "pixels" in gate.attrs  # it pools the row sums of d: a candidate but for its reader
    assert gates_in_readers(g) is g
