"""Compiling for a device that is not attached (a target profile), program binaries cached beside the
artifact, the active ``apply_history_best`` context in compile_model, the profile table, pyopencl's
CompilerWarning kept out of builds, and hostile profiles refused with the field named."""
from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
import textwrap
import uuid
import warnings

import numpy as np
import onnx
import pytest

from tuner.cli import main
from tuner.runtime import module as M
from tuner.zoo import models as zoo
from tuner.compile.compiler import compile_model
from tuner.runtime.module import TargetMismatchWarning, load_module
from tuner.plan.types import FIXED
from tuner.runtime.opencl import device as D
from tuner.runtime.opencl import program as P
from tuner.runtime.opencl.device import choose_device, open_device

from test_model import ort_run, rel_err

MODEL = zoo.test_models()["mixed"]


def _profile_file(tmp_path, spec: str):
    info = choose_device(spec, check=False)
    path = tmp_path / f"{info.fingerprint}.json"
    path.write_text(json.dumps(info.to_dict(), indent=2))  # what `tuner devices --json --device D` prints
    return info, path


def _no_devices(monkeypatch):
    """Opening, listing or building on any OpenCL device fails from here on (until monkeypatch undoes it)."""
    import pyopencl as cl

    def fail(*a, **k):
        raise AssertionError("an OpenCL device was touched while compiling for a target")
    monkeypatch.setattr(D, "_enumerate", fail)
    monkeypatch.setattr(cl, "get_platforms", fail)
    monkeypatch.setattr(cl, "Context", fail)
    monkeypatch.setattr(cl, "Program", fail)


def _records_for(mod, info, seed: int = 0):
    """One record per tuned layer of ``mod``: a random valid config (not the fallback) for ``info``."""
    from tuner.logs import SCHEMA_VERSION, Record
    from tuner.templates import get_template
    rng = np.random.default_rng(seed)
    out = []
    for n in mod.spec.nodes:
        if not n.template:
            continue
        t = get_template(n.template)
        wl = t.workload(**{k: v for k, v in n.workload.items() if k != "op"})
        space = t.space(wl, info, **FIXED[n.template], **{f"{k}_scope": v for k, v in n.scopes.items()})
        cfg = dataclasses.asdict(t.make_config(space.sample(rng)))
        out.append(Record(version=SCHEMA_VERSION, template=t.name, workload=n.workload, scopes=n.scopes, config=cfg,
                          device=info.fingerprint, costs=[1e-4], median_s=1e-4, gflops=1.0, error_code=0,
                          error_name="NO_ERROR"))
    return out


def _feeds(mod):
    return {n: np.random.default_rng(1).standard_normal(mod.spec.entries[n].shape).astype(np.float32)
            for n in mod.spec.inputs}


# -- 1. compile for a target that is not attached -----------------------------------------------------------
def test_compile_for_an_unattached_target_then_run_it_there(tmp_path, monkeypatch):
    """Oclgrind's profile, dumped to JSON; the compile opens no device; the artifact loads on Oclgrind, matches
    onnxruntime, and its second start builds from the cached binaries, faster than the first."""
    import pyopencl
    from tuner.logs import append_records
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))  # binaries of this test's own
    info, profile = _profile_file(tmp_path, "oclgrind")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = compile_model(MODEL, target=info)  # plans for the target, to know its layers
    log = str(tmp_path / f"{info.fingerprint}.jsonl")
    recs = _records_for(plain, info)
    append_records(log, recs)
    with monkeypatch.context() as m:
        _no_devices(m)
        mod = compile_model(MODEL, log=log, target=str(profile))
        assert mod.device is None and mod.target == info
        out = tmp_path / "artifact"
        mod.save(out)
    spec = json.loads((out / "graph.json").read_text())
    assert spec["device"]["fingerprint"] == info.fingerprint and spec["device"]["profile"] == info.to_dict()
    tuned = [n for n in mod.spec.nodes if n.template]
    assert tuned and all(n.tuned for n in tuned)  # every layer from the log records of the target's fingerprint
    assert [n.config for n in tuned] == [r.config for r in recs]
    assert not (out / M.BINARIES).exists()  # nothing was built

    import pyopencl.invoker  # noqa: F401  (imported with pyopencl's cache on, as it is outside this test)
    with warnings.catch_warnings(), monkeypatch.context() as m:
        m.setattr(pyopencl, "_PYOPENCL_NO_CACHE", True)  # a real first build, not pyopencl's disk cache
        warnings.simplefilter("error", TargetMismatchWarning)
        first = load_module(out)  # no device named: the attached one with the artifact's fingerprint
    assert first.device.fingerprint == info.fingerprint
    n = first.load_stats["programs"]
    assert first.load_stats["source"] == n and first.load_stats["binary"] == 0
    assert len(list((tmp_path / "cache" / M.BINARIES / info.fingerprint).glob("*.bin"))) == n  # the user's cache
    assert not (out / M.BINARIES).exists()  # never the artifact
    feeds = _feeds(first)
    for o, r in zip(first.run(feeds), ort_run(MODEL, feeds)):
        assert rel_err(o, r) < 1e-4
    second = load_module(out)
    assert second.load_stats["binary"] == n and second.load_stats["source"] == 0
    print(f"\noclgrind, {n} programs: first start {first.load_stats['seconds'] * 1e3:.1f} ms, "
          f"cached start {second.load_stats['seconds'] * 1e3:.1f} ms")
    assert second.load_stats["seconds"] < first.load_stats["seconds"]
    for o, r in zip(second.run(feeds), ort_run(MODEL, feeds)):
        assert rel_err(o, r) < 1e-4


