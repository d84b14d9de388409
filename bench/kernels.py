"""Kernel benchmark: the templates' kernels on the layers of ResNet-18 and MobileNetV2 against PyTorch's CPU
conv2d / linear, in one run.

    python bench/kernels.py [--suite small|full] [--device D] [--repeats N] [--layers REGEX] [--out DIR]

For every layer of the suite (bench/layers.py) it times the template's fallback config and a few
hand-picked ones (tiles, work-groups, texture vs buffer scopes, layouts; those outside the template's
search space for the workload and device are left out), each checked once against the template's NumPy
reference, and PyTorch fp32 on the CPU with the same fused epilogue (bias, activation, residual add).

- ours: median of ``--repeats`` OpenCL profiling-event times (``Executable.time``, after one warm-up run);
- PyTorch: median of ``time.perf_counter`` around max(repeats, 10) single calls after 3 warm-up calls, with
  ``torch.set_num_threads`` equal to the CPUs the OpenCL device uses (PoCL: every CPU of this process unless
  POCL_MAX_PTHREAD_COUNT says fewer; a GPU: the CPUs of this process), or ``--threads``;
- PyTorch is timed on one thread too (``torch1_median_s``): on shared CPUs a multi-threaded call stalls
  whenever one of its threads is descheduled, and the summary marks such layers (noisy);
- a set of repeats whose median is over 1.5x its minimum (a stall from other work on shared CPUs) is
  measured again, up to 3 sets, and the set with the lowest median is kept;
- GFLOP/s is ``workload.flops / median / 1e9``; ratio is ours / PyTorch (above 1: ours is faster).

Writes ``<out>/kernels_<device fingerprint>.csv`` (``..._small.csv`` for the small suite), one row per
layer x config (the minima of the repeats and PyTorch's thread count ride along), and a markdown summary
beside it (``.md``) that is also printed: per layer the best of ours vs PyTorch, and the geometric mean of
the ratio. A config that fails to build, run or check is a row with ``ok`` false and the error, never a
crash; a layer whose template cannot be imported gets PyTorch's timing and a ``skipped:`` row. PyTorch is an
optional dependency: without it the script says how to install it and exits with status 2.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/layers.py

from layers import SUITES, conv_flops  # noqa: E402

TORCH_INSTALL = """\
error: PyTorch is needed for the baseline of bench/kernels.py and is not installed.
Install a CPU build into the project's virtualenv:
    .venv/bin/pip install torch==2.13.0          # this project's machines: a local CPU wheel of 2.13.0
