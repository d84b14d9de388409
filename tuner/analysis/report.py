"""One self-contained HTML report of tuning logs: tables and matplotlib figures, PNGs embedded as data URIs.

Sections: the tasks (trials, failures, best), convergence (best GFLOP/s so far against the measurement
number, per task and sampler), texture against buffer per layer, achieved GFLOP/s against the device's
ceiling, the error breakdown and, given a compiled model's directory, its per-layer latency from
``profile.json``. The file has no scripts and loads nothing: it opens from an e-mail attachment.

The ceiling is the best GFLOP/s any task reached on the device, labelled as such: an honest, data-driven
upper line, not the device's peak (which nothing here measures).
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
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
from matplotlib.patches import Patch

from tuner.analysis.compare import CPU_REASON, compare, compare_totals, device_type, loss_summary
from tuner.analysis.summary import summarize
from tuner.errors import TunerError

SCOPE_COLORS = {"texture": "#4C72B0", "buffer": "#DD8452", "mixed": "#8172B3", "none": "#937860"}
ERROR_COLORS = {"NO_ERROR": "#55A868", "INSTANTIATION": "#8C8C8C", "COMPILE": "#C44E52", "RUNTIME": "#DD8452",
                "WRONG_ANSWER": "#8172B3", "BUILD_TIMEOUT": "#937860", "RUN_TIMEOUT": "#DA8BC3",
                "UNKNOWN": "#CCB974"}
DPI = 90


# ----------------------------------------------------------------------------------------------- figures

def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _short(label: str, n: int = 48) -> str:
    return label if len(label) <= n else label[:n - 1] + "…"


def convergence_figure(df: pd.DataFrame) -> Figure | None:
    """Best GFLOP/s so far against the measurement number (log order), one panel per task, one line per
    sampler; failures count as measurements. None when nothing succeeded."""
    if not df["ok"].any():
        return None
    tasks = df.groupby(["device", "task"], sort=True)
    several = df["device"].nunique() > 1
    n = tasks.ngroups
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(4.2 * ncols, 2.7 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    samplers = sorted(df["sampler"].fillna("unknown").unique())
    colors = dict(zip(samplers, ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"] * 4))
    for ax, ((device, task), g) in zip(axes, tasks):
        for sampler, s in g.groupby(g["sampler"].fillna("unknown"), sort=True):
            best = s["gflops"].where(s["ok"]).cummax()  # NaN until the first success
            x = np.arange(1, len(s) + 1)
            ax.step(x, best.to_numpy(dtype=float), where="post", color=colors[sampler], label=sampler)
            ax.plot(x, s["gflops"].where(s["ok"]).to_numpy(dtype=float), ".", color=colors[sampler],
                    alpha=0.35, markersize=4)
        ax.set_title(_short((device + ": " if several else "") + task, 60), fontsize=8)
        ax.set_xlabel("measurement", fontsize=8)
        ax.set_ylabel("best GFLOP/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle("Convergence: best GFLOP/s so far (line) and each measurement (dots)", fontsize=10)
    return fig


def _device_panels(device_column: pd.Series, row_inches: float):
    """One horizontal-bar panel per device, stacked, each as tall as its rows: ``(fig, [(ax, device)])``."""
    devices = list(dict.fromkeys(device_column))
    heights = [row_inches * (device_column == d).sum() + 0.9 for d in devices]
    fig = Figure(figsize=(9, sum(heights) + 0.3), layout="constrained")
    axes = fig.subplots(len(devices), 1, squeeze=False, height_ratios=heights).ravel()
    return fig, list(zip(axes, devices))


def scope_figure(cmp: pd.DataFrame) -> Figure | None:
    """Best texture against best buffer GFLOP/s per layer; hatched bars: sides with too few trials."""
    if cmp.empty:
        return None
    fig, panels = _device_panels(cmp["device"], 0.38)
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
            top = np.nanmax([r["texture_gflops"], r["buffer_gflops"], 0])
            note = (f"{r['texture_speedup']:.2f}x" if isinstance(r["pick"], str) else "too few trials")
            ax.text(top, i, "  " + note, va="center", fontsize=7)
        ax.set_yticks(y, [_short(w) for w in c["workload"]], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("best GFLOP/s  (label: texture speedup = buffer time / texture time)", fontsize=8)
        ax.set_title(f"Texture against buffer per layer on {device}", fontsize=9)
        ax.margins(x=0.15)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return fig


def ceiling_figure(summary: pd.DataFrame) -> Figure | None:
    """Each task's best GFLOP/s against the best any task reached on the same device."""
    s = summary[summary["best_gflops"].notna()]
    if s.empty:
        return None
    fig, panels = _device_panels(s["device"], 0.3)
    for ax, device in panels:
        d = s[s["device"] == device].reset_index(drop=True)
        ceiling = d["best_gflops"].max()
        colors = [SCOPE_COLORS.get(sc, SCOPE_COLORS["mixed"]) for sc in d["scopes"]]
        ax.barh(np.arange(len(d)), d["best_gflops"], color=colors)
        for i, v in enumerate(d["best_gflops"]):
            ax.text(v, i, f" {100 * v / ceiling:.0f}%", va="center", fontsize=7)
        ax.axvline(ceiling, color="black", linestyle="--", linewidth=1)
        ax.text(ceiling, -0.7, f"ceiling {ceiling:.3g} GFLOP/s\n(best seen on this device, not a measured peak)",
                ha="right", va="bottom", fontsize=7)
        ax.set_yticks(np.arange(len(d)), [_short(t, 56) for t in d["task"]], fontsize=7)
        ax.invert_yaxis()
        ax.set_ylim(len(d) - 0.5, -1.6)
        ax.set_xlabel("best GFLOP/s (bar colour: scopes; label: % of the ceiling)", fontsize=8)
        ax.set_title(f"Achieved GFLOP/s on {device}", fontsize=9)
        ax.margins(x=0.1)
        ax.grid(axis="x", alpha=0.3)
    return fig


