"""Attention blocks (tuner/graph/passes_tokens.py): token tensors as 4-D views, the 5-D head reshapes folded into
strided copies, activation-by-activation MatMuls; the passes against onnxruntime on the NumPy reference, the
strided-copy kernel against NumPy on the test device, and whole blocks compiled in both scopes."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from attention_models import attention_model
from test_graph_kernels import SCOPES, TOL, draw, rel_error, run
from tuner.errors import TunerError
from tuner.ops import kernels_movement as KM
from tuner.graph import passes_tokens as PT
from tuner.ops import token_views as TV
from tuner.graph import reference
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes_movement import optimize_movement
from tuner.runtime.opencl.launch import build

BLOCKS = [dict(), dict(c=12, hw=(3, 5), heads=3), dict(n=2, c=20, hw=(2, 3), heads=5),
          dict(scale_after=True, bias=True, pos=True), dict(n=2, c=8, hw=(3, 3), heads=1, bias=True, pos=True)]


def _input(kw, seed=1):
    n, c, hw = kw.get("n", 1), kw.get("c", 16), kw.get("hw", (4, 6))
    return np.random.default_rng(seed).standard_normal((n, c, *hw)).astype(np.float32)


@pytest.mark.parametrize("kw", BLOCKS, ids=str)
def test_token_passes_keep_the_block_onnxruntime_computes(tmp_path, kw):
    path = tmp_path / "a.onnx"
    attention_model(path=str(path), **kw)
    g = optimize_movement(from_onnx(str(path)))
    x = _input(kw)  # the passes' own ops (strided copies) evaluate too: reference_movement.PASS_OPS
    want = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    got = reference.run_graph_numpy(g, {"input": x})["output"]
    assert rel_error(got, want) <= 1e-5
    ops = [n.op for n in g.nodes]
    assert all(len(s) in (1, 2, 4) for t, s in g.shapes.items() if t not in g.params and any(
        t in n.outputs for n in g.nodes))  # no 3-D or 5-D tensor is left between kernels
    assert ops.count("matmul") == 2 and "transpose" not in ops and "slice_nd" not in ops
    assert ops.count("conv2d") == 2  # the qkv and output projections: 1x1 convolutions (tuned)
    # the q and k scales became the scores' alpha; each of q, k, v is one copy out of the qkv projection
    mm = [n for n in g.nodes if n.op == "matmul"]
    assert mm[0].attrs["alpha"] == pytest.approx((kw.get("c", 16) // kw.get("heads", 2)) ** -0.5)
    assert ops.count("strided_copy") == 6 - (kw.get("heads") == 1)  # one head: heads back to tokens is in order
    assert ops.count("add") == 1 + bool(kw.get("pos")) + bool(kw.get("bias"))  # the residual, pos, the bias (3-D)


VIEWS = [  # src logical shape, offset, view shape, strides, out shape
    ((1, 24, 48), 8, (2, 24, 8), (8, 48, 1), None),  # k of a qkv: heads x tokens x d out of (N, T, 3C)
    ((2, 24, 8), 0, (1, 24, 2, 8), (0, 8, 192, 1), (1, 24, 16)),  # heads back to tokens: a reshape no stride has
    ((1, 16, 4, 6), 0, (1, 24, 16), (0, 1, 24), None),  # NCHW -> tokens
    ((1, 13, 5), 0, (1, 13, 5), (65, 5, 1), (1, 5, 13)),  # odd features, a plain reshape
    ((3, 10), 2, (3, 4), (10, 2), None),  # 2-D rows, strided
    ((1, 7, 3), 0, (1, 7, 1, 3), (21, 3, 3, 1), (1, 7, 3, 1)),  # tokens -> 4-D
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("case", range(len(VIEWS)))
def test_strided_copy_kernel(device, rng, case, scopes, dtype):
    src, offset, shape, strides, out = VIEWS[case]
    k = KM.strided_copy_kernel(src, offset, shape, strides, dtype, *scopes,
                               max_work_group=device.info.max_work_group_size, out_shape=out)
    x = draw(rng, src, dtype)
    want = TV.to_view(TV.strided_reference(x, offset, shape, strides).reshape(out or shape))
    got = run(build(k, device), device, {"X": TV.to_view(x)}, padded_outputs=True)["Y"]
    assert rel_error(got[tuple(slice(0, s) for s in want.shape)], want) <= TOL[dtype]
    c = want.shape[1]
    if got.shape[1] > c:  # its own padding lanes are zero
        assert np.all(got[:, c:] == 0)


DIVIDED = [  # src logical shape, offset, view shape, strides, (divisor shape, offset, strides over the source)
    ((1, 16, 24), 8, (2, 4, 16), (4, 1, 24), ((1, 8, 1, 1), -8, (0, 0, 1))),  # EdgeNeXt's k from tokens: by channel
    ((1, 24, 2, 3), 6, (2, 6, 4), (36, 1, 6), ((1, 8, 1, 1), -1, (0, 1, 0, 0))),  # from a map: channels 1..8
    ((1, 3, 5), 0, (1, 5, 3), (15, 1, 5), ((1, 3, 1), 0, (0, 1, 0))),  # by row: divisions_into_copies' index
]


@pytest.mark.parametrize("scopes", SCOPES[:3])
@pytest.mark.parametrize("case", range(len(DIVIDED)))
def test_strided_copy_divides_by_an_affine_index_of_its_source(device, rng, case, scopes):
    """``divisor_index``: each source element divided by D's row-major element at an affine function of its
    coordinates (the norms ``passes_attention.norms_read_in_place`` reads off the channels), against NumPy."""
    src, offset, shape, strides, (d_shape, d_off, d_strides) = DIVIDED[case]
    k = KM.strided_copy_kernel(src, offset, shape, strides, "float32", *scopes[:2],
                               max_work_group=device.info.max_work_group_size, divisor_scope=scopes[-1],
                               divisor_index=(d_shape, d_off, d_strides))
    x, d = draw(rng, src, "float32"), rng.uniform(0.5, 2.0, d_shape).astype(np.float32)
    at = d_off + sum(g * st for g, st in zip(np.indices(src), d_strides))
    want = TV.to_view(TV.strided_reference(x / d.reshape(-1)[np.clip(at, 0, d.size - 1)], offset, shape, strides))
    got = run(build(k, device), device, {"X": TV.to_view(x), "D": TV.to_view(d)}, padded_outputs=True)["Y"]
    assert rel_error(got[tuple(slice(0, s) for s in want.shape)], want) <= TOL["float32"]


def _head_norm_graph(offset: int = 4, tokens: int = 16, also_output: bool = False, mixed: bool = False):
    """A token tensor (1, 16, 24) stored as (1, 24, 1, 16); S copies its channels offset.. as rows (1, 2, 4, tokens)
    (two heads of four), a reduce_l2 along the tokens takes each row's norm, and a copy of S into a matmul's layout
    divides by it: EdgeNeXt's q after ``divisions_into_copies``. ``mixed``: the copy's view runs its d axis with
    stride 4 across S's token rows, so that the two views compose into no strided view of the tokens."""
    from tuner.graph.graph import Graph, Node
    nodes = [Node("strided_copy", "s", ["x"], ["q"], {"src_shape": (1, 16, 24), "offset": offset,
                                                     "strides": (0, 4, 1, 24), "shape": (1, 2, 4, tokens),
                                                     "out_shape": (1, 2, 4, tokens)}),
             Node("reduce_l2", "r", ["q"], ["d"], {"axes": (3,), "keepdims": 1}),
             Node("strided_copy", "c", ["q", "d"], ["y"], {"src_shape": (1, 2, 4, tokens), "offset": 0,
                                                          "strides": (4 * tokens, 1, 4 if mixed else tokens),
                                                          "shape": (2, tokens, 4), "out_shape": (2, tokens, 4),
                                                          "divisor": True})]
    shapes = {"x": (1, 24, 1, 16), "q": (1, 2, 4, tokens), "d": (1, 2, 4, 1), "y": (2, 4, 1, tokens)}
    return Graph(nodes, ["x"], ["y", "q"] if also_output else ["y"], shapes)


