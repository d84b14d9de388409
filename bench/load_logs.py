"""Loading benchmark: ``tuner.analysis.load_logs`` on a 100,000-record log against ``pandas.read_json``.

    python bench/load_logs.py [--records N] [--repeats K] [--out bench/results] [--keep LOG]

Generates a realistic log first (``--keep`` reuses or keeps it): tasks are the unique conv, depthwise and
dense layers of ResNet-18 and MobileNetV2 (``bench/layers.py``), each with texture and with buffer scopes;
configs are valid configs sampled from the shipped search spaces for the local default device, records are
written by ``Record.new`` + ``Record.to_json`` (the tuner's own writer). Timings follow the measurer:
a median from a lognormal GFLOP/s around 10, and as many ``costs`` as a run of at least 20 ms of kernel
time and at least 5 repeats gives (``MeasureOptions.min_seconds``). 10% of records are failures with
error codes and messages in the proportions a tuning run shows (compile and runtime errors most often).

Then it times, median of ``--repeats`` runs each, in fresh subprocesses (so that no run warms another's
caches or heap):

- ``load_logs``: the full typed DataFrame (flattened workload fields and knobs, labels, timestamps) --
  a clean file goes through pyarrow's JSON reader;
- ``load_logs`` on a copy with one torn line in the middle: the chunk of 2,000 lines that holds it is
  parsed line by line, the rest by pyarrow;
- ``load_records``: parsing and validating the records only, no DataFrame;
- ``pandas.read_json(lines=True)``: the peer -- plain pandas, which stops at nested dict columns
  (no flattening, no typed knobs, and one bad line fails the whole file).

Writes ``<out>/load_logs.csv`` (one row per run) and ``<out>/load_logs.md`` (also printed).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/layers.py

FAILURES = [  # (error code, share of records, a typical message)
    (1, 0.01, "constraint 'registers' (tile_oc * tile_oh * tile_ow <= 32) is false for this workload"),
    (2, 0.03, "clBuildProgram failed: BUILD_PROGRAM_FAILURE\n<kernel>:41:17: error: use of undeclared "
              "identifier 'acc_3'\n        acc_3 = mad(w.s3, x, acc_3);\n                ^\n1 error generated."),
    (3, 0.03, "clEnqueueNDRangeKernel failed: INVALID_WORK_GROUP_SIZE (local size 64x8 exceeds the "
              "kernel's maximum work-group size 256)"),
    (4, 0.01, "max relative error 3.2e+00 above tolerance 1e-04 at output (0, 12, 3, 7)"),
    (6, 0.01, "run did not finish within 30.0 s; worker killed and restarted"),
    (7, 0.01, "worker process died with signal 11 (SIGSEGV)"),
]
SCOPES = ("texture", "buffer")
SAMPLERS = ("xgb", "tpe", "random")


def generate(path: Path, n: int, seed: int = 0) -> None:
    """Write ``n`` realistic records to ``path`` (see the module docstring)."""
    from layers import FULL

    from tuner.errors import ErrorCode
    from tuner.logs.record import Record
    from tuner.runtime.opencl.device import choose_device
    from tuner.templates import get_template

    rng = np.random.default_rng(seed)
    info = choose_device(None)
    tasks = []
    for layer in FULL:
        t = get_template(layer["template"])
        wl = t.workload(**layer["workload"])
        for scope in SCOPES:
            space = t.space(wl, info, **{f"{op}_scope": scope for op in ("input", "weight", "output")})
            pool = [space.sample(rng) for _ in range(64)]  # configs to draw from (duplicates are realistic)
            fb = t.fallback(wl, info)
            tasks.append((t, wl, fb, pool))
    per_task = math.ceil(n / len(tasks))
    codes = [c for c, _, _ in FAILURES]
    shares = np.array([s for _, s, _ in FAILURES])
    messages = {c: m for c, _, m in FAILURES}
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    written = 0
    with open(path, "w") as f:
        for i, (t, wl, fb, pool) in enumerate(tasks):
            sampler = SAMPLERS[i % len(SAMPLERS)]
            study = f"{t.name}-{i:012x}-{info.fingerprint}"
            base_gflops = float(rng.lognormal(np.log(10.0), 0.8))
            lines = []
            for trial in range(min(per_task, n - written)):
                values = pool[rng.integers(len(pool))]
                cfg = t.make_config(values) if hasattr(t, "make_config") else t.config(**values)
                u = rng.random()
                code = 0 if u >= shares.sum() else codes[int(np.searchsorted(np.cumsum(shares), u, side="right"))]
                costs = []
                if code == 0:
                    median = wl.flops / (base_gflops * float(rng.lognormal(0, 0.5)) * 1e9)
                    k = max(5, math.ceil(0.02 / median))
                    costs = (median * rng.lognormal(0, 0.05, k)).tolist()
                ts = (start + timedelta(seconds=written * 1.7)).isoformat(timespec="milliseconds")
                r = Record.new(t.name, wl, cfg, info, costs=costs, error_code=ErrorCode(code),
                               error_msg=messages.get(code, ""), max_rel_error=2e-7 if code == 0 else None,
                               timestamp=ts, duration_s=float(rng.uniform(0.2, 3.0)), trial=trial,
                               sampler=sampler, study=study)
                lines.append(r.to_json())
                written += 1
            f.write("\n".join(lines) + "\n")


LOADERS = {  # name -> (code, which log)
    "load_logs": ("from tuner.analysis import load_logs; df = load_logs(PATH)", "clean"),
    "load_logs, 1 torn line": ("import warnings; warnings.simplefilter('ignore'); "
                               "from tuner.analysis import load_logs; df = load_logs(PATH)", "torn"),
    "load_records": ("from tuner.logs import load_records; df = load_records(PATH)", "clean"),
    "pandas.read_json": ("import pandas as pd; df = pd.read_json(PATH, lines=True)", "clean"),
}


def write_torn(path: Path, torn: Path) -> None:
    """A copy of the log with a torn line (a writer killed mid-record) in the middle."""
    with open(path, "rb") as f:
        lines = f.readlines()
    with open(torn, "wb") as f:
        f.writelines(lines[:len(lines) // 2])
        f.write(lines[0][:150] + b"\n")
        f.writelines(lines[len(lines) // 2:])


RUNNER = """
import sys, time
PATH = sys.argv[1]
import pandas, tuner.logs, tuner.analysis  # imports are not part of the load
t0 = time.perf_counter()
{code}
t = time.perf_counter() - t0
print(t, len(df), getattr(df, "shape", (len(df), -1))[1])
"""


def time_loader(name: str, path: Path) -> tuple[float, int, int]:
    out = subprocess.run([sys.executable, "-c", RUNNER.format(code=LOADERS[name][0]), str(path)],
                         capture_output=True, text=True, check=True)
    t, rows, cols = out.stdout.split()
    return float(t), int(rows), int(cols)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--keep", metavar="LOG", help="generate the log here (or reuse it if it exists)")
    args = ap.parse_args(argv)

    tmp = None
    if args.keep:
        path = Path(args.keep)
    else:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "bench.jsonl"
    if not path.exists():
        t0 = time.perf_counter()
        generate(path, args.records)
        print(f"generated {args.records:,} records in {time.perf_counter() - t0:.1f} s: {path} "
              f"({path.stat().st_size / 2**20:.0f} MiB)", flush=True)
    size_mib = path.stat().st_size / 2**20
    torn = path.with_name(path.stem + "_torn.jsonl")
    write_torn(path, torn)
    logs = {"clean": path, "torn": torn}
    with open(path) as f:  # the shape of the log, for the summary
        n_costs = [line.count(",", line.index('"costs":['), line.index("]", line.index('"costs":[')))
                   + ('"costs":[]' not in line) for line in f]
    n_records = len(n_costs)
    ok_costs = np.array([c for c in n_costs if c > 0])

    rows = []
    load_start = os.getloadavg()[0]
    for rep in range(args.repeats):  # interleaved, so a slow period of the machine hits every loader
        for name in LOADERS:
            t, nrows, ncols = time_loader(name, logs[LOADERS[name][1]])
            rows.append({"loader": name, "repeat": rep, "seconds": round(t, 4), "rows": nrows, "columns": ncols})
            print(f"  {name:<18} run {rep}: {t:.2f} s ({nrows:,} rows x {ncols} columns)", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "load_logs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = {name: statistics.median(r["seconds"] for r in rows if r["loader"] == name) for name in LOADERS}
    best = {name: min(r["seconds"] for r in rows if r["loader"] == name) for name in LOADERS}
    cols = {r["loader"]: r["columns"] for r in rows}
    import pandas
    load = os.getloadavg()
    md = [f"# load_logs benchmark ({datetime.now(timezone.utc):%Y-%m-%d})", "",
          f"{n_records:,} records, {size_mib:.0f} MiB of JSON lines (ResNet-18 + MobileNetV2 layers, texture "
          f"and buffer tasks, {100 * (1 - len(ok_costs) / n_records):.0f}% failures; a success holds "
          f"{np.median(ok_costs):.0f} costs in the median, {np.mean(ok_costs):.0f} on average, "
          f"{np.percentile(ok_costs, 99):.0f} at the 99th percentile); median of {args.repeats} runs, each in "
          f"a fresh process; pandas {pandas.__version__}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {load_start:.1f} at the start and {load[0]:.1f} at the end "
          f"(a shared machine: the fastest run is the least disturbed one).", "",
          "| loader | median s | fastest s | records/s (median) | columns | median vs pandas.read_json |",
          "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in LOADERS:
        md.append(f"| `{name}` | {med[name]:.2f} | {best[name]:.2f} | {n_records / med[name]:,.0f} | "
                  f"{max(cols[name], 0) or '-'} | {med[name] / med['pandas.read_json']:.2f}x |")
    md += ["", "`load_logs, 1 torn line`: the same log with a torn line in the middle (the chunk holding it "
           "is parsed line by line, with a warning); `load_records` parses and validates only, one Record per "
           "line. `pandas.read_json` "
           "leaves the workload, scopes and config as dict columns and fails on a torn line: a plain load, "
           "not an equivalent of `load_logs`."]
    text = "\n".join(md) + "\n"
    (out / "load_logs.md").write_text(text)
    print("\n" + text)
    torn.unlink()
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
