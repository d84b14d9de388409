"""Who may fail a RUNNING trial: a trial is in flight until its owner is known dead, and no tuner fails a trial
another is asking for (``tuner.search.tune._in_flight``, the one rule of ``_recover`` and ``_peer_state``).
Each race is replayed one step at a time in a SQLite storage, as concurrent tuners share it; a storage in a
directory nobody can write in fails at once, naming it."""
import dataclasses
import importlib
import os
import socket
import subprocess
import sys
import time
import types
from datetime import datetime, timedelta

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tuner.errors import TunerError
from tuner.logs import Record
from tuner.search.storage import open_storage
from tuner.templates import get_template

T = importlib.import_module("tuner.search.tune")  # the module (tuner.search.tune is also its function)

DIST = {"a": CategoricalDistribution([1, 2, 3])}


def _session(tmp_path, sampler=None):
    """What ``_recover`` and ``_peer_state`` read of a session: one study in a SQLite file, as tuners share it."""
    storage = open_storage(f"sqlite:///{tmp_path / 'studies.db'}", heartbeat=None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize", sampler=sampler)
    return types.SimpleNamespace(study=study, names=["a"], known={}, dists=DIST)


def _running(s, owner=None, started=None, a=1) -> int:
    """A RUNNING trial of config ``a`` as a peer's ``ask`` leaves it: ``owner`` None before the owner is
    written; ``started`` its datetime_start (default now). Returns its trial id."""
    ft = optuna.trial.create_trial(state=TrialState.RUNNING, params={"a": a}, distributions=DIST,
                                   user_attrs={} if owner is None else {"owner": owner})
    ft.datetime_start = started or datetime.now()
    s.study.add_trial(ft)
    return max(t._trial_id for t in s.study.get_trials(deepcopy=False))


def _state(s, trial_id) -> TrialState:
    return s.study._storage.get_trial(trial_id).state


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_peer_inside_ask_keeps_its_trial(tmp_path):
    """The race of the issue: optuna creates the RUNNING trial, the peer's tuner writes ``owner`` right after.
    A tuner starting in between (``_recover``) must leave it running; the old rule failed it, and the peer
    died in ``study.ask`` with UpdateFinishedTrialError."""
    s = _session(tmp_path)
    no_params = s.study._storage.create_new_trial(s.study._study_id)  # inside ask: no parameters yet
    asked = _running(s)  # ask returned, owner not written yet
    T._recover(s)
    assert _state(s, no_params) == TrialState.RUNNING
    assert _state(s, asked) == TrialState.RUNNING
    s.study._storage.set_trial_param(no_params, "a", 0, DIST["a"])  # the peer carries on undisturbed
    assert T._peer_state(s, (1,), s.study._storage.get_trial(asked).number + 1) == "in_flight"


def test_dead_and_long_ownerless_trials_are_failed_live_owners_kept(tmp_path):
    s = _session(tmp_path)
    host = socket.gethostname()
    dead = _running(s, owner=f"{host}:{_dead_pid()}")
    stuck = _running(s, started=datetime.now() - timedelta(seconds=T.OWNERLESS_GRACE_S + 5))  # killed inside ask
    alive = _running(s, owner=f"{host}:{os.getppid()}")  # a live process on this host: a peer measuring
    young = _running(s, started=datetime.now() - timedelta(seconds=T.OWNERLESS_GRACE_S / 2))
    T._recover(s)
    assert _state(s, dead) == TrialState.FAIL
    assert _state(s, stuck) == TrialState.FAIL
    assert _state(s, alive) == TrialState.RUNNING
    assert _state(s, young) == TrialState.RUNNING


def test_recover_and_peer_state_judge_by_one_rule(tmp_path):
    """``_peer_state`` leaves a config to a peer exactly when ``_recover`` would leave the peer's trial
    running."""
    s = _session(tmp_path)
    host, old = socket.gethostname(), datetime.now() - timedelta(seconds=T.OWNERLESS_GRACE_S + 5)
    cases = {"ownerless": {}, "ownerless too long": {"started": old}, "dead": {"owner": f"{host}:{_dead_pid()}"},
             "alive": {"owner": f"{host}:{os.getppid()}"}, "elsewhere": {"owner": "some-other-host:1"}}
    ids = {name: _running(s, a=1, **kw) for name, kw in cases.items()}
    mine = s.study._storage.get_trial(max(ids.values())).number + 1
    verdicts = {name: T._in_flight(s.study._storage.get_trial(tid)) for name, tid in ids.items()}
    assert verdicts == {"ownerless": True, "ownerless too long": False, "dead": False, "alive": True,
                        "elsewhere": False}
    assert T._peer_state(s, (1,), mine) == "in_flight"  # the ownerless and the alive one
    T._recover(s)
    assert {n: _state(s, tid) == TrialState.RUNNING for n, tid in ids.items()} == verdicts


def test_an_ownerless_trial_is_failed_at_once_when_every_other_asker_is_dead(tmp_path):
    """A tuner killed inside ``ask`` (the trial created, its owner not yet written) and resumed at once: its
    trial must not wait out the grace period (CI saw it left RUNNING after the resumed run). Every tuner that
    asks names itself first (``announce``); an ownerless trial is in flight only while another asker may be
    asking: alive on this host, or on another host within the grace period."""
    host = socket.gethostname()
    for askers, kept in (([f"{host}:{_dead_pid()}"], False), ([f"{host}:{os.getppid()}"], True),
                         (["some-other-host:1"], True), ([T.OWNER], False)):
        s = _session(tmp_path / str(len(list(tmp_path.iterdir()))))
        for a in askers:
            s.study.set_user_attr(T.ASKER + a, True)
        young = _running(s)
        T._recover(s)
        assert (_state(s, young) == TrialState.RUNNING) is kept, askers
        assert T._in_flight(s.study._storage.get_trial(young), T._askers(s.study)) is kept
    s = _session(tmp_path / "remote")
    s.study.set_user_attr(T.ASKER + "some-other-host:1", True)
    old = _running(s, started=datetime.now() - timedelta(seconds=T.OWNERLESS_GRACE_S + 5))
    T._recover(s)
    assert _state(s, old) == TrialState.FAIL  # a remote asker gets the grace period, no more


def test_tune_announces_itself_before_asking(tmp_path):
    (tmp_path / "older").mkdir()
    assert T._askers(_session(tmp_path / "older").study) is None  # nobody announced: judged by the grace period
    s = _session(tmp_path)
    T.announce(s.study)
    assert T._askers(s.study) == (T.OWNER,)


def _record(a: int, costs=(1e-3,)) -> Record:
    """A measurement of the config this test's knob ``a`` stands for (a whole conv2d config: records are
    checked against their template's knobs when read back)."""
    t = get_template("conv2d")
    info = types.SimpleNamespace(fingerprint="fp", name="dev", platform="p", driver_version="1")
    wl = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    return Record.new("conv2d", wl, dataclasses.replace(t.config(), tile_oc=a), info, costs=costs)


@pytest.mark.parametrize("when", ["before", "between"])
def test_a_trial_a_peer_failed_is_told_without_losing_the_measurement(tmp_path, when):
    """A peer judged this tuner dead and failed its trial (``before`` it wrote its attributes, or ``between``
    them and ``tell``): telling it raises nothing, and the measurement joins the study as a ``late`` trial,
    which peers and the sampler learn from."""
    s = _session(tmp_path)
    trial = s.study.ask(DIST)
    rec = _record(trial.params["a"])
    peer_fails = lambda: s.study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)  # noqa: E731
    if when == "before":
        peer_fails()
        T._tell(s.study, trial, rec, record=rec.to_dict())
    else:
        real_tell = s.study.tell
        s.study.tell = lambda *a, **kw: (peer_fails(), real_tell(*a, **kw))[1]
        T._tell(s.study, trial, rec, record=rec.to_dict())
        s.study.tell = real_tell
    late = [t for t in s.study.get_trials(deepcopy=False) if t.user_attrs.get("late")]
    assert len(late) == 1 and late[0].state == TrialState.COMPLETE and late[0].value == pytest.approx(rec.gflops)
    assert late[0].params == trial.params and late[0].user_attrs["record"] == rec.to_dict()
    again = s.study.ask(DIST)
    k = (trial.params["a"],)
    s.known.clear()
    assert T._peer_state(s, k, again.number) == "known" and s.known[k].median_s == rec.median_s
    T._fail(s.study, trial)  # failing a trial a peer failed: nothing happens


