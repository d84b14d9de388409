"""Whole-model runtimes on a GPU in one job: the Python executor, the native runtime (tuner-run), the Python
executor of an older tree, and PyTorch eager and CUDA-graph replay, on the same models and the same input.

    # on the machine with the GPU (bench/runtimes_gpu.sh installs the wheels and registers NVIDIA's OpenCL first)
    python3 -P bench/runtimes_gpu.py all --out OUT [--device nvidia] [--log logs/nvidia-gpu-fcae3850.jsonl]
        [--models resnet18,mobilenet_v2,mobilenet_v3_large] [--input-size 224] [--repeats 50] [--warmup 10]
        [--rounds 3] [--new-tree DIR] [--old-tree DIR] [--deadline 560]
    # anywhere, before: the trees to compare, as `git archive` snapshots (untracked; delete them afterwards)
    python bench/runtimes_gpu.py prepare --new HEAD --old 4d2b635     # -> bench/_trees/{new,old}
    python bench/runtimes_gpu.py table --out OUT                       # runtimes_gpu.json -> .csv and .md again

Float32, batch 1, one random input (seed 0) for every side. Models: the zoo's ``resnet18`` and ``mobilenet_v2``
(``tuner zoo NAME -o M.onnx --input-size S``) and torchvision's ``mobilenet_v3_large`` with random weights
(``bench/export_torchvision.py``'s build, BatchNorm statistics calibrated on 2 random batches so activations
keep their scale; exported with torch's TorchScript exporter on the CPU; skipped if torchvision is missing).

Each side runs in its own process, one after the other, so that no two share the GPU's context:

1. ``ours`` (the new tree, no torch imported): ``compile_model(M.onnx, log, device, scope="auto")`` per log
   variant (below), what compile says (tuned layers, the plan ``--scope auto`` kept and each plan's time, the
   warnings), the output against onnxruntime's, then per round ``Module.time(repeats, warmup)`` (kernels
   only: enqueue every kernel on the run queue and wait; inputs already on the device) and ``Module.run(x)``
   (upload, kernels, download: wall clock, ``warmup`` untimed first), and the artifact saved for 2.
2. ``native``: ``make -C TREE/native cli`` builds tuner-run, which then runs each saved artifact once per round:
   ``tuner-run ART --device D --input x.npy --output y.npy --bench repeats --warmup warmup`` (whole runs:
   input written, kernels, output read), ``--profile`` in the first round for the kernel sum.
   OpenCL: the system's libOpenCL.so.1 when it finds the device, else ``tuner.native.opencl_env()``
   (pyopencl's bundled ICD loader over the same vendor files).
3. ``torch``: PyTorch eager over the same graph (zoo models: the tuner graph with BatchNorm folded, as
   ``bench/gpu.py`` runs it; MobileNetV3-Large: the torchvision module, BatchNorm folded into the
   convolutions) and its CUDA-graph replay, each without transfers (input already on the GPU, wait for the
   GPU) and with them (pageable host tensor copied in, run, output copied back). TF32 off, cudnn.benchmark on.
4. ``ours`` again with the old tree's Python executor (``--old-tree``): compile and time as 1.

Every time is a wall clock (time.perf_counter) median of ``repeats`` runs after ``warmup``; a side's figure is
the median of its ``rounds`` such medians (all kept in runtimes_gpu.json).

Log variants: ``log`` is ``--log`` as given. A log's records apply only to the device fingerprint they were
measured on (platform, device name, driver); when the device here has another fingerprint than the log's,
compile finds no tuned config and says so, and the variant ``relabeled`` is measured too: the same records
with this device's fingerprint, name, platform and driver written in (the other device's best configs,
deployed here untuned), named as such in every table.

Writes OUT/runtimes_gpu.{json,csv,md} and OUT/runtimes_gpu.log (every stage's output).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402  (bench/harness.py: the job, its shell and log, medians; shared with bench/peers.py)
import mnn  # noqa: E402  (bench/mnn.py: MNN's build, conversion and runs, shared with bench/peers.py)
ZOO = ("resnet18", "mobilenet_v2")
TORCHVISION = ("mobilenet_v3_large",)
MODELS = ZOO + TORCHVISION
def _variants(spec: str) -> list:
    """``name=path,name=path`` -> [(name, path)]."""
    return [tuple(v.split("=", 1)) for v in spec.split(",") if v]


# -- prepare (anywhere with git) -----------------------------------------------------------------------------
def cmd_prepare(args) -> int:
    """`git archive` snapshots of the trees to compare under bench/_trees/ (a COMMIT file in each): what the
    job imports, so that edits in the working tree during a run change nothing."""
    base = BENCH / "_trees"
    for name, rev in (("new", args.new), ("old", args.old)):
        if not rev:
            continue
        dest = base / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True,
                                text=True, check=True).stdout.strip()
        paths = [p for p in ("tuner", "templates", "search_space", "native")
                 if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{rev}:{p}"],
                                  capture_output=True).returncode == 0]
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, *paths], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        (dest / "COMMIT").write_text(commit + "\n")
        print(f"{name}: {rev} = {commit} -> {dest} ({', '.join(paths)})")
    return 0


# -- export (a process with torch on the CPU, no OpenCL) -----------------------------------------------------
def cmd_export(args) -> int:
    """The ONNX files, the input and onnxruntime's outputs under WORK; MobileNetV3-Large's torch module too."""
    import onnxruntime as ort
    work = Path(args.work)
    (work / "models").mkdir(parents=True, exist_ok=True)
    size = args.input_size
    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    np.save(work / "x.npy", x)
    done = harness.load_json(work / "export.json", {})
    for name in args.models.split(","):
        path = work / "models" / f"{name}.onnx"
        t0 = time.perf_counter()
        try:
            if name in ZOO or not (name in TORCHVISION or name.startswith("tv_")):  # the zoo's, by the CLI
                subprocess.run([sys.executable, "-P", "-m", "tuner", "zoo", name, "-o", str(path),
                                "--input-size", str(size)], check=True)
            elif name in TORCHVISION or name.startswith("tv_"):  # tv_NAME: torchvision's NAME (bench/peers.py)
                import torch
                sys.path.insert(0, str(BENCH))
                import export_torchvision as tv
                model = tv.build(name[3:] if name.startswith("tv_") else name, 0)
                tv.calibrate_batch_norm(model, size, 2, 0)
                xt = torch.from_numpy(x)
                with torch.no_grad():
                    torch.onnx.export(model, (xt,), str(path), dynamo=False, input_names=["input"],
                                      output_names=["output"], opset_version=17, do_constant_folding=True)
                    y_torch = model(xt).numpy()
                torch.save(model, work / "models" / f"{name}.pt")
                np.save(work / f"torch_cpu_{name}.npy", y_torch)
            else:
                raise ValueError(f"unknown model {name}")
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            inp = sess.get_inputs()[0].name
            ref = sess.run(None, {inp: x})[0]
            np.save(work / f"ref_{name}.npy", ref)
            done[name] = {"ok": True, "seconds": time.perf_counter() - t0, "output_shape": list(ref.shape),
                          "max_abs_output": float(np.abs(ref).max())}
            if name in TORCHVISION or name.startswith("tv_"):
                done[name]["torch_cpu_vs_onnxruntime"] = harness.rel_err(y_torch, ref)
        except Exception as e:  # a model that cannot be exported is reported, never the end of the job
            done[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        print(f"export {name}: {json.dumps(done[name])}", flush=True)
        harness.save_json(work / "export.json", done)
    return 0


# -- ours: the Python executor of one tree (a process without torch) -----------------------------------------
def _digest(mod) -> str:
    """What the GPU runs, independent of file names: each launch's kernel source, entry point and sizes."""
    import hashlib
    h = hashlib.sha256()
    for n in mod.spec.nodes:
        src = mod.sources[n.source]
        h.update(hashlib.sha256(src.encode() if isinstance(src, str) else src).digest())
        for c in n.calls:
            h.update(f"{c.kernel}|{list(c.global_size)}|{list(c.local_size)}".encode())
    return h.hexdigest()[:16]


