"""Where a model's kernel time goes (issue 35): compute layers (the conv2d, depthwise, dense, Winograd and matmul
templates), reductions (the spatial_reduce and group_norm templates) and glue (every other kernel), per model
and device, beside a peer measured in the same run: PyTorch's CUDA-graph replay on a GPU, onnxruntime on a CPU.

    python bench/glue.py export --work W [--models a,b] [--cuda]     # torch: ONNX files, inputs, references,
                                                                     #   and (--cuda) PyTorch's replay times
    python bench/glue.py ours --work W --tree NAME --device nvidia   # compile, check, profile: W/ours_NAME.json
    python bench/glue.py tune --work W --device nvidia --out-log L   # the models' reduction tasks tuned into L
    python bench/glue.py table --work W --out DIR                    # glue_<device>.csv and .md
    python bench/glue.py link --work W --onnx /tmp/timm_models/*.onnx  # ONNX files exported elsewhere (timm), their
                                                                     #   inputs drawn at their own input shapes
    python bench/glue.py plans --work W --device intel [--patterns]  # planned kernels per category (no run): glue
                                                                     #   by op, and by producer -> consumers

``ours`` runs with whichever tree is first on PYTHONPATH (``bench/runtimes_gpu.py prepare`` makes snapshots under
bench/_trees/), so that two trees are measured by the same job on the same device: ``--tree`` only names the
rows. Each model is compiled with ``--scope auto`` (or ``--scope``; ``--plan-timer native``: the candidate plans
timed by tuner-run), the given logs and ``--transfer-from auto`` (as ``tuner compile``), checked against onnxruntime's output (max error relative to its largest magnitude), then
profiled (``Module.profile``: per-node kernel time, medians of ``--repeats`` runs from profiling events) and
timed end to end (``Module.time``: the median of ``--repeats`` runs of the whole model on the run queue,
inputs uploaded before). ``bench/gpu.sh glue`` is the GPU job.

Models (random weights, BatchNorm statistics calibrated on two random batches, exported by torch's TorchScript
exporter, opset 17): torchvision's EfficientNet-B0, MobileNetV3-Large, ShuffleNetV2 x1.0 and RegNetY-400MF
(squeeze-excite pools), ConvNeXt-T (LayerNorm over channels, permutes), and three written here: ``poolformer_s12`` (PoolFormer-S12: GroupNorm(1) before
every token mixer and MLP, at 224), ``style_in`` (the Johnson et al. style-transfer net: reflection padding,
InstanceNorm, residual blocks, nearest upsampling, at 128x128) and ``gn32_resnet`` (ResNet-18 with
GroupNorm(32) in place of BatchNorm, at 224).
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMPUTE = ("conv2d", "depthwise_conv2d", "dense", "winograd2", "winograd4", "matmul")
REDUCTIONS = ("spatial_reduce", "group_norm", "layer_norm", "softmax", "se_gate")
# compute layers a template step runs besides COMPUTE's one each: a squeeze-excite block's two 1x1 convolutions in
# its se_gate (issue 55, item 2), so that a model's compute layers do not change when they fuse -- or in the
# depthwise convolution that computes the gate of its output (``gate``), or the convolution that computes the gate
# it reads (``in_gate``): ``extra_layers``
EXTRA_COMPUTE_LAYERS = {"se_gate": 2}
GATE_FIELDS = ("gate", "in_gate")
MODELS = ("tv_efficientnet_b0", "tv_mobilenet_v3_large", "tv_shufflenet_v2_x1_0", "tv_regnet_y_400mf",
          "poolformer_s12", "style_in", "gn32_resnet", "tv_convnext_tiny")


def extra_layers(steps) -> int:
    """The compute layers ``steps`` run besides their own, each ``(template, workload, gate)``: the workload a
    dataclass or a key's dict, ``gate`` what names the gate a step computes (a gate that several readers compute
    counts once)."""
    gates = set()
    extra = 0
    for template, workload, gate in steps:
        get = workload.get if isinstance(workload, dict) else lambda k, d=None, w=workload: getattr(w, k, d)
        extra += EXTRA_COMPUTE_LAYERS.get(template or "", 0)
        if any(get(k, 0) for k in GATE_FIELDS):
            gates.add(gate)
    return extra + 2 * len(gates)


def _gate_of(node) -> str:
    """What names the gate an artifact node computes: the row sums a reader binds as ``S``, or the node itself."""
    if (node.workload or {}).get("in_gate"):
        call = node.calls[0]
        return next((a for p, a in zip(call.signature, call.args) if p.name == "S"), node.name)
    return node.name


# -- torch side -----------------------------------------------------------------------------------------------
def _poolformer_s12(nn):
    """PoolFormer-S12 (Yu et al. 2022): stages of (GroupNorm(1), avg-pool mixer minus identity, GroupNorm(1),
    1x1-conv MLP) with layer scale, patch embeddings by strided convolutions; GELU."""
    import torch

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.n1, self.n2 = nn.GroupNorm(1, c), nn.GroupNorm(1, c)
            self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
            self.mlp = nn.Sequential(nn.Conv2d(c, 4 * c, 1), nn.GELU(), nn.Conv2d(4 * c, c, 1))
            self.s1, self.s2 = (nn.Parameter(torch.full((1, c, 1, 1), 0.5)) for _ in range(2))

        def forward(self, x):
            y = self.n1(x)
            x = x + self.s1 * (self.pool(y) - y)
            return x + self.s2 * self.mlp(self.n2(x))

    dims, depths = (64, 128, 320, 512), (2, 2, 6, 2)
    layers = [nn.Conv2d(3, dims[0], 7, 4, 2)]
    for i, (c, d) in enumerate(zip(dims, depths)):
        if i:
            layers.append(nn.Conv2d(dims[i - 1], c, 3, 2, 1))
        layers += [Block(c) for _ in range(d)]
    layers += [nn.GroupNorm(1, dims[-1]), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(dims[-1], 1000)]
    return nn.Sequential(*layers)


def _style_in(nn):
    """The Johnson et al. (2016) transformer net as in PyTorch's examples: reflection-padded convolutions with
    InstanceNorm(affine) and ReLU, five residual blocks, nearest-upsampling convolutions."""
    def conv(i, o, k, s=1, up=False):
        layers = [nn.Upsample(scale_factor=2, mode="nearest")] if up else []
        return layers + [nn.ReflectionPad2d(k // 2), nn.Conv2d(i, o, k, s)]

    def cin(i, o, k, s=1, up=False):
        return conv(i, o, k, s, up) + [nn.InstanceNorm2d(o, affine=True), nn.ReLU()]

    class Res(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(*cin(c, c, 3), *conv(c, c, 3), nn.InstanceNorm2d(c, affine=True))

        def forward(self, x):
            return x + self.body(x)

    return nn.Sequential(*cin(3, 32, 9), *cin(32, 64, 3, 2), *cin(64, 128, 3, 2), *[Res(128) for _ in range(5)],
                         *cin(128, 64, 3, up=True), *cin(64, 32, 3, up=True), *conv(32, 3, 9))


def _build(name: str):
    import torch
    from torch import nn
    if name.startswith("tv_"):
        import torchvision
        return getattr(torchvision.models, name[3:])(weights=None), 224
    if name.startswith("timm_"):  # timm's hybrids (random weights): the device needs timm (bench/gpu.sh: .whl_timm/)
        import timm  # at its native input size (224 or 256: attention biases and patch grids are sized for it)
        model = timm.create_model(name[5:], pretrained=False)
        return model, int(model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])
    if name == "gn32_resnet":
        import torchvision
        return torchvision.models.resnet18(weights=None, norm_layer=lambda c: nn.GroupNorm(32, c)), 224
    torch.manual_seed(0)
    return {"poolformer_s12": lambda: (_poolformer_s12(nn), 224), "style_in": lambda: (_style_in(nn), 128)}[name]()


def cmd_export(args) -> int:
    import torch
    work = Path(args.work)
    (work / "models").mkdir(parents=True, exist_ok=True)
    out = json.loads((work / "torch.json").read_text()) if (work / "torch.json").exists() else {}
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, size = _build(name)
        x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32))
        model.train()
        with torch.no_grad():  # BatchNorm statistics of random batches, so that activations keep their scale
            for _ in range(2):
                model(torch.randn(4, 3, size, size))
        model.eval()
        path = work / "models" / f"{name}.onnx"
        torch.onnx.export(model, (x,), str(path), opset_version=17, dynamo=False, input_names=["x"])
        np.save(work / "models" / f"{name}.x.npy", x.numpy())
        row = {"size": size}
        if args.cuda and torch.cuda.is_available():
            row["torch_graph_s"] = _torch_graph_time(model, x, args.repeats)
        out[name] = row
        print(f"{name}: exported at {size}x{size}" + (f", torch graph {row['torch_graph_s'] * 1e3:.3f} ms"
                                                       if "torch_graph_s" in row else ""), flush=True)
        (work / "torch.json").write_text(json.dumps(out, indent=1))
    return 0


def _torch_graph_time(model, x, repeats: int) -> float:
    """The median of ``repeats`` replays of a CUDA graph of one forward pass (cuDNN, TF32 off), each timed by
    CUDA events around the replay."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    m, xc = model.cuda(), x.cuda()
    s = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(5):
            m(xc)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        m(xc)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    m.cpu()
    return statistics.median(times)


