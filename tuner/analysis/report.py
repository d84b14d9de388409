"""One self-contained HTML report of tuning logs: tables and matplotlib figures, PNGs embedded as data URIs.

Sections, each a bounded number of figures whatever the size of the log (a panel per task took a minute of
CPU on a log of 3,336 records): per template (latency, tasks and outcomes), the tasks with the largest share of
the latency (and their GFLOP/s against the device's ceiling), convergence (one figure, a line per task: the
top tasks in colour, the rest grey), texture against buffer per layer (the layers of most latency), the error
breakdown and, given a compiled model's directory, its per-layer latency (``artifact_profile``: the profile
``tuner run DIR --profile`` kept, else measured now when the device the artifact was compiled for is attached).
Every task is in the tasks table at the end. The file has no scripts and loads nothing: it opens from an
e-mail attachment.

The ceiling is the best GFLOP/s any task reached on the device, labelled as such: an honest, data-driven
upper line, not the device's peak (which nothing here measures). A task's latency share is its best time over
the sum of the best times of the device's tasks, each task once (the log does not say how often a model runs a
layer).
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

from tuner.analysis.compare import CPU_REASON, compare, compare_totals, device_type, loss_summary
from tuner.analysis.summary import summarize
from tuner.errors import TunerError

SCOPE_COLORS = {"texture": "#4C72B0", "buffer": "#DD8452", "mixed": "#8172B3", "none": "#937860"}
ERROR_COLORS = {"NO_ERROR": "#55A868", "INSTANTIATION": "#8C8C8C", "COMPILE": "#C44E52", "RUNTIME": "#DD8452",
                "WRONG_ANSWER": "#8172B3", "BUILD_TIMEOUT": "#937860", "RUN_TIMEOUT": "#DA8BC3",
                "UNKNOWN": "#CCB974"}
LINE_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
               "#CCB974", "#64B5CD"]
DPI = 90
TOP_TASKS = 20  # rows of the top-tasks figure and table, per device
TOP_LINES = len(LINE_COLORS)  # tasks drawn in colour (and named in the legend) in the convergence figure
TOP_WORKLOADS = 25  # rows of the texture/buffer figure, per device (the table has them all)
TOP_LAYERS = 40  # bars of the per-layer figure (the slowest, in execution order)


# ----------------------------------------------------------------------------------------------- figures

def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)  # one draw: margins set by _margins, no layout engine's extra pass
    return base64.b64encode(buf.getvalue()).decode("ascii")


CHAR_INCHES = 7 * 0.6 / 72  # the width of a character of a 7-point tick label, about


def _margins(fig: Figure, left_chars: int = 0, left: float = 0.6, right: float = 0.3, top: float = 0.45,
             bottom: float = 0.6, wspace: float | None = None, hspace: float | None = None) -> None:
    """Fixed margins in inches (``left_chars``: the longest y tick label, in characters, is added to ``left``):
    a layout engine (constrained, tight) draws every figure once more to measure its labels, which was a third
    of the report's time."""
    w, h = fig.get_size_inches()
    left += left_chars * CHAR_INCHES
    fig.subplots_adjust(left=min(left / w, 0.6), right=1 - right / w, top=1 - top / h, bottom=min(bottom / h, 0.6),
                        wspace=wspace, hspace=hspace)


def _short(label: str, n: int = 48) -> str:
    return label if len(label) <= n else label[:n - 1] + "…"


def latency_shares(summary: pd.DataFrame) -> pd.DataFrame:
    """The tasks with a success, each with ``share``: its best time over the sum of the best times of its
    device's tasks (each task once), and ``of_ceiling``: its best GFLOP/s over the best of any task on the
    device; sorted by device (in log order), then share, largest first."""
    s = summary[summary["best_median_s"].notna()].copy()
    if s.empty:
        return s.assign(share=pd.Series(dtype=float), of_ceiling=pd.Series(dtype=float))
    by_device = s.groupby("device", sort=False)
    s["share"] = s["best_median_s"] / by_device["best_median_s"].transform("sum")
    s["of_ceiling"] = s["best_gflops"] / by_device["best_gflops"].transform("max")
    order = {d: i for i, d in enumerate(dict.fromkeys(summary["device"]))}
    s["_device_order"] = s["device"].map(order)
    s = s.sort_values(["_device_order", "share", "task"], ascending=[True, False, True], kind="stable")
    return s.drop(columns="_device_order").reset_index(drop=True)


def _task_label(device: str, task: str, several: bool, n: int = 56) -> str:
    return _short((device + ": " if several else "") + task, n)