def test_cli_compile_with_a_target_profile(tmp_path, monkeypatch, capsys, device):
    info, profile = _profile_file(tmp_path, device.fingerprint)  # the device under test (PoCL, Intel, ...)
    path = str(tmp_path / "m.onnx")
    onnx.save(MODEL, path)
    with monkeypatch.context() as m:
        _no_devices(m)
        assert main(["compile", path, "--target", str(profile), "-o", str(tmp_path / "a"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert info.fingerprint in out and "nothing built here" in out
    assert json.loads((tmp_path / "a" / "graph.json").read_text())["device"]["profile"] == info.to_dict()
    assert main(["compile", path, "--target", str(tmp_path / "missing.json"), "-o", str(tmp_path / "b")]) == 2
    assert "missing.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**info.to_dict(), "image_support": "yes"}))
    assert main(["compile", path, "--target", str(bad), "-o", str(tmp_path / "b")]) == 2
    assert "image_support" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "a"), "--repeat", "2", "--device", device.fingerprint]) == 0
    assert "built from source" in capsys.readouterr().out


def test_running_on_another_fingerprint_warns_once_naming_both(tmp_path, monkeypatch, device):
    monkeypatch.setattr(M, "_MISMATCH_WARNED", set())
    other = choose_device("oclgrind", check=False)
    assert other.fingerprint != device.fingerprint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_model(MODEL, target=other, scope="buffer").save(tmp_path / "a")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            mod = load_module(tmp_path / "a", device)
            mod.run(_feeds(mod))
    mismatch = [w for w in caught if issubclass(w.category, TargetMismatchWarning)]
    assert len(mismatch) == 1
    assert other.fingerprint in str(mismatch[0].message) and device.fingerprint in str(mismatch[0].message)


