"""A template from outside the package (tests/user_templates.py: a pointwise conv2d with knobs of its own),
registered with ``register_template``, is tuned, logged, planned into a model and compiled with no edit to
tuner/: the model's 1x1 convolution runs it with its tuned config, the 3x3 the built-in conv2d (the log measured
neither conv2d for the 1x1 nor Winograd for the 3x3, the alternatives the plan keeps for those nodes)."""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import tuner
from tuner.errors import TunerError
from tuner.zoo import models as zoo
from tuner.compile.compiler import compile_model, load_graph, plan_model
from tuner.plan.lower import extract_tasks, lower_graph, plan_storage
from tuner.templates import Template, get_template, register_template, templates, templates_for, unregister_template

ROOT = Path(__file__).resolve().parent.parent


def pointwise_model(channels: int = 8):
    """input (1, C, 6, 6) -> Conv 1x1 + bias + Relu -> Conv 3x3 (pad 1) -> output (1, 4, 6, 6)."""
    b = zoo._Builder(seed=0)
    x = b.input("input", (1, channels, 6, 6))
    y = b.node("Relu", [b.conv(x, channels, 8, 1, bias=True)])
    return b.model({b.conv(y, 8, 4, 3, output="output"): None}, "pointwise_then_3x3")


@pytest.fixture
def pointwise(monkeypatch):
    """The user template, registered; measuring processes import it by name from the repository root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    from tests.user_templates import POINTWISE
    register_template(POINTWISE)
    yield POINTWISE
    # registered again first: a registration refused in the test (test_register_template_wants_an_importable_name)
    # takes the name out of register_template's own list but leaves it in templates(), where unregister_template
    # alone does not reach it (templates/__init__.py), and the next test of this process would still see it
    register_template(POINTWISE)
    unregister_template(POINTWISE)


def test_registered_template_lowers_the_nodes_it_takes(pointwise, device):
    assert pointwise.name == "tests.user_templates:POINTWISE" and pointwise.name in templates()
    assert get_template(pointwise.name) is pointwise
    assert templates_for("conv2d")[0] is pointwise  # asked before the built-in conv2d and depthwise_conv2d
    plan = lower_graph(load_graph(pointwise_model()))
    tuned = [s for s in plan.steps if s.tuned]
    assert [s.op for s in tuned] == [pointwise.name, "conv2d"]
    assert tuned[0].workload == pointwise.workload((1, 8, 6, 6), (8, 8, 1, 1), bias=True, activation="relu")
    assert set(tuned[0].inputs) == {"X", "Wt", "B"}
    planned = plan_storage(plan, device.info, "buffer")
    tasks = extract_tasks(planned, alternatives=False)
    assert sorted(t.template for t in tasks) == sorted([pointwise.name, "conv2d"])
    assert next(t for t in tasks if t.template == pointwise.name).fixed == {}  # it pins no knobs
    # the built-in templates that take the same nodes are alternatives the log may prefer: conv2d for the 1x1,
    # Winograd for the 3x3; tuning measures them all
    assert [[c.op for c in s.candidates()] for s in planned.steps if s.tuned] == [
        [pointwise.name, "conv2d"], ["conv2d", "winograd2", "winograd4"]]
    assert sorted(t.template for t in extract_tasks(planned)) == sorted(
        [pointwise.name, "conv2d", "conv2d", "winograd2", "winograd4"])
    # a 1x1 whose input channels do not fill whole pixels is declined: the built-in conv2d takes it
    odd = lower_graph(load_graph(pointwise_model(channels=6)))
    assert [s.op for s in odd.steps if s.tuned] == ["conv2d", "conv2d"]


def test_unregistered_template_leaves_the_built_in_ones(pointwise):
    unregister_template(pointwise)
    assert pointwise.name not in templates()
    assert [s.op for s in lower_graph(load_graph(pointwise_model())).steps if s.tuned] == ["conv2d", "conv2d"]
    register_template(pointwise)  # the fixture unregisters it again


def test_register_template_wants_an_importable_name(pointwise):
    with pytest.raises(TunerError, match="package.module:ATTRIBUTE"):
        register_template(Template("my_conv", *[getattr(pointwise, f) for f in (
            "workload", "config", "build", "reference", "random_inputs", "fallback", "space_vars", "variables")]))
    with pytest.raises(TunerError, match="not the template being registered"):
        register_template(dataclasses.replace(pointwise, fallback=lambda wl, info: None))
    with pytest.raises(TunerError, match="cannot load template"):
        register_template(dataclasses.replace(pointwise, name="tests.user_templates:MISSING"))
    assert "tests.user_templates:MISSING" not in templates()


def test_user_template_is_tuned_planned_and_compiled_with_its_tuned_config(pointwise, device, tmp_path):
    from tuner.logs import apply_history_best, load_records
    from tuner.measure import MeasureOptions
    model = pointwise_model()
    plan = plan_model(model, device, scope="buffer")
    [task] = [t for t in extract_tasks(plan) if t.template == pointwise.name]
    log = str(tmp_path / "user.jsonl")
    res = tuner.tune(task.template, task.workload, device=device, trials=4, log=log, scopes=task.scopes,
                     fixed=task.fixed, storage=f"sqlite:///{tmp_path / 's.db'}",
                     options=MeasureOptions(repeats=2, n_parallel=1), progress=False)
    records = load_records(log)
    assert res.measured == len(records) == 4 and res.best is not None
    assert all(r.template == pointwise.name and r.ok for r in records)
    assert set(records[0].config) == {"tile_oc", "tile_ow", "wg_w", "input_scope", "weight_scope", "output_scope"}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 3x3 is not tuned: its fallback warns
        mod = compile_model(model, log=log, device=device, scope="buffer")
    nodes = {n.template: n for n in mod.spec.nodes if n.template}
    assert set(nodes) == {pointwise.name, "conv2d"}
    best = apply_history_best(log).query(pointwise.name, task.workload, device.info.fingerprint, task.scopes)
    assert nodes[pointwise.name].tuned and nodes[pointwise.name].config == best.config == res.best.config
    assert not nodes["conv2d"].tuned
    x = np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    got = mod.run([x])[0]
    assert got.shape == want[0].shape
    assert np.abs(got - want[0]).max() / np.abs(want[0]).max() < 1e-4