def template_figure(df: pd.DataFrame, shares: pd.DataFrame) -> Figure:
    """Per template (and device): the summed best time of its tasks, as a share of the device's, and its
    measurements stacked by outcome."""
    several = df["device"].nunique() > 1
    keys = df[["device", "template"]].drop_duplicates()
    keys = keys.sort_values(["device", "template"], kind="stable").itertuples(index=False)
    rows = [(d, t) for d, t in keys]
    labels = [f"{d}: {t}" if several else t for d, t in rows]
    fig = Figure(figsize=(11, 0.32 * len(rows) + 1.6))
    _margins(fig, max(map(len, labels)), wspace=0.08)
    ax_lat, ax_out = fig.subplots(1, 2, sharey=True)
    y = np.arange(len(rows))
    lat = shares.groupby(["device", "template"])["share"].sum() if not shares.empty else pd.Series(dtype=float)
    ms = shares.groupby(["device", "template"])["best_median_s"].sum() if not shares.empty else lat
    values = np.array([100 * lat.get(r, 0.0) for r in rows])
    ax_lat.barh(y, values, color="#4C72B0")
    for i, r in enumerate(rows):
        if r in ms.index:
            ax_lat.text(values[i], i, f" {values[i]:.0f}% ({ms[r] * 1e3:.3g} ms)", va="center", fontsize=7)
    ax_lat.set_yticks(y, labels, fontsize=8)
    ax_lat.invert_yaxis()
    ax_lat.set_xlim(0, max(100.0, values.max(initial=0) * 1.25))
    ax_lat.set_xlabel("% of the latency (sum of the tasks' best times)", fontsize=8)
    ax_lat.set_title("Latency per template", fontsize=9)
    ax_lat.grid(axis="x", alpha=0.3)
    counts = df.groupby(["device", "template", "error_name"]).size().unstack(fill_value=0)
    order = [e for e in ERROR_COLORS if e in counts.columns] + sorted(set(counts.columns) - set(ERROR_COLORS))
    counts = counts.reindex(pd.MultiIndex.from_tuples(rows), fill_value=0)[order]
    left = np.zeros(len(rows))
    for e in order:
        v = counts[e].to_numpy()
        ax_out.barh(y, v, left=left, color=ERROR_COLORS.get(e, "#999999"), label="ok" if e == "NO_ERROR" else e)
        left += v
    ax_out.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_out.set_xlabel("measurements", fontsize=8)
    failed = int((~df["ok"]).sum())
    ax_out.set_title(f"Outcomes: {failed} of {len(df)} measurements failed", fontsize=9)
    ax_out.legend(fontsize=7, loc="lower right")
    ax_out.grid(axis="x", alpha=0.3)
    for ax in (ax_lat, ax_out):
        ax.tick_params(labelsize=7)
    return fig


def top_tasks_figure(shares: pd.DataFrame, top: int = TOP_TASKS) -> Figure | None:
    """The ``top`` tasks of each device by latency share (bar colour: scopes), beside their best GFLOP/s as a
    share of the device's ceiling."""
    if shares.empty:
        return None
    t = shares.groupby("device", sort=False).head(top).reset_index(drop=True)
    several = shares["device"].nunique() > 1
    fig = Figure(figsize=(11, 0.28 * len(t) + 1.5))
    labels = [_task_label(d, k, several) for d, k in zip(t["device"], t["task"])]
    _margins(fig, max(map(len, labels)), wspace=0.06)
    ax_share, ax_ceiling = fig.subplots(1, 2, sharey=True, width_ratios=[3, 2])
    y = np.arange(len(t))
    colors = [SCOPE_COLORS.get(sc, SCOPE_COLORS["mixed"]) for sc in t["scopes"]]
    share = 100 * t["share"].to_numpy(dtype=float)
    ax_share.barh(y, share, color=colors)
    for i, (v, s) in enumerate(zip(share, t["best_median_s"])):
        ax_share.text(v, i, f" {v:.1f}% ({s * 1e3:.3g} ms)", va="center", fontsize=7)
    ax_share.set_yticks(y, labels, fontsize=7)
    ax_share.invert_yaxis()
    ax_share.set_xlim(0, share.max() * 1.35)
    ax_share.set_xlabel("% of the device's latency (bar colour: scopes)", fontsize=8)
    ax_share.set_title(f"The {min(top, len(t))} tasks of most latency" + (" per device" if several else ""),
                       fontsize=9)
    ax_share.legend(handles=[Patch(color=SCOPE_COLORS[k], label=k) for k in ("texture", "buffer", "mixed")
                             if any(SCOPE_COLORS.get(sc, SCOPE_COLORS["mixed"]) == SCOPE_COLORS[k]
                                    for sc in t["scopes"])], fontsize=7, loc="lower right")
    ceiling = 100 * t["of_ceiling"].to_numpy(dtype=float)
    ax_ceiling.barh(y, ceiling, color="#55A868")
    for i, (v, g) in enumerate(zip(ceiling, t["best_gflops"])):
        ax_ceiling.text(v, i, f" {v:.0f}% ({g:.3g})", va="center", fontsize=7)
    ax_ceiling.axvline(100, color="black", linestyle="--", linewidth=1)
    ax_ceiling.set_xlim(0, 135)
    ax_ceiling.set_xlabel("best GFLOP/s, % of the ceiling (the best any task reached)", fontsize=8)
    ax_ceiling.set_title("Achieved GFLOP/s against the ceiling", fontsize=9)
    for ax in (ax_share, ax_ceiling):
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    return fig


