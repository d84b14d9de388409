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
import hashlib
import os
import socket
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.errors import ErrorCode, TunerError
from tuner.logs import Record, append_records, load_records
from tuner.logs.io import ensure_writable
from tuner.logs.record import canonical_json
from tuner.measure import MeasureOptions, Measurer, Runner, open_runner
from tuner.search.loop import (Evaluator, enqueue_fallback, enqueue_region, enqueue_seeds, open_session, optimize,
                               progress_bar)
from tuner.search.shared import (Announcing, Heartbeat, claim, counts, final_state, finish, is_claimed, reap,
                                 score_of)
from tuner.search.storage import open_storage, redact
from tuner.task import TuningTask, as_task
from tuner.search.tune import default_log

TASK_ATTR = "tuner:task"
Task = TuningTask  # the worker's name for it: a task with its budget (``trials``) and ``weight``


def check_prefix(prefix) -> str:
    if not isinstance(prefix, str) or not prefix or any(c.isspace() for c in prefix):
        raise TunerError(f"study prefix {prefix!r}: a non-empty name without spaces, e.g. resnet18")
    return prefix


def model_prefix(path) -> str:
    """A study prefix for a model file: its name and a hash of its bytes (host and workers agree on it)."""
    p = Path(path)
    return f"{p.stem}-{hashlib.sha1(p.read_bytes()).hexdigest()[:8]}"