# -- ours ----------------------------------------------------------------------------------------------------
def _logs(spec: str):
    """The log files of ``--log``'s comma-separated globs; None for ''."""
    return sorted(p for pattern in spec.split(",") for p in glob.glob(pattern)) if spec else None


def _category(row) -> str:
    t = row.get("template") or ""
    return "compute" if t in COMPUTE else "reduction" if t in REDUCTIONS else "glue"


def _by_op(rows) -> list:
    """``[[kernel, count, seconds]]`` of profile rows grouped by template or glue op, the most time first."""
    out: dict = {}
    for r in rows:
        k = r.get("template") or r["op"]
        out.setdefault(k, [k, 0, 0.0])
        out[k][1] += 1
        out[k][2] += r["median_s"]
    return sorted(out.values(), key=lambda v: -v[2])


def _glue_reads(spec):
    """The most elements a glue kernel (no template) reads per launched work-item: its read arguments' elements
    over its work-items (issue 35's bound is 4096; the reduction templates keep theirs in their spaces)."""
    calls = [c for n in spec.nodes if not n.template for c in n.calls]
    if calls and not hasattr(calls[0], "reads_per_work_item"):  # a tree from before Call.reads_per_work_item
        return float("nan")
    return max((c.reads_per_work_item() for c in calls), default=0.0)