def _steps(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The vertices of a post-step line through (x, y), as ``drawstyle="steps-post"`` draws it."""
    xs = np.repeat(x, 2)[1:]
    ys = np.repeat(y, 2)[:-1]
    return np.column_stack([xs, ys])


def convergence_figure(df: pd.DataFrame, shares: pd.DataFrame, top: int = TOP_LINES) -> Figure | None:
    """One figure, a line per task: the best GFLOP/s found so far as a share of the task's best, against the
    task's measurement number (log order; failures count as measurements). The ``top`` tasks of most latency
    are drawn in colour and named in the legend, every other task as a thin grey line. None when nothing
    succeeded."""
    if not df["ok"].any():
        return None
    by = ["device", "task"]  # a task's label names it (summarize's rows, the tasks table)
    keys = [df[c] for c in by]
    best = df["gflops"].where(df["ok"]).groupby(keys, sort=False).cummax()  # NaN at each failure: carried over
    best = best.groupby(keys, sort=False).ffill()
    final = best.groupby(keys, sort=False).transform("max")
    frac = (100 * best / final).to_numpy(dtype=float)
    position = (df.groupby(by, sort=False).cumcount() + 1).to_numpy()
    groups = df.groupby(by, sort=False).indices
    several = df["device"].nunique() > 1
    ranked = list(zip(shares["device"], shares["task"]))
    colored = ranked[:top]
    names = dict(zip(ranked, zip(shares["device"], shares["task"], shares["share"])))
    legend_rows = math.ceil((len(colored) + bool(len(groups) > len(colored))) / 2)
    fig = Figure(figsize=(10, 5.2 + 0.17 * legend_rows))
    _margins(fig, 4, bottom=0.75 + 0.17 * legend_rows)
    ax = fig.subplots()
    grey, longest = [], 1
    for key, idx in groups.items():
        x, y = position[idx], frac[idx]
        longest = max(longest, int(x.max()))
        first = np.flatnonzero(~np.isnan(y))
        if not len(first) or key in colored:
            continue
        x, y = x[first[0]:], y[first[0]:]
        grey.append(_steps(x, y) if len(x) > 1 else np.array([[x[0], y[0]], [x[0] + 0.5, y[0]]]))
    if grey:
        ax.add_collection(LineCollection(grey, colors="#9a9a9a", linewidths=0.7, alpha=0.35,
                                         label=f"{len(grey)} other tasks"))
    for i, key in enumerate(colored):
        idx = groups[key]
        x, y = position[idx], frac[idx]
        device, task, share = names[key]
        ax.step(x, y, where="post", color=LINE_COLORS[i % len(LINE_COLORS)], linewidth=1.6,
                label=f"{_task_label(device, task, several, 60)} ({100 * share:.1f}%)")
    lengths = np.array([len(idx) for idx in groups.values()])
    if longest > 4 * max(np.percentile(lengths, 90), 4):  # a few long tasks: a log axis keeps the rest readable
        ax.set_xscale("log")
        ax.set_xlim(0.9, longest * 1.1)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))  # 1, 2, 5, 10, 20, ...
        ax.xaxis.set_minor_locator(NullLocator())
        scale = ", log scale"
    else:
        ax.set_xlim(0.5, longest + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # measurements are counted: no 2.5th
        scale = ""
    ax.set_ylim(0, 105)
    ax.set_xlabel(f"measurement of the task (log order; failures count{scale})", fontsize=8)
    ax.set_ylabel("best GFLOP/s so far, % of the task's best", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.set_title(f"Convergence of {len(groups)} tasks: in colour the {len(colored)} of most latency "
                 "(their share in brackets)", fontsize=9)
    fig.legend(loc="lower center", ncols=2, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return fig


def _device_panels(device_column: pd.Series, row_inches: float, left_chars: int):
    """One horizontal-bar panel per device, stacked, each as tall as its rows: ``(fig, [(ax, device)])``."""
    devices = list(dict.fromkeys(device_column))
    heights = [row_inches * (device_column == d).sum() + 0.9 for d in devices]
    fig = Figure(figsize=(9, sum(heights) + 0.3))
    _margins(fig, left_chars, hspace=0.9 / (sum(heights) / len(devices)))
    axes = fig.subplots(len(devices), 1, squeeze=False, height_ratios=heights).ravel()
    return fig, list(zip(axes, devices))


def _heaviest_workloads(cmp: pd.DataFrame, top: int) -> pd.DataFrame:
    """The ``top`` workloads of each device: the compared ones (enough trials on both sides) first, each group
    by its best time on either side (what ``--scope auto`` would run), slowest first."""
    order = {d: i for i, d in enumerate(dict.fromkeys(cmp["device"]))}
    t = cmp.assign(_d=cmp["device"].map(order), _few=cmp["pick"].isna(),
                   _s=cmp[["texture_median_s", "buffer_median_s"]].min(axis=1).fillna(0.0))
    t = t.sort_values(["_d", "_few", "_s"], ascending=[True, True, False], kind="stable")
    return t.groupby("device", sort=False).head(top).drop(columns=["_d", "_few", "_s"])


def scope_figure(cmp: pd.DataFrame, top: int = TOP_WORKLOADS) -> Figure | None:
    """Best texture against best buffer GFLOP/s of the ``top`` workloads of most latency per device; hatched
    bars: sides with too few trials."""
    if cmp.empty:
        return None
    cmp = _heaviest_workloads(cmp, top)
    fig, panels = _device_panels(cmp["device"], 0.38, max(len(_short(w, 56)) for w in cmp["workload"]))
    for ax, device in panels:
        c = cmp[cmp["device"] == device].reset_index(drop=True)
        y = np.arange(len(c))
        for offset, side in ((-0.2, "texture"), (0.2, "buffer")):
            values = c[f"{side}_gflops"].fillna(0).to_numpy(dtype=float)
            short = c["pick"].isna().to_numpy()
            bars = ax.barh(y + offset, values, height=0.4, color=SCOPE_COLORS[side], label=f"all {side}")
            for bar, few in zip(bars, short):
                if few:
                    bar.set_hatch("///")
                    bar.set_alpha(0.45)
        for i, r in c.iterrows():
            top_value = np.nanmax([r["texture_gflops"], r["buffer_gflops"], 0])
            note = (f"{r['texture_speedup']:.2f}x" if isinstance(r["pick"], str) else "too few trials")
            ax.text(top_value, i, "  " + note, va="center", fontsize=7)
        ax.set_yticks(y, [_short(w, 56) for w in c["workload"]], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("best GFLOP/s  (label: texture speedup = buffer time / texture time)", fontsize=8)
        ax.set_title(f"Texture against buffer per layer on {device}" + (
            f"\n{len(c)} layers: the compared ones first, each by latency" if len(c) == top else ""), fontsize=9)
        ax.margins(x=0.15)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return fig


_SCOPE_NAMES = {"texture": "texture", "buffer": "buffer", "global": "buffer"}  # global: the IR's buffer scope


def _scope_values(scopes) -> list:
    """The operands' scopes of a profile row: ``texture``, ``i=buffer,w=buffer,o=buffer``, ``texture/buffer/
    buffer`` or ``{"input": "texture", ...}``."""
    if isinstance(scopes, dict):
        return [str(v) for v in scopes.values()]
    parts = [p.strip() for p in re.split(r"[,/;\s]+", scopes or "") if p.strip()]
    return [p.split("=", 1)[-1].strip() for p in parts]


def _scope_kind(scopes) -> str:
    """``texture`` when every operand is a texture, ``buffer`` when every one is a buffer, ``none`` for a layer
    without a tuned kernel, else ``mixed``."""
    kinds = {_SCOPE_NAMES.get(v.lower(), "mixed") for v in _scope_values(scopes)}
    if not kinds:
        return "none"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _scope_text(scopes) -> str:
    """The profile table's scopes cell: the kind, with the operands when they are mixed."""
    kind = _scope_kind(scopes)
    if kind == "none":
        return "-"
    return kind if kind != "mixed" else f"mixed ({'/'.join(_scope_values(scopes))})"


def profile_figure(profile: dict, top: int = TOP_LAYERS) -> Figure:
    """The compiled model's per-layer latency, in execution order, coloured by scopes; of a model of more than
    ``top`` layers, the ``top`` slowest."""
    rows = profile["rows"]
    shown = rows
    if len(rows) > top:
        keep = set(sorted(range(len(rows)), key=lambda i: -rows[i]["median_s"])[:top])
        shown = [r for i, r in enumerate(rows) if i in keep]
    fig = Figure(figsize=(9, 0.26 * len(shown) + 1.4))
    names = [_short(f"{r['node']} ({r['op']})", 50) for r in shown]
    _margins(fig, max(map(len, names), default=0))
    ax = fig.subplots()
    y = np.arange(len(shown))
    ms = [r["median_s"] * 1e3 for r in shown]
    kinds = [_scope_kind(r.get("scopes")) for r in shown]
    ax.barh(y, ms, color=[SCOPE_COLORS[k] for k in kinds])
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median ms", fontsize=8)
    ax.legend(handles=[Patch(color=SCOPE_COLORS[k], label=k) for k in SCOPE_COLORS if k in kinds], fontsize=7,
              loc="lower right")
    which = f" (the {top} slowest of {len(rows)} layers, in execution order)" if len(shown) < len(rows) else ""
    ax.set_title(f"Per-layer latency on {profile['device']}{which}: total {profile['total_s'] * 1e3:.4g} ms "
                 f"(layers sum to {sum(r['median_s'] for r in rows) * 1e3:.4g} ms)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return fig


# ------------------------------------------------------------------------------------------------ profile

PROFILE_FILE = "profile.json"


def _run_command(artifact) -> str:
    return f"`tuner run {artifact} --profile`"


def _profile_file(artifact: Path) -> Path | None:
    """Where the artifact's profile is: the one ``tuner run DIR --profile`` kept in the user's cache
    (``tuner.artifact.cache.find_profile``, keyed by the artifact's manifest), else a ``DIR/profile.json``
    (written into the artifact by an older tuner, or put in a folder by hand); None when there is none."""
    legacy = artifact / PROFILE_FILE
    if (artifact / "manifest.json").is_file():
        try:
            from tuner.artifact.cache import find_profile
        except ImportError:  # a tuner that kept profiles in the artifact folder only
            find_profile = None
        if find_profile is not None:
            try:
                return find_profile(artifact)
            except TunerError:  # no cache folder (no HOME): only the artifact's own file can be there
                pass
    return legacy if legacy.is_file() else None


def read_profile(path) -> dict:
    """A profile file, checked: ``{"device": str, "rows": [{"node": str, "op": str, "template": str|null,
    "scopes": str|null, "median_s": number}, ...], "total_s": number}``."""
    path = Path(path)
    try:
        profile = json.loads(path.read_text())
    except OSError as e:
        raise TunerError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise TunerError(f"{path}: not valid JSON ({e}); write it again with `tuner run DIR --profile`") from None
    where = f"{path}: "
    if not isinstance(profile, dict) or not isinstance(profile.get("rows"), list):
        raise TunerError(where + 'expected an object with "device", "rows" (a list) and "total_s"')
    if not isinstance(profile.get("device"), str):
        raise TunerError(where + '"device" must be a string')
    if not _number(profile.get("total_s")):
        raise TunerError(where + '"total_s" must be a number of seconds')
    for i, r in enumerate(profile["rows"]):
        if not isinstance(r, dict):
            raise TunerError(where + f"rows[{i}] is not an object")
        for k in ("node", "op"):
            if not isinstance(r.get(k), str):
                raise TunerError(where + f'rows[{i}]["{k}"] must be a string')
        if not _number(r.get("median_s")):
            raise TunerError(where + f'rows[{i}]["median_s"] must be a number of seconds')
        if r.get("template") is not None and not isinstance(r["template"], str):
            raise TunerError(where + f'rows[{i}]["template"] must be a string or null')
        if r.get("scopes") is not None and not isinstance(r["scopes"], (str, dict)):
            raise TunerError(where + f'rows[{i}]["scopes"] must be a string such as "texture" or '
                             '"i=buffer,w=buffer,o=buffer", or null')
    return profile


def _artifact_dir(artifact) -> Path:
    path = Path(artifact)
    if not path.is_dir():
        raise TunerError(f"--artifact {artifact}: not a directory (give a compiled model's directory, written by "
                         f"`tuner compile MODEL -o DIR`)")
    return path


def load_profile(artifact) -> dict:
    """The per-layer profile of the compiled model in ``artifact`` that ``tuner run DIR --profile`` kept
    (``_profile_file``), checked (``read_profile``). Measures nothing: a missing profile is a TunerError naming
    the command that writes it."""
    path = _artifact_dir(artifact)
    found = _profile_file(path)
    if found is None:
        raise TunerError(f"{artifact} has no per-layer profile yet: {_run_command(artifact)} on the device it was "
                         f"compiled for writes it")
    return read_profile(found)


def _attached(fingerprint: str | None):
    """The local OpenCL device of ``fingerprint``, or None (none attached, no OpenCL here)."""
    if not fingerprint:
        return None
    try:
        from tuner.runtime.opencl.device import list_devices
        return next((d for d in list_devices() if d.fingerprint == fingerprint), None)
    except (ImportError, OSError, TunerError):
        return None


def artifact_profile(artifact, measure: bool = True, repeats: int = 10) -> tuple[dict, str]:
    """The per-layer profile of the compiled model in ``artifact`` and where it came from (a line for the
    user). The one ``tuner run DIR --profile`` kept, else, with ``measure``, the artifact profiled now, as
    ``tuner run --profile`` profiles it (``Module.profile``, ``repeats`` runs) and kept the same way, when the
    device it was compiled for is attached here; else a TunerError that names the command that writes it."""
    path = _artifact_dir(artifact)
    found = _profile_file(path)
    if found is not None:
        return read_profile(found), f"per-layer profile from {found}"
    how = f"{_run_command(artifact)} on the device it was compiled for writes it, then run this command again"
    if not (path / "manifest.json").is_file():
        raise TunerError(f"--artifact {artifact}: no profile.json and no manifest.json: not a compiled model's "
                         f"directory (give the DIR of `tuner compile MODEL -o DIR`; {_run_command('DIR')} "
                         f"profiles it)")
    if not measure:
        raise TunerError(f"{artifact} has no per-layer profile yet; {how}")
    from tuner.artifact.store import read_artifact
    from tuner.runtime.module import Module, user_binary_cache
    spec, sources, params = read_artifact(path)  # a TunerError (ArtifactError) names what is wrong with it
    want = spec.device.get("fingerprint")
    info = _attached(want)
    if info is None:
        name = spec.device.get("name") or "the device it was compiled for"
        raise TunerError(f"{artifact} has no per-layer profile yet, and it was compiled for {name} ({want}), "
                         f"which is not attached here; {how}")
    mod = Module(spec, sources, params, device=None, cache_dir=user_binary_cache())  # the attached match
    profile = mod.profile(repeats)
    kept = ""
    try:
        from tuner.artifact.cache import write_profile
        kept = f"; kept in {write_profile(path, profile)}"
    except ImportError:
        pass
    except TunerError as e:
        kept = f"; not kept ({e})"
    return profile, f"profiled {artifact} on {info.name} ({info.fingerprint}) now, {repeats} runs{kept}"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _profile_notes(profile: dict) -> list[str]:
    """Why the compiled model's layers are in buffers, where some are and the device is a CPU."""
    kinds = [_scope_kind(r.get("scopes")) for r in profile["rows"]]
    tuned = [k for k in kinds if k != "none"]
    buffers = tuned.count("buffer")
    fingerprint = profile.get("fingerprint") if isinstance(profile.get("fingerprint"), str) else ""
    if not buffers or device_type(fingerprint, profile["device"]) != "cpu":
        return []
    return [f"{buffers} of {len(tuned)} kernel layers run in buffers: {profile['device']} is a CPU; "
            f"{CPU_REASON}."]


# ---------------------------------------------------------------------------------------------------- html

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; background: #fff; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.meta, .note { color: #666; } img { max-width: 100%; height: auto; display: block; margin: 1em 0; }
table { border-collapse: collapse; font-size: 12px; margin: 1em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 11px; word-break: break-all; }
"""


def _e(x) -> str:
    return html.escape(str(x))


def _fmt(x, spec: str) -> str:
    return "-" if x is None or pd.isna(x) else format(x, spec)


def _table(headers: list, rows: list, numeric: set = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{_e(c)}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _knobs(config_json: str) -> str:
    """A config without its scope knobs, which the task label already shows."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in json.loads(config_json).items() if not k.endswith("_scope"))


def _img(fig: Figure | None, alt: str, empty: str) -> str:
    if fig is None:
        return f'<p class="note">{_e(empty)}</p>'
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{_png(fig)}">'


def _template_table(df: pd.DataFrame, summary: pd.DataFrame, shares: pd.DataFrame) -> str:
    """Per device and template: tasks, measurements, failures, the summed best time and its share, and the
    tasks' best GFLOP/s (median and best)."""
    several = df["device"].nunique() > 1
    per = summary.groupby(["device", "template"], sort=True).agg(
        tasks=("task", "size"), trials=("trials", "sum"), ok=("ok", "sum"), failed=("failed", "sum"),
        median_gflops=("best_gflops", "median"), best_gflops=("best_gflops", "max"))
    tuned = shares.groupby(["device", "template"])[["best_median_s", "share"]].sum() if not shares.empty else None
    rows = []
    for (device, template), r in per.iterrows():
        t = tuned.loc[(device, template)] if tuned is not None and (device, template) in tuned.index else None
        rows.append(([_e(device)] if several else []) + [
            _e(template), r["tasks"], r["trials"], r["ok"], r["failed"],
            _fmt(t["best_median_s"] * 1e3 if t is not None else None, ".4g"),
            _fmt(100 * t["share"] if t is not None else None, ".1f"),
            _fmt(r["median_gflops"], ".4g"), _fmt(r["best_gflops"], ".4g")])
    return _table((["device"] if several else []) + [
        "template", "tasks", "measurements", "ok", "failed", "best ms (sum)", "% of latency",
        "median best GFLOP/s", "best GFLOP/s"], rows, numeric={i + several for i in range(1, 9)})


def _top_table(shares: pd.DataFrame, top: int) -> str:
    several = shares["device"].nunique() > 1
    rows = []
    for device, g in shares.groupby("device", sort=False):
        cumulative = 0.0
        for _, r in g.head(top).iterrows():
            cumulative += r["share"]
            rows.append(([_e(device)] if several else []) + [
                _e(r["task"]), f"{r['best_median_s'] * 1e3:.4g}", f"{100 * r['share']:.1f}", f"{100 * cumulative:.1f}",
                _fmt(r["best_gflops"], ".4g"), f"{100 * r['of_ceiling']:.0f}", r["trials"], _fmt(r["best_at"], "d")])
    return _table((["device"] if several else []) + [
        "task", "best ms", "% of latency", "cumulative %", "best GFLOP/s", "% of ceiling", "trials", "best at"],
        rows, numeric={i + several for i in range(1, 8)})


def _still_improving(summary: pd.DataFrame) -> str:
    """How many tasks found their best in the last quarter of their measurements (at least 4)."""
    s = summary[summary["best_at"].notna() & (summary["trials"] >= 4)]
    late = s[s["best_at"] > 0.75 * s["trials"]]
    if s.empty:
        return ""
    return (f"{len(late)} of {len(s)} tasks with at least 4 measurements found their best config in the last "
            f"quarter of them: more trials would likely improve {'them' if len(late) != 1 else 'it'}"
            + (f" (the most latency: {', '.join(_e(t) for t in late.sort_values('best_median_s', ascending=False)['task'].head(3))})"
               if len(late) else "") + ".")


def render_report(df: pd.DataFrame, artifact=None, min_trials: int = 5, title: str = "Tuning report",
                  sources=(), profile: dict | None = None, measure: bool = True) -> str:
    """The report's HTML (see the module docstring). ``df``: a frame from ``load_logs``. ``profile``: the
    per-layer profile to show (``artifact_profile``), else the one of ``artifact`` (a compiled model's
    directory), measured now when it has none and ``measure`` and its device is attached."""
    if df.empty:
        raise TunerError("no records to report on")
    if profile is None and artifact is not None:
        profile, _ = artifact_profile(artifact, measure=measure)
    summary = summarize(df)
    shares = latency_shares(summary)
    cmp = compare(df, min_trials=min_trials)
    devices = df[["device", "device_name"]].drop_duplicates("device")
    parts = [f"<h1>{_e(title)}</h1>",
             f'<p class="meta">{len(df)} records, {len(summary)} tasks, {int(df["ok"].sum())} successful, from '
             f'{_e(", ".join(map(str, sources)) or "records")}; device{"s" if len(devices) > 1 else ""}: '
             + ", ".join(f"{_e(d)} ({_e(n)})" for d, n in devices.itertuples(index=False))
             + f'; generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.</p>']

    parts += ["<h2>Templates</h2>",
              _img(template_figure(df, shares), "latency and measurement outcomes per template", ""),
              _template_table(df, summary, shares),
              '<p class="note">% of latency: the summed best times of the template\'s tasks over those of every '
              "task of the device, each task once (the log does not say how often a model runs a layer).</p>"]

    parts += ["<h2>Where the time goes</h2>",
              _img(top_tasks_figure(shares), "the tasks of most latency and their GFLOP/s against the ceiling",
                   "no successful measurement yet.")]
    if not shares.empty:
        parts += [_top_table(shares, TOP_TASKS),
                  f'<p class="note">The {TOP_TASKS} tasks of most latency per device (every task is in the tasks '
                  "table below). The ceiling is the best GFLOP/s any task reached on the device: a line drawn from "
                  "the data, not the hardware's peak.</p>"]

    parts += ["<h2>Convergence</h2>",
              _img(convergence_figure(df, shares), "convergence: a line per task", "no successful measurement yet.")]
    improving = _still_improving(summary)
    if improving:
        parts.append(f"<p>{improving}</p>")

    parts += ["<h2>Texture against buffer</h2>",
              _img(scope_figure(cmp), "texture against buffer per layer",
                   "no task with all operands in textures or all in buffers.")]
    if not cmp.empty:
        several = cmp["device"].nunique() > 1
        parts.append(_table(
            (["device"] if several else []) + ["workload", "texture ms", "texture GFLOP/s", "texture ok",
                                               "buffer ms", "buffer GFLOP/s", "buffer ok", "texture speedup",
                                               "--scope auto", "why textures lost"],
            [([_e(r["device"])] if several else []) + [
                _e(r["workload"]), _fmt(r["texture_median_s"] * 1e3, ".4g"), _fmt(r["texture_gflops"], ".4g"),
                r["texture_ok"], _fmt(r["buffer_median_s"] * 1e3, ".4g"), _fmt(r["buffer_gflops"], ".4g"),
                r["buffer_ok"], _fmt(r["texture_speedup"], ".3f"),
                _e(r["pick"] if isinstance(r["pick"], str) else r["note"]), _e(r["why"] or "-")]
             for _, r in cmp.iterrows()], numeric={i + several for i in range(1, 8)}))
        parts += [f"<p>{_e(line)}</p>" for line in loss_summary(cmp)]
        for _, t in compare_totals(cmp).iterrows():
            if t["compared"]:
                plural = "s" if t["compared"] > 1 else ""
                parts.append(f'<p>{_e(t["device"])}: over {t["compared"]} compared workload{plural} (each unique '
                             f'workload once) all-texture takes {t["texture_s"] * 1e3:.4g} ms, all-buffer '
                             f'{t["buffer_s"] * 1e3:.4g} ms, the per-workload pick {t["auto_s"] * 1e3:.4g} ms '
                             f'({t["auto_vs_texture"]:.2f}x and {t["auto_vs_buffer"]:.2f}x faster).</p>')
        parts.append(f'<p class="note">A side needs {min_trials} successful trials to be compared; texture '
                     "speedup = best buffer time / best texture time.</p>")

    parts += ["<h2>Errors</h2>"]
    failed = df[~df["ok"]]
    if not failed.empty:
        first = failed.groupby("error_name", sort=True).agg(n=("ok", "size"), task=("task", "first"),
                                                             msg=("error_msg", "first"))
        parts.append(_table(["error", "count", "first seen in", "its message"],
                            [[_e(e), r["n"], _e(r["task"]), f"<code>{_e(str(r['msg'])[:400])}</code>"]
                             for e, r in first.iterrows()], numeric={1}))
        parts.append('<p class="note">The outcomes per template are in the Templates figure; per task in the '
                     "tasks table.</p>")
    else:
        parts.append(f"<p>No measurement failed ({len(df)} measurements).</p>")

    if profile is not None:
        rows = profile["rows"]
        parts += ["<h2>Compiled model: per-layer latency</h2>",
                  _img(profile_figure(profile) if rows else None, "per-layer latency of the compiled model",
                       "the profile has no rows."),
                  _table(["node", "op", "template", "scopes", "median ms", "share"],
                         [[_e(r["node"]), _e(r["op"]), _e(r.get("template") or "-"), _e(_scope_text(r.get("scopes"))),
                           f"{r['median_s'] * 1e3:.4g}", f"{100 * r['median_s'] / profile['total_s']:.1f}%"
                           if profile["total_s"] else "-"]
                          for r in sorted(rows, key=lambda r: -r["median_s"])[:15]], numeric={4, 5}),
                  f'<p class="note">{"The 15 slowest" if len(rows) > 15 else "All"} of {len(rows)} layers, slowest '
                  f'first; total {profile["total_s"] * 1e3:.4g} ms on {_e(profile["device"])}.</p>']
        parts += [f'<p class="note">{_e(line)}</p>' for line in _profile_notes(profile)]

    # the tasks table last: with many tasks it is long, and the figures summarize it
    fail_cols = [c for c in summary.columns if c.startswith("failed.")]
    several = len(devices) > 1
    parts += ["<h2>Tasks</h2>", _table(
        (["device"] if several else []) + ["task", "trials", "ok", "failures", "best GFLOP/s", "best ms",
                                           "best at", "best config (scope knobs are in the task)"],
        [([_e(r["device"])] if several else []) + [
            _e(r["task"]), r["trials"], r["ok"], _e(", ".join(f"{c[7:]} {r[c]}" for c in fail_cols if r[c]) or "-"),
            _fmt(r["best_gflops"], ".4g"), _fmt(r["best_median_s"] * 1e3, ".4g"), _fmt(r["best_at"], "d"),
            f"<code>{_e(_knobs(r['best_config']))}</code>" if isinstance(r["best_config"], str) else "-"]
         for _, r in summary.iterrows()], numeric={i + several for i in (1, 2, 4, 5, 6)}),
        '<p class="note">best at: the measurement (counted from 1, in log order) that found the best config; '
        "close to the number of trials means the search was still improving.</p>"]

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width\"><title>{_e(title)}</title>"
            f"<link rel=\"icon\" href=\"data:,\"><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(parts) + "\n</body></html>\n")


def write_report(df: pd.DataFrame, path, artifact=None, min_trials: int = 5, title: str = "Tuning report",
                 sources=(), profile: dict | None = None, measure: bool = True) -> Path:
    """Render the report (``render_report``) and write it to ``path`` (``files.write_file``: a link refused, a
    device written through, a file replaced whole); returns the path."""
    from tuner.files import write_file
    text = render_report(df, artifact=artifact, min_trials=min_trials, title=title, sources=sources,
                         profile=profile, measure=measure)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file(path, lambda f: f.write(text.encode("utf-8")), "the report")
