"""The reduction templates (templates/reduction.py's schedule; spatial_reduce, group_norm): the split and the
work-group tree against NumPy on long reductions, float32 statistics of data far from zero, the bound on the
texels a work-item reads (fallbacks on GPU profiles and the spaces), and models whose pools and norms become
tuning tasks. Random workloads and configs of both templates are in test_templates.py."""
import dataclasses

import numpy as np
import pytest

from tuner.runtime.opencl.launch import build
from tuner.templates import get_template
from tuner.templates.reduction import MAX_TEXELS_PER_ITEM, ceil_div, chunk_statistics


def _gpu(info, **kw):
    """A GPU profile over the test device's (H100-like unless ``kw`` says otherwise)."""
    base = dict(type="GPU", image_support=True, half_images=True, compute_units=132, max_work_group_size=1024,
                max_work_item_sizes=(1024, 1024, 64), local_mem_bytes=48 * 1024)
    return dataclasses.replace(info, **{**base, **kw})


def _run(device, name, fields, cfg, inputs=None, seed=0):
    t = get_template(name)
    wl = t.workload(**fields)
    cfg = t.config(**cfg)
    assert not t.space(wl, device).violations(t.config_values(wl, cfg))
    inputs = inputs or t.random_inputs(wl, np.random.default_rng(seed))
    return t.check(wl, build(t.build(wl, cfg), device)(**inputs), inputs)


SCOPES = [dict(input_scope=s, weight_scope=s, output_scope=s) for s in ("buffer", "texture")]


@pytest.mark.parametrize("scopes", SCOPES, ids=["buffer", "texture"])
@pytest.mark.parametrize("sched", [dict(wg_reduce=32, units_per_wg=1, split=8), dict(wg_reduce=8, units_per_wg=2, split=1),
                                   dict(wg_reduce=64, units_per_wg=2, split=4)])
def test_long_reductions_split_and_tree_match_numpy(device, sched, scopes):
    assert _run(device, "group_norm", dict(data=(2, 12, 40, 36), groups=1), {**sched, **scopes}) < 1e-4
    assert _run(device, "group_norm", dict(data=(2, 8, 30, 30), groups=8), {**sched, **scopes}) < 1e-4
    assert _run(device, "spatial_reduce", dict(data=(1, 8, 48, 40), kind="mean"), {**sched, **scopes}) < 1e-4
    assert _run(device, "spatial_reduce", dict(data=(1, 8, 48, 40), kind="max"), {**sched, **scopes}) < 1e-4


def test_group_norm_statistics_of_data_far_from_zero(device):
    """Raw float32 sums of x and x^2 over 38,400 values of mean 1000 and deviation 0.1 cancel to noise; the
    shifted sums keep the normalized output within 1e-4 of NumPy's float64."""
    t = get_template("group_norm")
    wl = t.workload(data=(1, 16, 40, 60), groups=1)
    rng = np.random.default_rng(1)
    x = (1000.0 + 0.1 * rng.standard_normal(wl.data)).astype(np.float32)
    inputs = {"X": x, "S": rng.standard_normal(16).astype(np.float32), "B": rng.standard_normal(16).astype(np.float32)}
    for sched in (dict(wg_reduce=64, units_per_wg=1, split=8), dict(wg_reduce=16, units_per_wg=1, split=1)):
        assert _run(device, "group_norm", dict(data=wl.data, groups=1), {**sched, **SCOPES[0]}, inputs) < 1e-4


# the worst readers: InstanceNorm at 128x128 (65,544 elements a work-item), GroupNorm(1) of 64x56x56
# (25,728) and a squeeze-excite pool of 112x112 (12,544)
BIG = [("group_norm", dict(data=(1, 32, 128, 128), groups=32)), ("group_norm", dict(data=(1, 64, 56, 56), groups=1)),
       ("group_norm", dict(data=(1, 320, 14, 14), groups=1)), ("spatial_reduce", dict(data=(1, 32, 112, 112))),
       ("spatial_reduce", dict(data=(1, 1152, 7, 7))), ("group_norm", dict(data=(1, 512, 64, 64), groups=1)),
       ("group_norm", dict(data=(1, 64, 56, 56), groups=32)),
       ("softmax", dict(data=(3136, 3136))), ("layer_norm", dict(data=(1, 768, 1, 196)))]  # attention rows, tokens


