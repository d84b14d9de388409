"""bench/mnn.py and bench/peers.py without a device: MNN's mode names, the source patch, benchmark.out's output
read (a fake benchmark.out), a run that fell back to MNN's CPU backend, and the tables from a peers.json."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import mnn  # noqa: E402
import peers  # noqa: E402


def sh(cmd, env=None, timeout=None, quiet=False):
    p = subprocess.run(list(map(str, cmd)), env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_mode_names():
    assert mnn.mode_name(132) == "wide tuning, image"
    assert mnn.mode_name(68) == "wide tuning, buffer"
    assert mnn.mode_name(130) == "heavy tuning, image"
    assert mnn.mode_name(65) == "none tuning, buffer"


def test_patch_any_device(tmp_path):
    p = tmp_path / "source/backend/opencl/core/runtime/OpenCLRuntime.cpp"
    p.parent.mkdir(parents=True)
    p.write_text("x;\n        res = platforms[platformId].getDevices(CL_DEVICE_TYPE_GPU, &gpuDevices);\ny;\n")
    assert mnn.patch_any_device(tmp_path)
    text = p.read_text()
    assert 'getenv("MNN_OPENCL_ANY_DEVICE") ? CL_DEVICE_TYPE_ALL : CL_DEVICE_TYPE_GPU' in text
    assert mnn.patch_any_device(tmp_path)  # idempotent
    assert p.read_text() == text
    q = tmp_path / "other"
    (q / p.relative_to(tmp_path)).parent.mkdir(parents=True)
    (q / p.relative_to(tmp_path)).write_text("no such line\n")
    assert not mnn.patch_any_device(q)  # another MNN: said, not guessed


def fake_exe(tmp_path, body: str) -> Path:
    exe = tmp_path / "benchmark.out"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return exe


def test_bench_reads_the_mean(tmp_path):
    exe = fake_exe(tmp_path, 'echo "[ - ] m.mnn                max =    1.793 ms  min =    1.638 ms  avg =    1.718 ms"\n')
    got = mnn.bench(sh, exe, tmp_path, 50, 10, 132, None)
    assert got["mean_s"] == pytest.approx(1.718e-3) and got["min_s"] == pytest.approx(1.638e-3)


def test_bench_cpu_fallback_is_an_error(tmp_path):
    exe = fake_exe(tmp_path, "echo \"Can't Find type=3 backend, use 0 instead\"\n"
                             'echo "[ - ] m.mnn                max =   13.857 ms  min =   11.040 ms  avg =   12.598 ms"\n')
    got = mnn.bench(sh, exe, tmp_path, 5, 1, 132, None)
    assert "mean_s" not in got and "CPU" in got["error"]


def test_bench_crash_is_named(tmp_path):
    exe = fake_exe(tmp_path, 'echo "PLEASE submit a bug report to x"; kill -SEGV $$\n')
    got = mnn.bench(sh, exe, tmp_path, 5, 1, 129, None)
    assert "compiler crashed" in got["error"]


def test_tables(tmp_path):
    meta = {"device": {"name": "Dev", "platform": "P", "driver_version": "1", "fingerprint": "p-cpu-1"},
            "input_size": 64, "rounds": 2, "repeats": 5, "warmup": 1, "started_utc": "now", "log": "L",
            "transfer_from": "", "host_cpus": 2, "loadavg_start": [1, 1, 1]}
    model = {"ours": {"compile_says": "compiled m for Dev (p-cpu-1): 26 kernels, 3 of 21 tuned layers from the log, "
                                      "18 fallback"},
             "native": {"rounds": [{"s": 0.002, "rel_err": 1e-6}, {"s": 0.004}]},
             "mnn": {"rounds": [{"modes": {"68": {"mean_s": 0.006}, "132": {"error": "exit -11"}}},
                                {"modes": {"68": {"mean_s": 0.010}, "132": {"error": "exit -11"}}}]},
             "ort": {"rounds": [{"s": 0.0015, "provider": "CPUExecutionProvider"}, {"s": 0.0015}]}}
    result = {"runs": {"cpu": {"meta": meta, "models": {"resnet18": model}}}}
    rows = peers.table_rows(result)
    r = rows[0]
    assert r["native_s"] == pytest.approx(0.003)  # median of the rounds
    assert r["mnn_s"] == pytest.approx(0.008) and r["mnn_mode"] == "68"
    assert r["mnn_over_native"] == pytest.approx(8 / 3)
    assert r["ort_over_native"] == pytest.approx(0.5)
    assert "exit -11" in r["errors"]  # the mode that never ran is reported
    (tmp_path / "peers.json").write_text(json.dumps(result))
    peers.write_tables(result, tmp_path)
    md = (tmp_path / "peers.md").read_text()
    assert "| resnet18 | 3.000 |" in md and "**2.67**" in md and "wide tuning, buffer" in md
    assert (tmp_path / "peers.csv").read_text().startswith("tag,model,")