def cmd_ours(args) -> int:
    import warnings

    import onnxruntime as ort
    from tuner.compile.compiler import compile_model
    from tuner.errors import TunerError
    work = Path(args.work)
    path = work / f"ours_{args.tree}.json"
    out = json.loads(path.read_text()) if path.exists() else {}
    logs = _logs(args.log)
    for name in args.models.split(","):
        onnx_path = work / "models" / f"{name}.onnx"
        if not onnx_path.exists():
            print(f"{name}: no {onnx_path}", flush=True)
            continue
        x = np.load(work / "models" / f"{name}.x.npy")
        sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        t0 = time.perf_counter()
        ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        ort_s = [time.perf_counter() - t0]
        for _ in range(min(args.repeats, 10)):
            t0 = time.perf_counter()
            sess.run(None, {sess.get_inputs()[0].name: x})
            ort_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = compile_model(str(onnx_path), log=logs, device=args.device, scope=args.scope,
                                    transfer_from="auto" if logs else None, plan_timer=args.plan_timer)
        except (TunerError, ValueError) as e:  # a tree that cannot compile the model: said, and the next model
            print(f"{name} [{args.tree}]: {e}", flush=True)
            continue
        compile_s = time.perf_counter() - t0
        got = mod.run([x])[0]
        err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
        prof = mod.profile(args.repeats)
        rows = prof["rows"]
        by = {c: [r for r in rows if _category(r) == c] for c in ("compute", "reduction", "glue")}
        launches = sum(len(n.calls) for n in mod.spec.nodes)
        out[name] = {"device": prof["device"], "fingerprint": prof["fingerprint"], "max_rel_err": err,
                     "compile_s": compile_s, "latency_s": statistics.median(mod.time(args.repeats)),
                     "kernel_total_s": prof["kernel_total_s"], "launches": launches,
                     "onnxruntime_cpu_s": statistics.median(ort_s),
                     **{f"{c}_s": sum(r["median_s"] for r in rs) for c, rs in by.items()},
                     **{f"{c}_nodes": len(rs) for c, rs in by.items()},
                     "se_launches": sum(len(n.calls) for n in mod.spec.nodes if n.template == "se_gate"),
                     "se_s": sum(r["median_s"] for r in rows if r.get("template") == "se_gate"),
                     "worst": sorted(((r["median_s"], r["op"], r.get("template") or "") for r in rows
                                      if _category(r) != "compute"), reverse=True)[:3],
                     "non_compute_by_op": _by_op(r for r in rows if _category(r) != "compute"),
                     "glue_reads_per_item": _glue_reads(mod.spec), "plan_kept": getattr(mod, "plan_kept", None),
                     "plan_steps": {st.name: {k: round(v * 1e3, 4) for k, v in st.times.items()}
                                    for st in getattr(mod, "plan_steps", None) or ()}}
        try:  # the C runtime's whole-run median (tuner-run --bench): the deployed path, without Python's enqueue
            import tempfile
            import tuner.native as native
            with tempfile.TemporaryDirectory() as d:
                mod.save(Path(d) / "a")
                exe = native.build()["tuner_run"]
                native.bench_artifact(Path(d) / "a", mod.spec.device["fingerprint"], repeats=1, warmup=0, exe=exe)
                out[name]["native_latency_s"] = native.bench_artifact(Path(d) / "a", mod.spec.device["fingerprint"],
                                                                      repeats=args.repeats, exe=exe)
        except Exception as e:  # noqa: BLE001 - a tree or machine without the native runtime: said, not fatal
            print(f"{name} [{args.tree}]: no native timing: {e}", flush=True)
        r = out[name]
        r["compute_nodes"] += extra_layers((n.template, n.workload or {}, _gate_of(n)) for n in mod.spec.nodes)
        print(f"{name} [{args.tree}]: err {err:.1e}, latency {r['latency_s'] * 1e3:.3f} ms "
              f"(native {r.get('native_latency_s', float('nan')) * 1e3:.3f}), kernels "
              f"{r['kernel_total_s'] * 1e3:.3f} ms (compute {r['compute_s'] * 1e3:.3f}, reduction "
              f"{r['reduction_s'] * 1e3:.3f}, glue {r['glue_s'] * 1e3:.3f}), {launches} launches for "
              f"{r['compute_nodes']} compute layers, plan {r['plan_kept']}", flush=True)
        for step in ("squeeze_excite", "norms"):  # the plans each of these steps timed: the plan timer's ms
            if step in r["plan_steps"]:
                print(f"{name} [{args.tree}] {step} step: {r['plan_steps'][step]}", flush=True)
        path.write_text(json.dumps(out, indent=1))
        del mod
    return 0


