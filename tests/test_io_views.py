"""Issue 55: launches cut on held-out models. The model input read in place by the first convolution and the model
output written in place by the last kernel (``tuner.plan.io_views``: no relayout at either boundary); a convolution
reading the concat, nearest upsample or pool before it through views (``tuner.plan.input_views``); MobileViTv2's
softmaxed query computed in the reduction that weights the keys (``tuner.graph.passes_attention``). Templates against
NumPy, small models against onnxruntime in both scopes and both runtimes, the plan's notes, and the log rule (no
tuned config given up for a fusion)."""
from __future__ import annotations

import numpy as np
import pytest

from test_templates import check_random_config, scopes


@pytest.mark.parametrize("fields", [
    dict(data=(1, 3, 9, 7), kernel=(8, 3, 3, 3), padding=(1, 1, 1, 1), bias=True, activation="relu"),
    dict(data=(2, 5, 6, 6), kernel=(6, 5, 3, 3), stride=(2, 2), padding=(1, 1, 1, 1), bias=True),
    dict(data=(1, 8, 5, 5), kernel=(3, 8, 1, 1), bias=True, activation="prelu"),
    dict(data=(1, 4, 6, 5), kernel=(4, 4, 3, 3), padding=(1, 1, 1, 1), pad_mode="reflect")])
@pytest.mark.parametrize("io", ["in", "out", "both"])
@pytest.mark.parametrize("seed", [1, 2])
def test_conv2d_plain_io_matches_numpy(device, fields, io, seed):
    """A random config of conv2d reading X or writing Y as a row-major NCHW buffer (channels not a multiple of 4:
    the last pixel's gather clamps, its scatter skips the padding lanes)."""
    flags = dict(plain_input=io in ("in", "both"), plain_output=io in ("out", "both"))
    fixed = {**scopes("buffer")}
    assert check_random_config(device, "conv2d", {**fields, **flags}, "float32", seed, **fixed) is not None


@pytest.mark.parametrize("data,weight", [((1, 16), (10, 16)), ((3, 8), (8, 8)), ((2, 12), (5, 12))])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dense_plain_output_matches_numpy(device, data, weight, seed):
    """A random config of dense writing Y as a row-major (N, M) buffer (M not a multiple of 4: the last block's
    padding lanes are not written, so no row spills into the next)."""
    assert check_random_config(device, "dense", dict(data=data, weight=weight, bias=True, plain_output=True),
                               "float32", seed, **scopes("buffer")) is not None


# -- the input read through views: a concat's parts, a nearest upsample, a pool (tuner.plan.input_views) ---------

def _part(c, hs, ws, kind="copy", kh=1, kw=1, sh=1, sw=1):
    return (c, hs, ws, kind, kh, kw, sh, sw)


IN_READ = {
    "nearest": dict(data=(1, 6, 8, 6), kernel=(8, 6, 3, 3), in_read=(_part(6, 4, 3, "nearest", 2, 2),)),
    "max": dict(data=(1, 5, 4, 3), kernel=(4, 5, 3, 3), in_read=(_part(5, 9, 7, "max", 2, 2, 2, 2),)),
    "avg3s2": dict(data=(1, 4, 4, 4), kernel=(6, 4, 1, 1), in_read=(_part(4, 9, 9, "avg", 3, 3, 2, 2),)),
    "concat": dict(data=(2, 11, 5, 6), kernel=(8, 11, 3, 3), in_read=(_part(8, 5, 6), _part(3, 5, 6))),
    "reflect_up": dict(data=(1, 4, 6, 4), kernel=(4, 4, 3, 3), pad_mode="reflect",
                       in_read=(_part(4, 3, 2, "nearest", 2, 2),)),
    "concat_up": dict(data=(1, 12, 6, 6), kernel=(5, 12, 3, 3),
                      in_read=(_part(4, 6, 6), _part(8, 3, 3, "nearest", 2, 2))),
    "slice": dict(data=(1, 8, 5, 4), kernel=(6, 8, 1, 1), in_read=((8, 5, 4, "copy", 1, 1, 1, 1, 4, 13),)),
    "three": dict(data=(1, 14, 4, 4), kernel=(4, 14, 1, 1), in_read=(_part(4, 8, 8, "max", 2, 2, 2, 2), _part(8, 4, 4),
                                                                   _part(2, 2, 2, "nearest", 2, 2)))}


