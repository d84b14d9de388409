"""Tuning one task: a template, a workload and the operands' scopes on one device, as one Optuna study.

The study lives in an Optuna storage (SQLite under ``logs/`` by default, any storage URL accepted), and
every measurement is appended to a JSONL log before the study hears of it. A re-run of the same task
resumes the study: configs already in the log are never measured again (they are told to the study from
the log when a killed run did not get that far), and trials a killed run left running are marked failed.

    result = tune("conv2d", wl, device="pocl", trials=64)   # -> TuneResult(best record, ...)
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner import __version__
from tuner.errors import ErrorCode, TunerError
from tuner.logs import SCHEMA_VERSION, Record, append_records, load_records
from tuner.measure import MeasureInput, MeasureOptions, MeasureResult, Measurer
from tuner.search.samplers import _key, make_sampler

SCOPES = ("input", "weight", "output")


@dataclass
class TuneResult:
    study_name: str
    best: Record | None  # the fastest successful record of the task (this run's or an earlier one's)
    records: list = field(default_factory=list)  # the records this run measured
    measured: int = 0
    reused: int = 0  # proposals answered from the log without measuring
    log: str = ""


def study_name(template: str, workload, scopes: dict, fingerprint: str, fixed: dict | None = None) -> str:
    task = {"template": template, "workload": workload.key(), "scopes": scopes}
    if fixed:  # knobs a model pins (its activation layout): a different task from the free one
        task["fixed"] = fixed
    task = json.dumps(task, sort_keys=True)
    return f"{template}-{hashlib.sha1(task.encode()).hexdigest()[:12]}-{fingerprint}"


def default_log(fingerprint: str) -> str:
    return f"logs/{fingerprint}.jsonl"


def default_storage(log: str) -> str:
    return f"sqlite:///{Path(log).parent / 'studies.db'}"


def _record(t, workload, scopes, cfg, info, res: MeasureResult, trial, sampler, study) -> Record:
    median = res.median if res.ok else None
    return Record(version=SCHEMA_VERSION, template=t.name, workload=workload.key(), scopes=dict(scopes),
                  config=dataclasses.asdict(cfg), device=info.fingerprint, device_name=info.name,
                  platform=info.platform, driver=info.driver_version, costs=list(res.costs) if res.ok else [],
                  median_s=median, gflops=workload.flops / median / 1e9 if median else None,
                  error_code=int(res.error_code), error_name=ErrorCode(res.error_code).name,
                  error_msg=res.error_msg[:4000], max_rel_error=res.max_rel_error, timestamp=res.timestamp,
                  duration_s=res.duration_s, tuner_version=__version__, trial=trial, sampler=sampler, study=study)


def _score(record: Record) -> float:
    return float(record.gflops) if record.ok and record.gflops else 0.0


def log_knowledge(log: str, t, workload, scopes: dict, fingerprint: str, space, transfer: bool = True):
    """What a log knows for a task: ``known`` maps each config key of this task to its best record (never
    measured again); ``others`` holds ``(vars, values, gflops)`` of successful records of other workloads of
    the template on the device, for the sampler's transfer learning."""
    known: dict = {}
    others = []
    if not Path(log).exists():
        return known, others
    names = list(space.choices)
    wkey = json.dumps(workload.key(), sort_keys=True)
    for r in load_records(log):
        if r.device != fingerprint or r.template != t.name:
            continue
        values = {"dtype": r.workload.get("dtype"), **r.config}
        if json.dumps(r.workload, sort_keys=True) == wkey and r.scopes == scopes:
            if all(values.get(n) in space.choices[n] for n in names):
                k = _key(values, names)
                if k not in known or _score(r) > _score(known[k]):
                    known[k] = r
        elif r.ok and transfer:
            try:
                others.append((t.space_vars(workload_of(t, r.workload)), values, r.gflops))
            except (TypeError, ValueError):
                continue
    return known, others


