"""Tuning logs: one JSON line per measurement (``record``), safe concurrent appends and tolerant loading
(``io``), and picking the best configs back out (``best``)."""
from tuner.logs.best import (ApplyHistoryBest, FallbackConfigWarning, apply_history_best, best_records,
                             current_history)
from tuner.logs.io import TuningLogWarning, append_records, iter_records, load_records
from tuner.logs.record import SCHEMA_VERSION, Record

__all__ = ["Record", "SCHEMA_VERSION", "append_records", "load_records", "iter_records", "best_records",
           "apply_history_best", "ApplyHistoryBest", "current_history", "TuningLogWarning",
           "FallbackConfigWarning"]
