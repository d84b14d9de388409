"""One-off (not committed): where a unit-statistics epilogue's microseconds go. Variants of
last_group_unit_statistics made by editing its source, timed against plain and full in alternating rounds."""
import dataclasses, inspect, json, statistics, sys, textwrap
sys.argv += []
import tuner.templates.reduction as R
import tuner.templates.conv2d_nchw4c as C
from tuner.op import prepared_op
from tuner.runtime.opencl.device import open_device
from tuner.templates import get_template
from tuner.logs.best import ApplyHistoryBest
sys.path.insert(0, sys.argv[1])
import stats_epilogue as SE

SRC = textwrap.dedent(inspect.getsource(R.last_group_unit_statistics))
EDITS = {
    "no_tail": [("with b.if_(last[0].equal(1)):", "with b.if_(last[0].equal(2)):")],
    "no_sync": [("with b.if_(last[0].equal(1)):", "with b.if_(last[0].equal(2)):"),
                ('call("atomic_inc", [Sc[unit]], "int32")', "Sc[unit]"),
                ("global_fence(b)  # stored before counted", "pass")],
    "no_tree": [("merged = tree_of(", "merged = own if True else tree_of(")],
    "own_only": [("with b.if_(last[0].equal(1)):", "with b.if_(last[0].equal(2)):"),
                 ('call("atomic_inc", [Sc[unit]], "int32")', "Sc[unit]"),
                 ("global_fence(b)  # stored before counted", "pass"),
                 ("merged = tree_of(", "merged = own if True else tree_of(")],
}
ORIG = R.last_group_unit_statistics


def variant(name):
    if name == "full":
        return ORIG
    src = SRC
    for a, b_ in EDITS[name]:
        assert a in src, (name, a)
        src = src.replace(a, b_)
    ns = dict(vars(R))
    exec(compile(src, f"<{name}>", "exec"), ns)
    return ns["last_group_unit_statistics"]


dev = open_device("nvidia" if len(sys.argv) < 3 else sys.argv[2])
t = get_template("conv2d")
history = ApplyHistoryBest([sys.argv[1] + "/../logs/*.jsonl"])
picks = {"gn32": None, "style": None}
rows = []
for preset in ("gn32", "style"):
    for f in SE.PRESETS[preset]:
        wl = t.workload(**f)
        plain = dataclasses.replace(wl, out_stats=0)
        configs = SE.configs_of(t, wl, plain, dev.info, history)
        chosen = {k: v for k, v in configs.items() if k == "plain" or (preset == "style" and k in ("wg_w=4", "wg_w=8"))
                  or k == "split_k=8"}
        for cname, cfg in chosen.items():
            timers = {}
            timers["plain"] = prepared_op(t, plain, cfg, dev, check=False)[1]
            for v in ("full", "no_tail", "no_sync", "no_tree", "own_only"):
                C.last_group_unit_statistics = variant(v)
                try:
                    res, timers[v] = prepared_op(t, wl, cfg, dev, check=(v == "full"))
                    if v == "full" and not res.ok:
                        print("full not ok", res.max_rel_error)
                finally:
                    C.last_group_unit_statistics = ORIG
            times = {k: [] for k in timers}
            order = list(timers)
            for rnd in range(5):
                for k in (order if rnd % 2 == 0 else order[::-1]):
                    times[k].append(statistics.median(timers[k](30)))
            us = {k: round(statistics.median(v) * 1e6, 2) for k, v in times.items()}
            row = {"workload": t.label(wl), "config": cname, **us,
                   "knobs": json.dumps({k: getattr(cfg, k) for k in ("tile_oc", "tile_oh", "tile_ow", "wg_w", "wg_h",
                                                                    "split_c", "split_k")})}
            rows.append(row)
            print(json.dumps(row), flush=True)
import os
out = os.environ.get("OUT", "/tmp")
with open(f"{out}/ablate.jsonl", "w") as fh:
    for r in rows:
        fh.write(json.dumps(r) + "\n")
