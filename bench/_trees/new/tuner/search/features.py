"""Config features for the cost model: every knob as a number, plus what the knobs imply -- work per
work-item, work-group size, how many work-groups, bytes read per multiply-add, texture/buffer flags,
registers the tile needs -- and the workload's sizes, so that records of other workloads of the same
template can teach the model (transfer)."""
from __future__ import annotations

import math

from tuner.logs.record import SCOPE_OPERANDS


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


def derived_features(template, vars: dict, v: dict) -> dict:
    """What the knobs imply (the template's ``features``) and the operands' texture flags. ``template``: a
    Template or its name."""
    if isinstance(template, str):
        from tuner.templates import get_template
        template = get_template(template)
    tex = {f"tex.{k}": float(v.get(f"{k}_scope") == "texture") for k in SCOPE_OPERANDS}
    return {**(template.features(vars, v) if template.features else {}), **tex}


def workload_features(vars: dict) -> dict:
    return {f"w.{k}": _log2(x) for k, x in vars.items() if isinstance(x, int) and not isinstance(x, bool)}


def features(template, space, vars: dict, values: dict) -> dict:
    return {**knob_features(space, values), **derived_features(template, vars, values), **workload_features(vars)}
