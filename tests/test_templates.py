"""Property tests: random workloads (odd channel counts, kernel sizes 1-7, stride 1/2, dilation, asymmetric
padding, batch > 1) with random valid configs drawn from each template's search space, for texture and
buffer scopes and both storage dtypes, checked against the NumPy reference on the test device (PoCL)."""
import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tuner.runtime.opencl.launch import build
from tuner.templates import get_template

# CI runs a fixed, derandomized set; HYPOTHESIS_PROFILE=thorough explores many more.
settings.register_profile("ci", max_examples=5, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

EPILOGUE = dict(bias=st.booleans(), activation=st.sampled_from(["none", "relu", "relu6"]))


@st.composite
def conv_fields(draw, depthwise=False, norm=False):
    k = draw(st.sampled_from([1, 3, 5, 7]))
    stride, dilation = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 1, 2]))
    pad = tuple(draw(st.integers(0, k // 2 + 1)) for _ in range(4))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 11))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    assume(h + pad[0] + pad[2] >= dilation * (k - 1) + 1 and w + pad[1] + pad[3] >= dilation * (k - 1) + 1)
    kernel = (c, 1, k, k) if depthwise else (draw(st.integers(1, 11)), c, k, k)
    # norm: the input group-normalized as read (an InstanceNorm, a GroupNorm(1) or one of whole blocks of 4)
    groups = draw(st.sampled_from([c, 1] + ([c // 4] if c % 4 == 0 else []))) if norm else 0
    read_norm = {"in_group_norm": (groups, draw(st.integers(1, 3)), 1e-5, draw(st.sampled_from(["none", "relu"])))} \
        if norm else {}
    return dict(data=(n, c, h, w), kernel=kernel, stride=stride, padding=pad, dilation=dilation,
                residual=draw(st.booleans()), **{f: draw(s) for f, s in EPILOGUE.items()}, **read_norm)


@st.composite
def dense_fields(draw):
    return dict(data=(draw(st.integers(1, 3)), k := draw(st.integers(1, 70))), weight=(draw(st.integers(1, 40)), k),
                **{f: draw(s) for f, s in EPILOGUE.items()})


@st.composite
def spatial_reduce_fields(draw):
    axes = draw(st.sampled_from([(2, 3), (2,), (3,)]))
    return dict(data=(draw(st.integers(1, 2)), draw(st.integers(1, 11)), draw(st.integers(1, 20)),
                      draw(st.integers(1, 20))), kind=draw(st.sampled_from(["mean", "max", "l2"])), axes=axes,
                keepdims=draw(st.booleans()) if axes == (2, 3) else True, scale=draw(st.sampled_from([1.0, 3.0])))


@st.composite
def group_norm_fields(draw):
    c, groups = draw(st.sampled_from([(5, 5), (6, 1), (3, 1), (8, 2), (12, 3), (16, 4), (7, 7), (8, 4), (9, 3),
                                      (10, 5)]))
    return dict(data=(draw(st.integers(1, 2)), c, draw(st.integers(1, 16)), draw(st.integers(1, 16))), groups=groups,
                epsilon=draw(st.sampled_from([1e-5, 1e-3])), activation=draw(st.sampled_from(["none", "relu", "silu"])))


@st.composite
def row_fields(draw, epsilon=False):
    data = draw(st.sampled_from([(draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 5)),
                                  draw(st.integers(1, 5))), (draw(st.integers(1, 9)), draw(st.integers(1, 70)))]))
    return dict(data=data, **({"epsilon": draw(st.sampled_from([1e-5, 1e-6])),
                               "activation": draw(st.sampled_from(["none", "gelu", "relu"]))} if epsilon else {}))


@st.composite
def se_gate_fields(draw):
    return dict(data=(draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 12)),
                      draw(st.integers(1, 12))), squeeze=draw(st.integers(1, 12)),
                act1=draw(st.sampled_from(["relu", "silu", "hardswish"])),
                activation=draw(st.sampled_from(["sigmoid", "hardsigmoid(0.2,0.5)"])))


FIELDS = {"conv2d": conv_fields(), "depthwise_conv2d": conv_fields(depthwise=True), "dense": dense_fields(),
          "spatial_reduce": spatial_reduce_fields(), "group_norm": group_norm_fields(),
          "layer_norm": row_fields(epsilon=True), "softmax": row_fields(), "se_gate": se_gate_fields()}


def scopes(scope: str) -> dict:
    """Every operand in ``scope``, as task knobs."""
    return {f"{k}_scope": scope for k in ("input", "weight", "output")}


def check_random_config(device, name, fields, dtype, seed, **fixed):
    """A random valid config of template ``name`` for the workload ``fields`` with the ``fixed`` knobs, built,
    run on random inputs and checked against the template's NumPy reference; returns the executable, or None
    when no config has those knobs (e.g. half_acc on a reduction longer than its constraint allows)."""
    t = get_template(name)
    wl = t.workload(**fields, dtype=dtype)
    space = t.space(wl, device, **fixed)
    if space.size() == 0:
        return None
    rng = np.random.default_rng(seed)
    cfg = t.make_config(space.sample(rng))
    for knob, value in fixed.items():
        assert getattr(cfg, knob) == value
    exe = build(t.build(wl, cfg), device)
    inputs = t.random_inputs(wl, rng)
    err = t.check(wl, exe(**inputs), inputs)
    assert err <= t.tolerance(wl, cfg), f"{wl}\n{cfg}\nmax relative error {err:.3g}"
    return exe


def check_random_configs_here(device, checks) -> None:
    """``check_random_config(device, name, fields, dtype, seed, **fixed)`` for each ``(name, fields, dtype, seed,
    fixed)`` of ``checks``, each required to find a config; a failure names its check. In this process:
    ``conftest.check_random_configs`` runs them here or in a child process that calls this."""
    for check in checks:
        name, fields, dtype, seed, fixed = check
        try:
            exe = check_random_config(device, name, fields, dtype, seed, **fixed)
        except BaseException as e:
            e.add_note(f"the check: {check!r}")
            raise
        if exe is None:  # raised, not asserted: the child process may run optimized
            raise AssertionError(f"no config of the space has those knobs: {check!r}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("name", list(FIELDS))
def test_random_workload_and_config_match_numpy(device, name, scope, dtype):
    t = get_template(name)

    @given(fields=FIELDS[name], seed=st.integers(0, 2**32 - 1))
    def check(fields, seed):
        assert check_random_config(device, t.name, fields, dtype, seed, **scopes(scope)) is not None
    check()


@pytest.mark.parametrize("fixed", [{"keep_norm_factors": True}, {"local_input": True},
                                   {"local_input": True, "keep_norm_factors": True}],
                         ids=["factors kept", "staged tile", "staged tile, factors kept"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_random_reader_of_a_norm_matches_numpy(device, scope, fixed):
    """A convolution normalizing its input as read (``in_group_norm``), random workloads and configs with the
    norm's factors kept by the work-group, a staged tile normalized as staged, or both."""
    @given(fields=conv_fields(norm=True), seed=st.integers(0, 2**32 - 1))
    def check(fields, seed):
        _, _, OH, OW = get_template("conv2d").workload(**fields).out_shape
        assume(OH * OW > 1 or "local_input" not in fixed)  # a staged tile is shared: a work-group of 2 or more
        assert check_random_config(device, "conv2d", fields, "float32", seed, **scopes(scope), **fixed) is not None
    check()


@pytest.mark.parametrize("kind", ["this device", "a GPU with images"])
@pytest.mark.parametrize("name", list(FIELDS))
def test_fallback_is_a_valid_config_of_the_space(device, name, kind):
    t = get_template(name)
    info = device.info if kind == "this device" else dataclasses.replace(device.info, type="GPU", image_support=True,
                                                                         half_images=True)

    @given(fields=FIELDS[name], dtype=st.sampled_from(["float32", "float16"]))
    @settings(max_examples=40)
    def check(fields, dtype):
        wl = t.workload(**fields, dtype=dtype)
        cfg = t.fallback(wl, info)
        t.space(wl, info).check(t.config_values(wl, cfg))
        # PoCL emulates images in software: its fallback uses buffers; a GPU that holds them uses textures
        assert cfg.input_scope == ("buffer" if kind == "this device" else "texture")
    check()
