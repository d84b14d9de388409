"""Where a measurement's seconds go (issue 53): for a model's tasks, random valid configs taken apart phase by
phase in this process (space check, instantiate, lower + generate, OpenCL compile from source, compile again from
the driver's/pyopencl's cache, executable, inputs and reference, check, timing), then the same configs through the
tuner's ``Measurer`` (worker processes) and through ``tune_model`` for a short while, as wall-clock rates.

    python bench/measure_profile.py --model resnet18 --device nvidia --configs 4 --out DIR

Writes ``DIR/measure_profile_<device>.csv`` (one row per config and phase) and ``.md`` (medians per phase, the
rates)."""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import numpy as np


def _phases(task, info, dev, values: dict, ref_cache: dict) -> dict:
    from tuner.codegen.opencl import program_source
    from tuner.lower import lower
    from tuner.runtime.opencl.launch import build as build_executable
    from tuner.runtime.opencl.program import build_program, clear_program_cache
    t = task.tmpl
    out = {}
    t0 = time.perf_counter()
    space = t.space(task.workload, info)
    bad = space.violations(values)
    out["space"] = time.perf_counter() - t0
    if bad:
        return {}
    cfg = t.make_config(values)
    t0 = time.perf_counter()
    kernel = t.build(task.workload, cfg)
    out["instantiate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    source = program_source(lower(kernel))
    out["lower+generate"] = time.perf_counter() - t0
    clear_program_cache(dev)
    t0 = time.perf_counter()
    build_program(dev, source + f"\n// {time.time_ns()}\n")  # a source no cache has seen: the compiler itself
    out["compile"] = time.perf_counter() - t0
    clear_program_cache(dev)
    t0 = time.perf_counter()
    build_program(dev, source)
    out["compile (cached?)"] = time.perf_counter() - t0
    clear_program_cache(dev)
    t0 = time.perf_counter()
    exe = build_executable(kernel, dev)
    out["executable"] = time.perf_counter() - t0
    key = task.key()
    t0 = time.perf_counter()
    if key not in ref_cache:
        inputs = t.random_inputs(task.workload, np.random.default_rng(0))
        ref_cache[key] = (inputs, t.reference(task.workload, inputs))
    inputs, ref = ref_cache[key]
    out["reference"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    arrays = exe.upload_inputs(**inputs)
    exe.launch(arrays)
    got = exe.outputs_of(arrays)[t.output]
    out["check"] = time.perf_counter() - t0
    out["rel_error"] = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    t0 = time.perf_counter()
    costs = exe.time(arrays, warmup=1, repeats=5, min_seconds=0.02)
    out["time"] = time.perf_counter() - t0
    out["kernel_ms"] = statistics.median(costs) * 1e3
    out["runs"] = len(costs)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18", help="a zoo model name or an ONNX file")
    p.add_argument("--device", default=None)
    p.add_argument("--configs", type=int, default=3, help="random valid configs per task")
    p.add_argument("--tasks", type=int, default=6, help="tasks taken (the heaviest first)")
    p.add_argument("--parallel", type=int, default=12)
    p.add_argument("--tune-seconds", type=float, default=60.0, help="tune_model's run (0: none)")
    p.add_argument("--out", default="bench/results")
    a = p.parse_args()
    from tuner.compile.compiler import model_tasks
    from tuner.measure import MeasureInput, MeasureOptions, Measurer
    from tuner.runtime.opencl.device import open_device
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = a.model
    if not model.endswith(".onnx"):
        from tuner.zoo.models import write_model
        model = write_model(model, str(out / f"{model}.onnx"))
    dev = open_device(a.device)
    info = dev.info
    tasks = sorted(model_tasks(model, info, scope="texture"), key=lambda t: -t.weight)[:a.tasks]
    rng = np.random.default_rng(0)
    rows, inputs, ref_cache = [], [], {}
    for task in tasks:
        bound = task.bind(info)
        space = bound.space(info)
        got = 0
        for _ in range(200):
            values = space.sample(rng)
            if space.violations(values):
                continue
            ph = _phases(bound, info, dev, values, ref_cache)
            if not ph:
                continue
            got += 1
            rows.append({"task": bound.label, **ph})
            inputs.append(MeasureInput(bound.template, bound.workload, bound.tmpl.make_config(values)))
            print(bound.label, {k: round(v, 3) for k, v in ph.items()}, flush=True)
            if got >= a.configs:
                break
    phases = [k for k in rows[0] if k != "task"]
    with open(out / f"measure_profile_{info.type.lower()}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["task", *phases])
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Where a measurement's time goes: {info.name} ({info.fingerprint}), {a.model}'s {len(tasks)} heaviest "
             f"tasks, {len(rows)} random valid configs", "", "| phase | median s | max s |", "| --- | ---: | ---: |"]
    for k in phases:
        vals = [r[k] for r in rows if k in r]
        lines.append(f"| {k} | {statistics.median(vals):.4g} | {max(vals):.4g} |")
    # the same configs again through the Measurer (worker processes), each a source it has not compiled
    for par in sorted({1, a.parallel}):
        t0 = time.perf_counter()
        with Measurer(info, MeasureOptions(n_parallel=par)) as m:
            res = m.measure(inputs)
        wall = time.perf_counter() - t0
        ok = sum(r.ok for r in res)
        lines.append("")
        lines.append(f"Measurer, {par} builders: {len(inputs)} configs ({ok} ok) in {wall:.1f} s = "
                     f"{60 * len(inputs) / wall:.0f} a minute; median duration_s {statistics.median(r.duration_s for r in res):.2f}")
    if a.tune_seconds > 0:
        from tuner.scheduler.model import tune_model
        log = out / "profile_tune.jsonl"
        t0 = time.perf_counter()
        try:
            tune_model(model, log=str(log), trials=10_000, device=info, scope="texture", progress=False,
                       options=MeasureOptions(n_parallel=a.parallel), compare_scopes=False,
                       time_budget=a.tune_seconds)
        except TypeError:  # before --time-budget: a fixed number of trials
            tune_model(model, log=str(log), trials=max(8, int(a.tune_seconds / 3)), device=info, scope="texture",
                       progress=False, options=MeasureOptions(n_parallel=a.parallel), compare_scopes=False)
        wall = time.perf_counter() - t0
        from tuner.logs import load_records
        n = len(load_records(str(log)))
        lines.append("")
        lines.append(f"tune_model, {a.parallel} builders: {n} measurements in {wall:.1f} s = {60 * n / wall:.0f} a minute")
    text = "\n".join(lines) + "\n"
    (out / f"measure_profile_{info.type.lower()}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
