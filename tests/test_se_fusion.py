"""Issue 55, item 2: a squeeze-excite block without launches of its own besides one. The pool and both 1x1
convolutions of the gate (``passes_se.fuse_squeeze_excite``) are one ``se_gate`` node, which the ``se_gate``
template runs in one launch (two with its pool split along the pixels); the gate is read by the next convolution
(``in_scale``). Checked against NumPy per config, against the unfused graph and onnxruntime per model, in both
scopes and both runtimes, with the launches between a block's producer and its gated convolution counted."""
from __future__ import annotations

import dataclasses
import subprocess
import warnings

import numpy as np
import onnx
import pytest

import tuner.graph.passes as passes
from test_templates import scopes
from tuner.compile.compiler import compile_model, load_graph
from tuner.frontend.onnx import from_onnx
from tuner.graph.reference import random_inputs, run_graph_numpy
from tuner.templates import get_template, templates
from tuner.zoo.builder import _Builder
from tuner.zoo.heldout import _cbs, _se

pytestmark = pytest.mark.xdist_group("se_fusion")
HSIGMOID = "hardsigmoid(0.1666666716337204)"


# -- the template against NumPy -------------------------------------------------------------------------------

WORKLOADS = [dict(data=(1, 10, 5, 7), squeeze=3, act1="silu", activation="sigmoid"),  # channels not a multiple of 4
             dict(data=(2, 24, 6, 6), squeeze=6, act1="relu", activation=HSIGMOID),  # two images
             dict(data=(1, 72, 9, 9), squeeze=18, act1="relu", activation=HSIGMOID),
             dict(data=(1, 36, 16, 15), squeeze=9, act1="silu", activation="sigmoid")]


@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("fields", WORKLOADS, ids=lambda f: "x".join(map(str, f["data"])))
def test_se_gate_matches_numpy(device, fields, scope):
    """Random configs of the space -- one launch, or the pool split over the pixels into its own kernel, or the
    pool and the squeeze's partial dots in a kernel of their own; the excite spread over work-groups that each
    pool and squeeze again, or its sums over work-items; either local axis inner -- and those variants forced, in
    float32 and float16 storage (``conftest.check_random_configs``: on PoCL, built specialized to the local
    size)."""
    from conftest import check_random_configs
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    checks = [("se_gate", fields, "float32", seed, scopes(scope)) for seed in range(3)]
    two = 2 if fields["data"][1] > 12 else 1  # the excite over two work-groups: each excites a block at least
    # the excite's sums over the squeeze channels shared by 2 or 4 work-items (4 does not divide S = 3, 6, 9, 18)
    # and the loops over the weights unrolled; the squeeze's dots split over the pool's work-groups, 2 channel
    # blocks each (C = 10: the last group half past C), alone or with the pool split too
    for split, groups, shared, unroll, partial in ((1, two, 1, False, False), (2, 1, 1, True, False),
                                                   (1, two, 4, True, False), (2, 1, 2, False, False),
                                                   (1, two, 2, False, True), (2, 1, 1, True, True)):
        small = dict(wg_c=2, wg_p=4) if shared > 1 or partial else {}  # 8 work-items: the excite takes rounds
        checks.append(("se_gate", fields, "float32", 7, dict(split=split, excite_groups=groups, excite_split=shared,
                                                             unroll=unroll, partial_squeeze=partial, **small,
                                                             **scopes(scope))))
    if scope == "buffer" or device.info.half_images:
        checks.append(("se_gate", fields, "float16", 11, scopes(scope)))
    check_random_configs(device, checks)


@pytest.mark.parametrize("kind", ["CPU", "GPU"])
def test_fallbacks_are_valid_and_pick_their_variant(device, kind):
    """The fallback is a valid config on this device and on a large GPU; a CPU pools in one launch with no tree;
    a GPU splits a large map's pool into a kernel of its own (two launches) and keeps a small one in one."""
    from conftest import profile
    t = get_template("se_gate")
    info = device.info if kind == "CPU" else profile()
    for f in WORKLOADS + [dict(data=(1, 32, 112, 112), squeeze=8), dict(data=(1, 1152, 7, 7), squeeze=48)]:
        wl = t.workload(**f)
        cfg = t.fallback(wl, info)
        t.space(wl, info).check(t.config_values(wl, cfg))
        if kind == "GPU":
            assert (cfg.split > 1) == (wl.data[2] >= 112), (f, cfg)
        elif info.type != "GPU":
            assert cfg.split == 1 and (cfg.wg_p == 1 or wl.data[2] * wl.data[3] > 1024), (f, cfg)


