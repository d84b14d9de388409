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
from tuner.search.samplers import _key, make_sampler
from tuner.search.shared import measured_error
from tuner.task import TuningTask, log_knowledge


def record_of(t, workload, cfg, info, res: MeasureResult, trial, sampler, study) -> Record:
    """The record of one measurement (its scopes are the config's own), with the device's GPU clock and
    temperature when it was measured (None where the device does not expose them)."""
    return Record.new(t.name, workload, cfg, info, costs=res.costs if res.ok else (), error_code=res.error_code,
                      error_msg=res.error_msg[:4000], max_rel_error=res.max_rel_error, timestamp=res.timestamp,
                      duration_s=res.duration_s, trial=trial, sampler=sampler, study=study,
                      gpu_clock_hz=getattr(res, "gpu_clock_hz", None), temp_c=getattr(res, "temp_c", None))


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
    seeds: list = field(default_factory=list)  # knob values to measure first: a named sibling's best of the task
    modes: list = field(default_factory=list)  # the device region's modes (``open_session``'s ``device_region``)
    dtype_seeds: list = field(default_factory=list)  # then the other storage dtype's best of the workload (dtype_seeds)
    nest_seeds: list = field(default_factory=list)  # then the same loop nest's best, another epilogue (nest_seeds)
    names: list = field(init=False)
    dists: dict = field(init=False)

    def __post_init__(self):
        self.names = list(self.space.choices)
        self.dists = {n: CategoricalDistribution(c) for n, c in self.space.choices.items()}

    def values(self, trial) -> dict:
        return {n: trial.params[n] for n in self.names}


def open_session(task: TuningTask, info, storage, name: str, log: str, sampler: str = "xgb", seed=None,
                 transfer: bool = True, seen_from_log: bool = True, wrap=None, transfer_from=None,
                 sampler_options: dict | None = None, device_region: bool | dict = False) -> Session:
    """The task bound to ``info`` (scopes decided), its space, the log's knowledge, the sampler (``wrap``ped,
    e.g. to announce trials) and the study ``name`` in ``storage`` (created or resumed), its attributes
    readable in optuna-dashboard: the task, its label and the objective's name. ``transfer_from``: sibling
    devices (``sibling_knowledge``) whose records weigh in the sampler's transfer as this device's do, and
    whose best valid configs of this very task are the session's ``seeds``. ``sampler_options``: keyword
    arguments of the xgb sampler (``XGBSampler``). ``device_region``: the xgb sampler searches each mode of the
    device class's region in turn (``tuner.search.regions.region_of``; a dict: a table in ``REGIONS``' shape)."""
    task = task.bind(info)
    space = task.space(info)
    known, others = log_knowledge(log, task, info.fingerprint, space, transfer)
    t = task.tmpl
    seeds, weights = [], None
    if transfer_from:
        rows, seeds, siblings = sibling_knowledge(log, task, info, space, transfer_from, known)
        others = [o for o in others if len(o) == 3 or o[3] not in siblings] + rows
        weights = {d: SIBLING_WEIGHT for d in siblings}
    twins = dtype_seeds(log, task, info, space, known, seeds) if transfer else []
    nests = nest_seeds(log, task, info, space, known, seeds + [p for p, _ in twins]) if transfer else []
    from tuner.search.regions import region_of
    modes = region_of(info.type, t.name, device_region)
    smp = make_sampler(sampler, space, t, t.space_vars(task.workload), seed=seed, transfer=others,
                       seen=set(known) if seen_from_log else None, device_weights=weights, options=sampler_options,
                       modes=modes)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                sampler=wrap(smp) if wrap else smp, load_if_exists=True)
    study.set_user_attr("task", task.attrs(info.fingerprint))
    study.set_user_attr("label", task.label)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(["GFLOP/s"])
    return Session(task, info, space, study, log, sampler, known, seeds, modes, dtype_seeds=twins, nest_seeds=nests)


def _in_study(s: Session) -> set:
    """Config keys of the log's records and of the study's trials, another worker's included: measured,
    measuring or waiting (a trial cut short by a killed run, FAIL without a measurement, is not)."""
    out = set(s.known)
    for tr in s.study.get_trials(deepcopy=False):
        if (tr.state != TrialState.FAIL or measured_error(tr)) and all(n in tr.params for n in s.names):
            out.add(_key(tr.params, s.names))
    return out


