"""Tune the layer suite of ResNet-18 and MobileNetV2 on a GPU through OpenCL, and time cuDNN (PyTorch) on the
same layers and whole models in the same run.

The layer suite is the models' own tasks (``tuner.compile.compiler.model_tasks`` of the zoo models at 224x224,
batch 1): exactly the kernels a compiled model deploys, so the committed log makes ``tuner compile`` pick
tuned configs. Subcommands (bench/gpu.sh runs them on the GPU machine):

    python bench/gpu.py tune   --out DIR [--trials 24] [--deadline 540]   # resumable: the log is the state
                               [--priority gpu_cudnn.csv]                  # only layers slower than cuDNN
    python bench/gpu.py cudnn  --out DIR                                   # PyTorch/cuDNN per layer
    python bench/gpu.py peak   --out DIR                                   # peak FMA rate and copy bandwidth
    python bench/gpu.py stream --side ours|torch --out DIR --log LOG     # per layer: ours re-timed, and both
                                                                           # back to back (100 launches)
    python bench/gpu.py models --side ours|torch --out DIR --log LOG     # whole models, ours vs PyTorch eager
                                                                           # and its CUDA-graph replay
    python bench/gpu.py table  --out DIR --log LOG                         # CSVs -> markdown (anywhere)

``peak`` writes ``gpu_peak.json``: the float32 (and, with cl_khr_fp16, float16) FMA rate and the copy bandwidth
of the OpenCL device our kernels run on, with torch.matmul (no TF32) and a torch device copy as cross-checks;
``table`` prices every layer against the roofline bound max(FLOPs / FMA rate, bytes / bandwidth) from it.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

MODELS = ("resnet18", "mobilenet_v2")
DTYPES = ("float32", "float16")
SCOPES = ("texture", "buffer")


def suite(info, models=MODELS, dtypes=DTYPES, scopes=SCOPES, log=None, alternatives: bool = True) -> list:
    """``[(model, dtype, scope, Task, layer names)]`` in tuning order: float32 first, models in order. Scope
    ``auto``: the plan ``--scope auto`` deploys given ``log`` (its mixed-scope kernels at texture/buffer
    boundaries are tasks of their own)."""
    from tuner.zoo import models as zoo
    from tuner.compile.compiler import load_graph
    from tuner.plan.lower import extract_tasks, lower_graph, plan_storage
    from tuner.logs import apply_history_best
    history = apply_history_best(log) if log and Path(log).exists() else None
    rows = []
    for dtype in dtypes:
        for model in models:
            plan0 = lower_graph(load_graph(getattr(zoo, model)(input_size=224)), dtype)
            for scope in scopes:
                plan = plan_storage(plan0, info, scope, history if scope == "auto" else None)
                for task in extract_tasks(plan, alternatives=alternatives):  # Winograd of 3x3 s1 convs too
                    names = [s.name for s in plan.steps if s.tuned and any(
                        c.op == task.template and c.workload == task.workload and c.scopes == task.scopes
                        for c in s.candidates())]
                    rows.append((model, dtype, scope, task, names))
    return rows


def _by_shortfall(rows: list, log: str, cudnn_csv: str, fingerprint: str) -> list:
    """The direct-template tasks of the layers where ours is slower than cuDNN by more than 5%, those losing
    most first: ours (the log's best of any scope and template) over max(cuDNN's CUPTI kernel time, the OpenCL
    empty-kernel floor in the ``gpu_floor.json`` beside ``cudnn_csv``, when there is one); a layer already at
    that floor has nothing to gain from more trials."""
    best = _bests(log, fingerprint)
    floor_path = Path(cudnn_csv).with_name("gpu_floor.json")
    floor = json.loads(floor_path.read_text())["opencl_event_s"] if floor_path.exists() else 0.0
    cudnn = {(t["model"], t["dtype"], t["workload"]): float(t["cudnn_conv_kernel_s"]) for t in _read(Path(cudnn_csv))}
    ranked = []
    for row in rows:
        model, dtype, scope, task, names = row
        wkey = json.dumps(task.workload.key(), sort_keys=True)
        if (model, dtype, wkey) not in cudnn:  # a Winograd alternative or a mixed-scope kernel: not ranked
            continue
        ours = [r.median_s for sc in SCOPES if (r := _best_of_layer(best, {"template": task.template,
                                                                             "workload": wkey}, sc))]
        shortfall = min(ours) / max(cudnn[(model, dtype, wkey)], floor) if ours else math.inf
        if shortfall > 1.05:
            ranked.append((shortfall, row))
    ranked.sort(key=lambda x: -x[0])
    for shortfall, (model, dtype, scope, task, _) in ranked:
        print(f"shortfall {shortfall:.2f}: {model} {dtype} {scope} {task.template} {task.workload.key()['data']}")
    return [row for _, row in ranked]


def _task_id(model, task) -> str:
    return f"{model}:{task.key()}"


def cmd_tune(args) -> int:
    from tuner.logs.index import LogIndex
    from tuner.measure import MeasureOptions, Measurer
    from tuner.runtime.opencl.device import choose_device
    from tuner.search.tune import tune
    info = choose_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = str(out / f"{info.fingerprint}.jsonl")
    seed_log = Path(__file__).resolve().parents[1] / "logs" / f"{info.fingerprint}.jsonl"  # an earlier run's log, committed: resume from it
    if seed_log.exists() and not Path(log).exists():
        Path(log).write_text(seed_log.read_text())
    rows = suite(info, args.models.split(","), args.dtypes.split(","), args.scopes.split(","), log)
    if args.priority:
        rows = _by_shortfall(rows, log, args.priority, info.fingerprint)
    index = LogIndex.of_log(log).on(info.fingerprint)  # each task is tuned once below, so read the log once
    t0 = time.time()
    # a fixed number of timed runs (GPU events are precise): a few-microsecond kernel would otherwise log
    # thousands of costs per record to fill MeasureOptions' default minimum time
    options = MeasureOptions(n_parallel=args.parallel, repeats=args.repeats, min_seconds=args.min_seconds)
    done_tasks, seen = 0, set()
    with Measurer(info, options) as measurer:
        for model, dtype, scope, task, names in rows:
            if task.key() in seen or (args.templates and task.template not in args.templates.split(",")):
                continue
            seen.add(task.key())
            todo = args.trials - index.count(task)
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


def _tdev() -> str:
    """The torch device: "cuda" on the GPU machine; "cpu" only to check these code paths without a GPU."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _gpu_name() -> str:
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no CUDA)"