@pytest.mark.parametrize("case,fires", [(dict(), True), (dict(offset=8), True), (dict(offset=2), False),
                                        (dict(tokens=8), False), (dict(also_output=True), False),
                                        (dict(mixed=True), False)])
def test_norms_read_in_place_only_where_each_row_is_a_whole_channel(case, fires):
    """``passes_attention.norms_read_in_place`` drops S where each row of it is one whole channel starting at an RGBA
    pixel and nothing else reads it -- not at offset 2 (not a whole pixel), not over half the tokens (a row is not
    the channel's map), not when S is a model output, not when the copy's view of S and S's view compose into no
    strided view -- and the graph computes what it did, on the reference."""
    from tuner.graph.passes_attention import norms_read_in_place
    g = _head_norm_graph(**case)
    x = np.random.default_rng(0).standard_normal((1, 24, 1, 16)).astype(np.float32)
    after = norms_read_in_place(g)
    assert (len(after.nodes) == 2) is fires
    want, got = reference.run_graph_numpy(g, {"x": x}), reference.run_graph_numpy(after, {"x": x})
    assert all(rel_error(got[k], want[k]) <= 1e-6 for k in g.outputs)


def test_a_view_that_leaves_its_source_is_refused():
    with pytest.raises(ValueError, match="leaves the source"):
        KM.strided_copy_kernel((1, 4, 8), 30, (1, 4, 8), (0, 8, 1))


