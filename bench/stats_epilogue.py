"""What a convolution's norm-statistics epilogue costs, config by config (issue 55): for each workload, the
configs a plan would run (the log's config of the plain convolution, as ``ApplyHistoryBest`` picks it, and the
same loop nest's fastest valid one for the variant), then that config's neighbours along the knobs that size the
epilogue's tree (``split_k``, ``wg_w``, ``wg_h``, ``tile_oc``), each built and checked once without and with
``out_stats``, then timed in ``--rounds`` alternating rounds (the order reversed every other round), ``--repeats``
profiled runs a round, in one process: a config's time is the median of its rounds' medians. On the H200
(2026-12-04) the epilogue cost 8-13 us a convolution of gn32_resnet and style_in with the plain layer's config,
and 16 trials of tuning the variant did not find a config without that cost; this table shows how the cost
follows the work-group and the split. Writes stats_epilogue_<device>.csv and .md under ``--out``.

``--ablate`` also times the epilogue with parts of it left out (``ABLATIONS``, by editing the source of
``reduction.last_group_unit_statistics``, a norm of blocks', or ``last_group_statistics``, a GroupNorm(1)'s; their
outputs are wrong, so they are not checked): without the last work-group's merge (``no_tail``), also without the
fence and the counter (``no_sync``), and also without the work-group's reduction and its tree (``own_only``) --
the differences say
where the epilogue's microseconds go. On the H200 (2026-12-04, the tree over every work-item's values this
replaced) the tree cost 2-6.5 us a convolution and the last work-group 2-3 us.

Workloads: ``--preset gn32`` (gn32_resnet's producers, GroupNorm(32)), ``style`` (style_in's, InstanceNorm) or
``gn1`` (GroupNorm(1) producers of MobileViTv2's and PoolFormer's size), or ``--workload`` JSON fields (repeatable).

usage: python bench/stats_epilogue.py --preset gn32 --log 'logs/*.jsonl' --device nvidia --out DIR"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (run with python -P too: bench/gpu.sh)
import harness  # noqa: E402  (bench/harness.py: the CSV and markdown tables)

PRESETS = {
    "gn32": [dict(data=(1, 128, 28, 28), kernel=(128, 128, 3, 3), padding=1, out_stats=32),
             dict(data=(1, 128, 28, 28), kernel=(256, 128, 3, 3), stride=2, padding=1, out_stats=32),
             dict(data=(1, 256, 14, 14), kernel=(256, 256, 3, 3), padding=1, out_stats=32),
             dict(data=(1, 512, 7, 7), kernel=(512, 512, 3, 3), padding=1, out_stats=32)],
    "style": [dict(data=(1, 128, 32, 32), kernel=(128, 128, 3, 3), padding=1, bias=True, pad_mode="reflect",
                   out_stats=128),
              dict(data=(1, 3, 128, 128), kernel=(32, 3, 9, 9), padding=4, bias=True, pad_mode="reflect",
                   out_stats=32)],
    "gn1": [dict(data=(1, 64, 56, 56), kernel=(64, 64, 1, 1), bias=True, out_stats=1),
            dict(data=(1, 128, 28, 28), kernel=(128, 128, 1, 1), bias=True, out_stats=1),
            dict(data=(1, 320, 14, 14), kernel=(320, 320, 1, 1), bias=True, out_stats=1)],
}
KNOBS = {"split_k": (1, 2, 4, 8, 16, 32), "wg_w": (4, 8, 16, 32), "wg_h": (1, 2, 4), "tile_oc": (1, 2, 4)}
BUFFER = {"input": "buffer", "weight": "buffer", "output": "buffer"}
_NO_TAIL = ("with b.if_(last[0].equal(1)):", "with b.if_(last[0].equal(2)):")  # no work-group merges
_NO_SYNC = [('call("atomic_inc", [Sc[unit]], "int32")', "Sc[unit]"),  # a load for the count, no fence
            ("global_fence(b)  # stored before counted", "pass")]
_NO_SYNC_IMAGE = [(a.replace("Sc[unit]", "Sc[n]"), b.replace("Sc[unit]", "Sc[n]")) for a, b in _NO_SYNC]
ABLATIONS = {  # the epilogue's function -> part name -> (old, new) edits of its source
    "last_group_unit_statistics": {
        "no_tail": [_NO_TAIL],
        "no_sync": [_NO_TAIL, *_NO_SYNC],
        "own_only": [_NO_TAIL, *_NO_SYNC, ("with b.if_(lid < t_oc * red):", "with b.if_(lid < 0):"),
                     ("    tree_of(b, [state[0], state[1], state[2]], lanewise_merge, lid, t_oc * red, tree, "
                      "span=red, items=size)\n", "")]},
    "last_group_statistics": {
        "no_tail": [_NO_TAIL],
        "no_sync": [_NO_TAIL, *_NO_SYNC_IMAGE],
        "own_only": [_NO_TAIL, *_NO_SYNC_IMAGE,
                     ("group = any_size_tree(b, own, welford_merge, lid, size, tree)", "group = own")]},
}
PARTS = ("no_tail", "no_sync", "own_only")


def epilogue_of(wl) -> str:
    """The reduction function that writes ``wl``'s statistics: a norm of blocks', or a GroupNorm(1)'s."""
    return "last_group_unit_statistics" if int(wl.out_stats) > 1 else "last_group_statistics"


