"""Check 11's count of what a launch can write (issue 54, item 4: "launch sizes the kernels assume"): the calls
that write a tensor can, with their launches, write at least as many elements (pixels of a texture) as it has.
Both runtimes read, from each kernel's source, an upper bound on the distinct elements each call writes through
each parameter (tuner/artifact/bounds.py ``Source.analyse_writes``, native/src/bounds.c ``tnr_brange.writes``):
per store, the work-items that can reach it (per dimension the launch's, or fewer where a position --
``get_global_id``, ``get_group_id``, ``get_local_id``, or ``get_group_id * local size + get_local_id`` -- is
narrowed by the guards in force there), times the runs of the loops around it, times what it stores, and never
more than the span it addresses; summed over stores and calls. An upper bound can only refuse what cannot
cover the tensor, so no launch the compiler writes is refused -- concats and interleaves written in place by
several calls included (pose, YOLO, ShuffleNet units, U-Net, in buffer and texture plans), where the reverted
exact-launch rule (c821bdd) refused correct artifacts.

Found before the count: of a conv + global-pool model at 13 x 11, the input relayout launched one work-group
short (320 -> 256 work-items) passed both runtimes -- the hull of its writes still reached the tensor's last
byte through ``%`` -- and ran with 120 of the 1,144 elements never written (the output off by 1e21). It is
refused now: its 256 work-items store 4 elements each, 1,024 < 1,144.

What the count cannot catch (it refuses only what is provably impossible): a short launch whose missing
work-items the analysis cannot tell from the ones left -- guards on values derived from the positions through
``/`` or ``%`` (the unpack relayouts of tensors with padded channel blocks store their lanes under
``i1 * 4 + k < C`` with ``i1 = p / 24 % 2``: one work-group short there still counts as enough; a transposed
convolution's phases split by ``/ 2`` and ``% 2``), a sum of two dimensions' positions, a ``const`` named before
the guard that narrows what it was made of, slack in one dimension hiding a shortage in another, a reduction
run by fewer work-items (every output still written); and the writes into a workspace (``w:``), which no
tensor's count covers. Each call one work-group short in each dimension that has more than one, both runtimes
alike: over the 238 artifacts of the test models (texture, buffer and auto, float32 and float16, default
configs) 2,163 of 2,178 refused (1,763 by the hull, 400 by the count), 15 not; over 176 compiled with random
configs (the test models and MobileNetV3-Small) 4,034 of 4,197 (333 by the count), 163 not, 116 of which write
only a workspace. None of the 414 compiler-written artifacts is refused.
"""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from artifact_corpus import _copy, _reseal

pytestmark = [pytest.mark.skipif(shutil.which("make") is None or shutil.which("gcc") is None,
                                 reason="the native runtime is built with make and gcc"),
              pytest.mark.xdist_group("launch_coverage")]  # one worker compiles the artifacts (tests/conftest.py)

SMALLER = "a launch smaller than the kernel was generated for"


@pytest.fixture(scope="module", params=["buffer", "texture"])
def art(request, tmp_path_factory, device):
    """conv 3x3, the input added back, global average pool on a 1x8x13x11 input, compiled with ``scope``: the
    input, read twice, is relaid once (``x.pack``, the kernel of the finding; a convolution that alone reads the
    input reads it in place)."""
    import onnx
    from onnx import TensorProto, helper

    import tuner
    d = tmp_path_factory.mktemp(f"coverage_{request.param}")
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8, 3, 3],
                           np.random.default_rng(0).standard_normal(576).astype(np.float32))
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
                           helper.make_node("Add", ["c", "x"], ["y"], name="res"),
                           helper.make_node("GlobalAveragePool", ["y"], ["z"], name="gap")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 13, 11])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 1, 1])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), d / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = tuner.compile_model(str(d / "m.onnx"), device=device, scope=request.param)
    mod.save(d / "art")
    return d / "art"


CONCATS = ("pose", "yolo", "shufflenet_units", "unet")


