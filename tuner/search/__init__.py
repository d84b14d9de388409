"""Search: one Optuna study per task, driven by an XGBoost cost-model sampler (or TPE / random)."""
from tuner.search.samplers import ConstrainedRandomSampler, XGBSampler, make_sampler
from tuner.search.tune import TuneResult, study_name, tune

__all__ = ["ConstrainedRandomSampler", "XGBSampler", "make_sampler", "TuneResult", "study_name", "tune"]
