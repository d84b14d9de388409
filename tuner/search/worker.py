"""Workers: tuning on the machine that holds the device, for tasks shared through one Optuna storage.

A host registers tasks (``register_tasks``): one device-independent study ``<prefix>-<task hash>`` each,
holding the task (template, workload key, scopes, fixed knobs, trial budget, weight) as a user attribute.
A worker (``run_worker``) finds the tasks under a prefix and, for its device's fingerprint, tunes the study
``<prefix>-<task hash>-<fingerprint>`` until the budget is spent: workers on devices with one fingerprint
cooperate on one study (never measuring a config twice, see ``tuner.search.shared``), workers of other
fingerprints work on other studies. Each record goes to the trial (user attribute ``record``), then to the
worker's local log, then the trial is told; ``export_study_records`` rebuilds a log from the studies.

    names = register_tasks("postgresql://tuner:pw@host/tuner", [Task("conv2d", wl.key(), scopes)], "resnet")
    summary = run_worker("postgresql://tuner:pw@host/tuner", device="mali", study_prefix="resnet")
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.errors import ErrorCode, TunerError
from tuner.logs import Record, append_records, load_records
from tuner.logs.record import canonical_json
from tuner.measure import MeasureInput, MeasureOptions, Measurer
from tuner.search.samplers import make_sampler
from tuner.search.shared import (Announcing, Heartbeat, claim, counts, finish, is_claimed, open_storage, reap,
                                 redact, score_of)
from tuner.search.tune import SCOPES, _record, default_log, log_knowledge, workload_of

TASK_ATTR = "tuner:task"


@dataclass(frozen=True)
class Task:
    """One kernel to tune, as data that a storage can hold: ``workload`` is the template workload's key
    (a workload object is turned into its key), ``scopes`` the operands' scopes (None: each device's
    fallback), ``fixed`` knobs a model pins, ``trials`` the budget per device, ``weight`` the share of the
    model's time (heavier tasks are tuned first)."""
    template: str
    workload: dict
    scopes: dict | None = None
    fixed: dict = field(default_factory=dict)
    trials: int = 32
    weight: float = 1.0

    def __post_init__(self):
        key = self.workload if isinstance(self.workload, dict) else self.workload.key()
        object.__setattr__(self, "workload", dict(key))
        object.__setattr__(self, "scopes", None if self.scopes is None else dict(self.scopes))
        object.__setattr__(self, "fixed", dict(self.fixed or {}))
        if not isinstance(self.trials, int) or isinstance(self.trials, bool) or self.trials < 1:
            raise TunerError(f"task {self.template}: trials must be a positive integer, not {self.trials!r}")
        if self.scopes is not None and (set(self.scopes) - set(SCOPES) or
                                        set(self.scopes.values()) - {"texture", "buffer"}):
            raise TunerError(f"task {self.template}: scopes {self.scopes}: keys input/weight/output, "
                             "values texture or buffer")

    @classmethod
    def of(cls, task, trials: int = 32) -> "Task":
        """A Task from a model's task (``tuner.graph.plan.Task``: template, workload, scopes, fixed, weight)."""
        return cls(task.template, task.workload, task.scopes, task.fixed, trials, float(task.weight))

    @property
    def hash(self) -> str:
        """The task's identity (not its budget or weight), short: study names carry it."""
        ident = {"template": self.template, "workload": self.workload, "scopes": self.scopes, "fixed": self.fixed}
        return hashlib.sha1(canonical_json(ident).encode()).hexdigest()[:12]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "task") -> "Task":
        if not isinstance(d, dict) or not {"template", "workload"} <= set(d):
            raise TunerError(f"{where}: a task is an object with template and workload (and optionally scopes, "
                             f"fixed, trials, weight); got {d!r}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TunerError(f"{where}: unknown task fields {sorted(unknown)}")
        return cls(**d)


def check_prefix(prefix) -> str:
    if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
        raise TunerError(f"study prefix {prefix!r}: a non-empty name without spaces, e.g. resnet18")
    return prefix


def device_study_name(prefix: str, task: Task, fingerprint: str) -> str:
    return f"{prefix}-{task.hash}-{fingerprint}"


def model_prefix(path) -> str:
    """A study prefix for a model file: its name and a hash of its bytes (host and workers agree on it)."""
    p = Path(path)
    return f"{p.stem}-{hashlib.sha1(p.read_bytes()).hexdigest()[:8]}"


def _resolve(task: Task, where: str):
    from tuner.templates import get_template
    t = get_template(task.template)
    try:
        return t, workload_of(t, task.workload)
    except (TypeError, ValueError) as e:
        raise TunerError(f"{where}: workload {canonical_json(task.workload)} is not a {t.name} workload: {e}") from None


def register_tasks(storage, tasks, prefix: str) -> list[str]:
    """Write each task to the storage as the study ``<prefix>-<task hash>`` (created or updated: a new
    budget or weight replaces the old); returns the study names. ``tasks``: Task objects (or dicts)."""
    check_prefix(prefix)
    st = open_storage(storage, heartbeat=None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = []
    for i, task in enumerate(tasks):
        task = task if isinstance(task, Task) else Task.from_dict(task, f"task {i}")
        _resolve(task, f"task {i} ({task.template})")
        name = f"{prefix}-{task.hash}"
        study = optuna.create_study(study_name=name, storage=st, direction="maximize", load_if_exists=True)
        study.set_user_attr(TASK_ATTR, task.to_dict())
        names.append(name)
    return names


def registered_tasks(storage, prefix: str) -> dict:
    """The tasks registered under ``prefix``: task study name -> Task."""
    check_prefix(prefix)
    st = open_storage(storage, heartbeat=None)
    found = {}
    for s in st.get_all_studies():
        d = s.user_attrs.get(TASK_ATTR)
        if d and s.study_name.startswith(f"{prefix}-"):
            task = Task.from_dict(d, f"study {s.study_name}")
            if s.study_name == f"{prefix}-{task.hash}":
                found[s.study_name] = task
    return found


@dataclass
class WorkerSummary:
    worker: str  # host:pid:nonce
    device: str  # fingerprint
    log: str
    studies: dict = field(default_factory=dict)  # per-device study -> {"done", "budget", "best": Record | None}
    records: list = field(default_factory=list)  # what this worker measured (rejected configs included)
    measured: int = 0  # measurements that spent budget
    yielded: int = 0  # claims given up: a twin claimed the config, or the budget was full
    reaped: int = 0  # trials of dead workers this worker finished


class _Job:
    """One task on this worker's device: its study, bound space and sampler."""

    def __init__(self, task: Task, info, storage, prefix: str, sampler: str, seed, log: str, beat: Heartbeat):
        self.task = task
        self.t, self.workload = _resolve(task, f"task {prefix}-{task.hash}")
        if task.scopes is None:
            fb = self.t.fallback(self.workload, info)
            self.scopes = {k: getattr(fb, f"{k}_scope") for k in SCOPES}
        else:
            self.scopes = task.scopes
        self.space = self.t.space(self.workload, info, **task.fixed,
                                  **{f"{k}_scope": v for k, v in self.scopes.items()})
        self.names = list(self.space.choices)
        self.dists = {n: CategoricalDistribution(c) for n, c in self.space.choices.items()}
        self.budget = min(task.trials, self.space.size())
        self.name = device_study_name(prefix, task, info.fingerprint)
        _, others = log_knowledge(log, self.t, self.workload, self.scopes, info.fingerprint, self.space)
        inner = make_sampler(sampler, self.space, self.t.name, self.t.space_vars(self.workload), seed=seed,
                             transfer=others)
        self.study = optuna.create_study(study_name=self.name, storage=storage, direction="maximize",
                                         sampler=Announcing(inner, beat), load_if_exists=True)
        self.study.set_user_attr("task", {"template": self.t.name, "workload": self.workload.key(),
                                          "scopes": self.scopes, "fixed": task.fixed, "device": info.fingerprint})
        self.finished = False
        self.done = 0  # trials that spent budget, at the last look
        self.yields_in_row = 0

    def state(self) -> tuple[int, int]:
        """(trials that spent budget, claimed trials running), over all workers."""
        trials = self.study.get_trials(deepcopy=False)
        return sum(map(counts, trials)), sum(map(is_claimed, trials))

    def best(self) -> Record | None:
        recs = [t.user_attrs["record"] for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if "record" in t.user_attrs]
        top = max(recs, key=score_of, default=None)
        return Record.from_dict(top) if top and score_of(top) > 0 else None


def _ask(study, dists):
    with warnings.catch_warnings():  # Optuna warns that heartbeats are meant for optimize(); ask/tell is ours
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        return study.ask(dists)


def run_worker(storage, device=None, study_prefix: str | None = None, tasks=None, max_trials: int | None = None,
               log: str | None = None, sampler: str = "xgb", seed: int | None = None,
               options: MeasureOptions | None = None, progress: bool = True, heartbeat: int = 10,
               grace: int = 60, poll: float = 1.0) -> WorkerSummary:
    """Tune, on ``device``, the tasks registered under ``study_prefix`` in ``storage`` (a URL or an Optuna
    storage), or ``tasks`` (registered under the prefix first, default prefix ``tuner``), until every
    task's budget is spent on this device's studies (by all workers) or this worker measured
    ``max_trials``. Heavier tasks first; a worker with nothing to claim waits for the others' trials to end
    (or to go stale after ``grace`` seconds without a heartbeat, checked every ``poll`` seconds)."""
    from tuner.runtime.device import DeviceInfo, choose_device
    if max_trials is not None and max_trials < 1:
        raise TunerError("max_trials must be at least 1")
    if heartbeat < 1 or grace <= heartbeat:
        raise TunerError(f"heartbeat {heartbeat} s and grace {grace} s: the heartbeat is at least 1 s and the "
                         "grace period longer than it (e.g. --heartbeat 10 --grace 60)")
    if study_prefix is None and tasks is None:
        raise TunerError("a worker needs --study-prefix P (the prefix the tasks were registered under, e.g. by "
                         "`tuner tune MODEL --storage URL --workers 0`) or tasks")
    prefix = check_prefix(study_prefix or "tuner")
    info = device.info if hasattr(device, "info") else device
    info = info if isinstance(info, DeviceInfo) else choose_device(info)
    st = open_storage(storage, heartbeat, grace)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if tasks is not None:
        tasks = [x if isinstance(x, Task) else Task.from_dict(x, f"task {i}") for i, x in enumerate(tasks)]
        register_tasks(st, tasks, prefix)
    else:
        tasks = list(registered_tasks(st, prefix).values())
        if not tasks:
            raise TunerError(f"no tasks registered under prefix {prefix!r} in {redact(storage)}; register them "
                             "with `tuner tune MODEL --storage URL --workers 0` (or `tuner worker --tasks FILE`)")
    log = log or default_log(info.fingerprint)
    options = options or MeasureOptions()
    batch = max(1, options.n_parallel)
    worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    summary = WorkerSummary(worker, info.fingerprint, log)

    def adopted(record: dict) -> None:  # a dead worker's measurement: it may be in no log yet
        append_records(log, Record.from_dict(record))
        summary.reaped += 1

    with Heartbeat(st, heartbeat) as beat, contextlib.ExitStack() as stack:
        jobs = sorted((_Job(task, info, st, prefix, sampler, seed, log, beat) for task in tasks),
                      key=lambda j: -j.task.weight)
        bar = _progress(sum(j.budget for j in jobs), progress, info.fingerprint)
        if bar is not None:
            stack.callback(bar.close)
        measurer = None
        stack.callback(_let_go, st, beat)
        while not (max_trials and summary.measured >= max_trials):
            worked = False
            for job in (j for j in jobs if not j.finished):
                reap(job.study, grace, adopted)
                job.done, running = job.state()
                job.finished = job.done >= job.budget or job.yields_in_row >= 64  # spent, or nothing to claim
                room = min(job.budget - job.done - running, batch,
                           max_trials - summary.measured if max_trials else batch)
                if job.finished or room <= 0:
                    continue
                todo = _claim_batch(job, room, worker, beat, summary)
                if todo:
                    measurer = measurer or stack.enter_context(Measurer(info, options))
                    _measure(job, todo, measurer, info, sampler, log, beat, summary)
                    worked = True
                    break  # back to the heaviest task that has room
            if all(j.finished for j in jobs):
                break
            if bar is not None:
                bar.n = sum(j.done for j in jobs)
                bar.refresh()
            if not worked:
                time.sleep(poll)  # the others' trials hold the rest of the budget: wait for them to end
    for job in jobs:
        summary.studies[job.name] = {"done": job.state()[0], "budget": job.budget, "best": job.best()}
    return summary


def _let_go(storage, beat: Heartbeat) -> None:
    """On the way out (Ctrl-C, an error): finish the trials still held, as a reaper would, so that the
    other workers need not wait out the grace period."""
    with beat.lock:
        held = list(beat.held)
    for tid in held:
        beat.release(tid)
        with contextlib.suppress(Exception):  # the storage may be what failed; then the grace period does it
            record = storage.get_trial(tid).user_attrs.get("record")
            storage.set_trial_state_values(tid, *((TrialState.COMPLETE, [score_of(record)]) if record else
                                                  (TrialState.FAIL,)))


def _claim_batch(job: _Job, n: int, worker: str, beat: Heartbeat, summary: WorkerSummary) -> list:
    todo = []
    for _ in range(n):
        trial = _ask(job.study, job.dists)
        if claim(job.study, trial, job.names, worker, job.budget):
            todo.append(trial)
            job.yields_in_row = 0
        else:
            beat.release(trial._trial_id)
            job.yields_in_row += 1
            summary.yielded += 1
    return todo


def _measure(job: _Job, todo: list, measurer, info, sampler: str, log: str, beat: Heartbeat,
             summary: WorkerSummary) -> None:
    """Measure the claimed trials; each record goes to its trial first (a reaper can then complete the
    trial if this worker dies), then to the log, then the trial is told."""
    cfgs = [job.t.make_config({n: tr.params[n] for n in job.names}) for tr in todo]
    outs = measurer.measure([MeasureInput(job.task.template, job.workload, c) for c in cfgs])
    recs = [_record(job.t, job.workload, job.scopes, c, info, res, tr.number, sampler, job.name)
            for tr, c, res in zip(todo, cfgs, outs)]
    storage = job.study._storage
    for tr, rec in zip(todo, recs):
        with contextlib.suppress(UpdateFinishedTrialError):  # reaped already: finish() adds it late
            storage.set_trial_user_attr(tr._trial_id, "record", rec.to_dict())
    append_records(log, recs)
    for tr, rec in zip(todo, recs):
        finish(job.study, tr._trial_id, rec.to_dict())
        beat.release(tr._trial_id)
        summary.records.append(rec)
        summary.measured += rec.error_code != ErrorCode.INSTANTIATION


def _progress(total: int, enabled: bool, fingerprint: str):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=f"worker {fingerprint}", unit="trial", dynamic_ncols=True)


def _identity(r: Record) -> tuple:
    """One measurement: its task, config and time (the same line in two logs is one measurement)."""
    return (*r.task_key, canonical_json(r.config), r.timestamp or r.to_json())


def export_study_records(storage, study_name_or_prefix: str, log_path) -> int:
    """Append to ``log_path`` the records of the study named ``study_name_or_prefix``, or of every study
    whose name starts with ``<prefix>-``, that the log does not hold yet; returns how many were appended.
    Then ``compile``, ``compare`` and ``report`` read the shared results like any local log."""
    st = open_storage(storage, heartbeat=None)
    names = [s.study_name for s in st.get_all_studies()
             if s.study_name == study_name_or_prefix or s.study_name.startswith(f"{study_name_or_prefix}-")]
    if not names:
        raise TunerError(f"no study named {study_name_or_prefix!r} or starting with {study_name_or_prefix + '-'!r} "
                         f"in {redact(storage)}")
    have = {_identity(r) for r in load_records(log_path)} if Path(log_path).exists() else set()
    new = []
    for name in names:
        study = optuna.load_study(study_name=name, storage=st)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            try:
                rec = Record.from_dict(t.user_attrs["record"])
            except (KeyError, TypeError, ValueError):
                continue  # a trial without a record (not measured by the tuner)
            if _identity(rec) not in have:
                have.add(_identity(rec))
                new.append(rec)
    new.sort(key=lambda r: r.timestamp)
    append_records(log_path, new)
    return len(new)
