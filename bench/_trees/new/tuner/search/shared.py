"""Studies shared by workers on many machines: storages with heartbeats, a claim on each trial so that no
config is measured twice and no task's budget is overspent, and reaping of the trials of dead workers.

Storages are Optuna's own (``tuner.search.storage``). Liveness: a worker heartbeats every trial it holds; in
a database that is Optuna's trial heartbeat (staleness is judged by the server's clock, so a phone's clock does
not matter), in a journal a ``tuner:beat`` timestamp (one machine, one clock). A stale trial that already carries its measurement (the
``record`` user attribute) is finished with it (COMPLETE, or FAIL for a failed measurement), any other is
failed: a worker killed with SIGKILL loses nothing it measured.

The claim (``claim``), after ``study.ask`` has set a trial's params: hold the trial's heartbeat, write the
claim, then read the study and decide (``decide``). Every worker writes its claim before it reads, so of two
claims at least one reader sees the other. A trial yields to any claimed twin (same params) that is lower
(by trial id) or already going, and to a full budget counted over done trials, lower claims and claims that
went; it waits while a higher claim it sees has not decided (that one may not have seen it). Two trials of
one config can then not both go: the higher went without seeing the lower, so the lower saw it, undecided
(waited) or gone (yielded). Waits only point upwards, so they end. The same argument bounds the budget.
"""
from __future__ import annotations

import threading
import time
import warnings

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.samplers import BaseSampler
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState

CLAIM, VERDICT, BEAT = "tuner:claim", "tuner:verdict", "tuner:beat"  # trial system attributes
GO, YIELD, WAIT = "go", "yield", "wait"


class Heartbeat:
    """Beats for the trials this worker holds, every ``interval`` seconds, from a daemon thread."""

    def __init__(self, storage, interval: float):
        self.storage, self.interval = storage, interval
        self.held: set = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tuner-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()

    def hold(self, trial_id: int) -> None:
        """Beat now (a death from here on leaves a stale trial) and keep beating until ``release``."""
        with self.lock:
            self.held.add(trial_id)
        self._beat(trial_id)

    def release(self, trial_id: int) -> None:
        with self.lock:
            self.held.discard(trial_id)

    def _beat(self, trial_id: int) -> None:
        try:
            if is_heartbeat_enabled(self.storage):
                self.storage.record_heartbeat(trial_id)
            else:
                self.storage.set_trial_system_attr(trial_id, BEAT, time.time())
        except UpdateFinishedTrialError:
            self.release(trial_id)  # finished (by us or a reaper): nothing left to keep alive

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            with self.lock:
                held = list(self.held)
            for trial_id in held:
                try:
                    self._beat(trial_id)
                except Exception as e:  # noqa: BLE001 -- a transient storage error must not end the heartbeat
                    warnings.warn(f"heartbeat of trial {trial_id} failed ({e}); retrying", RuntimeWarning)


class Wrapping(BaseSampler):
    """A sampler that hands every call to ``inner``: a base for samplers that do one thing more when a trial
    begins (``before_trial``), e.g. stamp it before the inner sampler's model fit (which takes a while)."""

    def __init__(self, inner: BaseSampler):
        self.inner = inner

    def before_trial(self, study, trial) -> None:
        self.inner.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self.inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


class Announcing(Wrapping):
    """A sampler that holds each new trial's heartbeat before sampling it (a model fit takes a while): a
    worker killed while sampling leaves a trial that goes stale like any other."""

    def __init__(self, inner: BaseSampler, heartbeat: Heartbeat):
        super().__init__(inner)
        self.heartbeat = heartbeat

    def before_trial(self, study, trial) -> None:
        self.heartbeat.hold(trial._trial_id)
        self.inner.before_trial(study, trial)


def measured_error(trial) -> str | None:
    """The error name of a finished trial that holds a measurement (``NO_ERROR``: a success, COMPLETE; a failed
    measurement is FAIL with its ``record`` or ``error`` attribute), None for a trial never measured (a claim
    that yielded, a trial interrupted or reaped before its measurement)."""
    if trial.state not in (TrialState.COMPLETE, TrialState.FAIL):
        return None
    name = (trial.user_attrs.get("record") or {}).get("error_name") or trial.user_attrs.get("error")
    return name or ("NO_ERROR" if trial.state == TrialState.COMPLETE else None)


def counts(trial) -> bool:
    """Whether a finished trial spent budget: a measurement, successful or failed (a config the template
    rejects before any device work, INSTANTIATION, is not)."""
    return measured_error(trial) not in (None, "INSTANTIATION")


def is_claimed(t) -> bool:
    return t.state == TrialState.RUNNING and CLAIM in t.system_attrs and t.system_attrs.get(VERDICT) != YIELD


