"""``se_gate``'s ``last_group``: the pool and the squeeze's partial dots in N x P work-groups, and the gate (the
partials added, ``act1``, the excite) computed by the last of an image's work-groups to arrive, in one launch.
Checked against NumPy on new random inputs at every launch (the last work-group returns its image's counter to
zero, or the next launch computes no gate), in the Python executor and in tuner-run."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template
from tuner.templates.reduction import SLOT_ALIGN
from tuner.templates.se_gate import SEGateConfig

HSIGMOID = "hardsigmoid(0.1666666716337204)"
LAST = dict(partial_squeeze=True, last_group=True)


def scopes(scope: str) -> dict:
    return dict(input_scope=scope, weight_scope=scope, output_scope=scope)


# (workload, knobs): channels not a multiple of 4 (the last pool group half past C) with both sums shared; two
# images with the pool split along the pixels too; three images of EfficientNet-B0's last gate from row sums, the
# excite in rounds of a 32-item group; the weights' loops unrolled
CASES = [
    (dict(data=(1, 10, 5, 7), squeeze=3, act1="silu", activation="sigmoid"),
     dict(wg_c=2, wg_p=4, fc_split=2, excite_split=2)),
    (dict(data=(2, 24, 6, 6), squeeze=6, act1="relu", activation=HSIGMOID), dict(wg_c=2, wg_p=4, split=2)),
    (dict(data=(3, 1152, 7, 1), squeeze=48, act1="silu", activation="sigmoid", pixels=49),
     dict(wg_c=4, wg_p=8, fc_split=2, excite_split=8, inner="channels")),
    (dict(data=(1, 72, 9, 9), squeeze=18, act1="relu", activation="sigmoid"),
     dict(wg_c=4, wg_p=16, fc_split=4, unroll=True)),
]


@pytest.mark.parametrize("scope", ["buffer", "texture"])
@pytest.mark.parametrize("fields,knobs", CASES, ids=["ragged", "split", "1152-rows", "unrolled"])
def test_the_last_work_group_computes_the_gate(device, fields, knobs, scope):
    """One kernel, its workspaces the partial dots (each image's on a 128-byte line of its own) and the arrival
    counters; three launches on new inputs each match NumPy, a gate off by a tenth fails the check, and after a
    launch every image's counter is back at zero (the runtime zeroes counters when it requests a workspace, not
    between the launches of one request: a run of several launches would compute no gate after the first)."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    t = get_template("se_gate")
    wl = t.workload(**fields)
    prog = t.build(wl, SEGateConfig(**LAST, **knobs, **scopes(scope)))
    assert [k.name for k in prog.kernels] == ["se_gate"]
    dots, counters = prog.workspaces
    N, S = wl.data[0], wl.squeeze
    assert counters.shape == (N,) and counters.dtype.base == "int32"
    assert dots.shape[0] % N == 0 and dots.shape[0] // N % (4 * SLOT_ALIGN) == 0
    run = build(prog, device)  # on PoCL without its optimizer (conftest): see the test below
    rng = np.random.default_rng(3)
    for _ in range(3):
        inputs = t.random_inputs(wl, rng)
        out = run(**inputs)
        assert t.check(wl, out, inputs) < 1e-4
    assert t.check(wl, dict(out, Y=out["Y"] * 1.1), inputs) > 1e-4
    assert (run._with_scratch(run.upload_inputs(**inputs), _counters_after_launch) == 0).all()


