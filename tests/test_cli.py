"""CLI tests: the real entry points against the real PoCL device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_devices_table_via_module():
    r = run(sys.executable, "-m", "tuner.cli", "devices")
    assert r.returncode == 0, r.stderr
    assert "Portable Computing Language" in r.stdout and "pocl-cpu-" in r.stdout
    assert "image2d max" in r.stdout and "fingerprint" in r.stdout
    assert sum(line.startswith("*") for line in r.stdout.splitlines()) == 2  # default row + legend


def test_devices_json_via_entry_point():
    exe = Path(sys.executable).with_name("tuner")
    if not exe.exists():
        pytest.skip("the `tuner` console script is not installed next to this interpreter")
    r = run(str(exe), "devices", "--json")
    assert r.returncode == 0, r.stderr
    devices = json.loads(r.stdout)
    assert any(d["platform"] == "Portable Computing Language" and d["image_support"] for d in devices)
    assert sum(d["default"] for d in devices) == 1
    assert all(d["fingerprint"] and d["image2d_max_width"] >= 0 for d in devices)


def test_devices_json_in_process(capsys):
    assert main(["devices", "--json", "--device", "pocl"]) == 0
    [d] = json.loads(capsys.readouterr().out)
    assert d["fingerprint"].startswith("pocl-cpu-") and d["half_images"] in (True, False)


def test_tuner_error_is_exit_2_without_traceback():
    r = run(sys.executable, "-m", "tuner", "devices", "--device", "nosuch")
    assert r.returncode == 2
    assert r.stderr.startswith("error: no OpenCL device matches 'nosuch'") and "Traceback" not in r.stderr
    assert "[0]" in r.stderr


def test_usage_errors_exit_2(capsys):
    assert main(["bogus"]) == 2
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().err
    assert main(["--version"]) == 0


def test_example_show_passes_prints_every_pass_and_the_source(capsys):
    from tuner.lower import PASSES
    assert main(["example", "addone", "--show-passes", "--device", "pocl"]) == 0
    out = capsys.readouterr().out
    for p in PASSES:
        assert f"===== addone: {p.__name__} =====" in out
        assert f"===== addone_shuffle_X: {p.__name__} =====" in out
    assert "texture2d_load(X_texture" in out and "read_imagef(X_texture, sampler" in out
    assert "addone on pocl cpu: max abs error 0" in out


def test_demo_runs_every_example(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "addone" in out and "nhwc_to_nchwc" in out and "max abs error 0" in out


def test_unknown_example_exits_2(capsys):
    assert main(["example", "nope"]) == 2
    assert "unknown example 'nope'; examples: addone" in capsys.readouterr().err
