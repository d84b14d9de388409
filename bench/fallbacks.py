"""Fallback rules compared per layer: what each model's untuned layers (every layer on its fallback config) cost
in kernel time under two or more trees' fallback rules, timed on one device in one process.

    # with each tree on PYTHONPATH in turn: the configs its fallback rules give every task of the models
    python bench/fallbacks.py configs --models a.onnx b.onnx --device nvidia --scope texture --out old.jsonl
    # then, with any one tree: every distinct config timed, the trees alternating, --rounds times
    python bench/fallbacks.py measure --configs old=old.jsonl new=new.jsonl --device nvidia --out DIR

Whole-model latency (``tuner run --bench``) hides a kernel-level change behind launch overhead and run-to-run
swings (on an H100, MobileNetV2's untuned latency moved between 0.74 and 0.97 ms from round to round with the
same artifact); this times the kernels themselves (``tuner.measure``: profiling events, the median of each
timing's repeats) and adds them up per model, each layer times its ``count``. A layer whose config is the same
under every tree is timed once and counts the same for each.

Writes ``<out>/fallbacks_<fingerprint>.csv`` (one row per task and tree) and ``.md`` (per model and template
family: kernel time per tree and the ratios to the first tree).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:  # the tree on PYTHONPATH (whose fallback rules ``configs`` asks), else this checkout
    import tuner  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent))


def cmd_configs(args) -> int:
    """Every task of the models, with the fallback config this tree's rules give it on the device."""
    import tempfile

    from tuner.compile.compiler import plan_model
    from tuner.plan.lower import extract_tasks
    if args.target:  # a device profile: the configs without the device
        from tuner.target import load_profile
        info = load_profile(args.target)
    else:
        from tuner.runtime.opencl.device import choose_device
        info = choose_device(args.device)
    out = open(args.out, "w")
    with tempfile.TemporaryDirectory() as d:
        empty = Path(d) / "empty.jsonl"
        empty.write_text("")
        for model in args.models:
            # the kernels the untuned model deploys (not the Winograd alternatives that tuning would also try)
            tasks = extract_tasks(plan_model(model, info, scope=args.scope, log=str(empty)), alternatives=False)
            for task in tasks:
                cfg = task.fallback(info)
                out.write(json.dumps({"model": Path(model).stem, "template": task.tmpl.name,
                                      "workload": task.workload.key(), "scopes": task.scopes, "fixed": task.fixed,
                                      "count": task.count, "label": task.label,
                                      "config": dataclasses.asdict(cfg)}) + "\n")
            print(f"{Path(model).stem}: {len(tasks)} tasks", flush=True)
    out.close()
    return 0


def cmd_measure(args) -> int:
    from tuner.measure import MeasureInput, MeasureOptions, Measurer
    from tuner.runtime.opencl.device import choose_device
    from tuner.task import workload_of
    from tuner.templates import get_template
    info = choose_device(args.device)
    trees = [s.split("=", 1) for s in args.configs]
    rows = {}  # (model, task label) -> {tree: line}
    for tree, path in trees:
        for line in Path(path).read_text().splitlines():
            d = json.loads(line)
            rows.setdefault((d["model"], d["label"]), {})[tree] = d
    inputs, keys = {}, {}  # config key -> MeasureInput
    for (model, label), by_tree in rows.items():
        for tree, d in by_tree.items():
            t = get_template(d["template"])
            wl = workload_of(t, d["workload"])
            k = json.dumps([d["template"], d["workload"], d["config"]], sort_keys=True)
            keys[(model, label, tree)] = k
            inputs.setdefault(k, MeasureInput(d["template"], wl, t.config(**d["config"])))
    names = list(inputs)
    print(f"{len(rows)} tasks, {len(names)} distinct configs, {args.rounds} rounds", flush=True)
    opts = MeasureOptions(repeats=args.repeats, min_seconds=0.01, n_parallel=2, check=True)
    times = {k: [] for k in names}
    with Measurer(info, opts) as m:
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]  # alternating: neither side always first
            for i in range(0, len(order), 16):
                batch = order[i:i + 16]
                for k, res in zip(batch, m.measure([inputs[k] for k in batch])):
                    if res.ok:
                        times[k].append(res.median)
                    elif r == 0:
                        print(f"  failed: {res.error_code.name} {res.error_msg[:200]}", flush=True)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    med = {k: statistics.median(v) if v else None for k, v in times.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tree_names = [t for t, _ in trees]
    csv_path = out / f"fallbacks_{info.fingerprint}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "task", "template", "count", "tree", "config", "median_us", "timings"])
        for (model, label), by_tree in rows.items():
            for tree, d in by_tree.items():
                k = keys[(model, label, tree)]
                cfg = {a: b for a, b in d["config"].items() if not a.endswith("_scope")}
                w.writerow([model, label, d["template"], d["count"], tree, json.dumps(cfg),
                            round(med[k] * 1e6, 3) if med[k] else "", len(times[k])])
    md = [f"# Fallback rules per layer on {info.name} ({info.fingerprint})", "",
          f"Kernel time of every layer on its fallback config (an empty log), summed per model (each layer times "
          f"its count); medians of {args.rounds} alternating rounds of {args.repeats} timed runs each. Ratios: "
          f"{tree_names[0]} over the other tree (above 1: the other is faster).", "",
          "| model | family | layers | " + " | ".join(f"{t} (us)" for t in tree_names) + " | " +
          " | ".join(f"{tree_names[0]}/{t}" for t in tree_names[1:]) + " |",
          "| --- | --- | ---: | " + " | ".join("---:" for _ in tree_names) + " | " +
          " | ".join("---:" for _ in tree_names[1:]) + " |"]
    for model in dict.fromkeys(m for m, _ in rows):
        fams = {}
        for (mm, label), by_tree in rows.items():
            if mm != model or set(by_tree) != set(tree_names):
                continue
            fam = next(iter(by_tree.values()))["template"]
            for key in (fam, "all"):
                acc = fams.setdefault(key, {"n": 0, **{t: 0.0 for t in tree_names}, "bad": False})
                acc["n"] += 1
                for t in tree_names:
                    v = med[keys[(mm, label, t)]]
                    acc["bad"] |= v is None
                    acc[t] += (v or 0.0) * by_tree[t]["count"] * 1e6
        for fam in sorted(fams, key=lambda f: (f == "all", f)):
            a = fams[fam]
            cells = [f"{a[t]:.1f}" for t in tree_names]
            ratios = [f"{a[tree_names[0]] / a[t]:.2f}" if a[t] else "-" for t in tree_names[1:]]
            md.append(f"| {model} | {'**all**' if fam == 'all' else fam} | {a['n']} | " + " | ".join(cells) + " | "
                      + " | ".join(ratios) + (" (a timing failed)" if a["bad"] else "") + " |")
    (out / f"fallbacks_{info.fingerprint}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("configs", help="this tree's fallback config of every task of the models")
    c.add_argument("--models", nargs="+", required=True)
    c.add_argument("--device", default=None)
    c.add_argument("--target", metavar="PROFILE.json", help="a device profile instead of a device, as `tuner "
                   "compile --target`")
    c.add_argument("--scope", default="texture")
    c.add_argument("--out", required=True)
    m = sub.add_parser("measure", help="time every tree's configs, alternating")
    m.add_argument("--configs", nargs="+", required=True, metavar="TREE=FILE")
    m.add_argument("--device", default=None)
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--repeats", type=int, default=10)
    m.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    return {"configs": cmd_configs, "measure": cmd_measure}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
