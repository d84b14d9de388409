"""The ``local_input`` knob (a work-group stages its input tile in ``__local`` memory) and the ``compute`` knob
(``float32``; ``half``: half loads and products, float32 sums; ``half_acc``: half sums too), checked against
NumPy with random workloads and random valid configs that have the knob on, in texture and buffer scopes.

Half arithmetic needs cl_khr_fp16: those tests run on Intel's CPU runtime (``-d intel``) and skip with the
reason when it is not installed. The errors each mode reaches (max relative error against the float64
reference, random normal inputs; float16 storage alone rounds the output to ~5e-4):

* ``float32`` and ``half`` on float16 storage: ~3e-4 to 5e-4 at any reduction length measured (up to 2304);
  half products lose nothing that the float16 operands had not lost already.
* ``half_acc``: ~3e-3 at a reduction of 144, ~6e-3 at 576, ~1.3e-2 at 1152 and 2304. The search spaces allow it
  only up to a reduction of 576 per accumulator (``half_acc_length``), so the float16 tolerance of 1e-2 holds
  for every config they allow.
"""
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from test_templates import FIELDS, check_random_config, scopes  # noqa: E402  (shared strategies and check; loads the CI profile)
from tuner.codegen.opencl import FP16_PRAGMA
from tuner.templates import get_template



@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("name", ["conv2d", "depthwise_conv2d"])
def test_local_input_matches_numpy(device, name, scope, dtype):
    @given(fields=FIELDS[name], seed=st.integers(0, 2**32 - 1))
    def check(fields, seed):
        exe = check_random_config(device, name, fields, dtype, seed, local_input=True, **scopes(scope))
        assert exe is None or ("__local" in exe.source and "barrier(CLK_LOCAL_MEM_FENCE)" in exe.source)
    check()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_split_k_matches_numpy(device, scope, dtype):
    """conv2d's ``split_k``: the work-items of a split sum interleaved channel steps, then combine in __local."""
    @given(fields=FIELDS["conv2d"], seed=st.integers(0, 2**32 - 1), k=st.sampled_from([2, 4, 8]))
    def check(fields, seed, k):
        exe = check_random_config(device, "conv2d", fields, dtype, seed, split_k=k, **scopes(scope))
        assert exe is None or ("__local" in exe.source and "barrier(CLK_LOCAL_MEM_FENCE)" in exe.source)
    check()


def test_split_k_needs_a_step_per_work_item_and_fits_local_memory(device):
    t = get_template("conv2d")
    wl = t.workload(data=(1, 16, 8, 8), kernel=(8, 16, 3, 3), padding=1)  # 4 channel blocks
    bufs = scopes("buffer")
    assert t.space(wl, device, split_k=4, **bufs).size() > 0
    assert t.space(wl, device, split_k=8, **bufs).size() == 0  # 4 steps cannot feed 8 work-items
    assert t.space(wl, device, split_k=2, local_input=True, **bufs).size() == 0
    small = dataclasses.replace(device.info, local_mem_bytes=1024)  # 2 x (4x2) x 4 entries x 16 B = 1 KiB fits
    big = dict(split_k=2, wg_w=4, wg_h=2, tile_oc=2, tile_oh=1, tile_ow=2, split_c=1, **bufs)
    assert t.space(wl, small, **big).size() > 0
    assert t.space(wl, small, **{**big, "tile_oh": 2}).size() == 0
    with pytest.raises(ValueError, match="local_input"):
        t.build(wl, t.config(split_k=2, local_input=True))


@pytest.mark.parametrize("compute", ["half", "half_acc"])
@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("name", ["conv2d", "depthwise_conv2d", "dense"])
def test_half_compute_matches_numpy(fp16_device, name, scope, compute):
    @given(fields=FIELDS[name], seed=st.integers(0, 2**32 - 1), local=st.booleans())
    def check(fields, seed, local):
        fixed = {"compute": compute, **({"local_input": local} if name != "dense" else {})}
        exe = check_random_config(fp16_device, name, fields, "float16", seed, **fixed, **scopes(scope))
        assert exe is None or (FP16_PRAGMA in exe.source and "half4" in exe.source)
    check()


