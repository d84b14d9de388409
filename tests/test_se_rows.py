"""Squeeze-excite pools inside their producers (issue 55, item 2): a depthwise convolution's epilogue also writes
each output row's sum (``row_sums``, Q), and the block's ``se_gate`` pools those rows, not the map. Checked against
NumPy on PoCL with random data, and whole models against onnxruntime."""
import dataclasses
import warnings

import numpy as np
import pytest

from test_templates import check_random_config, scopes
from tuner.compile.compiler import compile_model, load_graph
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes_se import split_squeeze_excite
from tuner.graph.reference import random_inputs, run_graph_numpy
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template
from tuner.templates.depthwise_conv2d_nchw4c import DepthwiseConfig, DepthwiseWorkload, depthwise_conv2d_nchw4c

HSIGMOID = "hardsigmoid(0.1666666716337204)"
BUFFERS = dict(input_scope="buffer", weight_scope="buffer", output_scope="buffer")
CASES = [
    ("3x3 silu, texture, one row a work-group", DepthwiseWorkload((1, 8, 9, 9), (8, 1, 3, 3), padding=1, bias=True,
                                                                 activation="silu", row_sums=True),
     DepthwiseConfig(tile_ow=2, wg_w=8)),
    ("5x5 stride 2, odd channels, buffer, 2 rows x 2 blocks a work-item, 2 rows of work-items",
     DepthwiseWorkload((2, 10, 13, 11), (10, 1, 5, 5), stride=2, padding=2, bias=True, activation="relu",
                       row_sums=True), DepthwiseConfig(tile_cb=2, tile_oh=2, tile_ow=4, wg_w=2, wg_h=2, **BUFFERS)),
    ("a work-group row of 6 (no power of two: summed in a loop)", DepthwiseWorkload(
        (1, 8, 12, 11), (8, 1, 3, 3), padding=1, bias=True, activation="relu", row_sums=True),
     DepthwiseConfig(tile_ow=2, wg_w=6, wg_h=2, **BUFFERS)),
    ("wider work-group than the row, local input, half storage", DepthwiseWorkload(
        (1, 12, 7, 7), (12, 1, 3, 3), padding=1, activation="relu6", dtype="float16", row_sums=True),
     DepthwiseConfig(tile_ow=1, wg_w=16, wg_h=2, local_input=True)),
]


@pytest.mark.parametrize("name,wl,cfg", CASES, ids=[c[0] for c in CASES])
def test_depthwise_row_sums_match_numpy(device, rng, name, wl, cfg):
    t = get_template("depthwise_conv2d")
    inputs = t.random_inputs(wl, rng)
    out = build(depthwise_conv2d_nchw4c(wl, cfg), device)(**inputs)
    ref = t.expected(t.reference(wl, inputs))
    assert set(ref) == {"Y", "Q"} and out["Q"].shape == wl.rows_shape == ref["Q"].shape
    tol = 1e-2 if wl.dtype == "float16" else 1e-4
    for k in ("Y", "Q"):
        assert np.abs(out[k] - ref[k]).max() / np.abs(ref[k]).max() < tol, k
    assert t.check(wl, out, inputs) < tol
    wrong = dict(out, Q=out["Q"] * 1.1)  # the harness looks at Q too
    assert t.check(wl, wrong, inputs) > tol


