"""CLI start-up: wall and CPU time of `tuner --help`, `--version`, `devices` and `logs LOG`, each in a fresh process.

    python bench/startup.py [--repeats 7] [--tree DIR] [--out bench/results]

Each run is ``python -c 'from tuner.cli import main; main(ARGV)'`` with the tuner of this checkout (or of ``--tree
DIR``, e.g. ``git archive COMMIT | tar -x -C DIR``: the start-up before a change), the two alternating so that a
busy period of the host hits both; what a user waits for before the command does anything (the interpreter, the
imports, the parser) and, for devices and logs, the command itself. tests/test_startup.py bounds what each
imports; this measures the time. Writes ``<out>/startup.md`` and ``startup.csv``.
"""
from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOG = ROOT / "logs" / "nvidia-gpu-d4a6eca0.jsonl"
COMMANDS = {"--help": ["--help"], "--version": ["--version"], "devices": ["devices"], "logs LOG": ["logs", str(LOG)]}
RUN = ("import sys, json; sys.path.insert(0, sys.argv[1]); import warnings; warnings.simplefilter('ignore'); "
       "from tuner.cli import main; sys.exit(main(json.loads(sys.argv[2])))")


def run(tree: Path, argv: list) -> tuple[float, float]:
    import json
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUN, str(tree), json.dumps(argv)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"tuner {' '.join(argv)} failed ({tree}):\n{r.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tree", metavar="DIR", help="another checkout to time as well (e.g. the code before)")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    trees = {"this tree": ROOT, **({args.tree: Path(args.tree).resolve()} if args.tree else {})}
    rows = []
    load_start = os.getloadavg()[0]
    for rep in range(args.repeats):
        for name, cmd in COMMANDS.items():
            for label, tree in trees.items():
                cpu, wall = run(tree, cmd)
                rows.append({"command": name, "tree": label, "repeat": rep, "cpu_s": round(cpu, 3),
                             "wall_s": round(wall, 3)})
                print(f"  tuner {name:<10} {label:<16} run {rep}: {cpu:.2f} s CPU, {wall:.2f} s wall", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "startup.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = [f"# CLI start-up ({datetime.now(timezone.utc):%Y-%m-%d})", "",
          f"Each command in a fresh process; median of {args.repeats} runs (CPU = user + system). {os.cpu_count()} "
          f"CPUs, load average {load_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end (a shared "
          f"host: wall times stretch with the load).", "",
          "| command | tuner | median wall s | median CPU s |", "| --- | --- | ---: | ---: |"]
    for name in COMMANDS:
        for label in trees:
            mine = [r for r in rows if r["command"] == name and r["tree"] == label]
            md.append(f"| `tuner {name}` | {label} | {statistics.median(r['wall_s'] for r in mine):.2f} | "
                      f"{statistics.median(r['cpu_s'] for r in mine):.2f} |")
    text = "\n".join(md) + "\n"
    (out / "startup.md").write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
