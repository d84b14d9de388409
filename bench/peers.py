"""Peer benchmark (issue 26): ours beside MNN's OpenCL backend and onnxruntime (and, on an NVIDIA GPU, PyTorch's
CUDA-graph replay) on the same models, the same OpenCL device, in one run, transfers included on every side.

    python bench/peers.py run --device D --models resnet18,mobilenet_v2 --input-size 96 --out OUT \\
        [--log 'logs/*.jsonl'] [--transfer-from FP] [--tag untuned] [--sides native,python,mnn,ort,torch] \\
        [--mnn-src .mnn/mnn-src.tgz --mnn-wheel .mnn/MNN-*.whl --mnn-build DIR --mnn-modes 132,68,130,66] \\
        [--mnn-vendor /path/x.icd] [--rounds 3] [--repeats 50] [--warmup 10] [--deadline S] [--work WORK]
    python bench/peers.py tune --device D --models ... --work WORK --tune-log-dir DIR --transfer-from FP \\
        [--trials 16] [--gpus N] [--deadline S]     # tune each model's remaining tasks, <= --trials each
    python bench/peers.py table --out OUT              # peers.json -> peers.csv, peers.md again

Models: the zoo's names (``tuner zoo NAME``) and ``tv_NAME`` for torchvision's NAME with random weights and
BatchNorm calibrated (``bench/runtimes_gpu.py export``: needs torch in that process), float32, batch 1, one
random input (seed 0); onnxruntime's CPU output on it is the reference every side is checked against.

Sides, each in its own process, the order rotated every round (a loaded machine drifts; every side sees each
position), each side's figure the median over ``--rounds`` of its per-round figure:

- ``native``: ``tuner compile`` (``--log``, ``--transfer-from``; --scope auto), then ``tuner-run ART --input
  x.npy --bench repeats --warmup warmup``: the median of whole runs (input written, kernels, output read).
- ``python``: the same artifact through ``tuner run ART --input x.npy --bench repeats`` (the Python executor:
  median of whole runs, no separate warm-up).
- ``mnn``: MNN's OpenCL backend (bench/mnn.py): ``benchmark.out`` per GPU mode in ``--mnn-modes`` (its own
  tuning at session creation; image and buffer memory); its figure is the mean of ``repeats`` runs after
  ``warmup`` (benchmark.out prints no median), inputs uploaded and outputs read back in each run. The best mode
  (lowest median over rounds) is MNN's figure. A run in which MNN did not get the OpenCL device counts as an
  error, never as a time.
- ``ort``: onnxruntime's ``InferenceSession.run`` on a NumPy input (CUDA provider where onnxruntime has one and
  the device is NVIDIA, else the CPU provider with its default threads), median of ``repeats`` after
  ``warmup``.
- ``torch`` (NVIDIA only): ``bench/runtimes_gpu.py torch``: PyTorch eager and CUDA-graph replay, BatchNorm
  folded, TF32 off, with and without transfers (pageable host tensor in, output back); its own rounds.

Ratios are ``peer / ours native`` (above 1: ours is faster), both measured in this run.

Writes OUT/peers.json (every round, every command's outcome), OUT/peers.csv, OUT/peers.md; OUT/peers.log.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import harness  # noqa: E402
import mnn  # noqa: E402

SIDES = ("native", "python", "mnn", "ort", "torch")


class Job(harness.Job):
    LOG, LOG_TAIL, SHOW, WIDTH, CLOCK = "peers.log", 60, 15, 300, True


def tuner_cmd() -> list:
    return [sys.executable, "-P", "-m", "tuner"] if sys.flags.safe_path else [sys.executable, "-m", "tuner"]


def export(job: Job) -> dict:
    """The ONNX files, x.npy and onnxruntime's reference outputs under WORK (bench/runtimes_gpu.py export)."""
    a = job.args
    have = harness.load_json(job.work / "export.json", {})
    todo = [m for m in a.models.split(",") if not have.get(m, {}).get("ok")]
    if todo or not (job.work / "x.npy").exists():
        job.sh([sys.executable, "-P", BENCH / "runtimes_gpu.py", "export", "--work", job.work, "--models",
                ",".join(todo or a.models.split(",")), "--input-size", a.input_size], timeout=1800)
    return harness.load_json(job.work / "export.json", {})