def test_the_gpu_fallback_shares_the_excite_only_where_its_tree_fits():
    """The GPU fallback's excite_split takes the work-items a group has to spare, and a second local tree of the
    group's size with it: on a GPU of 16 KiB of local memory and 256 work-items, EfficientNet-B4's last gate (672
    blocks, S 112) broke the space's local_memory constraint with it, and ran a random config instead."""
    from conftest import profile
    t = get_template("se_gate")
    small = profile(max_work_group_size=256, max_work_item_sizes=[256, 256, 64], local_mem_bytes=16384)
    for info in (small, profile()):
        for f in (dict(data=(1, 2688, 7, 7), squeeze=112), dict(data=(1, 1152, 7, 7), squeeze=48),
                  dict(data=(1, 96, 56, 1), squeeze=4, pixels=3136)):
            wl = t.workload(**f)
            cfg = t.fallback(wl, info)
            t.space(wl, info).check(t.config_values(wl, cfg))
    assert t.fallback(t.workload(data=(1, 2688, 7, 7), squeeze=112), small).excite_split == 1
    assert t.fallback(t.workload(data=(1, 1152, 7, 7), squeeze=48), profile()).excite_split > 1


def test_workload_key_and_label():
    t = get_template("se_gate")
    wl = t.workload(data=(1, 96, 14, 14), squeeze=4, act1="silu", activation="sigmoid")
    assert wl.key() == {"op": "se_gate", "data": [1, 96, 14, 14], "squeeze": 4, "act1": "silu",
                        "activation": "sigmoid", "dtype": "float32"}
    assert t.label(wl) == "1x96x14x14 ->4 +silu +sigmoid" and wl.out_shape == (1, 96, 1, 1)


# -- blocks: the pass, the launches, onnxruntime --------------------------------------------------------------

def _efficientnet_block(b: _Builder) -> dict:
    """EfficientNet's MBConv6 (torchvision): 1x1 expand + SiLU, depthwise 3x3 + SiLU, squeeze-excite (a quarter of
    the block's input channels, SiLU, Sigmoid, the gate first in the Mul as torchvision exports it), 1x1 project,
    residual; then a strided block whose SE pool is a ReduceMean over (2, 3) (timm's ``x.mean((2, 3),
    keepdim=True)``)."""
    x = b.input("input", (1, 8, 12, 12))
    y = _cbs(b, _cbs(b, x, 8, 48, 1), 48, 48, 3, groups=48)
    s = _se(b, y, 48, 2, "silu", "sigmoid")
    y = b.bn(b.conv(s, 48, 8, 1), 8)
    x = b.node("Add", [y, x])
    y = _cbs(b, _cbs(b, x, 8, 48, 1), 48, 48, 5, stride=2, groups=48)
    p = b.node("ReduceMean", [y], axes=[2, 3], keepdims=1)
    q = b.node("Mul", [c := b.conv(p, 48, 2, 1, bias=True), b.node("Sigmoid", [c])])
    g = b.node("Sigmoid", [b.conv(q, 2, 48, 1, bias=True)])
    b.node("Identity", [b.bn(b.conv(b.node("Mul", [g, y]), 48, 12, 1), 12)], output="output")
    return {"output": [1, 12, 6, 6]}


