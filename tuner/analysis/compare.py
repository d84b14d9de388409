"""Texture against buffer: per workload, the best all-texture config against the best all-buffer config.

Only tasks whose three operands share one scope take part (``scopes`` ``texture`` or ``buffer``); mixed
scopes are other tasks. A side with fewer than ``min_trials`` successful measurements is reported as "too
few trials" and the workload is not compared: a best-of-two against a best-of-fifty says more about the
search than about the scope.
"""
from __future__ import annotations

import json
import os
import re

import pandas as pd

from tuner.analysis.frame import as_frame
from tuner.analysis.summary import config_of
from tuner.errors import TunerError
from tuner.logs.index import LogIndex
from tuner.logs.io import load_records
from tuner.logs.record import SCOPE_OPERANDS, Record, canonical_json

SIDES = ("texture", "buffer")
WORKLOAD = ["device", "template", "workload_key"]


def select_device(df: pd.DataFrame, spec: str | None) -> pd.DataFrame:
    """The rows of one device: ``spec`` is a fingerprint, or a case-insensitive substring of a fingerprint
    or device name that names exactly one device of the log. None keeps every device."""
    if spec is None or df.empty:
        return df
    devices = df[["device", "device_name"]].drop_duplicates("device")
    if spec in set(devices["device"]):
        return df[df["device"] == spec]
    s = spec.lower()
    hits = devices[devices["device"].str.lower().str.contains(s, regex=False)
                   | devices["device_name"].fillna("").str.lower().str.contains(s, regex=False)]
    listed = ", ".join(f"{d} ({n})" for d, n in devices.itertuples(index=False))
    if hits.empty:
        raise TunerError(f"no device matching {spec!r} in the log; it has: {listed}")
    if len(hits) > 1:
        raise TunerError(f"--device {spec!r} matches {len(hits)} devices of the log ({', '.join(hits['device'])}); "
                         f"give a fingerprint")
    return df[df["device"] == hits["device"].iloc[0]]


CPU_REASON = ("CPU OpenCL runtimes emulate image reads in software (no texture units or texture cache), so "
              "buffers usually win there")


def device_type(fingerprint, name: str = "") -> str | None:
    """``cpu``, ``gpu``, ``accelerator``, ... from a fingerprint such as ``pocl-cpu-1a2b3c4d`` (``<platform>-
    <type>-<hash>``), else from a ``cpu``/``gpu`` word of the fingerprint or device name; None when neither
    says."""
    m = re.fullmatch(r"[a-z0-9]+-(cpu|gpu|accelerator|custom|other)-[0-9a-f]+", str(fingerprint))
    if m:
        return m.group(1)
    words = set(re.findall(r"[a-z0-9]+", f"{fingerprint} {name}".lower()))
    return next((t for t in ("cpu", "gpu") if t in words), None)


def why_texture_lost(row) -> str:
    """Why buffers won a compared workload (``row``: a row of ``compare``), in a few words; "" where textures
    won or the workload was not compared. On a CPU: the runtime emulates images; elsewhere: the measured ratio."""
    if row.get("pick") != "buffer":
        return ""
    tex, buf = row["texture_median_s"], row["buffer_median_s"]
    measured = f"buffer {tex / buf:.2f}x faster ({tex * 1e3:.4g} ms texture, {buf * 1e3:.4g} ms buffer)"
    if device_type(row["device"], row.get("device_name") or "") == "cpu":
        return f"CPU device: image reads are emulated in software; {measured}"
    return f"measured: {measured}"


