"""A convolution that writes its DCR depth_to_space (``Conv2dWorkload.shuffle_view``, issue 38): the template
against NumPy (texture and buffer, blocks 2 and 3, crops, tiles past the output, phases of 1, 2, 4 and 8 channels,
a split reduction, with a concat's ``out_view``); PixelShuffle's CRD turned into DCR by permuting the convolution
(``passes_conv_transpose.crd_to_dcr``); the plan's interleaves written in place (``plan.views``) in the task
models, against onnxruntime in texture, buffer and auto scopes; the cases that keep the kernel, with the note that
says why; an artifact of such a plan under tuner-run."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.compile.compiler import compile_model, load_graph, plan_graph
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes import optimize
from tuner.graph.passes_conv_transpose import crd_to_dcr
from tuner.graph.reference import run_graph_numpy
from tuner.ops.kernels_movement import depth_to_space_reference
from tuner.plan.lower import lower_graph, plan_storage
from tuner.plan.views import write_views
from tuner.runtime.opencl.launch import build
from tuner.templates import get_template
from tuner.templates.common import Conv2dWorkload, random_inputs, reference
from tuner.templates.conv2d_nchw4c import Conv2dConfig, conv2d_nchw4c
from tuner.zoo import models as zoo, tasks

BUFFERS = dict(input_scope="buffer", weight_scope="buffer", output_scope="buffer")


def _plain(wl: Conv2dWorkload) -> Conv2dWorkload:
    return dataclasses.replace(wl, shuffle_view=())


# (label, workload with its view, config): phases of c channels; tiles past the stacked output (7 columns in tiles
# of 4, 5 rows in tiles of 2); windows that crop the interleave's first rows / columns and its last
CASES = [
    ("2x2 c4 crop (1,1), texture", Conv2dWorkload((1, 5, 6, 7), (16, 5, 3, 3), 1, 1, bias=True, activation="relu",
                                                  shuffle_view=(2, 2, 1, 1, 10, 12)), Conv2dConfig()),
    ("2x2 c8 whole, buffer tiles", Conv2dWorkload((1, 6, 5, 7), (32, 6, 2, 2), 1, (1, 1, 0, 0), bias=True,
                                                  shuffle_view=(2, 2, 0, 0, 10, 14)),
     Conv2dConfig(tile_oc=3, tile_oh=2, tile_ow=4, wg_w=2, **BUFFERS)),
    ("3x3 c1 crop, texture tiles", Conv2dWorkload((1, 5, 6, 7), (9, 5, 3, 3), 1, 1, bias=True, activation="tanh",
                                                  shuffle_view=(3, 3, 1, 2, 16, 18)),
     Conv2dConfig(tile_oc=2, tile_ow=4, wg_w=2)),
    ("3x3 c2 crop, buffer", Conv2dWorkload((1, 5, 6, 7), (18, 5, 3, 3), 1, 1, bias=True,
                                           shuffle_view=(3, 3, 2, 1, 15, 19)), Conv2dConfig(tile_oh=2, **BUFFERS)),
    ("2x2 c1 (two pixels short), split_k", Conv2dWorkload((2, 8, 5, 4), (4, 8, 5, 5), 1, 2, bias=True,
                                                          shuffle_view=(2, 2, 1, 1, 8, 6)),
     Conv2dConfig(split_k=2, wg_w=2)),
    ("3x2 c4 residual, texture in / buffer out", Conv2dWorkload((1, 4, 4, 5), (24, 4, 3, 3), 1, 1, residual=True,
                                                                shuffle_view=(3, 2, 0, 1, 12, 9)),
     Conv2dConfig(output_scope="buffer", tile_ow=2, wg_w=4)),
    ("2x2 c2 half storage, texture", Conv2dWorkload((1, 8, 5, 6), (8, 8, 3, 3), 1, 1, bias=True, dtype="float16",
                                                    shuffle_view=(2, 2, 1, 1, 9, 11)), Conv2dConfig(tile_oc=2)),
]


@pytest.mark.parametrize("name,wl,cfg", CASES, ids=[c[0] for c in CASES])
def test_convolution_writes_its_interleave(device, rng, name, wl, cfg):
    """The kernel's output is the NumPy convolution put through depth_to_space (DCR) and cropped; the key, so the
    tuned configs, are the plain convolution's."""
    inputs = random_inputs(wl, rng)
    y = build(conv2d_nchw4c(wl, cfg), device)(**inputs)["Y"].astype(np.float64)
    bh, bw, top, left, oh, ow = wl.shuffle_view
    plain = reference(_plain(wl), inputs["X"], inputs["Wt"], inputs.get("B"), inputs.get("Res"))
    want = depth_to_space_reference(plain, (bh, bw), "DCR", (top, left), (oh, ow))
    assert y.shape == wl.stored_shape == want.shape == (wl.data[0], wl.kernel[0] // (bh * bw), oh, ow)
    assert np.abs(y - want).max() / np.abs(want).max() < get_template("conv2d").tolerance(wl)
    ref = reference(wl, inputs["X"], inputs["Wt"], inputs.get("B"), inputs.get("Res"))
    assert np.array_equal(ref, want)  # the template's reference applies the view: a tuned config is checked on it
    assert wl.key() == _plain(wl).key()


def test_tuning_check_of_a_workload_with_the_view(device, rng):
    """The template's check (what every measured config goes through) passes for the view; the plain
    convolution's reference has another shape."""
    t = get_template("conv2d")
    wl = CASES[0][1]
    inputs = t.random_inputs(wl, rng)
    y = build(conv2d_nchw4c(wl, Conv2dConfig(**BUFFERS)), device)(**inputs)
    assert t.check(wl, y, inputs) < t.tolerance(wl)
    with pytest.raises(Exception, match="output shape"):
        t.check(_plain(wl), y, inputs)


@pytest.mark.parametrize("knobs", [dict(), dict(**BUFFERS, tile_oc=2)], ids=["texture", "buffer"])
def test_interleave_written_into_a_concat(device, rng, knobs):
    """``shuffle_view`` with ``out_view``: a 4-channel phase interleave lands at channels 8..12 of a 13-channel
    concat; a 1-channel one as a concat's last part."""
    for kernel, view, out_view in (((16, 5, 3, 3), (2, 2, 1, 0, 11, 14), (8, 13)),
                                   ((4, 5, 3, 3), (2, 2, 0, 0, 12, 14), (12, 13))):
        wl = Conv2dWorkload((1, 5, 6, 7), kernel, 1, 1, bias=True, shuffle_view=view, out_view=out_view)
        assert wl.stored_shape == (1, out_view[1], *view[4:])
        inputs = random_inputs(wl, rng)
        y = build(conv2d_nchw4c(wl, Conv2dConfig(**knobs)), device)(**inputs)["Y"].astype(np.float64)
        ref = reference(wl, inputs["X"], inputs["Wt"], inputs["B"])
        got = y[:, out_view[0]:out_view[0] + ref.shape[1]]
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-4


@pytest.mark.parametrize("change,match", [
    (dict(kernel=(12, 5, 3, 3)), "3 channels a phase are not whole RGBA pixels"),
    (dict(kernel=(10, 5, 3, 3)), "do not divide into 2x2 phases"),
    (dict(shuffle_view=(2, 2, 1, 1, 12, 12)), "outside the 12x14 interleave"),
    (dict(shuffle_view=(2, 2, 0, 0, 12)), r"\(bh, bw, top, left, out_h, out_w\)"),
    (dict(out_view=(8, 10)), "within the total"),
    (dict(side_copy=((1, 4, 12, 14), (0, 1, 2, 3), 4, "texture"), out_view=(0, 8)), "side_copy with shuffle_view"),
])
def test_view_refused_with_what_is_wrong(change, match):
    base = dict(data=(1, 5, 6, 7), kernel=(16, 5, 3, 3), stride=1, padding=1, shuffle_view=(2, 2, 0, 0, 12, 14))
    with pytest.raises(ValueError, match=match):
        Conv2dWorkload(**{**base, **change})


# -- the graph: PixelShuffle's CRD as DCR --------------------------------------------------------------------------
def _espcn(channels: int):
    return tasks.sr_pixel_shuffle(input_size=12, channels=channels)


def _ort(model, x) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_pixel_shuffle_becomes_dcr_with_the_convolution_permuted(channels):
    """The convolution's weight rows and bias in DCR order and the interleave DCR: the graph's answer the same
    (the reference interpreter against onnxruntime); ``optimize`` runs the pass."""
    m = _espcn(channels)
    g = crd_to_dcr(from_onnx(m))
    (d2s,) = [n for n in g.nodes if n.op == "depth_to_space"]
    assert d2s.attrs["mode"] == "DCR"
    conv = g.producer(d2s.inputs[0])
    assert conv.inputs[1].endswith(".dcr") and conv.inputs[2].endswith(".dcr")
    x = np.random.default_rng(1).standard_normal((1, channels, 12, 12)).astype(np.float32)
    want = _ort(m, x)[0]
    got = run_graph_numpy(g, {"input": x})["output"]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    assert [n.attrs["mode"] for n in optimize(from_onnx(m)).nodes if n.op == "depth_to_space"] == ["DCR"]


def _with_output(model, tensor: str, relu: bool = False):
    """``model`` with ``tensor`` also a model output (through a ReLU: a second reader)."""
    nodes, out = list(model.graph.node), tensor
    if relu:
        out = f"{tensor}.relu"
        nodes.append(helper.make_node("Relu", [tensor], [out], name="second_reader"))
    g = helper.make_graph(nodes, "more", list(model.graph.input), list(model.graph.output) +
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], list(model.graph.initializer))
    return helper.make_model(g, opset_imports=list(model.opset_import))


