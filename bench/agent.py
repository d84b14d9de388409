"""The device agent against the local backend, on one device in one run: tuning throughput (trials per minute:
measurements through ``AgentRuntime`` over ``exec://build/native/tuner-agent`` against the local
``Measurer``'s worker processes) and each kernel's time as each measures it.

    python bench/agent.py [--device D] [--trials 12] [--repeats 3] [--out bench/results]

Throughput: per workload, ``--trials`` distinct random valid configs measured by each backend, in batches of
``n_parallel`` as ``tune`` sends them, the backends' order alternating from workload to workload. Each backend
has caches of its own, empty at the start (PoCL's kernel cache ``POCL_CACHE_DIR``; the local workers'
``XDG_CACHE_HOME``, where pyopencl keeps binaries; the agent's work directory), so neither compiles faster for
what the other compiled. Kernel time: ``--timed`` of those configs measured on both again (caches warm), the
median of each one's timed runs, the two alternating ``--repeats`` times. Writes
bench/results/agent_<fingerprint>.csv (one row per config and backend) and .md (the summary)."""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = [  # (label, template, workload args)
    ("conv2d 3x3 32->32 28x28", "conv2d", ((1, 32, 28, 28), (32, 32, 3, 3)), {"padding": 1}),
    ("conv2d 1x1 64->64 14x14", "conv2d", ((1, 64, 14, 14), (64, 64, 1, 1)), {}),
    ("depthwise 3x3 64 28x28", "depthwise_conv2d", ((1, 64, 28, 28), (64, 1, 3, 3)), {"padding": (1, 1, 1, 1)}),
    ("dense 1x512 -> 256", "dense", ((1, 512), (256, 512)), {}),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="a local device spec (the agent opens the same index)")
    ap.add_argument("--trials", type=int, default=16, help="configs per workload, measured by each backend")
    ap.add_argument("--timed", type=int, default=4, help="configs per workload timed on both (kernel time)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating repeats of the kernel-time pass")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="bench-agent-"))

    import tuner
    from tuner.agent import AgentRuntime
    from tuner.measure import MeasureInput, MeasureOptions, Measurer
    from tuner.measure.runtime_runner import RuntimeRunner
    from tuner.native import build
    from tuner.runtime.opencl.device import choose_device

    info = choose_device(args.device)
    agent = build()["agent"]
    options = MeasureOptions()  # the tuner's defaults: 1 warm-up, 5 repeats, 20 ms, 2 builders
    base_env = dict(os.environ)

    def own_caches(name: str) -> None:
        """The environment the backend's processes start with: caches of their own (read when a process
        starts: the agent just below; the local workers, started on first use, see the local one)."""
        os.environ.clear()
        os.environ.update(base_env, POCL_CACHE_DIR=str(scratch / name / "pocl"),
                          XDG_CACHE_HOME=str(scratch / name / "cache"))

    local = Measurer(info, options)
    own_caches("agent")
    rt = AgentRuntime(f"exec://{agent} --work-dir {scratch / 'agent' / 'work'}?device={info.index}")
    assert rt.info.fingerprint == info.fingerprint
    remote = RuntimeRunner(rt, options)
    own_caches("local")
    backends = {"local": local, "agent": remote}
    rng = np.random.default_rng(0)
    rows, summary = [], []

    def run(runner, template, wl, cfgs) -> tuple:
        start, out = time.perf_counter(), []
        for i in range(0, len(cfgs), options.n_parallel):  # batches as tune() sends them
            out += runner.measure([MeasureInput(template, wl, c) for c in cfgs[i:i + options.n_parallel]])
        return time.perf_counter() - start, out

    # warm both: worker processes started, the agent's executor up, each template imported (not timed)
    for name, runner in backends.items():
        t0 = tuner.get_template("dense")
        wl0 = t0.workload((1, 8), (8, 8))
        run(runner, "dense", wl0, [t0.fallback(wl0, info)])

    try:
        for n_wl, (label, template, shapes, kw) in enumerate(WORKLOADS):
            t = tuner.get_template(template)
            wl = t.workload(*shapes, **kw)
            space = t.space(wl, info)
            seen, cfgs = set(), []
            for _ in range(50 * args.trials):
                values = space.sample(rng)
                key = tuple(sorted(values.items()))
                if key not in seen:
                    seen.add(key)
                    cfgs.append(t.make_config(values))
                if len(cfgs) == args.trials:
                    break
            split = {"local": cfgs, "agent": cfgs}
            tput, results = {}, {}
            for name in (("local", "agent") if n_wl % 2 == 0 else ("agent", "local")):
                seconds, res = run(backends[name], template, wl, split[name])
                results[name] = res
                tput[name] = (len(res) / seconds * 60.0, sum(r.ok for r in res), len(res))
                for c, r in zip(split[name], res):
                    rows.append({"workload": label, "backend": name, "pass": "throughput", "config": repr(c),
                                 "error": r.error_code.name, "median_us": (r.median or 0) * 1e6,
                                 "max_rel_error": r.max_rel_error, "duration_s": round(r.duration_s, 4)})
            # kernel time: the same configs on both, alternating, caches warm
            timed = [c for c, r in zip(split["local"], results["local"]) if r.ok][:args.timed]
            medians: dict = {"local": [[] for _ in timed], "agent": [[] for _ in timed]}
            for rep in range(args.repeats):
                for name in (("local", "agent") if rep % 2 == 0 else ("agent", "local")):
                    _, res = run(backends[name], template, wl, timed)
                    for k, r in enumerate(res):
                        if r.ok:
                            medians[name][k].append(r.median)
            ratios = []
            for k, c in enumerate(timed):
                lo, ag = (statistics.median(medians[n][k]) if medians[n][k] else None for n in ("local", "agent"))
                if lo and ag:
                    ratios.append(ag / lo)
                for n, v in (("local", lo), ("agent", ag)):
                    rows.append({"workload": label, "backend": n, "pass": "kernel", "config": repr(c),
                                 "error": "NO_ERROR" if v else "FAILED", "median_us": (v or 0) * 1e6,
                                 "max_rel_error": None, "duration_s": None})
            summary.append({"workload": label, "local_tpm": tput["local"][0], "agent_tpm": tput["agent"][0],
                            "ok": f"{tput['local'][1]}/{tput['local'][2]} / {tput['agent'][1]}/{tput['agent'][2]}",
                            "kernel_ratio": statistics.median(ratios) if ratios else None,
                            "kernel_ratio_range": (min(ratios), max(ratios)) if ratios else None,
                            "timed": len(ratios)})
            s = summary[-1]
            print(f"{label}: {s['local_tpm']:.1f} vs {s['agent_tpm']:.1f} trials/min "
                  f"({s['agent_tpm'] / s['local_tpm']:.0%}); agent/local kernel time {s['kernel_ratio']}", flush=True)
    finally:
        local.close()
        remote.close()
        rt.close()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"agent_{info.fingerprint}"
    with open(f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# The device agent against the local backend on {info.platform} / {info.name} ({info.fingerprint})",
             "",
             f"`python bench/agent.py --trials {args.trials} --timed {args.timed} --repeats {args.repeats}`: "
             f"{time.strftime('%Y-%m-%d')}, this machine ({os.cpu_count()} cores, shared with other work). "
             "Throughput: the same distinct random valid configs on each backend, measured with the tuner's "
             "defaults (1 warm-up, 5 repeats, at least 20 ms, batches of 2), each backend with empty caches of its "
             "own (PoCL's kernel cache, pyopencl's binaries, the agent's work directory), the order alternating. Kernel time: the same configs on both, median of the timed runs, alternating "
             "repeats; ratio = agent / local.",
             "",
             "| workload | local trials/min | agent trials/min | agent / local | ok (local / agent) "
             "| kernel time agent / local (median, range, configs) |",
             "| --- | ---: | ---: | ---: | --- | --- |"]
    for s in summary:
        rng_txt = (f"{s['kernel_ratio']:.3f} ({s['kernel_ratio_range'][0]:.3f}-{s['kernel_ratio_range'][1]:.3f}, "
                   f"{s['timed']})") if s["kernel_ratio"] else "n/a"
        lines.append(f"| {s['workload']} | {s['local_tpm']:.1f} | {s['agent_tpm']:.1f} | "
                     f"{s['agent_tpm'] / s['local_tpm']:.0%} | {s['ok']} | {rng_txt} |")
    lt = statistics.fmean(s["local_tpm"] for s in summary)
    at = statistics.fmean(s["agent_tpm"] for s in summary)
    lines += ["", f"Mean over workloads: local {lt:.1f}, agent {at:.1f} trials/min ({at / lt:.0%}; goal >= 90%).", "",
              "Where the time goes (PoCL): the local path lowers and builds each config twice (a build worker, "
              "then the run worker, from pyopencl's cache) and pyopencl fetches every program's binary for its "
              "cache, which PoCL compiles again to give; the agent builds once, lowers once on the host while the "
              "device measures the previous config, and keeps a binary only when asked (a model's load). Its "
              "builds are not parallel (one executor), the local builders are (2 processes). Kernel times are "
              "the same kernels' device timestamps both ways: a ratio away from 1 is this shared machine's "
              "noise."]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {stem}.csv and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
