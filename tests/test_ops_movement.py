"""The data-movement and layout operators (tuner/graph/*_movement.py): glue kernels against NumPy on the test
device (NaN padding lanes in, NaN-filled outputs, texture / buffer / mixed scopes, float32 / float16, odd channel
counts), the frontend and passes against onnxruntime, and whole models compiled in both scopes."""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.ops import kernels_movement as KM
from tuner.runtime.opencl.launch import build

from test_graph_kernels import SCOPES, TOL, draw, rel_error, run

def _check(device, k, inputs, ref, dtype):
    got = run(build(k, device), device, inputs, padded_outputs=True)["Y"]
    shape = ref.shape
    logical = got[tuple(slice(0, s) for s in shape)]
    assert rel_error(logical, ref) <= TOL[dtype]
    c = shape[1]
    if got.shape[1] > c:  # the kernel's own padding lanes are zero
        assert np.all(got[:, c:] == 0)


SLICES = [  # in_shape, channels, rows, cols
    ((2, 7, 5, 6), list(range(2, 7)), (0, 1, None), (0, 1, None)),  # Split's second half, offset 2
    ((1, 9, 4, 5), list(range(0, 4)), (1, 2, 2), (0, 1, None)),  # aligned channels, strided rows
    ((1, 12, 3, 3), list(np.arange(12).reshape(2, 6).T.reshape(-1)), (0, 1, None), (0, 1, None)),  # shuffle g=2
    ((1, 10, 4, 4), list(range(9, 0, -3)), (0, 1, None), (3, -1, 4)),  # reversed channels and cols
    ((2, 13), list(range(5, 11)), (0, 1, None), (0, 1, None)),  # 2-D rows
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES)
@pytest.mark.parametrize("case", range(len(SLICES)))
def test_slice_kernel(device, rng, case, scopes, dtype):
    shape, ch, rows, cols = SLICES[case]
    k = KM.slice_kernel(shape, ch, rows, cols, dtype, *scopes, max_work_group=device.info.max_work_group_size)
    x = draw(rng, shape, dtype)
    _check(device, k, {"X": x}, KM.slice_reference(x, ch, rows, cols), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("shape,perm", [((1, 5, 3, 6), (0, 2, 3, 1)), ((2, 3, 7, 5), (0, 3, 1, 2)),
                                        ((1, 6, 5, 3), (0, 1, 3, 2)), ((3, 9), (1, 0))])
def test_permute_kernel(device, rng, shape, perm, scopes, dtype):
    k = KM.permute_kernel(shape, perm, dtype, *scopes)
    x = draw(rng, shape, dtype)
    _check(device, k, {"X": x}, KM.permute_reference(x, perm), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("mode,pads,value", [("constant", (1, 2, 0, 1), 0.5), ("reflect", (2, 1, 1, 3), 0.0),
                                             ("edge", (0, 3, 2, 1), 0.0)])
def test_pad_kernel(device, rng, mode, pads, value, scopes, dtype):
    shape = (2, 5, 4, 5)
    k = KM.pad_kernel(shape, pads, mode, value, dtype, *scopes)
    x = draw(rng, shape, dtype)
    _check(device, k, {"X": x}, KM.pad_reference(x, pads, mode, value), dtype)


RESIZES = [("nearest", "asymmetric", "floor", (10, 12)), ("nearest", "half_pixel", "round_prefer_floor", (7, 9)),
           ("linear", "half_pixel", "round_prefer_floor", (10, 12)), ("linear", "align_corners", "floor", (9, 11)),
           ("linear", "pytorch_half_pixel", "floor", (1, 3)), ("linear", "asymmetric", "floor", (3, 4)),
           ("nearest", "align_corners", "round_prefer_ceil", (8, 3))]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("case", RESIZES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3][0]}x{c[3][1]}")
def test_resize_kernel(device, rng, case, scopes, dtype):
    mode, coord, nearest, out_hw = case
    shape = (1, 6, 5, 6)
    k = KM.resize_kernel(shape, out_hw, mode, coord, nearest, None, dtype, *scopes)
    x = draw(rng, shape, dtype)
    _check(device, k, {"X": x}, KM.resize_reference(x, out_hw, mode, coord, nearest), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("out_hw,stride,shift", [((9, 7), (2, 2), (0, 0)), ((8, 11), (3, 2), (1, 0))])
def test_upsample_zeros_kernel(device, rng, out_hw, stride, shift, scopes, dtype):
    shape = (1, 5, 5, 4)
    k = KM.upsample_zeros_kernel(shape, out_hw, stride, shift, dtype, *scopes)
    x = draw(rng, shape, dtype)
    _check(device, k, {"X": x}, KM.upsample_zeros_reference(x, out_hw, stride, shift), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 8, 2, 2), (3, 13)])
