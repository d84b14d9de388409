"""Hostile command lines, second sweep: every option validated where it enters, the same way in `tune`,
`tune-op` and `worker`; search-space files that would hang or name another template; ONNX models that are
ill-formed; FIFOs, devices and missing files named as such; `tuner run` with several inputs; cache folders
that cannot be written. Each is `error: <what and how to fix it>` with exit status 2, never a traceback."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tuner.cli import main
from tuner.errors import TunerError
from tuner.frontend.onnx import from_onnx

ROOT = Path(__file__).resolve().parents[1]
CONV = ["conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3"]
COMMANDS = {  # the three measuring commands, each with what it needs besides the option under test
    "tune": ["tune", "model.onnx"],
    "tune-op": ["tune-op", *CONV],
    "worker": ["worker", "--storage", "journal:unused.log"],
}
BAD = [  # option, value, what the error says
    ("--parallel", "0", "--parallel must be at least 1, got 0"),
    ("--repeats", "0", "--repeats must be at least 1, got 0"),
    ("--trials", "0", "--trials must be at least 1, got 0"),
    ("--trials", "many", "--trials: 'many' is not an integer"),
    ("--seed", "-1", "--seed must be an integer from 0 to 4294967295, got -1"),
    ("--seed", str(2**32), "--seed must be an integer from 0 to 4294967295"),
    ("--build-timeout", "-1", "--build-timeout must be a number of seconds above 0"),
    ("--build-timeout", "nan", "--build-timeout must be a number of seconds above 0"),
    ("--run-timeout", "inf", "--run-timeout must be a number of seconds above 0 and at most 604800"),
    ("--run-timeout", "0", "--run-timeout must be a number of seconds above 0"),
]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag, value, message", BAD)
def test_measuring_options_are_validated_alike_in_every_command(capsys, command, flag, value, message):
    """`tune --seed -1` and `tune-op --build-timeout -1` gave tracebacks; `tune --parallel 0` measured nothing
    and exited 1 pointing at a log it never wrote."""
    assert main([*COMMANDS[command], flag, value]) == 2
    err = _error(capsys)
    assert message in err and f"usage: tuner {command}" in err


@pytest.mark.parametrize("argv, message", [
    (["tune", "m.onnx", "--workers", "-1"], "--workers must be at least 0"),
    (["tune", "m.onnx", "--min-trials", "0"], "--min-trials must be at least 1"),
    (["tune", "m.onnx", "--early-stopping", "0"], "--early-stopping must be at least 1"),
    (["worker", "--storage", "journal:x", "--max-trials", "0"], "--max-trials must be at least 1"),
    (["worker", "--storage", "journal:x", "--heartbeat", "0"], "--heartbeat must be at least 1"),
    (["worker", "--storage", "journal:x", "--grace", "5"], "--grace 5 must be longer than --heartbeat 10"),
    (["run", "a", "--repeat", "0"], "--repeat must be at least 1"),
    (["demo", "--input-size", "16"], "--input-size must be at least 32"),
    (["demo", "--trials", "0"], "--trials must be at least 1"),
    (["bogus"], "COMMAND: invalid choice: 'bogus'"),
])
def test_other_counts_are_validated_where_they_enter(capsys, argv, message):
    assert main(argv) == 2
    assert message in _error(capsys)


# -- search-space files --------------------------------------------------------------------------------------

def _space_file(tmp_path, replace: dict, name="space.toml") -> str:
    text = (ROOT / "search_space" / "dense.toml").read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("constraint, message", [
    ("10 ** 10 ** 10 > 0", "exponent 10000000000 is out of range"),  # hung `tuner space`
    ("len([0] * 10 ** 9) > 0", "more than 10000 items"),
    ("(2 ** 64) ** 64 > 0", "more than 4096 bits"),
    ("1 // 0 == 0", "ZeroDivisionError"),
])
def test_a_constraint_that_cannot_be_computed_is_refused_at_load(tmp_path, capsys, constraint, message):
    path = _space_file(tmp_path, {'tile_n_fits = "tile_n <= N"': f'tile_n_fits = "{constraint}"'})
    assert main(["space", "dense", "--file", path]) == 2
    err = _error(capsys)
    assert message in err and "constraint 'tile_n_fits'" in err and path in err


def test_a_constraint_reading_knobs_is_bounded_when_evaluated(tmp_path, capsys):
    path = _space_file(tmp_path, {'tile_n_fits = "tile_n <= N"': 'tile_n_fits = "N ** (tile_m * 100) > 0"'})
    assert main(["space", "dense", "--file", path, "--data", "1,8", "--weight", "4,8"]) == 2
    err = _error(capsys)
    assert "constraint 'tile_n_fits'" in err and path in err and "exponent 100 is out of range" in err


def test_a_space_file_must_name_its_own_template(tmp_path, capsys):
    """A dense space file saying `template = "conv2d"` was accepted as dense's."""
    path = _space_file(tmp_path, {'template = "dense"': 'template = "conv2d"'})
    assert main(["space", "dense", "--file", path]) == 2
    err = _error(capsys)
    assert path in err and "template = 'conv2d'" in err and "'dense'" in err
    # a template whose shipped file is shared (winograd2/4: conv2d_winograd.toml) accepts that file's name
    assert main(["space", "winograd2", "--file", str(ROOT / "search_space" / "conv2d_winograd.toml")]) == 0