def cmd_ours(args) -> int:
    import tuner
    from tuner.compile.compiler import compile_model
    assert "torch" not in sys.modules, "ours is timed in a process without PyTorch's CUDA context"
    work = Path(args.work)
    x = np.load(work / "x.npy")
    out_path = work / f"ours_{args.tree}.json"
    rows = harness.load_json(out_path, [])
    tree_commit = (Path(tuner.__file__).resolve().parents[1] / "COMMIT")
    commit = tree_commit.read_text().strip() if tree_commit.exists() else ""
    for variant, log in _variants(args.variants):
        for name in args.models.split(","):
            onnx_path = work / "models" / f"{name}.onnx"
            if not onnx_path.exists():
                continue
            ref = np.load(work / f"ref_{name}.npy")
            row = {"tree": args.tree, "commit": commit, "tuner_file": tuner.__file__, "variant": variant,
                   "log": log, "model": name}
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    t0 = time.perf_counter()
                    mod = compile_model(str(onnx_path), log=log, device=args.device, scope="auto", dtype="float32")
                    row["compile_s"] = time.perf_counter() - t0
                msgs = [str(w.message) for w in caught]
                kinds = {}
                for m in msgs:
                    k = re.sub(r"\{.*\}", "{...}", m)[:160]
                    kinds[k] = kinds.get(k, 0) + 1
                tuned = sum(bool(n.tuned) for n in mod.spec.nodes)
                total = sum(n.template is not None for n in mod.spec.nodes)
                moved = sum((getattr(n, "config_source", None) or "").startswith("transferred") for n in mod.spec.nodes)
                dev = mod.device
                info = getattr(dev, "info", None)
                row.update({
                    "device": getattr(info, "name", ""), "driver": getattr(info, "driver_version", ""),
                    "fingerprint": getattr(info, "fingerprint", ""),
                    "tuned_layers": tuned, "layers": total, "kernels": sum(len(n.calls) for n in mod.spec.nodes),
                    "compile_says": f"{tuned} of {total} tuned layers from the log"
                                    + (f", {moved} with the config of a nearby tuned workload" if moved else ""),
                    "transferred_layers": moved,
                    "plan_kept": getattr(mod, "plan_kept", ""),
                    "plan_times_ms": {k: v * 1e3 for k, v in getattr(mod, "plan_times", {}).items()},
                    "warnings": len(msgs), "warning_kinds": dict(list(kinds.items())[:6]),
                    "plan_digest": _digest(mod)})
                y = mod.run([x])[0]
                row["rel_err_vs_onnxruntime"] = harness.rel_err(y, ref)
                if args.save:
                    art = work / f"art_{args.tree}_{variant}_{name}"
                    mod.save(art)
                    row["artifact"] = str(art)
                kern, run = [], []
                for _ in range(args.rounds):
                    kern.append(statistics.median(mod.time(args.repeats, warmup=args.warmup)))
                    run.append(harness.wall(lambda: mod.run([x]), args.repeats, args.warmup))
                row.update({"kernels_only_rounds_s": kern, "run_rounds_s": run,
                            "kernels_only_s": statistics.median(kern), "run_s": statistics.median(run)})
                try:
                    prof = mod.profile(10)
                    row["kernel_sum_s"] = prof["kernel_total_s"]
                except Exception as e:  # the profile is context, not a result
                    row["kernel_sum_error"] = f"{type(e).__name__}: {e}"[:200]
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"ours {args.tree} {variant} {name}: " + json.dumps(
                {k: row.get(k) for k in ("compile_says", "plan_kept", "plan_times_ms", "kernels_only_s", "run_s",
                                         "kernel_sum_s", "rel_err_vs_onnxruntime", "warnings", "warning_kinds",
                                         "plan_digest", "error")}, default=str), flush=True)
            rows = [r for r in rows if (r["variant"], r["model"]) != (variant, name)] + [row]
            harness.save_json(out_path, rows)
    return 0


