"""Tuning-efficiency benchmark: how many measured trials each sampler (xgb, tpe, random) needs to find a
config within 95% of the best one ever seen for a workload.

    python bench/tuning.py [--trials N] [--seeds K] [--workloads REGEX] [--out bench/results] [--device D]
                           [--samplers xgb,tpe,random] [--scope buffer|texture]
    python bench/tuning.py --summarize bench/results/tuning_<fingerprint>.csv   # redo the tables from a CSV

For every workload, seed and sampler -- run one after another, never in parallel, since timings on a CPU
device are distorted by concurrent work -- it calls ``tuner.search.tune`` with ``trials=N``, a fresh
JSONL log and a fresh SQLite study (so no run sees another's measurements), ``transfer=False`` and the same
``MeasureOptions(repeats=3, min_seconds=0.005, n_parallel=2)`` for every sampler. Runs are interleaved per
(workload, seed) -- xgb, tpe, random, then the next seed -- so a slow period of the shared machine hits
all samplers alike.

From each run's records (measurement order; a failed measurement counts as a trial with no GFLOP/s) it
takes the best-so-far GFLOP/s curve. ``best_ever`` of a workload is the highest GFLOP/s measured by any run of
any sampler on it. ``trials_to_95pct`` of a run is the first trial whose best-so-far reaches
0.95 * best_ever; a run that never gets there is censored and scored N+1 (shown as ``>N``). The summary
gives, per workload and sampler, the median over seeds, and the geometric means over workloads of the
ratios xgb/random and xgb/tpe (per-workload medians; censored medians enter as N+1, which makes a ratio
whose denominator is censored an upper bound and one whose numerator is censored a lower bound).

Writes ``<out>/tuning_<device fingerprint>.csv`` (one row per run, rewritten after every run so a killed
benchmark keeps what it measured) and ``<out>/tuning_<device fingerprint>.md`` (also printed).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SAMPLERS = ("xgb", "tpe", "random")
THRESHOLD = 0.95

# (name, template, workload arguments): small layers, about 1 s per measured trial on PoCL
WORKLOADS = [
    ("conv3x3.16-32@28", "conv2d", dict(data=(1, 16, 28, 28), kernel=(32, 16, 3, 3), padding=1)),
    ("conv1x1.32-32@14", "conv2d", dict(data=(1, 32, 14, 14), kernel=(32, 32, 1, 1))),
    ("conv3x3s2.16-32@28", "conv2d", dict(data=(1, 16, 28, 28), kernel=(32, 16, 3, 3), stride=2, padding=1)),
    ("dw3x3.32@28", "depthwise_conv2d", dict(data=(1, 32, 28, 28), kernel=(32, 1, 3, 3), padding=1)),
]

CSV_FIELDS = ["workload", "template", "workload_args", "scope", "sampler", "seed", "trials", "trials_to_95pct",
              "reached", "best_gflops_run", "best_ever", "failed", "wall_s", "s_per_trial", "best_config", "curve",
              "gflops", "device"]


def options():
    from tuner.measure import MeasureOptions
    return MeasureOptions(repeats=3, min_seconds=0.005, n_parallel=2)


def best_so_far(gflops: list) -> list:
    out, best = [], 0.0
    for g in gflops:
        best = max(best, g or 0.0)
        out.append(round(best, 4))
    return out


def trials_to(curve: list, target: float, n: int) -> int:
    """1-based index of the first trial whose best-so-far reaches ``target``; ``n + 1`` if none (censored)."""
    for i, v in enumerate(curve, start=1):
        if v >= target:
            return i
    return n + 1


def run_one(template: str, wl, sampler: str, seed: int, trials: int, scope: str, device) -> dict:
    from tuner.search import tune
    scopes = {k: scope for k in ("input", "weight", "output")}
    with tempfile.TemporaryDirectory(prefix="tuning-bench-") as d:
        start = time.perf_counter()
        res = tune(template, wl, device=device, trials=trials, sampler=sampler, seed=seed,
                   log=os.path.join(d, "log.jsonl"), storage=f"sqlite:///{os.path.join(d, 'study.db')}",
                   transfer=False, progress=False, scopes=scopes, options=options())
        wall = time.perf_counter() - start
    gflops = [r.gflops if r.ok and r.gflops else None for r in res.records]
    best = max((r for r in res.records if r.ok and r.gflops), key=lambda r: r.gflops, default=None)
    cfg = {k: v for k, v in best.config.items() if not k.endswith("_scope")} if best else None
    return {"gflops": gflops, "best_config": cfg, "curve": best_so_far(gflops), "wall_s": wall, "trials": len(res.records),
            "failed": sum(g is None for g in gflops)}


def finish_rows(rows: list, n: int) -> None:
    """Fill best_ever / trials_to_95pct / reached once all runs of a workload are in."""
    best = {}
    for r in rows:
        best[r["workload"]] = max(best.get(r["workload"], 0.0), float(r["best_gflops_run"] or 0.0))
    for r in rows:
        be = best[r["workload"]]
        curve = r["curve"] if isinstance(r["curve"], list) else json.loads(r["curve"])
        r["best_ever"] = round(be, 4)
        k = trials_to(curve, THRESHOLD * be, n) if be > 0 else n + 1
        r["trials_to_95pct"] = k
        r["reached"] = k <= n


def write_csv(path: Path, rows: list) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            out = dict(r)
            for k in ("curve", "gflops", "workload_args", "best_config"):
                if not isinstance(out[k], str):
                    out[k] = json.dumps(out[k])
            w.writerow(out)
    os.replace(tmp, path)


def read_csv(path: Path) -> list:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["curve"] = json.loads(r["curve"])
        r["gflops"] = json.loads(r["gflops"])
        for k in ("seed", "trials", "failed"):
            r[k] = int(r[k])
        for k in ("best_gflops_run", "wall_s", "s_per_trial"):
            r[k] = float(r[k])
    return rows


def geomean(values) -> float:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def fmt_trials(v: float, n: int) -> str:
    return f">{n}" if v > n else (f"{v:.0f}" if v == int(v) else f"{v:.1f}")


def summarize(rows: list, n: int, meta: dict) -> str:
    samplers = [s for s in SAMPLERS if any(r["sampler"] == s for r in rows)]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    med, cens = {}, {}
    for w in workloads:
        for s in samplers:
            ks = [int(r["trials_to_95pct"]) for r in rows if r["workload"] == w and r["sampler"] == s]
            if ks:
                med[w, s] = statistics.median(ks)
                cens[w, s] = (sum(k > n for k in ks), len(ks))
    lines = [f"# Tuning efficiency: {meta['device_name']}", ""]
    lines += [f"- device: `{meta['device_name']}`, fingerprint `{meta['fingerprint']}`",
              f"- {meta['date']}; N = {n} measured trials per run, seeds {', '.join(map(str, seeds))} "
              f"({len(seeds)} per workload and sampler), {len(rows)} runs in all, run one after another",
              f"- scopes: {meta['scope']} for input, weight and output; `tune(..., transfer=False, progress=False)`, "
              f"a fresh log and SQLite study per run; MeasureOptions(repeats=3, min_seconds=0.005, n_parallel=2) "
              f"for every sampler",
              f"- metric: trials until the run's best-so-far GFLOP/s reaches {THRESHOLD:.0%} of the workload's best "
              f"ever (the max over all {len(rows) // max(len(workloads), 1)} runs of all samplers); a run that "
              f"never reaches it is censored at N+1 and shown as `>{n}`; cells are the median over seeds, "
              f"(c/k) = c of k runs censored"]
    if meta.get("wall_s"):
        trials = sum(r["trials"] for r in rows)
        lines.append(f"- wall time {meta['wall_s'] / 60:.1f} min for {trials} measured trials: "
                     f"{meta['wall_s'] / trials:.2f} s per trial in all (tune() calls only: "
                     f"{sum(r['wall_s'] for r in rows) / trials:.2f} s)")
    lines += ["", "| workload | best ever GFLOP/s | " + " | ".join(samplers) + " | xgb/random | xgb/tpe |",
              "| --- | ---: | " + " | ".join("---:" for _ in samplers) + " | ---: | ---: |"]
    ratios = {"random": [], "tpe": []}
    for w in workloads:
        be = max(float(r["best_ever"]) for r in rows if r["workload"] == w)
        cells = []
        for s in samplers:
            if (w, s) not in med:
                cells.append("")
                continue
            c, k = cens[w, s]
            cells.append(fmt_trials(med[w, s], n) + (f" ({c}/{k})" if c else ""))
        rs = []
        for other in ("random", "tpe"):
            if (w, "xgb") in med and (w, other) in med:
                ratio = med[w, "xgb"] / med[w, other]
                ratios[other].append(ratio)
                bound = "<=" if med[w, other] > n and med[w, "xgb"] <= n else \
                    ">=" if med[w, "xgb"] > n and med[w, other] <= n else "~" if med[w, other] > n else ""
                rs.append(f"{bound}{ratio:.2f}")
            else:
                rs.append("")
        lines.append(f"| {w} | {be:.2f} | " + " | ".join(cells) + " | " + " | ".join(rs) + " |")
    gm = {s: geomean([med[w, s] for w in workloads if (w, s) in med]) for s in samplers}
    lines += ["", f"**geometric mean over {len(workloads)} workloads of the median trials to {THRESHOLD:.0%}: "
              + ", ".join(f"{s} {gm[s]:.1f}" for s in samplers)
              + f"; ratio xgb/random {geomean(ratios['random']):.2f}, xgb/tpe {geomean(ratios['tpe']):.2f}** "
              f"(geometric means of the per-workload ratios; censored medians count as N+1 = {n + 1}). "
              f"Goal: xgb/random <= 0.33 and xgb/tpe < 1."]
    reached = {s: (sum(int(r["trials_to_95pct"]) <= n for r in rows if r["sampler"] == s),
                   sum(r["sampler"] == s for r in rows)) for s in samplers}
    lines += ["", f"Runs that reached {THRESHOLD:.0%} of best ever within N = {n} trials: "
              + ", ".join(f"{s} {a}/{b}" for s, (a, b) in reached.items()) + "."]
    # the same metric at lower thresholds (less censored; secondary)
    lines += ["", "Secondary: the same metric at lower thresholds (geometric mean over workloads of the median "
              "trials over seeds; censored = N+1):", "",
              "| threshold | " + " | ".join(samplers) + " | xgb/random | xgb/tpe | censored runs "
              + "/".join(samplers) + " |", "| ---: | " + " | ".join("---:" for _ in samplers) + " | ---: | ---: | ---: |"]
    for th in (0.7, 0.8, 0.9, THRESHOLD):
        meds, cen = {}, {}
        for s in samplers:
            ms = []
            for w in workloads:
                rs = [r for r in rows if r["workload"] == w and r["sampler"] == s]
                ks = [trials_to(r["curve"], th * float(r["best_ever"]), n) for r in rs]
                cen[s] = cen.get(s, 0) + sum(k > n for k in ks)
                if ks:
                    ms.append(statistics.median(ks))
            meds[s] = geomean(ms)
        ratio = [f"{meds['xgb'] / meds[o]:.2f}" if "xgb" in meds and o in meds else "" for o in ("random", "tpe")]
        lines.append(f"| {th:.0%} | " + " | ".join(f"{meds[s]:.1f}" for s in samplers) + " | "
                     + " | ".join(ratio) + " | " + "/".join(str(cen[s]) for s in samplers) + " |")
    # how good each sampler's result is after N trials, and after N/2 (same runs)
    lines += ["", f"Best found as a fraction of best ever, mean over seeds, after N/2 = {n // 2} and N = {n} trials:",
              "", "| workload | " + " | ".join(f"{s} @{n // 2} | {s} @{n}" for s in samplers) + " |",
              "| --- | " + " | ".join("---: | ---:" for _ in samplers) + " |"]
    for w in workloads:
        cells = []
        for s in samplers:
            rs = [r for r in rows if r["workload"] == w and r["sampler"] == s]
            for at in (n // 2, n):
                fr = [r["curve"][min(at, len(r["curve"])) - 1] / float(r["best_ever"]) for r in rs if r["curve"]]
                cells.append(f"{statistics.mean(fr):.2f}" if fr else "")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    failed = sum(r["failed"] for r in rows)
    lines += ["", f"{failed} of {sum(r['trials'] for r in rows)} measured trials failed (build, run or check)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=32, help="measured trials per run (N)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per workload and sampler: 0 .. K-1")
    p.add_argument("--workloads", default=".", help="regex over workload names: " +
                   ", ".join(w[0] for w in WORKLOADS))
    p.add_argument("--samplers", default=",".join(SAMPLERS))
    p.add_argument("--scope", default="buffer", choices=("buffer", "texture"), help="scope of every operand")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--device", default="pocl")
    p.add_argument("--summarize", metavar="CSV", help="only rebuild the markdown from an existing CSV")
    a = p.parse_args(argv)

    from tuner.runtime.device import choose_device
    from tuner.templates import get_template
    if a.summarize:
        rows = read_csv(Path(a.summarize))
        n = max(r["trials"] for r in rows)
        finish_rows(rows, n)
        src = Path(a.summarize)
        date = datetime.datetime.fromtimestamp(src.stat().st_mtime).strftime("%Y-%m-%d %H:%M") + " (end of the run: the CSV's mtime)"
        meta = {"device_name": rows[0]["device"], "fingerprint": src.stem.split("_", 1)[-1], "date": date,
                "scope": rows[0]["scope"], "wall_s": sum(r["wall_s"] for r in rows)}
        md = summarize(rows, n, meta)
        src.with_suffix(".md").write_text(md)
        print(md)
        print(f"wrote {src.with_suffix('.md')} (wall time = the sum of the runs' tune() calls)")
        return 0

    info = choose_device(a.device)
    samplers = [s.strip() for s in a.samplers.split(",") if s.strip()]
    workloads = [w for w in WORKLOADS if re.search(a.workloads, w[0])]
    if not workloads or not samplers:
        print("error: no workload or sampler selected", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"tuning_{info.fingerprint}.csv", out / f"tuning_{info.fingerprint}.md"
    total = len(workloads) * a.seeds * len(samplers)
    print(f"device {info.name} ({info.fingerprint}); {len(workloads)} workloads x {a.seeds} seeds x "
          f"{len(samplers)} samplers = {total} runs of {a.trials} trials; scope {a.scope}", flush=True)
    rows, start, done = [], time.perf_counter(), 0
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    for name, tname, kw in workloads:
        t = get_template(tname)
        wl = t.workload(**kw)
        for seed in range(a.seeds):
            for s in samplers:
                r = run_one(tname, wl, s, seed, a.trials, a.scope, info)
                done += 1
                curve = r["curve"]
                best = curve[-1] if curve else 0.0
                first_best = next((i for i, v in enumerate(curve, 1) if v >= best), 0) if best else 0
                rows.append({"workload": name, "template": tname, "workload_args": kw, "scope": a.scope,
                             "sampler": s, "seed": seed, "trials": r["trials"], "trials_to_95pct": "",
                             "reached": "", "best_gflops_run": round(best, 4), "best_ever": "",
                             "failed": r["failed"], "wall_s": round(r["wall_s"], 2),
                             "s_per_trial": round(r["wall_s"] / max(r["trials"], 1), 3),
                             "best_config": r["best_config"], "curve": curve,
                             "gflops": [round(g, 4) if g else None for g in r["gflops"]], "device": info.name})
                write_csv(csv_path, rows)
                el = time.perf_counter() - start
                print(f"[{done:3d}/{total}] {name:20s} {s:6s} seed {seed}: {r['trials']} trials "
                      f"({r['failed']} failed), best {best:6.2f} GFLOP/s at trial {first_best:2d}, "
                      f"{r['wall_s']:5.1f} s ({r['wall_s'] / max(r['trials'], 1):.2f} s/trial); "
                      f"elapsed {el / 60:5.1f} min", flush=True)
    wall = time.perf_counter() - start
    finish_rows(rows, a.trials)
    write_csv(csv_path, rows)
    md = summarize(rows, a.trials, {"device_name": info.name, "fingerprint": info.fingerprint, "date": date,
                                    "scope": a.scope, "wall_s": wall})
    md_path.write_text(md)
    print()
    print(md)
    print(f"wrote {csv_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
