"""The native runtime (native/, C): built once per session with the system gcc, run as tuner-run on artifacts
compiled here, compared with onnxruntime and the Python executor, under AddressSanitizer + UBSan, and against
the damaged-artifact corpus (tests/artifact_corpus.py)."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from artifact_corpus import damaged_artifacts
from conftest import building_cpu

ROOT = Path(__file__).resolve().parent.parent
SUPPRESSIONS = ROOT / "native" / "asan" / "lsan.supp"

pytestmark = [pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                 reason="the native runtime is built with make and gcc"),
              pytest.mark.xdist_group("native_runtime")]  # one worker compiles the artifacts (tests/conftest.py)




def _tuner_run(native, cl_env, *args, asan=False, env=None, timeout=600):
    exe = native["tuner_run_asan" if asan else "tuner_run"]
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env or cl_env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    out = {}
    import onnx
    from tuner.zoo.models import test_models, write_model
    for name in ("mobilenet_v3_small", "resnet18"):  # what `tuner zoo NAME -o ... --input-size 32` writes
        out[name] = Path(write_model(name, d / f"{name}.onnx", input_size=32))
    out["norms"] = d / "norms.onnx"  # the reduction templates' split programs: two kernels and a workspace
    onnx.save(test_models()["norms"], out["norms"])
    out["shufflenet_units"] = d / "shufflenet_units.onnx"  # concats written in place, gathers in the weights
    onnx.save(test_models()["shufflenet_units"], out["shufflenet_units"])
    out["poolformer_block"] = d / "poolformer_block.onnx"  # a binary kernel with a scale and a residual
    onnx.save(test_models()["poolformer_block"], out["poolformer_block"])
    out["pads_into_convs"] = d / "pads_into_convs.onnx"  # reflection and edge Pads read in place by convolutions
    onnx.save(test_models()["pads_into_convs"], out["pads_into_convs"])
    return out


# (model, device, scope, dtype): the artifacts compiled once per module.
CPU = building_cpu()  # PoCL, or Intel's CPU runtime where PoCL cannot build (AMD Zen 5)
ARTIFACTS = {
    "mnv3-cpu-texture-f32": ("mobilenet_v3_small", CPU, "texture", "float32"),  # PoCL where it builds
    "mnv3-intel-buffer-f16": ("mobilenet_v3_small", "intel", "buffer", "float16"),
    "resnet18-intel-auto-f32": ("resnet18", "intel", "auto", "float32"),
    "norms-cpu-buffer-f32": ("norms", CPU, "buffer", "float32"),
    "shufflenet-cpu-texture-f32": ("shufflenet_units", CPU, "texture", "float32"),
    "poolformer-cpu-buffer-f32": ("poolformer_block", CPU, "buffer", "float32"),
    "pads-cpu-texture-f32": ("pads_into_convs", CPU, "texture", "float32"),
}


@pytest.fixture(scope="module")
def artifacts(models, tmp_path_factory):
    import tuner
    d = tmp_path_factory.mktemp("artifacts")
    out = {}
    for key, (model, device, scope, dtype) in ARTIFACTS.items():
        m = tuner.compile_model(str(models[model]), device=device, scope=scope, dtype=dtype, keep=True)
        out[key] = Path(m.save(d / key))
    return out


def _input(artifact: Path) -> np.ndarray:
    import json
    g = json.loads((artifact / "graph.json").read_text())
    shape = g["entries"][g["inputs"][0]]["shape"]
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _onnx(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("key", list(ARTIFACTS))
def test_matches_onnxruntime_and_python(native, cl_env, models, artifacts, key, tmp_path):
    model, device, _, dtype = ARTIFACTS[key]
    art = artifacts[key]
    x = _input(art)
    np.save(tmp_path / "x.npy", x)
    r = _tuner_run(native, cl_env, art, "--device", device, "--input", tmp_path / "x.npy", "--output",
                   tmp_path / "y.npy", "--bench", 3, "--warmup", 1)
    assert r.returncode == 0, r.stderr
    assert "median latency" in r.stdout
    y = np.load(tmp_path / "y.npy")
    want = _onnx(models[model], x)
    assert y.shape == want.shape and y.dtype == np.float32
    assert _rel(y, want) < (1e-4 if dtype == "float32" else 1e-2)
    from tuner.runtime.module import load_module
    py = load_module(art, device=device).run([x])[0]
    assert _rel(y, py) < (1e-5 if dtype == "float32" else 1e-3)
    # the second start builds nothing: every program comes from the binary cache
    r = _tuner_run(native, cl_env, art, "--device", device, "--input", tmp_path / "x.npy", "--bench", 1)
    assert r.returncode == 0, r.stderr
    assert " 0 built from source" in r.stdout, r.stdout


@pytest.mark.parametrize("key", ["mnv3-cpu-texture-f32", "mnv3-intel-buffer-f16"])
def test_pinned_staging_gives_the_same_output(native, cl_env, artifacts, key, tmp_path):
    """Inputs and outputs are staged in pinned host memory (CL_MEM_ALLOC_HOST_PTR, mapped once) where the driver
    offers it, and the run says how many; TUNER_RUN_PINNED=0 stages them in ordinary memory. Both give the same
    bytes, under ASan too (the mapped stages are unmapped before the queue goes)."""
    art, device = artifacts[key], ARTIFACTS[key][1]
    np.save(tmp_path / "x.npy", _input(art))
    outs = {}
    for pinned, asan in (("1", False), ("0", False), ("1", True)):
        env = {**cl_env, "TUNER_RUN_PINNED": pinned}
        if asan:
            env.update(ASAN_OPTIONS="detect_leaks=1", LSAN_OPTIONS=f"suppressions={SUPPRESSIONS}")
        y = tmp_path / f"y{pinned}{asan}.npy"
        r = _tuner_run(native, env, art, "--device", device, "--input", tmp_path / "x.npy", "--output", y,
                       "--bench", 2, asan=asan)
        assert r.returncode == 0, r.stderr
        staged = re.search(r"(\d+) of (\d+) inputs and outputs staged in pinned memory", r.stdout)
        assert staged, r.stdout
        assert staged.group(2) == "2" and staged.group(1) == ("2" if pinned == "1" else "0"), r.stdout
        outs[pinned, asan] = np.load(y)
    assert np.array_equal(outs["1", False], outs["0", False]) and np.array_equal(outs["1", False], outs["1", True])


def test_profile_table(native, cl_env, artifacts):
    r = _tuner_run(native, cl_env, artifacts["mnv3-cpu-texture-f32"], "--device", CPU, "--profile", "--bench", 2)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("node "))
    assert lines[head].split()[:3] == ["node", "op", "storage"]
    assert lines[-1].startswith("kernels ") and "end to end" in lines[-1]
    assert len(lines) - head - 2 > 40  # one row per node (46 after the squeeze-excite and boundary fusions)


def test_asan_clean(native, cl_env, models, artifacts, tmp_path):
    """One model under AddressSanitizer + UBSan with LeakSanitizer on PoCL (no suppressions needed there), and on
    Intel's CPU runtime with the leaks inside libintelocl.so suppressed (native/asan/lsan.supp); then float16
    storage and a second model, their outputs checked against onnxruntime."""
    art = artifacts["mnv3-cpu-texture-f32"]
    x = _input(art)
    np.save(tmp_path / "x.npy", x)
    env = dict(cl_env, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=23", UBSAN_OPTIONS="halt_on_error=1")
    if CPU != "pocl":  # Intel's runtime leaks inside libintelocl.so
        env["LSAN_OPTIONS"] = f"suppressions={SUPPRESSIONS}"
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--input", tmp_path / "x.npy", "--output",
                   tmp_path / "y.npy", "--bench", 2, "--profile", asan=True, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr
    env["LSAN_OPTIONS"] = f"suppressions={SUPPRESSIONS}"
    r = _tuner_run(native, cl_env, art, "--device", "intel", "--input", tmp_path / "x.npy", "--bench", 1, asan=True,
                   env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    for key in ("mnv3-intel-buffer-f16", "resnet18-intel-auto-f32", "shufflenet-cpu-texture-f32",
                "poolformer-cpu-buffer-f32"):
        model, device, _, dtype = ARTIFACTS[key]
        x = _input(artifacts[key])
        np.save(tmp_path / "x.npy", x)
        r = _tuner_run(native, cl_env, artifacts[key], "--device", device, "--input", tmp_path / "x.npy", "--output",
                       tmp_path / "y.npy", "--bench", 1, asan=True, env=env)
        assert r.returncode == 0, (key, r.stderr[-4000:])
        assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, key
        assert _rel(np.load(tmp_path / "y.npy"), _onnx(models[model], x)) < (1e-4 if dtype == "float32" else 1e-2), key
    # the damaged corpus under ASan too: refusals free what they allocated
    for case, d, _ in damaged_artifacts(art, tmp_path)[:6]:
        r = _tuner_run(native, cl_env, d, "--device", CPU, asan=True, env=env)
        assert r.returncode == 2, (case, r.stderr[-2000:])


def test_damaged_artifacts_refused(native, cl_env, artifacts, tmp_path):
    cases = damaged_artifacts(artifacts["mnv3-cpu-texture-f32"], tmp_path)
    assert {"truncated_kernel", "swapped_params", "edited_graph", "missing_kernel", "planted_global_size",
            "empty_outputs"} <= {c for c, _, _ in cases}
    for case, d, name in cases:
        r = _tuner_run(native, cl_env, d, "--device", CPU)
        assert r.returncode == 2, (case, r.stdout, r.stderr)
        assert r.stderr.startswith("error: ") and name in r.stderr, (case, r.stderr)
        assert r.stdout == "", case  # refused before anything was loaded


def test_an_output_whose_pool_a_later_kernel_reuses_is_refused(native, cl_env, artifacts, tmp_path):
    """Issue 36: ``outputs`` edited to name the input, whose pool a later kernel writes (a buffer plan), and the
    manifest resealed: check 10 refuses it instead of returning another tensor's data."""
    d = next(d for c, d, _ in damaged_artifacts(artifacts["norms-cpu-buffer-f32"], tmp_path) if c == "output_overwritten")
    r = _tuner_run(native, cl_env, d, "--device", CPU)
    assert r.returncode == 2 and "is overwritten" in r.stderr and r.stdout == "", r.stderr