def test_layer_norm_template_writes_zero_padding_lanes(device, rng, shape, scopes, dtype):
    """The layer_norm template (templates/channel_reduce.py) with NaN input padding lanes."""
    from tuner.templates import get_template
    t = get_template("layer_norm")
    wl = t.workload(data=shape, epsilon=1e-5, dtype=dtype)
    k = t.build(wl, t.config(wg_reduce=2, units_per_wg=2, split=1, input_scope=scopes[0], weight_scope=scopes[0],
                             output_scope=scopes[1]))
    x, g, bt = draw(rng, shape, dtype) * 2 + 1, draw(rng, shape[1:2], dtype), draw(rng, shape[1:2], dtype)
    _check(device, k, {"X": x, "G": g, "Bt": bt}, t.reference(wl, {"X": x, "G": g, "Bt": bt}), dtype)


D2S = [((1, 12, 3, 4), (2, 2), "DCR", (0, 0), None),  # 3 channels: each lane gathered
       ((2, 32, 3, 2), (2, 2), "DCR", (1, 0), (4, 3)),  # 8 channels: whole pixels, a window
       ((1, 18, 4, 3), (3, 2), "CRD", (2, 1), (9, 4)),  # a 3x2 block, CRD, a window
       ((1, 16, 2, 2), (2, 2), "CRD", (0, 0), None)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("case", range(len(D2S)))
def test_depth_to_space_kernel(device, rng, case, scopes, dtype):
    shape, block, mode, crop, size = D2S[case]
    k = KM.depth_to_space_kernel(shape, block, mode, crop, size, dtype, *scopes)
    x = draw(rng, shape, dtype)
    _check(device, k, {"X": x}, KM.depth_to_space_reference(x, block, mode, crop, size), dtype)


def test_depth_to_space_reference_is_onnx_depth_to_space():
    from onnx.reference.ops.op_depth_to_space import DepthToSpace
    x = np.random.default_rng(0).standard_normal((2, 36, 3, 4)).astype(np.float32)
    for mode in ("DCR", "CRD"):
        want = DepthToSpace.eval(x, blocksize=3, mode=mode)
        assert np.array_equal(KM.depth_to_space_reference(x, (3, 3), mode).astype(np.float32), want)


# -- frontend, passes, whole models ---------------------------------------------------------------------------
from tuner.zoo import models as zoo, movement as zoo_movement  # noqa: E402
from tuner.frontend.onnx import from_onnx  # noqa: E402
from tuner.graph.passes_movement import optimize_movement  # noqa: E402
from tuner.graph.reference import random_inputs, run_graph_numpy  # noqa: E402
from tuner.graph.reference_movement import PASS_ATTRS, PASS_OPS  # noqa: E402

MODELS = zoo.test_models()
MOVEMENT = sorted(zoo_movement.TEST_MODELS)


@pytest.fixture
def with_pass(monkeypatch):
    """The reference interpreter knowing the ops only the movement passes create (``passes.optimize`` runs
    ``optimize_movement`` first: running it twice is not idempotent on attention's token tensors)."""
    from tuner.graph import reference
    monkeypatch.setattr(reference, "OPS", {**reference.OPS, **PASS_OPS})
    monkeypatch.setattr(reference, "ATTRS", {**reference.ATTRS, **PASS_ATTRS})


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name", MOVEMENT)
def test_movement_pass_keeps_values_and_leaves_4d_or_2d(name, with_pass):
    g = from_onnx(MODELS[name])
    opt = optimize_movement(g)
    assert all(len(opt.shapes[t]) in (2, 4) for n in opt.nodes for t in n.outputs)
    assert not any(n.op == "conv_transpose" for n in opt.nodes)
    x = random_inputs(g)
    want, got = run_graph_numpy(g, x), run_graph_numpy(opt, x)
    for t in g.outputs:
        assert rel_error(got[t], want[t].astype(np.float64)) < 1e-5


def test_channel_shuffle_is_one_gather_and_nhwc_layer_norm_has_no_transpose(with_pass):
    opt = optimize_movement(from_onnx(MODELS["shufflenet"]))
    assert not any(n.op in ("reshape", "transpose") for n in opt.nodes)
    shuffles = [n for n in opt.nodes if n.op == "slice" and len(n.attrs["channels"]) == 14]
    assert len(shuffles) == 1 and shuffles[0].attrs["channels"][:4] == (0, 7, 1, 8)  # the model's output
    # the first shuffle is read only by the split: each half gathers from the concat, through both
    halves = [n.attrs["channels"] for n in opt.nodes if n.op == "slice" and n.inputs == ["concat0"]]
    assert halves == [(0, 7, 1, 8, 2, 9, 3), (10, 4, 11, 5, 12, 6, 13)]
    ln = optimize_movement(from_onnx(MODELS["layer_norm"]))
    ops = [n.op for n in ln.nodes]
    assert ops[:2] == ["layer_norm", "relu"]  # the NHWC permutes cancelled around LayerNorm and ReLU
    assert ops.count("transpose") == 1  # the output's (0, 1, 3, 2) then (0, 2, 3, 1), merged into one
    assert [n.attrs["axis"] for n in ln.nodes if n.op == "layer_norm"] == [1, 1]
    ct = [n.op for n in optimize_movement(from_onnx(MODELS["conv_transpose"])).nodes]
    # the strided ones of dilation 1 are their phases, one stacked convolution and an interleave each; the BatchNorm
    # and ReLU after the first moved before its interleave (into the convolution's epilogue later); the dilated one
    # keeps zero insertion
    assert ct.count("depth_to_space") == 3 and ct.count("upsample_zeros") == 1
    assert ct[:3] == ["conv2d", "batch_norm", "relu"] and ct[3] == "depth_to_space"


@pytest.mark.parametrize("name", MOVEMENT)
@pytest.mark.parametrize("scope,dtype", [("texture", "float32"), ("buffer", "float32"), ("texture", "float16"),
                                         ("buffer", "float16"), ("auto", "float32")])
def test_movement_models_compile_and_match_onnxruntime(name, scope, dtype, with_pass, device):
    from tuner.compile.compiler import compile_model
    model = MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(model, device=device, scope=scope, dtype=dtype)
    feeds = {n: np.random.default_rng(1).standard_normal(mod.spec.entries[n].shape).astype(np.float32)
             for n in mod.spec.inputs}
    for o, r in zip(mod.run(feeds), _ort(model, feeds)):
        assert o.shape == r.shape
        assert rel_error(o, r) < (1e-4 if dtype == "float32" else 3e-2)
    inner = {e.storage_scope for n, e in mod.spec.entries.items() if n not in mod.spec.inputs + mod.spec.outputs}
    if scope == "buffer":
        assert inner == {"global"}
    elif scope == "texture":
        assert inner <= {"texture"}


def _convnext_block(c: int = 6, hidden: int = 10):
    """ConvNeXt's block as torch exports it, without the biases (whose last-axis Add needs broadcasting):
    dwconv7x7 -> permute(0, 2, 3, 1) -> LayerNorm -> MatMul -> ReLU -> MatMul -> permute back -> + x."""
    b = zoo._Builder(0, 17)
    r = b.rng
    x = b.input("input", (1, c, 9, 9))
    y = b.conv(x, c, c, 7, groups=c, bias=True)
    y = b.node("Transpose", [y], perm=[0, 2, 3, 1])
    y = b.node("LayerNormalization", [y, b.const("s", r.uniform(0.5, 1.5, c)), b.const("b", r.normal(0, .1, c))],
               epsilon=1e-6)
    y = b.node("MatMul", [y, b.const("w1", r.normal(0, 0.4, (c, hidden)))])
    y = b.node("MatMul", [b.node("Relu", [y]), b.const("w2", r.normal(0, 0.3, (hidden, c)))])
    y = b.node("Transpose", [y], perm=[0, 3, 1, 2])
    return b.model({b.node("Add", [x, y]): None}, "convnext_block")


def test_convnext_block_runs_in_nchw(with_pass, device, monkeypatch):
    """Needs frontend._op_MatMul to delegate ranks 3/4 to MovementOps._matmul_nd (patched in here if not yet)."""
    from tuner.frontend import onnx as frontend
    from tuner.compile.compiler import compile_model, load_graph
    model = _convnext_block()
    try:
        from_onnx(model)
    except Exception:
        orig = frontend._Converter._op_MatMul

        def matmul(self, ctx):
            if len(self.shapes[self.resolve(ctx.inputs()[0])]) != 2:
                return self._matmul_nd(ctx)
            return orig(self, ctx)
        monkeypatch.setattr(frontend._Converter, "_op_MatMul", matmul)
    g = load_graph(model)
    # ReLU and the add fused; the LayerNorm inside the first 1x1 convolution (passes_layer_norm)
    assert [(n.op, bool(n.attrs.get("in_norm"))) for n in g.nodes] == [("conv2d", False), ("conv2d", True),
                                                                       ("conv2d", False)]
    for scope in ("texture", "buffer"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = compile_model(model, device=device, scope=scope)
        x = np.random.default_rng(2).standard_normal((1, 6, 9, 9)).astype(np.float32)
        assert rel_error(mod.run([x])[0], _ort(model, {"input": x})[0]) < 1e-4


def test_errors_name_the_node():
    from tuner.errors import TunerError

    def model(node, shape=(1, 4, 6, 6), inits=()):
        xi = helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))
        y = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
        return helper.make_model(helper.make_graph([node], "g", [xi], [y], [numpy_helper.from_array(v, k)
                                                                           for k, v in inits]),
                                 opset_imports=[helper.make_opsetid("", 13)])
    cases = [
        (model(helper.make_node("Pad", ["input", "p"], ["y"], name="pd"), inits=[("p", np.array([0, 1, 0, 0, 0, 1, 0, 0],
                                                                                               np.int64))]),
         ["'pd'", "Pad", "only H and W"]),
        (model(helper.make_node("Resize", ["input", "", "s"], ["y"], name="rs", mode="cubic"),
               inits=[("s", np.array([1, 1, 2, 2], np.float32))]), ["'rs'", "mode='cubic'"]),
        (model(helper.make_node("Slice", ["input", "a", "b", "c"], ["y"], name="sl"),
               inits=[("a", np.array([0], np.int64)), ("b", np.array([1], np.int64)), ("c", np.array([0], np.int64))],
               shape=(2, 4, 6, 6)), ["'sl'", "batch axis"]),
        (model(helper.make_node("LayerNormalization", ["input", "s"], ["y"], name="ln", axis=1),
               inits=[("s", np.ones((4, 6, 6), np.float32))]), ["'ln'", "last axis"]),
    ]
    for m, parts in cases:
        with pytest.raises(TunerError) as e:
            from_onnx(m)
        assert all(p in str(e.value) for p in parts), (parts, str(e.value))