def enqueue_seeds(s: Session) -> None:
    """The session's seeds (a named sibling's best configs of the task, valid here), then its ``dtype_seeds``
    (the other storage dtype's best configs of the workload: float32's for a float16 task, user attribute
    ``start`` = ``dtype float32``), then its ``nest_seeds`` (the same loop nest's best configs with another epilogue,
    ``start`` = ``nest <workload>``), as the next trials, each unless the log or the study has it (``_in_study``:
    measured, being measured by another worker, or waiting: an interrupted run enqueued it): ``tune`` and
    ``run_worker`` ask them first."""
    have = _in_study(s)
    for params in s.seeds:
        if _key(params, s.names) not in have:
            s.study.enqueue_trial(params)
            have.add(_key(params, s.names))
    for params, dtype in s.dtype_seeds:
        if _key(params, s.names) not in have:
            s.study.enqueue_trial(params, user_attrs={"start": f"dtype {dtype}"})
            have.add(_key(params, s.names))
    for params, label in s.nest_seeds:
        if _key(params, s.names) not in have:
            s.study.enqueue_trial(params, user_attrs={"start": f"nest {label}"})
            have.add(_key(params, s.names))


def enqueue_fallback(s: Session) -> None:
    """Make the template's fallback config (what a model runs untuned) the next trial, unless the log or the
    study has it (measured, being measured by another worker, or waiting: an interrupted run enqueued it)."""
    values = s.task.tmpl.config_values(s.task.workload, s.task.fallback(s.info))
    if any(n not in values for n in s.names):
        return
    params = {n: values[n] for n in s.names}
    if _key(params, s.names) not in _in_study(s):
        s.study.enqueue_trial(params)


def enqueue_region(s: Session, seed) -> None:
    """Enqueue ``REGION_SEEDS`` configs of each of the session's region modes (``Session.modes``: the device
    class's default region, ``tuner.search.regions``, or that of the table ``open_session`` was given), drawn with
    ``seed``, when neither the log nor the study holds any measurement of the task yet and no trial of the study
    was enqueued from the region already (an interrupted run, or another worker, did)."""
    from tuner.search.regions import REGION_SEEDS, region_configs
    if not s.modes or s.known:
        return
    trials = s.study.get_trials(deepcopy=False)
    if any(tr.user_attrs.get("start") == "region" or tr.state in (TrialState.COMPLETE, TrialState.FAIL)
           for tr in trials):
        return
    for params in region_configs(s.space, s.modes, REGION_SEEDS, seed, exclude=_in_study(s)):
        s.study.enqueue_trial(params, user_attrs={"start": "region"})


SIBLING_WEIGHT = 1.0  # a named sibling's records in the sampler's transfer: as this device's (others: 0.25)
SEEDS = 3  # a named sibling's best configs of the task measured first
DTYPE_SEEDS = 3  # the other storage dtype's best configs of the workload measured next
NEST_SEEDS = 3  # the same loop nest's best configs (another epilogue) measured next


def _logs_beside(log: str) -> list:
    """``log`` and the other logs in its folder."""
    from pathlib import Path
    return [Path(log)] + sorted(p for p in Path(log).parent.glob("*.jsonl") if p != Path(log))


def _fastest_valid(task: TuningTask, space, records, seen: set, limit: int, config=lambda r: r.config) -> list:
    """``[(knob values, Record)]``: ``records``' configs (``config`` of each, with the task's knobs), fastest first,
    that this task's space accepts and ``seen`` (knob-value tuples) does not hold, each once: up to ``limit``."""
    t, names, out = task.tmpl, list(space.choices), []
    for r in sorted(records, key=lambda r: r.median_s):
        try:
            values = t.config_values(task.workload, t.config(**{**config(r), **task.knobs}))
            params = {n: values[n] for n in names}
        except (TypeError, ValueError, KeyError):
            continue
        k = tuple(params[n] for n in names)
        if k in seen or space.violations(params):
            continue
        seen.add(k)
        out.append((params, r))
        if len(out) >= limit:
            break
    return out


def dtype_seeds(log: str, task: TuningTask, info, space, known: dict, taken=()) -> list:
    """``[(knob values, dtype)]``: this device's fastest configs of the same workload and scopes in the other
    storage dtype (``tuner.logs.best.OTHER_DTYPE``: float32's for a float16 task, and the reverse), from ``log``
    and the logs beside it, that this task's space accepts (half arithmetic, ``compute``, set to float32 outside
    float16) and that neither the log (``known``) nor ``taken`` holds: up to ``DTYPE_SEEDS``. A float16 layer
    runs float32's loop nest on half the bytes, so float32's best configs are the strongest start it has."""
    from tuner.logs.best import OTHER_DTYPE
    from tuner.logs.index import LogIndex
    from tuner.logs.record import task_key
    t, dtype = task.tmpl, getattr(task.workload, "dtype", None)
    other = OTHER_DTYPE.get(dtype)
    if other is None:
        return []
    names = list(space.choices)
    key = task_key(info.fingerprint, t.name, {**task.workload.key(), "dtype": other}, task.scopes or {})
    records = [r for path in _logs_beside(log) if path.exists()
               for r in LogIndex.of_log(path).task(key, task.fixed, ok=True)]

    def config(r):  # half arithmetic needs half storage
        return {**r.config, "compute": "float32"} if "compute" in r.config and dtype != "float16" else r.config
    seen = set(known) | {tuple(p[n] for n in names) for p in taken}
    return [(params, other) for params, _ in _fastest_valid(task, space, records, seen, DTYPE_SEEDS, config)]