or, elsewhere, a CPU wheel from PyTorch's own index (the default PyPI wheel pulls several GB of CUDA):
    .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu"""

CSV_FIELDS = ["model", "layer", "template", "count", "workload", "config_label", "config", "scope", "dtype",
              "median_s", "gflops", "torch_median_s", "torch_gflops", "ratio", "max_rel_err", "ok", "error",
              "note", "min_s", "torch_min_s", "torch1_median_s", "repeats", "torch_threads", "device",
              "kernel_template"]

# The module of each template, for loading one directly when the registry cannot import all of them yet.
TEMPLATE_MODULES = {"conv2d": "conv2d_nchw4c", "depthwise_conv2d": "depthwise_conv2d_nchw4c", "dense": "dense"}


# ---------------------------------------------------------------------------------------------- templates

def load_template(name: str):
    """``get_template(name)``; if the registry fails (a sibling template not written yet), the template's own
    module. Returns (template or None, why not)."""
    try:
        from tuner.templates import get_template
        return get_template(name), None
    except Exception as e:  # noqa: BLE001 -- any import/registry failure means "try the module itself"
        registry_error = e
    try:
        import importlib
        mod = importlib.import_module(f"tuner.templates.{TEMPLATE_MODULES.get(name, name)}")
        return mod.TEMPLATE, None
    except Exception as e:  # noqa: BLE001
        why = f"template {name!r} not available: {short_error(e)}"
        if not isinstance(registry_error, ImportError):
            why += f" (registry: {short_error(registry_error)})"
        return None, why


def make_workload(t, spec: dict):
    """The template's workload from a layer's workload dict; a ``groups`` field is set for depthwise."""
    kw = dict(spec)
    fields = {f.name for f in dataclasses.fields(t.workload)}
    if t.name == "depthwise_conv2d" and "groups" in fields and "groups" not in kw:
        kw["groups"] = spec["data"][1]
    return t.workload(**kw)


def scope_of(cfg) -> str:
    """``texture`` / ``buffer`` when every ``*_scope`` knob agrees, else ``in:texture/w:buffer/out:...``."""
    scopes = {f.name[:-len("_scope")]: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
              if f.name.endswith("_scope")}
    if not scopes:
        return "-"
    if len(set(scopes.values())) == 1:
        return next(iter(scopes.values()))
    short = {"input": "in", "weight": "w", "output": "out"}
    return "/".join(f"{short.get(k, k)}:{v}" for k, v in scopes.items())


def with_scope(cfg, scope: str):
    return dataclasses.replace(cfg, **{f.name: scope for f in dataclasses.fields(cfg) if f.name.endswith("_scope")})


def config_label(cfg) -> str:
    """A short label from the tile / work-group knobs present, e.g. ``oc2.ow4.wg16x4.buffer``."""
    names = {f.name for f in dataclasses.fields(cfg)}
    parts = []
    for knob, short in (("tile_oc", "oc"), ("tile_cb", "cb"), ("tile_m", "m"), ("tile_n", "n"), ("tile_oh", "oh"),
                        ("tile_ow", "ow"), ("split_c", "sc"), ("split_k", "sk"), ("unroll_k", "uk")):
        if knob in names:
            v = getattr(cfg, knob)
            if knob.startswith(("split", "unroll")) and v == 1:
                continue
            parts.append(f"{short}{v}")
    if "wg_w" in names:
        parts.append(f"wg{cfg.wg_w}x{getattr(cfg, 'wg_h', 1)}" if "wg_h" in names else f"wg{cfg.wg_w}")
    elif "wg_m" in names:
        parts.append(f"wg{cfg.wg_m}")
    parts.append(scope_of(cfg))
    shown = {"tile_oc", "tile_cb", "tile_m", "tile_n", "tile_oh", "tile_ow", "split_c", "split_k", "unroll_k", "wg_w",
             "wg_h", "wg_m"}
    for f in dataclasses.fields(cfg):  # any other knob away from the config class's default
        if f.name in shown or f.name.endswith("_scope") or f.default is dataclasses.MISSING:
            continue
        v = getattr(cfg, f.name)
        if v != f.default:
            parts.append(f"{f.name}={v}")
    return ".".join(str(p) for p in parts)


# Hand-picked configs: overrides of the fallback. A variant naming a knob the template's config does not have
# is skipped, so guesses for templates still being written do no harm; so is one that breaks the template's
# search space for this workload and device (e.g. a work-group wider than twice the work). ``scope`` sets
# every ``*_scope`` knob: "texture", "buffer" or "flip" (the other one of the fallback's, tiles unchanged).
VARIANTS = {
    "conv2d": [
        dict(scope="flip"),  # texture vs buffer with the fallback's tiles and work-group
        dict(input_scope="texture", weight_scope="buffer", output_scope="texture"),  # weights in a buffer
        dict(tile_oc=1, tile_oh=1, tile_ow=2, wg_w=8, wg_h=1),  # the config dataclass's defaults: small tile
        dict(tile_oc=2, tile_oh=1, tile_ow=4, wg_w=16, wg_h=4),
        dict(tile_oc=4, tile_oh=1, tile_ow=4, wg_w=8, wg_h=2),  # 16 output channels x 4 columns
        dict(tile_oc=2, tile_oh=2, tile_ow=2, wg_w=8, wg_h=4),  # square spatial tile
        dict(split_c=2),  # two input-channel blocks per reduction step
        dict(scope="texture", act_layout="mace_channel_major", weight_layout="mace_conv2d_filter"),  # MACE images
    ],
    "depthwise_conv2d": [
        dict(scope="flip"),
        dict(scope="texture", weight_layout="oihw4o"),  # OIHW4o instead of MACE's depthwise-filter image
        dict(tile_cb=1, tile_oh=1, tile_ow=2, wg_w=8, wg_h=1),  # the config dataclass's defaults
        dict(tile_cb=2, tile_oh=1, tile_ow=4),  # 8 channels x 4 columns
        dict(tile_cb=1, tile_oh=2, tile_ow=4),
        dict(tile_cb=1, tile_oh=1, tile_ow=8, wg_w=8, wg_h=4),
    ],
    "dense": [
        dict(scope="flip"),
        dict(weight_pack="4i"),  # weights packed along the reduction: dot products, lanes summed at the end
        dict(split_k=1),  # the whole reduction in one work-item
        dict(split_k=8, wg_m=16),
        dict(tile_m=2),  # 8 outputs per work-item
        dict(unroll_k=4),
        dict(wg_m=16), dict(wg_m=64),
    ],
}


def _space(t, wl, info):
    """The template's search space bound to this workload and device, or None if it has none (yet)."""
    try:
        return t.space(wl, info)
    except Exception:  # noqa: BLE001 -- no TOML yet, or an older Template without the bound space
        return None