@pytest.fixture(scope="module")
def concats(tmp_path_factory, device):
    """The test models with concats and interleaves written in place, compiled in buffer and texture scope for
    this device's profile (nothing built: the checks read the artifacts' launches, and the build took two minutes
    of the suite): {(model, scope): artifact dir}."""
    import tuner
    from tuner.zoo.models import test_models
    d = tmp_path_factory.mktemp("coverage_concats")
    models, out = test_models(), {}
    for name in CONCATS:
        for scope in ("buffer", "texture"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = tuner.compile_model(models[name], target=device.info, scope=scope)
            mod.save(d / f"{name}_{scope}")
            out[name, scope] = d / f"{name}_{scope}"
    return out


def _graph(d: Path) -> dict:
    return json.loads((d / "graph.json").read_text())


def _shorts(art: Path) -> list:
    """(node, call, dimension) for every call and every dimension of more than one work-group."""
    return [(i, j, d) for i, n in enumerate(_graph(art)["nodes"]) for j, c in enumerate(n["calls"])
            for d in range(3) if c["global_size"][d] > c["local_size"][d]]


def _one_short(art: Path, dst: Path, i: int, j: int, d: int) -> Path:
    """A copy of ``art`` with call j of node i launched one work-group short in dimension d, resealed."""
    t = _copy(art, dst)
    g = _graph(t)
    c = g["nodes"][i]["calls"][j]
    c["global_size"][d] -= c["local_size"][d]
    (t / "graph.json").write_text(json.dumps(g, indent=1))
    _reseal(t)
    return t


def _python(d: Path):
    """The Python runtime's refusal of ``d`` (what follows 'graph.json: ', less '; recompile the model'), or None."""
    from tuner.artifact import ArtifactError, read_artifact
    try:
        read_artifact(d)
    except ArtifactError as e:
        msg = str(e)
        assert "graph.json: " in msg and msg.endswith("; recompile the model"), msg
        return msg.split("graph.json: ", 1)[1][:-len("; recompile the model")]
    return None


def _tuner_run(native, cl_env, *args, asan=False):
    return subprocess.run([native["tuner_run_asan" if asan else "tuner_run"], *map(str, args)], capture_output=True,
                          text=True, env=cl_env, timeout=120)


def _native(native, cl_env, d: Path, asan=False):
    """tuner-run --check's refusal of ``d``: its one error line, or None when it passes."""
    r = _tuner_run(native, cl_env, "--check", d, asan=asan)
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    if r.returncode == 0:
        return None
    assert r.returncode == 2 and len(lines) == 1 and "ERROR: AddressSanitizer" not in r.stderr, r.stderr[-2000:]
    return lines[0]


def test_the_compilers_launches_pass(art, native, cl_env):
    assert _python(art) is None
    assert _native(native, cl_env, art) is None
    assert _native(native, cl_env, art, asan=True) is None


def test_every_call_one_work_group_short_is_refused_by_both(art, native, cl_env, tmp_path):
    """The relayout (the finding: caught by the count alone) and the convolution (buffer and texture kernels),
    each one work-group short, refused by both runtimes with the same words (tuner-run under ASan too)."""
    shorts = _shorts(art)
    kernels = {_graph(art)["nodes"][i]["calls"][j]["kernel"] for i, j, _ in shorts}
    assert {"relayout", "conv2d_nchw4c"} <= kernels, kernels
    for i, j, d in shorts:
        t = _one_short(art, tmp_path / f"{i}_{j}_{d}", i, j, d)
        py = _python(t)
        assert py is not None, (i, j, d)
        for asan in (False, True):
            line = _native(native, cl_env, t, asan=asan)
            assert line is not None and py in line, (i, j, d, py, line)
        if (i, j) == (0, 0):  # the input relayout: the hull reaches the last byte, the count does not
            texture = "texture" in str(art)
            want = "at most 256 of its 286 pixels" if texture else "at most 1024 of its 1144 elements"
            assert f"entries['x.packed']: the calls that write it can write {want}" in py and SMALLER in py, py
        shutil.rmtree(t)


def test_the_relayout_one_work_group_short_is_refused_before_it_runs(art, native, cl_env, tmp_path):
    """The finding: the input's relayout launched one work-group short ran in both runtimes, a silent wrong
    result. Now `tuner run` and tuner-run refuse it with one error line and run nothing."""
    from tuner.cli import main
    c = _graph(art)["nodes"][0]["calls"][0]
    assert c["kernel"] == "relayout" and c["global_size"][0] > c["local_size"][0], c
    t = _one_short(art, tmp_path / "short", 0, 0, 0)
    assert main(["run", str(t), "--repeat", "1"]) == 2
    r = _tuner_run(native, cl_env, t, "--bench", 1)
    lines = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
    assert r.returncode == 2 and len(lines) == 1 and SMALLER in lines[0] and r.stdout == "", r.stderr


def test_concats_written_in_place_pass_and_their_short_launches_are_refused(concats, native, tmp_path):
    """Every artifact of the models whose concats and interleaves are written in place passes both runtimes
    (the exact-launch rule refused them), and each call one work-group short in each dimension of more than one
    is refused by both with the same words (of YOLO's 125 calls, those that write a concat in place): several
    of them by the count alone (a convolution writing its part of a concat, a transposed convolution's
    phases)."""
    lib = ctypes.CDLL(str(native["library"]))
    err = ctypes.create_string_buffer(4096)

    def c_check(d: Path):
        rc = lib.tnr_check(str(d).encode(), err, len(err))
        return None if rc == 0 else err.value.decode()

    shared = 0
    counted = set()
    for (name, scope), art in concats.items():
        g = _graph(art)
        writers: dict = {}
        for n in g["nodes"]:
            for c in n["calls"]:
                for ref, s in zip(c["args"], c["signature"]):
                    if s["access"] == "write" and ref.startswith("t:"):
                        writers[ref] = writers.get(ref, 0) + 1
        shared += sum(v > 1 for v in writers.values())
        assert _python(art) is None, (name, scope)
        assert c_check(art) is None, (name, scope, err.value)
        for i, j, d in _shorts(art):
            c = g["nodes"][i]["calls"][j]
            if name == "yolo" and not any(writers.get(ref, 0) > 1 for ref in c["args"]):
                continue
            t = _one_short(art, tmp_path / f"{name}_{scope}_{i}_{j}_{d}", i, j, d)
            py, theirs = _python(t), c_check(t)
            assert py is not None and theirs is not None and py in theirs, (name, scope, i, j, d, py, theirs)
            if SMALLER in py:
                counted.add((name, c["kernel"]))
            shutil.rmtree(t)
    assert shared >= 8, shared  # tensors written in parts by several calls: the concats written in place
    kernels = {k for _, k in counted}
    assert any(k.startswith("conv") for k in kernels) and "relayout" in kernels, counted


# -- the two analyses count alike ---------------------------------------------------------------------------------
class _Range(ctypes.Structure):
    _fields_ = [("has_range", ctypes.c_int), ("lo", ctypes.c_int64), ("hi", ctypes.c_int64),
                ("has_pixels", ctypes.c_int), ("xlo", ctypes.c_int64), ("xhi", ctypes.c_int64),
                ("ylo", ctypes.c_int64), ("yhi", ctypes.c_int64), ("writes", ctypes.c_int64)]


def _c_writes(lib, text: str, kernel: str, glob, local):
    src, line, what = ctypes.c_void_p(), ctypes.c_int(), ctypes.create_string_buffer(600)
    raw = text.encode()
    if lib.tnr_bounds_parse(raw, len(raw), ctypes.byref(src), ctypes.byref(line), what, 600):
        return ("error", line.value)
    try:
        out = (_Range * 16)()
        g, l_ = (ctypes.c_int64 * 3)(*glob), (ctypes.c_int64 * 3)(*local)
        if lib.tnr_bounds_analyse(src, kernel.encode(), g, l_, out, ctypes.byref(line), what, 600):
            return ("error", line.value)
        return ("ok", [r.writes for r in out])
    finally:
        lib.tnr_bounds_free(src)


def _py_writes(text: str, kernel: str, glob, local):
    from tuner.artifact import bounds
    src = bounds.parse_source(text)
    if isinstance(src, bounds.BoundsError):
        return ("error", src.line)
    try:
        writes = src.analyse_writes(kernel, tuple(glob), tuple(local))[2]
    except bounds.BoundsError as e:
        return ("error", e.line)
    return ("ok", [-1 if w is None else w for w in writes] + [0] * (16 - len(writes)))


_K = "__kernel void k(__global float* restrict Y) {\n%s\n}"
# (source, global size, local size, what it can write through its first parameter)
COUNTS = {
    "wraps": (_K % "  const int i = get_global_id(0);\n  Y[i % 100] = 1.0f;", (64, 1, 1), (16, 1, 1), 64),
    "wraps_past_its_span": (_K % "  const int i = get_global_id(0);\n  Y[i % 100] = 1.0f;", (256, 1, 1), (16, 1, 1),
                            100),
    "guard_on_the_call": (_K % "  if (get_global_id(0) < 10) { Y[get_global_id(0) * 2] = 0.0f; }", (64, 1, 1),
                          (16, 1, 1), 10),
    "guard_on_group_and_local": (_K % """  const int g = get_group_id(0);
  const int l = get_local_id(0);
  if (g * 16 + l < 40) { Y[(g * 16 + l) * 3] = 0.0f; }""", (64, 1, 1), (16, 1, 1), 40),
    "a_position_named": (_K % """  const int g = get_group_id(0);
  const int l = get_local_id(0);
  const int p = g * 16 + l;
  const int q = (int)p;
  if (q < 37) { Y[q * 5] = 0.0f; Y[q * 5 % 7 + 200] = 0.0f; }""", (64, 1, 1), (16, 1, 1), 37 + 7),
    "two_dimensions": (_K % """  const int x = get_global_id(0);
  const int y = get_global_id(1);
  if (x < 5 && y < 3) { vstore4((float4)(0.0f), (y * 5 + x) * 7 % 100, Y); }""", (16, 8, 1), (8, 4, 1), 60),
    "loops_around": (_K % """  const int i = get_global_id(0);
  for (int k = 0; k < 3; ++k) { for (int m = k; m <= 4; m++) { vstore2((float2)(0.0f), i * 100 + m * 7 + k, Y); } }""",
                     (8, 1, 1), (8, 1, 1), 8 * 3 * 5 * 2),
    "a_loop_of_unknown_runs": (_K % """  const int i = get_global_id(0);
  for (int k = 0; k < 3; k += 2) { Y[i] = 0.0f; }""", (8, 1, 1), (8, 1, 1), 8),
    "increments": (_K % "  const int i = get_local_id(0);\n  if (i < 3) { Y[i * 9]++; Y[i * 9 + 1] += 1.0f; }",
                   (64, 1, 1), (16, 1, 1), 4 * 3 * 2),
    "an_unnamed_dimension": (_K % "  Y[get_local_id(1) * 100] = 0.0f;", (4, 8, 2), (2, 4, 1), 4 * 8 * 2),
    "images": ("""__kernel void k(__write_only image2d_t Y) {
  const int x = get_global_id(0);
  const int y = get_global_id(1);
  if (x < 5) { write_imagef(Y, (int2)(x % 3, y), (float4)(0.0f)); }
}""", (8, 4, 1), (4, 2, 1), 12),
}


def test_both_runtimes_count_alike(native, art):
    """What each call can write, read by tuner/artifact/bounds.py and native/src/bounds.c alike: the hand-written
    sources above (each at its launch, one work-group short and one more) with the counts they must give, and the
    artifact's own kernels at their launches, one work-group short and one more in each dimension."""
    lib = ctypes.CDLL(str(native["library"]))
    cases = []
    for name, (text, glob, local, want) in COUNTS.items():
        py = _py_writes(text, "k", glob, local)
        assert py[0] == "ok" and py[1][0] == want, (name, py)
        cases += [(name, text, "k", [glob[0] + s * local[0], *glob[1:]], local) for s in (-1, 0, 1)
                  if glob[0] + s * local[0] > 0]
    g = _graph(art)
    for n in g["nodes"]:
        text = (art / "kernels" / n["source"]).read_text()
        for c in n["calls"]:
            for d in range(3):
                for s in (-1, 0, 1):
                    glob = list(c["global_size"])
                    glob[d] += s * c["local_size"][d]
                    if glob[d] > 0:
                        cases.append((n["source"], text, c["kernel"], glob, c["local_size"]))
    for name, text, kernel, glob, local in cases:
        py, c = _py_writes(text, kernel, glob, local), _c_writes(lib, text, kernel, glob, local)
        assert py == c, (name, glob, py, c)
    # the compiler's launches can write as many elements (pixels) as the tensor each call writes has
    for n in g["nodes"]:
        text = (art / "kernels" / n["source"]).read_text()
        for c in n["calls"]:
            ref = c["args"][-1]
            e = g["entries"][ref[2:]]
            need = e["physical_shape"][0] * e["physical_shape"][1] if e["storage_scope"].startswith("texture") \
                else int(np.prod(e["physical_shape"]))
            assert _py_writes(text, c["kernel"], c["global_size"], c["local_size"])[1][len(c["args"]) - 1] >= need
