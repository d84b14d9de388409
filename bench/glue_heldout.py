"""Glue on held-out models (issue 55): launches per compute layer and the share of kernels with no template, per
model, for a tree of this repository on one device -- the plan's launch count (every kernel call of the compiled
model) over its compute layers (conv2d, depthwise, dense, Winograd, matmul template steps), and from
``Module.profile`` (medians of ``--repeats`` runs' profiling events) the kernel time of steps with no template
(glue) and of every non-compute step (glue plus the norm / pool / softmax templates).

    python bench/glue_heldout.py run --work W --label after [--device intel]           # this tree
    python bench/glue_heldout.py run --work W --label before --tree /tmp/old55          # another tree (a
        # `git archive REV | tar -x -C DIR` snapshot): its tuner/, templates/ and search_space/ are imported
    python bench/glue_heldout.py table --work W --out bench/results/glue --name heldout_cpu   # .md and .csv

Timing: every profiled run (and every whole run) starts from the inputs uploaded again (``_profile``: a model
input's storage is reused by later tensors, so back-to-back runs without it compute on what the last run left).
``Module.time`` and ``Module.profile`` do the same since this round; ``_profile`` stays for the older trees ``--tree``
measures.

Models: tuner/zoo/heldout.py's five (MobileViT-like GroupNorm(1) linear attention, EdgeNeXt-like LayerNorm over
channels with permutes and a channel split, PReLU after convolutions, a GroupNorm U-Net level with resize and
concat, EfficientNet / MobileNetV3 squeeze-excite blocks; built here for both trees, so the models are the same),
and the zoo's test-size FSRCNN (``sr_conv_transpose``), U-Net, style transfer and MobileNetV3-Small at 64x64;
torchvision's EfficientNet-B0 at 64x64 (``tuner/zoo/heldout.efficientnet_b0``) when ``--models`` names
``efficientnet_b0``. Every model is compiled with ``--scope auto`` and no log (fallback configs), and checked against
onnxruntime. Besides the shares: the launches of squeeze-excite blocks between their producer and the gated
convolution (``se_launches``: an ``se_gate``, or a pool and two 1x1 convolutions) and their kernel time (``se_ms``),
the kernels' total and the whole run's median (``total_ms``). An ``se_gate`` step counts as the two compute layers
it runs (``compute_layers``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tuner/zoo/heldout.py of this tree builds the models for both trees
COMPUTE = ("conv2d", "depthwise_conv2d", "dense", "winograd2", "winograd4", "matmul")
ZOO_MODELS = ("sr_conv_transpose", "unet", "style_transfer", "mobilenet_v3_small")
NOTES = "<!-- notes -->"  # table: the text from this line on in an existing .md is kept


def compute_layers(nodes) -> int:
    """The plan's compute layers: its conv2d / depthwise / dense / Winograd / matmul steps, and the two 1x1
    convolutions each ``se_gate`` step runs (issue 55, item 2: a squeeze-excite block's pool and both convolutions
    in one kernel), so that a model's count does not change when they fuse."""
    return sum(n.template in COMPUTE for n in nodes) + 2 * sum(n.template == "se_gate" for n in nodes)


def _se_node(n) -> bool:
    """A kernel of a squeeze-excite block besides its producer and the gated convolution: an ``se_gate``, or (a
    tree without it) a pool over H, W keeping the rank, or a convolution of a 1x1 map (the squeeze and excite)."""
    wl = n.workload or {}
    return n.template == "se_gate" or (n.template == "spatial_reduce" and wl.get("keepdims", True)
                                       and wl.get("axes", [2, 3]) == [2, 3]) or \
        (n.template == "conv2d" and list(wl.get("data", [0, 0, 0, 0]))[2:] == [1, 1])