def _torch_layer(task, dtype: str):
    """The layer in PyTorch: conv only (cuDNN) and the eager layer (conv + bias + residual + activation)."""
    import torch
    import torch.nn.functional as F
    wl = task.workload
    dev, tdt = _tdev(), {"float32": torch.float32, "float16": torch.float16}[dtype]
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
    """Median seconds per call from CUDA events (without CUDA: wall clock, only to check code paths)."""
    import torch
    if not torch.cuda.is_available():
        for _ in range(warmup):
            fn()
        costs = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            costs.append(time.perf_counter() - t)
        return statistics.median(costs)
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


# The FMA-rate kernel: each work-item runs n x UNROLL steps of ACC independent float4 (half4) chains
# x = OP(x, m, c) (OP: `mad` or `fma`) with m, c kernel arguments (nothing to fold), and stores their sum (nothing
# to drop).
_FMA_ACC, _FMA_UNROLL = 8, 4
_FMA_SRC = """
#ifdef USE_HALF
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define T4 half4
#define CONVERT_T4 convert_half4
#else
#define T4 float4
#define CONVERT_T4 convert_float4
#endif
#define STEP x0 = OP(x0, m, c); x1 = OP(x1, m, c); x2 = OP(x2, m, c); x3 = OP(x3, m, c); \\
             x4 = OP(x4, m, c); x5 = OP(x5, m, c); x6 = OP(x6, m, c); x7 = OP(x7, m, c);
__kernel void fma_peak(__global float *out, const int n, const float a, const float b) {
    const T4 m = CONVERT_T4((float4)(a)), c = CONVERT_T4((float4)(b));
    const float s = (float)(get_global_id(0) & 1023) * 1e-4f;
    T4 x0 = CONVERT_T4((float4)(s, s + 0.01f, s + 0.02f, s + 0.03f)), x1 = x0 + c, x2 = x1 + c, x3 = x2 + c;
    T4 x4 = x3 + c, x5 = x4 + c, x6 = x5 + c, x7 = x6 + c;
    for (int i = 0; i < n; ++i) {
        STEP STEP STEP STEP
    }
    const float4 r = convert_float4(((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)));
    out[get_global_id(0)] = (r.x + r.y) + (r.z + r.w);
}
"""


