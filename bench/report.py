"""`tuner report` end to end: CPU and wall time of the command on the shipped log and on generated logs.

    python bench/report.py [--records 10000] [--repeats 3] [--tree DIR] [--out bench/results] [--keep LOG]

Each run is a fresh ``python -c 'from tuner.cli import main; main(["report", LOG, "-o", OUT])'`` (imports,
loading, figures, writing: what a user waits for), its CPU time read from the child's rusage (user + system,
every thread). Logs: the shipped ``logs/nvidia-gpu-d4a6eca0.jsonl`` (3,336 records, 158 tasks, one of 600
measurements) and ``--records`` generated ones (``bench/load_logs.py``'s generator: ResNet-18 and MobileNetV2
layers, texture and buffer tasks, 10% failures; needs an OpenCL device to sample configs for). ``--tree DIR``
also runs another checkout's tuner (e.g. ``git archive COMMIT | tar -x -C DIR``: the report before a change),
alternating with this one so that a busy period of the host hits both. Writes ``<out>/report.md`` and
``report.csv``.
"""
from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHIPPED = ROOT / "logs" / "nvidia-gpu-d4a6eca0.jsonl"

RUN = ("import sys; sys.path.insert(0, sys.argv[1]); import warnings; warnings.simplefilter('ignore'); "
       "from tuner.cli import main; sys.exit(main(['report', sys.argv[2], '-o', sys.argv[3]]))")


def run_report(tree: Path, log: Path, out: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `tuner report LOG -o OUT` by the tuner in ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUN, str(tree), str(log), str(out)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"tuner report {log} failed ({tree}):\n{r.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, nargs="*", default=[10_000], help="generated logs of these sizes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tree", metavar="DIR", help="another checkout to time as well (e.g. the code before)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--keep", metavar="DIR", help="keep (or reuse) the generated logs in this folder")
    args = ap.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-report-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = {f"shipped ({SHIPPED.name})": SHIPPED} if SHIPPED.exists() else {}
    for n in args.records:
        path = work / f"generated-{n}.jsonl"
        if not path.exists():
            sys.path.insert(0, str(HERE))
            import load_logs
            load_logs.generate(path, n)
        logs[f"generated, {n:,} records"] = path
    trees = {"this tree": ROOT, **({"--tree": Path(args.tree).resolve()} if args.tree else {})}
    rows = []
    load_start = os.getloadavg()[0]
    for rep in range(args.repeats):
        for name, log in logs.items():
            for label, tree in trees.items():
                cpu, wall = run_report(tree, log, work / "report.html")
                size = (work / "report.html").stat().st_size
                rows.append({"log": name, "tree": label, "repeat": rep, "cpu_s": round(cpu, 2),
                             "wall_s": round(wall, 2), "html_bytes": size})
                print(f"  {name:<44} {label:<10} run {rep}: {cpu:6.2f} s CPU, {wall:6.2f} s wall, "
                      f"{size / 1e6:.2f} MB", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = [f"# `tuner report` benchmark ({datetime.now(timezone.utc):%Y-%m-%d})", "",
          f"`tuner report LOG -o report.html` end to end in a fresh process (imports, loading, figures, writing); "
          f"median of {args.repeats} runs; CPU = user + system of the process. {os.cpu_count()} CPUs "
          f"({_cpu_name()}), load average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end "
          f"(a shared host: wall times stretch with the load, CPU times much less).", "",
          "| log | tuner | median CPU s | median wall s | report MB |", "| --- | --- | ---: | ---: | ---: |"]
    for name in logs:
        for label in trees:
            mine = [r for r in rows if r["log"] == name and r["tree"] == label]
            md.append(f"| {name} | {label if label != '--tree' else args.tree} | "
                      f"{statistics.median(r['cpu_s'] for r in mine):.2f} | "
                      f"{statistics.median(r['wall_s'] for r in mine):.2f} | "
                      f"{statistics.median(r['html_bytes'] for r in mine) / 1e6:.2f} |")
    text = "\n".join(md) + "\n"
    (out / "report.md").write_text(text)
    print("\n" + text)
    return 0


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