def test_shufflenet_units_write_their_concats_in_place(with_pass, device):
    """Every concat of ShuffleNetV2's units is written in place by the gather of the passed-through half and the
    branches' last convolutions: halves of 6 channels are padded to whole RGBA pixels first (zero filters, a
    gather continued). The shuffles and the splits' second halves run no kernel: composed gathers, gathers read
    through the next convolutions' weights, and the stride-2 unit's depthwise convolution runs on the concat's
    order with the gather moved after it (and folded into the 1x1 convolution there)."""
    from tuner.compile.compiler import plan_graph, load_graph
    from tuner.plan.views import write_views
    g = load_graph(MODELS["shufflenet_units"])
    concats = [n for n in g.nodes if n.op == "concat"]
    assert [g.shapes[n.outputs[0]][1] for n in concats] == [14, 14, 16, 16, 16]  # 6 + 6 stored as 8 + 6
    plan = write_views(plan_graph(g, device.info, "texture", None))
    ops = [s.op for s in plan.steps]
    compute = sum(op in ("conv2d", "depthwise_conv2d") for op in ops)
    # the 4 gathers of passed-through halves run in the launch of the convolution writing the same concat
    # (side_copy): the model's output gather and 2 relayouts are the only other kernels
    assert compute == 17 and "concat" not in ops and len(ops) == compute + 3
    assert len(plan.views) == 5 and all("no kernel" in v for v in plan.views)
    assert sum("gather in its own launch" in v for v in plan.views) == 4
    views = [s for s in plan.steps if s.attrs.get("out_view") or getattr(s.workload, "out_view", ())]
    assert sorted(s.op for s in views) == ["conv2d"] * 6
    copies = [s for s in views if s.workload.side_copy]
    assert len(copies) == 4 and all(s.inputs["Xs"] in plan.tensors and s.workload.side_copy[2] == 0 for s in copies)
    dw = next(n for n in g.nodes if n.op == "conv2d" and n.attrs["stride"] == (2, 2) and n.attrs["groups"] == 14)
    assert g.shapes[dw.inputs[0]][1] == 14  # the depthwise reads the padded concat itself


