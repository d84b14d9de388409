"""Model inputs and outputs of any rank (issue 38; ``graph/passes_io.py``) and the post-processing cut
(``frontend/postprocess.py``): detection heads' 3-D outputs, 5-D grids, 1-D vectors and 3-D token inputs come back
in the model's own shape, every output against onnxruntime, in texture, buffer and auto scopes; NonMaxSuppression
and TopK stay with the caller, who gets what they read."""
from __future__ import annotations

import os
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tuner.compile.compiler import compile_model
from tuner.errors import TunerError
from tuner.frontend.onnx import from_onnx
from tuner.graph.passes import optimize
from tuner.graph.passes_io import kernel_shape

RNG = np.random.default_rng(5)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _model(nodes, inits, inputs, outputs, opset=17):
    g = helper.make_graph(nodes, "io", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
                          [helper.make_tensor_value_info(o, t, None) for o, t in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _node(op, ins, out, **attrs):
    outs = out if isinstance(out, list) else [out]
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def _ssd_head():
    """Two levels of an SSD head: per level Conv -> Transpose(0, 2, 3, 1) -> Reshape(1, -1, K), concatenated on
    the anchors: boxes (1, A, 4) and class scores (1, A, 5) after a Softmax over the classes."""
    nodes = [_node("Conv", ["input", "w0"], "f0", pads=[1, 1, 1, 1]),
             _node("Conv", ["f0", "w1"], "f1", pads=[1, 1, 1, 1], strides=[2, 2])]
    inits = [("w0", _w(8, 8, 3, 3)), ("w1", _w(8, 8, 3, 3)), ("s4", np.array([1, -1, 4], np.int64)),
             ("s5", np.array([1, -1, 5], np.int64))]
    for head, k in (("box", 4), ("cls", 5)):
        parts = []
        for i in range(2):
            inits.append((f"{head}w{i}", _w(3 * k, 8, 3, 3)))
            nodes += [_node("Conv", [f"f{i}", f"{head}w{i}"], f"{head}c{i}", pads=[1, 1, 1, 1]),
                      _node("Transpose", [f"{head}c{i}"], f"{head}t{i}", perm=[0, 2, 3, 1]),
                      _node("Reshape", [f"{head}t{i}", f"s{k}"], f"{head}r{i}")]
            parts.append(f"{head}r{i}")
        nodes.append(_node("Concat", parts, "boxes" if head == "box" else "logits", axis=1))
    nodes.append(_node("Softmax", ["logits"], "scores", axis=-1))
    return nodes, inits


def _models():
    f = TensorProto.FLOAT
    out = {}
    nodes, inits = _ssd_head()
    out["ssd_head"] = _model(nodes, inits, [("input", (1, 8, 8, 8))], [("boxes", f), ("scores", f)])
    # a YOLO-style grid (1, anchors, 5 + K, H, W), a flattened vector, and the 4-D map itself
    out["grid_5d_1d"] = _model(
        [_node("Conv", ["input", "w"], "c", pads=[1, 1, 1, 1]), _node("Reshape", ["c", "s5"], "grid"),
         _node("Reshape", ["c", "s1"], "flat"), _node("Relu", ["c"], "map")],
        [("w", _w(12, 8, 3, 3)), ("s5", np.array([1, 3, 4, 6, 5], np.int64)), ("s1", np.array([-1], np.int64))],
        [("input", (1, 8, 6, 5))], [("grid", f), ("flat", f), ("map", f)])
    # (N, T, C) tokens in and out, and a second, 4-D input
    out["tokens_in_out"] = _model(
        [_node("MatMul", ["tokens", "mw"], "mm"), _node("Relu", ["mm"], "feat"),
         _node("Conv", ["image", "cw"], "conv")],
        [("mw", _w(6, 7)), ("cw", _w(4, 3, 1, 1))], [("tokens", (1, 10, 6)), ("image", (1, 3, 4, 4))],
        [("feat", f), ("conv", f)])
    # a classifier's logits squeezed to a vector (the model's only output of another rank), and a vector input
    out["vector_in_out"] = _model(
        [_node("Conv", ["input", "w"], "c", pads=[1, 1, 1, 1]), _node("GlobalAveragePool", ["c"], "p"),
         _node("Flatten", ["p"], "f"), _node("Gemm", ["f", "gw"], "g", transB=1),
         _node("Squeeze", ["g", "axis0"], "logits"), _node("Unsqueeze", ["bias", "axis0"], "b2"),
         _node("Gemm", ["b2", "gw2"], "from_vector", transB=1)],
        [("w", _w(6, 3, 3, 3)), ("gw", _w(10, 6)), ("gw2", _w(5, 7)), ("axis0", np.array([0], np.int64))],
        [("input", (1, 3, 8, 8)), ("bias", (7,))], [("logits", f), ("from_vector", f)])
    # YOLOv5's head: the grid (1, anchors, 5 + K, H, W) permuted to (1, anchors, H, W, 5 + K), then its sigmoid
    out["yolov5_grid"] = _model(
        [_node("Conv", ["input", "w"], "c", pads=[1, 1, 1, 1]), _node("Reshape", ["c", "s5"], "g5"),
         _node("Transpose", ["g5"], "t5", perm=[0, 1, 3, 4, 2]), _node("Sigmoid", ["t5"], "grid")],
        [("w", _w(21, 8, 3, 3)), ("s5", np.array([1, 3, 7, 6, 5], np.int64))], [("input", (1, 8, 6, 5))],
        [("grid", f)])
    return out


MODELS = _models()


def _feeds(mod):
    return {n: RNG.standard_normal(mod.spec.entries[n].shape).astype(np.float32) for n in mod.spec.inputs}


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("scope", ["texture", "buffer", "auto"])
def test_every_output_in_the_models_shape_matches_onnxruntime(device, name, scope):
    model = MODELS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(model, device=device, scope=scope)
    feeds = _feeds(mod)
    want = _ort(model, feeds)
    got = mod.run(feeds)
    assert list(mod.spec.outputs) == list(want)  # every output, in the model's order
    for o, (t, r) in zip(got, want.items()):
        assert o.shape == r.shape, t
        assert np.abs(o - r).max() <= 1e-4 * max(np.abs(r).max(), 1e-30), t


def test_the_graph_holds_other_ranks_in_kernel_shapes():
    assert kernel_shape((1, 3234, 95)) == (1, 3234, 1, 95)
    assert kernel_shape((1, 3, 85, 20, 20)) == (1, 3, 1700, 20)
    assert kernel_shape((768,)) == (1, 768) and kernel_shape(()) == (1, 1)
    g = optimize(from_onnx(MODELS["grid_5d_1d"]))
    assert g.io_shapes == {"grid": (1, 3, 4, 6, 5), "flat": (360,)}
    assert g.shapes["grid"] == (1, 3, 24, 5) and g.shapes["flat"] == (1, 360)
    assert all(len(g.shapes[t]) in (2, 4) for n in g.nodes for t in n.outputs)


def _detector(post_reads_an_integer=False):
    """The SSD head, then NonMaxSuppression over its boxes and scores and a TopK of the scores: the model's
    outputs are the selected indices and the top values."""
    nodes, inits = _ssd_head()
    nodes.append(_node("Transpose", ["scores"], "scores_t", perm=[0, 2, 1]))
    boxes = "boxes"
    if post_reads_an_integer:  # the boxes rounded to integers by the model: nothing the kernels can return
        nodes.append(_node("Cast", ["boxes"], "boxes_i", to=TensorProto.INT64))
        boxes = "boxes_i"
    nodes += [_node("NonMaxSuppression", [boxes, "scores_t", "max_out", "iou", "thr"], "selected"),
              _node("TopK", ["logits", "k"], ["top_values", "top_indices"], axis=1)]
    inits += [("max_out", np.array([5], np.int64)), ("iou", np.array([0.5], np.float32)),
              ("thr", np.array([0.1], np.float32)), ("k", np.array([4], np.int64))]
    return _model(nodes, inits, [("input", (1, 8, 8, 8))],
                  [("selected", TensorProto.INT64), ("top_values", TensorProto.FLOAT)])


def test_post_processing_stays_with_the_caller(device):
    model = _detector()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = compile_model(model, device=device, scope="texture")
    said = [str(w.message) for w in caught if "post-processing" in str(w.message)]
    assert len(said) == 1 and "NonMaxSuppression 'selected'" in said[0] and "TopK 'top_values'" in said[0]
    assert "'boxes', 'scores_t', 'logits'" in said[0] and "'selected', 'top_values'" in said[0]
    assert mod.spec.outputs == ["boxes", "scores_t", "logits"]
    # inputs of their own seed, not the module's generator (whose draw depends on which tests ran before): the
    # head's sigmoids saturate, and where more boxes of a class score 1.0 than NMS keeps, which ones it keeps is
    # the sort's choice, in onnxruntime as in any caller
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal(mod.spec.entries[n].shape).astype(np.float32) for n in mod.spec.inputs}
    got = dict(zip(mod.spec.outputs, mod.run(feeds)))
    # the caller's post-processing on our outputs gives what the whole model gives
    full = _ort(model, feeds)
    nms = _model([_node("NonMaxSuppression", ["b", "s", "max_out", "iou", "thr"], "selected"),
                  _node("TopK", ["l", "k"], ["top_values", "top_indices"], axis=1)],
                 [("max_out", np.array([5], np.int64)), ("iou", np.array([0.5], np.float32)),
                  ("thr", np.array([0.1], np.float32)), ("k", np.array([4], np.int64))],
                 [("b", got["boxes"].shape), ("s", got["scores_t"].shape), ("l", got["logits"].shape)],
                 [("selected", TensorProto.INT64), ("top_values", TensorProto.FLOAT)])
    post = _ort(nms, {"b": got["boxes"], "s": got["scores_t"], "l": got["logits"]})
    # the same boxes selected, up to ties: where more boxes of a class score the same (to float32 rounding; ours and
    # onnxruntime's sums round differently) than NMS keeps, which of them it keeps is the sort's choice -- so per
    # (image, class) the kept boxes' scores agree, and every box scoring clearly above the last one kept is kept by both
    def kept(rows):
        out: dict = {}
        for n, c, i in rows:
            out.setdefault((int(n), int(c)), []).append((float(got["scores_t"][n, c, i]), int(i)))
        return {k: sorted(v, reverse=True) for k, v in out.items()}
    ours, theirs = kept(post["selected"]), kept(full["selected"])
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert np.allclose([sc for sc, _ in ours[k]], [sc for sc, _ in theirs[k]], rtol=0, atol=1e-5), k
        last = ours[k][-1][0]
        assert {i for sc, i in ours[k] if sc > last + 1e-5} == {i for sc, i in theirs[k] if sc > last + 1e-5}, k
    assert np.allclose(post["top_values"], full["top_values"], rtol=1e-4, atol=1e-5)


def test_an_ambiguous_cut_is_refused_naming_the_node():
    with pytest.raises(TunerError, match=r"node 'boxes_i' \(Cast\) only feeds the post-processing "
                                         r"\(NonMaxSuppression 'selected', TopK 'top_values'\).*ambiguous"):
        from_onnx(_detector(post_reads_an_integer=True))


def test_cli_writes_every_output_in_the_models_shape(device, tmp_path, capsys):
    import onnx

    from tuner.cli import main
    onnx.save(MODELS["grid_5d_1d"], tmp_path / "m.onnx")
    dev = ["--device", os.environ["TUNER_TEST_DEVICE"]] if os.environ.get("TUNER_TEST_DEVICE") else []
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "art"), *dev]) == 0
    x = RNG.standard_normal((1, 8, 6, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = _ort(MODELS["grid_5d_1d"], {"input": x})
    assert main(["run", str(tmp_path / "art"), "--input", str(tmp_path / "x.npy"), "--outputs", str(tmp_path / "all"),
                 "--output", f"flat={tmp_path / 'flat.npy'}", "--repeat", "1"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {tmp_path / 'flat.npy'} [360] (output 'flat', 2 of 3)" in said
    for name, ref in want.items():
        got = np.load(tmp_path / "all" / f"{name}.npy") if name != "flat" else np.load(tmp_path / "flat.npy")
        assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), name
    assert not (tmp_path / "all" / "flat.npy").exists()  # named on its own: written there only
    for argv in (["--output", "nope=y.npy", "--output", "y2.npy"], ["--output", "nope=y.npy"]):
        assert main(["run", str(tmp_path / "art"), *argv, "--repeat", "1"]) == 2
        assert "the model has no output 'nope'; its outputs are grid, flat, map" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "art"), "--output", str(tmp_path / ("L" * 300 + ".npy")), "--repeat", "1"]) == 2
    assert "cannot be written (File name too long)" in capsys.readouterr().err