def decide(trials: list, me, names: list, budget: int | None) -> str:
    """GO, YIELD or WAIT for the claimed trial ``me`` given a fresh read of the study's ``trials``."""
    mine = tuple(me.params.get(n) for n in names)
    done = lower = went = undecided = 0
    for t in trials:
        if t._trial_id == me._trial_id:
            continue
        twin = tuple(t.params.get(n) for n in names) == mine
        if measured_error(t) is not None:
            if twin:
                return YIELD  # measured already
            done += counts(t)
        elif is_claimed(t):
            verdict = t.system_attrs.get(VERDICT)
            if t._trial_id < me._trial_id or verdict == GO:
                if twin:
                    return YIELD  # a lower claim goes first or decides for both; a higher one went
                lower += t._trial_id < me._trial_id
                went += t._trial_id > me._trial_id
            else:
                if twin:
                    return WAIT  # a higher claim that may not have seen mine: its verdict decides
                undecided += 1
    taken = done + lower + went
    if budget is not None and taken >= budget:
        return YIELD
    if budget is not None and undecided and taken + undecided >= budget:
        return WAIT
    return GO


def claim(study, trial, names: list, worker: str, budget: int | None = None, wait_s: float = 10.0) -> bool:
    """Claim ``trial`` (asked, params set, heartbeat held) for ``worker``: True to measure it, False when it
    yielded (marked FAIL with the reason in ``tuner:verdict``). Giving up after ``wait_s`` is safe."""
    storage, tid = study._storage, trial._trial_id
    storage.set_trial_system_attr(tid, CLAIM, worker)
    deadline = time.monotonic() + wait_s
    while True:
        trials = study.get_trials(deepcopy=False)
        me = next(t for t in trials if t._trial_id == tid)
        verdict = decide(trials, me, names, budget) if me.state == TrialState.RUNNING else YIELD
        if verdict == WAIT and time.monotonic() < deadline:
            time.sleep(0.05)
            continue
        if verdict == GO:
            storage.set_trial_system_attr(tid, VERDICT, GO)
            return True
        try:
            storage.set_trial_system_attr(tid, VERDICT, YIELD)
            storage.set_trial_state_values(tid, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass  # reaped meanwhile: failed either way
        return False


def reap(study, grace: float, on_completed=None) -> int:
    """Finish the trials of dead workers: a stale trial carrying its ``record`` is finished with it (and
    ``on_completed(record dict)`` called, e.g. to append it to this worker's log), any other is failed.
    Returns how many this call finished (exactly one reaper wins each trial)."""
    storage = study._storage
    if is_heartbeat_enabled(storage):
        stale = storage._get_stale_trial_ids(study._study_id)  # judged by the database server's clock
    else:
        now = time.time()
        stale = [t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                 if now - t.system_attrs.get(BEAT, t.datetime_start.timestamp() if t.datetime_start else now)
                 > grace]
    finished = 0
    for tid in stale:
        t = storage.get_trial(tid)
        record = t.user_attrs.get("record")
        try:
            storage.set_trial_system_attr(tid, "tuner:reaped", True)  # judged stale (a finished trial takes no attrs)
            storage.set_trial_state_values(tid, *final_state(record))
        except UpdateFinishedTrialError:
            continue
        finished += 1
        if record is not None and on_completed is not None:
            on_completed(record)
    return finished


def score_of(record: dict) -> float:
    """GFLOP/s of a successful measurement, 0 for a failure (the cost model learns failures as zeros)."""
    ok = record.get("error_code") == 0 and record.get("median_s") is not None
    return float(record["gflops"]) if ok and record.get("gflops") else 0.0


def final_state(record: dict | None) -> tuple:
    """How a trial carrying ``record`` (or none) ends, as ``set_trial_state_values`` arguments: COMPLETE with its
    GFLOP/s for a success, FAIL for a failed measurement or none (never COMPLETE with a made-up 0)."""
    return (TrialState.COMPLETE, [score_of(record)]) if record and score_of(record) > 0 else (TrialState.FAIL,)


def finish(study, trial_id: int, record: dict) -> str:
    """Tell a measured trial (its ``record`` attribute already set). When a reaper judged this worker dead
    meanwhile, the trial holds the same record (nothing to do) or none (it was reaped before the record
    arrived): then the measurement joins the study as a new trial, marked ``late``. Returns the trial's
    final state name."""
    storage = study._storage
    state, *value = final_state(record)
    try:
        storage.set_trial_state_values(trial_id, state, *value)
        return state.name
    except UpdateFinishedTrialError:
        t = storage.get_trial(trial_id)
        if measured_error(t) is not None:
            return t.state.name
        study.add_trial(optuna.trial.create_trial(params=t.params, distributions=t.distributions, state=state,
                                                  value=value[0][0] if value else None,
                                                  user_attrs={**t.user_attrs, "record": record, "late": True}))
        return "LATE"