def _mobilenet_v3_block(b: _Builder) -> dict:
    """MobileNetV3's bneck (torchvision): 1x1 expand + HardSwish, depthwise 5x5 + HardSwish, squeeze-excite with a
    ReLU squeeze and a HardSigmoid(1/6, 1/2) gate, 1x1 project, residual; a ReLU block before it; two images."""
    x = b.input("input", (2, 12, 10, 10))
    y = b.node("Relu", [b.bn(b.conv(x, 12, 12, 3, groups=12), 12)])
    y = _se(b, y, 12, 8, "relu", "hardsigmoid")
    x = b.node("Add", [b.bn(b.conv(y, 12, 12, 1), 12), x])
    y = b.node("HardSwish", [b.bn(b.conv(x, 12, 36, 1), 36)])
    y = b.node("HardSwish", [b.bn(b.conv(y, 36, 36, 5, groups=36), 36)])
    y = b.bn(b.conv(_se(b, y, 36, 10, "relu", "hardsigmoid"), 36, 12, 1), 12)
    b.node("Add", [y, x], output="output")
    return {"output": [2, 12, 10, 10]}


BLOCKS = {"efficientnet": (_efficientnet_block, [("silu", "sigmoid")] * 2),
          "mobilenet_v3": (_mobilenet_v3_block, [("relu", HSIGMOID)] * 2)}


def _model(name: str) -> onnx.ModelProto:
    b = _Builder(seed=3, opset=17)
    return b.model(BLOCKS[name][0](b), name)


def _unfused(monkeypatch):
    """The pipeline without ``fuse_squeeze_excite``: what this tree compiled before it."""
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in passes.PIPELINE if p.__name__ != "fuse_squeeze_excite"))