def test_row_sums_need_whole_rows_and_keep_the_old_keys(device):
    wl = DepthwiseWorkload((1, 8, 9, 20), (8, 1, 3, 3), padding=1, row_sums=True)
    with pytest.raises(ValueError, match="wg_w"):
        depthwise_conv2d_nchw4c(wl, DepthwiseConfig(tile_ow=2, wg_w=8))
    assert "row_sums" in wl.key() and "row_sums" not in DepthwiseWorkload((1, 8, 9, 20), (8, 1, 3, 3)).key()
    t = get_template("depthwise_conv2d")
    for kind in ("CPU", "GPU"):  # the fallback spans the row, and is valid in the space
        info = dataclasses.replace(device.info, type=kind, max_work_group_size=1024,
                                   max_work_item_sizes=(1024, 1024, 64))
        cfg = t.fallback(wl, info)
        assert cfg.wg_w * cfg.tile_ow >= 20
        assert not t.space(wl, info).violations(t.config_values(wl, cfg))


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_random_configs_of_both_halves_match_numpy(device, scope):
    """Random configs of the space: the depthwise convolution with row sums (Y and Q both checked by the
    template's check, as the tuner's measurements check them) and the gate pooling row sums (``pixels``)."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip(f"{device.info.name} has no image support: texture scope cannot run here (the buffer case does)")
    from conftest import check_random_configs
    checks = []
    for seed, fields in enumerate([dict(data=(1, 12, 14, 14), kernel=(12, 1, 3, 3), padding=(1, 1, 1, 1), bias=True,
                                        activation="silu", row_sums=True),
                                   dict(data=(1, 9, 11, 17), kernel=(9, 1, 5, 5), stride=(2, 2), padding=(2, 2, 2, 2),
                                        activation="relu", row_sums=True)]):
        checks += [("depthwise_conv2d", fields, "float32", 10 * seed + k, scopes(scope)) for k in range(3)]
    for k, fields in enumerate([dict(data=(1, 24, 14, 1), squeeze=6, act1="silu", activation="sigmoid", pixels=196),
                                dict(data=(2, 10, 6, 1), squeeze=3, act1="relu", activation=HSIGMOID, pixels=54)]):
        checks += [("se_gate", fields, "float32", 10 * k + seed, scopes(scope)) for seed in range(3)]
    check_random_configs(device, checks)  # on PoCL, built specialized to the local size (barriers in loops)


def _se_net():
    from tuner.zoo.heldout import heldout_model
    return heldout_model("se_net")


def test_the_pass_moves_each_pool_into_its_depthwise_producer_and_splits_back(tmp_path):
    """se_net (EfficientNet's and MobileNetV3's blocks): each se_gate reads its depthwise convolution's row sums;
    the optimized graph computes what the frontend's does; ``split_squeeze_excite`` (what ``fastest_plan`` times
    beside) puts the pool back on the map and drops the second output."""
    import onnx
    path = tmp_path / "se_net.onnx"
    onnx.save(_se_net(), path)
    raw = from_onnx(onnx.load(path))
    g = load_graph(str(path))
    gates = [n for n in g.nodes if n.op == "se_gate"]
    assert gates and all("pixels" in n.attrs for n in gates)
    for n in gates:
        p = g.producer(n.inputs[0])
        assert p.attrs.get("row_sums") and p.outputs[1] == n.inputs[0] and g.shapes[n.inputs[0]][3] == 1
        N, C, OH, OW = g.shapes[p.outputs[0]]
        assert n.attrs["pixels"] == OH * OW
    feeds = random_inputs(raw)
    want = run_graph_numpy(raw, feeds)
    for graph in (g, split_squeeze_excite(g), split_squeeze_excite(g, {gates[0].name})):
        got = run_graph_numpy(graph, feeds)
        for k in want:
            assert np.abs(got[k] - want[k]).max() <= 1e-4 * np.abs(want[k]).max()
    back = split_squeeze_excite(g)
    assert not any(n.attrs.get("row_sums") or len(n.outputs) > 1 for n in back.nodes)
    some = split_squeeze_excite(g, {gates[0].name})
    assert sum(1 for n in some.nodes if n.attrs.get("row_sums")) == len(gates) - 1


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_the_plan_writes_the_row_sums_in_the_convolutions_scope_and_each_gate_is_one_launch(tmp_path, scope):
    """On this device's fallback configs, in both scopes: each se_gate is one launch (its pool in the depthwise
    convolution's epilogue), the row sums stored as the convolution's output is, the model as onnxruntime."""
    import onnx
    import onnxruntime as ort
    path = tmp_path / "se_net.onnx"
    onnx.save(_se_net(), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(str(path), scope=scope)
    gates = [n for n in mod.spec.nodes if n.template == "se_gate"]
    assert gates and all(len(n.calls) == 1 for n in gates)
    rows = [n for n in mod.spec.nodes if n.template == "depthwise_conv2d" and n.workload.get("row_sums")]
    assert len(rows) == len(gates)
    for n in rows:
        q = next(a for a in n.calls[0].args if a.startswith("t:") and a.endswith(".rows"))
        args = n.calls[0].args  # X, Wt, B, (Res,) Y, Q: the output just before its row sums
        y = mod.spec.entries[args[args.index(q) - 1][2:]]
        assert mod.spec.entries[q[2:]].storage_scope == y.storage_scope
    x = np.random.default_rng(0).standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    sess = ort.InferenceSession(str(path))
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    got = mod.run([x])[0]
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_a_map_wider_than_a_work_group_row_keeps_its_pool():
    """A depthwise output wider than ``ROWS_MAX_WIDTH`` columns: no config of the space spans its rows, so the gate
    pools the map as before; a narrow one in the same model pools row sums."""
    from tuner.graph.passes_se import ROWS_MAX_WIDTH
    from tuner.zoo.builder import _Builder
    from tuner.zoo.heldout import _cbs, _se
    b = _Builder(seed=3, opset=17)
    x = b.input("input", (1, 8, 4, ROWS_MAX_WIDTH + 4))
    y = _cbs(b, x, 8, 8, 3, groups=8)
    y = b.conv(_se(b, y, 8, 2, "silu", "sigmoid"), 8, 8, 1)  # wide: the map's pool
    y = _cbs(b, y, 8, 8, 3, stride=2, groups=8)
    y = b.conv(_se(b, y, 8, 2, "relu", "hardsigmoid"), 8, 8, 1, output="output")  # half as wide: row sums
    g = load_graph(b.model({"output": [1, 8, 2, ROWS_MAX_WIDTH // 2 + 2]}, "wide"))
    gates = [n for n in g.nodes if n.op == "se_gate"]
    assert ["pixels" in n.attrs for n in gates] == [False, True]
    x = random_inputs(g)
    assert np.isfinite(run_graph_numpy(g, x)["output"]).all()


@pytest.mark.parametrize("tuned", ["maps", "rows"])
def test_a_compile_that_times_nothing_runs_the_gates_its_log_measured(device, tmp_path, tuned):
    """A fixed-scope compile (no plan timing): with a log that measured only the gates pooling their maps (tuned
    before the row sums), the gates pool their maps; once the row-sum gates are measured, they pool row sums."""
    import onnx
    from tuner.compile.compiler import extract_tasks, plan_graph
    from tuner.graph.passes_se import pool_maps_in_se_gates
    from tuner.search.tune import tune
    path = tmp_path / "se_net.onnx"
    onnx.save(_se_net(), path)
    log = tmp_path / "log.jsonl"
    g = load_graph(str(path))
    graph = pool_maps_in_se_gates(g) if tuned == "maps" else g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in extract_tasks(plan_graph(graph, device.info, "buffer", None)):
            if t.template == "se_gate":
                tune(t.template, t.workload, device, trials=1, log=str(log), scopes=t.scopes, fixed=t.fixed,
                     progress=False)
        mod = compile_model(str(path), log=str(log), device=device, scope="buffer")
    rows = [n for n in mod.spec.nodes if (n.workload or {}).get("row_sums")]
    gates = [n for n in mod.spec.nodes if n.template == "se_gate"]
    assert gates and len(rows) == (len(gates) if tuned == "rows" else 0)
    assert all(("pixels" in n.workload) == (tuned == "rows") for n in gates)


ADD_CASES = [  # (workload fields, fixed knobs): the addend's channels at an offset inside a pixel and at a whole one
    (dict(data=(1, 10, 8, 7), kernel=(10, 1, 3, 3), padding=1, bias=True, in_add=(30, 10)), dict(unroll_rs=True)),
    (dict(data=(2, 6, 9, 9), kernel=(6, 1, 3, 3), padding=1, in_add=(20, 12), activation="relu"),
     dict(local_input=True)),
    (dict(data=(1, 11, 6, 6), kernel=(11, 1, 5, 5), padding=2, in_add=(11, 0)), dict(unroll_rs=False)),
    (dict(data=(1, 14, 7, 7), kernel=(14, 1, 3, 3), padding=1, in_add=(42, 27), residual=True), dict()),
    (dict(data=(2, 10, 8, 7), kernel=(10, 1, 3, 3), padding=1, in_view=(8, 30)), dict()),  # X a chunk at 8 of 30
    (dict(data=(1, 9, 6, 6), kernel=(9, 1, 3, 3), padding=1, bias=True, in_view=(12, 24), in_add=(30, 21)),
     dict(local_input=True)),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("fields,fixed", ADD_CASES)
def test_depthwise_reads_its_input_plus_a_slice_of_another(device, fields, fixed, dtype):
    """``in_add``: the input read is X plus channels offset.. of A (EdgeNeXt's SDTA cascade: each chunk of the map
    plus the previous depthwise output), at offsets inside an RGBA pixel too; ``in_view``: X itself a chunk of a
    larger tensor at a whole pixel; random configs of the space in each case against the NumPy reference; the
    workload key has each field only when it is set."""
    for seed in range(3):
        check_random_config(device, "depthwise_conv2d", fields, dtype, seed, **fixed)
    wl = DepthwiseWorkload(**fields)
    for k in ("in_add", "in_view"):
        assert wl.key().get(k) == (list(fields[k]) if k in fields else None)
    assert not {"in_add", "in_view"} & set(dataclasses.replace(wl, in_add=(), in_view=()).key())
    with pytest.raises(ValueError, match="in_add"):
        DepthwiseWorkload((1, 10, 8, 7), (10, 1, 3, 3), in_add=(12, 4))
    with pytest.raises(ValueError, match="in_view"):
        DepthwiseWorkload((1, 10, 8, 7), (10, 1, 3, 3), in_view=(2, 12))


# -- the gate computed by the depthwise convolution's last work-group (``gate``) -----------------------------

SILU_GATE = dict(gate_act1="silu", gate_activation="sigmoid")
GATE_CASES = [
    ("3x3 silu, texture, one row a work-group", DepthwiseWorkload(
        (1, 8, 9, 9), (8, 1, 3, 3), padding=1, bias=True, activation="silu", gate=2, **SILU_GATE),
     DepthwiseConfig(tile_ow=2, wg_w=8)),
    ("5x5 stride 2, odd channels, two images, buffer, 2 rows x 2 blocks a work-item", DepthwiseWorkload(
        (2, 10, 13, 11), (10, 1, 5, 5), stride=2, padding=2, bias=True, activation="relu", gate=3, gate_act1="relu",
        gate_activation=HSIGMOID), DepthwiseConfig(tile_cb=2, tile_oh=2, tile_ow=4, wg_w=2, wg_h=2, **BUFFERS)),
    ("96 channels, 64 work-items: the squeeze's and the excite's trees", DepthwiseWorkload(
        (1, 96, 14, 14), (96, 1, 3, 3), padding=1, gate=4, **SILU_GATE), DepthwiseConfig(wg_w=16, wg_h=4)),
    ("a work-group of 6 x 2 (no power of two: the trees of 4)", DepthwiseWorkload(
        (1, 8, 12, 11), (8, 1, 3, 3), padding=1, bias=True, activation="relu", gate=2, **SILU_GATE),
     DepthwiseConfig(tile_ow=2, wg_w=6, wg_h=2, **BUFFERS)),
    ("one work-item a work-group", DepthwiseWorkload(
        (1, 8, 5, 3), (8, 1, 3, 3), padding=1, gate=2, gate_act1="relu", gate_activation="sigmoid"),
     DepthwiseConfig(tile_ow=4, wg_w=1)),
    ("local input, half storage", DepthwiseWorkload(
        (1, 12, 7, 7), (12, 1, 3, 3), padding=1, activation="relu6", dtype="float16", gate=3, gate_act1="relu",
        gate_activation="sigmoid"), DepthwiseConfig(tile_ow=1, wg_w=16, wg_h=2, local_input=True)),
]


@pytest.mark.parametrize("name,wl,cfg", GATE_CASES, ids=[c[0] for c in GATE_CASES])
def test_depthwise_computes_its_gate_in_the_last_work_group(device, rng, name, wl, cfg):
    """``gate``: Q is the squeeze-excite gate of the output (``se_gate``'s reference of Y), computed by the last
    work-group of each image to finish from the row sums the others left in a workspace. Three launches of one
    kernel on new inputs each: the last work-group returns each image's counter to zero, or the next launch would
    compute no gate."""
    t = get_template("depthwise_conv2d")
    run = build(depthwise_conv2d_nchw4c(wl, cfg), device)
    tol = 1e-2 if wl.dtype == "float16" else 1e-4
    for _ in range(3):
        inputs = t.random_inputs(wl, rng)
        out = run(**inputs)
        ref = t.expected(t.reference(wl, inputs))
        assert out["Q"].shape == (wl.data[0], wl.data[1], 1, 1) == ref["Q"].shape
        for k in ("Y", "Q"):
            assert np.abs(out[k] - ref[k]).max() / np.abs(ref[k]).max() < tol, k
        assert t.check(wl, out, inputs) < tol
    assert t.check(wl, dict(out, Q=out["Q"] * 1.1), inputs) > tol  # the harness looks at the gate too


def test_a_gate_pocl_miscompiles_is_right_elsewhere_and_the_rows_fill_whole_lines():
    """The config PoCL 3.0-rc2 builds wrongly when it optimizes (``compiler.GATES_IN_PRODUCERS_MISCOMPILED``: no
    gate-computing plan is offered there): Intel's CPU runtime computes it right, three images of 6 channels on 4
    work-items. Each image's row sums start a 128-byte line of the workspace."""
    from conftest import building_cpu
    from tuner.runtime.opencl import open_device
    from tuner.templates.depthwise_conv2d_nchw4c import gate_rows_shape
    from tuner.templates.reduction import SLOT_ALIGN
    for wl in (DepthwiseWorkload((3, 6, 7, 5), (6, 1, 3, 3), padding=1, gate=2, gate_act1="relu",
                                 gate_activation="sigmoid"), GATE_CASES[1][1], GATE_CASES[2][1]):
        N, C, OH, _ = gate_rows_shape(wl)
        assert C >= wl.data[1] and C % 4 == 0 and C // 4 * OH % SLOT_ALIGN == 0
    device = open_device(building_cpu("intel"))
    t = get_template("depthwise_conv2d")
    run = build(depthwise_conv2d_nchw4c(wl := DepthwiseWorkload(
        (3, 6, 7, 5), (6, 1, 3, 3), padding=1, bias=True, activation="relu", gate=2, gate_act1="relu",
        gate_activation="sigmoid"), DepthwiseConfig(tile_ow=2, wg_w=4, **BUFFERS)), device)
    rng = np.random.default_rng(0)
    for _ in range(3):
        inputs = t.random_inputs(wl, rng)
        assert t.check(wl, run(**inputs), inputs) < 1e-4


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_random_configs_with_a_gate_match_numpy(device, scope):
    """Random configs of the space for depthwise convolutions that compute their gate (the work-group spans whole
    rows; its size sets the squeeze's and the excite's sharing: ``gate_rule``); the key has ``gate`` only when
    set, and the fallback is valid."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip(f"{device.info.name} has no image support: texture scope cannot run here (the buffer case does)")
    from conftest import check_random_configs
    checks = []
    for seed, fields in enumerate([dict(data=(1, 24, 14, 14), kernel=(24, 1, 3, 3), padding=(1, 1, 1, 1), bias=True,
                                        activation="silu", gate=6, gate_act1="silu", gate_activation="sigmoid"),
                                   dict(data=(2, 9, 11, 17), kernel=(9, 1, 5, 5), stride=(2, 2), padding=(2, 2, 2, 2),
                                        activation="relu", gate=3, gate_act1="relu", gate_activation=HSIGMOID)]):
        checks += [("depthwise_conv2d", fields, "float32", 10 * seed + k, scopes(scope)) for k in range(3)]
        wl = get_template("depthwise_conv2d").workload(**fields)
        assert {"gate", "gate_act1", "gate_activation"} <= set(wl.key())
        assert not {"gate", "gate_act1", "gate_activation"} & set(dataclasses.replace(wl, gate=0).key())
        t = get_template("depthwise_conv2d")
        assert not t.space(wl, device).violations(t.config_values(wl, t.fallback(wl, device.info)))
    check_random_configs(device, checks)  # on PoCL, built specialized to the local size
    with pytest.raises(ValueError, match="gate"):
        DepthwiseWorkload((1, 8, 9, 9), (8, 1, 3, 3), row_sums=True, gate=2, gate_act1="relu",
                          gate_activation="sigmoid")


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_gates_in_their_producers_match_onnxruntime_in_both_runtimes(scope, native, cl_env, tmp_path):
    """``passes_se.gates_in_depthwise``: each se_gate that pools a depthwise convolution's row sums goes, the
    convolution computing the gate (``gates_apart`` gives the graph back); compiled on this device's fallbacks, no
    launch is left for a gate, and the model matches onnxruntime in the Python executor and in tuner-run (and its
    AddressSanitizer build)."""
    import onnx
    import onnxruntime as ort
    from conftest import building_cpu
    from tuner.compile.compiler import compile_plan, module_of, plan_graph
    from tuner.graph.passes_se import gates_apart, gates_in_depthwise
    from tuner.runtime.opencl import open_device
    spec = building_cpu()
    device = open_device(spec)
    path = tmp_path / "se_net.onnx"
    onnx.save(_se_net(), path)
    g = load_graph(str(path))
    fused = gates_in_depthwise(g)
    gates = [n.name for n in g.nodes if n.op == "se_gate"]
    assert gates and not any(n.op == "se_gate" for n in fused.nodes)
    assert sorted(n.attrs["gate_node"] for n in fused.nodes if n.attrs.get("gate")) == sorted(gates)
    same = lambda a, b: [(n.op, n.name, n.inputs, n.outputs, n.attrs) for n in a.nodes] == \
        [(n.op, n.name, n.inputs, n.outputs, n.attrs) for n in b.nodes]  # noqa: E731
    assert same(gates_apart(fused), g)
    some = gates_in_depthwise(g, {gates[0]})  # only the gates named (``+some-gates-in-producers``)
    assert [n.attrs.get("gate_node") for n in some.nodes if n.attrs.get("gate")] == [gates[0]]
    assert [n.name for n in some.nodes if n.op == "se_gate"] == gates[1:]
    feeds = random_inputs(g)
    want = run_graph_numpy(g, feeds)["output"]
    assert np.abs(run_graph_numpy(fused, feeds)["output"] - want).max() <= 1e-6 * np.abs(want).max()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = module_of(compile_plan(plan_graph(fused, device.info, scope, None), device.info), device)
    assert not any(n.template == "se_gate" for n in mod.spec.nodes)
    assert sum(bool((n.workload or {}).get("gate")) for n in mod.spec.nodes) == len(gates)
    x = np.random.default_rng(0).standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    sess = ort.InferenceSession(str(path))
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    matches_in_both_runtimes(mod, x, ref, spec, native, cl_env, tmp_path)


def matches_in_both_runtimes(mod, x, ref, spec: str, native, cl_env, tmp_path) -> None:
    """``mod`` on ``x`` matches ``ref`` to 1e-4 of its largest magnitude in the Python executor, and saved, in
    tuner-run and its AddressSanitizer build."""
    import subprocess
    assert np.abs(mod.run([x])[0] - ref).max() <= 1e-4 * np.abs(ref).max()
    art = mod.save(tmp_path / "art")
    np.save(tmp_path / "x.npy", x)
    for exe in ("tuner_run", "tuner_run_asan"):
        r = subprocess.run([native[exe], str(art), "--device", spec, "--input", str(tmp_path / "x.npy"), "--output",
                            str(tmp_path / "y.npy")], capture_output=True, text=True, env=cl_env, timeout=300)
        assert r.returncode == 0, (exe, r.stderr)
        assert np.abs(np.load(tmp_path / "y.npy") - ref).max() <= 1e-4 * np.abs(ref).max(), exe
