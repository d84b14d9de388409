"""Latency against tuning time (issue 53): each model tuned from an empty log with ``tuner tune --time-budget``,
then compiled from the log as it stood after 1, 2, 5, 10 and 20 minutes (the records' timestamps cut it: every
prefix of a log compiles) and timed, beside the fallback plan (an empty log) and, where given, the committed
long-tuned log.

    python bench/budget.py tune  --models resnet18,segmentation,sr_720p --budget 600 --device nvidia --out DIR
    python bench/budget.py curve --models resnet18 --points 1,2,5,10 --device nvidia --out DIR \\
        [--committed logs/nvidia-gpu-fcae3850.jsonl] [--runs 100 --rounds 3]
    python bench/budget.py table --out DIR        # budget_<device>.md and budget_<device>.png from the CSV

Models: a zoo name (``tuner zoo``), ``segmentation`` at 512x512, ``sr_720p`` (the pixel-shuffle super-resolution
net with a 1280x720 output: 640x360 in, x2), ``tv_NAME`` for a torchvision model exported beside (``--models-dir``:
``NAME.onnx`` files written elsewhere, e.g. by bench/runtimes_gpu.py export). Latency is the median over
``--rounds`` rounds of the median of ``--runs`` runs (``LoadedModule.time``), the plans interleaved round by round.
The tuning time of a prefix is the time since the tune started (``tune.json``: its start; across several
``tune`` calls on one log, the gaps between calls are taken out)."""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from datetime import datetime
from pathlib import Path

SPECIAL = {"segmentation": ("segmentation", {"input_size": 512}),
           "sr_720p": ("sr_pixel_shuffle", {"input_size": (360, 640), "scale": 2})}


def model_file(name: str, folder: Path, models_dir: Path | None) -> Path:
    path = folder / f"{name}.onnx"
    if path.exists():
        return path
    if models_dir is not None and (models_dir / f"{name}.onnx").exists():
        return models_dir / f"{name}.onnx"
    from tuner.zoo.models import ZOO
    zoo_name, kwargs = SPECIAL.get(name, (name, {}))
    if zoo_name not in ZOO:
        raise SystemExit(f"no model {name!r}: a zoo name, {', '.join(SPECIAL)}, or NAME.onnx in --models-dir")
    model = ZOO[zoo_name](**kwargs)
    path.write_bytes(model.SerializeToString())
    return path


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def cmd_tune(a) -> None:
    from tuner.scheduler.model import tune_model
    from tuner.measure import MeasureOptions
    out = Path(a.out)
    for name in a.models.split(","):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        path = model_file(name, folder, Path(a.models_dir) if a.models_dir else None)
        meta_path = folder / "tune.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"runs": []}
        start = time.time()
        meta["runs"].append({"start": start, "budget_s": a.budget})
        meta_path.write_text(json.dumps(meta, indent=1))
        res = tune_model(str(path), log=str(folder / "log.jsonl"), trials=None, time_budget=a.budget,
                         device=a.device, progress=False,  # the studies in memory, as `tuner tune` keeps them
                         options=MeasureOptions(n_parallel=a.parallel), say=print)
        meta["runs"][-1].update(end=time.time(), measured=res.measured, tasks=len(res.tasks),
                                unmeasured=len(res.unmeasured), estimate=res.estimate.text() if res.estimate else "",
                                phases={k: round(v, 1) for k, v in res.phases.items()})
        meta_path.write_text(json.dumps(meta, indent=1))
        print(f"{name}: {res.measured} measured in {res.elapsed_s:.0f} s ({60 * res.measured / res.elapsed_s:.0f} a "
              f"minute), {len(res.tasks)} tasks ({len(res.unmeasured)} not measured); {res.estimate.text()}",
              flush=True)


def prefix_at(log: Path, runs: list, minutes: float) -> list:
    """The log's lines whose record was measured within ``minutes`` of tuning time (gaps between runs out)."""
    lines, out = log.read_text().splitlines(), []
    for line in lines:
        try:
            t = _stamp(json.loads(line)["timestamp"])
        except (ValueError, KeyError):
            continue
        tuned = 0.0
        for r in runs:
            if t < r["start"]:
                break
            tuned += min(t, r.get("end", t)) - r["start"]
        if tuned <= minutes * 60:
            out.append(line)
    return out