@pytest.mark.parametrize("shape,strides,new,expect", [
    ((2, 3, 4), (12, 4, 1), (6, 4), (4, 1)),  # contiguous: merges
    ((2, 3, 4), (1, 8, 2), (6, 4), None),  # transposed: no strides express it
    ((3, 1, 2, 4), (8, 0, 4, 1), (3, 8), (8, 1)),  # a unit axis in between
    ((4, 6), (6, 1), (2, 2, 3, 2), (12, 6, 2, 1)),  # a split
])
def test_reshape_of_a_view_follows_numpy(shape, strides, new, expect):
    v = PT._View("x", (48,), 0, shape, strides).reshape(new)
    if expect is None:  # read out in order by its copy, composing on over the merged axes
        assert v.out_shape == new and v.shape == shape and v.strides == strides
        assert [len(gr) for gr in v.groups()] == [2, 1]
    else:
        assert v.strides == expect and v.shape == new


def test_a_window_partition_composes_into_one_view():
    """A reshape no strides express (Swin / EfficientViT's windows: (1, 2, 2, 7, 7, C) -> (4, 7, 7, C)) composes on
    over its merged axes: the transpose to NCHW windows, then a channel slice, stay one view, checked against
    NumPy; a slice that cuts the merged axis does not compose."""
    x = np.arange(1 * 14 * 14 * 8).reshape(1, 14, 14, 8)
    v = PT._View.whole("x", x.shape).reshape((1, 2, 7, 2, 7, 8)).transpose((0, 1, 3, 2, 4, 5))
    v = v.reshape((4, 7, 7, 8))
    assert v.composes and v.out_shape == (4, 7, 7, 8)
    w = v.transpose((0, 3, 1, 2)).slice((0, 4, 0, 0), (1, 1, 1, 1), (4, 4, 7, 7))
    want = x.reshape(1, 2, 7, 2, 7, 8).transpose(0, 1, 3, 2, 4, 5).reshape(4, 7, 7, 8).transpose(0, 3, 1, 2)[:, 4:]
    got = TV.strided_reference(x, w.offset, w.shape, w.strides).reshape(w.out_shape)
    assert np.array_equal(got, want)
    assert v.slice((1, 0, 0, 0), (1, 1, 1, 1), (2, 7, 7, 8)) is None


