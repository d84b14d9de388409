"""Tuning one task: a template, a workload and the operands' scopes on one device, as one Optuna study.

The study lives in an Optuna storage (SQLite under ``logs/`` by default, any storage URL accepted), and
every measurement is appended to a JSONL log before the study hears of it. A re-run of the same task
resumes the study: configs already in the log are never measured again (they are told to the study from
the log when a killed run did not get that far), and trials a killed run left running are marked failed.
A success is a COMPLETE trial valued in GFLOP/s, a failed measurement a FAIL trial (user attribute ``error``).

One evaluation loop (``optimize``) serves ``tune()`` (``LocalStrategy``: ask, answer from the log) and the
workers (``tuner.search.worker``: the claim protocol): propose -> build and measure -> ``Record.new`` -> log
-> tell (the ``Evaluator``), with callbacks (progress, early stopping, budgets) hearing every record.

    result = tune("conv2d", wl, device="pocl", trials=64)   # -> TuneResult(best record, ...)
"""
from __future__ import annotations

import contextlib
import os
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.errors import ErrorCode
from tuner.logs import Record, append_records, load_records
from tuner.logs.io import ensure_writable
from tuner.measure import MeasureInput, MeasureOptions, MeasureResult, Measurer
from tuner.search.samplers import _key, make_sampler
from tuner.search.shared import measured_error, open_storage
from tuner.search.task import TuningTask, log_knowledge


@dataclass
class TuneResult:
    study_name: str
    best: Record | None  # the fastest successful record of the task (this run's or an earlier one's)
    records: list = field(default_factory=list)  # the records this run measured
    measured: int = 0
    reused: int = 0  # proposals answered from the log without measuring
    log: str = ""
    label: str = ""  # the task in words: template, workload, scopes


def study_name(template: str, workload, scopes: dict, fingerprint: str, fixed: dict | None = None) -> str:
    return TuningTask(template, workload, scopes, fixed or {}).study_name(fingerprint)


def default_log(fingerprint: str) -> str:
    return f"logs/{fingerprint}.jsonl"


def default_storage(log: str) -> str:
    return f"sqlite:///{Path(log).parent / 'studies.db'}"


def _record(t, workload, scopes, cfg, info, res: MeasureResult, trial, sampler, study) -> Record:
    """The record of one measurement (``scopes`` are the config's own)."""
    return Record.new(t.name, workload, cfg, info, costs=res.costs if res.ok else (), error_code=res.error_code,
                      error_msg=res.error_msg[:4000], max_rel_error=res.max_rel_error, timestamp=res.timestamp,
                      duration_s=res.duration_s, trial=trial, sampler=sampler, study=study)