@pytest.mark.parametrize("case", list(IN_READ))
@pytest.mark.parametrize("scope,knobs", [("buffer", {}), ("texture", {}), ("buffer", {"vec_load": 1}),
                                         ("buffer", {"local_input": True}), ("texture", {"local_input": True})])
def test_conv2d_in_read_matches_numpy(device, case, scope, knobs):
    """A random config of conv2d reading its input through ``in_read`` views (every load path: one pixel per
    tap, one channel per lane, the local tile) against NumPy on the assembled input."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    fields = {**IN_READ[case], "padding": (1, 1, 1, 1), "bias": True, "activation": "relu"}
    assert check_random_config(device, "conv2d", fields, "float32", 3, **scopes(scope), **knobs) is not None


def test_in_read_is_in_the_key_and_checked():
    """A workload read through views is its own task (in the key, as text); a part that does not make the
    input's size, or an RGBA pixel shared by two parts, is refused naming the part."""
    from tuner.templates import get_template
    t = get_template("conv2d")
    wl = t.workload(**IN_READ["concat_up"])
    assert wl.key()["in_read"] == "4,6,6,copy,1,1,1,1;8,3,3,nearest,2,2,1,1"  # a log's fields: no nested lists
    assert t.workload(**{k: v for k, v in wl.key().items() if k != "op"}) == wl
    assert "in_read" not in t.workload(data=(1, 4, 4, 4), kernel=(4, 4, 1, 1)).key()
    with pytest.raises(ValueError, match="not the input's 6x6"):
        t.workload(data=(1, 4, 6, 6), kernel=(4, 4, 1, 1), in_read=(_part(4, 4, 3, "nearest", 2, 2),))
    with pytest.raises(ValueError, match="a multiple of 4"):
        t.workload(data=(1, 6, 3, 3), kernel=(4, 6, 1, 1), in_read=(_part(2, 3, 3), _part(4, 3, 3)))


# -- attention scores in the reduction (tuner.graph.passes_attention) -------------------------------------------

@pytest.mark.parametrize("data,of,scale", [((1, 16, 8, 8), (32, 33), 64.0), ((2, 5, 3, 7), (2, 3), 1.0),
                                           ((1, 8, 6, 6), (0, 1), 36.0)])