def test_an_unsupported_op_on_tokens_names_the_node(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 2, 2])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 2, 2])
    shape = helper.make_tensor("s", TensorProto.INT64, [3], [1, 8, 4])
    back = helper.make_tensor("b", TensorProto.INT64, [4], [1, 8, 2, 2])
    nodes = [helper.make_node("Reshape", ["input", "s"], ["t"], name="tok"),
             helper.make_node("ReduceMean", ["t", "axes"], ["p"], name="pool", keepdims=1),
             helper.make_node("Reshape", ["p", "b1"], ["p4"], name="four"),
             helper.make_node("Add", ["input", "p4"], ["output"], name="back")]
    b1 = helper.make_tensor("b1", TensorProto.INT64, [4], [1, 1, 1, 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2])
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [shape, back, axes, b1]),
                          opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(TunerError, match="'pool'.*axes"):
        optimize_movement(from_onnx(m))


@pytest.mark.parametrize("kw", [BLOCKS[0], BLOCKS[3], BLOCKS[4]], ids=["plain", "bias-pos", "batch2-1head"])
@pytest.mark.parametrize("scope,dtype", [("texture", "float32"), ("buffer", "float32"), ("buffer", "float16")])
def test_attention_blocks_compile_and_match_onnxruntime(tmp_path, device, kw, scope, dtype):
    """Whole blocks on the device: the matmul template, the strided copies, softmax and layer norm over the
    features of token views, 1x1 convolutions for the projections, in both scopes."""
    from tuner.compile.compiler import compile_model
    path = tmp_path / "a.onnx"
    attention_model(path=str(path), **kw)
    mod = compile_model(str(path), device=device, scope=scope, dtype=dtype)
    x = _input(kw)
    want = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    got = mod.run({"input": x})[0]
    assert got.shape == want.shape
    assert rel_error(got, want) <= (1e-4 if dtype == "float32" else 3e-2)
    ops = [n.op for n in mod.spec.nodes]
    assert ops.count("matmul") == 2