def _se_launches(mod) -> list:
    """Per squeeze-excite block, the launches between its depthwise producer and the gated convolution."""
    nodes = mod.spec.nodes
    out, i = [], 0
    while i < len(nodes):
        if nodes[i].template == "depthwise_conv2d":
            j = i + 1
            while j < len(nodes) and not (nodes[j].template == "conv2d" and nodes[j].workload.get("in_scale")):
                j += 1
            if j < len(nodes):
                out.append(sum(len(n.calls) for n in nodes[i + 1:j]))
            i = j
        i += 1
    return out


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_pass_makes_one_node_per_block(name):
    """Pool (or ReduceMean), squeeze conv + activation, excite conv + gate activation -> one se_gate, whose gate the
    projection reads (in_scale); the optimized graph computes what the frontend's does."""
    g = from_onnx(_model(name))
    opt = passes.optimize(g)
    se = [n for n in opt.nodes if n.op == "se_gate"]
    assert [(n.attrs["act1"], n.attrs["activation"]) for n in se] == BLOCKS[name][1]
    assert not any(n.op in ("global_avg_pool", "reduce_mean") for n in opt.nodes)
    assert all(n.outputs[0] == r.attrs["in_scale"] for n in se for r in opt.consumers(n.outputs[0]))
    x = random_inputs(g)
    want, got = run_graph_numpy(g, x)["output"], run_graph_numpy(opt, x)["output"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_pass_leaves_other_pools_alone():
    """A pool read by anything but a plain 1x1 convolution (a classifier's Flatten, a pool with a second reader,
    an excite without an activation's pattern) stays a pool."""
    def body(b):
        x = b.input("input", (1, 8, 6, 6))
        x = b.conv(x, 8, 8, 3)
        p = b.node("GlobalAveragePool", [x])
        g = b.node("Sigmoid", [b.conv(b.node("Relu", [b.conv(p, 8, 2, 1, bias=True)]), 2, 8, 1, bias=True)])
        y = b.conv(b.node("Mul", [x, g]), 8, 8, 3)  # p is read twice: by the squeeze and by the Add below
        b.node("Add", [b.node("GlobalAveragePool", [y]), p], output="output")
        return {"output": [1, 8, 1, 1]}
    b = _Builder(seed=1, opset=17)
    opt = load_graph(b.model(body(b), "m"))
    assert not any(n.op == "se_gate" for n in opt.nodes)


def _compile(path, scope, device=None, keep=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_model(str(path), device=device, scope=scope, keep=keep)


@pytest.mark.parametrize("name", list(BLOCKS))
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_blocks_launch_one_kernel_per_se_and_match_onnxruntime(name, scope, device, tmp_path, monkeypatch):
    """Each block's squeeze-excite: 3 launches before (a spatial_reduce and two conv2d), 1 now (CPU fallback:
    one launch); both compiles match onnxruntime (the Python executor)."""
    from conftest import with_reference
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    path = tmp_path / "m.onnx"
    x, want = with_reference(_model(name), path)
    fused = _compile(path, scope)
    with monkeypatch.context() as m:
        _unfused(m)
        before = _compile(path, scope)
    for mod in (fused, before):
        got = mod.run([x])[0]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert _se_launches(before) == [3, 3]
    expect = [len(n.calls) for n in fused.spec.nodes if n.template == "se_gate"]
    assert _se_launches(fused) == expect and len(expect) == 2 and set(expect) <= {1, 2}
    if device.info.type != "GPU":
        assert expect == [1, 1]
    launches = lambda mod: sum(len(n.calls) for n in mod.spec.nodes)  # noqa: E731
    assert launches(before) - launches(fused) == sum(3 - e for e in expect)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_blocks_in_the_native_runtime(scope, native, cl_env, tmp_path, monkeypatch):
    """Both blocks saved and run by tuner-run (the C runtime: its checks of the se_gate kernels' launches and
    extents, then the run), with the fallback and with two two-launch configs (the pool split, the excite over two
    work-groups; the squeeze's dots split over the pool's work-groups), against onnxruntime."""
    from conftest import building_cpu, with_reference
    spec = building_cpu()
    t = get_template("se_gate")
    split = dataclasses.replace(t, fallback=lambda wl, info: dataclasses.replace(
        t.fallback(wl, info), wg_c=2, wg_p=4, split=2, excite_groups=2, fc_split=2))
    partial = dataclasses.replace(t, fallback=lambda wl, info: dataclasses.replace(
        t.fallback(wl, info), wg_c=2, wg_p=4, split=1, excite_groups=2, fc_split=2, partial_squeeze=True))
    for name in BLOCKS:
        path = tmp_path / f"{name}.onnx"
        x, want = with_reference(_model(name), path, seed=1)
        np.save(tmp_path / "x.npy", x)
        for variant in ("fallback", "split", "partial"):
            with monkeypatch.context() as m:
                if variant != "fallback":
                    m.setitem(templates(), "se_gate", split if variant == "split" else partial)
                mod = _compile(path, scope, spec, keep=True)  # saved for tuner-run, as `tuner compile` does
            calls = [len(n.calls) for n in mod.spec.nodes if n.template == "se_gate"]
            assert calls == ([1, 1] if variant == "fallback" else [2, 2]), (name, variant, calls)
            assert np.abs(mod.run([x])[0] - want).max() <= 1e-4 * np.abs(want).max()
            art = mod.save(tmp_path / f"{name}_{scope}_{variant}")
            r = subprocess.run([native["tuner_run"], str(art), "--device", spec, "--input", str(tmp_path / "x.npy"),
                                "--output", str(tmp_path / "y.npy")], capture_output=True, text=True, env=cl_env,
                               timeout=300)
            assert r.returncode == 0, (name, variant, r.stderr)
            got = np.load(tmp_path / "y.npy")
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (name, variant)


def test_plan_summary_names_a_split_pool(device, tmp_path, monkeypatch):
    """Which variant a block runs is in the plan: a config that splits the pool, or the squeeze's dots, launches
    two kernels, named."""
    t = get_template("se_gate")
    path = tmp_path / "m.onnx"
    onnx.save(_model("efficientnet"), str(path))
    for knobs, first in ((dict(wg_p=4, split=2), "se_gate_pool"),
                         (dict(wg_c=2, partial_squeeze=True), "se_gate_squeeze")):
        monkeypatch.setitem(templates(), "se_gate", dataclasses.replace(
            t, fallback=lambda wl, info, _knobs=knobs: dataclasses.replace(t.fallback(wl, info), **_knobs)))
        summary = _compile(path, "buffer").plan_summary()
        assert summary.count(f"(2 launches: {first}, se_gate)") == 2, summary


# -- picked by measurement: fused or unfused, per plan and per block -------------------------------------------

def test_split_is_the_inverse_of_the_fusion():
    """``split_squeeze_excite``: every se_gate (or the named ones) back as a pool and two 1x1 convolutions that
    compute the same gate; the frontend's graph, the fused and the split graphs agree."""
    from tuner.graph.passes_se import split_squeeze_excite
    g = from_onnx(_model("efficientnet"))
    fused = passes.optimize(g)
    names = [n.name for n in fused.nodes if n.op == "se_gate"]
    every, one = split_squeeze_excite(fused), split_squeeze_excite(fused, {names[1]})
    assert not any(n.op == "se_gate" for n in every.nodes)
    assert [n.name for n in one.nodes if n.op == "se_gate"] == names[:1]
    assert [n.op for n in every.nodes if n.name.startswith(names[0])] == ["global_avg_pool", "conv2d", "conv2d"]
    x = random_inputs(g)
    want = run_graph_numpy(g, x)["output"]
    for h in (fused, every, one):
        assert np.abs(run_graph_numpy(h, x)["output"] - want).max() <= 1e-5 * np.abs(want).max()


def _form(mod) -> str:
    """How a compiled model runs its squeeze-excite blocks: ``rows`` (se_gate pooling its depthwise producer's row
    sums), ``maps`` (se_gate pooling the map), ``producers`` (the gates computed by their depthwise producers),
    ``readers`` (by the convolutions that read them), ``mixed`` (some in each) or ``unfused``."""
    producers, readers = (any((n.workload or {}).get(k) for n in mod.spec.nodes) for k in ("gate", "in_gate"))
    if producers or readers:
        return "mixed" if producers and readers else "producers" if producers else "readers"
    if not any(n.template == "se_gate" for n in mod.spec.nodes):
        return "unfused"
    return "rows" if any((n.workload or {}).get("row_sums") for n in mod.spec.nodes) else "maps"


@pytest.mark.parametrize("faster", ["rows", "maps", "unfused", "producers", "readers"])
def test_the_plan_keeps_whichever_form_measures_faster(faster, device, tmp_path, monkeypatch):
    """``fastest_plan`` times the plan with its blocks fused (each gate pooling its depthwise producer's row sums)
    beside the same plan with them unfused, with the gates pooling their maps, and with the gates computed by
    their depthwise producers or by their readers (step ``squeeze_excite``), and keeps the fastest; the kept plan
    names its form and matches onnxruntime."""
    import onnxruntime as ort
    import tuner.compile.compiler as C
    model = _model("mobilenet_v3")
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))

    def whole(mod):  # a device on which the chosen form runs faster
        return [1e-3 if _form(mod) == faster else 2e-3]
    # PoCL miscompiles some gate-computing convolutions (GATES_IN_PRODUCERS_MISCOMPILED), not this model's fallbacks:
    # the plan step is tested here on it anyway
    monkeypatch.setattr(C, "GATES_IN_PRODUCERS_MISCOMPILED", ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = C._fastest_plan(str(path), None, device, "float32", None, False, 1, "python", whole)
    step = next(st for st in mod.plan_steps if st.name == "squeeze_excite")
    mode = step.kept.split('+')[0]
    assert {f"{mode}+unfused-se", f"{mode}+map-se", f"{mode}+gates-in-producers", f"{mode}+gates-in-readers"} \
        <= set(step.times), step.times
    se = [n for n in mod.spec.nodes if n.template == "se_gate"]
    assert _form(mod) == faster
    if faster == "rows":
        assert "-se" not in mod.plan_kept and len(se) == 2
    elif faster == "maps":
        assert mod.plan_kept.endswith("+map-se") and len(se) == 2
    elif faster in ("producers", "readers"):
        assert mod.plan_kept.endswith(f"+gates-in-{faster}") and not se
        assert sum(bool((n.workload or {}).get("gate" if faster == "producers" else "in_gate"))
                   for n in mod.spec.nodes) == 2
    else:
        assert mod.plan_kept.endswith("+unfused-se") and not se
        assert sum(n.template == "spatial_reduce" for n in mod.spec.nodes) == 2
    x = np.random.default_rng(0).standard_normal((2, 12, 10, 10)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert np.abs(mod.run([x])[0] - want).max() <= 1e-4 * np.abs(want).max()
