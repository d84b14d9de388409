"""What a convolution that normalizes what it reads costs, config by config (issue 55): for each workload, the
log's config of the plain convolution (as ``ApplyHistoryBest`` picks it for the reader, whose ``in_group_norm`` is
an epilogue field: ``logs.best.EPILOGUE``) and that config's neighbours along ``--knobs``, each built and checked
once without and with ``in_group_norm``, then timed in ``--rounds`` alternating rounds (the order reversed every
other round), ``--repeats`` profiled runs a round, in one process: a config's time is the median of its rounds'
medians. On the H200 (2026-12-04) gn32_resnet's six readers cost 38.5 us more than the plain convolutions with
the same configs, 7.5-9.9 us each in layers 3 and 4: this table says which part and which configs.

``--ablate`` also times the reader with its norm's factors (the unit's mean, rstd * gamma and beta, which
``conv2d_nchw4c.group_norm_factors`` computes per channel block from the statistics) replaced by two loads of
the affine array (``cheap_factors``): the normalization's arithmetic stays, the statistics' loads, sums and
rsqrt go. Its output is wrong, so it is not checked. Where ``cheap_factors`` is near ``plain``, the factors are
what costs; where it is near ``reader``, the arithmetic on every tap is.

Workloads: ``--preset gn32`` (gn32_resnet's readers: GroupNorm(32) and its ReLU applied as read, the statistics
in one chunk as a producer writes them) or ``--workload`` JSON fields (repeatable).

usage: python bench/norm_readers.py --preset gn32 --log 'logs/*.jsonl' --device nvidia --out DIR"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
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


def cheap_factors(b, wl, X, Q, A, n, cb, tag: str = ""):
    """``group_norm_factors`` without the statistics: gamma's block as the mean and the scale, beta's as the shift
    (two loads, as factors computed once and kept would cost)."""
    from tuner.ir.expr import Ramp, as_expr
    C4, vec = -(-wl.data[1] // 4), Ramp(as_expr(0), as_expr(1), 4)
    g = b.let(f"gscale{tag}", A[cb, vec])
    return g, g, b.let(f"gshift{tag}", A[C4 + cb, vec])


def configs_of(t, reader, plain, info, history, knobs) -> dict:
    """name -> config: the reader's pick from the log (``plan``: the plain convolution's record, an epilogue
    apart), then each neighbour along ``knobs`` (one knob changed), valid for both workloads."""
    from tuner.logs.best import invalid_config
    from tuner.logs.record import scope_knobs
    fixed = {**scope_knobs(BUFFER), **t.model_knobs}
    rec = history.best_valid(t, reader, info, BUFFER, fixed) if history is not None else None
    base = t.config(**{**rec.config, **fixed}) if rec is not None else t.fallback_with(reader, info, **fixed)
    out = {"plan": base}
    for knob, values in KNOBS.items():
        for v in values if knob in knobs else ():
            cfg = dataclasses.replace(base, **{knob: v})
            variants = {f"{knob}={v}": cfg}
            if knob == "local_input":  # staged (no split), also with one output block and row a work-item
                cfg = dataclasses.replace(cfg, split_k=1, vec_load=4)
                variants = {f"{knob}={v}": cfg,
                            f"{knob}={v},tile 1": dataclasses.replace(cfg, tile_oc=1, tile_oh=1, tile_ow=1)}
            for name, cfg in variants.items():
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
    p.add_argument("--ablate", action="store_true", help="also time the reader without its statistics' factors")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    from tuner.logs.best import ApplyHistoryBest
    from tuner.op import prepared_op
    from tuner.runtime.opencl.device import open_device
    from tuner.templates import conv2d_nchw4c as conv2d, get_template
    dev = open_device(args.device)
    t = get_template("conv2d")
    history = ApplyHistoryBest(args.log.split(",")) if args.log else None
    fields = [f for name in args.preset for f in PRESETS[name]] + [json.loads(w) for w in args.workload]
    if not fields:
        p.error("give --preset or --workload")
    modes = ("plain", "reader", *(("cheap_factors",) if args.ablate else ()))
    rows = []
    for f in fields:
        reader = t.workload(**f)
        plain = dataclasses.replace(reader, in_group_norm=())
        configs = configs_of(t, reader, plain, dev.info, history, args.knobs.split(","))
        timers = {}
        for name, cfg in configs.items():
            for mode in modes:
                w = plain if mode == "plain" else reader
                if mode == "cheap_factors":
                    whole, conv2d.group_norm_factors = conv2d.group_norm_factors, cheap_factors
                    try:
                        timers[(name, mode)] = prepared_op(t, w, cfg, dev, check=False)[1]
                    finally:
                        conv2d.group_norm_factors = whole
                    continue
                res, timers[(name, mode)] = prepared_op(t, w, cfg, dev)  # built and checked once
                if not res.ok:
                    print(f"{t.label(w)} {name} {mode}: max relative error {res.max_rel_error}", file=sys.stderr)
        times = {k: [] for k in timers}
        order = list(timers)
        for rnd in range(args.rounds):
            for key in (order if rnd % 2 == 0 else order[::-1]):
                times[key].append(statistics.median(timers[key](args.repeats)))
        for name, cfg in configs.items():
            us = {m: round(statistics.median(times[(name, m)]) * 1e6, 2) for m in modes}
            rows.append({"workload": t.label(reader), "config": name, **{f"{m}_us": us[m] for m in modes},
                         "read_norm_us": round(us["reader"] - us["plain"], 2),
                         "knobs": json.dumps({k: getattr(cfg, k) for k in ("tile_oc", "tile_oh", "tile_ow", "wg_w",
                                                                          "wg_h", "split_c", "split_k", "vec_load",
                                                                          "local_input")})})
            r = rows[-1]
            print(f"{r['workload']} [{name}]: " + ", ".join(f"{m} {us[m]}" for m in modes) +
                  f" us ({r['read_norm_us']:+}) {r['knobs']}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"norm_readers_{dev.info.name.replace(' ', '_')}"
    harness.write_csv(Path(f"{stem}.csv"), rows)
    lines = harness.md_table(rows, list(rows[0]))
    Path(f"{stem}.md").write_text(f"{dev.info.name}: {args.rounds} alternating rounds, median of {args.repeats} "
                                  f"profiled runs each, buffer scope\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