# -- ONNX models ---------------------------------------------------------------------------------------------

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])


def _onnx(nodes, inputs=(X,), outputs=(Y,)):
    return helper.make_model(helper.make_graph(nodes, "g", list(inputs), list(outputs)),
                             opset_imports=[helper.make_opsetid("", 13)])


def test_a_tensor_defined_by_two_nodes_is_refused(tmp_path, capsys):
    """onnxruntime refuses it ('Duplicate definition of name (y)'); it compiled."""
    model = _onnx([helper.make_node("Relu", ["x"], ["y"], name="first"),
                   helper.make_node("Sigmoid", ["x"], ["y"], name="second")])
    with pytest.raises(TunerError, match=r"tensor 'y' is defined twice: by node 'first' \(#0, Relu\) and by node "
                                         r"'second' \(#1, Sigmoid\)"):
        from_onnx(model)
    path = tmp_path / "dup.onnx"
    onnx.save(model, str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "out"), "--no-progress"]) == 2
    assert "defined twice" in _error(capsys)
    assert not (tmp_path / "out").exists()  # a failed compile leaves no -o folder behind


def test_a_zero_size_dimension_is_not_called_symbolic():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 0, 4, 4])
    with pytest.raises(TunerError) as e:
        from_onnx(_onnx([helper.make_node("Relu", ["x"], ["y"])], inputs=(x,)))
    assert "zero-size dimension" in str(e.value) and "axis 1" in str(e.value) and "symbolic" not in str(e.value)


def test_an_empty_file_is_not_an_onnx_model(tmp_path, capsys):
    """'imports no opset' was the message for an empty file."""
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert main(["compile", str(tmp_path / "empty.onnx"), "-o", str(tmp_path / "out")]) == 2
    err = _error(capsys)
    assert "empty file" in err and "not an ONNX model" in err and "opset" not in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(TunerError, match="not an ONNX model"):
        from_onnx(onnx.ModelProto())


# -- FIFOs, devices, missing files ---------------------------------------------------------------------------

@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["compile", "{fifo}", "-o", "{tmp}/out"], "cannot read model '{fifo}': it is a FIFO (named pipe), not a regular "
                                              "file"),
    (["compile", "/dev/null", "-o", "{tmp}/out"], "cannot read model '/dev/null': it is a character device"),
    (["tune", "/dev/zero"], "it is a character device, not a regular file"),
    (["op", *CONV, "--config", "{fifo}"], "cannot read --config file '{fifo}': it is a FIFO"),
    (["op", *CONV, "--config", "/dev/null"], "--config file '/dev/null': it is a character device"),
    (["op", *CONV, "--config", "{tmp}/missing.json"], "cannot read --config file '{tmp}/missing.json': no such file"),
    (["worker", "--storage", "journal:{tmp}/j.log", "--tasks", "{fifo}"], "--tasks file '{fifo}': it is a FIFO"),
    (["worker", "--storage", "journal:{tmp}/j.log", "--tasks", "{tmp}/no.json"], "--tasks file '{tmp}/no.json': no "
                                                                                  "such file"),
    (["space", "dense", "--file", "{fifo}"], "is a FIFO (named pipe), not a regular file"),
    (["space", "dense", "--file", "{tmp}"], "is a directory, not a regular file"),
])
def test_special_and_missing_files_are_named_for_what_they_are(tmp_path, fifo, capsys, argv, message):
    """FIFOs hung (`compile`, `tune`, `--tasks`) or were reported as missing; a missing --config file was
    'not valid JSON'."""
    assert main([a.format(fifo=fifo, tmp=tmp_path) for a in argv]) == 2
    assert message.format(fifo=fifo, tmp=tmp_path) in _error(capsys)
    assert not (tmp_path / "out").exists()


# -- tuner run: several inputs, outputs written whole --------------------------------------------------------