def _models(names) -> dict:
    """name -> ONNX ModelProto, built by this tree's zoo (before any other tree is imported)."""
    from tuner.zoo import models as zoo
    from tuner.zoo.heldout import heldout_models
    out = dict(heldout_models())
    tm = zoo.test_models()
    for name in ZOO_MODELS:
        out[name] = zoo.ZOO[name](input_size=64) if name == "mobilenet_v3_small" else tm[name]
    if names and "efficientnet_b0" in names:  # torchvision's EfficientNet-B0 at 64x64: only when named
        from tuner.zoo.heldout import efficientnet_b0
        out["efficientnet_b0"] = efficientnet_b0(input_size=64)
    return {k: v for k, v in out.items() if not names or k in names}


def _profile(mod, feeds: list, repeats: int) -> dict:
    """``Module.profile``'s numbers with the inputs uploaded again before every run: a model input's storage is
    reused by later tensors once the kernels that read it ran (the memory plan), so runs after the first without
    an upload start from what the last one left there, and the values grow run by run (se_net's output 1.8 -> 4e5
    over 25 runs), which changes what some kernels cost. Per node: the median over ``repeats`` runs of its
    kernels' profiling events; ``kernel_total_s`` their sum; ``total_s`` the median whole run on the run queue
    (enqueue to finish, the upload outside the span)."""
    import statistics
    mod.load()
    per: dict = {}
    whole = []
    mod.set_inputs(feeds)
    mod._on_device(mod.runtime.profile, mod._launches)  # warm-up
    for _ in range(repeats):
        mod.set_inputs(feeds)
        for i, t in zip(mod._nodes_of_launch, mod._on_device(mod.runtime.profile, mod._launches)):
            per.setdefault(i, [0.0] * repeats)
            per[i][len(whole)] += t
        mod.set_inputs(feeds)
        mod._on_device(mod.runtime.finish)
        t0 = time.perf_counter()
        mod._on_device(mod.runtime.submit, mod._launches)
        mod._on_device(mod.runtime.finish)
        whole.append(time.perf_counter() - t0)
    rows = [{"node": n.name, "template": n.template, "median_s": statistics.median(per[i]) if i in per else 0.0}
            for i, n in enumerate(mod.spec.nodes)]
    return {"rows": rows, "kernel_total_s": sum(r["median_s"] for r in rows), "total_s": statistics.median(whole)}


def _use_tree(tree: str) -> None:
    """Import ``tree``'s tuner (and its templates / search_space folders) instead of this one's."""
    for mod in [m for m in sys.modules if m == "tuner" or m.startswith("tuner.")]:
        del sys.modules[mod]
    sys.path.insert(0, str(Path(tree).resolve()))
    import tuner
    root = os.path.dirname(os.path.dirname(tuner.__file__))
    if root not in tuner.__path__:
        tuner.__path__.append(root)  # before the editable install's mapping of tuner.templates
    assert Path(tuner.__file__).resolve().is_relative_to(Path(tree).resolve()), tuner.__file__


