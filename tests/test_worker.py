"""Workers sharing studies through a storage: the claim protocol (no config measured twice, no budget
overspent), reaping of dead workers' trials, the sampler learning from every worker's trials, the task
registry, and three real worker processes against a real PostgreSQL server and against a journal file,
one of them killed with SIGKILL mid-run."""
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.cli import main
from tuner.errors import TunerError
from tuner.logs import load_records
from tuner.logs.record import canonical_json
from tuner.measure import MeasureOptions
from tuner.search import XGBSampler
from tuner.search.shared import BEAT, CLAIM, GO, VERDICT, WAIT, YIELD, Heartbeat, claim, decide, reap
from tuner.search.storage import open_storage
from tuner.search.worker import Task, export_study_records, register_tasks, registered_tasks, run_worker
from tuner.templates import get_template

ROOT = Path(__file__).resolve().parents[1]
BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}
NAMES = ["x"]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _trial(tid, x, state=TrialState.RUNNING, claimed=True, verdict=None, error=None):
    system = {CLAIM: "w"} if claimed else {}
    if verdict:
        system[VERDICT] = verdict
    return FrozenTrial(number=tid, state=state, value=1.0 if state == TrialState.COMPLETE else None,
                       datetime_start=datetime.now(), datetime_complete=None, params={"x": x},
                       distributions={"x": CategoricalDistribution(list(range(100)))},
                       user_attrs={"error": error} if error else {}, system_attrs=system, intermediate_values={},
                       trial_id=tid)


@pytest.mark.parametrize("others, me, budget, expected", [
    ([_trial(1, 5, TrialState.COMPLETE)], 2, None, YIELD),  # measured already
    ([_trial(1, 5)], 2, None, YIELD),  # a lower claim of the config goes first
    ([_trial(3, 5)], 2, None, WAIT),  # a higher claim that may not have seen mine: wait for its verdict
    ([_trial(3, 5, verdict=GO)], 2, None, YIELD),  # ... it went
    ([_trial(3, 5, verdict=YIELD)], 2, None, GO),  # ... it yielded
    ([_trial(1, 5, claimed=False)], 2, None, GO),  # still sampling: it will see my claim
    ([_trial(1, 5, TrialState.FAIL)], 2, None, GO),  # a failed trial holds nothing
    ([_trial(1, 6, TrialState.COMPLETE), _trial(3, 7, TrialState.COMPLETE)], 2, 3, GO),
    ([_trial(1, 6, TrialState.COMPLETE), _trial(3, 7, TrialState.COMPLETE), _trial(4, 8)], 5, 3, YIELD),  # full
    ([_trial(1, 6, TrialState.COMPLETE), _trial(4, 8)], 2, 3, GO),  # room for both
    ([_trial(1, 6, TrialState.COMPLETE), _trial(3, 7, TrialState.COMPLETE), _trial(4, 8)], 2, 3, WAIT),
    ([_trial(1, 6, TrialState.COMPLETE), _trial(3, 7, TrialState.COMPLETE, error="INSTANTIATION")], 2, 2, GO),
])
def test_decide(others, me, budget, expected):
    mine = _trial(me, 5)
    assert decide([*others, mine], mine, NAMES, budget) == expected


def _race(tmp_path, configs: int, budget, threads: int = 4, asks: int = 12):
    """``threads`` workers, each with its own storage handle, ask random configs of ``x`` and claim them;
    a claimed config is 'measured' (a short random delay) and completed."""
    path = str(tmp_path / "race.journal")
    optuna.create_study(study_name="race", storage=open_storage(f"journal:{path}"), direction="maximize")
    went, errors = [], []

    def work(i):
        try:
            study = optuna.load_study(study_name="race", storage=open_storage(f"journal:{path}"),
                                      sampler=optuna.samplers.RandomSampler(seed=i))
            dists = {"x": CategoricalDistribution(list(range(configs)))}
            for _ in range(asks):
                trial = study.ask(dists)
                if claim(study, trial, NAMES, f"w{i}", budget):
                    went.append(trial.params["x"])
                    time.sleep(random.random() * 0.02)
                    study._storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [1.0])
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    trials = optuna.load_study(study_name="race", storage=open_storage(f"journal:{path}")).trials
    assert not any(t.state == TrialState.RUNNING for t in trials)
    return went, trials


