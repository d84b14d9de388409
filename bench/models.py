"""Model-coverage benchmark (issue 14): which real ONNX models compile, match onnxruntime, and how fast they run.

    python bench/models.py [--models-dir /tmp/tv_models] [--device D] [--variants texture,buffer,auto,buffer:float16]
                           [--repeats N] [--log PATH|none] [--models REGEX] [--timeout S] [--out DIR]
                           [--zoo resnet18,mobilenet_v2,mobilenet_v3_small] [--zoo-size 64] [--asan] [--tag T]
    python bench/models.py --variants native:texture,native:buffer,native:auto,native:buffer:float16 ...

The models come from ``bench/export_torchvision.py`` (torchvision architectures, random weights, written with a
separate torch virtualenv; the project itself never needs torch). For every ``*.onnx`` in the folder:

- **operators**: the ONNX operators the model uses, and those the frontend has no handler for
  (``tuner.frontend.onnx.SUPPORTED_OPS``; column "no handler"), so one row shows what may be missing, not
  only the first failure; an operator of a shape subgraph folded to constants (Shape, Gather) needs none;
- **frontend**: ``load_graph`` (ONNX -> graph, passes) once; when it fails every variant records that error;
- **variants** (``--variants``, default ``texture,buffer,auto,buffer:float16``: [native:]scope[:dtype], dtype
  float32 unless named): ``tuner.compile_model(model, log=LOG, device=D, scope=..., dtype=...)``, one run on a
  fixed random input (seeded, standard normal), compared with onnxruntime: max relative error = max|a-b| / max|b|,
  a match when it is at most ``--rtol`` (1e-4; ``--rtol16`` 1e-2 for float16 storage);
- **native variants** (``native:scope[:dtype]``): the same compiled module (one compile per scope and dtype,
  whichever runtimes ask for it) saved as an artifact (``Module.save``, docs/artifact.md) and run by the native
  runtime, ``build/native/tuner-run ART --device D --input x.npy --outputs DIR --bench N --warmup 2`` in a
  subprocess (``tuner.native.opencl_env()``'s environment; the program is built with ``make -C native`` and
  copied aside first, so a rebuild during the run cannot change it); every output is compared with onnxruntime
  with the same tolerances, and with the Python executor's output of the same module (``py_rel_diff``). Its
  latency is tuner-run's median (a whole run: inputs written, every kernel, outputs read, one wait), against
  the Python executor's whole run of the same module (``Module.run``: inputs uploaded, kernels, outputs
  downloaded; ``py_median_s``). Program binaries of the native runs are kept in ``--cache``/native (the
  artifact's ``binaries/`` links there). ``--asan``: tuner-run is ``build/native/asan/tuner-run``
  (AddressSanitizer + UBSan) with ``ASAN_OPTIONS=detect_leaks=1`` and ``LSAN_OPTIONS=suppressions=
  native/asan/lsan.supp`` (leaks inside OpenCL drivers only); a report of any kind fails the row (column
  ``asan``);
- **zoo** (``--zoo NAMES``): the project's own models (``tuner zoo NAME -o F --input-size S``, ``--zoo-size``,
  default 64; random weights, written to the run's temporary folder) run beside the folder's, as ``zoo_NAME``;
- **kernels**: the compiled module's kernels (``len(module.spec.nodes)``, as ``tuner compile`` counts them)
  and its tuned-template layers, ``tuned of total`` as ``tuner compile`` prints "layers use tuned configs":
  a layer is tuned when ``LOG`` (default ``logs/<device fingerprint>.jsonl`` when it exists) has a record of
  its exact task, else it runs the template's fallback config;
- **latency**: ours is the median of ``--repeats`` ``Module.time`` runs (wall clock of enqueuing every kernel
  and waiting, inputs already uploaded, after 2 warm-up runs); onnxruntime's is the median of as many
  ``InferenceSession.run`` calls (after 3 warm-up calls) with ``intra_op_num_threads`` = the CPUs of this
  process (``--threads``), on the same machine, in the same process, just before ours. A set of repeats
  whose median is over 1.5x its minimum (a stall from other work on shared CPUs) is measured again, up to 3
  sets, and the lowest median is kept. ratio = onnxruntime / ours (above 1: ours is faster).

Compiling is planning and generating (``compile_model(..., target=device profile)``, ``compile_s``) and then
building (``Module.load``, ``build_s``) with program binaries kept in ``--cache`` (default
``~/.cache/tuner/bench_models/<fingerprint>/``): PoCL's builds are most of a run's time, and a re-run (to see
what the frontend gained) builds only kernels whose source changed.

Each model runs in its own Python process (``--timeout`` seconds, default 900), so a crash, a hang or a
half-edited frontend costs one row, never the run: a failure at any stage (import, frontend, compile, run,
mismatch) is recorded as its first error message on one line (for the frontend: which node and operator),
never raised. Writes ``<out>/models_<device fingerprint>.csv`` (one row per model x variant) and ``.md`` (one
row per model, printed too) with the summary line "N of M compile and match" (all float32 variants compile
and match onnxruntime); with native variants the files are ``models_native_<fingerprint>`` (``--asan``:
``models_native_asan_<fingerprint>``; ``--tag T`` adds ``T_`` before the fingerprint) and a second line counts
the models whose every float32 native variant matches (every variant, when none is float32). With float16
variants, column ``ort16_rel_err`` is onnxruntime's own error with float16 storage emulated
(``float16_storage_model``): a float16 mismatch our kernels share with it is float16's rounding, not a bug.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "@@MODELS@@ "  # a worker's result lines on stdout start with this

DEFAULT_VARIANTS = "texture,buffer,auto,buffer:float16"

CSV_FIELDS = ["model", "variant", "runtime", "scope", "dtype", "stage", "compiles", "max_rel_err", "match", "kernels",
              "launches", "tuned_layers", "template_layers", "compile_s", "build_s", "programs_built",
              "ours_median_s", "ours_min_s", "ort_median_s", "ort_min_s", "ratio", "py_median_s", "py_min_s",
              "py_rel_diff", "native_wall_s", "asan", "ort16_rel_err", "ref_absmax", "error", "onnx_ops",
              "unsupported_ops", "onnx_nodes", "input_shape", "output_shape", "repeats", "ort_threads", "device", "log"]
# ours_median_s: the Python executor's Module.time (kernels only) for a python variant, tuner-run's median (inputs
# written, kernels, outputs read) for a native one; py_median_s / py_min_s: the Python executor's whole run
# (Module.run) of the same module, native variants only; ort16_rel_err: onnxruntime's error with float16 storage
# emulated (float16_storage_model), float16 variants only


# -------------------------------------------------------------------------------------------------- helpers

sys.path.insert(0, str(HERE))
from kernels import cpu_count, cpu_name, steady  # noqa: E402  (bench/kernels.py's timing and host helpers)

def one_line(e: BaseException | str, limit: int = 400) -> str:
    """The first line of an error, with the frontend's long "; supported: ..." list cut off."""
    text = str(e).strip() if not isinstance(e, str) else e.strip()
    if isinstance(e, BaseException) and not type(e).__name__.endswith("TunerError"):
        text = f"{type(e).__name__}: {text}"
    text = text.splitlines()[0] if text else (type(e).__name__ if isinstance(e, BaseException) else "")
    text = text.split("; supported:")[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def failed_op(error: str) -> str:
    """The operator an error names: the frontend's ``ONNX node 'x' (#12, Resize): ...`` -> ``Resize``."""
    m = re.search(r"\(#\d+, (\w+)\)", error or "") or re.search(r"#\d+ \((\w+)\)", error or "")
    return m.group(1) if m else ""


RUNTIMES = ("python", "native")


def parse_variants(text: str) -> list:
    """``[native:]scope[:dtype]`` -> [(runtime, scope, dtype)], runtime ``python`` unless ``native:`` leads."""
    out = []
    for v in text.split(","):
        v = v.strip()
        if not v:
            continue
        runtime, rest = ("native", v[len("native:"):]) if v.startswith("native:") else ("python", v)
        scope, _, dtype = rest.partition(":")
        dtype = dtype or "float32"
        if scope not in ("texture", "buffer", "auto") or dtype not in ("float32", "float16"):
            raise ValueError(f"variant {v!r}: write [native:]scope[:dtype], scope texture|buffer|auto, "
                             f"dtype float32|float16")
        if (runtime, scope, dtype) not in out:
            out.append((runtime, scope, dtype))
    if not out:
        raise ValueError("no variants")
    return out


def variant_name(runtime: str, scope: str, dtype: str) -> str:
    name = scope if dtype == "float32" else f"{scope}:{dtype}"
    return name if runtime == "python" else f"{runtime}:{name}"


def compiles_of(variants: list) -> list:
    """The compiles the variants need, in order: (scope, dtype) -> the runtimes that run it."""
    out: dict = {}
    for runtime, scope, dtype in variants:
        out.setdefault((scope, dtype), []).append(runtime)
    return list(out.items())


NATIVE_LATENCY = re.compile(r": median latency ([0-9.]+) ms over (\d+) runs")
NATIVE_LOADED = re.compile(r"(\d+) programs from cached binaries, (\d+) built from source")
SANITIZER = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)[^\n]*|runtime error:[^\n]*"
                       r"|SUMMARY: \w+Sanitizer[^\n]*")