def test_cli_errors(native, cl_env, artifacts, tmp_path):
    art = artifacts["mnv3-cpu-texture-f32"]
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 8, 8), np.float32))
    for args, words in (([], "no artifact"), ([art, "--device", "no-such-device"], "no OpenCL device matches"),
                        ([art, "--device", CPU, "--input", tmp_path / "bad.npy"], "has shape [1, 3, 8, 8]"),
                        ([art, "--bench", "0"], "--bench"), ([tmp_path / "nothing"], "not a compiled model"),
                        ([art, "--frobnicate"], "unknown option")):
        r = _tuner_run(native, cl_env, *args)
        assert r.returncode == 2 and r.stderr.count("error: ") == 1 and words in r.stderr, (args, r.stderr)
    r = _tuner_run(native, cl_env, "--devices")
    assert r.returncode == 0 and "pocl-cpu-" in r.stdout


def test_device_order_matches_python(native, cl_env):
    from tuner.runtime.opencl.device import list_devices
    r = _tuner_run(native, cl_env, "--devices")
    assert r.returncode == 0, r.stderr
    native_fps = [line.split("\t")[4] for line in r.stdout.splitlines()]
    assert native_fps == [d.fingerprint for d in list_devices()]


def test_half_conversion_matches_numpy(native):
    lib = ctypes.CDLL(native["library"])
    lib.tnr_half_to_float.restype = ctypes.c_float
    lib.tnr_half_to_float.argtypes = [ctypes.c_uint16]
    halves = np.arange(65536, dtype=np.uint16)
    got = np.empty(65536, np.float32)
    lib.tnr_halves_to_floats(halves.ctypes.data_as(ctypes.c_void_p), got.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_size_t(65536))
    want = halves.view(np.float16).astype(np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all()
    rng = np.random.default_rng(0)
    pos = want[:0x7C00].astype(np.float64)  # the finite positive halves, ascending
    mid = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)  # ties: round to even
    xs = np.concatenate([(rng.standard_normal(200000) * 10.0 ** rng.integers(-9, 6, 200000)).astype(np.float32),
                         want[np.isfinite(want)], mid, -mid,
                         np.array([65504, 65519.99, 65520, 1e9, -1e9, 2.0 ** -25, 2.0 ** -24 * 1.5, 0.0, -0.0,
                                   np.inf, -np.inf], np.float32)]).astype(np.float32)
    out = np.empty(len(xs), np.uint16)
    lib.tnr_floats_to_halves(xs.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_size_t(len(xs)))
    with np.errstate(over="ignore"):
        ref = xs.astype(np.float16).view(np.uint16)
    bad = np.flatnonzero(out != ref)
    assert bad.size == 0, [(float(xs[i]), hex(out[i]), hex(ref[i])) for i in bad[:5]]


