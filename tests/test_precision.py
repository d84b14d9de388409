"""The precision guard of a float16 compile (issue 56, item 3): a model whose activations shrink below float16's
range (an uncalibrated random init) returns zeros in float16; the guard keeps the nodes that flush in float32,
the mixed plan matches onnxruntime's float32 within 2e-2 with the same top-1 in the Python executor, tuner-run
and its ASan build; ``--precision strict`` refuses it (exit 2); an artifact whose ``float32`` record is not its
storage is refused by both runtimes (check 12)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.artifact_corpus import _copy, _edit_graph

pytestmark = [pytest.mark.xdist_group("precision")]

SUPPRESSIONS = os.path.join(os.path.dirname(__file__), "..", "native", "asan", "lsan.supp")


def decaying_model(layers: int = 6, c: int = 8, size: int = 16, gain: float = 0.04, classes: int = 10,
                   seed: int = 0) -> onnx.ModelProto:
    """A random-init conv chain whose activations shrink by about ``gain`` a layer, as an uncalibrated network's
    do, then a classifier: float32 ranks the classes (outputs near 1e-9), float16 flushes everything to zero."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, cin = [], [], "input", 3
    for i in range(layers):
        w = rng.standard_normal((c, cin, 3, 3)) * np.sqrt(2 / (cin * 9)) * gain
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x, cin = f"r{i}", c
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"))
    inits.append(numpy_helper.from_array((rng.standard_normal((classes, c)) / np.sqrt(c)).astype(np.float32), "fc_w"))
    inits.append(numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["output"], transB=1, name="fc"))
    g = helper.make_graph(nodes, "decaying", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                            [1, 3, size, size])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, classes])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _rel(y, ref) -> float:
    return float(np.max(np.abs(np.asarray(y, np.float64) - ref)) / np.max(np.abs(ref)))


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    import onnxruntime as ort

    from tuner.cli import main
    d = tmp_path_factory.mktemp("precision")
    model = d / "decay.onnx"
    onnx.save(decaying_model(), model)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(d / "x.npy", x)
    ref = ort.InferenceSession(str(model)).run(None, {"input": x})[0].astype(np.float64)
    arts = {}
    for name, args in (("off", ["--precision", "off"]), ("mixed", []), ("texture", ["--scope", "texture"])):
        arts[name] = d / name
        assert main(["compile", str(model), "--dtype", "float16", "-o", str(arts[name]), "--no-progress",
                     *args]) == 0
    return {"dir": d, "model": model, "x": x, "ref": ref, "arts": arts}


def test_float16_alone_returns_zeros_and_the_guard_keeps_the_flushing_nodes(case, capsys):
    """What the guard is for: unchecked float16 returns all zeros on this model (so the mixed plan's match below
    is the guard's doing); the mixed plan's artifact records its float32 tensors and the kept nodes."""
    from tuner.runtime.module import load_module
    y = load_module(case["arts"]["off"]).run({"input": case["x"]})[0]
    assert np.all(y == 0) and _rel(y, case["ref"]) == 1.0
    g = json.loads((case["arts"]["mixed"] / "graph.json").read_text())
    assert g["version"] == 4 and g["dtype"] == "float16"
    kept = {k["node"]: k["reason"] for k in g["precision"]["kept"]}
    assert "fc" in kept and "conv5" in kept and "conv0" not in kept and "flushes to zero" in kept["conv5"]
    dtypes = {n: e["dtype"] for n, e in g["entries"].items()}
    assert dtypes["r0"] == "float16" and dtypes["output"] == "float32"
    assert set(g["float32"]) == {f"t:{n}" for n, t in dtypes.items() if t == "float32"} | \
        {f"p:{b['key']}" for b in g["params"] if b["dtype"] == "float32"}
    assert any(n["op"] == "cast" for n in g["nodes"])  # the float16 -> float32 boundary
    off = json.loads((case["arts"]["off"] / "graph.json").read_text())
    assert off["float32"] == [] and "precision" not in off or not off["precision"]