# -- torch (a process without OpenCL) ------------------------------------------------------------------------
def _fuse_bn(model):
    """Every Conv2d followed by its BatchNorm2d folded into one Conv2d (eval mode): torch.fx's fuse where the
    module traces (ResNet's blocks keep their BatchNorm outside any Sequential), else every Conv2d directly
    followed by a BatchNorm2d in a Sequential."""
    import torch
    try:
        from torch.fx.experimental.optimization import fuse
        return fuse(model.eval())
    except Exception:  # a module fx cannot trace: the Sequential pairs below
        pass
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    for m in model.modules():
        if isinstance(m, torch.nn.Sequential):
            names = list(m._modules)
            for a, b in zip(names, names[1:]):
                c, bn = m._modules[a], m._modules[b]
                if isinstance(c, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
                    m._modules[a] = fuse_conv_bn_eval(c, bn)
                    m._modules[b] = torch.nn.Identity()
    return model


def cmd_torch(args) -> int:
    import torch
    sys.path.insert(0, str(BENCH))
    import gpu as G
    from tuner.compile.compiler import load_graph
    G._torch_fp32()
    dev = G._tdev()
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    work = Path(args.work)
    x = np.load(work / "x.npy")
    rows = []
    for name in args.models.split(","):
        onnx_path = work / "models" / f"{name}.onnx"
        if not onnx_path.exists():
            continue
        ref = np.load(work / f"ref_{name}.npy")
        row = {"model": name, "torch": torch.__version__, "gpu": G._gpu_name(),
               "cudnn": torch.backends.cudnn.version() if dev == "cuda" else None}
        try:
            if name in ZOO:
                fn = G._torch_graph(load_graph(str(onnx_path)), "float32")
                row["torch_graph_of"] = "the tuner graph, BatchNorm folded (bench/gpu.py _torch_graph)"
            else:
                module = _fuse_bn(torch.load(work / "models" / f"{name}.pt", weights_only=False).eval()).to(dev)
                fn = module
                row["torch_graph_of"] = "the torchvision module, BatchNorm folded into the convolutions"
            x_host = torch.from_numpy(x)  # pageable, as NumPy's memory is for ours
            x_dev = x_host.to(dev)
            with torch.no_grad():
                row["eager_rel_err"] = harness.rel_err(fn(x_dev).float().cpu().numpy(), ref)
                eager, eager_io = [], []
                for _ in range(args.rounds):
                    eager.append(harness.wall(lambda: fn(x_dev), args.repeats, args.warmup, sync))
                    eager_io.append(harness.wall(lambda: fn(x_host.to(dev)).cpu(), args.repeats, args.warmup, sync))
                row.update({"eager_rounds_s": eager, "eager_io_rounds_s": eager_io,
                            "eager_s": statistics.median(eager), "eager_io_s": statistics.median(eager_io)})
                if dev == "cuda":
                    static_x = x_dev.clone()
                    graph, static_y = G._capture(lambda: fn(static_x), lambda: fn(static_x))
                    graph.replay()
                    sync()
                    row["graph_rel_err"] = harness.rel_err(static_y.float().cpu().numpy(), ref)

                    def replay_io():
                        static_x.copy_(x_host)
                        graph.replay()
                        return static_y.cpu()
                    gr, gr_io = [], []
                    for _ in range(args.rounds):
                        gr.append(harness.wall(graph.replay, args.repeats, args.warmup, sync))
                        gr_io.append(harness.wall(replay_io, args.repeats, args.warmup, sync))
                    row.update({"graph_rounds_s": gr, "graph_io_rounds_s": gr_io,
                                "graph_s": statistics.median(gr), "graph_io_s": statistics.median(gr_io),
                                "graph_event_s": G._cuda_time(graph.replay, repeats=args.repeats)})
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        print(f"torch {name}: " + json.dumps({k: v for k, v in row.items() if not k.endswith("rounds_s")},
                                             default=str), flush=True)
        rows.append(row)
        harness.save_json(work / "torch.json", rows)
    return 0


# -- the job ---------------------------------------------------------------------------------------------------
class Job(harness.Job):
    LOG = "runtimes_gpu.log"

    def __init__(self, args):
        if not args.resume and args.cmd == "all":
            shutil.rmtree(Path(args.work), ignore_errors=True)
        super().__init__(args)

    def env(self, tree) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve())] +
                                            [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def child(self, sub: str, tree, *extra) -> int:
        a = self.args
        cmd = [sys.executable, "-P", str(Path(__file__).resolve()), sub, "--work", str(self.work), "--models",
               a.models, "--input-size", a.input_size, "--repeats", a.repeats, "--warmup", a.warmup,
               "--rounds", a.rounds, "--device", a.device, *extra]
        return self.sh(cmd, env=self.env(tree))[0]


def _relabel(log: str, info: dict, dest: Path) -> dict:
    """The log's records with ``info``'s fingerprint, name, platform and driver; (counts of records)."""
    n, fps = 0, {}
    with open(log) as f, open(dest, "w") as g:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            fps[r.get("device")] = fps.get(r.get("device"), 0) + 1
            r.update({"device": info["fingerprint"], "device_name": info["name"], "platform": info["platform"],
                      "driver": info["driver_version"]})
            g.write(json.dumps(r) + "\n")
            n += 1
    return {"records": n, "log_fingerprints": fps}


def _native(job: Job, meta: dict, variants: list) -> list:
    a = job.args
    build = job.work / "native"
    if "native_opencl" in meta:  # built and probed for an earlier variant
        return _native_runs(job, meta, variants, build / "tuner-run", meta["_native_env"])
    rc, text = job.sh(["make", "-C", Path(a.new_tree) / "native", f"BUILD={build}", f"-j{min(8, os.cpu_count() or 1)}",
                       "cli"], quiet=True)
    exe = build / "tuner-run"
    if rc or not exe.exists():
        meta["native_error"] = "build failed: " + text[-800:]
        return []
    env = dict(os.environ)
    rc, text = job.sh([exe, "--devices"], env=env)
    how = "system libOpenCL.so.1 (ICD loader), /etc/OpenCL/vendors"
    if rc or a.device.lower() not in text.lower():
        sys.path.insert(0, str(Path(a.new_tree).resolve()))
        from tuner.native import opencl_env
        env = opencl_env(dict(os.environ))
        how = f"TUNER_OPENCL_LIB={env.get('TUNER_OPENCL_LIB')} (pyopencl's ICD loader), OCL_ICD_VENDORS={env.get('OCL_ICD_VENDORS')}"
        rc, text = job.sh([exe, "--devices"], env=env)
    meta["native_opencl"] = how
    meta["native_devices"] = text.strip()[-1500:]
    meta["_native_env"] = env
    return _native_runs(job, meta, variants, exe, env)


def _native_runs(job: Job, meta: dict, variants: list, exe: Path, env: dict) -> list:
    a = job.args
    rows = harness.load_json(job.work / "native.json", [])
    ours = harness.load_json(job.work / "ours_new.json", [])
    for variant, _ in variants:
        for name in a.models.split(","):
            art = job.work / f"art_new_{variant}_{name}"
            if not art.exists():
                continue
            ref = np.load(job.work / f"ref_{name}.npy")
            row = {"variant": variant, "model": name, "artifact": str(art), "rounds_s": [], "rel_err_vs_onnxruntime": None}
            for r in range(a.rounds):
                if job.left() < 20:
                    row["note"] = "deadline: fewer rounds"
                    break
                y = job.work / f"y_native_{variant}_{name}.npy"
                cmd = [exe, art, "--device", a.device, "--input", job.work / "x.npy", "--output", y,
                       "--bench", a.repeats, "--warmup", a.warmup] + (["--profile"] if r == 0 else [])
                rc, text = job.sh(cmd, env=env, quiet=r > 0)
                s = harness.latency_s(text)
                if rc or s is None:
                    row["error"] = text.strip()[-500:]
                    break
                row["rounds_s"].append(s)
                k = re.search(r"kernels ([0-9.]+) ms, end to end ([0-9.]+) ms", text)
                if k:
                    row["kernel_sum_s"] = float(k.group(1)) * 1e-3
                ld = re.search(r"loaded .*", text)
                if ld and r == 0:
                    row["loaded"] = ld.group(0)
                if y.exists():
                    row["rel_err_vs_onnxruntime"] = harness.rel_err(np.load(y), ref)
            row["run_s"] = harness.median(row["rounds_s"])
            # the same runs with the inputs and outputs staged in ordinary memory (TUNER_RUN_PINNED=0)
            row["unpinned_rounds_s"] = []
            for r in range(a.rounds if row["rounds_s"] else 0):
                if job.left() < 20:
                    break
                rc, text = job.sh([exe, art, "--device", a.device, "--input", job.work / "x.npy", "--bench", a.repeats,
                                   "--warmup", a.warmup], env={**env, "TUNER_RUN_PINNED": "0"}, quiet=True)
                s = harness.latency_s(text)
                if rc or s is None:
                    break
                row["unpinned_rounds_s"].append(s)
            row["run_unpinned_s"] = harness.median(row["unpinned_rounds_s"])
            py = next((o for o in ours if (o["variant"], o["model"]) == (variant, name)), {})
            if row["run_s"] and py.get("kernels_only_s"):
                row["over_python_kernels_only"] = row["run_s"] / py["kernels_only_s"]
            job.say(f"native {variant} {name}: " + json.dumps({k: v for k, v in row.items() if k != "artifact"}))
            rows.append(row)
            harness.save_json(job.work / "native.json", rows)
    return [r for r in rows if r["variant"] in {v for v, _ in variants}]


def _mnn_build(job: Job, meta: dict):
    """benchmark.out, built from ``--mnn-src`` into ``--mnn-build`` unless it is there (bench/mnn.py)."""
    exe = mnn.build(job.sh, job.args.mnn_src, job.args.mnn_build, meta=meta)
    if exe is None:
        job.say(meta.get("mnn_error", "MNN: no benchmark.out"))
    elif "mnn_build_s" in meta:
        job.say(f"MNN built in {meta['mnn_build_s']:.0f} s: {exe}")
    return exe


def cmd_mnn_build(args) -> int:
    """Build MNN's benchmark.out alone (a job may start it in the background before the timed stages)."""
    job = Job(args)
    meta: dict = {}
    exe = _mnn_build(job, meta)
    harness.save_json(job.out / "mnn_build.json", {k: v for k, v in meta.items()})
    return 0 if exe else 1


def _mnn(job: Job, meta: dict) -> list:
    """MNN's OpenCL backend on the same models (bench/mnn.py: built from ``--mnn-src`` into ``--mnn-build``,
    kept between calls; each exported ONNX file converted by the ``MNN`` wheel's mnnconvert; ``benchmark.out
    DIR repeats warmup 3 MODE 1``). Its times include the input upload and the output download; it prints the
    mean (and min, max) of its runs, not a median. Each mode once, then the best mode's mean ``rounds`` times
    in all."""
    a = job.args
    rows = harness.load_json(job.work / "mnn.json", [])
    build = Path(a.mnn_build)
    exe = _mnn_build(job, meta)
    if exe is None:
        return rows
    site = build / "site"
    err = mnn.install_converter(job.sh, a.mnn_wheel, site)
    env, meta["mnn_opencl"] = mnn.opencl_env(job.sh, build)
    modes = [int(m) for m in a.mnn_modes.split(",")]
    for name in a.models.split(","):
        onnx_path = job.work / "models" / f"{name}.onnx"
        if not onnx_path.exists() or any(r["model"] == name and not r.get("error") for r in rows):
            continue
        rows = [r for r in rows if r["model"] != name]  # an earlier try that failed (a deadline) is tried again
        d = build / "models" / f"{name}-{a.input_size}"  # a converted model is kept: one per size
        row = {"model": name, "modes": {}, "rounds_mean_s": []}
        err = err or mnn.convert(job.sh, onnx_path, d / f"{name}.mnn", site)
        if err:
            row["error"] = err
            rows.append(row)
            harness.save_json(job.work / "mnn.json", rows)
            continue

        def bench(mode: int):
            got = mnn.bench(job.sh, exe, d, a.repeats, a.warmup, mode, env, timeout=min(240.0, job.left()))
            return (None, got["error"]) if "error" in got else (got, None)
        for mode in modes:
            if job.left() < 30:
                row["note"] = "deadline: fewer modes"
                break
            got, err = bench(mode)
            row["modes"][str(mode)] = got or {"error": err}
        ok = {m: v for m, v in row["modes"].items() if "mean_s" in v}
        if ok:
            best = min(ok, key=lambda m: ok[m]["mean_s"])
            row["best_mode"] = int(best)
            row["rounds_mean_s"] = [ok[best]["mean_s"]]
            for _ in range(a.rounds - 1):
                if job.left() < 30:
                    break
                got, _ = bench(int(best))
                if got:
                    row["rounds_mean_s"].append(got["mean_s"])
            row["run_s"] = harness.median(row["rounds_mean_s"])
        else:
            row["error"] = "; ".join(f"mode {m}: {v.get('error')}" for m, v in row["modes"].items())[:600]
        job.say(f"mnn {name}: " + json.dumps(row))
        rows.append(row)
        harness.save_json(job.work / "mnn.json", rows)
    return rows


def cmd_all(args) -> int:
    job = Job(args)
    a = args
    meta = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "models": a.models,
            "input_size": a.input_size, "repeats": a.repeats, "warmup": a.warmup, "rounds": a.rounds,
            "device_spec": a.device, "log": a.log}
    for tag, tree in (("new", a.new_tree), ("old", a.old_tree)):
        if tree:
            c = Path(tree) / "COMMIT"
            meta[f"{tag}_tree"] = f"{tree} ({c.read_text().strip()})" if c.exists() else str(tree)
    rc, text = job.sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], quiet=True)
    meta["nvidia_smi"] = text.strip() if rc == 0 else "n/a"
    rc, text = job.sh(["sh", "-c", "ldconfig -p | grep -i -E 'libOpenCL|libnvidia-opencl' ; cat /etc/OpenCL/vendors/*.icd"],
                      quiet=True)
    meta["opencl_libs"] = text.strip()
    info = job.device_info([sys.executable, "-P", "-m", "tuner"], env=job.env(job.args.new_tree))
    meta["device"] = {k: info.get(k) for k in ("name", "platform", "driver_version", "fingerprint", "error")}
    job.say("device " + json.dumps(meta["device"]))
    with open(a.log) as f:
        first = json.loads(next(ln for ln in f if ln.strip()))
    meta["log_fingerprint"] = first.get("device")
    variants = [("log", str(Path(a.log).resolve()))]
    if info.get("fingerprint") and info["fingerprint"] != first.get("device"):
        rel = job.work / f"relabeled-{info['fingerprint']}.jsonl"
        meta["relabeled"] = _relabel(a.log, info, rel)
        job.say(f"the log is of {first.get('device')} ({first.get('device_name')}, driver {first.get('driver')}); "
                f"this device is {info['fingerprint']}: variant 'relabeled' = {rel}")
        variants.append(("relabeled", str(rel)))
    if a.only_variants:
        variants = [v for v in variants if v[0] in a.only_variants.split(",")] or variants[:1]  # the log's own GPU
    meta["variants"] = variants
    harness.save_json(job.out / "runtimes_gpu.json", {"meta": meta})

    def flush() -> None:  # after every stage: a job cut short keeps what it measured
        result = {"meta": {k: v for k, v in meta.items() if not k.startswith("_")},
                  "export": harness.load_json(job.work / "export.json", {}),
                  "ours_new": harness.load_json(job.work / "ours_new.json", []),
                  "ours_old": harness.load_json(job.work / "ours_old.json", []),
                  "native": harness.load_json(job.work / "native.json", []),
                  "torch": harness.load_json(job.work / "torch.json", []),
                  "mnn": harness.load_json(job.work / "mnn.json", [])}
        harness.save_json(job.out / "runtimes_gpu.json", result)
        write_tables(result, job.out)

    models = a.models.split(",")

    def done(stage: str, variant: str | None = None) -> bool:
        """--resume (a second call on the same machine, WORK kept): is this stage's every model there?"""
        if not a.resume:
            return False
        if stage == "export":
            return all(name in harness.load_json(job.work / "export.json", {}) for name in models)
        rows = harness.load_json(job.work / f"{stage}.json", [])
        have = {r["model"] for r in rows if r.get("variant", variant) == variant and not r.get("error")}
        ok = {n for n, e in harness.load_json(job.work / "export.json", {}).items() if e.get("ok")}
        return ok <= have
    if not done("export"):
        job.child("export", a.new_tree)
    skipped = []
    for i, (name, path) in enumerate(variants):  # the log as given first; each variant whole before the next
        one = f"{name}={path}"
        if done("ours_new", name) and done("native", name):
            pass
        elif job.left() > 60:
            job.child("ours", a.new_tree, "--tree", "new", "--variants", one, "--save")
            flush()
            _native(job, meta, [(name, path)])
        else:
            skipped.append(f"new+native {name}")
        flush()
        if i == 0 and not done("torch"):
            if job.left() > 30:
                job.child("torch", a.new_tree)
            else:
                skipped.append("torch")
            flush()
        if i == 0 and a.mnn_src:
            if job.left() > 60:
                _mnn(job, meta)
            else:
                skipped.append("mnn")
            flush()
        if a.old_tree and not done("ours_old", name):
            if job.left() > 60:
                job.child("ours", a.old_tree, "--tree", "old", "--variants", one)
            else:
                skipped.append(f"old {name}")
            flush()
    meta["skipped_for_deadline"] = skipped
    meta["finished_after_s"] = time.time() - job.t0
    flush()
    job.say((job.out / "runtimes_gpu.md").read_text())
    return 0


