"""Choosing a device that works: the build probe, $TUNER_DEVICE / $PYOPENCL_CTX, bundled runtimes' ICD
registration, and device profiles (checked in tuner.target). PoCL's failure on CPUs its LLVM does not know
(AMD Zen 5) is reproduced with a real PoCL build failure: POCL_EXTRA_BUILD_FLAGS with a CPU no LLVM knows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner import TunerError
from tuner.runtime.opencl import device as devmod
from tuner.runtime.opencl.device import DeviceInfo, choose_device, list_devices, probe_device
from tuner.runtime.opencl.icd import bundled_libraries

ROOT = Path(__file__).resolve().parents[1]
BROKEN_POCL = {"POCL_EXTRA_BUILD_FLAGS": "-mcpu=no-such-cpu", "POCL_KERNEL_CACHE": "0"}


def tuner(*args, env=None, tmp_path, timeout=300):
    e = {k: v for k, v in os.environ.items() if k not in ("TUNER_DEVICE", "PYOPENCL_CTX")}
    e.update({"XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=tmp_path, env=e, capture_output=True,
                          text=True, timeout=timeout)


def usable_cpus():
    return [d for d in list_devices() if d.type == "CPU" and d.platform_tag != "pocl" and probe_device(d) is None]


def test_probe_passes_on_the_test_device(device):
    assert probe_device(device.info) is None


def test_pocl_that_cannot_build_is_never_the_default_and_devices_says_why(tmp_path):
    r = tuner("devices", env=BROKEN_POCL, tmp_path=tmp_path)
    if not usable_cpus() and not any(d.type == "GPU" and not d.is_simulator for d in list_devices()):
        assert r.returncode == 0 and "no default device" in r.stderr
        return
    assert r.returncode == 0, r.stderr
    pocl_rows = [ln for ln in r.stdout.splitlines() if " pocl " in ln]
    assert pocl_rows and all(not ln.startswith("*") and "no build" in ln for ln in pocl_rows), r.stdout
    assert "is never the default: it cannot build OpenCL programs: " in r.stdout
    assert "no-such-cpu" in r.stdout  # the compiler's own reason

    r = tuner("op", "conv2d", "--data", "1,4,6,6", "--kernel", "4,4,3,3", "--check", "-d", "pocl",
              env=BROKEN_POCL, tmp_path=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: device 'pocl'") and "cannot build OpenCL programs" in r.stderr


def test_probe_answer_is_cached_per_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    info = choose_device("pocl", check=False)
    key = devmod._probe_key(info)
    (tmp_path / "tuner").mkdir()
    (tmp_path / "tuner" / "probe.json").write_text(json.dumps({key: {"ok": False, "reason": "cached no"}}))
    devmod._probe.cache_clear()
    try:
        assert probe_device(info) == "cached no"  # no build: the cached answer
        with pytest.raises(TunerError, match="cached no"):
            choose_device(info.fingerprint)
        assert choose_device(info.fingerprint, check=False) == info
    finally:
        devmod._probe.cache_clear()


@pytest.mark.parametrize("var", ["TUNER_DEVICE", "PYOPENCL_CTX"])
def test_environment_sets_the_default_device(tmp_path, var):
    target = next((d for d in list_devices() if not d.is_simulator and probe_device(d) is None), None)
    assert target is not None
    platforms = list(dict.fromkeys(d.platform for d in list_devices()))
    same = [d for d in list_devices() if d.platform == target.platform]
    spec = target.fingerprint if var == "TUNER_DEVICE" else f"{platforms.index(target.platform)}:{same.index(target)}"
    r = tuner("devices", "--json", env={var: spec}, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    [default] = [d for d in json.loads(r.stdout) if d["default"]]
    assert default["fingerprint"] == target.fingerprint

    r = tuner("devices", env={var: "no-such-device"}, tmp_path=tmp_path)
    assert r.returncode == 0 and f"${var}" in r.stderr  # the table still lists what there is
    r = tuner("example", "addone", env={var: "no-such-device"}, tmp_path=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"error: ${var}") and "Traceback" not in r.stderr


def test_api_default_follows_tuner_device(monkeypatch):
    target = [d for d in list_devices() if not d.is_simulator and probe_device(d) is None][-1]
    monkeypatch.setenv("TUNER_DEVICE", str(target.index))
    assert choose_device() == target


@pytest.mark.skipif(not bundled_libraries(), reason="Intel's CPU runtime (tuner[cpu]) is not installed")
def test_bundled_runtime_registered_beside_existing_vendors(tmp_path):
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "other.icd").write_text("/opt/other/libOther.so\n")
    code = ("import os, tuner.runtime.opencl.device as d; v = os.environ['OCL_ICD_VENDORS']; "
            "print(v); print(sorted(os.listdir(v))); print([x.platform_tag for x in d.list_devices()])")
    e = {**os.environ, "OCL_ICD_VENDORS": str(vendors), "XDG_CACHE_HOME": str(tmp_path / "c"),
         "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()
    d = Path(out[0])
    assert d != vendors and (d / "other.icd").read_text() == "/opt/other/libOther.so\n"  # kept, not replaced
    assert any("libintelocl" in (d / f).read_text() for f in os.listdir(d))
    assert "intel" in out[2] and "pocl" in out[2]


def test_device_profile_round_trip_and_validation(device):
    d = device.info.to_dict()
    assert DeviceInfo.from_dict(json.loads(json.dumps(d))) == device.info
    with pytest.raises(TunerError, match="lacks 'image2d_max_width'"):
        DeviceInfo.from_dict({k: v for k, v in d.items() if k != "image2d_max_width"})
    with pytest.raises(TunerError, match="'fp16' must be bool"):
        DeviceInfo.from_dict({**d, "fp16": "yes"})
    with pytest.raises(TunerError, match="does not match"):
        DeviceInfo.from_dict({**d, "name": "other"})
    with pytest.raises(TunerError, match="'max_work_group_size' is 0"):  # ranges are checked before the fingerprint
        DeviceInfo.from_dict({**d, "max_work_group_size": 0})


def test_every_attached_device_passes_the_profile_ranges():
    """tuner.target's plausible ranges let through what real drivers report (the profile of each device here
    loads, and DeviceInfo is the same class under its old name)."""
    from tuner.target import DeviceInfo as TargetInfo
    from tuner.target import check_profile
    assert TargetInfo is DeviceInfo
    for info in list_devices():
        check_profile(info)
        assert DeviceInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@pytest.mark.slow
def test_demo_runs_where_pocl_cannot_build(tmp_path):
    """make demo on a host whose PoCL cannot compile: it runs on the CPU device that can."""
    if not usable_cpus():
        pytest.skip("no other CPU OpenCL runtime here (install tuner[cpu])")
    # one plan (--scope buffer): what this checks is the device choice; test_model's demo covers --scope auto
    r = tuner("demo", "--dir", str(tmp_path / "demo"), "--trials", "8", "--input-size", "32", "--scope", "buffer",
              env=BROKEN_POCL, tmp_path=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pocl-cpu-" not in r.stdout.splitlines()[0]  # "device ... (intel-cpu-...)"


@pytest.mark.skipif(not bundled_libraries(), reason="Intel's CPU runtime (tuner[cpu]) is not installed")
def test_the_bundled_runtime_is_found_from_the_package_metadata_too(tmp_path, monkeypatch):
    """Outside a venv's lib/ (a user or system install, or Python run with -S) the library is found through the
    package's file list: the library itself, not the gdb helper's bytecode beside it, which also starts with
    libintelocl.so (it was registered as an OpenCL vendor library, and Intel's runtime went missing)."""
    import sys
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # no lib/libintelocl.so here
    (lib,) = bundled_libraries()
    assert lib.name.startswith("libintelocl.so") and not lib.name.endswith((".py", ".pyc")) and lib.is_file()
