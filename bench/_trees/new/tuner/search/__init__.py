"""Search: one Optuna study per task, driven by an XGBoost cost-model sampler (or TPE / random); workers
on many machines share tasks and studies through one storage (``tuner.search.worker``)."""
from tuner.search.samplers import ConstrainedRandomSampler, XGBSampler, make_sampler
from tuner.task import TuningTask
from tuner.search.tune import TuneResult, study_name, tune
from tuner.search.worker import (Task, WorkerSummary, export_study_records, model_prefix, register_tasks,
                                 registered_tasks, run_worker)

__all__ = ["ConstrainedRandomSampler", "XGBSampler", "make_sampler", "TuneResult", "study_name", "tune", "Task",
           "TuningTask", "WorkerSummary", "export_study_records", "model_prefix", "register_tasks", "registered_tasks",
           "run_worker"]