OUTPUT_FILE_NAMES = {"scores": "scores.npy", "../x/y:z": "_._x_y_z.npy", ".hidden": "_hidden.npy", "": "_.npy",
                     "é": "__.npy", "日本": "______.npy", "L" * 300: "L" * 200 + ".npy"}


def test_output_file_names_hold_no_folder():
    """Per UTF-8 byte, as tuner-run names them (test_native_runtime checks the C side on the same names)."""
    from tuner.cli.model import output_file_name
    for name, file in OUTPUT_FILE_NAMES.items():
        assert output_file_name(name) == file, name


def test_a_cut_read_through_identity_is_the_output_it_copies(device):
    """NMS reads Identity(boxes) while boxes is a model output itself: the compiled model returns boxes once, and the
    compile says the copy is that output (it was refused as a pass-through output)."""
    nodes, inits = _ssd_head()
    nodes += [_node("Identity", ["boxes"], "boxes_copy"), _node("Transpose", ["scores"], "scores_t", perm=[0, 2, 1]),
              _node("NonMaxSuppression", ["boxes_copy", "scores_t", "max_out", "iou", "thr"], "selected")]
    inits += [("max_out", np.array([5], np.int64)), ("iou", np.array([0.5], np.float32)),
              ("thr", np.array([0.1], np.float32))]
    model = _model(nodes, inits, [("input", (1, 8, 8, 8))], [("boxes", TensorProto.FLOAT),
                                                              ("selected", TensorProto.INT64)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = compile_model(model, device=device, scope="buffer")
    said = next(str(w.message) for w in caught if "post-processing" in str(w.message))
    assert mod.spec.outputs == ["boxes", "scores_t"]
    assert "'boxes_copy' (compiled output 'boxes')" in said and "'iou' (a constant of the model)" in said


def test_an_output_of_more_than_8_dimensions_is_refused_at_compile_time():
    model = _model([_node("Reshape", ["input", "s9"], "y")], [("s9", np.array([1] * 7 + [2, 3], np.int64))],
                   [("input", (1, 6, 1, 1))], [("y", TensorProto.FLOAT)])
    with pytest.raises(TunerError, match=r"model output 'y' has rank 9 .* at most 8 dimensions"):
        optimize(from_onnx(model))
