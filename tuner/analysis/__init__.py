"""Analysis of tuning logs: pandas DataFrames, texture-versus-buffer comparisons, HTML reports.

    from tuner.analysis import load_logs, compare
    df = load_logs("logs/*.jsonl")                  # one row per record, typed columns
    compare(df)                                     # best texture vs best buffer config per workload
"""
from tuner.analysis.frame import export_frame, load_logs, read_export, records_frame, workload_label

__all__ = ["load_logs", "records_frame", "export_frame", "read_export", "workload_label"]
