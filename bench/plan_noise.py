"""How steady is the timing that picks ``--scope auto``'s plan? (issue #26: on an H100 one EfficientNet-B0
texture plan timed 1.406 ms in one compile process and 3.866 ms in the next.)

``compile_model(scope="auto")`` times the per-layer plan and both uniform plans whole, in one process, in
``PLAN_ROUNDS`` alternating rounds, and keeps the fastest. This script separates the noise that choice meets:

1. ``compile MODEL --out DIR``: the three plans as artifacts (``DIR/auto``: the per-layer plan without the
   timing, ``DIR/texture``, ``DIR/buffer``), compiled once, so that every later process runs the same kernels.
2. ``together DIR``: one process loads all three (Python executor) and times them in ``--rounds`` alternating
   rounds (``Module.time``: kernels only, inputs on the device), as ``fastest_plan`` does.
3. ``alone DIR --plan P``: one process loads only plan P and times it the same way.
4. ``kernels DIR``: as ``together``, each plan's time the sum of its kernels' profiling-event times.
5. ``native DIR --exe tuner-run``: each plan in its own ``tuner-run --bench`` process (whole runs with
   transfers), ``--rounds`` processes each, the plans alternating.
6. ``table DIR``: per way of timing, each plan's median, the spread within a process (max/min of its rounds)
   and between processes (max/min of the processes' medians), and how often each plan came out fastest.

Every step appends its JSON lines to ``DIR/times.jsonl``; ``table`` writes ``DIR/plan_noise.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


PLANS = ("auto", "texture", "buffer")


def _append(d: Path, row: dict) -> None:
    with open(d / "times.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def cmd_compile(a) -> int:
    from tuner.compile.compiler import compile_model
    d = Path(a.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "times.jsonl").unlink(missing_ok=True)  # new artifacts: the earlier timings are of other kernels
    for plan in PLANS:
        t0 = time.perf_counter()
        mod = compile_model(a.model, log=a.log, device=a.device, scope=plan, measure_plans=False,
                            transfer_from=a.transfer_from)
        mod.save(d / plan)
        print(f"{plan}: {len(mod.spec.nodes)} nodes, saved in {time.perf_counter() - t0:.1f} s", flush=True)
    if len(mod.spec.inputs) != 1:
        print(f"{a.model} has {len(mod.spec.inputs)} inputs: this script times one-input models", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal(mod.spec.entries[mod.spec.inputs[0]].shape).astype(np.float32)
    np.save(d / "x.npy", x)
    return 0


def _load(d: Path, plan: str, device):
    from tuner.runtime.module import load_module
    mod = load_module(d / plan, device=device).load()
    mod.set_inputs([np.load(d / "x.npy")])
    return mod


def _in_rounds(plans: list, rounds: int, measure) -> dict:
    """``{plan: [measure(plan, round) per round]}``, the plans in alternating order round by round (as
    ``fastest_plan``)."""
    out = {p: [] for p in plans}
    for r in range(rounds):
        for p in (plans if r % 2 == 0 else plans[::-1]):
            out[p].append(measure(p, r))
    return out


def cmd_time(a, plans) -> int:
    d = Path(a.dir)
    mods = {p: _load(d, p, a.device) for p in plans}
    rounds = _in_rounds(plans, a.rounds, lambda p, _: statistics.median(mods[p].time(a.repeats)))
    _append(d, {"way": "together" if len(plans) > 1 else "alone", "pid": os.getpid(), "rounds_s": rounds})
    return 0


def cmd_kernels(a) -> int:
    """As ``together``, but each round a plan's time is the sum of its kernels' times from profiling events
    (``Module.profile``: device time, no host enqueue cost)."""
    d = Path(a.dir)
    mods = {p: _load(d, p, a.device) for p in PLANS}
    rounds = _in_rounds(list(PLANS), a.rounds, lambda p, _: mods[p].profile(a.repeats)["kernel_total_s"])
    _append(d, {"way": "kernels", "pid": os.getpid(), "rounds_s": rounds})
    return 0


def cmd_native(a) -> int:
    """Each timing one ``tuner-run --bench`` process (``tuner.native.bench_artifact``: its fixed pseudo-random
    input, this host's OpenCL environment), a JSON line per timing."""
    from tuner.native import bench_artifact
    d = Path(a.dir)

    def one(plan: str, r: int) -> float:
        s = bench_artifact(d / plan, a.device, repeats=a.repeats, warmup=5, exe=a.exe)
        _append(d, {"way": "native", "round": f"{os.getpid()}.{r}", "rounds_s": {plan: [s]}})
        return s

    _in_rounds(list(PLANS), a.rounds, one)
    return 0


def cmd_table(a) -> int:
    d = Path(a.dir)
    rows = [json.loads(x) for x in (d / "times.jsonl").read_text().splitlines() if x.strip()]
    lines = [f"# Timing the candidate plans: {d.name}", "",
             "Milliseconds. `together`: one process holding all three plans, alternating rounds (what `fastest_plan` "
             "does); `alone`: a process holding one plan; `kernels`: as together, the sum of the kernels' profiling-event "
             "times; `native`: one `tuner-run --bench` process per time (whole "
             "runs, transfers included). Within: max/min of one process's rounds (the median over processes); "
             "between: max/min of the processes' medians.", "",
             "| way | plan | processes | median | within | between | fastest in |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for way in ("together", "alone", "kernels", "native"):
        rs = [r for r in rows if r["way"] == way]
        if not rs:
            continue
        wins = {}
        for r in rs if way in ("together", "kernels") else []:
            meds = {p: statistics.median(v) for p, v in r["rounds_s"].items()}
            best = min(meds, key=meds.get)
            wins[best] = wins.get(best, 0) + 1
        if way == "native":  # one round: every plan timed once, the fastest of the round counts
            by_round = {}
            for r in rs:
                for p, v in r["rounds_s"].items():
                    by_round.setdefault(r["round"], {})[p] = v[0]
            for meds in by_round.values():
                if len(meds) == len(PLANS):
                    best = min(meds, key=meds.get)
                    wins[best] = wins.get(best, 0) + 1
        total = sum(wins.values())
        for p in PLANS:
            per = [v for r in rs for q, v in r["rounds_s"].items() if q == p]
            if not per:
                continue
            meds = [statistics.median(v) for v in per]
            within = statistics.median(max(v) / min(v) for v in per)
            lines.append(f"| {way} | {p} | {len(per)} | {statistics.median(meds) * 1e3:.3f} | "
                         + (f"{within:.2f}" if way != "native" else "–")
                         + f" | {max(meds) / min(meds):.2f} | " + (f"{wins.get(p, 0)}/{total}" if total else "–") + " |")
    (d / "plan_noise.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("model")
    c.add_argument("--out", required=True)
    c.add_argument("--log")
    c.add_argument("--transfer-from")
    for name in ("together", "alone", "kernels", "native", "table"):
        s = sub.add_parser(name)
        s.add_argument("dir")
        s.add_argument("--rounds", type=int, default=6)
        s.add_argument("--repeats", type=int, default=100)
        if name == "alone":
            s.add_argument("--plan", choices=PLANS, required=True)
        if name == "native":
            s.add_argument("--exe", required=True)
    for s in sub.choices.values():
        s.add_argument("--device", default="nvidia")
    a = p.parse_args(argv)
    if a.cmd == "compile":
        return cmd_compile(a)
    if a.cmd == "together":
        return cmd_time(a, list(PLANS))
    if a.cmd == "alone":
        return cmd_time(a, [a.plan])
    if a.cmd == "kernels":
        return cmd_kernels(a)
    if a.cmd == "native":
        return cmd_native(a)
    return cmd_table(a)


if __name__ == "__main__":
    sys.exit(main())