def _rewrite(name: str):
    """``--rewrite``: the graph rewrite of a plan the compile times beside the graph's own, or None."""
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers, norms_applied_as_read
    from tuner.graph.passes_se import gates_in_depthwise, gates_in_readers
    return {"": None, "gates-in-producers": gates_in_depthwise, "gates-in-readers": gates_in_readers,
            "stats-in-producers": norm_statistics_into_producers,
            "norms-as-read": norms_applied_as_read,
            "norms-as-read+stats-in-producers": lambda g: norm_statistics_into_producers(norms_applied_as_read(g)),
            "pools-in-dense": None}[name]  # a plan's views, not a graph rewrite: ``_pooled_dense_tasks``


def _pooled_dense_tasks(graph, dev, scope: str, logs) -> list:
    """``--rewrite pools-in-dense``: each dense of the plan that reads a global average pool, as the task that reads
    the pool's maps itself (``DenseWorkload.in_pool``; a wide one, ImageNet's 1000 classes, is fused only where
    the log has measured it faster than the two apart: ``input_views._staged_pool_pays``)."""
    from tuner.compile.compiler import plan_model
    from tuner.plan.input_views import pooled_dense
    from tuner.plan.io_views import readers_of
    from tuner.plan.types import FIXED
    from tuner.task import TuningTask
    plan = plan_model(graph, dev, scope, logs)
    producer, readers = {s.output: s for s in plan.steps}, readers_of(plan)
    fused = [(s, pooled_dense(plan, s, producer, readers)) for s in plan.steps]
    return [TuningTask("dense", found[0], dict(s.scopes), FIXED["dense"]) for s, found in fused if found is not None]