def _stacked(model) -> str:
    return next(n for n in model.graph.node if n.op_type == "DepthToSpace").input[0]


def test_crd_stays_where_the_convolution_has_another_reader():
    """A CRD interleave of a convolution whose output is also a model output: nothing permuted."""
    m = _espcn(4)
    g = optimize(from_onnx(_with_output(m, _stacked(m))))
    (d2s,) = [n for n in g.nodes if n.op == "depth_to_space"]
    assert d2s.attrs["mode"] == "CRD" and not any(t.endswith(".dcr") for n in g.nodes for t in n.inputs)


# -- the plan: interleaves written in place, against onnxruntime ------------------------------------------------------
def _models() -> dict:
    """Task models: the test set's (pose: 8 channels a phase; FSRCNN: 1; U-Net: 6, 4, 3; ESPCN: 3) and variants
    whose every interleave can be written (ESPCN on luminance and on 4 channels, a U-Net of 32, 16, 8 a phase)."""
    test = zoo.test_models()
    out = {name: test[name] for name in ("pose", "sr_conv_transpose", "unet", "sr_pixel_shuffle")}
    out.update(espcn1=_espcn(1), espcn4=_espcn(4), unet8=tasks.unet(input_size=16, base=8))
    return out


MODELS = _models()
# name -> depth_to_space kernels left in the plan; the other interleaves are written by their convolutions
LEFT = {"pose": 0, "sr_conv_transpose": 0, "espcn1": 0, "espcn4": 0, "unet8": 0, "unet": 2, "sr_pixel_shuffle": 1}


