"""fp16 tasks start from fp32's configs (issue 56, item 2): a float32 record of a layer fills the float16 model's
layer (``ApplyHistoryBest.for_dtype``), labelled ``dtype: tuned in float32``, and the reverse; ``--scope auto``
times the plan built from those transfers beside the other and keeps the faster; the tuner seeds a float16
task with float32's best configs of the same workload."""
import dataclasses

import numpy as np
import pytest

from tuner.artifact.format import config_source_ok
from tuner.compile.compiler import compile_model, load_graph, source_kind
from tuner.logs import SCHEMA_VERSION, Record, apply_history_best
from tuner.plan.lower import lower_graph
from tuner.templates import get_template
from tuner.zoo.models import test_models as zoo_test_models

BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}
SCOPES = {f"{k}_scope": v for k, v in BUFFERS.items()}


def _records(model, info, dtype, seed=0, median=1e-4, **knobs):
    """One buffer-scope record per tuned layer of ``model`` stored in ``dtype``: a random config valid in both
    storage dtypes (``knobs`` applied), so a transferred one is told apart from the fallback."""
    rng = np.random.default_rng(seed)
    recs = []
    for step in [s for s in lower_graph(load_graph(model), dtype).steps if s.tuned]:
        t = get_template(step.op)
        other = dataclasses.replace(step.workload, dtype="float32" if dtype == "float16" else "float16")
        space = t.space(step.workload, info, **SCOPES, **t.model_knobs, **knobs)
        for _ in range(200):
            cfg = t.make_config(space.sample(rng))
            plain = dataclasses.replace(cfg, compute="float32") if hasattr(cfg, "compute") else cfg
            if cfg != t.fallback_with(step.workload, info, **SCOPES, **t.model_knobs) and \
                    not t.space(other, info).violations(t.config_values(other, plain)):
                break
        recs.append(Record(version=SCHEMA_VERSION, template=t.name, workload=step.workload.key(), scopes=BUFFERS,
                           config=dataclasses.asdict(cfg), device=info.fingerprint, costs=[median], median_s=median,
                           gflops=1.0, error_code=0, error_name="NO_ERROR"))
    return recs


def _nodes(mod):
    return [n for n in mod.spec.nodes if n.template]


def test_float32_records_configure_a_float16_model_and_the_reverse(device):
    model = zoo_test_models()["conv_pads"]
    info = dataclasses.replace(device.info, fp16=True)  # half arithmetic offered: the reverse resets it
    f32 = _records(model, info, "float32")
    mod = compile_model(model, log=apply_history_best(f32), target=info, scope="buffer", dtype="float16")
    assert [n.config_source for n in _nodes(mod)] == ["dtype: tuned in float32"] * len(f32)
    assert [n.config for n in _nodes(mod)] == [r.config for r in f32]
    assert all(config_source_ok(n.config_source) and source_kind(n.config_source) == "dtype" for n in _nodes(mod))
    assert not any(n.tuned for n in _nodes(mod))  # nothing was measured in float16

    f16 = _records(model, info, "float16", seed=1, compute="half_acc")
    back = compile_model(model, log=apply_history_best(f16), target=info, scope="buffer", dtype="float32")
    assert [n.config_source for n in _nodes(back)] == ["dtype: tuned in float16"] * len(f16)
    assert [n.config for n in _nodes(back)] == [{**r.config, "compute": "float32"} for r in f16]

    # a layer measured in float16 keeps its own record: float32's only fill what float16 lacks
    both = apply_history_best(f32 + f16[:1])
    mixed = compile_model(model, log=both, target=info, scope="buffer", dtype="float16")
    assert [n.config_source for n in _nodes(mixed)] == ["tuned"] + ["dtype: tuned in float32"] * (len(f32) - 1)
    assert _nodes(mixed)[0].config == f16[0].config


def test_for_dtype_fills_or_replaces():
    from tuner.target import DeviceInfo  # noqa: F401 - the history needs only a fingerprint
    info = type("Info", (), {"fingerprint": "dev-cpu-00000000"})()
    key = {"op": "dense", "data": [1, 32], "weight": [8, 32], "dtype": "float32", "bias": False, "activation": "none"}
    rec = lambda dtype, median, **cfg: Record(version=SCHEMA_VERSION, template="dense",  # noqa: E731
                                              workload={**key, "dtype": dtype}, scopes=BUFFERS, config=cfg,
                                              device=info.fingerprint, costs=[median], median_s=median, gflops=1.0,
                                              error_code=0, error_name="NO_ERROR")
    h = apply_history_best([rec("float32", 1e-4, wg=8, compute="float32"), rec("float16", 3e-4, wg=2, compute="half")])
    assert h.for_dtype(info, "float16") is h  # float16 has its record: nothing to fill
    replaced = h.for_dtype(info, "float16", replace=True)
    [best] = [r for r in replaced.best.values() if r.workload["dtype"] == "float16"]
    assert best.config == {"wg": 8, "compute": "float32"} and replaced.dtype_origin == {best.task_key: "float32"}
    only16 = apply_history_best([rec("float16", 3e-4, wg=2, compute="half")]).for_dtype(info, "float32")
    [back] = [r for r in only16.best.values() if r.workload["dtype"] == "float32"]
    assert back.config == {"wg": 2, "compute": "float32"}  # half arithmetic needs half storage
    assert h.for_dtype(info, "int32") is h