def cmd_tune(args) -> int:
    """Every reduction task (``REDUCTIONS``) of the models' plans in each of ``--scopes`` (``auto``'s; with
    ``auto,texture,buffer`` also those of the uniform plans ``--scope auto`` may keep in another job), tuned with
    ``--trials`` measurements each (the fallback config first), the slowest-looking first, until ``--deadline``
    seconds have passed. ``--untuned``: also every other task that no record of ``--log`` holds (a kernel the
    glue work made new: a depthwise convolution that writes its row sums), the heaviest first; ``--templates``:
    only those templates' tasks; ``--again``: those --log holds records of too (each task's best before and after
    is printed); ``--rewrite``: only the tasks that a plan the compile times beside the graph's own has and that one
    lacks -- ``gates-in-producers``: each squeeze-excite gate computed by its depthwise producer
    (``passes_se.gates_in_depthwise``); ``gates-in-readers``: by the convolutions that read it
    (``passes_se.gates_in_readers``); ``stats-in-producers``: each GroupNorm(1)'s statistics written by its
    producer (``passes_layer_norm.norm_statistics_into_producers``); ``norms-as-read+stats-in-producers``: every
    norm applied by its readers, its statistics (an InstanceNorm's, a GroupNorm's) by its producer;
    ``pools-in-dense``: each classifier's dense reading its global average pool's maps. A convolution
    that writes statistics keeps its plain key (``Conv2dWorkload.out_stats``: the records apply), so of those two
    only the readers that normalize are new tasks."""
    import dataclasses
    from tuner.compile.compiler import load_graph, model_tasks
    from tuner.runtime.opencl.device import open_device
    from tuner.search.tune import tune
    from tuner.templates import get_template
    dev = open_device(args.device)
    logs = _logs(args.log)
    rewrite = _rewrite(args.rewrite)
    tasks, seen = [], set()
    for name in args.models.split(","):
        onnx_path = Path(args.work) / "models" / f"{name}.onnx"
        if onnx_path.exists():
            graph = load_graph(str(onnx_path))
            own = set() if rewrite is None else \
                {t.key() for scope in args.scopes.split(",") for t in model_tasks(graph, dev, scope=scope, log=logs)}
            graph = graph if rewrite is None else rewrite(graph)
            for scope in args.scopes.split(","):  # auto's plan, and the uniform ones auto may switch to
                for t in (_pooled_dense_tasks(graph, dev, scope, logs) if args.rewrite == "pools-in-dense" else
                          model_tasks(graph, dev, scope=scope, log=logs)):
                    wanted = t.template in args.templates.split(",") if args.templates else \
                        t.template in REDUCTIONS or args.untuned
                    if wanted and t.key() not in seen and t.key() not in own:
                        seen.add(t.key())
                        tasks.append(t)
    tasks.sort(key=lambda t: -t.workload.flops * t.count)
    if logs:
        from tuner.logs.best import ApplyHistoryBest
        history = ApplyHistoryBest(logs)
    pinned = _pinned(args.fix)

    def knobs(t) -> dict:
        """The task's fixed knobs and those of ``--fix`` its template has."""
        own = {f.name for f in dataclasses.fields(get_template(t.template).config)}
        return {**t.fixed, **{k: v for k, v in pinned.items() if k in own}}
    if logs and not args.again:  # a task this device's logs already hold a record of is not tuned again
        done = [t for t in tasks if history.query(t.template, t.workload, dev.fingerprint, t.scopes, knobs(t))]
        tasks = [t for t in tasks if t not in done]
        print(f"{len(done)} tasks tuned before (in --log)", flush=True)
    start = time.perf_counter()
    print(f"{len(tasks)} tasks to tune", flush=True)
    for i, t in enumerate(tasks):
        if time.perf_counter() - start > args.deadline:
            print(f"deadline: {len(tasks) - i} tasks not tuned", flush=True)
            break
        before = ""
        if args.again and logs:
            rec = history.query(t.template, t.workload, dev.fingerprint, t.scopes, t.fixed)
            before = f" (the log's best: {rec.median_s * 1e6:.1f} us, {rec.config})" if rec is not None else ""
        r = tune(t.template, t.workload, dev, trials=args.trials, log=args.out_log, scopes=t.scopes,
                 fixed=knobs(t), fallback_first=knobs(t) == t.fixed, progress=False)
        print(f"[{i + 1}/{len(tasks)}] {t.template} {t.label}: best {r.best.median_s * 1e6:.1f} us {r.best.config}"
              f"{before}" if r.best else f"[{i + 1}/{len(tasks)}] {t.label}: no valid config", flush=True)
    return 0