def test_a_told_trial_is_not_added_again(tmp_path):
    s = _session(tmp_path)
    trial = s.study.ask(DIST)
    T._tell(s.study, trial, _record(trial.params["a"]), record={})
    failed = s.study.ask(DIST)
    T._tell(s.study, failed, _record(failed.params["a"], costs=()))  # a failed measurement: FAIL, as told
    trials = s.study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL]
    assert not any(t.user_attrs.get("late") for t in trials)


class _PeerFailsFirstAsk(optuna.samplers.RandomSampler):
    """While this tuner is inside its first ``ask``, a peer fails the new trial."""

    failed = None

    def before_trial(self, study, trial):
        if self.failed is None:
            self.failed = trial._trial_id
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def test_an_ask_a_peer_cut_short_is_asked_again(tmp_path):
    sampler = _PeerFailsFirstAsk()
    s = _session(tmp_path, sampler=T.Owning(sampler))
    trial = T._ask(s)
    assert trial._trial_id != sampler.failed and _state(s, trial._trial_id) == TrialState.RUNNING
    assert s.study._storage.get_trial(trial._trial_id).user_attrs["owner"] == T.OWNER


class _Peeking(optuna.samplers.RandomSampler):
    """Records the trial's owner as the sampler sees it (an XGBoost fit runs here, for seconds)."""

    owners: list

    def sample_relative(self, study, trial, search_space):
        self.owners = [*getattr(self, "owners", []), study._storage.get_trial(trial._trial_id).user_attrs]
        return {}


def test_a_trial_names_its_owner_before_it_is_sampled(tmp_path):
    """``Owning``: a tuner killed while its sampler fits leaves a trial whose owner is known (and dead),
    not one that stays ownerless for the grace period."""
    inner = _Peeking()
    s = _session(tmp_path, sampler=T.Owning(inner))
    s.study.ask(DIST)
    assert inner.owners == [{"owner": T.OWNER}]


def test_a_sqlite_storage_in_an_unwritable_directory_fails_at_once():
    """It waited 120 s on its creation lock and then blamed the lock; now it names the directory and the fix."""
    t0 = time.monotonic()
    with pytest.raises(TunerError) as e:
        open_storage("sqlite:////proc/x.db")
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert "cannot write in /proc" in msg and "lock" not in msg and "--storage sqlite:///" in msg
