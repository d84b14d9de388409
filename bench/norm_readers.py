"""What a convolution that normalizes what it reads costs, config by config (issue 55): for each workload, the
log's config of the plain convolution (as ``ApplyHistoryBest`` picks it for the reader, whose ``in_group_norm`` is
an epilogue field: ``logs.best.EPILOGUE``) and that config's neighbours along ``--knobs``, each built and checked
once without and with ``in_group_norm``, then timed in ``--rounds`` alternating rounds (the order reversed every
other round), ``--repeats`` profiled runs a round, in one process: a config's time is the median of its rounds'
medians (a variant that fails its check against NumPy is reported and not timed). On the H200 (2026-12-04)
gn32_resnet's six readers cost 38.5 us more than the plain convolutions with the same configs, 7.5-9.9 us each in
layers 3 and 4: this table says which part and which configs.

Each config is also timed with the norm's factors (each input block's mean, rstd * gamma and beta, from the
statistics) kept by the work-group in local memory (``kept``: ``Conv2dConfig.keep_norm_factors``), where each
work-item computes them for each block it reads (``reader``). A first version of this script (a910ea5, H100)
replaced the factors by two loads of the affine array (``cheap_factors``): that removed most of a reader's cost
at the plan's configs, so the factors were what cost.

Workloads: ``--preset gn32`` (gn32_resnet's readers: GroupNorm(32) and its ReLU applied as read, the statistics
in one chunk as a producer writes them) or ``--workload`` JSON fields (repeatable).

usage: python bench/norm_readers.py --preset gn32 --log 'logs/*.jsonl' --device nvidia --out DIR"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run with python -P too: bench/gpu.sh)
import harness  # noqa: E402  (bench/harness.py: the CSV and markdown tables)

GN32 = (32, 1, 1e-5, "relu")
PRESETS = {
    "gn32": [dict(data=(1, 128, 28, 28), kernel=(128, 128, 3, 3), padding=1, in_group_norm=GN32),
             dict(data=(1, 256, 14, 14), kernel=(256, 256, 3, 3), padding=1, in_group_norm=GN32),
             dict(data=(1, 512, 7, 7), kernel=(512, 512, 3, 3), padding=1, in_group_norm=GN32)],
}
KNOBS = {"vec_load": (1, 4), "tile_oc": (1, 2, 4), "split_k": (4, 8, 16, 32), "split_c": (1, 2, 4),
         "local_input": (True,)}
BUFFER = {"input": "buffer", "weight": "buffer", "output": "buffer"}


def configs_of(t, reader, plain, info, history, knobs, given=()) -> dict:
    """name -> config: the reader's pick from the log (``plan``: the plain convolution's record, an epilogue
    apart), then each neighbour along ``knobs`` (one knob changed), then the ``given`` knob dicts (over the plan's
    config: ``given1``, ...), each valid for both workloads."""
    from tuner.logs.best import invalid_config
    from tuner.logs.record import scope_knobs
    fixed = {**scope_knobs(BUFFER), **t.model_knobs}
    rec = history.best_valid(t, reader, info, BUFFER, fixed) if history is not None else None
    base = t.config(**{**rec.config, **fixed}) if rec is not None else t.fallback_with(reader, info, **fixed)
    base = dataclasses.replace(base, keep_norm_factors=False)  # a reader's own record may keep them: the plain lacks
    out = {"plan": base}
    candidates = {}  # name -> config, before the validity check
    for knob, values in KNOBS.items():
        for v in values if knob in knobs else ():
            cfg = dataclasses.replace(base, **{knob: v})
            candidates[f"{knob}={v}"] = cfg
            if knob == "local_input":  # staged (no split), also with one output block and row a work-item
                cfg = candidates[f"{knob}={v}"] = dataclasses.replace(cfg, split_k=1, vec_load=4)
                candidates[f"{knob}={v},tile 1"] = dataclasses.replace(cfg, tile_oc=1, tile_oh=1, tile_ow=1)
    for i, g in enumerate(given, 1):
        candidates[f"given{i}"] = dataclasses.replace(base, **g)
    for name, cfg in candidates.items():
        valid = all(invalid_config(t, w, info, dataclasses.asdict(cfg)) is None for w in (plain, reader))
        if valid and cfg not in out.values():
            out[name] = cfg
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[])
    p.add_argument("--workload", action="append", default=[], help="conv2d workload fields as JSON, with "
                                                                      "in_group_norm")
    p.add_argument("--log", default="", help="logs (comma-separated globs): the plain convolutions' configs")
    p.add_argument("--device", default="nvidia")
    p.add_argument("--knobs", default=",".join(KNOBS),
                   help="the knobs whose neighbours are timed too (comma-separated; none: only the plan's config)")
    p.add_argument("--config", action="append", default=[],
                   help="knobs as JSON over the plan's config, timed too where valid (repeatable)")
    harness.add_round_args(p)
    args = p.parse_args(argv)
    from tuner.logs.best import invalid_config
    from tuner.op import prepared_op
    dev, t, history, fields = harness.conv2d_bench(p, args, PRESETS)
    modes = ("plain", "reader", "kept")
    rows = []
    for f in fields:
        reader = t.workload(**f)
        plain = dataclasses.replace(reader, in_group_norm=())
        configs = configs_of(t, reader, plain, dev.info, history, args.knobs.split(","),
                             [json.loads(c) for c in args.config])
        timers = {}
        for name, cfg in configs.items():
            kept = dataclasses.replace(cfg, keep_norm_factors=True)
            builds = {"plain": (plain, cfg), "reader": (reader, cfg), "kept": (reader, kept)}
            if invalid_config(t, reader, dev.info, dataclasses.asdict(kept)) is not None:
                del builds["kept"]  # the factors do not fit beside the config's own local memory
            for mode, (w, c) in builds.items():
                res, timer = prepared_op(t, w, c, dev)  # built and checked once
                if res.ok:
                    timers[(name, mode)] = timer
                else:  # not timed: its row says so
                    print(f"{t.label(w)} {name} {mode}: max relative error {res.max_rel_error}: not timed",
                          file=sys.stderr)
        times = harness.alternating_medians(timers, args.rounds, args.repeats)
        for name, cfg in configs.items():
            us = {m: round(times[(name, m)] * 1e6, 2) if (name, m) in times else None for m in modes}
            rows.append({"workload": t.label(reader), "config": name,
                         **{f"{m}_us": us[m] if us[m] is not None else "" for m in modes},
                         "read_norm_us": round(us["reader"] - us["plain"], 2)
                         if None not in (us["reader"], us["plain"]) else "",
                         "kept_saves_us": round(us["reader"] - us["kept"], 2)
                         if None not in (us["reader"], us["kept"]) else "",
                         "knobs": json.dumps({k: getattr(cfg, k) for k in ("tile_oc", "tile_oh", "tile_ow", "wg_w",
                                                                          "wg_h", "split_c", "split_k", "vec_load",
                                                                          "local_input")})})
            r = rows[-1]
            print(f"{r['workload']} [{name}]: " + ", ".join(f"{m} {us[m] if us[m] is not None else '-'}"
                                                           for m in modes) + f" us {r['knobs']}", flush=True)
    harness.write_round_tables(Path(args.out) / f"norm_readers_{dev.info.name.replace(' ', '_')}", rows, dev, args,
                               "buffer scope")
    return 0


if __name__ == "__main__":
    sys.exit(main())
