"""The artifact contract (docs/artifact.md): written atomically, verified by hash, checked against itself and the
device before anything is allocated; each damaged artifact is refused with an error naming the file."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tuner
from tuner.artifact import ArtifactError, read_artifact
from tuner.cli import main
from tuner.graph.module import load_module
from tuner.graph.zoo import write_model


@pytest.fixture(scope="module")
def built(tmp_path_factory, device):
    """Artifacts of a small ResNet compiled for the test device's profile (nothing is built here): the buffer
    plan, the texture plan (its files share names and differ in content) and the buffer plan of the same
    architecture with other weights."""
    d = tmp_path_factory.mktemp("artifacts")
    model = write_model("resnet18", d / "r.onnx", input_size=32, num_classes=10)
    out = {}
    for scope in ("buffer", "texture"):
        m = tuner.compile_model(model, target=device.info.to_dict(), scope=scope)
        out[scope] = Path(m.save(d / scope))
    other = write_model("resnet18", d / "r1.onnx", input_size=32, num_classes=10, seed=1)
    out["other"] = Path(tuner.compile_model(other, target=device.info.to_dict(), scope="buffer").save(d / "other"))
    out["model"] = Path(model)
    return out


def rehash(d: Path) -> None:
    """Rewrite the manifest to match the files: an edit that a forged manifest hides from check 1."""
    m = json.loads((d / "manifest.json").read_text())
    for f in m["files"]:
        p = d / f["path"]
        f["size"], f["sha256"] = p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()
    (d / "manifest.json").write_text(json.dumps(m))


def edit_graph(d: Path, how) -> None:
    g = json.loads((d / "graph.json").read_text())
    how(g)
    (d / "graph.json").write_text(json.dumps(g))
    rehash(d)


def _first_call(g):
    return next(n for n in g["nodes"] if n["template"])["calls"][0]


def _swap_kernel(d, other):
    shutil.copy(other / "kernels" / "k001.cl", d / "kernels" / "k001.cl")


CASES = {
    # check 1: the manifest catches what was replaced, truncated or removed
    "kernel swapped": (lambda d, o: _swap_kernel(d, o), "kernels/k001.cl"),
    "params swapped": (lambda d, o: shutil.copy(o.parent / "other" / "params.bin", d / "params.bin"),
                       "params.bin does not match its SHA-256"),
    "kernel truncated": (lambda d, o: (d / "kernels" / "k002.cl").write_text("__kernel"), "kernels/k002.cl holds"),
    "kernel missing": (lambda d, o: (d / "kernels" / "k003.cl").unlink(), "kernels/k003.cl is missing"),
    "graph truncated": (lambda d, o: (d / "graph.json").write_text("{"), "graph.json holds"),
    "manifest missing": (lambda d, o: (d / "manifest.json").unlink(), "has no manifest.json"),
    "manifest garbage": (lambda d, o: (d / "manifest.json").write_text("[" * 100000), "manifest.json is not valid JSON"),
    "params a fifo": (lambda d, o: ((d / "params.bin").unlink(), os.mkfifo(d / "params.bin")),
                      "params.bin is not a regular file"),
    # checks 2 to 10: edits a forged manifest would hide
    "version 1": (lambda d, o: edit_graph(d, lambda g: g.update(version=1)), "version 1"),
    "int32 weights": (lambda d, o: edit_graph(d, lambda g: g["params"][0].update(dtype="int32")), "'int32'"),
    "entry edited to float16": (lambda d, o: edit_graph(d, lambda g: g["entries"][g["outputs"][0]].update(
        dtype="float16")), "is float16"),
    "nodes reversed": (lambda d, o: edit_graph(d, lambda g: g["nodes"].reverse()), "before any call writes it"),
    "kernel emptied": (lambda d, o: ((d / "kernels" / "k001.cl").write_text(""), rehash(d)), "is not defined"),
    "kernel renamed": (lambda d, o: edit_graph(d, lambda g: _first_call(g).update(kernel="nosuch")),
                       "'nosuch' is not defined"),
    "argument missing": (lambda d, o: edit_graph(d, lambda g: _first_call(g)["args"].__setitem__(0, "t:nosuch")),
                         "'t:nosuch' names no entry"),
    "launch 1x1x1": (lambda d, o: edit_graph(d, lambda g: _first_call(g).update(global_size=[1, 1, 1])),
                     "does not divide"),
    "launch 3x5": (lambda d, o: edit_graph(d, lambda g: _first_call(g).update(global_size=[3, 5])),
                   "must be three integers"),
    "launch out of range": (lambda d, o: edit_graph(d, lambda g: _first_call(g).update(
        global_size=[4 * _first_call(g)["local_size"][0], 16000000 * _first_call(g)["local_size"][1],
                     _first_call(g)["local_size"][2]])), "work-items for operands"),
    "pool shrunk": (lambda d, o: edit_graph(d, lambda g: g["pools"][0].update(shape=[16])), "holds 16"),
    "no outputs": (lambda d, o: edit_graph(d, lambda g: g.update(outputs=[])), "outputs is empty"),
    "kernel path escapes": (lambda d, o: edit_graph(d, lambda g: g["nodes"][0].update(source="../../etc/passwd")),
                            "is not in the manifest"),
    "shape a string": (lambda d, o: edit_graph(d, lambda g: g["pools"][0].update(shape="16")), "pools[0].shape"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_artifact_is_refused_naming_the_file(built, tmp_path, capsys, case):
    how, message = CASES[case]
    d = tmp_path / "a"
    shutil.copytree(built["buffer"], d)
    how(d, built["texture"])
    with pytest.raises(ArtifactError) as e:
        read_artifact(d)
    assert message in str(e.value) and str(d) in str(e.value) and "recompile" in str(e.value), str(e.value)
    out = tmp_path / "y.npy"
    assert main(["run", str(d), "--repeat", "1", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not out.exists()


def test_planted_launch_is_refused_before_any_enqueue(built, tmp_path, monkeypatch):
    import pyopencl as cl
    d = tmp_path / "a"
    shutil.copytree(built["buffer"], d)
    CASES["launch out of range"][0](d, None)
    enqueued = []
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", lambda *a, **k: enqueued.append(a))
    with pytest.raises(ArtifactError, match="work-items"):
        load_module(d).run([np.zeros((1, 3, 32, 32), np.float32)])
    assert enqueued == []


def test_the_good_artifact_runs_and_matches_onnxruntime(built, device):
    import onnxruntime as ort
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(str(built["model"])).run(None, {"input": x})[0]
    for scope in ("buffer", "texture"):
        y, = load_module(built[scope], device=device).run([x])
        assert np.abs(y - want).max() <= 1e-4 * max(1.0, np.abs(want).max()), scope


def test_a_device_with_smaller_limits_refuses_the_artifact(built):
    spec, sources, params = read_artifact(built["texture"])
    from tuner.artifact import check_spec
    size = (built["texture"] / "params.bin").stat().st_size
    small = {**spec.device["profile"], "image2d_max_width": 2, "max_work_group_size": 1}
    with pytest.raises(ArtifactError, match="image2d limit|work-group limits"):
        check_spec(spec, sources, size, small)


def test_recompiling_replaces_the_whole_folder(built, tmp_path):
    d = tmp_path / "a"
    shutil.copytree(built["buffer"], d)
    (d / "profile.json").write_text("{}")
    (d / "kernels" / "k999.cl").write_text("stale")
    (d / "binaries").mkdir(exist_ok=True)
    m = tuner.compile_model(built["model"], target=json.loads((d / "graph.json").read_text())["device"]["profile"],
                            scope="texture")
    m.save(d)
    assert not (d / "profile.json").exists() and not (d / "kernels" / "k999.cl").exists()
    assert not (d / "binaries").exists()
    read_artifact(d)
    assert [p.name for p in tmp_path.iterdir()] == ["a"]  # no temporary folder left beside it


def test_a_failed_write_leaves_nothing_and_other_folders_are_refused(built, tmp_path, monkeypatch):
    spec, sources, params = read_artifact(built["buffer"])
    from tuner.artifact import store, write_artifact
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="is not a compiled model"):
        write_artifact(keep, spec, sources, params)
    assert (keep / "notes.txt").read_text() == "mine"

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(store, "_sha256", boom)
    with pytest.raises(ArtifactError, match="No space left"):
        write_artifact(tmp_path / "new", spec, sources, params)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_kernel_files_never_come_from_node_names(device, tmp_path):
    import onnx
    from onnx import TensorProto, helper
    name = "n" * 300 + "/../x:y"
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 1, 1], np.ones(12, np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name=name)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = tmp_path / "long.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    m = tuner.compile_model(model, target=device.info.to_dict(), scope="buffer")
    d = Path(m.save(tmp_path / "a"))
    assert sorted(p.name for p in (d / "kernels").iterdir())[0] == "k000.cl"
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y, = load_module(d, device=device).run([x])
    np.testing.assert_allclose(y, np.einsum("oc,nchw->nohw", np.ones((4, 3), np.float32), x), rtol=1e-5, atol=1e-5)