def violations(t, space, wl, cfg) -> list:
    if space is None:
        return []
    try:
        values = t.config_values(wl, cfg) if hasattr(t, "config_values") else dataclasses.asdict(cfg)
        return space.violations(values)
    except Exception:  # noqa: BLE001 -- a space out of step with the config: run it, let the build judge
        return []


def configs_for(t, wl, info) -> list:
    """[(label, config or None, note)]: the fallback first, then the distinct variants inside the space."""
    try:
        fb = t.fallback(wl, info)
    except Exception as e:  # noqa: BLE001
        return [("fallback", None, f"fallback: {short_error(e)}")]
    space = _space(t, wl, info)
    bad = violations(t, space, wl, fb)
    out = [(f"fallback ({config_label(fb)})", fb, "fallback outside the search space: " + "; ".join(bad)
            if bad else "")]
    seen = {fb}
    names = {f.name for f in dataclasses.fields(fb)}
    for v in VARIANTS.get(t.name, []):
        v = dict(v)
        scope = v.pop("scope", None)
        if not set(v) <= names:
            continue
        cfg = dataclasses.replace(fb, **v)
        if scope == "flip":
            cur = scope_of(fb)
            scope = {"texture": "buffer", "buffer": "texture"}.get(cur)
            if scope is None:
                continue
        if scope:
            cfg = with_scope(cfg, scope)
        if cfg in seen or violations(t, space, wl, cfg):
            continue
        seen.add(cfg)
        out.append((config_label(cfg), cfg, ""))
    return out


def log_bests(path, fingerprint: str) -> dict:
    """``(template, canonical workload json) -> Record``: the fastest successful record of each workload on this
    device in the tuning log at ``path`` (any scopes)."""
    from tuner.logs import best_records, load_records
    best = {}
    for r in best_records(r for r in load_records(path) if r.device == fingerprint).values():  # per scopes
        if r.workload_key not in best or r.median_s < best[r.workload_key].median_s:
            best[r.workload_key] = r
    return best


def winograd_workloads(t, wl) -> list:
    """``[(template, workload)]`` of the Winograd templates that compute a conv2d workload (``WinogradWorkload.of``
    says which do); none for another template's."""
    if t.name != "conv2d":
        return []
    out = []
    for name in ("winograd2", "winograd4"):
        tw, _ = load_template(name)
        w = tw.workload.of(wl) if tw is not None else None
        if w is not None:
            out.append((tw, w))
    return out


def tuned_configs(t, wl, bests: dict) -> list:
    """``[(label, config, note, template, workload)]``: the log's fastest config of the layer's template and,
    for a 3x3 stride-1 conv2d, of each Winograd template (another kernel for the same layer)."""
    from tuner.logs.record import canonical_json
    out = []
    for tmpl, w in [(t, wl), *winograd_workloads(t, wl)]:
        r = bests.get((tmpl.name, canonical_json(w.key())))
        if r is not None:
            cfg = tmpl.config(**r.config)  # a knob the record predates takes its default
            label = f"tuned ({config_label(cfg)})" if tmpl is t else f"tuned {tmpl.name} ({config_label(cfg)})"
            out.append((label, cfg, "", tmpl, w))
    return out