def _pinned(text: str) -> dict:
    """``--fix``'s knobs: ``KNOB=VALUE`` pairs, comma-separated; true, false and integers as such."""
    pinned = {}
    for pair in filter(None, text.split(",")):
        knob, sep, value = pair.partition("=")
        if not sep or not knob.strip():
            raise SystemExit(f"--fix {pair!r}: want KNOB=VALUE, e.g. last_group=true")
        value = value.strip()
        number = value.lstrip("-").isdigit()
        pinned[knob.strip()] = {"true": True, "false": False}.get(value.lower(), int(value) if number else value)
    return pinned


# -- other models, and plans ---------------------------------------------------------------------------------
def cmd_link(args) -> int:
    """ONNX files exported elsewhere (timm's, with torch on another machine) as ``W/models/NAME.onnx``, each with a
    random input of its own input shape (``NAME.x.npy``, seed 0; a symbolic dimension is 1)."""
    import onnx
    models = Path(args.work) / "models"
    models.mkdir(parents=True, exist_ok=True)
    for path in args.onnx:
        src = Path(path).resolve()
        dest = models / src.name
        if not dest.exists():
            dest.symlink_to(src)
        dims = onnx.load(str(src), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
        shape = [d.dim_value or 1 for d in dims]
        np.save(models / f"{src.stem}.x.npy", np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        print(f"{src.stem}: input {shape}")
    return 0


def _patterns(plan) -> list:
    """``[[count, op, producers, consumers]]`` of the plan's glue steps: what each reads (producer steps' ops, or
    param / input) and what reads it (consumer op.parameter), the most frequent first."""
    producer = {s.output: s for s in plan.steps}
    readers: dict = {}
    for s in plan.steps:
        for k, v in s.inputs.items():
            readers.setdefault(v, []).append(f"{s.op}.{k}")
    count: dict = {}
    for s in plan.steps:
        if s.op in COMPUTE + REDUCTIONS:
            continue
        what = s.attrs.get("op") or s.attrs.get("fn") or ""
        ins = tuple(producer[v].op if v in producer else "param" if v in plan.params else "input"
                    for v in s.inputs.values())
        outs = tuple(sorted(readers.get(s.output, []))) or (("model output",) if s.output in plan.outputs else
                                                             ("read by none",))
        key = (s.op + (f" {what}" if what else ""), ins, outs)
        count[key] = count.get(key, 0) + 1
    return sorted(([n, *k] for k, n in count.items()), key=lambda r: -r[0])


def cmd_plans(args) -> int:
    """Each model's planned kernels (``--scope``, default auto; no log: what ``plan_model`` and ``write_views``
    leave) as compute / reduction / glue counts, launches per compute layer and glue by op; ``--rewrite``: the plan
    of that rewrite of the graph (a candidate ``--scope auto`` times); ``--patterns``: glue by producer -> consumers
    too."""
    import warnings

    from tuner.compile.compiler import device_history, as_history, load_graph, plan_graph
    from tuner.plan.views import write_views
    from tuner.runtime.opencl.device import open_device
    if args.rewrite == "pools-in-dense":
        raise SystemExit("plans --rewrite pools-in-dense: a plan's views, not a graph rewrite; the plan fuses a wide "
                         "head's pool where the log measured it faster (tune it with tune --rewrite pools-in-dense)")
    dev = open_device(args.device)
    rewrite = _rewrite(args.rewrite)
    for name in args.models.split(","):
        path = Path(args.work) / "models" / f"{name}.onnx"
        if not path.exists():
            print(f"{name}: no {path}")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = load_graph(str(path))
            plan = write_views(plan_graph(graph if rewrite is None else rewrite(graph), dev.info, args.scope,
                                          device_history(as_history(None), dev.info)))
        ops = [s.op for s in plan.steps]
        glue = {op: ops.count(op) for op in dict.fromkeys(ops) if op not in COMPUTE + REDUCTIONS}
        reductions = {op: ops.count(op) for op in dict.fromkeys(ops) if op in REDUCTIONS}
        layers = sum(op in COMPUTE for op in ops) + extra_layers(
            (s.op, s.workload, s.inputs.get("S") if getattr(s.workload, "in_gate", 0) else s.name) for s in plan.steps)
        print(f"{name}: {len(ops)} kernels for {layers} compute layers ({len(ops) / max(layers, 1):.2f}): "
              f"reductions {reductions}, glue {sum(glue.values())} {glue}")
        if args.patterns:
            for n, op, ins, outs in _patterns(plan):
                print(f"  {n:4d} {op} <- {', '.join(ins)} -> {', '.join(outs)}")
    return 0


# -- table ---------------------------------------------------------------------------------------------------
def cmd_table(args) -> int:
    work, dest = Path(args.work), Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    torch_t = json.loads((work / "torch.json").read_text()) if (work / "torch.json").exists() else {}
    trees = sorted(work.glob("ours_*.json"))
    rows = []
    for f in trees:
        tree = f.stem[len("ours_"):]
        for name, r in json.loads(f.read_text()).items():
            peer = torch_t.get(name, {}).get("torch_graph_s")
            rows.append({"model": name, "tree": tree, "device": r["device"], "max_rel_err": f"{r['max_rel_err']:.1e}",
                         "latency_ms": r["latency_s"] * 1e3, "kernels_ms": r["kernel_total_s"] * 1e3,
                         "compute_ms": r["compute_s"] * 1e3, "reduction_ms": r["reduction_s"] * 1e3,
                         "glue_ms": r["glue_s"] * 1e3,
                         "non_compute_share": (r["reduction_s"] + r["glue_s"]) / max(r["kernel_total_s"], 1e-12),
                         "launches": r["launches"], "compute_layers": r["compute_nodes"],
                         "launches_per_compute": r["launches"] / max(r["compute_nodes"], 1),
                         "se_gate_launches": r.get("se_launches", 0), "se_gate_ms": r.get("se_s", 0.0) * 1e3,
                         "peer": "torch_cuda_graph" if peer else "onnxruntime_cpu",
                         "peer_ms": (peer or r["onnxruntime_cpu_s"]) * 1e3,
                         "speedup_vs_peer": (peer or r["onnxruntime_cpu_s"]) / r["latency_s"],
                         "native_latency_ms": r.get("native_latency_s", float("nan")) * 1e3,
                         "native_speedup_vs_peer": (peer or r["onnxruntime_cpu_s"]) / r.get("native_latency_s",
                                                                                           float("nan")),
                         "glue_reads_per_item": r.get("glue_reads_per_item", float("nan")),
                         "worst_non_compute": "; ".join(f"{op}{'/' + t if t else ''} {s * 1e3:.3f}" for s, op, t in r["worst"]),
                         "non_compute_by_op": "; ".join(f"{k} {n}x {t * 1e3:.3f}" for k, n, t in r.get("non_compute_by_op", []))})
    if not rows:
        print(f"no ours_*.json under {work}")
        return 2
    device = rows[0]["device"].replace(" ", "_")
    fields = list(rows[0])
    with open(dest / f"glue_{device}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(fmt(r[k]) for k in fields) + " |" for r in sorted(rows, key=lambda r: (r["model"], r["tree"]))]
    (dest / f"glue_{device}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=("export", "ours", "tune", "table", "link", "plans"))
    p.add_argument("--work", required=True)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--cuda", action="store_true", help="export: time PyTorch's CUDA-graph replay too")
    p.add_argument("--tree", default="new", help="ours: the name of this tree's rows")
    p.add_argument("--device", default=None)
    p.add_argument("--log", default="logs/*.jsonl", help="ours: comma-separated globs of logs ('' for none)")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--scope", default="auto", choices=("auto", "texture", "buffer"),
                   help="ours: compile's --scope; plans: the plan's scope")
    p.add_argument("--plan-timer", default="python", choices=("python", "native"),
                   help="ours: with --scope auto, what times the candidate plans (compile's --plan-timer)")
    p.add_argument("--trials", type=int, default=24, help="tune: measurements per task")
    p.add_argument("--deadline", type=float, default=400, help="tune: start no task after this many seconds")
    p.add_argument("--out-log", default=None, help="tune: the log the records go to (default: the device's)")
    p.add_argument("--scopes", default="auto", help="tune: the plans whose tasks are tuned, comma-separated "
                   "(auto, texture, buffer)")
    p.add_argument("--untuned", action="store_true", help="tune: also the other tasks --log has no record of")
    p.add_argument("--again", action="store_true", help="tune: also the tasks --log holds records of (a template "
                   "whose space grew a knob), tuned afresh into --out-log (the fallback first)")
    p.add_argument("--templates", default="", help="tune: only the tasks of these templates (comma-separated) that "
                   "--log has no record of (with --again: all of them), e.g. depthwise_conv2d,se_gate")
    p.add_argument("--fix", default="", help="tune: knobs pinned in every task's search, KNOB=VALUE comma-separated "
                   "(e.g. partial_squeeze=true,last_group=true,excite_groups=1: a new variant's configs measured "
                   "where the sampler would rarely reach them)")
    p.add_argument("--rewrite", default="", choices=("", "gates-in-producers", "gates-in-readers", "stats-in-producers",
                                                     "norms-as-read", "norms-as-read+stats-in-producers",
                                                     "pools-in-dense"),
                   help="tune, plans: the tasks "
                   "or the plan of this rewrite of each model's graph (a plan the compile times beside its own)")
    p.add_argument("--out", default=str(HERE / "results" / "glue"))
    p.add_argument("--onnx", nargs="*", default=[], help="link: the ONNX files")
    p.add_argument("--patterns", action="store_true", help="plans: glue by producer -> consumers too")
    args = p.parse_args(argv)
    return {"export": cmd_export, "ours": cmd_ours, "tune": cmd_tune, "table": cmd_table, "link": cmd_link,
            "plans": cmd_plans}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