@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """An artifact of y = relu(a + b) and its inputs."""
    d = tmp_path_factory.mktemp("two")
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 4, 4, 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 4, 4])
    model = _onnx([helper.make_node("Add", ["a", "b"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"])],
                  inputs=(a, b))
    onnx.save(model, str(d / "two.onnx"))
    assert main(["compile", str(d / "two.onnx"), "-o", str(d / "art"), "--no-progress"]) == 0
    rng = np.random.default_rng(1)
    for name in "ab":
        np.save(d / f"{name}.npy", rng.standard_normal((1, 4, 4, 4)).astype(np.float32))
    return d


def test_run_feeds_each_input_by_name(two_inputs, tmp_path, capsys):
    d = two_inputs
    out = tmp_path / "y.npy"
    assert main(["run", str(d / "art"), "--input", f"b={d / 'b.npy'}", "--input", f"a={d / 'a.npy'}",
                 "--output", str(out), "--repeat", "1"]) == 0
    assert f"wrote {out} [1, 4, 4, 4]" in capsys.readouterr().out
    assert np.array_equal(np.load(out), np.maximum(np.load(d / "a.npy") + np.load(d / "b.npy"), 0))
    assert [p.name for p in tmp_path.iterdir()] == ["y.npy"]  # no temporary file left beside it


@pytest.mark.parametrize("inputs, message", [
    (["{d}/a.npy"], "does not say which input it is: the model takes 2 inputs; give one --input NAME=X.npy per "
                    "model input (a, b)"),
    (["a={d}/a.npy"], "no --input for 'b'"),
    (["a={d}/a.npy", "a={d}/b.npy"], "--input a=... is given twice"),
    (["c={d}/a.npy", "b={d}/b.npy"], "the model has no input 'c'"),
    (["a={d}/a.npy", "b={d}/missing.npy"], "cannot read --input 'b={d}/missing.npy': no such file"),
])
def test_run_says_which_inputs_are_wrong(two_inputs, tmp_path, capsys, inputs, message):
    out = tmp_path / "y.npy"
    argv = ["run", str(two_inputs / "art"), "--output", str(out), "--repeat", "1"]
    for spec in inputs:
        argv += ["--input", spec.format(d=two_inputs)]
    assert main(argv) == 2
    assert message.format(d=two_inputs) in _error(capsys)
    assert not out.exists()


def test_run_refuses_to_write_the_outputs_of_a_model_without_outputs(two_inputs, tmp_path, capsys, monkeypatch):
    """A model whose outputs list is empty left a 0-byte --output file behind (IndexError after opening it)."""
    import tuner.runtime.module as module
    real = module.load_module

    def no_outputs(*args, **kwargs):
        mod = real(*args, **kwargs)
        mod.spec.outputs = []
        return mod
    monkeypatch.setattr(module, "load_module", no_outputs)
    out = tmp_path / "y.npy"
    assert main(["run", str(two_inputs / "art"), "--output", str(out), "--repeat", "1"]) == 2
    assert "computes no outputs" in _error(capsys) and not out.exists()
    assert list(tmp_path.iterdir()) == []


# -- cache folders -------------------------------------------------------------------------------------------

def test_an_unwritable_cache_folder_does_not_hide_pocl(tmp_path):
    """PoCL reports no device when it cannot create its cache folder ($XDG_CACHE_HOME/pocl); the CLI then said
    to install PoCL. Now it caches in a private temp folder and says so."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(blocker / "cache"), "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": str(ROOT)}
    from tuner.runtime.opencl.device import list_devices
    if not any(d.platform == "Portable Computing Language" for d in list_devices()):
        pytest.skip("no PoCL device here")
    r = subprocess.run([sys.executable, "-m", "tuner", "devices", "--json"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    main_devices = subprocess.run([sys.executable, "-m", "tuner", "devices", "--json"], capture_output=True,
                                  text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300).stdout
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"the cache folder {blocker / 'cache'} cannot be written (Not a directory)" in r.stderr
    pocl = [d for d in json.loads(r.stdout) if d["platform"] == "Portable Computing Language"]
    usual = [d for d in json.loads(main_devices) if d["platform"] == "Portable Computing Language"]
    assert pocl and [d["usable"] for d in pocl] == [d["usable"] for d in usual], (pocl, usual)
    # the library too, not only the command line: the folders are checked where OpenCL is first loaded
    code = "import tuner; print(sorted({d.platform for d in tuner.list_devices()}))"
    lib = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert lib.returncode == 0 and "Portable Computing Language" in lib.stdout, lib.stderr


def test_native_help_reaches_its_own_parser(capsys):
    from tuner.cli import main
    for flag in ("-h", "--help"):
        assert main(["native", flag]) == 0 and "build" in capsys.readouterr().out
    assert main(["native", "--frobnicate"]) == 2
