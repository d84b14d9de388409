"""Tune the layer suite of ResNet-18 and MobileNetV2 on a GPU through OpenCL, and time cuDNN (PyTorch) on the
same layers and whole models in the same run.

The layer suite is the models' own tasks (``tuner.graph.compiler.model_tasks`` of the zoo models at 224x224,
batch 1): exactly the kernels a compiled model deploys, so the committed log makes ``tuner compile`` pick
tuned configs. Subcommands (bench/gpu.sh runs them on the GPU machine):

    python bench/gpu.py tune   --out DIR [--trials 24] [--deadline 540]   # resumable: the log is the state
    python bench/gpu.py cudnn  --out DIR                                   # PyTorch/cuDNN per layer
    python bench/gpu.py models --out DIR --log LOG                         # whole models, ours vs PyTorch eager
    python bench/gpu.py table  --out DIR                                   # CSVs -> markdown (anywhere)
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

MODELS = ("resnet18", "mobilenet_v2")
DTYPES = ("float32", "float16")
SCOPES = ("texture", "buffer")


def suite(info, models=MODELS, dtypes=DTYPES, scopes=SCOPES, log=None) -> list:
    """``[(model, dtype, scope, Task, layer names)]`` in tuning order: float32 first, models in order. Scope
    ``auto``: the plan ``--scope auto`` deploys given ``log`` (its mixed-scope kernels at texture/buffer
    boundaries are tasks of their own)."""
    from tuner.graph import zoo
    from tuner.graph.compiler import load_graph
    from tuner.graph.plan import extract_tasks, lower_graph, plan_storage
    from tuner.logs import apply_history_best
    history = apply_history_best(log) if log and Path(log).exists() else None
    rows = []
    for dtype in dtypes:
        for model in models:
            plan0 = lower_graph(load_graph(getattr(zoo, model)(input_size=224)), dtype)
            for scope in scopes:
                plan = plan_storage(plan0, info, scope, history if scope == "auto" else None)
                for task in extract_tasks(plan):
                    names = [s.name for s in plan.steps if s.tuned and s.op == task.template
                             and s.workload == task.workload and s.scopes == task.scopes]
                    rows.append((model, dtype, scope, task, names))
    return rows


def _task_id(model, task) -> str:
    return f"{model}:{task.key()}"


def cmd_tune(args) -> int:
    from tuner.graph.tuning import measured, measured_index
    from tuner.measure import MeasureOptions, Measurer
    from tuner.runtime.device import choose_device
    from tuner.search.tune import tune
    info = choose_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = str(out / f"{info.fingerprint}.jsonl")
    seed_log = Path(__file__).resolve().parents[1] / "logs" / f"{info.fingerprint}.jsonl"  # an earlier run's log, committed: resume from it
    if seed_log.exists() and not Path(log).exists():
        Path(log).write_text(seed_log.read_text())
    rows = suite(info, args.models.split(","), args.dtypes.split(","), args.scopes.split(","), log)
    index = measured_index(log, info.fingerprint)  # each task is tuned once below, so read the log once
    t0 = time.time()
    # a fixed number of timed runs (GPU events are precise): a few-microsecond kernel would otherwise log
    # thousands of costs per record to fill MeasureOptions' default minimum time
    options = MeasureOptions(n_parallel=args.parallel, repeats=args.repeats, min_seconds=args.min_seconds)
    done_tasks, seen = 0, set()
    with Measurer(info, options) as measurer:
        for model, dtype, scope, task, names in rows:
            if task.key() in seen:
                continue
            seen.add(task.key())
            todo = args.trials - measured(index, task)
            if todo <= 0:
                done_tasks += 1
                continue
            if time.time() - t0 > args.deadline:
                print(f"deadline: stopping with {len(seen) - 1} of {len(rows)} tasks visited", flush=True)
                break
            r = tune(task.template, task.workload, info, trials=todo, log=log,
                     storage="sqlite:////tmp/gpu_studies.db", sampler="xgb", scopes=task.scopes, fixed=task.fixed,
                     seed=0, options=options, progress=False, measurer=measurer)
            done_tasks += 1
            best = f"{r.best.gflops:.1f} GFLOP/s {r.best.median_s * 1e6:.1f} us" if r.best else "no success"
            print(f"[{time.time() - t0:5.0f}s] {model} {dtype} {scope} {task.template} "
                  f"{task.workload.key()['data']} x{task.count}: {r.measured} new, best {best}", flush=True)
    print(f"{done_tasks} tasks complete; log {log}")
    return 0


def _torch_layer(task, dtype: str):
    """The layer in PyTorch: conv only (cuDNN) and the eager layer (conv + bias + residual + activation)."""
    import torch
    import torch.nn.functional as F
    wl = task.workload
    dev, tdt = "cuda", {"float32": torch.float32, "float16": torch.float16}[dtype]
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(wl.data, generator=g).to(dev, tdt)
    if task.template == "dense":
        w = torch.randn(wl.weight, generator=g).to(dev, tdt)
        b = torch.randn(wl.weight[0], generator=g).to(dev, tdt)
        conv = lambda: F.linear(x, w)  # noqa: E731
        full = lambda: _act(F.linear(x, w, b), wl.activation)  # noqa: E731
        return conv, full
    w = torch.randn(wl.kernel, generator=g).to(dev, tdt)
    b = torch.randn(wl.kernel[0], generator=g).to(dev, tdt)
    groups = wl.data[1] if task.template == "depthwise_conv2d" else 1
    res = torch.randn(wl.out_shape, generator=g).to(dev, tdt) if wl.residual else None

    def conv(bias=None):
        return _conv2d(x, w, bias, wl.stride, wl.padding, wl.dilation, groups)

    def full():
        y = conv(b)
        if res is not None:
            y = y + res
        return _act(y, wl.activation)
    return conv, full


def _torch_fp32() -> None:
    """cuDNN in true fp32 (no TF32), its fastest algorithm per shape."""
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True


def _conv2d(x, w, b, stride, padding, dilation, groups):
    """F.conv2d with (top, left, bottom, right) padding: asymmetric padding as an explicit pad first."""
    import torch.nn.functional as F
    pt, pl, pb, pr = padding
    if (pt, pl) == (pb, pr):
        return F.conv2d(x, w, b, stride, (pt, pl), dilation, groups)
    return F.conv2d(F.pad(x, (pl, pr, pt, pb)), w, b, stride, 0, dilation, groups)


def _act(y, activation):
    import torch.nn.functional as F
    return F.relu(y) if activation == "relu" else F.hardtanh(y, 0.0, 6.0) if activation == "relu6" else y


def _cuda_time(fn, repeats: int = 100, warmup: int = 10) -> float:
    """Median seconds per call from CUDA events."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    costs = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        costs.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(costs)