def _softmax_model(axis: int):
    """NCHW (1, 8, 2, 3) -> (1, 2, 4, 6) -> Softmax(axis) -> back: CoaT's softmax over the tokens of K."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 2, 3])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 2, 3])
    inits = [helper.make_tensor("s4", TensorProto.INT64, [4], [1, 2, 4, 6]),
             helper.make_tensor("back", TensorProto.INT64, [4], [1, 8, 2, 3])]
    nodes = [helper.make_node("Reshape", ["input", "s4"], ["r"], name="heads"),
             helper.make_node("Softmax", ["r"], ["p"], name="probs", axis=axis),
             helper.make_node("Reshape", ["p", "back"], ["output"], name="out")]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("axis", [2, -1, 1])
def test_softmax_over_any_axis_of_heads(device, axis):
    from tuner.compile.compiler import compile_model
    m = _softmax_model(axis)
    x = _input({"c": 8, "hw": (2, 3)})
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"input": x})[0]
    mod = compile_model(m, device=device, scope="buffer")
    assert rel_error(mod.run({"input": x})[0], want) <= 1e-5


@pytest.mark.parametrize("scope,n", [("texture", 1), ("buffer", 2)])
def test_a_class_token_joins_and_leaves_the_tokens(tmp_path, device, scope, n):
    """A ViT's class token: a constant concatenated in front of the tokens (concat_view), a position embedding
    (a whole constant), and ``Gather`` of token 0 at the end (a strided copy to (N, C))."""
    from attention_models import class_token_model
    from tuner.compile.compiler import compile_model
    path = tmp_path / "cls.onnx"
    class_token_model(n=n, path=str(path))
    x = _input({"n": n, "c": 12, "hw": (3, 4)})
    want = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    mod = compile_model(str(path), device=device, scope=scope)
    assert [n.op for n in mod.spec.nodes].count("concat_view") == 1
    got = mod.run({"input": x})[0]
    assert got.shape == want.shape == (n, 12)
    assert rel_error(got, want) <= 1e-4


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shapes,axis", [([(1, 1, 6), (1, 5, 6)], 1), ([(2, 3, 5), (2, 3, 3), (2, 3, 1)], 2),
                                         ([(1, 3, 2, 5), (1, 3, 1, 5)], 2)])
def test_concat_view_kernel(device, rng, shapes, axis, dtype):
    k = KM.concat_view_kernel(shapes, axis, dtype, "buffer", "texture")
    xs = [draw(rng, s, dtype) for s in shapes]
    got = run(build(k, device), device, {f"X{i}": TV.to_view(x) for i, x in enumerate(xs)})["Y"]
    assert rel_error(got, TV.to_view(np.concatenate(xs, axis=axis))) <= TOL[dtype]


def _graph_model(nodes, inits, in_shape, out_shape, opset=17):
    from onnx import TensorProto, helper, numpy_helper
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, list(in_shape))
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out_shape))
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], tensors),
                             opset_imports=[helper.make_opsetid("", opset)])


def _shape(*dims):
    return np.array(dims, np.int64)


def _n(op, ins, out, **kw):
    from onnx import helper
    return helper.make_node(op, ins, [out], name=out, **kw)


_R = np.random.default_rng(3)
SHAPES_OF_ATTENTION = {  # name -> (model, input shape): each a pattern a held-out architecture exported
    "pool_1d": (_graph_model([_n("Reshape", ["input", "s"], "ncl"),  # Next-ViT's spatial reduction
                              _n("AveragePool", ["ncl"], "p", kernel_shape=[2], strides=[2]),
                              _n("Reshape", ["p", "back"], "output")],
                             {"s": _shape(1, 6, 8), "back": _shape(1, 6, 2, 2)}, (1, 6, 2, 4), (1, 6, 2, 2)),
                (1, 6, 2, 4)),
    "batch_norm_ncl": (_graph_model([_n("Reshape", ["input", "s"], "ncl"),
                                     _n("BatchNormalization", ["ncl", "g", "b", "m", "v"], "bn"),
                                     _n("Reshape", ["bn", "back"], "output")],
                                    {"s": _shape(1, 6, 8), "back": _shape(1, 6, 2, 4),
                                     **{k: (_R.random(6) + 0.5).astype(np.float32) for k in "gbmv"}},
                                    (1, 6, 2, 4), (1, 6, 2, 4)), (1, 6, 2, 4)),
    "tile_broadcast": (_graph_model([_n("Reshape", ["input", "s"], "q"),  # GC ViT's global query
                                     _n("Tile", ["q", "reps"], "t"),
                                     _n("Reshape", ["t", "back"], "output")],
                                    {"s": _shape(1, 1, 6, 4), "reps": _shape(1, 3, 1, 1), "back": _shape(1, 6, 3, 4)},
                                    (1, 6, 2, 2), (1, 6, 3, 4)), (1, 6, 2, 2)),
    "mask_5d": (_graph_model([_n("Reshape", ["input", "s"], "w"),  # Swin's shifted-window mask
                              _n("Add", ["w", "mask"], "m"),
                              _n("Reshape", ["m", "back"], "output")],
                             {"s": _shape(1, 2, 3, 4, 4), "mask": _R.standard_normal((1, 2, 1, 4, 4)).astype(np.float32),
                              "back": _shape(1, 6, 4, 4)}, (1, 6, 4, 4), (1, 6, 4, 4)), (1, 6, 4, 4)),
    "roll_concat_h": (_graph_model([_n("Transpose", ["input"], "nhwc", perm=[0, 2, 3, 1]),  # Swin's torch.roll
                                    _n("Slice", ["nhwc", "st", "en", "ax"], "a"),
                                    _n("Slice", ["nhwc", "st2", "en2", "ax"], "b"),
                                    _n("Concat", ["a", "b"], "r", axis=1),
                                    _n("ReduceMean", ["r"], "output", axes=[1, 2], keepdims=0)],
                                   {"st": _shape(2), "en": _shape(5), "st2": _shape(0), "en2": _shape(2),
                                    "ax": _shape(1)}, (1, 6, 5, 3), (1, 6), opset=17), (1, 6, 5, 3)),
}


@pytest.mark.parametrize("name", sorted(SHAPES_OF_ATTENTION))
def test_shapes_of_held_out_attention_models_compile_and_match(device, name):
    from tuner.compile.compiler import compile_model
    m, shape = SHAPES_OF_ATTENTION[name]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"input": x})[0]
    mod = compile_model(m, device=device, scope="buffer")
    got = mod.run({"input": x})[0]
    assert got.shape == want.shape
    assert rel_error(got, want) <= 1e-5


def _ort_and_module(m, device, scope, seed=1):
    from tuner.compile.compiler import compile_model
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"input": x})[0]
    mod = compile_model(m, device=device, scope=scope)
    return mod, mod.run({"input": x})[0], want


def test_cascaded_heads_plan_their_products_in_place():
    """EfficientViT's heads (graph passes only): q * scale folds into q^T @ k's alpha through the transpose, the
    identity view and the q gather the depthwise no longer reads run no kernel, the attention bias is the
    product's addend, q and k are read as channel slices of their NCHW tensors (k as B^T), and ``v @ attn^T`` runs
    as ``attn @ v^T``, writing the head's NCHW output: no strided copy is left. The second head's input adds the
    input's second channel chunk read in place (``slices_read_in_place``): no slice is left either. The ReLU after
    the heads' concat runs in the concat (``fuse_concat_activations``: the adds read its parts too)."""
    from attention_models import cascaded_attention_model
    from tuner.graph.passes import optimize
    g = optimize(from_onnx(cascaded_attention_model()))
    ops = [n.op for n in g.nodes]
    assert not {"strided_copy", "reshape", "mul", "slice", "relu"} & set(ops)
    assert next(n for n in g.nodes if n.op == "concat").attrs["activation"] == "relu"
    assert next(n for n in g.nodes if n.op == "add").attrs["channel_offsets"] == (None, 8)
    scores, out = [n for n in g.nodes if n.op == "matmul"][:2]
    assert scores.attrs["alpha"] == pytest.approx(0.5) and scores.attrs["trans_b"] and "addend" in scores.attrs
    assert scores.attrs["a_view"][2:] == (0, 0, 0) and scores.attrs["b_view"][2:] == (4, 0, 0)  # q, k channels
    assert out.inputs[0] == "p0" and not out.attrs["trans_b"]  # attn (the softmax's output) itself
    assert out.attrs["b_view"][2] == 8 and out.attrs["y_view"] == ((2, 8, 3, 4), 1, 0, 0, 0)  # v^T; NCHW out


