"""The ``se_gate`` configs of two sets of logs timed alternately in one process (issue 55): for every se_gate
task that ``--after``'s logs hold on this device, the best config of ``--before``'s logs, the best of
``--after``'s and the template's fallback for the device, each built and checked once, then timed in ``--rounds`` rounds
(the order reversed every other round), ``--repeats`` profiled runs a round; a config's time is the median of
its rounds' medians. Configs measured in different sessions drift on the H200 by more than the knobs' effect
(EfficientNet-B0's 1152-channel gate: 15.4 us best in one job, 19.6 us in the next), so the comparison is made
here, in one process. Writes se_gate_ab_<device>.csv and .md under ``--out``.

``--before`` must not hold the records of ``--after`` (once they are appended to the committed log, take the log
of the commit before: ``git show REV:logs/FILE > before.jsonl``), or before is after.

usage: python bench/se_gate_ab.py --before 'logs/*.jsonl' --after new.jsonl --device nvidia --out DIR"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run with python -P too: bench/gpu.sh)
import harness  # noqa: E402  (bench/harness.py: the CSV and markdown tables)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="logs (comma-separated globs): the configs before")
    p.add_argument("--after", required=True, help="logs (comma-separated globs): the configs after")
    p.add_argument("--device", default="nvidia")
    harness.add_round_args(p, 5, 50)
    args = p.parse_args(argv)
    from tuner.logs.best import ApplyHistoryBest
    from tuner.op import make_config, make_workload, prepared_op
    from tuner.runtime.opencl.device import open_device
    from tuner.templates import get_template
    dev = open_device(args.device)
    t = get_template("se_gate")
    before, after = ApplyHistoryBest(args.before.split(",")), ApplyHistoryBest(args.after.split(","))
    tasks = {}
    for r in after.records:
        if r.template == "se_gate" and r.device == dev.fingerprint and r.ok:
            tasks.setdefault(json.dumps([r.workload, r.scopes], sort_keys=True), (r.workload, r.scopes))
    rows = []
    for key, (wk, scopes) in sorted(tasks.items()):
        wl = make_workload(t, **{k: v for k, v in wk.items() if k != "op"})
        configs = {"fallback": make_config(t, wl, dev, **{f"{k}_scope": v for k, v in scopes.items()})}
        for name, hist in (("before", before), ("after", after)):
            rec = hist.query("se_gate", wk, dev.fingerprint, scopes)
            if rec is not None:
                configs[name] = t.make_config(rec.config)
        if set(configs) != {"fallback", "before", "after"}:
            continue
        timers = {}
        for m, cfg in configs.items():  # each built and checked once, then timed in every round
            res, timers[m] = prepared_op(t, wl, cfg, dev)
            if not res.ok:
                print(f"{t.label(wl)} {m}: error {res.max_rel_error}", file=sys.stderr)
        us = {m: v * 1e6 for m, v in harness.alternating_medians(timers, args.rounds, args.repeats).items()}
        row = {"task": t.label(wl), "scope": scopes.get("input"), **{f"{m}_us": round(v, 2) for m, v in us.items()},
               "after_vs_before": round(us["before"] / us["after"], 3),
               "before_config": json.dumps({k: v for k, v in configs["before"].__dict__.items() if "scope" not in k}),
               "after_config": json.dumps({k: v for k, v in configs["after"].__dict__.items() if "scope" not in k})}
        rows.append(row)
        print(f"{row['task']} [{row['scope']}]: before {us['before']:.1f} us, after {us['after']:.1f} us, "
              f"fallback {us['fallback']:.1f} us ({row['after_vs_before']}x)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"se_gate_ab_{dev.info.name.replace(' ', '_')}"
    if rows:
        harness.write_csv(Path(f"{stem}.csv"), rows)
        lines = harness.md_table(rows, ["task", "scope", "before_us", "after_us", "fallback_us", "after_vs_before"])
        total = {m: sum(r[f"{m}_us"] for r in rows) for m in ("before", "after", "fallback")}
        lines.append(f"| all {len(rows)} tasks | | {total['before']:.1f} | {total['after']:.1f} | "
                     f"{total['fallback']:.1f} | {total['before'] / total['after']:.3f} |")
        Path(f"{stem}.md").write_text(f"{dev.info.name}: {args.rounds} alternating rounds, median of "
                                      f"{args.repeats} runs each\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