def compile_ours(job: Job, name: str) -> dict:
    a = job.args
    art = job.work / f"art_{a.tag}_{name}"
    cmd = [*tuner_cmd(), "compile", job.work / "models" / f"{name}.onnx", "--device", a.device, "--no-progress",
           "-o", art, "--scope", a.scope]
    if a.log:
        cmd += ["--log", a.log]
    if a.transfer_from:
        cmd += ["--transfer-from", a.transfer_from]
    if a.scope == "auto" and getattr(a, "plan_timer", "python") != "python":
        cmd += ["--plan-timer", a.plan_timer]
    t0 = time.time()
    rc, text = job.sh(cmd, timeout=900)
    row = {"artifact": str(art), "compile_s": time.time() - t0}
    m = re.search(r"^compiled .*$", text, re.M)
    row["compile_says"] = re.sub(r" -> \S+$", "", m.group(0)) if m else None
    m = re.search(r"^--scope auto: .*$", text, re.M)
    row["plan"] = m.group(0) if m else None
    if rc or not art.exists():
        row["error"] = f"tuner compile exit {rc}: {text.strip()[-500:]}"
    return row


def _run_ours(job: Job, name: str, side: str, cmd: list, first: bool, what: str, env=None) -> dict:
    """One timed run of our artifact (``cmd`` prints the median; ``--output`` on the first round, whose output is
    checked against onnxruntime's)."""
    y = job.work / f"y_{side}_{job.args.tag}_{name}.npy"
    rc, text = job.sh(cmd + (["--output", y] if first else []), env=env, quiet=True, timeout=600)
    s = harness.latency_s(text)
    if rc or s is None:
        return {"error": f"{what} exit {rc}: {text.strip()[-300:]}"}
    got = {"s": s}
    if first and y.exists():
        got["rel_err"] = harness.rel_err(np.load(y), np.load(job.work / f"ref_{name}.npy"))
    return got


def run_native(job: Job, name: str, st: dict, first: bool) -> dict:
    a = job.args
    cmd = [st["native_exe"], st["ours"][name]["artifact"], "--device", a.device, "--input", job.work / "x.npy",
           "--bench", a.repeats, "--warmup", a.warmup]
    return _run_ours(job, name, "native", cmd, first, "tuner-run", env=st["native_env"])


def run_python(job: Job, name: str, st: dict, first: bool) -> dict:
    a = job.args
    cmd = [*tuner_cmd(), "run", st["ours"][name]["artifact"], "--device", a.device, "--input", job.work / "x.npy",
           "--bench", a.repeats]
    return _run_ours(job, name, "python", cmd, first, "tuner run")


def run_mnn(job: Job, name: str, st: dict, first: bool) -> dict:
    a = job.args
    got = {}
    for mode in [int(m) for m in a.mnn_modes.split(",") if m]:
        if job.left() < 20:
            got[str(mode)] = {"error": "deadline"}
            continue
        r = mnn.bench(job.sh, st["mnn_exe"], st["mnn_dirs"][name], a.repeats, a.warmup, mode, st["mnn_env"],
                      timeout=min(a.mnn_timeout, job.left()))
        got[str(mode)] = r
    return {"modes": got}


def run_ort(job: Job, name: str, st: dict, first: bool) -> dict:
    a = job.args
    rc, text = job.sh([sys.executable, "-P", Path(__file__).resolve(), "ort-one", "--work", job.work, "--models", name,
                       "--repeats", a.repeats, "--warmup", a.warmup, "--device", a.device, "--out", job.out],
                      quiet=True, timeout=600)
    m = re.search(r"^ORT (\{.*\})$", text, re.M)
    if rc or not m:
        return {"error": f"ort exit {rc}: {text.strip()[-300:]}"}
    return json.loads(m.group(1))


