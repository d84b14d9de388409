"""The artifact contract (docs/artifact.md): written atomically, verified by hash, checked against itself and the
device before anything is allocated; each damaged artifact is refused with an error naming the file."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tuner
from tuner.artifact import ArtifactError, read_artifact
from tuner.cli import main
from tuner.runtime.module import load_module
from tuner.zoo.models import write_model

from artifact_corpus import damaged_artifacts

pytestmark = pytest.mark.xdist_group("artifact")  # one worker compiles the artifacts (tests/conftest.py)


@pytest.fixture(scope="module")
def built(tmp_path_factory, device):
    """Artifacts of a small ResNet compiled for the test device's profile (nothing is built here): the buffer
    plan and the texture plan."""
    d = tmp_path_factory.mktemp("artifacts")
    model = write_model("resnet18", d / "r.onnx", input_size=32, num_classes=10)
    out = {}
    for scope in ("buffer", "texture"):
        m = tuner.compile_model(model, target=device.info.to_dict(), scope=scope)
        out[scope] = Path(m.save(d / scope))
    out["model"] = Path(model)
    return out


# The check each case of the shared corpus (tests/artifact_corpus.py, which the native runtime's tests refuse
# too) is aimed at: the Python reader's message must say it, beyond naming the file.
AIMED = {
    "truncated_kernel": "holds", "swapped_params": "does not match its SHA-256", "edited_graph": "names no pool",
    "missing_kernel": "is missing", "planted_global_size": "work-items for operands", "empty_outputs":
    "outputs is empty", "missing_manifest": "has no manifest.json", "unknown_argument": "names no entry",
    "format_version_1": "version 1", "undefined_kernel": "is not defined", "kernel_from_another_node": "kernels/",
    "params_a_fifo": "is not a regular file", "manifest_nested": "is not valid JSON", "int32_weights": "'int32'",
    "output_edited_to_float16": "is float16", "nodes_reversed": "before any call writes it",
    "launch_1x1x1": "does not divide", "launch_2d": "must be three integers", "pool_shrunk": "holds 16",
    "kernel_path_escapes": "is not a kernel file name", "shape_a_string": "pools[0].shape",
    "duplicate_key": "appears twice", "nan_literal": "NaN is not JSON", "trailing_comma": "is not valid JSON",
    "float_in_a_shape": "must be an integer", "kernel_with_nul": "not text", "kernel_a_symlink": "symbolic link",
    "written_argument_passed_twice": "is written and also passed",
    "param_shrunk": "is smaller than parameter", "config_source_escape": "config_source must be",
}


def test_every_damaged_artifact_is_refused_naming_the_file(built, tmp_path, capsys):
    cases = damaged_artifacts(built["texture"], tmp_path)
    assert {c for c, _, _ in cases} == set(AIMED)
    for case, d, name in cases:
        with pytest.raises(ArtifactError) as e:
            read_artifact(d)
        msg = str(e.value)
        assert name in msg and str(d) in msg and AIMED[case] in msg and "recompile" in msg, (case, msg)
        out = tmp_path / "y.npy"
        assert main(["run", str(d), "--repeat", "1", "--output", str(out)]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("error: ") and name in err and "Traceback" not in err, (case, err)
        assert not out.exists()


def test_an_output_whose_pool_a_later_kernel_reuses_is_refused(built, tmp_path, capsys):
    """Issue 36: the buffer plan shares the input's pool with later tensors; ``outputs`` edited to name the
    input (manifest resealed) returned another tensor's data. Check 10 now refuses it in both runtimes (the C
    side: test_native_runtime)."""
    d = next(d for c, d, _ in damaged_artifacts(built["buffer"], tmp_path) if c == "output_overwritten")
    with pytest.raises(ArtifactError, match="is overwritten"):
        read_artifact(d)
    assert main(["run", str(d), "--repeat", "1"]) == 2 and "is overwritten" in capsys.readouterr().err


def test_planted_launch_is_refused_before_any_enqueue(built, tmp_path, monkeypatch):
    import pyopencl as cl
    d = next(d for c, d, _ in damaged_artifacts(built["buffer"], tmp_path) if c == "planted_global_size")
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


def _resealed(d: Path) -> None:
    from artifact_corpus import _reseal
    _reseal(d)


def test_a_kernel_only_in_a_comment_is_one_line_at_load(built, tmp_path, capsys):
    """Found by a hostile sweep: a kernel defined only in a comment or under `#if 0` passes the text checks and
    is refused, in one line naming the file, when the driver cannot set it up."""
    good = built["buffer"]
    cases = []

    def copy(name):
        d = tmp_path / name
        shutil.copytree(good, d, ignore=shutil.ignore_patterns("binaries"))
        return d

    d = copy("comment_only")
    k = d / "kernels" / "k000.cl"
    src = k.read_text()
    k.write_text("// __kernel void relayout(\n#if 0\n" + src + "\n#endif\n")
    _resealed(d)
    cases.append((d, None))  # passes the text checks; the driver's refusal at load is one line
    for d, words in cases:
        if words is not None:
            with pytest.raises(ArtifactError, match=words):
                read_artifact(d)
        assert main(["run", str(d), "--repeat", "1"]) == 2, d.name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err and "k000.cl" in err or words, (d.name, err)


def test_profile_json_that_is_a_link_is_never_written_through(built, tmp_path, device):
    """A ``profile.json`` link planted in the artifact: the profile goes to the user's cache, the artifact and the
    link's target stay as they were, and the planted link is not taken for the artifact's profile."""
    from tuner.artifact.cache import find_profile, profile_path
    d = tmp_path / "a"
    shutil.copytree(built["buffer"], d)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (d / "profile.json").symlink_to(victim)
    assert main(["run", str(d), "--repeat", "1", "--profile", "--device", str(device.info.index)]) == 0
    assert victim.read_text() == "precious" and (d / "profile.json").is_symlink()
    assert find_profile(d) == profile_path(d) and json.loads(profile_path(d).read_text())["rows"]


@pytest.mark.parametrize("out, words", [("", "-o is empty"), ("mine", "is not a compiled model")])
def test_compile_refuses_its_output_before_any_work(built, tmp_path, capsys, monkeypatch, out, words):
    import tuner.compile.compiler as compiler
    monkeypatch.setattr(compiler, "compile_model", lambda *a, **k: pytest.fail("compiled before checking -o"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    assert main(["compile", str(built["model"]), "-o", out]) == 2
    assert words in capsys.readouterr().err


# -- a device's failure names the node, its kernel file and the launch (issue 39) ---------------------------------
def _planted_local_size(good: Path, dst: Path) -> tuple:
    """A copy of ``good`` whose first tuned call with a work-group of more than one item runs with local size
    [1, 1, 1], the manifest resealed: it divides the global size and fits every device, so every check of the
    artifact passes, but the kernel's reqd_work_group_size says otherwise and the driver refuses the launch.
    ``(dir, node name, its kernel file, the call's global size)``."""
    from artifact_corpus import _copy, _edit_graph
    d = _copy(good, dst)
    g = json.loads((d / "graph.json").read_text())
    node = next(n for n in g["nodes"] if n.get("template") and n["calls"][0]["local_size"] != [1, 1, 1])

    def plant(g):
        next(n for n in g["nodes"] if n["name"] == node["name"])["calls"][0]["local_size"] = [1, 1, 1]
    _edit_graph(d, plant)
    return d, node["name"], node["source"], node["calls"][0]["global_size"]


def test_a_launch_the_device_refuses_is_an_error_naming_the_node(built, tmp_path, monkeypatch):
    import subprocess
    import sys

    import tuner.artifact.checks as checks
    from tuner.errors import DeviceError
    d, name, source, global_size = _planted_local_size(built["buffer"], tmp_path / "local_size_planted")
    # check 11 reads the kernel's reqd_work_group_size from its source: the planted local size is refused
    with pytest.raises(ArtifactError, match=r"local_size \[1, 1, 1\] is not the reqd_work_group_size"):
        read_artifact(d)
    # with check 11 off, only the driver knows: its refusal names the node, its kernel file and the launch
    monkeypatch.setattr(checks, "check_sizes", lambda spec, sources: None)
    read_artifact(d)
    with pytest.raises(DeviceError) as e:
        load_module(d).run([np.zeros((1, 3, 32, 32), np.float32)])
    msg = str(e.value)
    assert msg.startswith(f"node {name!r} (kernels/{source}), ") and f"global size {global_size}" in msg, msg
    assert "local size [1, 1, 1]" in msg and "clEnqueueNDRangeKernel" in msg, msg
    code = ("import sys, tuner.artifact.checks as c; c.check_sizes = lambda spec, sources: None; "
            "from tuner.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "run", str(d), "--repeat", "1"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    err = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and f"node {name!r} (kernels/{source})" in err[0], r.stderr


def _failing_at_wait(device, index: int, foreign: bool = False):
    """A local OpenCL runtime whose device fails while it runs the ``index``-th launch of a submit: the next wait
    raises what the runtime raises for a driver's late failure (a DeviceError that carries the launch), or,
    ``foreign``, an exception of a runtime's own that carries nothing."""
    from tuner.errors import DeviceError
    from tuner.runtime.opencl import OpenCLRuntime

    class FailingAtWait(OpenCLRuntime):
        blamed = None

        def submit(self, launches):
            super().submit(launches)
            self.blamed = launches[index]

        def finish(self):
            super().finish()
            if self.blamed is not None:
                if foreign:
                    raise RuntimeError("CL_OUT_OF_RESOURCES")
                raise DeviceError(f"waiting for the device on {self.info.name}: clFinish failed: OUT_OF_RESOURCES",
                                  self.blamed)
    return FailingAtWait(device)


def test_a_launch_that_fails_on_the_device_is_named_at_the_wait(built, device):
    from tuner.errors import DeviceError
    spec = read_artifact(built["buffer"])[0]
    calls = [(n, c) for n in spec.nodes for c in n.calls]
    node, call = calls[len(calls) // 2]
    mod = load_module(built["buffer"], device=_failing_at_wait(device, len(calls) // 2))
    with pytest.raises(DeviceError) as e:
        mod.time(1, warmup=0)
    assert str(e.value).startswith(f"node {node.name!r} (kernels/{node.source}), kernel {call.kernel!r} with "
                                   f"global size {list(call.global_size)} and local size "
                                   f"{list(call.local_size)}: waiting for the device"), str(e.value)
    mod = load_module(built["buffer"], device=_failing_at_wait(device, 0, foreign=True))
    with pytest.raises(DeviceError, match=rf"a run of its {len(calls)} launches .*RuntimeError: CL_OUT_OF_RES"):
        mod.time(1, warmup=0)