def sanitizer_report(stderr: str) -> str:
    """The first lines of an AddressSanitizer / LeakSanitizer / UBSan report in ``stderr``, '' when none."""
    found = [m.group(0).strip() for m in SANITIZER.finditer(stderr or "")]
    return "; ".join(dict.fromkeys(found))[:400]


def run_native(exe: str, art: Path, inputs: dict, device: str, repeats: int, env: dict, timeout: float,
               asan: bool = False, outputs: list = ("output",)) -> dict:
    """Run the artifact ``art`` with tuner-run: one --input NAME=X.npy per model input, every output read back
    (``--outputs DIR``, in the order of ``outputs``: the artifact's names); raises on a failed run (the error is
    tuner-run's own message, or the sanitizer's report)."""
    import numpy as np

    from tuner.cli.model import output_file_name
    work = art.parent
    cmd = [exe, str(art), "--device", device, "--outputs", str(work / "ys"), "--bench", str(repeats),
           "--warmup", "2"]
    for k, (name, x) in enumerate(inputs.items()):
        path = work / f"x{k}.npy"
        np.save(path, x)
        cmd += ["--input", f"{name}={path}" if len(inputs) > 1 else str(path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    out = {"native_wall_s": time.perf_counter() - t0}
    if asan:
        report = sanitizer_report(proc.stderr)
        out["asan"] = report or ("clean" if proc.returncode == 0 else "")
        if report:
            raise RuntimeError(f"sanitizer: {report}")
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        err = next((ln for ln in lines if ln.startswith("error: ")), lines[-1] if lines else "")
        raise RuntimeError(f"tuner-run exited with status {proc.returncode}" + (f": {err[:300]}" if err else ""))
    m = NATIVE_LATENCY.search(proc.stdout)
    if not m:
        raise RuntimeError(f"tuner-run printed no latency: {proc.stdout.strip()[-200:]}")
    out["ours_median_s"] = float(m.group(1)) * 1e-3
    m = NATIVE_LOADED.search(proc.stdout)
    if m:
        out["programs_built"] = int(m.group(2))
    out["y"] = [np.load(work / "ys" / output_file_name(name)) for name in outputs]
    return out


def float16_storage_model(path: str) -> bytes:
    """The ONNX model with float16 storage emulated, as tuner's float16 variants store tensors: every float
    initializer and every float value a node writes rounded to float16 (a Cast to float16 and back), the
    arithmetic float32. Run by onnxruntime on the input rounded the same way, it is the error float16 storage
    itself costs, without any kernel of ours (column ``ort16_rel_err``)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    m = onnx.shape_inference.infer_shapes(onnx.load(path))
    g = m.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.output, *g.input)}
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    nodes = []
    for n in g.node:
        nodes.append(n)
        for i, name in enumerate(list(n.output)):
            if not name or types.get(name) != TensorProto.FLOAT:
                continue
            n.output[i] = f"{name}__f32"
            nodes += [helper.make_node("Cast", [f"{name}__f32"], [f"{name}__f16"], to=TensorProto.FLOAT16),
                      helper.make_node("Cast", [f"{name}__f16"], [name], to=TensorProto.FLOAT)]
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return m.SerializeToString()


# --------------------------------------------------------------------------------- worker (one model, own process)

def emit(obj: dict) -> None:
    print(MARK + json.dumps(obj), flush=True)


def worker(args) -> int:
    """One model: its operators, onnxruntime's output and latency, then every variant; one result line each."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    path = args.worker
    info = {"kind": "model"}
    try:
        m = onnx.load(path)
        ops = sorted({n.op_type for n in m.graph.node})
        info.update(onnx_ops=ops, onnx_nodes=len(m.graph.node))
        inits = {i.name for i in m.graph.initializer}
        graph_inputs = [i for i in m.graph.input if i.name not in inits]
        shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph_inputs]
        info["input_shape"] = "x".join(map(str, shapes[0])) if shapes else ""
        del m
    except Exception as e:  # noqa: BLE001
        emit({**info, "error": f"onnx: {one_line(e)}"})
        return 0
    try:
        from tuner.frontend.onnx import SUPPORTED_OPS
        info["unsupported_ops"] = [o for o in ops if o not in SUPPORTED_OPS]
    except Exception as e:  # noqa: BLE001 -- the frontend being edited: every variant will say so
        info["unsupported_ops"] = None
        info["import_error"] = one_line(e)

    rng = np.random.default_rng(args.seed)
    xs = {i.name: rng.standard_normal(s).astype(np.float32) for i, s in zip(graph_inputs, shapes)}
    threads = args.threads or cpu_count()
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ref = sess.run(None, xs)
        info["output_shape"] = "x".join(map(str, ref[0].shape))
        info["ref_absmax"] = float(np.abs(ref[0]).max())  # random weights can shrink outputs below float16's range
        if any(v[2] == "float16" for v in parse_variants(args.variants)):
            try:  # what float16 storage costs by itself: onnxruntime with every stored tensor rounded to float16
                s16 = ort.InferenceSession(float16_storage_model(path), so, providers=["CPUExecutionProvider"])
                y16 = s16.run(None, {k: v.astype(np.float16).astype(np.float32) for k, v in xs.items()})[0]
                info["ort16_rel_err"] = float(np.abs(y16 - ref[0]).max() / max(float(np.abs(ref[0]).max()), 1e-30))
                del s16
            except Exception as e:  # noqa: BLE001 -- a reference for float16 rows only; never fails the model
                info["ort16_error"] = one_line(e)

        def measure_ort():
            costs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                sess.run(None, xs)
                costs.append(time.perf_counter() - t0)
            return costs
        for _ in range(3):
            sess.run(None, xs)
        info["ort_median_s"], info["ort_min_s"] = steady(measure_ort)
        info["ort_threads"] = threads
        del sess
    except Exception as e:  # noqa: BLE001
        emit({**info, "error": f"onnxruntime: {one_line(e)}"})
        return 0

    frontend_error = info.get("import_error")
    dev = None
    if frontend_error is None:
        try:
            from tuner.compile.compiler import load_graph
            load_graph(path)
        except Exception as e:  # noqa: BLE001
            frontend_error = one_line(e)
    if frontend_error is None:
        try:
            from tuner.runtime.opencl import open_device
            dev = open_device(args.device)
        except Exception as e:  # noqa: BLE001
            frontend_error = f"device: {one_line(e)}"
    info["frontend_error"] = frontend_error
    emit(info)

    inputs = [xs[i.name] for i in graph_inputs]
    native = None
    for (scope, dtype), runtimes in compiles_of(parse_variants(args.variants)):
        rows = {rt: {"kind": "variant", "variant": variant_name(rt, scope, dtype), "runtime": rt, "scope": scope,
                     "dtype": dtype, "compiles": False, "match": False} for rt in runtimes}
        if dtype == "float16":
            for row in rows.values():
                row["ort16_rel_err"] = info.get("ort16_rel_err")
        if frontend_error is not None:
            for row in rows.values():
                emit({**row, "stage": "frontend", "error": frontend_error})
            continue
        stage, common, mod, y_py = "compile", {}, None, None
        tol = args.rtol16 if dtype == "float16" else args.rtol
        r = [np.asarray(x, np.float32) for x in ref]  # every output, in the model's order

        def rel_err(ys, wants) -> float:
            """The largest relative error over the outputs (each in the model's own shape)."""
            if len(ys) != len(wants):
                raise ValueError(f"{len(ys)} outputs, onnxruntime's {len(wants)}")
            worst = 0.0
            for y, want in zip(ys, wants):
                y = np.asarray(y, np.float32)
                if y.shape != want.shape:
                    raise ValueError(f"output shape {list(y.shape)}, onnxruntime's {list(want.shape)}")
                err = float(np.abs(y - want).max() / max(float(np.abs(want).max()), 1e-30))
                worst = max(worst, err if np.isfinite(err) else float("inf"))
            return worst

        def mismatch(err: float) -> str:
            text = f"max relative error {err:.3g} > {tol:g}"
            if dtype == "float16" and info["ref_absmax"] < 6.1e-5:
                text += (f" (onnxruntime's output is at most {info['ref_absmax']:.2g}, below float16's "
                         f"smallest normal 6.1e-05: random weights shrink activations until they underflow)")
            elif dtype == "float16" and info.get("ort16_rel_err", 0) > tol:
                text += (f" (onnxruntime with float16 storage emulated: {info['ort16_rel_err']:.3g}, float16's own "
                         f"rounding)")
            return text

        try:  # one compile and one Python load for every runtime of this scope and dtype
            import warnings

            import tuner
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # one fallback warning per untuned workload: counted below
                # for the device's profile: planned and generated, not built yet, so that the build below can
                # keep program binaries in --cache (a re-run builds only the kernels that changed)
                mod = tuner.compile_model(path, log=args.log, target=dev.info, scope=scope, dtype=dtype)
                common["compile_s"] = time.perf_counter() - t0
                stage = "build"
                t0 = time.perf_counter()
                if args.cache:
                    mod.cache_dir = Path(args.cache)
                mod.load(dev)
            common["build_s"] = time.perf_counter() - t0
            common["programs_built"] = mod.load_stats.get("source")
            common["compiles"] = True
            nodes = mod.spec.nodes
            common["kernels"] = len(nodes)
            common["launches"] = sum(len(n.calls) for n in nodes)
            common["tuned_layers"] = sum(bool(n.tuned) for n in nodes)
            common["template_layers"] = sum(n.template is not None for n in nodes)
        except Exception as e:  # noqa: BLE001
            for row in rows.values():
                emit({**row, **common, "stage": stage, "error": one_line(e)})
            mod = None  # release a module that failed to load (a failed compile bound none: `del` would raise)
            continue

        if "python" in rows:
            row, stage = {**rows["python"], **common}, "run"
            try:
                y_py = [np.asarray(y, np.float32) for y in mod.run(inputs)]
                err = row["max_rel_err"] = rel_err(y_py, r)
                row["match"] = err <= tol
                stage = "time"
                row["ours_median_s"], row["ours_min_s"] = steady(lambda: mod.time(args.repeats, warmup=2))
                stage = "done" if row["match"] else "mismatch"
                if not row["match"]:
                    row["error"] = mismatch(err)
            except Exception as e:  # noqa: BLE001
                row["error"] = one_line(e)
            emit({**row, "stage": stage})

        if "native" in rows:
            row, stage = {**rows["native"], **common}, "save"
            row.pop("programs_built", None)  # the Python load's; tuner-run's own below
            work = None
            try:
                import shutil
                import tempfile
                if native is None:
                    from tuner.native import opencl_env
                    native = {"env": opencl_env(dict(os.environ, **asan_env()) if args.asan else None)}
                work = Path(tempfile.mkdtemp(prefix="models-native-", dir=args.work))
                art = Path(mod.save(work / "artifact"))
                env = native["env"]
                if args.cache:  # tuner-run's binary cache (tuner.artifact.cache) kept across runs and models
                    env = {**env, "TUNER_CACHE_DIR": str(Path(args.cache) / "native")}
                stage = "native"
                res = run_native(args.tuner_run, art, xs, args.device, args.repeats, env,
                                 timeout=args.timeout, asan=args.asan, outputs=list(mod.spec.outputs))
                row.update({k: v for k, v in res.items() if k != "y"})
                err = row["max_rel_err"] = rel_err(res["y"], r)
                row["match"] = err <= tol
                stage = "python"
                if y_py is None:
                    y_py = [np.asarray(y, np.float32) for y in mod.run(inputs)]
                row["py_rel_diff"] = rel_err(res["y"], y_py)
                stage = "time"  # the Python executor's whole run of the same module, as tuner-run times it

                def py_runs():
                    costs = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        mod.run(inputs)
                        costs.append(time.perf_counter() - t0)
                    return costs
                for _ in range(2):
                    mod.run(inputs)
                row["py_median_s"], row["py_min_s"] = steady(py_runs)
                stage = "done" if row["match"] else "mismatch"
                if not row["match"]:
                    row["error"] = mismatch(err)
            except subprocess.TimeoutExpired:
                row["error"] = f"tuner-run timed out after {args.timeout} s"
            except Exception as e:  # noqa: BLE001
                row["error"] = one_line(e)
            finally:
                if work is not None:
                    shutil.rmtree(work, ignore_errors=True)
            emit({**row, "stage": stage})
        del mod
    return 0


def asan_env() -> dict:
    """The sanitizers' options for --asan: leak detection on, leaks inside OpenCL drivers suppressed."""
    return {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=23",
            "LSAN_OPTIONS": f"suppressions={ROOT / 'native' / 'asan' / 'lsan.supp'}",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


# ------------------------------------------------------------------------------------------- parent (the run)

def run_model(path: Path, args) -> tuple:
    """(model info, [variant rows]) from a worker process; a crash or timeout becomes the error of what is left."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), "--variants", args.variants,
           "--repeats", str(args.repeats), "--seed", str(args.seed), "--rtol", str(args.rtol),
           "--rtol16", str(args.rtol16), "--log", args.log or "none", "--cache", args.cache or "none",
           "--timeout", str(args.timeout)]
    if args.device:
        cmd += ["--device", args.device]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.tuner_run:
        cmd += ["--tuner-run", args.tuner_run, "--work", args.work] + (["--asan"] if args.asan else [])
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    # its own process group: a timeout kills the worker and the tuner-run it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    why = None
    try:
        out, err = proc.communicate(timeout=args.timeout)
        if proc.returncode != 0:
            tail = [ln for ln in err.strip().splitlines() if ln.strip()]
            why = f"worker exited with status {proc.returncode}" + (f": {tail[-1].strip()[:300]}" if tail else "")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        why = f"timed out after {args.timeout} s"
    results = [json.loads(line[len(MARK):]) for line in out.splitlines() if line.startswith(MARK)]
    info = next((r for r in results if r.get("kind") == "model"), {"error": why or "worker wrote no result"})
    rows = [r for r in results if r.get("kind") == "variant"]
    done = {r["variant"] for r in rows}
    for runtime, scope, dtype in parse_variants(args.variants):
        name = variant_name(runtime, scope, dtype)
        if name not in done:
            rows.append({"variant": name, "runtime": runtime, "scope": scope, "dtype": dtype, "compiles": False,
                         "match": False, "stage": "worker", "error": info.get("error") or why or "no result"})
    return info, rows


def fmt_err(v) -> str:
    if v is None or v == "":
        return "-"
    return "inf" if v == float("inf") else f"{v:.1e}"


def fmt_ms(v) -> str:
    return "-" if v in (None, "") else f"{v * 1e3:.2f}"


def summarize(models: list, variants: list, meta: dict) -> str:
    """Markdown: one row per model, then the failures by operator and the summary lines (one per runtime)."""
    names = [variant_name(*v) for v in variants]
    runtimes = [rt for rt in RUNTIMES if any(v[0] == rt for v in variants)]
    # a model counts when every float32 variant of a runtime matches (every variant, when none is float32)
    f32 = {rt: [variant_name(*v) for v in variants if v[0] == rt and v[2] == "float32"]
           or [variant_name(*v) for v in variants if v[0] == rt] for rt in runtimes}

    def latency_variant(rt: str) -> str:
        own = [variant_name(*v) for v in variants if v[0] == rt]
        auto = variant_name(rt, "auto", "float32")
        return auto if auto in own else (f32[rt][0] if f32[rt] else own[0])
    lat = {rt: latency_variant(rt) for rt in runtimes}
    heads = ["ort rel err, float16 storage emulated"] if any(v[2] == "float16" for v in variants) else []
    if "python" in lat:
        heads += [f"ours ms ({lat['python']})"]
    if "native" in lat:
        heads += [f"native ms ({lat['native']})", "python ms (same module, whole run)", "python / native"]
    main_lat = lat.get("python", lat.get("native"))
    latency_note = (f"; native: `tuner-run --bench {meta['repeats']}` median of a whole run (inputs written, kernels, "
                   f"outputs read) against the Python executor's whole run of the same module (`Module.run`), "
                   f"python / native above 1: native is faster; tuner-run: `{meta.get('tuner_run')}`"
                   if "native" in lat else "")
    if heads and heads[0].startswith("ort rel err"):
        latency_note += ("; \"ort rel err, float16 storage emulated\": onnxruntime with every stored tensor rounded "
                        "to float16 (`float16_storage_model`) against itself in float32, the error float16 storage "
                        "costs without any kernel of ours")
    lines = [f"# Model coverage: `{meta['fingerprint']}`", "",
             f"- device: `{meta['device']}`, fingerprint `{meta['fingerprint']}`; CPU {meta['cpu']} "
             f"({meta['ncpu']} CPUs), load average {meta['load'][0]:.1f} -> {meta['load'][1]:.1f}",
             f"- models: `{meta['models_dir']}`" + (f" and the zoo's {meta['zoo']}" if meta.get("zoo") else "")
             + f" ({meta['n']} models, input {meta['input_sizes']}), "
             f"{meta['date']}, {meta['elapsed_s'] / 60:.1f} min",
             f"- variants: {', '.join(names)} ([runtime:]scope[:storage dtype]); match: max|ours - ort| / max|ort| "
             f"<= {meta['rtol']:g} (float16 storage {meta['rtol16']:g}); tuning log: {meta['log'] or 'none'}"
             + ("; under AddressSanitizer + UBSan with leak detection (`build/native/asan/tuner-run`, "
                "native/asan/lsan.supp)" if meta.get("asan") else ""),
             f"- latency: median of {meta['repeats']} runs, ours ({main_lat}"
             + (", `Module.time`" if "python" in lat else "") + f") vs onnxruntime "
             f"{meta['ort']} (CPUExecutionProvider, {meta['threads']} threads); ratio = ort / ours, above 1: "
             f"ours is faster" + latency_note, "",
             "| model | ONNX operators used | no handler | " + " | ".join(f"compiles {n}" for n in names) + " | "
             + " | ".join(f"max rel err {n}" for n in names) + " | kernels | tuned layers | "
             + " | ".join(heads) + " | ort ms | ratio | first error |",
             "| --- | --- | --- | " + " | ".join("---" for _ in names) + " | " + " | ".join("---:" for _ in names)
             + " | ---: | ---: | " + " | ".join("---:" for _ in heads) + " | ---: | ---: | --- |"]
    ok_models, by_op, per_variant = {rt: 0 for rt in runtimes}, {}, {n: 0 for n in names}
    for name, info, rows in models:
        rows = {r["variant"]: r for r in rows}
        comp = ["yes" if rows.get(n, {}).get("compiles") else "no" for n in names]
        errs = []
        for n in names:
            r = rows.get(n, {})
            e = fmt_err(r.get("max_rel_err"))
            errs.append(e if r.get("match") or e == "-" else f"**{e}**")
            per_variant[n] += bool(r.get("match"))
        lr = rows.get(main_lat, {})
        kern = lr.get("kernels", next((r.get("kernels") for r in rows.values() if r.get("kernels")), None))
        tl = (f"{lr['tuned_layers']} of {lr['template_layers']}" if lr.get("template_layers") is not None else "-")
        ours, ort_s = lr.get("ours_median_s"), info.get("ort_median_s")
        ratio = f"{ort_s / ours:.2f}" if ours and ort_s else "-"
        cells = [fmt_err(info.get("ort16_rel_err"))] if heads and heads[0].startswith("ort rel err") else []
        if "python" in lat:
            cells.append(fmt_ms(rows.get(lat["python"], {}).get("ours_median_s")))
        if "native" in lat:
            nr = rows.get(lat["native"], {})
            nat, py = nr.get("ours_median_s"), nr.get("py_median_s")
            cells += [fmt_ms(nat), fmt_ms(py), f"{py / nat:.2f}" if nat and py else "-"]
        first = next((r.get("error") for r in rows.values() if r.get("error")), info.get("error") or "")
        for rt in runtimes:
            if all(rows.get(n, {}).get("match") for n in f32[rt]):
                ok_models[rt] += 1
        bad = next((rows.get(n, {}) for rt in runtimes for n in f32[rt] if not rows.get(n, {}).get("match")), None)
        if bad is not None:
            op = failed_op(bad.get("error") or first) or bad.get("stage", "?")
            by_op.setdefault(op, []).append(name)
        unsupported = info.get("unsupported_ops")
        lines.append(f"| {name} | {' '.join(info.get('onnx_ops', [])) or '-'} | "
                     f"{' '.join(unsupported) if unsupported else ('-' if unsupported is not None else '?')} | "
                     + " | ".join(comp) + " | " + " | ".join(errs) + f" | {kern if kern is not None else '-'} | "
                     f"{tl} | " + " | ".join(cells) + f" | {fmt_ms(ort_s)} | {ratio} | "
                     f"{first.replace('|', '/') or '-'} |")
    lines += ["", "First failure by operator (or stage): "
              + ("; ".join(f"{op}: {', '.join(ms)}" for op, ms in sorted(by_op.items(), key=lambda kv: -len(kv[1])))
                 or "none"),
              "", "Per variant, models that compile and match: "
              + ", ".join(f"{n} {per_variant[n]} of {meta['n']}" for n in names), ""]
    for rt in runtimes:
        what = "compile and match" if rt == "python" else "compile, run under the native runtime and match"
        lines += [f"**{ok_models[rt]} of {meta['n']} {what}** (every {rt} variant of float32, else every one: "
                  f"{', '.join(f32[rt])})", ""]
    if meta.get("asan"):
        runs = [r for _, _, rows in models for r in rows if r.get("runtime") == "native"]
        clean = [r for r in runs if r.get("asan") == "clean"]
        reports = [f"{name} {r['variant']}: {r.get('asan') or r.get('error') or r.get('stage')}"
                   for name, _, rows in models for r in rows
                   if r.get("runtime") == "native" and r.get("asan") != "clean"]
        lines += [f"**AddressSanitizer + UBSan + LeakSanitizer: {len(clean)} of {len(runs)} native runs clean** "
                  "(no report, exit status 0)" + (": not clean: " + "; ".join(reports) if reports else ""), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models-dir", default="/tmp/tv_models",
                    help="folder of .onnx files (default /tmp/tv_models, from bench/export_torchvision.py)")
    ap.add_argument("--models", metavar="REGEX", help="only models whose file name matches")
    ap.add_argument("--device", default=os.environ.get("TUNER_DEVICE"),
                    help="OpenCL device spec as in `tuner devices` (default: the default device, $TUNER_DEVICE)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help=f"comma-separated [native:]scope[:dtype] (default {DEFAULT_VARIANTS}); native: the artifact "
                    "run by build/native/tuner-run")
    ap.add_argument("--zoo", default="", metavar="NAMES",
                    help="comma-separated models of `tuner zoo` to run too, as zoo_NAME (e.g. "
                    "resnet18,mobilenet_v2,mobilenet_v3_small; default none)")
    ap.add_argument("--zoo-size", type=int, default=64, help="the zoo models' input height and width (default 64)")
    ap.add_argument("--asan", action="store_true", help="native variants under build/native/asan/tuner-run "
                    "(AddressSanitizer + UBSan, leak detection on, native/asan/lsan.supp): any report fails the row")
    ap.add_argument("--tuner-run", default=None, metavar="PATH",
                    help="the native runtime's program (default: build/native/tuner-run, or asan/tuner-run with "
                    "--asan, built with `make -C native` first); copied aside for the run")
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--log", default=None, help="tuning log for compile_model (default logs/<device "
                    "fingerprint>.jsonl when it exists; 'none': fallback configs only)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs, ours and onnxruntime's (median; default 10)")
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime threads (default: the CPUs of this process)")
    ap.add_argument("--rtol", type=float, default=1e-4, help="match tolerance, float32 (default 1e-4)")
    ap.add_argument("--rtol16", type=float, default=1e-2, help="match tolerance, float16 storage (default 1e-2)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model, all its variants (default 900)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random input")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "tuner" / "bench_models"),
                    help="where built program binaries are kept and reused across runs, per device fingerprint "
                    "(default ~/.cache/tuner/bench_models; 'none': build every kernel from source)")
    ap.add_argument("--out", default=str(HERE / "results"), help="output folder (default bench/results)")
    ap.add_argument("--tag", default="", help="a word in the output files' names: models[_native]_TAG_<fingerprint>")
    ap.add_argument("--worker", metavar="MODEL.onnx", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        ap.error(str(e))
    if args.zoo_size < 32:
        ap.error("--zoo-size must be at least 32")
    if args.worker:
        args.log = None if args.log in (None, "none") else args.log
        args.cache = None if args.cache in (None, "", "none") else args.cache
        return worker(args)
    import shutil
    import tempfile
    args.work = tempfile.mkdtemp(prefix="bench-models-")
    try:
        return run(args, variants)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


def prepare_native(args) -> None:
    """Build the native runtime (make -C native, incremental) unless --tuner-run names a program, and copy the
    program into the run's folder: a rebuild of build/native during the run cannot change what it runs."""
    import shutil
    exe = args.tuner_run
    if exe is None:
        from tuner.native import build
        exe = build()["tuner_run_asan" if args.asan else "tuner_run"]
    snap = Path(args.work) / "bin" / Path(exe).name
    snap.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(exe, snap)
    args.tuner_run_source = str(exe)
    args.tuner_run = str(snap)


def zoo_models(names: list, size: int, folder: Path) -> list:
    """``tuner zoo NAME -o folder/zoo_NAME.onnx --input-size size`` for each name; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = folder / f"zoo_{name}.onnx"
        proc = subprocess.run([sys.executable, "-m", "tuner", "zoo", name, "-o", str(path), "--input-size", str(size)],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"tuner zoo {name}: {(proc.stderr or proc.stdout).strip()[-300:]}")
        paths.append(path)
    return paths


def run(args, variants: list) -> int:
    from tuner.errors import TunerError
    from tuner.runtime.opencl import open_device
    try:
        device = open_device(args.device)
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = device.info
    args.device = args.device or device.fingerprint  # every worker opens the same device
    if args.log is None:
        default_log = ROOT / "logs" / f"{device.fingerprint}.jsonl"
        args.log = str(default_log) if default_log.exists() else None
    elif args.log == "none":
        args.log = None
    paths = sorted(Path(args.models_dir).glob("*.onnx"))
    zoo = [z.strip() for z in args.zoo.split(",") if z.strip()]
    if zoo:
        try:
            paths += zoo_models(zoo, args.zoo_size, Path(args.work) / "zoo")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    native = any(v[0] == "native" for v in variants)
    if native:
        try:
            prepare_native(args)
        except (TunerError, OSError) as e:
            print(f"error: the native runtime: {e}", file=sys.stderr)
            return 2
    else:
        args.tuner_run = None
    if args.models:
        paths = [p for p in paths if re.search(args.models, p.stem)]
    if not paths:
        print(f"error: no .onnx files in {args.models_dir}" + (f" matching {args.models!r}" if args.models else "")
              + "; export them with `/tmp/torchvenv/bin/python bench/export_torchvision.py`", file=sys.stderr)
        return 2
    import onnxruntime as ort
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = ("models_native_asan_" if native and args.asan else "models_native_" if native else "models_") \
        + (f"{args.tag}_" if args.tag else "") + device.fingerprint
    csv_path, md_path = out / f"{stem}.csv", out / f"{stem}.md"
    print(f"device {info.platform} / {info.name} ({device.fingerprint}); {len(paths)} models from {args.models_dir}; "
          f"variants {args.variants}; log {args.log or 'none'}; onnxruntime {ort.__version__} with "
          f"{args.threads or cpu_count()} threads" + (f"; native runtime {args.tuner_run_source}" if native else "")
          + f" -> {csv_path}", flush=True)

    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    models, sizes = [], set()
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for k, path in enumerate(paths, 1):
            t0 = time.perf_counter()
            minfo, rows = run_model(path, args)
            if minfo.get("input_shape"):
                sizes.add(minfo["input_shape"])
            models.append((path.stem, minfo, rows))
            for r in rows:
                ours, ort_s = r.get("ours_median_s"), minfo.get("ort_median_s")
                writer.writerow({**r, "model": path.stem, "onnx_ops": " ".join(minfo.get("onnx_ops", [])),
                                 "unsupported_ops": " ".join(minfo.get("unsupported_ops") or []),
                                 "onnx_nodes": minfo.get("onnx_nodes"), "input_shape": minfo.get("input_shape"),
                                 "output_shape": minfo.get("output_shape"), "ort_median_s": ort_s,
                                 "ref_absmax": minfo.get("ref_absmax"),
                                 "ort_min_s": minfo.get("ort_min_s"), "ratio": ort_s / ours if ours and ort_s else None,
                                 "repeats": args.repeats, "ort_threads": minfo.get("ort_threads"),
                                 "device": device.fingerprint, "log": args.log or ""})
            fh.flush()
            status = " ".join(f"{r['variant']}={'ok' if r.get('match') else r.get('stage', '?')}" for r in rows)
            first = next((r.get("error") for r in rows if r.get("error")), minfo.get("error"))
            print(f"[{k}/{len(paths)}] {path.stem} ({time.perf_counter() - t0:.0f} s): {status}"
                  + (f"\n    {first}" if first else ""), flush=True)
            md_path.write_text(summarize(models, variants, run_meta(info, device, args, models, sizes, t_start,
                                                                    load0, ort.__version__))
                               + f"\n(partial: {k} of {len(paths)} models so far)\n")

    meta = run_meta(info, device, args, models, sizes, t_start, load0, ort.__version__)
    md = summarize(models, variants, meta)
    md_path.write_text(md)
    print("\n" + md)
    print(f"wrote {csv_path} and {md_path}")
    return 0


def run_meta(info, device, args, models, sizes, t_start, load0, ort_version) -> dict:
    return {"device": f"{info.platform} / {info.name}", "fingerprint": device.fingerprint, "cpu": cpu_name(),
            "ncpu": cpu_count(), "load": (load0, os.getloadavg()[0]), "models_dir": args.models_dir, "n": len(models),
            "input_sizes": ", ".join(sorted(sizes)) or "?", "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "elapsed_s": time.perf_counter() - t_start, "rtol": args.rtol, "rtol16": args.rtol16, "log": args.log,
            "repeats": args.repeats, "ort": ort_version, "threads": args.threads or cpu_count(),
            "tuner_run": getattr(args, "tuner_run_source", None), "asan": args.asan,
            "zoo": f"{args.zoo} at {args.zoo_size}x{args.zoo_size}" if args.zoo else ""}


if __name__ == "__main__":
    sys.exit(main())
