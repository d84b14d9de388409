"""Host work per model run: enqueuing every kernel with its arguments set on each call (pyopencl's
``Kernel.__call__``, the old path) against arguments set once at load and a bare enqueue (``Module._enqueue``).

    python bench/host_overhead.py [--model mobilenet_v3_small] [--input-size 64] [--runs 200] [--device D]

Times only the host side of enqueuing all of a model's kernels (``time.perf_counter`` around the enqueue loop,
the queue drained after each run and not counted), median over ``--runs``, both paths on the same Module in
alternating runs. Writes bench/results/host_overhead_<fingerprint>.csv and .md."""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v3_small")
    ap.add_argument("--input-size", type=int, default=64)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)

    import pyopencl as cl

    import tuner
    from tuner.zoo import models as zoo
    model = zoo.ZOO[args.model](input_size=args.input_size)
    mod = tuner.compile_model(model, device=args.device, scope="buffer")
    x = np.random.default_rng(0).standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    mod.run([x])
    q = mod.device.run_queue  # the queue a run enqueues on (Module._enqueue)
    old = [(cl.Kernel(k.program, k.function_name), g, l, [mod.arrays[a].mem for a in c.args])
           for (i, k, g, l), c in zip(mod._launches, [c for n in mod.spec.nodes for c in n.calls])]

    def old_path():
        for k, g, l, mems in old:
            k(q, g, l, *mems)

    def new_path():
        mod._enqueue()

    times = {"set args per call (old)": [], "args set once (now)": []}
    for r in range(args.runs):
        for name, fn in (list(times.items()) if r % 2 == 0 else list(times.items())[::-1]):
            q.finish()
            t0 = time.perf_counter()
            (old_path if "old" in name else new_path)()
            fn.append(time.perf_counter() - t0)
            q.finish()
    n = len(mod._launches)
    rows = [{"path": k, "kernels": n, "median_us": statistics.median(v) * 1e6,
             "per_kernel_us": statistics.median(v) * 1e6 / n} for k, v in times.items()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"host_overhead_{mod.device.fingerprint}"
    with open(f"{stem}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = [f"{args.model} at {args.input_size}x{args.input_size} on {mod.device.info.name} ({mod.device.fingerprint}), "
          f"{n} kernels, host time to enqueue one run, median of {args.runs}", "",
          "| path | µs per run | µs per kernel |", "| --- | ---: | ---: |"]
    md += [f"| {r['path']} | {r['median_us']:.1f} | {r['per_kernel_us']:.2f} |" for r in rows]
    ratio = rows[0]["median_us"] / rows[1]["median_us"]
    md += ["", f"arguments set once: {ratio:.2f}x less host time per run"]
    Path(f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