# -- 2. program binaries in the user's cache -------------------------------------------------------------------
def test_a_rejected_or_corrupt_binary_is_rebuilt_from_source(tmp_path, device, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_model(MODEL, device=device, scope="buffer").save(tmp_path / "a")
    fresh = lambda: open_device(device.info)  # noqa: E731  (a new context: no in-memory program cache)
    first = load_module(tmp_path / "a", fresh())
    n = first.load_stats["programs"]
    feeds = _feeds(first)
    want = first.run(feeds)
    files = sorted((tmp_path / "cache" / M.BINARIES / device.fingerprint).glob("*.bin"))
    assert len(files) == n
    P._write_binary(files[0], device.fingerprint, files[0].stem, b"not a program binary" * 8)  # driver rejects
    files[1].write_bytes(files[1].read_bytes()[:-100])  # truncated: fails its own check
    again = load_module(tmp_path / "a", fresh())
    assert (again.load_stats["source"], again.load_stats["binary"]) == (2, n - 2)
    assert all(rel_err(a, b) == 0 for a, b in zip(again.run(feeds), want))
    third = load_module(tmp_path / "a", fresh())  # rewritten: every program from its binary again
    assert third.load_stats["binary"] == n
    assert load_module(tmp_path / "a", fresh(), cache=False).load_stats["binary"] == 0


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    from tuner.runtime.module import load_module
    mod = load_module(sys.argv[1], sys.argv[2])
    t1 = time.perf_counter()
    x = [__import__("numpy").zeros(mod.spec.entries[n].shape, "float32") for n in mod.spec.inputs]
    mod.run(x)
    t2 = time.perf_counter()
    print(json.dumps({**mod.load_stats, "load_s": t1 - t0, "first_run_s": t2 - t1}))
""")


def _start(artifact, spec, tmp_path, tag):
    """A fresh process loading the artifact with empty PoCL and pyopencl caches: only ours can help. Ours is a
    folder of this test's (``TUNER_CACHE_DIR``), empty before the first start: the session's, which other tests
    of this worker fill with the same programs (a compile keeps its programs there), would serve the first too."""
    import os
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "tuner-cache"),
           "POCL_CACHE_DIR": str(tmp_path / f"pocl-cache-{tag}"),
           "PYOPENCL_CACHE_DIR": str(tmp_path / f"pyopencl-cache-{tag}"), "PYOPENCL_NO_CACHE": "1"}
    r = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(artifact), spec], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_resnet18_second_start_on_a_cpu_is_faster(tmp_path):
    """ResNet-18 at 32x32 compiled for a CPU device's profile (no device opened: PoCL, or Intel's CPU runtime
    where PoCL cannot build), then started twice in fresh processes with PoCL's and pyopencl's own caches empty:
    the second start builds from our binaries."""
    from conftest import building_cpu

    from tuner.runtime.opencl.device import choose_device
    info = choose_device(building_cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_model(zoo.resnet18(num_classes=10, input_size=32), target=info.to_dict()).save(tmp_path / "a")
    first = _start(tmp_path / "a", info.fingerprint, tmp_path, "1")
    second = _start(tmp_path / "a", info.fingerprint, tmp_path, "2")
    print(f"\nresnet18@32 on {info.fingerprint}, {first['programs']} programs ({first['source']} unique): first start load "
          f"{first['load_s']:.2f} s + first run {first['first_run_s']:.2f} s; cached start load "
          f"{second['load_s']:.2f} s + first run {second['first_run_s']:.2f} s")
    assert first["binary"] == 0 and first["source"] > 0 and second["source"] == 0 and second["binary"] > 0
    assert second["load_s"] + second["first_run_s"] < first["load_s"] + first["first_run_s"]


# -- 3. the active apply_history_best context -------------------------------------------------------------------
def test_compile_model_uses_the_active_history(device):
    from tuner.logs import apply_history_best
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = compile_model(MODEL, device=device, scope="buffer")
    assert not any(n.tuned for n in plain.spec.nodes)
    recs = _records_for(plain, device.info, seed=3)
    with apply_history_best(recs):
        mod = compile_model(MODEL, device=device, scope="buffer")
    tuned = [n for n in mod.spec.nodes if n.template]
    assert tuned and all(n.tuned for n in tuned) and [n.config for n in tuned] == [r.config for r in recs]
    feeds = _feeds(mod)
    assert rel_err(mod.run(feeds)[0], ort_run(MODEL, feeds)[0]) < 1e-4


# -- 4. the profile table and profile.json -----------------------------------------------------------------------
def _columns_aligned(table: str, cells: list, right: set) -> None:
    """Each row's cells start (left-aligned) or end (right-aligned) where the header's words do."""
    lines = table.splitlines()[:-1]  # the last line is the total
    cols = [(m.start(), m.end()) for m in re.finditer(r"\S+", lines[0])]
    assert len(lines) == len(cells) + 1
    for line, row in zip(lines[1:], cells):
        assert len(row) == len(cols)
        for (start, end), value in zip(cols, row):
            if value == "" and start >= len(line):  # a glue kernel's config, the last column: the line ends
                continue
            if right and (start, end) in [cols[k] for k in right]:
                assert line[:end].endswith(value) and (end == len(line) or line[end] == " "), (line, value)
            else:
                assert line[start:].startswith(value) and (start == 0 or line[start - 1] == " "), (line, value)


def test_profile_table_is_aligned_and_labels_storage(device, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = compile_model(MODEL, device=device, scope="texture")
    prof = mod.profile(2)
    storage = {r["node"]: r["storage"] for r in prof["rows"]}
    for n in mod.spec.nodes:
        if n.template:
            want = "texture" if set(n.scopes.values()) == {"texture"} else "buffer" if set(
                n.scopes.values()) == {"buffer"} else "mixed"
            assert storage[n.name] == want
    first = mod.spec.nodes[0]  # the model input's relayout, or the convolution that reads it in place (io_views)
    assert storage[first.name] == "mixed" and (first.op == "relayout" or first.workload.get("op") == "conv2d")
    assert {"texture", "mixed"} <= set(storage.values())
    long = dict(prof["rows"][1], node="a/very/long/node/name/that/is/wider/than/the/column",
                scopes="i=texture,w=texture,o=texture", storage="texture")
    prof = {**prof, "rows": prof["rows"] + [long]}
    from tuner.cli.model import print_profile
    buf = io.StringIO()
    print_profile(prof, file=buf)
    table = buf.getvalue()
    assert "a/very/long/node/name/that/is/wider/than/the/column" in table and " storage " in table
    cells = [(r["node"], r["op"], r["storage"], r["scopes"], f"{r['median_s'] * 1e3:.3f}",
              f"{r['gflops']:.3g}" if r["gflops"] else "-",
              ("tuned" if r["tuned"] else "fallback") if r["template"] else "") for r in prof["rows"]]
    _columns_aligned(table, cells, right={4, 5})


def test_run_profile_writes_storage_labels(tmp_path, device, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_model(MODEL, device=device, scope="buffer").save(tmp_path / "a")
    assert main(["run", str(tmp_path / "a"), "--repeat", "2", "--profile", "--device", device.fingerprint]) == 0
    from tuner.artifact.cache import profile_path
    prof = json.loads(profile_path(tmp_path / "a").read_text())  # in the user's cache, not the artifact
    assert {r["storage"] for r in prof["rows"]} == {"buffer"} and not (tmp_path / "a" / "profile.json").exists()
    assert all(r["scopes"] == "i=buffer,w=buffer,o=buffer" for r in prof["rows"] if r["template"])


# -- 5. pyopencl's CompilerWarning ---------------------------------------------------------------------------------
def test_builds_do_not_emit_pyopencl_compiler_warnings(device):
    import pyopencl as cl
    src = f"// {uuid.uuid4()}\n#warning the compiler says something\n__kernel void k(__global float *a) {{ a[0] = 1; }}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        P.build_program(device, src)
    assert not [w for w in caught if issubclass(w.category, cl.CompilerWarning)]
    with pytest.raises(Exception) as e:  # the build log still comes with a failure
        P.build_program(device, src.replace("a[0] = 1;", "a[0] = undefined_name;"))
    assert "undefined_name" in e.value.log


# -- 6. hostile device profiles --------------------------------------------------------------------------------------
# A phone GPU's profile, as `tuner devices --json` writes it (no fingerprint: then none is checked).
PHONE = {"index": 0, "platform": "ARM Platform", "name": "Mali-G78", "type": "GPU", "driver_version": "v1.r32p1",
         "opencl_version": "OpenCL 3.0 v1.r32p1", "image_support": True, "image2d_max_width": 65536,
         "image2d_max_height": 65536, "max_work_group_size": 512, "max_work_item_sizes": [512, 512, 512],
         "local_mem_bytes": 32768, "global_mem_bytes": 7 << 30, "max_mem_alloc_bytes": 1 << 30, "compute_units": 20,
         "fp16": True, "half_images": True}
HINT = "tuner devices --json --device D"

# (field named in the error, the profile's changes, what the error shows of the value)
HOSTILE = [
    ("max_work_group_size", {"max_work_group_size": 0}, "is 0"),  # was a ZeroDivisionError
    ("max_work_item_sizes", {"max_work_item_sizes": []}, "[]"),  # was an IndexError
    ("max_work_item_sizes", {"max_work_item_sizes": [512, 0, 512]}, "[1] = 0"),
    ("max_work_item_sizes", {"max_work_item_sizes": [512, 512]}, "[512, 512]"),
    ("image2d_max_width", {"image2d_max_width": 10 ** 12}, "1000000000000"),
    ("image2d_max_height", {"image2d_max_height": 1e12}, "1000000000000.0"),  # JSON 1e12 is a float
    ("image2d_max_width", {"image2d_max_width": 0}, "is 0"),  # with image_support true
    ("image2d_max_height", {"image2d_max_height": -8192}, "-8192"),
    ("compute_units", {"compute_units": -1}, "-1"),
    ("global_mem_bytes", {"global_mem_bytes": -1}, "-1"),
    ("local_mem_bytes", {"local_mem_bytes": -1}, "-1"),
    ("max_mem_alloc_bytes", {"max_mem_alloc_bytes": 16}, "16"),
    ("max_mem_alloc_bytes", {"max_mem_alloc_bytes": 8 << 30}, "more than 'global_mem_bytes'"),
    ("half_images", {"image_support": False, "image2d_max_width": 0, "image2d_max_height": 0}, "image_support"),
    ("fp16", {"fp16": 1}, "got 1"),
    ("type", {"type": "QPU"}, "'QPU'"),
    ("name", {"name": "x" * 100_000}, "xxx..."),
    ("name", {"name": "Mali\x1b[2J"}, "printable"),
    ("index", {"index": -1}, "-1"),
]


@pytest.mark.parametrize("field,changes,shown", HOSTILE,
                         ids=[f"{f}={list(c.values())[0]!r:.20}" for f, c, _ in HOSTILE])
def test_a_hostile_profile_is_refused_naming_the_field(field, changes, shown, tmp_path, capsys):
    """Each of these was accepted (or crashed) and planned into an artifact that fails on the device; now the
    profile, as a dict or as a file given to `tuner compile --target`, is refused naming field, value and fix."""
    from tuner.errors import TunerError
    from tuner.target import load_profile
    bad = {**PHONE, **changes}
    with pytest.raises(TunerError) as e:
        load_profile(bad)
    assert repr(field) in str(e.value) and shown in str(e.value) and HINT in str(e.value), str(e.value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    model = tmp_path / "m.onnx"
    onnx.save(MODEL, str(model))
    assert main(["compile", str(model), "--target", str(path), "-o", str(tmp_path / "a"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: target profile") and str(path) in err and repr(field) in err and HINT in err, err
    assert len(err) < 1000 and not (tmp_path / "a" / "graph.json").exists()


def test_plausible_profiles_load():
    """The ranges let real devices through: the phone, a CUSTOM device with no local memory, a device without
    images, and every attached device (test_devices checks those)."""
    from tuner.target import load_profile
    assert load_profile(PHONE).name == "Mali-G78"
    assert load_profile({**PHONE, "type": "CUSTOM", "local_mem_bytes": 0}).local_mem_bytes == 0
    assert not load_profile({**PHONE, "image_support": False, "half_images": False, "image2d_max_width": 0,
                             "image2d_max_height": 0}).image_support


def _cli(*args, tmp_path, timeout=120):
    """`python -m tuner ...` in a fresh process, as a user runs it; a hang is a failure after ``timeout``."""
    import os
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_target_that_is_not_a_regular_file_is_refused_not_read(tmp_path):
    """/dev/zero (read forever before), a FIFO with no writer (opened forever before), a directory and a huge
    file: `tuner compile --target` exits 2 with one line naming the path, no traceback, no hang."""
    import os
    model = tmp_path / "m.onnx"
    onnx.save(MODEL, str(model))
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    (tmp_path / "profile.d").mkdir()
    huge = tmp_path / "huge.json"
    huge.write_text(" " * (2 << 20) + json.dumps(PHONE))
    for target, what in (("/dev/zero", "a character device"), (str(fifo), "a FIFO"), (str(tmp_path / "profile.d"),
                         "a directory"), (str(huge), "larger than 1 MiB")):
        r = _cli("compile", str(model), "--target", target, "-o", str(tmp_path / "a"), "--no-progress",
                 tmp_path=tmp_path)
        assert r.returncode == 2, (target, r.stdout, r.stderr)
        assert r.stderr.startswith(f"error: target profile {target!r} is {what}"), r.stderr
        assert "Traceback" not in r.stderr and HINT in r.stderr, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**PHONE, "max_work_group_size": 0}))
    r = _cli("compile", str(model), "--target", str(bad), "-o", str(tmp_path / "a"), tmp_path=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "'max_work_group_size' is 0" in r.stderr, r.stderr


def test_profile_files_that_are_not_profiles(tmp_path):
    from tuner.errors import TunerError
    from tuner.target import load_profile
    cases = {"deep.json": "[" * 100_000, "binary.json": b"\xff\xfe\x00{", "list.json": json.dumps([PHONE, PHONE]),
             "number.json": "42"}
    for name, text in cases.items():
        p = tmp_path / name
        p.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(TunerError, match=re.escape(repr(str(p)))):
            load_profile(p)
    with pytest.raises(TunerError, match="'compute_units' is a number too long to print"):  # not int()'s ValueError
        load_profile({**PHONE, "compute_units": 10 ** 5000})