def loss_summary(cmp: pd.DataFrame) -> list[str]:
    """One line per device where buffers won a compared workload: how often, and why (``why_texture_lost``)."""
    lines = []
    for dev, g in cmp.groupby("device", sort=False):
        lost, compared = g[g["pick"] == "buffer"], int(g["pick"].notna().sum())
        if lost.empty:
            continue
        where = f"textures lost {len(lost)} of {compared} compared workload{'s' if compared > 1 else ''} on {dev}"
        ratios = lost["texture_median_s"] / lost["buffer_median_s"]
        if device_type(dev, str(g["device_name"].iloc[0])) == "cpu":
            lines.append(f"{where}: a CPU; {CPU_REASON}.")
        else:
            lines.append(f"{where}: buffers measured {ratios.min():.2f}x to {ratios.max():.2f}x faster there.")
    return lines


def decide(texture_ok: int, texture_s: float | None, buffer_ok: int, buffer_s: float | None,
           min_trials: int) -> tuple[str | None, str]:
    """(the faster scope or None, why not compared): the rule of ``compare`` and ``pick_scopes``."""
    short = [f"{side} {n} < {min_trials}" for side, n in (("texture", texture_ok), ("buffer", buffer_ok))
             if n < min_trials]
    if short:
        return None, "too few trials: " + ", ".join(short) + " successful"
    return ("texture" if texture_s <= buffer_s else "buffer"), ""


def compare(df, device: str | None = None, min_trials: int = 5) -> pd.DataFrame:
    """One row per (device, template, workload) with all-texture or all-buffer records.

    Columns: ``device``, ``device_name``, ``template``, ``workload`` (label), ``workload_key``; per side
    (``texture_*``, ``buffer_*``): ``trials`` (records), ``ok`` (successful), ``median_s``, ``gflops`` and
    ``config`` (JSON) of its best config (NaN/None when the side has no success); ``texture_speedup`` =
    buffer time / texture time (> 1: textures are faster), ``pick`` (``texture``, ``buffer``, or None when
    not compared), ``note`` (why not) and ``why`` (why textures lost, see ``why_texture_lost``).
    ``df``: a frame from ``load_logs``, Records or log paths."""
    if min_trials < 1:
        raise TunerError(f"min_trials must be at least 1, got {min_trials}")
    df = select_device(as_frame(df), device)
    df = df[df["scopes"].isin(SIDES)]
    # per (workload, side) counts and the best successful row, each in one grouping (not a slice of the wide
    # frame per workload: that took seconds on a few thousand records); ties go to the earlier record
    sides = WORKLOAD + ["scopes"]
    counts = df.groupby(sides, sort=False)["ok"].agg(["size", "sum"])
    ok = df[df["ok"]]
    best_at = ok.groupby(sides, sort=False)["median_s"].idxmin() if len(ok) else pd.Series(dtype=object)
    cfg = [c for c in df.columns if c.startswith("cfg.")]
    best = df.loc[list(best_at.values), ["median_s", "gflops", *cfg]] if len(best_at) else None
    rows = []
    for r in df.drop_duplicates(WORKLOAD)[[*WORKLOAD, "device_name", "workload"]].itertuples(index=False):
        dev, template, wkey = r[0], r[1], r[2]
        row = {"device": dev, "device_name": r[3], "template": template, "workload": r[4], "workload_key": wkey}
        for side in SIDES:
            key = (dev, template, wkey, side)
            n, n_ok = (int(v) for v in counts.loc[key]) if key in counts.index else (0, 0)
            b = best.loc[best_at[key]] if n_ok else None
            row.update({f"{side}_trials": n, f"{side}_ok": n_ok,
                        f"{side}_median_s": b["median_s"] if b is not None else float("nan"),
                        f"{side}_gflops": b["gflops"] if b is not None else float("nan"),
                        f"{side}_config": json.dumps(config_of(b)) if b is not None else None})
        pick, note = decide(row["texture_ok"], row["texture_median_s"], row["buffer_ok"], row["buffer_median_s"],
                            min_trials)
        row["texture_speedup"] = row["buffer_median_s"] / row["texture_median_s"] if pick else float("nan")
        row["pick"], row["note"] = pick, note
        row["why"] = why_texture_lost(row)
        rows.append(row)
    columns = ["device", "device_name", "template", "workload", "workload_key",
               *[f"{side}_{c}" for side in SIDES for c in ("trials", "ok", "median_s", "gflops", "config")],
               "texture_speedup", "pick", "note", "why"]
    out = pd.DataFrame(rows, columns=columns)
    for c in ("texture_trials", "texture_ok", "buffer_trials", "buffer_ok"):
        out[c] = out[c].astype("int64")
    return out