def test_build_products(native):
    for key in ("library", "tuner_run", "tuner_run_asan"):
        assert os.access(native[key], os.X_OK) or key == "library"
    deps = subprocess.run(["ldd", native["tuner_run"]], capture_output=True, text=True).stdout
    assert "libOpenCL" not in deps  # loaded with dlopen at run time
    from tuner.cli.programs import native_main
    assert native_main(["build"]) == 0


def test_refused_binary_is_rebuilt(native, cl_env, artifacts, tmp_path):
    """A cached binary the driver refuses (a well-formed cache file holding garbage) is rebuilt from source and
    rewritten; a cache file that does not check out (truncated) is ignored the same way."""
    from artifact_corpus import _copy
    art = _copy(artifacts["mnv3-cpu-texture-f32"], tmp_path / "art")
    cl_env = {**cl_env, "TUNER_CACHE_DIR": str(tmp_path / "cache")}  # the user's cache: this test's own
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--bench", 1)
    assert r.returncode == 0, r.stderr
    bins = sorted((tmp_path / "cache" / "binaries").glob("*/*.bin"))
    assert len(bins) > 10
    import hashlib
    garbage = b"\x7fELF not a program binary" * 40
    tag = f"{bins[0].parent.name}/{bins[0].stem}"  # the program the file is for
    head = f"tuner-native-clbin 2\n{len(garbage)} {hashlib.sha256(garbage).hexdigest()} {tag}\n".encode()
    bins[0].write_bytes(head + garbage)
    bins[1].write_bytes(bins[1].read_bytes()[:100])
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--bench", 1)
    assert r.returncode == 0, r.stderr
    import re
    cached, built = map(int, re.search(r"(\d+) programs from cached binaries, (\d+) built from source", r.stdout).groups())
    assert 2 <= built < 10 and cached > 10, r.stdout  # (sources with the same text share one cache file)
    assert garbage not in bins[0].read_bytes()