def error_figure(df: pd.DataFrame) -> Figure:
    """Measurements per task, stacked by outcome (NO_ERROR first)."""
    counts = df.groupby(["task", "error_name"]).size().unstack(fill_value=0)
    order = [e for e in ERROR_COLORS if e in counts.columns] + sorted(set(counts.columns) - set(ERROR_COLORS))
    counts = counts[order]
    fig = Figure(figsize=(9, 0.3 * len(counts) + 1.4), layout="constrained")
    ax = fig.subplots()
    left = np.zeros(len(counts))
    y = np.arange(len(counts))
    for e in order:
        v = counts[e].to_numpy()
        ax.barh(y, v, left=left, color=ERROR_COLORS.get(e, "#999999"), label="ok" if e == "NO_ERROR" else e)
        left += v
    ax.set_yticks(y, [_short(t, 56) for t in counts.index], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("measurements", fontsize=8)
    failed = int((~df["ok"]).sum())
    ax.set_title(f"Outcomes per task: {failed} of {len(df)} measurements failed", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
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


def profile_figure(profile: dict) -> Figure:
    """The compiled model's per-layer latency, in execution order, coloured by scopes."""
    rows = profile["rows"]
    fig = Figure(figsize=(9, 0.26 * len(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    y = np.arange(len(rows))
    ms = [r["median_s"] * 1e3 for r in rows]
    kinds = [_scope_kind(r.get("scopes")) for r in rows]
    ax.barh(y, ms, color=[SCOPE_COLORS[k] for k in kinds])
    ax.set_yticks(y, [_short(f"{r['node']} ({r['op']})", 50) for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median ms", fontsize=8)
    ax.legend(handles=[Patch(color=SCOPE_COLORS[k], label=k) for k in SCOPE_COLORS if k in kinds], fontsize=7,
              loc="lower right")
    ax.set_title(f"Per-layer latency on {profile['device']}: total {profile['total_s'] * 1e3:.4g} ms "
                 f"(layers sum to {sum(ms):.4g} ms)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return fig


# ------------------------------------------------------------------------------------------------ profile

def load_profile(artifact) -> dict:
    """``DIR/profile.json`` of a compiled model, checked: ``{"device": str, "rows": [{"node": str, "op": str,
    "template": str|null, "scopes": str|null, "median_s": number}, ...], "total_s": number}``."""
    path = Path(artifact)
    if not path.is_dir():
        raise TunerError(f"--artifact {artifact}: not a directory (give a compiled model's directory)")
    path = path / "profile.json"
    if not path.is_file():
        raise TunerError(f"{path}: no such file; the artifact has no per-layer profile (profile the compiled "
                         f"model to write it)")
    try:
        profile = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise TunerError(f"{path}: not valid JSON ({e})") from None
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


def render_report(df: pd.DataFrame, artifact=None, min_trials: int = 5, title: str = "Tuning report",
                  sources=()) -> str:
    """The report's HTML (see the module docstring). ``df``: a frame from ``load_logs``."""
    if df.empty:
        raise TunerError("no records to report on")
    profile = load_profile(artifact) if artifact is not None else None
    summary = summarize(df)
    cmp = compare(df, min_trials=min_trials)
    devices = df[["device", "device_name"]].drop_duplicates("device")
    parts = [f"<h1>{_e(title)}</h1>",
             f'<p class="meta">{len(df)} records, {len(summary)} tasks, {int(df["ok"].sum())} successful, from '
             f'{_e(", ".join(map(str, sources)) or "records")}; device{"s" if len(devices) > 1 else ""}: '
             + ", ".join(f"{_e(d)} ({_e(n)})" for d, n in devices.itertuples(index=False))
             + f'; generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.</p>']

    parts += ["<h2>Convergence</h2>",
              _img(convergence_figure(df), "convergence per task and sampler", "no successful measurement yet.")]

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

    parts += ["<h2>Achieved GFLOP/s against the ceiling</h2>",
              _img(ceiling_figure(summary), "achieved GFLOP/s against the device ceiling",
                   "no successful measurement yet."),
              '<p class="note">The ceiling is the best GFLOP/s any task reached on the device: a line drawn from '
              "the data, not the hardware's peak.</p>"]

    parts += ["<h2>Errors</h2>", _img(error_figure(df), "measurement outcomes per task", "")]
    failed = df[~df["ok"]]
    if not failed.empty:
        first = failed.groupby("error_name", sort=True).agg(n=("ok", "size"), task=("task", "first"),
                                                             msg=("error_msg", "first"))
        parts.append(_table(["error", "count", "first seen in", "its message"],
                            [[_e(e), r["n"], _e(r["task"]), f"<code>{_e(str(r['msg'])[:400])}</code>"]
                             for e, r in first.iterrows()], numeric={1}))

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
                 sources=()) -> Path:
    """Render the report and write it to ``path`` (``files.write_file``: a link refused, a device written
    through, a file replaced whole); returns the path."""
    from tuner.files import write_file
    text = render_report(df, artifact=artifact, min_trials=min_trials, title=title, sources=sources)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_file(path, lambda f: f.write(text.encode("utf-8")), "the report")