def cmd_ort_one(args) -> int:
    """One model through onnxruntime (a process of its own): ``ORT {json}``."""
    import onnxruntime as ort
    work = Path(args.work)
    name = args.models
    x = np.load(work / "x.npy")
    avail = ort.get_available_providers()
    prov = ["CUDAExecutionProvider"] if ("nvidia" in args.device.lower() and "CUDAExecutionProvider" in avail) \
        else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(str(work / "models" / f"{name}.onnx"), providers=prov)
    inp = sess.get_inputs()[0].name
    out = []
    s = harness.wall(lambda: out.append(sess.run(None, {inp: x})[0]), args.repeats, args.warmup)
    print("ORT " + json.dumps({"s": s, "provider": sess.get_providers()[0],
                               "ort": ort.__version__, "threads_default": os.cpu_count(),
                               "rel_err": harness.rel_err(out[-1], np.load(work / f"ref_{name}.npy"))}))
    return 0


RUNNERS = {"native": run_native, "python": run_python, "mnn": run_mnn, "ort": run_ort}


def native_exe(job: Job, meta: dict):
    """tuner-run built from this tree's native/ into WORK/native, and the environment that finds the device."""
    build = job.work / "native"
    exe = build / "tuner-run"
    if not exe.exists():
        rc, text = job.sh(["make", "-C", REPO / "native", f"BUILD={build}", f"-j{min(8, os.cpu_count() or 1)}", "cli"],
                          quiet=True)
        if rc or not exe.exists():
            meta["native_error"] = "tuner-run build failed: " + text[-800:]
            return None, None
    env = dict(os.environ)
    rc, text = job.sh([exe, "--devices"], env=env, quiet=True)
    how = "system libOpenCL.so.1"
    if rc or job.args.device.lower() not in text.lower():
        sys.path.insert(0, str(REPO))
        from tuner.native import opencl_env
        env = opencl_env(dict(os.environ))
        how = f"TUNER_OPENCL_LIB={env.get('TUNER_OPENCL_LIB')}, OCL_ICD_VENDORS={env.get('OCL_ICD_VENDORS')}"
        rc, text = job.sh([exe, "--devices"], env=env, quiet=True)
    meta["native_opencl"] = how
    meta["native_devices"] = text.strip()[-1200:]
    return exe, env


def mnn_vendor_file(device: str):
    """The pyopencl ICD folder's vendor file for ``device`` (intel, pocl), for MNN on a CPU runtime."""
    sys.path.insert(0, str(REPO))
    from tuner.native import opencl_env
    env = opencl_env(dict(os.environ))
    folder = env.get("OCL_ICD_VENDORS")
    if not folder:
        return None, None
    for f in sorted(Path(folder).glob("*.icd")):
        if device.lower() in f.name.lower():
            return str(f), env.get("TUNER_OPENCL_LIB")
    return None, env.get("TUNER_OPENCL_LIB")


def prepare_mnn(job: Job, meta: dict, models: list) -> dict:
    a = job.args
    st: dict = {}
    exe = mnn.build(job.sh, a.mnn_src, a.mnn_build, meta=meta)
    if exe is None:
        return st
    site = Path(a.mnn_build) / "site"
    err = mnn.install_converter(job.sh, a.mnn_wheel, site)
    if err:
        meta["mnn_error"] = err
        return st
    if "nvidia" in a.device.lower() and not a.mnn_vendor:
        env, how = mnn.opencl_env(job.sh, a.mnn_build)
    else:
        vendor, loader = (a.mnn_vendor, None) if a.mnn_vendor else mnn_vendor_file(a.device)
        if a.mnn_vendor:
            _, loader = mnn_vendor_file(a.device)
        if not vendor:
            meta["mnn_error"] = f"no OpenCL vendor file for device {a.device!r} to give MNN"
            return st
        env, how = mnn.opencl_env(job.sh, a.mnn_build, loader=loader, vendor_file=vendor)
    meta["mnn_opencl"] = how
    dirs = {}
    for name in models:
        d = Path(a.mnn_build) / "models" / f"{name}-{a.input_size}"  # a converted model is kept: one per size
        e = mnn.convert(job.sh, job.work / "models" / f"{name}.onnx", d / f"{name}.mnn", site)
        if e:
            meta.setdefault("mnn_convert_errors", {})[name] = e
        else:
            dirs[name] = d
    st.update({"mnn_exe": exe, "mnn_env": env, "mnn_dirs": dirs})
    return st