def test_concats_that_stay_copies_say_why(with_pass, device):
    """A part read by another kernel too, one that shares an RGBA pixel with the next part, one whose producer
    writes no offset (a pooling kernel): the concat stays one copy kernel, and the plan says why."""
    from tuner.compile.compiler import plan_graph, load_graph
    from tuner.plan.views import write_views
    from tuner.zoo.models import test_models
    why = []
    for name in ("concat", "mixed"):
        plan = write_views(plan_graph(load_graph(test_models()[name]), device.info, "texture", None))
        assert [s.op for s in plan.steps].count("concat") == len(plan.views)
        why += plan.views
    assert all("a copy kernel" in v for v in why)
    for reason in ("read by another kernel too", "share an RGBA pixel", "(pool) writes no offset"):
        assert any(reason in v for v in why), reason


def test_convnext_block_runs_three_kernels(with_pass):
    """torchvision's ConvNeXt block: the GELU is recognized before the transposes sink (its erf pattern reads its
    input twice), so both NHWC permutes cancel; the layer scale folds into the second Linear's filters, which
    then takes the residual add; the LayerNorm runs inside the first Linear (``passes_layer_norm``): depthwise,
    LayerNorm + 1x1 + GELU, 1x1 + scale + residual -- three kernels."""
    from tuner.graph.passes import optimize
    opt = optimize(from_onnx(MODELS["convnext_block"]))
    assert [(n.op, n.attrs.get("activation"), "residual" in n.attrs, bool(n.attrs.get("in_norm")))
            for n in opt.nodes] == [("conv2d", None, False, False), ("conv2d", "gelu", False, True),
                                    ("conv2d", None, True, False)]