@pytest.mark.parametrize("name", ["conv2d", "depthwise_conv2d", "dense"])
def test_half_compute_needs_fp16_and_float16_storage(device, name):
    t = get_template(name)
    fields = {"conv2d": dict(data=(1, 8, 6, 6), kernel=(8, 8, 3, 3), padding=1),
              "depthwise_conv2d": dict(data=(1, 8, 6, 6), kernel=(8, 1, 3, 3), padding=1),
              "dense": dict(data=(1, 32), weight=(8, 32))}[name]
    no_fp16 = dataclasses.replace(device.info, fp16=False)
    with_fp16 = dataclasses.replace(device.info, fp16=True)
    for dtype, info, allowed in (("float32", with_fp16, False), ("float16", no_fp16, False),
                                 ("float16", with_fp16, True)):
        space = t.space(t.workload(**fields, dtype=dtype), info, compute="half", input_scope="buffer",
                        weight_scope="buffer", output_scope="buffer")
        assert (space.size() > 0) == allowed, (dtype, info.fp16)
    with pytest.raises(ValueError, match="float16 storage"):
        t.build(t.workload(**fields), t.config(compute="half"))


def test_half_acc_is_limited_to_short_reductions(device):
    t = get_template("conv2d")
    info = dataclasses.replace(device.info, fp16=True)
    short = t.workload(data=(1, 64, 8, 8), kernel=(8, 64, 3, 3), padding=1, dtype="float16")  # 576
    long = t.workload(data=(1, 128, 8, 8), kernel=(8, 128, 3, 3), padding=1, dtype="float16")  # 1152
    bufs = scopes("buffer")
    assert t.space(short, info, compute="half_acc", **bufs).size() > 0
    assert t.space(long, info, compute="half_acc", **bufs).size() == 0
    assert t.space(long, info, compute="half", **bufs).size() > 0


@pytest.mark.parametrize("name", ["conv2d", "depthwise_conv2d"])
def test_local_tile_must_fit_local_memory(device, name):
    t = get_template(name)
    kernel = (64, 64, 7, 7) if name == "conv2d" else (64, 1, 7, 7)
    wl = t.workload(data=(1, 64, 64, 64), kernel=kernel, padding=3)
    big = dict(tile_oh=4, tile_ow=8, wg_w=8, wg_h=8, local_input=True, input_scope="buffer",
               weight_scope="buffer", output_scope="buffer")
    info = dataclasses.replace(device.info, local_mem_bytes=16384, max_work_group_size=4096,
                               max_work_item_sizes=(4096, 4096, 4096))
    space = t.space(wl, info, **big)
    assert space.size() == 0  # (8*4-1+7) x (8*8-1+7) pixels x 16 B > 16 KiB
    assert t.space(wl, info, **{**big, "local_input": False}).size() > 0


@pytest.mark.parametrize("name", ["conv2d", "depthwise_conv2d", "dense"])
def test_fallback_keeps_new_knobs_off(device, name):
    t = get_template(name)
    fields = {"conv2d": dict(data=(1, 8, 6, 6), kernel=(8, 8, 3, 3), padding=1),
              "depthwise_conv2d": dict(data=(1, 8, 6, 6), kernel=(8, 1, 3, 3), padding=1),
              "dense": dict(data=(1, 32), weight=(8, 32))}[name]
    cfg = t.fallback(t.workload(**fields, dtype="float16"), device.info)
    assert cfg.compute == "float32" and not getattr(cfg, "local_input", False)
    assert name != "conv2d" or cfg.split_k == 1


def test_features_see_the_new_knobs():
    t = get_template("conv2d")
    from tuner.search.features import derived_features
    wl = t.workload(data=(1, 8, 6, 6), kernel=(8, 8, 3, 3), padding=1, dtype="float16")
    v = t.space_vars(wl)
    base = t.config_values(wl, t.config())
    on = t.config_values(wl, t.config(local_input=True, compute="half"))
    f0, f1 = derived_features(t, v, base), derived_features(t, v, on)
    assert (f0["local_input"], f0["half"], f1["local_input"], f1["half"]) == (0.0, 0.0, 1.0, 1.0)


