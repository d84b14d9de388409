"""Model-coverage benchmark (issue 14): which real ONNX models compile, match onnxruntime, and how fast they run.

    python bench/models.py [--models-dir /tmp/tv_models] [--device D] [--variants texture,buffer,auto,buffer:float16]
                           [--repeats N] [--log PATH|none] [--models REGEX] [--timeout S] [--out DIR]

The models come from ``bench/export_torchvision.py`` (torchvision architectures, random weights, written with a
separate torch virtualenv; the project itself never needs torch). For every ``*.onnx`` in the folder:

- **operators**: the ONNX operators the model uses, and those the frontend has no handler for
  (``tuner.graph.frontend.SUPPORTED_OPS``; column "no handler"), so one row shows what may be missing, not
  only the first failure; an operator of a shape subgraph folded to constants (Shape, Gather) needs none;
- **frontend**: ``load_graph`` (ONNX -> graph, passes) once; when it fails every variant records that error;
- **variants** (``--variants``, default ``texture,buffer,auto,buffer:float16``: scope[:dtype], dtype float32
  unless named): ``tuner.compile_model(model, log=LOG, device=D, scope=..., dtype=...)``, one run on a fixed
  random input (seeded, standard normal), compared with onnxruntime: max relative error = max|a-b| / max|b|,
  a match when it is at most ``--rtol`` (1e-4; ``--rtol16`` 1e-2 for float16 storage);
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
and match onnxruntime).
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

CSV_FIELDS = ["model", "variant", "scope", "dtype", "stage", "compiles", "max_rel_err", "match", "kernels",
              "launches", "tuned_layers", "template_layers", "compile_s", "build_s", "programs_built",
              "ours_median_s", "ours_min_s", "ort_median_s", "ort_min_s", "ratio", "ref_absmax", "error", "onnx_ops",
              "unsupported_ops", "onnx_nodes", "input_shape", "output_shape", "repeats", "ort_threads", "device", "log"]


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


def parse_variants(text: str) -> list:
    out = []
    for v in text.split(","):
        v = v.strip()
        if not v:
            continue
        scope, _, dtype = v.partition(":")
        dtype = dtype or "float32"
        if scope not in ("texture", "buffer", "auto") or dtype not in ("float32", "float16"):
            raise ValueError(f"variant {v!r}: write scope[:dtype], scope texture|buffer|auto, dtype float32|float16")
        out.append((scope, dtype))
    if not out:
        raise ValueError("no variants")
    return out


def variant_name(scope: str, dtype: str) -> str:
    return scope if dtype == "float32" else f"{scope}:{dtype}"


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
        from tuner.graph.frontend import SUPPORTED_OPS
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
            from tuner.graph.compiler import load_graph
            load_graph(path)
        except Exception as e:  # noqa: BLE001
            frontend_error = one_line(e)
    if frontend_error is None:
        try:
            from tuner.runtime import open_device
            dev = open_device(args.device)
        except Exception as e:  # noqa: BLE001
            frontend_error = f"device: {one_line(e)}"
    info["frontend_error"] = frontend_error
    emit(info)

    inputs = [xs[i.name] for i in graph_inputs]
    for scope, dtype in parse_variants(args.variants):
        row = {"kind": "variant", "variant": variant_name(scope, dtype), "scope": scope, "dtype": dtype,
               "compiles": False, "match": False}
        if frontend_error is not None:
            emit({**row, "stage": "frontend", "error": frontend_error})
            continue
        stage = "compile"
        try:
            import warnings

            import tuner
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # one fallback warning per untuned workload: counted below
                # for the device's profile: planned and generated, not built yet, so that the build below can
                # keep program binaries in --cache (a re-run builds only the kernels that changed)
                mod = tuner.compile_model(path, log=args.log, target=dev.info, scope=scope, dtype=dtype)
                row["compile_s"] = time.perf_counter() - t0
                stage = "build"
                t0 = time.perf_counter()
                if args.cache:
                    mod.cache_dir = Path(args.cache)
                mod.load(dev)
            row["build_s"] = time.perf_counter() - t0
            row["programs_built"] = mod.load_stats.get("source")
            row["compiles"] = True
            nodes = mod.spec.nodes
            row["kernels"] = len(nodes)
            row["launches"] = sum(len(n.calls) for n in nodes)
            row["tuned_layers"] = sum(bool(n.tuned) for n in nodes)
            row["template_layers"] = sum(n.template is not None for n in nodes)
            stage = "run"
            outs = mod.run(inputs)
            y, r = np.asarray(outs[0], np.float32), np.asarray(ref[0], np.float32)
            if y.shape != r.shape:
                raise ValueError(f"output shape {list(y.shape)}, onnxruntime's {list(r.shape)}")
            err = float(np.abs(y - r).max() / max(float(np.abs(r).max()), 1e-30))
            if not np.isfinite(err):
                err = float("inf")
            row["max_rel_err"] = err
            tol = args.rtol16 if dtype == "float16" else args.rtol
            row["match"] = err <= tol
            stage = "time"
            row["ours_median_s"], row["ours_min_s"] = steady(lambda: mod.time(args.repeats, warmup=2))
            stage = "done" if row["match"] else "mismatch"
            if not row["match"]:
                row["error"] = f"max relative error {err:.3g} > {tol:g}"
                if dtype == "float16" and info["ref_absmax"] < 6.1e-5:
                    row["error"] += (f" (onnxruntime's output is at most {info['ref_absmax']:.2g}, below float16's "
                                     f"smallest normal 6.1e-05: random weights shrink activations until they underflow)")
            del mod
        except Exception as e:  # noqa: BLE001
            row["error"] = one_line(e)
        emit({**row, "stage": stage})
    return 0


# ------------------------------------------------------------------------------------------- parent (the run)

def run_model(path: Path, args) -> tuple:
    """(model info, [variant rows]) from a worker process; a crash or timeout becomes the error of what is left."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path), "--variants", args.variants,
           "--repeats", str(args.repeats), "--seed", str(args.seed), "--rtol", str(args.rtol),
           "--rtol16", str(args.rtol16), "--log", args.log or "none", "--cache", args.cache or "none"]
    if args.device:
        cmd += ["--device", args.device]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    why = None
    try:
        out, err = proc.communicate(timeout=args.timeout)
        if proc.returncode != 0:
            tail = [ln for ln in err.strip().splitlines() if ln.strip()]
            why = f"worker exited with status {proc.returncode}" + (f": {tail[-1].strip()[:300]}" if tail else "")
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        why = f"timed out after {args.timeout} s"
    results = [json.loads(line[len(MARK):]) for line in out.splitlines() if line.startswith(MARK)]
    info = next((r for r in results if r.get("kind") == "model"), {"error": why or "worker wrote no result"})
    rows = [r for r in results if r.get("kind") == "variant"]
    done = {r["variant"] for r in rows}
    for scope, dtype in parse_variants(args.variants):
        name = variant_name(scope, dtype)
        if name not in done:
            rows.append({"variant": name, "scope": scope, "dtype": dtype, "compiles": False, "match": False,
                         "stage": "worker", "error": info.get("error") or why or "no result"})
    return info, rows