@pytest.mark.parametrize("scope", ["buffer", "texture"])
@pytest.mark.parametrize("seed", [1, 2])
def test_spatial_reduce_softmax_weights_match_numpy(device, data, of, scale, scope, seed):
    """The sum (or mean) over H, W of X times the softmax over H, W of one channel of Q, in one kernel: a random
    schedule (the tree or one work-item a unit; never split) against NumPy."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    assert check_random_config(device, "spatial_reduce", dict(data=data, weight="softmax", softmax_of=of, scale=scale),
                               "float32", seed, **scopes(scope)) is not None


# -- models: the fusions against onnxruntime, in both scopes and both runtimes -------------------------------------

def _unet_level(b):
    """A U-Net level at odd channel counts: 3x3 convs, a 2x2 max pool read by a 16-output conv, a nearest upsample
    concatenated with the skip (8 + 12 channels) read by a conv, a 5-channel 1x1 head writing the output."""
    x = b.input("input", (1, 3, 12, 10))
    s = b.node("Relu", [b.conv(x, 3, 8, 3, bias=True, pads=[1, 1, 1, 1])])
    d = b.node("MaxPool", [s], kernel_shape=[2, 2], strides=[2, 2])
    d = b.node("Relu", [b.conv(d, 8, 16, 3, bias=True, pads=[1, 1, 1, 1])])
    d = b.conv(d, 16, 12, 1, bias=True)
    u = b.node("Resize", [d, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], mode="nearest",
               coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    y = b.node("Relu", [b.conv(b.node("Concat", [s, u], axis=1), 20, 8, 3, bias=True, pads=[1, 1, 1, 1])])
    b.conv(y, 8, 5, 1, bias=True, output="output")
    return {"output": [1, 5, 12, 10]}


def _classifier(b):
    """A 3x3 stride-2 stem reading the input, a pool and a 10-way dense writing the (1, 10) output."""
    x = b.input("input", (2, 3, 16, 16))
    x = b.node("Relu", [b.conv(x, 3, 12, 3, stride=2, bias=True, pads=[1, 1, 1, 1])])
    b.fc(b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1), 12, 10, output="output")
    return {"output": [2, 10]}


MODELS = {"unet_level": (_unet_level, 1, 11), "classifier": (_classifier, 2, 3)}  # (body, ..., launches at most)


def _model(name):
    from tuner.zoo.builder import _Builder
    b = _Builder(seed=3, opset=17)
    return b.model(MODELS[name][0](b), name)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("scope", ["buffer", "texture"])
def test_fused_models_match_onnxruntime_in_both_runtimes(device, native, cl_env, name, scope, tmp_path):
    """The model compiled in ``scope``: no relayout at either boundary, no pool / resize / concat kernel; the Python
    executor and tuner-run both match onnxruntime."""
    import subprocess
    import warnings

    from conftest import building_cpu, with_reference
    from tuner.compile.compiler import compile_model
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    path = tmp_path / "m.onnx"
    x, want = with_reference(_model(name), path)
    dev = building_cpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(str(path), device=dev, scope=scope)
    ops = [n.op for n in mod.spec.nodes]
    assert not {"relayout", "pool", "resize", "concat"} & set(ops), ops
    assert sum(len(n.calls) for n in mod.spec.nodes) <= MODELS[name][2], ops
    viewed = [n for n in mod.spec.nodes if "in_read" in (n.workload or {})]
    assert all(n.scopes["input"] == scope for n in viewed), [(n.name, n.scopes) for n in viewed]  # parts: one scope
    got = mod.run([x])[0]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    art = mod.save(tmp_path / "art")
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([native["tuner_run"], str(art), "--device", dev, "--input", str(tmp_path / "x.npy"),
                        "--output", str(tmp_path / "y.npy")], capture_output=True, text=True, env=cl_env, timeout=300)
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npy")
    assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max()


def test_plan_names_what_it_fused_and_keeps_what_does_not_pay(device):
    """``Plan.fused`` names each kernel folded into a neighbour; a 9x9 stem keeps the input's relayout (its gathers
    would cost more), named with why in ``Plan.copies``; a pool read by a convolution of few outputs stays a kernel."""
    import warnings

    from tuner.compile.compiler import load_graph, plan_graph, plan_model
    from tuner.plan.views import write_views
    from tuner.zoo import models as zoo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        undecided = write_views(plan_model(_model("unet_level"), device.info, "buffer"))
        plan = write_views(plan_graph(load_graph(_model("unet_level")), device.info, "buffer", None))
        st = write_views(plan_graph(load_graph(zoo.test_models()["style_transfer"]), device.info, "buffer", None))
    # the 3x3 stem may still run Winograd before choose_templates: its relayout waits (tuning measures both)
    assert any(c.startswith("input.pack: a copy kernel") and "not chosen yet" in c for c in undecided.copies)
    fused = " | ".join(plan.fused)
    for what in ("input.pack: no kernel; conv0 reads the model input", "output.unpack: no kernel",
                 "read as a max pool of", "read as a nearest upsample of", "its parts read in place"):
        assert what in fused, fused
    assert any(c.startswith("input.pack: a copy kernel (relayout)") and "9x9 window" in c for c in st.copies), st.copies
    assert any("output.unpack: no kernel" in f for f in st.fused), st.fused
    small = write_views(plan_graph(load_graph(zoo.test_models()["unet"]), device.info, "buffer", None))
    assert sum(s.op == "pool" for s in small.steps) == 3  # 2x2 pools read by convolutions of under 16 outputs


def test_a_tuned_config_is_not_given_up_for_a_fusion(device, tmp_path):
    """With a log that tunes the convolutions as they are (reading a pool's, a concat's output), the plan keeps the
    pool, resize and concat kernels and deploys the tuned configs; with records of the fused workloads too, it fuses.
    (The boundary convolutions' buffer-scope records apply to them reading and writing the host buffers in place:
    ``plain_input`` / ``plain_output`` are not in the key, so no relayout is kept for them.)"""
    import dataclasses
    import warnings

    from tuner.compile.compiler import compile_model
    from tuner.logs import SCHEMA_VERSION, Record, append_records
    from tuner.templates import get_template
    model = _model("unet_level")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unfused = compile_model(model, device=device, scope="buffer", measure_plans=False)
    info = device.info

    def records(mod):
        out = []
        for n in mod.spec.nodes:
            if n.template == "conv2d":
                t = get_template("conv2d")
                wl = t.workload(**{k: v for k, v in n.workload.items() if k != "op"})
                cfg = dataclasses.asdict(t.fallback_with(wl, info, **{f"{k}_scope": v for k, v in n.scopes.items()},
                                                         **t.model_knobs))
                out.append(Record(version=SCHEMA_VERSION, template="conv2d", workload=n.workload, scopes=n.scopes,
                                  config=cfg, device=info.fingerprint, costs=[1e-4], median_s=1e-4, gflops=1.0,
                                  error_code=0, error_name="NO_ERROR"))
        return out
    import tuner.compile.compiler as C
    from tuner.plan.lower import plan_storage
    import functools
    orig = C.plan_storage
    C.plan_storage = functools.partial(plan_storage, fusions=())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = compile_model(model, device=device, scope="buffer", measure_plans=False)
    finally:
        C.plan_storage = orig
    log = tmp_path / "log.jsonl"
    append_records(str(log), records(plain))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kept = compile_model(model, device=device, scope="buffer", log=str(log), measure_plans=False)
    ops = [n.op for n in kept.spec.nodes]
    assert {"pool", "resize", "concat"} <= set(ops) and "relayout" not in ops, ops
    assert all(n.tuned for n in kept.spec.nodes if n.template == "conv2d"), ops
    assert sum(len(n.calls) for n in unfused.spec.nodes) < sum(len(n.calls) for n in kept.spec.nodes)
    append_records(str(log), records(unfused))  # the fused workloads measured too: taken
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        both = compile_model(model, device=device, scope="buffer", log=str(log), measure_plans=False)
    assert [n.op for n in both.spec.nodes] == [n.op for n in unfused.spec.nodes]
    assert all(n.tuned for n in both.spec.nodes if n.template == "conv2d")


@pytest.mark.parametrize("data,weight,pool", [((1, 16), (10, 16), (8, 8)), ((2, 6), (5, 6), (3, 5)),
                                              ((1, 24), (16, 24), (1, 1))])
@pytest.mark.parametrize("scope", ["buffer", "texture"])
@pytest.mark.parametrize("seed", [1, 2])
def test_dense_reading_its_global_pool_matches_numpy(device, data, weight, pool, scope, seed):
    """A random config of dense whose input features are the means of an NCHW tensor's maps (``in_pool``: a
    classifier's global average pool read in place) against NumPy; odd feature counts pad the last block."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    assert check_random_config(device, "dense", dict(data=data, weight=weight, bias=True, in_pool=pool), "float32",
                               seed, **scopes(scope)) is not None


@pytest.mark.parametrize("data,parts", [((1, 16, 8, 8), ((4, 0, 16), (4, 4, 16), (4, 0, 4), (4, 0, 4))),
                                        ((2, 10, 3, 5), ((8, 8, 20), (2, 0, 2))), ((1, 6, 4, 4), ((6, 4, 12),))])
@pytest.mark.parametrize("scope", ["buffer", "texture"])
@pytest.mark.parametrize("seed", [1, 2])
def test_layer_norm_reading_parts_matches_numpy(device, data, parts, scope, seed):
    """A random schedule of layer_norm over the channels of an input read in parts (``in_read``: EdgeNeXt's
    concatenated SDTA chunks, slices of a larger tensor read at their offsets) against NumPy."""
    if scope == "texture" and not device.info.image_support:
        pytest.skip("no images")
    assert check_random_config(device, "layer_norm", dict(data=data, in_read=parts, activation="gelu"), "float32",
                               seed, **scopes(scope)) is not None
