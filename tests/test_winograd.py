"""Winograd conv2d, F(2x2,3x3) (``winograd2``) and F(4x4,3x3) (``winograd4``): the transform matrices, random
workloads and configs against the NumPy direct convolution in both scopes and storage types (and half arithmetic
on a cl_khr_fp16 device), an Oclgrind memory check, and a model: without a log its 3x3 convolutions run the
direct conv2d; with a log that measured Winograd faster they run Winograd, and the output matches onnxruntime.

Accuracy (max error relative to the float64 direct convolution's largest magnitude; see
templates/conv2d_winograd.py): float32 storage F(2x2) <1e-6, F(4x4) <1e-5; float16 storage F(2x2) ~5e-4 (as
the direct conv), F(4x4) ~4e-3 to 7e-3 -- the tolerances are 1e-4 (float32), 1e-2 (F(2x2) float16) and 2e-2
(F(4x4) float16). ``test_accuracy_against_float64`` checks those figures on one workload."""
from __future__ import annotations

import dataclasses
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from test_templates import check_random_config, scopes  # noqa: E402  (the shared check)
from tuner.errors import TunerError
from tuner.zoo import models as zoo
from tuner.compile.compiler import compile_model, load_graph
from tuner.plan.lower import choose_templates, extract_tasks, lower_graph, plan_storage
from tuner.logs import SCHEMA_VERSION, Record, apply_history_best
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template, templates_for
from tuner.templates.conv2d_winograd import MATRICES, transform_weights, untransform_weights

NAMES = ["winograd2", "winograd4"]
EXAMPLES = 30 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 2
FEW = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@st.composite
def winograd_fields(draw):
    """3x3 convolutions: padding 0 or 1 per side, odd sizes (not multiples of m), channels not multiples of 4,
    batch 1-2, the fused epilogue."""
    pad = tuple(draw(st.integers(0, 1)) for _ in range(4))
    n, c, o = draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    h, w = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    assume(h + pad[0] + pad[2] >= 3 and w + pad[1] + pad[3] >= 3)
    return dict(data=(n, c, h, w), kernel=(o, c, 3, 3), padding=pad, bias=draw(st.booleans()),
                activation=draw(st.sampled_from(["none", "relu", "relu6"])), residual=draw(st.booleans()))


# -- the algorithm -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [2, 4])
def test_transform_matrices_compute_the_correlation(m):
    """A^T [(G g G^T) (.) (B^T d B)] A is the m x m valid correlation of an alpha x alpha patch, in float64."""
    rng = np.random.default_rng(0)
    BT, AT = (np.asarray(MATRICES[m][k], np.float64) for k in ("BT", "AT"))
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((1, 1, 3, 3))
    y = AT @ (transform_weights(g, m, np.float64)[0, 0] * (BT @ d @ BT.T)) @ AT.T
    want = [[np.sum(d[i:i + 3, j:j + 3] * g[0, 0]) for j in range(m)] for i in range(m)]
    np.testing.assert_allclose(y, want, atol=1e-12)
    np.testing.assert_allclose(untransform_weights(transform_weights(g, m, np.float64), m), g, atol=1e-12)
    if m == 2:  # F(2x2)'s input and output transforms are additions only
        assert set(np.abs(BT).ravel()) | set(np.abs(AT).ravel()) == {0.0, 1.0}


def test_workload_takes_only_3x3_and_m_is_not_a_knob():
    t2, t4 = get_template("winograd2"), get_template("winograd4")
    wl = t4.workload(data=(1, 8, 9, 9), kernel=(8, 8, 3, 3), padding=1)
    assert (wl.m, wl.alpha, wl.transformed_kernel, wl.out_shape) == (4, 6, (8, 8, 6, 6), (1, 8, 9, 9))
    assert wl.key()["op"] == "winograd4" and "m" not in wl.key() and "m" not in t4.space().all_knobs
    assert wl.flops == get_template("conv2d").workload(data=(1, 8, 9, 9), kernel=(8, 8, 3, 3), padding=1).flops
    assert t2.workload(**{k: v for k, v in wl.key().items() if k != "op"}) != wl  # another tile size
    with pytest.raises(ValueError, match="3x3"):
        t2.workload(data=(1, 8, 9, 9), kernel=(8, 8, 5, 5))
    assert [t.name for t in templates_for("conv2d")][-2:] == NAMES


# -- kernels against NumPy ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("name", NAMES)
def test_random_workload_and_config_match_numpy(device, name, scope, dtype):
    @FEW
    @given(fields=winograd_fields(), seed=st.integers(0, 2**32 - 1))
    def check(fields, seed):
        check_random_config(device, name, fields, dtype, seed, **scopes(scope))
    check()


