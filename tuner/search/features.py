"""Config features for the cost model: every knob as a number, plus what the knobs imply -- work per
work-item, work-group size, how many work-groups, bytes read per multiply-add, texture/buffer flags,
registers the tile needs -- and the workload's sizes, so that records of other workloads of the same
template can teach the model (transfer)."""
from __future__ import annotations

import math


def _log2(x) -> float:
    return math.log2(max(float(x), 1.0))


def knob_features(space, values: dict) -> dict:
    """Numbers for knobs: booleans 0/1, numbers as log2, strings as their index among the choices."""
    out = {}
    for name, choices in space.all_knobs.items():
        v = values[name]
        if isinstance(v, bool):
            out[f"k.{name}"] = float(v)
        elif isinstance(v, (int, float)):
            out[f"k.{name}"] = _log2(v)
        else:
            out[f"k.{name}"] = float(choices.index(v))
    return out


def derived_features(template: str, vars: dict, v: dict) -> dict:
    tex = {f"tex.{k}": float(v.get(f"{k}_scope") == "texture") for k in ("input", "weight", "output")}
    if template in ("conv2d", "depthwise_conv2d"):
        oc = v.get("tile_oc", v.get("tile_cb", 1))
        tile = oc * v["tile_oh"] * v["tile_ow"]
        blocks = vars["OB"] if template == "conv2d" else vars["CB"]
        items = vars["N"] * math.ceil(blocks / oc) * math.ceil(vars["OH"] / v["tile_oh"]) * \
            math.ceil(vars["OW"] / v["tile_ow"])
        wg = v["wg_w"] * v["wg_h"]
        # input pixels per tap read by one work-item, against the multiply-adds they feed
        reads = v["tile_oh"] * v["tile_ow"] + oc * (4 if template == "conv2d" else 1)
        macs = tile * (16 if template == "conv2d" else 4)
        f = {"work_per_item": _log2(tile), "wg_size": _log2(wg), "items": _log2(items),
             "groups": _log2(items / wg), "bytes_per_mac": 16 * reads / macs, "registers": 4 * tile + 4 * reads,
             "padding_waste": math.ceil(vars["OW"] / v["tile_ow"]) * v["tile_ow"] / vars["OW"]}
    elif template == "dense":
        tile = v["tile_m"] * v["tile_n"]
        items = math.ceil(vars["MB"] / v["tile_m"]) * math.ceil(vars["N"] / v["tile_n"]) * v["split_k"]
        wg = v["wg_m"] * v["split_k"]
        reads = v["tile_n"] + v["tile_m"] * 4
        f = {"work_per_item": _log2(tile), "wg_size": _log2(wg), "items": _log2(items),
             "groups": _log2(items / wg), "bytes_per_mac": 16 * reads / (16 * tile),
             "registers": 4 * tile * (4 if v["weight_pack"] == "4i" else 1) + 4 * reads}
    else:
        f = {}
    return {**f, **tex}


def workload_features(vars: dict) -> dict:
    return {f"w.{k}": _log2(x) for k, x in vars.items() if isinstance(x, int) and not isinstance(x, bool)}


def features(template: str, space, vars: dict, values: dict) -> dict:
    return {**knob_features(space, values), **derived_features(template, vars, values), **workload_features(vars)}