@pytest.mark.parametrize("art", ["mixed", "texture"])
def test_the_mixed_plan_matches_float32_in_both_runtimes(case, art, native, cl_env, tmp_path):
    from tuner.runtime.module import load_module
    ref, top = case["ref"], int(np.argmax(case["ref"]))
    y = load_module(case["arts"][art]).run({"input": case["x"]})[0]
    assert _rel(y, ref) < 2e-2 and int(np.argmax(y)) == top
    for asan in ((False, True) if art == "mixed" else (False,)):
        env = dict(cl_env, ASAN_OPTIONS="detect_leaks=1:exitcode=23", LSAN_OPTIONS=f"suppressions={SUPPRESSIONS}")
        out = tmp_path / f"y{asan}.npy"
        r = subprocess.run([native["tuner_run_asan" if asan else "tuner_run"], str(case["arts"][art]), "--device",
                            "intel", "--input", str(case["dir"] / "x.npy"), "--output", str(out), "--bench", "1"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        y = np.load(out)
        assert _rel(y, ref) < 2e-2 and int(np.argmax(y)) == top, (asan, y)


def test_strict_refuses_with_exit_2_naming_the_nodes_and_the_fix(case, tmp_path, capsys):
    from tuner.cli import main
    capsys.readouterr()
    assert main(["compile", str(case["model"]), "--dtype", "float16", "--precision", "strict", "-o",
                 str(tmp_path / "a"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--precision strict" in err and "conv5" in err and "fc" in err and "flushes to zero" in err
    assert "--precision mixed" in err and "--dtype float32" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()


def test_compile_prints_the_kept_nodes_and_the_calibration_it_used(case, tmp_path, capsys):
    from tuner.cli import main
    cal = tmp_path / "cal"
    cal.mkdir()
    rng = np.random.default_rng(5)
    for k in range(2):
        np.save(cal / f"x{k}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    capsys.readouterr()
    assert main(["compile", str(case["model"]), "--dtype", "float16", "--calibration", str(cal), "-o",
                 str(tmp_path / "a"), "--no-progress", "--scope", "buffer"]) == 0
    out = capsys.readouterr().out
    assert f"--calibration {cal}: 2 sample(s)" in out and "nodes kept in float32" in out and "  fc: " in out
    # a float32 compile has nothing to guard; a calibration file of another shape is named
    np.save(cal / "x0.npy", np.zeros((1, 3, 8, 8), np.float32))
    for args, want in ((["--dtype", "float32", "--calibration", str(cal)], "add --dtype float16"),
                       (["--dtype", "float16", "--calibration", str(cal)], "x0.npy has shape [1, 3, 8, 8]"),
                       (["--dtype", "float16", "--calibration", str(tmp_path / "none")], "not a folder")):
        assert main(["compile", str(case["model"]), "-o", str(tmp_path / "b"), "--no-progress", *args]) == 2
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err, err


def test_a_calibrated_model_stays_float16():
    """A model whose activations stay in range keeps every node in float16 (the guard is not a blanket fp32)."""
    from tuner.compile.compiler import load_graph
    from tuner.plan.precision import calibration_inputs, check_precision
    g = load_graph(decaying_model(gain=1.0))
    guard = check_precision(g, *calibration_inputs(g))
    assert guard.kept == {} and guard.half_error < 2e-2


def _tuner_run_refuses(native, cl_env, d) -> str:
    r = subprocess.run([native["tuner_run"], str(d), "--device", "intel", "--bench", "1"], capture_output=True,
                       text=True, env=cl_env, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    return r.stderr


@pytest.mark.parametrize("lie", ["unlisted", "listed_half", "float32_in_half", "unknown", "twice"])
def test_an_artifact_lying_about_a_tensors_precision_is_refused_by_both(case, lie, native, cl_env, tmp_path):
    """Check 12: the manifest resealed after each edit (so only the precision record is wrong)."""
    from tuner.artifact import ArtifactError
    from tuner.runtime.module import load_module
    src = case["arts"]["texture"] if lie == "listed_half" else case["arts"]["mixed"]
    d = _copy(src, tmp_path / lie)

    def edit(g):
        if lie == "unlisted":  # a float32 weight the record omits
            g["float32"] = [r for r in g["float32"] if not r.startswith("p:")][:] + \
                [r for r in g["float32"] if r.startswith("p:")][1:]
        elif lie == "listed_half":  # a float32 texture (and its pool) made float16, still listed as float32
            name = next(n for n, e in g["entries"].items() if e["dtype"] == "float32" and
                        e["storage_scope"].startswith("texture") and n != "output")
            g["entries"][name]["dtype"] = "float16"
            sid = g["entries"][name]["storage_id"]
            for e in g["entries"].values():
                if e["storage_id"] == sid:
                    e["dtype"] = "float16"
            for p in g["pools"]:
                if p["storage_id"] == sid:
                    p["dtype"] = "float16"
        elif lie == "float32_in_half":  # a float16 texture stored as float32, unlisted
            name = next(n for n, e in g["entries"].items() if e["dtype"] == "float16" and
                        e["storage_scope"].startswith("texture"))
            sid = g["entries"][name]["storage_id"]
            for e in g["entries"].values():
                if e["storage_id"] == sid:
                    e["dtype"] = "float32"
            for p in g["pools"]:
                if p["storage_id"] == sid:
                    p["dtype"] = "float32"
        elif lie == "unknown":
            g["float32"].append("t:nothing")
        else:
            g["float32"].append(g["float32"][0])
    if lie == "float32_in_half":
        d = _copy(case["arts"]["texture"], tmp_path / "t")
    _edit_graph(d, edit)
    with pytest.raises(ArtifactError) as e:
        load_module(d)
    assert "float32" in str(e.value), str(e.value)
    err = _tuner_run_refuses(native, cl_env, d)
    assert "graph.json" in err and "float32" in err, err


def test_a_node_between_float32_nodes_is_kept_too():
    """Half storage between two float32 nodes would cost two casts: such a node joins them (and only such)."""
    from tuner.compile.compiler import load_graph
    from tuner.plan.precision import _fill
    g = load_graph(decaying_model())
    names = [n.name for n in g.nodes]
    kept = {names[1]: "x", names[3]: "x"}
    _fill(g, kept)
    assert set(kept) == {names[1], names[2], names[3]} and "between float32 nodes" in kept[names[2]]