@pytest.mark.parametrize("compute", ["half", "half_acc"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_half_compute_matches_numpy(fp16_device, scope, compute):
    @settings(FEW, max_examples=1)
    @given(fields=winograd_fields(), seed=st.integers(0, 2**32 - 1))
    def check(fields, seed):
        exe = check_random_config(fp16_device, "winograd2", fields, "float16", seed, compute=compute,
                                  **scopes(scope))
        assert exe is not None and "half4" in exe.source
    check()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("name", NAMES)
def test_split_k_matches_numpy(device, name, scope, dtype):
    """``split_k``: the work-items of a split sum interleaved channel blocks, transform their partial sums and
    combine the m x m outputs in __local memory."""
    @FEW
    @given(fields=winograd_fields(), seed=st.integers(0, 2**32 - 1), k=st.sampled_from([2, 4]))
    def check(fields, seed, k):
        fields = {**fields, "data": (fields["data"][0], 4 * k + 1, *fields["data"][2:]),  # C4 > k, ragged
                  "kernel": (fields["kernel"][0], 4 * k + 1, 3, 3)}
        exe = check_random_config(device, name, fields, dtype, seed, split_k=k, **scopes(scope))
        assert exe is not None and "__local" in exe.source and "barrier(CLK_LOCAL_MEM_FENCE)" in exe.source
    check()


def test_split_k_needs_a_step_per_work_item_and_fits_local_memory(device):
    t = get_template("winograd4")
    wl = t.workload(data=(1, 16, 8, 8), kernel=(8, 16, 3, 3), padding=1)  # 4 channel blocks
    bufs = scopes("buffer")
    assert t.space(wl, device, split_k=4, **bufs).size() > 0
    assert t.space(wl, device, split_k=8, **bufs).size() == 0  # 4 steps cannot feed 8 work-items
    assert t.space(wl, device, split_k=4, split_c=2, **bufs).size() == 0  # 2 steps of 2 blocks
    small = dataclasses.replace(device.info, local_mem_bytes=1024)  # 2 x (2x1) x 16 outputs x 16 B = 1 KiB fits
    fits = dict(split_k=2, wg_w=2, wg_h=1, tile_cb=1, tile_t=1, split_c=1, **bufs)
    assert t.space(wl, small, **fits).size() > 0
    assert t.space(wl, small, **{**fits, "tile_cb": 2}).size() == 0
    with pytest.raises(ValueError, match="split_k=8"):
        t.build(wl, t.config(split_k=8))


def test_half_arithmetic_is_f2x2_only(device):
    """F(4x4)'s half input transform reaches 2e-2 (past its float16 tolerance): the space leaves it out."""
    info = dataclasses.replace(device.info, fp16=True)
    bufs = scopes("buffer")
    fields = dict(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1, dtype="float16")
    for name, allowed in (("winograd2", True), ("winograd4", False)):
        t = get_template(name)
        for compute in ("half", "half_acc"):
            assert (t.space(t.workload(**fields), info, compute=compute, **bufs).size() > 0) == allowed
    wide = get_template("winograd2").workload(data=(1, 260, 4, 4), kernel=(4, 260, 3, 3), dtype="float16")
    assert get_template("winograd2").space(wide, info, compute="half_acc", **bufs).size() == 0


def test_accuracy_against_float64(device):
    """The figures of the module docstring: max error relative to the float64 direct convolution."""
    fields = dict(data=(1, 64, 12, 12), kernel=(16, 64, 3, 3), padding=1)
    bufs = scopes("buffer")
    errors = {}
    for name in ("conv2d", *NAMES):
        t = get_template(name)
        for dtype in ("float32", "float16"):
            wl = t.workload(**fields, dtype=dtype)
            exe = build(t.build(wl, t.fallback_with(wl, device, **bufs)), device)
            inputs = t.random_inputs(wl, np.random.default_rng(0))
            errors[name, dtype] = t.check(wl, exe(**inputs), inputs)
            assert errors[name, dtype] <= t.tolerance(wl)
    assert errors["winograd2", "float32"] < 2e-6 and errors["winograd4", "float32"] < 2e-5
    assert errors["winograd2", "float16"] < 1.5e-3 and errors["winograd4", "float16"] < 1.2e-2
    assert errors["winograd4", "float16"] > 2 * errors["conv2d", "float16"]  # F(4x4) in half: known to be worse


@pytest.mark.parametrize("kind", ["this device", "a GPU with images"])
def test_fallback_is_a_valid_config_of_the_space(device, kind):
    info = device.info if kind == "this device" else dataclasses.replace(device.info, type="GPU", image_support=True,
                                                                         half_images=True)

    @settings(max_examples=20, deadline=None, derandomize=True)
    @given(fields=winograd_fields(), name=st.sampled_from(NAMES), dtype=st.sampled_from(["float32", "float16"]))
    def check(fields, name, dtype):
        t = get_template(name)
        wl = t.workload(**fields, dtype=dtype)
        t.space(wl, info).check(t.config_values(wl, t.fallback(wl, info)))
    check()


# -- Oclgrind ---------------------------------------------------------------------------------------------------

BUFFERS = scopes("buffer")
OCLGRIND_CASES = [
    {"label": "winograd2 texture: C=5 O=6, pad 1, OW=7 over tile_t=2 (8 columns), tile_cb=2, wg 2x2, bias+relu6",
     "template": "winograd2",
     "workload": {"data": (1, 5, 5, 7), "kernel": (6, 5, 3, 3), "padding": 1, "bias": True, "activation": "relu6"},
     "config": {"tile_t": 2, "tile_cb": 2, "wg_w": 2, "wg_h": 2}},
    {"label": "winograd4 buffer: batch 2, C=6 O=5 (split_c=2), asymmetric pad, OH=5 OW=6 over 4x4 tiles, residual",
     "template": "winograd4",
     "workload": {"data": (2, 6, 5, 7), "kernel": (5, 6, 3, 3), "padding": (1, 0, 1, 1), "residual": True},
     "config": {"split_c": 2, "tile_t": 2, "wg_w": 1, "wg_h": 2, **BUFFERS}},
    {"label": "winograd4 texture, split_k=2 over C=13 (4 blocks, 2 per work-item), tile_t=2, wg 2x1, residual",
     "template": "winograd4",
     "workload": {"data": (1, 13, 6, 9), "kernel": (6, 13, 3, 3), "padding": 1, "residual": True},
     "config": {"split_k": 2, "tile_t": 2, "wg_w": 2, "wg_h": 1}},
    {"label": "winograd2 buffer, split_k=4 over C=20 (5 blocks: ragged), tile_cb=2, wg 2x2, bias+relu",
     "template": "winograd2",
     "workload": {"data": (2, 20, 5, 6), "kernel": (7, 20, 3, 3), "padding": 1, "bias": True, "activation": "relu"},
     "config": {"split_k": 4, "tile_cb": 2, "wg_w": 2, "wg_h": 2, **BUFFERS}},
    {"label": "winograd2 float16 buffer in / texture out: C=3, pad 0, OH=5 OW=3, tile_t=2 over 2 tiles, bias",
     "template": "winograd2",
     "workload": {"data": (1, 3, 7, 5), "kernel": (4, 3, 3, 3), "bias": True, "dtype": "float16"},
     "config": {"tile_t": 2, "wg_w": 1, "wg_h": 2, "input_scope": "buffer", "weight_scope": "buffer"}},
]


def test_winograd_kernels_are_clean_under_oclgrind():
    from test_oclgrind import problems_of, run_oclgrind
    problems = problems_of(*run_oclgrind(OCLGRIND_CASES))
    assert not problems, "\n\n".join(problems)


# -- a model: direct or Winograd per node, from the log ------------------------------------------------------------

def winograd_model():
    """input (1, 6, 9, 7) -> Conv 3x3 p1 + bias + Relu -> Conv 3x3 p1 (5 -> 7) -> Conv 1x1 -> output."""
    b = zoo._Builder(seed=0)
    x = b.input("input", (1, 6, 9, 7))
    x = b.node("Relu", [b.conv(x, 6, 5, 3, bias=True)])
    x = b.conv(x, 5, 7, 3)
    return b.model({b.conv(x, 7, 4, 1, output="output"): None}, "winograd_convs")


def _record(step, info, median):
    t = get_template(step.op)
    cfg = t.fallback_with(step.workload, info, **{f"{k}_scope": v for k, v in step.scopes.items()},
                          **t.model_knobs)
    return Record(version=SCHEMA_VERSION, template=t.name, workload=step.workload.key(), scopes=dict(step.scopes),
                  config=dataclasses.asdict(cfg), device=info.fingerprint, costs=[median], median_s=median,
                  gflops=1.0, error_code=0, error_name="NO_ERROR")


def _ort(model, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def test_model_runs_winograd_where_the_log_measured_it_faster(device):
    info, model = device.info, winograd_model()
    plan = plan_storage(lower_graph(load_graph(model)), info, "buffer")
    convs = [s for s in plan.steps if s.tuned]
    assert [[c.op for c in s.candidates()] for s in convs] == [["conv2d", *NAMES], ["conv2d", *NAMES], ["conv2d"]]
    # tuning measures every alternative; the plan without a log deploys the direct conv2d
    assert sorted(t.template for t in extract_tasks(plan)) == sorted(["conv2d"] * 3 + NAMES * 2)
    untuned = choose_templates(plan, None, info)
    assert [s.op for s in untuned.steps if s.tuned] == ["conv2d"] * 3
    assert sorted(t.template for t in extract_tasks(untuned)) == ["conv2d"] * 3
    assert not any(".winograd" in p for p in untuned.params)

    # the log: conv0 fastest with F(4x4), conv1 with F(2x2) (F(4x4) unmeasured), the 1x1 direct
    times = [{"conv2d": 3e-4, "winograd2": 2e-4, "winograd4": 1e-4}, {"conv2d": 3e-4, "winograd2": 2e-4},
             {"conv2d": 1e-4}]
    history = apply_history_best([_record(c, info, times[i][c.op]) for i, s in enumerate(convs)
                                  for c in s.candidates() if c.op in times[i]])
    chosen = choose_templates(plan_storage(lower_graph(load_graph(model)), info, "auto", history), history, info)
    assert [s.op for s in chosen.steps if s.tuned] == ["winograd4", "winograd2", "conv2d"]
    w0, w1 = convs[0].inputs["Wt"], convs[1].inputs["Wt"]
    assert {f"{w0}.winograd4", f"{w1}.winograd2"} <= set(chosen.params)
    assert not {w0, w1, f"{w0}.winograd2", f"{w1}.winograd4"} & set(chosen.params)  # never uploaded

    x = np.random.default_rng(1).standard_normal((1, 6, 9, 7)).astype(np.float32)
    want = _ort(model, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the log's configs are fallbacks
        fast = compile_model(model, log=history, device=device, scope="auto", measure_plans=False)
        plain = compile_model(model, device=device, scope="auto")
    assert [n.template for n in fast.spec.nodes if n.template] == ["winograd4", "winograd2", "conv2d"]
    assert all(n.tuned for n in fast.spec.nodes if n.template)
    assert [n.template for n in plain.spec.nodes if n.template] == ["conv2d"] * 3
    assert sorted(b.key for b in fast.spec.params if b.key.endswith(".Wt")) == ["conv0.Wt", "conv1.Wt", "conv2.Wt"]
    # the transformed weights, packed OIHW4o with alpha x alpha for R x S: 2 blocks x 6 x 6x6 x 4, 2 x 5 x 4x4 x 4
    assert (fast.params["conv0.Wt"].size, fast.params["conv1.Wt"].size) == (2 * 6 * 36 * 4, 2 * 5 * 16 * 4)
    for mod in (fast, plain):
        got = mod.run([x])[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def _winograd_history(info, model):
    """The log of the test above, for either scope: conv0 fastest with F(4x4), conv1 with F(2x2), the 1x1
    direct (so that whichever plan ``--scope auto`` times fastest runs Winograd)."""
    times = [{"conv2d": 3e-4, "winograd2": 2e-4, "winograd4": 1e-4}, {"conv2d": 3e-4, "winograd2": 2e-4},
             {"conv2d": 1e-4}]
    records = []
    for scope in ("buffer", "texture") if info.image_support else ("buffer",):
        convs = [s for s in plan_storage(lower_graph(load_graph(model)), info, scope).steps if s.tuned]
        records += [_record(c, info, times[i][c.op]) for i, s in enumerate(convs) for c in s.candidates()
                    if c.op in times[i]]
    return apply_history_best(records)


def test_prefer_overrides_the_logs_template_choice(device):
    info, model = device.info, winograd_model()
    history = _winograd_history(info, model)
    plan = plan_storage(lower_graph(load_graph(model)), info, "buffer", history)
    tuned = lambda p: [s.op for s in p.steps if s.tuned]  # noqa: E731
    assert tuned(choose_templates(plan, history, info)) == ["winograd4", "winograd2", "conv2d"]
    assert tuned(choose_templates(plan, history, info, prefer="first")) == ["conv2d"] * 3
    names = [s.name for s in plan.steps if s.tuned]
    mixed = choose_templates(plan, history, info, prefer={names[0]: "winograd2", names[2]: "winograd4"})
    assert tuned(mixed) == ["winograd2", "winograd2", "conv2d"]  # conv1 from the log; no F(4x4) for a 1x1
    first = choose_templates(plan, history, info, prefer="first")
    assert not any(".winograd" in p for p in first.params)
    for bad, match in (({"conv0": "winograd9"}, "not registered: winograd9"), ("direct", "give None, 'first'")):
        with pytest.raises(TunerError, match=match):
            compile_model(model, log=history, device=device, prefer=bad)


def test_auto_checks_the_template_choice_inside_the_model(device, monkeypatch):
    """The log times each kernel alone; ``--scope auto`` also runs the kept plan with the direct conv2d on every
    node, profiles both inside the model and, where each is faster on some node, a plan taking each node's
    faster kernel; the kept plan is the fastest by the plan rule (the incumbent unless a challenger beat it in the
    rounds: a close median is not a win). Per-node times are faked here to make the per-node plan certain."""
    from tuner.runtime import module as M
    info, model = device.info, winograd_model()
    history = _winograd_history(info, model)
    real = M.Module.profile

    def profile(self, repeats=10):  # in the model: F(4x4) wins conv0, the direct conv2d wins conv1
        out = real(self, repeats=2)
        fake = {("winograd4", 0): 1e-6, ("conv2d", 0): 2e-6, ("winograd2", 1): 2e-6, ("conv2d", 1): 1e-6}
        tuned = [r for r in out["rows"] if r["template"]]
        for i, r in enumerate(tuned[:2]):
            r["median_s"] = fake[(r["template"], i)]
        return out
    monkeypatch.setattr(M.Module, "profile", profile)
    from tuner.compile import compiler
    made, plan_real = [], compiler.plan_graph

    def plan_graph_spy(*args, **kwargs):  # every plan fastest_plan compiles, with the template choice asked
        plan = plan_real(*args, **kwargs)
        prefer = kwargs.get("prefer", args[5] if len(args) > 5 else None)
        made.append((prefer, [s.op for s in plan.steps if s.tuned]))
        return plan
    monkeypatch.setattr(compiler, "plan_graph", plan_graph_spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the log's configs are fallbacks
        mod = compiler.compile_model(model, log=history, device=device, scope="auto")
    base = mod.plan_kept.split("+")[0]
    assert {f"{base}+direct", f"{base}+per-node"} <= set(mod.plan_times)
    step = mod.plan_steps[-1]  # the templates step: plan_times are its rounds' medians
    incumbent = next(iter(step.times))
    assert step.kept == mod.plan_kept  # the incumbent, or a challenger that beat it (compiler._alternating)
    assert mod.plan_kept == incumbent or step.times[mod.plan_kept] < step.times[incumbent]
    x = np.random.default_rng(1).standard_normal((1, 6, 9, 7)).astype(np.float32)
    want = _ort(model, x)
    assert np.abs(mod.run([x])[0] - want).max() / np.abs(want).max() < 1e-4
    per_node = [t for prefer, t in made if isinstance(prefer, dict)]
    assert per_node == [["winograd4", "conv2d", "conv2d"]]
    assert [t for prefer, t in made if prefer == "first"] == [["conv2d"] * 3]


@pytest.mark.parametrize("pad_mode", ["reflect", "edge"])
@pytest.mark.parametrize("name", NAMES)
def test_reflected_or_edge_padding_matches_numpy(device, name, pad_mode):
    """``pad_mode``: a style-transfer net's ReflectionPad2d(1) before a 3x3 convolution, read in place by the
    Winograd tiles too (tiles past the output read in bounds); random configs in both scopes, against the
    template's reference, which is checked against an explicit np.pad."""
    fields = dict(data=(1, 5, 7, 10), kernel=(6, 5, 3, 3), padding=(1, 1, 1, 1), bias=True, pad_mode=pad_mode)
    for seed, scope in ((0, "texture"), (1, "buffer"), (2, "texture")):
        check_random_config(device, name, fields, "float32", seed, **scopes(scope))
    t, rng = get_template(name), np.random.default_rng(0)
    wl = t.workload(**fields)
    inputs = t.random_inputs(wl, rng)
    xp = np.pad(inputs["X"].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)), mode=pad_mode)
    plain = dataclasses.replace(wl.direct, data=xp.shape, padding=(0, 0, 0, 0), pad_mode="zeros")
    from tuner.templates.common import reference
    ref = reference(plain, xp, untransform_weights(inputs["Wt"], wl.m), inputs["B"])
    assert np.allclose(t.reference(wl, inputs), ref, rtol=1e-6, atol=1e-6)
