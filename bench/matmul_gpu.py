"""The matmul template on attention shapes against PyTorch's ``torch.bmm`` (cuBLAS, TF32 off), on a GPU through
OpenCL (issue 27). The shapes are the Q @ K^T and P @ V products of MobileViT-XXS (256x256) and PVT-v2-B0
(224x224), as ``tuner compile`` lowers them (``SHAPES``).

    python bench/matmul_gpu.py tune  --out DIR [--trials 40] [--deadline 420]  # ours: tuned, resumable (the log)
    python bench/matmul_gpu.py torch --out DIR                                  # torch.bmm on the same shapes
    python bench/matmul_gpu.py table --out DIR                                  # -> matmul_gpu.{csv,md}

bench/matmul_gpu.sh runs all three on the GPU machine. Ours is the tuned kernel's median execution time from
OpenCL profiling events (the log's ``median_s``: the template's own measurement); torch.bmm's is its GPU kernel
time from CUPTI (torch.profiler, ``gpu._kernel_time``: execution only, as profiling events are), and, as a
second column, CUDA events around one call (launch included). ratio = torch / ours (above 1: ours is faster).
Float32 storage and arithmetic on both sides; each side in its own process.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# (model, product, a (B, M, K), b (B, K, N), alpha)
SHAPES = [
    ("mobilevit_xxs", "Q@K^T", (16, 196, 16), (16, 16, 196), 0.25),
    ("mobilevit_xxs", "P@V", (16, 196, 196), (16, 196, 16), 1.0),
    ("mobilevit_xxs", "Q@K^T", (16, 49, 20), (16, 20, 49), 20 ** -0.5),
    ("mobilevit_xxs", "P@V", (16, 49, 49), (16, 49, 20), 1.0),
    ("pvt_v2_b0", "Q@K^T", (1, 3136, 32), (1, 32, 49), 32 ** -0.5),
    ("pvt_v2_b0", "P@V", (1, 3136, 49), (1, 49, 32), 1.0),
    ("pvt_v2_b0", "Q@K^T", (2, 784, 32), (2, 32, 49), 32 ** -0.5),
    ("pvt_v2_b0", "P@V", (5, 196, 49), (5, 49, 32), 1.0),
]


def _workload(a, b, alpha):
    from tuner.templates import get_template
    return get_template("matmul").workload(a=a, b=b, alpha=alpha)


def cmd_tune(args) -> int:
    from tuner.measure import MeasureOptions, Measurer
    from tuner.runtime.opencl.device import choose_device
    from tuner.search.tune import tune
    info = choose_device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = str(out / "matmul_gpu.jsonl")
    options = MeasureOptions(repeats=args.repeats, min_seconds=0.0)
    t0 = time.time()
    with Measurer(info, options) as measurer:
        for k, (model, what, a, b, alpha) in enumerate(SHAPES):
            if time.time() - t0 > args.deadline:
                print(f"deadline: {k} of {len(SHAPES)} shapes tuned", flush=True)
                break
            for scope in args.scopes.split(","):
                scopes = {"input": scope, "weight": scope, "output": scope}
                r = tune("matmul", _workload(a, b, alpha), info, trials=args.trials, log=log, scopes=scopes,
                         storage="sqlite:////tmp/matmul_gpu_studies.db", sampler="xgb", seed=0, options=options,
                         progress=False, measurer=measurer)
                best = f"{r.best.median_s * 1e6:.2f} us" if r.best else "no success"
                print(f"[{time.time() - t0:5.0f}s] {model} {what} {a}x{b} {scope}: {r.measured} new, best {best}",
                      flush=True)
    print(json.dumps({"device": info.name, "fingerprint": info.fingerprint, "log": log}))
    (out / "matmul_gpu_device.json").write_text(json.dumps({"device": info.name, "fingerprint": info.fingerprint}))
    return 0


def cmd_torch(args) -> int:
    import torch

    from gpu import _cuda_time, _gpu_name, _kernel_time, _tdev, _torch_fp32
    _torch_fp32()
    dev = _tdev()
    rows = []
    for model, what, a, b, alpha in SHAPES:
        x = torch.randn(a, device=dev)
        y = torch.randn(b, device=dev)
        fn = (lambda x=x, y=y, alpha=alpha: torch.bmm(x, y).mul_(alpha)) if alpha != 1.0 else \
            (lambda x=x, y=y: torch.bmm(x, y))
        rows.append({"model": model, "product": what, "a": "x".join(map(str, a)), "b": "x".join(map(str, b)),
                     "torch_kernel_s": _kernel_time(fn), "torch_event_s": _cuda_time(fn), "gpu": _gpu_name(),
                     "torch": torch.__version__})
        print(rows[-1], flush=True)
    _write(Path(args.out) / "matmul_gpu_torch.csv", rows)
    return 0


def _write(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def cmd_table(args) -> int:
    from tuner.logs import load_records
    out = Path(args.out)
    torch_rows = {(r["a"], r["b"]): r for r in csv.DictReader(open(out / "matmul_gpu_torch.csv"))}
    device = json.loads((out / "matmul_gpu_device.json").read_text())
    best: dict = {}
    for rec in load_records(str(out / "matmul_gpu.jsonl")):
        if not rec.ok:
            continue
        key = ("x".join(map(str, rec.workload["a"])), "x".join(map(str, rec.workload["b"])))
        scope = rec.scopes.get("input", "?")
        if rec.median_s < best.get((key, scope), (float("inf"),))[0]:
            best[(key, scope)] = (rec.median_s, rec.config)
    rows = []
    for model, what, a, b, _ in SHAPES:
        key = ("x".join(map(str, a)), "x".join(map(str, b)))
        t = torch_rows.get(key)
        for scope in ("texture", "buffer"):
            ours = best.get((key, scope))
            if ours is None or t is None:
                continue
            tk = float(t["torch_kernel_s"])
            rows.append({"model": model, "product": what, "a": key[0], "b": key[1], "scope": scope,
                         "ours_us": round(ours[0] * 1e6, 2), "torch_kernel_us": round(tk * 1e6, 2),
                         "torch_event_us": round(float(t["torch_event_s"]) * 1e6, 2),
                         "ratio": round(tk / ours[0], 2), "device": device["device"], "gpu": t["gpu"]})
    _write(out / "matmul_gpu.csv", rows)
    lines = [f"matmul template (tuned) vs torch.bmm (cuBLAS, TF32 off), float32, {rows[0]['gpu'] if rows else '?'} "
             f"(OpenCL: {device['device']}); ratio = torch kernel / ours, above 1: ours faster", "",
             "| model | product | A | B | scope | ours (us) | torch.bmm kernel (us) | torch.bmm call (us) | ratio |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['product']} | {r['a']} | {r['b']} | {r['scope']} | {r['ours_us']} | "
              f"{r['torch_kernel_us']} | {r['torch_event_us']} | {r['ratio']} |" for r in rows]
    (out / "matmul_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune")
    t.add_argument("--out", required=True)
    t.add_argument("--device", default=None)
    t.add_argument("--trials", type=int, default=40)
    t.add_argument("--repeats", type=int, default=20)
    t.add_argument("--scopes", default="texture,buffer")
    t.add_argument("--deadline", type=float, default=420.0)
    for name in ("torch", "table"):
        sub.add_parser(name).add_argument("--out", required=True)
    args = p.parse_args(argv)
    return {"tune": cmd_tune, "torch": cmd_torch, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