def jsonable(obj):
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return json.dumps(obj, sort_keys=True, default=lambda o: list(o) if isinstance(o, tuple) else str(o))


def short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().replace("\n", " | ")
    return text if len(text) <= 300 else text[:297] + "..."


def steady(measure, attempts: int = 3, spread: float = 1.5) -> tuple:
    """(median, min) of ``measure()``'s list of seconds. On shared CPUs another process can stall a run
    (multi-threaded PyTorch most: one descheduled thread holds up the rest), so a set of repeats whose
    median is over ``spread`` times its minimum is measured again, up to ``attempts`` times in all, and the
    set with the lowest median is kept."""
    best = None
    for _ in range(attempts):
        costs = measure()
        med, low = statistics.median(costs), min(costs)
        if best is None or med < best[0]:
            best = (med, low)
        if med <= spread * low:
            break
    return best


def run_config(t, wl, cfg, device, inputs, check_t, repeats) -> dict:
    """Build, launch once and check, then time one config. Failures are returned, not raised."""
    from tuner.runtime.opencl.launch import build
    r = {"median_s": None, "min_s": None, "max_rel_err": None, "ok": False, "error": ""}
    try:
        exe = build(t.build(wl, cfg), device)
        arrays = exe.upload_inputs(**inputs)
        exe.launch(arrays)
        err = check_t.check(wl, exe.outputs_of(arrays), inputs)
        r["max_rel_err"] = err
        tol = t.tolerance(wl, cfg)
        r["ok"] = bool(err <= tol)  # NaN fails too
        if not r["ok"]:
            r["error"] = f"check failed: max relative error {err:.3g} > tolerance {tol:g}"
        r["median_s"], r["min_s"] = steady(lambda: exe.time(arrays, warmup=1, repeats=repeats))
    except Exception as e:  # noqa: BLE001 -- record build/run failures and go on
        r["ok"] = False
        r["error"] = short_error(e)
    return r


# -------------------------------------------------------------------------------------------------- torch

def torch_layer(torch, layer: dict, rng):
    """A no-argument callable running the layer in PyTorch fp32 with the same fused epilogue."""
    F = torch.nn.functional
    spec, template = layer["workload"], layer["template"]
    rand = lambda shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    act = spec.get("activation", "none")

    def epilogue(y):
        if act == "relu":
            y = F.relu(y, inplace=True)
        elif act == "relu6":
            y = F.hardtanh(y, 0.0, 6.0, inplace=True)
        return y

    if template == "dense":
        x, w = rand(spec["data"]), rand(spec["weight"])
        b = rand(spec["weight"][:1]) if spec.get("bias") else None
        return lambda: epilogue(F.linear(x, w, b))

    x, w = rand(spec["data"]), rand(spec["kernel"])
    b = rand(spec["kernel"][:1]) if spec.get("bias") else None
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    stride, dilation = pair(spec.get("stride", 1)), pair(spec.get("dilation", 1))
    p = spec.get("padding", 0)
    p = (p, p, p, p) if isinstance(p, int) else tuple(p) if len(p) == 4 else (p[0], p[1], p[0], p[1])
    groups = spec["data"][1] if template == "depthwise_conv2d" else spec.get("groups", 1)
    if p[0] == p[2] and p[1] == p[3]:
        conv = lambda: F.conv2d(x, w, b, stride, (p[0], p[1]), dilation, groups)  # noqa: E731
    else:  # asymmetric (top, left, bottom, right): pad explicitly (F.pad takes left, right, top, bottom)
        conv = lambda: F.conv2d(F.pad(x, (p[1], p[3], p[0], p[2])), w, b, stride, 0, dilation, groups)  # noqa: E731
    if spec.get("residual"):
        res = None

        def run():
            nonlocal res
            y = epilogue(conv())
            if res is None:
                res = rand(tuple(y.shape))
            return y.add_(res)
        run()
        return run
    return lambda: epilogue(conv())