def cmd_curve(a) -> None:
    from tuner.compile.compiler import compile_model
    from tuner.runtime.module import load_module
    from tuner.runtime.opencl.device import open_device
    out = Path(a.out)
    dev = open_device(a.device)
    rows = []
    for name in a.models.split(","):
        folder = out / name
        path = model_file(name, folder, Path(a.models_dir) if a.models_dir else None)
        meta = json.loads((folder / "tune.json").read_text())
        tuned_min = sum(r.get("end", r["start"]) - r["start"] for r in meta["runs"]) / 60
        plans = {"fallback": None}
        for p in (float(x) for x in a.points.split(",")):
            if p > tuned_min + 0.05:
                continue
            lines = prefix_at(folder / "log.jsonl", meta["runs"], p)
            prefix = folder / f"log_{p:g}min.jsonl"
            prefix.write_text("\n".join(lines) + ("\n" if lines else ""))
            plans[f"{p:g} min"] = str(prefix)
        if a.committed:
            plans["committed"] = a.committed
        mods = {}
        for label, log in plans.items():
            t0 = time.perf_counter()
            mod = compile_model(str(path), log=log, device=dev, scope="auto")
            mod.save(folder / f"artifact_{label.replace(' ', '')}")
            mods[label] = load_module(folder / f"artifact_{label.replace(' ', '')}", device=dev)
            print(f"{name} {label}: compiled in {time.perf_counter() - t0:.0f} s", flush=True)
        times = {k: [] for k in mods}
        for _ in range(a.rounds):
            for label, mod in mods.items():
                times[label].append(statistics.median(mod.time(a.runs)))
        fb = statistics.median(times["fallback"])
        for label, ts in times.items():
            med = statistics.median(ts)
            rows.append({"model": name, "plan": label, "latency_ms": round(med * 1e3, 4),
                         "speedup_vs_fallback": round(fb / med, 3), "rounds": a.rounds, "runs": a.runs,
                         "device": dev.info.name, "measured": sum(r.get("measured", 0) for r in meta["runs"])})
            print(rows[-1], flush=True)
    csv_path = out / f"budget_{dev.info.type.lower()}.csv"
    new = not csv_path.exists()
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    cmd_table(a)


def cmd_table(a) -> None:
    out = Path(a.out)
    for csv_path in sorted(out.glob("budget_*.csv")):
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        models = list(dict.fromkeys(r["model"] for r in rows))
        plans = sorted(dict.fromkeys(r["plan"] for r in rows), key=lambda p: (p != "fallback", p == "committed",
                                                                           float(p.split()[0]) if p.endswith(" min") else 0))
        lines = [f"# Latency against tuning time from an empty log: {rows[0]['device']}", "",
                 "Median of rounds of the median of runs, ms (x = speed-up over the fallback plan, in the same run).",
                 "", "| model | " + " | ".join(plans) + " |", "| --- |" + " ---: |" * len(plans)]
        for m in models:
            cells = []
            for p in plans:
                r = next((r for r in rows if r["model"] == m and r["plan"] == p), None)
                cells.append(f"{float(r['latency_ms']):.3f} ({float(r['speedup_vs_fallback']):.2f}x)" if r else "")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        md = csv_path.with_suffix(".md")
        md.write_text("\n".join(lines) + "\n")
        print(md.read_text())
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in models:
            pts = [(float(r["plan"].split()[0]), float(r["speedup_vs_fallback"])) for r in rows
                   if r["model"] == m and r["plan"].endswith(" min")]
            if pts:
                ax.plot(*zip(*sorted(pts)), marker="o", label=m)
            com = next((r for r in rows if r["model"] == m and r["plan"] == "committed"), None)
            if com:
                ax.axhline(float(com["speedup_vs_fallback"]), ls=":", color=ax.lines[-1].get_color())
        ax.set_xlabel("tuning time from an empty log (min)")
        ax.set_ylabel("speed-up over the fallback plan")
        ax.set_title(f"tuner tune --time-budget on {rows[0]['device']} (dotted: committed logs)", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(csv_path.with_suffix(".png"), dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn in (("tune", cmd_tune), ("curve", cmd_curve), ("table", cmd_table)):
        q = sub.add_parser(name)
        q.set_defaults(func=fn)
        q.add_argument("--out", required=True)
        if name != "table":
            q.add_argument("--models", default="resnet18")
            q.add_argument("--models-dir")
            q.add_argument("--device")
        if name == "tune":
            q.add_argument("--budget", type=float, default=600.0, help="seconds")
            q.add_argument("--parallel", type=int, default=12)
        if name == "curve":
            q.add_argument("--points", default="1,2,5,10,20")
            q.add_argument("--committed")
            q.add_argument("--runs", type=int, default=100)
            q.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