def test_a_binary_planted_under_another_programs_name_is_refused(native, cl_env, models, artifacts, tmp_path):
    """A cached binary of one kernel saved under another kernel's name was loaded: the kernel computed what the
    planted binary computes. Each cache file now names its program (the device folder and the source's hash), so
    the copy is refused and rebuilt from source, and the output is right; files that others can write are not
    read either."""
    import re
    from artifact_corpus import _copy
    art = _copy(artifacts["shufflenet-cpu-texture-f32"], tmp_path / "art")
    x = _input(art)
    np.save(tmp_path / "x.npy", x)
    cl_env = {**cl_env, "TUNER_CACHE_DIR": str(tmp_path / "cache")}  # the user's cache: this test's own
    assert _tuner_run(native, cl_env, art, "--device", CPU, "--bench", 1).returncode == 0
    bins = sorted((tmp_path / "cache" / "binaries").glob("*/*.bin"))
    assert len(bins) > 4 and all(p.stat().st_mode & 0o077 == 0 for p in bins)
    assert (tmp_path / "cache" / "binaries").stat().st_mode & 0o077 == 0  # folders 0700, files 0600
    for dst in bins[1:]:  # every program's cache file holds the first program's binary
        shutil.copyfile(bins[0], dst)
    bins[0].chmod(0o666)  # and the first one is writable by anyone
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--input", tmp_path / "x.npy", "--output",
                   tmp_path / "y.npy", "--bench", 1)
    assert r.returncode == 0, r.stderr
    cached, built = map(int, re.search(r"(\d+) programs from cached binaries, (\d+) built from source", r.stdout).groups())
    assert built == len(bins), r.stdout  # each file rebuilt once (programs of the same text then share it)
    assert _rel(np.load(tmp_path / "y.npy"), _onnx(models["shufflenet_units"], x)) < 1e-4