def fmt_err(v) -> str:
    if v is None or v == "":
        return "-"
    return "inf" if v == float("inf") else f"{v:.1e}"


def fmt_ms(v) -> str:
    return "-" if v in (None, "") else f"{v * 1e3:.2f}"


def summarize(models: list, variants: list, meta: dict) -> str:
    """Markdown: one row per model, then the failures by operator and the summary line."""
    names = [variant_name(*v) for v in variants]
    f32 = [variant_name(*v) for v in variants if v[1] == "float32"]
    lat = "auto" if "auto" in f32 else (f32[0] if f32 else names[0])
    lines = [f"# Model coverage: `{meta['fingerprint']}`", "",
             f"- device: `{meta['device']}`, fingerprint `{meta['fingerprint']}`; CPU {meta['cpu']} "
             f"({meta['ncpu']} CPUs), load average {meta['load'][0]:.1f} -> {meta['load'][1]:.1f}",
             f"- models: `{meta['models_dir']}` ({meta['n']} files, input {meta['input_sizes']}), "
             f"{meta['date']}, {meta['elapsed_s'] / 60:.1f} min",
             f"- variants: {', '.join(names)} (scope[:storage dtype]); match: max|ours - ort| / max|ort| <= "
             f"{meta['rtol']:g} (float16 storage {meta['rtol16']:g}); tuning log: {meta['log'] or 'none'}",
             f"- latency: median of {meta['repeats']} runs, ours ({lat} scope, `Module.time`) vs onnxruntime "
             f"{meta['ort']} (CPUExecutionProvider, {meta['threads']} threads); ratio = ort / ours, above 1: "
             f"ours is faster", "",
             "| model | ONNX operators used | no handler | " + " | ".join(f"compiles {n}" for n in names) + " | "
             + " | ".join(f"max rel err {n}" for n in names) + " | kernels | tuned layers | "
             f"ours ms ({lat}) | ort ms | ratio | first error |",
             "| --- | --- | --- | " + " | ".join("---" for _ in names) + " | " + " | ".join("---:" for _ in names)
             + " | ---: | ---: | ---: | ---: | ---: | --- |"]
    ok_models, by_op, per_variant = 0, {}, {n: 0 for n in names}
    for name, info, rows in models:
        rows = {r["variant"]: r for r in rows}
        comp = ["yes" if rows.get(n, {}).get("compiles") else "no" for n in names]
        errs = []
        for n in names:
            r = rows.get(n, {})
            e = fmt_err(r.get("max_rel_err"))
            errs.append(e if r.get("match") or e == "-" else f"**{e}**")
            per_variant[n] += bool(r.get("match"))
        lr = rows.get(lat, {})
        kern = lr.get("kernels", next((r.get("kernels") for r in rows.values() if r.get("kernels")), None))
        tl = (f"{lr['tuned_layers']} of {lr['template_layers']}" if lr.get("template_layers") is not None else "-")
        ours, ort_s = lr.get("ours_median_s"), info.get("ort_median_s")
        ratio = f"{ort_s / ours:.2f}" if ours and ort_s else "-"
        first = next((r.get("error") for r in rows.values() if r.get("error")), info.get("error") or "")
        if all(rows.get(n, {}).get("match") for n in f32):
            ok_models += 1
        else:
            bad = next((rows.get(n, {}) for n in f32 if not rows.get(n, {}).get("match")), {})
            op = failed_op(bad.get("error") or first) or bad.get("stage", "?")
            by_op.setdefault(op, []).append(name)
        unsupported = info.get("unsupported_ops")
        lines.append(f"| {name} | {' '.join(info.get('onnx_ops', [])) or '-'} | "
                     f"{' '.join(unsupported) if unsupported else ('-' if unsupported is not None else '?')} | "
                     + " | ".join(comp) + " | " + " | ".join(errs) + f" | {kern if kern is not None else '-'} | "
                     f"{tl} | {fmt_ms(ours)} | {fmt_ms(ort_s)} | {ratio} | {first.replace('|', '/') or '-'} |")
    lines += ["", "First failure by operator (or stage): "
              + ("; ".join(f"{op}: {', '.join(ms)}" for op, ms in sorted(by_op.items(), key=lambda kv: -len(kv[1])))
                 or "none"),
              "", "Per variant, models that compile and match: "
              + ", ".join(f"{n} {per_variant[n]} of {meta['n']}" for n in names),
              "", f"**{ok_models} of {meta['n']} compile and match** (every float32 variant: "
              f"{', '.join(f32)})", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models-dir", default="/tmp/tv_models",
                    help="folder of .onnx files (default /tmp/tv_models, from bench/export_torchvision.py)")
    ap.add_argument("--models", metavar="REGEX", help="only models whose file name matches")
    ap.add_argument("--device", default=os.environ.get("TUNER_DEVICE"),
                    help="OpenCL device spec as in `tuner devices` (default: the default device, $TUNER_DEVICE)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help=f"comma-separated scope[:dtype] (default {DEFAULT_VARIANTS})")
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
    ap.add_argument("--worker", metavar="MODEL.onnx", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        ap.error(str(e))
    if args.worker:
        args.log = None if args.log in (None, "none") else args.log
        args.cache = None if args.cache in (None, "", "none") else args.cache
        return worker(args)

    from tuner.errors import TunerError
    from tuner.runtime import open_device
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
    if args.models:
        paths = [p for p in paths if re.search(args.models, p.stem)]
    if not paths:
        print(f"error: no .onnx files in {args.models_dir}" + (f" matching {args.models!r}" if args.models else "")
              + "; export them with `/tmp/torchvenv/bin/python bench/export_torchvision.py`", file=sys.stderr)
        return 2
    import onnxruntime as ort
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"models_{device.fingerprint}"
    csv_path, md_path = out / f"{stem}.csv", out / f"{stem}.md"
    print(f"device {info.platform} / {info.name} ({device.fingerprint}); {len(paths)} models from {args.models_dir}; "
          f"variants {args.variants}; log {args.log or 'none'}; onnxruntime {ort.__version__} with "
          f"{args.threads or cpu_count()} threads -> {csv_path}", flush=True)

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
            "repeats": args.repeats, "ort": ort_version, "threads": args.threads or cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
