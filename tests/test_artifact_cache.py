"""Issue 57, item 3: running an artifact never writes into it. Profiles, program binaries and plan timings go to the
user's cache (``tuner.artifact.cache``), keyed by the artifact's manifest hash and the programs' sources; the
programs ``tuner compile`` built are there, so the first run of either runtime builds none."""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.artifact import cache

pytestmark = pytest.mark.xdist_group("artifact_cache")


def _tree(d: Path) -> dict:
    """Every path under ``d`` with its mode, size, mtime and content hash: what "unchanged" means."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        out[str(p.relative_to(d))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def _chmod_tree(d: Path, writable: bool) -> None:
    for p in [d, *d.rglob("*")] if os.geteuid() != 0 else []:
        mode = p.stat().st_mode
        p.chmod(mode | stat.S_IWUSR if writable else mode & ~0o222)


@pytest.fixture
def env(cl_env, tmp_path):
    return {**cl_env, cache.CACHE_ENV: str(tmp_path / "cache")}


def _tuner(env, *args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_read_only_artifact_runs_and_profiles_under_both_runtimes_with_the_compiles_programs(
        native, env, tmp_path, monkeypatch):
    import onnx

    from tuner.zoo.models import test_models
    onnx.save(test_models()["mixed"], tmp_path / "m.onnx")
    r = _tuner(env, "compile", "m.onnx", "-o", "art", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    art = tmp_path / "art"
    before = _tree(art)
    # read-only (root writes through chmod a-w: there, the tree compared at the end is what catches a write)
    _chmod_tree(art, writable=False)
    try:
        # the Python executor: every program from the binaries the compile left in the cache, the profile there
        r = _tuner(env, "run", art, "--profile", "--repeat", "3", cwd=tmp_path)
        assert r.returncode == 0 and "cannot write" not in r.stderr and "no cache" not in r.stderr, r.stderr
        m = re.search(r"(\d+) programs, (\d+) from cached binaries, (\d+) built from source", r.stdout)
        programs, cached, built = map(int, m.groups())
        assert programs > 5 and (cached, built) == (programs, 0), r.stdout
        monkeypatch.setenv(cache.CACHE_ENV, env[cache.CACHE_ENV])
        where = cache.profile_path(art)
        manifest = hashlib.sha256((art / "manifest.json").read_bytes()).hexdigest()
        assert where == tmp_path / "cache" / "artifacts" / manifest / "profile.json"
        assert f"profile written to {where}" in r.stdout
        assert {row["node"] for row in json.loads(where.read_text())["rows"]} and cache.find_profile(art) == where
        assert where.parent.stat().st_mode & 0o077 == 0  # the cache's folders are the user's alone
        # tuner-run: its own binary format, also left by the compile
        r = subprocess.run([native["tuner_run"], str(art), "--bench", "3", "--profile"], env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        m = re.search(r"(\d+) programs from cached binaries, (\d+) built from source", r.stdout)
        assert tuple(map(int, m.groups())) == (programs, 0), r.stdout
        assert "kernels" in r.stdout  # the profile table
    finally:
        _chmod_tree(art, writable=True)
    assert _tree(art) == before  # not a byte, mode or time changed: no binaries/, no profile.json


def test_binaries_an_artifact_carries_are_never_read(device, tmp_path, monkeypatch):
    """A ``binaries/`` folder inside the artifact (an older tuner's cache, or one planted by whoever can write the
    artifact: tests/test_hostile_round3.py plants swapped programs) is ignored by every run, verified or not:
    binaries come only from the user's cache. Here it holds the right binaries, and none is read."""
    import numpy as np

    from tuner.compile.compiler import compile_model
    from tuner.runtime.module import load_module
    from tuner.runtime.opencl.program import clear_program_cache
    from tuner.zoo.models import test_models
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    mod = compile_model(test_models()["mixed"], device=device, scope="buffer")
    art = Path(mod.save(tmp_path / "art"))
    assert not (art / "binaries").exists()
    import shutil
    shutil.copytree(tmp_path / "cache" / "binaries", art / "binaries")  # good binaries of every program, 0700/0600
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "empty"))
    clear_program_cache()
    x = np.random.default_rng(0).standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    again = load_module(art, device=device)
    assert again.load_stats["binary"] == 0 and again.load_stats["source"] == again.load_stats["programs"]
    np.testing.assert_allclose(again.run([x])[0], mod.run([x])[0], rtol=1e-6, atol=1e-6)


def test_the_cache_folder_is_resolved_as_tuner_run_resolves_it(monkeypatch, tmp_path):
    for var in (cache.CACHE_ENV, "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)
    assert cache.cache_root() is None
    monkeypatch.setenv("HOME", "/h")
    assert cache.cache_root() == Path("/h/.cache/tuner")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # only an absolute path counts, as in native/src/runtime.c
    assert cache.cache_root() == Path("/h/.cache/tuner")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert cache.cache_root() == Path("/x/tuner")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    assert cache.cache_root() == tmp_path and cache.binaries_dir() == tmp_path / "binaries"


def test_a_profile_is_found_in_the_cache_or_where_an_older_tuner_wrote_it(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    art = tmp_path / "art"
    art.mkdir()
    (art / "manifest.json").write_text('{"format": "tuner-artifact"}')
    assert cache.find_profile(art) is None
    (art / "profile.json").write_text("{}")  # an older tuner's, inside the artifact
    assert cache.find_profile(art) == art / "profile.json"
    written = cache.write_profile(art, {"rows": []})
    assert cache.find_profile(art) == written == cache.profile_path(art)
    assert written.stat().st_mode & 0o077 == 0 and not list(written.parent.glob(".*tmp"))
    (art / "manifest.json").write_text('{"format": "tuner-artifact", "files": []}')  # another artifact: its own
    assert cache.profile_path(art) != written
    with pytest.raises(Exception, match="manifest.json: no such file"):
        cache.profile_path(tmp_path)


def test_the_native_device_key_is_tuner_runs(native, env, tmp_path, device):
    """``native_device_key`` names the folder tuner-run keeps a device's binaries in (what compile writes into)."""
    import onnx

    from tuner.zoo.models import test_models
    onnx.save(test_models()["mixed"], tmp_path / "m.onnx")
    from tuner.compile.compiler import compile_model
    art = Path(compile_model(str(tmp_path / "m.onnx"), device=device, scope="buffer",
                             measure_plans=False).save(tmp_path / "art"))
    r = subprocess.run([native["tuner_run"], str(art), "--device", device.fingerprint, "--bench", "1"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = device.info
    folders = {p.name for p in (tmp_path / "cache" / "binaries").iterdir()}
    assert cache.native_device_key(info.platform, info.name, info.driver_version) in folders, folders
