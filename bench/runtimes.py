"""CPU OpenCL runtimes against each other on bench/kernels.py's layers, in one run.

    python bench/runtimes.py [--devices pocl,intel] [--suite small|full] [--repeats N] [--out DIR]

Runs ``bench/kernels.py`` once per device (each a fresh process, so one runtime's threads never compete with
the other's), alternating the order over ``--rounds`` rounds, then joins the CSVs per layer: the best ``ok``
config of ours on each device (median of the repeats, the lowest median over rounds), PyTorch's time from the
same processes, and the ratio of the devices' times (above 1: the second device is faster). Writes
``<out>/runtimes_<suite>.csv`` and ``.md`` (also printed). Devices that cannot build (``tuner devices``
says why) are reported and left out.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def best_per_layer(csv_path: Path) -> dict[tuple[str, str], dict]:
    best: dict[tuple[str, str], dict] = {}
    with open(csv_path) as fh:
        for r in csv.DictReader(fh):
            if r["ok"] != "True" or not r["median_s"]:
                continue
            key = (r["model"], r["layer"])
            if key not in best or float(r["median_s"]) < float(best[key]["median_s"]):
                best[key] = r
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="pocl,intel", help="two device specs, comma-separated")
    ap.add_argument("--suite", default="small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="runs per device, order alternating (default 2)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    specs = [s.strip() for s in args.devices.split(",") if s.strip()]
    if len(specs) != 2:
        ap.error("--devices takes exactly two device specs, e.g. pocl,intel")

    from tuner.errors import TunerError
    from tuner.runtime.opencl.device import choose_device
    infos = []
    for spec in specs:
        try:
            infos.append(choose_device(spec))
        except TunerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    out = Path(args.out)
    tmp = out / "runtimes_runs"
    per_device: list[dict] = [{}, {}]
    for rnd in range(args.rounds):
        order = [0, 1] if rnd % 2 == 0 else [1, 0]
        for i in order:
            run_dir = tmp / f"round{rnd}"
            cmd = [sys.executable, str(HERE / "kernels.py"), "--suite", args.suite, "--device", infos[i].fingerprint,
                   "--repeats", str(args.repeats), "--out", str(run_dir)]
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            stem = f"kernels_{infos[i].fingerprint}" + ("" if args.suite == "full" else f"_{args.suite}")
            for key, row in best_per_layer(run_dir / f"{stem}.csv").items():
                if key not in per_device[i] or float(row["median_s"]) < float(per_device[i][key]["median_s"]):
                    per_device[i][key] = row

    a, b = infos
    rows = []
    for key in sorted(set(per_device[0]) & set(per_device[1])):
        ra, rb = per_device[0][key], per_device[1][key]
        rows.append({"model": key[0], "layer": key[1], "workload": ra["workload"],
                     f"{a.platform_tag}_ms": float(ra["median_s"]) * 1e3, f"{a.platform_tag}_config": ra["config_label"],
                     f"{b.platform_tag}_ms": float(rb["median_s"]) * 1e3, f"{b.platform_tag}_config": rb["config_label"],
                     "torch_ms": statistics.median([float(ra["torch_median_s"]), float(rb["torch_median_s"])]) * 1e3,
                     "ratio": float(ra["median_s"]) / float(rb["median_s"])})
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / f"runtimes_{args.suite}.csv", out / f"runtimes_{args.suite}.md"
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["model"])
        w.writeheader()
        w.writerows(rows)
    geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows)) if rows else float("nan")
    lines = [f"{a.platform} / {a.name} ({a.fingerprint}) against {b.platform} / {b.name} ({b.fingerprint}); "
             f"best config of bench/kernels.py's set per layer, median of {args.repeats} repeats, lowest over "
             f"{args.rounds} rounds, {os.cpu_count()} CPUs", "",
             f"| layer | {a.platform_tag} ms | {b.platform_tag} ms | {a.platform_tag} / {b.platform_tag} | PyTorch ms |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']}.{r['layer']} | {r[f'{a.platform_tag}_ms']:.3f} | {r[f'{b.platform_tag}_ms']:.3f} | "
              f"{r['ratio']:.2f} | {r['torch_ms']:.3f} |" for r in rows]
    lines += ["", f"geometric mean {a.platform_tag} / {b.platform_tag} time: {geo:.2f} "
              f"(above 1: {b.platform_tag} is faster), {len(rows)} layers"]
    md_path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