def workload_of(t, key: dict):
    """A template's workload object from its key (JSON lists back to tuples)."""
    return t.workload(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in key.items() if k != "op"})


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
    from tuner.templates import get_template
    spec = template if isinstance(template, str) else template.name  # measuring processes look it up again
    t = get_template(spec)
    info = device.info if hasattr(device, "info") else device
    info = info if isinstance(info, DeviceInfo) else choose_device(info)
    if scopes is None:
        fb = t.fallback(workload, info)
        scopes = {k: getattr(fb, f"{k}_scope") for k in SCOPES}
    bad = set(scopes) - set(SCOPES) or {v for v in scopes.values() if v not in ("texture", "buffer")}
    if bad:
        raise TunerError(f"scopes {scopes}: keys input/weight/output, values texture or buffer")
    fixed = dict(fixed or {})
    space = t.space(workload, info, **fixed, **{f"{k}_scope": v for k, v in scopes.items()})
    names = list(space.choices)
    log = log or default_log(info.fingerprint)
    storage = storage or default_storage(log)
    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    name = study_name(t.name, workload, scopes, info.fingerprint, fixed)
    options = options or MeasureOptions()
    batch = batch or options.n_parallel

    known, others = log_knowledge(log, t, workload, scopes, info.fingerprint, space, transfer)
    vars = t.space_vars(workload)
    smp = make_sampler(sampler, space, t.name, vars, seed=seed, transfer=others, seen=set(known))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=smp,
                                load_if_exists=True)
    study.set_user_attr("task", {"template": t.name, "workload": workload.key(), "scopes": scopes,
                                 "device": info.fingerprint})
    dists = {n: CategoricalDistribution(c) for n, c in space.choices.items()}
    _recover(study, known, names, dists)
    if fallback_first:
        _enqueue_fallback(study, t, workload, info, scopes, fixed, known, names)

    best = max((r for r in known.values() if r.ok), key=_score, default=None)
    result = TuneResult(name, best, log=log)
    since_best = 0
    bar = _progress(trials, progress, name)
    try:
        with (nullcontext(measurer) if measurer is not None else Measurer(info, options)) as measurer:
            task = _Task(study, t, spec, workload, scopes, info, names, dists, known, result, measurer, sampler,
                         bar)
            proposals = 0
            while result.measured < trials and proposals < 20 * trials + 100:
                if early_stopping and since_best >= early_stopping:
                    break
                asked: dict = {}  # trial number -> (trial, record once logged): told before Ctrl-C propagates
                try:
                    proposals, since_best = _batch(task, batch, trials, proposals, since_best, asked)
                except BaseException:
                    _settle(study, asked, log)
                    raise
    finally:
        if bar is not None:
            bar.close()
    return result


@dataclass
class _Task:
    """What one tune() call measures with: its study, template, workload, scopes, device, knobs, the log's
    knowledge, the result so far, the measurer, the sampler's name and the progress bar."""
    study: object
    t: object
    spec: str
    workload: object
    scopes: dict
    info: object
    names: list
    dists: dict
    known: dict
    result: TuneResult
    measurer: Measurer
    sampler: str
    bar: object