def _counters_after_launch(calls) -> np.ndarray:
    """``Executable._with_scratch``'s body: the one kernel launched, then its last parameter (the arrival counters,
    int32) read back before the workspace is released."""
    import pyopencl as cl
    (kernel, global_size, local_size, args), = calls
    queue = cl.CommandQueue(kernel.context)
    kernel(queue, global_size, local_size, *args)
    counters = np.full(args[-1].size // 4, -1, np.int32)
    cl.enqueue_copy(queue, counters, args[-1])
    queue.finish()
    return counters


def test_what_pocl_builds_wrongly_when_it_optimizes_is_right_on_intels_runtime():
    """PoCL 3.0-rc2 with its optimizer on builds EfficientNet-B0's last gate in this form wrongly (0.37 off on
    every launch; without the optimizer, and under Oclgrind, it is right) -- as it does a depthwise convolution
    that computes its gate. Intel's CPU runtime computes it right. The space keeps the knob to GPUs."""
    from conftest import building_cpu
    from tuner.runtime.opencl import open_device
    device = open_device(building_cpu("intel"))
    t = get_template("se_gate")
    fields, knobs = CASES[2]
    wl = t.workload(**fields)
    run = build(t.build(wl, SEGateConfig(**LAST, **knobs, **scopes("buffer"))), device)
    rng = np.random.default_rng(0)
    for _ in range(3):
        inputs = t.random_inputs(wl, rng)
        assert t.check(wl, run(**inputs), inputs) < 1e-4


def test_the_space_offers_it_on_gpus_with_what_it_needs():
    """On a GPU the space holds last_group configs, each with the partial squeeze and one gate work-group an
    image; on a CPU it holds none. A config without those is refused by the template, naming the knob."""
    from conftest import profile
    t = get_template("se_gate")
    wl = t.workload(data=(1, 1152, 7, 1), squeeze=48, act1="silu", activation="sigmoid", pixels=49)
    gpu = t.space(wl, profile(), last_group=True)
    assert gpu.size() > 0
    rng = np.random.default_rng(0)
    for _ in range(20):
        cfg = t.make_config(gpu.sample(rng))
        assert cfg.partial_squeeze and cfg.excite_groups == 1
    assert t.space(wl, profile(type="CPU"), last_group=True).size() == 0
    for bad in (dict(last_group=True), dict(last_group=True, partial_squeeze=True, excite_groups=2)):
        with pytest.raises(ValueError, match="last_group"):
            t.build(wl, SEGateConfig(wg_c=8, wg_p=8, **bad, **scopes("buffer")))


def test_the_space_counts_its_local_memory(device):
    """Every sampled config declares no more local memory than ``last_group_local`` counts: on a device with one
    byte less than it declares, the space refuses it."""
    from test_norm_stats_in_producers import _local_memory_refusals
    fields = dict(data=(1, 1152, 7, 1), squeeze=48, act1="silu", activation="sigmoid", pixels=49)
    for cfg, _, used, refused in _local_memory_refusals(device, "se_gate", fields, 0, 8, **LAST):
        assert cfg.last_group and "last_group_local" in refused, (cfg, used, refused)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_the_blocks_match_onnxruntime_in_both_runtimes(scope, native, cl_env, tmp_path, monkeypatch):
    """EfficientNet's and MobileNetV3's blocks (``test_se_fusion``), each gate one launch in this form, match
    onnxruntime in the Python executor, in tuner-run and in its AddressSanitizer build, on Intel's CPU runtime
    (PoCL's optimizer, which tuner-run's PoCL builds use, gets it wrong: above). Planned as for a GPU, whose space
    holds the knob; built and run on the CPU."""
    import warnings

    from conftest import building_cpu, with_reference
    from test_se_fusion import BLOCKS, _model
    from test_se_rows import matches_in_both_runtimes
    from tuner.compile.compiler import compile_plan, load_graph, module_of, plan_graph
    from tuner.runtime.opencl import open_device
    from tuner.templates import templates
    spec = building_cpu("intel")
    device = open_device(spec)
    as_gpu = dataclasses.replace(device.info, type="GPU")
    t = get_template("se_gate")
    last = dataclasses.replace(t, fallback=lambda wl, info: dataclasses.replace(
        t.fallback(wl, info), wg_c=2, wg_p=4, split=1, excite_groups=1, fc_split=2, excite_split=2, **LAST))
    monkeypatch.setitem(templates(), "se_gate", last)
    for name in BLOCKS:
        path = tmp_path / f"{name}.onnx"
        x, want = with_reference(_model(name), path, seed=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = module_of(compile_plan(plan_graph(load_graph(str(path)), as_gpu, scope, None), as_gpu), device)
        gates = [n for n in mod.spec.nodes if n.template == "se_gate"]
        assert [len(n.calls) for n in gates] == [1, 1] and all(n.config["last_group"] for n in gates), name
        (tmp_path / name).mkdir()
        # Intel's runtime leaks inside itself (LeakSanitizer's report names only libintelocl): the AddressSanitizer
        # build still checks every access, with the leak report off
        env = {**cl_env, "ASAN_OPTIONS": ":".join(filter(None, [cl_env.get("ASAN_OPTIONS"), "detect_leaks=0"]))}
        matches_in_both_runtimes(mod, x, want, spec, native, env, tmp_path / name)
