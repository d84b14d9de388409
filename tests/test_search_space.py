"""The declarative search spaces: every shipped file loads; errors name the offending knob or constraint;
counting agrees with brute force; samples are valid; constraints follow the device's limits."""
import dataclasses
import itertools

import numpy as np
import pytest

from tuner.errors import TunerError
from tuner.search_space import load_space, parse_space
from tuner.templates import get_template

NAMES = ["conv2d", "depthwise_conv2d", "dense", "winograd2", "winograd4"]
WORKLOADS = {
    "conv2d": dict(data=(1, 6, 7, 9), kernel=(5, 6, 3, 3), padding=1),
    "winograd2": dict(data=(1, 6, 7, 9), kernel=(5, 6, 3, 3), padding=1),
    "winograd4": dict(data=(1, 6, 7, 9), kernel=(5, 6, 3, 3), padding=1),
    "depthwise_conv2d": dict(data=(1, 6, 7, 9), kernel=(6, 1, 3, 3), stride=2, padding=1),
    "dense": dict(data=(1, 30), weight=(9, 30)),
}


@pytest.mark.parametrize("name", NAMES)
def test_shipped_space_covers_every_config_field(name):
    t = get_template(name)
    space = t.space()
    fields = {f.name for f in dataclasses.fields(t.config)}
    assert set(space.all_knobs) == fields | {"dtype"}
    assert space.task["dtype"] == ["float32", "float16"]
    assert {"input_scope", "weight_scope", "output_scope"} <= set(space.task)
    assert space.total == np.prod([len(c) for c in space.all_knobs.values()])


@pytest.mark.parametrize("name", NAMES)
def test_size_matches_brute_force_and_samples_are_valid(device, name):
    t = get_template(name)
    wl = t.workload(**WORKLOADS[name])
    fewer = {"output_scope": "texture", "unroll_rs": True, "tile_oh": 2, "compute": "float32", "cache_input": False} \
        if name == "conv2d" else {}
    bound = t.space(wl, device, input_scope="buffer", weight_scope="texture", **fewer)
    names = list(bound.choices)
    brute = sum(not bound.violations(dict(zip(names, values)))
                for values in itertools.product(*bound.choices.values()))
    assert 0 < bound.size() == brute == sum(1 for _ in bound.configs())
    rng = np.random.default_rng(0)
    for _ in range(20):
        values = bound.sample(rng)
        assert bound.violations(values) == []
        assert values["input_scope"] == "buffer" and values["weight_scope"] == "texture"
        t.make_config(values)  # every assignment is a config


def test_constraints_follow_the_device_limits(device):
    t = get_template("conv2d")
    wl = t.workload(data=(1, 8, 40, 40), kernel=(8, 8, 3, 3), padding=1)
    small = dataclasses.replace(device.info, max_work_group_size=16, image2d_max_width=16)
    full, limited = t.space(wl, device.info), t.space(wl, small)
    assert limited.size() < full.size()
    values = t.config_values(wl, t.config(wg_w=8, wg_h=4, tile_ow=1))
    assert any(v.startswith("work_group:") for v in limited.violations(values))
    assert any(v.startswith("input_image:") for v in limited.violations(values))  # 40 pixels > 16 wide
    assert full.violations(values) == []
    with pytest.raises(TunerError, match="work_group"):
        limited.check(values)
    no_images = dataclasses.replace(device.info, image_support=False)
    assert all(v["input_scope"] == v["weight_scope"] == v["output_scope"] == "buffer"
               for v in itertools.islice(t.space(wl, no_images).configs(), 2000))


def test_fixed_knob_must_be_a_choice(device):
    t = get_template("dense")
    wl = t.workload(**WORKLOADS["dense"])
    with pytest.raises(TunerError, match="input_scope='global' is not a choice of knob 'input_scope'"):
        t.space(wl, device, input_scope="global")
    with pytest.raises(TunerError, match="unknown knobs \\['tile_q'\\]"):
        t.space(wl, device, tile_q=1)