def test_tuner_run_runtime_native(native, artifacts, tmp_path, capsys):
    """`tuner run --runtime native` runs the artifact through tuner-run: same output as the Python executor."""
    from tuner.cli import main
    from tuner.runtime.module import load_module
    art = artifacts["mnv3-cpu-texture-f32"]
    x = _input(art)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(art), "--runtime", "native", "--device", CPU, "--input", f"input={tmp_path / 'x.npy'}",
                 "--output", str(tmp_path / "y.npy"), "--bench", "2"]) == 0
    want = load_module(art, device=CPU).run([x])[0]
    assert _rel(np.load(tmp_path / "y.npy"), want) < 1e-5


def _jni_include() -> Path | None:
    homes = [os.environ.get("JAVA_HOME", "")] + sorted(str(p) for p in Path("/usr/lib/jvm").glob("*"))
    for home in homes:
        if home and (Path(home) / "include" / "jni.h").is_file():
            return Path(home) / "include"
    return None


def test_jni_example_builds(native, tmp_path):
    """The JNI snippet of docs/android-app.md (native/examples/jni/tuner_jni.c) compiles warning-free against a
    JDK's jni.h and links against the runtime library, exporting the three methods the Java class declares."""
    inc = _jni_include()
    if inc is None:
        pytest.skip("no JDK headers (jni.h) here")
    lib = Path(native["library"])
    out = tmp_path / "libtuner_jni.so"
    r = subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                        f"-I{inc}", f"-I{inc / 'linux'}", f"-I{ROOT / 'native' / 'include'}",
                        str(ROOT / "native" / "examples" / "jni" / "tuner_jni.c"), f"-L{lib.parent}",
                        "-ltuner_runtime", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    syms = subprocess.run(["nm", "-D", "--defined-only", str(out)], capture_output=True, text=True).stdout
    for name in ("open", "run", "close"):
        assert f"Java_com_example_tuner_TunedModel_{name}" in syms


def test_signed_artifacts_verify_in_both_runtimes(native, cl_env, models, artifacts, tmp_path, capsys):
    """`tuner compile --sign KEY` writes an HMAC-SHA256 of manifest.json; `tuner run --verify KEY` and `tuner-run
    --verify KEY` refuse an unsigned artifact, another key, and weights rescaled with the manifest resealed (which
    pass every check without --verify: a hash proves integrity, the key proves who made it)."""
    import json

    from artifact_corpus import _reseal
    from tuner.cli import main
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_bytes(os.urandom(32))
    other.write_bytes(os.urandom(32))
    art = tmp_path / "signed"
    assert main(["compile", str(models["poolformer_block"]), "-o", str(art), "--device", CPU, "--scope", "buffer",
                 "--sign", str(key), "--no-progress"]) == 0
    assert "(signed)" in capsys.readouterr().out
    assert (art / "signature").read_text().startswith("hmac-sha256:")

    def both(k, where, expect):
        code = main(["run", str(where), "--device", CPU, "--verify", str(k), "--repeat", "1"])
        err = capsys.readouterr().err
        r = _tuner_run(native, cl_env, where, "--device", CPU, "--verify", k, "--bench", "1")
        if expect is None:
            assert code == 0 and r.returncode == 0, (err, r.stderr)
        else:
            assert code == 2 and expect in err, err
            assert r.returncode != 0 and expect in r.stderr, r.stderr

    both(key, art, None)
    both(other, art, "does not match")
    unsigned = artifacts["norms-cpu-buffer-f32"]
    both(key, unsigned, "is not signed")
    short = tmp_path / "short"
    short.write_bytes(b"0123")
    both(short, art, "under 16 bytes")
    # rescaled weights, manifest resealed: the checks pass, the signature does not
    bad = tmp_path / "rescaled"
    shutil.copytree(art, bad, ignore=shutil.ignore_patterns("binaries"))
    blob = next(p for p in json.loads((bad / "manifest.json").read_text())["files"] if p["path"].startswith("params"))
    w = np.fromfile(bad / blob["path"], np.float32)
    (w * 2).astype(np.float32).tofile(bad / blob["path"])
    _reseal(bad)
    assert _tuner_run(native, cl_env, "--check", bad).returncode == 0
    both(key, bad, "changed after it was signed")