def register_tasks(storage, tasks, prefix: str) -> list[str]:
    """Write each task to the storage as the study ``<prefix>-<task hash>`` (created or updated: a new
    budget or weight replaces the old); returns the study names. ``tasks``: TuningTasks (or their dicts)."""
    check_prefix(prefix)
    st = open_storage(storage, heartbeat=None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = []
    for i, task in enumerate(tasks):
        task = as_task(task, f"task {i}")
        task.tmpl  # noqa: B018 -- an unknown template fails here, before anything is written
        name = f"{prefix}-{task.hash}"
        study = optuna.create_study(study_name=name, storage=st, direction="maximize", load_if_exists=True)
        study.set_user_attr(TASK_ATTR, task.to_dict())
        study.set_user_attr("label", task.label)
        names.append(name)
    return names


def registered_tasks(storage, prefix: str) -> dict:
    """The tasks registered under ``prefix``: task study name -> TuningTask."""
    check_prefix(prefix)
    st = open_storage(storage, heartbeat=None)
    found = {}
    for s in st.get_all_studies():
        d = s.user_attrs.get(TASK_ATTR)
        if d and s.study_name.startswith(f"{prefix}-"):
            task = TuningTask.from_dict(d, f"study {s.study_name}")
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


class ClaimStrategy:
    """The claim protocol (``tuner.search.shared``) as a strategy of the evaluation loop, for one task on this
    worker's device: finish dead workers' trials, then claim up to the room the budget has left over all
    workers. Each record goes to its trial first (a reaper completes the trial if this worker dies), then
    to the log (the Evaluator), then the trial is told."""

    def __init__(self, session, budget: int, worker: str, beat: Heartbeat, summary: WorkerSummary, grace: float,
                 adopted):
        self.session, self.budget, self.worker, self.beat = session, budget, worker, beat
        self.summary, self.grace, self.adopted = summary, grace, adopted
        self.done = 0  # trials that spent budget, at the last look
        self.yields_in_row = 0
        self._finished = False

    def state(self) -> tuple[int, int]:
        """(trials that spent budget, claimed trials running), over all workers."""
        trials = self.session.study.get_trials(deepcopy=False)
        return sum(map(counts, trials)), sum(map(is_claimed, trials))

    def finished(self) -> bool:
        return self._finished

    def propose(self, n: int) -> list:
        s = self.session
        reap(s.study, self.grace, self.adopted)
        self.done, running = self.state()
        self._finished = self.done >= self.budget or self.yields_in_row >= 64  # spent, or nothing to claim
        todo = []
        for _ in range(0 if self._finished else min(self.budget - self.done - running, n)):
            with warnings.catch_warnings():  # Optuna warns that heartbeats are meant for optimize(); ask/tell is ours
                warnings.filterwarnings("ignore", message="Heartbeat of storage")
                trial = s.study.ask(s.dists)
            if claim(s.study, trial, s.names, self.worker, self.budget):
                todo.append((trial, s.values(trial)))
                self.yields_in_row = 0
            else:
                self.beat.release(trial._trial_id)
                self.yields_in_row += 1
                self.summary.yielded += 1
        return todo

    def measured(self, proposals: list, recs: list) -> None:
        for (tr, _), rec in zip(proposals, recs):
            with contextlib.suppress(UpdateFinishedTrialError):  # reaped already: finish() adds it late
                self.session.study._storage.set_trial_user_attr(tr._trial_id, "record", rec.to_dict())

    def tell(self, trial, rec: Record) -> None:
        finish(self.session.study, trial._trial_id, rec.to_dict())
        self.beat.release(trial._trial_id)

    def settle(self) -> None:
        pass  # the worker lets go of every held trial at once (``_let_go``)

    def best(self) -> Record | None:
        recs = [t.user_attrs["record"] for t in self.session.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if "record" in t.user_attrs]
        top = max(recs, key=score_of, default=None)
        return Record.from_dict(top) if top and score_of(top) > 0 else None


def run_worker(storage, device=None, study_prefix: str | None = None, tasks=None, max_trials: int | None = None,
               log: str | None = None, sampler: str = "xgb", seed: int | None = None,
               options: MeasureOptions | None = None, progress: bool = True, heartbeat: int = 10,
               grace: int = 60, poll: float = 1.0, transfer_from=None, fallback_first: bool = True,
               device_region: bool = True) -> WorkerSummary:
    """Tune, on ``device``, the tasks registered under ``study_prefix`` in ``storage`` (a URL or an Optuna
    storage), or ``tasks`` (registered under the prefix first, default prefix ``tuner``), until every
    task's budget is spent on this device's studies (by all workers) or this worker measured
    ``max_trials``. Heavier tasks first; a worker with nothing to claim waits for the others' trials to end
    (or to go stale after ``grace`` seconds without a heartbeat, checked every ``poll`` seconds).
    ``transfer_from``: sibling devices' fingerprints (or ``"auto"``) whose records seed each study, as in
    ``tune``. ``fallback_first`` and ``device_region``: as in ``tune``, their trials once per study (the first
    worker to open it enqueues them; one that finds them in the study, in any state, does not); the region's
    modes go to every worker's xgb sampler."""
    from tuner.runtime.base import Runtime
    from tuner.target import DeviceInfo
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
    if not isinstance(info, DeviceInfo):
        from tuner.runtime.opencl.device import choose_device
        info = choose_device(info)
    st = open_storage(storage, heartbeat, grace)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if tasks is not None:
        tasks = [as_task(x, f"task {i}") for i, x in enumerate(tasks)]
        register_tasks(st, tasks, prefix)
    else:
        tasks = list(registered_tasks(st, prefix).values())
        if not tasks:
            raise TunerError(f"no tasks registered under prefix {prefix!r} in {redact(storage)}; register them "
                             "with `tuner tune MODEL --storage URL --workers 0` (or `tuner worker --tasks FILE`)")
    log = str(ensure_writable(log or default_log(info.fingerprint)))  # before any measurement
    options = options or MeasureOptions()
    batch = max(1, options.n_parallel)
    worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    summary = WorkerSummary(worker, info.fingerprint, log)

    def adopted(record: dict) -> None:  # a dead worker's measurement: it may be in no log yet
        append_records(log, Record.from_dict(record))
        summary.reaped += 1

    def tally(strategy, rec: Record) -> None:
        summary.records.append(rec)
        summary.measured += rec.error_code != ErrorCode.INSTANTIATION
        if bar is not None:  # every worker's trials, as of the last look
            bar.n = sum(j.done for j in jobs)
            bar.refresh()

    with Heartbeat(st, heartbeat) as beat, contextlib.ExitStack() as stack:
        jobs = []
        for task in sorted(tasks, key=lambda t: -t.weight):
            session = open_session(task, info, st, task.study_name(info.fingerprint, prefix), log, sampler, seed,
                                   seen_from_log=False, wrap=lambda inner: Announcing(inner, beat),
                                   transfer_from=transfer_from, device_region=device_region)
            enqueue_seeds(session)  # a named sibling's best configs of the task first (asked before any other)
            if fallback_first:
                enqueue_fallback(session)
            if device_region:
                enqueue_region(session, seed)
            budget = min(task.trials, session.space.size())
            jobs.append(ClaimStrategy(session, budget, worker, beat, summary, grace, adopted))
        bar = progress_bar(sum(j.budget for j in jobs), progress, f"worker {info.fingerprint}")
        if bar is not None:
            stack.callback(bar.close)
        remote = isinstance(device, (Runner, Runtime))  # any device behind the seam, else local processes
        evaluate = stack.enter_context(Evaluator(info, log, lambda: open_runner(device, options) if remote
                                                 else Measurer(info, options)))
        stack.callback(_let_go, st, beat)  # first on the way out: the other workers need not wait
        room = lambda: min(batch, max_trials - summary.measured) if max_trials else batch  # noqa: E731
        optimize(jobs, evaluate, room, [tally], idle=lambda: time.sleep(poll))
    for job in jobs:
        summary.studies[job.session.study.study_name] = {"done": job.state()[0], "budget": job.budget,
                                                         "best": job.best()}
    return summary


def _let_go(storage, beat: Heartbeat) -> None:
    """On the way out (Ctrl-C, an error): finish the trials still held, as a reaper would, so that the
    other workers need not wait out the grace period."""
    with beat.lock:
        held = list(beat.held)
    for tid in held:
        beat.release(tid)
        with contextlib.suppress(Exception):  # the storage may be what failed; then the grace period does it
            storage.set_trial_state_values(tid, *final_state(storage.get_trial(tid).user_attrs.get("record")))


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
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
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