def time_torch(torch, fn, repeats: int, warmup: int = 3) -> tuple:
    """(median, min) seconds of single calls."""
    def measure():
        with torch.inference_mode():
            for _ in range(warmup):
                fn()
            costs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                costs.append(time.perf_counter() - t0)
        return costs
    return steady(measure)


def bench_layer(layer, t, wl, cfgs, device, torch, args, rng_torch) -> list:
    """The CSV rows of one layer: every config of ours (built, checked, timed), then PyTorch once."""
    flops = getattr(wl, "flops", None) or conv_flops(layer)
    results = []
    if wl is not None:
        inputs = t.random_inputs(wl, np.random.default_rng(args.seed))
        ref_cache = {}

        def cached_reference(w, inp):
            if "ref" not in ref_cache:
                ref_cache["ref"] = t.reference(w, inp)
            return ref_cache["ref"]
        check_t = dataclasses.replace(t, reference=cached_reference)  # t.check, one reference per layer
    for label, cfg, note, *other in cfgs:
        if cfg is None:
            r = {"median_s": None, "min_s": None, "max_rel_err": None, "ok": False, "error": note or "no config"}
            note = ""
        elif other:  # another template for the same layer (Winograd): its own inputs and reference
            tw, ww = other
            r = run_config(tw, ww, cfg, device, tw.random_inputs(ww, np.random.default_rng(args.seed)), tw,
                           args.repeats)
        else:
            r = run_config(t, wl, cfg, device, inputs, check_t, args.repeats)
        results.append((label, cfg, r, note, other[0].name if other else layer["template"]))
    # PyTorch after ours, so that its OpenMP threads' spin-wait never overlaps our timed kernels
    tm = tmin = tm1 = None
    try:
        fn = torch_layer(torch, layer, rng_torch)
        tm, tmin = time_torch(torch, fn, max(args.repeats, 10))
        threads = torch.get_num_threads()
        if threads > 1:  # one thread as well: far faster than all of them means the CPUs were contended
            torch.set_num_threads(1)
            try:
                tm1, _ = time_torch(torch, fn, max(args.repeats, 10))
            finally:
                torch.set_num_threads(threads)
    except Exception as e:  # noqa: BLE001
        print(f"warning: PyTorch failed on {layer['model']}.{layer['name']}: {short_error(e)}", file=sys.stderr)
    t_gflops = flops / tm / 1e9 if tm else None
    rows = []
    for label, cfg, r, note, kernel_template in results:
        gflops = flops / r["median_s"] / 1e9 if r["median_s"] else None
        rows.append({
            "model": layer["model"], "layer": layer["name"], "template": layer["template"], "count": layer["count"],
            "kernel_template": kernel_template,
            "workload": jsonable(wl.key() if wl is not None and hasattr(wl, "key") else layer["workload"]),
            "config_label": label, "config": jsonable(cfg) if cfg is not None else "",
            "scope": scope_of(cfg) if cfg is not None else "", "dtype": getattr(wl, "dtype", "float32"),
            "median_s": r["median_s"], "gflops": gflops, "torch_median_s": tm, "torch_gflops": t_gflops,
            "ratio": gflops / t_gflops if gflops and t_gflops else None,
            "max_rel_err": r["max_rel_err"], "ok": r["ok"], "error": r["error"], "note": note,
            "min_s": r["min_s"], "torch_min_s": tmin, "torch1_median_s": tm1, "_flops": flops,
        })
    return rows


# -------------------------------------------------------------------------------------------------- report

def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def fmt(v, spec=".2f", none="n/a"):
    return none if v is None else format(v, spec)