@pytest.mark.parametrize("transfers_faster", [True, False])
def test_scope_auto_times_the_plan_built_from_float32s_configs(device, transfers_faster):
    """float16 records (here: few, slow) against float32's: the plan built from float32's configs is timed beside
    the float16 plan, and the faster whole plan is kept."""
    import tuner.compile.compiler as C
    from tuner.compile.compiler import device_history
    model = zoo_test_models()["conv_pads"]
    info = device.info
    history = apply_history_best(_records(model, info, "float32") + _records(model, info, "float16", seed=2))
    history = device_history(history, info, None, "float16")
    uses_f32 = lambda mod: all(source_kind(n.config_source) == "dtype" for n in _nodes(mod))  # noqa: E731
    whole = lambda mod: (1.0 if uses_f32(mod) == transfers_faster else 2.0)  # noqa: E731
    mod = C._fastest_plan(model, history, device, "float16", None, False, 1, "python", whole)
    assert mod.plan_kept.endswith("+float32") == transfers_faster, mod.plan_times
    assert any(k.endswith("+float32") for k in mod.plan_times)
    assert uses_f32(mod) == transfers_faster
    assert mod.plan_times[mod.plan_kept] == min(mod.plan_times.values())


def test_a_float16_task_measures_float32s_best_config_first(tmp_path, device):
    """Tuning a float16 task with float32 records of the same workload in the log: float32's fastest config is
    the first trial (labelled ``start: dtype float32``), before the fallback; half arithmetic of a float16
    record becomes float arithmetic when it seeds a float32 task."""
    from tuner.search.loop import dtype_seeds
    from tuner.search.tune import tune
    from tuner.task import TuningTask
    t = get_template("conv2d")
    wl32 = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    wl16 = dataclasses.replace(wl32, dtype="float16")
    fast = t.config(tile_oc=1, tile_oh=1, tile_ow=2, wg_w=4, wg_h=2, **SCOPES)
    slow = dataclasses.replace(fast, wg_w=2)
    assert fast != t.fallback_with(wl16, device, **SCOPES)
    log = tmp_path / "dev.jsonl"
    log.write_text("".join(Record.new("conv2d", wl32, c, device.info, costs=[s]).to_json() + "\n"
                           for c, s in ((slow, 2e-3), (fast, 1e-3))))
    res = tune("conv2d", wl16, device, trials=1, log=str(log), scopes=BUFFERS, progress=False)
    assert res.measured == 1 and res.records[0].config == dataclasses.asdict(fast)
    assert res.records[0].workload["dtype"] == "float16"

    info = dataclasses.replace(device.info, fp16=True)
    half = dataclasses.replace(fast, compute="half_acc")
    log.write_text(Record.new("conv2d", wl16, half, info, costs=[1e-3]).to_json() + "\n")
    task = TuningTask("conv2d", wl32, scopes=BUFFERS).bind(info)
    [(params, dtype)] = dtype_seeds(str(log), task, info, task.space(info), {})
    assert dtype == "float16" and params["compute"] == "float32" and params["wg_w"] == 4
    assert dtype_seeds(str(log), task, info, task.space(info), {tuple(params.values()): None}) == []


def test_a_float32_compile_times_no_plan_of_float16s_configs(device):
    """A float32 model trusts its own records: float16's fill only the layers it has none of, and no plan built
    from float16's configs is timed against it."""
    import tuner.compile.compiler as C
    from tuner.compile.compiler import device_history
    model = zoo_test_models()["conv_pads"]
    info = device.info
    history = apply_history_best(_records(model, info, "float32") + _records(model, info, "float16", seed=2))
    history = device_history(history, info, None, "float32")
    mod = C._fastest_plan(model, history, device, "float32", None, False, 1, "python", lambda mod: 1.0)
    names = {name for step in mod.plan_steps for name in step.times}
    assert not any("float16" in name for name in names), names
    assert {n.config_source for n in _nodes(mod)} == {"tuned"}


@pytest.mark.parametrize("float32_faster", [True, False])
def test_a_mixed_float16_compile_times_the_all_float32_plan(device, float32_faster):
    """A float16 plan the precision guard mixes (``float32_plan``) is timed last beside the same scope's plan in
    float32 throughout, and the faster whole plan is kept: ``--dtype float16`` is never slower than float32
    (issue 56, item 2; an uncalibrated MobileNetV2 on the H200 ran 0.446 ms mixed against 0.357 in float32)."""
    import tuner.compile.compiler as C
    from tuner.compile.compiler import device_history
    model = zoo_test_models()["conv_pads"]
    info = device.info
    history = device_history(apply_history_best(_records(model, info, "float32")), info, None, "float16")
    all32 = lambda mod: all(e.dtype == "float32" for e in mod.spec.entries.values())  # noqa: E731
    whole = lambda mod: (1.0 if all32(mod) == float32_faster else 2.0)  # noqa: E731
    mod = C._fastest_plan(model, history, device, "float16", None, False, 1, "python", whole, float32_plan=True)
    assert mod.plan_steps[-1].name == "float32"
    assert any(k.endswith("+all-float32") for k in mod.plan_times), mod.plan_times
    assert mod.plan_kept.endswith("+all-float32") == float32_faster == all32(mod)
    assert mod.plan_times[mod.plan_kept] == min(mod.plan_times.values())
    plain = C._fastest_plan(model, history, device, "float16", None, False, 1, "python", whole)
    assert not any("all-float32" in k for st in plain.plan_steps for k in st.times)  # --precision off/strict