def test_racing_claims_never_measure_a_config_twice(tmp_path):
    went, trials = _race(tmp_path, configs=6, budget=None)
    assert len(went) == len(set(went)) and set(went) == set(range(6))  # each config once, all of them
    complete = [t.params["x"] for t in trials if t.state == TrialState.COMPLETE]
    assert sorted(complete) == sorted(went)
    assert any(t.system_attrs.get(VERDICT) == YIELD for t in trials)  # twins did race, and yielded


def test_racing_claims_never_overspend_the_budget(tmp_path):
    went, trials = _race(tmp_path, configs=100, budget=5)
    assert len(went) == 5 == len(set(went))
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 5


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_dead_workers_trials_are_completed_from_their_record_or_failed(tmp_path, kind):
    url = f"journal:{tmp_path / 's.journal'}" if kind == "journal" else f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url, heartbeat=1, grace=1)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    dists = {"x": CategoricalDistribution(list(range(10)))}
    record = {"error_code": 0, "median_s": 1e-3, "gflops": 7.5, "error_name": "NO_ERROR"}
    with Heartbeat(storage, 1) as alive:
        measured, unmeasured, live = (study.ask(dists) for _ in range(3))
        for tr in (measured, unmeasured):  # a worker that beat once, then was killed
            Heartbeat(storage, 1)._beat(tr._trial_id)
            storage.set_trial_system_attr(tr._trial_id, CLAIM, "dead")
        storage.set_trial_user_attr(measured._trial_id, "record", record)  # killed after measuring
        alive.hold(live._trial_id)
        time.sleep(3.2)
        adopted = []
        assert reap(study, grace=1, on_completed=adopted.append) == 2
        assert reap(study, grace=1, on_completed=adopted.append) == 0  # exactly one reaper wins
    by_id = {t._trial_id: t for t in study.get_trials()}
    assert by_id[measured._trial_id].state == TrialState.COMPLETE and by_id[measured._trial_id].value == 7.5
    assert by_id[unmeasured._trial_id].state == TrialState.FAIL
    assert by_id[live._trial_id].state == TrialState.RUNNING  # its heartbeat kept it alive
    assert adopted == [record]


