"""What tuning a whole model costs: the measurements and the wall time until the model's estimated latency is
within 5% of its best known, for the search before and after a change (two git revisions of this repository).

    python bench/model_tuning.py --before 97f93fd [--after HEAD] [--model resnet18] [--input-size 32]
                                 [--trials 96] [--device D] [--out bench/results]
    python bench/model_tuning.py --before-tree DIR --after-tree DIR ...   # checkouts already made (no git)

Each side runs ``tuner.scheduler.model.tune_model`` from its own revision (a ``git worktree`` under /tmp, in a
fresh process) on the same ONNX model, with a fresh log, the default device, buffer scopes, its default
sampler and seed 0, and the same total trial budget. From each log, in measurement order, it follows the
model's estimated latency: the sum over the model's tuned kernels of their count times the best median time
measured so far for that kernel (defined once every kernel has a success; each task measures its fallback
config first). ``best known`` is the same sum over the best time of each kernel in either log. The table
gives, per side, the measurements and the seconds from the start of ``tune_model`` until the estimate is
within 5% (and 10%) of the best known, and where each side ends.

Writes ``<out>/model_tuning_<fingerprint>.csv`` (one row per side and threshold) and ``.md`` (also printed).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def worktree(rev: str) -> Path:
    """A checkout of ``rev`` under /tmp (made once)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=10", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"tuner-rev-{sha}"
    if not (path / "tuner").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(path), sha], check=True,
                       capture_output=True)
    return path


def side(root: str, model: str, log: str, trials: int, out_json: str, device=None) -> None:
    """Run in a fresh process whose ``tuner`` is ``root``'s: tune the model, write start/end times."""
    sys.path.insert(0, root)
    from tuner.scheduler.model import tune_model
    start = time.time()
    res = tune_model(model, log=log, trials=trials, scope="buffer", progress=False, seed=0, device=device)
    Path(out_json).write_text(json.dumps({"start": start, "end": time.time(), "measured": res.measured,
                                          "tuner": str(Path(sys.modules["tuner"].__file__).parent)}))


def curve(records: list, counts: dict) -> list:
    """(measurement index, seconds since the first record, estimated latency or None) per measurement."""
    best, out = {}, []
    for i, r in enumerate(records, start=1):
        key = r.task_key[1:]
        if key in counts and r.ok and r.median_s and r.median_s < best.get(key, float("inf")):
            best[key] = r.median_s
        est = sum(n * best[k] for k, n in counts.items()) if all(k in best for k in counts) else None
        out.append((i, r, est))
    return out


def when(points: list, target: float):
    return next(((i, r) for i, r, est in points if est is not None and est <= target), (None, None))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", help="the revision before (e.g. the commit before a search change)")
    p.add_argument("--after", help="the revision after (default HEAD)")
    p.add_argument("--before-tree", help="instead of --before: a checkout of it (e.g. from `git archive`)")
    p.add_argument("--after-tree", help="instead of --after: a checkout of it")
    p.add_argument("--device", help="default: the default device")
    p.add_argument("--model", default="resnet18", help="a zoo model: resnet18, mobilenet_v2, mobilenet_v3_small")
    p.add_argument("--input-size", type=int, default=32)
    p.add_argument("--trials", type=int, default=96, help="measurements for the whole model, each side")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--side", nargs=6, metavar=("ROOT", "MODEL", "LOG", "TRIALS", "JSON", "DEVICE"),
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.side:
        side(a.side[0], a.side[1], a.side[2], int(a.side[3]), a.side[4], a.side[5] or None)
        return 0
    if not (a.before or a.before_tree):
        p.error("give --before REV or --before-tree DIR")

    sys.path.insert(0, str(REPO))
    from tuner.errors import ErrorCode
    from tuner.compile.compiler import load_graph
    from tuner.plan.lower import extract_tasks, lower_graph, plan_storage
    from tuner.zoo.models import write_model
    from tuner.logs import load_records
    from tuner.runtime.opencl.device import choose_device
    info = choose_device(a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="model-tuning-"))
    model = write_model(a.model, work / f"{a.model}.onnx", input_size=a.input_size)
    plan = plan_storage(lower_graph(load_graph(model), "float32"), info, "buffer")
    counts = {t.record_key(info.fingerprint)[1:]: t.count for t in extract_tasks(plan, alternatives=False)}
    sides = {}
    for name, rev, tree in (("before", a.before, a.before_tree), ("after", a.after, a.after_tree)):
        root = Path(tree).resolve() if tree else worktree(rev or "HEAD")
        rev = rev or Path(tree).name
        (work / name).mkdir()  # a log of its own folder: the other side's log is no sibling to learn from
        log, js = work / name / "log.jsonl", work / name / "side.json"
        print(f"{name}: {rev} ({root}) tuning {a.model}@{a.input_size}, {len(counts)} kernels, {a.trials} trials ...",
              flush=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
        subprocess.run([sys.executable, str(HERE / "model_tuning.py"), "--side", str(root), model,
                        str(log), str(a.trials), str(js), a.device or ""], check=True, env=env, cwd=root)
        meta = json.loads(js.read_text())
        assert Path(meta["tuner"]).resolve() == (root / "tuner").resolve(), meta  # it ran that revision's code
        recs = sorted((r for r in load_records(str(log)) if r.error_code != ErrorCode.INSTANTIATION),
                      key=lambda r: r.timestamp)  # a config the space rejects costs no device work
        sides[name] = (rev, meta, recs)
    best = {}
    for _, _, recs in sides.values():
        for r in recs:
            k = r.task_key[1:]
            if k in counts and r.ok and r.median_s:
                best[k] = min(best.get(k, float("inf")), r.median_s)
    best_known = sum(n * best[k] for k, n in counts.items())
    rows = []
    for name, (rev, meta, recs) in sides.items():
        pts = curve(recs, counts)
        final = pts[-1][2] if pts else None
        for th in (0.05, 0.10):
            i, r = when(pts, best_known * (1 + th))
            secs = (datetime.datetime.fromisoformat(r.timestamp).timestamp() - meta["start"]) if r else None
            rows.append({"side": name, "revision": rev, "threshold": f"{th:.0%}", "measurements": i,
                         "seconds": round(secs, 1) if secs is not None else None, "total_measurements": len(recs),
                         "total_seconds": round(meta["end"] - meta["start"], 1),
                         "final_ms": round(final * 1e3, 4) if final else None,
                         "best_known_ms": round(best_known * 1e3, 4)})
    csv_path = out / f"model_tuning_{info.fingerprint}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [f"# Tuning a whole model: {a.model} at {a.input_size}x{a.input_size}, {info.name}", "",
             f"- device `{info.name}` ({info.fingerprint}), {date}; {len(counts)} tuned kernels, buffer scopes, "
             f"{a.trials} measurements per side, `tune_model` of each revision in its own worktree and process",
             f"- best known latency (sum over kernels of count x best median time in either log): "
             f"{best_known * 1e3:.3f} ms (kernel time only, estimate)", "",
             "| side | revision | within | measurements | seconds | measured in all | seconds in all | final estimate ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['side']} | `{r['revision']}` | {r['threshold']} | "
                     f"{r['measurements'] if r['measurements'] else 'not reached'} | "
                     f"{r['seconds'] if r['seconds'] is not None else '-'} | {r['total_measurements']} | "
                     f"{r['total_seconds']} | {r['final_ms']} |")
    md = "\n".join(lines) + "\n"
    (out / f"model_tuning_{info.fingerprint}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