# -- tables ----------------------------------------------------------------------------------------------------
def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "–"


def table_rows(result: dict) -> list:
    rows = []
    torch_by = {t["model"]: t for t in result.get("torch", [])}
    mnn_by = {m["model"]: m for m in result.get("mnn", [])}
    for o in result.get("ours_new", []):
        key = (o["variant"], o["model"])
        nat = next((n for n in result.get("native", []) if (n["variant"], n["model"]) == key), {})
        old = next((p for p in result.get("ours_old", []) if (p["variant"], p["model"]) == key), {})
        t = torch_by.get(o["model"], {})
        rows.append({
            "model": o["model"], "variant": o["variant"], "device": o.get("device"), "driver": o.get("driver"),
            "compile_says": o.get("compile_says"),
            "tuned": (f"{o['tuned_layers']} of {o['layers']}" + (f" (+{o['transferred_layers']} transferred)"
                                                                  if o.get("transferred_layers") else "")
                      if "tuned_layers" in o else "–"),
            "plan_kept": o.get("plan_kept"), "kernels": o.get("kernels"),
            "py_kernels_only_s": o.get("kernels_only_s"), "py_run_s": o.get("run_s"),
            "py_kernel_sum_s": o.get("kernel_sum_s"), "native_run_s": nat.get("run_s"),
            "native_kernel_sum_s": nat.get("kernel_sum_s"),
            "native_over_py_kernels_only": (nat["run_s"] / o["kernels_only_s"]) if nat.get("run_s") and o.get("kernels_only_s") else None,
            "old_py_kernels_only_s": old.get("kernels_only_s"), "old_py_run_s": old.get("run_s"),
            "old_plan_kept": old.get("plan_kept"), "old_compile_says": old.get("compile_says"),
            "same_plan_old_new": (old.get("plan_digest") == o.get("plan_digest")) if old.get("plan_digest") else None,
            "torch_eager_s": t.get("eager_s"), "torch_eager_io_s": t.get("eager_io_s"),
            "torch_graph_s": t.get("graph_s"), "torch_graph_io_s": t.get("graph_io_s"),
            "torch_graph_event_s": t.get("graph_event_s"),
            "graph_over_py_kernels_only": (t["graph_s"] / o["kernels_only_s"]) if t.get("graph_s") and o.get("kernels_only_s") else None,
            "graph_io_over_native_run": (t["graph_io_s"] / nat["run_s"]) if t.get("graph_io_s") and nat.get("run_s") else None,
            "rel_err_py": o.get("rel_err_vs_onnxruntime"), "rel_err_native": nat.get("rel_err_vs_onnxruntime"),
            "rel_err_old": old.get("rel_err_vs_onnxruntime"), "rel_err_torch_graph": t.get("graph_rel_err"),
            "native_run_unpinned_s": nat.get("run_unpinned_s"),
            "mnn_run_s": mnn_by.get(o["model"], {}).get("run_s"), "mnn_mode": mnn_by.get(o["model"], {}).get("best_mode"),
            "mnn_over_native_run": (mnn_by[o["model"]]["run_s"] / nat["run_s"])
            if mnn_by.get(o["model"], {}).get("run_s") and nat.get("run_s") else None,
            "errors": "; ".join(f"{k}: {d['error']}" for k, d in (("ours", o), ("native", nat), ("old", old), ("torch", t))
                                if d.get("error"))})
    return rows


