"""Half precision and the precision guard, model by model (issue 56, item 4).

    .venv/bin/python bench/precision.py [--device intel] [--models resnet18,mobilenet_v2,mobilenet_v3_small]
        [--weights calibrated,uncalibrated] [--size 224] [--log PATH ...] [--transfer-from auto]
        [--scope auto] [--runs 20] [--out bench/results/precision]

For each model and weights, three artifacts are compiled for the device: ``fp32`` (``--dtype float32``),
``fp16`` (``--dtype float16 --precision off``: every tensor in half, unchecked, what ``--dtype float16`` meant
before the guard) and ``mixed`` (``--dtype float16``, the default ``--precision mixed``: the guard's plan). Each
runs in ``tuner-run`` (its median latency over ``--runs`` runs, transfers included, and its output) and in the
Python executor (its output), on one fixed random input (seed 1; the guard's own inputs are seed 0). Recorded:
latency, the error against onnxruntime's float32 output (``max |y - ref| / max |ref|``) and whether the top-1
class agrees, in both runtimes; the share of exact zeros in the output; the nodes the guard kept in float32.

Models: the zoo's (``resnet18``, ``mobilenet_v2``, ``mobilenet_v3_small``, built here) and torchvision's
(``tv_NAME``, e.g. ``tv_mobilenet_v2``, ``tv_efficientnet_b0``, ``tv_mobilenet_v3_large``, ``tv_resnet18``:
exported here by ``bench/export_torchvision.py``, so the Python running this needs torch and torchvision, as on
the GPU host's ``bench/gpu.sh precision``).

Weights:

- ``calibrated``: BatchNorm statistics set to those of random inputs, so activations stay near unit scale (the
  zoo's: each BatchNormalization's mean and variance from its input on 8 random inputs, in order, onnxruntime
  evaluating the model as calibrated so far; torchvision's: ``calibrate_batch_norm``, 2 batches of 8);
- ``uncalibrated``: the constructors' initialization (torchvision's as is; the zoo's re-drawn the way torchvision
  initializes these architectures: convolutions He-normal over fan-out, BatchNorm mean 0, variance 1, scale 1,
  shift 0, biases 0, the classifier N(0, 0.01)). Activations shrink layer after layer, to 1e-9 at the logits.

Writes ``precision_<fingerprint>.csv`` and ``.md`` under ``--out``; a model that fails is a row saying why.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent  # not put on sys.path: bench/gpu.sh runs the installed tuner

ZOO_MODELS = ("resnet18", "mobilenet_v2", "mobilenet_v3_small")
VARIANTS = (("fp32", "float32", "mixed"), ("fp16", "float16", "off"), ("mixed", "float16", "mixed"))
ROUNDS = 3  # alternating timing rounds over a model's variants
FIELDS = ["model", "weights", "variant", "latency_ms", "rounds_ms", "plan", "err_python", "top1_python", "err_native", "top1_native",
          "zeros_native", "kept", "nodes", "kept_nodes", "guard_error", "compile_s", "note"]


# -- weights ----------------------------------------------------------------------------------------------------

def _inits(model) -> dict:
    return {t.name: t for t in model.graph.initializer}


def _set(model, name: str, value: np.ndarray) -> None:
    from onnx import numpy_helper
    t = _inits(model)[name]
    t.CopyFrom(numpy_helper.from_array(np.asarray(value, np.float32).reshape(tuple(t.dims)), name))


def uncalibrated(model, seed: int = 0):
    """The zoo model with torchvision's initialization of these architectures (see the module docstring)."""
    import onnx
    from onnx import numpy_helper
    model = onnx.ModelProto.FromString(model.SerializeToString())
    rng = np.random.default_rng(seed)
    init = _inits(model)
    for n in model.graph.node:
        if n.op_type == "Conv" and n.input[1] in init:
            w = numpy_helper.to_array(init[n.input[1]])
            fan_out = w.shape[0] * int(np.prod(w.shape[2:]))
            _set(model, n.input[1], rng.standard_normal(w.shape) * np.sqrt(2.0 / fan_out))
            if len(n.input) > 2 and n.input[2] in init:
                _set(model, n.input[2], np.zeros(numpy_helper.to_array(init[n.input[2]]).shape))
        elif n.op_type == "BatchNormalization":
            for name, v in zip(n.input[1:5], (1.0, 0.0, 0.0, 1.0)):  # scale, bias, mean, var
                _set(model, name, np.full(numpy_helper.to_array(init[name]).shape, v))
        elif n.op_type in ("Gemm", "MatMul") and n.input[1] in init:
            w = numpy_helper.to_array(init[n.input[1]])
            _set(model, n.input[1], rng.normal(0, 0.01, w.shape))
            if len(n.input) > 2 and n.input[2] in init:
                _set(model, n.input[2], np.zeros(numpy_helper.to_array(init[n.input[2]]).shape))
    return model


