"""Analysis of tuning logs: pandas DataFrames, texture-versus-buffer comparisons, HTML reports.

    from tuner.analysis import load_logs, compare, summarize
    df = load_logs("logs/*.jsonl")      # one row per record, typed columns (see tuner.analysis.frame)
    summarize(df)                       # per task: trials, failures by error, best GFLOP/s and config
    compare(df)                         # per workload: best all-texture vs best all-buffer config
    write_report(df, "report.html")     # one self-contained HTML file with figures
"""
from tuner.analysis.compare import compare, compare_totals, pick_scopes
from tuner.analysis.frame import export_frame, load_logs, read_export, records_frame, workload_label
from tuner.analysis.summary import best_rows, summarize

# the report pulls in matplotlib: imported on first use
_LAZY = {"render_report": "tuner.analysis.report", "write_report": "tuner.analysis.report",
         "load_profile": "tuner.analysis.report"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tuner.analysis' has no attribute {name!r}")


__all__ = ["load_logs", "records_frame", "export_frame", "read_export", "workload_label", "summarize",
           "best_rows", "compare", "compare_totals", "pick_scopes", *_LAZY]