@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("kw", [dict(), dict(n=1, heads=3, kd=6)], ids=["aligned", "k-at-channel-6"])
def test_cascaded_heads_match_onnxruntime(device, scope, kw):
    """The heads compiled, both scopes: every product reads and writes in place; k at channel 6 (not an RGBA
    pixel's start) keeps one copy per head, the product taking it as (K, N)."""
    from attention_models import cascaded_attention_model
    mod, got, want = _ort_and_module(cascaded_attention_model(**kw), device, scope)
    assert rel_error(got, want) <= 1e-4
    ops = [n.op for n in mod.spec.nodes]
    heads = kw.get("heads", 2)
    assert ops.count("matmul") == 2 * heads and "binary" not in ops and ops.count("concat_act") == 1
    assert ops.count("strided_copy") == (heads if kw else 0) and ops.count("elementwise") == heads - 1  # the adds


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_matmul_epilogues_match_onnxruntime(device, scope):
    """A product's scalar scale, per-column bias, ReLU and an add of a second product run in the products:
    two matmuls, no elementwise kernel."""
    from attention_models import matmul_epilogue_model
    mod, got, want = _ort_and_module(matmul_epilogue_model(), device, scope)
    assert rel_error(got, want) <= 1e-4
    ops = [n.op for n in mod.spec.nodes]
    assert ops.count("matmul") == 2 and not {"elementwise", "binary", "unary"} & set(ops)


