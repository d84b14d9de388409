"""Every command that takes --device reaches a device agent the same way (exec:// here; tcp:// and adb://
go through the same Runtime, tests/test_agent.py): devices, op, tune-op, compile, run; errors are one line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.cli import main
from tuner.zoo.models import write_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def agent(native):
    return f"exec://{native['agent']}"


def test_devices_through_the_agent_is_the_local_profile(agent, capsys, device):
    assert main(["devices", "--json", "--device", f"{agent}?device={device.info.index}"]) == 0
    prof = json.loads(capsys.readouterr().out)
    assert prof["fingerprint"] == device.info.fingerprint and prof["agent"].startswith("exec://")


def _tuner(*argv, cwd):
    """The command as a user runs it: its own process."""
    r = subprocess.run([sys.executable, "-m", "tuner", *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, (argv, r.stdout[-2000:], r.stderr[-2000:])
    return r.stdout


def test_op_tune_op_compile_and_run_through_the_agent(agent, device, tmp_path):
    spec = f"{agent}?device={device.info.index}"
    conv = ["conv2d", "--data", "1,8,8,8", "--kernel", "8,8,3,3", "--padding", "1"]
    out = _tuner("op", *conv, "--check", "--time", "--repeats", "3", "--device", spec, cwd=tmp_path)
    assert "check: max relative error" in out
    log = tmp_path / "agent.jsonl"
    _tuner("tune-op", *conv, "--trials", "2", "--log", log, "--no-progress", "--sampler", "random",
           "--device", spec, cwd=tmp_path)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(recs) == 2 and {r["device"] for r in recs} == {device.info.fingerprint}
    model = write_model("resnet18", tmp_path / "r.onnx", input_size=32, num_classes=10)
    art = tmp_path / "art"
    _tuner("compile", model, "-o", art, "--scope", "buffer", "--no-progress", "--device", spec, cwd=tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    _tuner("run", art, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--bench", "2",
           "--device", spec, cwd=tmp_path)
    import onnxruntime as ort
    want = ort.InferenceSession(model).run(None, {"input": x})[0]
    y = np.load(tmp_path / "y.npy")
    assert np.abs(y - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("argv, words", [
    (["devices", "--device", "exec://"], "needs the agent's path"),
    (["devices", "--device", "exec:///no/such/agent"], "no agent program"),
    (["devices", "--device", "tcp://nohost"], "tcp://HOST:PORT"),
    (["devices", "--device", "tcp://127.0.0.1:1"], "cannot connect"),
    (["devices", "--device", "exec:///bin/true?color=red"], "unknown option"),
])
def test_bad_agent_specs_are_one_line_errors(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err, err


def test_a_local_only_command_says_so(agent, capsys):
    assert main(["example", "addone", "--device", agent]) == 2
    assert "local OpenCL device" in capsys.readouterr().err


@pytest.mark.parametrize("tail, words", [("?timeout=abc", "not a number of seconds"), ("?timeout=nan", "not a number"),
                                         ("?timeout=inf", "at most 86400"), ("?timeout=5000000", "at most 86400"),
                                         (" 'unclosed", "cannot split the command")])
def test_bad_agent_options_are_one_line_errors(agent, tail, words, capsys):
    assert main(["devices", "--device", agent + tail]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err, err