def calibrated(model, samples: int = 8, seed: int = 0):
    """The model with every BatchNormalization's statistics those of its input on ``samples`` random inputs,
    in order (each measured on the model calibrated up to it), scale 1 and shift 0 kept as the model has them."""
    import onnx
    import onnxruntime as ort
    from onnx import helper
    model = onnx.ModelProto.FromString(model.SerializeToString())
    x_info = model.graph.input[0]
    shape = [d.dim_value for d in x_info.type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed + 1)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(samples)]
    for n in [n for n in model.graph.node if n.op_type == "BatchNormalization"]:
        probe = onnx.ModelProto.FromString(model.SerializeToString())
        probe.graph.output.append(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
        sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        acts = np.concatenate([sess.run([n.input[0]], {x_info.name: x})[0] for x in xs])
        axes = (0, *range(2, acts.ndim))
        _set(model, n.input[3], acts.mean(axis=axes))
        _set(model, n.input[4], acts.var(axis=axes))
    return model


def zoo_model(name: str, weights: str, size: int):
    from tuner.zoo.models import ZOO
    m = ZOO[name](input_size=size)
    return calibrated(m) if weights == "calibrated" else uncalibrated(m)


def tv_model(name: str, weights: str, size: int, path: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit(f"error: {name}: torchvision models are exported here, and this Python has no torch; run "
                         f"with one that has torch and torchvision (bench/export_torchvision.py says how), or "
                         f"leave tv_ models out of --models") from None
    sys.path.insert(0, str(ROOT / "bench"))
    import export_torchvision as tv
    tv.export(name[3:], path, size, 17, 0, calibrate=2 if weights == "calibrated" else 0)


# -- one model ------------------------------------------------------------------------------------------------

def _rel(y, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(y, np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-300))


def run_native(exe, env, art: Path, fingerprint: str, x_path: Path, runs: int, tmp: Path) -> tuple:
    """(median ms, output) of ``tuner-run --bench runs``."""
    out = tmp / "y_native.npy"
    r = subprocess.run([exe, str(art), "--device", fingerprint, "--input", str(x_path), "--output", str(out),
                        "--bench", str(runs)], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"tuner-run: {r.stderr.strip()[-300:]}")
    m = re.search(r"median latency ([0-9.]+) ms", r.stdout)
    return float(m.group(1)), np.load(out)


def bench_model(name, weights, args, dev, exe, env, tmp: Path) -> list:
    import onnx
    import onnxruntime as ort

    from tuner.compile.compiler import compile_model
    path = tmp / f"{name}_{weights}.onnx"
    if name.startswith("tv_"):
        tv_model(name, weights, args.size, path)
    else:
        onnx.save(zoo_model(name, weights, args.size), path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.random.default_rng(1).standard_normal([d if isinstance(d, int) else 1 for d in inp.shape]) \
        .astype(np.float32)
    ref = sess.run(None, {inp.name: x})[0]
    x_path = tmp / "x.npy"
    np.save(x_path, x)
    rows, timed = [], []
    for variant, dtype, precision in VARIANTS:
        row = {"model": name, "weights": weights, "variant": variant}
        try:
            t0 = time.perf_counter()
            kw = dict(precision=precision) if dtype == "float16" else {}
            mod = compile_model(str(path), log=args.log, device=dev, scope=args.scope, dtype=dtype,
                                transfer_from=args.transfer_from, **kw)
            row["compile_s"] = f"{time.perf_counter() - t0:.1f}"
            row["plan"] = getattr(mod, "plan_kept", "") or ""
            guard = getattr(mod, "precision", None)
            if guard is not None:
                row["kept"], row["nodes"] = len(guard.kept), guard.nodes
                row["kept_nodes"] = " ".join(guard.kept)
                row["guard_error"] = f"{guard.mixed_error:.2g}"
            art = tmp / f"{name}_{weights}_{variant}"
            mod.save(art)
            y = mod.run({inp.name: x})[0]
            row["err_python"] = f"{_rel(y, ref):.2g}"
            row["top1_python"] = "same" if int(np.argmax(y)) == int(np.argmax(ref)) else "DIFFERS"
            del mod
            _, yn = run_native(exe, env, art, dev.info.fingerprint, x_path, 1, tmp)  # builds its binaries
            row["err_native"] = f"{_rel(yn, ref):.2g}"
            row["top1_native"] = "same" if int(np.argmax(yn)) == int(np.argmax(ref)) else "DIFFERS"
            row["zeros_native"] = f"{float(np.mean(yn == 0)):.0%}"
            timed.append((row, art))
        except Exception as e:  # noqa: BLE001 -- one failure is a row, never the end of the run
            row["note"] = traceback.format_exception_only(type(e), e)[-1].strip()[:200]
        rows.append(row)
    # the variants' artifacts timed in alternating rounds, so that a drift of the device's speed between compiles
    # falls on every variant alike; the median of the rounds' medians
    times = {id(row): [] for row, _ in timed}
    for _ in range(ROUNDS):
        for row, art in timed:
            try:
                times[id(row)].append(run_native(exe, env, art, dev.info.fingerprint, x_path, args.runs, tmp)[0])
            except Exception as e:  # noqa: BLE001
                row["note"] = traceback.format_exception_only(type(e), e)[-1].strip()[:200]
    for row, _ in timed:
        if times[id(row)]:
            row["latency_ms"] = f"{float(np.median(times[id(row)])):.3f}"
            row["rounds_ms"] = " ".join(f"{t:.3f}" for t in times[id(row)])
    for row in rows:
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items() if k not in ("model", "weights", "kept_nodes")),
              flush=True)
    return rows


def write(rows: list, out: Path, fingerprint: str, device_name: str, args) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"precision_{fingerprint}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in FIELDS})
    lines = [f"# Half precision and the precision guard on {device_name} ({fingerprint})", "",
             f"`bench/precision.py --size {args.size} --scope {args.scope} --runs {args.runs}"
             + (f" --log {' '.join(args.log)}" if args.log else "") + (f" --transfer-from {args.transfer_from}"
                                                                      if args.transfer_from else "")
             + f"`, {time.strftime('%Y-%m-%d', time.gmtime())}. Latency: `tuner-run --bench`'s median (transfers "
             f"included), the median of {ROUNDS} rounds that alternate a model's variants. Error: `max |y - ref| / max |ref|` against onnxruntime's float32, one random input (seed 1); "
             "top-1: the same class as onnxruntime's. fp16: `--precision off` (every tensor in half, unchecked); "
             "mixed: `--dtype float16` as compiled by default (the guard's plan, or the all-float32 plan where --scope "
             "auto timed it faster: the plan column)." + (f" {args.note}" if args.note else ""), "",
             "| model | weights | fp32 ms | fp16 ms | mixed ms | fp16 error (python / native), top-1 | "
             "mixed error (python / native), top-1 | fp32 error | mixed plan | kept in fp32 |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- | --- |"]
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["weights"]), {})[r["variant"]] = r

    def err(r):
        if r is None:
            return ""
        if r.get("note"):
            return f"failed: {r['note'][:80]}"
        top = "top-1 same" if r.get("top1_python") == r.get("top1_native") == "same" else \
            f"top-1 {r.get('top1_python')}/{r.get('top1_native')}"
        zeros = f", {r['zeros_native']} zeros" if r.get("zeros_native") not in (None, "", "0%") else ""
        return f"{r.get('err_python', '')} / {r.get('err_native', '')}, {top}{zeros}"

    for (model, weights), v in by.items():
        m = v.get("mixed", {})
        kept = m.get("kept", "")
        names = m.get("kept_nodes", "").split()
        shown = (f"{kept} of {m.get('nodes')}" if kept != "" else "") + (f": {' '.join(names[:6])}{' ...' if len(names) > 6 else ''}" if names else "")
        lines.append(f"| {model} | {weights} | {v.get('fp32', {}).get('latency_ms', '')} | "
                     f"{v.get('fp16', {}).get('latency_ms', '')} | {m.get('latency_ms', '')} | {err(v.get('fp16'))} | "
                     f"{err(m)} | {v.get('fp32', {}).get('err_native', '')} | {m.get('plan', '')} | {shown} |")
    (out / f"precision_{fingerprint}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / f'precision_{fingerprint}.csv'} and .md")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="OpenCL device spec (default: the default device)")
    p.add_argument("--models", default=",".join(ZOO_MODELS), help="comma-separated: zoo names and tv_NAME "
                   f"(default {','.join(ZOO_MODELS)})")
    p.add_argument("--weights", default="calibrated,uncalibrated", help="comma-separated: calibrated, uncalibrated")
    p.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    p.add_argument("--scope", default="auto", choices=("auto", "texture", "buffer"))
    p.add_argument("--log", action="append", help="tuning log(s) for compile (default: none, fallback configs)")
    p.add_argument("--transfer-from", default=None, help="as tuner compile's")
    p.add_argument("--runs", type=int, default=20, help="tuner-run --bench runs (default 20)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "precision"))
    p.add_argument("--note", default="", help="a sentence for the table's header (the host, what shares it)")
    args = p.parse_args(argv)
    import tuner.native as native
    from tuner.runtime.opencl.device import open_device
    dev = open_device(args.device)
    exe = native.build()["tuner_run"]
    env = native.opencl_env()
    env.pop("TUNER_DEVICE", None)
    rows = []
    weights = [w for w in args.weights.split(",") if w]
    bad = [w for w in weights if w not in ("calibrated", "uncalibrated")]
    if bad:
        p.error(f"--weights {','.join(bad)}: calibrated or uncalibrated")
    with tempfile.TemporaryDirectory(prefix="tuner-precision-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            if not name.startswith("tv_") and name not in ZOO_MODELS:
                p.error(f"--models {name}: a zoo model ({', '.join(ZOO_MODELS)}) or tv_NAME")
            for w in weights:
                print(f"{name} {w}", flush=True)
                d = Path(tmp) / f"{name}_{w}"
                d.mkdir()
                rows += bench_model(name, w, args, dev, exe, env, d)
                write(rows, Path(args.out), dev.info.fingerprint, dev.info.name, args)  # as it goes
    return 0


if __name__ == "__main__":
    sys.exit(main())