def test_fit_view_finds_the_template_view_or_none():
    """token_views.fit_view: a 3-D operand's element indices into a tensor -> the matmul template's view."""
    src = (4, 48, 7, 7)
    ar = np.arange(np.prod(src)).reshape(src)
    q_t = ar[:, :16].reshape(4, 16, 49).transpose(0, 2, 1)  # q^T: tokens x channels of an NCHW slice
    assert TV.fit_view(q_t, src) == (src, 1, 0, 0, 0)
    k = ar[:, 16:32].reshape(4, 16, 49)
    assert TV.fit_view(k, src) is None and TV.fit_view(k.transpose(0, 2, 1), src) == (src, 1, 16, 0, 0)
    assert TV.fit_view(ar[:, 6:22].reshape(4, 16, 49).transpose(0, 2, 1), src) is None  # starts mid-pixel
    tok = np.arange(192).reshape(1, 6, 32)  # 4 heads of 8 features over 6 tokens: heads as channel groups
    assert TV.fit_view(tok.reshape(1, 6, 4, 8).transpose(0, 2, 1, 3).reshape(4, 6, 8), (1, 6, 32)) == \
        ((1, 32, 1, 6), 4, 0, 8, 0)
    assert TV.fit_view(np.arange(120).reshape(4, 5, 6), (4, 5, 6)) == ()  # its own storage
    assert TV.affine_form(q_t) == (0, (2352, 1, 49)) and TV.affine_form(np.arange(6)[[0, 2, 1, 3, 4, 5]]) is None


@pytest.mark.parametrize("scope", ["texture", "buffer"])
@pytest.mark.parametrize("kw", [dict(), dict(n=2, c=12, heads=3, kd=3, dv=5)], ids=["aligned", "odd-widths"])
def test_levit_block_matches_onnxruntime(device, scope, kw):
    """LeViT's block: the BatchNorms over flattened tokens fold into the Linears before them
    (``batch_norm_over_rows``), the split of the 4-D (B, T, heads, 2kd + dv) view and the per-head transposes
    compose into the products' views (heads as channel groups), and the hardswish after the heads runs in the
    second product (``activations_before_copies``): 6 kernels with widths that start RGBA pixels -- the first
    token copy (the last one is written by the projection before it: a 1x1 "patch" view, ``passes_patches``), the
    Linears, the products and the softmax."""
    from attention_models import levit_attention_model
    mod, got, want = _ort_and_module(levit_attention_model(**kw), device, scope)
    assert rel_error(got, want) <= 1e-4
    ops = [n.op for n in mod.spec.nodes if n.op != "relayout"]
    assert not {"binary", "elementwise", "unary", "slice", "permute"} & set(ops)
    if not kw:
        assert sorted(ops) == ["conv2d", "conv2d", "matmul", "matmul", "softmax", "strided_copy"]
        assert [n.workload["activation"] for n in mod.spec.nodes if n.op == "matmul"] == ["none", "hardswish"]


@pytest.mark.parametrize("scope", ["texture", "buffer"])
def test_nchw_attention_reads_its_convolutions_in_place(device, scope):
    """EfficientFormerV2's attention: the 4-D reshapes / transposes of the q, k, v convolutions feed only the
    products, so they are views (``_matmul_chains``) the products read in place; the output is written back as
    NCHW and takes the ``v_local`` add as its residual through that view (``_residual_after``): no glue kernel
    but the input's and output's packing."""
    from attention_models import nchw_attention_model
    mod, got, want = _ort_and_module(nchw_attention_model(), device, scope)
    assert rel_error(got, want) <= 1e-4
    assert sorted(n.op for n in mod.spec.nodes if n.op != "relayout") == [
        "conv2d", "conv2d", "conv2d", "conv2d", "depthwise_conv2d", "matmul", "matmul", "softmax"]
    out = [n for n in mod.spec.nodes if n.op == "matmul"][1]
    assert out.workload["residual"]