def nest_seeds(log: str, task: TuningTask, info, space, known: dict, taken=()) -> list:
    """``[(knob values, label)]``: this device's fastest configs of the same loop nest with another epilogue
    (``tuner.logs.best.workload_distance`` 0: a convolution without the norm statistics its variant writes, or
    without the gate it computes) in the same scopes and dtype, from ``log`` and the logs beside it, that this
    task's space accepts and that ``taken`` does not hold: up to ``NEST_SEEDS``, none where the log holds the task
    (``known``). An untuned variant runs those configs (``ApplyHistoryBest.suggest``), so they are the start its
    tuning must beat: on the H200 16 trials of style_in's InstanceNorm readers without them found 27.6 us configs
    where the plain nest's ran 24.0 in the model."""
    from tuner.logs.best import workload_distance
    from tuner.logs.index import LogIndex
    if known:
        return []
    t, fp, names = task.tmpl, info.fingerprint, list(space.choices)
    mine, scopes = task.workload.key(), task.scopes or {}
    records = [r for path in _logs_beside(log) if path.exists() for r in LogIndex.of_log(path).template(t.name)
               if r.device == fp and r.scopes == scopes and r.workload != mine
               and workload_distance(mine, r.workload) == 0]
    seen = {tuple(p[n] for n in names) for p in taken}
    return [(params, t.key_label(r.workload)) for params, r in _fastest_valid(task, space, records, seen, NEST_SEEDS)]


def sibling_knowledge(log: str, task: TuningTask, info, space, names, known: dict) -> tuple:
    """``(rows, seeds, siblings)`` for tuning ``task`` (bound) on ``info`` with the sibling devices ``names``
    (fingerprints, or ``"auto"``: the devices of ``info``'s family, ``tuner.logs.best.device_family``):
    their records are read from the logs beside ``log`` and from ``<fingerprint>.jsonl`` there or in logs/
    (a name found nowhere is a TunerError). ``rows``: ``(vars, values, gflops, device)`` of their successful
    records of the template, for the sampler; ``seeds``: knob values of their fastest records of this very
    task that this device's space accepts and the log has not measured (up to ``SEEDS``)."""
    import dataclasses as dc
    from pathlib import Path

    from tuner.errors import TunerError
    from tuner.logs.best import AUTO, device_family, parse_transfer_from, sibling_logs
    from tuner.logs.index import LogIndex
    from tuner.task import workload_of
    names = parse_transfer_from(names)
    fp = info.fingerprint
    wanted = [n for n in names if n not in (AUTO, fp)]
    folder = Path(log).parent
    paths = sorted(folder.glob("*.jsonl")) + sibling_logs(wanted, [log])
    records, seen_paths = [], set()
    for path in paths:
        if path.resolve() not in seen_paths:
            seen_paths.add(path.resolve())
            records += [r for r in LogIndex.of_log(path).records if r.device != fp]
    family = device_family(info.platform, info.type, info.name)
    devices = {r.device: r for r in records}
    siblings = [n for n in wanted if n in devices]
    if AUTO in names:
        siblings += [d for d, r in devices.items() if d not in siblings and r.device_name != info.name
                     and device_family(r.platform, d.split("-")[1] if d.count("-") >= 2 else "", r.device_name)
                     == family]
    missing = [n for n in wanted if n not in devices]
    if missing:
        raise TunerError(f"--transfer-from {', '.join(missing)}: no records of that device in the logs in "
                         f"{folder}/ nor in logs/{missing[0]}.jsonl; put its log beside --log, or name a fingerprint "
                         f"those logs hold ({', '.join(sorted(devices)) or 'none'})")
    t, names_ = task.tmpl, list(space.choices)
    defaults = {f.name: f.default for f in dc.fields(t.config) if f.default is not dc.MISSING}
    rows, exact = [], []
    mine = task.record_key(fp)[1:]
    for r in records:
        if r.device not in siblings or r.template != t.name or not r.ok:
            continue
        values = {**defaults, "dtype": r.workload.get("dtype"), **r.config}
        try:
            rows.append((t.space_vars(workload_of(t, r.workload)), values, r.gflops, r.device))
        except (TypeError, ValueError):
            continue
        if r.task_key[1:] == mine and task.fits(r):
            exact.append((siblings.index(r.device), r.median_s, r))
    seeds = []
    for _, _, r in sorted(exact, key=lambda x: x[:2]):
        try:
            cfg = t.config(**{**r.config, **task.knobs})
            values = t.config_values(task.workload, cfg)
            params = {n: values[n] for n in names_}
        except (TypeError, ValueError, KeyError):
            continue
        key = tuple(params[n] for n in names_)
        if key in known or params in seeds or space.violations(params):
            continue  # measured here already, or beyond this device's limits
        seeds.append(params)
        if len(seeds) >= SEEDS:
            break
    return rows, seeds, siblings


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