def _input(model) -> np.ndarray:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def _compiled(model, device, scope: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_model(model, device=device, scope=scope)


def _views(model, device, scope: str = "texture"):
    return write_views(plan_graph(load_graph(model), device.info, scope, None))


@pytest.mark.parametrize("scope", ["texture", "buffer", "auto"])
def test_task_model_plans_write_their_interleaves(device, scope):
    """No depth_to_space kernel where the convolution can write it; a note per interleave. (The test set's models
    run against onnxruntime in every scope in test_model.py's test_every_operator_matches_onnxruntime.)"""
    for name, model in MODELS.items():
        plan = _views(model, device, scope)
        assert [s.op for s in plan.steps].count("depth_to_space") == LEFT[name], (name, plan.views)
        views = [v for v in plan.views if "interleave" in v or ": a kernel:" in v]
        assert sum("writes the interleave" in v for v in views) == len(views) - LEFT[name], (name, views)
        if scope != "auto":
            assert {t.scope for t in plan.tensors.values() if t.kind != "plain"} == {scope}


@pytest.mark.parametrize("name", ["espcn1", "espcn4", pytest.param("unet8", marks=pytest.mark.slow)])
def test_interleaves_written_by_convolutions_match_onnxruntime(device, name):
    model = MODELS[name]
    x = _input(model)
    want = _ort(model, x)
    for scope in ("texture", "buffer", "auto"):
        mod = _compiled(model, device, scope)
        assert [n.op for n in mod.spec.nodes].count("depth_to_space") == 0
        for got, ref in zip(mod.run([x]), want):
            assert got.shape == ref.shape and np.abs(got - ref).max() / np.abs(ref).max() < 1e-4, scope


def test_notes_say_why_an_interleave_stays_a_kernel(device):
    """RGB ESPCN (3 channels a phase), U-Net's 6- and 3-channel up-convolutions, and a convolution whose output
    another kernel reads too keep their kernels, and the plan's notes say why."""
    notes = _views(MODELS["sr_pixel_shuffle"], device).views
    assert any(v.startswith("d2s") and ": a kernel:" in v and "3 channels a phase" in v for v in notes), notes
    notes = _views(MODELS["unet"], device).views
    assert sum("channels a phase" in v for v in notes) == 2 and sum("writes the interleave" in v for v in notes) == 1
    m = MODELS["espcn4"]
    plan = _views(_with_output(m, _stacked(m), relu=True), device)
    assert [s.op for s in plan.steps].count("depth_to_space") == 1
    assert any(": a kernel:" in v and "read by another kernel too" in v for v in plan.views), plan.views


def test_winograd_or_undecided_producer_keeps_the_kernel(device):
    """A phase convolution deployed as Winograd (3x3 stride 1: ESPCN's last layer) cannot write the interleave, nor
    can a step whose template is not chosen yet (``alternatives``): the notes name the producer."""
    graph = load_graph(MODELS["espcn4"])
    undecided = plan_storage(lower_graph(graph), device.info, "texture", None)
    d2s = next(s for s in undecided.steps if s.op == "depth_to_space")
    conv = next(s for s in undecided.steps if s.output == d2s.inputs["X"])
    assert {a.op for a in conv.alternatives} == {"winograd2", "winograd4"}
    assert write_views(undecided).views == [f"{d2s.name}: a kernel: {d2s.inputs['X']} (its producer's template is "
                                            f"not chosen yet (conv2d, winograd2, winograd4))"]
    why = f"{d2s.name}: a kernel: {d2s.inputs['X']} (its producer ({{}}) writes no interleave)"
    for wino in ("winograd2", "winograd4"):
        plan = write_views(plan_graph(graph, device.info, "texture", None, prefer={conv.name: wino}))
        assert [s.op for s in plan.steps].count("depth_to_space") == 1 and plan.views == [why.format(wino)]


def _two_up_convolutions():
    """Two stride-2 ConvTransposes (2x2, and 4x4 pad 1) of one input, concatenated (4 + 4 channels), then a ReLU."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 6, 5, 7])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, None)
    inits, nodes = [], []
    for i, (k, p) in enumerate(((2, 0), (4, 1))):
        w, b = rng.standard_normal((6, 4, k, k)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("ConvTranspose", ["input", f"w{i}", f"b{i}"], [f"up{i}"], name=f"ct{i}",
                                      kernel_shape=[k, k], strides=[2, 2], pads=[p] * 4))
    nodes.append(helper.make_node("Concat", ["up0", "up1"], ["cat"], name="cat", axis=1))
    nodes.append(helper.make_node("Relu", ["cat"], ["output"], name="relu"))
    return helper.make_model(helper.make_graph(nodes, "two_up", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_interleaves_written_into_a_concat_match_onnxruntime(device):
    """Each phase convolution writes its interleave at its channels of the concat: neither the interleaves nor
    the concat run a kernel."""
    model = _two_up_convolutions()
    x = _input(model)
    want = _ort(model, x)[0]
    for scope in ("texture", "buffer"):
        plan = _views(model, device, scope)
        assert [s.op for s in plan.steps].count("conv2d") == 2, plan.views
        assert {"depth_to_space", "concat"}.isdisjoint(s.op for s in plan.steps), plan.views
        got = _compiled(model, device, scope).run([x])[0]
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                    reason="the native runtime is built with make and gcc")
@pytest.mark.parametrize("name,scope", [("sr_conv_transpose", "texture"), ("espcn4", "buffer")])
def test_artifact_runs_under_tuner_run(native, cl_env, tmp_path, name, scope):
    """The artifact of a plan whose convolutions write interleaves runs under tuner-run (C) and matches
    onnxruntime: the artifact holds nothing new, a kernel writes another tensor."""
    from conftest import building_cpu
    model, cpu = MODELS[name], building_cpu()
    mod = _compiled(model, cpu, scope)
    assert "depth_to_space" not in [n.op for n in mod.spec.nodes]
    art = mod.save(tmp_path / "art")
    x = _input(model)
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run([native["tuner_run"], str(art), "--device", cpu, "--input", str(tmp_path / "x.npy"),
                        "--output", str(tmp_path / "y.npy")], capture_output=True, text=True, env=cl_env, timeout=300)
    assert r.returncode == 0, r.stderr
    y, want = np.load(tmp_path / "y.npy"), _ort(model, x)[0]
    assert y.shape == want.shape and np.abs(y - want).max() / np.abs(want).max() < 1e-4