def test_pads_read_by_convolutions_run_no_kernel():
    """passes.fold_pads: the reflection, edge and zero Pads before convolutions become their padding (a
    reflection read by two convolutions too); a reflection before a depthwise layer, a non-zero constant and a
    reflection before a convolution with its own padding stay kernels."""
    from tuner.graph.passes import optimize
    g = optimize(from_onnx(MODELS["pads_into_convs"]))
    convs = [n for n in g.nodes if n.op == "conv2d"]
    assert [n.attrs.get("pad_mode", "zeros") for n in convs[:5]] == ["reflect", "reflect", "reflect", "edge", "zeros"]
    assert [tuple(n.attrs["padding"]) for n in convs[:5]] == [(1, 1, 1, 1), (2, 1, 1, 2), (2, 1, 1, 2), (0, 2, 1, 0),
                                                             (2, 1, 1, 3)]
    assert [(n.attrs["mode"], n.outputs[0] in (c.inputs[0] for c in convs)) for n in g.nodes if n.op == "pad"] == \
        [("reflect", True), ("constant", True), ("reflect", True)]


def test_head_slices_read_by_token_copies_run_no_kernel(with_pass):
    """passes_movement.compose_gathers_into_copies: the q and k slices of a convolution's channels, reshaped
    into tokens, become copies reading the convolution's output at the slices' offsets (strides rescaled per
    image: batch 2); a slice whose reshape mixes images and channels keeps its kernel. Values: against the
    graph before the pass. Then ``passes_tokens.matmul_views`` (last) lets the product read both in place."""
    from tuner.graph.graph import run_passes
    from tuner.graph.passes import PIPELINE, optimize
    from tuner.graph.passes_tokens import matmul_views
    g0 = from_onnx(MODELS["heads_to_tokens"])
    g = run_passes(g0, PIPELINE[:PIPELINE.index(matmul_views)])
    slices = [n for n in g.nodes if n.op == "slice"]
    assert [n.attrs["channels"] for n in slices] == [tuple(range(8, 16))]
    copies = [n for n in g.nodes if n.op == "strided_copy" and n.inputs[0] == "conv0"]
    assert sorted(n.attrs["offset"] for n in copies) == [0, 48] and all(n.attrs["src_shape"] == (2, 16, 3, 4)
                                                                       for n in copies)
    x = random_inputs(g0)
    want, got = run_graph_numpy(g0, x), run_graph_numpy(g, x)
    for t in g0.outputs:
        assert rel_error(got[t], want[t].astype(np.float64)) < 1e-5
    mm = next(n for n in optimize(g0).nodes if n.op == "matmul")  # q^T @ k: k as B^T, both channels of conv0
    assert mm.inputs == ["conv0", "conv0"] and mm.attrs["trans_b"]
    assert mm.attrs["a_view"] == ((2, 16, 3, 4), 1, 0, 0, 0) and mm.attrs["b_view"] == ((2, 16, 3, 4), 1, 4, 0, 0)