def write_tables(result: dict, out: Path) -> None:
    rows = table_rows(result)
    if rows:
        with open(out / "runtimes_gpu.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)
    meta = result.get("meta", {})
    d = meta.get("device", {})
    lines = [f"Device: {d.get('name')} ({d.get('platform')}, driver {d.get('driver_version')}, fingerprint "
             f"{d.get('fingerprint')}); nvidia-smi: {meta.get('nvidia_smi')}. Log: {meta.get('log')} (records of "
             f"{meta.get('log_fingerprint')}). Float32, batch 1, {meta.get('input_size')}x{meta.get('input_size')}; "
             f"ms, median of {meta.get('rounds')} rounds of each a median of {meta.get('repeats')} runs after "
             f"{meta.get('warmup')} warm-up runs; wall clock.", "",
             "| model | log | tuned layers | Python kernels only | Python run (+transfers) | native run (+transfers) "
             "| native / kernels only | old Python kernels only | old Python run | same plan old/new | PyTorch eager "
             "(+transfers) | CUDA graph replay (+transfers) | replay / ours kernels only | replay+transfers / native |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['tuned']} | "
            f"{harness.ms(r['py_kernels_only_s'])} | {harness.ms(r['py_run_s'])} | {harness.ms(r['native_run_s'])} | "
            f"{_ratio(r['native_run_s'], r['py_kernels_only_s'])} | {harness.ms(r['old_py_kernels_only_s'])} | "
            f"{harness.ms(r['old_py_run_s'])} | {'–' if r['same_plan_old_new'] is None else 'yes' if r['same_plan_old_new'] else 'no'} | "
            f"{harness.ms(r['torch_eager_s'])} ({harness.ms(r['torch_eager_io_s'])}) | {harness.ms(r['torch_graph_s'])} "
            f"({harness.ms(r['torch_graph_io_s'])}) | {_ratio(r['torch_graph_s'], r['py_kernels_only_s'])} | "
            f"{_ratio(r['torch_graph_io_s'], r['native_run_s'])} |")
    lines += ["", "Transfers and the peer that includes them (MNN's benchmark.out prints the mean of its runs, ours "
              "the median; MNN's mode: the best of the GPU modes tried, tuning bits | memory bits).", "",
              "| model | log | native run, pinned staging | native run, TUNER_RUN_PINNED=0 | Python run | MNN OpenCL "
              "(+transfers) | MNN mode | MNN / native |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['variant']} | {harness.ms(r['native_run_s'])} | {harness.ms(r['native_run_unpinned_s'])} | "
                     f"{harness.ms(r['py_run_s'])} | {harness.ms(r['mnn_run_s'])} | {r['mnn_mode'] or '–'} | "
                     f"{_ratio(r['mnn_run_s'], r['native_run_s'])} |")
    lines += ["", "| model | log | plan kept (new / old) | kernels | kernel sum: Python profile / native profile "
              "| rel. err. vs onnxruntime: Python / native / old / PyTorch replay | errors |",
              "| --- | --- | --- | ---: | ---: | --- | --- |"]
    for r in rows:
        e = harness.sci
        lines.append(f"| {r['model']} | {r['variant']} | {r['plan_kept'] or '–'} / {r['old_plan_kept'] or '–'} | "
                     f"{r['kernels']} | {harness.ms(r['py_kernel_sum_s'])} / {harness.ms(r['native_kernel_sum_s'])} | "
                     f"{e(r['rel_err_py'])} / {e(r['rel_err_native'])} / {e(r['rel_err_old'])} / "
                     f"{e(r['rel_err_torch_graph'])} | {r['errors'] or ''} |")
    (out / "runtimes_gpu.md").write_text("\n".join(lines) + "\n")


def cmd_table(args) -> int:
    out = Path(args.out)
    write_tables(json.loads((out / "runtimes_gpu.json").read_text()), out)
    print((out / "runtimes_gpu.md").read_text())
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("all", "export", "ours", "torch", "table", "prepare", "mnn-build"):
        s = sub.add_parser(name)
        s.add_argument("--out", default="/tmp/runtimes_gpu_out")
        s.add_argument("--work", default="/tmp/runtimes_gpu_work")
        s.add_argument("--models", default=",".join(MODELS))
        s.add_argument("--input-size", type=int, default=224)
        s.add_argument("--repeats", type=int, default=50)
        s.add_argument("--warmup", type=int, default=10)
        s.add_argument("--rounds", type=int, default=3)
        s.add_argument("--device", default="nvidia")
        s.add_argument("--log", default=str(REPO / "logs" / "nvidia-gpu-fcae3850.jsonl"))
        s.add_argument("--new-tree", default=str(REPO), help="the tree whose Python executor and native/ are timed")
        s.add_argument("--old-tree", default=None, help="an older tree's Python executor to time the same way")
        s.add_argument("--deadline", type=float, default=560.0, help="all: seconds; later stages are skipped past it")
        s.add_argument("--tree", default="new")
        s.add_argument("--variants", default="")
        s.add_argument("--save", action="store_true")
        s.add_argument("--resume", action="store_true",
                       help="all: keep WORK's results and run only the stages that lack some model")
        s.add_argument("--only-variants", default="", help="all: only these log variants (log, relabeled)")
        s.add_argument("--mnn-src", default=None, help="all: a tarball of MNN's source: measure MNN's OpenCL backend")
        s.add_argument("--mnn-wheel", default=None, help="all: the MNN wheel (its mnnconvert converts the models)")
        s.add_argument("--mnn-build", default="/tmp/mnn_build", help="all: MNN's build folder (kept between calls)")
        s.add_argument("--mnn-modes", default="68,132,66,130", help="all: MNN GPU modes to try (tuning | memory bits)")
        s.add_argument("--new", default="HEAD", help="prepare: the revision of bench/_trees/new")
        s.add_argument("--old", default=None, help="prepare: the revision of bench/_trees/old")
    args = p.parse_args(argv)
    return {"all": cmd_all, "export": cmd_export, "ours": cmd_ours, "torch": cmd_torch, "table": cmd_table,
            "prepare": cmd_prepare, "mnn-build": cmd_mnn_build}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