def cmd_run(args) -> int:
    import onnx
    import onnxruntime as ort
    models = _models(args.models.split(",") if args.models else None)
    paths = {}
    work = Path(args.work)
    (work / "models").mkdir(parents=True, exist_ok=True)
    for name, m in models.items():
        paths[name] = work / "models" / f"{name}.onnx"
        onnx.save(m, str(paths[name]))
    if args.tree:
        _use_tree(args.tree)
    from tuner.compile.compiler import compile_model
    out = {}
    for name, path in paths.items():
        m = models[name]
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal([d.dim_value or 1 for d in i.type.tensor_type.shape.dim])
                 .astype(np.float32) for i in m.graph.input}
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = compile_model(str(path), device=args.device, scope="auto", **(
                dict(measure_plans=True, plan_timer=args.plan_timer) if args.plan_timer else {}))
        compile_s = time.perf_counter() - t0
        got = mod.run(list(feeds.values()))
        err = max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)) for g, r in zip(got, ref))
        nodes = mod.spec.nodes
        launches = sum(len(n.calls) for n in nodes)
        compute = compute_layers(nodes)
        se_launches = sum(len(n.calls) for n in nodes if _se_node(n))
        glue_launches = sum(len(n.calls) for n in nodes if not n.template)
        glue_ops: dict = {}
        for n in nodes:
            if not n.template:
                glue_ops[n.op] = glue_ops.get(n.op, 0) + len(n.calls)
        multi = {n.template: len(n.calls) for n in nodes if n.template and len(n.calls) > 1}
        r = {"device": mod.spec.device.get("name", ""), "max_rel_err": err, "compile_s": compile_s,
             "launches": launches, "compute_layers": compute, "se_launches": se_launches,
             "glue_launches": glue_launches,
             "glue_by_op": glue_ops, "multi_kernel_templates": multi}
        if args.plan_timer:  # the plans timed (fastest_plan's steps): each step's finalists' medians, the kept one
            r["plan_kept"] = getattr(mod, "plan_kept", None)
            r["plan_steps"] = {s.name: {"kept": s.kept, "times_ms": {k: v * 1e3 for k, v in s.times.items()}}
                               for s in getattr(mod, "plan_steps", [])}
        try:  # the copies the plan names with their reasons (Plan.copies; a tree without them: none)
            from tuner.compile.compiler import load_graph, plan_graph
            from tuner.plan.views import write_views
            from tuner.runtime.opencl.device import open_device
            with warnings.catch_warnings():  # the plan compile_model deploys here (no log: templates chosen)
                warnings.simplefilter("ignore")
                plan = write_views(plan_graph(load_graph(str(path)), open_device(args.device).info, "auto", None))
            r["copies"] = list(getattr(plan, "copies", []))
            r["fused"] = list(getattr(plan, "fused", []))  # movement kernels folded into neighbours (io, views)
        except Exception as e:  # noqa: BLE001 - a tree whose planner has another signature: said, not fatal
            r["copies"] = [f"(not planned here: {e})"]
        if args.repeats:
            prof = _profile(mod, list(feeds.values()), args.repeats)
            rows, total = prof["rows"], prof["kernel_total_s"]
            r["kernel_ms"] = total * 1e3
            r["total_ms"] = prof["total_s"] * 1e3  # whole runs on the run queue (Module.time's median)
            se_names = {n.name for n in nodes if _se_node(n)}
            r["se_ms"] = sum(x["median_s"] for x in rows if x["node"] in se_names) * 1e3
            r["no_template_share"] = sum(x["median_s"] for x in rows if not x.get("template")) / max(total, 1e-12)
            r["non_compute_share"] = sum(x["median_s"] for x in rows if x.get("template") not in COMPUTE) / \
                max(total, 1e-12)
        out[name] = r
        print(f"{name} [{args.label}]: err {err:.1e}, plan {r.get('plan_kept', 'auto')}, {launches} launches for "
              f"{compute} compute layers ({launches / max(compute, 1):.2f}), {glue_launches} without a template {glue_ops}"
              + (f", no-template share {r['no_template_share']:.1%}, non-compute {r['non_compute_share']:.1%}, "
                 f"{se_launches} squeeze-excite launches {r['se_ms']:.3f} ms, kernels {r['kernel_ms']:.3f} ms, "
                 f"whole run {r['total_ms']:.3f} ms" if args.repeats else ""), flush=True)
        del mod
    (work / f"heldout_{args.label}.json").write_text(json.dumps(out, indent=1))
    return 0