@pytest.mark.parametrize("op,views,scopes", [
    ("add", ((), (24, 8)), ("texture", "buffer")),  # X1 = channels 8..14 of a 24-channel tensor
    ("add", ((12, 4), (16, 8)), ("buffer", "texture")),  # both read in place
    ("relu", ((20, 12),), ("texture",)),
    ("bias_add", ((11, 4),), ("buffer", "buffer")),  # 7 channels ending at the source's last (padding lanes)
    ("add", ((), (24, 6)), ("buffer", "buffer")),  # inside a pixel: channels 6..12 (EdgeNeXt's chunks of 30)
    ("add", ((9, 1), (17, 10)), ("texture", "buffer")),  # both inside a pixel, the first ending at the last
    ("relu", ((10, 3),), ("texture",)),
])
def test_elementwise_reads_channel_slices_in_place(device, rng, op, views, scopes):
    """elementwise_kernel's ``in_views``: an input read as channels offset..offset + C of a larger tensor (the
    slice ``passes_movement.slices_read_in_place`` drops), against NumPy on the slices."""
    from tuner.ops.kernels import elementwise_kernel, elementwise_reference
    shape = (2, 7, 3, 5)
    k = elementwise_kernel(shape, op, "float32", scopes, "texture", "relu" if op != "relu" else "none",
                           max_work_group=device.info.max_work_group_size, in_views=views)
    names = [b.name for b in k.params[:-1]]
    full = [draw(rng, (2, v[0], 3, 5) if v else shape, "float32") for v in views]
    inputs = dict(zip(names, full + ([draw(rng, (7,), "float32")] if op == "bias_add" else [])))
    sliced = [x[:, v[1]:v[1] + 7] if v else x for x, v in zip(full, views)] + list(inputs.values())[len(full):]
    got = run(build(k, device), device, inputs)["Y"]
    ref = elementwise_reference(op, *sliced, activation="relu" if op != "relu" else "none")
    assert rel_error(got, ref) <= TOL["float32"]
    with pytest.raises(ValueError, match="within the channels"):
        elementwise_kernel(shape, "relu", in_views=((12, 6),))