def test_profile_prints_the_config_source_the_artifact_records(native, cl_env, conv3x3_onnx, device, tmp_path,
                                                               capsys):
    """Issue 39: a layer whose config came from a sibling GPU's records is not labelled "fallback": both
    runtimes' --profile print config_source as the artifact records it."""
    import dataclasses
    import json
    import warnings

    import tuner
    from tuner.cli import main
    from tuner.compile.compiler import model_tasks
    from tuner.logs.record import Record
    model = conv3x3_onnx(16)
    a = dataclasses.replace(device.info, name="Family X200", max_work_group_size=1024)
    b = dataclasses.replace(device.info, name="Family X100", max_work_group_size=64)
    task = next(t for t in model_tasks(model, b, scope="buffer") if t.template == "conv2d")
    cfg = task.tmpl.fallback_with(task.workload, b, **task.knobs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SiblingConfigWarning: said here on purpose
        mod = tuner.compile_model(model, log=[Record.new(task.template, task.workload, cfg, a, costs=[1e-4])],
                                  target=b.to_dict(), scope="buffer", transfer_from=[a.fingerprint])
    want = f"sibling {a.fingerprint}"
    assert [n.config_source for n in mod.spec.nodes if n.template] == [want]
    art = Path(mod.save(tmp_path / "art"))
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--profile", "--bench", 1)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(line for line in lines if line.startswith("node "))
    assert head.split()[-1] == "config" and "fallback" not in r.stdout
    row = next(line for line in lines if line.startswith("conv "))
    assert row.endswith("  " + want), row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TargetMismatchWarning: compiled for b, run here
        assert main(["run", str(art), "--device", CPU, "--profile", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("conv ") and line.endswith("  " + want) for line in out.splitlines()), out
    assert "fallback" not in out
    from tuner.artifact.cache import profile_path
    assert [r["config_source"] for r in json.loads(profile_path(art).read_text())["rows"]
            if r["template"]] == [want]


@pytest.fixture
def conv_artifact(conv3x3_onnx, tmp_path):
    """A one-convolution artifact for PoCL (or the CPU runtime that builds here), fallback configs."""
    import warnings

    import tuner
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FallbackConfigWarning
        return Path(tuner.compile_model(conv3x3_onnx(8), device=CPU, scope="buffer", keep=True).save(tmp_path / "conv"))


def _default_opencl_paths() -> list:
    """tcl_default_paths of native/src/opencl.c, in order."""
    src = (ROOT / "native" / "src" / "opencl.c").read_text()
    return re.findall(r'"([^"]+)"', src.split("tcl_default_paths[] = {", 1)[1].split("NULL}", 1)[0])


def test_no_opencl_library_names_what_was_tried_and_the_fix(native, conv_artifact, tmp_path):
    """Issue 39: on a host whose OpenCL comes from Python wheels, tuner-run started without `tuner native env`
    found no library and said so in Android's paths only. One error, exit status 2: every path tried with
    dlopen's reason, TUNER_OPENCL_LIB, and the line that sets it up."""
    import ctypes
    try:
        ctypes.CDLL("libOpenCL.so.1")
        pytest.skip("a system OpenCL loader is installed: tuner-run finds it without TUNER_OPENCL_LIB")
    except OSError:
        pass
    paths = _default_opencl_paths()
    assert paths[0] == "libOpenCL.so.1" and "/system/lib/libOpenCL.so" in paths
    missing = tmp_path / "no" / "libOpenCL.so.1"
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for env, first in ((base, "$TUNER_OPENCL_LIB: not set"),
                       ({**base, "TUNER_OPENCL_LIB": str(missing)}, f"$TUNER_OPENCL_LIB={missing}: cannot open")):
        for args, asan in (([conv_artifact, "--bench", 1], False), (["--devices"], False),
                           ([conv_artifact, "--bench", 1], True)):
            r = _tuner_run(native, None, *args, env=env, asan=asan)
            err = r.stderr
            assert r.returncode == 2 and r.stdout == "" and err.count("error: ") == 1, (args, err)
            assert err.startswith("error: no OpenCL library could be loaded; tried:\n  " + first), err
            for path in paths:
                assert f"\n  {path}: cannot open shared object file" in err, (path, err)
            assert err.rstrip().endswith("""eval "$(tuner native env | sed 's/^/export /')\"""") and \
                "set TUNER_OPENCL_LIB to" in err, err
            assert "ERROR: AddressSanitizer" not in err


def test_the_agent_without_opencl_names_what_was_tried(native, tmp_path):
    """The agent shares the loader: `exec://` with a TUNER_OPENCL_LIB that names nothing reports one error with
    the paths tried and the fix, not the Android hint (an agent built for Android gives its own)."""
    missing = tmp_path / "libOpenCL.so.1"
    r = subprocess.run([sys.executable, "-m", "tuner", "devices", "--device", f"exec://{native['agent']}"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "TUNER_OPENCL_LIB": str(missing)})
    err = r.stderr
    assert r.returncode == 2 and err.count("error: ") == 1 and "Traceback" not in err, err
    assert "the agent found no OpenCL device: no OpenCL library could be loaded; tried:" in err, err
    assert f"$TUNER_OPENCL_LIB={missing}: cannot open shared object file" in err and "tuner native env" in err
    assert "on Android set" not in err


def test_every_output_in_the_models_shape(native, cl_env, device, tmp_path):
    """A detection head's 3-D boxes and scores, a 5-D grid and a 1-D vector: tuner-run writes each output in the
    model's own shape (--outputs DIR, --output NAME=Y.npy), the head under ASan too, equal to onnxruntime's."""
    import tuner
    from test_model_io import MODELS, _ort
    for name in ("ssd_head", "grid_5d_1d"):
        model = MODELS[name]
        art = Path(tuner.compile_model(model, device=CPU, scope="texture", keep=True).save(tmp_path / name))
        x = np.random.default_rng(2).standard_normal((1, 8, *((8, 8) if name == "ssd_head" else (6, 5))))
        np.save(tmp_path / "x.npy", x.astype(np.float32))
        want = _ort(model, {"input": x.astype(np.float32)})
        first = next(iter(want))
        for asan in (False, True) if name == "ssd_head" else (False,):
            out = tmp_path / f"{name}_{asan}"
            env = dict(cl_env, ASAN_OPTIONS="detect_leaks=1:exitcode=23", LSAN_OPTIONS=f"suppressions={SUPPRESSIONS}")
            r = _tuner_run(native, cl_env, art, "--device", CPU, "--input", tmp_path / "x.npy", "--outputs", out,
                           "--output", f"{first}={tmp_path / 'first.npy'}", "--bench", 1, asan=asan, env=env)
            assert r.returncode == 0, r.stderr[-3000:]
            assert f"wrote {tmp_path / 'first.npy'} {list(want[first].shape)} (output '{first}', 1 of {len(want)})" \
                in r.stdout
            for t, ref in want.items():
                got = np.load(tmp_path / "first.npy" if t == first else out / f"{t}.npy")
                assert got.shape == ref.shape and _rel(got, ref) < 1e-4, (name, t)
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--output", "a.npy", "--output", "b.npy", "--bench", 1)
    assert r.returncode == 2 and "--output a.npy does not name an output of the model" in r.stderr


def test_outputs_files_are_named_as_the_python_side_names_them(native, cl_env, tmp_path):
    """tuner-run --outputs and tuner run --outputs give each output the same file (per UTF-8 byte, 200 at most),
    and an output name with a control character reaches the terminal escaped."""
    import tuner
    from test_model_io import OUTPUT_FILE_NAMES, _model, _node, _w
    from tuner.cli.model import output_file_name
    names = [n for n in OUTPUT_FILE_NAMES if n] + ["red\x1b[31m"]
    nodes = [_node("Conv", ["input", "w"], "c", pads=[1, 1, 1, 1])]
    nodes += [_node("Mul", ["c", f"k{i}"], name) for i, name in enumerate(names)]
    inits = [("w", _w(4, 3, 3, 3))] + [(f"k{i}", np.float32(i + 1)) for i in range(len(names))]
    from onnx import TensorProto
    model = _model(nodes, inits, [("input", (1, 3, 5, 5))], [(n, TensorProto.FLOAT) for n in names])
    art = Path(tuner.compile_model(model, device=CPU, scope="buffer", keep=True).save(tmp_path / "a"))
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--outputs", tmp_path / "deep" / "er", "--bench", 1)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "(output 'red\\x1b[31m'" in r.stdout
    first = np.load(tmp_path / "deep" / "er" / output_file_name(names[0]))
    for i, name in enumerate(names):
        got = np.load(tmp_path / "deep" / "er" / output_file_name(name))
        assert np.allclose(got, first * (i + 1), rtol=1e-6), name
    r = _tuner_run(native, cl_env, art, "--device", CPU, "--output", "typo=y.npy", "--bench", 1)
    assert r.returncode == 2 and "--output typo=y.npy: the model has no output of that name" in r.stderr