def _score(record: Record) -> float:
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
            study.tell(trial, _score(rec))
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
        recs = [_record(t, s.task.workload, s.task.scopes, c, self.info, res, tr.number, s.sampler,
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


class LocalStrategy:
    """``tune()``'s strategy: ask the study; a config the log has is answered from it (not measured), a
    config proposed twice in one batch is failed. Every trial asked is in ``asked`` until told, so that an
    interruption tells the study what the log has (``settle``)."""

    def __init__(self, session: Session, result: TuneResult, max_proposals: int):
        self.session, self.result, self.max_proposals = session, result, max_proposals
        self.proposals = 0
        self.asked: dict = {}  # trial number -> (trial, record once measured)

    def finished(self) -> bool:
        return self.proposals >= self.max_proposals

    def propose(self, n: int) -> list:
        s, todo = self.session, []
        while len(todo) < n and self.proposals < self.max_proposals:
            self.proposals += 1
            trial = s.study.ask(s.dists)
            trial.set_user_attr("owner", OWNER)
            self.asked[trial.number] = (trial, None)
            values = s.values(trial)
            k = _key(values, s.names)
            if k not in s.known:
                _learn_from_peers(s, k, trial.number)
            if k in s.known:  # measured before (this run, an earlier one, or a concurrent tuner): from the log
                rec = s.known[k]
                tell(s.study, trial, rec, from_log=True)
                self.result.reused += 1
            elif k in {_key(v, s.names) for _, v in todo} or _in_flight_elsewhere(s, k, trial.number):
                s.study.tell(trial, state=TrialState.FAIL)  # a duplicate: measured once, by whoever asked first
            else:
                todo.append((trial, values))
                continue
            del self.asked[trial.number]
        return todo

    def measured(self, proposals: list, recs: list) -> None:
        for (tr, _), rec in zip(proposals, recs):
            self.asked[tr.number] = (tr, rec)  # measured: told its value if the log has it when Ctrl-C comes

    def tell(self, trial, rec: Record) -> None:
        s = self.session
        s.known[_key(s.values(trial), s.names)] = rec
        tell(s.study, trial, rec, record=rec.to_dict())  # the study alone can rebuild the log
        del self.asked[trial.number]

    def settle(self) -> None:
        """Interrupted: trials whose record is in the log are told their measurement, the others are failed
        (a re-run proposes those again; the logged ones it answers from the log). Best effort: the storage
        may be gone, and then the next run's ``_recover`` does it."""
        study, log, asked = self.session.study, self.session.log, self.asked
        logged = set()
        if any(rec is not None for _, rec in asked.values()) and Path(log).exists():
            logged = {r.trial for r in load_records(log) if r.study == study.study_name}
        for trial, rec in asked.values():
            try:
                if rec is not None and trial.number in logged:
                    tell(study, trial, rec, record=rec.to_dict())
                else:
                    study.tell(trial, state=TrialState.FAIL)
            except Exception:  # noqa: BLE001 - told already, or the storage is unreachable: the next run's _recover
                pass
        asked.clear()


class Tally:
    """Callback: this run's measurements and the best record into the TuneResult, and the progress bar."""

    def __init__(self, result: TuneResult, bar=None):
        self.result, self.bar = result, bar

    def __call__(self, strategy, rec: Record) -> None:
        if rec.error_code == ErrorCode.INSTANTIATION:  # rejected before any device work: not a measurement
            return
        res = self.result
        res.measured += 1
        res.records.append(rec)
        if rec.ok and (res.best is None or _score(rec) > _score(res.best)):
            res.best = rec
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"best {_score(res.best):.3g} GFLOP/s" if res.best else "no success yet")


class EarlyStopping:
    """Callback: stop after ``patience`` measurements without a new best (counting from the best known)."""

    def __init__(self, patience: int, best: Record | None = None):
        self.patience, self.best, self.since = patience, _score(best) if best else None, 0

    def __call__(self, strategy, rec: Record) -> bool:
        if rec.error_code == ErrorCode.INSTANTIATION:
            return False
        if rec.ok and (self.best is None or _score(rec) > self.best):
            self.best, self.since = _score(rec), 0
        else:
            self.since += 1
        return self.since >= self.patience


def tune(template, workload, device=None, trials: int = 32, log: str | None = None, storage: str | None = None,
         sampler: str = "xgb", scopes: dict | None = None, seed: int | None = 0, early_stopping: int | None = None,
         batch: int | None = None, options: MeasureOptions | None = None, progress: bool = True,
         transfer: bool = True, fixed: dict | None = None, measurer: Measurer | None = None,
         fallback_first: bool = False) -> TuneResult:
    """Measure up to ``trials`` new configs of ``template`` (a registered name, or ``"module:ATTRIBUTE"``)
    on ``workload`` with ``sampler`` (xgb, tpe or random), stopping early after ``early_stopping``
    measurements without improvement. ``fixed`` pins knobs (a model pins its activation layout so that the
    kernel tuned is the kernel deployed). ``measurer``: an open Measurer to reuse (a model's tasks share
    one set of worker processes instead of starting them per task). ``fallback_first``: the template's
    fallback config is the first trial (unless the log has it), so tuned and untuned can be compared.

    Ctrl-C (KeyboardInterrupt) propagates: the trials it cut short are told to the study first (their
    measurement when the log has it, else failed), so no trial is left running and nothing in the log is
    measured again by a re-run."""
    from tuner.runtime.device import DeviceInfo, choose_device
    info = device.info if hasattr(device, "info") else device
    info = info if isinstance(info, DeviceInfo) else choose_device(info)
    spec = template if isinstance(template, str) else template.name  # measuring processes look it up again
    task = TuningTask(spec, workload, scopes, fixed or {}).bind(info)
    log = str(ensure_writable(log or default_log(info.fingerprint)))  # before any measurement
    storage = open_storage(storage or default_storage(log), heartbeat=None)  # validated, race-free creation
    options = options or MeasureOptions()
    session = open_session(task, info, storage, task.study_name(info.fingerprint), log, sampler, seed, transfer)
    _recover(session)
    if fallback_first:
        _enqueue_fallback(session)

    best = max((r for r in session.known.values() if r.ok), key=_score, default=None)
    result = TuneResult(session.study.study_name, best, log=log, label=task.label)
    bar = _progress(trials, progress, task.label)
    callbacks = [Tally(result, bar)] + ([EarlyStopping(early_stopping, best)] if early_stopping else [])
    own = measurer is not None
    batch = batch or options.n_parallel
    try:
        with Evaluator(info, log, (lambda: contextlib.nullcontext(measurer)) if own else
                       (lambda: Measurer(info, options))) as evaluate:
            optimize([LocalStrategy(session, result, 20 * trials + 100)], evaluate,
                     lambda: min(batch, trials - result.measured), callbacks)
    finally:
        if bar is not None:
            bar.close()
    return result


def _enqueue_fallback(s: Session) -> None:
    """Make the template's fallback config (what a model runs untuned) the next trial, unless the log has it
    or it is waiting in the study already (an interrupted run enqueued it)."""
    values = s.task.tmpl.config_values(s.task.workload, s.task.fallback(s.info))
    if any(n not in values for n in s.names):
        return
    params = {n: values[n] for n in s.names}
    if _key(params, s.names) in s.known:
        return
    for tr in s.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if all(tr.params.get(n) == params[n] for n in s.names):
            return
    s.study.enqueue_trial(params)


def _recover(s: Session) -> None:
    """After a killed run: running trials are marked failed; measurements in the log that the study never
    heard of are added to it (failures as FAIL trials), so the sampler learns from them and never proposes
    them again."""
    in_study = set()
    for tr in s.study.get_trials(deepcopy=False):
        if tr.state == TrialState.RUNNING:
            if _owner_alive(tr):  # another tuner on this study is measuring it
                continue
            try:
                s.study._storage.set_trial_state_values(tr._trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                pass
        elif (tr.state == TrialState.COMPLETE or measured_error(tr)) and all(n in tr.params for n in s.names):
            in_study.add(_key(tr.params, s.names))
    dists = s.dists
    for k, rec in s.known.items():
        if k not in in_study:
            attrs = {"from_log": True, "error": rec.error_name, "record": rec.to_dict()}
            state = TrialState.COMPLETE if rec.ok else TrialState.FAIL
            s.study.add_trial(optuna.trial.create_trial(params=dict(zip(s.names, k)), distributions=dists,
                                                        value=_score(rec) if rec.ok else None, state=state,
                                                        user_attrs=attrs))


OWNER = f"{socket.gethostname()}:{os.getpid()}"


def _owner_alive(trial) -> bool:
    """Whether the tuner that asked a RUNNING trial still runs (known for tuners on this host)."""
    owner = trial.user_attrs.get("owner", "")
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False  # our own leftovers (an earlier session of this process) are dead
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _peer_trials(s, number: int, states) -> list:
    return [tr for tr in s.study.get_trials(deepcopy=False, states=states) if tr.number != number
            and all(n in tr.params for n in s.names)]


def _in_flight_elsewhere(s, k, number: int) -> bool:
    """Another tuner on this study is measuring the same config (a RUNNING trial it asked first)."""
    return any(_key(tr.params, s.names) == k and tr.number < number and _owner_alive(tr)
               for tr in _peer_trials(s, number, (TrialState.RUNNING,)))


def _learn_from_peers(s, k, number: int) -> None:
    """A config a concurrent tuner measured since this session opened: its record joins ``known``."""
    for tr in _peer_trials(s, number, (TrialState.COMPLETE, TrialState.FAIL)):
        d = tr.user_attrs.get("record")
        if d and _key(tr.params, s.names) == k:
            try:
                s.known[k] = Record.from_dict(d)
            except Exception:  # noqa: BLE001 - a record another version wrote: measure instead
                continue
            return


def _progress(total: int, enabled: bool, desc: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="trial", dynamic_ncols=True)