def test_identities_run_no_kernel(device):
    """passes_movement.drop_identities: a reshape to the same shape, a Pad of zeros (a window partition padded
    by 0) and a Slice keeping everything run no kernel; both scopes still match onnxruntime."""
    from tuner.compile.compiler import compile_model
    from tuner.graph.passes import optimize
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, -1, 3, 5], np.int64), "same"),
             numpy_helper.from_array(np.zeros(8, np.int64), "zeros"),
             numpy_helper.from_array(np.array([0, 0], np.int64), "starts"),
             numpy_helper.from_array(np.array([6, 5], np.int64), "ends"),
             numpy_helper.from_array(np.array([1, 3], np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], name="conv"),
             helper.make_node("Reshape", ["c", "same"], ["r"], name="view"),
             helper.make_node("Pad", ["r", "zeros"], ["p"], name="pad"),
             helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"], name="crop"),
             helper.make_node("Relu", ["s"], ["output"], name="relu")]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                       [1, 4, 3, 5])],
                                            [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 6, 3, 5])],
                                            inits), opset_imports=[helper.make_opsetid("", 17)])
    assert [n.op for n in optimize(from_onnx(m)).nodes] == ["conv2d"]  # the ReLU fuses into the convolution
    x = rng.standard_normal((1, 4, 3, 5)).astype(np.float32)
    want = _ort(m, {"input": x})[0]
    for scope in ("texture", "buffer"):
        assert rel_error(compile_model(m, device=device, scope=scope).run({"input": x})[0], want) <= 1e-5


@pytest.mark.parametrize("activation,dtype", [("relu", "float32"), ("sigmoid", "float16"), ("clip(-0.5,0.25)",
                                                                                              "float32")])
def test_concat_kernel_with_an_activation(device, rng, activation, dtype):
    """concat_kernel's ``activation`` (``fuse_concat_activations``): applied to every lane, the padding lanes of the
    last block still zero (sigmoid(0) is not)."""
    from tuner.ops.kernels import concat_kernel, concat_reference
    shapes = [(2, 5, 3, 2), (2, 8, 3, 2), (2, 2, 3, 2)]
    k = concat_kernel(shapes, dtype, ("texture", "buffer", "texture"), "buffer",
                      max_work_group=device.info.max_work_group_size, activation=activation)
    xs = [draw(rng, s, dtype) for s in shapes]
    _check(device, k, {f"X{i}": x for i, x in enumerate(xs)}, concat_reference(*xs, activation=activation), dtype)