def compare_totals(cmp: pd.DataFrame) -> pd.DataFrame:
    """Per device, over the compared workloads (those with a ``pick``): the summed best times of all-texture,
    all-buffer and the per-workload pick (what ``--scope auto`` runs), and the pick's speedup over each.
    Each unique workload counts once; a model that runs a layer several times spends it several times."""
    rows = []
    for dev, g in cmp.groupby("device", sort=False):
        c = g[g["pick"].notna()]
        tex, buf = c["texture_median_s"].sum(), c["buffer_median_s"].sum()
        auto = c[["texture_median_s", "buffer_median_s"]].min(axis=1).sum()
        rows.append({"device": dev, "workloads": len(g), "compared": len(c),
                     "texture_picks": int((c["pick"] == "texture").sum()),
                     "texture_s": tex, "buffer_s": buf, "auto_s": auto,
                     "auto_vs_texture": tex / auto if auto else float("nan"),
                     "auto_vs_buffer": buf / auto if auto else float("nan")})
    return pd.DataFrame(rows, columns=["device", "workloads", "compared", "texture_picks", "texture_s",
                                       "buffer_s", "auto_s", "auto_vs_texture", "auto_vs_buffer"])


def _workload_key(workload_key) -> str:
    if isinstance(workload_key, str):
        return canonical_json(json.loads(workload_key))  # any key order or spacing
    if isinstance(workload_key, dict):
        return canonical_json(workload_key)
    return canonical_json(workload_key.key())  # a template workload object


def _fingerprint(device) -> str:
    if isinstance(device, str):
        return device
    info = getattr(device, "info", device)
    return info.fingerprint


def pick_scopes(df_or_records, template: str, workload_key, device, min_trials: int = 5) -> str | None:
    """The scope ``--scope auto`` should give every operand of ``template`` on ``workload_key`` (a key dict,
    its JSON, or a workload object) on ``device`` (a fingerprint, Device or DeviceInfo): ``"texture"`` or
    ``"buffer"``, whichever's best successful config is faster, or None when either side has fewer than
    ``min_trials`` successful records (then the caller decides, e.g. by its fallback).

    ``df_or_records``: a frame from ``load_logs``, a list of Records (fast: no DataFrame is built, so a
    compiler may call this per node), or log paths."""
    key, fp = _workload_key(workload_key), _fingerprint(device)
    if isinstance(df_or_records, pd.DataFrame):
        df = df_or_records
        df = df[(df["device"] == fp) & (df["template"] == template) & (df["workload_key"] == key) & df["ok"]]
        stats = {side: (int((df["scopes"] == side).sum()), df.loc[df["scopes"] == side, "median_s"].min())
                 for side in SIDES}
    else:
        records = [df_or_records] if isinstance(df_or_records, (str, os.PathLike)) else list(df_or_records)
        if not all(isinstance(r, Record) for r in records):
            records = load_records(records)  # paths and globs
        stats = {side: [0, None] for side in SIDES}
        for r in LogIndex(records).workload(fp, template, json.loads(key)):
            scopes = {r.scopes.get(op) for op in SCOPE_OPERANDS}
            side = scopes.pop() if len(scopes) == 1 else None
            if side in stats:
                s = stats[side]
                s[0] += 1
                s[1] = r.median_s if s[1] is None else min(s[1], r.median_s)
    (tn, ts), (bn, bs) = stats["texture"], stats["buffer"]
    return decide(tn, ts, bn, bs, min_trials)[0]
