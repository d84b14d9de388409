"""Installed like a library (issue 39): the wheel built from this tree, installed (not editable) in a fresh venv
that sees the dependencies but not this checkout, serves from a folder outside any checkout: ``tuner native
build`` makes the native programs from the sources the wheel carries (tuner/native_src) in the user's cache,
``tuner compile --plan-timer native`` compiles a model with no log, and the built ``tuner-run`` runs the artifact
after the README's ``tuner native env`` line, with onnxruntime's result."""
from __future__ import annotations

import importlib.util
import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                reason="the native runtime is built with make and gcc")


def _sources(dest: Path) -> Path:
    """The files the wheel is built from, copied (a build writes build/ and *.egg-info beside them: not into the
    shared checkout): pyproject.toml, the readme, tuner/ and every folder package-dir maps into the package."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = {"tuner", *conf["tool"]["setuptools"].get("package-dir", {}).values()}
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in sorted(folders):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", conf["project"]["readme"]):
        shutil.copy2(ROOT / name, dest / name)
    return dest


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.mark.slow
def test_the_installed_wheel_builds_and_runs_the_native_runtime(tmp_path):
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None:
        pytest.skip("this setuptools builds no wheel by itself: pip install 'setuptools>=70.1' (the test extra)")
    # the wheel, with this environment's setuptools: nothing fetched
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", _sources(tmp_path / "src"), "--no-deps", "--no-build-isolation",
          "--no-index", "-q", "-w", dist])
    (wheel,) = dist.glob("tuner-*.whl")

    # a venv that sees this one's packages through a .pth line (whose folder's own .pth files, the editable
    # tuner's finder among them, are not read) and holds the wheel's tuner, which comes first on sys.path
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    purelib = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "deps.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel])

    cwd = tmp_path / "work"  # outside any checkout
    cwd.mkdir()
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TUNER_OPENCL_LIB", "PYOPENCL_HOME", "VIRTUAL_ENV")}
    # the build folder's cache is this test's; PoCL's kernel cache stays the user's (shared safely, and warm)
    env["POCL_CACHE_DIR"] = os.environ.get("POCL_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pocl")
    env["XDG_CACHE_HOME"] = str(cache)
    tuner = venv / "bin" / "tuner"

    def run(*cmd, **kw):
        return _run(cmd, cwd=cwd, env=env, **kw)

    where = run(py, "-c", "import sys, tuner, tuner.native as n; n.opencl_env(); "
                          "print(tuner.__file__, n.NATIVE, 'pyopencl' in sys.modules, sep='\\n')").stdout.split("\n")
    assert Path(where[0]).is_relative_to(purelib), where  # the installed copy, not this checkout's
    assert Path(where[1]) == purelib / "tuner" / "native_src", where
    assert where[2] == "False"  # the native environment finds pyopencl's loader without importing it

    r = run(tuner, "native", "build")
    lines = dict(reversed(line.split(" ", 1)) for line in r.stdout.split("\n") if line)
    assert sorted(lines.values()) == ["agent", "agent", "runtime", "runtime", "runtime"], r.stdout
    built = cache / "tuner" / "native"
    assert all(Path(p).is_relative_to(built) and os.access(p, os.X_OK) for p in lines), r.stdout
    tuner_run = next(p for p in lines if p.endswith("/tuner-run") and "/asan/" not in p)

    import onnx

    from tuner.zoo.models import test_models
    model = cwd / "se.onnx"
    onnx.save(test_models()["squeeze_excitation"], model)
    r = run(tuner, "compile", model, "--plan-timer", "native", "-o", "art", "--no-progress")
    assert "warning: --plan-timer native: no log holds records for this device, so --scope auto timed no plans" \
        in r.stderr, r.stderr
    assert (cwd / "art" / "manifest.json").is_file()

    import onnxruntime as ort
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    shape = [d if isinstance(d, int) else 1 for d in s.get_inputs()[0].shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.save(cwd / "x.npy", x)
    # the README's line, as a user types it
    r = run("bash", "-c", f"eval \"$('{tuner}' native env | sed 's/^/export /')\" && "
                          f"exec '{tuner_run}' art --input x.npy --output y.npy --bench 1 --warmup 0")
    assert "median latency" in r.stdout, r.stdout
    want = s.run(None, {s.get_inputs()[0].name: x})[0]
    y = np.load(cwd / "y.npy")
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_the_build_folder_is_a_writable_checkouts_else_the_users_cache(tmp_path, monkeypatch):
    """build/native in a source checkout this user can write (as `make -C native`); else, and in an installed
    tuner, $XDG_CACHE_HOME/tuner/native/<version>-<hash of the sources>; else the same under the temp folder,
    made this user's own (each new level 0700). ``tuner.native.BUILD`` is the same folder."""
    import tempfile

    import tuner
    import tuner.native as native
    assert native.NATIVE == ROOT / "native" and native.CHECKOUT
    assert native.default_build_dir() == ROOT / "build" / "native" == native.BUILD
    key = Path("tuner", "native", f"{tuner.__version__}-{native._source_hash()[:12]}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "CHECKOUT", False)  # an installed tuner
    assert native.default_build_dir() == tmp_path / "cache" / key == native.BUILD
    monkeypatch.setattr(native, "CHECKOUT", True)
    monkeypatch.setattr(native, "_writable", lambda path: False)  # neither the checkout nor the cache
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    fallback = tmp_path / "tmp" / f"tuner-cache-{os.getuid()}" / key
    assert native.default_build_dir() == fallback and fallback.is_dir()
    assert all(p.stat().st_mode & 0o777 == 0o700 for p in (fallback, *fallback.parents) if p.is_relative_to(
        tmp_path / "tmp" / f"tuner-cache-{os.getuid()}"))
