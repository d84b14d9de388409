"""The evaluation loop, shared by ``tune()`` (``tuner.search.tune.LocalStrategy``) and the workers
(``tuner.search.worker.ClaimStrategy``): propose -> build and measure -> ``Record.new`` -> log -> tell, with
callbacks (progress, early stopping, budgets) hearing every record -- AutoTVM's ``Tuner.tune`` loop with Kernel
Tuner's ``CostFunc`` as the ``Evaluator``.

A strategy has ``finished()``, ``propose(n) -> [(trial, knob values)]``, ``measured(proposals, records)`` (the
records exist, before the log has them), ``tell(trial, record)`` and ``settle()`` (on the way out)."""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.errors import ErrorCode
from tuner.logs import Record, append_records
from tuner.measure import MeasureInput, MeasureResult
from tuner.search.samplers import make_sampler
from tuner.search.task import TuningTask, log_knowledge


def record_of(t, workload, cfg, info, res: MeasureResult, trial, sampler, study) -> Record:
    """The record of one measurement (its scopes are the config's own)."""
    return Record.new(t.name, workload, cfg, info, costs=res.costs if res.ok else (), error_code=res.error_code,
                      error_msg=res.error_msg[:4000], max_rel_error=res.max_rel_error, timestamp=res.timestamp,
                      duration_s=res.duration_s, trial=trial, sampler=sampler, study=study)


def score(record: Record) -> float:
    return float(record.gflops) if record.ok and record.gflops else 0.0


@dataclass
class Session:
    """One task's study on one device: the bound task, its space and distributions, the study, the log and
    what the log knows of the task."""
    task: TuningTask
    info: object
    space: object
    study: object
    log: str
    sampler: str
    known: dict
    names: list = field(init=False)
    dists: dict = field(init=False)

    def __post_init__(self):
        self.names = list(self.space.choices)
        self.dists = {n: CategoricalDistribution(c) for n, c in self.space.choices.items()}

    def values(self, trial) -> dict:
        return {n: trial.params[n] for n in self.names}


def open_session(task: TuningTask, info, storage, name: str, log: str, sampler: str = "xgb", seed=None,
                 transfer: bool = True, seen_from_log: bool = True, wrap=None) -> Session:
    """The task bound to ``info`` (scopes decided), its space, the log's knowledge, the sampler (``wrap``ped,
    e.g. to announce trials) and the study ``name`` in ``storage`` (created or resumed), its attributes
    readable in optuna-dashboard: the task, its label and the objective's name."""
    task = task.bind(info)
    space = task.space(info)
    known, others = log_knowledge(log, task, info.fingerprint, space, transfer)
    t = task.tmpl
    smp = make_sampler(sampler, space, t, t.space_vars(task.workload), seed=seed, transfer=others,
                       seen=set(known) if seen_from_log else None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                sampler=wrap(smp) if wrap else smp, load_if_exists=True)
    study.set_user_attr("task", task.attrs(info.fingerprint))
    study.set_user_attr("label", task.label)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["GFLOP/s"])
    return Session(task, info, space, study, log, sampler, known)


def tell(study, trial, rec: Record, **attrs) -> None:
    """A measured trial: COMPLETE with its GFLOP/s, or FAIL with the error's name (user attribute ``error``)."""
    try:
        trial.set_user_attr("error", rec.error_name)
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if rec.ok:
            study.tell(trial, score(rec))
        else:
            study.tell(trial, state=TrialState.FAIL)
    except UpdateFinishedTrialError:  # another tuner on this study settled it; the log has the record
        pass


class Evaluator:
    """Kernel Tuner's CostFunc: builds and measures a strategy's proposals (``[(trial, knob values)]``),
    records each (``Record.new``), appends the records to the log (first: a kill after this loses nothing
    measured), then has the strategy tell its study. The Measurer (``open_measurer()``) starts on first use."""

    def __init__(self, info, log: str, open_measurer):
        self.info, self.log, self.open_measurer = info, log, open_measurer
        self.measurer = None
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def __call__(self, strategy, proposals: list) -> list:
        s = strategy.session
        t = s.task.tmpl
        cfgs = [t.make_config(v) for _, v in proposals]
        if self.measurer is None:
            self.measurer = self.stack.enter_context(self.open_measurer())
        outs = self.measurer.measure([MeasureInput(s.task.template, s.task.workload, c) for c in cfgs])
        recs = [record_of(t, s.task.workload, c, self.info, res, tr.number, s.sampler,
                        s.study.study_name) for (tr, _), c, res in zip(proposals, cfgs, outs)]
        strategy.measured(proposals, recs)
        append_records(self.log, recs)
        for (tr, _), rec in zip(proposals, recs):
            strategy.tell(tr, rec)
        return recs


def optimize(strategies: list, evaluate, room, callbacks=(), idle=None) -> None:
    """The evaluation loop. Each round the first unfinished strategy that proposes anything (up to ``room()``
    configs) has its proposals evaluated, and every callback hears each record (``callback(strategy,
    record)``; a true answer ends the loop after the round). When none proposes: ``idle()`` and again (other
    workers hold the rest), or without ``idle`` the end. Ends too when every strategy is finished or
    ``room()`` is 0. Each strategy's ``settle()`` runs on the way out, Ctrl-C included."""
    try:
        while True:
            n = room()
            live = [s for s in strategies if not s.finished()]
            if n <= 0 or not live:
                return
            for s in live:
                proposals = s.propose(n)
                if proposals:
                    break
            else:
                if idle is None:
                    return
                idle()
                continue
            stop = False
            for rec in evaluate(s, proposals):
                for cb in callbacks:
                    stop = bool(cb(s, rec)) or stop
            if stop:
                return
    finally:
        for s in strategies:
            s.settle()


class EarlyStopping:
    """Callback: stop after ``patience`` measurements without a new best (counting from the best known)."""

    def __init__(self, patience: int, best: Record | None = None):
        self.patience, self.best, self.since = patience, score(best) if best else None, 0

    def __call__(self, strategy, rec: Record) -> bool:
        if rec.error_code == ErrorCode.INSTANTIATION:
            return False
        if rec.ok and (self.best is None or score(rec) > self.best):
            self.best, self.since = score(rec), 0
        else:
            self.since += 1
        return self.since >= self.patience


def progress_bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="trial", dynamic_ncols=True)