def _nhwc_region_model(case: str):
    """An NHWC tensor (a transposed convolution output) read by a rank-keeping reduction and pointwise ops, then
    transposed back: ``grn`` timm's channels-last response norm (the L2 norm over axes 1 and 2, its mean over the last
    axis, ``y + (beta + gamma * (y * N) * 1)``); ``unsupported`` a reduction over W and C, which in NCHW would be over
    axes 1 and 3 (no kernel)."""
    from tuner.zoo.builder import _Builder
    b = _Builder(seed=13, opset=17)
    c = 6
    x = b.conv(b.input("input", (2, 3, 5, 4)), 3, c, 3, bias=True)
    y = b.node("Transpose", [x], perm=[0, 2, 3, 1])
    if case == "grn":
        g = b.node("ReduceL2", [y], axes=[1, 2], keepdims=1)
        n = b.node("Div", [g, b.node("Add", [b.node("ReduceMean", [g], axes=[-1], keepdims=1),
                                             b.const("eps", np.float32(1e-6))])])
        t = b.node("Mul", [b.node("Mul", [b.const("gamma", b.rng.normal(0, 0.5, (1, 1, 1, c))),
                                          b.node("Mul", [y, n])]), b.const("one", np.ones(1, np.float32))])
        out = b.node("Add", [y, b.node("Add", [b.const("beta", b.rng.normal(0, 0.2, (1, 1, 1, c))), t])])
    else:
        out = b.node("Add", [b.node("ReduceMean", [y], axes=[2, 3], keepdims=1), y])
    b.node("Transpose", [out], perm=[0, 3, 1, 2], output="output")
    return b.model({"output": [2, c, 5, 4]}, "m")


@pytest.mark.parametrize("case", ["grn", "unsupported"])
def test_an_nhwc_region_of_reductions_runs_in_nchw_where_it_can(case):
    """``passes_movement._reductions_to_nchw``: an NHWC region of rank-keeping reductions and pointwise ops read
    through one transpose computes in NCHW -- no transpose left but the model output's identity, the reference's
    result the same; a region whose reduction would have no kernel in NCHW stays as it was."""
    from tuner.graph.passes_movement import nhwc_to_nchw
    from tuner.graph.reference import random_inputs, run_graph_numpy
    g = from_onnx(_nhwc_region_model(case))
    moved = nhwc_to_nchw(g)
    inputs = random_inputs(g, seed=1)
    want, got = run_graph_numpy(g, inputs), run_graph_numpy(moved, inputs)
    np.testing.assert_allclose(got["output"], want["output"], rtol=1e-6, atol=1e-6)
    transposes = [n for n in moved.nodes if n.op == "transpose" and tuple(n.attrs["perm"]) != (0, 1, 2, 3)]
    if case == "unsupported":
        assert transposes, [n.op for n in moved.nodes]
    else:
        assert not transposes, [(n.op, n.attrs) for n in moved.nodes]
        axes = [tuple(n.attrs["axes"]) for n in moved.nodes if n.op.startswith("reduce_")]
        assert axes == [(2, 3), (1,)], axes


def test_an_nhwc_constant_is_one_value_only_where_that_changes_nothing():
    """``_nchw_constant``: an all-equal constant becomes one value where it does not widen the operand; one that
    widens it (a (1, 1, W, 1) ones against (N, 1, 1, C)) is transposed whole, and zeros of both signs stay apart (a
    division by them keeps its infinities' signs)."""
    from tuner.graph.passes_movement import _nchw_constant
    assert _nchw_constant(np.full((1, 1, 1, 6), 2.0), (2, 5, 4, 6)).shape == (1,)
    assert _nchw_constant(np.ones((1, 1, 4, 1)), (2, 1, 1, 6)).shape == (1, 1, 1, 4)
    assert _nchw_constant(np.array([0.0, -0.0, 0.0]), (2, 5, 4, 3)).shape == (1, 3, 1, 1)
    v = np.arange(6.0).reshape(1, 1, 1, 6)
    np.testing.assert_array_equal(_nchw_constant(v, (2, 5, 4, 6)), v.reshape(1, 6, 1, 1))
