"""Fault suite: hostile or broken input at every boundary gives `error: ...` with exit 2 (one line, no
traceback), or the documented correct behaviour; never a hang or a silently wrong result."""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.cli import main
from tuner.zoo.models import write_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    d = tmp_path_factory.mktemp("art")
    model = write_model("resnet18", d / "r.onnx", input_size=32, num_classes=10)
    assert main(["compile", model, "-o", str(d / "a"), "--scope", "buffer", "--no-progress"]) == 0
    return d / "a"


def _broken(artifact, tmp_path, how):
    b = tmp_path / "b"
    shutil.copytree(artifact, b)
    how(b)
    return b


@pytest.mark.parametrize("how, message", [
    (lambda b: next((b / "kernels").iterdir()).unlink(), "is missing"),
    (lambda b: (b / "graph.json").write_text((b / "graph.json").read_text()[:100]), "graph.json holds"),
    (lambda b: (b / "graph.json").write_text("[1, 2]"), "graph.json holds"),
    (lambda b: (b / "params.bin").unlink(), "params.bin is missing"),
    (lambda b: (b / "params.bin").write_bytes(b"not the weights"), "params.bin holds"),
    (lambda b: (b / "graph.json").unlink(), "graph.json is missing"),
    (lambda b: [p.unlink() for p in b.iterdir() if p.is_file()], "is not a compiled model"),
])
def test_damaged_artifacts_name_the_file(artifact, tmp_path, capsys, how, message):
    b = _broken(artifact, tmp_path, how)
    assert main(["run", str(b), "--repeat", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "recompile" in err or "tuner compile" in err


def test_run_rejects_bad_arguments_before_work(artifact, tmp_path, capsys):
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    cases = [
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--input", str(tmp_path / "s.npy")], "holds <U1 values"),
        (["--input", str(tmp_path / "missing.npy")], "cannot read --input"),
        (["--output", str(tmp_path)], "is a directory"),
        (["--output", str(tmp_path / "no" / "such" / "dir" / "y.npy")], "cannot be written"),
    ]
    for extra, message in cases:
        assert main(["run", str(artifact), "--repeat", "1", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, (extra, err)


def test_run_output_is_written_under_the_name_given(artifact, tmp_path):
    out = tmp_path / "out_conv"
    assert main(["run", str(artifact), "--repeat", "1", "--output", str(out)]) == 0
    assert out.is_file() and not (tmp_path / "out_conv.npy").exists()
    assert np.load(out).shape == (1, 10)


@pytest.mark.parametrize("argv, message", [
    (["zoo", "resnet18", "--input-size", "0", "-o", "{tmp}/z.onnx"], "at least 32"),  # wrote 224x224 before
    (["zoo", "resnet18", "--input-size", "-32", "-o", "{tmp}/z.onnx"], "at least 32"),  # negative dims before
    (["zoo", "resnet18", "-o", "{tmp}/no/such/z.onnx"], "cannot be written"),
    (["zoo", "resnet18", "-o", "{tmp}"], "is a directory"),
    (["logs", str(ROOT / "logs"), "-o", "/proc/no/x.csv"], "cannot"),
    (["compare", str(ROOT / "logs"), "-o", "/proc/no/x.txt"], "cannot"),
    (["report", str(ROOT / "logs"), "-o", "/proc/no/r.html"], "cannot"),
])
def test_outputs_are_checked_before_any_work(tmp_path, capsys, argv, message):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_compile_output_checked_first(artifact, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    model = write_model("resnet18", tmp_path / "r.onnx", input_size=32)
    assert main(["compile", model, "-o", str(blocker / "sub"), "--no-progress"]) == 2
    assert "cannot be created or written" in capsys.readouterr().err


def test_no_traceback_in_a_fresh_process(artifact, tmp_path):
    (tmp_path / "b").mkdir()
    r = subprocess.run([sys.executable, "-m", "tuner", "run", str(tmp_path / "b")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_an_onnx_opset_from_the_future_is_refused(tmp_path, capsys):
    import onnx
    from tuner.zoo.models import test_models
    model = test_models()["add"]
    model.opset_import[0].version = 99  # onnxruntime refuses it too
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["compile", str(path), "-o", str(tmp_path / "a"), "--no-progress"]) == 2
    assert "opset 99" in capsys.readouterr().err


def _some_records(n=3):
    from tuner.logs import load_records
    recs = load_records(ROOT / "logs" / "pocl-cpu-e66d8a71.jsonl")[:n]  # the committed log
    assert len(recs) == n
    return recs


@pytest.mark.parametrize("make_bad", [
    lambda p: p.symlink_to("/dev/full"),  # a full disk: every write is ENOSPC
    lambda p: p.mkdir(),  # the log replaced by a folder
])
def test_records_that_cannot_reach_the_log_are_rescued_not_lost(tmp_path, make_bad):
    from tuner.logs import load_records
    from tuner.logs.io import TuningLogWarning, append_records
    log = tmp_path / "log.jsonl"
    make_bad(log)
    recs = _some_records()
    with pytest.warns(TuningLogWarning, match="saved in .*rescued"):
        where = append_records(log, recs)
    assert where != log and [r.to_dict() for r in load_records(where)] == [r.to_dict() for r in recs]


def test_an_unwritable_log_is_refused_before_measuring(tmp_path, capsys):
    assert main(["tune-op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3", "--trials", "2",
                 "--log", "/proc/no/L.jsonl", "--storage", f"sqlite:///{tmp_path / 's.db'}"]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_a_stuck_lock_times_out_naming_it(tmp_path, monkeypatch):
    from filelock import FileLock

    from tuner.errors import TunerError
    from tuner.logs import io
    monkeypatch.setattr(io, "LOCK_TIMEOUT_S", 0.3)
    log = tmp_path / "log.jsonl"
    holder = FileLock(str(log) + ".lock")
    holder.acquire()
    try:
        import threading
        err = []
        t = threading.Thread(target=lambda: err.append(_try(io.append_records, log, _some_records(1))))
        t.start()
        t.join(10)
        assert not t.is_alive() and isinstance(err[0], TunerError) and "locked by another process" in str(err[0])
    finally:
        holder.release()


def _try(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.mark.parametrize("storage, message", [
    ("nosuch://x", "cannot open storage"),
    ("sqlite:////proc/no/x.db", "cannot"),
    ("journal:{tmp}", "is a directory"),
    ("journal:/proc/no/j.log", "cannot be written"),
    ("no-scheme", "give a database URL"),
])
@pytest.mark.parametrize("command", ["tune-op", "worker"])
def test_bad_storages_are_one_clear_error(tmp_path, capsys, storage, message, command):
    s = storage.format(tmp=tmp_path)
    argv = (["tune-op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3", "--trials", "1"] if command == "tune-op"
            else ["worker", "--study-prefix", "x", "--no-progress"])
    assert main([*argv, "--storage", s, "--log", str(tmp_path / "l.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err


def test_a_logged_config_the_space_rejects_is_never_deployed(tmp_path, device):
    """The fastest record of a layer breaks its template's space (hand-edited): compile uses the next valid
    record, or the fallback, with a warning; the bad config is never built."""
    import dataclasses
    import json
    import warnings

    from tuner.compile.compiler import compile_model
    from tuner.zoo.models import test_models
    from tuner.logs import Record, append_records
    from tuner.logs.best import InvalidLoggedConfigWarning
    from tuner.measure import MeasureResult
    from tuner.templates import get_template

    model = test_models()["conv_pads"]
    plain = compile_model(model, device=device, scope="buffer")
    layers = [n for n in plain.spec.nodes if n.template == "conv2d"]
    t = get_template("conv2d")
    n = layers[0]
    wl = t.workload(**{k: v for k, v in n.workload.items() if k != "op"})
    good = t.config(**n.config)
    bad = dataclasses.replace(good, tile_ow=3)  # not a choice of the knob
    res = MeasureResult(costs=[1e-6, 1e-6])
    recs = [Record.new("conv2d", wl, bad, device.info, costs=res.costs),
            Record.new("conv2d", wl, good, device.info, costs=[2e-6, 2e-6])]
    log = tmp_path / "log.jsonl"
    append_records(log, recs)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mod = compile_model(model, log=str(log), device=device, scope="buffer")
    assert any(issubclass(x.category, InvalidLoggedConfigWarning) and "tile_ow" in str(x.message) for x in w)
    deployed = next(m for m in mod.spec.nodes if m.name == n.name)
    assert deployed.config["tile_ow"] != 3 and deployed.config == json.loads(json.dumps(dataclasses.asdict(good)))