def _batch(task: _Task, batch: int, trials: int, proposals: int, since_best: int, asked: dict) -> tuple:
    """Ask for up to ``batch`` unmeasured configs, measure them, log them, tell the study; returns the updated
    ``(proposals, since_best)``. Every trial asked is in ``asked`` until told."""
    study, t, names, known, result, bar = task.study, task.t, task.names, task.known, task.result, task.bar
    todo = []  # (trial, values)
    while len(todo) < min(batch, trials - result.measured) and proposals < 20 * trials + 100:
        proposals += 1
        trial = study.ask(task.dists)
        asked[trial.number] = (trial, None)
        values = {n: trial.params[n] for n in names}
        k = _key(values, names)
        if k in known:  # measured before (this run or an earlier one): answer from the log
            study.tell(trial, _score(known[k]))
            result.reused += 1
        elif k in {_key(v, names) for _, v in todo}:
            study.tell(trial, state=TrialState.FAIL)
        else:
            todo.append((trial, values))
            continue
        del asked[trial.number]
    if not todo:
        return proposals, since_best
    cfgs = [t.make_config(v) for _, v in todo]
    outs = task.measurer.measure([MeasureInput(task.spec, task.workload, c) for c in cfgs])
    recs = [_record(t, task.workload, task.scopes, c, task.info, res, tr.number, task.sampler, study.study_name)
            for (tr, _), c, res in zip(todo, cfgs, outs)]
    for (tr, _), rec in zip(todo, recs):
        asked[tr.number] = (tr, rec)  # measured: told its value if the log has it when Ctrl-C comes
    append_records(result.log, recs)  # the log first: a kill after this loses nothing measured
    for (tr, values), rec in zip(todo, recs):
        known[_key(values, names)] = rec
        _tell(study, tr, rec)
        del asked[tr.number]
        if rec.error_code == ErrorCode.INSTANTIATION:
            continue  # rejected before any device work: not a measurement
        result.measured += 1
        result.records.append(rec)
        if rec.ok and (result.best is None or _score(rec) > _score(result.best)):
            result.best, since_best = rec, 0
        else:
            since_best += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"best {_score(result.best):.3g} GFLOP/s" if result.best else "no success yet")
    return proposals, since_best


def _tell(study, trial, rec: Record) -> None:
    trial.set_user_attr("error", rec.error_name)
    trial.set_user_attr("record", rec.to_dict())  # the study alone can rebuild the log
    study.tell(trial, _score(rec))


def _settle(study, asked: dict, log: str) -> None:
    """Interrupted: trials whose record is in the log are told their measurement, the others are failed (a
    re-run proposes those again; the logged ones it answers from the log). Best effort: the storage may be
    gone, and then the next run's ``_recover`` does it."""
    logged = set()
    if any(rec is not None for _, rec in asked.values()) and Path(log).exists():
        logged = {r.trial for r in load_records(log) if r.study == study.study_name}
    for trial, rec in asked.values():
        try:
            if rec is not None and trial.number in logged:
                _tell(study, trial, rec)
            else:
                study.tell(trial, state=TrialState.FAIL)
        except Exception:  # noqa: BLE001 - told already, or the storage is unreachable: the next run's _recover
            pass


def _enqueue_fallback(study, t, workload, info, scopes: dict, fixed: dict, known: dict, names: list) -> None:
    """Make the template's fallback config (what a model runs untuned) the next trial, unless the log has it
    or it is waiting in the study already (an interrupted run enqueued it)."""
    cfg = t.fallback_with(workload, info, **fixed, **{f"{k}_scope": v for k, v in scopes.items()})
    values = t.config_values(workload, cfg)
    if any(n not in values for n in names):
        return
    params = {n: values[n] for n in names}
    if _key(params, names) in known:
        return
    for tr in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if all(tr.params.get(n) == params[n] for n in names):
            return
    study.enqueue_trial(params)


def _recover(study, known: dict, names: list, dists: dict) -> None:
    """After a killed run: running trials are marked failed; measurements in the log that the study never
    heard of are added to it, so the sampler learns from them and never proposes them again."""
    in_study = set()
    for tr in study.get_trials(deepcopy=False):
        if tr.state == TrialState.RUNNING:
            study._storage.set_trial_state_values(tr._trial_id, TrialState.FAIL)
        elif tr.state == TrialState.COMPLETE and all(n in tr.params for n in names):
            in_study.add(_key(tr.params, names))
    for k, rec in known.items():
        if k not in in_study:
            attrs = {"from_log": True, "error": rec.error_name, "record": rec.to_dict()}
            study.add_trial(optuna.trial.create_trial(params=dict(zip(names, k)), distributions=dists,
                                                      value=_score(rec), user_attrs=attrs))


def _progress(total: int, enabled: bool, name: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=name.split("-")[0], unit="trial", dynamic_ncols=True)