def cmd_table(args) -> int:
    work, dest = Path(args.work), Path(args.out)
    runs = {f.stem[len("heldout_"):]: json.loads(f.read_text()) for f in sorted(work.glob("heldout_*.json"))}
    labels = [lab for lab in ("before", "after") if lab in runs] + [lab for lab in runs if lab not in ("before", "after")]
    if not labels:
        print(f"no heldout_*.json under {work}")
        return 2
    names = list(dict.fromkeys(n for lab in labels for n in runs[lab]))
    rows = []
    for name in names:
        row = {"model": name}
        for lab in labels:
            r = runs[lab].get(name)
            if r is None:
                continue
            row["device"] = r["device"]
            row[f"launches_{lab}"] = r["launches"]
            row[f"compute_layers_{lab}"] = r["compute_layers"]
            row[f"launches_per_compute_{lab}"] = round(r["launches"] / max(r["compute_layers"], 1), 3)
            row[f"glue_launches_{lab}"] = r["glue_launches"]
            for k in ("se_launches", "se_ms", "kernel_ms", "total_ms"):
                if k in r:
                    row[f"{k}_{lab}"] = round(r[k], 4) if isinstance(r[k], float) else r[k]
            row[f"no_template_share_{lab}"] = round(r.get("no_template_share", float("nan")), 4)
            row[f"non_compute_share_{lab}"] = round(r.get("non_compute_share", float("nan")), 4)
            row[f"max_rel_err_{lab}"] = f"{r['max_rel_err']:.1e}"
            row[f"glue_by_op_{lab}"] = "; ".join(f"{k} {v}" for k, v in sorted(r["glue_by_op"].items(),
                                                                              key=lambda kv: -kv[1]))
            row[f"copies_named_{lab}"] = " | ".join(r.get("copies", []))
            row[f"fused_{lab}"] = " | ".join(r.get("fused", []))
            row[f"multi_kernel_{lab}"] = "; ".join(f"{k} x{v}" for k, v in r.get("multi_kernel_templates", {}).items())
        rows.append(row)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / f"{args.name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    timed = ("launches", "se_launches", "se_ms", "total_ms")  # columns of runs that recorded them
    short = ["model"] + [f"{k}_{lab}" for k in ("launches_per_compute", "no_template_share", "non_compute_share")
                         for lab in labels] + \
        [f"{k}_{lab}" for k in timed for lab in labels if any(f"{k}_{lab}" in r for r in rows)] + \
        [f"glue_by_op_{lab}" for lab in labels]
    lines = ["| " + " | ".join(short) + " |", "|" + "---|" * len(short)]
    fmt = lambda v: f"{v:.1%}" if isinstance(v, float) and v <= 1 else str(v)  # noqa: E731
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(k, "")) if "share" in k else str(r.get(k, "")) for k in short) + " |")
    head = [f"# Glue on held-out models ({rows[0].get('device', '')})", "",
            "Launches per compute layer (every kernel call of the plan over its conv2d / depthwise / dense / "
            "Winograd / matmul steps), and the shares of the kernel time (profiling events' medians) of kernels with "
            "no template and of every non-compute kernel, per tree (`bench/glue_heldout.py`; fallback configs, no "
            "log, `--scope auto`). Full columns (launches, compute layers, errors against onnxruntime, templates "
            f"launching more than one kernel) in {args.name}.csv.", ""]
    md = dest / f"{args.name}.md"
    kept = ""  # what follows the notes marker in the file already there (the run's circumstances) is kept
    if md.exists() and NOTES in md.read_text():
        kept = "\n" + md.read_text()[md.read_text().index(NOTES):]
    md.write_text("\n".join(head + lines) + "\n" + kept)
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=("run", "table"))
    p.add_argument("--work", required=True)
    p.add_argument("--label", default="after", help="run: the name of this tree's rows")
    p.add_argument("--tree", default=None, help="run: a source tree to import instead of this one")
    p.add_argument("--device", default=None, help="run: the OpenCL device (default: the host's default)")
    p.add_argument("--models", default="", help="run: comma-separated names (default: all)")
    p.add_argument("--repeats", type=int, default=10, help="run: profiled runs per model (0: launches only)")
    p.add_argument("--plan-timer", default=None, choices=("python", "native"),
                   help="run: time the plans as `tuner compile --scope auto` does with a log (the per-layer and "
                        "uniform plans, the norms' and squeeze-excite candidates) and keep the fastest; default: "
                        "the per-layer plan, untimed")
    p.add_argument("--out", default=str(HERE / "results" / "glue"))
    p.add_argument("--name", default="heldout_cpu", help="table: the files' name")
    args = p.parse_args(argv)
    return {"run": cmd_run, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