def ablated(function: str, part: str):
    """``reduction.<function>`` with ``ABLATIONS[function][part]``'s edits (each must match once)."""
    import inspect
    import textwrap
    import tuner.templates.reduction as reduction
    src = textwrap.dedent(inspect.getsource(getattr(reduction, function)))
    for old, new in ABLATIONS[function][part]:
        if src.count(old) != 1:
            raise SystemExit(f"--ablate {part}: {old!r} is not once in {function}; update ABLATIONS")
        src = src.replace(old, new)
    scope = dict(vars(reduction))
    exec(compile(src, f"<{function} {part}>", "exec"), scope)  # noqa: S102 - our own source
    return scope[function]


def configs_of(t, wl, plain, info, history, knobs=tuple(KNOBS)) -> dict:
    """name -> config: the plain convolution's logged config (``plain``), the variant's pick where that one does
    not fit it (``variant``), then each neighbour along ``KNOBS`` of the first, valid for both workloads."""
    from tuner.logs.best import invalid_config
    from tuner.logs.record import scope_knobs
    from tuner.search.samplers import CostModel
    fixed = {**scope_knobs(BUFFER), **t.model_knobs}
    rec = history.best_valid(t, plain, info, BUFFER, fixed) if history is not None else None
    pick = None if rec is not None or history is None else history.suggest(t, plain, info, BUFFER, fixed,
                                                                           fit=CostModel.fit)
    base = t.config(**{**rec.config, **fixed}) if rec is not None else pick.config if pick is not None else \
        t.fallback_with(plain, info, **fixed)
    out = {"plain": base}
    if invalid_config(t, wl, info, dataclasses.asdict(base)) is not None:
        variant = history.suggest(t, wl, info, BUFFER, fixed, fit=CostModel.fit) if history is not None else None
        out["variant"] = variant.config if variant is not None else t.fallback_with(wl, info, **fixed)
    for knob, values in KNOBS.items():
        for v in values if knob in knobs else ():
            cfg = dataclasses.replace(base, **{knob: v})
            valid = all(invalid_config(t, w, info, dataclasses.asdict(cfg)) is None for w in (plain, wl))
            if valid and cfg not in out.values():
                out[f"{knob}={v}"] = cfg
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), action="append", default=[])
    p.add_argument("--workload", action="append", default=[], help="conv2d workload fields as JSON, with out_stats")
    p.add_argument("--log", default="", help="logs (comma-separated globs): the plain convolutions' configs")
    p.add_argument("--device", default="nvidia")
    p.add_argument("--knobs", default=",".join(KNOBS),
                   help="the knobs whose neighbours are timed too (comma-separated; none: only the plans' configs)")
    p.add_argument("--ablate", action="store_true", help="also time the epilogue with parts of it left out")
    harness.add_round_args(p)
    args = p.parse_args(argv)
    from tuner.op import prepared_op
    from tuner.templates import conv2d_nchw4c as conv2d
    dev, t, history, fields = harness.conv2d_bench(p, args, PRESETS)
    rows = []
    for f in fields:
        wl = t.workload(**f)
        plain = dataclasses.replace(wl, out_stats=0)
        configs = configs_of(t, wl, plain, dev.info, history, args.knobs.split(","))
        timers = {}  # (config name, plain or stats) -> its build's timer; the variant's pick runs with statistics only
        for name, cfg in configs.items():
            for which, w in (("plain", plain), ("stats", wl)):
                if which == "stats" or name != "variant":
                    res, timers[(name, which)] = prepared_op(t, w, cfg, dev)  # built and checked once
                    if not res.ok:
                        print(f"{t.label(wl)} {name} {which}: max relative error {res.max_rel_error}",
                              file=sys.stderr)
            for part in PARTS if args.ablate else ():
                function = epilogue_of(wl)
                whole = getattr(conv2d, function)
                setattr(conv2d, function, ablated(function, part))
                try:
                    timers[(name, part)] = prepared_op(t, wl, cfg, dev, check=False)[1]
                finally:
                    setattr(conv2d, function, whole)
        times = harness.alternating_medians(timers, args.rounds, args.repeats)
        for name, cfg in configs.items():
            us = {w: times[(name, w)] * 1e6 if (name, w) in times else None
                  for w in ("plain", "stats")}
            rows.append({"workload": t.label(wl), "config": name,
                         "plain_us": round(us["plain"], 2) if us["plain"] is not None else "",
                         "stats_us": round(us["stats"], 2),
                         "epilogue_us": round(us["stats"] - us["plain"], 2) if us["plain"] is not None else "",
                         **{f"{part}_us": round(times[(name, part)] * 1e6, 2)
                            if (name, part) in times else "" for part in (PARTS if args.ablate else ())},
                         "knobs": json.dumps({k: getattr(cfg, k) for k in ("tile_oc", "tile_oh", "tile_ow", "wg_w",
                                                                          "wg_h", "split_c", "split_k")})})
            r = rows[-1]
            parts = "".join(f", {part} {r[f'{part}_us']}" for part in PARTS if r.get(f"{part}_us", "") != "")
            print(f"{r['workload']} [{name}]: plain {r['plain_us']} us, with statistics {r['stats_us']} us "
                  f"({r['epilogue_us']}){parts} {r['knobs']}", flush=True)
    harness.write_round_tables(Path(args.out) / f"stats_epilogue_{dev.info.name.replace(' ', '_')}", rows, dev, args,
                               "buffer scope")
    return 0


if __name__ == "__main__":
    sys.exit(main())