def _kernel_time(fn, repeats: int = 50, warmup: int = 10) -> float:
    """Mean seconds of GPU kernel time per call, from CUPTI (torch.profiler): the same quantity as OpenCL
    profiling events (execution only, no launch gaps), unlike CUDA events around the call."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    total_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
                   for e in prof.key_averages())
    return total_us * 1e-6 / repeats


def cmd_cudnn(args) -> int:
    import torch
    from tuner.runtime.device import choose_device
    _torch_fp32()
    info = choose_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seen, rows = set(), []
    for model, dtype, scope, task, names in suite(info):
        k = (model, dtype, json.dumps(task.workload.key(), sort_keys=True))
        if k in seen:
            continue
        seen.add(k)
        conv, full = _torch_layer(task, dtype)
        with torch.no_grad():
            rows.append({"model": model, "dtype": dtype, "template": task.template,
                         "workload": json.dumps(task.workload.key(), sort_keys=True), "count": task.count,
                         "flops": task.workload.flops, "cudnn_conv_s": _cuda_time(conv),
                         "torch_layer_s": _cuda_time(full), "cudnn_conv_kernel_s": _kernel_time(conv),
                         "torch_layer_kernel_s": _kernel_time(full), "gpu": torch.cuda.get_device_name(),
                         "torch": torch.__version__, "cudnn": torch.backends.cudnn.version()})
    _write(out / "gpu_cudnn.csv", rows)
    print(f"{len(rows)} layers timed with PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    return 0


def _torch_graph(graph, dtype: str):
    """PyTorch eager over the optimized graph (BatchNorm folded, as we run it): a callable and its input."""
    import torch
    import torch.nn.functional as F
    tdt = {"float32": torch.float32, "float16": torch.float16}[dtype]
    P = {k: torch.from_numpy(np.asarray(v, np.float32)).to("cuda", tdt) for k, v in graph.params.items()}

    def run(x):
        env = {graph.inputs[0]: x}
        for n in graph.nodes:
            a = n.attrs
            ins = [P[t] if t in P else env[t] for t in n.inputs if t != a.get("residual")]
            if n.op == "conv2d":
                y = _conv2d(ins[0], ins[1], ins[2] if len(ins) > 2 else None, a["stride"], a["padding"],
                            a["dilation"], a["groups"])
            elif n.op == "dense":
                y = F.linear(ins[0], ins[1], ins[2] if len(ins) > 2 else None)
            elif n.op == "add":
                y = ins[0] + ins[1]
            elif n.op == "relu":
                y = F.relu(ins[0])
            elif n.op == "clip":
                y = torch.clamp(ins[0], a.get("min"), a.get("max"))
            elif n.op == "global_avg_pool":
                y = ins[0].mean((2, 3), keepdim=True)
            elif n.op == "max_pool":
                pt, pl, pb, pr = a["padding"]
                y = F.max_pool2d(F.pad(ins[0], (pl, pr, pt, pb), value=float("-inf")), a["kernel"], a["stride"])
            elif n.op in ("flatten", "reshape"):
                y = ins[0].reshape(graph.shapes[n.outputs[0]])
            else:
                raise ValueError(f"bench: no PyTorch op for {n.op}")
            if "residual" in a:
                y = y + env[a["residual"]]
            y = _act(y, a.get("activation", "none")) if n.op not in ("relu", "clip") else y
            env[n.outputs[0]] = y
        return env[graph.outputs[0]]
    return run


def cmd_models(args) -> int:
    import onnxruntime as ort
    import torch
    from tuner.graph import zoo
    from tuner.graph.compiler import compile_model, load_graph
    from tuner.runtime import open_device
    _torch_fp32()
    dev = open_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in MODELS:
        model = getattr(zoo, name)(input_size=224)
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = sess.run(None, {"input": x})[0]
        graph = load_graph(model)
        for dtype in args.dtypes.split(","):
            fn = _torch_graph(graph, dtype)
            xt = torch.from_numpy(x).to("cuda", {"float32": torch.float32, "float16": torch.float16}[dtype])
            with torch.no_grad():
                eager = _cuda_time(lambda: fn(xt), repeats=50)
                y_t = fn(xt).float().cpu().numpy()
            for scope in ("auto", "texture", "buffer"):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    mod = compile_model(model, log=args.log, device=dev, scope=scope, dtype=dtype)
                y = mod.run([x])[0]
                costs = mod.time(50, warmup=5)
                tuned = sum(n.tuned for n in mod.spec.nodes)
                layers = sum(n.template is not None for n in mod.spec.nodes)
                err = float(np.abs(y - ref).max() / np.abs(ref).max())
                rows.append({"model": name, "dtype": dtype, "scope": scope, "ours_s": statistics.median(costs),
                             "torch_eager_s": eager, "ratio_torch_over_ours": eager / statistics.median(costs),
                             "tuned_layers": tuned, "layers": layers, "rel_err_vs_onnxruntime": err,
                             "torch_rel_err": float(np.abs(y_t - ref).max() / np.abs(ref).max()),
                             "fallback_warnings": len(caught), "gpu": torch.cuda.get_device_name(),
                             "device": dev.info.name, "driver": dev.info.driver_version})
                print(json.dumps(rows[-1]), flush=True)
                if scope == "auto" and dtype == "float32":
                    mod.save(out / f"artifact_{name}")
                    prof = mod.profile(20)
                    (out / f"profile_{name}.json").write_text(json.dumps(prof, indent=1))
    _write(out / "gpu_models.csv", rows)
    return 0


def _write(path: Path, rows: list) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _read(path: Path) -> list:
    with open(path) as f:
        return list(csv.DictReader(f))


def cmd_table(args) -> int:
    """Per layer: tuned texture, tuned buffer, cuDNN conv, PyTorch eager layer, ratios; then whole models."""
    from tuner.logs import best_records, load_records
    from tuner.logs.record import canonical_json
    out = Path(args.out)
    recs = load_records(args.log)
    best = {}
    for r in best_records(recs).values():  # task_key = (device, template, workload, scopes)
        scope = "texture" if set(r.scopes.values()) == {"texture"} else "buffer" if set(r.scopes.values()) == {
            "buffer"} else "mixed"
        k = (r.template, canonical_json(r.workload), scope)
        if k not in best or r.median_s < best[k].median_s:
            best[k] = r
    trials: dict = {}
    for r in recs:
        trials[(r.template, canonical_json(r.workload))] = trials.get((r.template, canonical_json(r.workload)), 0) + 1
    torch_rows = _read(out / "gpu_cudnn.csv")
    lines, ratios = [], {}
    for dtype in DTYPES:
        rows = [t for t in torch_rows if t["dtype"] == dtype]
        if not rows:
            continue
        lines += [f"\n#### {dtype} storage, batch 1: GPU kernel time in microseconds (ours: OpenCL profiling events, "
                  f"median of 25; PyTorch: CUPTI, mean of 50); ratio > 1: ours faster\n",
                  "| model | layer | count | tuned texture | tuned buffer | cuDNN conv | PyTorch layer (conv+bias+act+res) "
                  "| cuDNN conv / best ours | PyTorch layer / best ours |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for t in rows:
            wl = canonical_json(json.loads(t["workload"]))
            tex, buf = best.get((t["template"], wl, "texture")), best.get((t["template"], wl, "buffer"))
            ours = min((r.median_s for r in (tex, buf) if r is not None), default=None)
            conv, layer = float(t["cudnn_conv_kernel_s"]), float(t["torch_layer_kernel_s"])
            conv_ev = float(t["cudnn_conv_s"])
            wd = json.loads(t["workload"])
            shape = "x".join(map(str, wd["data"]))
            k = "x".join(map(str, wd.get("kernel", wd.get("weight", []))))
            extra = "".join(f" +{e}" for e, on in (("res", wd.get("residual")), (wd.get("activation"), wd.get(
                "activation", "none") != "none")) if on)
            label = f"{t['template']} {shape} k{k}{' s2' if wd.get('stride') == [2, 2] else ''}{extra}"
            fmt = lambda r: f"{r.median_s * 1e6:.1f}" if r is not None else "-"  # noqa: E731
            if ours:
                ratios.setdefault((t["model"], dtype), []).append((conv / ours, layer / ours, conv_ev / ours))
            lines.append(f"| {t['model']} | {label} | {t['count']} | {fmt(tex)} | {fmt(buf)} | {conv * 1e6:.1f} "
                         f"| {layer * 1e6:.1f} | " + (f"{conv / ours:.2f} | {layer / ours:.2f} |" if ours else "- | - |"))
    summary = ["| model | dtype | layers | geomean cuDNN conv / ours | geomean PyTorch layer / ours | same, cuDNN timed "
               "with CUDA events (launch gaps included) |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    geo = lambda xs: float(np.exp(np.mean(np.log(xs))))  # noqa: E731
    for (model, dtype), rs in ratios.items():
        summary.append(f"| {model} | {dtype} | {len(rs)} | {geo([a for a, _, _ in rs]):.3f} | "
                       f"{geo([b for _, b, _ in rs]):.3f} | {geo([c for _, _, c in rs]):.3f} |")
    for dtype in DTYPES:
        rs = [r for (m, d), v in ratios.items() if d == dtype for r in v]
        if rs:
            summary.append(f"| both | {dtype} | {len(rs)} | {geo([a for a, _, _ in rs]):.3f} | "
                           f"{geo([b for _, b, _ in rs]):.3f} | {geo([c for _, _, c in rs]):.3f} |")
    model_lines = []
    if (out / "gpu_models.csv").exists():
        model_lines = ["| model | dtype | scope | ours ms | PyTorch eager ms | PyTorch / ours | tuned layers | "
                       "max rel err vs onnxruntime |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for m in _read(out / "gpu_models.csv"):
            model_lines.append(f"| {m['model']} | {m['dtype']} | {m['scope']} | {float(m['ours_s']) * 1e3:.3f} | "
                               f"{float(m['torch_eager_s']) * 1e3:.3f} | {float(m['ratio_torch_over_ours']):.3f} | "
                               f"{m['tuned_layers']}/{m['layers']} | {float(m['rel_err_vs_onnxruntime']):.1e} |")
    text = "\n".join(["### Summary", *summary, "", "### Whole models", *model_lines, "", "### Per layer", *lines])
    (out / "gpu_summary.md").write_text(text + "\n")
    print(text)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("tune", "cudnn", "models", "table"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--device", default="nvidia")
        s.add_argument("--log")
        s.add_argument("--trials", type=int, default=24)
        s.add_argument("--deadline", type=float, default=540.0, help="seconds before no new task starts")
        s.add_argument("--parallel", type=int, default=12)
        s.add_argument("--repeats", type=int, default=25)
        s.add_argument("--min-seconds", type=float, default=0.0)
        s.add_argument("--models", default=",".join(MODELS))
        s.add_argument("--dtypes", default=",".join(DTYPES))
        s.add_argument("--scopes", default=",".join(SCOPES))
    args = p.parse_args(argv)
    return {"tune": cmd_tune, "cudnn": cmd_cudnn, "models": cmd_models, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
