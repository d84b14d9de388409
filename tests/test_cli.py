"""CLI tests: the real entry points against the real PoCL device."""

import json
import re
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
    assert "pocl" in r.stdout and "pocl-cpu-" in r.stdout and "status" in r.stdout
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
    assert main(["devices", "--json", "--device", "pocl"]) == 0  # one device: its profile, usable or not
    d = json.loads(capsys.readouterr().out)
    assert d["fingerprint"].startswith("pocl-cpu-") and d["half_images"] in (True, False)
    assert d["usable"] in (True, False) and (d["unusable_reason"] is None) == d["usable"]


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
    assert main(["example", "addone", "--show-passes"]) == 0
    out = capsys.readouterr().out
    for p in PASSES:
        assert f"===== addone: {p.__name__} =====" in out
        assert f"===== addone_shuffle_X: {p.__name__} =====" in out
    assert "texture2d_load(X_texture" in out and "read_imagef(X_texture, sampler" in out
    assert re.search(r"addone on \w+ \w+: max abs error 0", out)


def test_unknown_example_exits_2(capsys):
    assert main(["example", "nope"]) == 2
    assert "unknown example 'nope'; examples: addone" in capsys.readouterr().err


def test_op_check_and_time_every_template(capsys):
    for argv in (["conv2d", "--data", "1,5,9,8", "--kernel", "6,5,3,3", "--padding", "1", "--bias",
                  "--activation", "relu6"],
                 ["depthwise_conv2d", "--data", "2,6,8,8", "--kernel", "6,1,3,3", "--stride", "2",
                  "--padding", "1,0,1,1", "--dtype", "float16", "--residual"],
                 ["dense", "--data", "1,37", "--weight", "10,37", "--bias"],
                 ["winograd2", "--data", "1,5,9,8", "--kernel", "6,5,3,3", "--padding", "1", "--residual"],
                 ["winograd4", "--data", "2,5,9,7", "--kernel", "6,5,3,3", "--padding", "0,1", "--dtype", "float16",
                  "--activation", "relu"]):
        assert main(["op", *argv, "--check", "--time", "--repeats", "2"]) == 0
        out = capsys.readouterr().out
        assert "check: max relative error" in out and out.rstrip().endswith("GFLOP/s")
        assert " ok" in out


def test_op_json_config_and_source(capsys):
    argv = ["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,8,1,1", "--scope", "texture", "--config",
            '{"tile_oc": 2, "tile_ow": 2, "wg_w": 2}', "--check", "--json", "--show-source"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "read_imagef(X, sampler" in out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["config"]["tile_oc"] == 2 and result["config"]["input_scope"] == "texture"
    assert result["max_rel_error"] < 1e-4 and result["workload"]["op"] == "conv2d"


@pytest.mark.parametrize("argv, message", [
    (["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,8,3,3", "--config", '{"tile_ow": 3}'],
     "tile_ow: 3 not in [1, 2, 4, 8]"),
    (["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,8,3,3", "--config", '{"tile_ow": 8}'],
     "tile_ow_fits: tile_ow <= OW"),
    (["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,8,3,3", "--config", '{"tiles": 8}'],
     "unknown knob 'tiles'"),
    (["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,8,3,3", "--config", "{bad"], "--config is not valid JSON"),
    (["op", "conv2d", "--data", "1,8,6,6", "--kernel", "8,4,3,3"], "with groups=1 wants C and O divisible by groups"),
    (["op", "conv2d", "--data", "1,8,x,6", "--kernel", "8,8,3,3"], "--data must be comma-separated integers"),
    (["op", "conv2d", "--data", "1,8,2,2", "--kernel", "8,8,3,3"], "output (1, 8, 0, 0) is empty"),
    (["op", "depthwise_conv2d", "--data", "1,8,6,6", "--kernel", "8,2,3,3"], "kernel 8,1,R,S"),
    (["op", "winograd4", "--data", "1,8,6,6", "--kernel", "8,8,5,5"], "winograd4 computes 3x3 convolutions"),
    (["op", "winograd2", "--data", "1,8,6,6", "--kernel", "8,8,3,3", "--stride", "2"], "winograd2 takes no --stride"),
    (["op", "dense", "--data", "1,64"], "dense needs --weight M,K"),
    (["op", "dense", "--data", "1,64", "--weight", "10,32"], "the same K"),
    (["space", "conv2d", "--file", "missing.toml"], "no search space"),
])
def test_op_and_space_errors_exit_2_naming_the_problem(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_space_reports_knobs_constraints_and_size(capsys):
    assert main(["space", "depthwise_conv2d", "--data", "1,32,56,56", "--kernel", "32,1,3,3", "--padding", "1",
                 "--scope", "buffer"]) == 0
    out = capsys.readouterr().out
    assert "tile_cb" in out and "work_group" in out and "unconstrained size:" in out
    valid = int(out.rsplit(":", 1)[1].replace(",", ""))
    assert 0 < valid < int(out.split("unconstrained size:")[1].split()[0].replace(",", ""))


def test_zoo_help_names_every_zoo_model():
    from tuner.cli.model import ZOO_NAMES
    from tuner.zoo.models import ZOO
    assert sorted(ZOO_NAMES.replace(" or ", ", ").split(", ")) == sorted(ZOO)