@pytest.mark.parametrize("profile", [{}, dict(compute_units=4, max_work_group_size=512, max_work_item_sizes=(512, 512, 512),
                                              local_mem_bytes=32 * 1024)], ids=["h100-like", "phone-like"])
@pytest.mark.parametrize("name, fields", BIG)
def test_fallbacks_read_a_bounded_share_and_fill_the_gpu(device, name, fields, profile):
    t = get_template(name)
    info = _gpu(device.info, **profile)
    wl = t.workload(**fields)
    cfg = t.fallback(wl, info)
    t.space(wl, info).check(t.config_values(wl, cfg))
    v = t.space_vars(wl)
    texels = ceil_div(ceil_div(v["E"], cfg.split), cfg.wg_reduce)
    assert texels * 4 <= 4096 and texels <= MAX_TEXELS_PER_ITEM
    groups = ceil_div(v["U"], cfg.units_per_wg) * cfg.split
    assert groups * cfg.wg_reduce * cfg.units_per_wg >= min(v["U"] * v["E"] // 64, 2 * info.compute_units * 64)
    assert cfg.input_scope == "texture"


@pytest.mark.parametrize("name, fields", BIG[:2])
def test_the_space_refuses_a_work_item_over_the_whole_image(device, name, fields):
    t = get_template(name)
    wl = t.workload(**fields)
    serial = t.config(wg_reduce=1, units_per_wg=1, split=1, input_scope="buffer", weight_scope="buffer",
                      output_scope="buffer")
    assert [v.split(":")[0] for v in t.space(wl, device).violations(t.config_values(wl, serial))] == ["bounded"]


@pytest.mark.parametrize("scopes", SCOPES, ids=["buffer", "texture"])
@pytest.mark.parametrize("data, groups", [((1, 64, 9, 7), 32), ((2, 30, 6, 5), 10), ((1, 18, 5, 8), 6)])
def test_groups_that_share_a_block_match_numpy(device, data, groups, scopes):
    """GroupNorm(32) of 64 channels (2 a group), groups of 3: a pixel holds lanes of two groups."""
    for sched in (dict(wg_reduce=8, units_per_wg=2, split=1), dict(wg_reduce=4, units_per_wg=1, split=4)):
        assert _run(device, "group_norm", dict(data=data, groups=groups), {**sched, **scopes}) < 1e-4


COMPUTE = {"conv2d", "conv2d_winograd", "depthwise_conv2d", "dense", "matmul"}
BOUNDED_MODELS = ["norms", "reduce", "reduce_axes_input", "squeeze_excitation", "global_avg_pool", "softmax",
                  "poolformer_block", "mixed", "avg_pool", "max_pool", "pool_ceil", "shufflenet_units",
                  "layer_norm", "convnext_block", "resize", "conv_transpose"]


@pytest.mark.parametrize("name", BOUNDED_MODELS)
def test_no_kernel_outside_the_compute_templates_reads_more_than_4096_elements_a_work_item(device, name):
    """Issue 35's bound, on the models compiled for a GPU profile: no kernel but a convolution's, a dense layer's or
    a matmul's reads more than 4096 elements per launched work-item. A reduction template's config keeps its own
    bound (the space's ``bounded`` constraint: at most 1,024 texels a work-item); a glue kernel's read arguments
    hold at most 4096 elements per work-item it launches."""
    import warnings

    from tuner.compile.compiler import compile_model
    from tuner.zoo.models import test_models
    info = _gpu(device.info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(test_models()[name], target=info)
    glue = {}
    for n in mod.spec.nodes:
        if n.template in COMPUTE:
            continue
        if n.template:
            t = get_template(n.template)
            wl = t.workload(**{k: tuple(v) if isinstance(v, list) else v for k, v in n.workload.items() if k != "op"})
            assert not t.space(wl, info).violations(t.config_values(wl, t.config(**n.config))), (n.name, n.config)
        else:
            glue[n.name, n.op] = max(c.reads_per_work_item() for c in n.calls)
    assert max(glue.values(), default=0) <= 4 * MAX_TEXELS_PER_ITEM, sorted(glue.items(), key=lambda kv: -kv[1])[:3]


@pytest.mark.parametrize("data,chunks", [((2, 10, 6, 7), 4), ((1, 16, 4, 8), 16), ((1, 4, 2, 2), 1)])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_group_norm_statistics_only(device, data, chunks, scope):
    """``stats``: GroupNorm(1)'s chunk partials only (for its 1x1 readers, ``passes_layer_norm``), one kernel, a
    float32 buffer of (N * chunks * 2, 4), against NumPy on data far from zero; the split is the chunk count and
    the output a buffer (the space); stats is in the key only when set."""
    t = get_template("group_norm")
    wl = t.workload(data=data, groups=1, stats=chunks)
    cfg = dataclasses.replace(t.fallback(wl, device.info), input_scope=scope, weight_scope=scope)
    built = t.build(wl, cfg)
    assert len(getattr(built, "kernels", [built])) == 1
    assert _run(device, "group_norm", dict(data=data, groups=1, stats=chunks), cfg.__dict__) < 1e-5
    space = t.space(wl, device)
    assert space.violations(t.config_values(wl, dataclasses.replace(cfg, split=chunks * 2)))
    assert space.violations(t.config_values(wl, dataclasses.replace(cfg, output_scope="texture")))
    assert "stats" not in t.workload(data=data, groups=1).key() and wl.key()["stats"] == chunks
    with pytest.raises(ValueError, match="stats"):
        t.workload(data=(1, 8, 4, 4), groups=4, stats=2)  # groups of 2 channels share a block


@pytest.mark.parametrize("data,groups,chunks", [((2, 10, 6, 7), 10, 4), ((1, 16, 4, 8), 16, 16), ((1, 4, 2, 2), 4, 1),
                                               ((2, 16, 6, 7), 2, 4), ((1, 24, 5, 5), 6, 8)])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_group_norm_statistics_of_more_groups(device, data, groups, chunks, scope):
    """``stats`` with groups = C (an InstanceNorm: per (image, block of 4 channels), a lane each channel) or groups of
    whole blocks: the statistics for the convolutions that normalize as they read (``Conv2dWorkload.in_group_norm``),
    one kernel, a float32 buffer of (N * units * chunks * 2, 4), against NumPy on data far from zero (a partial last
    block included); the sums add up to each unit's, whatever the chunks; groups that share a block have none."""
    t = get_template("group_norm")
    C = data[1]
    wl = t.workload(data=data, groups=groups, stats=chunks)
    units = -(-C // 4) if groups == C else groups
    assert wl.out_shape == (data[0] * units * chunks * 2, 4)
    cfg = dataclasses.replace(t.fallback(wl, device.info), input_scope=scope, weight_scope=scope)
    built = t.build(wl, cfg)
    assert len(getattr(built, "kernels", [built])) == 1
    x = t.random_inputs(wl, np.random.default_rng(1))["X"].astype(np.float64)
    sums = chunk_statistics(x, chunks, groups).reshape(data[0], units, chunks, 2, 4).sum(axis=2)[:, :, 0]
    if groups == C:  # each lane its channel's sum of d = x - x[.., 0, 0]
        assert np.allclose(sums.reshape(data[0], -1)[:, :C], (x - x[:, :, :1, :1]).sum(axis=(2, 3)))
    else:  # each unit's lanes add up to its group's sum of d = x - the group's first element
        xg = x.reshape(data[0], groups, -1)
        assert np.allclose(sums.sum(axis=2), (xg - xg[:, :, :1]).sum(axis=2))
    assert _run(device, "group_norm", dict(data=data, groups=groups, stats=chunks), cfg.__dict__) < 1e-5
    with pytest.raises(ValueError, match="stats"):
        t.workload(data=(1, 8, 4, 4), groups=4, stats=2)  # 2 channels a group
