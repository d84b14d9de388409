"""Tuning one task: a template, a workload and the operands' scopes on one device, as one Optuna study.

The study lives in an Optuna storage (SQLite under ``logs/`` by default, any storage URL accepted), and
every measurement is appended to a JSONL log before the study hears of it. A re-run of the same task
resumes the study: configs already in the log are never measured again (they are told to the study from
the log when a killed run did not get that far), and trials a killed run left running are marked failed.
A success is a COMPLETE trial valued in GFLOP/s, a failed measurement a FAIL trial (user attribute ``error``).

``tune()`` runs the evaluation loop (``tuner.search.loop``) with one ``LocalStrategy``: ask the study, answer
from the log what it has, measure the rest.

    result = tune("conv2d", wl, device="pocl", trials=64)   # -> TuneResult(best record, ...)
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.errors import ErrorCode
from tuner.logs import Record, load_records
from tuner.logs.io import ensure_writable
from tuner.measure import MeasureOptions, Measurer
from tuner.logs import append_records
from tuner.search.loop import (EarlyStopping, Evaluator, Session, enqueue_fallback, enqueue_region, enqueue_seeds,
                               open_session, optimize, progress_bar, record_of, score)
from tuner.search.samplers import _key
from tuner.search.shared import Wrapping, measured_error
from tuner.search.storage import open_storage
from tuner.task import TuningTask


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


class LocalStrategy:
    """``tune()``'s strategy: ask the study; a config the log has is answered from it (not measured), a
    config the space's constraints refuse is failed as ``INSTANTIATION`` here (not sent to the device), a
    config proposed twice in one batch is failed. Every trial asked is in ``asked`` until told, so that an
    interruption tells the study what the log has (``settle``)."""

    REPEATS = 20  # proposals in a row that measure nothing new before asking whether the space is exhausted

    def __init__(self, session: Session, result: TuneResult, max_proposals: int):
        self.session, self.result, self.max_proposals = session, result, max_proposals
        self.proposals = 0
        self.asked: dict = {}  # trial number -> (trial, record once measured)
        self.repeats = 0  # proposals in a row answered from the log or failed as duplicates
        self._size: int | None = None  # the space's valid configs, counted once when first needed

    def finished(self) -> bool:
        return self.proposals >= self.max_proposals or self.exhausted()

    def exhausted(self, pending=()) -> bool:
        """Every valid config of the space is in the log (measured, or refused by the template): nothing is
        left to propose. Asked only after ``REPEATS`` proposals in a row measured nothing new, so a large space
        is never counted; a small one re-run would otherwise ask its full budget of proposals, each answered
        from the log (a 12-config task spent 160 s so on an H100). ``pending``: the keys of configs proposed
        for measurement in this batch, which count as known."""
        if self.repeats < self.REPEATS:
            return False
        s = self.session
        if self._size is None:
            self._size = s.space.size()
        known = set(s.known).union(pending)
        if len(known) < self._size:
            return False
        # the log may hold configs of this space's choices that its constraints reject now (an older version)
        return sum(not s.space.violations(dict(zip(s.names, k))) for k in known) >= self._size

    def propose(self, n: int) -> list:
        s, todo, pending = self.session, [], set()  # pending: the keys of ``todo``
        while len(todo) < n and self.proposals < self.max_proposals and not self.exhausted(pending):
            self.proposals += 1
            trial = _ask(s)
            self.asked[trial.number] = (trial, None)
            values = s.values(trial)
            k = _key(values, s.names)
            rejected = k not in s.known and bool(s.space.violations(values))
            in_flight = k not in s.known and not rejected and _peer_state(s, k, trial.number) == "in_flight"
            if k in s.known:  # measured before (this run, an earlier one, or a concurrent tuner): from the log
                rec = s.known[k]
                _tell(s.study, trial, rec, from_log=True)
                self.result.reused += 1
            elif rejected:  # the space's constraints refuse it: no device work, no log line
                _reject(s.study, trial)
            elif in_flight or k in pending:
                _fail(s.study, trial)  # a duplicate: measured once, by whoever asked first
            else:
                todo.append((trial, values))
                pending.add(k)
                self.repeats = 0
                continue
            self.repeats += 1
            del self.asked[trial.number]
        return todo

    def measured(self, proposals: list, recs: list) -> None:
        for (tr, _), rec in zip(proposals, recs):
            self.asked[tr.number] = (tr, rec)  # measured: told its value if the log has it when Ctrl-C comes

    def tell(self, trial, rec: Record) -> None:
        s = self.session
        s.known[_key(s.values(trial), s.names)] = rec
        _tell(s.study, trial, rec, record=rec.to_dict())  # the study alone can rebuild the log
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
                    _tell(study, trial, rec, record=rec.to_dict())
                else:
                    _fail(study, trial)
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
        if rec.ok and (res.best is None or score(rec) > score(res.best)):
            res.best = rec
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"best {score(res.best):.3g} GFLOP/s" if res.best else "no success yet")



class TaskSearch:
    """One task's search, open across visits: its study and session, the strategy, this run's result and its
    early-stopping count. ``tune()`` makes one and runs it to its budget; a model's task scheduler
    (``tuner.scheduler``) keeps one per task and visits each as often as it is worth, with one runner for all.
    ``close()`` settles what a visit left asked (Ctrl-C included)."""

    def __init__(self, task: TuningTask, info, log: str, storage, sampler: str = "xgb", seed: int | None = 0,
                 transfer: bool = True, fallback_first: bool = True, transfer_from=None,
                 device_region: bool | dict = True, sampler_options: dict | None = None,
                 early_stopping: int | None = None):
        self.task, self.info, self.log = task, info, log
        self.early_stopping = early_stopping
        session = open_session(task, info, storage, task.study_name(info.fingerprint), log, sampler, seed, transfer,
                               wrap=Owning, transfer_from=transfer_from, sampler_options=sampler_options,
                               device_region=device_region)  # each trial names its tuner before it is sampled
        announce(session.study)  # before the first ask: an ownerless trial may be ours from now on
        _recover(session)
        enqueue_seeds(session)  # a named sibling's best configs of this very task first: the strongest evidence
        if fallback_first:
            enqueue_fallback(session)
        if device_region:  # only for a task nothing of which was measured yet
            enqueue_region(session, seed)
        self.session = session
        best = max((r for r in session.known.values() if r.ok), key=score, default=None)
        self.result = TuneResult(session.study.study_name, best, log=log, label=task.label)
        self.strategy = LocalStrategy(session, self.result, 0)
        self.stopping = EarlyStopping(early_stopping, best) if early_stopping else None
        self.stopped = False  # early stopping ended the search
        self.exhausted = False  # the space has nothing left to propose

    @property
    def done(self) -> bool:
        return self.stopped or self.exhausted

    def run(self, trials: int, evaluate, batch: int, callbacks=()) -> int:
        """Measure up to ``trials`` new configs (fewer when early stopping ends the search or the space runs out)
        in batches of ``batch``; the number measured."""
        if self.done or trials <= 0:
            return 0
        before = self.result.measured
        st = self.strategy
        st.max_proposals = st.proposals + 20 * trials + 100  # proposals answered from the log count too

        def stop_early(strategy, rec) -> bool:
            self.stopped = self.stopping is not None and bool(self.stopping(strategy, rec))
            return self.stopped
        optimize([st], evaluate, lambda: min(batch, trials - (self.result.measured - before)),
                 [Tally(self.result), *callbacks, stop_early])
        if self.result.measured - before < trials and not self.stopped and st.proposals < st.max_proposals:
            self.exhausted = True  # it stopped proposing before its budget: nothing new is left
        return self.result.measured - before

    def propose(self, n: int) -> list:
        """Up to ``n`` new configs to measure (``[(trial, knob values)]``); fewer when the space runs out."""
        st = self.strategy
        st.max_proposals = st.proposals + 20 * n + 100
        props = st.propose(n)
        if len(props) < n:
            self.exhausted = True
        return props

    def take(self, proposals: list, results: list, callbacks=()) -> list:
        """The measurements of ``proposals`` (``MeasureResult`` each, in order): recorded, appended to the log
        (first: a kill after this loses nothing), told to the study; the records, in order."""
        s, t = self.session, self.session.task.tmpl
        cfgs = [t.make_config(v) for _, v in proposals]
        recs = [record_of(t, s.task.workload, c, self.info, res, tr.number, s.sampler, s.study.study_name)
                for (tr, _), c, res in zip(proposals, cfgs, results)]
        self.strategy.measured(proposals, recs)
        append_records(self.log, recs)
        tally = Tally(self.result)
        for (tr, _), rec in zip(proposals, recs):
            self.strategy.tell(tr, rec)
            tally(self.strategy, rec)
            for cb in callbacks:
                cb(self.strategy, rec)
            if self.stopping is not None and self.stopping(self.strategy, rec):
                self.stopped = True
        return recs

    def close(self) -> None:
        self.strategy.settle()


def tune(template, workload, device=None, trials: int = 32, log: str | None = None, storage: str | None = None,
         sampler: str = "xgb", scopes: dict | None = None, seed: int | None = 0, early_stopping: int | None = None,
         batch: int | None = None, options: MeasureOptions | None = None, progress: bool = True,
         transfer: bool = True, fixed: dict | None = None, measurer: Measurer | None = None,
         fallback_first: bool = True, transfer_from=None, device_region: bool | dict = True,
         sampler_options: dict | None = None) -> TuneResult:
    """Measure up to ``trials`` new configs of ``template`` (a registered name, or ``"module:ATTRIBUTE"``)
    on ``workload`` with ``sampler`` (xgb, tpe or random), stopping early after ``early_stopping``
    measurements without improvement. ``fixed`` pins knobs (a model pins its activation layout so that the
    kernel tuned is the kernel deployed). ``device``: a DeviceInfo, Device or spec (measured by local worker
    processes), or any ``Runner`` or ``Runtime`` (``tuner.measure``, ``tuner.runtime.base``). ``measurer``: an
    open Runner to reuse (a model's tasks share one set of worker processes instead of starting them per task). ``fallback_first``: the template's
    fallback config is the first trial (unless the log has it), so tuned and untuned can be compared and the
    search starts from what the task runs untuned. ``device_region``: then ``REGION_SEEDS`` configs of each
    mode of the device class's default region (``tuner.search.regions``: a CPU convolution's wide work-groups and
    its narrow groups of 2-D tiles, a GPU convolution's 1x1 tiles with split reductions in wide or small
    groups) are measured, when the log holds nothing of the task yet; the sampler learns from them as from any
    trial (and starts around them when they are the best of the first trials). The xgb sampler also gets the
    region's modes and, where there are two or more, searches each in turn (``XGBSampler``'s ``modes``), whether
    or not the log knew the task. A dict: a regions table in ``REGIONS``'
    shape used instead (``tuner.search.regions.ONE_MODE``: the region before the CPU's second mode).
    ``sampler_options``: keyword arguments of the xgb sampler (``XGBSampler``: its exploration, transfer weighting).
    ``transfer_from``: sibling devices' fingerprints (or ``"auto"``) whose records of the template weigh in the
    cost model's transfer as this device's own, and whose best configs of this task that this device's space
    accepts are measured first (``loop.sibling_knowledge``).

    Ctrl-C (KeyboardInterrupt) propagates: the trials it cut short are told to the study first (their
    measurement when the log has it, else failed), so no trial is left running and nothing in the log is
    measured again by a re-run."""
    from tuner.measure import Runner, open_runner
    from tuner.runtime.base import Runtime
    from tuner.target import DeviceInfo
    info = device.info if hasattr(device, "info") else device
    if not isinstance(info, DeviceInfo):
        from tuner.runtime.opencl.device import choose_device
        info = choose_device(info)
    if measurer is None and isinstance(device, (Runner, Runtime)):
        measurer = open_runner(device, options)  # any device behind the seam; the caller's to close
    spec = template if isinstance(template, str) else template.name  # measuring processes look it up again
    task = TuningTask(spec, workload, scopes, fixed or {}).bind(info)
    log = str(ensure_writable(log or default_log(info.fingerprint)))  # before any measurement
    storage = open_storage(storage or default_storage(log), heartbeat=None)  # validated, race-free creation
    options = options or MeasureOptions()
    search = TaskSearch(task, info, log, storage, sampler, seed, transfer, fallback_first, transfer_from,
                        device_region, sampler_options, early_stopping)
    result = search.result
    bar = progress_bar(trials, progress, task.label)
    own = measurer is not None
    batch = batch or options.n_parallel
    try:
        with Evaluator(info, log, (lambda: contextlib.nullcontext(measurer)) if own else
                       (lambda: Measurer(info, options))) as evaluate:
            search.run(trials, evaluate, batch, [Tally(TuneResult("", None), bar)] if bar is not None else [])
    finally:
        search.close()
        if bar is not None:
            bar.close()
    return result


def _recover(s: Session) -> None:
    """After a killed run: running trials no tuner holds any more (``_in_flight``) are marked failed;
    measurements in the log that the study never heard of are added to it (failures as FAIL trials), so the
    sampler learns from them and never proposes them again."""
    in_study = set()
    askers = _askers(s.study)
    for tr in s.study.get_trials(deepcopy=False):
        if tr.state == TrialState.RUNNING:
            if not _in_flight(tr, askers):
                _fail_abandoned(s.study, tr)
        elif (tr.state == TrialState.COMPLETE or measured_error(tr)) and all(n in tr.params for n in s.names):
            in_study.add(_key(tr.params, s.names))
    dists = s.dists
    for k, rec in s.known.items():
        if k not in in_study:
            attrs = {"from_log": True, "error": rec.error_name, "record": rec.to_dict()}
            state = TrialState.COMPLETE if rec.ok else TrialState.FAIL
            s.study.add_trial(optuna.trial.create_trial(params=dict(zip(s.names, k)), distributions=dists,
                                                        value=score(rec) if rec.ok else None, state=state,
                                                        user_attrs=attrs))


def _fail_abandoned(study, trial) -> None:
    try:
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except UpdateFinishedTrialError:
        pass  # another tuner's _recover, or its owner, finished it first


OWNER = f"{socket.gethostname()}:{os.getpid()}"
OWNERLESS_GRACE_S = 60.0  # how long a RUNNING trial without an owner counts as a remote peer's trial inside ask
ASKER = "asker:"  # study user attribute prefix: ASKER + owner for every tuner that asks trials in the study


def announce(study) -> None:
    """Name this tuner among the study's askers (a study user attribute) before it asks its first trial, so
    that an ownerless trial -- ``study.ask`` writes the ``owner`` only after creating the trial -- can be told
    apart: a live asker's, or one left by an asker killed inside ``ask``."""
    study.set_user_attr(ASKER + OWNER, True)


def _askers(study) -> tuple | None:
    """The tuners ``announce``d in ``study`` (None for a study no tuner announced itself in: an older
    version's, judged by the grace period alone)."""
    found = tuple(k[len(ASKER):] for k in study.user_attrs if k.startswith(ASKER))
    return found or None


class Owning(Wrapping):
    """A sampler that names this tuner as the ``owner`` of each trial it begins, before the inner sampler
    runs (an XGBoost fit takes seconds): a trial is ownerless only between its creation and this call,
    and a tuner killed while sampling leaves a trial whose owner is known dead."""

    def before_trial(self, study, trial) -> None:
        study._storage.set_trial_user_attr(trial._trial_id, "owner", OWNER)
        self.inner.before_trial(study, trial)


def _in_flight(trial, askers: tuple | None = None) -> bool:
    """Whether a trial is some tuner's, being asked or measured: the one rule by which ``_recover`` fails
    trials and ``_peer_state`` leaves configs to peers. A trial is in flight until its owner is known dead;
    no tuner fails a trial another is asking for.

    ``study.ask`` creates a RUNNING trial before the ``owner`` is written (``Owning``), so a trial without one
    may be a peer's inside ``ask``: it is in flight while one of the study's other ``askers`` may be asking --
    one on this host that is alive, or one on another host (unknowable from here) for ``OWNERLESS_GRACE_S``.
    When every other asker is dead (a tuner killed inside ``ask``, then resumed) it is failed at once. With
    ``askers`` unknown (None: a study of an older version) the grace period alone decides."""
    if trial.state != TrialState.RUNNING:
        return False
    owner = trial.user_attrs.get("owner")
    if owner is not None:
        return _owner_alive(owner)
    young = _age_s(trial) < OWNERLESS_GRACE_S
    if askers is None:
        return young
    return any(a != OWNER and (_owner_alive(a) if _local(a) else young) for a in askers)


def _local(owner: str) -> bool:
    return owner.rpartition(":")[0] == socket.gethostname()


def _age_s(trial) -> float:
    """Seconds since ``trial`` started, by this machine's clock (Optuna stamps ``datetime_start`` with the
    asking process's local time; the tuners sharing a study by ``owner`` share a host)."""
    start = trial.datetime_start
    return (datetime.now() - start).total_seconds() if start is not None else 0.0


def _owner_alive(owner: str) -> bool:
    """Whether the tuner ``owner`` (host:pid) still runs. Known only for tuners on this host: a tuner on
    another machine shares studies as a worker (heartbeats, ``tuner.search.shared``), so one named here is
    a dead host's or container's leftover."""
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


def _ask(s: Session, tries: int = 5):
    """``study.ask``, again when a peer failed the trial while this tuner was inside ``ask`` (it judged this
    tuner dead: the owner of a trial unknowable from its host, or a sampler slower than the grace period);
    that trial is the peer's business now, a new one is asked."""
    for attempt in range(tries):
        try:
            return s.study.ask(s.dists)
        except UpdateFinishedTrialError:
            if attempt == tries - 1:
                raise


def _tell(study, trial, rec: Record, **attrs) -> None:
    """A trial this tuner holds, told its record (COMPLETE with its GFLOP/s, or FAIL with the error's name,
    user attribute ``error``). The record is in the log already, which is the truth: when a peer finished
    the trial first (it judged this tuner dead), the measurement joins the study as a new trial marked
    ``late``, so that the sampler and the peers learn it all the same."""
    state = TrialState.COMPLETE if rec.ok else TrialState.FAIL
    try:
        for k, v in {"error": rec.error_name, **attrs}.items():
            trial.set_user_attr(k, v)
        study.tell(trial, score(rec) if rec.ok else None, state=state, skip_if_finished=True)
    except UpdateFinishedTrialError:
        pass
    t = study._storage.get_trial(trial._trial_id)
    if t.state == state and t.user_attrs.get("error") == rec.error_name:
        return  # told (by us, or failed by a peer after our attributes, which says the same)
    study.add_trial(optuna.trial.create_trial(
        params=t.params, distributions=t.distributions, value=score(rec) if rec.ok else None, state=state,
        user_attrs={**attrs, "error": rec.error_name, "record": rec.to_dict(), "owner": OWNER, "late": True}))


def _reject(study, trial) -> None:
    """A trial whose config the search space's constraints refuse, failed as ``INSTANTIATION`` without measuring
    it (the samplers draw valid configs; one that finds none left unseen falls back to Optuna's independent
    draws, which the constraints mostly refuse), so that the samplers count it as seen."""
    try:
        trial.set_user_attr("error", ErrorCode.INSTANTIATION.name)
    except UpdateFinishedTrialError:
        return  # a peer failed it first
    _fail(study, trial)


def _fail(study, trial) -> None:
    """A trial this tuner holds and will not measure, failed (a peer may have failed it already)."""
    try:
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
    except UpdateFinishedTrialError:
        pass


def _peer_state(s, k, number: int, wait_s: float = 60.0) -> str | None:
    """What concurrent tuners on this study did with config ``k``, from one snapshot of its trials: ``"known"``
    (a peer measured it: its record joins ``s.known``), ``"in_flight"`` (a peer's trial in flight, asked
    before trial ``number``: that one measures it) or None (nobody: this trial measures it).

    ``study.ask`` creates a RUNNING trial first and writes its parameters after its sampler ran, so a peer trial
    asked before ours may not show its config yet; then the snapshot is taken again, for up to ``wait_s`` (a
    tuner killed inside ``ask`` leaves such a trial behind, in flight by ``_in_flight`` until its asker is known
    dead; then a session's ``_recover`` fails it). The wait lasts as long as the peer's sampler: an XGBoost fit
    on a loaded 2-core host takes seconds, and with a 1 s limit four tuners at once measured a config twice
    (2026-11-28). A trial without its config older than ``wait_s`` is not waited for (an asker that failed
    inside ``ask`` and lives on leaves one behind), and the snapshots back off from 10 ms to 200 ms apart. One
    snapshot for all states: two reads let a peer finish between them unseen."""
    deadline, pause = time.monotonic() + wait_s, 0.01
    while True:
        pending = in_flight = False
        askers = _askers(s.study)
        for tr in s.study.get_trials(deepcopy=False):
            if tr.number == number:
                continue
            if not all(n in tr.params for n in s.names):
                pending |= tr.number < number and _in_flight(tr, askers) and _age_s(tr) < wait_s
                continue
            if _key(tr.params, s.names) != k:
                continue
            if tr.state in (TrialState.COMPLETE, TrialState.FAIL) and tr.user_attrs.get("record"):
                try:
                    s.known[k] = Record.from_dict(tr.user_attrs["record"])
                    return "known"
                except Exception:  # noqa: BLE001 - a record another version wrote: measure instead
                    continue
            in_flight |= tr.number < number and _in_flight(tr, askers)
        if in_flight:  # a record, had there been one, wins: nothing to measure then
            return "in_flight"
        if not pending or time.monotonic() > deadline:
            return None
        time.sleep(pause)
        pause = min(0.2, pause * 2)