def cmd_run(args) -> int:
    job = Job(args)
    a = args
    path = job.out / "peers.json"
    result = harness.load_json(path, {"runs": {}})
    meta = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device_spec": a.device,
            "models": a.models, "input_size": a.input_size, "repeats": a.repeats, "warmup": a.warmup,
            "rounds": a.rounds, "log": a.log, "transfer_from": a.transfer_from, "sides": a.sides,
            "mnn_modes": a.mnn_modes, "host_cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    info = job.device_info(tuner_cmd())
    meta["device"] = {k: info.get(k) for k in ("name", "platform", "driver_version", "fingerprint", "error")}
    job.say("device " + json.dumps(meta["device"]))
    run = {"meta": meta, "models": {}}
    result["runs"][a.tag] = run

    def flush():
        meta["loadavg_now"] = os.getloadavg()
        harness.save_json(path, result)
        write_tables(result, job.out)
    flush()
    exported = export(job)
    models = [m for m in a.models.split(",") if exported.get(m, {}).get("ok")]
    for m in a.models.split(","):
        run["models"][m] = {"export": exported.get(m, {"ok": False, "error": "not exported"})}
    sides = [s for s in a.sides.split(",") if s]
    st: dict = {"ours": {}}
    if {"native", "python"} & set(sides):
        for name in models:
            st["ours"][name] = run["models"][name]["ours"] = compile_ours(job, name)
            job.say(f"ours {name}: {st['ours'][name].get('compile_says') or st['ours'][name].get('error')}")
            flush()
    if "native" in sides:
        st["native_exe"], st["native_env"] = native_exe(job, meta)
    if "mnn" in sides:
        st.update(prepare_mnn(job, meta, models))
        flush()
    timed = [s for s in sides if s in RUNNERS]
    for r in range(a.rounds):
        for name in models:
            order = timed[r % len(timed):] + timed[:r % len(timed)] if timed else []
            for side in order:
                if job.left() < 30:
                    meta.setdefault("skipped_for_deadline", []).append(f"round {r} {name} {side}")
                    continue
                cell = run["models"][name].setdefault(side, {"rounds": []})
                if side in ("native", "python") and (st["ours"].get(name, {}).get("error") or
                                                     (side == "native" and not st.get("native_exe"))):
                    cell["error"] = st["ours"].get(name, {}).get("error") or meta.get("native_error")
                    continue
                if side == "mnn" and name not in st.get("mnn_dirs", {}):
                    cell["error"] = meta.get("mnn_error") or meta.get("mnn_convert_errors", {}).get(name, "no MNN")
                    continue
                got = RUNNERS[side](job, name, st, r == 0)
                got["round"], got["position"] = r, order.index(side)
                cell["rounds"].append(got)
                job.say(f"round {r} {name} {side}: " + json.dumps(got)[:400])
                flush()
    if "torch" in sides and "nvidia" in a.device.lower():
        job.sh([sys.executable, "-P", BENCH / "runtimes_gpu.py", "torch", "--work", job.work, "--models",
                ",".join(models), "--repeats", a.repeats, "--warmup", a.warmup, "--rounds", a.rounds], timeout=900)
        for t in harness.load_json(job.work / "torch.json", []):
            if t["model"] in run["models"]:
                run["models"][t["model"]]["torch"] = t
    meta["finished_after_s"] = time.time() - job.t0
    flush()
    print((job.out / "peers.md").read_text())
    return 0