def test_tolerance_follows_the_arithmetic_and_the_reduction_length():
    """The check's tolerance is the config's: float arithmetic keeps the storage's (1e-4, 1e-2); half products
    with float sums keep it too; half sums grow with the square root of the terms one output sums."""
    t = get_template("conv2d")
    wl = lambda c, dtype="float16", groups=1: t.workload(data=(1, c, 8, 8), kernel=(16, c // groups, 3, 3),  # noqa: E731
                                                         padding=1, groups=groups, dtype=dtype)
    f32 = wl(16, "float32")
    assert t.tolerance(f32) == t.tolerance(f32, t.config()) == 1e-4
    assert t.tolerance(wl(64), t.config()) == t.tolerance(wl(64), t.config(compute="half")) == 1e-2
    acc = lambda w: t.tolerance(w, t.config(compute="half_acc"))  # noqa: E731
    assert 1e-2 < acc(wl(16)) < acc(wl(64)) < 3e-2  # 144 and 576 terms: measured 3e-3 and 6e-3
    assert acc(wl(64, groups=4)) == acc(wl(16))  # a group sums its own 16 channels
    assert acc(wl(256)) > 2 * acc(wl(16))
    clipped = t.workload(data=(1, 96, 8, 8), kernel=(16, 96, 1, 1), activation="relu6", dtype="float16")
    plain = dataclasses.replace(clipped, activation="relu")
    assert acc(clipped) > 3 * acc(plain)  # relu6 bounds the output, not the sums' rounding (measured 9.6e-3)
    assert t.tolerance(clipped, t.config()) == 1e-2
    dw = get_template("depthwise_conv2d")
    assert dw.tolerance(dw.workload(data=(1, 8, 6, 6), kernel=(8, 1, 3, 3), padding=1, dtype="float16"),
                        dw.config(compute="half_acc")) == 1e-2  # 9 terms: the storage's rounding dominates
    for name in ("conv2d", "depthwise_conv2d", "dense", "matmul", "winograd2", "winograd4"):
        assert get_template(name).reduction is not None, name
    w4 = get_template("winograd4")
    assert w4.tolerance(w4.workload(data=(1, 16, 8, 8), kernel=(8, 16, 3, 3), padding=1, dtype="float16")) == 2e-2


@pytest.mark.parametrize("compute", ["float32", "half", "half_acc"])
def test_the_check_uses_the_configs_tolerance(fp16_device, compute):
    """tuner op's check (as the measurement's) judges a config by its own arithmetic's tolerance: a 576-term
    conv2d in half sums is within it, and its error exceeds float arithmetic's (half sums do round)."""
    from tuner.op import run_op
    t = get_template("conv2d")
    wl = t.workload(data=(1, 64, 8, 8), kernel=(16, 64, 3, 3), padding=1, dtype="float16")
    cfg = t.fallback_with(wl, fp16_device, compute=compute, **scopes("buffer"))
    res = run_op(t, wl, cfg, fp16_device, check=True, time=False)
    assert res.tolerance == t.tolerance(wl, cfg) and res.ok, (res.max_rel_error, res.tolerance)
    if compute == "half_acc":
        assert 1e-3 < res.max_rel_error < 1e-2 < res.tolerance
    else:
        assert res.max_rel_error < 1.5e-3 and res.tolerance == 1e-2


def test_compute_is_a_knob_of_the_arithmetic_templates_only():
    """conv2d, depthwise, dense, matmul and Winograd tune ``compute``; norms and reductions have no such knob
    and always sum in float (their accumulators are float32x4 whatever the storage)."""
    import inspect
    for name in ("conv2d", "depthwise_conv2d", "dense", "matmul", "winograd2", "winograd4"):
        assert get_template(name).space().all_knobs["compute"] == ["float32", "half", "half_acc"], name
    for name in ("group_norm", "layer_norm", "softmax", "spatial_reduce"):
        t = get_template(name)
        assert "compute" not in t.space().all_knobs, name
        source = inspect.getsource(inspect.getmodule(t.build))
        assert '"float16x4", "private"' not in source and '"float32x4", "private"' in source, name


def test_logs_show_half_arithmetic_first():
    """`tuner logs` cuts its config column to the terminal: half arithmetic leads it, float keeps knob order."""
    from tuner.analysis.summary import knobs_text
    assert knobs_text({"tile_oc": 2, "input_scope": "buffer", "compute": "half_acc", "split_k": 1}) == \
        "compute=half_acc tile_oc=2 split_k=1"
    assert knobs_text('{"tile_oc": 2, "compute": "float32", "split_k": 1}') == "tile_oc=2 compute=float32 split_k=1"