BASE = {"template": "t", "task": {"dtype": ["float32"]}, "knobs": {"a": [1, 2], "b": ["x", "y"]},
        "constraints": {"ok": "a <= N"}}


@pytest.mark.parametrize("change, message", [
    ({"knobs": {"a": [], "b": ["x"]}}, "knob 'a' must list its choices"),
    ({"knobs": {"a": [1, "2"], "b": ["x"]}}, "knob 'a': choices must be"),
    ({"knobs": {"a": [1, 1], "b": ["x"]}}, "knob 'a' lists a choice twice"),
    ({"constraints": {"bad": "a <= Q"}}, "constraint 'bad': unknown name 'Q'"),
    ({"constraints": {"bad": "a <="}}, "constraint 'bad': invalid expression"),
    ({"constraints": {"bad": "device.gpu_count > 1"}}, "constraint 'bad': unknown device capability 'gpu_count'"),
    ({"constraints": {"bad": "__import__('os')"}}, "constraint 'bad': only calls to"),
    ({"constraints": {"bad": "a.real"}}, "constraint 'bad': only device.<capability>"),
    ({"constraints": {"bad": "[x for x in b]"}}, "constraint 'bad': ListComp is not allowed"),
    ({"constraints": {"bad": 3}}, "constraint 'bad': must be a string"),
    ({"extra": 1}, "unknown top-level keys \\['extra'\\]"),
    ({"template": None}, "template = "),
])
def test_invalid_space_files_name_what_is_wrong(change, message):
    with pytest.raises(TunerError, match=message):
        parse_space({**BASE, **change}, "t.toml", var_names={"N"})


def test_knobs_must_match_the_config_fields():
    with pytest.raises(TunerError, match="knob 'b' is not a config field"):
        parse_space(BASE, "t.toml", config_fields={"a"}, var_names={"N"})
    with pytest.raises(TunerError, match="config field 'c' has no knob"):
        parse_space(BASE, "t.toml", config_fields={"a", "b", "c"}, var_names={"N"})


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "mine.toml"
    bad.write_text("template = 'conv2d'\n[knobs\n")
    with pytest.raises(TunerError, match="mine.toml: not valid TOML"):
        load_space(str(bad))
    with pytest.raises(TunerError, match="no search space 'conv3d'.*shipped spaces: channel_reduce, conv2d, conv2d_winograd, dense, "
                                         "depthwise_conv2d, group_norm, matmul, se_gate, spatial_reduce"):
        load_space("conv3d")


def test_a_constraint_that_breaks_at_evaluation_is_named(device):
    space = parse_space({**BASE, "constraints": {"boom": "a // (N - N) > 0"}}, "t.toml", var_names={"N"})
    with pytest.raises(TunerError, match="constraint 'boom'.*ZeroDivisionError"):
        space.bind({"N": 3}, device.info).size()


@pytest.mark.parametrize("name", ["conv2d", "depthwise_conv2d", "dense"])
def test_exists_agrees_with_size(device, name):
    """``exists`` (the planner's question: is there any valid config?) stops at the first config, and says no
    exactly where ``size`` counts none: a work-group limit of 0 leaves none."""
    t = get_template(name)
    wl = {"conv2d": lambda: t.workload(data=(1, 6, 9, 9), kernel=(10, 6, 3, 3), padding=(1, 1, 1, 1)),
          "depthwise_conv2d": lambda: t.workload(data=(1, 6, 9, 9), kernel=(6, 1, 3, 3), padding=(1, 1, 1, 1)),
          "dense": lambda: t.workload(data=(2, 20), weight=(12, 20))}[name]()
    bound = t.space(wl, device.info)
    assert bound.exists() and bound.size() > 0
    starved = dataclasses.replace(device.info, max_work_group_size=0)
    none = t.space(wl, starved)
    assert none.size() == 0 and not none.exists()