def summarize(rows: list, layers: list, meta: dict) -> str:
    lines = [f"# Kernel benchmark: {meta['device']}", "",
             f"- device: `{meta['device']}`, fingerprint `{meta['fingerprint']}`",
             f"- PyTorch {meta['torch']} CPU fp32, {meta['torch_threads']} threads "
             f"(`torch.set_num_threads`), {meta['cpu']}",
             f"- suite `{meta['suite']}`{meta['filter']}, {meta['repeats']} timed repeats per config "
             f"(median; ours: OpenCL profiling events; PyTorch: perf_counter over {max(meta['repeats'], 10)} calls), "
             f"{meta['date']}, "
             f"{meta['elapsed_s']:.0f} s in all",
             f"- load average (1 min) at start {meta['load'][0]:.2f}, at end {meta['load'][1]:.2f} on "
             f"{meta['ncpu']} CPUs" + (" -- other work was running, so timings are noisy (multi-threaded PyTorch most)"
                                       if meta['load'][0] > 0.5 * meta['ncpu'] else ""),
             "- ratio = our GFLOP/s / PyTorch GFLOP/s (above 1: ours is faster); best = fastest config that "
             "passed its check" + (f"; `tuned`: the fastest config of the layer in the log `{meta['log']}` on this "
                                   "device (and of the Winograd templates for a 3x3 stride-1 conv2d), timed here "
                                   "again" if meta.get("log") else ""), "",
             "| model | layer | template | x | MFLOP | best config | ours ms | ours GFLOP/s | fallback GFLOP/s "
             "| torch ms | torch GFLOP/s | ratio best | ratio fallback | failed |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    best_ratios, fb_ratios, quiet_ratios, totals, n_noisy = [], [], [], {}, 0
    per_template = {}  # layer template -> [(best ratio, tuned ratio or None, kernel template of the best)]
    for layer in layers:
        mine = [r for r in rows if r["model"] == layer["model"] and r["layer"] == layer["name"]]
        if not mine:
            continue
        ok = [r for r in mine if r["ok"] and r["median_s"]]
        best = min(ok, key=lambda r: r["median_s"]) if ok else None
        fb = next((r for r in ok if r["config_label"].startswith("fallback")), None)
        tm = mine[0]["torch_median_s"]
        flops = mine[0]["_flops"]
        skipped = all(r["error"].startswith("skipped:") for r in mine)
        failed = sum(1 for r in mine if not r["ok"] and not r["error"].startswith("skipped:"))
        noisy = bool(best and best["min_s"] and best["median_s"] > 2 * best["min_s"])
        noisy |= bool(tm and mine[0]["torch_min_s"] and tm > 2 * mine[0]["torch_min_s"])
        noisy |= bool(tm and mine[0]["torch1_median_s"] and tm > 2 * mine[0]["torch1_median_s"])
        n_noisy += noisy
        if best and best["ratio"]:
            best_ratios.append(best["ratio"])
            if not noisy:
                quiet_ratios.append(best["ratio"])
        if fb and fb["ratio"]:
            fb_ratios.append(fb["ratio"])
        if best and best["ratio"]:
            tuned = [r for r in ok if r["config_label"].startswith("tuned (") and r["ratio"]]
            per_template.setdefault(layer["template"], []).append(
                (best["ratio"], tuned[0]["ratio"] if tuned else None, best.get("kernel_template") or layer["template"]))
        tot = totals.setdefault(layer["model"], [0.0, 0.0, 0, 0])
        tot[3] += 1
        if best and tm and not noisy:
            tot[0] += layer["count"] * best["median_s"]
            tot[1] += layer["count"] * tm
            tot[2] += 1
        label = best["config_label"] if best else "(not run: template not available)" if skipped else "(all failed)"
        lines.append(
            f"| {layer['model']} | {layer['name']} | {layer['template']} | {layer['count']} | {flops / 1e6:.1f} "
            f"| {label} | {fmt(best and best['median_s'] * 1e3, '.3f')} | {fmt(best and best['gflops'])} "
            f"| {fmt(fb and fb['gflops'])} | {fmt(tm and tm * 1e3, '.3f')} | {fmt(mine[0]['torch_gflops'])} "
            f"| {fmt(best and best['ratio'], '.3f')}{' (noisy)' if noisy else ''} "
            f"| {fmt(fb and fb['ratio'], '.3f')} "
            f"| {'-' if skipped else f'{failed}/{len(mine)}'} |")
    g_best, g_fb = geomean(best_ratios), geomean(fb_ratios)
    lines += ["", f"**geometric mean of the ratio, best config: {fmt(g_best, '.3f')}** over {len(best_ratios)} "
              f"layers; fallback config: {fmt(g_fb, '.3f')} over {len(fb_ratios)} layers"
              + (f"; best config on the {len(quiet_ratios)} layers not marked (noisy): "
                 f"{fmt(geomean(quiet_ratios), '.3f')}." if n_noisy else "."), ""]
    if per_template:
        lines += ["Per template (a layer's template; its best kernel may be a Winograd template's for a 3x3 "
                  "stride-1 conv2d):", "",
                  "| template | layers | geomean ratio, best config | geomean ratio, the log's tuned config "
                  "(layers with one) | best kernel by template |", "| --- | ---: | ---: | ---: | --- |"]
        for name, vals in sorted(per_template.items()):
            tuned = [v[1] for v in vals if v[1]]
            winners = {}
            for v in vals:
                winners[v[2]] = winners.get(v[2], 0) + 1
            lines.append(f"| {name} | {len(vals)} | {fmt(geomean([v[0] for v in vals]), '.3f')} | "
                         f"{fmt(geomean(tuned), '.3f')} ({len(tuned)}) | "
                         + ", ".join(f"{k} {n}" for k, n in sorted(winners.items())) + " |")
        lines.append("")
    if n_noisy:
        lines += [f"(noisy): on {n_noisy} layers a median is over twice the minimum of its repeats (ours or "
                  "PyTorch's), or PyTorch on all threads took over twice as long as on one thread (the CSV has "
                  "`min_s`, `torch_min_s`, `torch1_median_s`): other work shared the CPUs while they ran, "
                  "and multi-threaded PyTorch stalls whenever one of its threads is descheduled.", ""]
    for model, (ours, theirs, n, total) in totals.items():
        if n:
            lines.append(f"- {model}: the {n} of its {total} layers run here and not marked (noisy), weighted by "
                         f"count: ours (best) "
                         f"{ours * 1e3:.2f} ms, PyTorch {theirs * 1e3:.2f} ms (ratio {theirs / ours:.3f})")
    skipped = [r for r in rows if r["error"].startswith("skipped:")]
    failed = [r for r in rows if not r["ok"] and r not in skipped]
    ran = len(rows) - len(skipped)
    lines += ["", f"{ran - len(failed)} of {ran} configs run passed their check."]
    if failed:
        lines += ["", "Failed:", ""]
        lines += [f"- {r['model']} {r['layer']} `{r['config_label']}`: {r['error']}" for r in failed]
    if skipped:
        lines += ["", "Not run (PyTorch only):", ""]
        lines += [f"- {r['model']} {r['layer']}: {r['error'][len('skipped: '):]}" for r in skipped]
    notes = [r for r in rows if r.get("note")]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {r['model']} {r['layer']} `{r['config_label']}`: {r['note']}" for r in notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- main

def cpu_count() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_count_for(info) -> int:
    """CPUs the OpenCL device computes on: PoCL's pthread driver uses every CPU of the process unless
    POCL_MAX_PTHREAD_COUNT says fewer; for a GPU, the CPUs of this process."""
    n = cpu_count()
    if info.type == "CPU" and info.platform_tag == "pocl" and os.environ.get("POCL_MAX_PTHREAD_COUNT"):
        n = min(n, int(os.environ["POCL_MAX_PTHREAD_COUNT"]))
    return n


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Progress:
    """tqdm when it is installed, else one printed line per step."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="cfg", dynamic_ncols=True)
        except ImportError:
            self.bar = None
        self.total, self.n = total, 0

    def step(self, text: str):
        self.n += 1
        if self.bar is not None:
            self.bar.set_description(text.split(":")[0][:40])
            self.bar.update(1)
            self.bar.write(text)
        else:
            print(f"[{self.n}/{self.total}] {text}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", choices=sorted(SUITES), default="small",
                    help="small: 7 layers, a quick check (default); full: all 47 unique layers")
    ap.add_argument("--device", default=os.environ.get("TUNER_BENCH_DEVICE"),
                    help="OpenCL device: index or name substring as in `tuner devices` (default: the default "
                    "device, $TUNER_DEVICE)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per config and for PyTorch (median)")
    ap.add_argument("--layers", default=None, help="regex over 'model.layer' (e.g. 'resnet18.*3x3')")
    ap.add_argument("--out", default=str(HERE / "results"), help="output folder (default: bench/results)")
    ap.add_argument("--threads", type=int, default=None,
                    help="PyTorch threads (default: the CPUs the OpenCL device uses)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    ap.add_argument("--log", default=None, help="a tuning log: each layer's fastest logged config on this device "
                    "is timed too (and, for a 3x3 stride-1 conv2d, the Winograd templates' fastest)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

    try:
        import torch
    except ImportError:
        print(TORCH_INSTALL, file=sys.stderr)
        return 2

    from tuner.errors import TunerError
    from tuner.runtime.opencl import open_device
    try:
        device = open_device(args.device)
    except TunerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = device.info
    threads = args.threads or cpu_count_for(info)
    torch.set_num_threads(threads)

    layers = SUITES[args.suite]
    if args.layers:
        rx = re.compile(args.layers)
        layers = [la for la in layers if rx.search(f"{la['model']}.{la['name']}")]
        if not layers:
            print(f"error: no layer of the {args.suite} suite matches {args.layers!r}", file=sys.stderr)
            return 2

    templates = {name: load_template(name) for name in sorted({la["template"] for la in layers})}
    for name, (t, err) in templates.items():
        if t is None:
            print(f"note: {err}; its layers get PyTorch timings only", file=sys.stderr)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"kernels_{device.fingerprint}" + ("" if args.suite == "full" else f"_{args.suite}")
    csv_path, md_path = out / f"{stem}.csv", out / f"{stem}.md"
    print(f"device {info.platform} / {info.name} ({device.fingerprint}); PyTorch {torch.__version__} with "
          f"{threads} threads; {len(layers)} layers, {args.repeats} repeats -> {csv_path}", flush=True)

    try:
        bests = log_bests(args.log, device.fingerprint) if args.log else {}
    except TunerError as e:
        print(f"error: --log: {e}", file=sys.stderr)
        return 2
    plans = []
    for layer in layers:
        t, terr = templates[layer["template"]]
        wl, cfgs = None, []
        if t is not None:
            try:
                wl = make_workload(t, layer["workload"])
                cfgs = configs_for(t, wl, info) + tuned_configs(t, wl, bests)
            except Exception as e:  # noqa: BLE001
                terr = f"workload: {short_error(e)}"
        plans.append((layer, t, wl, cfgs or [("-", None, f"skipped: {terr}")]))

    progress = Progress(sum(len(c) for *_, c in plans))
    rows, t_start, load0 = [], time.perf_counter(), os.getloadavg()[0]
    rng_torch = np.random.default_rng(args.seed + 1)
    common = {"repeats": args.repeats, "torch_threads": threads, "device": device.fingerprint}
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for layer, t, wl, cfgs in plans:
            for row in bench_layer(layer, t, wl, cfgs, device, torch, args, rng_torch):
                row.update(common)
                rows.append(row)
                writer.writerow(row)
                fh.flush()
                status = (f"{fmt(row['median_s'] and row['median_s'] * 1e3, '.3f')} ms {fmt(row['gflops'])} "
                          f"GFLOP/s, torch {fmt(row['torch_gflops'])} GFLOP/s, ratio {fmt(row['ratio'], '.3f')}")
                if not row["ok"]:
                    status += f"  {'SKIPPED' if row['error'].startswith('skipped:') else 'FAILED'}: {row['error']}"
                progress.step(f"{layer['model']}.{layer['name']} {row['config_label']}: {status}")
    progress.close()

    meta = {"device": f"{info.platform} / {info.name}", "fingerprint": device.fingerprint,
            "torch": torch.__version__, "torch_threads": threads, "cpu": cpu_name(), "suite": args.suite,
            "filter": f" filtered by `{args.layers}`" if args.layers else "", "repeats": args.repeats,
            "log": args.log,
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "elapsed_s": time.perf_counter() - t_start, "load": (load0, os.getloadavg()[0]),
            "ncpu": os.cpu_count()}
    md = summarize(rows, layers, meta)
    md_path.write_text(md)
    print("\n" + md)
    print(f"wrote {csv_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