def _cl_fma_rate(dev, dtype: str = "float32", op: str = "fma", items_per_cu: int = 2048, target_s: float = 0.02,
                 repeats: int = 10) -> dict:
    """FLOP/s (2 per FMA) of the OpenCL device ``dev`` (a tuner Device: its profiling queue) on the kernel
    above: enough work-items to fill it, the loop count calibrated to ``target_s`` per launch, the median of
    ``repeats`` launches from OpenCL profiling events."""
    import pyopencl as cl
    opts = [f"-DOP={op}"] + (["-DUSE_HALF"] if dtype == "float16" else [])
    prg = cl.Program(dev.context, _FMA_SRC).build(options=opts)
    knl = prg.fma_peak
    wg = knl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, dev.cl_device)
    local = max(1, min(256, dev.info.max_work_group_size, wg))
    items = max(local, max(1, dev.info.compute_units) * items_per_cu // local * local)
    out = cl.Buffer(dev.context, cl.mem_flags.WRITE_ONLY, items * 4)

    def launch(n: int) -> float:
        ev = knl(dev.queue, (items,), (local,), out, np.int32(n), np.float32(0.999), np.float32(0.001))
        ev.wait()
        return (ev.profile.end - ev.profile.start) * 1e-9

    n, cap = 16, 1 << 24
    launch(n)  # the first launch also loads the program
    for _ in range(12):  # calibrate: grow n until a launch takes half the target (the faster of two launches)
        t = min(launch(n), launch(n))
        if t >= target_s / 2 or n >= cap:
            break
        n = min(cap, n * max(2, min(1024, int(target_s / max(t, 1e-9)))))
    launch(n)
    times = []
    for _ in range(repeats):
        times.append(launch(n))
        if sum(times) > 4 * repeats * target_s:  # launches far slower than calibrated: do not spend minutes
            break
    host = np.empty(items, np.float32)
    cl.enqueue_copy(dev.queue, host, out)
    flops = items * n * _FMA_UNROLL * _FMA_ACC * 4 * 2
    return {"flops": flops / statistics.median(times), "median_s": statistics.median(times),
            "max_flops": flops / min(times), "work_items": items, "local": local, "loop": n,
            "flop_per_launch": flops, "finite": bool(np.isfinite(host).all())}


def _cl_copy_rate(dev, nbytes: int = 1 << 30, repeats: int = 10) -> dict:
    """Bytes/s (read + write) of clEnqueueCopyBuffer between two ``nbytes`` buffers: median of ``repeats``
    copies from OpenCL profiling events."""
    import pyopencl as cl
    nbytes = int(min(nbytes, dev.info.max_mem_alloc_bytes, dev.info.global_mem_bytes // 4)) // 4096 * 4096
    src = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, nbytes)
    dst = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, nbytes)
    cl.enqueue_fill_buffer(dev.queue, src, np.uint32(1), 0, nbytes)
    cl.enqueue_fill_buffer(dev.queue, dst, np.uint32(0), 0, nbytes)
    dev.queue.finish()
    times = []
    for i in range(repeats + 2):
        ev = cl.enqueue_copy(dev.queue, dst, src, byte_count=nbytes)
        ev.wait()
        if i >= 2:  # two warm-up copies
            times.append((ev.profile.end - ev.profile.start) * 1e-9)
    check = np.empty(1024, np.uint32)
    cl.enqueue_copy(dev.queue, check, dst, src_offset=nbytes - check.nbytes)
    return {"bytes_per_s": 2 * nbytes / statistics.median(times), "median_s": statistics.median(times),
            "size_bytes": nbytes, "copied": bool((check == 1).all())}


def _cl_empty_kernel(dev, repeats: int = 100) -> dict:
    """Seconds an OpenCL profiling event reports for a kernel that does almost nothing (one work-item stores one
    float): the floor under every kernel time measured the same way; median of ``repeats``."""
    import pyopencl as cl
    knl = cl.Program(dev.context, "__kernel void nop(__global float *o) { o[get_global_id(0)] = 1.0f; }").build().nop
    out = cl.Buffer(dev.context, cl.mem_flags.WRITE_ONLY, 4)
    times = []
    for i in range(repeats + 5):
        ev = knl(dev.queue, (1,), (1,), out)
        ev.wait()
        if i >= 5:
            times.append((ev.profile.end - ev.profile.start) * 1e-9)
    return {"median_s": statistics.median(times), "min_s": min(times)}


def _torch_empty_kernel(repeats: int = 100) -> float:
    """CUPTI's mean kernel time of a one-element in-place add: the floor under the cuDNN columns."""
    import torch
    t = torch.zeros(1, device=_tdev())
    return _kernel_time(lambda: t.add_(1.0), repeats=repeats)


def _torch_rates(matmul_n: int = 8192, copy_bytes: int = 1 << 30, repeats: int = 10) -> dict:
    """Cross-checks through PyTorch on its device: FLOP/s of an n x n x n torch.matmul in float32 without TF32
    (and float16, tensor cores, on CUDA), bytes/s (read + write) of a device-to-device copy_ of copy_bytes."""
    import torch
    _torch_fp32()
    dev, res = _tdev(), {}
    g = torch.Generator(device="cpu").manual_seed(0)
    for dtype in ("float32", "float16") if dev == "cuda" else ("float32",):
        tdt = getattr(torch, dtype)
        a = torch.randn(matmul_n, matmul_n, generator=g).to(dev, tdt)
        b = torch.randn(matmul_n, matmul_n, generator=g).to(dev, tdt)
        c = torch.empty(matmul_n, matmul_n, device=dev, dtype=tdt)
        with torch.no_grad():
            t = _cuda_time(lambda: torch.matmul(a, b, out=c), repeats=repeats, warmup=3)
        res[f"torch_matmul_{dtype}_flops"] = 2 * matmul_n ** 3 / t
    n = max(1, copy_bytes // 4)
    src = torch.ones(n, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = _cuda_time(lambda: dst.copy_(src), repeats=repeats, warmup=2)
    res["torch_copy_bytes_per_s"] = 2 * 4 * n / t
    res["torch_copy_size_bytes"] = 4 * n
    res["torch_matmul_n"] = matmul_n
    res["torch_matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def cmd_peak(args) -> int:
    """gpu_peak.json: the device's peak FMA rate and copy bandwidth, for the roofline bound of ``table``."""
    from tuner.runtime.opencl import open_device
    dev = open_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    peak = {"opencl_device": dev.info.name, "platform": dev.info.platform, "driver": dev.info.driver_version,
            "fingerprint": dev.info.fingerprint, "cl_khr_fp16": bool(dev.info.fp16),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "repeats": args.peak_repeats}
    for dtype in ("float32", "float16") if dev.info.fp16 else ("float32",):
        for op in ("fma", "mad"):  # the rate is the faster of the two built-ins
            r = _cl_fma_rate(dev, dtype, op, args.peak_items_per_cu, args.peak_target_ms * 1e-3, args.peak_repeats)
            peak[f"cl_{op}_{dtype}"] = r
            print(f"OpenCL {dtype} {op}: {r['flops'] / 1e12:.3f} TFLOP/s {r}", flush=True)
        peak[f"cl_fma_{dtype}_flops"] = max(peak[f"cl_fma_{dtype}"]["flops"], peak[f"cl_mad_{dtype}"]["flops"])
    r = _cl_copy_rate(dev, args.copy_mib << 20, args.peak_repeats)
    peak["cl_copy_bytes_per_s"] = r.pop("bytes_per_s")
    peak["cl_copy"] = r
    print(f"OpenCL copy: {peak['cl_copy_bytes_per_s'] / 1e9:.1f} GB/s {r}", flush=True)
    peak["cl_empty_kernel"] = _cl_empty_kernel(dev)
    print(f"OpenCL empty kernel (profiling events): {peak['cl_empty_kernel']['median_s'] * 1e6:.2f} us", flush=True)
    try:
        import torch
        peak.update(gpu=_gpu_name(), torch=torch.__version__, **_torch_rates(args.matmul_n, args.copy_mib << 20,
                                                                           args.peak_repeats))
        peak["torch_empty_kernel_s"] = _torch_empty_kernel()
    except Exception as e:  # the OpenCL numbers are the bound; the cross-checks must not lose them
        peak["torch_error"] = f"{type(e).__name__}: {e}"
    print(json.dumps({k: v for k, v in peak.items() if not isinstance(v, dict)}), flush=True)
    tmp = out / "gpu_peak.json.tmp"
    tmp.write_text(json.dumps(peak, indent=1) + "\n")
    os.replace(tmp, out / "gpu_peak.json")
    return 0


def cmd_cudnn(args) -> int:
    import torch
    from tuner.runtime.opencl.device import choose_device
    _torch_fp32()
    info = choose_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seen, rows = set(), []
    for model, dtype, scope, task, names in suite(info, alternatives=False):  # the layers, once each
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


def _graph_stream_time(fn, runs: int = 100, repeats: int = 10) -> float:
    """Seconds per call of ``fn`` inside a CUDA graph of ``runs`` back-to-back calls (captured once, warmed
    up on a side stream), replayed: median over ``repeats`` replays of CUDA-event time / ``runs``. The same
    quantity as ``Executable.time_stream`` for ours: a call among many, launch gaps included, host not timed."""
    import torch
    if not torch.cuda.is_available():
        return _cuda_time(fn, repeats=repeats)
    with torch.no_grad():
        graph, _ = _capture(fn, lambda: [fn() for _ in range(runs)])
        graph.replay()
        return _cuda_time(graph.replay, repeats=repeats, warmup=2) / runs


def _capture(warm, body):
    """``(torch.cuda.CUDAGraph of body(), what body returned)``: ``warm()`` runs 3 times on a side stream first,
    so that cudnn.benchmark picks its algorithms there, not during capture."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            warm()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # OpenCL may run threads
        out = body()
    return graph, out


def _cl_empty_stream(dev, runs: int = 1000, repeats: int = 5) -> dict:
    """The one-float kernel of ``_cl_empty_kernel`` enqueued ``runs`` times back to back behind a user event:
    seconds per launch from the first start to the last end (profiling queue), and by wall clock from
    releasing the event to ``finish`` on a profiling queue and on a queue without profiling; medians."""
    import pyopencl as cl

    from tuner.runtime.opencl.stream import gated_batch
    knl = cl.Program(dev.context, "__kernel void nop(__global float *o) { o[get_global_id(0)] = 1.0f; }").build().nop
    out = cl.Buffer(dev.context, cl.mem_flags.WRITE_ONLY, 4)
    knl.set_args(out)
    plain = cl.CommandQueue(dev.context)
    res = {}
    for name, q in (("profiling", dev.queue), ("plain", plain)):
        spans, walls = [], []
        for i in range(repeats + 1):
            wall, events = gated_batch(dev.context, q, [(knl, (1,), (1,))], runs)
            if i:
                walls.append(wall)
                if name == "profiling":
                    spans.append((events[-1].profile.end - events[0].profile.start) * 1e-9 / runs)
        res[f"{name}_wall_s"] = statistics.median(walls)
        if spans:
            res["profiling_span_s"] = statistics.median(spans)
    return res


def _stream_layers(info, args) -> list:
    """``[(model, dtype, task, workload json)]``: each layer of the suite once."""
    rows, seen = [], set()
    for model, dtype, scope, task, names in suite(info, args.models.split(","), args.dtypes.split(","),
                                                  alternatives=False):
        wkey = json.dumps(task.workload.key(), sort_keys=True)
        if (model, dtype, wkey) not in seen:
            seen.add((model, dtype, wkey))
            rows.append((model, dtype, task, wkey))
    return rows


def cmd_stream(args) -> int:
    """Per layer, the best logged kernel of each scope checked against the reference and timed two ways (one
    launch by profiling events, as the log; ``runs`` launches back to back on the run queue,
    ``Executable.time_stream``), and cuDNN's conv and PyTorch's layer in a CUDA graph of as many back-to-back
    calls; the same for an empty kernel. Each side in its own process, so that neither shares the GPU with the
    other's context: ``--side ours`` (no torch imported) writes gpu_stream_ours.csv and gpu_floor_ours.json,
    then ``--side torch`` times PyTorch and merges both into gpu_stream.csv and gpu_floor.json."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.side == "ours":
        return _stream_ours(args, out)
    import torch
    from tuner.runtime.opencl.device import choose_device
    _torch_fp32()
    ours = {(r["model"], r["dtype"], r["workload"]): r for r in _read(out / "gpu_stream_ours.csv")} if (
        out / "gpu_stream_ours.csv").exists() else {}
    floor_path = out / "gpu_floor_ours.json"
    floor = json.loads(floor_path.read_text()) if floor_path.exists() else {}
    t = torch.zeros(1, device=_tdev())
    floor["torch_graph_stream_s"] = _graph_stream_time(lambda: t.add_(1.0), runs=1000)
    floor["torch_cupti_s"] = _torch_empty_kernel() if torch.cuda.is_available() else None
    (out / "gpu_floor.json").write_text(json.dumps(floor, indent=1) + "\n")
    rows = []
    for model, dtype, task, wkey in _stream_layers(choose_device(args.device), args):
        row = {"model": model, "dtype": dtype, "template": task.template, "workload": wkey, "count": task.count}
        conv, full = _torch_layer(task, dtype)
        with torch.no_grad():
            row["cudnn_conv_stream_s"] = _graph_stream_time(conv, runs=args.runs)
            row["torch_layer_stream_s"] = _graph_stream_time(full, runs=args.runs)
        row.update({k: v for k, v in ours.get((model, dtype, wkey), {}).items() if k not in row})
        rows.append(row)
        _write(out / "gpu_stream.csv", rows)
    print(f"{len(rows)} layers timed with PyTorch, {len(ours)} of ours merged into {out / 'gpu_stream.csv'}")
    return 0


def _stream_ours(args, out: Path) -> int:
    from tuner.runtime.opencl import open_device
    from tuner.runtime.opencl.launch import build as build_executable
    from tuner.task import workload_of
    from tuner.templates import get_template
    assert "torch" not in sys.modules, "ours is timed in a process without PyTorch's CUDA context"
    dev = open_device(args.device)
    floor = {"opencl": _cl_empty_stream(dev), "opencl_event_s": _cl_empty_kernel(dev)["median_s"]}
    print("floor", json.dumps(floor), flush=True)
    (out / "gpu_floor_ours.json").write_text(json.dumps(floor, indent=1) + "\n")
    best = _bests(args.log, dev.info.fingerprint)
    rows = []
    for model, dtype, task, wkey in _stream_layers(dev.info, args):
        row = {"model": model, "dtype": dtype, "workload": wkey}
        for sc in SCOPES:
            r = _best_of_layer(best, {"template": task.template, "workload": wkey}, sc)
            if r is None:
                continue
            try:
                tm = get_template(r.template)
                wl = workload_of(tm, r.workload)
                exe = build_executable(tm.build(wl, tm.config(**r.config)), dev)
                inputs = tm.random_inputs(wl, np.random.default_rng(0))
                arrays = exe.upload_inputs(**inputs)
                exe.launch(arrays)
                err = tm.check(wl, exe.outputs_of(arrays), inputs)
                row[f"{sc}_template"] = r.template
                row[f"{sc}_log_s"] = r.median_s
                row[f"{sc}_event_s"] = statistics.median(exe.time(arrays, warmup=2, repeats=25))
                row[f"{sc}_stream_s"] = statistics.median(exe.time_stream(arrays, runs=args.runs, repeats=5))
                row[f"{sc}_rel_err"] = err
            except Exception as e:  # one kernel must not lose the table
                row[f"{sc}_error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(out / "gpu_stream_ours.csv", rows)
    return 0


def _torch_graph(graph, dtype: str):
    """PyTorch eager over the optimized graph (BatchNorm folded, as we run it): a callable and its input."""
    import torch
    import torch.nn.functional as F
    tdt = {"float32": torch.float32, "float16": torch.float16}[dtype]
    P = {k: torch.from_numpy(np.asarray(v, np.float32)).to(_tdev(), tdt) for k, v in graph.params.items()}

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


def _cuda_graph_time(fn, x, repeats: int = 50):
    """PyTorch's ``fn(x)`` captured once into a torch.cuda.CUDAGraph (warmed up on a side stream, static input
    ``x``) and replayed: (median seconds per replay from CUDA events, the replay's output as float32 NumPy,
    None), or (nan, None, why) where there is no CUDA or the capture fails."""
    import torch
    if not torch.cuda.is_available():
        return math.nan, None, "no CUDA"
    try:
        with torch.no_grad():
            static_x = x.clone()
            graph, static_y = _capture(lambda: fn(static_x), lambda: fn(static_x))
            seconds = _cuda_time(graph.replay, repeats=repeats)
            graph.replay()
            torch.cuda.synchronize()
            y = static_y.float().cpu().numpy()
        return seconds, y, None
    except Exception as e:  # a capture failure must not lose the rest of the models stage
        return math.nan, None, f"{type(e).__name__}: {e}"


def _profiling_queue_time(mod, repeats: int, warmup: int = 5) -> float:
    """Median wall seconds of a whole run enqueued on the profiling queue instead of the run queue: what the
    models stage reported before runs moved off it."""
    q = mod.device.queue
    costs = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        mod._enqueue(profiling=True)
        q.finish()
        if i >= warmup:
            costs.append(time.perf_counter() - t0)
    return statistics.median(costs)


def _model_input(name: str):
    """The zoo model at 224x224, a random input and onnxruntime's output for it."""
    import onnxruntime as ort
    from tuner.zoo import models as zoo
    model = getattr(zoo, name)(input_size=224)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, x, sess.run(None, {"input": x})[0]


def cmd_models(args) -> int:
    """Whole models, each side in its own process (neither shares the GPU with the other's context):
    ``--side ours`` (no torch imported) compiles every plan with the log, checks it against onnxruntime and
    times it -> gpu_models_ours.csv, profile and artifact of the float32 auto plans; then ``--side torch`` times
    PyTorch eager and its CUDA-graph replay of the same graph and merges both into gpu_models.csv."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.side == "ours":
        return _models_ours(args, out)
    import torch
    from tuner.compile.compiler import load_graph
    _torch_fp32()
    ours = _read(out / "gpu_models_ours.csv") if (out / "gpu_models_ours.csv").exists() else []
    rows = []
    for name in args.models.split(","):
        model, x, ref = _model_input(name)
        graph = load_graph(model)
        for dtype in args.dtypes.split(","):
            fn = _torch_graph(graph, dtype)
            xt = torch.from_numpy(x).to(_tdev(), {"float32": torch.float32, "float16": torch.float16}[dtype])
            with torch.no_grad():
                eager = _cuda_time(lambda: fn(xt), repeats=50)
                y_t = fn(xt).float().cpu().numpy()
            graph_s, y_g, why = _cuda_graph_time(fn, xt, repeats=50)
            graph_err = float(np.abs(y_g - ref).max() / np.abs(ref).max()) if y_g is not None else math.nan
            print(f"{name} {dtype}: PyTorch eager {eager * 1e3:.3f} ms, CUDA graph replay "
                  + (f"{graph_s * 1e3:.3f} ms (rel err {graph_err:.1e})" if why is None else f"n/a ({why})"),
                  flush=True)
            for o in (o for o in ours if o["model"] == name and o["dtype"] == dtype):
                t = float(o["ours_s"])
                rows.append({**o, "torch_eager_s": eager, "ratio_torch_over_ours": eager / t,
                             "torch_rel_err": float(np.abs(y_t - ref).max() / np.abs(ref).max()), "gpu": _gpu_name(),
                             "torch_cuda_graph_s": graph_s, "ratio_torch_graph_over_ours": graph_s / t,
                             "torch_graph_rel_err": graph_err, "torch_graph_error": why or ""})
                _write(out / "gpu_models.csv", rows)  # after every row: a job cut short keeps what it measured
    return 0


def _models_ours(args, out: Path) -> int:
    from tuner.compile.compiler import compile_model
    from tuner.runtime.opencl import open_device
    assert "torch" not in sys.modules, "ours is timed in a process without PyTorch's CUDA context"
    dev = open_device(args.device)
    rows = []
    for name in args.models.split(","):
        model, x, ref = _model_input(name)
        for dtype in args.dtypes.split(","):
            for scope in args.model_scopes.split(","):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    mod = compile_model(model, log=args.log, device=dev, scope=scope, dtype=dtype)
                y = mod.run([x])[0]
                ours = statistics.median(mod.time(50, warmup=5))  # on the device's run queue (no profiling)
                rows.append({"model": name, "dtype": dtype, "scope": scope, "ours_s": ours,
                             "ours_profiling_queue_s": _profiling_queue_time(mod, 50),
                             "tuned_layers": sum(n.tuned for n in mod.spec.nodes),
                             "layers": sum(n.template is not None for n in mod.spec.nodes),
                             "kernels": sum(len(n.calls) for n in mod.spec.nodes),
                             "storage": ",".join(sorted({mod.node_storage(n) for n in mod.spec.nodes if n.template})),
                             "rel_err_vs_onnxruntime": float(np.abs(y - ref).max() / np.abs(ref).max()),
                             "templates": ",".join(sorted({n.template for n in mod.spec.nodes if n.template})),
                             "plan_kept": getattr(mod, "plan_kept", ""),
                             "plan_times_ms": ";".join(f"{k}={v * 1e3:.3f}" for k, v in
                                                       getattr(mod, "plan_times", {}).items()),
                             "fallback_warnings": len(caught), "device": dev.info.name,
                             "driver": dev.info.driver_version})
                print(json.dumps(rows[-1]), flush=True)
                _write(out / "gpu_models_ours.csv", rows)
                if scope == "auto" and dtype == "float32":
                    mod.save(out / f"artifact_{name}")
                    prof = mod.profile(20)
                    (out / f"profile_{name}.json").write_text(json.dumps(prof, indent=1))
    return 0


def _write(path: Path, rows: list) -> None:
    """A CSV of dict rows; the columns are the union of their keys, in order of first appearance."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


def _read(path: Path) -> list:
    with open(path) as f:
        return list(csv.DictReader(f))


def _num(value):
    """A CSV/JSON cell as a float; None where missing, empty or not finite."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _layer_traffic(wd: dict) -> tuple:
    """(FLOPs, compulsory bytes) of one layer from its workload key: 2 x MACs; input + weight + output (+ bias,
    + residual) tensors in the storage dtype, each read or written once."""
    size = 2 if wd.get("dtype") == "float16" else 4
    if wd["op"] == "dense":
        (n, k), (m, _) = wd["data"], wd["weight"]
        out = n * m
        elems = n * k + m * k + out + (m if wd.get("bias") else 0)
        return 2 * n * m * k, elems * size
    n, c, h, w = wd["data"]
    o, ci, r, s = wd["kernel"]
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = wd["stride"], wd["dilation"], wd["padding"]
    oh, ow = (h + pt + pb - dh * (r - 1) - 1) // sh + 1, (w + pl + pr - dw * (s - 1) - 1) // sw + 1
    out = n * o * oh * ow
    elems = n * c * h * w + o * ci * r * s + out + (o if wd.get("bias") else 0) + (out if wd.get("residual") else 0)
    return 2 * out * ci * r * s, elems * size


def _peak_rates(peak: dict | None, dtype: str) -> tuple:
    """(FLOP/s, bytes/s) for the bound of a ``dtype`` layer: the OpenCL measurements (float16 layers: the
    faster of the float32 and float16 FMA rates), else torch's cross-checks; None where unmeasured."""
    if not peak:
        return None, None
    rates = [_num(peak.get("cl_fma_float32_flops"))]
    if dtype == "float16":
        rates.append(_num(peak.get("cl_fma_float16_flops")))
    flops = max((r for r in rates if r), default=None) or _num(peak.get("torch_matmul_float32_flops"))
    bw = _num(peak.get("cl_copy_bytes_per_s")) or _num(peak.get("torch_copy_bytes_per_s"))
    return flops, bw


def _peak_text(peak: dict | None) -> list:
    """The markdown sentences on how the bound was measured (n/a without gpu_peak.json)."""
    if not peak:
        return ["Roofline bound: n/a (no `gpu_peak.json` in this results directory: run `bench/gpu.sh peak`)."]
    f = lambda key, unit, scale: (f"{_num(peak.get(key)) / scale:.2f} {unit}" if _num(peak.get(key))  # noqa: E731
                                  else "n/a")
    fp16 = (f"; float16 (cl_khr_fp16) {f('cl_fma_float16_flops', 'TFLOP/s', 1e12)}" if peak.get("cl_khr_fp16")
            else "; the device has no cl_khr_fp16, so float16 layers are priced at the float32 rate")
    copy_gib = (_num((peak.get("cl_copy") or {}).get("size_bytes")) or 0) / 2 ** 30
    return [f"Roofline bound per layer = max(FLOPs / P, bytes / B), FLOPs = 2 x MACs, bytes = input + weights + "
            f"output (+ bias, + residual) in the storage dtype, each moved once. P and B were measured on "
            f"{peak.get('opencl_device', '?')} ({peak.get('platform', '?')} {peak.get('driver', '')}) on "
            f"{peak.get('date', '?')} UTC by `bench/gpu.py peak` (`gpu_peak.json`), median of "
            f"{peak.get('repeats', '?')}: P = {f('cl_fma_float32_flops', 'TFLOP/s', 1e12)} float32 FMA rate of an "
            f"OpenCL kernel (8 independent float4 chains of `fma` or `mad`, the faster, per work-item, enough "
            f"work-groups to fill the device, OpenCL profiling events){fp16}; B = {f('cl_copy_bytes_per_s', 'GB/s', 1e9)} from "
            f"clEnqueueCopyBuffer of {copy_gib:.2f} GiB (read + write counted). Cross-checks in the same job: "
            f"torch.matmul {peak.get('torch_matmul_n', '?')}^3 float32 without TF32 "
            f"{f('torch_matmul_float32_flops', 'TFLOP/s', 1e12)} (float16, tensor cores: "
            f"{f('torch_matmul_float16_flops', 'TFLOP/s', 1e12)}), torch device-to-device copy "
            f"{f('torch_copy_bytes_per_s', 'GB/s', 1e9)}. `x / bound` is kernel time over the bound (1.0 = at "
            f"the roofline). The bound uses DRAM bandwidth and CUDA-core FMAs: cuDNN's float16 convolutions use "
            f"tensor cores, and a layer's tensors can stay in L2 between the repeated timed runs, so a ratio "
            f"below 1 is possible there." + _floor_text(peak)]


def _stream_floor_text(floor: dict | None) -> list:
    """What an almost empty kernel costs each way of timing (``gpu_floor.json`` of the stream stage)."""
    if not floor:
        return []
    cl_f = floor.get("opencl") or {}
    us = lambda x: f"{x * 1e6:.2f} us" if _num(x) else "n/a"  # noqa: E731
    return ["", f"Launch floors, measured in the job of the back-to-back columns (a kernel that stores one float; "
                f"a one-element torch add): OpenCL, one launch by profiling events {us(floor.get('opencl_event_s'))}; "
                f"1000 launches back to back, per launch: {us(cl_f.get('profiling_span_s'))} by events and "
                f"{us(cl_f.get('profiling_wall_s'))} by wall clock on a profiling queue, {us(cl_f.get('plain_wall_s'))} "
                f"by wall clock on a queue without profiling; PyTorch: CUPTI {us(floor.get('torch_cupti_s'))}, a CUDA "
                f"graph of 1000 adds {us(floor.get('torch_graph_stream_s'))} per add. CUPTI and Nsight Compute do not "
                f"see kernels launched through NVIDIA's OpenCL, so ours cannot be timed the way cuDNN's CUPTI column "
                f"is; no floor is subtracted except in the columns named `each above its timing floor`."]


def _floor_text(peak: dict) -> str:
    """The two timing methods' floors (an almost empty kernel), when the peak stage measured them."""
    cl_s = _num((peak.get("cl_empty_kernel") or {}).get("median_s"))
    torch_s = _num(peak.get("torch_empty_kernel_s"))
    if not cl_s:
        return ""
    torch_part = f"; CUPTI reports {torch_s * 1e6:.2f} us for a one-element torch add" if torch_s else ""
    return (f" Timing floor: an OpenCL kernel that stores one float takes {cl_s * 1e6:.2f} us by OpenCL "
            f"profiling events (median of 100){torch_part}. Layers of a few microseconds are compared near these "
            f"floors; nothing is subtracted.")


def _bests(log, fingerprint: str | None = None) -> dict:
    """``(template, canonical workload json, "texture" | "buffer" | "mixed") -> Record``: the fastest successful
    record of each in the log (of one device, or of any)."""
    from tuner.runtime.module import storage_label
    from tuner.logs import best_records, load_records
    from tuner.logs.record import canonical_json
    best = {}
    for r in best_records(r for r in load_records(log) if fingerprint in (None, r.device)).values():
        k = (r.template, canonical_json(r.workload), storage_label(r.scopes.values()))
        if k not in best or r.median_s < best[k].median_s:
            best[k] = r
    return best


def _best_of_layer(best: dict, row: dict, scope: str):
    """The fastest record at ``scope`` of the layer in ``row`` over every template that can run it: its own
    (conv2d, ...) and, for a 3x3 stride-1 conv2d, the Winograd templates (their workload key has no stride,
    dilation or groups)."""
    from tuner.logs.record import canonical_json
    from tuner.task import workload_of
    from tuner.templates import get_template
    wd = json.loads(row["workload"])
    keys = [(row["template"], canonical_json(wd))]
    if row["template"] == "conv2d":
        direct = workload_of(get_template("conv2d"), wd)
        for m in ("winograd2", "winograd4"):
            w = get_template(m).workload.of(direct)
            if w is not None:
                keys.append((m, canonical_json(w.key())))
    found = [best[(tmpl, wl, scope)] for tmpl, wl in keys if (tmpl, wl, scope) in best]
    return min(found, key=lambda r: r.median_s, default=None)


def cmd_table(args) -> int:
    """Per layer: tuned texture, tuned buffer, cuDNN conv, PyTorch eager layer, ratios, roofline bound; then
    whole models."""
    out = Path(args.out)
    best = _bests(args.log)
    peak = None
    if (out / "gpu_peak.json").exists():
        try:
            peak = json.loads((out / "gpu_peak.json").read_text())
        except ValueError as e:
            print(f"ignoring {out / 'gpu_peak.json'}: {e}", file=sys.stderr)
    torch_rows = _read(out / "gpu_cudnn.csv") if (out / "gpu_cudnn.csv").exists() else []
    # ours re-timed in the job that timed cuDNN, and both timed back to back (``stream``), where it ran
    stream = {(r["model"], r["dtype"], r["workload"]): r for r in _read(out / "gpu_stream.csv")} if (
        out / "gpu_stream.csv").exists() else {}
    floor = json.loads((out / "gpu_floor.json").read_text()) if (out / "gpu_floor.json").exists() else None
    # each timing method's floor (an almost empty kernel, measured in the job of the stream stage)
    f_cl, f_cu = (_num((floor or {}).get(k)) for k in ("opencl_event_s", "torch_cupti_s"))
    b2b_lines = []
    lines, ratios, bounds = [] if torch_rows else ["n/a: no gpu_cudnn.csv here (run `bench/gpu.sh cudnn`)"], {}, {}
    by_template = {}
    opt = lambda x, spec: format(x, spec) if x is not None else "n/a"  # noqa: E731
    for dtype in DTYPES:
        rows = [t for t in torch_rows if t["dtype"] == dtype]
        if not rows:
            continue
        peak_flops, peak_bw = _peak_rates(peak, dtype)
        retimed = any(k[1] == dtype for k in stream)
        lines += [f"\n#### {dtype} storage, batch 1: GPU kernel time in microseconds (ours: OpenCL profiling events, "
                  f"median of 25, {'re-timed in the job that timed cuDNN' if retimed else 'from the tuning log'}; "
                  f"PyTorch: CUPTI, mean of 50); ratio > 1: ours faster; roofline bound in "
                  f"microseconds, `x / bound` > 1: slower than the bound\n",
                  "| model | layer | count | tuned texture | tuned buffer | cuDNN conv | PyTorch layer (conv+bias+act+res) "
                  "| cuDNN conv / best ours | PyTorch layer / best ours | roofline bound | best ours / bound "
                  "| cuDNN conv / bound |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        if retimed:
            b2b_lines += [f"\n#### {dtype}: one launch among 100 back to back, microseconds per launch (ours: "
                          f"`Executable.time_stream`, wall clock on a queue without profiling from releasing a batch "
                          f"held behind a user event to its end, median of 5 batches; cuDNN: a CUDA graph of 100 "
                          f"calls, CUDA events, median of 10 replays)\n",
                          "| model | layer | ours, one launch | ours, back to back | cuDNN conv, CUPTI | cuDNN conv, "
                          "back to back | cuDNN / ours, one launch | cuDNN / ours, back to back |",
                          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for t in rows:
            st = stream.get((t["model"], dtype, t["workload"]))
            if st is not None:  # (seconds, template) of each scope, timed in this job
                tex, buf = ((_num(st.get(f"{sc}_event_s")), st.get(f"{sc}_template")) for sc in SCOPES)
            else:
                tex, buf = ((r.median_s, r.template) if r else (None, None)
                            for r in (_best_of_layer(best, t, sc) for sc in SCOPES))
            ours = min((x for x, _ in (tex, buf) if x), default=None)
            conv, layer = float(t["cudnn_conv_kernel_s"]), float(t["torch_layer_kernel_s"])
            conv_ev = float(t["cudnn_conv_s"])
            wd = json.loads(t["workload"])
            flops, nbytes = _layer_traffic(wd)
            bound = (max(flops / peak_flops, nbytes / peak_bw) if peak_flops and peak_bw else None)
            shape = "x".join(map(str, wd["data"]))
            k = "x".join(map(str, wd.get("kernel", wd.get("weight", []))))
            extra = "".join(f" +{e}" for e, on in (("res", wd.get("residual")), (wd.get("activation"), wd.get(
                "activation", "none") != "none")) if on)
            label = f"{t['template']} {shape} k{k}{' s2' if wd.get('stride') == [2, 2] else ''}{extra}"
            fmt = lambda c: (f"{c[0] * 1e6:.1f}" + (f" ({c[1]})" if c[1] != t["template"] else "")  # noqa: E731
                             if c[0] else "-")
            ours_b2b = min((x for x in (_num(st.get(f"{sc}_stream_s")) for sc in SCOPES) if x), default=None) \
                if st else None
            conv_b2b = _num(st.get("cudnn_conv_stream_s")) if st else None
            b2b = conv_b2b / ours_b2b if ours_b2b and conv_b2b else None
            if st is not None:
                b2b_lines.append(f"| {t['model']} | {label} | {opt(ours * 1e6 if ours else None, '.1f')} | "
                                 f"{opt(ours_b2b * 1e6 if ours_b2b else None, '.1f')} | {conv * 1e6:.1f} | "
                                 f"{opt(conv_b2b * 1e6 if conv_b2b else None, '.1f')} | "
                                 f"{opt(conv / ours if ours else None, '.2f')} | {opt(b2b, '.2f')} |")
            above = ((conv - f_cu) / (ours - f_cl)  # ours timed in the job that measured the floors
                     if st is not None and ours and f_cl and f_cu and ours > f_cl and conv > f_cu else None)
            if ours:
                ratios.setdefault((t["model"], dtype), []).append((conv / ours, layer / ours, conv_ev / ours, b2b,
                                                                   above))
                by_template.setdefault((t["template"], dtype), []).append((conv / ours, above))
                if bound:
                    bounds.setdefault((t["model"], dtype), []).append((ours / bound, conv / bound))
            lines.append(f"| {t['model']} | {label} | {t['count']} | {fmt(tex)} | {fmt(buf)} | {conv * 1e6:.1f} "
                         f"| {layer * 1e6:.1f} | " + (f"{conv / ours:.2f} | {layer / ours:.2f} |" if ours else "- | - |")
                         + f" {opt(bound * 1e6 if bound else None, '.2f')} | "
                         f"{opt(ours / bound if ours and bound else None, '.2f')} | "
                         f"{opt(conv / bound if bound else None, '.2f')} |")
    summary = ["| model | dtype | layers | geomean cuDNN conv / ours | geomean PyTorch layer / ours | same, cuDNN timed "
               "with CUDA events (launch gaps included) | both back to back (100 launches) | geomean best ours / "
               "roofline bound | geomean cuDNN conv / roofline bound | cuDNN conv / ours, each above its timing "
               "floor |",
               "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    geo = lambda xs: float(np.exp(np.mean(np.log(xs)))) if xs else None  # noqa: E731

    def cells(rs, bs):
        b2b = [r[3] for r in rs if r[3]]
        return (f"{len(rs)} | " + " | ".join(f"{geo([r[i] for r in rs]):.3f}" for i in range(3))
                + f" | {opt(geo(b2b), '.3f')}" + (f" ({len(b2b)})" if b2b and len(b2b) < len(rs) else "")
                + f" | {opt(geo([a for a, _ in bs]), '.2f')} | {opt(geo([b for _, b in bs]), '.2f')} | "
                + above_cell([r[4] for r in rs]) + " |")

    def above_cell(xs):
        kept = [x for x in xs if x]
        return opt(geo(kept), ".3f") + (f" ({len(kept)})" if kept and len(kept) < len(xs) else "")
    for (model, dtype), rs in ratios.items():
        summary.append(f"| {model} | {dtype} | " + cells(rs, bounds.get((model, dtype), [])))
    for dtype in DTYPES:
        rs = [r for (m, d), v in ratios.items() if d == dtype for r in v]
        bs = [b for (m, d), v in bounds.items() if d == dtype for b in v]
        if rs:
            summary.append(f"| both | {dtype} | " + cells(rs, bs))
    if by_template:
        summary += ["", "By template:", "", "| template | dtype | layers | geomean cuDNN conv / ours | cuDNN conv / "
                    "ours, each above its timing floor |", "| --- | --- | ---: | ---: | ---: |"]
        for (tmpl, dtype), rs in sorted(by_template.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            summary.append(f"| {tmpl} | {dtype} | {len(rs)} | {geo([a for a, _ in rs]):.3f} | "
                           f"{above_cell([b for _, b in rs])} |")
    if f_cl and f_cu:
        summary += ["", f"`each above its timing floor`: (cuDNN's CUPTI time - {f_cu * 1e6:.2f} us) / (ours by OpenCL "
                        f"events - {f_cl * 1e6:.2f} us), the floors being what each method reports for an almost "
                        f"empty kernel in the job of the back-to-back columns (below); only layers re-timed in that job (n/a: "
                        f"none). It estimates how the kernels' "
                        f"own work compares with the launch cost of each API taken out; it is not the target's "
                        f"measure, which subtracts nothing."]
    model_lines = []
    if (out / "gpu_models.csv").exists():
        model_lines = ["| model | dtype | scope | ours ms | ours on the profiling queue ms | PyTorch eager ms | PyTorch "
                       "CUDA graph ms | PyTorch eager / ours | PyTorch CUDA graph / ours | tuned layers | kernels | max rel err "
                       "vs onnxruntime |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for m in _read(out / "gpu_models.csv"):
            ours, graph = _num(m["ours_s"]), _num(m.get("torch_cuda_graph_s"))
            prof_q = _num(m.get("ours_profiling_queue_s"))
            model_lines.append(f"| {m['model']} | {m['dtype']} | {m['scope']} | {ours * 1e3:.3f} | "
                               f"{opt(prof_q * 1e3 if prof_q else None, '.3f')} | "
                               f"{float(m['torch_eager_s']) * 1e3:.3f} | {opt(graph * 1e3 if graph else None, '.3f')} "
                               f"| {float(m['ratio_torch_over_ours']):.3f} | "
                               f"{opt(graph / ours if graph and ours else None, '.3f')} | "
                               f"{m['tuned_layers']}/{m['layers']} | {m.get('kernels') or 'n/a'} | "
                               f"{float(m['rel_err_vs_onnxruntime']):.1e} |")
        model_lines.append("\nBoth PyTorch columns run the same BatchNorm-folded graph, median of 50 timed with CUDA "
                           "events; the CUDA graph is its forward captured once with torch.cuda.CUDAGraph (warmed "
                           "up on a side stream, static input) and replayed, which removes PyTorch's per-kernel "
                           "launch overhead. Ours: wall clock from enqueuing a run's kernels to its end, median of "
                           "50, on the device's run queue (no profiling); the profiling-queue column is the same "
                           "run enqueued on the queue with profiling enabled, as runs were before. Ratios > 1: "
                           "ours faster.")
        for m in _read(out / "gpu_models.csv"):  # what --scope auto compiled and timed whole before keeping one
            if m.get("plan_times_ms"):
                model_lines.append(f"\n{m['model']} {m['dtype']} `--scope auto` timed these whole plans (ms): "
                                   f"{m['plan_times_ms'].replace(';', ', ').replace('=', ' ')}; kept "
                                   f"`{m['plan_kept']}` (templates: {m.get('templates', 'n/a')}).")
    else:
        model_lines = _profile_lines(out)
    text = "\n".join(["### Summary", *summary, "", *_peak_text(peak), *_stream_floor_text(floor), "",
                      "### Whole models", *model_lines, "", "### Per layer", *lines,
                      *(["", "### Per layer, back to back", *b2b_lines] if b2b_lines else [])])
    (out / "gpu_summary.md").write_text(text + "\n")
    print(text)
    return 0


def _profile_lines(out: Path) -> list:
    """Without gpu_models.csv (a job that ran out of time before PyTorch's side): our auto plans' whole-run
    latency and kernel sum from the ``profile_<model>.json`` the models stage writes first."""
    lines = []
    for path in sorted(out.glob("profile_*.json")):
        prof = json.loads(path.read_text())
        lines.append(f"| {path.stem[len('profile_'):]} | float32 | auto | {prof['total_s'] * 1e3:.3f} | "
                     f"{prof['kernel_total_s'] * 1e3:.3f} | {len(prof['rows'])} |")
    if not lines:
        return ["n/a (no `gpu_models.csv` in this results directory: run `bench/gpu.sh models`)."]
    return ["No `gpu_models.csv`: the models stage did not finish in this job, so PyTorch was not timed beside "
            "these plans. Ours, from `profile_<model>.json` (median of 20 whole runs; kernel sum from OpenCL "
            "profiling events):", "", "| model | dtype | scope | ours ms | kernel sum ms | kernels |",
            "| --- | --- | --- | ---: | ---: | ---: |", *lines]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("tune", "cudnn", "peak", "models", "table", "stream"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--device", default="nvidia")
        s.add_argument("--log")
        s.add_argument("--trials", type=int, default=24)
        s.add_argument("--templates", default="", help="tune only these templates (comma-separated; default all)")
        s.add_argument("--deadline", type=float, default=540.0, help="seconds before no new task starts")
        s.add_argument("--parallel", type=int, default=12)
        s.add_argument("--repeats", type=int, default=25)
        s.add_argument("--min-seconds", type=float, default=0.0)
        s.add_argument("--models", default=",".join(MODELS))
        s.add_argument("--dtypes", default=",".join(DTYPES))
        s.add_argument("--scopes", default=",".join(SCOPES))
        s.add_argument("--model-scopes", default="auto,texture,buffer", help="models: the plans compiled")
        s.add_argument("--copy-mib", type=int, default=1024, help="peak: bytes of each copy, MiB")
        s.add_argument("--matmul-n", type=int, default=8192, help="peak: torch.matmul cross-check size")
        s.add_argument("--peak-items-per-cu", type=int, default=2048, help="peak: FMA work-items per compute unit")
        s.add_argument("--peak-target-ms", type=float, default=20.0, help="peak: time per FMA-kernel launch")
        s.add_argument("--peak-repeats", type=int, default=10)
        s.add_argument("--priority", help="tune: only the layers slower than cuDNN in this gpu_cudnn.csv, "
                       "slowest relative to cuDNN first")
        s.add_argument("--side", choices=("ours", "torch"), default="torch",
                       help="stream, models: time our kernels (in a process without torch) or PyTorch's")
        s.add_argument("--runs", type=int, default=100, help="stream: back-to-back launches per timed batch")
    args = p.parse_args(argv)
    return {"tune": cmd_tune, "cudnn": cmd_cudnn, "peak": cmd_peak, "models": cmd_models,
            "table": cmd_table, "stream": cmd_stream}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
