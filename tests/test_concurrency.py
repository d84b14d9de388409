"""Four tuners at once on one log and one (fresh) default storage: all finish without an error, and no config is
measured twice (a duplicate is answered from the log or from the study, never re-measured)."""
import collections
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.logs import load_records
from tuner.logs.record import canonical_json

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_four_concurrent_tuners_on_a_fresh_directory(tmp_path):
    argv = [sys.executable, "-m", "tuner", "tune-op", "conv2d", "--data", "1,8,8,8", "--kernel", "8,8,3,3",
            "--padding", "1", "--scope", "buffer", "--trials", "6", "--repeats", "2", "--parallel", "1",
            "--log", "logs/shared.jsonl", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([*argv, "--seed", str(i)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert "Traceback" not in err
    recs = [r for r in load_records(tmp_path / "logs" / "shared.jsonl") if r.error_name != "INSTANTIATION"]
    counts = collections.Counter(canonical_json(r.config) for r in recs)
    assert recs and max(counts.values()) == 1, [c for c, n in counts.items() if n > 1]


@pytest.mark.slow
def test_two_tuners_started_together_on_an_existing_storage(tmp_path):
    """The race of a tuner starting while a peer is inside ``study.ask``: the starter's ``_recover`` failed the
    peer's ownerless trial, and the peer died with UpdateFinishedTrialError (or a config was measured twice).
    On a storage and study an earlier run left, two tuners start at once: both finish, nothing measured twice,
    no trial left running."""
    import optuna

    from tuner.search.storage import open_storage

    argv = [sys.executable, "-m", "tuner", "tune-op", "conv2d", "--data", "1,8,8,8", "--kernel", "8,8,3,3",
            "--padding", "1", "--scope", "buffer", "--repeats", "2", "--parallel", "1", "--log", "logs/shared.jsonl",
            "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = dict(cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = subprocess.run([*argv, "--trials", "4", "--seed", "9"], timeout=300, **run)
    assert first.returncode == 0, first.stderr[-2000:]
    procs = [subprocess.Popen([*argv, "--trials", "3", "--seed", str(i)], **run) for i in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert "Traceback" not in err and "UpdateFinishedTrialError" not in err, err[-2000:]
        assert ": 3 measured" in out, out
    recs = [r for r in load_records(tmp_path / "logs" / "shared.jsonl") if r.error_name != "INSTANTIATION"]
    counts = collections.Counter(canonical_json(r.config) for r in recs)
    assert len(recs) == 4 + 2 * 3 and max(counts.values()) == 1, [c for c, n in counts.items() if n > 1]
    storage = open_storage(f"sqlite:///{tmp_path / 'logs' / 'studies.db'}", heartbeat=None)
    (study,) = optuna.get_all_study_summaries(storage)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING]


def test_a_journal_lock_dies_with_its_holder(tmp_path):
    """A worker killed while it appends to a journal storage (``journal:PATH``) held its lock. Optuna's own lock,
    a symbolic link, outlived it: the others waited 30 s, then two of them could each break it, and the first
    failed with "did not possess lock" (a full suite under load). The storage's lock goes with its holder: two
    writers waiting on a killed holder both get it at once and both write."""
    import signal

    import optuna

    url = f"journal:{tmp_path / 'studies.journal'}"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from tuner.search.storage import open_storage\n"
        "open_storage(sys.argv[1])._backend._lock.acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"), url], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    writer = ("import sys, time\n"
              "import optuna\n"
              "from tuner.search.storage import open_storage\n"
              "optuna.logging.set_verbosity(optuna.logging.ERROR)\n"
              "start = time.monotonic()\n"
              "study = optuna.create_study(study_name=sys.argv[2], storage=open_storage(sys.argv[1]))\n"
              "study.add_trial(optuna.trial.create_trial(value=1.0))\n"
              "print(time.monotonic() - start)\n")
    writers = [subprocess.Popen([sys.executable, "-c", writer, url, f"s{i}"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(2)]
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err[-2000:]
        assert float(out.split()[-1]) < 20  # the writes, not the interpreter's start: a lock left behind is
        # waited out for 30 s
    import pickle
    from tuner.search.storage import open_storage
    storage = pickle.loads(pickle.dumps(open_storage(url)))  # as Optuna's own lock, it pickles
    assert sorted(s.study_name for s in optuna.get_all_study_summaries(storage)) == ["s0", "s1"]
    assert all(len(optuna.load_study(study_name=n, storage=storage).trials) == 1 for n in ("s0", "s1"))
