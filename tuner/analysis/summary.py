"""Per-task summaries of a log frame: trials, failures by error, the best config and when it was found."""
from __future__ import annotations

import json

import pandas as pd

# What one tuning task is (Record.task_key): the same workload with other scopes or on another device is
# another task.
TASK = ["device", "template", "workload_key", "scopes"]


def _python(v):
    return v.item() if hasattr(v, "item") else v


def config_of(row: pd.Series) -> dict:
    """The knob values of one row (``cfg.*`` columns, NA knobs of other templates left out)."""
    return {c[4:]: _python(v) for c, v in row.items() if c.startswith("cfg.") and not pd.isna(v)}


def knobs_text(config) -> str:
    """A config (dict or its JSON) for a table: ``tile_oc=2 wg_w=8 unroll_rs=true``, without the scope knobs
    (the task label shows the scopes); half arithmetic first (``compute=half tile_oc=2 ...``), where a table cut
    to the terminal's width still shows it. Exports keep the full JSON."""
    if isinstance(config, str):
        config = json.loads(config)
    items = [(k, v) for k, v in config.items() if not k.endswith("_scope")]
    items.sort(key=lambda kv: not (kv[0] == "compute" and kv[1] != "float32"))  # stable: the rest in order
    return " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in items)


def best_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The best successful row of each task: the lowest median; ties go to the earlier record, failures are
    never picked (as ``apply_history_best``). Sorted by device and task."""
    ok = df[df["ok"]]
    if ok.empty:
        return df.iloc[0:0]
    idx = ok.groupby(TASK, sort=False)["median_s"].idxmin()
    return df.loc[idx.values].sort_values(["device", "task"], kind="stable")


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per task: ``device``, ``device_name``, ``task``, ``template``, ``workload``, ``scopes``,
    ``trials`` (records), ``ok``, ``failed``, ``failed.<ERROR_NAME>`` per error seen, ``best_gflops``,
    ``best_median_s``, ``best_at`` (the record, counted from 1 in log order, that found the best: close to
    ``trials`` means the search was still improving) and ``best_config`` (JSON)."""
    cols = ["device", "device_name", "task", "template", "workload", "scopes", "trials", "ok", "failed"]
    if df.empty:
        return pd.DataFrame({c: [] for c in cols + ["best_gflops", "best_median_s", "best_at", "best_config"]})
    g = df.groupby(TASK, sort=False)
    out = g.agg(device_name=("device_name", "first"), task=("task", "first"), workload=("workload", "first"),
                trials=("ok", "size"), ok=("ok", "sum")).reset_index()
    out["failed"] = out["trials"] - out["ok"]
    failed = df[~df["ok"]]
    if not failed.empty:
        counts = failed.groupby(TASK + ["error_name"], sort=False).size().unstack("error_name", fill_value=0)
        counts.columns = [f"failed.{c}" for c in counts.columns]
        out = out.merge(counts.reset_index(), on=TASK, how="left")
        fail_cols = sorted(c for c in out.columns if c.startswith("failed."))
        out[fail_cols] = out[fail_cols].fillna(0).astype("int64")
    else:
        fail_cols = []
    position = g.cumcount() + 1  # the n-th record of its task, in log order
    best = best_rows(df)
    best_info = pd.DataFrame({
        **{c: best[c] for c in TASK},
        "best_gflops": best["gflops"], "best_median_s": best["median_s"],
        "best_at": position.loc[best.index].astype("Int64"),
        "best_config": [json.dumps(config_of(row)) for _, row in best.iterrows()],
    })
    out = out.merge(best_info, on=TASK, how="left")
    out = out[cols + fail_cols + ["best_gflops", "best_median_s", "best_at", "best_config"]]
    return out.sort_values(["device", "task"], kind="stable").reset_index(drop=True)
