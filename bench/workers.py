"""Worker throughput: trials per minute with 1, 2 and 4 `tuner worker` processes sharing one study on one
machine (PoCL), i.e. how throughput scales when workers cooperate through a storage.

    python bench/workers.py [--workers 1,2,4] [--trials 24] [--storage journal|URL] [--out bench/results]
                            [--device pocl] [--sampler xgb] [--note TEXT]
    python bench/workers.py --summarize bench/results/workers_<fingerprint>.csv   # redo the table

For each worker count k, one after another: a fresh storage (a journal file in a temporary directory, or a
fresh study prefix in the database at --storage URL) with one registered task (conv2d 16->32 channels, 3x3,
28x28, buffers) and a budget of N trials; k `tuner worker` processes start together (seed = worker index,
--parallel 1: one build process and one run process each, repeats 3) and tune until the budget is spent.
``trials_per_min`` counts the whole wall time, process start-up included (N / wall); ``steady_per_min``
only the measuring span (measurements / (end of the last - start of the first, from the records)).
``twice`` counts configs measured by two workers (the claim protocol makes it 0).

Writes ``<out>/workers_<device fingerprint>.csv`` and ``.md`` (also printed).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

WORKLOAD = dict(data=(1, 16, 28, 28), kernel=(32, 16, 3, 3), padding=1)
BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}
FIELDS = ["workers", "trials", "wall_s", "trials_per_min", "steady_per_min", "speedup", "steady_speedup",
          "per_worker", "yielded", "twice", "failed", "load_before", "load_after", "storage", "sampler", "device"]


def run(k: int, trials: int, storage: str | None, sampler: str, device: str, tmp: Path) -> dict:
    from tuner.logs import load_records
    from tuner.search.worker import Task, register_tasks
    from tuner.templates import get_template
    wl = get_template("conv2d").workload(**WORKLOAD)
    url = storage or f"journal:{tmp / f'studies-{k}.journal'}"
    prefix = f"bench-{k}-{int(time.time())}"
    register_tasks(url, [Task("conv2d", wl, BUFFERS, trials=trials)], prefix)
    logs = [tmp / f"k{k}-w{i}.jsonl" for i in range(k)]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "tuner", "worker", "--storage", url, "--study-prefix", prefix,
                               "-d", device, "--log", str(log), "--sampler", sampler, "--seed", str(i),
                               "--parallel", "1", "--repeats", "3", "--no-progress"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, log in enumerate(logs)]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - start
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"a worker failed:\n{err}")
    records = [r for log in logs if log.exists() for r in load_records(str(log))]
    measured = [r for r in records if r.error_name != "INSTANTIATION"]
    t0 = min(_time(r.timestamp) for r in measured)
    t1 = max(_time(r.timestamp) + r.duration_s for r in measured)
    configs = [json.dumps(r.config, sort_keys=True) for r in records]
    yielded = sum(int(m.group(1)) for out, _ in outs for m in re.finditer(r"yielded (\d+) claims", out))
    return {"workers": k, "trials": len(measured), "wall_s": round(wall, 1),
            "trials_per_min": round(len(measured) / wall * 60, 2),
            "steady_per_min": round(len(measured) / (t1 - t0) * 60, 2),
            "per_worker": "/".join(str(sum(r.error_name != "INSTANTIATION" for r in load_records(str(log))))
                                   for log in logs if log.exists()),
            "yielded": yielded, "twice": len(configs) - len(set(configs)),
            "failed": sum(not r.ok for r in measured), "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2), "storage": "journal file" if storage is None else
            re.sub(r"://([^:/@]+):[^@/]*@", r"://\1:***@", storage), "sampler": sampler, "device": records[0].device}


def _time(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp).timestamp()


def _number(v: str):
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def markdown(rows: list, cores: int, note: str, when: float | None = None) -> str:
    base = next(r for r in rows if r["workers"] == rows[0]["workers"])
    for r in rows:
        r["speedup"] = round(r["trials_per_min"] / base["trials_per_min"], 2)
        r["steady_speedup"] = round(r["steady_per_min"] / base["steady_per_min"], 2)
    lines = [f"# Worker throughput: {rows[0]['device']}", "",
             f"- {datetime.datetime.fromtimestamp(when or time.time()):%Y-%m-%d %H:%M}; {cores} CPU cores; "
             f"storage: {rows[0]['storage']}; "
             f"sampler {rows[0]['sampler']}; task conv2d {WORKLOAD}, buffers; `tuner worker --parallel 1 "
             "--repeats 3` per process", f"- {note}",
             "- on PoCL the device *is* the machine's CPU cores: the workers share one device, so more workers "
             "can only fill the gaps (one worker's build and run phases alternate); the throughput that scales "
             "with workers is that of separate devices (phones, GPUs), each with its own worker", "",
             "| workers | trials | wall s | trials/min | speedup | steady trials/min | steady speedup | "
             "per worker | yielded claims | configs measured twice | load before/after |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    lines += [f"| {r['workers']} | {r['trials']} | {r['wall_s']} | {r['trials_per_min']} | {r['speedup']} | "
              f"{r['steady_per_min']} | {r['steady_speedup']} | {r['per_worker']} | {r['yielded']} | {r['twice']} | "
              f"{r['load_before']}/{r['load_after']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--storage", default="journal", help="journal (a fresh file per run) or a database URL")
    ap.add_argument("--sampler", default="xgb", choices=("xgb", "tpe", "random"))
    ap.add_argument("--device", default="pocl")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--note", default="the machine is shared with other users' work: timings are noisy")
    ap.add_argument("--summarize", metavar="CSV", help="only rewrite the markdown of an earlier run's CSV")
    args = ap.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            rows = [{k: _number(v) for k, v in r.items()} for r in csv.DictReader(f)]
        md = markdown(rows, os.cpu_count() or 0, args.note, Path(args.summarize).stat().st_mtime)
        Path(args.summarize).with_suffix(".md").write_text(md)
        print(md)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        for k in (int(x) for x in args.workers.split(",")):
            rows.append(run(k, args.trials, None if args.storage == "journal" else args.storage, args.sampler,
                            args.device, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    md = markdown(rows, os.cpu_count() or 0, args.note)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"workers_{rows[0]['device']}"
    with open(f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    Path(f"{stem}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