# -- tables ------------------------------------------------------------------------------------------------------
def summarize(cell: dict) -> dict:
    """A side's figure: the median over rounds (MNN: per mode, then the best mode)."""
    if not cell:
        return {}
    rounds = cell.get("rounds", [])
    if rounds and "modes" in rounds[0]:
        per = {}
        for r in rounds:
            for mode, v in r["modes"].items():
                per.setdefault(mode, []).append(v.get("mean_s"))
        med = {m: harness.median(v) for m, v in per.items()}
        ok = {m: v for m, v in med.items() if v}
        errs = {m: next((r["modes"][m].get("error") for r in rounds if r["modes"].get(m, {}).get("error")), None)
                for m in per}
        best = min(ok, key=ok.get) if ok else None
        return {"s": ok.get(best), "mode": best, "modes": med, "n": len(rounds),
                "errors": {m: e for m, e in errs.items() if e and not ok.get(m)}}
    vals = [r.get("s") for r in rounds]
    rel = next((r["rel_err"] for r in rounds if "rel_err" in r), None)
    prov = next((r.get("provider") for r in rounds if r.get("provider")), None)
    err = cell.get("error") or next((r["error"] for r in rounds if r.get("error")), None)
    return {"s": harness.median(vals), "n": sum(v is not None for v in vals), "rounds_s": vals, "rel_err": rel,
            "provider": prov, "error": err if harness.median(vals) is None else None}


def table_rows(result: dict) -> list:
    rows = []
    for tag, run in result.get("runs", {}).items():
        meta = run["meta"]
        for name, m in run["models"].items():
            nat, py, mn, ort = (summarize(m.get(k, {})) for k in ("native", "python", "mnn", "ort"))
            t = m.get("torch", {})
            base = nat.get("s")

            def ratio(x):
                return x / base if isinstance(x, float) and base else None
            rows.append({
                "tag": tag, "model": name, "device": meta["device"].get("name"),
                "fingerprint": meta["device"].get("fingerprint"), "input_size": meta["input_size"],
                "compile_says": m.get("ours", {}).get("compile_says"), "plan": m.get("ours", {}).get("plan"),
                "native_s": base, "native_rounds": nat.get("n"), "native_rel_err": nat.get("rel_err"),
                "python_s": py.get("s"), "python_rel_err": py.get("rel_err"),
                "mnn_s": mn.get("s"), "mnn_mode": mn.get("mode"),
                "mnn_modes_s": json.dumps(mn.get("modes")) if mn else None,
                "mnn_errors": json.dumps(mn.get("errors")) if mn.get("errors") else None,
                "ort_s": ort.get("s"), "ort_provider": ort.get("provider"), "ort_rel_err": ort.get("rel_err"),
                "torch_graph_s": t.get("graph_s"), "torch_graph_io_s": t.get("graph_io_s"),
                "torch_eager_io_s": t.get("eager_io_s"),
                "mnn_over_native": ratio(mn.get("s")), "ort_over_native": ratio(ort.get("s")),
                "python_over_native": ratio(py.get("s")), "graph_io_over_native": ratio(t.get("graph_io_s")),
                "graph_over_native": ratio(t.get("graph_s")),
                "errors": "; ".join(f"{k}: {v.get('error')}" for k, v in (("native", nat), ("python", py), ("ort", ort))
                                    if v.get("error")) + (f"; mnn: {mn['errors']}" if mn.get("errors") else "")
                          + (f"; ours: {m['ours']['error']}" if m.get("ours", {}).get("error") else "")})
    return rows


def _x(r):
    return f"**{r:.2f}**" if isinstance(r, float) else "–"