def test_xgb_sampler_learns_from_other_workers_trials(device, tmp_path):
    t = get_template("dense")
    wl = t.workload(data=(1, 256), weight=(100, 256))
    space = t.space(wl, device, input_scope="buffer", weight_scope="buffer", output_scope="buffer")
    dists = {n: CategoricalDistribution(c) for n, c in space.choices.items()}
    url = f"journal:{tmp_path / 's.journal'}"
    other = optuna.create_study(study_name="s", storage=open_storage(url), direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(10):  # another worker's measurements
        tr = other.ask(dists)
        other.tell(tr, tr.params["tile_m"] * 2.0 + tr.params["split_k"])
    running = other.ask(dists)  # ... and one it is measuring now
    key = lambda p: tuple(p[n] for n in space.choices)  # noqa: E731
    sampler = XGBSampler(space, "dense", t.space_vars(wl), seed=1, n_warmup=8, epsilon=0.0, explore="none",
                         far=(0.0, 0.0))  # every proposal the model's
    mine = optuna.load_study(study_name="s", storage=open_storage(url), sampler=sampler)
    theirs = {key(tr.params) for tr in other.get_trials()}
    assert key(running.params) in sampler.seen(mine) and sampler.seen(mine) == theirs
    proposal = mine.ask(dists)
    assert sampler.model_fits == 1  # trained on the other worker's 10 trials: past its warm-up of 8
    assert key(proposal.params) not in theirs


def test_tasks_register_once_per_identity_and_carry_their_budget(tmp_path):
    t = get_template("conv2d")
    wl = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    url = f"journal:{tmp_path / 's.journal'}"
    a = Task("conv2d", wl, BUFFERS, trials=12)
    b = Task("conv2d", wl.key(), {**BUFFERS, "input": "texture"}, trials=12, weight=3.0)
    names = register_tasks(url, [a, b.to_dict()], "net")
    assert names == [f"net-{a.hash}", f"net-{b.hash}"] and a.hash != b.hash
    assert register_tasks(url, [Task("conv2d", wl, BUFFERS, trials=20)], "net") == names[:1]  # same task
    found = registered_tasks(url, "net")
    assert found == {names[0]: Task("conv2d", wl, BUFFERS, trials=20), names[1]: b}
    assert [t.trials for t in found.values()] == [20, 12] and found[names[1]].weight == 3.0
    assert registered_tasks(url, "other") == {}
    assert a.study_name("pocl-cpu-1", "net").startswith(f"net-{a.hash}-pocl-cpu-1 ")
    assert a.study_name("pocl-cpu-1", "net") != a.study_name("mali-g78-2", "net")
    planned = Task("conv2d", wl, BUFFERS, {"act_layout": "nchw4c"}, count=2)  # what the model pipeline hands over
    task = planned.budgeted(8)
    assert task.fixed == {"act_layout": "nchw4c"} and task.hash != a.hash and task.trials == 8
    assert task.weight == 2 * wl.flops and task == planned  # budget and weight are not the identity
    with pytest.raises(TunerError, match="unknown template"):
        register_tasks(url, [Task("conv3d", wl)], "net")
    with pytest.raises(TunerError, match="not a conv2d workload"):
        register_tasks(url, [Task("conv2d", {"data": [1, 8]})], "net")
    with pytest.raises(TunerError, match="trials"):
        Task("conv2d", wl, trials=0)
    with pytest.raises(TunerError, match="prefix"):
        register_tasks(url, [a], "has space")


@pytest.mark.parametrize("argv, message", [
    (["--storage", "journal:{tmp}/s.journal"], "needs --study-prefix"),
    (["--storage", "nowhere", "--study-prefix", "p"], "give a database URL"),
    (["--storage", "postgresql://u:secret@127.0.0.1:1/db", "--study-prefix", "p"], "cannot open storage"),
    (["--storage", "journal:{tmp}/s.journal", "--study-prefix", "p"], "no tasks registered under prefix 'p'"),
    (["--storage", "journal:{tmp}/s.journal", "--tasks", "{tmp}/missing.json"], "--tasks"),
    (["--storage", "journal:{tmp}/s.journal", "--study-prefix", "p", "--grace", "5", "--heartbeat", "5"], "grace"),
    (["--storage", "journal:{tmp}/s.journal", "--study-prefix", "p", "--max-trials", "0"], "--max-trials must be at least 1"),
])
def test_worker_cli_errors(tmp_path, capsys, argv, message):
    assert main(["worker", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "secret" not in err and "Traceback" not in err


class FakeMeasurer:
    """Stands in for the device: a 'measurement' takes 0.2 s and its speed follows the config."""

    def __init__(self, info, options):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def measure(self, inputs):
        from tuner.measure import MeasureResult
        time.sleep(0.2)
        return [MeasureResult(costs=[1e-3 / (x.config.tile_ow * x.config.tile_oh)], max_rel_error=1e-6,
                              timestamp=datetime.now().astimezone().isoformat(), duration_s=0.2) for x in inputs]


class Interrupted(FakeMeasurer):
    def measure(self, inputs):
        raise KeyboardInterrupt


def _tasks(trials=10):
    t = get_template("conv2d")
    small = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    big = t.workload(data=(1, 8, 16, 16), kernel=(8, 8, 3, 3), padding=1)
    return [Task("conv2d", small, BUFFERS, trials=trials, weight=1.0),
            Task("conv2d", big, BUFFERS, trials=trials, weight=5.0)]


def test_workers_in_threads_share_the_budget_exactly(device, tmp_path, monkeypatch):
    monkeypatch.setattr("tuner.search.worker.Measurer", FakeMeasurer)
    url = f"journal:{tmp_path / 's.journal'}"
    tasks = _tasks(trials=10)
    register_tasks(url, tasks, "net")
    results, errors = {}, []

    def work(i):
        try:
            results[i] = run_worker(url, device, study_prefix="net", log=str(tmp_path / f"w{i}.jsonl"),
                                    sampler="random", seed=i, progress=False, heartbeat=1, grace=5, poll=0.05,
                                    options=MeasureOptions(n_parallel=2))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    records = load_records(str(tmp_path / "w*.jsonl"))
    assert len(records) == 20 == sum(s.measured for s in results.values())  # 10 per task, all workers
    assert sum(s.measured > 0 for s in results.values()) >= 2  # they did share the work
    by_task = {}
    for r in records:
        by_task.setdefault(r.study, []).append(canonical_json(r.config))
    assert sorted(len(c) for c in by_task.values()) == [10, 10]
    assert all(len(c) == len(set(c)) for c in by_task.values())  # no config twice in a study
    for s in results.values():
        assert all(v["done"] == 10 == v["budget"] and v["best"].ok for v in s.studies.values())


def test_a_worker_measures_the_heaviest_task_first_and_stops_at_max_trials(device, tmp_path, monkeypatch):
    monkeypatch.setattr("tuner.search.worker.Measurer", FakeMeasurer)
    url = f"journal:{tmp_path / 's.journal'}"
    small, big = _tasks()
    s = run_worker(url, device, tasks=[small, big], max_trials=3, log=str(tmp_path / "w.jsonl"), sampler="random",
                   progress=False, options=MeasureOptions(n_parallel=2))
    assert s.measured == 3 and {r.workload["data"][2] for r in s.records} == {16}  # the heavier task
    assert s.studies[big.study_name(device.fingerprint, "tuner")]["done"] == 3
    assert s.studies[small.study_name(device.fingerprint, "tuner")]["done"] == 0


def test_an_interrupted_worker_lets_go_of_its_trials_at_once(device, tmp_path, monkeypatch):
    monkeypatch.setattr("tuner.search.worker.Measurer", Interrupted)
    url = f"journal:{tmp_path / 's.journal'}"
    task = _tasks()[0]
    with pytest.raises(KeyboardInterrupt):
        run_worker(url, device, tasks=[task], log=str(tmp_path / "w.jsonl"), progress=False, grace=600,
                   options=MeasureOptions(n_parallel=2))
    study = optuna.load_study(study_name=task.study_name(device.fingerprint, "tuner"), storage=open_storage(url))
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]  # not RUNNING for 600 s


def test_worker_cli_registers_and_tunes_tasks_from_a_file(device, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tuner.search.worker.Measurer", FakeMeasurer)
    task = Task("conv2d", _tasks()[0].workload, BUFFERS, trials=3)
    (tmp_path / "tasks.json").write_text(json.dumps([task.to_dict()]))
    argv = ["worker", "--storage", f"journal:{tmp_path / 's.journal'}", "--tasks", str(tmp_path / "tasks.json"),
            "--study-prefix", "cli", "--log", str(tmp_path / "w.jsonl"), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "measured 3" in out and f"{task.study_name(device.fingerprint, 'cli')}  3/3 trials  best" in out
    assert len(load_records(str(tmp_path / "w.jsonl"))) == 3
    for text, message in (("[", "not valid JSON"), ("[]", "non-empty JSON list"),
                          ('[{"template": "conv2d", "workload": {}, "budget": 3}]', "unknown task fields")):
        (tmp_path / "bad.json").write_text(text)
        assert main([*argv[:3], "--tasks", str(tmp_path / "bad.json")]) == 2
        assert message in capsys.readouterr().err


# ---- three worker processes, one killed with SIGKILL mid-run ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[4]))
    which = shutil.which("pg_ctl")
    return Path(found[-1]).parent if found else Path(which).parent if which else None


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of Debian's package (installed here when missing), in a temporary data
    directory, listening on 127.0.0.1 only; yields the URL of an empty database."""
    root = os.geteuid() == 0
    if _pg_bin() is None:
        if not (root and shutil.which("apt-get")):
            pytest.skip("PostgreSQL is not installed and installing it needs root and apt-get")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True, env=env, timeout=900)
    bindir = _pg_bin()
    base = Path(tempfile.mkdtemp(prefix="tuner-pg-", dir="/tmp" if root else None))  # reachable by postgres
    as_owner = []
    if root:  # postgres refuses to run as root: its own account owns the data
        shutil.chown(base, "postgres", "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", _free_port()

    def pg(*cmd):
        return subprocess.run([*as_owner, *cmd], check=True, capture_output=True, text=True, timeout=120)

    pg(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
    pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w", "start", "-o",
       f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off")
    try:
        import psycopg2
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE tuner")
        conn.close()
        yield f"postgresql://postgres@127.0.0.1:{port}/tuner"  # the installed driver is picked
    finally:
        pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until ``pid`` is in the stopped state (T) that a SIGSTOP puts it in: the signal is delivered asynchronously."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        except OSError:
            return  # gone: the caller sees it exit
        time.sleep(0.005)


def _identity(r) -> tuple:
    return (*r.task_key, canonical_json(r.config), r.timestamp)


def _run_three_workers_kill_one(url: str, tmp_path: Path):
    t = get_template("conv2d")
    wl = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=1)
    task = Task("conv2d", wl, BUFFERS, trials=12)
    register_tasks(url, [task], "tiny")
    devices = subprocess.run([sys.executable, "-m", "tuner", "devices", "--json"], cwd=ROOT,
                             capture_output=True, text=True, check=True)
    fingerprint = next(d["fingerprint"] for d in json.loads(devices.stdout) if d["default"])
    name = task.study_name(fingerprint, "tiny")
    # another device's study of the same task: workers on PoCL must leave it alone
    elsewhere = optuna.create_study(study_name=task.study_name("mali-g78-0123abcd", "tiny"),
                                    storage=open_storage(url), direction="maximize")
    elsewhere.add_trial(optuna.trial.create_trial(params={"x": 1}, distributions={
        "x": CategoricalDistribution([1, 2])}, value=1.0))

    logs = [tmp_path / f"worker{i}.jsonl" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-m", "tuner", "worker", "--storage", url, "--study-prefix", "tiny",
                               "--log", str(log), "--repeats", "2", "--parallel", "1",
                               "--heartbeat", "1", "--grace", "4", "--seed", str(i), "--no-progress"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, log in enumerate(logs)]
    victim = procs[0]
    try:
        # kill the first worker once it has logged a measurement and holds a claimed trial (mid-measurement). It
        # is stopped (SIGSTOP) while the study is read: a worker still running could finish the trial seen as held
        # before the kill lands (a measurement takes about a second, and a loaded machine stretches the gap).
        deadline, held = time.time() + 240, None
        while time.time() < deadline and held is None and victim.poll() is None:
            time.sleep(0.1)
            if logs[0].exists() and logs[0].read_text().strip():
                os.kill(victim.pid, signal.SIGSTOP)
                _wait_stopped(victim.pid)
                try:
                    study = optuna.load_study(study_name=name, storage=open_storage(url))
                    held = next((tr for tr in study.get_trials(states=(TrialState.RUNNING,))
                                 if tr.system_attrs.get(CLAIM, "").split(":")[1:2] == [str(victim.pid)]), None)
                except KeyError:
                    pass
                if held is None:  # between two trials: let it claim the next one
                    os.kill(victim.pid, signal.SIGCONT)
        assert held is not None, "worker 0 never held a trial after measuring one"
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(30) == -signal.SIGKILL
        outs = [p.communicate(timeout=480) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs[1:], outs):
        assert p.returncode == 0, err
        assert f"{name}  12/12 trials" in out

    study = optuna.load_study(study_name=name, storage=open_storage(url))
    trials = study.get_trials()
    assert not any(tr.state == TrialState.RUNNING for tr in trials)
    dead = next(tr for tr in trials if tr._trial_id == held._trial_id)
    assert dead.system_attrs.get("tuner:reaped") and dead.state in (TrialState.FAIL, TrialState.COMPLETE)
    complete = [tr for tr in trials if "record" in tr.user_attrs]  # successes COMPLETE, failures FAIL
    assert all(tr.state == (TrialState.COMPLETE if load_record(tr).ok else TrialState.FAIL) for tr in complete)
    in_study = [load_record(tr) for tr in complete]
    measured = [r for r in in_study if r.error_name != "INSTANTIATION"]
    assert len(measured) == 12  # the survivors finished the budget, and no more
    configs = [canonical_json(r.config) for r in in_study]
    assert len(configs) == len(set(configs))  # the study holds every config once

    logged = {_identity(r): r for log in logs if log.exists() for r in load_records(str(log))}
    assert {_identity(r) for r in in_study} <= set(logged)  # every completed trial is in a log
    assert set(logged) <= {_identity(r) for r in in_study}  # every logged measurement is in the study
    per_config = [canonical_json(r.config) for r in logged.values()]
    assert len(per_config) == len(set(per_config))  # no config measured twice, across all workers
    assert all(r.device == fingerprint and r.study == name for r in logged.values())
    assert len(load_records(str(logs[1]))) and len(load_records(str(logs[2])))  # both survivors measured

    assert [tr.params for tr in optuna.load_study(study_name=elsewhere.study_name, storage=open_storage(url)).trials] \
        == [{"x": 1}]  # the other fingerprint's study is untouched

    export = tmp_path / "export.jsonl"
    assert export_study_records(url, "tiny", export) == len(complete)
    assert {_identity(r) for r in load_records(str(export))} == {_identity(r) for r in in_study}
    assert export_study_records(url, name, export) == 0  # deduped against the log


def load_record(trial):
    from tuner.logs import Record
    return Record.from_dict(trial.user_attrs["record"])


@pytest.mark.slow
def test_three_workers_journal_file_one_killed(tmp_path):
    _run_three_workers_kill_one(f"journal:{tmp_path / 'studies.journal'}", tmp_path)


@pytest.mark.slow
def test_three_workers_postgres_one_killed(postgres, tmp_path):
    _run_three_workers_kill_one(postgres, tmp_path)