def write_tables(result: dict, out: Path) -> None:
    rows = table_rows(result)
    if rows:
        with open(out / "peers.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)
    lines = []
    for tag, run in result.get("runs", {}).items():
        meta = run["meta"]
        d = meta["device"]
        lines += [f"## {tag}", "", f"Device: {d.get('name')} ({d.get('platform')}, driver {d.get('driver_version')}, "
                  f"{d.get('fingerprint')}); log {meta.get('log')}; transfer-from {meta.get('transfer_from')}; "
                  f"float32, batch 1, {meta['input_size']}x{meta['input_size']}; ms: median of {meta['rounds']} rounds "
                  f"(sides alternating), each the median of {meta['repeats']} runs after {meta['warmup']} warm-up runs "
                  f"(MNN: its mean); transfers included on every side. Host: {meta.get('host_cpus')} CPUs, load "
                  f"{meta.get('loadavg_start')} at the start. Started {meta['started_utc']} UTC.", "",
                  "| model | ours native | ours Python | MNN OpenCL (best mode) | MNN / ours | onnxruntime | ORT / ours "
                  "| CUDA-graph replay (+transfers) | replay+transfers / ours | layers |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in (r for r in rows if r["tag"] == tag):
            mode = f" ({r['mnn_mode']}: {mnn.mode_name(int(r['mnn_mode']))})" if r["mnn_mode"] else ""
            says = (r["compile_says"] or "").split("tuned layers from the log")
            layers = ("tuned from the log" + says[1]) if len(says) > 1 else "–"
            lines.append(f"| {r['model']} | {harness.ms(r['native_s'])} | {harness.ms(r['python_s'])} | {harness.ms(r['mnn_s'])}{mode} | "
                         f"{_x(r['mnn_over_native'])} | {harness.ms(r['ort_s'])}{' (' + r['ort_provider'].replace('ExecutionProvider', '') + ')' if r['ort_provider'] else ''} | "
                         f"{_x(r['ort_over_native'])} | {harness.ms(r['torch_graph_s'])} ({harness.ms(r['torch_graph_io_s'])}) | "
                         f"{_x(r['graph_io_over_native'])} | {(says[0].split(': ')[-1] + layers) if r['compile_says'] else '–'} |")
        lines += ["", "| model | MNN modes (ms) | rel. err. vs onnxruntime CPU: native / Python / ORT | errors |",
                  "| --- | --- | --- | --- |"]
        for r in (r for r in rows if r["tag"] == tag):
            modes = json.loads(r["mnn_modes_s"]) if r["mnn_modes_s"] else {}
            ms = ", ".join(f"{m} {mnn.mode_name(int(m))}: {harness.ms(v)}" for m, v in modes.items())
            e = harness.sci
            lines.append(f"| {r['model']} | {ms or '–'} | {e(r['native_rel_err'])} / {e(r['python_rel_err'])} / "
                         f"{e(r['ort_rel_err'])} | {(r['errors'] or '')[:400]} |")
        lines.append("")
    (out / "peers.md").write_text("\n".join(lines) + "\n")


def cmd_table(args) -> int:
    out = Path(args.out)
    write_tables(json.loads((out / "peers.json").read_text()), out)
    print((out / "peers.md").read_text())
    return 0


# -- tuning the remaining tasks ------------------------------------------------------------------------------------
def remaining_tasks(models: list, work: Path, device: str, own_logs: list, sibling_logs: list,
                    transfer_from: str, trials: int, scope: str = "auto") -> tuple:
    """Every model's tasks as the auto plan deploys them with this device's logs and the siblings' records
    (one task per node, no alternatives), unique over the models; ``todo``: those with no record of a sibling
    and fewer than ``trials`` on this device."""
    from tuner.compile.compiler import load_graph
    from tuner.scheduler.model import _history
    from tuner.logs.index import LogIndex
    from tuner.plan.lower import extract_tasks, lower_graph, plan_storage
    from tuner.runtime.opencl.device import choose_device
    info = choose_device(device)
    siblings = [s for s in transfer_from.split(",") if s]
    history = _history(own_logs[0], info, siblings)  # own_logs[0]'s folder holds the siblings' logs too
    own = [LogIndex.of_log(p).on(info.fingerprint) for p in own_logs]
    sib = [LogIndex.of_log(p).on(fp) for fp in siblings for p in sibling_logs]
    seen, out = {}, []
    for name in models:
        plan = lower_graph(load_graph(str(work / "models" / f"{name}.onnx")), "float32")
        for t in extract_tasks(plan_storage(plan, info, scope, history if scope == "auto" else None),
                               alternatives=False):
            key = t.record_key("")
            if key in seen:
                seen[key]["models"].append(name)
                continue
            row = {"task": t, "models": [name], "own": sum(d.count(t) for d in own),
                   "sibling": sum(d.count(t) for d in sib)}
            seen[key] = row
            out.append(row)
    todo = [r for r in out if r["sibling"] == 0 and r["own"] < trials]
    return info, out, todo


def cmd_tune(args) -> int:
    """Tune every model's remaining tasks (``remaining_tasks``) with at most ``--trials`` measurements each, in
    ``--gpus`` processes (one per GPU: CUDA_VISIBLE_DEVICES=i), each with its own log under --tune-log-dir
    (part<i>.jsonl; the siblings' logs are copied there, where the history looks for them). The parent lists
    the tasks once and hands each worker its share (pickled), heaviest first, round robin."""
    import pickle
    import shutil
    work, logdir = Path(args.work), Path(args.tune_log_dir)
    logdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.part is None:  # the parent: list, then start the workers and wait
        sib_logs = []
        for p in args.sibling_logs.split(","):
            dest = logdir / Path(p).name
            if not dest.exists():
                shutil.copy(p, dest)
            sib_logs.append(str(dest))
        own_logs = [str(p) for p in sorted(logdir.glob("part*.jsonl"))] or [str(logdir / "part0.jsonl")]
        info, allt, todo = remaining_tasks(args.models.split(","), work, args.device, own_logs, sib_logs,
                                           args.transfer_from, args.trials, args.scope)
        desc = [{"template": r["task"].template, "workload": str(r["task"].workload.key()), "scopes": r["task"].scopes,
                 "models": r["models"], "own": r["own"], "sibling": r["sibling"], "weight": r["task"].weight,
                 "todo": r in todo} for r in allt]
        per_model = {m: {"tasks": sum(m in r["models"] for r in allt), "todo": sum(m in r["models"] for r in todo)}
                     for m in args.models.split(",")}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        harness.save_json(Path(args.out) / f"tune_tasks_{args.scope}.json", {"device": info.fingerprint, "per_model": per_model,
                                                   "tasks": desc, "todo": len(todo), "trials": args.trials})
        print(f"tune: {len(allt)} tasks in {args.models} ({json.dumps(per_model)}); {len(todo)} remaining (no "
              f"record of {args.transfer_from}, fewer than {args.trials} here); at most {args.trials} trials each; "
              f"{args.gpus} processes", flush=True)
        todo.sort(key=lambda r: -r["task"].weight)
        for i in range(args.gpus):
            with open(logdir / f"todo{i}.pkl", "wb") as f:
                pickle.dump([(r["task"], r["own"]) for r in todo[i::args.gpus]], f)
        procs = []
        for i in range(args.gpus):
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            if args.gpus > 1:
                env["CUDA_VISIBLE_DEVICES"] = str(i)
            cmd = [sys.executable, "-P", Path(__file__).resolve(), *(sys.argv[1:] if argv_tail() else []), "--part", str(i)]
            procs.append(subprocess.Popen(list(map(str, cmd)), env=env, stdout=open(logdir / f"part{i}.txt", "a"),
                                          stderr=subprocess.STDOUT))
        rcs = [p.wait() for p in procs]
        print(f"tune: workers exited {rcs} after {time.time() - t0:.0f} s", flush=True)
        return max(rcs) if rcs else 0
    from tuner.measure import MeasureOptions, open_runner
    from tuner.runtime.opencl.device import choose_device
    from tuner.search.tune import tune
    info = choose_device(args.device)
    with open(logdir / f"todo{args.part}.pkl", "rb") as f:
        mine = pickle.load(f)
    log = str(logdir / f"part{args.part}.jsonl")
    print(f"part {args.part}: {len(mine)} tasks on {info.name} ({info.fingerprint}), {args.build_workers} build "
          f"processes", flush=True)
    options = MeasureOptions(n_parallel=args.build_workers)
    measurer = open_runner(info, options)  # one set of worker processes for every task, as tune_model does
    try:
        _tune_part(args, info, mine, log, options, measurer, tune, t0)
    finally:
        measurer.close()
    return 0


def _tune_part(args, info, mine, log, options, measurer, tune, t0) -> None:
    for j, (t, own) in enumerate(mine):
        if time.time() - t0 > args.deadline:
            print(f"part {args.part}: deadline after {j} of {len(mine)} tasks", flush=True)
            break
        t1 = time.time()
        try:
            res = tune(t.template, t.workload, info, trials=max(1, args.trials - own), log=log, scopes=t.scopes,
                       fixed=t.fixed, progress=False, fallback_first=True, options=options, measurer=measurer,
                       transfer_from=[s for s in args.transfer_from.split(",") if s])
            print(f"part {args.part} task {j + 1}/{len(mine)} {t.template} {t.workload.key()['data']} {t.scopes}: "
                  f"{res.measured} measured in {time.time() - t1:.0f} s", flush=True)
        except Exception as e:  # one task's failure is reported, the others still run
            print(f"part {args.part} task {j + 1}: {type(e).__name__}: {e}"[:400], flush=True)


def argv_tail() -> bool:
    return len(sys.argv) > 1 and sys.argv[1] == "tune"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "table", "ort-one", "tune"):
        s = sub.add_parser(name)
        s.add_argument("--out", default="/tmp/peers_out")
        s.add_argument("--work", default="/tmp/peers_work")
        s.add_argument("--device", default="nvidia")
        s.add_argument("--models", default="resnet18,mobilenet_v2")
        s.add_argument("--input-size", type=int, default=224)
        s.add_argument("--repeats", type=int, default=50)
        s.add_argument("--warmup", type=int, default=10)
        s.add_argument("--rounds", type=int, default=3)
        s.add_argument("--log", default=None, help="run: tuning log(s), a file or glob, for `tuner compile`")
        s.add_argument("--transfer-from", default="", help="sibling fingerprints (compile and tune)")
        s.add_argument("--scope", default="auto")
        s.add_argument("--plan-timer", choices=("python", "native"), default="python",
                       help="run: with --scope auto, `tuner compile --plan-timer` (native: the plans timed by tuner-run, "
                       "the side these runs measure; python, the default, as the committed results were made)")
        s.add_argument("--tag", default="run", help="run: the name of this run's rows (untuned, tuned, ...)")
        s.add_argument("--sides", default="native,python,mnn,ort,torch")
        s.add_argument("--deadline", type=float, default=3600.0, help="seconds; later measurements are skipped")
        s.add_argument("--mnn-src", default=str(REPO / ".mnn" / "mnn-src.tgz"))
        s.add_argument("--mnn-wheel", default=None)
        s.add_argument("--mnn-build", default=str(REPO / ".mnn" / "build-peers"))
        s.add_argument("--mnn-modes", default="132,68,130,66")
        s.add_argument("--mnn-timeout", type=float, default=240.0, help="seconds for one benchmark.out run")
        s.add_argument("--mnn-vendor", default=None, help="an .icd file: MNN gets only this OpenCL vendor")
        s.add_argument("--trials", type=int, default=16, help="tune: at most this many measurements per task")
        s.add_argument("--gpus", type=int, default=1, help="tune: worker processes, one per GPU")
        s.add_argument("--build-workers", type=int, default=min(8, os.cpu_count() or 2),
                       help="tune: build processes per worker (MeasureOptions.n_parallel)")
        s.add_argument("--part", type=int, default=None, help=argparse.SUPPRESS)
        s.add_argument("--tune-log-dir", default="/tmp/peers_tune")
        s.add_argument("--sibling-logs", default=str(REPO / "logs" / "nvidia-gpu-fcae3850.jsonl"))
    args = p.parse_args(argv)
    if args.cmd == "run" and not args.mnn_wheel:
        wheels = sorted((REPO / ".mnn").glob("*.whl"))
        args.mnn_wheel = str(wheels[0]) if wheels else None
    return {"run": cmd_run, "table": cmd_table, "ort-one": cmd_ort_one, "tune": cmd_tune}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
